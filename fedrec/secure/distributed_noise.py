"""Distributed discrete Gaussian noise inside the secure sum, and its accounting.

Why: a node that adds the whole noise of a Gaussian mechanism to its own contribution makes
the noise of a sum over n nodes grow as sqrt(n) times what one release needs; the secure
sum already hides every contribution, so each node adds only a share. With n committed
nodes and a target total sigma, each node adds discrete Gaussian noise of variance
sigma^2 / n on the secure sum's integer grid (after fixed-point encoding, before masking),
and the unmasked sum carries the whole variance once (Kairouz, Liu & Steinke, ICML 2021,
"The Distributed Discrete Gaussian Mechanism for Federated Learning with Secure
Aggregation", KLS below).

What a node derives itself (``clients/noise_node.py``; nothing here is the server's
choice): its share sigma_total / sqrt(m) from the request's declared total sigma (bound into
the sum's request digest, so every node of the sum reads the same value) and m, the sum's
committed node set less its signed dropouts; the grid, the worst-case number of shares the
unmasked sum can hold (the whole set unless its policy allows dropouts, else its
``min-survivors``), and from those the privacy it spends.

Accounting (all in grid units; the L2 sensitivity is the clip norm C times 2^bits, exact
because a node truncates toward zero after clipping, so its integer vector never has a
larger norm than the real one, and the neighbouring input is the same node with its
contribution zeroed):

- The sum Z of s independent discrete Gaussians N_Z(0, sigma_s^2) is not a discrete
  Gaussian. KLS Proposition 14 bounds its Renyi divergence for a shift Delta in Z^d: with
  tau = 10 sum_{k=1}^{s-1} exp(-2 pi^2 sigma_s^2 k / (k + 1)) and the scales
  a2 = ||Delta||_2 / (sqrt(s) sigma_s), a1 = ||Delta||_1 / (sqrt(s) sigma_s),
  D_alpha(Z || Z + Delta) <= min(alpha a2^2 / 2 + tau d,
  alpha / 2 (a2^2 + 2 a1 tau + tau^2 d), alpha / 2 (a2 + sqrt(d) tau)^2)
  (:func:`ddg_rdp`, as Google's reference ``compute_rdp_dgaussian`` has it). For the
  continuous Gaussian of the same variance the bound is alpha a2^2 / 2; tau is the extra
  term. Where the codec's grid is fine enough, a node puts its share at 2^40 to 2^41 grid
  steps (:func:`noise_bits`); tau is then 0 in float64 (each term is below
  exp(-pi^2 2^80)), so the discrete sum's RDP curve is the continuous one. It is computed
  whatever the grid.
- Poisson subsampling with rate q (each node decides by its own CSPRNG whether its input
  enters, and answers either way; the neighbouring input is the same node with its
  contribution zeroed, the add/remove relation of the subsampled Gaussian). What a node
  charges (:func:`composed_epsilon`): Opacus's RDP of the subsampled Gaussian with noise
  multiplier sqrt(s) sigma_s / ||Delta||_2 (Mironov, Talwar & Zhang 2019) plus tau d per
  sum at every integer order, converted by Opacus (Balle et al. 2020, Thm. 21). Why the
  correction is enough in one direction: at integer alpha, D_alpha((1-q) P0 + q P1 || P0)
  expands to sum_l C(alpha,l) (1-q)^(alpha-l) q^l exp((l-1) D_l(P1 || P0)) for *any* P0,
  P1, and Prop. 14 bounds each D_l by the Gaussian's plus tau d, so the sum is at most
  exp((alpha-1) tau d) times the Gaussian's. The other direction, D_alpha(P0 || mixture),
  is bounded by the first for the continuous Gaussian (Mironov et al., Thm. 5, through its
  rotation invariance), which the discrete Gaussian on Z^d lacks: for the discrete sum it
  is not a theorem here. The theorem for both directions is Zhu & Wang's general bound
  (ICML 2019, "Poisson Subsampled Renyi Differential Privacy", Thm. 9: (alpha-1)
  eps'(alpha) <= log[(1-q)^(alpha-1) (alpha q - q + 1) + C(alpha,2) q^2 (1-q)^(alpha-2)
  e^eps(2) + 3 sum_{l>=3} C(alpha,l) (1-q)^(alpha-l) q^l e^((l-1) eps(l))],
  :func:`subsampled_rdp`), KLS's own accounting, which a run reports beside the charged
  number (:func:`ddg_epsilon`); its factor 3 costs log(3) / (alpha - 1) per sum and
  order, so over many sums it is several times looser at small epsilon.

Wrap-around: the ring is Z_{2^64} and the signal of m nodes fills at most 2^62
(``FixedPoint.for_sum``); a node refuses a sum whose total noise scale times
:data:`TAIL_SIGMAS` passes the remaining 2^62 (a request-only check), so a noisy sum wraps
with probability below d exp(-TAIL_SIGMAS^2 / 2) per sum (the sum of discrete Gaussians is
subgaussian with the sum of the variances, CKS 2020 Cor. 9).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

__all__ = [
    "NOISE_KEY",
    "NOISE_FIELDS",
    "TAIL_SIGMAS",
    "RDP_ORDERS",
    "NoisePlan",
    "ddg_tau",
    "ddg_rdp",
    "subsampled_rdp",
    "ddg_epsilon",
    "gaussian_epsilon",
    "composed_epsilon",
    "noise_bits",
    "truncate_l2",
]

#: The request's ConfigRecord that opts a sum into distributed noise, beside its
#: ``secagg`` record (part of every node's request, so ``request_digest`` binds it and a
#: node given other values than its neighbours masks with keys that do not cancel), and its
#: fields: the mechanism (``ddg``), the total sigma the unmasked sum carries, the L2 bound
#: every contribution is clipped to, the Poisson rate each node samples its participation
#: with (1: every node contributes), the number of noisy sums the run plans (the whole-run
#: check) and the delta the run reports at.
NOISE_KEY = "secagg.noise"
NOISE_FIELDS = ("mechanism", "sigma", "l2", "rate", "releases", "delta")
#: Standard deviations of the total noise the ring keeps room for (wrap-around check).
TAIL_SIGMAS = 64.0
#: Integer RDP orders: Zhu & Wang's bound is for integers; Opacus's conversion takes any.
RDP_ORDERS: tuple[int, ...] = tuple(range(2, 65)) + (80, 96, 128, 160, 192, 256)
#: Bits of the noise scale in grid units: sigma_share 2^bits lies in [2^GRID, 2^(GRID+1)).
GRID = 40


def ddg_tau(sigma: float, shares: int) -> float:
    """KLS's tau for ``shares`` discrete Gaussians of scale ``sigma`` (grid units):
    10 sum_{k=1}^{shares-1} exp(-2 pi^2 sigma^2 k / (k + 1)) (0 for one share)."""
    if shares <= 1:
        return 0.0
    k = np.arange(1, int(shares), dtype=np.float64)
    return float(10.0 * np.exp(-2.0 * math.pi ** 2 * float(sigma) ** 2 * k / (k + 1)).sum())


def ddg_rdp(alpha: float, l2: float, l1: float, sigma: float, shares: int, dim: int) -> float:
    """KLS Proposition 14: an upper bound on D_alpha(Z || Z + Delta) for Z the sum of
    ``shares`` discrete Gaussians of scale ``sigma`` in Z^dim and ||Delta||_2 <= l2,
    ||Delta||_1 <= l1 (grid units)."""
    tau = ddg_tau(sigma, shares)
    scale = math.sqrt(shares) * sigma
    a2, a1 = l2 / scale, l1 / scale
    return min(alpha * a2 * a2 / 2 + tau * dim,
               alpha / 2 * (a2 * a2 + 2 * a1 * tau + tau * tau * dim),
               alpha / 2 * (a2 + math.sqrt(dim) * tau) ** 2)


def _log_comb(n: int, k: np.ndarray) -> np.ndarray:
    from scipy.special import gammaln

    return gammaln(n + 1) - gammaln(k + 1) - gammaln(n - k + 1)


def subsampled_rdp(alpha: int, q: float, eps: Sequence[float]) -> float:
    """Zhu & Wang's general upper bound on the RDP at integer ``alpha`` >= 2 of a mechanism
    with RDP ``eps[l]`` at every integer order l in [2, alpha] under Poisson sampling with
    rate ``q``; never more than ``eps[alpha]`` (no amplification)."""
    from scipy.special import logsumexp

    alpha = int(alpha)
    if alpha < 2:
        raise ValueError(f"alpha must be an integer >= 2, got {alpha}")
    if q >= 1:
        return float(eps[alpha])
    if q <= 0:
        return 0.0
    log1q, logq = math.log1p(-q), math.log(q)
    terms = [(alpha - 1) * log1q + math.log(alpha * q - q + 1),
             math.log(math.comb(alpha, 2)) + 2 * logq + (alpha - 2) * log1q + eps[2]]
    weights = [1.0, 1.0]
    if alpha >= 3:
        ls = np.arange(3, alpha + 1)
        more = (_log_comb(alpha, ls) + (alpha - ls) * log1q + ls * logq
                + (ls - 1) * np.asarray([eps[int(l)] for l in ls]))
        terms.extend(more.tolist())
        weights.extend([3.0] * len(ls))
    bound = float(logsumexp(terms, b=weights)) / (alpha - 1)
    return min(bound, float(eps[alpha]))


def _to_epsilon(orders: Sequence[float], rdp: Sequence[float], delta: float) -> float:
    """Opacus's RDP-to-DP conversion, without its warning that the best order is the
    smallest: the orders are integers by design (the binomial expansion behind the
    subsampled bounds holds at integer orders), so no smaller one can be offered."""
    import warnings

    from opacus.accountants.analysis.rdp import get_privacy_spent

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        eps, _ = get_privacy_spent(orders=list(orders), rdp=list(rdp), delta=delta)
    return float(eps)


@dataclass(frozen=True)
class NoisePlan:
    """One noisy sum as a node accounts it, all in grid units: the per-node scale
    ``sigma``, the fewest shares the unmasked sum can hold (``shares``), the L2 and L1
    bounds of a node's contribution and its dimension, and the Poisson ``rate``."""

    sigma: float
    shares: int
    l2: float
    dim: int
    rate: float

    @property
    def l1(self) -> float:
        """||Delta||_1 <= min(sqrt(d) ||Delta||_2, ||Delta||_2^2) on the integer grid
        (each nonzero coordinate is at least 1 in magnitude)."""
        return min(math.sqrt(self.dim) * self.l2, self.l2 * self.l2)

    @property
    def noise_multiplier(self) -> float:
        """sqrt(shares) sigma / l2: the continuous Gaussian's noise multiplier."""
        return math.sqrt(self.shares) * self.sigma / self.l2

    def rdp(self, alpha: int) -> float:
        return ddg_rdp(alpha, self.l2, self.l1, self.sigma, self.shares, self.dim)


