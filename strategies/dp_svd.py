"""dp-svd: a user-level DP low-rank item subspace by the noisy power method, its noise
shared inside the secure sum.

What runs (node side ``clients/dp_svd.py``, math ``fedrec/recsys/dp_svd.py``, noise and
accounting ``fedrec/secure/distributed_noise.py``, decisions in
``docs/protocols/dp-svd.md``). Partition ``user``: one user per node, so node-level DP is
user-level DP. One SecAgg+ sum of every node's scaled rows gives noisy item counts, from
which the server keeps the ``dpsvd-items`` largest; then ``dpsvd-iterations`` sums of
``A_S^T A_S X`` refine an orthonormal basis X (the server orthonormalizes each noisy sum).
Every sum has L2 sensitivity 1 per user and carries noise of total sigma z once (each node
adds its discrete Gaussian share before masking); z is calibrated so that the run's
``dpsvd-iterations + 1`` sums cost ``dpsvd-epsilon`` at ``dpsvd-delta`` by the accountant
every node runs and charges itself. Each node scores its own users with the released X;
nothing else leaves it.

The mechanism is fedsvd-privacy's (paper 002, Alg. 3: a power method whose every
synchronization is noised) with the noise moved inside the sum and the unit moved from a
row's entries to a user's whole row.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from fedrec.config import Key
from fedrec.recsys.dp_svd import DPSVDParams, initial_basis, next_basis, select_items
from fedrec.secure.distributed_noise import (
    calibrate,
    composed_epsilon,
    ddg_epsilon,
    gaussian_epsilon,
    multiplier_plan,
    noisy_range,
)
from fedrec.wire.dp_svd import (
    CountRequest,
    CountSum,
    EvaluateRequest,
    IterateRequest,
    IterateSum,
)
from fedrec.wire.sums import NoiseRequest
from strategies.base import Federation, ProtocolStrategy, RunOutcome
from strategies.policy_needs import PolicyNeed

log = logging.getLogger("fedrec")

_DEFAULTS = DPSVDParams()
DPSVD_KEYS: tuple[Key, ...] = (
    Key("dpsvd-epsilon", 5.0, "user-level epsilon of the whole run (the count sum and every "
        "iteration's sum, composed); the server calibrates the noise to it", min=1e-3, used_by="dp-svd"),
    Key("dpsvd-delta", 1e-5, "delta of the run's (epsilon, delta); keep it below 1 / users",
        min=1e-12, max=0.1, used_by="dp-svd"),
    Key("dpsvd-rank", _DEFAULTS.rank, "k: the subspace's dimension (columns of X)", min=1,
        used_by="dp-svd"),
    Key("dpsvd-iterations", _DEFAULTS.iterations, "noisy power iterations (one noisy sum "
        "each)", min=1, used_by="dp-svd"),
    Key("dpsvd-items", _DEFAULTS.items, "items kept by the noisy counts (the subspace's "
        "support); 0: every item", min=0, used_by="dp-svd"),
    Key("dpsvd-pop-weight", _DEFAULTS.pop_weight, "weight of the noisy counts (scaled to "
        "max 1) beside the low-rank score", min=0.0, used_by="dp-svd"),
)
#: Key of a history row (the server's own record, not the wire's).
_ROUND = "round"
#: Every sum's L2 sensitivity: one user's row at norm <= 1 (fedrec/recsys/dp_svd.py).
_L2 = 1.0
#: Every node answers every sum (no subsampling).
_RATE = 1.0


class DPSVD(ProtocolStrategy):
    """User-level DP low-rank filter: noisy item counts, then noisy power iterations, the
    noise of every sum shared by the nodes inside SecAgg+."""

    config_keys = DPSVD_KEYS
    unseeded_randomness = ("each node's noise share comes from an OS-keyed ChaCha20 "
                           "stream, never seeded (DP noise must be unpredictable to "
                           "everyone, the server included)")

    only_aggregator = ("secagg+", "adds its noise inside SecAgg+ sums")

    def __init__(self, cfg: Mapping[str, Any] | None = None) -> None:
        super().__init__(cfg)
        cfg = self.cfg
        self.params = DPSVDParams(rank=cfg["dpsvd-rank"], iterations=cfg["dpsvd-iterations"],
                                  items=cfg["dpsvd-items"],
                                  pop_weight=cfg["dpsvd-pop-weight"])
        self.epsilon, self.delta = cfg["dpsvd-epsilon"], cfg["dpsvd-delta"]
        self.seed, self.top_k = cfg["seed"], 20

    @property
    def releases(self) -> int:
        """The run's noisy sums: the counts and one per iteration."""
        return self.params.iterations + 1

    def noise_multiplier(self, shares: int) -> float:
        """z for this run over ``shares`` nodes."""
        return calibrate(self.epsilon * (1 - 1e-9), self.delta, _RATE, self.releases, shares)

    def policy_needs(self) -> tuple[PolicyNeed, ...]:
        """A ``dp-budget`` of at least the run's epsilon and a ``dp-max-delta`` of at least
        its delta (every node charges them); ``dp-min-noise`` depends on the node count and
        is checked by each node on its first sum."""
        return (*super().policy_needs(),
                PolicyNeed("dp-budget", f"epsilon {self.epsilon:g} per user (dp-svd, "
                           f"{self.releases} noisy sums)", self.epsilon),
                PolicyNeed("dp-max-delta", f"delta {self.delta:g} (dp-svd)", self.delta))

    def noise_request(self, z: float) -> NoiseRequest:
        """Every sum's distributed-noise record: total sigma z (sensitivity 1), rate 1."""
        return NoiseRequest(mechanism="ddg", sigma=z * _L2, l2=_L2, rate=_RATE,
                            releases=self.releases, delta=self.delta)

    def privacy_report(self, z: float, shares: int) -> dict[str, Any]:
        plan = [(multiplier_plan(z, _RATE, shares), self.releases)]
        return {"epsilon": composed_epsilon(plan, self.delta), "delta": self.delta,
                "epsilon-discrete-bound": ddg_epsilon(plan, self.delta),
                "epsilon-opacus-gaussian": gaussian_epsilon(plan, self.delta),
                "noise-multiplier": z, "sample-rate": _RATE, "noisy-sums": self.releases,
                "clip": _L2, "noise-shares": shares,
                "unit": "user (one user per node: partition user)",
                "accountant": "Opacus RDP of the Gaussian plus KLS Prop. 14's tau d per sum "
                              "(charged by every node); epsilon-discrete-bound: KLS Prop. 14"}

    def run(self, fed: Federation) -> RunOutcome:
        shares, p = len(fed.nodes), self.params
        z = self.noise_multiplier(shares)
        log.info("dp-svd: %d nodes, noise multiplier %.4g for epsilon %g at delta %g over "
                 "%d noisy sums", shares, z, self.epsilon, self.delta, self.releases)
        noise, max_abs = self.noise_request(z), noisy_range(_L2, z, shares)
        counts = fed.sum_of(CountRequest(), CountSum, max_abs=max_abs, phase="count",
                            noise=noise).counts
        items = select_items(counts, p.items)
        if p.rank > items.size:
            raise ValueError(f"dpsvd-rank {p.rank} exceeds the {items.size} selected items")
        X = initial_basis(items.size, p.rank, self.seed, counts[items])
        history = self.new_history()
        for t in range(1, p.iterations + 1):
            Y = fed.sum_of(IterateRequest(items=items, X=X, round=t), IterateSum,
                           max_abs=max_abs, phase="iterate", noise=noise).product
            X = next_basis(Y)
            history.append({_ROUND: t})
        metrics = fed.evaluate_ranking(EvaluateRequest(
            items=items, X=X, counts=counts, pop_weight=p.pop_weight, top_k=self.top_k))
        return RunOutcome(metrics=metrics, history=history,
                          extra={"items": items, "basis": X, "counts": counts},
                          privacy={"dp": self.privacy_report(z, shares)})
