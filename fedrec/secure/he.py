"""Homomorphic encryption helpers on TenSEAL: dense CKKS packing, server-side sums, BFV bits.

Why: PrivMVMF (paper 004) aggregates real-valued gradients under CKKS so that the server
adds ciphertexts it cannot read. (The federated-SVD utility scheme's encrypted selection
value times a plaintext noise vector, paper 002, lives in ``selection.py``: complex packing,
flooding, its own parameters.) The server only
ever receives a *public* context (public key, no secret key); :class:`EncryptedSum` refuses a
context that holds a secret key.

Packing: a float vector of length n is cut into ceil(n / slots) CKKS vectors with
slots = poly_modulus_degree / 2 (4096 for N=8192), each serialized separately. Dense
packing is what keeps traffic manageable: a fresh N=8192 ciphertext is ~330 KB whether it
holds 1 value or 4096.

Default CKKS parameters (``CkksParams``): N=8192, coeff_mod_bit_sizes [60, 40, 40, 60]
(200 bits total, within the 218-bit bound for 128-bit security at N=8192), global scale
2^40. This
allows ciphertext additions and one ciphertext x plaintext multiplication (which rescales
to the next level).

Measured precision (this machine, TenSEAL 0.3.18, 3 trials): the sum of 20 encrypted
vectors of 25,000 values uniform in [-1, 1] (7 ciphertexts per client, ~0.7 s for all 20
clients including encryption) decrypts with max abs error 3.8e-8 to 4.7e-8 over all 25,000
coordinates against the float64 plain sum; one fresh encryption has max abs error about
1e-8. A ciphertext x plaintext product loses more: its max abs error grows with the
plaintext, about 1.3e-7 x max|plain| (2.6e-7 for |x| <= 1, |w| <= 2; 1.4e-5 for |w| <= 100,
20,000 values), so multiply by plaintexts of moderate magnitude.

Public contexts are serialized without the secret key, the Galois keys and (by default) the
relinearization keys: additions and plaintext multiplications need none of them, and
dropping the relin keys shrinks the public context from ~1.9 MB to ~0.47 MB.

BFV (``make_bfv_context``, ``encrypt_bits``, ``decrypt_ints``) is for integers: N=8192 with a
40-bit batching prime plain modulus t = 1099511480321 (t = 1 mod 2N), 8192 slots per
ciphertext. Decryption returns the centered representative in (-t/2, t/2], so signed
fixed-point integers with |sum| < 2^39 decode correctly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import tenseal as ts

__all__ = [
    "CkksParams",
    "make_secret_context",
    "public_context_bytes",
    "secret_context_bytes",
    "load_context",
    "slots_of",
    "encrypt_packed",
    "decrypt_packed",
    "EncryptedSum",
    "plain_times_cipher",
    "BFV_PLAIN_MODULUS",
    "make_bfv_context",
    "encrypt_bits",
    "decrypt_ints",
    "pad_ciphertext",
    "unpad_ciphertext",
]

Scheme = Literal["ckks", "bfv"]

# Largest prime below 2^40 with p = 1 (mod 2*8192): enables BFV batching at N=8192.
BFV_PLAIN_MODULUS = 1099511480321


@dataclass(frozen=True)
class CkksParams:
    """CKKS parameters. Defaults give <= ~1e-8 max error per fresh value and one plaintext product."""

    poly_modulus_degree: int = 8192
    coeff_mod_bit_sizes: tuple[int, ...] = field(default=(60, 40, 40, 60))
    global_scale: float = 2.0**40

    @property
    def slots(self) -> int:
        """Values per ciphertext: poly_modulus_degree / 2."""
        return self.poly_modulus_degree // 2


# ---------------------------------------------------------------------------- contexts
def make_secret_context(params: CkksParams | None = None, galois_keys: bool = False) -> ts.Context:
    """Create a CKKS context holding the secret key (stays with the key-holding clients).

    Galois keys (needed only for rotations, e.g. encrypted dot products) are generated
    only when ``galois_keys=True``; sums and elementwise plaintext products need none.
    """
    params = params or CkksParams()
    ctx = ts.context(
        ts.SCHEME_TYPE.CKKS,
        poly_modulus_degree=params.poly_modulus_degree,
        coeff_mod_bit_sizes=list(params.coeff_mod_bit_sizes),
    )
    ctx.global_scale = params.global_scale
    if galois_keys:
        ctx.generate_galois_keys()
    return ctx


def public_context_bytes(ctx: ts.Context, relin_keys: bool = False, galois_keys: bool = False) -> bytes:
    """Serialize ``ctx`` without its secret key: the holder can encrypt and add, not decrypt."""
    return ctx.serialize(
        save_public_key=True,
        save_secret_key=False,
        save_galois_keys=galois_keys and ctx.has_galois_keys(),
        save_relin_keys=relin_keys and ctx.has_relin_keys(),
    )


def secret_context_bytes(ctx: ts.Context) -> bytes:
    """Serialize ``ctx`` with its secret key (relay it only sealed, see ``keys``)."""
    if not ctx.has_secret_key():
        raise ValueError("context holds no secret key; cannot serialize a secret context")
    return ctx.serialize(save_secret_key=True)


def load_context(data: bytes) -> ts.Context:
    """Deserialize a context produced by :func:`public_context_bytes` / :func:`secret_context_bytes`."""
    try:
        return ts.context_from(bytes(data))
    except Exception as err:  # TenSEAL raises bare ValueError/RuntimeError on bad input
        raise ValueError(f"cannot load TenSEAL context ({len(data)} bytes): {err}") from err


def slots_of(ctx: ts.Context) -> int:
    """CKKS slots per ciphertext for this context (poly_modulus_degree / 2)."""
    return ctx.seal_context().data.key_context_data().parms().poly_modulus_degree() // 2


def _chunks(n: int, slots: int) -> list[tuple[int, int]]:
    return [(s, min(s + slots, n)) for s in range(0, n, slots)]


# ---------------------------------------------------------------------------- CKKS packing
def encrypt_packed(ctx: ts.Context, x: np.ndarray) -> list[bytes]:
    """Encrypt a float vector densely: ceil(n / slots) serialized CKKS vectors.

    ``x`` is flattened (C order); the last chunk holds the remainder. A public context
    suffices (clients holding only the public key can encrypt).
    """
    flat = np.asarray(x, dtype=np.float64).ravel()
    if flat.size == 0:
        return []
    if not np.all(np.isfinite(flat)):
        raise ValueError("cannot CKKS-encrypt non-finite values (NaN/inf)")
    slots = slots_of(ctx)
    return [ts.ckks_vector(ctx, flat[a:b].tolist()).serialize() for a, b in _chunks(flat.size, slots)]


def decrypt_packed(ctx: ts.Context, chunks: list[bytes], n: int) -> np.ndarray:
    """Decrypt :func:`encrypt_packed` output back to a float64 vector of length ``n``.

    Raises ``ValueError`` if ``ctx`` has no secret key or the chunk layout does not match n.
    """
    if not ctx.has_secret_key():
        raise ValueError("this context holds no secret key: it can add ciphertexts but not decrypt")
    return _decrypt_chunks(ctx, chunks, n, slots_of(ctx), ts.ckks_vector_from, np.float64, "CKKS")


def _decrypt_chunks(ctx: ts.Context, chunks: list[bytes], n: int, slots: int,
                    load: Any, dtype: Any, scheme: str) -> np.ndarray:
    """Decrypt packed chunks (any scheme) into one vector of length ``n``, checking layout."""
    expected = math.ceil(n / slots) if n > 0 else 0
    if len(chunks) != expected:
        raise ValueError(f"expected {expected} {scheme} ciphertext chunks for n={n} "
                         f"({slots} slots), got {len(chunks)}")
    out = np.empty(n, dtype=dtype)
    for (a, b), blob in zip(_chunks(n, slots), chunks):
        vals = load(ctx, blob).decrypt()
        if len(vals) != b - a:
            raise ValueError(f"chunk for [{a}, {b}) holds {len(vals)} values, expected {b - a}")
        out[a:b] = vals
    return out


def plain_times_cipher(
    ctx: ts.Context, chunks: list[bytes], plain: np.ndarray, scheme: Scheme = "ckks"
) -> list[bytes]:
    """Elementwise product of packed ciphertexts with a plaintext vector of the same length.

    Works with a public context. For CKKS the product is rescaled (one level consumed); for
    BFV ``plain`` must be integer-valued (e.g. fixed-point noise times an encrypted bit).
    """
    flat = np.asarray(plain).ravel()
    loader = ts.ckks_vector_from if scheme == "ckks" else ts.bfv_vector_from
    out: list[bytes] = []
    pos = 0
    for i, blob in enumerate(chunks):
        vec = loader(ctx, blob)
        size = vec.size()
        part = flat[pos : pos + size]
        if part.size != size:
            raise ValueError(f"plaintext has {flat.size} values, fewer than the ciphertexts hold (chunk {i})")
        if scheme == "ckks":
            vec.mul_(part.astype(np.float64).tolist())
        else:
            if not np.issubdtype(part.dtype, np.integer):
                raise TypeError(f"BFV plaintext must be integers, got {part.dtype}")
            vec.mul_(part.astype(np.int64).tolist())
        out.append(vec.serialize())
        pos += size
    if pos != flat.size:
        raise ValueError(f"plaintext has {flat.size} values, ciphertexts hold {pos}")
    return out


# ---------------------------------------------------------------------------- server sum
class EncryptedSum:
    """Running encrypted sum on the server, one client's ciphertext list at a time.

    Holds only the running total (one ciphertext per chunk), never the individual clients'
    ciphertexts, so memory is independent of the number of clients. Accepts only a public
    context: the server must not be able to decrypt.
    """

    def __init__(self, public_ctx_bytes: bytes, scheme: Scheme = "ckks") -> None:
        if scheme not in ("ckks", "bfv"):
            raise ValueError(f"scheme must be 'ckks' or 'bfv', got {scheme!r}")
        self._ctx = load_context(public_ctx_bytes)
        if self._ctx.has_secret_key():
            raise ValueError("EncryptedSum was given a context with a secret key; the server gets a public context only")
        self._loader = ts.ckks_vector_from if scheme == "ckks" else ts.bfv_vector_from
        self._total: list = []
        self._count = 0

    @property
    def count(self) -> int:
        """Number of clients added so far."""
        return self._count

    @property
    def held_ciphertexts(self) -> int:
        """Ciphertexts currently held (= chunks of the running total)."""
        return len(self._total)

    def add(self, chunks: list[bytes]) -> None:
        """Add one client's packed ciphertexts into the running total."""
        vecs = [self._loader(self._ctx, blob) for blob in chunks]
        if self._count == 0:
            self._total = vecs
        else:
            if len(vecs) != len(self._total):
                raise ValueError(
                    f"client #{self._count + 1} sent {len(vecs)} chunks, the running sum has {len(self._total)}"
                )
            for i, (acc, vec) in enumerate(zip(self._total, vecs)):
                if acc.size() != vec.size():
                    raise ValueError(
                        f"client #{self._count + 1} chunk {i} holds {vec.size()} values, the running sum {acc.size()}"
                    )
                acc.add_(vec)
        self._count += 1

    def result(self) -> list[bytes]:
        """Serialized running total (packed like the inputs)."""
        if self._count == 0:
            raise ValueError("EncryptedSum.result() called before any client was added")
        return [acc.serialize() for acc in self._total]