@lru_cache(maxsize=256)
def _step_curves(plan: NoisePlan) -> tuple[np.ndarray, np.ndarray, float]:
    """One noisy sum's RDP at :data:`RDP_ORDERS`: the discrete sum's through Zhu & Wang's
    general bound, the subsampled continuous Gaussian's by Opacus, and the discrete
    correction tau d (KLS Prop. 14's first term)."""
    from opacus.accountants.analysis.rdp import compute_rdp

    top = max(RDP_ORDERS)
    curve = [0.0, 0.0] + [plan.rdp(a) for a in range(2, top + 1)]
    general = np.array([subsampled_rdp(a, plan.rate, curve) for a in RDP_ORDERS])
    gauss = np.asarray(compute_rdp(q=plan.rate, noise_multiplier=plan.noise_multiplier,
                                   steps=1, orders=list(RDP_ORDERS)), np.float64)
    return general, gauss, ddg_tau(plan.sigma, plan.shares) * plan.dim


def _composed(plans: Sequence[tuple[NoisePlan, int]]) -> tuple[np.ndarray, np.ndarray,
                                                                  float]:
    general, gauss, correction = np.zeros(len(RDP_ORDERS)), np.zeros(len(RDP_ORDERS)), 0.0
    for plan, steps in plans:
        g, c, t = _step_curves(plan)
        general, gauss, correction = general + steps * g, gauss + steps * c, \
            correction + steps * t
    return general, gauss, correction


