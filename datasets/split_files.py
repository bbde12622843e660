"""LightGCN-format loaders: `train.txt`/`test.txt` text and the scipy `.npz` split.

Both carry a given train/test split of implicit interactions (users x items, 1.0).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import scipy.sparse as sp

from .containers import RawData
from .errors import DataError, require_finite_array


def read_txt(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """(users, items) from lines `user item1 item2 ...` (0-based, space-separated)."""
    try:
        return _read_txt(path)
    except UnicodeDecodeError as exc:  # e.g. a binary file under the name train.txt
        raise DataError(f"{path}: not a UTF-8 text file (byte {exc.start} cannot be decoded); "
                        "expected lines of integer ids 'user item1 item2 ...'") from None


def _read_txt(path: Path) -> tuple[np.ndarray, np.ndarray]:
    users: list[int] = []
    items: list[int] = []
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            parts = line.split()
            if not parts:
                continue
            try:
                ids = [int(p) for p in parts]
            except ValueError:
                bad = next((p for p in parts if not p.lstrip("-").isdigit()), line.strip())
                raise DataError(
                    f"{path} line {lineno}: expected integer ids 'user item1 item2 ...', got {bad!r}"
                ) from None
            if min(ids) < 0:
                raise DataError(f"{path} line {lineno}: ids must be >= 0, got {min(ids)}")
            users.extend([ids[0]] * (len(ids) - 1))
            items.extend(ids[1:])
            if len(ids) == 1:  # a user without items still counts towards n_users
                users.append(ids[0])
                items.append(-1)
    return np.asarray(users, np.int64), np.asarray(items, np.int64)


def _to_csr(users: np.ndarray, items: np.ndarray, shape: tuple[int, int]) -> sp.csr_matrix:
    keep = items >= 0
    m = sp.csr_matrix(
        (np.ones(int(keep.sum())), (users[keep], items[keep])), shape=shape, dtype=np.float64
    )
    m.data[:] = 1.0  # duplicates summed by csr construction become one interaction
    m.sort_indices()
    return m


def load_txt(files: dict[str, Path]) -> RawData:
    """Given split from train.txt/test.txt; sizes are max id + 1 over both files."""
    tu, ti = read_txt(files["train_txt"])
    su, si = read_txt(files["test_txt"])
    if len(tu) == 0:
        raise DataError(f"{files['train_txt']}: no interactions found")
    n_users = int(max(tu.max(), su.max() if len(su) else -1)) + 1
    n_items = int(max(ti.max(), si.max() if len(si) else -1)) + 1
    shape = (n_users, n_items)
    return RawData(train=_to_csr(tu, ti, shape), test=_to_csr(su, si, shape))


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
