"""Client side of the shared-secret relay (see ``fedrec/secure/relay.py`` for the protocol).

State kept in this node's ``context.state`` (never sent anywhere): one typed
:class:`SharedSecret` per purpose (``clients/state.py``, keyed by the purpose: record
``secret.<purpose>``), checked field by field whenever it is read back.

Protocol handlers read the secret with :func:`get_shared_secret` (bytes) or, for a relayed
CKKS context, :func:`get_shared_context` (a TenSEAL context holding the secret key).

The diagnostic actions that use a relayed secret on the server's input (``keys_prove``: an
HMAC of a server-chosen challenge; ``keys_ckks_selftest``: decrypts what the server sends)
are oracles, so they live in ``clients/diagnostics.py``, which a production ClientApp does
not load.
"""

from __future__ import annotations

import hashlib
import secrets

from flwr.app import RecordDict

from clients.handlers import handler
from clients.node import NodeContext
from clients.state import NodeState, state_keys
from fedrec.records import config_record
from fedrec.secure.relay import MAKES, RelayError, secret_mail_purpose
from fedrec.wire.keyrelay import (
    RELAY_KEY,
    Action,
    CreateSecret,
    ReceiveSecret,
    RelayRequest,
    SecretAck,
    SecretCreated,
)
from fedrec.wire.message import Message, message, reply, wire_fields

__all__ = ["SharedSecret", "get_shared_secret", "get_shared_context", "secret_fingerprint"]

#: fingerprint -> loaded TenSEAL context (this process), oldest dropped first: each context is
#: about 10 MiB native, so the cache is bounded whatever the server relays.
_CONTEXT_CACHE: dict[bytes, object] = {}
_CONTEXT_CACHE_SIZE = 2
#: Secrets a node keeps per run: the purposes are the server's names, and each kept secret
#: (a CKKS context: 0.7 MB, about 10 MiB once loaded) outlives the request that brought it.
#: A run of this project relays at most two (LP-GCN's key, the CKKS sums' context).
MAX_SECRETS = 4


# Typed so a corrupted or stale record is refused on reload naming the field, never used.
@message()
class SharedSecret(Message):
    """A relayed secret this node keeps, one per purpose (node-state record
    ``secret.<purpose>``: the state keyed by its purpose, fields as they always were)."""

    CONFIG = "secret"  # kept under "secret.<purpose>"
    ARRAYS = "secret-arrays"  # none: a node state names its own records

    secret: bytes = reply(doc="the secret: a random key or a serialized CKKS secret context")
    make: str = reply(doc="what kind it is (fedrec.secure.relay.MAKES)")
    owner: int = reply(doc="the node that created it")
    fingerprint: bytes = reply(doc="its SHA-256, what the node reports instead")

    def __repr__(self) -> str:  # a traceback or log line never shows the secret
        return f"SharedSecret(make={self.make!r}, owner={self.owner}, secret=<hidden>)"


def _wire_name(cls: type[Message], attr: str) -> str:
    """The wire name of ``cls``'s field ``attr``, for a refusal that names the field."""
    return next(f.name for f in wire_fields(cls) if f.attr == attr)


#: The owner's peer list (bounded by its length before it is read), and the fields a
#: refusal names: ``relay.purpose``, ``relay.peers``.
_PEERS = _wire_name(CreateSecret, "peers")
_PURPOSE_FIELD = f"{RELAY_KEY}.{_wire_name(RelayRequest, 'purpose')}"
_PEERS_FIELD = f"{RELAY_KEY}.{_PEERS}"


def secret_fingerprint(secret: bytes) -> bytes:
    """SHA-256 of the secret: what a node reports instead of the secret itself."""
    return hashlib.sha256(bytes(secret)).digest()


def _held(state: RecordDict, purpose: str, who: str) -> SharedSecret:
    """The secret kept for ``purpose``, checked; :class:`RelayError` if the relay for
    ``purpose`` has not run on this node."""
    kept = NodeState(state, who).load_state(SharedSecret, purpose)
    if kept is None:
        held = sorted(state_keys(state, SharedSecret))
        raise RelayError(
            f"no shared secret '{purpose}' on this node (holds: {held or 'none'}); the server "
            f"must run fedrec.secure.relay.relay_secret(purpose={purpose!r}) first"
        )
    return kept


def get_shared_secret(state: RecordDict, purpose: str, who: str = "this node") -> bytes:
    """The secret relayed for ``purpose`` (raw bytes), from this node's state (``who``
    names the node if its record is refused as corrupted).

    Raises :class:`fedrec.secure.relay.RelayError` if the relay for ``purpose`` has not run
    on this node (the server must call ``relay_secret(..., purpose=...)`` first).
    """
    return _held(state, purpose, who).secret


