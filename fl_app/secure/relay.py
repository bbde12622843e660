"""Shared-secret relay: one node creates a secret, the server relays it sealed to the others.

Why: LP-GCN's shared key S and PrivMVMF's CKKS secret context must be known to every client
and never to the server (DESIGN.md section 4, "Keys"). One client (the owner) creates the
secret and seals one copy per peer under the owner-peer X25519 agreement key
(:func:`fl_app.secure.keys.wrap_secret_for_peers`, AES-256-GCM with associated data
binding owner, recipient and purpose). The server only moves public keys and ciphertexts.

Rounds (three synchronous Flower rounds, all through :class:`fl_app.messaging.Messenger`):

1. ``keys_advertise_relay`` to every node: it makes an X25519 key pair for this purpose,
   keeps the private key in its state and replies its public key.
2. ``keys_create_secret`` to the owner only, with every peer's public key: the owner
   creates the secret (32 random bytes for ``make="random-key"``, a TenSEAL CKKS secret
   context for ``make="ckks-context"``), keeps it in its state and replies one sealed blob
   per peer, plus the SHA-256 fingerprint of the secret (and for CKKS the *public* context,
   so the server can add ciphertexts without being able to decrypt).
3. ``keys_receive_secret`` to every other node, with the owner's public key and its blob:
   the node opens it (a tampered or misdirected blob fails authentication and the node's
   error names owner and recipient), stores the secret and replies only its fingerprint.

The server compares fingerprints and raises :class:`RelayError` naming every node whose
fingerprint differs from the owner's. A SHA-256 fingerprint of a 32-byte random key or of a
serialized secret context reveals nothing usable about it.

Client side: ``clients/keyrelay.py`` (handlers and :func:`clients.keyrelay.get_shared_secret`).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from flwr.app import ConfigRecord, RecordDict

from fl_app.messaging import Messenger

__all__ = ["MAKES", "RELAY_KEY", "RelayError", "RelayResult", "relay_secret", "relay_context"]

#: Kinds of secret the owner can create.
MAKES = ("random-key", "ckks-context")
#: ConfigRecord key of relay parameters inside relay messages.
RELAY_KEY = "relay"


class RelayError(RuntimeError):
    """The relay could not establish one secret shared by every node."""


@dataclass(frozen=True)
class RelayResult:
    """Outcome of :func:`relay_secret`.

    ``owner``: the node that created the secret. ``public_context``: for
    ``make="ckks-context"``, the serialized public TenSEAL context (encrypt and add, no
    decryption), else None. ``fingerprint``: SHA-256 of the secret, agreed by every node.
    """

    owner: int
    public_context: bytes | None = None
    fingerprint: bytes = b""


def relay_context(purpose: str) -> bytes:
    """Associated-data / HKDF context binding relayed blobs to this purpose."""
    return b"fedrec-relay|" + purpose.encode()


def relay_secret(messenger: Messenger, nodes: list[int], *, purpose: str,
                 owner: int | None = None, seed: int = 0,
                 make: str = "random-key") -> RelayResult:
    """Have one node create a secret and relay it, sealed, to every other node.

    Args:
        messenger: the server's Messenger.
        nodes: node ids that must end up holding the secret.
        purpose: name of the secret (e.g. ``"lpgcn-S"``, ``"privmvmf-ckks"``); nodes store it
            under ``secret.<purpose>`` and protocol handlers read it with
            :func:`clients.keyrelay.get_shared_secret`.
        owner: node that creates the secret; None picks one with ``random.Random(seed)``.
        seed: seeds the owner choice only (the secret itself comes from the OS CSPRNG).
        make: ``"random-key"`` (32 random bytes) or ``"ckks-context"`` (TenSEAL CKKS secret
            context, serialized with ``fl_app.secure.he.secret_context_bytes``).

    Returns:
        :class:`RelayResult` (owner id, public CKKS context for ``"ckks-context"``).

    Raises:
        ValueError on bad arguments, :class:`RelayError` when nodes disagree on the secret,
        :class:`fl_app.messaging.NodeError` when a node fails (e.g. authentication).
    """
    if make not in MAKES:
        raise ValueError(f"make must be one of {MAKES}, got {make!r}")
    if not purpose or not isinstance(purpose, str):
        raise ValueError(f"purpose must be a non-empty string, got {purpose!r}")
    nodes = sorted(int(n) for n in nodes)
    if not nodes:
        raise ValueError("relay_secret needs at least one node")
    if len(set(nodes)) != len(nodes):
        raise ValueError(f"duplicate node ids in {nodes}")
    if owner is None:
        owner = random.Random(seed).choice(nodes)
    elif int(owner) not in nodes:
        raise ValueError(f"owner {owner} is not one of the nodes {nodes}")
    owner = int(owner)
    phase = f"relay:{purpose}"

    # 1. every node makes a key pair for this purpose and publishes its public key
    replies = messenger.broadcast(
        "keys_advertise_relay",
        RecordDict({RELAY_KEY: ConfigRecord({"purpose": purpose})}),
        nodes, phase=phase,
    )
    pks = {node: bytes(reply.config_records["relay-pk"]["pk"]) for node, reply in replies.items()}
    peers = [n for n in nodes if n != owner]

    # 2. the owner creates the secret and seals one copy per peer
    req = RecordDict({RELAY_KEY: ConfigRecord({
        "purpose": purpose, "make": make,
        "peers": peers, "peer-pks": [pks[n] for n in peers],
    })})
    created = messenger.send("keys_create_secret", {owner: req}, phase=phase)[owner]
    cfg = created.config_records["relay-created"]
    blobs = created.config_records["relay-blobs"]
    fingerprint = bytes(cfg["fingerprint"])
    public_ctx = bytes(cfg["public-context"]) if make == "ckks-context" else None
    missing = [n for n in peers if str(n) not in blobs]
    if missing:
        raise RelayError(f"owner {messenger.label(owner)} sent no sealed secret for "
                         f"{', '.join(messenger.label(n) for n in missing)}")

    # 3. every other node opens its blob and acknowledges with the fingerprint only
    if peers:
        requests = {n: RecordDict({RELAY_KEY: ConfigRecord({
            "purpose": purpose, "make": make, "owner": owner,
            "owner-pk": pks[owner], "blob": bytes(blobs[str(n)]),
        })}) for n in peers}
        acks = messenger.send("keys_receive_secret", requests, phase=phase)
        bad = sorted(n for n, reply in acks.items()
                     if bytes(reply.config_records["relay-ack"]["fingerprint"]) != fingerprint)
        if bad:
            raise RelayError(
                f"relayed secret '{purpose}': fingerprint of "
                f"{', '.join(messenger.label(n) for n in bad)} differs from owner "
                f"{messenger.label(owner)}'s; the nodes do not share one secret"
            )
    return RelayResult(owner=owner, public_context=public_ctx, fingerprint=fingerprint)
