"""FedMVMF / PrivMVMF nodes (paper 004): user nodes and the item server.

A user node keeps its users' ratings, attributes and factors p_i; its summed gradients
leave only as a share of a sum (``clients.sums_node.sum_reply``: masked, CKKS-encrypted or,
with the node's ``allow-plain``, clear). SGD factors stay in the node state between epochs.
The item server answers sum_d f(j,d) and the eq. 17 factors of its new items in clear (the
paper's Alg. 2: item features are not private). Math: ``fedrec/recsys/multiview.py``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from flwr.app import RecordDict

from clients.handlers import handler
from clients.node import NodeContext
from clients.sums_node import sum_reply
from fedrec.records import to_array_record
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
from fedrec.wire import evaluation as evaluation_wire
from fedrec.wire import mvmf as mvmf_wire
from fedrec.wire import request as request_wire
from fedrec.wire.mvmf import Action

_FACTORS = "mvmf.factors"  # node state: SGD users' ids and factors


def _model(node: NodeContext) -> MVMFConfig:
    """The request's model config; its dimension K is a server-chosen size."""
    cfg = node.config()
    return MVMFConfig(dim=node.size(cfg, "dim"), lam1=float(cfg["lam1"]),
                      lam2=float(cfg["lam2"]),
                      alpha=float(cfg["alpha"]), rho=float(cfg["rho"]),
                      weighting=str(cfg["weighting"]), p_update=str(cfg["p-update"]),
                      lr=float(cfg["lr"]), beta1=float(cfg["beta1"]), beta2=float(cfg["beta2"]),
                      seed=int(cfg["seed"]))


def _require(node: NodeContext, role: str, action: str) -> None:
    if node.role != role:
        raise PermissionError(f"{node.who} has role {node.role!r}; '{action}' is for a "
                              f"{role} node")


def _user_inputs(node: NodeContext, model: MVMFConfig) -> tuple[Any, np.ndarray, np.ndarray,
                                                                np.ndarray]:
    """This node's rows, dummy attributes and the request's Q and U, checked."""
    data = node.data()
    K = model.dim
    # per block of BLOCK users: K x K systems and dense items x K rows; factors, gradients
    node.reserve(8.0 * (BLOCK * K * K * 2 + 4 * BLOCK * data.n_items * (K + 1)
                        + 4 * (data.n_items + len(data.user_ids)) * K),
                 f"MVMF user step (dim={K})")
    dcfg = node.data_config()
    X = check_attributes(attribute_matrix(data.user_attributes, str(dcfg["dataset"]),
                                          int(dcfg.get("synthetic-clusters", 10)), node.who),
                         node.who)
    arrays = node.arrays()
    Q, U = arrays["Q"], arrays["U"]
    if Q.shape != (data.n_items, model.dim) or U.shape != (X.shape[1], model.dim):
        raise ValueError(f"{node.who}: the request's Q {Q.shape} / U {U.shape} do not fit "
                         f"{data.n_items} items, {X.shape[1]} attributes and K={model.dim}")
    return data, X, Q, U


def _factors(node: NodeContext) -> dict[int, np.ndarray]:
    stored = node.load_arrays(_FACTORS)
    if stored is None:
        return {}
    return {int(u): p for u, p in zip(stored["ids"], stored["P"])}


@handler(Action.TRAIN, sums=True)
def mvmf_train(content: RecordDict, node: NodeContext) -> RecordDict:
    """One epoch of this node's users; their summed gradients as a share of a sum."""
    _require(node, "user", Action.TRAIN)
    cfg = node.config()
    model = _model(node)
    data, X, Q, U = _user_inputs(node, model)
    step = users_step(data.train, X, data.user_ids, Q, U, model,
                      node.size(cfg, "epoch", minimum=0),
                      _factors(node))
    reply = sum_reply(node, {"gQ": step.grad_Q, "gU": step.grad_U,
                             "loss": np.array([step.loss]),
                             "users": np.array([float(step.n_users)])})
    if model.p_update == "sgd" and step.factors:  # kept once the reply passed its checks
        ids = np.array(sorted(step.factors), dtype=np.int64)
        node.store_arrays(_FACTORS, {"ids": ids,
                                     "P": np.stack([step.factors[int(u)] for u in ids])})
    return reply


