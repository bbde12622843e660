"""Readers for interaction files in the declared formats, refusing what they cannot read right.

Why: a reader that guesses reads a ``user item rating timestamp`` file as per-user item lists
(ratings and timestamps become item ids) and builds a matrix of a billion columns without a
word. Each format here has a fixed shape, every line is checked against it, and every error
names the file (by its folder and name, never the full path), the 1-based line and the field,
and says what was expected; it never repeats a value from the file.

Ids are returned raw (as written); :mod:`datasets.ids` turns them into rows and columns.
"""

from __future__ import annotations

import csv
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .errors import DataError

#: Format name -> what a line holds (for messages and docs). ``npz`` is not a text format:
#: it is recognized by its file names (``datasets/sources.py``).
FORMATS: dict[str, str] = {
    "lists": "one line 'user item1 item2 ...' per user (LightGCN), whitespace-separated",
    "pairs": "one line 'user item' per interaction, whitespace-separated",
    "ratings": "one line 'user item rating timestamp' per interaction (MovieLens u.data), "
               "whitespace- or tab-separated",
    "csv": "comma-separated, a header line naming the columns user and item (and optionally "
           "rating, timestamp), one line per interaction",
}
#: A format's line shape in a few words, for the summary line.
SHAPES: dict[str, str] = {"lists": "'user item1 item2 ...'", "pairs": "'user item'",
                          "ratings": "'user item rating timestamp'", "csv": "with a header"}
#: The fixed fields of each fixed-width text format.
FIXED_FIELDS: dict[str, tuple[str, ...]] = {
    "pairs": ("user", "item"),
    "ratings": ("user", "item", "rating", "timestamp"),
}
#: CSV header names accepted per column, compared lower-case without '_', '-' or spaces
#: (so MovieLens' own ``userId,movieId,rating,timestamp`` reads as it is).
CSV_COLUMNS: dict[str, tuple[str, ...]] = {
    "user": ("user", "userid"),
    "item": ("item", "itemid", "movieid"),
    "rating": ("rating",),
    "timestamp": ("timestamp", "time"),
}


@dataclass
class Records:
    """The interactions of one file, one entry per interaction, ids raw.

    ``items`` is -1 for a user listed without items (``lists`` format): the user still
    counts, the entry is no interaction.
    """

    users: np.ndarray
    items: np.ndarray
    lines: np.ndarray
    ratings: np.ndarray | None
    times: np.ndarray | None
    label: str
    fmt: str

    def subset(self, index: np.ndarray) -> "Records":
        """The records at ``index`` (an index array or a boolean mask), in that order."""
        def pick(a: np.ndarray | None) -> np.ndarray | None:
            return None if a is None else a[index]
        return Records(self.users[index], self.items[index], self.lines[index],
                       pick(self.ratings), pick(self.times), self.label, self.fmt)

    @property
    def n_interactions(self) -> int:
        """Entries that are interactions (not a listed user without items)."""
        return int((self.items >= 0).sum())


def label(path: Path) -> str:
    """How a message names a file: its folder's name and its own, never the full path."""
    return f"{path.parent.name}/{path.name}"


def _open_text(path: Path, newline: str | None = None):
    return open(path, encoding="utf-8", newline=newline)


def _decode_error(path: Path, exc: UnicodeDecodeError, fmt: str) -> DataError:
    # The one message with the full path: the operator's own console has always shown it
    # (tests/test_cli_tool.py), and it carries no line of the file.
    return DataError(f"{path}: not a UTF-8 text file (byte {exc.start} cannot be "
                     f"decoded); expected format '{fmt}': {FORMATS[fmt]}")


def _text_rows(path: Path, fmt: str) -> Iterator[tuple[int, list[str]]]:
    """(line number, whitespace-split fields) of every non-blank line."""
    try:
        with _open_text(path) as fh:
            for lineno, line in enumerate(fh, start=1):
                parts = line.split()
                if parts:
                    yield lineno, parts
    except UnicodeDecodeError as exc:
        raise _decode_error(path, exc, fmt) from None


def _where(path: Path, lineno: int, field: str) -> str:
    return f"{label(path)} line {lineno}: field '{field}'"