def _quiet_epsilon(rdp: np.ndarray, delta: float) -> float:
    return _to_epsilon(RDP_ORDERS, rdp.tolist(), delta)


def ddg_epsilon(plans: Sequence[tuple[NoisePlan, int]], delta: float) -> float:
    """(eps, delta) of the composition of ``steps`` noisy sums per plan by the general
    theorem: each plan's discrete RDP curve (:func:`ddg_rdp`) through Zhu & Wang's
    subsampling bound (both directions of the add/remove relation), summed, converted by
    Opacus's RDP-to-DP conversion: KLS's own accounting of the sampled distributed discrete
    Gaussian (reported beside the charged epsilon; looser by Zhu & Wang's factor 3)."""
    if not plans:
        return 0.0
    return _quiet_epsilon(_composed(plans)[0], delta)


def gaussian_epsilon(plans: Sequence[tuple[NoisePlan, int]], delta: float) -> float:
    """The same composition as the subsampled *continuous* Gaussian (noise multiplier,
    sample rate, steps per plan) at :data:`RDP_ORDERS`: what Opacus's ``RDPAccountant``
    gives for that history at those orders (``tests/test_distributed_noise.py``)."""
    if not plans:
        return 0.0
    return _quiet_epsilon(_composed(plans)[1], delta)


