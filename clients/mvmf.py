"""FedMVMF / PrivMVMF nodes (paper 004): user nodes and the item server.

A user node keeps its users' ratings, attributes and factors p_i; its summed gradients
leave only as a share of a sum (``clients.sums_node.sum_reply``: masked, CKKS-encrypted or,
with the node's ``allow-plain``, clear). SGD factors stay in the node state between epochs.
The item server answers sum_d f(j,d) and the eq. 17 factors of its new items in clear (the
paper's Alg. 2: item features are not private). Math: ``fedrec/recsys/multiview.py``.
"""

from __future__ import annotations

from typing import Any, TypeVar

import numpy as np
from flwr.app import RecordDict

from clients.handlers import handler
from clients.node import NodeContext
from clients.sums_node import sum_reply
from fedrec.recsys.multiview import (
    BLOCK,
    MVMFConfig,
    attribute_matrix,
    check_attributes,
    check_item_features,
    cold_item_factors,
    item_server_step,
    rating_ranking_sums,
    user_factors_for_scoring,
    user_scores,
    users_step,
)
from fedrec.wire import mvmf as mvmf_wire
from fedrec.wire.evaluation import RankingSum
from fedrec.wire.message import Message, message, reply
from fedrec.wire.mvmf import (
    Action,
    ColdFactors,
    EvaluateRequest,
    ItemColdRequest,
    ItemGradientRequest,
    ItemTerm,
    ModelRequest,
    TrainRequest,
    TrainSum,
)

#: The item server's requests, and the user nodes'.
ItemReq = TypeVar("ItemReq", ItemGradientRequest, ItemColdRequest)
UserReq = TypeVar("UserReq", TrainRequest, EvaluateRequest)
#: Node-local names of the SGD users' ids and factors (never sent).
_IDS, _P = "ids", "P"


# typed so that a corrupted or stale state is refused on reload (clients/state.py)
@message()
class MVMFFactors(Message):
    """The factors p_i of this node's users that SGD moved (``p-update = sgd``), kept between
    epochs and never sent: one id and one row of dimension K per such user."""

    CONFIG = "mvmf.state"  # empty: marks the state kept
    ARRAYS = "mvmf.factors"

    ids: np.ndarray = reply(name=_IDS, shape=("kept",))
    P: np.ndarray = reply(name=_P, shape=("kept", "dim"))


def _model(req: ModelRequest) -> MVMFConfig:
    """The request's model config (``MVMFConfig`` checks the ranges)."""
    return MVMFConfig(dim=req.dim, lam1=req.lam1, lam2=req.lam2, alpha=req.alpha, rho=req.rho,
                      weighting=req.weighting, p_update=req.p_update, lr=req.lr,
                      beta1=req.beta1, beta2=req.beta2, seed=req.seed)


def _require(node: NodeContext, role: str, action: str) -> None:
    if node.role != role:
        raise PermissionError(f"{node.who} has role {node.role!r}; '{action}' is for a "
                              f"{role} node")


def _user_inputs(node: NodeContext, cls: type[UserReq]
                 ) -> tuple[Any, np.ndarray, UserReq, MVMFConfig]:
    """This node's rows and dummy attributes, and the request, its Q and U checked against
    them and against K."""
    data = node.data()
    req = node.read(cls, items=data.n_items)
    model = _model(req)
    K = model.dim
    # per block of BLOCK users: K x K systems and dense items x K rows; factors, gradients
    node.reserve(8.0 * (BLOCK * K * K * 2 + 4 * BLOCK * data.n_items * (K + 1)
                        + 4 * (data.n_items + len(data.user_ids)) * K),
                 f"MVMF user step (dim={K})")
    dcfg = node.data_config()
    X = check_attributes(attribute_matrix(data.user_attributes, str(dcfg["dataset"]),
                                          int(dcfg.get("synthetic-clusters", 10)), node.who),
                         node.who)
    Q, U = req.Q, req.U
    if Q.shape != (data.n_items, model.dim) or U.shape != (X.shape[1], model.dim):
        raise ValueError(f"{node.who}: the request's Q {Q.shape} / U {U.shape} do not fit "
                         f"{data.n_items} items, {X.shape[1]} attributes and K={model.dim}")
    return data, X, req, model


def _factors(node: NodeContext, model: MVMFConfig) -> dict[int, np.ndarray]:
    """The SGD users' kept factors by user id, of the model's dimension K."""
    stored = node.load_state(MVMFFactors, dims={"dim": model.dim})
    if stored is None:
        return {}
    return {int(u): p for u, p in zip(stored.ids, stored.P)}


