"""Signed fixed-point encoding into Z_{2^64} (or Z_{2^32}) for exact secure sums.

Why: masks only cancel exactly in a finite ring, so real vectors are scaled by 2^frac_bits,
rounded to the nearest integer and stored in two's complement modulo 2^modulus_bits.
Ring arithmetic is numpy ``uint64`` arithmetic: addition, subtraction and negation of
uint64 arrays wrap around modulo 2^64 by definition (numpy does not raise on unsigned
array overflow), which is exactly addition in Z_{2^64}. For modulus_bits=32 values are kept
in uint64 too; sums of up to 2^32 such values cannot overflow 64 bits, and
:meth:`FixedPoint.reduce` / :meth:`FixedPoint.decode` reduce modulo 2^32.

Wrap-around is only ever used for masks. Inputs never wrap silently: :meth:`encode` raises
``OverflowError`` when a value exceeds the declared range ``max_abs``, and
:meth:`check_capacity` raises when the *sum* of ``n_summands`` values of magnitude
``max_abs`` could leave the signed range [-2^(m-1), 2^(m-1)). If both checks pass, the
decoded sum equals the sum of the rounded inputs exactly, and its error against the real
sum is at most ``n_summands * resolution / 2`` with ``resolution = 2**-frac_bits``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

__all__ = ["FixedPoint"]


@dataclass(frozen=True)
class FixedPoint:
    """Fixed-point codec with a declared input range.

    Attributes:
        max_abs: declared bound on |x| for every encoded value (> 0).
        frac_bits: fractional bits; values are scaled by 2^frac_bits (default 24).
        modulus_bits: ring size, 64 or 32.
    """

    max_abs: float
    frac_bits: int = 24
    modulus_bits: int = 64

    def __post_init__(self) -> None:
        if self.modulus_bits not in (32, 64):
            raise ValueError(f"modulus_bits must be 32 or 64, got {self.modulus_bits}")
        if int(self.frac_bits) != self.frac_bits or self.frac_bits < 0:
            raise ValueError(f"frac_bits must be a non-negative int, got {self.frac_bits}")
        if not (math.isfinite(self.max_abs) and self.max_abs > 0):
            raise ValueError(f"max_abs must be finite and > 0, got {self.max_abs}")
        object.__setattr__(self, "frac_bits", int(self.frac_bits))
        object.__setattr__(self, "max_abs", float(self.max_abs))
        self.check_capacity(1)

    # ------------------------------------------------------------------ properties
    @property
    def scale(self) -> float:
        """2^frac_bits, the factor applied before rounding."""
        return float(2.0**self.frac_bits)

    @property
    def resolution(self) -> float:
        """Quantum 2^-frac_bits; per-summand rounding error is at most resolution / 2."""
        return float(2.0**-self.frac_bits)

    @property
    def max_int(self) -> int:
        """Largest encoded magnitude: round(max_abs * 2^frac_bits) (round-half-even <= +0.5)."""
        return math.floor(self.max_abs * self.scale + 0.5)

    @property
    def mask(self) -> int:
        """2^modulus_bits - 1."""
        return (1 << self.modulus_bits) - 1

    # ------------------------------------------------------------------ capacity
    def capacity(self) -> int:
        """Largest number of summands whose signed sum always fits (>= 1 after __post_init__)."""
        limit = (1 << (self.modulus_bits - 1)) - 1
        return limit // max(self.max_int, 1)

    def check_capacity(self, n_summands: int) -> None:
        """Raise ``OverflowError`` unless n_summands * max_abs * 2^frac_bits fits in m-1 bits.

        The sum of ``n_summands`` encoded values lies in [-n*max_int, n*max_int]; it decodes
        correctly iff that interval is inside the signed range of the ring.
        """
        n_summands = int(n_summands)
        if n_summands < 1:
            raise ValueError(f"n_summands must be >= 1, got {n_summands}")
        limit = (1 << (self.modulus_bits - 1)) - 1
        need = n_summands * self.max_int
        if need > limit:
            raise OverflowError(
                f"fixed-point capacity exceeded: {n_summands} summands x max_abs={self.max_abs:g} "
                f"x 2^{self.frac_bits} needs {need.bit_length()} magnitude bits, the "
                f"{self.modulus_bits}-bit ring has {self.modulus_bits - 1}; lower frac_bits, "
                f"max_abs or the number of summands (FixedPoint.for_sum picks frac_bits)"
            )

    @classmethod
    def for_sum(
        cls,
        max_abs: float,
        n_summands: int,
        frac_bits: int | None = None,
        modulus_bits: int = 64,
    ) -> "FixedPoint":
        """Codec for a sum of ``n_summands`` values each bounded by ``max_abs``.

        With ``frac_bits=None`` picks the largest frac_bits such that
        n_summands * round(max_abs * 2^frac_bits) <= 2^(m-2), i.e. the sum fits with one
        spare bit of headroom beyond the sign bit. With an explicit frac_bits it only checks
        capacity (m-1 bits). Raises ``OverflowError`` if no frac_bits >= 0 fits.
        """
        n_summands = int(n_summands)
        if n_summands < 1:
            raise ValueError(f"n_summands must be >= 1, got {n_summands}")
        if frac_bits is not None:
            codec = cls(max_abs=max_abs, frac_bits=frac_bits, modulus_bits=modulus_bits)
            codec.check_capacity(n_summands)
            return codec
        if not (math.isfinite(max_abs) and max_abs > 0):
            raise ValueError(f"max_abs must be finite and > 0, got {max_abs}")
        budget = 1 << (modulus_bits - 2)

        def fits(f: int) -> bool:
            return n_summands * math.floor(max_abs * 2.0**f + 0.5) <= budget

        if not fits(0):
            raise OverflowError(
                f"no fixed-point precision fits: {n_summands} summands x max_abs={max_abs:g} "
                f"exceed 2^{modulus_bits - 2} even with frac_bits=0"
            )
        # Start from the analytic estimate and correct for rounding at the boundary.
        f = max(0, math.floor(math.log2(budget / n_summands / max_abs)))
        while not fits(f):
            f -= 1
        while fits(f + 1) and f < 1000:
            f += 1
        return cls(max_abs=max_abs, frac_bits=f, modulus_bits=modulus_bits)

    # ------------------------------------------------------------------ codec
    def encode(self, x: np.ndarray, n_summands: int | None = None) -> np.ndarray:
        """Encode floats as uint64 ring elements (round to nearest, two's complement).

        Raises ``OverflowError`` naming the declared range (never the values nor how many
        exceed it: the message may reach the server), and, when
        ``n_summands`` is given, if the sum of that many values could overflow the ring.
        Raises ``ValueError`` on NaN or infinite inputs. Output has the shape of ``x``.
        """
        if n_summands is not None:
            self.check_capacity(n_summands)
        arr = np.asarray(x, dtype=np.float64)
        if arr.size == 0:
            return np.zeros(arr.shape, dtype=np.uint64)
        if not np.all(np.isfinite(arr)):
            raise ValueError("cannot fixed-point encode non-finite values (NaN/inf)")
        if np.any(np.abs(arr) > self.max_abs):
            raise OverflowError(f"values out of declared range max_abs = {self.max_abs!r}")
        ints = np.rint(arr * self.scale).astype(np.int64)
        out = ints.view(np.uint64)
        if self.modulus_bits == 32:
            out = out & np.uint64(self.mask)
        return out

    def reduce(self, v: np.ndarray) -> np.ndarray:
        """Reduce uint64 values modulo 2^modulus_bits (identity for 64 bits)."""
        v = self._as_ring(v)
        if self.modulus_bits == 64:
            return v
        return v & np.uint64(self.mask)

    def decode(self, v: np.ndarray) -> np.ndarray:
        """Decode ring elements (e.g. an unmasked sum) as signed values / 2^frac_bits."""
        v = self._as_ring(v)
        if self.modulus_bits == 64:
            signed = v.view(np.int64)
        else:
            low = (v & np.uint64(self.mask)).astype(np.int64)
            signed = np.where(low >= (1 << 31), low - (1 << 32), low)
        return signed.astype(np.float64) / self.scale

    @staticmethod
    def _as_ring(v: np.ndarray) -> np.ndarray:
        arr = np.asarray(v)
        if arr.dtype != np.uint64:
            raise TypeError(
                f"fixed-point ring elements must be uint64, got {arr.dtype}; "
                "do ring arithmetic in uint64 (it wraps mod 2^64)"
            )
        return arr
