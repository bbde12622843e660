"""MovieLens raw-file loaders: 100K (u.data, u.user, u.item) and 1M (ratings.dat, users.dat,
movies.dat), as published.

Parses line by line so a malformed line is reported with its file and number.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np

from .containers import RawData
from .csr import last_wins_matrix
from .errors import DataError, require_finite_lines

N_GENRES = 19
_DATA_FIELDS = ("user", "item", "rating", "timestamp")


def _number(path: Path, lineno: int, field: str, text: str, kind: type) -> float:
    try:
        return kind(text)
    except ValueError:
        raise DataError(
            f"{path} line {lineno}: field '{field}' is not a{'n integer' if kind is int else ' number'}: {text!r}"
        ) from None


def _fields(path: Path, sep: str, n_fields: int | None, what: str,
            min_fields: int = 0) -> Iterator[tuple[int, list[str]]]:
    """(line number, fields) of every non-blank line; a wrong field count names the line."""
    with open(path, encoding="latin-1") as fh:
        for lineno, line in enumerate(fh, start=1):
            line = line.rstrip("\r\n")
            if not line.strip():
                continue
            parts = line.split(sep)
            if (n_fields is not None and len(parts) != n_fields) or len(parts) < min_fields:
                raise DataError(f"{path} line {lineno}: expected {what}, got {len(parts)} fields")
            yield lineno, parts


def read_ratings(path: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """0-based (users, items, ratings) from u.data; the last duplicate pair wins."""
    users, items, values, _ = _rating_lines(
        path, "\t", ("user", "item", "rating", "timestamp"),
        f"4 tab-separated fields '{' '.join(_DATA_FIELDS)}'")
    return users - 1, items - 1, values


def read_users(path: Path) -> dict[str, np.ndarray]:
    """Per-user attributes from u.user (`id|age|gender|occupation|zip`), ordered by id."""
    rows: dict[int, tuple[int, str, str, str]] = {}
    for lineno, parts in _fields(path, "|", 5, "5 '|'-separated fields "
                                 "'id|age|gender|occupation|zip'"):
        uid = int(_number(path, lineno, "id", parts[0], int))
        age = int(_number(path, lineno, "age", parts[1], int))
        if parts[2] not in ("M", "F"):
            raise DataError(f"{path} line {lineno}: field 'gender' must be M or F, got {parts[2]!r}")
        rows[uid] = (age, parts[2], parts[3].strip(), parts[4].strip())
    ids = sorted(rows)
    if ids != list(range(1, len(ids) + 1)):
        raise DataError(f"{path}: user ids must be 1..n without gaps")
    return {
        "age": np.array([rows[u][0] for u in ids], dtype=np.int64),
        "gender": np.array([rows[u][1] for u in ids]),
        "occupation": np.array([rows[u][2] for u in ids]),
        "zip": np.array([rows[u][3] for u in ids]),
    }


def read_items(path: Path) -> np.ndarray:
    """n_items x 19 genre flags from u.item (pipe-separated, latin-1), ordered by id."""
    rows: dict[int, list[float]] = {}
    for lineno, parts in _fields(path, "|", None, f"id and {N_GENRES} genre flags",
                                 min_fields=1 + N_GENRES):
        iid = int(_number(path, lineno, "id", parts[0], int))
        flags = [_number(path, lineno, f"genre{k}", t, int) for k, t in enumerate(parts[-N_GENRES:])]
        rows[iid] = [float(f) for f in flags]
    ids = sorted(rows)
    if ids != list(range(1, len(ids) + 1)):
        raise DataError(f"{path}: item ids must be 1..n without gaps")
    return np.array([rows[i] for i in ids], dtype=np.float64).reshape(len(ids), N_GENRES)


def user_features(attrs: dict[str, np.ndarray]) -> np.ndarray:
    """Age min-max scaled to [0,1], gender one-hot (F, M), occupation one-hot (sorted)."""
    age = attrs["age"].astype(np.float64)
    span = age.max() - age.min()
    age = (age - age.min()) / span if span > 0 else np.zeros_like(age)
    gender = np.stack([attrs["gender"] == "F", attrs["gender"] == "M"], axis=1)
    occs = np.unique(attrs["occupation"])
    occ = attrs["occupation"][:, None] == occs[None, :]
    return np.hstack([age[:, None], gender, occ]).astype(np.float64)


def load_ml100k(files: dict[str, Path]) -> RawData:
    """All ratings (no given split) plus features and raw attributes when present."""
    data_path = files["ratings"]
    users, items, ratings = read_ratings(data_path)
    attrs: dict[str, np.ndarray] = {}
    ufeat = ifeat = None
    n_users, n_items = int(users.max()) + 1, int(items.max()) + 1
    if "users" in files:
        attrs = read_users(files["users"])
        ufeat = user_features(attrs)
        if n_users > len(attrs["zip"]):
            raise DataError(f"{data_path}: user id {n_users} not in {files['users']}")
        n_users = len(attrs["zip"])
    if "items" in files:
        ifeat = read_items(files["items"])
        if n_items > ifeat.shape[0]:
            raise DataError(f"{data_path}: item id {n_items} not in {files['items']}")
        n_items = ifeat.shape[0]
    return RawData(ratings=last_wins_matrix(users, items, ratings, (n_users, n_items)),
                   user_features=ufeat, item_features=ifeat, user_attributes=attrs,
                   has_ratings=True)


# ------------------------------------------------------------------------ MovieLens 1M
#: The 18 genres of ML-1M's movies.dat, in the order of the README that ships with the release;
#: the item-feature columns follow this order.
ML1M_GENRES: tuple[str, ...] = (
    "Action", "Adventure", "Animation", "Children's", "Comedy", "Crime", "Documentary",
    "Drama", "Fantasy", "Film-Noir", "Horror", "Musical", "Mystery", "Romance", "Sci-Fi",
    "Thriller", "War", "Western",
)
#: users.dat's Age field is a bracket code: 1 "under 18", 18 "18-24", 25 "25-34", 35 "35-44",
#: 45 "45-49", 50 "50-55", 56 "56+".
ML1M_AGE_CODES: tuple[int, ...] = (1, 18, 25, 35, 45, 50, 56)
#: users.dat's Occupation field is a code 0..20; attributes keep the release's names so
#: they read like ML-100K's (0 is "other or not specified").
ML1M_OCCUPATIONS: tuple[str, ...] = (
    "other", "academic/educator", "artist", "clerical/admin", "college/grad student",
    "customer service", "doctor/health care", "executive/managerial", "farmer", "homemaker",
    "K-12 student", "lawyer", "programmer", "retired", "sales/marketing", "scientist",
    "self-employed", "technician/engineer", "tradesman/craftsman", "unemployed", "writer",
)
_ML1M_SEP = "::"


def read_ratings_1m(path: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Raw (user ids, movie ids, ratings, line numbers) from ratings.dat
    (``UserID::MovieID::Rating::Timestamp``), in file order."""
    return _rating_lines(path, _ML1M_SEP, ("UserID", "MovieID", "Rating", "Timestamp"),
                         "4 '::'-separated fields 'UserID::MovieID::Rating::Timestamp'")


