"""Federated SVD by power iteration (paper 002, Liu, Pejo, Tang 2023): the math of FedPower
(Algorithm 1) and of its utility- and privacy-enhanced schemes (Algorithms 2 and 3).

Every party's step is a function here, used by the Flower protocol (server side
``strategies/fedsvd.py``, node side ``clients/fedsvd.py``) and by the in-process run
(:func:`run_in_process`) that the benchmark uses for 100 nodes x 92 iterations; a test shows
both give the same numbers. Decisions on the paper's open points (``docs/protocols/fedsvd.md``):

- M'_i = (1/s_i) M_i^T M_i over the node's rows as loaded; the node never forms it, it
  multiplies ``(1/s_i) M_i^T (M_i Z)`` (sparse). The federation's matrix is
  M' = sum_i (s_i/s) M'_i = (1/s) M^T M (Eq. 1); its top-k eigenvectors are the truth.
- Aggregation is the weighted sum sum_i (s_i/s) Y'_i for all three schemes (Eq. 1); each
  node weights its own noisy update, so its noise is weighted with it, and in Algorithm 2
  the server removes the weighted noises.
- sigma is a standard deviation (the paper's "sigma/10 at n = 100 gives the same
  accumulated noise" only holds for a standard deviation).
- The orthogonal Procrustes transformation D_t^(i) aligns the node's local basis
  Z_{t-1}^(i) to the last common basis (the one every node got at the previous
  synchronization): D = U V^T with U S V^T = svd(Z_{t-1}^(i)^T Z_common). This needs no
  extra message and reveals nothing; with p = 1 it is the identity.
- Algorithm 3's clip(., z_hat) clamps every entry to [-z_hat, z_hat] (the proof of Theorem 1
  uses |z_jl| <= z_hat).
- FedPower's noise scales ||Z_{t-1}^(i)||_max (Alg. 1 step 6) and max_i ||Z_{t-1}^(i) D||_max
  (step 8) are replaced by their public bound :data:`FEDPOWER_Z_MAX` = 1: a node's value
  depends on its data and on the basis the server sends (under Z = e_j it tells whether the
  node's users hold item j), so no value derived from it leaves the node, in clear, inside a
  sum, or as the spread of the noise in the sum.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import scipy.sparse as sp

from fedrec.dp import PrivacyLedger
from fedrec.dp_sampling import noise_grid, snap_to_grid
from fedrec.recsys.linalg import qr_positive
from fedrec.recsys.metrics import subspace_distance

#: The three registered schemes.
SCHEMES = ("fedpower", "fedsvd-utility", "fedsvd-privacy")

Noise = Callable[[tuple[int, ...], float], np.ndarray]


def draw_noise(shape: tuple[int, ...], std: float) -> np.ndarray:
    """Discrete Gaussian noise of scale ``std`` on the grid ``noise_grid(std)`` (integers
    times a power of two; ``fedrec/dp_sampling.py``), as float64 of ``shape``.

    Every noise the protocol releases comes from here, and :func:`noisy` adds it to the
    value rounded to the same grid (floating-point safe); tests may replace it with known
    values (the node handlers look it up on this module per call).
    """
    from fedrec.dp_sampling import add_discrete_gaussian

    return add_discrete_gaussian(np.zeros(shape), std)


def on_noise_grid(Y: np.ndarray, std: float) -> np.ndarray:
    """Y rounded to the grid of noise of scale ``std`` (``dp_sampling.noise_grid``): with
    :func:`draw_noise`'s values, also on that grid, the float sum is the correctly rounded
    exact mechanism output, so no low bit of Y reaches it; the rounding adds at most
    grid sqrt(d r) to the L2 sensitivity (``fedrec/dp.py``, "Discrete noise")."""
    return snap_to_grid(Y, noise_grid(std))


def noisy(Y: np.ndarray, std: float, noise: Noise) -> np.ndarray:
    """Y on the noise grid plus ``noise(Y.shape, std)`` (:func:`on_noise_grid`)."""
    return on_noise_grid(Y, std) + noise(Y.shape, std)


@dataclass(frozen=True)
class SvdParams:
    """The paper's parameters: k, r, T, p, (sigma, sigma'), z_hat, m_hat, delta.

    ``ddp``: Algorithm 3's distributed-DP variant, every node's noise scaled by 1/sqrt(n),
    so the sum of n nodes' noises has the standard deviation one node's had (paper, Sec. 5).
    """

    k: int = 10
    r: int = 10
    T: int = 92
    p: int = 4
    sigma: float = 0.1
    sigma_server: float = 0.1
    z_hat: float = 0.2
    m_hat: float = 1.0
    delta: float = 1e-5
    ddp: bool = False
    seed: int = 0

    def check(self, d: int) -> None:
        """Clear errors for sizes the method cannot run with."""
        if not 1 <= self.k <= d:
            raise ValueError(f"fedsvd-k = {self.k} must be between 1 and the number of "
                             f"columns d = {d}")
        if not self.k <= self.r <= d:
            raise ValueError(f"fedsvd-rank r = {self.r} must satisfy k = {self.k} <= r <= d = "
                             f"{d}")
        if self.T < 1 or self.p < 1:
            raise ValueError(f"fedsvd-iterations ({self.T}) and fedsvd-sync-every ({self.p}) "
                             "must be >= 1")
        self.check_release()

    def check_release(self) -> None:
        """Clear errors for the privacy parameters a release and its charge stand on (the
        node checks them on every request: they come from the server)."""
        for name, value in (("fedsvd-z-hat", self.z_hat), ("fedsvd-m-hat", self.m_hat)):
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be finite and > 0, got {value!r}")
        if not (math.isfinite(self.delta) and 0 < self.delta < 1):
            raise ValueError(f"fedsvd-delta must be in (0, 1), got {self.delta!r} (Theorem "
                             "2's ln(1.25/delta) is not a DP bound outside it)")
        for name, value in (("fedsvd-sigma", self.sigma), ("fedsvd-sigma-server",
                                                           self.sigma_server)):
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be finite and >= 0, got {value!r}")

    def is_sync(self, t: int) -> bool:
        """Whether iteration t (1-based) synchronizes (Alg. 1: t in I_T^p; Alg. 2/3: p | t)."""
        return t % self.p == 0

    @property
    def syncs(self) -> int:
        """Communication rounds: floor(T / p)."""
        return self.T // self.p

    def node_sigma(self, scheme: str, n_nodes: int) -> float:
        """Standard deviation of one node's Gaussian noise (before ||Z||_max for FedPower)."""
        if scheme == "fedsvd-privacy" and self.ddp:
            return self.sigma / math.sqrt(n_nodes)
        return self.sigma


