"""Differentially private prototypes of one silo (paper 003, Ribero et al. 2022,
Algorithms 2-6, after Balcan et al. 2017) and the silo's local metrics.

What one silo computes (``private_prototypes``), with every decision on the paper's printed
constants in ``docs/protocols/dp-prototypes.md``:

1. **Public bounds by clipping** (:func:`clip_rows`): entries to ``[0, value_max]`` (Alg. 3's
   Lambda), at most ``s`` non-zeros per user (the largest, ties broken by public
   randomness), rows to L2 norm ``radius`` (Alg. 2's Lambda; default ``value_max * sqrt(s)``,
   which the first two clips already imply). Nothing is read from the data.
2. **JL projection** to ``p = floor(jl_coef * ln N)`` dimensions (1 <= p <= 8), rows clipped
   back into the ball.
3. **Candidates** (Algs. 4-5): ``shifts`` random cubes ``[-2R, 2R]^p + v``,
   ``v ~ U([-R, R]^p)`` (so every point is inside, as Alg. 4 requires), each recursively
   split ``depth = ceil(log2 N)`` times. A child cube is kept with probability
   ``f(m) = P(m + Lap(1/eps') > gamma)`` -- exactly Alg. 4's f(m), drawn as a noisy threshold
   with the exact discrete Laplace sampler (``fedrec/dp_sampling.py``); ``gamma = ln(2^p / delta) / eps'``, so each active cube
   keeps an empty child with probability at most ``delta / 2``. All ``2^p`` children are
   tested, empty ones included.
4. **Local swap** (Alg. 6): ``swaps`` exponential-mechanism swaps scored by the k-means loss
   in the projected space (candidates projected into the ball, so one user moves the loss by
   at most ``4 R^2``), then an exponential-mechanism choice among the iterates (lower loss
   preferred: the printed sign is a typo).
5. **Assignment** of each user to its nearest swap centre (projected space).
6. **Sparse recovery** (Alg. 3) per cluster, in the item space: Gumbel top-``s`` on the
   cluster's *sums* (per-item sensitivity ``value_max``), Laplace on the selected sums (L1
   sensitivity ``s * value_max``) and on the cluster size (sensitivity 1); the prototype is
   ``clip(noisy sum / max(noisy size, 1), 0, value_max)`` on the selected items, 0 elsewhere.
   Using sums and a released size keeps the private cluster size out of the noise scales.
7. With ``trials > 1``: one exponential-mechanism choice among the trials' prototype sets by
   their k-means loss in the item space (Alg. 2, line 8).

Neighbouring datasets differ by adding or removing one user (a row). Every release is
recorded in a :class:`fedrec.dp.PrivacyLedger`; the split (:meth:`PrototypeParams.
budget`) sums to epsilon by basic composition, and clusters compose in parallel.

Randomness that is *not* DP noise (the JL matrix, shifts, initial centres, padding points,
tie-breaks) is public by design (Balcan et al.'s guarantee does not need it secret) and comes
from a seeded numpy stream; every DP draw comes from ``fedrec.dp`` (exact discrete samplers, OS-keyed).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp

from fedrec import dp
from fedrec.recsys.kmeans import kmeans_loss, squared_distances
from fedrec.recsys.metrics import RankingSums, average_rank_sums, ranking_sums
from fedrec.wire import evaluation as evaluation_wire

__all__ = ["TRIAL_SPLIT", "FINAL_SHARE", "MAX_JL_DIM", "PrototypeParams", "clip_rows",
           "jl_dimension", "project", "private_grid", "candidates", "localswap",
           "sparse_recovery", "private_prototypes", "silo_metric_sums", "metric_means",
           "ACCOUNTINGS", "PAPER_SPLIT", "PAPER_TAG", "values_sensitivity"]

#: Each trial's share of its budget, in the order the steps spend it. Candidates and the
#: local swap keep the paper's eps/8 each (Alg. 2, lines 4-5); the recovery's three releases
#: share the rest (the paper gives each "eps", which would not sum to eps).
TRIAL_SPLIT: dict[str, float] = {"candidate": 1 / 8, "localswap": 1 / 8, "select": 5 / 16,
                                 "values": 5 / 16, "count": 1 / 8}
#: Share of epsilon for the final choice among trials (only when trials > 1).
FINAL_SHARE = 1 / 8
#: ``accounting = "paper"``: the noise scales as paper 003 prints them, for comparison only.
#: Candidates and the local swap eps/8 each (T = 1), the Gumbel selection and the Laplace
#: values each the full eps with the printed Laplace scale 2 Lambda s / (eps n) (replacement
#: sensitivity), the cluster size n used as it is (no release). By basic composition that
#: spends 2.25 eps, and the exact sizes are outside any DP guarantee; the ledger says so.
PAPER_SPLIT: dict[str, float] = {"candidate": 1 / 8, "localswap": 1 / 8, "select": 1.0,
                                 "values": 1.0}
ACCOUNTINGS = ("strict", "paper")
PAPER_TAG = " [paper accounting: printed scales, exact cluster sizes]"
#: Largest JL dimension: the private grid tests all 2^p children of every active cube.
MAX_JL_DIM = 8

# Public random streams (numpy, seeded): never DP noise.
_CLIP, _PUBLIC = 41, 43


@dataclass(frozen=True)
class PrototypeParams:
    """Public parameters of one silo's release (all from the run config, none from data)."""

    k: int
    epsilon: float
    value_max: float
    sparsity: int
    radius: float = 0.0
    delta: float = 0.1
    trials: int = 1
    shifts: int = 4
    swaps: int = 10
    jl_coef: float = 0.5
    #: "strict" (default): the split sums to epsilon. "paper": the printed noise scales
    #: (``PAPER_SPLIT``), never a default; every result that uses it must say so.
    accounting: str = "strict"

    def __post_init__(self) -> None:
        checks = [("k", self.k >= 1), ("epsilon", math.isfinite(self.epsilon)
                                       and self.epsilon > 0),
                  ("value_max", math.isfinite(self.value_max) and self.value_max > 0),
                  ("sparsity", self.sparsity >= 1),
                  ("radius", math.isfinite(self.radius) and self.radius >= 0),
                  ("delta", 0 < self.delta < 1), ("trials", self.trials >= 1),
                  ("shifts", self.shifts >= 1), ("swaps", self.swaps >= 1),
                  ("jl_coef", math.isfinite(self.jl_coef) and self.jl_coef > 0),
                  ("accounting", self.accounting in ACCOUNTINGS),
                  ("trials (paper accounting prints no final choice for T > 1)",
                   self.accounting != "paper" or self.trials == 1)]
        bad = [name for name, ok in checks if not ok]
        if bad:
            raise ValueError(f"invalid prototype parameter(s) {bad} (each must be finite and "
                             f"in range): {self}")

    @property
    def l2_radius(self) -> float:
        """Alg. 2's Lambda: ``radius``, or ``value_max * sqrt(s)`` (implied by the clips)."""
        return float(self.radius) if self.radius > 0 else self.value_max * math.sqrt(self.sparsity)

    def budget(self) -> dict[str, Any]:
        """The explicit split: epsilon per step of one trial, the trial count and the final
        choice's epsilon; ``trials * sum(per_trial) + final_choice == epsilon`` (strict), or
        the paper's printed scales (``PAPER_SPLIT``, which sum to 2.25 epsilon)."""
        if self.paper_accounting:
            return {"per_trial": {name: self.epsilon * share
                                  for name, share in PAPER_SPLIT.items()},
                    "trials": 1, "final_choice": 0.0}
        final = self.epsilon * FINAL_SHARE if self.trials > 1 else 0.0
        per_trial = (self.epsilon - final) / self.trials
        return {"per_trial": {name: per_trial * share for name, share in TRIAL_SPLIT.items()},
                "trials": self.trials, "final_choice": final}

    @property
    def paper_accounting(self) -> bool:
        return self.accounting == "paper"

    def spent_epsilon(self) -> float:
        """What a release really spends by basic composition: epsilon, or 2.25 epsilon in
        paper accounting."""
        return self.epsilon * (sum(PAPER_SPLIT.values()) if self.paper_accounting else 1.0)

    def to_config(self) -> dict[str, Any]:
        return asdict(self)