def _first_seen(seen: dict[int, int], path: Path, lineno: int, field: str, key: int) -> None:
    if key in seen:
        raise DataError(f"{path} line {lineno}: {field} {key} already listed on line {seen[key]}; "
                        f"expected each {field} once")
    seen[key] = lineno


def read_users_1m(path: Path) -> dict[int, tuple[int, str, str, str]]:
    """UserID -> (age code, gender, occupation name, zip) from users.dat
    (``UserID::Gender::Age::Occupation::Zip-code``)."""
    rows: dict[int, tuple[int, str, str, str]] = {}
    seen: dict[int, int] = {}
    for lineno, parts in _fields(path, _ML1M_SEP, 5, "5 '::'-separated fields "
                                 "'UserID::Gender::Age::Occupation::Zip-code'"):
        uid = int(_number(path, lineno, "UserID", parts[0], int))
        if parts[1] not in ("M", "F"):
            raise DataError(f"{path} line {lineno}: field 'Gender' must be M or F, got {parts[1]!r}")
        age = int(_number(path, lineno, "Age", parts[2], int))
        if age not in ML1M_AGE_CODES:
            raise DataError(f"{path} line {lineno}: field 'Age' must be one of the bracket codes "
                            f"{', '.join(map(str, ML1M_AGE_CODES))}, got {age}")
        occ = int(_number(path, lineno, "Occupation", parts[3], int))
        if not 0 <= occ < len(ML1M_OCCUPATIONS):
            raise DataError(f"{path} line {lineno}: field 'Occupation' must be a code 0.."
                            f"{len(ML1M_OCCUPATIONS) - 1}, got {occ}")
        zip_code = parts[4].strip()
        if not zip_code:
            raise DataError(f"{path} line {lineno}: field 'Zip-code' is empty; expected a zip code")
        _first_seen(seen, path, lineno, "UserID", uid)
        rows[uid] = (age, parts[1], ML1M_OCCUPATIONS[occ], zip_code)
    return rows


