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
from collections.abc import Mapping
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord
from flwr.serverapp.strategy import Strategy

from fedrec.config import ROUNDS, Key
from fedrec.recsys.metrics import evaluate_ranking
from fedrec.recsys.mf import BPRMF, Adam, EarlyStopped, init_item_factors, item_gradient
from fedrec.recsys.mf_ceiling import ceiling_keys, tune_mf_ceiling
from fedrec.transport.ledger import PROGRESS_SECONDS
from fedrec.transport.messenger import AccountedGrid, Messenger
from fedrec.wire import request as request_wire
from fedrec.wire.fedmf import EvaluateRequest, ExactSum, LocalSum, StockConfig, TrainRequest
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
    #: How :meth:`reference` searches its candidates: ``halving`` (successive halving within
    #: a budget of rounds) or ``full`` (each to its early stop); fedrec.recsys.mf_ceiling.
    ceiling_budget = "halving"
    #: What a stock Flower strategy driving these nodes asks of their policy (clear rounds).
    STOCK_NEEDS = (PolicyNeed("allow-plain", "Flower's stock train/evaluate rounds (the "
                              "server sees each node's item factors)"),)

    def __init__(self, cfg: Mapping[str, Any] | None = None) -> None:
        super().__init__(cfg)
        cfg = self.cfg  # typed: mf-mode and mf-optimizer are checked against their choices
        self.mode, self.rounds = cfg["mf-mode"], cfg["rounds"]
        self.dim = cfg["mf-dim"]
        self.lr, self.reg = cfg["mf-lr"], cfg["mf-reg"]
        self.negatives, self.epochs = cfg["mf-negatives"], cfg["mf-local-epochs"]
        self.batch_size, self.optimizer = cfg["mf-batch-size"], cfg["mf-optimizer"]
        self.server_lr, self.clip = cfg["mf-server-lr"], cfg["mf-clip"]
        self.factor_bound, self.seed = cfg["mf-factor-bound"], cfg["seed"]
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
        Ranking metrics keyed as the federated run's, plus what the tuning chose and spent
        (``fedrec.recsys.mf_ceiling.ceiling_keys``: ``tuned-rounds``, ``tuned-lr``, ...)."""
        tuned = self.tune(data.train)
        assert tuned.model is not None
        return {**evaluate_ranking(tuned.model.score, data.train, data.test,
                                   k=self.top_k).means(),
                **ceiling_keys(tuned, self.lr, self.reg, self.ceiling_budget)}

    def tune(self, train: Any, split_steps: bool = True, budget: str | None = None
             ) -> EarlyStopped:
        """The ceiling's steps, L2 weight and rounds, chosen on a validation split carved
        from ``train`` around this run's ``mf-lr`` / ``mf-reg``
        (``fedrec.recsys.mf_ceiling.tune_mf_ceiling``); ``budget``: ``halving`` or ``full``
        (None: :attr:`ceiling_budget`)."""
        return tune_mf_ceiling(self._untrained, train, self.lr, self.reg, self.rounds,
                               budget=budget or self.ceiling_budget,
                               split_steps=split_steps, seed=self.seed, top_k=self.top_k)

    def _untrained(self, lr: float | None = None, reg: float | None = None,
                   item_lr: float | None = None) -> BPRMF:
        return BPRMF(dim=self.dim, lr=self.lr if lr is None else lr,
                     reg=self.reg if reg is None else reg, negatives=self.negatives,
                     seed=self.seed, mode=self.mode, epochs=self.epochs,
                     batch_size=self.batch_size, item_lr=item_lr)

    def train_request(self, V: np.ndarray, round_: int) -> TrainRequest:
        """What every node needs for one round (public hyperparameters only)."""
        return TrainRequest(V=V, round=round_, mode=self.mode, seed=self.seed, lr=self.lr,
                            reg=self.reg, negatives=self.negatives, epochs=self.epochs,
                            batch_size=self.batch_size, clip=self.clip, loss_cap=LOSS_CAP)

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
            request = self.train_request(V, r)
            if self.mode == "exact":
                exact = fed.sum_of(request, ExactSum, max_abs=max_abs, phase="train")
                n = self._users(exact.weight, r)
                row: dict[str, Any] = {"round": r, "train-loss": float(exact.loss[0]) / n}
                V = V - self.lr * item_gradient(V, exact.grad, int(round(n)), self.reg)
            else:
                local = fed.sum_of(request, LocalSum, max_abs=max_abs, phase="train")
                n = self._users(local.weight, r)
                row = {"round": r, "train-loss": float(local.loss[0]) / n}
                mean_delta = local.delta / n
                V = (V + self.server_lr * mean_delta if self.optimizer == "avg"
                     else server_opt.step(V, -mean_delta))
                row["clipped-fraction"] = float(local.clipped[0]) / n
            history.append(row)
            progress(r, self.rounds, row["train-loss"])
        metrics = {"train-loss": history[-1]["train-loss"],
                   **fed.evaluate_ranking(EvaluateRequest(V=V, seed=self.seed,
                                                          top_k=self.top_k))}
        return RunOutcome(metrics=metrics, history=history, extra={"item_factors": V})

    @staticmethod
    def _users(weight: np.ndarray, r: int) -> float:
        """The round's summed user count; no user with training items is an error."""
        n = float(weight[0])
        if n <= 0:
            raise ValueError(f"round {r}: no node has a user with training items")
        return n

    def drive_stock_strategy(self, strategy: Strategy, messenger: Messenger) -> RunOutcome:
        """Any message-API Strategy (e.g. a user's FedAvg subclass) drives the FedMF nodes.

        Flower's ``train`` messages reach ``clients.fedmf.fedmf_stock_train`` (one full-batch
        step, like ``mf-mode = exact``). Stock strategies aggregate in clear: on this path the
        server sees every node's updated item factors, the leak the FedMF protocol avoids.
        """
        cfg, grid = self.cfg, AccountedGrid(messenger.grid, messenger)
        infos = handshake(messenger, cfg, policy_needs=FedMF.STOCK_NEEDS)
        n_items = next(iter(infos.values())).n_items
        seed = self.seed
        initial = ArrayRecord([init_item_factors(n_items, self.dim, seed)])
        stock = StockConfig(mf_lr=self.lr, mf_reg=self.reg, mf_negatives=self.negatives,
                            seed=seed)
        train_config = ConfigRecord({**data_config(cfg), request_wire.STOCK_PROTOCOL: "fedmf",
                                     **stock.to_config()})
        result = strategy.start(
            grid=grid,
            initial_arrays=initial,
            num_rounds=self.rounds,
            timeout=cfg["timeout"],
            train_config=train_config,
            evaluate_config=ConfigRecord(dict(train_config)),
        )
        history = []
        for rnd in sorted(set(result.train_metrics_clientapp)
                          | set(result.evaluate_metrics_clientapp)):
            row: dict[str, Any] = {"round": rnd}
            row.update(dict(result.train_metrics_clientapp.get(rnd, {})))
            row.update(dict(result.evaluate_metrics_clientapp.get(rnd, {})))
            row.pop(request_wire.NUM_EXAMPLES, None)
            history.append(row)
        final = {k: v for k, v in history[-1].items() if k != "round"} if history else {}
        arrays = result.arrays.to_numpy_ndarrays() if result.arrays is not None else []
        return RunOutcome(metrics=final, history=history,
                          extra={"item_factors": arrays[0] if arrays else None},
                          privacy={"stock-strategy": "the server saw every node's item "
                                   "factors in clear (Flower train replies)"})
