"""Node key pairs, pairwise keys, authenticated encryption and Shamir shares.

Why: secure aggregation needs (a) a pairwise secret per pair of nodes from a key agreement
the server cannot complete, (b) authenticated encryption so that the server can relay
shares and shared secrets (LP-GCN's S, the CKKS secret context) without reading or altering
them, and (c) threshold sharing for dropout recovery.

Choices:

- X25519 (``cryptography``) for key agreement: 32-byte public keys, constant time, no
  point validation pitfalls; the raw shared secret is never used directly but passed
  through HKDF-SHA256 with a caller-supplied ``context`` (run id, purpose) so that keys of
  different runs and purposes are independent. flwr 1.42.0's SecAgg+ uses ECDH on P-384 via
  ``flwr.supercore.primitives.asymmetric``; we use X25519 because the project needs only
  our own protocol to interoperate with itself.
- AES-256-GCM for sealing (random 12-byte nonce prepended; 16-byte tag appended). Flower's
  ``symmetric_encryption.encrypt`` is Fernet (AES-128-CBC + HMAC) without associated data;
  we need associated data to bind a blob to (sender, recipient, run, round, purpose; see
  ``sealed.py``), so that the relaying server cannot swap blobs between recipients or
  replay them into another run. Random
  96-bit nonces are safe for far more than the < 2^32 messages a key seals here.
- Shamir shares over GF(2^31 - 1), vectorized (``shamir.py``; Flower's GF(2^128)
  ``crypto.shamir`` runs one share at a time in Python and dominated SecAgg+ at 100 nodes).
  Combining too few shares would silently yield garbage, so :func:`split_secret` prefixes
  each share with a header (version, threshold, secret length) and :func:`combine_secret`
  refuses to combine fewer than threshold. Shares are not authenticated by themselves; they
  travel sealed (the sealed relay) in the protocol.

Cryptographic keys come from the OS CSPRNG, never from the run's ``seed``: determinism of
the numeric results does not depend on them because masks cancel exactly.
"""

from __future__ import annotations

import os

import numpy as np
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import (
    X25519PrivateKey,
    X25519PublicKey,
)
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from fedrec.secure import shamir

__all__ = [
    "AuthenticationError",
    "NodeKeys",
    "seal",
    "open_sealed",
    "split_secret",
    "split_secrets",
    "combine_secret",
]

_PAIRWISE_INFO = b"fedrec-privacy/pairwise/v1|"
_NONCE_LEN = 12
_TAG_LEN = 16
_SHARE_VERSION = 2
_SHARE_HEADER = 5  # version (1 byte) || threshold (2 bytes BE) || secret length (2 bytes BE)


class AuthenticationError(ValueError):
    """A sealed blob failed authentication: tampered, wrong key, or wrong associated data."""


# ---------------------------------------------------------------------------- key pairs
class NodeKeys:
    """A node's X25519 key pair.

    Create with ``NodeKeys()`` (fresh key from the OS CSPRNG) or restore one saved in the
    node's state with ``NodeKeys.from_private_bytes(b)``.
    """

    def __init__(self, private_key: X25519PrivateKey | None = None) -> None:
        self._private = private_key if private_key is not None else X25519PrivateKey.generate()
        self._public = self._private.public_key()

    @classmethod
    def from_private_bytes(cls, data: bytes) -> "NodeKeys":
        """Restore keys from the 32 raw private bytes of :meth:`private_bytes`."""
        if len(data) != 32:
            raise ValueError(f"X25519 private key must be 32 bytes, got {len(data)}")
        return cls(X25519PrivateKey.from_private_bytes(bytes(data)))

    def private_bytes(self) -> bytes:
        """Raw 32-byte private key, for the node's own persistent state only."""
        return self._private.private_bytes(
            serialization.Encoding.Raw,
            serialization.PrivateFormat.Raw,
            serialization.NoEncryption(),
        )

    def public_bytes(self) -> bytes:
        """Raw 32-byte public key, safe to publish through the server."""
        return self._public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)

    def shared_key(self, peer_public: bytes, context: bytes) -> bytes:
        """32-byte key shared with the owner of ``peer_public``: HKDF-SHA256(X25519(a, B)).

        ``info = "fedrec-privacy/pairwise/v1|" || context``. Both sides get the same key only
        if they pass the same ``context``, so the context must not depend on who calls
        (e.g. use the run id and a purpose label, not "my id || your id").
        """
        if not isinstance(context, (bytes, bytearray)):
            raise TypeError(f"context must be bytes, got {type(context).__name__}")
        if len(peer_public) != 32:
            raise ValueError(f"X25519 public key must be 32 bytes, got {len(peer_public)}")
        try:
            raw = self._private.exchange(X25519PublicKey.from_public_bytes(bytes(peer_public)))
        except ValueError as err:  # all-zero output from a small-order point
            raise ValueError(f"invalid peer public key: {err}") from err
        return HKDF(
            algorithm=hashes.SHA256(), length=32, salt=None, info=_PAIRWISE_INFO + bytes(context)
        ).derive(raw)


