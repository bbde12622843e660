"""dp-fedmf node: its users' factors stay here; its item update leaves only clipped, inside
a SecAgg+ sum that carries its share of distributed discrete Gaussian noise.

Each training round (``strategies/dp_fedmf.py``): the node updates its users' factors on
the broadcast V (private), draws its own participation (``clients/noise_node.py``
``participates``: a ChaCha20 stream keyed by the OS, rate from the request, accounted as
Poisson sampling), and answers with its clipped item update, or zeros, through
``sum_reply``; the sum layer clips the whole reply to the request's L2 bound again, adds
the noise share after fixed-point encoding, charges the node's DP ledger first and masks
(``clients/sums_node.py``). The server sees the reply masked, whether or not the node took
part.
"""

from __future__ import annotations

import numpy as np
from flwr.app import RecordDict

from clients.handlers import handler
from clients.node import NodeContext
from clients.noise_node import participates, requested, run_epsilon
from clients.sums_node import ranking_bytes, sum_reply
from fedrec.recsys.dp_mf import DPMFParams, round_updates
from fedrec.recsys.metrics import evaluate_ranking
from fedrec.recsys.mf import init_user_factors
from fedrec.wire import evaluation as evaluation_wire
from fedrec.wire.dp_fedmf import DELTA, Action
from fedrec.wire.sums import AggregationError

_STATE = "dpfedmf.users"


def _users(node: NodeContext, dim: int, seed: int) -> np.ndarray:
    stored = node.load_arrays(_STATE)
    if stored is None:
        return init_user_factors(node.data().user_ids, dim, seed)
    if stored["U"].shape[1] != dim:
        raise ValueError(f"{node.who}: stored user factors have dimension "
                         f"{stored['U'].shape[1]}, the request's item factors {dim}")
    return stored["U"]


def _checked_V(node: NodeContext) -> np.ndarray:
    V = node.arrays()["V"]
    n_items = node.data().n_items
    if V.ndim != 2 or V.shape[0] != n_items or V.shape[1] < 1:
        raise ValueError(f"{node.who}: the request's item factors V have shape {V.shape}, "
                         f"expected ({n_items}, dim >= 1)")
    return V


@handler(Action.TRAIN, sums=True)
def dpfedmf_train(content: RecordDict, node: NodeContext) -> RecordDict:
    """One round: update the users' factors, draw participation, reply the clipped item
    update (or zeros) as a noisy masked share."""
    noise = requested(node)
    if noise is None:
        raise AggregationError(f"{node.who} refuses a dp-fedmf round without distributed "
                               "noise (its item update is released only noised)")
    cfg = node.config()
    V = _checked_V(node)
    data = node.data()
    node.iterations(cfg, "epochs", minimum=1)
    node.reserve(8.0 * (12 * float(node.interactions_bound()) * node.size(cfg, "negatives")
                        + 4 * (len(data.user_ids) + data.n_items) * V.shape[1]),
                 f"dp-fedmf training (dim={V.shape[1]})")
    # the clip is the noise record's (the bound the node accounts), never another
    p = DPMFParams(dim=V.shape[1], lr=float(cfg["lr"]), epochs=int(cfg["epochs"]),
                   reg=float(cfg["reg"]), negatives=int(cfg["negatives"]),
                   clip=float(noise["l2"]), rate=float(noise["rate"]))
    U = _users(node, V.shape[1], int(cfg["seed"]))
    takes = participates(node)
    step = round_updates(U, V, data.train, data.user_ids,
                         np.full(U.shape[0], takes, dtype=bool), p, seed=int(cfg["seed"]),
                         round_=int(cfg["round"]))
    reply = sum_reply(node, {DELTA: step.item_update})
    node.store_arrays(_STATE, {"U": step.user_factors})
    return reply


@handler(Action.EVALUATE, sums=True)
def dpfedmf_evaluate(content: RecordDict, node: NodeContext) -> RecordDict:
    """Recall/NDCG sums of this node's users with the final V (scored U V^T)."""
    cfg = node.config()
    V = _checked_V(node)
    data = node.data()
    k = node.size(cfg, evaluation_wire.TOP_K, default=20)
    node.reserve(8.0 * len(data.user_ids) * V.shape[1]
                 + ranking_bytes(data.n_items, min(1024, len(data.user_ids)), k),
                 f"dp-fedmf evaluation (dim={V.shape[1]}) with top-k={k}")
    U = _users(node, V.shape[1], int(cfg["seed"]))
    sums = evaluate_ranking(lambda rows: U[rows] @ V.T, data.train, data.test, k=k,
                            batch_size=1024)
    return sum_reply(node, {evaluation_wire.RANKING: sums.to_vector()})


def spent(node: NodeContext) -> tuple[float, float]:
    """(epsilon, delta) this node charged for the run's noisy sums (for tests and reports)."""
    return run_epsilon(node)