def params_from_config(cfg: Mapping[str, Any]) -> SvdParams:
    """The paper's parameters from a run config (server) or a node request config."""
    return SvdParams(
        k=int(cfg["fedsvd-k"]), r=int(cfg["fedsvd-rank"]), T=int(cfg["fedsvd-iterations"]),
        p=int(cfg["fedsvd-sync-every"]), sigma=float(cfg["fedsvd-sigma"]),
        sigma_server=float(cfg["fedsvd-sigma-server"]), z_hat=float(cfg["fedsvd-z-hat"]),
        m_hat=float(cfg["fedsvd-m-hat"]), delta=float(cfg["fedsvd-delta"]),
        ddp=bool(cfg["fedsvd-ddp"]), seed=int(cfg["seed"]))


# ----------------------------------------------------------------------------- pieces
def initial_basis(d: int, r: int, seed: int) -> np.ndarray:
    """Z_0: orth of a d x r standard Gaussian from the public run seed (Alg. 2/3, step 1)."""
    return orth(np.random.default_rng([seed, 2]).standard_normal((d, r)))


def orth(Y: np.ndarray) -> np.ndarray:
    """orth(.): QR with a positive diagonal (deterministic, the paper's QR factorization)."""
    return qr_positive(Y)[0]


def clip_entries(Z: np.ndarray, z_hat: float) -> np.ndarray:
    """clip(Z, z_hat): every entry clamped to [-z_hat, z_hat] (Alg. 3, Theorem 1)."""
    return np.clip(Z, -z_hat, z_hat)


def node_basis(scheme: str, Z: np.ndarray, params: SvdParams) -> np.ndarray:
    """The common basis as a node uses it: fedsvd-privacy clips it to z_hat itself (the
    server's clip(orth(Y), z_hat) already is; the initial orth basis may not be), so Theorem
    1's |z_jl| <= z_hat holds for every basis the node multiplies, whatever the server sent."""
    return clip_entries(Z, params.z_hat) if scheme == "fedsvd-privacy" else Z


