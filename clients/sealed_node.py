"""Node side of the sealed relay (``fedrec/secure/sealed.py``): this node's mail key
(:func:`new_mail_key`, called by the ``relay_keys`` handler in ``clients/common.py`` and by
``secagg_advertise``), opening and sealing payloads for other nodes.

A handler reads mail with ``node.mailbox.receive(purpose)`` and sends with
``node.mailbox.send(recipient, purpose, payload)``; the ClientApp puts outgoing mail into
the reply. The directory of the other nodes' public mail keys arrives once; every key must
carry its publisher's signature under the roster (``clients/identity_node.py``), no partition may
appear under two node ids, and a later directory that changes a node's key is refused (the
server must not swap keys mid-run).

A peer's mail key is verified once per run, when this node first mails it or opens its
mail, and the pairwise key derived from it is kept in node state for the run's later
messages: both are bound to the exact signed key in the directory, and this node's own mail
key is made once per run (a new one forgets them).

What the server can make a node keep is bounded (issue 43): the directory names at most
the roster's partitions, each claimed partition in the roster; delivered mail is kept
across messages only for a purpose some handler reads (:data:`KEPT_PURPOSES`; other mail is
open to the request that carries it only), at most :data:`MAIL_PER_PARTITION` entries per
roster partition, and the inbox (with what it already holds) within the node's
``memory-budget-mb``. A request past a bound is refused before anything of it is kept.
"""

from __future__ import annotations

import hashlib
from functools import cached_property
from typing import TYPE_CHECKING

from flwr.app import ConfigRecord, RecordDict

from clients.state import NodeState
from fedrec.records import config_record, state_record
from fedrec.secure.identity import SIGNED_KEY_BYTES, SignedKey
from fedrec.secure.keys import AuthenticationError, NodeKeys, open_sealed, seal
from fedrec.secure.relay import secret_mail_purpose
from fedrec.secure.sealed import (
    MAIL_PURPOSE,
    RelayError,
    mail_aad,
    mail_context,
    out_key,
    parse_in_key,
)
from fedrec.secure.secagg import SHARES_PURPOSE
from fedrec.wire.mail import MAIL_DIRECTORY, MAIL_IN, MAIL_OUT, MailRound
from fedrec.wire.message import Message, WireError, message, reply

if TYPE_CHECKING:
    from clients.identity_node import NodeIdentity

KEY_STATE = "relay.key"  # ConfigRecord in node state: this node's mail private key
_DIRECTORY = "relay.known-keys"  # ConfigRecord in node state: {"keys": _pack(node -> key)}
SEEN_STATE = "relay.seen"  # ConfigRecord in node state: mail already opened (replay guard)
_INBOX = "relay.inbox"  # ConfigRecord in node state: mail delivered but not opened yet
_PAIRWISE = "relay.pairwise"  # ConfigRecord in node state: peer's signed key digest -> mail key
_NODE_ID_BYTES = 9  # signed: every uint64 Flower node id fits
#: Bytes a kept mail or directory entry takes besides its key text and payload (the two
#: objects' headers and the record's slot): what the inbox's reservation counts per entry.
_ENTRY_BYTES = 160
#: Mail kept per roster partition at most: a node reads a few purposes from each peer at
#: a time (a secret, a batch of SecAgg+ seed shares, an LP-GCN layer's rows).
MAIL_PER_PARTITION = 16
#: Purpose families some handler reads (a purpose is kept when it starts with one): the
#: key relay's secrets (``clients/relay_node.py``), SecAgg+'s seed shares
#: (``clients/secagg_node.py``), LP-GCN's mail (``clients/lpgcn.py``). Handlers outside
#: this project add theirs with :func:`keep_mail_for`.
KEPT_PURPOSES: list[str] = [secret_mail_purpose(""), f"{SHARES_PURPOSE}:", "lpgcn-"]


def keep_mail_for(prefix: str) -> None:
    """Keep delivered mail whose purpose starts with ``prefix`` until a handler reads it
    (for a handler that reads mail arriving with an earlier request than its own)."""
    if prefix and prefix not in KEPT_PURPOSES:
        KEPT_PURPOSES.append(prefix)


