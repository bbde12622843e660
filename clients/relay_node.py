"""Client side of the shared-secret relay (see ``fedrec/secure/relay.py`` for the protocol).

State kept in this node's ``context.state`` (never sent anywhere):

- ``secret.<purpose>`` ConfigRecord: the shared secret (``secret``), what kind it is
  (``make``), who created it (``owner``) and its SHA-256 ``fingerprint``.

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

from flwr.app import ConfigRecord, RecordDict

from clients.handlers import handler
from clients.node import NodeContext
from fedrec.records import config_record
from fedrec.secure.relay import MAKES, RelayError, secret_mail_purpose
from fedrec.wire import keyrelay as relay_wire
from fedrec.wire.keyrelay import RELAY_KEY, Action

__all__ = ["get_shared_secret", "get_shared_context", "secret_fingerprint"]

#: fingerprint -> loaded TenSEAL context (this process), oldest dropped first: each context is
#: about 10 MiB native, so the cache is bounded whatever the server relays.
_CONTEXT_CACHE: dict[bytes, object] = {}
_CONTEXT_CACHE_SIZE = 2
#: Secrets a node keeps per run: the purposes are the server's names, and each kept secret
#: (a CKKS context: 0.7 MB, about 10 MiB once loaded) outlives the request that brought it.
#: A run of this project relays at most two (LP-GCN's key, the CKKS sums' context).
MAX_SECRETS = 4


def _secret_key(purpose: str) -> str:
    return f"secret.{purpose}"


def secret_fingerprint(secret: bytes) -> bytes:
    """SHA-256 of the secret: what a node reports instead of the secret itself."""
    return hashlib.sha256(bytes(secret)).digest()


def get_shared_secret(state: RecordDict, purpose: str) -> bytes:
    """The secret relayed for ``purpose`` (raw bytes), from this node's state.

    Raises :class:`fedrec.secure.relay.RelayError` if the relay for ``purpose`` has not run
    on this node (the server must call ``relay_secret(..., purpose=...)`` first).
    """
    key = _secret_key(purpose)
    record = config_record(state, key)
    if record is None:
        held = sorted(k.removeprefix("secret.") for k in state
                      if k.startswith("secret.") and config_record(state, k) is not None)
        raise RelayError(
            f"no shared secret '{purpose}' on this node (holds: {held or 'none'}); the server "
            f"must run fedrec.secure.relay.relay_secret(purpose={purpose!r}) first"
        )
    return bytes(record["secret"])


def get_shared_context(state: RecordDict, purpose: str):
    """The relayed CKKS secret context for ``purpose`` as a TenSEAL context (cached)."""
    from fedrec.secure.he import load_context

    record = config_record(state, _secret_key(purpose))
    if record is not None and str(record["make"]) != "ckks-context":
        raise RelayError(f"shared secret '{purpose}' is a {record['make']}, not a CKKS context")
    secret = get_shared_secret(state, purpose)
    fp = secret_fingerprint(secret)
    if fp not in _CONTEXT_CACHE:
        while len(_CONTEXT_CACHE) >= _CONTEXT_CACHE_SIZE:
            _CONTEXT_CACHE.pop(next(iter(_CONTEXT_CACHE)))
        _CONTEXT_CACHE[fp] = load_context(secret)
    return _CONTEXT_CACHE[fp]


def _cfg(content: RecordDict) -> ConfigRecord:
    if RELAY_KEY not in content.config_records:
        raise RelayError(f"relay message has no '{RELAY_KEY}' ConfigRecord")
    return content.config_records[RELAY_KEY]


def _room_for(node: NodeContext, purpose: str) -> None:
    """Refuse a new purpose past :data:`MAX_SECRETS` (checked before any secret is made)."""
    held = [k for k in node.state if k.startswith("secret.")]
    if _secret_key(purpose) not in held and len(held) >= MAX_SECRETS:
        raise RelayError(f"{node.who} refuses a secret for field '{RELAY_KEY}.purpose': it "
                         f"keeps at most {MAX_SECRETS} relayed secrets per run")


def _store_secret(node: NodeContext, purpose: str, make: str, owner: int, secret: bytes) -> bytes:
    fp = secret_fingerprint(secret)
    node.state[_secret_key(purpose)] = ConfigRecord({
        "secret": secret, "make": make, "owner": int(owner), "fingerprint": fp,
    })
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


def _peers(node: NodeContext, cfg: ConfigRecord) -> list[int]:
    """The peers the owner mails, distinct and other than itself: the list is no longer
    than the roster and its copies are reserved before they exist, and no peer gets two
    copies (each a sealing's time)."""
    listed = cfg["peers"]
    node.identity.bound_nodes(len(listed), f"{node.who} refuses to create a secret",
                              f"field '{RELAY_KEY}.peers'", RelayError)
    node.reserve(_PEER_BYTES * len(listed), "the relay's peer list")
    peers = [int(p) for p in listed]
    if len(set(peers)) != len(peers) or node.context.node_id in peers:
        raise RelayError(f"{node.who} refuses to create a secret: field '{RELAY_KEY}.peers' "
                         "must list distinct node ids other than this node")
    return peers


@handler(Action.CREATE)
def create_secret(content: RecordDict, node: NodeContext) -> RecordDict:
    """Round 2 (owner only): create the secret, keep it, mail a sealed copy to every peer."""
    cfg = _cfg(content)
    purpose, make = str(cfg["purpose"]), str(cfg["make"])
    me = node.context.node_id
    peers = _peers(node, cfg)
    _room_for(node, purpose)
    secret, public_ctx = _make_secret(make)
    # one sealed copy per peer leaves with the reply (nonce and tag, and its mail key)
    node.reserve(len(peers) * (len(secret) + _MAIL_OVERHEAD),
                 f"sealed copies of the secret for {len(peers)} peers")
    fp = _store_secret(node, purpose, make, me, secret)
    for peer in peers:
        node.mailbox.send(peer, secret_mail_purpose(purpose), secret)
    created: dict = {"fingerprint": fp}
    if public_ctx is not None:
        created["public-context"] = public_ctx
    return RecordDict({relay_wire.CREATED: ConfigRecord(created)})


@handler(Action.RECEIVE)
def receive_secret(content: RecordDict, node: NodeContext) -> RecordDict:
    """Round 3: open the owner's sealed secret, keep it, acknowledge its fingerprint."""
    cfg = _cfg(content)
    purpose, make, owner = str(cfg["purpose"]), str(cfg["make"]), int(cfg["owner"])
    _room_for(node, purpose)
    mail = node.mailbox.receive(secret_mail_purpose(purpose))  # names a tampering's sender
    if owner not in mail:
        raise RelayError(f"node {node.context.node_id} received no secret '{purpose}' from its "
                         f"owner, node {owner} (mail from: {sorted(mail) or 'nobody'})")
    fp = _store_secret(node, purpose, make, owner, mail[owner])
    return RecordDict({relay_wire.ACK: ConfigRecord({"fingerprint": fp})})
