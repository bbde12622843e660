"""Small conversions between NumPy/SciPy objects and Flower records, used by both sides."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict

from datasets.csr import csr_from_arrays, csr_to_arrays
from fedrec.wire.request import ARRAYS

__all__ = ["to_array_record", "from_array_record", "arrays_of", "csr_to_arrays",
           "csr_from_arrays", "config_record", "state_record"]


def to_array_record(arrays: Mapping[str, np.ndarray]) -> ArrayRecord:
    """ArrayRecord with the given names (Flower wants ``Array`` values for named entries)."""
    return ArrayRecord({k: Array(np.ascontiguousarray(v)) for k, v in arrays.items()})


def from_array_record(record: ArrayRecord) -> dict[str, np.ndarray]:
    """Inverse of :func:`to_array_record`."""
    return {k: v.numpy() for k, v in record.items()}


def arrays_of(content: RecordDict, key: str = ARRAYS) -> dict[str, np.ndarray]:
    """The named arrays of ``content[key]``, with a clear error when the record is missing."""
    if key not in content.array_records:
        raise KeyError(
            f"message has no ArrayRecord '{key}' (has: {sorted(content.array_records)})"
        )
    return from_array_record(content.array_records[key])


def config_record(content: RecordDict, key: str) -> ConfigRecord | None:
    """The ConfigRecord ``content[key]``, or None if there is none.

    Why not ``content.config_records[key]``: Flower rebuilds that view on every access
    (every record of ``content`` copied and type-checked, then written back), so in a
    handler that touches a node state of ten records a few dozen times per message, it
    cost more than the cryptography (``benchmarks/secure.py``, 100 nodes).
    """
    record = content.get(key)
    return record if isinstance(record, ConfigRecord) else None


def array_record(content: RecordDict, key: str) -> ArrayRecord | None:
    """The ArrayRecord ``content[key]``, or None (see :func:`config_record` for why)."""
    record = content.get(key)
    return record if isinstance(record, ArrayRecord) else None


def state_record(state: RecordDict, key: str) -> ConfigRecord:
    """The ConfigRecord ``state[key]``, created empty if absent (the node state's
    ``setdefault``, without Flower's per-access view)."""
    record = config_record(state, key)
    if record is None:
        record = state[key] = ConfigRecord()
    return record


def content_digest(content: RecordDict, skip: tuple[str, ...] = ()) -> bytes:
    """BLAKE2b-256 of a request's records, in a canonical form, leaving out ``skip``.

    Why: a node binds its masked contribution to the request it answered (the model and
    config the server sent), so nodes that were sent different requests -- a server that
    gives one node a model of its choice and the others one that makes their replies known --
    produce masks that do not cancel (``clients/sums_node.py``). Records are hashed by name,
    type and content: arrays by dtype, shape and bytes, configs by their sorted items.
    """
    import hashlib

    h = hashlib.blake2b(b"fedrec-content|v1|", digest_size=32)
    for name in sorted(k for k in content.keys() if k not in skip):
        record = content[name]
        h.update(f"|{len(name)}:{name}|{type(record).__name__}|".encode())
        if isinstance(record, ArrayRecord):
            for key in sorted(record.keys()):
                arr = record[key]
                h.update(f"{key}|{arr.dtype}|{list(arr.shape)}|{len(arr.data)}|".encode())
                h.update(arr.data)
        else:
            h.update(repr(sorted((str(k), v) for k, v in record.items())).encode())
    return h.digest()
