"""Oblivious selection under the server's CKKS key: sum_i b_i v_i without the nodes learning
b_i (paper 002, Algorithm 2 steps 8-13, with CKKS in place of 3072-bit Paillier).

The server holds the key pair and sends node i one fresh encryption of its selection value
b_i in {0, 1}; the node multiplies its plaintext vector v_i into it, re-randomizes, and
returns the product; the server adds all products and decrypts only the sum.

Why this module and not ``he.py``'s TenSEAL vectors (measured, ``results/fedsvd``):

- Complex packing: a CKKS ciphertext at N = 8192 has 4,096 complex slots; TenSEAL's
  ``CKKSVector`` uses only their real parts. The selection value is real, so b * (x + iy) =
  bx + iby: packing two reals per slot carries N = 8,192 values per ciphertext (3 instead
  of 5 ciphertexts for a 1,682 x 10 noise matrix). TenSEAL's ``sealapi`` encodes complex
  slots, and serializes SEAL objects only through file paths, hence :func:`_save` /
  :func:`_load_ciphertext` (a private temporary file, in memory where ``/dev/shm`` exists).
- No rescaling: the product keeps the scale SELECTION_SCALE x VALUE_SCALE (one plaintext
  product needs no further level), and the fresh encryption of zero is made directly at the
  product's level and scale instead of as Enc(0) x 1.
- Statistical re-randomization: CKKS is not circuit-private. Decrypting node j's product
  Enc(0) x v_j yields v_j * E / SELECTION_SCALE (slot-wise), where E is the error of the
  ciphertext the server made and knows. A fresh Enc(0) adds an error E_z of E's size, which
  masks v_j * E only by the ratio |v_j| (a weak leak for the ~1e-3 weighted noises of the
  paper's setting, a practical one for values near 1) and never statistically. So the
  selection value is encrypted at a large scale (2^108) and the node adds a uniform
  flooding term (AES-CTR keyed from the OS CSPRNG) to every real coordinate, of half-width
  2^(STAT_BITS + 13) times the largest possible leak: the decryptions for two different
  v_j are within statistical distance 2^-STAT_BITS per ciphertext. The flooding adds at
  most 2.6e-9 per value per node to the decrypted sum (CKKS itself adds ~1e-9).

Semi-honest server (the paper's model): the leak bound assumes the selection ciphertext is
a fresh SEAL encryption (|E| per slot measured <= 2^14 here; ERROR_BOUND = 2^20). A node
checks the context's parameters and the ciphertext's level and scale, which it can; it
cannot check E without the secret key.
"""

from __future__ import annotations

import hashlib
import math
import os
import tempfile
from dataclasses import dataclass

import numpy as np
import tenseal as ts
import tenseal.sealapi as sa

from fedrec.secure.he import (
    CkksParams,
    load_context,
    make_secret_context,
    pad_ciphertext,
    padded_size,
    public_context_bytes,
    unpad_ciphertext,
)
from fedrec.secure.randomness import csprng_uniform

#: N = 8192 and 218 bits of coefficient modulus (the 128-bit-security maximum at N = 8192):
#: one 158-bit data level holds SELECTION_SCALE x VALUE_SCALE x 2^8 with a bit to spare.
PARAMS = CkksParams(poly_modulus_degree=8192, coeff_mod_bit_sizes=(60, 49, 49, 60),
                    global_scale=2.0**40)
SELECTION_SCALE = 2.0**108
VALUE_SCALE = 2.0**40
#: |v_i| a node may put in (each coordinate); the SUM over nodes must stay below 2^7, which
#: callers guarantee (fedsvd: weighted values, weights summing to 1).
VALUE_BOUND = 64.0
#: Bound on |E| per complex slot of a fresh selection ciphertext (measured max 2^14).
ERROR_BOUND = 2.0**20
#: Statistical distance per ciphertext between the decryptions of two node vectors.
STAT_BITS = 40
#: Real values per ciphertext: N / 2 complex slots, two reals each.
REALS = PARAMS.poly_modulus_degree