def get_shared_context(state: RecordDict, purpose: str, who: str = "this node"):
    """The relayed CKKS secret context for ``purpose`` as a TenSEAL context (cached)."""
    from fedrec.secure.he import load_context

    kept = _held(state, purpose, who)
    if kept.make != "ckks-context":
        raise RelayError(f"shared secret '{purpose}' is a {kept.make}, not a CKKS context")
    secret = kept.secret
    fp = secret_fingerprint(secret)
    if fp not in _CONTEXT_CACHE:
        while len(_CONTEXT_CACHE) >= _CONTEXT_CACHE_SIZE:
            _CONTEXT_CACHE.pop(next(iter(_CONTEXT_CACHE)))
        _CONTEXT_CACHE[fp] = load_context(secret)
    return _CONTEXT_CACHE[fp]


def _room_for(node: NodeContext, purpose: str) -> None:
    """Refuse a new purpose past :data:`MAX_SECRETS` (checked before any secret is made)."""
    held = state_keys(node.state, SharedSecret)
    if purpose not in held and len(held) >= MAX_SECRETS:
        raise RelayError(f"{node.who} refuses a secret for field '{_PURPOSE_FIELD}': it "
                         f"keeps at most {MAX_SECRETS} relayed secrets per run")


def _store_secret(node: NodeContext, purpose: str, make: str, owner: int, secret: bytes) -> bytes:
    fp = secret_fingerprint(secret)
    node.save_state(SharedSecret(secret=secret, make=make, owner=int(owner), fingerprint=fp),
                    purpose)
    return fp


def _make_secret(make: str) -> tuple[bytes, bytes | None]:
    """(secret bytes, public context bytes or None) for a new secret of kind ``make``."""
    if make == "random-key":
        return secrets.token_bytes(32), None
    if make == "ckks-context":
        from fedrec.secure.he import (
            make_secret_context,
            public_context_bytes,
            secret_context_bytes,
        )

        ctx = make_secret_context()
        return secret_context_bytes(ctx), public_context_bytes(ctx)
    raise RelayError(f"unknown secret kind {make!r}; expected one of {MAKES}")


#: Bytes a sealed copy adds to its payload in the reply (nonce, tag, its key), and a listed
#: peer's copies while the list is checked (the list's length is the server's choice).
_MAIL_OVERHEAD, _PEER_BYTES = 160, 64


def _read_create(node: NodeContext) -> CreateSecret:
    """The owner's request, its peers distinct and other than itself: the list is no longer
    than the roster and its copies are reserved before they exist -- both checked on the
    list's length before the typed read copies it -- and no peer gets two copies (each a
    sealing's time)."""
    record = config_record(node.request, CreateSecret.CONFIG)
    listed = record.get(_PEERS) if record is not None else None
    if isinstance(listed, list):
        node.identity.bound_nodes(len(listed), f"{node.who} refuses to create a secret",
                                  f"field '{_PEERS_FIELD}'", RelayError)
        node.reserve(_PEER_BYTES * len(listed), "the relay's peer list")
    req = node.read(CreateSecret)
    if len(set(req.peers)) != len(req.peers) or node.context.node_id in req.peers:
        raise RelayError(f"{node.who} refuses to create a secret: field '{_PEERS_FIELD}' "
                         "must list distinct node ids other than this node")
    return req


@handler(Action.CREATE)
def create_secret(content: RecordDict, node: NodeContext) -> RecordDict:
    """Round 2 (owner only): create the secret, keep it, mail a sealed copy to every peer."""
    req = _read_create(node)
    _room_for(node, req.purpose)
    secret, public_ctx = _make_secret(req.make)
    # one sealed copy per peer leaves with the reply (nonce and tag, and its mail key)
    node.reserve(len(req.peers) * (len(secret) + _MAIL_OVERHEAD),
                 f"sealed copies of the secret for {len(req.peers)} peers")
    fp = _store_secret(node, req.purpose, req.make, node.context.node_id, secret)
    for peer in req.peers:
        node.mailbox.send(peer, secret_mail_purpose(req.purpose), secret)
    return SecretCreated(fingerprint=fp, public_context=public_ctx).to_records()


@handler(Action.RECEIVE)
def receive_secret(content: RecordDict, node: NodeContext) -> RecordDict:
    """Round 3: open the owner's sealed secret, keep it, acknowledge its fingerprint."""
    req = node.read(ReceiveSecret)
    _room_for(node, req.purpose)
    mail = node.mailbox.receive(secret_mail_purpose(req.purpose))  # names a tampering's sender
    if req.owner not in mail:
        raise RelayError(f"node {node.context.node_id} received no secret '{req.purpose}' "
                         f"from its owner, node {req.owner} "
                         f"(mail from: {sorted(mail) or 'nobody'})")
    fp = _store_secret(node, req.purpose, req.make, req.owner, mail[req.owner])
    return SecretAck(fingerprint=fp).to_records()