def parse_id(path: Path, lineno: int, field: str, text: str) -> int:
    """A non-negative integer id, or an error naming file, line and field (not the text)."""
    try:
        value = int(text)
    except ValueError:
        raise DataError(f"{_where(path, lineno, field)} is not an integer; expected an integer "
                        "id >= 0") from None
    if value < 0:
        raise DataError(f"{_where(path, lineno, field)} is negative; expected an integer id >= 0")
    return value


def parse_number(path: Path, lineno: int, field: str, text: str) -> float:
    """A finite number (a NaN rating passes every threshold, so it is refused here)."""
    try:
        value = float(text)
    except ValueError:
        raise DataError(f"{_where(path, lineno, field)} is not a number; expected a finite "
                        "number") from None
    if not np.isfinite(value):
        raise DataError(f"{_where(path, lineno, field)} is not finite (NaN or inf); expected a "
                        "finite number")
    return value


class _Columns:
    """Accumulates parsed fields into the arrays of a :class:`Records`."""

    def __init__(self, with_rating: bool, with_time: bool) -> None:
        self.users: list[int] = []
        self.items: list[int] = []
        self.lines: list[int] = []
        self.ratings: list[float] | None = [] if with_rating else None
        self.times: list[float] | None = [] if with_time else None

    def add(self, lineno: int, user: int, item: int, rating: float = 0.0,
            time: float = 0.0) -> None:
        self.users.append(user)
        self.items.append(item)
        self.lines.append(lineno)
        if self.ratings is not None:
            self.ratings.append(rating)
        if self.times is not None:
            self.times.append(time)

    def records(self, path: Path, fmt: str) -> Records:
        def arr(values: list[float] | None) -> np.ndarray | None:
            return None if values is None else np.asarray(values, np.float64)
        return Records(np.asarray(self.users, np.int64), np.asarray(self.items, np.int64),
                       np.asarray(self.lines, np.int64), arr(self.ratings), arr(self.times),
                       label(path), fmt)


def read_lists(path: Path) -> Records:
    """``user item1 item2 ...`` per line; a line with a user only is a user without items."""
    cols = _Columns(False, False)
    for lineno, parts in _text_rows(path, "lists"):
        try:  # the fast path; on any bad token the slow one names its field
            ids = [int(p) for p in parts]
            if min(ids) < 0:
                raise ValueError
        except ValueError:
            ids = _list_ids(path, lineno, parts)
        items = ids[1:] or [-1]
        cols.users.extend([ids[0]] * len(items))
        cols.items.extend(items)
        cols.lines.extend([lineno] * len(items))
    return cols.records(path, "lists")


def _list_ids(path: Path, lineno: int, parts: list[str]) -> list[int]:
    """The slow path of a ``lists`` line: the error names the line's first bad field."""
    fields = ["user", *(f"item {k}" for k in range(1, len(parts)))]
    try:
        return [parse_id(path, lineno, f, p) for f, p in zip(fields, parts)]
    except DataError as exc:
        detail = str(exc).split(": ", 1)[1]
        raise DataError(f"{label(path)} line {lineno}: expected integer ids 'user item1 item2 "
                        f"...' (format 'lists'); {detail}") from None


def _width_error(path: Path, lineno: int, got: int, fmt: str, fields: tuple[str, ...]) -> DataError:
    return DataError(f"{label(path)} line {lineno}: {got} field{'s' if got != 1 else ''}; "
                     f"expected {len(fields)} '{' '.join(fields)}' (format '{fmt}')")


def read_fixed(path: Path, fmt: str) -> Records:
    """A fixed-width format (``pairs``, ``ratings``): every line has exactly its fields."""
    fields = FIXED_FIELDS[fmt]
    cols = _Columns("rating" in fields, "timestamp" in fields)
    for lineno, parts in _text_rows(path, fmt):
        if len(parts) != len(fields):
            raise _width_error(path, lineno, len(parts), fmt, fields)
        user = parse_id(path, lineno, "user", parts[0])
        item = parse_id(path, lineno, "item", parts[1])
        if len(fields) == 2:
            cols.add(lineno, user, item)
        else:
            cols.add(lineno, user, item, parse_number(path, lineno, "rating", parts[2]),
                     parse_number(path, lineno, "timestamp", parts[3]))
    return cols.records(path, fmt)


