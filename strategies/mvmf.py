"""FedMVMF and PrivMVMF (paper 004, "PrivMVMF: Privacy-Preserving Multi-View Matrix
Factorization"): multi-view MF with an item server, plaintext or CKKS-encrypted gradients.

Parties (math in ``fedrec/recsys/multiview.py``, node handlers in ``clients/mvmf.py``, decisions in
``docs/protocols/mvmf.md``):

- user nodes (role ``user``) hold their users' explicit ratings, dummy attributes and user
  factors p_i; each epoch they compute p_i (SemiALS closed form, or an SGD step) and answer
  the summed gradients sum_i f(i,j), sum_i f(i,d) as a share of a sum;
- the item server (role ``item-server``) holds the item features Y and V; each epoch it
  answers sum_d f(j,d) for the broadcast Q in clear (paper Alg. 2: its data are not private);
  at the end it answers eq. 17's factors of the new (cold-start) items;
- the server (this strategy) holds Q, U and their Adam state.

``fedmvmf`` forms the user sums with the run's ``aggregator`` (``plain`` with one user per
node, ``partition = user``, is the paper's FedMVMF: the server sees every user's gradients;
the default ``secagg+`` already hides them). ``privmvmf`` always uses CKKS (TenSEAL, instead
of the paper's Paillier): one user node makes the context, the secret key reaches the other
user nodes sealed, the server adds ciphertexts with the public context, and the decrypter
node (drawn with the seed) opens only a sum of at least its ``min-survivors`` signed
contributions (``fedrec/wire/sums.py``). Dense packing hides which items a user sent.

Rounds per epoch: the item server's term, the users' sum (privmvmf: plus its decryption).
At the end: the item server's cold-start factors and the metric sum (plus its decryption).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any, TypeVar

import numpy as np

from fedrec.config import ROUNDS, Key
from fedrec.recsys.mf import PATIENCE, VALID_FRACTION
from fedrec.recsys.multiview import (
    CEILING_GRID,
    CEILING_REFINE,
    CEILING_REFINE_PASSES,
    EPOCHS_PER_CHECK,
    MAX_EPOCH_FACTOR,
    MVMF,
    P_UPDATES,
    WEIGHTINGS,
    Ceiling,
    MVMFConfig,
    attribute_dim,
    attribute_matrix,
    init_server_factors,
    rating_metrics,
    rating_ranking_means,
    server_gradients,
    tune_ceiling,
)
from fedrec.transport.aggregators import Aggregator, CkksAggregator
from fedrec.transport.factory import make_aggregator
from fedrec.transport.ledger import PROGRESS_SECONDS
from fedrec.transport.messenger import Messenger
from fedrec.wire import mvmf as mvmf_wire
from fedrec.wire.evaluation import RankingSum
from fedrec.wire.message import Message
from fedrec.wire.mvmf import (
    ColdFactors,
    EvaluateRequest,
    ItemColdRequest,
    ItemGradientRequest,
    ItemTerm,
    ModelRequest,
    TrainRequest,
    TrainSum,
)
from strategies.base import Federation, ProtocolStrategy, RoleNeed, RunOutcome
from strategies.policy_needs import PolicyNeed, aggregator_needs
from strategies.refusals import SettingRefused

log = logging.getLogger("fedrec")

R = TypeVar("R", bound=Message)
#: Keys of a history row (the server's own record, not the wire's).
_EPOCH, _LOSS, _USERS = "epoch", "loss", "users"

MVMF_KEYS: tuple[Key, ...] = (
    Key("mvmf-dim", 6, "K, the latent dimension (paper Table 2: 6)", min=1),
    Key("mvmf-lambda1", 1.0, "lambda1: weight of the attribute and item-feature views",
        min=1e-12),
    Key("mvmf-lambda2", 10.0, "lambda2: L2 regularisation of every factor", min=1e-12),
    Key("mvmf-weighting", "sampled", "weights of unrated items: `obsonly` (0), `inclunc` "
        "(alpha on all), `sampled` (alpha on rho x |rated| items drawn per epoch, paper eq. 36)",
        choices=WEIGHTINGS),
    Key("mvmf-alpha", 0.1, "alpha: weight of an unrated (or sampled) item", min=0.0, max=1.0),
    Key("mvmf-rho", 1.0, "rho: sampled unrated items per rated item (`sampled`)", min=0.0),
    Key("mvmf-p-update", "semials", "user factors by the SemiALS closed form (eq. 8) or one "
        "SGD step per epoch (eqs. 9-10)", choices=P_UPDATES),
    Key("mvmf-lr", 0.05, "gamma: the server's Adam learning rate (and the SGD step of p)",
        min=1e-12),
    Key("mvmf-beta1", 0.5, "Adam beta1 (paper Table 2)", min=0.0, max=0.999999),
    Key("mvmf-beta2", 0.99, "Adam beta2 (paper Table 2)", min=0.0, max=0.999999),
    # 1e9: a node's loss and gradient sums grow with its ratings (ML-1M users 1-2999 on 5
    # nodes: ~78k training ratings and a loss of ~1.1e6 per node in the first epoch); CKKS sums are
    # exact far beyond that, and SecAgg+'s 64-bit fixed point keeps 29 fractional bits
    Key("mvmf-max-abs", 1e9, "declared bound of every value a user node sends in a sum "
        "(its summed gradients and loss); nodes refuse values beyond it", min=1e-9),
    Key("mvmf-top-k", 10, "length of the recommendation lists (paper: 10)", min=1),
    Key("mvmf-threshold", 4.0, "a test rating >= this is relevant (paper: 4)", min=0.0),
)


def model_config(cfg: Mapping[str, Any]) -> MVMFConfig:
    """The model hyperparameters of a run config (public: they travel to every node)."""
    return MVMFConfig(dim=cfg["mvmf-dim"], lam1=cfg["mvmf-lambda1"],
                      lam2=cfg["mvmf-lambda2"], alpha=cfg["mvmf-alpha"],
                      rho=cfg["mvmf-rho"], weighting=cfg["mvmf-weighting"],
                      p_update=cfg["mvmf-p-update"], lr=cfg["mvmf-lr"],
                      beta1=cfg["mvmf-beta1"], beta2=cfg["mvmf-beta2"],
                      seed=cfg["seed"])


def model_fields(model: MVMFConfig, epoch: int, top_k: int,
                 threshold: float) -> dict[str, Any]:
    """The fields every MVMF request carries (``fedrec.wire.mvmf.ModelRequest``), as
    keyword arguments of a request: public hyperparameters and the evaluation's schema."""
    return dict(dim=model.dim, lam1=model.lam1, lam2=model.lam2, alpha=model.alpha,
                rho=model.rho, weighting=model.weighting, p_update=model.p_update,
                lr=model.lr, beta1=model.beta1, beta2=model.beta2, seed=model.seed,
                epoch=int(epoch), top_k=top_k, threshold=threshold)