# ---------------------------------------------------------------------------- BFV bits
def make_bfv_context(poly_modulus_degree: int = 8192, plain_modulus: int = BFV_PLAIN_MODULUS) -> ts.Context:
    """BFV context (secret key included) for integer vectors; slots = poly_modulus_degree.

    ``plain_modulus`` must be a prime = 1 (mod 2 * poly_modulus_degree) for batching; the
    default is the 40-bit prime for N=8192.
    """
    if (plain_modulus - 1) % (2 * poly_modulus_degree):
        raise ValueError(f"plain_modulus {plain_modulus} is not 1 mod 2N={2 * poly_modulus_degree}")
    return ts.context(ts.SCHEME_TYPE.BFV, poly_modulus_degree=poly_modulus_degree, plain_modulus=plain_modulus)


def _bfv_slots(ctx: ts.Context) -> int:
    return ctx.seal_context().data.key_context_data().parms().poly_modulus_degree()


def encrypt_bits(ctx: ts.Context, bits: np.ndarray) -> list[bytes]:
    """Encrypt a 0/1 vector with BFV, packed N values per ciphertext."""
    flat = np.asarray(bits).ravel()
    if flat.size and not np.all((flat == 0) | (flat == 1)):
        raise ValueError("encrypt_bits expects only 0/1 values")
    ints = flat.astype(np.int64)
    slots = _bfv_slots(ctx)
    return [ts.bfv_vector(ctx, ints[a:b].tolist()).serialize() for a, b in _chunks(ints.size, slots)]


