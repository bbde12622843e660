"""Given train/test splits of a folder dataset: text files in a declared or detected format
(``datasets/readers.py``) or scipy ``.npz`` matrices, each read with a one-line summary.

Why one summary line: a person whose file was read the wrong way sees it at once (users,
items, interactions, how ids were taken), before any protocol runs on it.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from . import ids, readers
from .containers import RawData
from .csr import last_wins_matrix
from .errors import DataError, require_finite_array
from .folder_meta import FolderMeta, read_meta

log = logging.getLogger("fedrec")


def _matrix(rec: readers.Records, idmap: ids.IdMap) -> sp.csr_matrix:
    """One file's matrix; without ratings every interaction is 1.0."""
    rows, cols = idmap.rows_cols(rec)
    keep = cols >= 0
    values = rec.ratings if rec.ratings is not None else np.ones(len(cols))
    return last_wins_matrix(rows[keep], cols[keep], values[keep],
                            (idmap.n_users, idmap.n_items))


def text_format(files: dict[str, Path], meta: FolderMeta) -> str:
    """The declared format, else the one the file names and lines give (docs/datasets.md)."""
    if meta.format is not None:
        return meta.format
    if "train_csv" in files:
        return "csv"
    return readers.detect_text_format([files["train_txt"], files["test_txt"]])


def load_text(files: dict[str, Path], meta: FolderMeta) -> tuple[RawData, str]:
    """Given split from text files, and the summary line of what was read."""
    fmt = text_format(files, meta)
    ext = "csv" if fmt == "csv" else "txt"
    train_rec = readers.read(files[f"train_{ext}"], fmt)
    test_rec = readers.read(files[f"test_{ext}"], fmt)
    if train_rec.n_interactions == 0:
        raise DataError(f"{train_rec.label}: no interactions found")
    idmap = ids.resolve([train_rec, test_rec], meta.ids)
    has_ratings = train_rec.ratings is not None
    raw = RawData(train=_matrix(train_rec, idmap), test=_matrix(test_rec, idmap),
                  has_ratings=has_ratings)
    what = f"{fmt} {readers.SHAPES[fmt]}"
    return raw, summary(f"{train_rec.label} + {test_rec.label}", what, raw, idmap.describe())


def summary(names: str, what: str, raw: RawData, ids_text: str) -> str:
    """``<files> read as <format>: U users, I items, N interactions (a train + b test), <ids>``."""
    assert raw.train is not None and raw.test is not None
    n_users, n_items = raw.shape
    a, b = raw.train.nnz, raw.test.nnz
    return (f"{names} read as {what}: {n_users:,} users, {n_items:,} items, {a + b:,} "
            f"interactions ({a:,} train + {b:,} test), {ids_text}")


def _read_npz(path: Path) -> sp.csr_matrix:
    try:
        m = sp.load_npz(path)
    except Exception as exc:  # zipfile/KeyError/ValueError from a foreign .npz
        raise DataError(f"{path}: not a scipy sparse .npz ({type(exc).__name__}: {exc})") from None
    require_finite_array(m.data, path, "data")  # before CSR sums duplicates
    m = sp.csr_matrix(m, dtype=np.float64)
    m.sort_indices()
    return m


def load_npz(files: dict[str, Path]) -> RawData:
    """Given split from train.npz/test.npz (scipy.sparse.save_npz, users x items)."""
    train = _read_npz(files["train_npz"])
    test = _read_npz(files["test_npz"])
    if train.shape != test.shape:
        raise DataError(
            f"{files['test_npz']}: shape {test.shape} differs from {files['train_npz']} shape {train.shape}"
        )
    return RawData(train=train, test=test)


def load_split(files: dict[str, Path]) -> RawData:
    """A folder dataset's given split, whatever its files, logging what was read."""
    meta = read_meta(files["meta"]) if "meta" in files else FolderMeta()
    if "train_npz" in files:
        raw = load_npz(files)
        names = f"{readers.label(files['train_npz'])} + {readers.label(files['test_npz'])}"
        line = summary(names, "npz (scipy sparse matrices)", raw, "ids are rows and columns")
    else:
        raw, line = load_text(files, meta)
    log.info("%s", line)
    return raw
