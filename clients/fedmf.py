"""FedMF node: private user factors stay here; item updates leave only as shares of a sum.

``fedmf_train`` answers the FedMF protocol (``strategies/fedmf.py``) through
``clients.sums_node.sum_reply``, so under SecAgg+ the server sees this node's reply masked.
The node keeps its users' factors and its Adam state in ``context.state`` between rounds.
``fedmf_stock_train`` / ``fedmf_stock_evaluate`` answer Flower's stock ``train`` /
``evaluate`` messages (a stock strategy such as ``FedAvg``), which reveal item factors in
clear to the server: that path exists for plugging in Flower strategies, not for privacy.
"""

from __future__ import annotations

import math
from typing import TypeVar

import numpy as np
from flwr.app import ArrayRecord, MetricRecord, RecordDict

from clients.handlers import evaluate_handler, handler, train_handler
from clients.node import NodeContext
from clients.sums_node import ranking_bytes, sum_reply
from fedrec.recsys.metrics import RankingSums, evaluate_ranking
from fedrec.recsys.mf import Adam, bpr_step, bpr_train_local, init_user_factors, item_gradient
from fedrec.wire import request as request_wire
from fedrec.wire.evaluation import RankingSum
from fedrec.wire.fedmf import (
    Action,
    EvaluateRequest,
    ExactSum,
    LocalSum,
    StockConfig,
    TrainRequest,
)
from fedrec.wire.message import Message, message, reply

R = TypeVar("R", bound=Message)
#: The metric of a stock train reply: the mean BPR loss (a stock strategy's history key).
_STOCK_TRAIN_LOSS = "train-loss"
#: This node's private arrays (node-local names, never sent): user factors, and the Adam
#: moments of its users' and its local item factors once local training ran.
_U, _ADAM_U, _ADAM_V = "U", "adamU", "adamV"


# typed so that a corrupted or stale state is refused on reload (clients/state.py)
@message()
class FedMFState(Message):
    """This node's FedMF state: its users' factors and, in local mode, the Adam moments
    (shapes checked against each other on reload: users and items by dimension)."""

    CONFIG = "fedmf.state"
    ARRAYS = "fedmf.users"

    U: np.ndarray = reply(name=_U, shape=("users", "dim"))
    user_m: np.ndarray | None = reply(None, name=f"{_ADAM_U}.m", shape=("users", "dim"))
    user_v: np.ndarray | None = reply(None, name=f"{_ADAM_U}.v", shape=("users", "dim"))
    user_t: np.ndarray | None = reply(None, name=f"{_ADAM_U}.t", shape=(1,))
    item_m: np.ndarray | None = reply(None, name=f"{_ADAM_V}.m", shape=("items", "dim"))
    item_v: np.ndarray | None = reply(None, name=f"{_ADAM_V}.v", shape=("items", "dim"))
    item_t: np.ndarray | None = reply(None, name=f"{_ADAM_V}.t", shape=(1,))


def _load_state(node: NodeContext, dim: int, seed: int) -> dict[str, np.ndarray]:
    """This node's private state: U (and Adam moments once local training ran)."""
    stored = node.load_state(FedMFState)
    if stored is None:
        return {_U: init_user_factors(node.data().user_ids, dim, seed)}
    if stored.U.shape[1] != dim:
        raise ValueError(f"partition {node.partition_id}: stored user factors have dimension "
                         f"{stored.U.shape[1]}, the request's item factors {dim} "
                         "(mf-dim changed within a run?)")
    return stored.to_arrays()


def _store_state(node: NodeContext, state: dict[str, np.ndarray]) -> None:
    """Keep ``state`` (as :func:`_load_state` returns it, updated) as the typed state."""
    node.save_state(FedMFState.from_parts(state, {}, node.who))