def csv_columns(path: Path, header: list[str]) -> dict[str, int]:
    """Column -> index from a CSV header; user and item are required, each column once."""
    found: dict[str, int] = {}
    for index, name in enumerate(header):
        key = "".join(c for c in name.strip().lower() if c not in "_- ")
        for column, aliases in CSV_COLUMNS.items():
            if key in aliases:
                if column in found:
                    raise DataError(f"{label(path)} line 1: header names column '{column}' "
                                    "twice; expected each column once")
                found[column] = index
    missing = [c for c in ("user", "item") if c not in found]
    if missing:
        names = "; ".join(f"{c}: {' or '.join(CSV_COLUMNS[c])}" for c in missing)
        raise DataError(f"{label(path)} line 1: header has no column {' or '.join(missing)}; "
                        f"expected a header naming them (case, '_' and '-' ignored: {names})")
    return found


def read_csv(path: Path) -> Records:
    """CSV with a header; every line has the header's number of fields."""
    try:
        with _open_text(path, newline="") as fh:
            return _read_csv_rows(path, csv.reader(fh))
    except UnicodeDecodeError as exc:
        raise _decode_error(path, exc, "csv") from None
    except csv.Error as exc:
        raise DataError(f"{label(path)}: not readable as CSV ({exc}); expected "
                        f"{FORMATS['csv']}") from None


def _read_csv_rows(path: Path, rows: Iterator[list[str]]) -> Records:
    header = next(rows, None)
    if header is None:
        raise DataError(f"{label(path)}: empty; expected a header line, then {FORMATS['csv']}")
    at = csv_columns(path, header)
    cols = _Columns("rating" in at, "timestamp" in at)
    for lineno, row in enumerate(rows, start=2):
        if not any(cell.strip() for cell in row):
            continue
        if len(row) != len(header):
            raise DataError(f"{label(path)} line {lineno}: {len(row)} fields; expected "
                            f"{len(header)}, as the header line has (format 'csv')")
        extra = {c: parse_number(path, lineno, c, row[at[c]]) for c in ("rating", "timestamp")
                 if c in at}
        cols.add(lineno, parse_id(path, lineno, "user", row[at["user"]].strip()),
                 parse_id(path, lineno, "item", row[at["item"]].strip()),
                 extra.get("rating", 0.0), extra.get("timestamp", 0.0))
    return cols.records(path, "csv")


def read(path: Path, fmt: str) -> Records:
    """The records of ``path`` in format ``fmt`` (one of :data:`FORMATS`)."""
    if fmt == "lists":
        return read_lists(path)
    if fmt == "csv":
        return read_csv(path)
    return read_fixed(path, fmt)


def line_widths(path: Path) -> set[int]:
    """The distinct numbers of whitespace-separated fields over the non-blank lines."""
    return {len(parts) for _, parts in _text_rows(path, "lists")}


DECLARE_IN_FOLDER = "in the folder's dataset.toml: format = \"ratings\" or \"lists\""


def detect_text_format(paths: list[Path], declare: str = DECLARE_IN_FOLDER) -> str:
    """The format of undeclared ``.txt`` files, by a rule stated in docs/datasets.md:

    every line of every file has 2 fields -> ``pairs`` (which reads the same as ``lists``);
    every line has the same number of fields, 3 or more -> refused: ``user item rating
    timestamp`` and a list of 3 items per user look alike, so the format must be declared;
    otherwise (lines of varying width) -> ``lists``.
    """
    widths: set[int] = set()
    for path in paths:
        widths |= line_widths(path)
    if widths == {2}:
        return "pairs"
    if len(widths) == 1 and min(widths) >= 3:
        width = widths.pop()
        names = " + ".join(label(p) for p in paths)
        raise DataError(
            f"{names}: every line has {width} fields, so one interaction per line with more "
            f"columns (e.g. 'user item rating timestamp') and a user with {width - 1} items "
            f"(LightGCN lists) look alike; declare the format {declare} (docs/datasets.md, "
            "'Your own data')")
    return "lists"
