"""Explicit differential-privacy mechanisms and a privacy ledger.

Why: every protocol that adds noise must say which mechanism, with which sensitivity and
which budget, and the run must report the composed budget. So each mechanism here is a
plain function of (value, sensitivity, budget) with nothing hidden, and
:class:`PrivacyLedger` records every release, modelled on Opacus accountants (record, then
ask for epsilon at a delta).

Calibrations:

- Gaussian, classical (Dwork & Roth 2014, Thm A.1): sigma = sqrt(2 ln(1.25/delta)) * s / eps,
  with s the L2 sensitivity. The theorem is proved for 0 < eps < 1, so the classical mode
  refuses eps > 1 (use ``analytic=True``).
- Gaussian, analytic (Balle & Wang 2018, Thm 8): the smallest sigma with
  Phi(s/(2 sigma) - eps sigma/s) - e^eps Phi(-s/(2 sigma) - eps sigma/s) <= delta, found by
  scipy root bracketing (brentq) on a log-stable form. Exact for every eps > 0 and never
  larger than the classical sigma.
- Laplace: scale b = s1 / eps with s1 the L1 sensitivity (pure eps-DP).
- Exponential mechanism (McSherry & Talwar 2007): P(i) proportional to exp(eps u_i / (2 s)),
  sampled as report-noisy-max with Gumbel noise of scale 2 s / eps (equivalent, never
  exponentiates).
- Gumbel top-s (Durfee & Rogers 2019): adding Gumbel noise once with per-item budget eps/s
  and keeping the s largest is distributed exactly as s rounds of the exponential mechanism
  without replacement ("peeling"), each eps/s-DP, hence eps-DP in total by basic
  composition.

Sampling (why not numpy or textbook floats): textbook floating-point Laplace/Gaussian
samplers leak through the set of floats they can output (Mironov 2012: the low bits of
x + noise reveal x), and numpy's Generator is a seedable statistical PRG. The Gaussian and
Laplace mechanisms here draw exact discrete Gaussian / discrete Laplace noise on a grid
(``fedrec/dp_sampling.py``: Canonne, Kamath & Steinke 2020, CKS below, batched in numpy,
ChaCha20 keyed by ``os.urandom``; ~2e6 values per CPU second against OpenDP's ~1.6e4,
``results/dp_sampler/sampler.md``): x is rounded to the grid g = 2^(floor(log2 scale) - 44)
and integer noise times g is added, so the released float is the correctly rounded exact
grid value, a function of the mechanism's output alone. The selection mechanisms
(exponential, Gumbel top-s) draw one value per candidate and keep OpenDP's exact samplers
(``opendp.measurements``: make_noisy_top_k). There is no ``rng`` argument and no seed: DP
noise must be unpredictable to everyone, the server included, so it is the one draw the
run seed does not reproduce.

Discrete noise, the same guarantees (what each mechanism below calibrates to):

- Rounding to the grid moves each of n coordinates by at most g/2, so the sensitivity of
  the grid values is at most Delta_2 + g sqrt(n) (L2) or Delta_1 + g n (L1)
  (``dp_sampling.grid_l2_sensitivity``); :func:`gaussian_mechanism` and
  :func:`laplace_mechanism` calibrate to these. :func:`gaussian_noise_with_sigma` takes
  sigma from its caller, who accounts Delta_2 + g sqrt(n) with g <= 2^-44 sigma (relative
  to the sensitivity 2^-44 sqrt(n) sigma / Delta: 3.6e-13 for fedsvd-privacy's defaults
  on ML-100K, checked in ``tests/test_fedsvd_accounting.py``).
- Discrete Laplace with scale b on the grid: P(y) proportional to exp(-|y| / b), so the
  pmf ratio of two shifts is at most exp(Delta_1 / b): pure (Delta_1 / b)-DP, as the
  continuous Laplace.
- Discrete Gaussian with sigma on the grid: for shifts of L2 norm Delta (in grid units) its
  Renyi divergence at every order alpha is at most alpha Delta^2 / (2 sigma^2) (CKS Sec. 2:
  (Delta^2 / 2 sigma^2)-zCDP, Thm. 14 for independent coordinates), the continuous
  Gaussian's RDP curve. So Opacus's RDP accountant composes discrete-Gaussian entries
  recorded with sample_rate = 1 unchanged (noise_multiplier = sigma / Delta). Its (eps,
  delta) calibrations (classical, analytic) are continuous-Gaussian results, so
  :func:`gaussian_mechanism` takes the larger of that sigma and the one whose zCDP
  implies (eps, delta) (:func:`zcdp_gaussian_sigma`, CKS Cor. 13's conversion). The
  per-release epsilon a Gaussian ledger entry records (fedsvd-privacy: Theorem 2, the
  classical formula) is a continuous-Gaussian number; for epsilon <= 1 the zCDP
  conversion confirms it for the discrete noise too (checked on a grid of epsilon in
  [0.01, 1] and delta in [1e-12, 0.05], ``tests/test_fedsvd_accounting.py``), above 1 it is
  no theorem for either noise. Opacus's PRV accountant and subsampled RDP
  (sample_rate < 1) model continuous noise and are not claimed for discrete entries.

Accounting: the ledger composes pure-DP entries by summation, and the Gaussian entries
with Opacus's RDP or PRV accountant from (noise_multiplier = sigma / sensitivity,
sample_rate, steps), which is much tighter than summing per-release (eps, delta).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from functools import lru_cache
from typing import Any, Literal

import numpy as np

from fedrec.dp_sampling import (
    add_discrete_gaussian,
    add_discrete_laplace,
    grid_l1_sensitivity,
    grid_l2_sensitivity,
    noise_grid,
)

# scipy.optimize / scipy.special are imported where the analytic calibration needs them, so
# importing this module stays cheap for processes that only read its constants and ledger.

__all__ = [
    "gaussian_sigma",
    "classical_gaussian_epsilon",
    "gaussian_mechanism",
    "gaussian_noise_with_sigma",
    "zcdp_epsilon",
    "zcdp_gaussian_sigma",
    "laplace_mechanism",
    "exponential_mechanism",
    "gumbel_top_s",
    "clip_l2",
    "clip_rows_l2",
    "LedgerEntry",
    "PrivacyLedger",
]


def _check_pos(name: str, value: float) -> float:
    value = float(value)
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be finite and > 0, got {value}")
    return value


def _check_delta(delta: float) -> float:
    delta = float(delta)
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    return delta


# ---------------------------------------------------------------------------- Gaussian
def _analytic_delta(sigma: float, sens: float, eps: float) -> float:
    """delta(sigma) of the Gaussian mechanism (Balle & Wang 2018, Thm 8), log-stable."""
    from scipy.special import log_ndtr, ndtr  # lazy: see the module imports

    a = sens / (2 * sigma)
    b = eps * sigma / sens
    first = ndtr(a - b)
    second = math.exp(eps + log_ndtr(-a - b))
    return float(first - second)


def gaussian_sigma(l2_sensitivity: float, epsilon: float, delta: float, analytic: bool = False) -> float:
    """Noise std for an (epsilon, delta)-DP Gaussian mechanism with the given L2 sensitivity.

    Classical (default): sqrt(2 ln(1.25/delta)) * s / epsilon, valid for epsilon <= 1 only
    (raises ``ValueError`` otherwise). ``analytic=True``: Balle & Wang's exact calibration,
    valid for all epsilon > 0.
    """
    sens = _check_pos("l2_sensitivity", l2_sensitivity)
    eps = _check_pos("epsilon", epsilon)
    delta = _check_delta(delta)
    classical = math.sqrt(2 * math.log(1.25 / delta)) * sens / eps
    if not analytic:
        if eps > 1:
            raise ValueError(
                f"classical Gaussian calibration is proved only for epsilon <= 1 (got {eps}); "
                "use analytic=True"
            )
        return classical
    # delta(sigma) decreases in sigma: bracket the root, then solve.
    lo, hi = sens * 1e-6, max(classical, sens)
    while _analytic_delta(hi, sens, eps) > delta:
        hi *= 2
    if _analytic_delta(lo, sens, eps) <= delta:
        return lo
    from scipy.optimize import brentq  # lazy: see the module imports

    sigma = brentq(lambda s: _analytic_delta(s, sens, eps) - delta, lo, hi, xtol=1e-12 * hi, rtol=1e-12, maxiter=500)
    # Return a sigma that certainly satisfies the bound (root finders may land just below).
    while _analytic_delta(sigma, sens, eps) > delta:
        sigma *= 1 + 1e-12
    return float(sigma)


def classical_gaussian_epsilon(sigma: float, l2_sensitivity: float, delta: float) -> float:
    """Inverse of the classical calibration: eps = sqrt(2 ln(1.25/delta)) * s / sigma.

    A guarantee only when the result is <= 1; used for basic-composition comparisons.
    """
    sigma = _check_pos("sigma", sigma)
    sens = _check_pos("l2_sensitivity", l2_sensitivity)
    delta = _check_delta(delta)
    return math.sqrt(2 * math.log(1.25 / delta)) * sens / sigma


def _opendp():
    """OpenDP with its ``contrib`` features on (the selection samplers are in contrib)."""
    import opendp.prelude as odp  # lazy: a native library, only for processes that select

    odp.enable_features("contrib")
    return odp


def _float_vector(x: np.ndarray) -> np.ndarray:
    arr = np.asarray(x, dtype=np.float64)
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{int(np.count_nonzero(~np.isfinite(arr)))} non-finite value(s) "
                         "cannot be released")
    return arr


def zcdp_epsilon(rho: float, delta: float) -> float:
    """The epsilon at ``delta`` implied by rho-zCDP: min over alpha > 1 of alpha rho +
    log((alpha - 1) / alpha) - (log delta + log alpha) / (alpha - 1) (CKS 2020 Cor. 13;
    the conversion Opacus's RDP accountant applies). The minimum is over a fixed grid of
    orders, each of which gives a valid bound."""
    alphas = 1.0 + np.logspace(-4, 5, 4000)
    eps = alphas * rho + np.log1p(-1 / alphas) - (math.log(delta) + np.log(alphas)) / (alphas - 1)
    return float(np.min(eps))


def zcdp_gaussian_sigma(l2_sensitivity: float, epsilon: float, delta: float) -> float:
    """The smallest sigma (to 1e-12 relative, rounded up) whose (Delta^2 / 2 sigma^2)-zCDP
    implies (epsilon, delta)-DP through :func:`zcdp_epsilon`: a calibration the discrete
    Gaussian meets as a theorem, whatever epsilon."""
    sens = _check_pos("l2_sensitivity", l2_sensitivity)
    eps = _check_pos("epsilon", epsilon)
    delta = _check_delta(delta)

    def ok(sigma: float) -> bool:
        return zcdp_epsilon(sens * sens / (2 * sigma * sigma), delta) <= eps

    lo, hi = sens * 1e-6, sens
    while not ok(hi):
        lo, hi = hi, hi * 2
    while hi - lo > 1e-12 * hi:
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if ok(mid) else (mid, hi)
    return hi


def gaussian_noise_with_sigma(x: np.ndarray, sigma: float) -> np.ndarray:
    """Return x rounded to the noise grid plus discrete Gaussian noise of scale sigma
    (float64), for callers that calibrate sigma themselves to the sensitivity on the grid
    (module docstring; ``dp_sampling.add_discrete_gaussian``)."""
    sigma = float(sigma)
    if not (math.isfinite(sigma) and sigma >= 0):
        raise ValueError(f"sigma must be finite and >= 0, got {sigma}")
    arr = _float_vector(x)
    if sigma == 0 or arr.size == 0:
        return arr.copy()
    return add_discrete_gaussian(arr, sigma)


def gaussian_mechanism(
    x: np.ndarray,
    l2_sensitivity: float,
    epsilon: float,
    delta: float,
    analytic: bool = False,
) -> np.ndarray:
    """(epsilon, delta)-DP release of x with discrete Gaussian noise on the grid: sigma the
    larger of :func:`gaussian_sigma`'s and :func:`zcdp_gaussian_sigma`'s, both for the
    sensitivity on the grid (Delta + g sqrt(n), module docstring)."""
    arr = _float_vector(x)
    grid = noise_grid(gaussian_sigma(l2_sensitivity, epsilon, delta, analytic=analytic))
    sens = grid_l2_sensitivity(l2_sensitivity, arr.size, grid)
    sigma = max(gaussian_sigma(sens, epsilon, delta, analytic=analytic),
                zcdp_gaussian_sigma(sens, epsilon, delta))
    return add_discrete_gaussian(arr, sigma, grid=grid) if arr.size else arr.copy()


# ---------------------------------------------------------------------------- Laplace
def laplace_mechanism(x: np.ndarray, l1_sensitivity: float, epsilon: float) -> np.ndarray:
    """epsilon-DP release of x: x rounded to the grid plus discrete Laplace noise of scale
    (Delta_1 + g n) / epsilon on it (the L1 sensitivity on the grid; the scale rounded up
    to whole grid steps), per coordinate."""
    scale = _check_pos("l1_sensitivity", l1_sensitivity) / _check_pos("epsilon", epsilon)
    arr = _float_vector(x)
    if arr.size == 0:
        return arr.copy()
    grid = noise_grid(scale)
    sens = grid_l1_sensitivity(l1_sensitivity, arr.size, grid)
    return add_discrete_laplace(arr, sens / epsilon, grid=grid)[0]


# ---------------------------------------------------------------------------- selection
def _utilities(utilities: np.ndarray) -> list[float]:
    u = np.asarray(utilities, dtype=np.float64).ravel()
    if u.size == 0:
        raise ValueError("utilities is empty; nothing to select")
    if not np.all(np.isfinite(u)):
        raise ValueError("utilities must be finite")
    return u.tolist()


@lru_cache(maxsize=64)
def _gumbel_top_k(scale: float, k: int) -> Any:
    """OpenDP's noisy top-k with Gumbel noise of ``scale`` (cached per scale and k).

    OpenDP picks the noise by the output measure: exponential noise (permute-and-flip, a
    different selection distribution) under max-divergence, Gumbel under zero-concentrated
    divergence. Gumbel is what makes noisy max *the* exponential mechanism, so the zCDP
    form is built; the release is accounted as pure eps-DP (McSherry & Talwar; Durfee &
    Rogers for top-k) by the ledger, not by OpenDP's rho.
    """
    odp = _opendp()
    return odp.m.make_noisy_top_k(odp.vector_domain(odp.atom_domain(T=float, nan=False)),
                                  odp.linf_distance(T=float, monotonic=False),
                                  odp.zero_concentrated_divergence(), k=k, scale=scale)


def exponential_mechanism(utilities: np.ndarray, sensitivity: float, epsilon: float) -> int:
    """epsilon-DP choice of an index with P(i) proportional to exp(eps u_i / (2 sensitivity)).

    Report-noisy-max with Gumbel noise of scale 2 sensitivity / eps, which is exactly the
    exponential mechanism (OpenDP ``make_noisy_top_k`` with k = 1, see
    :func:`_gumbel_top_k`); it never exponentiates, so large utilities cannot overflow.
    """
    values = _utilities(utilities)
    scale = 2 * _check_pos("sensitivity", sensitivity) / _check_pos("epsilon", epsilon)
    return int(_gumbel_top_k(scale, 1)(values)[0])


def gumbel_top_s(utilities: np.ndarray, s: int, sensitivity: float, epsilon: float) -> np.ndarray:
    """epsilon-DP selection of s distinct indices (one-shot Gumbel top-s), best first.

    Gumbel noise of scale 2 s sensitivity / eps once, keep the s largest (OpenDP
    ``make_noisy_top_k``): distributed as s rounds of the exponential mechanism without
    replacement with budget eps/s each, hence eps-DP by basic composition (Durfee & Rogers
    2019). ``sensitivity`` is the per-item utility sensitivity.
    """
    values = _utilities(utilities)
    s = int(s)
    if not 1 <= s <= len(values):
        raise ValueError(f"s must be in [1, {len(values)}], got {s}")
    scale = 2 * s * _check_pos("sensitivity", sensitivity) / _check_pos("epsilon", epsilon)
    return np.asarray(_gumbel_top_k(scale, s)(values), dtype=np.int64)


# ---------------------------------------------------------------------------- clipping
def clip_l2(x: np.ndarray, c: float) -> np.ndarray:
    """Scale x (as one vector) to L2 norm at most c; bounds the L2 sensitivity by c."""
    c = _check_pos("clip norm c", c)
    arr = np.asarray(x, dtype=np.float64)
    norm = float(np.linalg.norm(arr))
    return arr * (c / norm) if norm > c else arr.copy()


def clip_rows_l2(X: np.ndarray, c: float) -> np.ndarray:
    """Scale each row of a 2-D array to L2 norm at most c (per-user / per-item clipping)."""
    c = _check_pos("clip norm c", c)
    arr = np.asarray(X, dtype=np.float64)
    if arr.ndim != 2:
        raise ValueError(f"clip_rows_l2 expects a 2-D array, got shape {arr.shape}")
    norms = np.linalg.norm(arr, axis=1, keepdims=True)
    factor = np.ones_like(norms)
    over = norms > c
    factor[over] = c / norms[over]  # rows within the bound (zero rows too) stay as they are
    return arr * factor


# ---------------------------------------------------------------------------- ledger
_GAUSSIAN = "gaussian"


@dataclass(frozen=True)
class LedgerEntry:
    """One recorded release (or ``steps`` identical releases)."""

    name: str
    mechanism: str
    epsilon: float | None
    delta: float
    sigma: float | None
    sensitivity: float | None
    sample_rate: float
    steps: int

    @property
    def noise_multiplier(self) -> float | None:
        """sigma / sensitivity for Gaussian entries (Opacus's noise_multiplier)."""
        if self.sigma is None or self.sensitivity is None:
            return None
        return self.sigma / self.sensitivity


class PrivacyLedger:
    """The DP accountant: a record of releases, with composed budgets.

    Usage mirrors Opacus accountants: ``record(...)`` steps it with a release, then
    ``spent()`` / ``gaussian_epsilon(delta)`` / ``pure_epsilon()`` / ``basic_composition()``
    query it. It is the one accountant of the project: a node builds the ledger of what it
    is about to release, charges :meth:`spent` against its budget (its disk ledger,
    ``clients/dp_ledger.py``, keeps the rows of every release and re-reads them as one
    ledger), and the results report the rows of the same ledger.

    - Pure entries (delta == 0 and not Gaussian: Laplace, exponential, Gumbel top-s)
      compose by summing epsilon * steps. Their sample_rate is recorded but not used for
      amplification (conservative).
    - Gaussian entries (mechanism "gaussian", with sigma and sensitivity) are composed by
      Opacus (RDP or PRV) as subsampled Gaussian steps; sample_rate=1 means no subsampling.
    """

    def __init__(self) -> None:
        self.entries: list[LedgerEntry] = []

    def record(
        self,
        name: str,
        mechanism: str,
        epsilon: float | None,
        delta: float = 0.0,
        sigma: float | None = None,
        sensitivity: float | None = None,
        sample_rate: float = 1.0,
        steps: int = 1,
    ) -> LedgerEntry:
        """Store a release; ``steps`` > 1 records that many identical releases."""
        mech = str(mechanism).lower()
        if epsilon is not None:
            epsilon = _check_pos(f"epsilon of {name!r}", epsilon)
        delta = float(delta)
        if not 0 <= delta < 1:
            raise ValueError(f"delta of {name!r} must be in [0, 1), got {delta}")
        if not 0 < sample_rate <= 1:
            raise ValueError(f"sample_rate of {name!r} must be in (0, 1], got {sample_rate}")
        steps = int(steps)
        if steps < 1:
            raise ValueError(f"steps of {name!r} must be >= 1, got {steps}")
        if mech == _GAUSSIAN:
            if sigma is None or sensitivity is None:
                raise ValueError(f"Gaussian entry {name!r} needs sigma and sensitivity for accounting")
            sigma = _check_pos(f"sigma of {name!r}", sigma)
            sensitivity = _check_pos(f"sensitivity of {name!r}", sensitivity)
        elif epsilon is None:
            raise ValueError(f"entry {name!r} ({mech}) needs an epsilon")
        entry = LedgerEntry(name, mech, epsilon, delta, sigma, sensitivity, float(sample_rate), steps)
        self.entries.append(entry)
        return entry

    @classmethod
    def from_rows(cls, rows: Iterable[Mapping[str, Any]]) -> PrivacyLedger:
        """The ledger whose :meth:`to_table_rows` are ``rows`` (every row checked again)."""
        ledger = cls()
        for row in rows:
            ledger.record(str(row["name"]), str(row["mechanism"]), row["epsilon"],
                          row["delta"], row["sigma"], row["sensitivity"], row["sample_rate"],
                          row["steps"])
        return ledger

    # -- composition ---------------------------------------------------------------
    def spent(self) -> float:
        """The epsilon a budget is checked against: basic composition, the sum of each
        release's epsilon times its steps (Gaussian releases with their per-release epsilon).
        The composition theorems below can only give less; a budget holds under all of them."""
        return self.basic_composition()[0]

    def _gaussian_entries(self) -> list[LedgerEntry]:
        return [e for e in self.entries if e.mechanism == _GAUSSIAN]

    def pure_epsilon(self) -> float:
        """Basic composition of the pure-DP entries (non-Gaussian, delta == 0): sum eps * steps."""
        return float(
            sum(e.epsilon * e.steps for e in self.entries if e.mechanism != _GAUSSIAN and e.delta == 0 and e.epsilon)
        )

    def basic_composition(self) -> tuple[float, float]:
        """(sum eps_i * steps_i, sum delta_i * steps_i) over all entries.

        Gaussian entries need their per-release epsilon (and delta) recorded; raises
        ``ValueError`` naming the first entry without one.
        """
        eps = delta = 0.0
        for e in self.entries:
            if e.epsilon is None:
                raise ValueError(f"entry {e.name!r} has no per-release epsilon; use gaussian_epsilon()")
            eps += e.epsilon * e.steps
            delta += e.delta * e.steps
        return eps, delta

    def gaussian_epsilon(self, delta: float, accountant: Literal["rdp", "prv"] = "rdp") -> float:
        """Epsilon at ``delta`` of all Gaussian entries composed by an Opacus accountant.

        Each entry contributes (noise_multiplier = sigma / sensitivity, sample_rate, steps)
        to the accountant's history. Returns 0.0 when there are no Gaussian entries.
        """
        from opacus.accountants import (  # heavy import, on demand
            PRVAccountant,
            RDPAccountant,
        )

        delta = _check_delta(delta)
        history = [(e.noise_multiplier, e.sample_rate, e.steps) for e in self._gaussian_entries()]
        if not history:
            return 0.0
        if accountant == "rdp":
            acc = RDPAccountant()
        elif accountant == "prv":
            acc = PRVAccountant()
        else:
            raise ValueError(f"accountant must be 'rdp' or 'prv', got {accountant!r}")
        acc.history = history
        return float(acc.get_epsilon(delta=delta))

    def total_epsilon(self, delta: float, accountant: Literal["rdp", "prv"] = "rdp") -> float:
        """pure_epsilon() + gaussian_epsilon(delta): an (eps, delta)-DP bound for the whole run.

        Approximate-DP non-Gaussian entries (delta > 0) are not covered; raises if any exist.
        """
        other = [e.name for e in self.entries if e.mechanism != _GAUSSIAN and e.delta > 0]
        if other:
            raise ValueError(f"entries {other} are approximate DP but not Gaussian; use basic_composition()")
        return self.pure_epsilon() + self.gaussian_epsilon(delta, accountant)

    # -- reporting -----------------------------------------------------------------
    def summary(self, delta: float | None = None) -> dict[str, Any]:
        """JSON-serialisable summary; with ``delta`` also the RDP-composed Gaussian epsilon."""
        out: dict[str, Any] = {
            "n_entries": len(self.entries),
            "total_steps": int(sum(e.steps for e in self.entries)),
            "pure_epsilon": self.pure_epsilon(),
            "entries": [asdict(e) for e in self.entries],
        }
        try:
            eps, dlt = self.basic_composition()
            out["basic_composition"] = {"epsilon": eps, "delta": dlt}
        except ValueError:
            out["basic_composition"] = None
        if delta is not None:
            out["gaussian_rdp"] = {"delta": float(delta), "epsilon": self.gaussian_epsilon(delta, "rdp")}
        return out

    TABLE_COLUMNS = ("name", "mechanism", "epsilon", "delta", "sigma", "sensitivity", "sample_rate", "steps")

    def to_table_rows(self) -> list[dict[str, Any]]:
        """One dict per entry with keys ``TABLE_COLUMNS`` (for Markdown / console tables)."""
        return [{k: getattr(e, k) for k in self.TABLE_COLUMNS} for e in self.entries]