def flood_width() -> float:
    """Half-width B of the node's uniform flooding per real coordinate: the leak per complex
    slot is <= sqrt(2) VALUE_BOUND ERROR_BOUND / SELECTION_SCALE; B = 2^(STAT_BITS + 13) x
    that makes sum over the 2^13 coordinates of leak / (2B) <= 2^-(STAT_BITS + 1)."""
    leak = math.sqrt(2.0) * VALUE_BOUND * ERROR_BOUND / SELECTION_SCALE
    return 2.0 ** (STAT_BITS + 13) * leak


def chunks_for(n_values: int) -> int:
    """Ciphertexts per node for ``n_values`` reals."""
    return -(-n_values // REALS)


# ----------------------------------------------------------------------------- server side
def make_context() -> ts.Context:
    """The server's key pair for the selection (secret key inside; never sent)."""
    return make_secret_context(PARAMS)


def selection_ciphertext(ctx: ts.Context, bit: int) -> bytes:
    """A fresh encryption of ``bit`` in every slot at SELECTION_SCALE, padded to one length
    (SEAL compresses, so Enc(0) and Enc(1) could differ in size)."""
    if bit not in (0, 1):
        raise ValueError("a selection value is 0 or 1")
    vec = ts.ckks_vector(ctx, [float(bit)] * (REALS // 2), scale=SELECTION_SCALE)
    return pad_ciphertext(vec.serialize(), padded_size(PARAMS.poly_modulus_degree))


class ProductSum:
    """The server's running sum of the nodes' products (one list of ciphertexts per node)
    and its single decryption."""

    def __init__(self, ctx: ts.Context, n_values: int) -> None:
        self.ctx, self.n_values = ctx, int(n_values)
        self.seal = ctx.seal_context().data
        self.evaluator = sa.Evaluator(self.seal)
        self.total: list | None = None
        self.count = 0

    def add(self, products: list[bytes], who: str = "a node") -> None:
        expected = chunks_for(self.n_values)
        if len(products) != expected:
            raise ValueError(f"{who} sent {len(products)} product ciphertexts, expected "
                             f"{expected}")
        cts = [_load_ciphertext(self.seal, bytes(b), who) for b in products]
        for ct in cts:
            if ct.size() != 2 or ct.scale != SELECTION_SCALE * VALUE_SCALE or \
                    ct.parms_id() != self.seal.first_parms_id():
                raise ValueError(f"{who}'s product is not a 2-part ciphertext at the "
                                 "selection's level and scale")
        if self.total is None:
            self.total = cts
        else:
            for acc, ct in zip(self.total, cts):
                self.evaluator.add_inplace(acc, ct)
        self.count += 1

    def decrypt(self) -> np.ndarray:
        """sum_i b_i v_i (length ``n_values``), from one decryption per ciphertext."""
        if self.total is None:
            raise ValueError("no product was added")
        decryptor = sa.Decryptor(self.seal, self.ctx.secret_key().data)
        encoder = sa.CKKSEncoder(self.seal)
        out = []
        for ct in self.total:
            pt = sa.Plaintext()
            decryptor.decrypt(ct, pt)
            slots = np.asarray(encoder.decode_complex(pt))
            out.append(np.concatenate([slots.real, slots.imag]))
        return np.concatenate(out)[:self.n_values]


# ----------------------------------------------------------------------------- node side
@dataclass
class NodeSelection:
    """A node's view of one public context: checked once (public, expected parameters),
    then reused for every product while the context stays the same (``context_hash``)."""

    context_hash: str
    ctx: ts.Context

    @classmethod
    def load(cls, public: bytes) -> NodeSelection:
        ctx = load_context(public)
        if ctx.has_secret_key():
            raise ValueError("the selection context must be public (it holds a secret key)")
        parms = ctx.seal_context().data.key_context_data().parms()
        bits = [m.bit_count() for m in parms.coeff_modulus()]
        if parms.poly_modulus_degree() != PARAMS.poly_modulus_degree or \
                tuple(bits) != PARAMS.coeff_mod_bit_sizes or \
                parms.scheme().name != "CKKS":
            raise ValueError("the selection context does not have the expected CKKS "
                             f"parameters (N = {PARAMS.poly_modulus_degree}, coefficient "
                             f"modulus bits {PARAMS.coeff_mod_bit_sizes})")
        return cls(context_hash_of(public), ctx)

    def __post_init__(self) -> None:
        self.seal = self.ctx.seal_context().data
        self.encoder = sa.CKKSEncoder(self.seal)
        self.evaluator = sa.Evaluator(self.seal)
        self.encryptor = self.ctx.encryptor().data

    def product(self, selection: bytes, values: np.ndarray) -> list[bytes]:
        """Enc(b) x values, re-randomized with a fresh Enc(0) and flooded, as serialized
        ciphertexts (``chunks_for(values.size)`` of them)."""
        flat = np.asarray(values, dtype=np.float64).ravel()
        if not np.all(np.isfinite(flat)) or (flat.size and np.abs(flat).max() > VALUE_BOUND):
            raise ValueError(f"values for the selection product must be finite and within "
                             f"+-{VALUE_BOUND:g}")
        sel = ts.ckks_vector_from(self.ctx, unpad_ciphertext(selection)).ciphertext()[0]
        if sel.size() != 2 or sel.scale != SELECTION_SCALE or \
                sel.parms_id() != self.seal.first_parms_id():
            raise ValueError("the selection ciphertext is not a fresh 2-part ciphertext at "
                             "the first level and the selection scale")
        n = chunks_for(flat.size)
        padded = np.zeros(n * REALS)
        padded[:flat.size] = flat
        half = REALS // 2
        scale = SELECTION_SCALE * VALUE_SCALE
        width = flood_width()
        out = []
        for c in range(n):
            part = padded[c * REALS:(c + 1) * REALS]
            pt = sa.Plaintext()
            prod = sa.Ciphertext(self.seal)
            self.encryptor.encrypt_zero(sel.parms_id(), prod)
            prod.scale = scale
            if part.any():  # SEAL refuses a product with an all-zero plaintext (0 x Enc(b) = 0)
                self.encoder.encode((part[:half] + 1j * part[half:]).tolist(), sel.parms_id(),
                                    VALUE_SCALE, pt)
                product = sa.Ciphertext(self.seal)
                self.evaluator.multiply_plain(sel, pt, product)
                self.evaluator.add_inplace(prod, product)
            flood = _uniform(REALS, width)
            self.encoder.encode((flood[:half] + 1j * flood[half:]).tolist(), sel.parms_id(),
                                scale, pt)
            self.evaluator.add_plain_inplace(prod, pt)
            out.append(_save(prod))
        return out


def context_hash_of(public: bytes) -> str:
    """SHA-256 of a serialized context: the key a node caches its checked context under."""
    return hashlib.sha256(bytes(public)).hexdigest()


def _uniform(n: int, width: float) -> np.ndarray:
    """n values uniform on (-width, width), unpredictable to the server
    (``fedrec/secure/randomness.py``: AES-256-CTR keyed from the OS CSPRNG)."""
    return (2.0 * csprng_uniform(n) - 1.0) * width


# ----------------------------------------------------------------------------- transport
def _tmpdir() -> str | None:
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None


def _save(ct) -> bytes:
    """SEAL's own serialization of a ciphertext (``sealapi`` writes only to a path)."""
    fd, path = tempfile.mkstemp(prefix="seal-", dir=_tmpdir())
    os.close(fd)
    try:
        ct.save(path)
        with open(path, "rb") as fh:
            return fh.read()
    finally:
        os.unlink(path)


def _load_ciphertext(seal_context, data: bytes, who: str):
    """A ciphertext from :func:`_save` bytes, validated by SEAL against the context."""
    fd, path = tempfile.mkstemp(prefix="seal-", dir=_tmpdir())
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        ct = sa.Ciphertext(seal_context)
        try:
            ct.load(seal_context, path)
        except Exception as err:  # SEAL raises bare errors on malformed or foreign data
            raise ValueError(f"{who} sent a malformed product ciphertext ({len(data)} bytes)"
                             ) from err
        return ct
    finally:
        os.unlink(path)


__all__ = ["PARAMS", "SELECTION_SCALE", "VALUE_SCALE", "VALUE_BOUND", "ERROR_BOUND",
           "STAT_BITS", "REALS", "flood_width", "chunks_for", "make_context",
           "selection_ciphertext", "ProductSum", "NodeSelection", "context_hash_of",
           "public_context_bytes"]