def read_movies_1m(path: Path) -> dict[int, list[float]]:
    """MovieID -> 18 genre flags (order :data:`ML1M_GENRES`) from movies.dat
    (``MovieID::Title::Genres``, Latin-1, genres separated by '|')."""
    index = {g: k for k, g in enumerate(ML1M_GENRES)}
    rows: dict[int, list[float]] = {}
    seen: dict[int, int] = {}
    for lineno, parts in _fields(path, _ML1M_SEP, None, "3 '::'-separated fields "
                                 "'MovieID::Title::Genres'", min_fields=3):
        mid = int(_number(path, lineno, "MovieID", parts[0], int))
        flags = [0.0] * len(ML1M_GENRES)
        for genre in parts[-1].split("|"):
            if genre not in index:
                raise DataError(f"{path} line {lineno}: field 'Genres' holds {genre!r}; expected "
                                f"'|'-separated names from {', '.join(ML1M_GENRES)}")
            flags[index[genre]] = 1.0
        _first_seen(seen, path, lineno, "MovieID", mid)
        rows[mid] = flags
    return rows


def _unknown_id(ids: np.ndarray, known: np.ndarray, lines: np.ndarray, path: Path,
                field: str, other: Path) -> None:
    missing = np.flatnonzero(~np.isin(ids, known))
    if missing.size:
        k = int(missing[0])
        raise DataError(f"{path} line {int(lines[k])}: {field} {int(ids[k])} is not in {other}; "
                        f"expected every rated {field} to be listed there")


def load_ml1m(files: dict[str, Path]) -> RawData:
    """All ratings (no given split) plus features and raw attributes when present.

    Rows are the users that have at least one rating, in UserID order (users.dat lists
    users without ratings when ratings.dat is partial). Columns are every movie of
    movies.dat in MovieID order, rated or not, as ML-100K keeps every movie of u.item;
    without movies.dat, the rated movies only.
    """
    data_path = files["ratings"]
    uids, mids, ratings, lines = read_ratings_1m(data_path)
    user_ids = np.unique(uids)
    attrs: dict[str, np.ndarray] = {}
    ufeat = ifeat = None
    if "users" in files:
        rows = read_users_1m(files["users"])
        _unknown_id(uids, np.fromiter(rows, np.int64, len(rows)), lines, data_path, "UserID",
                    files["users"])
        attrs = {
            "age": np.array([rows[u][0] for u in user_ids], dtype=np.int64),
            "gender": np.array([rows[u][1] for u in user_ids]),
            "occupation": np.array([rows[u][2] for u in user_ids]),
            "zip": np.array([rows[u][3] for u in user_ids]),
        }
        ufeat = user_features(attrs)
    if "items" in files:
        movies = read_movies_1m(files["items"])
        item_ids = np.array(sorted(movies), dtype=np.int64)
        _unknown_id(mids, item_ids, lines, data_path, "MovieID", files["items"])
        ifeat = np.array([movies[m] for m in item_ids], dtype=np.float64).reshape(
            len(item_ids), len(ML1M_GENRES))
    else:
        item_ids = np.unique(mids)
    users = np.searchsorted(user_ids, uids)
    items = np.searchsorted(item_ids, mids)
    n_users, n_items = len(user_ids), len(item_ids)
    return RawData(ratings=last_wins_matrix(users, items, ratings, (n_users, n_items)),
                   user_features=ufeat, item_features=ifeat, user_attributes=attrs,
                   has_ratings=True)


def _rating_lines(path: Path, sep: str, names: tuple[str, str, str, str], what: str
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """1-based (user ids, item ids, ratings, line numbers) of a MovieLens ratings file with
    fields ``names`` (user, item, rating, timestamp) separated by ``sep``; errors name the
    file, the line and the field as the release names it."""
    users, items, ratings, lines = [], [], [], []
    user, item, rating, stamp = names
    for lineno, parts in _fields(path, sep, 4, what):
        u = _number(path, lineno, user, parts[0], int)
        i = _number(path, lineno, item, parts[1], int)
        r = _number(path, lineno, rating, parts[2], float)
        _number(path, lineno, stamp, parts[3], int)
        if u < 1 or i < 1:
            raise DataError(f"{path} line {lineno}: ids are 1-based, got {user} {u} {item} {i}")
        users.append(u)
        items.append(i)
        ratings.append(r)
        lines.append(lineno)
    if not users:
        raise DataError(f"{path}: no ratings found")
    values = np.asarray(ratings, dtype=np.float64)
    require_finite_lines(values, path, rating, "a finite number", encoding="latin-1")
    return (np.asarray(users, np.int64), np.asarray(items, np.int64), values,
            np.asarray(lines, np.int64))