def procrustes(Z: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """The orthogonal D minimizing ||Z D - reference||_F (Schonemann 1966): U V^T."""
    U, _, Vt = np.linalg.svd(Z.T @ reference)
    return U @ Vt


def gram_product(rows: sp.spmatrix, Z: np.ndarray) -> np.ndarray:
    """M'_i Z = (1/s_i) M_i^T (M_i Z), without forming the d x d matrix."""
    s_i = rows.shape[0]
    return np.asarray(rows.T @ (rows @ Z)) / s_i


def clip_gram(rows: sp.spmatrix, m_hat: float) -> sp.spmatrix:
    """``rows`` with column j scaled by min(1, sqrt(m_hat / m'_jj)), so that every entry of
    the clipped M'_i is within [-m_hat, m_hat] (|m'_jk| <= sqrt(m'_jj m'_kk), Cauchy-Schwarz).

    Why a clip and not a refusal: a node that refuses when its data exceed the declared
    bound answers the server a data-dependent bit per request (repeatable with other
    bounds). Clipping enforces the bound Theorem 1 and the sums' range use, and leaves data
    within the bound unchanged.
    """
    if rows.shape[0] == 0:
        return rows
    sq = rows.multiply(rows) if sp.issparse(rows) else np.square(rows)
    diag = np.asarray(sq.sum(axis=0)).ravel() / rows.shape[0]
    scale = np.sqrt(np.minimum(1.0, m_hat / np.maximum(diag, np.finfo(np.float64).tiny)))
    if np.all(scale >= 1.0):
        return rows
    return sp.csr_matrix(sp.csr_matrix(rows) @ sp.diags(scale))


def max_gram_entry(rows: sp.spmatrix) -> float:
    """max |m'_jk| of M'_i: a Gram matrix's largest entry is on its diagonal (Cauchy-Schwarz),
    so this is max_j (1/s_i) sum_u m_uj^2, without forming M'_i."""
    if rows.shape[0] == 0:
        return 0.0
    sq = rows.multiply(rows) if sp.issparse(rows) else np.square(rows)
    return float(np.asarray(sq.sum(axis=0)).max()) / rows.shape[0]


def sensitivity(params: SvdParams) -> float:
    """Theorem 1: the L2 sensitivity of M'_i Z under a change of one entry of M'_i is
    2 sqrt(r) m_hat z_hat."""
    return 2.0 * math.sqrt(params.r) * params.m_hat * params.z_hat


def theorem2_epsilon(params: SvdParams, sigma: float) -> float:
    """Theorem 2 (one iteration): eps = sqrt(8 r ln(1.25/delta)) m_hat z_hat / sigma."""
    params.check_release()
    return math.sqrt(8 * params.r * math.log(1.25 / params.delta)) * params.m_hat * \
        params.z_hat / sigma


def release_ledger(params: SvdParams, sigma: float, rank: int, iterations: int) -> PrivacyLedger:
    """The ledger of ``iterations`` noisy fedsvd-privacy iterations: Theorem 2 per
    iteration with the rank ``rank`` of the basis multiplied (its entries clipped to z_hat,
    M'_i to m_hat by :func:`clip_gram`) and the noise ``sigma`` added. A node builds it from
    what it actually uses and charges it to its budget; the run's privacy report
    (:func:`privacy_report`) builds it with the run's parameters. A declared rank or bound
    cannot lower it: the node enforces both."""
    if not (math.isfinite(sigma) and sigma > 0):
        raise ValueError(f"fedsvd-privacy noise sigma must be finite and > 0, got {sigma!r}")
    if rank < 1 or iterations < 1:
        raise ValueError(f"a release needs rank >= 1 and iterations >= 1, got {rank}, "
                         f"{iterations}")
    used = replace(params, r=int(rank))
    ledger = PrivacyLedger()
    ledger.record("fedsvd-privacy iteration (Theorem 2)", "gaussian",
                  theorem2_epsilon(used, sigma), used.delta, sigma=sigma,
                  sensitivity=sensitivity(used), steps=int(iterations))
    return ledger


def release_epsilon(params: SvdParams, sigma: float, rank: int, iterations: int) -> float:
    """What :func:`release_ledger`'s iterations spend: the epsilon a node charges."""
    return release_ledger(params, sigma, rank, iterations).spent()


def fedpower_claimed_epsilon(params: SvdParams, min_rows: int) -> float:
    """The epsilon FedPower [18] states for its sigma (inverted from its calibration
    sigma = (T/p) / (eps min_i s_i) sqrt(2 ln(1.25 (T/p) / delta))); it claims (2 eps,
    2 delta) in total. Paper 002 (Sec. 4) shows the claim does not hold."""
    syncs = max(params.syncs, 1)
    return syncs * math.sqrt(2 * math.log(1.25 * syncs / params.delta)) / \
        (params.sigma * max(min_rows, 1))


# ----------------------------------------------------------------- FedPower's noise scale
#: FedPower's ||Z||_max (Alg. 1: nodes add "N(0, ||Z_{t-1}^(i)||^2_max sigma^2)", the server
#: "N(0, max_i ||Z_{t-1}^(i) D_t^(i)||^2_max sigma'^2)") replaced by its public bound. In
#: paper 002's sensitivity analysis that factor is z_hat, the bound on the basis' entries
#: (Theorem 1: "If we assume |m'_ij| <= m_hat ... bounded by 2 sqrt(r) m_hat z_hat", from
#: "abs(m z) <= m_hat z_hat"); the bound every basis with orthonormal columns meets whatever
#: the data is |z_jl| <= ||z_l||_2 = 1. The paper's data-dependent max would need the nodes'
#: values to reach the server, and under a basis the server chooses (Z = e_j) a node's
#: value tells whether its users hold item j (security review, issue 43). Cost on ML-100K:
#: ``results/fedsvd/zmax_public_bound.md``.
FEDPOWER_Z_MAX = 1.0


# ----------------------------------------------------------------------------- node side
@dataclass
class SyncContribution:
    """What one node hands in at a synchronization: its weighted noisy update, its weighted
    noise (Alg. 2 keeps it for the noise-removal step) and the node's compute seconds."""

    update: np.ndarray
    noise: np.ndarray | None
    seconds: float = 0.0


def local_step(scheme: str, rows: sp.spmatrix, Z: np.ndarray, params: SvdParams,
               sigma: float, noise: Noise) -> np.ndarray:
    """One iteration without communication: orth(M'_i Z) (Alg. 1/2, step 12/18) or
    clip(orth(M'_i Z + N), z_hat) (Alg. 3, steps 4 and 11)."""
    Y = gram_product(rows, Z)
    if scheme == "fedsvd-privacy":
        if sigma > 0:
            Y = noisy(Y, sigma, noise)
        return clip_entries(orth(Y), params.z_hat)
    return orth(Y)


def sync_step(scheme: str, rows: sp.spmatrix, Z: np.ndarray, common: np.ndarray,
              params: SvdParams, sigma: float, weight: float, noise: Noise) -> SyncContribution:
    """The node's part of a synchronization at iteration t, from its Z_{t-1}^(i).

    FedPower: Y D + N(0, (FEDPOWER_Z_MAX sigma)^2); utility: Y D + N(0, sigma^2) (N kept);
    privacy: Y + N(0, sigma^2), no alignment. Everything is multiplied by the node's weight
    s_i / s before it leaves (Eq. 1).
    """
    Y = gram_product(rows, Z)
    if scheme == "fedsvd-privacy":
        std, update = sigma, Y
    else:
        std = FEDPOWER_Z_MAX * sigma if scheme == "fedpower" else sigma
        update = Y @ procrustes(Z, common)
    N = noise(update.shape, std) if std > 0 else np.zeros_like(update)
    update = (on_noise_grid(update, std) if std > 0 else update) + N
    kept = weight * N if scheme == "fedsvd-utility" else None
    return SyncContribution(weight * update, kept)


def node_block(scheme: str, rows: sp.spmatrix, common: np.ndarray, t_from: int, t_to: int,
               params: SvdParams, sigma: float, weight: float,
               noise: Noise) -> SyncContribution | np.ndarray:
    """A node's work from the common basis at iteration ``t_from`` to ``t_to``.

    Local iterations t_from+1 .. t_to-1, then either the synchronization at t_to (a
    :class:`SyncContribution`) or, when t_to = T is not a synchronization, the output rule's
    weighted w_i Z_T^(i) D_{T+1}^(i) (D only where the scheme aligns).
    """
    t0 = time.perf_counter()
    Z = common
    for _ in range(t_from + 1, t_to):
        Z = local_step(scheme, rows, Z, params, sigma, noise)
    if params.is_sync(t_to):
        out = sync_step(scheme, rows, Z, common, params, sigma, weight, noise)
        out.seconds = time.perf_counter() - t0
        return out
    Z = local_step(scheme, rows, Z, params, sigma, noise)
    return weight * output_alignment(scheme, Z, common)


def output_alignment(scheme: str, Z: np.ndarray, common: np.ndarray) -> np.ndarray:
    """Z_T^(i) D_{T+1}^(i) of the output rule (Alg. 3 has no D: its OPT step is removed)."""
    return Z if scheme == "fedsvd-privacy" else Z @ procrustes(Z, common)


# ----------------------------------------------------------------------------- server side
def server_step(scheme: str, total: np.ndarray, params: SvdParams, *,
                removed: np.ndarray | None = None, noise: Noise | None = None) -> np.ndarray:
    """The common basis after a synchronization from the aggregated update.

    FedPower: orth(Y + N(0, (FEDPOWER_Z_MAX sigma')^2)); utility: orth(Y - sum_{i != j}
    w_i N_i); privacy: clip(orth(Y), z_hat).
    """
    if scheme == "fedpower":
        std = FEDPOWER_Z_MAX * params.sigma_server
        draw = noise or draw_noise  # looked up per call (tests substitute known noise)
        Y = noisy(total, std, draw) if std > 0 else total
        return orth(Y)
    if scheme == "fedsvd-utility":
        return orth(total if removed is None else total - removed)
    return clip_entries(orth(total), params.z_hat)


def block_ends(params: SvdParams) -> list[tuple[int, int]]:
    """(t_from, t_to) of every block of work between messages: one per synchronization,
    plus the output rule's last block when T is not a multiple of p."""
    ends = [(t - params.p, t) for t in range(params.p, params.T + 1, params.p)]
    if params.T % params.p:
        ends.append((params.syncs * params.p, params.T))
    return ends


# ----------------------------------------------------------------------------- reference
#: Largest d for the dense eigendecomposition of M' (d x d doubles); above it, sparse SVD.
DENSE_EIGH_MAX_D = 4000


def true_eigenspace(M: sp.spmatrix, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Top-k eigenvectors (d x k, largest first) and eigenvalues of M' = (1/s) M^T M.

    Signs fixed so each column's largest-magnitude entry is positive, which makes the
    paper's literal (sign-sensitive) Euclidean distance well defined.
    """
    if sp.issparse(M) and M.shape[1] > DENSE_EIGH_MAX_D:
        # d x d dense would not fit (Yelp2018: 38,048 items, 11.6 GB): the top right singular
        # vectors of M / sqrt(s) to ARPACK's full precision are the same eigenvectors.
        from scipy.sparse.linalg import svds

        _, sv, Vt = svds(sp.csr_matrix(M, dtype=np.float64) / np.sqrt(M.shape[0]), k=k, tol=0,
                         random_state=0)
        order = np.argsort(-sv, kind="stable")
        w, V = sv[order] ** 2, Vt[order].T
        signs = np.sign(V[np.abs(V).argmax(axis=0), np.arange(V.shape[1])])
        signs[signs == 0] = 1.0
        return V * signs, w
    dense = M.toarray() if sp.issparse(M) else np.asarray(M, dtype=np.float64)
    G = dense.T @ dense / dense.shape[0]
    w, V = np.linalg.eigh(G)
    order = np.argsort(-w, kind="stable")[:k]
    V = V[:, order]
    signs = np.sign(V[np.abs(V).argmax(axis=0), np.arange(V.shape[1])])
    signs[signs == 0] = 1.0
    return V * signs, w[order]


def distances(Z_bar: np.ndarray, truth: np.ndarray) -> dict[str, float]:
    """The paper's literal Euclidean distance ||Z_bar[:, :k] - Z*||_F (sign- and rotation-
    sensitive; at most 2 sqrt(k) for orthonormal bases, below the values the paper reports)
    and the rotation-invariant ||P - P*||_F and sin of the largest principal angle."""
    k = truth.shape[1]
    Zk = Z_bar[:, :k]
    return {"euclidean": subspace_distance(Zk, truth, "euclidean"),
            "subspace": subspace_distance(Zk, truth, "frobenius"),
            "sin_max": subspace_distance(Zk, truth, "spectral")}


def leading_basis(Z_bar: np.ndarray, k: int) -> np.ndarray:
    """The orthonormal d x k basis a recommender uses: the first k columns of orth(Z_bar)."""
    return orth(Z_bar)[:, :k]


# ----------------------------------------------------------------------------- in process
@dataclass
class InProcessRun:
    """The result of :func:`run_in_process`: final estimate, common bases, timings."""

    Z_bar: np.ndarray
    commons: list[np.ndarray] = field(default_factory=list)
    estimates: list[np.ndarray] = field(default_factory=list)  # per iteration t = 1..T
    node_seconds: float = 0.0
    node_cpu_seconds: float = 0.0  # process CPU time of the same node work (load-robust)
    server_seconds: float = 0.0
    kept: list[int] = field(default_factory=list)  # Alg. 2: the kept node per sync


def run_in_process(scheme: str, blocks: Sequence[sp.spmatrix], params: SvdParams, *,
                   noise: Noise | None = None, server_noise: Noise | None = None,
                   choose: Callable[[int], int] | None = None,
                   per_iteration: bool = False) -> InProcessRun:
    """The protocol's arithmetic for all nodes in one process, in the Flower run's order.

    ``blocks``: each node's rows (node order). ``noise(shape, std)`` draws each node's noise
    (called per node in node order, as the nodes do); ``server_noise`` FedPower's central
    noise (default ``noise``); ``choose(n)`` the node whose noise Alg. 2 keeps (default: a
    CSPRNG draw). Sums are formed in node order from the first node's term, as the plain
    aggregator does, so with the same noise the result equals the Flower run bit for bit.
    ``per_iteration``: also keep the output-rule estimate at every iteration (for curves).
    """
    import secrets

    if scheme not in SCHEMES:
        raise ValueError(f"unknown scheme {scheme!r}; expected one of {SCHEMES}")
    d = blocks[0].shape[1]
    params.check(d)
    blocks = [clip_gram(b, params.m_hat) for b in blocks]  # as every node does
    sizes = [b.shape[0] for b in blocks]
    s = float(sum(sizes))
    weights = [si / s for si in sizes]
    n = len(blocks)
    sigma = params.node_sigma(scheme, n)
    choose = choose or secrets.randbelow
    noise = noise or draw_noise
    server_noise = server_noise or noise
    common = initial_basis(d, params.r, params.seed)
    out = InProcessRun(Z_bar=common)
    node_t = server_t = node_cpu = 0.0
    local = [node_basis(scheme, common, params)] * n
    for t in range(1, params.T + 1):
        t0, c0 = time.perf_counter(), time.process_time()
        if not params.is_sync(t):
            local = [local_step(scheme, b, Z, params, sigma, noise)
                     for b, Z in zip(blocks, local)]
            node_t += time.perf_counter() - t0
            node_cpu += time.process_time() - c0
            if per_iteration or t == params.T:
                est = _sum_in_order(w * output_alignment(scheme, Z, common)
                                    for w, Z in zip(weights, local))
                if per_iteration:
                    out.estimates.append(est)
                if t == params.T:
                    out.Z_bar = est
            continue
        parts = [sync_step(scheme, b, Z, common, params, sigma, w, noise)
                 for b, Z, w in zip(blocks, local, weights)]
        t1 = time.perf_counter()
        node_t += t1 - t0
        node_cpu += time.process_time() - c0
        total = _sum_in_order(c.update for c in parts)
        removed = None
        if scheme == "fedsvd-utility":
            j = choose(n)
            out.kept.append(j)
            removed = _sum_in_order(c.noise for i, c in enumerate(parts) if i != j) \
                if n > 1 else np.zeros_like(total)
        common = server_step(scheme, total, params, removed=removed, noise=server_noise)
        server_t += time.perf_counter() - t1
        local = [node_basis(scheme, common, params)] * n
        out.commons.append(common)
        if per_iteration:
            out.estimates.append(common)
        out.Z_bar = common
    out.node_seconds, out.server_seconds, out.node_cpu_seconds = node_t, server_t, node_cpu
    return out


def _sum_in_order(arrays) -> np.ndarray:
    """sum of arrays in the given order, starting from a float64 copy of the first (the
    plain aggregator's reduction)."""
    total = None
    for a in arrays:
        if total is None:
            total = np.array(a, dtype=np.float64)
        else:
            total += a
    if total is None:
        raise ValueError("nothing to sum")
    return total


# ----------------------------------------------------------------------------- accounting
#: Below these noise multipliers (sigma / sensitivity) Opacus's accountants run for seconds
#: to minutes (measured: PRV 250 s at 0.079, the paper's setting on 0/1 data, ending without
#: a number; RDP 17 s at 0.029) for epsilons in the thousands; they are then not run.
OPACUS_MIN_NOISE_MULTIPLIER = {"rdp": 0.05, "prv": 0.3}
#: Above this PRV also takes seconds (11 s at 70) for an epsilon RDP already bounds well.
PRV_MAX_NOISE_MULTIPLIER = 20.0

def accounting(scheme: str, params: SvdParams, n_nodes: int, min_rows: int,
               opacus: bool = True) -> dict:
    """The privacy each scheme claims, as the paper states it and with Opacus.

    ``epsilon`` is the headline number (``None`` where no guarantee exists):

    - fedpower: the (2 eps, 2 delta) FedPower claims for its sigma; paper 002 (Sec. 4)
      shows it does not hold (noise after the data-dependent alignment), so it is reported
      with ``valid: False``.
    - fedsvd-utility: none; the paper gives no theorem (no clipping, unbounded sensitivity).
    - fedsvd-privacy: Theorem 2 per iteration with each node's own noise, composed over all
      T iterations (every iteration's output feeds the next): basic composition (T eps,
      T delta) as the paper, and Opacus RDP / PRV with noise multiplier sigma / sensitivity
      for T steps at ``delta``. ``distributed``: the same when every node is honest, so a
      synchronized sum carries the noise of all n nodes (local iterations keep one node's).
    """
    import warnings

    out: dict = {"scheme": scheme, "delta": params.delta, "T": params.T}
    if scheme == "fedpower":
        if params.sigma <= 0:
            return {**out, "epsilon": None, "reason": "sigma = 0: no noise, no guarantee"}
        eps = fedpower_claimed_epsilon(params, min_rows)
        return {**out, "epsilon": 2 * eps, "claimed_delta": 2 * params.delta, "valid": False,
                "reason": "FedPower's claim; paper 002 Sec. 4: noise is added after the "
                          "alignment D, whose sensitivity is not accounted"}
    if scheme == "fedsvd-utility":
        return {**out, "epsilon": None, "reason": "fedsvd-utility has no DP guarantee in the "
                "paper: its noise N(0, sigma^2) is not calibrated to any sensitivity (no "
                "clipping)"}
    sigma = params.node_sigma(scheme, n_nodes)
    if sigma <= 0:
        return {**out, "epsilon": None, "reason": "sigma = 0: no noise, no guarantee"}
    sens = sensitivity(params)
    per_iter = theorem2_epsilon(params, sigma)
    ledger = release_ledger(params, sigma, params.r, params.T)
    eps, dlt = ledger.basic_composition()
    out.update({"epsilon": eps, "epsilon_per_iteration": per_iter, "total_delta": dlt,
                "sensitivity": sens, "node_sigma": sigma, "noise_multiplier": sigma / sens,
                "ledger": ledger.to_table_rows()})
    syncs = params.syncs
    sum_sigma = sigma * math.sqrt(n_nodes)  # equal weights: n noises over n updates
    dist = (params.T - syncs) * per_iter + syncs * theorem2_epsilon(params, sum_sigma)
    out["distributed"] = {"epsilon": dist, "sum_sigma": sum_sigma,
                          "assumes": "all n nodes add their noise and equal row counts"}
    if opacus:
        for name in ("rdp", "prv"):
            if name == "prv" and sigma / sens > PRV_MAX_NOISE_MULTIPLIER:
                out["epsilon_prv"] = None
                out["prv_error"] = (f"noise multiplier {sigma / sens:.3g} > "
                                    f"{PRV_MAX_NOISE_MULTIPLIER:g}: not run (slow; see RDP)")
                continue
            if sigma / sens < OPACUS_MIN_NOISE_MULTIPLIER[name]:
                out[f"epsilon_{name}"] = None
                out[f"{name}_error"] = (f"noise multiplier {sigma / sens:.3g} < "
                                        f"{OPACUS_MIN_NOISE_MULTIPLIER[name]}: not run (Opacus "
                                        "takes minutes there; epsilon is in the thousands)")
                continue
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                try:
                    value = ledger.gaussian_epsilon(params.delta, name)
                except Exception as exc:  # noqa: BLE001  (Opacus fails on extreme settings)
                    value, out[f"{name}_error"] = None, f"{type(exc).__name__}: {exc}"
            out[f"epsilon_{name}"] = value if value is None or math.isfinite(value) else None
    return out
