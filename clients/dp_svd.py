"""dp-svd node: its users' rows leave only scaled to L2 norm <= 1, inside SecAgg+ sums that
carry its share of distributed discrete Gaussian noise.

The count and iteration handlers refuse a request without a noise record (their shares are
released only noised); the sum layer (``clients/sums_node.py``, ``clients/noise_node.py``)
checks the noise record against the node's policy, clips the whole reply to the record's
L2 bound, adds the share, charges the node's DP ledger and masks, so what a reply reveals
does not depend on the basis or the items the server sends. The evaluation scores the
node's users locally with the released model and answers metric sums.
"""

from __future__ import annotations

import numpy as np
from flwr.app import RecordDict

from clients.handlers import handler
from clients.node import NodeContext
from clients.noise_node import requested
from clients.sums_node import ranking_bytes, sum_reply
from fedrec.recsys.dp_svd import count_share, power_share, scores
from fedrec.recsys.metrics import evaluate_ranking
from fedrec.wire.dp_svd import (
    Action,
    CountRequest,
    CountSum,
    EvaluateRequest,
    IterateRequest,
    IterateSum,
)
from fedrec.wire.evaluation import RankingSum
from fedrec.wire.sums import AggregationError


def _noised(node: NodeContext, what: str) -> None:
    if requested(node) is None:
        raise AggregationError(f"{node.who} refuses a dp-svd {what} without distributed "
                               "noise (its share is released only noised)")


def _items(node: NodeContext, items: np.ndarray) -> np.ndarray:
    """The selected item ids, checked: integers, ascending without repeats, in range."""
    n = node.data().n_items
    ids = np.asarray(items)
    if ids.size and (not np.all(np.isfinite(ids)) or not np.all(ids == np.round(ids))):
        raise ValueError(f"{node.who}: the request's item ids are not integers")
    ids = ids.astype(np.int64)
    if ids.size and (ids[0] < 0 or ids[-1] >= n or np.any(np.diff(ids) <= 0)):
        raise ValueError(f"{node.who}: the request's item ids must ascend without repeats "
                         f"within [0, {n})")
    return ids


@handler(Action.COUNT, sums=True)
def dpsvd_count(content: RecordDict, node: NodeContext) -> RecordDict:
    """Its users' rows, each scaled to L2 norm <= 1, summed: a noisy masked share."""
    _noised(node, "count")
    node.read(CountRequest)
    data = node.data()
    node.reserve(8.0 * (3 * data.train.nnz + data.n_items), "dp-svd counts")
    return sum_reply(node, CountSum(counts=count_share(data.train)))


@handler(Action.ITERATE, sums=True)
def dpsvd_iterate(content: RecordDict, node: NodeContext) -> RecordDict:
    """One power iteration's share ``A_S^T A_S X``: a noisy masked share."""
    _noised(node, "iteration")
    req = node.read(IterateRequest)
    items = _items(node, req.items)
    data = node.data()
    node.reserve(8.0 * (3 * data.train.nnz + 3 * req.X.size
                        + len(data.user_ids) * req.X.shape[1]),
                 f"a dp-svd iteration (rank {req.X.shape[1]}, {items.size} items)")
    return sum_reply(node, IterateSum(product=power_share(data.train, items, req.X)))


@handler(Action.EVALUATE, sums=True)
def dpsvd_evaluate(content: RecordDict, node: NodeContext) -> RecordDict:
    """Recall/NDCG sums of this node's users scored with the released model."""
    data = node.data()
    req = node.read(EvaluateRequest, items=data.n_items)
    items, k = _items(node, req.items), req.top_k
    node.reserve(ranking_bytes(data.n_items, min(1024, len(data.user_ids)), k),
                 f"dp-svd evaluation with top-k={k}")
    sums = evaluate_ranking(
        lambda rows: scores(data.train[rows], items, req.X, data.n_items, req.counts,
                            req.pop_weight),
        data.train, data.test, k=k, batch_size=1024)
    return sum_reply(node, RankingSum(ranking=sums.to_vector()))
