"""The server side of the sealed relay (``fedrec/secure/sealed.py``): the directory of signed
mail keys and the queues that carry each node's sealed mail to its recipient's next request.
The server sees who sends how many bytes to whom (:class:`MailRecord`), nothing more."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from flwr.app import ConfigRecord, RecordDict

from fedrec.secure.sealed import RelayError, in_key
from fedrec.wire.mail import (
    MAIL_DIRECTORY,
    MAIL_IN,
    MAIL_KEY_REPLY,
    MAIL_OUT,
    Action,
    MailKey,
    MailRound,
)
from fedrec.wire.message import WireError, field_names

#: A mail key reply's one field, as a refusal names it (``relay-key.pk``).
_KEY_FIELD = f"{MAIL_KEY_REPLY}.{field_names(MailKey)[0]}"


@dataclass
class MailRecord:
    """One relayed payload as the server saw it: endpoints, size, purpose, round."""

    sender: int
    recipient: int
    purpose: str
    round: int
    nbytes: int


@dataclass
class Mailroom:
    """Server side of the relay for one run: the key directory and the queues.

    ``tamper(sender, recipient, blob) -> blob`` lets tests play a server that alters mail.
    """

    nodes: list[int]
    directory: dict[int, bytes] = field(default_factory=dict)  # node -> signed mail key
    queues: dict[int, dict[str, bytes]] = field(default_factory=dict)
    #: node -> the directory entries it was sent (peer -> signed key), so each goes once
    sent: dict[int, dict[int, bytes]] = field(default_factory=dict)
    #: node -> the peers whose keys it needs, for nodes that write to a few peers only
    #: (:meth:`need`); a node not listed is sent the whole directory
    peers: dict[int, set[int]] = field(default_factory=dict)
    view: list[MailRecord] = field(default_factory=list)
    tamper: Callable[[int, int, bytes], bytes] | None = None
    out_record: str = MAIL_OUT  # the reply record that carries outgoing mail
    #: The whole directory as a request record, made once per change and shared by every
    #: request that carries it (n nodes x n keys: building and measuring it per node was
    #: most of the server's share of key setup at 100 nodes).
    _directory_record: tuple[dict[int, bytes], ConfigRecord] | None = field(default=None,
                                                                             repr=False)

    def add_keys(self, keys: dict[int, bytes]) -> None:
        """Signed public mail keys from the ``relay_keys`` round (checked by the nodes)."""
        self.directory.update({int(n): bytes(k) for n, k in keys.items()})

    def need(self, peers: Mapping[int, Iterable[int]]) -> None:
        """Each listed node writes to the given peers only (SecAgg+'s neighbours): it is
        sent their keys, not the whole directory, so no request grows with the federation.
        Sending fewer keys weakens nothing: a node refuses mail to a peer it has no key for."""
        for node, wanted in peers.items():
            self.peers.setdefault(int(node), set()).update(int(v) for v in wanted)

    def need_all(self, nodes: Iterable[int]) -> None:
        """The listed nodes may write to anyone (a protocol's own relay): whole directory."""
        for node in nodes:
            self.peers.pop(int(node), None)

    def directory_record(self) -> ConfigRecord:
        """The current directory as the request record nodes receive (node -> signed key)."""
        if self._directory_record is None or self._directory_record[0] != self.directory:
            self._directory_record = (dict(self.directory), ConfigRecord(
                {str(n): k for n, k in self.directory.items()}))
        return self._directory_record[1]

    def covers(self, nodes: Iterable[int]) -> bool:
        return all(int(n) in self.directory for n in nodes)

    def attach(self, node: int, content: RecordDict, round_: int) -> RecordDict:
        """``content`` for ``node`` plus its pending mail, the directory entries it has not
        been sent yet (its peers', or all) and the round."""
        out = RecordDict(dict(content.items()))
        out.update(MailRound(round=int(round_)).to_records())
        sent = self.sent.setdefault(node, {})
        wanted = self.peers.get(node)
        if wanted is None and not sent:  # the whole directory, as one shared record
            if self.directory:
                out[MAIL_DIRECTORY] = self.directory_record()
                sent.update(self.directory)
        else:
            pool = self.directory if wanted is None else \
                {v: self.directory[v] for v in wanted if v in self.directory}
            new = {v: k for v, k in pool.items() if sent.get(v) != k}
            if new:
                out[MAIL_DIRECTORY] = ConfigRecord({str(v): k for v, k in new.items()})
                sent.update(new)
        mail = self.queues.pop(node, None)
        if mail:
            out[MAIL_IN] = ConfigRecord(mail)
        return out

    def collect(self, sender: int, reply: RecordDict, round_: int) -> bool:
        """Queue the mail ``sender`` put in its reply (sealed in ``round_``); True if any."""
        if MAIL_OUT not in reply.config_records:
            return False
        for key, blob in reply.config_records[MAIL_OUT].items():
            recipient_s, _, purpose = key.partition("|")
            recipient = int(recipient_s)
            if recipient not in self.directory:
                raise RelayError(f"node {sender} sent mail to node {recipient}, which is not "
                                 "in the federation's mail directory")
            blob = bytes(blob)
            self.view.append(MailRecord(sender, recipient, purpose, round_, len(blob)))
            if self.tamper is not None:
                blob = self.tamper(sender, recipient, blob)
            self.queues.setdefault(recipient, {})[in_key(sender, round_, purpose)] = blob
        del reply[MAIL_OUT]
        return True

    def pending(self) -> dict[int, int]:
        """Payloads waiting per recipient."""
        return {n: len(q) for n, q in self.queues.items() if q}


def prepare_mailroom(messenger, nodes: Iterable[int]) -> tuple[Mailroom, list[int]]:  # noqa: ANN001
    """The messenger's mailroom (made if it has none) and which of ``nodes`` have no mail
    key yet: they need a ``relay_keys`` round, or :data:`MAIL_KEYGEN` in a protocol's
    request, then :func:`take_mail_keys` on the replies."""
    nodes = sorted(int(n) for n in nodes)
    room = messenger.mailroom_for(nodes)
    return room, [n for n in nodes if n not in room.directory]


def take_mail_keys(messenger, room: Mailroom, nodes: Iterable[int],  # noqa: ANN001
                   replies: Mapping[int, RecordDict]) -> None:
    """Add the signed mail keys that ``nodes`` sent in ``replies`` (:data:`MAIL_KEY_REPLY`)
    to the directory; a reply without one is an error naming the node."""
    keys: dict[int, bytes] = {}
    for n in nodes:
        try:
            keys[n] = MailKey.from_records(replies[n], messenger.label(n)).pk
        except (KeyError, WireError):
            raise RelayError(f"{messenger.label(n)} sent no mail key (field "
                             f"'{_KEY_FIELD}')") from None
    room.add_keys(keys)
    room.nodes = sorted(set(room.nodes) | set(keys))


def open_mailroom(messenger, nodes: Iterable[int]) -> Mailroom:  # noqa: ANN001 (a Messenger)
    """The messenger's mailroom, with mail keys for every node in ``nodes`` (one round if any
    node has none yet). Every later request through the messenger carries mail."""
    room, missing = prepare_mailroom(messenger, nodes)
    room.need_all(nodes)
    if missing:
        replies = messenger.broadcast(Action.RELAY_KEYS, RecordDict(), missing,
                                      phase=Action.RELAY_KEYS)
        take_mail_keys(messenger, room, missing, replies)
    return room
