"""Shared-secret relay: one node creates a secret, every other node receives it sealed, the
server sees only ciphertexts and fingerprints.

Used for the secrets the papers let nodes share but not the server: LP-GCN's key S, the CKKS
secret context of PrivMVMF and of the ``ckks`` aggregator. The secret travels through the
sealed relay (``fedrec/secure/sealed.py``): AES-256-GCM under the owner-recipient X25519 key,
bound to sender, recipient, run, round and purpose.

Rounds (through :class:`fedrec.transport.messenger.Messenger`; the first only if the run's relay has no
mail keys yet):

1. ``relay_keys`` (``open_mailroom``): every node publishes its mail public key.
2. ``keys_create_secret`` to the owner only: it creates the secret (32 random bytes for
   ``make="random-key"``, a TenSEAL CKKS secret context for ``make="ckks-context"``), keeps
   it, mails one sealed copy to every peer and replies the SHA-256 fingerprint of the secret
   (and for CKKS the *public* context, so the server can add ciphertexts without being able
   to decrypt).
3. ``keys_receive_secret`` to every other node, which receives the owner's mail with it: the
   node opens it (a tampered or misdirected blob fails authentication and the error names
   the owner), stores the secret and replies only its fingerprint.

The server compares fingerprints and raises :class:`RelayError` naming every node whose
fingerprint differs from the owner's. A SHA-256 fingerprint of a 32-byte random key or of a
serialized secret context reveals nothing usable about it.

Client side: ``clients/relay_node.py`` (handlers and :func:`clients.relay_node.get_shared_secret`).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from fedrec.secure.relay import MAKES, secret_mail_purpose
from fedrec.secure.sealed import RelayError
from fedrec.transport.mailroom import open_mailroom
from fedrec.transport.messenger import Messenger
from fedrec.wire.keyrelay import Action, CreateSecret, ReceiveSecret, SecretAck, SecretCreated

__all__ = ["RelayResult", "relay_secret"]


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


def relay_secret(messenger: Messenger, nodes: list[int], *, purpose: str,
                 owner: int | None = None, seed: int = 0,
                 make: str = "random-key") -> RelayResult:
    """Have one node create a secret and relay it, sealed, to every other node.

    Args:
        messenger: the server's Messenger.
        nodes: node ids that must end up holding the secret.
        purpose: name of the secret (e.g. ``"lpgcn-S"``, ``"privmvmf-ckks"``); nodes store it
            under ``secret.<purpose>`` and protocol handlers read it with
            :func:`clients.relay_node.get_shared_secret`.
        owner: node that creates the secret; None picks one with ``random.Random(seed)``.
        seed: seeds the owner choice only (the secret itself comes from the OS CSPRNG).
        make: ``"random-key"`` (32 random bytes) or ``"ckks-context"`` (TenSEAL CKKS secret
            context, serialized with ``fedrec.secure.he.secret_context_bytes``).

    Returns:
        :class:`RelayResult` (owner id, public CKKS context for ``"ckks-context"``).

    Raises:
        ValueError on bad arguments, :class:`RelayError` when nodes disagree on the secret,
        :class:`fedrec.transport.messenger.NodeError` when a node fails (e.g. authentication).
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
    open_mailroom(messenger, nodes)
    peers = [n for n in nodes if n != owner]

    # 2. the owner creates the secret and mails one sealed copy per peer
    create = CreateSecret(purpose=purpose, make=make, peers=peers)
    created = SecretCreated.from_records(
        messenger.send(Action.CREATE, {owner: create.to_records()}, phase=phase)[owner],
        messenger.label(owner))
    fingerprint = created.fingerprint
    public_ctx = created.public_context if make == "ckks-context" else None
    if make == "ckks-context" and public_ctx is None:
        raise RelayError(f"owner {messenger.label(owner)} sent no public CKKS context")
    room = messenger.mailroom
    sent = {r.recipient for r in (room.view if room else [])
            if r.sender == owner and r.purpose == secret_mail_purpose(purpose)}
    missing = [n for n in peers if n not in sent]
    if missing:
        raise RelayError(f"owner {messenger.label(owner)} sent no sealed secret for "
                         f"{', '.join(messenger.label(n) for n in missing)}")

    # 3. every other node opens its mail and acknowledges with the fingerprint only
    if peers:
        receive = ReceiveSecret(purpose=purpose, make=make, owner=owner)
        acks = messenger.broadcast(Action.RECEIVE, receive.to_records(), peers, phase=phase)
        bad = sorted(n for n, reply in acks.items()
                     if SecretAck.from_records(reply, messenger.label(n)).fingerprint
                     != fingerprint)
        if bad:
            raise RelayError(
                f"relayed secret '{purpose}': fingerprint of "
                f"{', '.join(messenger.label(n) for n in bad)} differs from owner "
                f"{messenger.label(owner)}'s; the nodes do not share one secret"
            )
    return RelayResult(owner=owner, public_context=public_ctx, fingerprint=fingerprint)
