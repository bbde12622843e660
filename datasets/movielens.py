"""MovieLens 100K raw-file loader (u.data, u.user, u.item as published).

Parses line by line so a malformed line is reported with its file and number.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from .containers import RawData
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
    users, items, ratings = [], [], []
    what = f"4 tab-separated fields '{' '.join(_DATA_FIELDS)}'"
    for lineno, parts in _fields(path, "\t", 4, what):
        u = _number(path, lineno, "user", parts[0], int)
        i = _number(path, lineno, "item", parts[1], int)
        r = _number(path, lineno, "rating", parts[2], float)
        _number(path, lineno, "timestamp", parts[3], int)
        if u < 1 or i < 1:
            raise DataError(f"{path} line {lineno}: ids are 1-based, got user {u} item {i}")
        users.append(u - 1)
        items.append(i - 1)
        ratings.append(r)
    if not users:
        raise DataError(f"{path}: no ratings found")
    values = np.asarray(ratings, dtype=np.float64)
    require_finite_lines(values, path, "rating", "a finite number", encoding="latin-1")
    return np.asarray(users, np.int64), np.asarray(items, np.int64), values


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
    # Keep the last occurrence of a duplicated (user, item) pair.
    key = users * n_items + items
    _, last = np.unique(key[::-1], return_index=True)
    keep = len(key) - 1 - last
    m = sp.csr_matrix((ratings[keep], (users[keep], items[keep])), shape=(n_users, n_items))
    m.sort_indices()
    return RawData(
        ratings=m, user_features=ufeat, item_features=ifeat, user_attributes=attrs, has_ratings=True
    )
