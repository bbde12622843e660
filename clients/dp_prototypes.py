"""DP-Prototypes silo (paper 003): one epsilon-DP release, then local fitting and metrics.

``dpp_prototypes`` releases this silo's k prototypes (``fl_app/recsys/dp_prototypes.py``)
only after the node's own checks: it holds at least k users, and its node policy's
``dp-budget`` covers epsilon (charged before any computation, so a failed release still
counts). ``dpp_evaluate`` receives the item factors, fits this silo's non-negative user
factors against them (kept in the node state, never sent) and answers with metric sums
through the run's aggregator.
"""

from __future__ import annotations

import json

from flwr.app import ConfigRecord, RecordDict

from clients.aggregate import sum_reply
from clients.node import NodeContext
from clients.registry import handler
from fl_app.records import to_array_record
from fl_app.recsys.dp_prototypes import PrototypeParams, private_prototypes, silo_metric_sums
from fl_app.recsys.nmf import fit_user_factors

_USER_FACTORS = "dpp.users"
_SILO_ROLES = ("silo", "user")


def _params(cfg: dict) -> PrototypeParams:
    fields = ("k", "epsilon", "value_max", "sparsity", "radius", "delta", "trials", "shifts",
              "swaps", "jl_coef")
    missing = [f for f in fields if f not in cfg]
    if missing:
        raise ValueError(f"dp-prototypes request lacks field(s) {missing}")
    kinds = {"epsilon": float, "value_max": float, "radius": float, "delta": float,
             "jl_coef": float}
    return PrototypeParams(**{f: kinds.get(f, int)(cfg[f]) for f in fields})


@handler("dpp_prototypes")
def dpp_prototypes(content: RecordDict, node: NodeContext) -> RecordDict:
    """Release this silo's epsilon-DP prototypes and the ledger of their releases."""
    who = node.who
    if node.role not in _SILO_ROLES:
        raise PermissionError(f"{who} refuses dp-prototypes: its role is {node.role!r}, not "
                              "a silo")
    cfg = node.config()
    params = _params(cfg)
    data = node.data()
    n_users = len(data.user_ids)
    if n_users < params.k:
        raise PermissionError(
            f"{who} refuses to release dp-prototypes: it holds {n_users} users, fewer than "
            f"k={params.k} prototypes (each silo needs at least k users; paper 003, Table 1)")
    node.policy.charge_dp(node.state, params.epsilon,
                          f"a dp-prototypes release of {params.k} prototypes", who)
    P, ledger, _ = private_prototypes(data.train, params,
                                      seed=(int(cfg.get("seed", 0)), node.partition_id))
    return RecordDict({
        "prototypes": to_array_record({"P": P}),
        "dp-ledger": ConfigRecord({"rows": json.dumps(ledger.to_table_rows())}),
    })


@handler("dpp_evaluate")
def dpp_evaluate(content: RecordDict, node: NodeContext) -> RecordDict:
    """Fit U >= 0 against the broadcast item factors; reply metric sums only."""
    cfg = node.config()
    V = node.arrays()["V"]
    data = node.data()
    if V.shape[0] != data.n_items:
        raise ValueError(f"{node.who}: item factors have {V.shape[0]} rows for "
                         f"{data.n_items} items")
    U = fit_user_factors(data.train, V, float(cfg["reg"]), int(cfg["nmf-iters"]))
    node.store_arrays(_USER_FACTORS, {"U": U})
    sums = silo_metric_sums(U @ V.T, data.train, data.test, float(cfg["value-max"]),
                            int(cfg.get("top-k", 20)))
    return sum_reply(node, sums)