def _train_exact(node: NodeContext, req: TrainRequest,
                 state: dict[str, np.ndarray]) -> ExactSum:
    """One full-batch step: this node's summed V-gradient (divided by N on the server).

    No check of the stored factors against ``mf-factor-bound``: the server moves them with
    the V it sends, so a refusal would answer whether this node's users hold the items it
    chose. A value outside the sum's declared range is clipped by the sum layer, inside the
    masked sum (``clients.sums_node.clipped_into_range``): the server learns only how many
    nodes clipped, and the round fails rather than take an inexact step."""
    data = node.data()
    step = bpr_step(state[_U], req.V, data.train, data.user_ids, seed=req.seed,
                    round_=req.round, lr=req.lr, reg=req.reg, negatives=req.negatives)
    state[_U] = step.user_factors
    loss_sum = min(step.loss, req.loss_cap) * step.n_users
    return ExactSum(grad=step.item_grad_sum, weight=np.array([float(step.n_users)]),
                    loss=np.array([loss_sum]))


def _train_local(node: NodeContext, req: TrainRequest,
                 state: dict[str, np.ndarray]) -> LocalSum:
    """Local epochs of mini-batch BPR with Adam; the user-weighted, clipped item delta."""
    data = node.data()
    user_opt = Adam.from_arrays(req.lr, state, _ADAM_U)
    item_opt = Adam.from_arrays(req.lr, state, _ADAM_V)
    out = bpr_train_local(state[_U], req.V, data.train, data.user_ids, seed=req.seed,
                          round_=req.round, epochs=req.epochs, batch_size=req.batch_size,
                          reg=req.reg, negatives=req.negatives, user_opt=user_opt,
                          item_opt=item_opt)
    state.update({_U: out.user_factors, **user_opt.to_arrays(_ADAM_U),
                  **item_opt.to_arrays(_ADAM_V)})
    raw = out.item_factors - req.V
    w = float(out.n_users)
    clipped = float(np.mean(np.abs(raw) > req.clip)) if raw.size else 0.0
    return LocalSum(delta=w * np.clip(raw, -req.clip, req.clip), weight=np.array([w]),
                    loss=np.array([w * min(out.loss, req.loss_cap)]),
                    clipped=np.array([w * clipped]))


def _ranking(node: NodeContext, V: np.ndarray, seed: int, k: int) -> RankingSums:
    """Recall/NDCG/... sums of this node's users on their own test rows, scored U V^T."""
    data = node.data()
    batch = 1024
    node.reserve(8.0 * len(data.user_ids) * V.shape[1]
                 + ranking_bytes(data.n_items, min(batch, len(data.user_ids)), k),
                 f"FedMF evaluation (mf-dim={V.shape[1]}) with top-k={k}")
    U = _load_state(node, V.shape[1], seed)[_U]
    return evaluate_ranking(lambda rows: U[rows] @ V.T, data.train, data.test, k=k,
                            batch_size=batch)


def _request(node: NodeContext, cls: type[R]) -> R:
    """The request as ``cls``, its item factors items x mf-dim for this node's items."""
    return node.read(cls, items=node.data().n_items)


def _reserve_training(node: NodeContext, dim: int, negatives: int, batch_size: int,
                      epochs: int, mode: str) -> None:
    """Refuse before training when the server's mf-dim, negatives and batch size would need
    more than this node's memory budget: index and loss arrays per BPR triple (negatives
    per training pair), per-triple factor rows (every triple at once in exact mode, one
    batch in local mode), and user and item factors with gradients and Adam moments."""
    data = node.data()
    # the published bound on the interactions, never their count: a refusal then depends
    # on the handshake's numbers and the server's sizes only
    triples = float(node.interactions_bound()) * negatives
    if mode == "local":
        # every epoch takes ceil(triples / batch) Adam steps over the whole U and V
        node.check_iterations(epochs, "epochs", times=max(math.ceil(triples / batch_size), 1))
        rows_at_once = min(float(batch_size), triples)
    else:
        rows_at_once = triples
    n_bytes = 8.0 * (8 * triples + 6 * rows_at_once * dim
                     + 6 * (len(data.user_ids) + data.n_items) * dim)
    node.reserve(n_bytes, f"FedMF {mode} training (mf-dim={dim}, negatives, batch size)")


