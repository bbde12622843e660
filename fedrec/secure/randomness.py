"""Secret randomness that is not DP noise: draws nobody but the drawing node may predict.

Why not numpy: ``np.random.default_rng(secrets.randbits(128))`` is PCG64, a statistical
generator; its whole output follows from 128 bits of state, and its outputs reveal that
state. A node's private Gaussian rows (PriviRec's Omega) need draws that stay unpredictable
even to someone who sees many of them, so they come from AES-256-CTR keyed by 32 fresh bytes
of the OS CSPRNG (``secrets.token_bytes``, i.e. ``os.urandom``) -- the generator SecAgg+'s
masks use (:func:`fedrec.secure.masks.expand_mask`).

Construction of :func:`csprng_normal`: each pair of 64-bit keystream words gives two uniforms
u = (w >> 11 + 0.5) / 2^53 in the open interval (0, 1) (53 random bits, never 0 or 1), and
the Box-Muller transform maps (u1, u2) to two independent standard normals
sqrt(-2 ln u1) cos(2 pi u2) and sqrt(-2 ln u1) sin(2 pi u2). The float rounding of this map
is irrelevant for its use here (a random start matrix); DP noise, where floating point
can leak, uses the samplers of ``fedrec/dp.py`` instead.
"""

from __future__ import annotations

import secrets

import numpy as np

from fedrec.secure.masks import expand_mask

_TWO_POW_53 = float(1 << 53)


def csprng_uniform(n: int, key: bytes | None = None) -> np.ndarray:
    """``n`` uniforms in (0, 1) with 53 random bits each, from AES-256-CTR keyed by ``key``
    (default: 32 fresh bytes from the OS CSPRNG)."""
    words = expand_mask(key if key is not None else secrets.token_bytes(32), 0, int(n))
    return ((words >> np.uint64(11)).astype(np.float64) + 0.5) / _TWO_POW_53


def csprng_normal(shape: int | tuple[int, ...], key: bytes | None = None) -> np.ndarray:
    """Standard normal draws of ``shape`` (Box-Muller over :func:`csprng_uniform`)."""
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    n = int(np.prod(shape)) if shape else 1
    half = (n + 1) // 2
    u = csprng_uniform(2 * half, key)
    radius = np.sqrt(-2.0 * np.log(u[:half]))
    angle = 2.0 * np.pi * u[half:]
    out = np.concatenate([radius * np.cos(angle), radius * np.sin(angle)])[:n]
    return out.reshape(shape)
