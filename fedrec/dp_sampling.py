"""Exact discrete Gaussian and discrete Laplace noise, vectorized, from a CSPRNG.

Why this module: the mechanisms of :mod:`fedrec.dp` and FedSVD's per-iteration noise draw
d x r values at a time (FedPower on LastFM: ~55 minutes through OpenDP's one-value-at-a-time
samplers, 1e4-3e4 values/s). No installed library samples exact discrete Gaussians in bulk
(OpenDP: per value; numpy: floating-point and seedable; Opacus: continuous torch noise), so
this one is written by hand, following Canonne, Kamath & Steinke 2020 ("The Discrete
Gaussian for Differential Privacy", CKS below) with numpy arrays of candidates. It lives
beside ``fedrec/dp.py``, not in ``fedrec/secure``: its consumers are the DP mechanisms, and
the secure sum's fixed-point grid enters only as an integer ``frac_bits``.

Algorithms (CKS Algorithms 1-3, batched):

- discrete Laplace with rational scale t/s (P(y) proportional to exp(-|y| s/t)): U uniform
  on {0..t-1} kept with probability exp(-U/t), V geometric (the count of Bernoulli(1/e)
  successes before a failure), X = U + t V, Y = floor(X/s), a sign bit, (-, 0) rejected.
- discrete Gaussian with rational sigma^2: Y discrete Laplace with t = floor(sigma) + 1,
  kept with probability exp(-(|Y| - sigma^2/t)^2 / (2 sigma^2)).
- Bernoulli(exp(-x)) for rational x >= 0: where CKS compose Bernoulli(x/k) draws in exact
  rational arithmetic (Algorithm 1), this module compares a uniform U in [0, 1) with
  exp(-x) directly, exactly: U's first 53 bits give an interval of width 2^-53, and
  ``fl(exp(-x))`` (numpy, the argument computed in float64) is within ERR = 2^-40 of
  exp(-x) (numpy's float64 exp errs by a few ulps, ~2^-51; the argument's rounding, ~2^-50
  here, is bounded in the docs of each caller and checked against correctly rounded
  Decimal values by ``tests/test_discrete_noise.py``). When U's interval lies wholly
  below or above [fl - ERR, fl + ERR] the answer is decided; otherwise (probability about
  2^-39 per draw) U is refined with 64 more bits at a time and compared with exp(-x)
  computed from the exact rational x by ``decimal`` (correctly rounded exp) at growing
  precision, until decided. Each decision therefore equals [U < exp(-x)] for a uniform
  real U: Bernoulli(exp(-x)) exactly, in one 64-bit word almost always.

Randomness: a ChaCha20 keystream (``cryptography``) under a fresh 32-byte key from
``os.urandom`` per :class:`RandomBits` (each public sampler call makes its own unless
given one), so no state is shared across processes (Ray forks workers) and nothing the
run seed reproduces. ``RandomBits(key=...)`` exists for tests that need fixed draws.

Grid (floating-point safety): a real value x gets noise on the grid g = 2^(e - 44), e =
floor(log2 sigma) (:func:`noise_grid`): the output is fl(k g + Z g) with k = rint(x / g)
and Z the integer noise of scale sigma / g in [2^44, 2^45). k g and Z g are exact (power-of-
two scaling, |Z| < 2^53 checked), so the float result is IEEE's correctly rounded value of
the exact grid point (k + Z) g: a function of the mechanism's exact output alone, hence
post-processing. The low bits of x never reach the output (Mironov 2012's attack needs
them). What rounding costs: on n coordinates rint moves each by at most g/2, so the L2
sensitivity on the grid is at most Delta + g sqrt(n) (L1: Delta + g n);
:func:`grid_l2_sensitivity` / :func:`grid_l1_sensitivity` give it and the mechanisms in
``fedrec/dp.py`` calibrate to it.
"""

from __future__ import annotations

import decimal
import math
import os
from collections.abc import Callable
from fractions import Fraction

import numpy as np

__all__ = [
    "GRID_BITS",
    "RandomBits",
    "add_discrete_gaussian",
    "add_discrete_laplace",
    "discrete_gaussian",
    "discrete_gaussian_fixed_point",
    "discrete_laplace",
    "grid_l1_sensitivity",
    "grid_l2_sensitivity",
    "noise_grid",
    "snap_to_grid",
]

Rational = int | float | Fraction