@handler(Action.EVALUATE, sums=True)
def mvmf_evaluate(content: RecordDict, node: NodeContext) -> RecordDict:
    """Ranking sums of this node's users (new users' p from eq. 15) as a share of a sum."""
    _require(node, "user", Action.EVALUATE)
    cfg = node.config()
    model = _model(node)
    data, X, Q, U = _user_inputs(node, model)
    top_k = node.size(cfg, evaluation_wire.TOP_K)
    # every user's scores P Q^T and the ranked copies of them the metric sums make
    node.reserve(8.0 * len(data.user_ids) * (6.0 * data.n_items + 2.0 * model.dim),
                 f"MVMF evaluation (dim={model.dim})")
    P = user_factors_for_scoring(data.train, X, data.user_ids, Q, U, model,
                                 node.size(cfg, "epoch", minimum=0), _factors(node))
    sums = rating_ranking_sums(user_scores(P, Q), data.train, data.test,
                               top_k, float(cfg["threshold"]),
                               _new_items(node, data.n_items))
    return sum_reply(node, {evaluation_wire.RANKING: sums})


def _new_items(node: NodeContext, n_items: int) -> np.ndarray | None:
    """The request's new (cold-start) items, the all-unrated candidates of a cold-item
    split; absent or empty: every item. Server-named like Q itself, which already decides
    every item's score; what a chosen list reveals is a per-item count over the node set
    (docs/threat-model.md, FedMVMF / PrivMVMF)."""
    raw = node.arrays().get(mvmf_wire.NEW_ITEMS)
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


def _item_inputs(node: NodeContext, action: str) -> tuple[Any, np.ndarray, np.ndarray]:
    _require(node, "item-server", action)
    data = node.data()
    Y = check_item_features(data.item_features, data.n_items, node.who)
    Q = node.arrays()["Q"]
    if Q.ndim != 2 or Q.shape[0] != data.n_items:
        raise ValueError(f"{node.who}: the request's Q has shape {Q.shape}, expected "
                         f"({data.n_items}, K) for {data.n_items} items")
    K = Q.shape[1]
    # Q^T Q, V (features x K) and the residual E = Y - Q V^T, items x features, twice
    node.reserve(8.0 * (K * K * 2 + Y.shape[1] * K * 3 + data.n_items * (Y.shape[1] * 3 + K)),
                 f"MVMF item-server step (K={K})")
    return data, Y, Q


@handler(Action.ITEM_GRADIENT)
def mvmf_item_gradient(content: RecordDict, node: NodeContext) -> RecordDict:
    """The item server: V (eq. 11) for the broadcast Q, and sum_d f(j,d) in clear."""
    model = _model(node)
    _, Y, Q = _item_inputs(node, Action.ITEM_GRADIENT)
    _, term, loss = item_server_step(Y, Q, model.lam1, model.lam2)
    return RecordDict({request_wire.ARRAYS: to_array_record({mvmf_wire.ITEM_TERM: term,
                                                            "loss": np.array([loss])})})


@handler(Action.ITEM_COLD)
def mvmf_item_cold(content: RecordDict, node: NodeContext) -> RecordDict:
    """The item server: its new items and their factors from eq. 17 (V from the final Q)."""
    model = _model(node)
    data, Y, Q = _item_inputs(node, Action.ITEM_COLD)
    V, _, _ = item_server_step(Y, Q, model.lam1, model.lam2)
    cold = np.asarray(data.cold_items, dtype=np.int64)
    rows = cold_item_factors(Y[cold], V, model.lam1, model.lam2) if cold.size else \
        np.zeros((0, Q.shape[1]))
    return RecordDict({request_wire.ARRAYS: to_array_record({
        mvmf_wire.COLD_ITEMS: cold.astype(np.float64), mvmf_wire.COLD_FACTORS: rows})})