# -- 1-2. bounds and projection ------------------------------------------------------------
def clip_rows(X: sp.spmatrix, value_max: float, sparsity: int, radius: float,
              rng: np.random.Generator) -> sp.csr_matrix:
    """Each user's row within the public bounds: entries in [0, value_max], at most
    ``sparsity`` non-zeros (the largest; ties broken by ``rng``), L2 norm at most ``radius``.
    A per-row map, so it changes no sensitivity argument."""
    X = sp.csr_matrix(X, dtype=np.float64, copy=True)
    X.sum_duplicates()
    n = X.shape[0]
    data = np.clip(X.data, 0.0, value_max)
    rows = np.repeat(np.arange(n), np.diff(X.indptr))
    order = np.lexsort((rng.random(X.nnz), -data, rows))
    rank = np.empty(X.nnz, dtype=np.int64)
    rank[order] = np.arange(X.nnz) - X.indptr[rows[order]]
    keep = (rank < sparsity) & (data > 0)
    out = sp.csr_matrix((data[keep], (rows[keep], X.indices[keep])), shape=X.shape)
    norms = np.sqrt(np.asarray(out.multiply(out).sum(axis=1)).ravel())
    scale = np.minimum(1.0, radius / np.maximum(norms, np.finfo(np.float64).tiny))
    return sp.csr_matrix(sp.diags(scale) @ out)


