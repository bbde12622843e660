"""dp-fedmf: user-level differentially private federated BPR-MF with distributed noise.

What runs (node side ``clients/dp_fedmf.py``, math ``fedrec/recsys/dp_mf.py``, noise and
accounting ``fedrec/secure/distributed_noise.py``, decisions in
``docs/protocols/dp-fedmf.md``). Every node holds its users' factors (partition ``user``:
one user per node, so node-level DP is user-level DP). Each round the server sends the item
factors V; every node updates its own user factor, decides by its own CSPRNG (Poisson,
rate ``dpmf-rate``) whether its user takes part, and answers a SecAgg+ sum with its item
update clipped to L2 ``dpmf-clip`` (zeros when it does not take part) plus its share of
discrete Gaussian noise, so the unmasked sum carries noise of total sigma
``z x dpmf-clip`` once. The server never learns who took part. It calibrates z so that
``rounds`` such sums cost ``dpmf-epsilon`` at ``dpmf-delta``, by the accountant every node
runs itself (:func:`fedrec.secure.distributed_noise.composed_epsilon`: Opacus's RDP of the
subsampled Gaussian with the discrete sum's correction); each node checks the whole run
against its ``dp-budget`` before its first release and charges its ledger every round.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import numpy as np

from fedrec.config import ROUNDS, Key
from fedrec.recsys.dp_mf import DPMFParams, server_step
from fedrec.recsys.mf import init_item_factors
from fedrec.secure.distributed_noise import (
    calibrate,
    composed_epsilon,
    ddg_epsilon,
    gaussian_epsilon,
    multiplier_plan,
    noisy_range,
)
from fedrec.wire.dp_fedmf import EvaluateRequest, TrainRequest, TrainSum
from fedrec.wire.sums import NoiseRequest
from strategies.base import Federation, ProtocolStrategy, RunOutcome
from strategies.policy_needs import PolicyNeed

log = logging.getLogger("fedrec")

DPFEDMF_KEYS: tuple[Key, ...] = (
    Key("dpmf-epsilon", 5.0, "user-level epsilon of the whole run (every round's noisy sum, "
        "composed); the server calibrates the noise to it", min=1e-3, used_by="dp-fedmf"),
    Key("dpmf-delta", 1e-5, "delta of the run's (epsilon, delta); keep it below 1 / users",
        min=1e-12, max=0.1, used_by="dp-fedmf"),
    Key("dpmf-rate", 0.3, "Poisson rate q: each node takes part in a round with this "
        "probability, drawn by its own CSPRNG", min=1e-6, max=1.0, used_by="dp-fedmf"),
    Key("dpmf-clip", 2.0, "L2 bound C of one user's item update (user-level sensitivity)",
        min=1e-9, used_by="dp-fedmf"),
    Key("dpmf-dim", 16, "factor dimension", min=1, used_by="dp-fedmf"),
    Key("dpmf-lr", 0.5, "step of the user factor's local gradient steps", min=0.0,
        used_by="dp-fedmf"),
    Key("dpmf-epochs", 3, "local gradient steps of the user factor per round", min=1,
        used_by="dp-fedmf"),
    Key("dpmf-reg", 0.01, "L2 weight on the user factor", min=0.0, used_by="dp-fedmf"),
    Key("dpmf-negatives", 1, "negatives sampled per training item per round", min=1,
        used_by="dp-fedmf"),
    Key("dpmf-server-lr", 4.0, "server step: V += lr x noisy sum / (q x users)", min=0.0,
        used_by="dp-fedmf"),
)

#: Key of a history row (the server's own record, not the wire's).
_ROUND = "round"
#: The accounting a server and its nodes share, under the names this module has given it.
plan_of = multiplier_plan


class DPFedMF(ProtocolStrategy):
    """User-level DP federated MF: clipped item updates, Poisson participation decided by
    each node, distributed discrete Gaussian noise inside the SecAgg+ sum."""

    config_keys = (ROUNDS, *DPFEDMF_KEYS)
    unseeded_randomness = ("each node's participation draw and its noise share come from "
                           "OS-keyed ChaCha20 streams, never seeded (DP noise and the "
                           "sampling must be unpredictable to everyone, the server included)")

    only_aggregator = ("secagg+", "adds its noise inside SecAgg+ sums")

    def __init__(self, cfg: Mapping[str, Any] | None = None) -> None:
        super().__init__(cfg)
        cfg = self.cfg
        self.params = DPMFParams(
            dim=cfg["dpmf-dim"], lr=cfg["dpmf-lr"], epochs=cfg["dpmf-epochs"],
            reg=cfg["dpmf-reg"], negatives=cfg["dpmf-negatives"],
            clip=cfg["dpmf-clip"], server_lr=cfg["dpmf-server-lr"],
            rate=cfg["dpmf-rate"])
        self.epsilon, self.delta = cfg["dpmf-epsilon"], cfg["dpmf-delta"]
        self.rounds, self.seed, self.top_k = cfg["rounds"], cfg["seed"], 20
        self._z: dict[int, float] = {}

    def noise_multiplier(self, shares: int) -> float:
        """z for this run over ``shares`` nodes (cached)."""
        if shares not in self._z:
            self._z[shares] = calibrate(self.epsilon * (1 - 1e-9), self.delta,
                                        self.params.rate, self.rounds, shares)
        return self._z[shares]

    def policy_needs(self) -> tuple[PolicyNeed, ...]:
        """A ``dp-budget`` of at least the run's epsilon (every node charges it), and a
        ``dp-max-delta`` of at least the run's delta; the node also needs ``dp-min-noise``
        at most the calibrated multiplier, which depends on the node count (checked by the
        node on its first sum)."""
        return (*super().policy_needs(),
                PolicyNeed("dp-budget", f"epsilon {self.epsilon:g} per user (dp-fedmf, "
                           f"{self.rounds} noisy sums)", self.epsilon),
                PolicyNeed("dp-max-delta", f"delta {self.delta:g} (dp-fedmf)", self.delta))

    def train_request(self, V: np.ndarray, round_: int) -> TrainRequest:
        """One round's request: the item factors and public hyperparameters only."""
        p = self.params
        return TrainRequest(V=V, round=round_, seed=self.seed, lr=p.lr, epochs=p.epochs,
                            reg=p.reg, negatives=p.negatives, clip=p.clip)

    def noise_request(self, z: float) -> NoiseRequest:
        """The sum's distributed-noise record (``clients/noise_node.py`` checks it): total
        sigma z x clip, the L2 bound, the Poisson rate, the run's releases and delta."""
        p = self.params
        return NoiseRequest(mechanism="ddg", sigma=z * p.clip, l2=p.clip, rate=p.rate,
                            releases=self.rounds, delta=self.delta)

    def max_abs(self, z: float, shares: int) -> float:
        """The sum's declared range: the clip norm (every coordinate of a clipped update
        lies within it), widened so the ring keeps TAIL_SIGMAS noise sigmas of room
        (``clients/noise_node.py`` refuses less)."""
        return noisy_range(self.params.clip, z, shares)

    def privacy_report(self, z: float, shares: int) -> dict[str, Any]:
        plan = [(plan_of(z, self.params.rate, shares), self.rounds)]
        return {"epsilon": composed_epsilon(plan, self.delta), "delta": self.delta,
                "epsilon-discrete-bound": ddg_epsilon(plan, self.delta),
                "epsilon-opacus-gaussian": gaussian_epsilon(plan, self.delta),
                "noise-multiplier": z, "sample-rate": self.params.rate,
                "rounds": self.rounds, "clip": self.params.clip, "noise-shares": shares,
                "unit": "user (one user per node: partition user)",
                "accountant": "Opacus RDP of the subsampled Gaussian plus KLS Prop. 14's "
                              "tau d per sum (charged by every node); "
                              "epsilon-discrete-bound: KLS Prop. 14 through Zhu & Wang's "
                              "general subsampling bound"}

    def run(self, fed: Federation) -> RunOutcome:
        shares = len(fed.nodes)
        n_users = sum(fed.infos[n].n_users for n in fed.nodes)
        z = self.noise_multiplier(shares)
        log.info("dp-fedmf: %d nodes, %d users, noise multiplier %.4g for epsilon %g at "
                 "delta %g over %d rounds (q = %g)", shares, n_users, z, self.epsilon,
                 self.delta, self.rounds, self.params.rate)
        V = init_item_factors(fed.n_items, self.params.dim, self.seed)
        history = self.new_history()
        max_abs = self.max_abs(z, shares)
        for r in range(1, self.rounds + 1):
            total = fed.sum_of(self.train_request(V, r), TrainSum, max_abs=max_abs,
                               phase="train", noise=self.noise_request(z))
            V = server_step(V, total.update, self.params, n_users)
            history.append({_ROUND: r})
        metrics = fed.evaluate_ranking(EvaluateRequest(V=V, seed=self.seed, top_k=self.top_k))
        return RunOutcome(metrics=metrics, history=history, extra={"item_factors": V},
                          privacy={"dp": self.privacy_report(z, shares)})

