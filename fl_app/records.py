"""Small conversions between NumPy/SciPy objects and Flower records, used by both sides."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import scipy.sparse as sp
from flwr.app import Array, ArrayRecord, RecordDict


def to_array_record(arrays: Mapping[str, np.ndarray]) -> ArrayRecord:
    """ArrayRecord with the given names (Flower wants ``Array`` values for named entries)."""
    return ArrayRecord({k: Array(np.ascontiguousarray(v)) for k, v in arrays.items()})


def from_array_record(record: ArrayRecord) -> dict[str, np.ndarray]:
    """Inverse of :func:`to_array_record`."""
    return {k: v.numpy() for k, v in record.items()}


def arrays_of(content: RecordDict, key: str = "arrays") -> dict[str, np.ndarray]:
    """The named arrays of ``content[key]``, with a clear error when the record is missing."""
    if key not in content.array_records:
        raise KeyError(
            f"message has no ArrayRecord '{key}' (has: {sorted(content.array_records)})"
        )
    return from_array_record(content.array_records[key])


def csr_to_arrays(m: sp.csr_matrix, prefix: str) -> dict[str, np.ndarray]:
    """A CSR matrix as plain arrays (data, indices, indptr, shape) for a message."""
    m = sp.csr_matrix(m)
    return {
        f"{prefix}.data": m.data,
        f"{prefix}.indices": m.indices,
        f"{prefix}.indptr": m.indptr,
        f"{prefix}.shape": np.asarray(m.shape, dtype=np.int64),
    }


def csr_from_arrays(arrays: Mapping[str, np.ndarray], prefix: str) -> sp.csr_matrix:
    """Inverse of :func:`csr_to_arrays`."""
    shape = tuple(int(x) for x in arrays[f"{prefix}.shape"])
    return sp.csr_matrix(
        (arrays[f"{prefix}.data"], arrays[f"{prefix}.indices"], arrays[f"{prefix}.indptr"]),
        shape=shape,
    )
