"""Cryptographic mask expansion for secure aggregation.

Why this module exists: secure aggregation hides each client's vector behind masks that
cancel in the sum (pairwise masks) or are removed after the fact (self masks). The masks
must be computationally indistinguishable from uniform noise to anyone who does not hold
the key. Flower's ``secaggplus_utils.pseudo_rand_gen`` XOR-folds the key into a 32-bit seed
for numpy's Mersenne Twister, so 2^32 guesses recover any mask (flwr issue 7522). We never
use it. Instead a mask is the AES-256-CTR keystream under the *full* 32-byte key, read as
little-endian unsigned integers, which is a PRF-based generator with a 256-bit key.

Derivation (documented so that any party can recompute a mask bit-for-bit):

- key: the 32-byte key as given. A key of any other length (>= 16 bytes) is first
  stretched/compressed to 32 bytes with HKDF-SHA256 (salt none, info
  ``b"fedrec-privacy/expand_mask/v1"``). Keys shorter than 16 bytes are refused: they cannot
  carry 128 bits of entropy.
- counter block (AES-CTR IV, 16 bytes): ``nonce (8 bytes) || 0x00 * 8``. An ``int`` nonce
  (e.g. the sum id) is encoded as 8 bytes big-endian; a ``bytes`` nonce must be exactly 8
  bytes. The low 64 bits are the block counter starting at 0, so one (key, nonce) pair
  yields up to 2^64 blocks (2^65 uint64 values) before its stream could run into the
  stream of nonce+1; distinct nonces under one key never overlap in practice.
- values: keystream bytes viewed as ``<u8`` (modulus_bits=64) or ``<u4`` widened to uint64
  (modulus_bits=32). Every value is uniform on [0, 2^modulus_bits) because the keystream
  bytes are.

Many sums per key setup: run the pairwise ECDH once, then derive an independent key per
sum with :func:`derive_sum_key` (HKDF with the sum id and a purpose label in ``info``).
Fresh keys per sum mean a mask is never reused even if a caller reuses nonces, and revealing
one sum's key (e.g. the self-mask key revealed in dropout recovery) reveals nothing about
another sum's masks.

Throughput: the keystream is produced by OpenSSL (AES-NI) in 1 MiB chunks written straight
into the output array (``update_into``), measured at several GB/s per core by
``benchmarks/mask_throughput.py``.
"""

from __future__ import annotations

import numpy as np
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

__all__ = ["expand_mask", "derive_sum_key", "counter_block"]

_KEY_LEN = 32
_MIN_KEY_LEN = 16
_EXPAND_INFO = b"fedrec-privacy/expand_mask/v1"
_SUM_KEY_INFO = b"fedrec-privacy/sum-key/v1"
# 1 MiB chunks: large enough to amortise the Python call, small enough to stay in cache.
_CHUNK = 1 << 20
_ZEROS = bytes(_CHUNK)


def _hkdf32(ikm: bytes, info: bytes) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=_KEY_LEN, salt=None, info=info).derive(ikm)


def _normalise_key(key: bytes) -> bytes:
    """Return a 32-byte AES-256 key: the key itself, or HKDF-SHA256 of it if another length."""
    if not isinstance(key, (bytes, bytearray, memoryview)):
        raise TypeError(f"mask key must be bytes, got {type(key).__name__}")
    key = bytes(key)
    if len(key) == _KEY_LEN:
        return key
    if len(key) < _MIN_KEY_LEN:
        raise ValueError(
            f"mask key has {len(key)} bytes; at least {_MIN_KEY_LEN} are required "
            f"(32 are expected; other lengths are stretched with HKDF-SHA256)"
        )
    return _hkdf32(key, _EXPAND_INFO)


def counter_block(nonce: bytes | int) -> bytes:
    """Build the 16-byte AES-CTR initial counter block ``nonce(8 bytes) || 0^8``.

    An int nonce must lie in [0, 2^64) and is encoded big-endian; a bytes nonce must be
    exactly 8 bytes. The zero low half is the block counter, so streams of different nonces
    under the same key are disjoint for the first 2^64 blocks.
    """
    if isinstance(nonce, (bool, np.bool_)):
        raise TypeError("mask nonce must be an int or 8 bytes, not bool")
    if isinstance(nonce, (int, np.integer)):
        nonce = int(nonce)
        if not 0 <= nonce < 1 << 64:
            raise ValueError(f"int mask nonce must be in [0, 2^64), got {nonce}")
        prefix = nonce.to_bytes(8, "big")
    elif isinstance(nonce, (bytes, bytearray, memoryview)):
        prefix = bytes(nonce)
        if len(prefix) != 8:
            raise ValueError(
                f"bytes mask nonce must be exactly 8 bytes, got {len(prefix)}; "
                "pass an int sum id, or derive a fresh key per sum with derive_sum_key"
            )
    else:
        raise TypeError(f"mask nonce must be int or bytes, got {type(nonce).__name__}")
    return prefix + bytes(8)


