"""DP-Prototypes (paper 003, Ribero et al. 2022, "Federating recommendations using
differentially private prototypes"): one-shot cross-silo recommendation.

Two protocol rounds after the handshake (node side ``clients/dp_prototypes.py``, math
``fedrec/recsys/prototypes.py`` and ``fedrec/recsys/nmf.py``, decisions in
``docs/protocols/dp-prototypes.md``):

1. ``prototypes`` (up): every silo releases k epsilon-DP prototypes of its users (Alg. 2),
   after charging epsilon to its own node policy (``dp-budget``). The server sees each
   silo's prototypes (a DP release, by design) and the silo's ledger of releases.
2. ``evaluate`` (down): the server stacks the prototypes, fits a regularized NMF of rank l
   (lambda = ``dpp-reg``) and sends only the item factors V. Each silo fits its non-negative
   user factors against the fixed V, predicts locally and answers with its metric sums
   through the run's aggregator (SecAgg+ by default): the server learns totals only.

Nodes of role ``silo`` take part; so do ``user`` nodes (Flower's simulation gives nodes no
role, so simulated nodes report ``user``): a node holding at least k users is a silo to this
protocol. A node with fewer than k users is refused by the server before anyone spends
budget, and refuses by itself if asked anyway.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

import numpy as np
from flwr.app import RecordDict

from fedrec.config import Key
from fedrec.dp import PrivacyLedger
from fedrec.recsys.mf import EarlyStopped
from fedrec.recsys.nmf import nmf
from fedrec.recsys.prototypes import ACCOUNTINGS, PrototypeParams, metric_means
from fedrec.wire import evaluation as evaluation_wire
from fedrec.wire.dp_prototypes import (
    PROTOTYPES_RECORD,
    EvaluateRequest,
    MetricSums,
    PrototypesReply,
    PrototypesRequest,
)
from strategies.base import Federation, ProtocolStrategy, RoleNeed, RunOutcome
from strategies.policy_needs import PolicyNeed

log = logging.getLogger("fedrec")

#: The roles that take part: declared silos, and user nodes holding many users (simulation).
SILO_ROLES = ("silo", "user")
#: Users scored at once by the centralized ceiling (:meth:`DPPrototypes.model_metrics`).
SCORE_BLOCK = 2048

DPP_KEYS: tuple[Key, ...] = (
    Key("dpp-epsilon", 1.0, "epsilon of each silo's prototype release (pure DP, user level); "
        "every silo's node policy `dp-budget` must allow it", min=1e-9),
    Key("dpp-k", 10, "prototypes per silo (every silo needs at least k users)", min=1),
    Key("dpp-rank", 20, "rank l of the server's NMF (the item factors' dimension)", min=1),
    Key("dpp-reg", 0.1, "lambda of the NMF objective ||X - U V^T||^2 + lambda (||U||^2 + "
        "||V||^2), server and silos", min=0.0),
    Key("dpp-nmf-iters", 200, "HALS sweeps of the NMF fits (stops earlier on a 1e-6 relative "
        "change)", min=1),
    Key("dpp-value-max", 5.0, "public bound of an entry (Alg. 3's Lambda): a silo clips its "
        "entries to [0, value-max] before the release", min=1e-9),
    Key("dpp-sparsity", 50, "s: a silo keeps each user's s largest entries and each "
        "prototype has at most s non-zeros", min=1),
    Key("dpp-radius", 0.0, "public L2 bound of a user row (Alg. 2's Lambda); `0` = value-max "
        "x sqrt(sparsity), which the other two clips imply", min=0.0),
    Key("dpp-delta", 0.1, "failure probability of the private grid: an active cube keeps "
        "an empty child with probability <= delta/2 (not a privacy parameter)", min=1e-9,
        max=0.999),
    Key("dpp-trials", 1, "independent trials, one chosen privately at the end (the paper's "
        "code runs 1)", min=1),
    Key("dpp-shifts", 4, "randomly shifted grids of the candidate step", min=1),
    Key("dpp-swaps", 10, "exponential-mechanism swaps of the local search", min=1),
    Key("dpp-jl-coef", 0.5, "JL dimension p = floor(coef x ln N), 1 <= p <= 8 (the paper "
        "prints 8; Balcan et al.'s and the paper's code use 0.5)", min=1e-9),
    Key("dpp-accounting", "strict", "`strict`: the release's split sums to dpp-epsilon. "
        "`paper`: paper 003's printed noise scales, for comparison only (2.25 x dpp-epsilon "
        "by basic composition, exact cluster sizes); a silo answers it only when its node "
        "policy sets `allow-paper-accounting` and charges what it really spends",
        choices=ACCOUNTINGS),
)


def params_from_config(cfg: Mapping[str, Any]) -> PrototypeParams:
    """The public release parameters of a run config (``dpp-*`` keys)."""
    return PrototypeParams(
        k=cfg["dpp-k"], epsilon=cfg["dpp-epsilon"],
        value_max=cfg["dpp-value-max"], sparsity=cfg["dpp-sparsity"],
        radius=cfg["dpp-radius"], delta=cfg["dpp-delta"],
        trials=cfg["dpp-trials"], shifts=cfg["dpp-shifts"],
        swaps=cfg["dpp-swaps"], jl_coef=cfg["dpp-jl-coef"],
        accounting=cfg["dpp-accounting"])


class DPPrototypes(ProtocolStrategy):
    """One upload (DP prototypes), one download (item factors), metrics as sums."""

    config_keys = DPP_KEYS
    federation = (RoleNeed(SILO_ROLES, min=1, holds=("rows",)),)

    def __init__(self, cfg: Mapping[str, Any] | None = None) -> None:
        super().__init__(cfg)
        cfg = self.cfg
        self.params, self.rank = params_from_config(cfg), cfg["dpp-rank"]
        self.reg, self.nmf_iters = cfg["dpp-reg"], cfg["dpp-nmf-iters"]
        self.seed, self.top_k = cfg["seed"], 20

    def policy_needs(self) -> tuple[PolicyNeed, ...]:
        """Each silo's release spends epsilon outside any secure sum: a ``dp-budget`` of at
        least what :func:`release_ledger` charges (``dpp-epsilon``, 2.25 x in the paper's
        accounting, which also needs ``allow-paper-accounting``). Only this run's share: the
        node's ledger of earlier runs is its own, and the node checks it."""
        from fedrec.recsys.prototypes import release_ledger

        params = self.params
        spent = release_ledger(params, 1000, 1000).spent()  # public sizes do not change it
        needs = [PolicyNeed("dp-budget", f"epsilon {spent:g} per silo (dp-prototypes "
                            "release)", spent)]
        if params.paper_accounting:
            needs.insert(0, PolicyNeed("allow-paper-accounting", "the paper's accounting "
                                       "(2.25 x epsilon, exact cluster sizes)"))
        return tuple(needs)

    #: Why a run is not reproducible by its seed (the released prototypes are noised).
    unseeded_randomness = ("each silo's prototypes carry DP noise from the exact discrete "
                           "sampler (OS-keyed), "
                           "which is never seeded (DP noise must be unpredictable to "
                           "everyone, the server included)")

    def reference(self, data: Any) -> dict[str, float]:
        """The centralized ceiling: paper 003's "Full" baseline (the same NMF on every
        user's training row in one process, no federation, no privacy) trained to
        convergence and tuned on a validation split carved from train, never the test split
        (:meth:`tune`), then scored as the federated run's silos score. Metrics keyed as
        the federated run's, plus ``tuned-rounds`` (HALS sweeps of the scored model),
        ``tuned-reg``, ``tuned-valid`` (the chosen validation NDCG), ``tuned-candidates``
        and ``tuned-at-edge`` (1.0 when the chosen L2 weight is the largest tried, or the
        smallest above 0)."""
        return self.ceiling_metrics(self.tune(data.train), data)

    def ceiling_metrics(self, tuned: EarlyStopped, data: Any) -> dict[str, float]:
        """:meth:`reference`'s metrics of a :meth:`tune` result (benchmarks keep the
        result's per-candidate scores beside them)."""
        from fedrec.recsys.nmf_ceiling import NMFModel, reg_at_edge

        model = tuned.model
        assert isinstance(model, NMFModel)
        tried = [float(label) for label in tuned.tried]
        return {**self.model_metrics(model, data),
                "tuned-rounds": float(model.sweeps), "tuned-reg": model.reg,
                "tuned-valid": max(tuned.curve), "tuned-candidates": float(len(tried)),
                "tuned-at-edge": float(reg_at_edge(model.reg, tried))}

    def model_metrics(self, model: Any, data: Any) -> dict[str, float]:
        """A centralized NMF (``NMFModel`` fitted on ``data.train``) scored on ``data.test``
        exactly as the silos score the federated run (``silo_metric_sums``)."""
        from fedrec.recsys.prototypes import silo_metric_sums

        V, U = model.item_factors, model.user_factors
        ranking = rating = 0.0
        # users in blocks: the sums add over users, as they add over silos, and a block's
        # dense scores stay small on a catalogue of 40,000 items (Gowalla: 10 GB at once)
        for lo in range(0, U.shape[0], SCORE_BLOCK):
            rows = slice(lo, lo + SCORE_BLOCK)
            sums = silo_metric_sums(U[rows] @ V.T, data.train[rows], data.test[rows],
                                    self.params.value_max, self.top_k)
            ranking = ranking + sums[evaluation_wire.RANKING]
            rating = rating + sums[evaluation_wire.RATING]
        return metric_means(self.top_k, ranking, rating)

    def tune(self, train: Any) -> EarlyStopped:
        """HALS sweeps by early stopping and the L2 weight from a grid around this run's,
        both on a validation split of ``train`` (``fedrec.recsys.nmf_ceiling``), the rank
        this run's; returns the ``EarlyStopped`` with the winner retrained on ``train``."""
        from fedrec.recsys.mf import MAX_ROUND_FACTOR, PATIENCE, VALID_FRACTION
        from fedrec.recsys.nmf_ceiling import SWEEPS_PER_CHECK, tune_nmf_ceiling

        log.info("dp-prototypes reference: centralized NMF (rank %d) to convergence (early "
                 "stopping on a %.0f%% validation split of train, NDCG@%d every %d sweeps, "
                 "patience %d, at most %d sweeps), L2 weight from a grid around %g",
                 self.rank, 100 * VALID_FRACTION, self.top_k, SWEEPS_PER_CHECK, PATIENCE,
                 MAX_ROUND_FACTOR * self.nmf_iters, self.reg)

        def shown(k: int, n: int, label: str, out: Any) -> None:
            log.info("dp-prototypes reference: candidate %d of %d (reg %s) done, best at "
                     "check %d of %d (every %d sweeps), validation NDCG@%d %.4f", k, n, label,
                     out.rounds, len(out.curve), SWEEPS_PER_CHECK, self.top_k, max(out.curve))

        tuned = tune_nmf_ceiling(train, self.rank, self.reg, self.nmf_iters, seed=self.seed,
                                 top_k=self.top_k, on_candidate=shown)
        log.info("dp-prototypes reference: reg %s, %d checks chosen, retrained on train "
                 "(validation NDCG@%d %.4f)", tuned.label, tuned.rounds, self.top_k,
                 max(tuned.curve))
        return tuned

    def check_silo_sizes(self, fed: Federation) -> None:
        """Refuse the run before any release if a silo holds fewer than k users (the
        paper's one assumption); the user counts are the handshake's public facts."""
        k = self.params.k
        small = [f"{fed.messenger.label(n)} holds {fed.infos[n].n_users}"
                 for n in fed.of_role(*SILO_ROLES) if fed.infos[n].n_users < k]
        if small:
            raise ValueError(f"dp-prototypes needs at least dpp-k={k} users in every silo: "
                             f"{'; '.join(small)}. Lower dpp-k or merge small silos")

    def prototype_request(self) -> PrototypesRequest:
        """What a silo needs for its release: public parameters only."""
        return PrototypesRequest(**self.params.to_config(), seed=self.seed)

    def collect(self, fed: Federation, replies: Mapping[int, RecordDict]
                ) -> tuple[np.ndarray, dict[str, Any]]:
        """The stacked prototypes (in node order) and each silo's ledger, checked: shape,
        range, and a ledger whose pure epsilon is the configured one."""
        dims = {"k": self.params.k, "items": fed.n_items}
        blocks, ledgers = [], {}
        for node in fed.of_role(*SILO_ROLES):
            label = fed.messenger.label(node)
            reply = PrototypesReply.from_records(replies[node], label, dims)
            P = reply.P
            if not (np.all(np.isfinite(P)) and P.min() >= 0
                    and P.max() <= self.params.value_max):
                raise ValueError(f"{label}: prototypes outside [0, dpp-value-max]")
            ledger = PrivacyLedger.from_rows(json.loads(reply.rows))
            spent = ledger.pure_epsilon()
            want = self.params.spent_epsilon()
            if not np.isclose(spent, want, rtol=1e-9, atol=0):
                raise ValueError(f"{label}: its ledger composes to epsilon {spent:g}, the run "
                                 f"asked for {want:g}")
            blocks.append(P)
            ledgers[label] = ledger.summary()
        return np.vstack(blocks), ledgers

    def dp_report(self, ledgers: dict[str, Any]) -> dict[str, Any]:
        """The run's privacy ledger: per silo the releases, and the run's epsilon."""
        per_silo = {label: s["pure_epsilon"] for label, s in ledgers.items()}
        not_covered = ["silo user counts (handshake)", "aggregate test metrics"]
        guarantee = ("pure epsilon-DP per silo, user level (add/remove one user's row); silos "
                     "hold disjoint users, so the run is epsilon-DP (parallel composition)")
        if self.params.paper_accounting:
            guarantee = (f"PAPER ACCOUNTING (dpp-accounting = paper): the paper's printed noise "
                         f"scales for a claimed epsilon {self.params.epsilon:g}; by basic "
                         f"composition each silo spends {self.params.spent_epsilon():g}, and "
                         "the exact cluster sizes are outside any DP guarantee")
            not_covered.append("cluster sizes (used exactly)")
        return {"guarantee": guarantee, "accounting": self.params.accounting,
                "epsilon": self.params.epsilon, "delta": 0.0,
                "run_epsilon": max(per_silo.values()), "epsilon_per_silo": per_silo,
                "split": self.params.budget(), "ledgers": ledgers, "not_covered": not_covered}

    def max_abs(self, fed: Federation) -> float:
        """Bound of every value a silo's evaluation reply holds: ranking sums <= its users;
        squared error <= entries x value-max^2; rank sums <= entries x value-max."""
        vm = self.params.value_max
        return float(fed.max_users) * fed.n_items * max(vm * vm, vm, 1.0) + fed.max_users + 1.0

    def run(self, fed: Federation) -> RunOutcome:
        messenger = fed.messenger
        self.check_silo_sizes(fed)
        silos = fed.of_role(*SILO_ROLES)
        log.info("dp-prototypes: %d silos release %d prototypes each at epsilon %g",
                 len(silos), self.params.k, self.params.epsilon)
        replies = fed.send(self.prototype_request(), nodes=silos, phase="prototypes")
        messenger.ledger.mark("prototypes", PROTOTYPES_RECORD, "noised")
        P, ledgers = self.collect(fed, replies)
        fit = nmf(P, self.rank, self.reg, self.nmf_iters)
        self.history.extend({"nmf-objective": v} for v in fit.objective)
        log.info("dp-prototypes: NMF of the %d x %d prototypes, rank %d: objective %.4g after "
                 "%d sweeps", *P.shape, self.rank, fit.objective[-1], len(fit.objective) - 1)
        request = EvaluateRequest(V=fit.V, reg=self.reg, nmf_iters=self.nmf_iters,
                                  value_max=self.params.value_max, top_k=self.top_k)
        total = fed.sum_of(request, MetricSums, max_abs=self.max_abs(fed), phase="evaluate")
        metrics = metric_means(self.top_k, total.ranking, total.rating)
        return RunOutcome(metrics=metrics,
                          history=list(self.history),
                          extra={"item_factors": fit.V, "prototypes": P},
                          privacy={"dp": self.dp_report(ledgers)})
