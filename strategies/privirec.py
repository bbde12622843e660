"""PriviRec and PriviRec-k (paper 000, "Secure Federated Graph-Filtering for Recommender
Systems"): graph filters (GF-CF, BSPM, Turbo-CF) from secure sums and a distributed
randomized power method, without centralizing any interaction.

Phases (each a secure sum unless noted; client side in ``clients/privirec.py``):

1. ``degrees`` (Eq. 6): V' = sum of the nodes' item degree counts.
2. ``gram`` (Theorem 3.1, PriviRec only): P' = sum_u d_u^{-2 alpha} R_u^T R_u (upper
   triangle); the server forms P~ = V^{alpha-1} P' V^{alpha-1}. Once per alpha the filters
   need (Turbo-CF uses its own alpha, 0.6 on Gowalla and Yelp2018).
3. ``power`` (Algorithm 1): round 1 sums R~_u^T Omega_u with Omega rows drawn privately by
   each node (digest A2: the server must not know Omega); rounds 2..L sum R~_u^T R~_u X and
   the server takes a positive-diagonal QR (``qr_positive``). ``L`` counts all secure-sum
   rounds including the sketch round; the default 3 is the paper's "L = 2" power rounds
   after the sketch (digest A3; measured in docs/protocols/privirec.md).
4. ``ritz`` (beyond the paper, on by default when filters need different ranks): one k x k
   secure sum H = sum_u (R~_u X)^T (R~_u X) and a Rayleigh-Ritz step, so the leading r
   columns are the best rank-r estimate for every filter and the eigenvalue estimates are
   Ritz values instead of diag(T) (digest A6).
5. ``evaluate``: the server broadcasts V, P~ (PriviRec) or diag of the eigenvalue estimates
   (PriviRec-k), and S; every node builds each filter and scores its own users; the Recall
   and NDCG sums come back through a secure sum, so the server learns totals only.

Decisions on the paper's open points are listed in ``docs/protocols/privirec.md``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any, TypeVar

import numpy as np
import scipy.sparse as sp

from fedrec.config import ConfigError, Key
from fedrec.recsys.graph_filters import (
    SCORE_DTYPES,
    default_hyperparams,
    evaluate_centrally,
    make_filter,
)
from fedrec.recsys.linalg import (
    item_item_from_gram,
    qr_positive,
    rayleigh_ritz_from_gram,
    symmetric_from_upper,
    upper_triangle,
)
from fedrec.recsys.metrics import RankingSums
from fedrec.transport.aggregators import Aggregator
from fedrec.transport.factory import make_aggregator
from fedrec.transport.messenger import Messenger
from fedrec.wire import privirec as privirec_wire
from fedrec.wire.message import Message
from fedrec.wire.privirec import (
    OMEGA_MODES,
    DegreesRequest,
    DegreesSum,
    EvaluateRequest,
    FilterRankings,
    GramRequest,
    GramSum,
    PowerRequest,
    PowerSum,
    RitzSum,
    SparseGram,
    triangle_fields,
)
from fedrec.wire.sums import WIRE_DTYPES
from strategies.base import Federation, ProtocolStrategy, RunOutcome, data_config
from strategies.policy_needs import PolicyNeed
from strategies.refusals import SettingRefused

log = logging.getLogger("fedrec")
R = TypeVar("R", bound=Message)

DEFAULT_FILTERS = ("gf-cf", "bspm-lm", "bspm-em", "turbo-cf")
#: Ranges declared to the fixed-point encoder (see clients/privirec.py for why they hold).
POWER_MAX_ABS = 2.0  # entries of R~_node^T R~_node X and of H: the node's P~ part has norm <= 1


#: The parameters of the paper's Table 1 figures (Section 3.6: L = 3, k2 = 2000, e = 1000
#: epochs, k3 = 64), with which Gowalla gives 1,679M, 246M and 4,534M floats per client.
PAPER_TABLE1 = {"L": 3, "k2": 2000, "e": 1000, "k3": 64}


def paper_float_counts(n_items: int, L: int, k2: int = 2000, k3: int = 64,
                       e: int = 1000, n_users: int = 0) -> dict[str, float]:
    """Dominant per-client upload terms of the paper's Table 1 (Section 3.6), in floats.

    PriviRec: |I|^2; PriviRec-k: L k2 |I|; federated GCN/MF: e k3 (|I| + n). With
    :data:`PAPER_TABLE1` and Gowalla's catalogue these are 1,679M, 246M and 4,534M.
    """
    return {"privirec": float(n_items) ** 2, "privirec-k": float(L * k2 * n_items),
            "federated-gcn": float(e * k3 * (n_items + n_users))}


#: Run-config keys of PriviRec (PriviRec-k adds ``privirec-k``).
PRIVIREC_KEYS: tuple[Key, ...] = (
    Key("privirec-filters", ",".join(DEFAULT_FILTERS), "comma-separated filters to build and "
        "evaluate (`gf-cf`, `bspm-lm`, `bspm-em`, `turbo-cf`, `linear`, `ideal`); privirec-k "
        "drops `turbo-cf`"),
    Key("privirec-L", 3, "secure-sum rounds of the power method, including the R~^T Omega "
        "round: the sketch round plus L-1 power rounds. 3 reproduces the paper's Table 3 "
        "\"Priv.\" column (its \"L = 2\"; docs/protocols/privirec.md, A3)", min=1),
    Key("privirec-rank", 0, "iteration rank p; `0` = the largest rank any filter needs", min=0),
    Key("privirec-ritz", "auto", "Rayleigh-Ritz step (one k x k secure sum): `auto` (privirec: "
        "when filter ranks differ or privirec-rank exceeds a filter's rank; privirec-k: off), "
        "`true`, `false`",
        choices=("auto", "true", "false")),
    Key("privirec-omega", "private", "`private`: each node draws its Omega rows from OS "
        "entropy; `seeded`: from (seed, user id), reproducible by the centralized reference "
        "(evaluation only)", choices=OMEGA_MODES),
    Key("privirec-filter-rank", 0, "override every filter's ideal low-pass rank (`0` = "
        "published per-dataset ranks); for small catalogues", min=0),
    Key("privirec-wire-dtype", "float64", "precision of the dense |I| x p matrices on the "
        "wire (X, the nodes' Y, S): `float64` (lossless) or `float32` (half the bytes and node "
        "memory; `aggregator = plain` only; the server still does QR in float64)",
        choices=WIRE_DTYPES),
    Key("privirec-score-dtype", "float64", "precision of a node's products with the explicit "
        "P~ when it scores its users: `float64` (the centralized reference's arithmetic, to "
        "rounding) or `float32` (less than half the CPU of each product on Gowalla at ~1e-6 "
        "relative error; results/privirec/node_cost_gowalla.md)", choices=SCORE_DTYPES),
)


def published_presets(filters: tuple[str, ...], dataset: str,
                      filter_rank: int = 0) -> dict[str, dict[str, Any]]:
    """Per filter, the settings the dataset NAME selects over each method's generic defaults
    (``graph_filters.default_hyperparams``: published settings for gowalla, yelp2018,
    amazon-book and their aliases), without a rank that ``privirec-filter-rank`` overrides.
    The synthetic data's rank (twice its latent rank) is this project's choice, not a
    published preset, and is not listed."""
    if dataset == "synthetic":
        return {}
    out: dict[str, dict[str, Any]] = {}
    for name in filters:
        generic = default_hyperparams(name, None)
        named = default_hyperparams(name, dataset)
        diff = {k: v for k, v in named.items() if generic.get(k) != v
                and not (k == "rank" and filter_rank)}
        if diff:
            out[name] = diff
    return out


def preset_line(filters: tuple[str, ...], dataset: str, filter_rank: int = 0) -> str:
    """One console line naming the published presets a run applies because of its dataset
    name and how to override them; "" when none applies."""
    presets = published_presets(filters, dataset, filter_rank)
    if not presets:
        return ""
    parts = "; ".join(f"{name} " + " ".join(f"{k}={v}" for k, v in hp.items())
                      for name, hp in presets.items())
    ranks = any("rank" in hp for hp in presets.values())
    generic = ("for each method's generic defaults run the data under another dataset name "
               "(a folder of your own, docs/datasets.md)")
    how = (f"Override the ranks with --set privirec-filter-rank=N; {generic}" if ranks
           else generic[0].upper() + generic[1:])
    return f"privirec: dataset '{dataset}' selects published filter presets: {parts}. {how}"


class NodeSetChanged(RuntimeError):
    """PriviRec's sums ran over different node sets (the paper forbids it: differencing)."""