def jl_dimension(n_users: int, n_items: int, coef: float) -> int:
    """``floor(coef * ln N)`` clamped to [1, MAX_JL_DIM], and never above the item count."""
    p = int(math.floor(coef * math.log(max(n_users, 2))))
    return max(1, min(p, MAX_JL_DIM, n_items))


def project(X: sp.csr_matrix, p: int, radius: float, rng: np.random.Generator) -> np.ndarray:
    """Alg. 2, line 3: ``Y = X G^T / sqrt(p)``, G ~ N(0, 1)^{p x d} (public), rows clipped
    into B(0, radius); the identity when p equals the item count."""
    d = X.shape[1]
    if p >= d:
        Y = X.toarray()
    else:
        G = rng.standard_normal((p, d))
        Y = np.asarray(X @ G.T) / math.sqrt(p)
    return dp.clip_rows_l2(Y, radius)


def _random_ball(count: int, p: int, radius: float, rng: np.random.Generator) -> np.ndarray:
    """Uniform public points in B(0, radius) (pads a candidate set; data-independent)."""
    g = rng.standard_normal((count, p))
    g /= np.maximum(np.linalg.norm(g, axis=1, keepdims=True), 1e-300)
    return g * radius * rng.random((count, 1)) ** (1.0 / p)


# -- 3. private grid candidates ------------------------------------------------------------
def _cell_counts(children: np.ndarray, cells: np.ndarray) -> np.ndarray:
    """How many rows of ``cells`` equal each row of ``children`` (integer coordinates)."""
    if len(cells) == 0:
        return np.zeros(len(children))
    uniq, counts = np.unique(cells, axis=0, return_counts=True)
    _, inverse = np.unique(np.vstack([uniq, children]), axis=0, return_inverse=True)
    inverse = inverse.ravel()
    lookup = np.zeros(int(inverse.max()) + 1)
    lookup[inverse[:len(uniq)]] = counts
    return lookup[inverse[len(uniq):]]


