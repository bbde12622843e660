"""DP-Prototypes silo (paper 003): one epsilon-DP release, then local fitting and metrics.

``dpp_prototypes`` releases this silo's k prototypes (``fedrec/recsys/prototypes.py``)
only after the node's own checks: every parameter finite and in range, it holds at least k
users (its public user count), the sizes fit its ``memory-budget-mb``, and its node policy's
``dp-budget`` covers epsilon on top of what its DP ledger (``clients/dp_ledger.py``) records
over every run (charged before any computation, so a failed release still counts). Every
bound the guarantee needs is enforced by the node's own clipping, so the charge is epsilon
whatever bounds the request declares. ``dpp_evaluate`` receives the item factors, fits this silo's non-negative user
factors against them (kept in the node state, never sent) and answers with metric sums
through the run's aggregator.
"""

from __future__ import annotations

import json
from dataclasses import fields

import numpy as np
from flwr.app import RecordDict

from clients.handlers import handler
from clients.node import NodeContext
from clients.sums_node import sum_reply
from fedrec.recsys.nmf import fit_user_factors
from fedrec.recsys.prototypes import (
    MAX_JL_DIM,
    PrototypeParams,
    private_prototypes,
    release_ledger,
    silo_metric_sums,
)
from fedrec.wire.dp_prototypes import (
    NMF_ITERS,
    Action,
    EvaluateRequest,
    MetricSums,
    PrototypesReply,
    PrototypesRequest,
)
from fedrec.wire.evaluation import RANKING, RATING
from fedrec.wire.message import Message, message, reply

#: The node-local name of the user factors' array (never sent).
_U = "U"
_SILO_ROLES = ("silo", "user")


# typed so that a corrupted or stale state is refused on reload (clients/state.py)
@message()
class DPPrototypesUsers(Message):
    """This silo's non-negative user factors, fitted at evaluation against the broadcast
    item factors and kept, never sent: one row per user of the silo."""

    CONFIG = "dpp.state"  # empty: marks the state kept
    ARRAYS = "dpp.users"

    U: np.ndarray = reply(name=_U, shape=("users", "rank"))


def _params(req: PrototypesRequest, who: str) -> PrototypeParams:
    """The release parameters of the request, range-checked by ``PrototypeParams`` (a clear
    error naming the field)."""
    try:
        return PrototypeParams(**{f.name: getattr(req, f.name)
                                  for f in fields(PrototypeParams)})
    except (ValueError, TypeError, OverflowError) as exc:
        raise ValueError(f"{who} refuses dp-prototypes: {exc}") from None


def _release_bytes(params: PrototypeParams, n_users: int, n_items: int) -> float:
    """What one trial allocates: the k x d cluster sums, noisy values and prototypes, the
    users' distances to at least 2k candidates and the 2^p children per active cube."""
    k, p = params.k, MAX_JL_DIM
    return 8.0 * (3 * k * n_items + n_users * (2 * k + params.shifts * 2 ** p) + 4 * k * k)


def _evaluate_bytes(n_users: int, n_items: int, rank: int) -> float:
    """What the evaluation allocates: V^T V and the ridge system (rank x rank), X V, U and
    the HALS sweep's copies (users x rank), then every user's scores U V^T and the metric
    sums' ranked copies of them (users x items, several times)."""
    return 8.0 * (4.0 * rank * rank + 8.0 * n_users * rank + 2.0 * n_items * rank
                  + 6.0 * n_users * n_items)


@handler(Action.PROTOTYPES)
def dpp_prototypes(content: RecordDict, node: NodeContext) -> RecordDict:
    """Release this silo's epsilon-DP prototypes and the ledger of their releases."""
    who = node.who
    if node.role not in _SILO_ROLES:
        raise PermissionError(f"{who} refuses dp-prototypes: its role is {node.role!r}, not "
                              "a silo")
    req = node.read(PrototypesRequest)
    params = _params(req, who)
    if params.paper_accounting:  # spends 2.25 epsilon and uses exact sizes: the node's call
        node.policy.require("allow-paper-accounting", "dp-prototypes with the paper's "
                            "accounting (2.25 x epsilon, exact cluster sizes)", who)
    data = node.data()
    n_users = len(data.user_ids)  # public: the node's handshake reports it
    if n_users < params.k:
        raise PermissionError(
            f"{who} refuses to release dp-prototypes: it holds {n_users} users, fewer than "
            f"k={params.k} prototypes (each silo needs at least k users; paper 003, Table 1)")
    # each trial runs its shifts and swaps
    node.check_iterations(req.trials, "trials")
    node.check_iterations(req.shifts, "shifts", times=req.trials)
    node.check_iterations(req.swaps, "swaps", times=req.trials)
    node.reserve(_release_bytes(params, n_users, data.n_items),
                 f"dp-prototypes with k={params.k}")
    release = release_ledger(params, n_users, data.n_items)  # from public sizes only
    node.charge_dp(release, f"a dp-prototypes release of {params.k} prototypes")
    P, ledger, _ = private_prototypes(data.train, params, seed=(req.seed, node.partition_id))
    if ledger.to_table_rows() != release.to_table_rows():  # released only what was charged
        raise RuntimeError(f"{who}: the release's DP ledger differs from the one charged")
    return PrototypesReply(P=P, rows=json.dumps(release.to_table_rows())).to_records()


@handler(Action.EVALUATE, sums=True)
def dpp_evaluate(content: RecordDict, node: NodeContext) -> RecordDict:
    """Fit U >= 0 against the broadcast item factors; reply metric sums only."""
    data = node.data()
    req = node.read(EvaluateRequest, items=data.n_items)
    V = req.V
    if V.shape[1] < 1:
        raise ValueError(f"{node.who}: the item factors V have shape {V.shape}, expected "
                         f"({data.n_items}, rank >= 1) for {data.n_items} items")
    node.check_iterations(req.nmf_iters, NMF_ITERS)
    node.reserve(_evaluate_bytes(len(data.user_ids), data.n_items, V.shape[1]),
                 f"dp-prototypes evaluation with item factors of rank {V.shape[1]}")
    U = fit_user_factors(data.train, V, req.reg, req.nmf_iters)
    node.save_state(DPPrototypesUsers(U=U))
    sums = silo_metric_sums(U @ V.T, data.train, data.test, req.value_max, req.top_k)
    return sum_reply(node, MetricSums(ranking=sums[RANKING], rating=sums[RATING]))