# Typed so a corrupted or stale record is refused on reload naming the field, never used.
@message()
class MailKeyState(Message):
    """This run's mail private key (node-state record :data:`KEY_STATE`, field ``sk`` as
    it always was); made by :func:`new_mail_key`, read by the :class:`Mailbox`."""

    CONFIG = KEY_STATE
    ARRAYS = f"{KEY_STATE}.arrays"  # none: a node state names its own records

    sk: bytes = reply(doc="the X25519 private key")

    def __repr__(self) -> str:  # a traceback or log line never shows the private key
        return "MailKeyState(sk=<hidden>)"


# Typed so a corrupted or stale record is refused on reload naming the field, never used.
@message()
class MailDirectory(Message):
    """The directory of peers' signed mail keys this node holds (node-state record
    ``relay.known-keys``, field ``keys`` as it always was: :func:`_pack`'s blob)."""

    CONFIG = _DIRECTORY
    ARRAYS = f"{_DIRECTORY}.arrays"  # none: a node state names its own records

    keys: bytes = reply(name="keys", doc="(node id | signed key) entries, by node id")

    def __post_init__(self) -> None:  # a cut blob would unpack into shifted, wrong keys
        if len(self.keys) % (_NODE_ID_BYTES + SIGNED_KEY_BYTES):
            raise WireError("MailDirectory field 'keys' must be whole (node id, signed key) "
                            "entries")


# Typed so a corrupted or stale record is refused on reload naming the field, never used.
@message()
class MailInbox(Message):
    """Mail delivered for a purpose some handler reads, not opened yet (node-state record
    ``relay.inbox``): each entry's ``<sender>|<round>|<purpose>`` key and sealed payload, in
    the order delivered. Two lists, not a record entry per mail: a key is the server's
    text, never a record's field name."""

    CONFIG = _INBOX
    ARRAYS = f"{_INBOX}.arrays"  # none: a node state names its own records

    keys: list[str] = reply(doc="each mail's '<sender>|<round>|<purpose>'")
    mail: list[bytes] = reply(doc="each mail's sealed payload, in the order of keys")

    def __post_init__(self) -> None:  # a cut or shifted list would open the wrong mail
        if len(self.keys) != len(self.mail) or len(set(self.keys)) != len(self.keys):
            raise WireError("MailInbox fields 'keys' and 'mail' must pair distinct keys "
                            "with payloads, one each")
        try:
            for key in self.keys:
                parse_in_key(key)
        except ValueError:
            raise WireError("MailInbox field 'keys' must be '<sender>|<round>|<purpose>' "
                            "entries") from None

    @classmethod
    def of(cls, inbox: dict[str, bytes]) -> MailInbox:
        return cls(keys=list(inbox), mail=list(inbox.values()))

    def entries(self) -> dict[str, bytes]:
        return dict(zip(self.keys, self.mail, strict=True))


def _kept(purpose: str) -> bool:
    return purpose.startswith(tuple(KEPT_PURPOSES))


def _pack(directory: dict[int, bytes]) -> bytes:
    """The directory as one value: (node id, 9 bytes signed big-endian | signed key) sorted
    by node id. Why not a record entry per node: writing n entries into a Flower record
    type-checks each, for every node, O(n^2) per run (a tenth of key setup at 100 nodes)."""
    return b"".join(int(n).to_bytes(_NODE_ID_BYTES, "big", signed=True) + k
                    for n, k in sorted(directory.items()))


def _unpack(blob: bytes) -> dict[int, bytes]:
    step = _NODE_ID_BYTES + SIGNED_KEY_BYTES
    return {int.from_bytes(blob[i:i + _NODE_ID_BYTES], "big", signed=True):
            blob[i + _NODE_ID_BYTES:i + step] for i in range(0, len(blob), step)}


def new_mail_key(state: RecordDict, identity: NodeIdentity, run_id: int, me: int) -> bytes:
    """Make this run's mail key pair (the private key stays in the node's ``state``) and
    return the public key signed with the node's ``identity``, for the server's directory.

    What the node knew under its previous mail key, if any (mail seen, pairwise keys), is
    forgotten: the pairwise keys derive from the private key."""
    keys = NodeKeys()
    NodeState(state, f"node {me}").save_state(MailKeyState(sk=keys.private_bytes()))
    state[SEEN_STATE] = ConfigRecord()
    state[_PAIRWISE] = ConfigRecord()
    return identity.sign(MAIL_PURPOSE, run_id, me, keys.public_bytes())