@handler(Action.TRAIN, sums=True)
def mvmf_train(content: RecordDict, node: NodeContext) -> RecordDict:
    """One epoch of this node's users; their summed gradients as a share of a sum."""
    _require(node, "user", Action.TRAIN)
    data, X, req, model = _user_inputs(node, TrainRequest)
    step = users_step(data.train, X, data.user_ids, req.Q, req.U, model, req.epoch,
                      _factors(node, model))
    reply = sum_reply(node, TrainSum(gQ=step.grad_Q, gU=step.grad_U,
                                     loss=np.array([step.loss]),
                                     users=np.array([float(step.n_users)])))
    if model.p_update == "sgd" and step.factors:  # kept once the reply passed its checks
        ids = np.array(sorted(step.factors), dtype=np.int64)
        node.save_state(MVMFFactors(ids=ids, P=np.stack([step.factors[int(u)] for u in ids])))
    return reply


@handler(Action.EVALUATE, sums=True)
def mvmf_evaluate(content: RecordDict, node: NodeContext) -> RecordDict:
    """Ranking sums of this node's users (new users' p from eq. 15) as a share of a sum."""
    _require(node, "user", Action.EVALUATE)
    data, X, req, model = _user_inputs(node, EvaluateRequest)
    # every user's scores P Q^T and the ranked copies of them the metric sums make
    node.reserve(8.0 * len(data.user_ids) * (6.0 * data.n_items + 2.0 * model.dim),
                 f"MVMF evaluation (dim={model.dim})")
    P = user_factors_for_scoring(data.train, X, data.user_ids, req.Q, req.U, model, req.epoch,
                                 _factors(node, model))
    sums = rating_ranking_sums(user_scores(P, req.Q), data.train, data.test, req.top_k,
                               req.threshold, _new_items(node, req.new_items, data.n_items))
    return sum_reply(node, RankingSum(ranking=sums))


def _new_items(node: NodeContext, raw: np.ndarray | None, n_items: int) -> np.ndarray | None:
    """The request's new (cold-start) items, the all-unrated candidates of a cold-item
    split; absent or empty: every item. Server-named like Q itself, which already decides
    every item's score; what a chosen list reveals is a per-item count over the node set
    (docs/threat-model.md, FedMVMF / PrivMVMF)."""
    if raw is None or raw.size == 0:
        return None
    items = np.asarray(raw, dtype=np.float64).ravel()
    ok = bool(np.all(np.isfinite(items)) and np.all(items == np.round(items))
              and items.min() >= 0 and items.max() < n_items
              and np.unique(items).size == items.size)
    if not ok:
        raise ValueError(f"{node.who}: the request's '{mvmf_wire.NEW_ITEMS}' must be distinct "
                         f"integer item indices in [0, {n_items}); its {items.size} values are not")
    return items.astype(np.int64)


def _item_inputs(node: NodeContext, cls: type[ItemReq]
                 ) -> tuple[Any, np.ndarray, ItemReq, MVMFConfig]:
    """The item server's features, the request (Q items x K, K Q's own) and its model."""
    _require(node, "item-server", str(cls.ACTION))
    data = node.data()
    Y = check_item_features(data.item_features, data.n_items, node.who)
    req = node.read(cls, items=data.n_items)
    model = _model(req)
    K = req.Q.shape[1]
    # Q^T Q, V (features x K) and the residual E = Y - Q V^T, items x features, twice
    node.reserve(8.0 * (K * K * 2 + Y.shape[1] * K * 3 + data.n_items * (Y.shape[1] * 3 + K)),
                 f"MVMF item-server step (K={K})")
    return data, Y, req, model


@handler(Action.ITEM_GRADIENT)
def mvmf_item_gradient(content: RecordDict, node: NodeContext) -> RecordDict:
    """The item server: V (eq. 11) for the broadcast Q, and sum_d f(j,d) in clear."""
    _, Y, req, model = _item_inputs(node, ItemGradientRequest)
    _, term, loss = item_server_step(Y, req.Q, model.lam1, model.lam2)
    return ItemTerm(item_term=term, loss=np.array([loss])).to_records()


@handler(Action.ITEM_COLD)
def mvmf_item_cold(content: RecordDict, node: NodeContext) -> RecordDict:
    """The item server: its new items and their factors from eq. 17 (V from the final Q)."""
    data, Y, req, model = _item_inputs(node, ItemColdRequest)
    V, _, _ = item_server_step(Y, req.Q, model.lam1, model.lam2)
    cold = np.asarray(data.cold_items, dtype=np.int64)
    rows = cold_item_factors(Y[cold], V, model.lam1, model.lam2) if cold.size else \
        np.zeros((0, req.Q.shape[1]))
    return ColdFactors(cold_items=cold.astype(np.float64), cold_factors=rows).to_records()