def private_grid(Y: np.ndarray, lo: np.ndarray, side: float, depth: int, eps_level: float,
                 gamma: float) -> np.ndarray:
    """Alg. 4 on the cube ``[lo, lo + side]^p``: centres of the root and of every kept cube.

    At each of ``depth`` levels the children of the active cubes are kept iff their noisy
    count ``m + Lap(1/eps_level)`` exceeds ``gamma``: P(kept) is exactly Alg. 4's f(m). A user
    lies in one cube per level, so each level is eps_level-DP and the levels compose to
    ``depth * eps_level`` (charged in full even when the recursion stops early).
    """
    p = Y.shape[1]
    offsets = (np.arange(2 ** p)[:, None] >> np.arange(p)) & 1
    inside = np.all((Y >= lo) & (Y <= lo + side), axis=1)
    points = Y[inside]
    centres = [lo + side / 2]
    active = np.zeros((1, p), dtype=np.int64)
    for a in range(1, depth + 1):
        cell = side / 2 ** a
        cells = np.clip(np.floor((points - lo) / cell).astype(np.int64), 0, 2 ** a - 1)
        children = (active[:, None, :] * 2 + offsets[None]).reshape(-1, p)
        noisy = dp.laplace_mechanism(_cell_counts(children, cells), 1.0, eps_level)
        active = children[noisy > gamma]
        if len(active) == 0:
            break
        centres.extend(lo + (active + 0.5) * cell)
    return np.array(centres)


def grid_depth(n: int) -> int:
    """Levels of one private grid over ``n`` points (Alg. 5): ceil(log2 n), at least 1."""
    return max(1, math.ceil(math.log2(max(n, 2))))


def candidates(Y: np.ndarray, k: int, epsilon: float, shifts: int, delta: float,
               radius: float, rng: np.random.Generator) -> tuple[np.ndarray, dict[str, Any]]:
    """Alg. 5: private grids over ``shifts`` random cubes, candidates projected into
    B(0, radius) and padded with public random points to at least 2k (the local swap needs
    more candidates than centres). Returns the candidates and the grid's accounting."""
    n, p = Y.shape
    depth = grid_depth(n)
    eps_level = epsilon / (shifts * depth)
    gamma = math.log(2 ** p / delta) / eps_level
    found = [private_grid(Y, rng.uniform(-radius, radius, p) - 2 * radius, 4 * radius,
                          depth, eps_level, gamma) for _ in range(shifts)]
    C = dp.clip_rows_l2(np.vstack(found), radius)
    n_found = len(C)
    if len(C) < 2 * k:
        C = np.vstack([C, _random_ball(2 * k - len(C), p, radius, rng)])
    return C, {"levels": shifts * depth, "eps_level": eps_level, "gamma": gamma,
               "depth": depth, "found": n_found}


# -- 4. local swap --------------------------------------------------------------------------
def _swap_losses(D: np.ndarray, Z: np.ndarray) -> np.ndarray:
    """(k x m): the k-means loss after replacing centre Z[x] by candidate y, for all x, y."""
    k = len(Z)
    if k == 1:
        return D.sum(axis=0)[None, :]
    DZ = D[:, Z]
    order = np.argsort(DZ, axis=1)[:, :2]
    rows = np.arange(len(D))
    best, second = DZ[rows, order[:, 0]], DZ[rows, order[:, 1]]
    out = np.empty((k, D.shape[1]))
    for x in range(k):
        rest = np.where(order[:, 0] == x, second, best)
        out[x] = np.minimum(rest[:, None], D).sum(axis=0)
    return out


def localswap(Y: np.ndarray, C: np.ndarray, k: int, epsilon: float, swaps: int,
              radius: float, rng: np.random.Generator) -> np.ndarray:
    """Alg. 6: indices into C of k centres. Starts from k distinct public random candidates;
    each of ``swaps`` steps picks a (centre, candidate) swap by the exponential mechanism with
    utility -loss (sensitivity 4 R^2), then one more exponential mechanism picks an iterate
    (lower loss preferred). ``swaps + 1`` releases of ``epsilon / (swaps + 1)`` each."""
    D = squared_distances(Y, C)
    sens = 4.0 * radius ** 2
    step = epsilon / (swaps + 1)
    Z = rng.choice(len(C), size=k, replace=False)
    iterates: list[tuple[np.ndarray, float]] = []
    for _ in range(swaps):
        losses = _swap_losses(D, Z)
        free = np.flatnonzero(~np.isin(np.arange(len(C)), Z))
        pick = dp.exponential_mechanism(-losses[:, free].ravel(), sens, step)
        x, y = divmod(pick, len(free))
        Z = Z.copy()
        Z[x] = free[y]
        iterates.append((Z, float(losses[x, free[y]])))
    chosen = dp.exponential_mechanism(-np.array([loss for _, loss in iterates]), sens, step)
    return iterates[chosen][0]


