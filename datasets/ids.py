"""Raw ids -> rows and columns: 0-based, 1-based (shifted, so no empty row or column 0 is
made up) or remapped, with a range check so a misread column never becomes a huge id space.

Why the range check: ids index the matrix, so a timestamp read as an item id makes a
matrix of a billion columns that every protocol then allocates. Ids may have gaps (ML-1M's
movie ids do), but not more than :data:`RANGE_FACTOR` times the ids used.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .errors import DataError
from .readers import Records

#: An axis's id range may span at most this many times its distinct ids ...
RANGE_FACTOR = 10
#: ... or this many more than them, whichever is larger (small hand-made files).
RANGE_SLACK = 1000


@dataclass(frozen=True)
class IdMap:
    """How raw ids become rows (users) and columns (items)."""

    mode: str  # "0-based", "1-based" or "remap"
    how: str  # "detected" or "declared"
    n_users: int
    n_items: int
    user_ids: np.ndarray | None = None  # remap: the sorted distinct raw ids
    item_ids: np.ndarray | None = None

    def rows_cols(self, rec: Records) -> tuple[np.ndarray, np.ndarray]:
        """Row and column of every record (column -1 stays -1: a user without items)."""
        if self.mode == "remap":
            assert self.user_ids is not None and self.item_ids is not None
            rows = np.searchsorted(self.user_ids, rec.users)
            cols = np.where(rec.items >= 0, np.searchsorted(self.item_ids, rec.items), -1)
            return rows, cols
        base = 1 if self.mode == "1-based" else 0
        return rec.users - base, np.where(rec.items >= 0, rec.items - base, -1)

    def describe(self) -> str:
        """The summary line's words for the ids."""
        if self.mode == "remap":
            return f"ids remapped to 0..n-1 in id order ({self.how})"
        if self.mode == "1-based":
            return f"ids 1-based ({self.how}; row = id - 1)"
        return f"ids 0-based ({self.how})"


def _axis(parts: list[Records], field: str) -> np.ndarray:
    values = np.concatenate([getattr(r, f"{field}s") for r in parts])
    return values[values >= 0]


def _names(parts: list[Records]) -> str:
    return " + ".join(r.label for r in parts)


def _refuse_zero(parts: list[Records]) -> None:
    """Under declared 1-based ids, an id 0 is an error at its line."""
    for rec in parts:
        for field in ("user", "item"):
            zero = np.flatnonzero(getattr(rec, f"{field}s") == 0)
            if len(zero):
                raise DataError(f"{rec.label} line {int(rec.lines[zero[0]])}: field '{field}' "
                                "is 0; expected ids >= 1 (dataset.toml declares ids = "
                                "\"1-based\")")


def _check_range(parts: list[Records], field: str, ids: np.ndarray, base: int) -> None:
    distinct = len(np.unique(ids))
    span = int(ids.max()) - base + 1
    if span > max(RANGE_FACTOR * distinct, distinct + RANGE_SLACK):
        raise DataError(
            f"{_names(parts)}: field '{field}': the ids span more than {RANGE_FACTOR}x the "
            f"{distinct:,} distinct {field} ids used; expected consecutive ids (0..n-1 or 1..n, "
            f"with gaps). A rating or timestamp read as an id does this: check the format "
            f"(dataset.toml: format = ...); for sparse ids from another system declare "
            f"ids = \"remap\" (docs/datasets.md, 'Your own data')")


def resolve(parts: list[Records], declared: str = "detect") -> IdMap:
    """The id mapping for files ``parts`` read together (a train and a test file)."""
    users, items = _axis(parts, "user"), _axis(parts, "item")
    if len(users) == 0:
        raise DataError(f"{_names(parts)}: no interactions found")
    if declared == "remap":
        uids, iids = np.unique(users), np.unique(items)
        return IdMap("remap", "declared", len(uids), len(iids), uids, iids)
    if declared == "1-based":
        _refuse_zero(parts)
    mode, how = declared, "declared"
    if declared == "detect":
        one = users.min() >= 1 and (len(items) == 0 or items.min() >= 1)
        mode, how = ("1-based" if one else "0-based"), "detected"
    base = 1 if mode == "1-based" else 0
    _check_range(parts, "user", users, base)
    if len(items):
        _check_range(parts, "item", items, base)
    n_items = int(items.max()) - base + 1 if len(items) else 0
    return IdMap(mode, how, int(users.max()) - base + 1, n_items)