def composed_epsilon(plans: Sequence[tuple[NoisePlan, int]], delta: float) -> float:
    """What a node charges for these noisy sums: Opacus's subsampled Gaussian RDP plus the
    discrete correction tau d per sum at every order (module docstring: a theorem for the
    direction D(with user || without); 0 in float64 at the grids these sums use, where
    this equals :func:`gaussian_epsilon`)."""
    if not plans:
        return 0.0
    _, gauss, correction = _composed(plans)
    return _quiet_epsilon(gauss + correction, delta)



#: Grid units of :func:`multiplier_plan` (the noise multiplier does not depend on them).
_PLAN_UNIT = 2.0 ** 40


def multiplier_plan(z: float, rate: float, shares: int) -> NoisePlan:
    """The plan a node accounts for one sum of noise multiplier ``z`` over ``shares``
    shares at Poisson rate ``rate`` (grid-free: the multiplier is what counts)."""
    return NoisePlan(z * _PLAN_UNIT / math.sqrt(shares), shares, _PLAN_UNIT, 1, rate)


def calibrate(epsilon: float, delta: float, rate: float, releases: int, shares: int,
              tol: float = 1e-4) -> float:
    """The smallest noise multiplier z (to ``tol`` relative, rounded up) whose ``releases``
    noisy sums cost at most ``epsilon`` at ``delta`` by :func:`composed_epsilon`, with
    ``shares`` noise shares (one per node): what a server asks of its nodes, who account
    the same plans themselves."""
    def eps(z: float) -> float:
        return composed_epsilon([(multiplier_plan(z, rate, shares), releases)], delta)

    lo, hi = 1e-3, 1.0
    while eps(hi) > epsilon:
        lo, hi = hi, hi * 2
        if hi > 1e6:
            raise ValueError(f"no noise multiplier below 1e6 reaches epsilon {epsilon:g}")
    while hi - lo > tol * hi:
        mid = math.sqrt(lo * hi)
        lo, hi = (lo, mid) if eps(mid) <= epsilon else (mid, hi)
    return hi


def noisy_range(l2: float, z: float, shares: int) -> float:
    """A noisy sum's declared range: the L2 bound (every coordinate of a clipped reply
    lies within it), widened so the ring keeps :data:`TAIL_SIGMAS` noise sigmas of room
    (``clients/noise_node.py`` refuses less)."""
    return l2 * max(1.0, 1.01 * TAIL_SIGMAS * z / shares)

def noise_bits(sigma_share: float, frac_bits: int) -> int:
    """The noise grid 2^-bits of a sum whose codec has ``frac_bits``: the coarser of the
    codec's grid and the one on which ``sigma_share`` is 2^GRID to 2^(GRID+1) steps (the
    sampler's int64 draws need a scale below 2^47; a finer grid changes nothing but the
    tau term, already 0)."""
    e = math.frexp(float(sigma_share))[1] - 1  # floor(log2 sigma_share)
    return min(int(frac_bits), GRID - e)


def truncate_l2(vec: np.ndarray, l2: float, bits: int) -> np.ndarray:
    """Integers k = trunc(2^bits x') with x' = ``vec`` scaled to L2 norm at most ``l2``:
    truncation toward zero never grows a coordinate, so ||k||_2 <= l2 2^bits exactly."""
    x = np.asarray(vec, dtype=np.float64)
    norm = float(np.linalg.norm(x))
    if norm > l2:
        x = x * (l2 / norm)
    return np.trunc(np.ldexp(x, int(bits))).astype(np.int64)