#: The noise scale in grid units lies in [2^GRID_BITS, 2^(GRID_BITS + 1)): fine enough that
#: rounding to the grid changes a sensitivity by a relative 2^-44 sqrt(n) sigma / Delta,
#: coarse enough that every noise value is an exact float (|Z| < 2^53 unless Z is 256
#: sigma out, probability below 1e-14000).
GRID_BITS = 44
#: |fl(exp(-x)) - exp(-x)| is below this for every float argument this module computes
#: (see the module docstring); a uniform within it of the float value is decided exactly.
ERR = 2.0 ** -40
_CHUNK = 1 << 20  # candidates per batch: bounded memory for any request
_WORD_BYTES = 8
#: Bytes one key may give: half of what ChaCha20's 32-bit block counter (OpenSSL's 16-byte
#: IV form) reaches before it would wrap and repeat the stream.
_STREAM_BYTES = 1 << 37


class RandomBits:
    """Uniform 64-bit words from ChaCha20 under a 32-byte key (``os.urandom`` by default).

    ``key`` is for tests only (fixed draws); production code never passes one.
    """

    def __init__(self, key: bytes | None = None) -> None:
        from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

        key = os.urandom(32) if key is None else bytes(key)
        if len(key) != 32:
            raise ValueError(f"a ChaCha20 key has 32 bytes, got {len(key)}")
        # nonce = initial counter: zero, safe because every key is used for one stream
        self._enc = Cipher(algorithms.ChaCha20(key, bytes(16)), mode=None).encryptor()
        self._zeros = b""
        self._left = _STREAM_BYTES

    def words(self, n: int) -> np.ndarray:
        """The next ``n`` keystream words as uint64."""
        size = _WORD_BYTES * int(n)
        self._left -= size
        if self._left < 0:  # never near: a draw makes its own stream
            raise OverflowError("one ChaCha20 stream gives at most 2^37 bytes here")
        if len(self._zeros) < size:
            self._zeros = bytes(max(size, 2 * len(self._zeros)))
        out = bytearray(size + 31)  # update_into wants room for a block beyond the data
        self._enc.update_into(memoryview(self._zeros)[:size], out)
        return np.frombuffer(out, dtype="<u8", count=int(n))


# ----------------------------------------------------------------------- exact Bernoulli
def _exp_neg_bounds(x: Fraction, digits: int) -> tuple[Fraction, Fraction]:
    """Rationals lo <= exp(-x) <= hi, hi - lo = 2 10^-digits (``decimal``'s exp is
    correctly rounded; the working precision covers the rounding of x to a Decimal)."""
    with decimal.localcontext() as ctx:
        ctx.Emin, ctx.Emax = decimal.MIN_EMIN, decimal.MAX_EMAX
        ctx.prec = digits + len(str(math.floor(x))) + 5
        value = (-(decimal.Decimal(x.numerator) / decimal.Decimal(x.denominator))).exp()
    half = Fraction(1, 10 ** digits)
    centre = Fraction(value)
    return centre - half, centre + half


def _below_exp_exact(bits: RandomBits, high: int, x: Fraction) -> bool:
    """[U < exp(-x)] for the uniform U whose first 53 bits are ``high``, its further bits
    drawn here 64 at a time until the comparison is decided."""
    numerator, scale, digits = high, 53, 30
    while True:
        lo, hi = _exp_neg_bounds(x, digits)
        if Fraction(numerator + 1, 1 << scale) <= lo:
            return True
        if Fraction(numerator, 1 << scale) >= hi:
            return False
        numerator = (numerator << 64) | int(bits.words(1)[0])
        scale += 64
        digits += 20


def bernoulli_exp(bits: RandomBits, x: np.ndarray,
                  exact: Callable[[int], Fraction]) -> np.ndarray:
    """Bernoulli(exp(-x_i)) for each i, exactly: ``x`` holds float64 values within the
    module's error budget of the rational arguments ``exact(i)`` (called only in the rare
    undecided case). See the module docstring for the argument."""
    high = bits.words(x.size) >> np.uint64(11)
    u = high.astype(np.float64) * 2.0 ** -53  # exact: high < 2^53
    p = np.exp(-x)
    out = u + 2.0 ** -53 <= p - ERR  # U's whole interval below exp(-x)
    undecided = ~out & (u < p + ERR)  # and not wholly above it
    for i in np.flatnonzero(undecided):
        out[i] = _below_exp_exact(bits, int(high[i]), exact(int(i)))
    return out


