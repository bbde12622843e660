"""Local disk cache of node partitions, so a node process skips the full load next time.

Location: $FEDREC_CACHE, else ~/.cache/fedrec-privacy. One `.npz` per
(dataset key, partition spec, partition id). The dataset key hashes every
DatasetSpec field plus each source file's path, mtime and size, so editing a
spec or touching a file yields a new key (stale files are simply never read).
Writes go to a temp file in the same directory and are published with
os.replace, so concurrent node processes never see a half-written file.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import tempfile
import warnings
import zipfile
from pathlib import Path

import numpy as np

from .containers import NodeData
from .csr import csr_from_arrays, csr_to_arrays
from .errors import first_non_finite
from .partition import PartitionSpec
from .sources import fingerprint
from .spec import DatasetSpec

CACHE_VERSION = 3  # bump when the cached layout or the data pipeline changes
# 3: folder datasets' 1-based text ids are shifted to rows 0.. (datasets/ids.py)


def cache_dir() -> Path:
    """The cache directory, read from the environment at call time."""
    env = os.environ.get("FEDREC_CACHE", "")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "fedrec-privacy"


def dataset_key(spec: DatasetSpec, files: dict[str, Path]) -> str:
    """sha256 over the cache version, all spec fields and the source-file fingerprints."""
    payload = {
        "version": CACHE_VERSION,
        "spec": dataclasses.asdict(spec),
        "files": fingerprint(files),
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def node_path(spec: DatasetSpec, key: str, part: PartitionSpec, partition_id: int) -> Path:
    """File for one node: readable prefix, spec-hash, partition spec, partition id."""
    name = (
        f"{spec.name}-{key[:20]}-{part.scheme}-n{part.num_partitions}"
        f"-s{part.seed}-p{partition_id}.npz"
    )
    return cache_dir() / "nodes" / name


_ATTR = "attr:"  # array-name prefix of user attributes in a node file


def write_node(path: Path, key: str, node: NodeData) -> bool:
    """Atomically write `node`; warn and return False if the cache is not writable."""
    arrays = {
        "key": np.array(key),
        "partition_id": np.array(node.partition_id, dtype=np.int64),
        "user_ids": node.user_ids,
        "n_items": np.array(node.n_items, dtype=np.int64),
        "n_users_total": np.array(node.n_users_total, dtype=np.int64),
        "has_user_features": np.array(node.user_features is not None),
        "user_features": node.user_features if node.user_features is not None else np.zeros((0, 0)),
        **csr_to_arrays(node.train, "train", sep="_"),
        **csr_to_arrays(node.test, "test", sep="_"),
        **{f"{_ATTR}{name}": values for name, values in node.user_attributes.items()},
    }
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    except OSError as exc:
        warnings.warn(f"fedrec cache disabled: cannot write {path.parent} ({exc})", stacklevel=3)
        return False
    try:
        with os.fdopen(fd, "wb") as fh:
            np.savez(fh, **arrays)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; other local tools may read the cache
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return True


def read_node(path: Path, key: str) -> NodeData | None:
    """The cached node, or None when absent, unreadable, written for another key or holding
    non-finite values."""
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as z:
            if str(z["key"]) != key:
                return None
            node = NodeData(
                partition_id=int(z["partition_id"]),
                user_ids=z["user_ids"],
                train=csr_from_arrays(z, "train", sep="_"),
                test=csr_from_arrays(z, "test", sep="_"),
                user_features=z["user_features"] if bool(z["has_user_features"]) else None,
                n_items=int(z["n_items"]),
                n_users_total=int(z["n_users_total"]),
                user_attributes={name.removeprefix(_ATTR): z[name] for name in z.files
                                 if name.startswith(_ATTR)},
            )
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):
        return None
    return node if _finite(node) else None


def _finite(node: NodeData) -> bool:
    """Whether a cached node's values are all finite: a damaged cache file is re-derived from
    the source files (whose reader names the bad line) instead of being trusted."""
    arrays = (node.train.data, node.test.data,
              node.user_features if node.user_features is not None else np.zeros(0))
    return all(first_non_finite(a) is None for a in arrays)
