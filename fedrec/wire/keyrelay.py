"""The shared-secret relay's wire, declared once for the server
(``fedrec/transport/relay_server.py``) and the node (``clients/relay_node.py``); the kinds of
secret and the sealed-mail purpose are ``fedrec/secure/relay.py``.

The server asks one node, the owner, to create a secret (:class:`CreateSecret`) and mail a
sealed copy to every peer; the owner answers with the secret's fingerprint (and a CKKS
context's public part) in :class:`SecretCreated`. Every peer then opens its copy
(:class:`ReceiveSecret`) and answers with the fingerprint only (:class:`SecretAck`), so the
server checks that all hold one secret without seeing it. Both requests carry their
parameters in :data:`RELAY_KEY`.

Every request field is per round: a run relays several secrets (LP-GCN's key, the CKKS
sums' context), each under its own purpose and kind, so none is fixed for the run.
"""

from __future__ import annotations

from enum import StrEnum

from fedrec.wire.message import Message, message, per_round, reply


class Action(StrEnum):
    """The relay's node actions (``message_type = "query.<action>"``)."""

    CREATE = "keys_create_secret"  # the owner: create, keep, mail sealed copies to the peers
    RECEIVE = "keys_receive_secret"  # each peer: open the owner's copy, keep it, acknowledge


#: ConfigRecord of both requests: ``purpose``, ``make``, and ``peers`` or ``owner``.
RELAY_KEY = "relay"
#: ConfigRecord in the owner's reply: ``fingerprint`` (and ``public-context`` of a CKKS one).
CREATED = "relay-created"
#: ConfigRecord in a peer's reply: ``fingerprint`` of the secret it opened.
ACK = "relay-ack"


@message()
class RelayRequest(Message):
    """What every request about a relayed secret names: which secret (its purpose)."""

    CONFIG = RELAY_KEY

    purpose: str = per_round(doc="the secret's name; nodes keep it under secret.<purpose>")


@message()
class SecretRequest(RelayRequest):
    """A relay round's request: the secret and its kind."""

    make: str = per_round(doc="random-key or ckks-context (fedrec.secure.relay.MAKES)")


@message(Action.CREATE)
class CreateSecret(SecretRequest):
    """To the owner: create a secret of kind ``make``, keep it, mail a copy to each peer."""

    peers: list[int] = per_round(doc="the node ids the owner mails a sealed copy")


@message(Action.RECEIVE)
class ReceiveSecret(SecretRequest):
    """To every peer: open the owner's sealed copy, keep it, acknowledge its fingerprint."""

    owner: int = per_round(doc="the node that created the secret and mailed it")


@message()
class SecretCreated(Message):
    """The owner's reply: the secret's SHA-256 fingerprint, and for a CKKS secret context
    its public part (encrypt and add, never decrypt)."""

    CONFIG = CREATED

    fingerprint: bytes = reply()
    public_context: bytes | None = reply(None)


@message()
class SecretAck(Message):
    """A peer's reply: the fingerprint of the secret it opened (never the secret)."""

    CONFIG = ACK

    fingerprint: bytes = reply()
