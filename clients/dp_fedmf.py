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

from typing import TypeVar

import numpy as np
from flwr.app import RecordDict

from clients.handlers import handler
from clients.node import NodeContext
from clients.noise_node import participates, requested, run_epsilon
from clients.sums_node import ranking_bytes, sum_reply
from fedrec.recsys.dp_mf import DPMFParams, round_updates
from fedrec.recsys.metrics import evaluate_ranking
from fedrec.recsys.mf import init_user_factors
from fedrec.wire.dp_fedmf import Action, EvaluateRequest, TrainRequest, TrainSum
from fedrec.wire.evaluation import RankingSum
from fedrec.wire.message import Message, message, reply
from fedrec.wire.sums import AggregationError, NoiseRequest

R = TypeVar("R", TrainRequest, EvaluateRequest)
#: The node-local name of the user factors' array (never sent).
_U = "U"


# typed so that a corrupted or stale state is refused on reload (clients/state.py)
@message()
class DPFedMFUsers(Message):
    """This node's users' factors, kept between rounds and never sent: one row per user of
    the node (checked on reload against the node's user count)."""

    CONFIG = "dpfedmf.state"  # empty: marks the state kept
    ARRAYS = "dpfedmf.users"

    U: np.ndarray = reply(name=_U, shape=("users", "dim"))


def _users(node: NodeContext, dim: int, seed: int) -> np.ndarray:
    users = node.data().user_ids
    stored = node.load_state(DPFedMFUsers, dims={"users": len(users)})
    if stored is None:
        return init_user_factors(users, dim, seed)
    if stored.U.shape[1] != dim:
        raise ValueError(f"{node.who}: stored user factors have dimension "
                         f"{stored.U.shape[1]}, the request's item factors {dim}")
    return stored.U


def _request(node: NodeContext, cls: type[R]) -> R:
    """The request as ``cls``, its item factors V items x dim with dim >= 1."""
    req = node.read(cls, items=node.data().n_items)
    if req.V.shape[1] < 1:
        raise ValueError(f"{node.who}: the request's item factors V have shape "
                         f"{req.V.shape}, expected ({req.V.shape[0]}, dim >= 1)")
    return req


@handler(Action.TRAIN, sums=True)
def dpfedmf_train(content: RecordDict, node: NodeContext) -> RecordDict:
    """One round: update the users' factors, draw participation, reply the clipped item
    update (or zeros) as a noisy masked share."""
    record = requested(node)
    if record is None:
        raise AggregationError(f"{node.who} refuses a dp-fedmf round without distributed "
                               "noise (its item update is released only noised)")
    # checked by the sum layer before this handler ran (clients/noise_node.py); read from
    # its config record alone (the request's arrays are read once, by _request)
    noise = NoiseRequest.from_parts({}, dict(record), node.who)
    req = _request(node, TrainRequest)
    data = node.data()
    dim = req.V.shape[1]
    node.check_iterations(req.epochs, "epochs")
    node.reserve(8.0 * (12 * float(node.interactions_bound()) * req.negatives
                        + 4 * (len(data.user_ids) + data.n_items) * dim),
                 f"dp-fedmf training (dim={dim})")
    # the clip is the noise record's (the bound the node accounts), never another
    p = DPMFParams(dim=dim, lr=req.lr, epochs=req.epochs, reg=req.reg,
                   negatives=req.negatives, clip=noise.l2, rate=noise.rate)
    U = _users(node, dim, req.seed)
    takes = participates(node)
    step = round_updates(U, req.V, data.train, data.user_ids,
                         np.full(U.shape[0], takes, dtype=bool), p, seed=req.seed,
                         round_=req.round)
    reply = sum_reply(node, TrainSum(update=step.item_update))
    node.save_state(DPFedMFUsers(U=step.user_factors))
    return reply


@handler(Action.EVALUATE, sums=True)
def dpfedmf_evaluate(content: RecordDict, node: NodeContext) -> RecordDict:
    """Recall/NDCG sums of this node's users with the final V (scored U V^T)."""
    req = _request(node, EvaluateRequest)
    data = node.data()
    V, k = req.V, req.top_k
    node.reserve(8.0 * len(data.user_ids) * V.shape[1]
                 + ranking_bytes(data.n_items, min(1024, len(data.user_ids)), k),
                 f"dp-fedmf evaluation (dim={V.shape[1]}) with top-k={k}")
    U = _users(node, V.shape[1], req.seed)
    sums = evaluate_ranking(lambda rows: U[rows] @ V.T, data.train, data.test, k=k,
                            batch_size=1024)
    return sum_reply(node, RankingSum(ranking=sums.to_vector()))


def spent(node: NodeContext) -> tuple[float, float]:
    """(epsilon, delta) this node charged for the run's noisy sums (for tests and reports)."""
    return run_epsilon(node)