@handler(Action.TRAIN, sums=True)
def fedmf_train(content: RecordDict, node: NodeContext) -> RecordDict:
    """Train this node's users on the broadcast V; reply this node's share of the item sum."""
    req = _request(node, TrainRequest)
    _reserve_training(node, req.V.shape[1], req.negatives, req.batch_size, req.epochs,
                      req.mode)
    state = _load_state(node, req.V.shape[1], req.seed)
    train = _train_exact if req.mode == "exact" else _train_local
    reply = sum_reply(node, train(node, req, state))
    _store_state(node, state)  # kept only once the reply passed every check
    return reply


@handler(Action.EVALUATE, sums=True)
def fedmf_evaluate(content: RecordDict, node: NodeContext) -> RecordDict:
    """Recall/NDCG sums of this node's users with the final V, as its share of a sum."""
    req = _request(node, EvaluateRequest)
    sums = _ranking(node, req.V, req.seed, req.top_k)
    return sum_reply(node, RankingSum(ranking=sums.to_vector()))


# -- Flower's stock train / evaluate messages (a stock strategy drives the nodes) -------------
@train_handler("fedmf")
def fedmf_stock_train(content: RecordDict, node: NodeContext) -> RecordDict:
    """One full-batch BPR step; reply the updated item factors IN CLEAR (stock FedAvg path).

    FedAvg weights the reply by ``num-examples`` = users with training items here, which
    makes its average exactly the centralized step (``fedrec/recsys/mf.py``). The server sees
    this node's item factors, so the node's policy must allow plain replies.
    """
    node.policy.require("allow-plain", "Flower's stock train round (the server would see this "
                        "node's updated item factors in clear)", f"partition {node.partition_id}")
    cfg = node.read(StockConfig)
    V = _stock_V(node, content)
    _reserve_training(node, V.shape[1], cfg.mf_negatives, 1, 1, "exact")
    data = node.data()
    state = _load_state(node, V.shape[1], cfg.seed)
    step = bpr_step(state[_U], V, data.train, data.user_ids, seed=cfg.seed,
                    round_=cfg.server_round, lr=cfg.mf_lr, reg=cfg.mf_reg,
                    negatives=cfg.mf_negatives)
    _store_state(node, {_U: step.user_factors})
    V_new = V - cfg.mf_lr * item_gradient(V, step.item_grad_sum, step.n_users, cfg.mf_reg)
    return RecordDict({
        request_wire.ARRAYS: ArrayRecord([V_new]),
        request_wire.METRICS: MetricRecord({request_wire.NUM_EXAMPLES: step.n_users,
                                            _STOCK_TRAIN_LOSS: step.loss}),
    })


def _stock_V(node: NodeContext, content: RecordDict) -> np.ndarray:
    """A stock strategy's model: the ArrayRecord's one array, items x mf-dim."""
    arrays = content.array_records[request_wire.ARRAYS].to_numpy_ndarrays()
    n_items = node.data().n_items
    if len(arrays) != 1 or arrays[0].ndim != 2 or arrays[0].shape[0] != n_items:
        raise ValueError(f"{node.who}: a stock strategy's model must be one array of "
                         f"({n_items}, mf-dim) item factors")
    return arrays[0]


@evaluate_handler("fedmf")
def fedmf_stock_evaluate(content: RecordDict, node: NodeContext) -> RecordDict:
    """Recall/NDCG@K of this node's users on their own test rows (means, weighted by users).

    Answered in clear for whatever V the server sends: an oracle on this node's train and
    test items (a chosen V probes them), so the node's policy must allow plain replies, as
    for the stock train round. The protocol's own evaluation is a secure sum."""
    node.policy.require("allow-plain", "Flower's stock evaluate round (the server would see "
                        "this node's metrics in clear for a model it chose)", node.who)
    cfg = node.read(StockConfig)
    sums = _ranking(node, _stock_V(node, content), cfg.seed, cfg.top_k)
    metrics = {name: float(value) for name, value in sums.means().items()}
    return RecordDict({request_wire.METRICS: MetricRecord({
        request_wire.NUM_EXAMPLES: sums.n_users, **metrics})})
