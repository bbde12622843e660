"""FedMF: federated BPR matrix factorization, the baseline the papers compare against.

What runs (client side ``clients/fedmf.py``, math ``fedrec/recsys/mf.py``, decisions in
``docs/protocols/fedmf.md``). Each round the server broadcasts the item factors V; every
node trains on its own users, whose factors never leave it, and answers with its share of
a sum through the run's aggregator (``aggregator``: SecAgg+ by default, so the server learns
only the SUM over nodes, never one node's item update):

- ``mf-mode = local`` (default): ``mf-local-epochs`` epochs of mini-batch BPR with Adam on a
  local copy of V; the node sends ``w * clip(V_local - V, mf-clip)`` and ``w`` (w = its users
  with training items). The server's update is the user-weighted mean delta, applied by
  ``mf-optimizer``: ``avg`` (V += mf-server-lr * mean delta, FedAvg on deltas) or ``adam``
  (server Adam with the negated mean delta as pseudo-gradient, FedAdam).
- ``mf-mode = exact``: one full-batch gradient step per round; the node sends its users'
  summed V-gradient, the server divides by the summed user count. This is centralized
  gradient descent (``BPRMF(mode="exact")``) up to float64 summation order.

Flower's stock strategies (``--strategy flwr.serverapp.strategy:FedAvg``) can still drive the
same nodes through ``train`` / ``evaluate`` messages (:meth:`FedMF.drive_stock_strategy`),
one full-batch step per round; on that path the server sees every node's item factors.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from functools import partial
from typing import Any

from flwr.app import ArrayRecord, ConfigRecord
from flwr.serverapp.strategy import Strategy

from fedrec.config import ROUNDS, Key
from fedrec.recsys.metrics import evaluate_ranking
from fedrec.recsys.mf import (
    BPRMF,
    MAX_ROUND_FACTOR,
    PATIENCE,
    VALID_FRACTION,
    Adam,
    EarlyStopped,
    init_item_factors,
    item_gradient,
    steps_past_edges,
    tune_early_stopped,
)
from fedrec.transport.ledger import PROGRESS_SECONDS
from fedrec.transport.messenger import AccountedGrid, Messenger
from fedrec.wire.fedmf import Action
from strategies.base import Federation, ProtocolStrategy, RunOutcome, data_config, handshake
from strategies.policy_needs import PolicyNeed

log = logging.getLogger("fedrec")

#: The reported mean training loss is capped here on the node so the sum has a range; a
#: BPR loss starts at ln 2 = 0.69 and falls, so the cap only binds for a diverged run.
LOSS_CAP = 20.0

FEDMF_KEYS: tuple[Key, ...] = (
    Key("mf-dim", 32, "factor dimension", min=1, used_by="fedmf"),
    Key("mf-lr", 0.01, "learning rate: the nodes' local Adam step (`mf-mode = local`), the "
        "gradient step (`mf-mode = exact` and stock strategies)", min=0.0, used_by="fedmf"),
    Key("mf-reg", 0.01, "L2 weight on user and item factors (per BPR triple in local mode)", min=0.0, used_by="fedmf"),
    Key("mf-negatives", 1, "negatives sampled per positive per epoch", min=1, used_by="fedmf"),
    Key("mf-mode", "local", "`local`: local epochs of mini-batch BPR with Adam, the server "
        "sums the nodes' item-factor deltas; `exact`: one full-batch gradient step per round, "
        "equal to centralized gradient descent", choices=("local", "exact"), used_by="fedmf"),
    Key("mf-local-epochs", 3, "local mode: epochs over the node's users per round", min=1,
        used_by="fedmf"),
    Key("mf-batch-size", 256, "local mode: BPR triples per mini-batch", min=1, used_by="fedmf"),
    Key("mf-optimizer", "avg", "local mode, server step on the user-weighted mean item delta: "
        "`avg` (V += mf-server-lr x mean delta) or `adam` (server Adam, FedAdam)",
        choices=("avg", "adam"), used_by="fedmf"),
    Key("mf-server-lr", 1.0, "local mode: server step size (`avg`: 1 applies the mean delta "
        "as is; `adam`: Adam's lr)", min=0.0, used_by="fedmf"),
    Key("mf-clip", 1.0, "local mode: a node clips every element of its item delta to "
        "[-mf-clip, mf-clip]; with its user weight this is the sum's declared range", min=1e-9,
        used_by="fedmf"),
    Key("mf-factor-bound", 100.0, "exact mode: the summed gradients' declared range is max "
        "users x this; a node clips values outside it inside the masked sum and the round "
        "fails, naming only how many nodes clipped", min=1e-9, used_by="fedmf"),
)


#: The reference's candidates, first pass: (user lr, item lr, reg) multiples of the run's
#: ``mf-lr`` and ``mf-reg``, one Adam step size for both factors at 1, 1/3, 1/10, 1/30 of the
#: run's (one Adam on all users takes ~nodes times the item steps a federated round
#: averages), each at the run's L2 weight and three times it.
REFERENCE_GRID = tuple((a, a, b) for b in (1.0, 3.0) for a in (1.0, 1 / 3, 0.1, 1 / 30))
#: Second pass, at the first pass's best L2 weight: the item step 1/3 or 1/10 of the user
#: step, for the same user steps. A FedMF round averages the nodes' item deltas, each made
#: from one node's share of the batches, so the federated item factors move slower than its
#: user factors, which one step size for both cannot do (ML-100K validation NDCG@20: one
#: step at best 0.2085, user 1e-3 / item 3.3e-4 0.2138, the federated run 0.2074;
#: results/fedmf/ceiling.md). Item steps below 1/100 of the run's are left out (1/30 x 1/10:
#: the slowest to converge, the farthest from the run).
REFERENCE_SPLIT_STEPS = tuple((a, a * c) for a in (1.0, 1 / 3, 0.1, 1 / 30)
                              for c in (1 / 3, 0.1) if a * c >= 0.01 - 1e-12)


#: After the split steps, passes of a walk one step past an edge of what was tried that the
#: best sits on (user step or item / user ratio, x 3 or / 3): a ceiling chosen where the grid
#: cut it off may not be one. The leaderboard's ML-100K and ML-1M choices are inside the grid,
#: so the walk adds nothing there; results/fedmf/{ml-100k,synthetic} chose ratio 1, its edge.
EDGE_PASSES = 2


def _label(lr: float, item_lr: float, reg: float) -> str:
    """A reference candidate's name: ``lr,item_lr,reg`` (what :func:`_parse` reads)."""
    return f"{lr!r},{item_lr!r},{reg!r}"