def check_fixed_node_set(agg: Aggregator) -> None:
    """Abort unless every sum so far holds the inputs of the same nodes.

    PriviRec's sums (degrees, item-item, power rounds, evaluation) are only private as a
    set over one fixed federation: two sums over node sets that differ by one node could be
    differenced to that node's contribution (paper 000, Section 3). The SecAgg+ aggregator
    already abandons a sum with a dropout before unmasking (``agg.fixed_set``); this check
    holds for every aggregator and names the sums and nodes.
    """
    if not agg.view:
        return
    first = agg.view[0]
    for record in agg.view[1:]:
        if record.members != first.members:
            label = agg.messenger.label
            gone = sorted(set(first.members) - set(record.members))
            new = sorted(set(record.members) - set(first.members))
            change = "; ".join(part for part in (
                f"without {', '.join(label(n) for n in gone)}" if gone else "",
                f"with {', '.join(label(n) for n in new)} added" if new else "") if part)
            raise NodeSetChanged(
                f"PriviRec needs one fixed node set: sum '{record.phase}' ran {change} "
                f"compared with sum '{first.phase}'; the run stops (sums over different node "
                "sets could be differenced to one node's contribution)")


def _sparse_gram(gram: SparseGram, label: str, n_items: int) -> sp.csr_matrix:
    """A node's sparse item-item contribution, its shape checked."""
    shape = tuple(int(x) for x in gram.shape)
    if shape != (n_items, n_items):
        raise ValueError(f"{label}: its sparse item-item reply has shape {shape}, expected "
                         f"({n_items}, {n_items})")
    return gram.matrix()