# -- 6. sparse recovery ----------------------------------------------------------------------
def sparse_recovery(X: sp.csr_matrix, labels: np.ndarray, k: int, value_max: float,
                    sparsity: int, eps_select: float, eps_values: float,
                    eps_count: float | None, values_sensitivity: float | None = None
                    ) -> np.ndarray:
    """Alg. 3 for every cluster (disjoint users: parallel composition). Returns k x d
    prototypes in [0, value_max] with at most ``sparsity`` non-zeros each.

    ``eps_count`` None uses the exact cluster sizes (the paper's printed algorithm; not DP);
    ``values_sensitivity`` defaults to ``s * value_max`` (one user added or removed)."""
    n, d = X.shape
    s = min(int(sparsity), d)
    member = sp.csr_matrix((np.ones(n), (labels, np.arange(n))), shape=(k, n))
    sums = np.asarray((member @ X).todense())
    counts = np.bincount(labels, minlength=k).astype(np.float64)
    sizes = counts if eps_count is None else dp.laplace_mechanism(counts, 1.0, eps_count)
    chosen = np.stack([dp.gumbel_top_s(sums[j], s, value_max, eps_select) for j in range(k)])
    rows = np.repeat(np.arange(k), s)
    noisy = dp.laplace_mechanism(sums[rows, chosen.ravel()],
                                 values_sensitivity or s * value_max, eps_values)
    P = np.zeros((k, d))
    P[rows, chosen.ravel()] = np.clip(noisy / np.maximum(sizes[rows], 1.0), 0.0, value_max)
    return P


# -- Alg. 2 ----------------------------------------------------------------------------------
def values_sensitivity(params: PrototypeParams, s: int) -> float:
    """L1 sensitivity of a cluster's s selected sums: ``s * value_max`` for one user added or
    removed; the paper's printed ``2 Lambda s`` (a user replaced) in paper accounting."""
    return (2.0 if params.paper_accounting else 1.0) * s * params.value_max


def release_ledger(params: PrototypeParams, n_users: int, n_items: int) -> dp.PrivacyLedger:
    """Every DP release :func:`private_prototypes` makes on a silo of ``n_users`` x
    ``n_items``, in order, with its epsilon and sensitivity. Public sizes decide it, so a silo
    builds it before it computes anything: it charges this ledger to its budget and reports
    it; ``spent()`` is ``params.epsilon`` (the split of :meth:`PrototypeParams.budget`), or
    2.25 epsilon in paper accounting."""
    budget = params.budget()
    step = budget["per_trial"]
    R, depth, s = params.l2_radius, grid_depth(n_users), min(params.sparsity, n_items)
    ledger = dp.PrivacyLedger()
    # Every row of a paper-accounting release says so (it is never silent).
    tag = PAPER_TAG if params.paper_accounting else ""
    for t in range(1, params.trials + 1):
        ledger.record(f"trial {t}: private grid, noisy cell counts ({params.shifts} shifts "
                      f"x {depth} levels){tag}", "laplace",
                      step["candidate"] / (params.shifts * depth), sensitivity=1.0,
                      steps=params.shifts * depth)
        ledger.record(f"trial {t}: local swap ({params.swaps} swaps + choice of iterate)" + tag,
                      "exponential", step["localswap"] / (params.swaps + 1),
                      sensitivity=4.0 * R ** 2, steps=params.swaps + 1)
        ledger.record(f"trial {t}: top-{s} item selection per cluster (Gumbel)" + tag,
                      "gumbel-top-s", step["select"], sensitivity=params.value_max)
        ledger.record(f"trial {t}: Laplace on the selected cluster sums" + tag, "laplace",
                      step["values"], sensitivity=values_sensitivity(params, s))
        if "count" in step:
            ledger.record(f"trial {t}: Laplace on the cluster sizes" + tag, "laplace",
                          step["count"], sensitivity=1.0)
    if params.trials > 1:
        ledger.record("final choice among trials (k-means loss)" + tag, "exponential",
                      budget["final_choice"], sensitivity=4.0 * R ** 2)
    return ledger


