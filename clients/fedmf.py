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
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, MetricRecord, RecordDict

from clients.handlers import evaluate_handler, handler, train_handler
from clients.node import NodeContext
from clients.sums_node import ranking_bytes, sum_reply
from fedrec.recsys.metrics import RankingSums, evaluate_ranking
from fedrec.recsys.mf import Adam, bpr_step, bpr_train_local, init_user_factors, item_gradient
from fedrec.wire import evaluation as evaluation_wire
from fedrec.wire import request as request_wire
from fedrec.wire.fedmf import Action

_STATE = "fedmf.users"


def _load_state(node: NodeContext, dim: int, seed: int) -> dict[str, np.ndarray]:
    """This node's private state: U (and Adam moments once local training ran)."""
    stored = node.load_arrays(_STATE)
    if stored is None:
        return {"U": init_user_factors(node.data().user_ids, dim, seed)}
    if stored["U"].shape[1] != dim:
        raise ValueError(f"partition {node.partition_id}: stored user factors have dimension "
                         f"{stored['U'].shape[1]}, the request's item factors {dim} "
                         "(mf-dim changed within a run?)")
    return dict(stored)


def _train_exact(node: NodeContext, V: np.ndarray, cfg: dict[str, Any],
                 state: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """One full-batch step: this node's summed V-gradient (divided by N on the server).

    No check of the stored factors against ``mf-factor-bound``: the server moves them with
    the V it sends, so a refusal would answer whether this node's users hold the items it
    chose. A value outside the sum's declared range is clipped by the sum layer, inside the
    masked sum (``clients.sums_node.clipped_into_range``): the server learns only how many
    nodes clipped, and the round fails rather than take an inexact step."""
    data = node.data()
    step = bpr_step(state["U"], V, data.train, data.user_ids, seed=int(cfg["seed"]),
                    round_=int(cfg["round"]), lr=float(cfg["lr"]), reg=float(cfg["reg"]),
                    negatives=int(cfg["negatives"]))
    state["U"] = step.user_factors
    loss_sum = min(step.loss, float(cfg["loss-cap"])) * step.n_users
    return {"grad": step.item_grad_sum, "weight": np.array([float(step.n_users)]),
            "loss": np.array([loss_sum])}


def _train_local(node: NodeContext, V: np.ndarray, cfg: dict[str, Any],
                 state: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Local epochs of mini-batch BPR with Adam; the user-weighted, clipped item delta."""
    data = node.data()
    lr = float(cfg["lr"])
    user_opt, item_opt = Adam.from_arrays(lr, state, "adamU"), Adam.from_arrays(lr, state, "adamV")
    out = bpr_train_local(state["U"], V, data.train, data.user_ids, seed=int(cfg["seed"]),
                          round_=int(cfg["round"]), epochs=int(cfg["epochs"]),
                          batch_size=int(cfg["batch-size"]), reg=float(cfg["reg"]),
                          negatives=int(cfg["negatives"]), user_opt=user_opt, item_opt=item_opt)
    state.update({"U": out.user_factors, **user_opt.to_arrays("adamU"),
                  **item_opt.to_arrays("adamV")})
    clip = float(cfg["clip"])
    raw = out.item_factors - V
    w = float(out.n_users)
    clipped = float(np.mean(np.abs(raw) > clip)) if raw.size else 0.0
    return {"delta": w * np.clip(raw, -clip, clip), "weight": np.array([w]),
            "loss": np.array([w * min(out.loss, float(cfg["loss-cap"]))]),
            "clipped": np.array([w * clipped])}


def _ranking(node: NodeContext, V: np.ndarray, seed: int, k: int) -> RankingSums:
    """Recall/NDCG/... sums of this node's users on their own test rows, scored U V^T."""
    data = node.data()
    batch = 1024
    node.reserve(8.0 * len(data.user_ids) * V.shape[1]
                 + ranking_bytes(data.n_items, min(batch, len(data.user_ids)), k),
                 f"FedMF evaluation (mf-dim={V.shape[1]}) with top-k={k}")
    U = _load_state(node, V.shape[1], seed)["U"]
    return evaluate_ranking(lambda rows: U[rows] @ V.T, data.train, data.test, k=k,
                            batch_size=batch)


def _checked_V(node: NodeContext, V: np.ndarray) -> np.ndarray:
    """The request's item factors, items x mf-dim (the dimension is the server's choice)."""
    n_items = node.data().n_items
    if V.ndim != 2 or V.shape[0] != n_items or V.shape[1] < 1:
        raise ValueError(f"{node.who}: the request's item factors V have shape {V.shape}, "
                         f"expected ({n_items}, mf-dim >= 1) for {n_items} items")
    return V


def _reserve_training(node: NodeContext, V: np.ndarray, cfg: dict[str, Any], mode: str) -> None:
    """Refuse before training when the server's mf-dim, negatives and batch size would need
    more than this node's memory budget: index and loss arrays per BPR triple (negatives
    per training pair), per-triple factor rows (every triple at once in exact mode, one
    batch in local mode), and user and item factors with gradients and Adam moments."""
    data = node.data()
    dim = V.shape[1]
    # the published bound on the interactions, never their count: a refusal then depends
    # on the handshake's numbers and the server's sizes only
    triples = float(node.interactions_bound()) * node.size(cfg, "negatives")
    if mode == "local":
        batch = node.size(cfg, "batch-size")
        # every epoch takes ceil(triples / batch) Adam steps over the whole U and V
        node.iterations(cfg, "epochs", minimum=1, times=max(math.ceil(triples / batch), 1))
        rows_at_once = min(float(batch), triples)
    else:
        rows_at_once = triples
    n_bytes = 8.0 * (8 * triples + 6 * rows_at_once * dim
                     + 6 * (len(data.user_ids) + data.n_items) * dim)
    node.reserve(n_bytes, f"FedMF {mode} training (mf-dim={dim}, negatives, batch size)")


@handler(Action.TRAIN, sums=True)
def fedmf_train(content: RecordDict, node: NodeContext) -> RecordDict:
    """Train this node's users on the broadcast V; reply this node's share of the item sum."""
    cfg = node.config()
    V = _checked_V(node, node.arrays()["V"])
    mode = str(cfg["mode"])
    if mode not in ("exact", "local"):
        raise ValueError(f"partition {node.partition_id}: unknown mf-mode {mode!r}")
    _reserve_training(node, V, cfg, mode)
    state = _load_state(node, V.shape[1], int(cfg["seed"]))
    train = _train_exact if mode == "exact" else _train_local
    reply = sum_reply(node, train(node, V, cfg, state))
    node.store_arrays(_STATE, state)  # kept only once the reply passed every check
    return reply


@handler(Action.EVALUATE, sums=True)
def fedmf_evaluate(content: RecordDict, node: NodeContext) -> RecordDict:
    """Recall/NDCG sums of this node's users with the final V, as its share of a sum."""
    cfg = node.config()
    V = _checked_V(node, node.arrays()["V"])
    sums = _ranking(node, V, int(cfg["seed"]), node.size(cfg, evaluation_wire.TOP_K, default=20))
    return sum_reply(node, {evaluation_wire.RANKING: sums.to_vector()})


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
    cfg = content.config_records[request_wire.STOCK_CONFIG]
    V = _checked_V(node, content.array_records[request_wire.ARRAYS].to_numpy_ndarrays()[0])
    _reserve_training(node, V, {"negatives": cfg["mf-negatives"]}, "exact")
    data = node.data()
    seed = int(cfg["seed"])
    state = _load_state(node, V.shape[1], seed)
    lr, reg = float(cfg["mf-lr"]), float(cfg["mf-reg"])
    step = bpr_step(state["U"], V, data.train, data.user_ids, seed=seed,
                    round_=int(cfg["server-round"]), lr=lr, reg=reg,
                    negatives=int(cfg["mf-negatives"]))
    node.store_arrays(_STATE, {"U": step.user_factors})
    V_new = V - lr * item_gradient(V, step.item_grad_sum, step.n_users, reg)
    return RecordDict({
        request_wire.ARRAYS: ArrayRecord([V_new]),
        request_wire.METRICS: MetricRecord({"num-examples": step.n_users,
                                            "train-loss": step.loss}),
    })


@evaluate_handler("fedmf")
def fedmf_stock_evaluate(content: RecordDict, node: NodeContext) -> RecordDict:
    """Recall/NDCG@K of this node's users on their own test rows (means, weighted by users).

    Answered in clear for whatever V the server sends: an oracle on this node's train and
    test items (a chosen V probes them), so the node's policy must allow plain replies, as
    for the stock train round. The protocol's own evaluation is a secure sum."""
    node.policy.require("allow-plain", "Flower's stock evaluate round (the server would see "
                        "this node's metrics in clear for a model it chose)", node.who)
    cfg = content.config_records[request_wire.STOCK_CONFIG]
    V = _checked_V(node, content.array_records[request_wire.ARRAYS].to_numpy_ndarrays()[0])
    sums = _ranking(node, V, int(cfg["seed"]), node.size(cfg, evaluation_wire.TOP_K, default=20))
    metrics = {name: float(value) for name, value in sums.means().items()}
    return RecordDict({request_wire.METRICS: MetricRecord({"num-examples": sums.n_users,
                                                           **metrics})})