def decrypt_ints(ctx: ts.Context, chunks: list[bytes], n: int) -> np.ndarray:
    """Decrypt packed BFV ciphertexts to int64 (centered representatives mod t)."""
    if not ctx.has_secret_key():
        raise ValueError("this context holds no secret key: it cannot decrypt")
    return _decrypt_chunks(ctx, chunks, n, _bfv_slots(ctx), ts.bfv_vector_from, np.int64, "BFV")


# ---------------------------------------------------------------------------- fixed sizes
def padded_size(poly_modulus_degree: int = 8192, levels: int = 3) -> int:
    """A public length every serialized ciphertext of these parameters fits in: two
    polynomials of ``levels`` 64-bit residues per coefficient, plus headroom for headers."""
    return 16 * poly_modulus_degree * levels + 65536


def pad_ciphertext(blob: bytes, size: int | None = None) -> bytes:
    """``blob`` framed to exactly ``size`` bytes (4-byte length, blob, zeros).

    Why: SEAL compresses what it serializes, so a ciphertext's length varies with its
    contents; a receiver must not be able to tell two encryptions apart by length (the
    federated-SVD selection values Enc(0) and Enc(1)).
    """
    size = padded_size() if size is None else int(size)
    if len(blob) + 4 > size:
        raise ValueError(f"ciphertext of {len(blob)} bytes does not fit the padded size {size}")
    return len(blob).to_bytes(4, "big") + blob + bytes(size - 4 - len(blob))


def unpad_ciphertext(framed: bytes) -> bytes:
    """Inverse of :func:`pad_ciphertext`; a clear error for a malformed frame."""
    framed = bytes(framed)
    n = int.from_bytes(framed[:4], "big") if len(framed) >= 4 else -1
    if n < 0 or 4 + n > len(framed):
        raise ValueError(f"malformed padded ciphertext ({len(framed)} bytes)")
    return framed[4:4 + n]