# ---------------------------------------------------------------------------- sealing
def seal(key: bytes, plaintext: bytes, aad: bytes) -> bytes:
    """AES-256-GCM encrypt: ``nonce(12) || ciphertext || tag(16)``; ``aad`` is authenticated."""
    if len(key) != 32:
        raise ValueError(f"sealing key must be 32 bytes, got {len(key)}")
    nonce = os.urandom(_NONCE_LEN)
    return nonce + AESGCM(bytes(key)).encrypt(nonce, bytes(plaintext), bytes(aad))


def open_sealed(key: bytes, ciphertext: bytes, aad: bytes) -> bytes:
    """Decrypt a :func:`seal` blob; raise :class:`AuthenticationError` if it does not verify."""
    if len(key) != 32:
        raise ValueError(f"sealing key must be 32 bytes, got {len(key)}")
    if len(ciphertext) < _NONCE_LEN + _TAG_LEN:
        raise AuthenticationError(
            f"sealed blob too short ({len(ciphertext)} bytes; at least {_NONCE_LEN + _TAG_LEN})"
        )
    nonce, body = bytes(ciphertext[:_NONCE_LEN]), bytes(ciphertext[_NONCE_LEN:])
    try:
        return AESGCM(bytes(key)).decrypt(nonce, body, bytes(aad))
    except InvalidTag:
        raise AuthenticationError(
            "sealed blob failed authentication (AES-GCM tag mismatch): the ciphertext was "
            "altered, or it was sealed under a different key or associated data "
            f"({len(ciphertext)} bytes, aad {len(aad)} bytes)"
        ) from None


# ---------------------------------------------------------------------------- Shamir
def split_secret(secret: bytes, threshold: int, n: int) -> list[bytes]:
    """Split ``secret`` into ``n`` shares, any ``threshold`` of which reconstruct it.

    Share format: ``version(1) || threshold(2, BE) || length(2, BE) || holder x(2, BE) ||
    limbs (uint32 LE)``, the limbs being the GF(2^31 - 1) values of :mod:`fedrec.secure.shamir`.
    """
    return split_secrets([secret], threshold, n)[0]


def split_secrets(secrets: list[bytes], threshold: int, n: int) -> list[list[bytes]]:
    """:func:`split_secret` of each of ``secrets`` (all of one length), in one vectorized
    call: ``out[i][x - 1]`` is holder x's share of secret i. Each secret gets its own random
    polynomials, exactly as if split alone (a node shares a batch of seeds per round)."""
    threshold, n = int(threshold), int(n)
    secrets = [bytes(s) for s in secrets]
    if not secrets:
        return []
    size = len(secrets[0])
    if not 1 <= size < 1 << 16:
        raise ValueError(f"secret length must be in [1, 65535] bytes, got {size}")
    if any(len(s) != size for s in secrets):
        raise ValueError("secrets split together must have one length")
    ys = shamir.split(np.stack([shamir.limbs_of(s) for s in secrets]), threshold, n)
    ys = ys.astype("<u4")  # (n, secrets, limbs); every value < 2^31
    header = bytes([_SHARE_VERSION]) + threshold.to_bytes(2, "big") + size.to_bytes(2, "big")
    return [[header + x.to_bytes(2, "big") + ys[x - 1, i].tobytes() for x in range(1, n + 1)]
            for i in range(len(secrets))]


def combine_secret(shares: list[bytes]) -> bytes:
    """Reconstruct the secret from at least ``threshold`` shares of one :func:`split_secret`.

    Raises ``ValueError`` stating the threshold and the count if too few distinct shares
    are given, and on shares from different splits or malformed shares.
    """
    if not shares:
        raise ValueError("no shares given; need at least threshold shares to reconstruct")
    parsed: dict[int, bytes] = {}
    head = bytes(shares[0])[:_SHARE_HEADER]
    for share in shares:
        share = bytes(share)
        if len(share) != len(shares[0]) or len(share) < _SHARE_HEADER + 2 + 4 \
                or (len(share) - _SHARE_HEADER - 2) % 4:
            raise ValueError(f"malformed Shamir share ({len(share)} bytes) or shares of "
                             "different secrets")
        if share[0] != _SHARE_VERSION:
            raise ValueError(f"unknown Shamir share version {share[0]}")
        if share[:_SHARE_HEADER] != head:
            raise ValueError("shares disagree on the threshold or the secret's length")
        x = int.from_bytes(share[_SHARE_HEADER:_SHARE_HEADER + 2], "big")
        body = share[_SHARE_HEADER + 2:]
        if x in parsed and parsed[x] != body:
            raise ValueError(f"two different shares carry the same index {x}")
        parsed[x] = body
    threshold = int.from_bytes(head[1:3], "big")
    nbytes = int.from_bytes(head[3:5], "big")
    if len(parsed) < threshold:
        raise ValueError(
            f"too few Shamir shares: threshold is {threshold}, got {len(parsed)} distinct share(s)"
        )
    # Any `threshold` shares determine the polynomials; use exactly that many.
    xs = sorted(parsed)[:threshold]
    ys = np.stack([np.frombuffer(parsed[x], dtype="<u4").astype(np.int64) for x in xs])
    return shamir.secret_of(shamir.combine(xs, ys), nbytes)