def expand_mask(key: bytes, nonce: bytes | int, n: int, modulus_bits: int = 64) -> np.ndarray:
    """Expand ``key`` into ``n`` uniform integers mod 2^modulus_bits (dtype uint64).

    Deterministic: the same (key, nonce, n, modulus_bits) gives the same array on every
    machine (little-endian interpretation is fixed). A prefix property holds: the first m
    values of ``expand_mask(k, c, n)`` equal ``expand_mask(k, c, m)`` for m <= n.

    Args:
        key: secret key; 32 bytes used directly as the AES-256 key, other lengths (>= 16)
            are mapped to 32 bytes by HKDF-SHA256.
        nonce: int in [0, 2^64) (e.g. the sum id) or exactly 8 bytes; see module docstring.
        n: number of values (>= 0).
        modulus_bits: 64 (values in [0, 2^64)) or 32 (values in [0, 2^32), still uint64 so
            that sums can be formed without overflow before reduction).

    Returns:
        Writable 1-D ``np.uint64`` array of length n.
    """
    if modulus_bits not in (32, 64):
        raise ValueError(f"modulus_bits must be 32 or 64, got {modulus_bits}")
    n = int(n)
    if n < 0:
        raise ValueError(f"mask length must be >= 0, got {n}")
    aes_key = _normalise_key(key)
    iv = counter_block(nonce)
    width = modulus_bits // 8
    nbytes = n * width
    # 15 spare bytes: update_into demands len(out) >= len(in) + block_size - 1.
    buf = np.empty(nbytes + 15, dtype=np.uint8)
    encryptor = Cipher(algorithms.AES(aes_key), modes.CTR(iv)).encryptor()
    view = memoryview(buf)
    off = 0
    while off < nbytes:
        length = min(_CHUNK, nbytes - off)
        src = _ZEROS if length == _CHUNK else _ZEROS[:length]
        written = encryptor.update_into(src, view[off : off + length + 15])
        off += written
    encryptor.finalize()
    raw = buf[:nbytes]
    if modulus_bits == 64:
        out = raw.view("<u8")
        return out if out.dtype == np.uint64 else out.astype(np.uint64)
    return raw.view("<u4").astype(np.uint64)


def derive_sum_key(shared_key: bytes, sum_id: int, purpose: bytes) -> bytes:
    """Derive the 32-byte mask key for one sum from a long-lived shared key.

    Why: one ECDH key agreement (or one self-mask seed) should serve every sum of a run,
    yet each sum needs masks that are independent of all others. HKDF-SHA256 with
    ``info = "fedrec-privacy/sum-key/v1" || len(purpose) (2 bytes BE) || purpose ||
    sum_id (8 bytes BE)`` gives keys that are independent pseudorandom values for distinct
    (purpose, sum_id) pairs. ``purpose`` separates uses of the same shared key, e.g.
    ``b"pairwise"`` vs ``b"self"`` vs a protocol name; it is length-prefixed so that
    different (purpose, sum_id) pairs can never produce the same info string.

    Args:
        shared_key: the long-lived secret (e.g. a pairwise key from ``keys.NodeKeys``).
        sum_id: int in [0, 2^64), unique per sum within the run.
        purpose: short label (< 65536 bytes).
    """
    if not isinstance(shared_key, (bytes, bytearray)) or len(shared_key) < _MIN_KEY_LEN:
        raise ValueError(f"shared_key must be bytes of length >= {_MIN_KEY_LEN}")
    if not isinstance(purpose, (bytes, bytearray)):
        raise TypeError(f"purpose must be bytes, got {type(purpose).__name__}")
    if len(purpose) >= 1 << 16:
        raise ValueError("purpose label too long (>= 65536 bytes)")
    sum_id = int(sum_id)
    if not 0 <= sum_id < 1 << 64:
        raise ValueError(f"sum_id must be in [0, 2^64), got {sum_id}")
    info = _SUM_KEY_INFO + len(purpose).to_bytes(2, "big") + bytes(purpose) + sum_id.to_bytes(8, "big")
    return _hkdf32(bytes(shared_key), info)
