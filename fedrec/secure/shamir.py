"""Shamir secret sharing over the prime field GF(2^31 - 1), vectorized with numpy.

Why not Flower's ``crypto.shamir``: it evaluates and interpolates polynomials over GF(2^128)
one share at a time in Python (pycryptodome), and at 100 SecAgg+ nodes the server's
reconstruction of every survivor's self-mask seed, and each node's sharing of a batch of
seeds among 100 holders, dominated key setup and every sum (``results/secure.md``).

Construction: a secret of ``b`` bytes is read as an integer and cut into ``ceil(8b / 30)``
limbs of 30 bits; each limb is shared with its own random polynomial of degree
``threshold - 1`` over GF(p), p = 2^31 - 1, all limbs and all holders at once (Horner's rule
on int64 arrays: every intermediate product stays below 2^62). Holder ``x`` (1..n) gets the
polynomials' values at ``x``. Any ``threshold`` shares give the limbs back by Lagrange
interpolation at 0; fewer reveal nothing (each limb is a perfectly hiding Shamir sharing,
since a limb < 2^30 < p). Coefficients come from the OS CSPRNG (``os.urandom``), uniform
over GF(p) by rejection.
"""

from __future__ import annotations

import os
from functools import lru_cache

import numpy as np

#: The field modulus: the Mersenne prime 2^31 - 1.
P = (1 << 31) - 1
LIMB_BITS = 30
MAX_SHARES = (1 << 16) - 1


def limbs_of(secret: bytes) -> np.ndarray:
    """The secret as ``ceil(8 * len / 30)`` limbs of 30 bits, least significant first."""
    value = int.from_bytes(secret, "big")
    count = -(-8 * len(secret) // LIMB_BITS)
    mask = (1 << LIMB_BITS) - 1
    return np.array([(value >> (LIMB_BITS * i)) & mask for i in range(count)], dtype=np.int64)


def secret_of(limbs: np.ndarray, nbytes: int) -> bytes:
    """Inverse of :func:`limbs_of`."""
    value = 0
    for i, limb in enumerate(np.asarray(limbs, dtype=np.int64).tolist()):
        value |= int(limb) << (LIMB_BITS * i)
    if value >= 1 << (8 * nbytes):
        raise ValueError("reconstructed value does not fit the secret's length: the shares do "
                         "not belong to one secret")
    return value.to_bytes(nbytes, "big")


def uniform_field(shape: tuple[int, ...]) -> np.ndarray:
    """Uniform elements of GF(p) from the OS CSPRNG (31-bit draws, the value p rejected)."""
    count = int(np.prod(shape))
    out = np.empty(0, dtype=np.int64)
    while out.size < count:
        need = count - out.size
        draws = np.frombuffer(os.urandom(4 * (need + 8)), dtype="<u4").astype(np.int64)
        draws &= P  # 31 bits: uniform on [0, 2^31 - 1]; reject 2^31 - 1 itself
        out = np.concatenate([out, draws[draws < P]])
    return out[:count].reshape(shape)


def split(limbs: np.ndarray, threshold: int, n: int) -> np.ndarray:
    """Shares of ``limbs`` (any shape) for holders x = 1..n: an (n, *limbs.shape) array."""
    if not 1 <= n <= MAX_SHARES:
        raise ValueError(f"number of shares must be in [1, {MAX_SHARES}], got {n}")
    if not 1 <= threshold <= n:
        raise ValueError(f"threshold must be in [1, n={n}], got {threshold}")
    limbs = np.asarray(limbs, dtype=np.int64)
    coeffs = uniform_field((threshold - 1, *limbs.shape))
    x = np.arange(1, n + 1, dtype=np.int64).reshape((n,) + (1,) * limbs.ndim)
    y = np.zeros((n, *limbs.shape), dtype=np.int64)
    for c in coeffs[::-1]:  # Horner: y = (...(c_{t-1} x + c_{t-2}) x + ...) x + secret
        y = (y + c) % P * x % P
    return (y + limbs) % P


@lru_cache(maxsize=256)
def _lagrange_at_zero(xs: tuple[int, ...]) -> np.ndarray:
    """Lagrange coefficients l_i(0) = prod_{j != i} x_j / (x_j - x_i) mod p, for these x."""
    out = []
    for i, xi in enumerate(xs):
        num, den = 1, 1
        for j, xj in enumerate(xs):
            if j != i:
                num = num * xj % P
                den = den * (xj - xi) % P
        out.append(num * pow(den, P - 2, P) % P)
    return np.array(out, dtype=np.int64)


def combine(xs: list[int], ys: np.ndarray) -> np.ndarray:
    """The shared limbs from shares ``ys[i]`` held at distinct points ``xs[i]``."""
    if len(set(xs)) != len(xs):
        raise ValueError("shares must come from distinct holders")
    lam = _lagrange_at_zero(tuple(int(x) for x in xs))
    ys = np.asarray(ys, dtype=np.int64)
    total = np.zeros(ys.shape[1:], dtype=np.int64)
    for coeff, y in zip(lam.tolist(), ys):
        total = (total + coeff * y) % P
    return total