class Mailbox:
    """This node's mail for one handler call: what arrived with the request, what to send."""

    def __init__(self, state: RecordDict, request: RecordDict, me: int, run_id: int,
                 identity: NodeIdentity) -> None:
        self.state, self.request, self.me, self.run_id = state, request, int(me), int(run_id)
        self.identity = identity
        self.who = f"node {self.me}"  # in refusals
        self._state = NodeState(state, self.who)
        self._pairwise: dict[int, bytes] = {}  # peer -> pairwise mail key, for this call
        self._passing: dict[str, bytes] = {}  # mail no handler keeps: this call's only
        self.outgoing: dict[str, bytes] = {}
        self._absorb_directory()
        self._absorb_mail()

    @cached_property
    def _directory(self) -> dict[int, bytes]:
        """The directory this node holds: node -> signed mail key (see :func:`_pack`)."""
        kept = self._state.load_state(MailDirectory)
        return _unpack(kept.keys) if kept is not None else {}

    def _absorb_directory(self) -> None:
        """Merge the directory the request carries into the one kept, refusing one longer
        than the roster (checked first), a partition outside the roster (so the kept one
        never outgrows it), a partition under two node ids, or a changed key."""
        directory = config_record(self.request, MAIL_DIRECTORY)
        if directory is None:
            return
        what = f"the mail directory (field '{MAIL_DIRECTORY}')"
        refuse = f"{self.who} refuses {what}"
        self.identity.bound_nodes(len(directory), refuse, "it", RelayError)
        known = self._directory
        self.identity.policy.check_size(
            (len(known) + len(directory)) * (_NODE_ID_BYTES + SIGNED_KEY_BYTES + _ENTRY_BYTES),
            what, self.who)
        owners = {SignedKey.from_bytes(signed, f"node {node}").partition: node
                  for node, signed in known.items()}
        for node_s, blob in directory.items():
            node, signed = int(node_s), bytes(blob)
            partition = SignedKey.from_bytes(signed, f"node {node}").partition
            if partition not in self.identity.roster.keys:
                raise RelayError(f"{refuse}: node {node}'s key claims partition {partition}, "
                                 "which is not in its roster")
            if owners.get(partition, node) != node:
                raise RelayError(f"node {self.me} refuses the mail directory: partition "
                                 f"{partition} appears as node {owners[partition]} and as "
                                 f"node {node}")
            owners[partition] = node
            if node in known and known[node] != signed:
                raise RelayError(f"node {self.me} refuses a new mail key for node {node}: keys "
                                 "may not change during a run (a key substitution by the "
                                 "server?)")
            known[node] = signed
        self._state.save_state(MailDirectory(keys=_pack(known)))

    def _absorb_mail(self) -> None:
        """Keep delivered mail in state until a handler opens it: mail rides on whatever
        request goes to this node next, not necessarily the one whose handler reads it.

        Only mail for a purpose some handler reads (:func:`_kept`) is kept; other mail is
        open to this request's handler only. The kept inbox, with what earlier messages
        left in it, must stay within :data:`MAIL_PER_PARTITION` entries per roster
        partition and the node's ``memory-budget-mb``: checked before anything is kept."""
        mail = config_record(self.request, MAIL_IN)
        if mail is None:
            return
        refuse = f"{self.who} refuses mail (field '{MAIL_IN}')"
        kept: dict[str, bytes] = {}
        for key, blob in mail.items():
            try:
                purpose = parse_in_key(key)[2]
            except ValueError:
                raise RelayError(f"{refuse}: a key is not '<sender>|<round>|<purpose>'") \
                    from None
            (kept if _kept(purpose) else self._passing)[key] = bytes(blob)
        if not kept:
            return
        inbox = self._inbox()
        entries = len(set(inbox) | set(kept))
        most = MAIL_PER_PARTITION * len(self.identity.roster.keys)
        if entries > most:
            raise RelayError(f"{refuse}: its inbox would hold {entries:,} mails, more than "
                             f"{MAIL_PER_PARTITION} per partition of its roster ({most})")
        size = sum(len(k) + len(v) + _ENTRY_BYTES  # bytes values: no copy to measure
                   for k, v in {**inbox, **kept}.items())
        self.identity.policy.check_size(size, f"mail (field '{MAIL_IN}') for its inbox, kept "
                                        "across messages", self.who)
        inbox.update(kept)
        self._keep_inbox(inbox)

    def _inbox(self) -> dict[str, bytes]:
        """The mail kept for a handler: in-key -> sealed payload, as delivered."""
        kept = self._state.load_state(MailInbox)
        return kept.entries() if kept is not None else {}

    def _keep_inbox(self, inbox: dict[str, bytes]) -> None:
        if inbox:
            self._state.save_state(MailInbox.of(inbox))
        else:
            self._state.drop_state(MailInbox)

    @cached_property
    def _secret(self) -> bytes:
        """This node's private mail key (raw bytes, from its state)."""
        kept = self._state.load_state(MailKeyState)
        if kept is None:
            raise RelayError(f"node {self.me} has no mail key: the server must run "
                             "fedrec.transport.mailroom.open_mailroom first")
        return kept.sk

    @cached_property
    def _keys(self) -> NodeKeys:
        return NodeKeys.from_private_bytes(self._secret)

    def _peer_key(self, peer: int) -> bytes:
        """The pairwise mail key with ``peer``, once its mail key's signature checks.

        Signatures are checked here, on first use in the run, not when the directory
        arrives: a node mails only its few peers (SecAgg+ neighbours), so checking all n keys
        would cost every node O(n) verifications for nothing. The key is kept in state under
        a digest of the roster, this node's private mail key, the run, the peer and its
        signed mail key: a later message finds it only while all of these are the same
        (``_absorb_directory`` also refuses a directory that changes a peer's key).
        """
        if peer in self._pairwise:
            return self._pairwise[peer]
        signed = self._directory.get(int(peer))
        if signed is None:
            raise RelayError(f"node {self.me} has no mail key for node {peer} (not in the "
                             "directory the server delivered)")
        tag = hashlib.sha256(self.identity.roster.fingerprint + self._secret + repr(
            (self.run_id, peer)).encode() + signed).hexdigest()
        cache = state_record(self.state, _PAIRWISE)
        if tag not in cache:
            _, public = self.identity.check_once(self.state, MAIL_PURPOSE, self.run_id, peer,
                                                 signed)
            cache[tag] = self._keys.shared_key(public, mail_context(self.run_id))
        self._pairwise[peer] = bytes(cache[tag])
        return self._pairwise[peer]

    @cached_property
    def round(self) -> int:
        """The round this node seals its mail in (:class:`MailRound`, from the server)."""
        if config_record(self.request, MailRound.CONFIG) is None:
            raise RelayError("this request carries no relay round: the server has no mailroom")
        return MailRound.from_records(self.request, self.who).round

    def receive(self, purpose: str) -> dict[int, bytes]:
        """Open every delivered payload of ``purpose``: sender -> plaintext.

        A payload that fails authentication (altered, sealed for another node, another run,
        round or purpose) or that was opened before raises :class:`RelayError` naming the
        sender.
        """
        inbox = self._inbox()
        boxes = [box for box in (inbox, self._passing) if box]
        if not boxes:
            return {}
        seen = state_record(self.state, SEEN_STATE)
        out: dict[int, bytes] = {}
        held = len(inbox)
        try:
            for box, key in [(b, k) for b in boxes for k in b
                             if parse_in_key(k)[2] == purpose]:
                sender, round_, what = parse_in_key(key)
                blob = box.pop(key)
                if key in seen:
                    raise RelayError(f"node {self.me} received mail '{purpose}' from node "
                                     f"{sender} (round {round_}) twice: replay refused")
                aad = mail_aad(self.run_id, sender, self.me, round_, purpose)
                try:
                    out[sender] = open_sealed(self._peer_key(sender), bytes(blob), aad)
                except AuthenticationError:
                    raise RelayError(f"mail '{purpose}' from node {sender} to node {self.me} "
                                     "failed authentication: altered, misrouted or not sealed "
                                     f"by node {sender}") from None
                seen[key] = True
        finally:  # what was taken out is gone, opened or refused
            if len(inbox) != held:
                self._keep_inbox(inbox)
        return out

    def send(self, recipient: int, purpose: str, payload: bytes) -> None:
        """Seal ``payload`` for ``recipient``; it leaves with this handler's reply."""
        if "|" in purpose:
            raise ValueError(f"mail purpose may not contain '|': {purpose!r}")
        aad = mail_aad(self.run_id, self.me, recipient, self.round, purpose)
        self.outgoing[out_key(recipient, purpose)] = seal(self._peer_key(recipient), payload, aad)

    def attach(self, reply: RecordDict) -> RecordDict:
        """``reply`` with the outgoing mail added (the ClientApp calls this)."""
        if self.outgoing:
            reply[MAIL_OUT] = ConfigRecord(dict(self.outgoing))
        return reply