def private_prototypes(X: sp.spmatrix, params: PrototypeParams,
                       seed: tuple[int, ...] = (0,)) -> tuple[np.ndarray, dp.PrivacyLedger,
                                                              dict[str, Any]]:
    """epsilon-DP prototypes (k x d) of the users (rows) of X, the ledger of every release
    (:func:`release_ledger`: its pure epsilon equals ``params.epsilon``) and public facts of
    the run (dimensions, grid accounting). ``seed`` seeds only the public randomness."""
    n, d = X.shape
    if n < params.k:
        raise ValueError(f"{n} users cannot give k={params.k} prototypes (paper 003 assumes "
                         "at least k users per silo)")
    budget = params.budget()
    step = budget["per_trial"]
    R = params.l2_radius
    Xc = clip_rows(X, params.value_max, params.sparsity, R,
                   np.random.default_rng([*seed, _CLIP]))
    rng = np.random.default_rng([*seed, _PUBLIC])
    p = jl_dimension(n, d, params.jl_coef)
    ledger = release_ledger(params, n, d)
    sets: list[np.ndarray] = []
    info: dict[str, Any] = {"jl_dim": p, "radius": R, "trials": []}
    s = min(params.sparsity, d)
    for _ in range(params.trials):
        Y = project(Xc, p, R, rng)
        C, grid = candidates(Y, params.k, step["candidate"], params.shifts, params.delta, R,
                             rng)
        Z = localswap(Y, C, params.k, step["localswap"], params.swaps, R, rng)
        labels = squared_distances(Y, C[Z]).argmin(axis=1)
        sets.append(sparse_recovery(Xc, labels, params.k, params.value_max, s,
                                    step["select"], step["values"], step.get("count"),
                                    values_sensitivity(params, s)))
        info["trials"].append({"candidates_found": grid["found"], "candidates": len(C),
                               "depth": grid["depth"]})
    chosen = 0
    if params.trials > 1:
        losses = np.array([kmeans_loss(Xc, dp.clip_rows_l2(P, R)) for P in sets])
        chosen = dp.exponential_mechanism(-losses, 4.0 * R ** 2, budget["final_choice"])
    return sets[chosen], ledger, info


# -- the silo's local evaluation ---------------------------------------------------------------
def silo_metric_sums(scores: np.ndarray, train: sp.csr_matrix, test: sp.csr_matrix,
                     value_max: float, k: int = 20) -> dict[str, np.ndarray]:
    """A silo's metrics as sums (only these leave it): the top-k ranking sums
    (``RankingSums.to_vector``) and ``[squared error, test entries, rank numerator, rank
    denominator]`` for test RMSE and paper 003's mean average rank (Eq. 4, weights = test
    values). Predictions and test values are clipped to [0, value_max] for the RMSE (the
    public bound, which also bounds the sum a secure aggregator is told to expect).
    ``scores``: the silo's predictions, users x items (``U @ V.T``)."""
    ranking = ranking_sums(scores, train, test, k=k)
    num, den = average_rank_sums(scores, test, train)
    coo = sp.coo_matrix(test)
    pred = np.clip(scores[coo.row, coo.col], 0.0, value_max)
    truth = np.clip(coo.data, 0.0, value_max)
    return {evaluation_wire.RANKING: ranking.to_vector(),
            evaluation_wire.RATING: np.array([float(np.sum((pred - truth) ** 2)),
                                              float(coo.nnz), num, den])}


def metric_means(k: int, ranking: np.ndarray, rating: np.ndarray) -> dict[str, float]:
    """Metrics from summed :func:`silo_metric_sums` vectors: the top-k means, ``rmse`` and
    ``mean-rank`` (0 = best, 0.5 = random)."""
    sse, count, num, den = (float(x) for x in rating)
    out = RankingSums.from_vector(k, ranking).means()
    out["rmse"] = math.sqrt(sse / count) if count > 0 else float("nan")
    out["mean-rank"] = num / den if den > 0 else float("nan")
    return out