def _coords(label: str, lr: float, reg: float) -> tuple[float, float, float]:
    """A candidate as (user step, item / user step, L2 weight), multiples of the run's
    ``lr`` and ``reg``: the coordinates the edge walk steps in."""
    user, item, weight = _parse(label)
    return (user / lr, item / user, weight / reg)


def _at_edge(label: str, tried: Iterable[str], lr: float, reg: float) -> bool:
    """Whether the chosen candidate still sits on an edge of what was tried in the user step
    or the item / user ratio (the walk's passes ran out): the grid may have cut off a better
    value. The L2 weight has two values, so it is left out."""
    return bool(steps_past_edges(_coords(label, lr, reg),
                                 [_coords(t, lr, reg) for t in tried], dims=(0, 1)))


def _parse(label: str) -> tuple[float, float, float]:
    lr, item_lr, reg = (float(x) for x in label.split(","))
    return lr, item_lr, reg


class _RoundLines:
    """``<label> k of N done, loss x, t s``: the first and last round, and between them at
    most one line per PROGRESS_SECONDS (a fast run does not flood the console)."""

    def __init__(self, label: str) -> None:
        self.label, self.t0, self.last = label, time.perf_counter(), float("-inf")

    def __call__(self, r: int, rounds: int, loss: float) -> None:
        now = time.perf_counter()
        if r in (1, rounds) or now - self.last >= PROGRESS_SECONDS:
            log.info("%s %d of %d done, loss %.4g, %.1f s", self.label, r, rounds, loss,
                     now - self.t0)
            self.last = now


