"""Node side of the sealed relay (``fl_app/secure/sealed.py``): opening and sealing payloads
for other nodes (the ``relay_keys`` handler that makes this node's mail key is in
``clients/common.py``).

A handler reads mail with ``node.mailbox.receive(purpose)`` and sends with
``node.mailbox.send(recipient, purpose, payload)``; the ClientApp puts outgoing mail into
the reply. The directory of the other nodes' public mail keys arrives once; every key must
carry its publisher's signature under the roster (``clients/identity.py``), no partition may
appear under two node ids, and a later directory that changes a node's key is refused (the
server must not swap keys mid-run).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from flwr.app import ConfigRecord, RecordDict

from fl_app.secure.identity import SignedKey
from fl_app.secure.keys import AuthenticationError, NodeKeys, open_sealed, seal
from fl_app.secure.sealed import (
    MAIL_DIRECTORY,
    MAIL_IN,
    MAIL_OUT,
    MAIL_PURPOSE,
    MAIL_ROUND,
    RelayError,
    mail_aad,
    mail_context,
    out_key,
    parse_in_key,
)

if TYPE_CHECKING:
    from clients.identity import NodeIdentity

KEY_STATE = "relay.key"  # ConfigRecord in node state: this node's mail private key
_DIRECTORY = "relay.directory"  # ConfigRecord in node state: node -> public mail key
_PARTITIONS = "relay.partitions"  # ConfigRecord in node state: partition -> node id
SEEN_STATE = "relay.seen"  # ConfigRecord in node state: mail already opened (replay guard)
_INBOX = "relay.inbox"  # ConfigRecord in node state: mail delivered but not opened yet


class Mailbox:
    """This node's mail for one handler call: what arrived with the request, what to send."""

    def __init__(self, state: RecordDict, request: RecordDict, me: int, run_id: int,
                 identity: NodeIdentity) -> None:
        self.state, self.request, self.me, self.run_id = state, request, int(me), int(run_id)
        self.identity = identity
        self._verified: dict[int, bytes] = {}  # peer -> pairwise mail key, signature checked
        self.outgoing: dict[str, bytes] = {}
        self._absorb_directory()
        self._absorb_mail()

    def _absorb_directory(self) -> None:
        if MAIL_DIRECTORY not in self.request.config_records:
            return
        known = self.state.config_records.setdefault(_DIRECTORY, ConfigRecord())
        owners = self.state.config_records.setdefault(_PARTITIONS, ConfigRecord())
        for node, signed in self.request.config_records[MAIL_DIRECTORY].items():
            partition = SignedKey.from_bytes(bytes(signed), f"node {node}").partition
            if owners.get(str(partition), int(node)) != int(node):
                raise RelayError(f"node {self.me} refuses the mail directory: partition "
                                 f"{partition} appears as node {owners[str(partition)]} and as "
                                 f"node {node}")
            owners[str(partition)] = int(node)
            if node in known and bytes(known[node]) != bytes(signed):
                raise RelayError(f"node {self.me} refuses a new mail key for node {node}: keys "
                                 "may not change during a run (a key substitution by the "
                                 "server?)")
            known[node] = bytes(signed)

    def _absorb_mail(self) -> None:
        """Keep delivered mail in state until a handler opens it: mail rides on whatever
        request goes to this node next, not necessarily the one whose handler reads it."""
        if MAIL_IN not in self.request.config_records:
            return
        inbox = self.state.config_records.setdefault(_INBOX, ConfigRecord())
        for key, blob in self.request.config_records[MAIL_IN].items():
            inbox[key] = bytes(blob)

    def _keys(self) -> NodeKeys:
        record = self.state.config_records.get(KEY_STATE)
        if record is None:
            raise RelayError(f"node {self.me} has no mail key: the server must run "
                             "fl_app.secure.sealed.open_mailroom first")
        return NodeKeys.from_private_bytes(bytes(record["sk"]))

    def _peer_key(self, peer: int) -> bytes:
        """The pairwise mail key with ``peer``, once its mail key's signature checks.

        Signatures are checked here, on first use, not when the directory arrives: a node
        mails only its few peers (SecAgg+ neighbours), so checking all n keys would cost
        every node O(n) verifications for nothing.
        """
        if peer in self._verified:
            return self._verified[peer]
        directory = self.state.config_records.get(_DIRECTORY, ConfigRecord())
        if str(peer) not in directory:
            raise RelayError(f"node {self.me} has no mail key for node {peer} (not in the "
                             "directory the server delivered)")
        _, public = self.identity.check(MAIL_PURPOSE, self.run_id, peer,
                                        bytes(directory[str(peer)]))
        self._verified[peer] = self._keys().shared_key(public, mail_context(self.run_id))
        return self._verified[peer]

    @property
    def round(self) -> int:
        if MAIL_ROUND not in self.request.config_records:
            raise RelayError("this request carries no relay round: the server has no mailroom")
        return int(self.request.config_records[MAIL_ROUND]["round"])

    def receive(self, purpose: str) -> dict[int, bytes]:
        """Open every delivered payload of ``purpose``: sender -> plaintext.

        A payload that fails authentication (altered, sealed for another node, another run,
        round or purpose) or that was opened before raises :class:`RelayError` naming the
        sender.
        """
        inbox = self.state.config_records.get(_INBOX)
        if not inbox:
            return {}
        seen = self.state.config_records.setdefault(SEEN_STATE, ConfigRecord())
        out: dict[int, bytes] = {}
        for key in [k for k in inbox if parse_in_key(k)[2] == purpose]:
            sender, round_, what = parse_in_key(key)
            blob = inbox.pop(key)
            if key in seen:
                raise RelayError(f"node {self.me} received mail '{purpose}' from node {sender} "
                                 f"(round {round_}) twice: replay refused")
            aad = mail_aad(self.run_id, sender, self.me, round_, purpose)
            try:
                out[sender] = open_sealed(self._peer_key(sender), bytes(blob), aad)
            except AuthenticationError:
                raise RelayError(f"mail '{purpose}' from node {sender} to node {self.me} failed "
                                 "authentication: altered, misrouted or not sealed by "
                                 f"node {sender}") from None
            seen[key] = True
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