class PriviRec(ProtocolStrategy):
    """PriviRec (paper 000, Section 3.3): exact P~ and the ideal low-pass filter.

    Its settings, from the run config (``privirec-*`` keys and the core's)
    ----------------------------------------------------------------------
    filters : filter names to evaluate (``gf-cf``, ``bspm-lm``, ``bspm-em``, ``turbo-cf``,
        ``linear``, ``ideal``); hyperparameters are each method's published per-dataset ones.
    L : secure-sum rounds of the power method, including the R~^T Omega round (default 3:
        the sketch round and two power rounds, which reproduces Table 3's "Priv." column;
        see docs/protocols/privirec.md, A3).
    rank : iteration rank p; 0 means the largest rank any filter needs (GF-CF 256, BSPM 448
        on Gowalla, 384 on Yelp2018).
    ritz : run the Rayleigh-Ritz step (one k x k secure sum); None = when ranks differ or
        the iteration rank exceeds a filter's rank (oversampling).
    omega : ``private`` (default; each node draws its Omega rows from OS entropy) or
        ``seeded`` (reproducible from the run seed; for comparisons with the reference).
    aggregator : ``secagg+``, ``plain`` (labelled clear sums; the item-item contribution then
        travels sparse, which is what makes Gowalla-scale runs possible) or ``ckks``.
    secagg_degree : neighbours per node in SecAgg+ (0 = complete graph).
    filter_rank : override every filter's ideal low-pass rank (0 = the published ranks); for
        small catalogues.
    wire_dtype : precision of the dense |I| x p matrices that travel (X, the nodes' Y, S):
        ``float64`` (default, lossless) or ``float32`` (half the bytes and node memory; the
        server still runs QR and sums in float64, and the nodes' low-rank scoring runs in
        float32). Plain sums only: SecAgg+ replies are 64-bit ring elements either way.
    score_dtype : precision of each node's products with the explicit P~ at evaluation
        (``float64`` default; ``float32`` for large catalogues, where these products are
        almost all of a node's work: docs/protocols/privirec.md). Nothing it computes
        travels except the metric sums, so any aggregator accepts it.
    """

    low_rank = False
    config_keys = PRIVIREC_KEYS

    def __init__(self, cfg: Mapping[str, Any] | None = None) -> None:
        super().__init__(cfg)
        cfg = self.cfg
        L, ritz = cfg["privirec-L"], cfg["privirec-ritz"]
        wire_dtype, score_dtype = cfg["privirec-wire-dtype"], cfg["privirec-score-dtype"]
        aggregator, rank = cfg["aggregator"], cfg["privirec-rank"]
        if L < 1:
            raise ConfigError(f"privirec-L counts the R~^T Omega round and must be >= 1, got {L}")
        self.filters = tuple(f.strip() for f in cfg["privirec-filters"].split(",")
                             if f.strip())
        self.L, self.rank, self.omega = L, rank, cfg["privirec-omega"]
        self.ritz: bool | None = None if ritz == "auto" else ritz == "true"
        self.aggregator, self.secagg_degree = aggregator, cfg["secagg-degree"]
        self.dataset, self.seed, self.top_k = cfg["dataset"], cfg["seed"], 20
        self.filter_rank = cfg["privirec-filter-rank"]
        if wire_dtype not in WIRE_DTYPES:
            raise ConfigError(f"privirec-wire-dtype must be one of {WIRE_DTYPES}, got "
                              f"{wire_dtype!r}")
        if wire_dtype != "float64" and aggregator != "plain":
            raise ConfigError("privirec-wire-dtype = float32 needs aggregator = 'plain' (SecAgg+ "
                              "sums 64-bit fixed-point ring elements, CKKS its own encoding)")
        self.wire_dtype = wire_dtype
        if score_dtype not in SCORE_DTYPES:
            raise ConfigError(f"privirec-score-dtype must be one of {SCORE_DTYPES}, got "
                              f"{score_dtype!r}")
        self.score_dtype = score_dtype
        # PriviRec-k: the ideal low-pass part uses at most the k columns there are
        self.max_filter_rank = rank if self.low_rank else 0
        self._filter_objects()  # unknown filter names fail here, before any message

    def policy_needs(self) -> tuple[PolicyNeed, ...]:
        """The aggregator's needs; a plain item-item sum travels sparse and unmasked
        (``allow-sparse-transport``); a seeded Omega is known to the server
        (``allow-seeded-omega``)."""
        strategy = self
        needs = list(super().policy_needs())
        gram = not strategy.low_rank and any(
            f.needs_P for f in strategy._filter_objects().values())
        if strategy.aggregator == "plain" and gram:
            needs.append(PolicyNeed("allow-sparse-transport", "sparse item-item transport "
                                    "(its rows of R^T R unmasked)"))
        if strategy.omega == "seeded" and strategy.iteration_rank_needed():
            needs.append(PolicyNeed("allow-seeded-omega", "seeded Omega (the server knows "
                                    "Omega and, with p >= users, recovers every row)"))
        return tuple(needs)

    # -- helpers ----------------------------------------------------------------------------
    def _filter_objects(self) -> dict[str, Any]:
        return {name: make_filter(name, self.dataset, self.filter_rank, self.max_filter_rank)
                for name in self.filters}

    def iteration_rank(self, n_items: int) -> int:
        """The power method's rank p; a p above the catalogue is refused naming the key that
        set it and a value that fits (the largest power of two up to ``n_items``)."""
        ranks = [f.rank for f in self._filter_objects().values() if f.needs_S]
        p = self.rank or max(ranks, default=0)
        if p > n_items:
            raise SettingRefused(f"{type(self).__name__}: rank {p} is larger than the number "
                                 f"of items ({n_items})", self.rank_key(),
                                 1 << (n_items.bit_length() - 1))
        return p

    def rank_key(self) -> str:
        """The run-config key that set the iteration rank: the one to lower."""
        return "privirec-rank" if self.rank else "privirec-filter-rank"

    def check_catalogue(self, n_items: int) -> None:
        """Before any message where the catalogue is known first (a simulation's data)."""
        self.iteration_rank(n_items)

    @property
    def unseeded_randomness(self) -> str:
        """Why this run is not reproducible by its seed ("" when it is): with
        ``omega = private`` each node draws its Omega rows from the OS CSPRNG, so S and the
        low-rank filters' metrics change from run to run (the server must not know Omega);
        CKKS sums carry encryption noise."""
        reasons = []
        if self.omega == "private" and self.iteration_rank_needed():
            reasons.append(
                "PriviRec's power method starts from Omega rows each node draws privately "
                "from the OS CSPRNG (privirec-omega = private), so the low-rank filters' "
                "metrics vary from run to run; --set privirec-omega=seeded with "
                "--node-policy allow-seeded-omega=true reproduces them (evaluation only: the "
                "server can then compute Omega)")
        if self.aggregator == "ckks":
            reasons.append("CKKS sums are approximate and each encryption draws fresh OS "
                           "randomness, so the low digits of every sum vary")
        return "; ".join(reasons)

    def iteration_rank_needed(self) -> bool:
        """Whether any filter needs the power method (else Omega is never drawn)."""
        return bool(self.rank) or any(f.needs_S for f in self._filter_objects().values())

    def _use_ritz(self) -> bool:
        if self.ritz is not None:
            return self.ritz
        ranks = {f.rank for f in self._filter_objects().values() if f.needs_S}
        # an oversampled basis (p above a filter's rank) only helps through Ritz: without it
        # the leading r QR columns of the p-block are no better than p = r (ML-1M, p = 2r:
        # NDCG@20 0.3783 without, 0.3861 with; docs/protocols/privirec.md)
        oversampled = bool(self.rank) and any(r < self.rank for r in ranks)
        return len(ranks) > 1 or self.low_rank or oversampled

    # -- phases -----------------------------------------------------------------------------
    def sum_degrees(self, fed: Federation) -> np.ndarray:
        """Eq. 6: V' = SecAgg(R_u)."""
        return fed.sum_of(DegreesRequest(), DegreesSum, max_abs=float(fed.max_users),
                          phase="degrees").deg

    def sum_gram(self, fed: Federation, alpha: float) -> sp.csr_matrix:
        """Theorem 3.1: P' (upper triangle) by secure sum, or sparse plain sum if labelled."""
        n_items, phase = fed.n_items, f"gram@{alpha:g}"
        if self.aggregator == "plain":  # sparse clear sum, in node order (reproducible)
            return symmetric_from_upper(self._sparse_gram_sum(
                fed, GramRequest(alpha=alpha, transport="sparse"), phase))
        dense = fed.sum_of(GramRequest(alpha=alpha, transport="dense"), GramSum,
                           max_abs=float(fed.max_users), phase=phase).gram
        rows, cols = np.triu_indices(n_items)
        keep = dense != 0.0
        upper = sp.csr_matrix((dense[keep], (rows[keep], cols[keep])), shape=(n_items, n_items))
        return symmetric_from_upper(upper)

    @staticmethod
    def _sparse_gram_sum(fed: Federation, request: GramRequest, phase: str) -> sp.csr_matrix:
        """Every node's sparse triangle, added in node order; recorded as a plain sum."""
        n_items = fed.n_items
        total = sp.csr_matrix((n_items, n_items))
        layout = [(privirec_wire.GRAM, (n_items, n_items))]
        for node, gram in fed.plain_replies(request, SparseGram, phase=phase, layout=layout):
            total = total + _sparse_gram(gram, fed.messenger.label(node), n_items)
        return total

    def power_method(self, fed: Federation, item_deg: np.ndarray, p: int,
                     k: int) -> tuple[np.ndarray, np.ndarray]:
        """Algorithm 1 with L secure-sum rounds; optional Rayleigh-Ritz. Returns (S, eigvals)."""
        wire = np.dtype(self.wire_dtype)

        def power_sum(X: np.ndarray | None, reply: type[R], max_abs: float, phase: str,
                      ritz: bool | None = None) -> R:
            request = PowerRequest(item_deg=item_deg,
                                   X=None if X is None else X.astype(wire, copy=False),
                                   p=p, omega=self.omega, seed=self.seed, ritz=ritz)
            return fed.sum_of(request, reply, max_abs=max_abs, phase=phase,
                              wire_dtype=self.wire_dtype)

        omega_max = 8.0 * float(fed.max_users)  # |sum_u R~_ui Omega_ui| <= 8 * (users on a node)
        t0 = time.perf_counter()
        rounds = self.L + int(self._use_ritz())
        X, T = qr_positive(power_sum(None, PowerSum, omega_max, "power").Y)
        log.info("privirec: power round 1 of %d (sketch R~^T Omega) done, %.1f s", rounds,
                 time.perf_counter() - t0)
        for i in range(2, self.L + 1):
            X, T = qr_positive(power_sum(X, PowerSum, POWER_MAX_ABS, "power").Y)
            log.info("privirec: power round %d of %d done, %.1f s", i, rounds,
                     time.perf_counter() - t0)
        if self._use_ritz():
            log.info("privirec: power round %d of %d (Rayleigh-Ritz)", rounds, rounds)
            H = power_sum(X, RitzSum, POWER_MAX_ABS, "ritz", ritz=True).H
            S, theta = rayleigh_ritz_from_gram(X, H)  # H = X^T P~ X
            return S[:, :k], np.maximum(theta[:k], 0.0)
        return X[:, :k], np.abs(np.diag(T))[:k].copy()

    def evaluate(self, fed: Federation, item_deg: np.ndarray, S: np.ndarray | None,
                 eigvals: np.ndarray | None,
                 P: Mapping[float, sp.csr_matrix]) -> dict[str, RankingSums]:
        """Broadcast the pieces; nodes score their users; secure sum of the metric sums."""
        filters = sorted(set(self.filters))  # the reply's rows, in this order
        triangles = {alpha: upper_triangle(Pt) for alpha, Pt in P.items()}
        request = EvaluateRequest(
            **triangle_fields(triangles, fed.n_items), top_k=self.top_k, dataset=self.dataset,
            filter_rank=self.filter_rank, max_filter_rank=self.max_filter_rank,
            score_dtype=self.score_dtype, filters=filters, item_deg=item_deg,
            S=None if S is None else S.astype(self.wire_dtype, copy=False), eigvals=eigvals)
        total = fed.sum_of(request, FilterRankings, max_abs=float(fed.max_users) + 1.0,
                           phase="evaluate")
        return {name: RankingSums.from_vector(self.top_k, row)
                for name, row in zip(filters, total.ranking, strict=True)}

    # -- the centralized reference -----------------------------------------------------------
    def reference(self, data: Any) -> dict[str, float]:
        """The same filters from exactly computed pieces on all the data in one process
        (exact SVD instead of the power method): what the federated metrics are compared
        with. Keys as the federated run's (``gf-cf/ndcg@20``)."""
        sums = evaluate_centrally(data.train, data.test, self.filters, self.dataset,
                                  filter_rank=self.filter_rank, max_rank=self.max_filter_rank,
                                  k=self.top_k)
        return {f"{name}/{key}": value for name, s in sums.items()
                for key, value in s.means().items()}

    # -- the run ----------------------------------------------------------------------------
    def sum_aggregator(self, messenger: Messenger, nodes: list[int]) -> Aggregator:
        """The aggregator this strategy was built with, over a fixed node set: a dropout
        abandons the sum before anything is unmasked."""
        agg = make_aggregator(self.aggregator, messenger, nodes,
                              degree=self.secagg_degree or None, seed=self.seed)
        agg.fixed_set = True
        return agg

    def run(self, fed: Federation) -> RunOutcome:
        infos, agg, n_items = fed.infos, fed.aggregator, fed.n_items
        p = self.iteration_rank(n_items)
        presets = preset_line(self.filters, self.dataset, self.filter_rank)
        if presets:
            log.info("%s", presets)
        log.info("privirec: degrees")
        item_deg = self.sum_degrees(fed)
        P = {}
        if not self.low_rank:
            alphas = sorted({f.alpha for f in self._filter_objects().values() if f.needs_P})
            for alpha in alphas:
                log.info("privirec: item-item gram (alpha=%g)", alpha)
                P[alpha] = item_item_from_gram(self.sum_gram(fed, alpha), item_deg, alpha)
                check_fixed_node_set(agg)
        S = eigvals = None
        if p:
            log.info("privirec: power method, rank %d, L=%d", p, self.L)
            S, eigvals = self.power_method(fed, item_deg, p, p)
            check_fixed_node_set(agg)
        log.info("privirec: evaluation on the nodes: each node builds %d filter(s) (%s) and "
                 "scores its users over %d items; one secure sum of the metric sums",
                 len(self.filters), ", ".join(self.filters), n_items)
        t0 = time.perf_counter()
        sums = self.evaluate(fed, item_deg, S, eigvals if self.low_rank else None, P)
        log.info("privirec: evaluation done in %.1f s", time.perf_counter() - t0)
        check_fixed_node_set(agg)
        metrics = {f"{name}/{key}": value for name, s in sums.items()
                   for key, value in s.means().items()}
        n_users = sum(i.n_users for i in infos.values())
        # the run's results (keyword names: result keys, not wire fields)
        return RunOutcome(metrics=metrics, extra=dict(
            item_deg=item_deg, S=S, eigvals=eigvals, P=P, n_items=n_items, rank=p,
            secure_sums=agg.sum_id, n_users=n_users,
            paper_floats_per_client=paper_float_counts(n_items, n_users=n_users,
                                                       **PAPER_TABLE1),
            floats_per_client_this_run=paper_float_counts(n_items, self.L, k2=p,
                                                          n_users=n_users),
            data=data_config(self.cfg)))


class PriviRecK(PriviRec):
    """PriviRec-k (paper 000, Section 3.4): no item-item sum; P~ ~ S_k Diag(T) S_k^T.

    ``rank`` is the large rank k of the power method (the paper sweeps 256..3584); filters
    use the leading columns for their ideal low-pass part. Turbo-CF needs explicit P~
    entries (element-wise powers) and is not available here.
    """

    low_rank = True
    config_keys = (*PRIVIREC_KEYS, Key("privirec-k", 1024, "rank k of the power method (the "
                                       "paper sweeps 256..3584)", min=1))

    def __init__(self, cfg: Mapping[str, Any] | None = None) -> None:
        super().__init__(cfg)
        # turbo-cf is left out of the run config's filters; the rank is privirec-k, and
        # Rayleigh-Ritz runs only when asked (``privirec-ritz = true``)
        self.filters = tuple(f for f in self.filters if f != "turbo-cf")
        self.rank = self.max_filter_rank = self.cfg["privirec-k"]
        self.ritz = self.cfg["privirec-ritz"] == "true"
        self._filter_objects()

    def rank_key(self) -> str:
        return "privirec-k"

    def _use_ritz(self) -> bool:
        return bool(self.ritz)