class FedMF(ProtocolStrategy):
    """Federated BPR-MF with private user factors and item updates learned only as sums."""

    config_keys = (ROUNDS, *FEDMF_KEYS)
    #: What a stock Flower strategy driving these nodes asks of their policy (clear rounds).
    STOCK_NEEDS = (PolicyNeed("allow-plain", "Flower's stock train/evaluate rounds (the "
                              "server sees each node's item factors)"),)

    def __init__(self, cfg: Mapping[str, Any] | None = None) -> None:
        super().__init__(cfg)
        cfg = self.cfg  # typed: mf-mode and mf-optimizer are checked against their choices
        self.mode, self.rounds = str(cfg["mf-mode"]), int(cfg["rounds"])
        self.dim = int(cfg["mf-dim"])
        self.lr, self.reg = float(cfg["mf-lr"]), float(cfg["mf-reg"])
        self.negatives, self.epochs = int(cfg["mf-negatives"]), int(cfg["mf-local-epochs"])
        self.batch_size, self.optimizer = int(cfg["mf-batch-size"]), str(cfg["mf-optimizer"])
        self.server_lr, self.clip = float(cfg["mf-server-lr"]), float(cfg["mf-clip"])
        self.factor_bound, self.seed = float(cfg["mf-factor-bound"]), int(cfg["seed"])
        self.top_k = 20

    def reference_model(self, train: Any, progress: bool = False) -> BPRMF:
        """The centralized BPR-MF with this run's budget: the same training code the nodes
        call (local mode) or centralized gradient descent (exact mode), on all users.
        ``progress``: a console line per round (at most every few seconds)."""
        model = self._untrained()
        if progress:
            budget = (f"{self.rounds} round(s) x {self.epochs} epoch(s) of mini-batch BPR with "
                      "Adam" if self.mode == "local" else
                      f"{self.rounds} full-batch gradient step(s)")
            log.info("fedmf reference: centralized BPR-MF, %s, on %d users x %d items",
                     budget, *train.shape)
        return model.fit(train, self.rounds,
                         on_round=_RoundLines("fedmf reference: round") if progress else None)

    def reference(self, data: Any) -> dict[str, float]:
        """The centralized ceiling: this run's model trained centrally to convergence, tuned
        on a validation split carved from train, never the test split (:meth:`tune`).
        Ranking metrics keyed as the federated run's, plus ``tuned-rounds``, ``tuned-lr``,
        ``tuned-item-lr``, ``tuned-reg``, ``tuned-valid`` (the chosen validation NDCG),
        ``tuned-candidates`` and ``tuned-at-edge`` (1.0 when the chosen user step or item /
        user step ratio still sits on an edge of what was tried after the edge walk)."""
        tuned = self.tune(data.train)
        lr, item_lr, reg = _parse(tuned.label)
        edge = _at_edge(tuned.label, tuned.tried, self.lr, self.reg)
        assert tuned.model is not None
        return {**evaluate_ranking(tuned.model.score, data.train, data.test,
                                   k=self.top_k).means(),
                "tuned-rounds": float(tuned.rounds), "tuned-lr": lr, "tuned-item-lr": item_lr,
                "tuned-reg": reg, "tuned-valid": max(tuned.curve),
                "tuned-candidates": float(len(tuned.tried)), "tuned-at-edge": float(edge)}

    def tune(self, train: Any, split_steps: bool = True) -> EarlyStopped:
        """Rounds by early stopping on a validation split carved from ``train``, step size
        and L2 weight from REFERENCE_GRID around this run's, then (``split_steps``) separate
        user and item steps (REFERENCE_SPLIT_STEPS) at the best L2 weight, all on
        validation (``tune_early_stopped``), up to MAX_ROUND_FACTOR x this run's rounds; the
        winner retrained on ``train``. The federated run's values came from a handful of
        trials (docs/protocols/fedmf.md). Labels are ``lr,item_lr,reg``."""
        n = len(REFERENCE_GRID) + (len(REFERENCE_SPLIT_STEPS) if split_steps else 0)
        log.info("fedmf reference: centralized BPR-MF to convergence (early stopping on a "
                 "%.0f%% validation split of train, patience %d, at most %d rounds; %d "
                 "(user lr, item lr, reg) candidates)", 100 * VALID_FRACTION, PATIENCE,
                 MAX_ROUND_FACTOR * self.rounds, n)

        def candidates(grid: Any) -> dict[str, Any]:
            return {_label(self.lr * a, self.lr * b, self.reg * c):
                    partial(self._untrained, self.lr * a, self.reg * c, self.lr * b)
                    for a, b, c in grid}

        def shown(k: int, known_now: int, label: str, out: Any) -> None:
            # the walk past a grid edge can add candidates after the planned n: the count
            # shown is what is known so far, never fewer than k
            log.info("fedmf reference: candidate %d of %d (lr, item lr, reg = %s) done, %d "
                     "rounds, validation NDCG@%d %.4f", k, max(n, known_now, k), label,
                     out.rounds, self.top_k, max(out.curve))

        def coords(label: str) -> tuple[float, float, float]:
            return _coords(label, self.lr, self.reg)

        known: set[str] = set()

        def refine(label: str) -> dict[str, Any]:
            """First the split steps at the best L2 weight; once those are tried, one step
            past any edge of what was tried that the best sits on, in the user step or the
            item / user ratio (``steps_past_edges``; the L2 weight has two values)."""
            a, ratio, reg = coords(label)
            split = candidates([(x, y, reg) for x, y in REFERENCE_SPLIT_STEPS])
            if not set(split) <= known:
                known.update(split)
                return split
            steps = steps_past_edges((a, ratio, reg), map(coords, known), dims=(0, 1))
            more = candidates([(x, x * r, g) for x, r, g in steps])
            known.update(more)
            return more

        first = candidates(REFERENCE_GRID)
        known.update(first)
        tuned = tune_early_stopped(first, train, MAX_ROUND_FACTOR * self.rounds,
                                   refine=refine if split_steps else None,
                                   refine_passes=1 + EDGE_PASSES, seed=self.seed,
                                   top_k=self.top_k, on_candidate=shown)
        log.info("fedmf reference: lr, item lr, reg = %s, %d rounds chosen (validation "
                 "NDCG@%d %.4f)", tuned.label, tuned.rounds, self.top_k, max(tuned.curve))
        return tuned

    def _untrained(self, lr: float | None = None, reg: float | None = None,
                   item_lr: float | None = None) -> BPRMF:
        return BPRMF(dim=self.dim, lr=self.lr if lr is None else lr,
                     reg=self.reg if reg is None else reg, negatives=self.negatives,
                     seed=self.seed, mode=self.mode, epochs=self.epochs,
                     batch_size=self.batch_size, item_lr=item_lr)

    def node_config(self, round_: int) -> dict[str, Any]:
        """What every node needs for one round (public hyperparameters only)."""
        return {"mode": self.mode, "round": round_, "seed": self.seed, "lr": self.lr,
                "reg": self.reg, "negatives": self.negatives, "epochs": self.epochs,
                "batch-size": self.batch_size, "clip": self.clip, "loss-cap": LOSS_CAP}

    def max_abs(self, fed: Federation) -> float:
        """The range every value of a node's reply provably lies in.

        local: ``w * clip(delta)`` with w <= the node's users, ``w``, ``w * min(loss, cap)``,
        ``w * clipped fraction``. exact: the summed V-gradient of n users is at most
        ``n * max |U|`` per entry (a user's triple weights sum to 1 and |dl/dx| <= weight),
        declared for ``max |U| <= mf-factor-bound``; the loss sum is capped too. A node whose
        values fall outside clips them inside the sum (no refusal: the server chooses V,
        which moves U), and the aggregator fails the round naming how many nodes clipped.
        """
        per_user = max(self.clip if self.mode == "local" else self.factor_bound, LOSS_CAP, 1.0)
        return float(fed.max_users) * per_user

    def run(self, fed: Federation) -> RunOutcome:
        V = init_item_factors(fed.n_items, self.dim, self.seed)
        server_opt = Adam(self.server_lr)
        max_abs = self.max_abs(fed)
        history = self.new_history()
        progress = _RoundLines("fedmf: train round")
        for r in range(1, self.rounds + 1):
            total = fed.sum(Action.TRAIN, {"V": V}, self.node_config(r), max_abs=max_abs,
                            phase="train")
            n = float(total["weight"][0])
            if n <= 0:
                raise ValueError(f"round {r}: no node has a user with training items")
            row: dict[str, Any] = {"round": r, "train-loss": float(total["loss"][0]) / n}
            if self.mode == "exact":
                V = V - self.lr * item_gradient(V, total["grad"], int(round(n)), self.reg)
            else:
                mean_delta = total["delta"] / n
                V = (V + self.server_lr * mean_delta if self.optimizer == "avg"
                     else server_opt.step(V, -mean_delta))
                row["clipped-fraction"] = float(total["clipped"][0]) / n
            history.append(row)
            progress(r, self.rounds, row["train-loss"])
        metrics = {"train-loss": history[-1]["train-loss"],
                   **fed.evaluate(Action.EVALUATE, {"V": V}, {"seed": self.seed},
                                               k=self.top_k)}
        return RunOutcome(metrics=metrics, history=history, extra={"item_factors": V})

    def drive_stock_strategy(self, strategy: Strategy, messenger: Messenger) -> RunOutcome:
        """Any message-API Strategy (e.g. a user's FedAvg subclass) drives the FedMF nodes.

        Flower's ``train`` messages reach ``clients.fedmf.fedmf_stock_train`` (one full-batch
        step, like ``mf-mode = exact``). Stock strategies aggregate in clear: on this path the
        server sees every node's updated item factors, the leak the FedMF protocol avoids.
        """
        cfg, grid = self.cfg, AccountedGrid(messenger.grid, messenger)
        infos = handshake(messenger, cfg, policy_needs=FedMF.STOCK_NEEDS)
        n_items = next(iter(infos.values())).n_items
        seed = int(cfg["seed"])
        initial = ArrayRecord([init_item_factors(n_items, int(cfg["mf-dim"]), seed)])
        train_config = ConfigRecord({
            **data_config(cfg),
            "fedrec-protocol": "fedmf",
            "mf-lr": float(cfg["mf-lr"]),
            "mf-reg": float(cfg["mf-reg"]),
            "mf-negatives": int(cfg["mf-negatives"]),
        })
        result = strategy.start(
            grid=grid,
            initial_arrays=initial,
            num_rounds=int(cfg["rounds"]),
            timeout=float(cfg["timeout"]),
            train_config=train_config,
            evaluate_config=ConfigRecord(dict(train_config)),
        )
        history = []
        for rnd in sorted(set(result.train_metrics_clientapp)
                          | set(result.evaluate_metrics_clientapp)):
            row: dict[str, Any] = {"round": rnd}
            row.update(dict(result.train_metrics_clientapp.get(rnd, {})))
            row.update(dict(result.evaluate_metrics_clientapp.get(rnd, {})))
            row.pop("num-examples", None)
            history.append(row)
        final = {k: v for k, v in history[-1].items() if k != "round"} if history else {}
        arrays = result.arrays.to_numpy_ndarrays() if result.arrays is not None else []
        return RunOutcome(metrics=final, history=history,
                          extra={"item_factors": arrays[0] if arrays else None},
                          privacy={"stock-strategy": "the server saw every node's item "
                                   "factors in clear (Flower train replies)"})
