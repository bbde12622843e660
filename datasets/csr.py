"""A CSR matrix as four plain named arrays (for ``.npz`` caches and Flower ArrayRecords)."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import scipy.sparse as sp


def csr_to_arrays(m: sp.spmatrix, prefix: str, sep: str = ".") -> dict[str, np.ndarray]:
    """``{prefix.data, prefix.indices, prefix.indptr, prefix.shape}`` of ``m`` as CSR."""
    m = sp.csr_matrix(m)
    return {
        f"{prefix}{sep}data": m.data,
        f"{prefix}{sep}indices": m.indices,
        f"{prefix}{sep}indptr": m.indptr,
        f"{prefix}{sep}shape": np.asarray(m.shape, dtype=np.int64),
    }


def csr_from_arrays(arrays: Mapping[str, np.ndarray], prefix: str, sep: str = ".") -> sp.csr_matrix:
    """Inverse of :func:`csr_to_arrays` (``arrays`` may be an open ``NpzFile``)."""
    shape = tuple(int(x) for x in arrays[f"{prefix}{sep}shape"])
    return sp.csr_matrix(
        (arrays[f"{prefix}{sep}data"], arrays[f"{prefix}{sep}indices"], arrays[f"{prefix}{sep}indptr"]),
        shape=shape,
    )


def last_wins_matrix(rows: np.ndarray, cols: np.ndarray, values: np.ndarray,
                     shape: tuple[int, int]) -> sp.csr_matrix:
    """Users x items from entries, keeping the last occurrence of a duplicated (row, column)
    pair: a file that lists a pair twice means its later value (MovieLens, own data)."""
    key = rows * shape[1] + cols
    _, last = np.unique(key[::-1], return_index=True)
    keep = len(key) - 1 - last
    m = sp.csr_matrix((values[keep], (rows[keep], cols[keep])), shape=shape, dtype=np.float64)
    m.sort_indices()
    return m
