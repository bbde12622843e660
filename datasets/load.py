"""Entry points: the whole dataset (load_dataset) and one node's rows (load_node_data)."""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from . import cache, movielens, split_files, synthetic
from .containers import InteractionData, NodeData, RawData
from .errors import DataError
from .partition import PartitionSpec, partition_users
from .sources import locate
from .spec import DatasetSpec
from .split import binarize, cold_start, holdout

# Independent random streams per purpose, so e.g. cold start does not shift the split.
_STREAM_SPLIT, _STREAM_COLD = 2, 3


def _read_raw(spec: DatasetSpec, files: dict[str, Path]) -> RawData:
    """Dispatch to the source reader for spec.name."""
    if spec.name == "synthetic":
        return synthetic.generate(
            spec.synthetic_users,
            spec.synthetic_items,
            spec.synthetic_rank,
            spec.synthetic_density,
            spec.seed,
            clusters=spec.synthetic_clusters,
            popularity_skew=spec.synthetic_popularity_skew,
            feature_noise=spec.synthetic_feature_noise,
        )
    if spec.name == "ml-100k":
        return movielens.load_ml100k(files)
    if spec.name == "ml-1m":
        return movielens.load_ml1m(files)
    return split_files.load_split(files)


def _prepare(spec: DatasetSpec, raw: RawData) -> InteractionData:
    """Apply min-rating/implicit, the holdout split (if none given) and cold start."""
    if raw.ratings is not None:
        ratings = binarize(raw.ratings, spec.implicit, spec.min_rating)
        rng = np.random.default_rng([spec.seed, _STREAM_SPLIT])
        train, test = holdout(ratings, spec.test_ratio, rng)
    else:
        assert raw.train is not None and raw.test is not None
        if spec.min_rating > 1.0 and not raw.has_ratings:
            raise DataError(
                f"{spec.name}: min-rating {spec.min_rating} would drop every interaction "
                f"(the data are implicit, 1.0 per interaction)"
            )
        train = binarize(raw.train, spec.implicit, spec.min_rating)
        test = binarize(raw.test, spec.implicit, spec.min_rating)
    item_features = raw.item_features
    if spec.drop_cold_items:  # after the split: the items it left without a training row
        keep = np.flatnonzero(train.getnnz(axis=0) > 0)
        train, test = train[:, keep].tocsr(), test[:, keep].tocsr()
        if item_features is not None and item_features.shape[0] == raw.shape[1]:
            item_features = item_features[keep]
    n_users, n_items = train.shape
    for label, feats, n in (("user", raw.user_features, n_users), ("item", item_features, n_items)):
        if feats is not None and feats.shape[0] != n:
            raise DataError(f"{spec.name}: {feats.shape[0]} {label} feature rows for {n} {label}s")
    rng = np.random.default_rng([spec.seed, _STREAM_COLD])
    train, test, cold_users, cold_items = cold_start(
        train, test, spec.cold_start_users, spec.cold_start_items, rng
    )
    return InteractionData(
        train=train,
        test=test,
        user_features=raw.user_features,
        item_features=item_features,
        user_attributes=raw.user_attributes,
        cold_users=cold_users,
        cold_items=cold_items,
        name=spec.name,
    )


@functools.lru_cache(maxsize=4)
def _load_by_key(key: str, spec: DatasetSpec, files: tuple[tuple[str, Path], ...]) -> InteractionData:
    """Per-process memo of full loads, keyed by the spec hash (includes file mtimes)."""
    return _prepare(spec, _read_raw(spec, dict(files)))


def _key_and_files(spec: DatasetSpec) -> tuple[str, tuple[tuple[str, Path], ...]]:
    files = locate(spec.name, spec.data_dir)
    return cache.dataset_key(spec, files), tuple(sorted(files.items()))


def load_dataset(spec: DatasetSpec) -> InteractionData:
    """The whole dataset, for centralized references and partitioning.

    Memoized per process: the returned object is shared, copy before mutating.
    """
    key, files = _key_and_files(spec)
    return _load_by_key(key, spec, files)