class FedMVMF(ProtocolStrategy):
    """Federated multi-view MF: user sums through the run's aggregator, an item server."""

    config_keys = (ROUNDS, *MVMF_KEYS)
    federation = (RoleNeed(("user",), min=1, holds=("rows", "user-attributes")),
                  RoleNeed(("item-server",), min=1, max=1, holds=("item-features",)))
    name = "fedmvmf"
    sum_roles = ("user",)  # the item server sends in clear

    def __init__(self, cfg: Mapping[str, Any] | None = None) -> None:
        super().__init__(cfg)
        cfg = self.cfg
        if cfg["implicit"]:
            raise SettingRefused(f"{self.name} factorizes explicit ratings", "implicit", False)
        self.model, self.epochs = model_config(cfg), cfg["rounds"]
        self.dataset, self.clusters = cfg["dataset"], cfg["synthetic-clusters"]
        self.top_k, self.threshold = cfg["mvmf-top-k"], cfg["mvmf-threshold"]

    # -- reference ---------------------------------------------------------------------------
    def attributes(self, data: Any) -> np.ndarray:
        """The dummy attribute rows of ``data``'s users (the run's schema)."""
        return attribute_matrix(data.user_attributes, self.dataset, self.clusters, "reference")

    def reference_model(self, data: Any, groups: Any = None) -> MVMF:
        """The centralized model of this run's budget: the same per-party code on all users
        (``groups``: the federation's user sets, so sums run in its order)."""
        return MVMF(self.model).fit(data.train, self.attributes(data), data.item_features,
                                    self.epochs, groups)

    def budget_metrics(self, data: Any) -> dict[str, float]:
        """Metrics of :meth:`reference_model` (keys as the federated run's): the federated
        arithmetic at this run's budget, equal to the run up to float64 rounding."""
        model = self.reference_model(data)
        return {**rating_metrics(model, data.train, self.attributes(data),
                                 data.item_features, data.test, data.cold_items, self.top_k,
                                 self.threshold), "train-loss": model.losses[-1]}

    def tune(self, data: Any) -> Ceiling:
        """This run's MVMF trained centrally to convergence (``tune_ceiling``): epochs by
        early stopping on a validation split carved from train, (lr, lambda1, lambda2) from
        CEILING_GRID around this run's, then CEILING_REFINE and steps past an edge; the test
        split is not passed."""
        n = len(CEILING_GRID) + len(CEILING_REFINE)
        log.info("%s reference: centralized MVMF to convergence (early stopping on a %.0f%% "
                 "validation split of train, a check every %d epochs, patience %d checks, at "
                 "most %d epochs; %d (lr, lambda1, lambda2) candidates, then a step past any "
                 "edge the best sits on, up to %d passes)", self.name, 100 * VALID_FRACTION,
                 EPOCHS_PER_CHECK, PATIENCE, MAX_EPOCH_FACTOR * self.epochs, n,
                 CEILING_REFINE_PASSES)

        def shown(i: int, n_: int, label: str, out: Any) -> None:
            log.info("%s reference: candidate %d (lr, lambda1, lambda2 = %s) done, %d epochs, "
                     "validation NDCG@%d %.4f", self.name, i, label,
                     out.rounds * EPOCHS_PER_CHECK, self.top_k, max(out.curve))

        tuned = tune_ceiling(self.model, self.attributes(data), data.item_features,
                             data.cold_items, data.train, self.epochs, self.top_k,
                             self.threshold, on_candidate=shown, seed=self.model.seed)
        log.info("%s reference: lr %g, lambda1 %g, lambda2 %g, %d epochs chosen (validation "
                 "NDCG@%d %.4f)", self.name, tuned.cfg.lr, tuned.cfg.lam1, tuned.cfg.lam2,
                 tuned.epochs, self.top_k, tuned.valid)
        return tuned

    def reference(self, data: Any) -> dict[str, float]:
        """The centralized ceiling (:meth:`tune`), scored on test as the federated run is
        (keys as its metrics), plus ``tuned-rounds`` (epochs), ``tuned-lr``,
        ``tuned-lam1``, ``tuned-lam2``, ``tuned-valid`` (the chosen validation NDCG@k),
        ``tuned-candidates`` and ``tuned-at-edge`` (1.0 when a chosen value is its grid's
        smallest or largest)."""
        return self.ceiling_metrics(data, self.tune(data))

    def ceiling_metrics(self, data: Any, tuned: Ceiling) -> dict[str, float]:
        """:meth:`reference`'s dict for a tuning result (scored on ``data``'s test split)."""
        model = tuned.model
        assert model.model is not None
        return {**model.metrics(data.train, data.test), "train-loss": model.model.losses[-1],
                "tuned-rounds": float(tuned.epochs), "tuned-lr": tuned.cfg.lr,
                "tuned-lam1": tuned.cfg.lam1, "tuned-lam2": tuned.cfg.lam2,
                "tuned-valid": tuned.valid, "tuned-candidates": float(len(tuned.tried)),
                "tuned-at-edge": float(tuned.at_edge)}

    # -- the protocol --------------------------------------------------------------------------
    def _sum(self, fed: Federation, request: ModelRequest, reply: type[R], max_abs: float,
             phase: str, seconds: dict[str, float]) -> R:
        """A user sum; under CKKS the decryption is timed as its own phase (Table 5)."""
        t0 = time.perf_counter()
        agg = fed.aggregator
        if isinstance(agg, CkksAggregator):
            chunks, layout = agg.sum_encrypted(request.ACTION, request.to_records(),
                                               max_abs=max_abs, phase=phase)
            t1 = time.perf_counter()
            out = reply.from_parts(agg.decrypt(chunks, layout, phase=phase), {}, "the sum")
            seconds["decryption"] = seconds.get("decryption", 0.0) + time.perf_counter() - t1
            seconds["aggregation"] = seconds.get("aggregation", 0.0) + t1 - t0
            return out
        out = fed.sum_of(request, reply, max_abs=max_abs, phase=phase)
        seconds["aggregation"] = seconds.get("aggregation", 0.0) + time.perf_counter() - t0
        return out

    @staticmethod
    def _item_server(fed: Federation, node: int, request: ItemGradientRequest |
                     ItemColdRequest, reply: type[R], phase: str) -> R:
        """The item server's clear reply to ``request``, checked (errors name the node)."""
        content = fed.send(request, nodes=[node], phase=phase)[node]
        return reply.from_records(content, fed.messenger.label(node),
                                  {"items": fed.n_items, "K": request.Q.shape[1]})

    def run(self, fed: Federation) -> RunOutcome:
        messenger, cfg = fed.messenger, self.cfg
        (item_server,) = fed.of_role("item-server")
        agg = fed.aggregator
        model, max_abs = self.model, cfg["mvmf-max-abs"]
        n_attrs = attribute_dim(cfg["dataset"], cfg["synthetic-clusters"])
        Q, U = init_server_factors(fed.n_items, n_attrs, model.dim, model.seed)
        optQ, optU = model.adam(), model.adam()
        history = self.new_history()
        seconds: dict[str, float] = {"item-server": 0.0, "aggregation": 0.0,
                                     "server-update": 0.0}
        t_start, last_line = time.perf_counter(), float("-inf")
        for epoch in range(1, self.epochs + 1):
            fields = model_fields(model, epoch, self.top_k, self.threshold)
            t0 = time.perf_counter()
            item = self._item_server(fed, item_server, ItemGradientRequest(Q=Q, **fields),
                                     ItemTerm, "item-server")
            seconds["item-server"] += time.perf_counter() - t0
            total = self._sum(fed, TrainRequest(Q=Q, U=U, **fields), TrainSum, max_abs,
                              "train", seconds)
            t1 = time.perf_counter()
            if total.users[0] < 0.5:
                raise ValueError(f"epoch {epoch}: no user node has a user with training "
                                 "ratings")
            dQ, dU = server_gradients(Q, U, total.gQ, total.gU, item.item_term, model.lam1,
                                      model.lam2)
            Q, U = optQ.step(Q, dQ), optU.step(U, dU)
            seconds["server-update"] += time.perf_counter() - t1
            history.append({_EPOCH: epoch, _LOSS: float(total.loss[0] + item.loss[0]),
                            _USERS: int(round(float(total.users[0])))})
            now = time.perf_counter()
            if epoch in (1, self.epochs) or now - last_line >= PROGRESS_SECONDS:
                log.info("%s: epoch %d of %d done, loss %.4g, %.1f s", self.name, epoch,
                         self.epochs, history[-1][_LOSS], now - t_start)
                last_line = now
            messenger.ledger.summarize(force=False)
        fields = model_fields(model, self.epochs, self.top_k, self.threshold)
        cold = self._item_server(fed, item_server, ItemColdRequest(Q=Q, **fields),
                                 ColdFactors, mvmf_wire.COLD_ITEMS)  # phase named as its reply
        Q_eval = Q.copy()
        idx = cold.cold_items.astype(np.int64)
        if idx.size and (idx.min() < 0 or idx.max() >= fed.n_items):
            raise ValueError(f"{messenger.label(item_server)} named cold items outside the "
                             f"catalogue of {fed.n_items}")
        Q_eval[idx] = cold.cold_factors
        k = self.top_k
        sums = self._sum(fed, EvaluateRequest(Q=Q_eval, U=U, new_items=idx.astype(np.float64),
                                              **fields),
                         RankingSum, float(fed.max_users) + 1.0, "evaluate", {})
        metrics = {**rating_ranking_means(sums.ranking, k), "train-loss": history[-1][_LOSS]}
        epochs = max(self.epochs, 1)
        privacy = {"item-server": "sends sum_d f(j,d) (items x K) for the broadcast Q in clear "
                   "every epoch, and the eq. 17 factors of its new items (paper Alg. 2)",
                   "user-sums": agg.kind}
        if isinstance(agg, CkksAggregator):
            privacy["decrypter"] = messenger.label(agg.decrypter)
        return RunOutcome(metrics=metrics, history=history,
                          extra={"Q": Q, "U": U, "cold_items": idx,
                                 "epoch_seconds": {k2: v / epochs for k2, v in seconds.items()}},
                          privacy=privacy)


class PrivMVMF(FedMVMF):
    """PrivMVMF: the users' gradients only as a CKKS sum, opened by one decrypter node."""

    name = "privmvmf"
    #: Why a run is not reproducible by its seed.
    unseeded_randomness = ("CKKS sums are approximate and each encryption draws fresh OS "
                           "randomness, so the low digits of every sum vary")

    def policy_needs(self) -> tuple[PolicyNeed, ...]:
        """Always CKKS sums (:meth:`sum_aggregator`): ``allow-ckks``."""
        return aggregator_needs("ckks")

    def sum_aggregator(self, messenger: Messenger, users: list[int]) -> Aggregator:
        """Always CKKS (the run config's ``aggregator`` is not read): the paper's scheme."""
        cfg = self.cfg
        if cfg["aggregator"] not in ("ckks", "secagg+"):
            log.info("privmvmf sums with CKKS; run config aggregator = %s is not used",
                     cfg["aggregator"])
        return make_aggregator("ckks", messenger, users, seed=cfg["seed"])