# ------------------------------------------------------------------------ integer draws
def _uniform_below(bits: RandomBits, t: int, n: int) -> np.ndarray:
    """n uniform integers in [0, t) (rejection from 64-bit words, exact)."""
    if t == 1:
        return np.zeros(n, dtype=np.uint64)
    limit = ((1 << 64) // t) * t  # words below it map uniformly by mod t
    out = np.empty(n, dtype=np.uint64)
    filled = 0
    while filled < n:
        w = bits.words(n - filled + 8)
        if limit < 1 << 64:
            w = w[w < np.uint64(limit)]
        take = min(n - filled, w.size)
        out[filled:filled + take] = w[:take] % np.uint64(t)
        filled += take
    return out


_ONE = Fraction(1)


def _geometric_exp1(bits: RandomBits, n: int) -> np.ndarray:
    """n draws of the number of Bernoulli(exp(-1)) successes before the first failure."""
    v = np.zeros(n, dtype=np.int64)
    active = np.arange(n)
    while active.size:
        ok = bernoulli_exp(bits, np.ones(active.size), lambda i: _ONE)
        active = active[ok]
        v[active] += 1
    return v


def _laplace_batch(bits: RandomBits, t: int, s: int, m: int) -> np.ndarray:
    """The accepted ones among m candidates of CKS Algorithm 2 (scale t/s)."""
    u = _uniform_below(bits, t, m)
    if t > 1:
        keep = bernoulli_exp(bits, u.astype(np.float64) / t, lambda i: Fraction(int(u[i]), t))
        u = u[keep]
    v = _geometric_exp1(bits, u.size)
    if v.size and int(v.max()) >= (1 << 62) // t:
        raise OverflowError("discrete Laplace draw beyond int64")  # needs t V >= 2^62
    x = u.astype(np.int64) + np.int64(t) * v
    y = x // s if s != 1 else x
    negative = (bits.words(y.size) >> np.uint64(63)).astype(bool)
    keep = ~(negative & (y == 0))
    return np.where(negative, -y, y)[keep]


def _gaussian_batch(bits: RandomBits, sigma2: Fraction, m: int) -> np.ndarray:
    """The accepted ones among m candidates of CKS Algorithm 3.

    The float argument (|Y| - c)^2 / (2 sigma^2), c = sigma^2 / t: |Y| is exact below
    2^53, c and 2 sigma^2 carry a relative 2^-53, so the difference errs by at most
    ulp(c) ~ 2^-52 c and the argument by about (|Y - c| / sigma) 2^-51 + 2^-51 x; times
    exp(-x) <= 1 that stays below 2^-48 for every x (a tail |Y| >= 2^53 has exp(-x) below
    e^-1000 and float 0 within ERR)."""
    t = math.isqrt(math.floor(sigma2)) + 1
    y = _laplace_batch(bits, t, 1, m)
    c = sigma2 / t
    two_s2 = 2 * sigma2
    d = np.abs(y).astype(np.float64) - float(c)
    keep = bernoulli_exp(bits, d * d / float(two_s2),
                         lambda i: (abs(int(y[i])) - c) ** 2 / two_s2)
    return y[keep]


def _rational(name: str, value: Rational) -> Fraction:
    """A positive finite scale as an exact rational (a float converts exactly)."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{name} must be finite and > 0, got {value}")
    q = Fraction(value)
    if q <= 0:
        raise ValueError(f"{name} must be finite and > 0, got {value}")
    return q


def _fill(shape: tuple[int, ...] | int, batch: Callable[[int], np.ndarray]) -> np.ndarray:
    """An int64 array of ``shape`` from i.i.d. accepted candidates (acceptance learnt)."""
    n = int(np.prod(shape, dtype=np.int64))
    out = np.empty(n, dtype=np.int64)
    filled, rate = 0, 0.3
    while filled < n:
        m = min(_CHUNK, int((n - filled) / rate * 1.05) + 64)
        got = batch(m)
        rate = max(0.05, min(1.0, got.size / m))
        take = min(n - filled, got.size)
        out[filled:filled + take] = got[:take]
        filled += take
    return out.reshape(shape)


def discrete_laplace(shape: tuple[int, ...] | int, scale: Rational,
                     bits: RandomBits | None = None) -> np.ndarray:
    """Integers with P(y) proportional to exp(-|y| / scale), exactly (CKS Algorithm 2);
    ``scale`` a rational t/s (a float is taken as its exact binary value)."""
    q = _rational("scale", scale)
    t, s = q.numerator, q.denominator
    if t >= 1 << 56:
        raise ValueError(f"scale numerator {t} too large for int64 draws (< 2^56)")
    bits = bits or RandomBits()
    return _fill(shape, lambda m: _laplace_batch(bits, t, s, m))


def discrete_gaussian(shape: tuple[int, ...] | int, sigma: Rational,
                      bits: RandomBits | None = None) -> np.ndarray:
    """Integers with P(y) proportional to exp(-y^2 / (2 sigma^2)), exactly (CKS Algorithm
    3); ``sigma`` rational (a float is taken as its exact binary value), below 2^47."""
    q = _rational("sigma", sigma)
    if q >= 1 << 47:
        raise ValueError(f"sigma {float(q):g} too large for int64 draws (< 2^47)")
    bits = bits or RandomBits()
    sigma2 = q * q
    return _fill(shape, lambda m: _gaussian_batch(bits, sigma2, m))


def discrete_gaussian_fixed_point(shape: tuple[int, ...] | int, sigma: Rational,
                                  frac_bits: int, bits: RandomBits | None = None) -> np.ndarray:
    """Noise for values encoded on the grid 2^-frac_bits (``fedrec/secure/fixedpoint.py``):
    integers of a discrete Gaussian with scale sigma 2^frac_bits, to add to the encoded
    integers (the real noise is the result times 2^-frac_bits)."""
    return discrete_gaussian(shape, _rational("sigma", sigma) * (1 << int(frac_bits)), bits)


# ------------------------------------------------------------------------ real values
def noise_grid(scale: float) -> float:
    """The grid g = 2^(floor(log2 scale) - GRID_BITS) that noise of ``scale`` lives on."""
    scale = float(scale)
    if not (math.isfinite(scale) and scale > 2.0 ** -900):
        raise ValueError(f"noise scale must be finite and > 2^-900, got {scale}")
    return math.ldexp(1.0, math.frexp(scale)[1] - 1 - GRID_BITS)


def snap_to_grid(x: np.ndarray, grid: float) -> np.ndarray:
    """x rounded to the nearest multiple of ``grid`` (a power of two), exactly."""
    arr = np.asarray(x, dtype=np.float64)
    k = np.rint(arr / grid)
    if not np.all(np.isfinite(k)):
        raise ValueError("values must be finite (and within range of the noise grid)")
    return k * grid


def grid_l2_sensitivity(l2_sensitivity: float, n: int, grid: float) -> float:
    """L2 sensitivity after rounding ``n`` coordinates to ``grid``: Delta + grid sqrt(n)."""
    return float(l2_sensitivity) + grid * math.sqrt(max(int(n), 0))


def grid_l1_sensitivity(l1_sensitivity: float, n: int, grid: float) -> float:
    """L1 sensitivity after rounding ``n`` coordinates to ``grid``: Delta + grid n."""
    return float(l1_sensitivity) + grid * max(int(n), 0)


def _on_grid(x: np.ndarray, grid: float, noise: np.ndarray) -> np.ndarray:
    """fl(snap(x) + noise grid): the correctly rounded exact grid value (module docstring)."""
    if noise.size and int(np.abs(noise).max()) >= 1 << 53:
        raise OverflowError("noise beyond 2^53 grid steps")  # never: 256 sigma out
    return snap_to_grid(x, grid) + noise.astype(np.float64) * grid


def add_discrete_gaussian(x: np.ndarray, sigma: float, grid: float | None = None,
                          bits: RandomBits | None = None) -> np.ndarray:
    """x rounded to ``grid`` (default :func:`noise_grid` (sigma)) plus discrete Gaussian
    noise of standard scale sigma on that grid, as float64 (floating-point safe: see the
    module docstring). The caller accounts the sensitivity on the grid
    (:func:`grid_l2_sensitivity`)."""
    arr = np.asarray(x, dtype=np.float64)
    g = noise_grid(sigma) if grid is None else float(grid)
    noise = discrete_gaussian(arr.shape, Fraction(float(sigma)) / Fraction(g), bits)
    return _on_grid(arr, g, noise)


def add_discrete_laplace(x: np.ndarray, scale: float, grid: float | None = None,
                         bits: RandomBits | None = None) -> tuple[np.ndarray, float]:
    """x rounded to ``grid`` plus discrete Laplace noise whose scale is ``scale`` rounded up
    to a whole number of grid steps; returns (values, the scale used, >= ``scale``)."""
    arr = np.asarray(x, dtype=np.float64)
    g = noise_grid(scale) if grid is None else float(grid)
    steps = math.ceil(Fraction(float(scale)) / Fraction(g))
    return _on_grid(arr, g, discrete_laplace(arr.shape, steps, bits)), steps * g