def load_node_data(spec: DatasetSpec, part: PartitionSpec, partition_id: int) -> NodeData:
    """The rows of node `partition_id` only, from the disk cache when present."""
    if not 0 <= partition_id < part.num_partitions:
        raise DataError(
            f"partition id {partition_id} out of range for {part.num_partitions} partitions "
            f"(scheme {part.scheme!r})"
        )
    key, files = _key_and_files(spec)
    path = cache.node_path(spec, key, part, partition_id)
    node = cache.read_node(path, key)
    if node is not None:
        return node
    data = _load_by_key(key, spec, files)
    users = partition_users(data, part)[partition_id]
    node = NodeData(
        partition_id=partition_id,
        user_ids=users,
        train=data.train[users],
        test=data.test[users],
        user_features=None if data.user_features is None else data.user_features[users].copy(),
        n_items=data.n_items,
        n_users_total=data.n_users,
        user_attributes={k: v[users].copy() for k, v in data.user_attributes.items()},
    )
    cache.write_node(path, key, node)
    return node


#: Bytes of a row digest (:func:`row_digests`): 128 bits, so distinct rows never collide in
#: practice, and a collision only makes two rows share one DP budget.
ROW_DIGEST_BYTES = 16


def row_digests(spec: DatasetSpec, user_ids: np.ndarray) -> list[bytes]:
    """A content digest of each user's rows, for the node's DP ledger.

    Why: a DP budget must follow the people a release is about, not the names the server's
    run config gives them. The digest is SHA-256 over the user's id and the sorted item ids
    the user has any interaction with in the source files, train and test together, before
    min-rating, binarization, the holdout split, cold start or dropping cold items (all
    server-chosen), so the same rows give the same digest from ``.npz`` or text files, under
    any dataset name, folder, partition or split. Ids are the rows and columns the reader
    makes (the ``.npz``'s own; a text file's ids after the 0/1-based shift or remap,
    ``datasets/ids.py``); ratings' values are left out, so a
    binarized copy of a rating file keeps its digests. The user id is in the digest because
    two people can hold the same items (a single popular item, say): without it they would
    share one budget and an honest federation would be refused.
    """
    _, files = _key_and_files(spec)
    table = _row_digests_by_key(_raw_key(spec, files), spec, files)
    return [table[int(u)] for u in user_ids]


def _raw_key(spec: DatasetSpec, files: tuple[tuple[str, Path], ...]) -> str:
    """What the raw rows depend on: the source files, or the synthetic generator's
    settings (a memo key only)."""
    if spec.name == "synthetic":
        return repr((spec.synthetic_users, spec.synthetic_items, spec.synthetic_rank,
                     spec.synthetic_density, spec.seed, spec.synthetic_clusters,
                     spec.synthetic_popularity_skew, spec.synthetic_feature_noise))
    return cache.dataset_key(DatasetSpec(name=spec.name), dict(files))


@functools.lru_cache(maxsize=4)
def _row_digests_by_key(_key: str, spec: DatasetSpec,
                        files: tuple[tuple[str, Path], ...]) -> tuple[bytes, ...]:
    raw = _read_raw(spec, dict(files))
    rows = raw.ratings if raw.ratings is not None else raw.train + raw.test
    rows = sp.csr_matrix(rows)
    rows.sum_duplicates()
    rows.sort_indices()
    out = []
    for u in range(rows.shape[0]):
        items = rows.indices[rows.indptr[u]:rows.indptr[u + 1]].astype(">i8")
        out.append(hashlib.sha256(b"fedrec-row|v1|" + int(u).to_bytes(8, "big") +
                                  items.tobytes()).digest()[:ROW_DIGEST_BYTES])
    return tuple(out)


def load_item_server_data(spec: DatasetSpec) -> NodeData:
    """What an item server holds: the catalogue's item features and which items are new
    (cold-start items), no user rows."""
    key, files = _key_and_files(spec)
    data = _load_by_key(key, spec, files)
    empty = data.train[:0]
    return NodeData(
        partition_id=-1,
        user_ids=np.zeros(0, dtype=np.int64),
        train=empty,
        test=data.test[:0],
        user_features=None,
        n_items=data.n_items,
        n_users_total=data.n_users,
        item_features=None if data.item_features is None else data.item_features.copy(),
        cold_items=data.cold_items.copy(),
    )
