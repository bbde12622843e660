"""Request/reply over the Flower Grid: short polling, clear timeouts, byte and time accounting.

Why not ``Grid.send_and_receive``: it sleeps between polls (0.1 s in simulation, 3 s against a
deployed SuperLink), and protocols here run hundreds of synchronous rounds. We push all
requests with ``push_messages`` and pull replies with a short poll, so a round costs what
Flower's own delivery costs and nothing more (the simulation engine hands each node at most
one message every 0.1 s; docs/architecture.md, "Flower facts").

The Messenger owns three things and writes only its own: the loop (this module), the
communication ledger every round is recorded in (``ledger.py``) and the run report's privacy
section (``report.py``), which the handshake, the aggregators and the loop add to through its
methods. The sealed mail's directory and queues (``mailroom.py``) ride on every request once a
relay opened them.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from flwr.app import Message, RecordDict
from flwr.common.constant import ErrorCode
from flwr.serverapp import Grid

from fedrec.transport.ledger import CommLedger, message_nbytes, messages_nbytes
from fedrec.transport.mailroom import Mailroom
from fedrec.transport.report import RunReport

DEFAULT_POLL_INTERVAL = 0.002

log = logging.getLogger("fedrec")

#: Flower's error codes for "no reply will come" (``flwr.common.constant.ErrorCode``): the
#: SuperLink writes these replies itself when a node stops sending heartbeats or a message
#: expires. They mean the node went silent, not that its handler failed, so they count as
#: missing replies (a dropout where the protocol tolerates one).
UNAVAILABLE_ERROR_CODES = frozenset({
    ErrorCode.MESSAGE_UNAVAILABLE, ErrorCode.REPLY_MESSAGE_UNAVAILABLE, ErrorCode.NODE_UNAVAILABLE,
})


#: Seconds between progress lines while a round waits for its replies (the handshake of a
#: simulation waits for Ray to start a worker per node: 20-60 s on a loaded machine).
PROGRESS_SECONDS = 5.0

#: Set (e.g. by Ctrl-C in ``fl_app.simulation``) to stop the run at its next wait for
#: replies: the loop raises :class:`RunInterrupted`, so the ServerApp writes what it has.
STOP = threading.Event()


class RunInterrupted(Exception):
    """The run was asked to stop (:data:`STOP`) while it waited for nodes."""


class NodeTimeoutError(TimeoutError):
    """Some nodes did not answer a request; the message names each with the reason (the
    SuperLink reported it unavailable, or it was silent past the timeout) and the run-config
    key that sets the deadline (``setting``), so a user knows what to raise."""

    def __init__(self, action: str, missing: list[str], total: int, timeout: float,
                 details: list[str] | None = None, setting: str = "timeout"):
        self.action = action
        self.missing = missing
        self.setting = setting
        super().__init__(
            f"{len(missing)} of {total} node(s) did not answer '{action}' within "
            f"{timeout:g} s: {', '.join(details or missing)}. If they are only slow (a busy "
            f"machine, many nodes), raise the run config '{setting}' (now {timeout:g} s): "
            f"run_simulation.py --set {setting}=SECONDS, flwr run --run-config "
            f"\"{setting}=SECONDS\""
        )


def check_stop(what: str) -> None:
    """Raise :class:`RunInterrupted` if :data:`STOP` is set."""
    if STOP.is_set():
        raise RunInterrupted(f"interrupted while waiting for {what}")


#: Why a node gave no reply, as :meth:`Messenger.missing_reason` words it.
UNAVAILABLE_REASON = "the SuperLink reports it unavailable"
REJECTED_REASON = "the SuperLink rejected the message (unknown or offline node)"


class NodeError(RuntimeError):
    """A node answered with an error (its handler raised); the message names the node."""

    def __init__(self, action: str, node: str, reason: str):
        self.action = action
        self.node = node
        self.reason = clean_error_reason(reason)
        super().__init__(f"{node} failed in '{action}': {self.reason}")


def clean_error_reason(reason: str) -> str:
    """The node's own error line out of Flower's wrapping (exception class, Ray traceback)."""
    text = reason.strip()
    marker = "Message: "
    if marker in text:
        text = text.rsplit(marker, 1)[1]
    elif text.startswith("<class"):
        text = text.split(":<'", 1)[-1]
    text = text.removesuffix("'>").strip()
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1].strip() if lines else reason


class Messenger:
    """Send requests to nodes and collect their replies, fast and accounted.

    :attr:`report` names the nodes (e.g. ``"node 7 (partition 3)"``) in error messages once
    the handshake has named them (:meth:`RunReport.name_node`).
    """

    def __init__(
        self,
        grid: Grid,
        *,
        timeout: float = 120.0,
        poll_interval: float = DEFAULT_POLL_INTERVAL,
        ledger: CommLedger | None = None,
    ) -> None:
        self.grid = grid
        self.timeout = timeout
        self.poll_interval = poll_interval
        self.ledger = ledger if ledger is not None else CommLedger()
        self.report = RunReport()
        self.last_missing: list[int] = []
        self.last_rejected: list[int] = []
        #: Of :attr:`last_missing`, the nodes the SuperLink reported unavailable.
        self.last_unavailable: set[int] = set()
        #: The deadline (s) of the last round and the run-config key that set it, for
        #: :meth:`missing_reason`.
        self.last_timeout: float = timeout
        self.last_timeout_key = "timeout"
        #: Sealed node-to-node mail (``fedrec.secure.sealed``): once opened
        #: (:meth:`mailroom_for`), every request carries the recipient's pending mail and
        #: every reply's outgoing mail is queued.
        self.mailroom: Mailroom | None = None
        self._round = 0

    def mailroom_for(self, nodes: Iterable[int]) -> Mailroom:
        """The run's mailroom, opened for ``nodes`` if no relay opened it yet."""
        if self.mailroom is None:
            self.mailroom = Mailroom(nodes=sorted(int(n) for n in nodes))
        return self.mailroom

    def poll_wait(self, elapsed: float) -> float:
        """Seconds to wait before the next pull, ``elapsed`` s into a round.

        ``poll_interval`` for the first 0.2 s (a simulated round takes 0.1-0.2 s, so it ends
        within a poll of its last reply), then 20 ms, 50 ms after 1 s and 250 ms after 3 s:
        a deployed round takes at least the SuperNode's 3 s idle sleep (docs/deployment.md,
        section 8), and each pull is an HTTPS request to the SuperLink, whose CPU the nodes'
        ClientApp processes need on a small machine (four pulls a second per waiting run
        instead of twenty; the reply is seen at most 0.25 s late in a round of 3.5 s or more).
        """
        if elapsed < 0.2:
            return self.poll_interval
        wait = 0.02 if elapsed < 1.0 else 0.05 if elapsed < 3.0 else 0.25
        return max(self.poll_interval, wait)

    def node_ids(self, min_nodes: int = 1, wait: float | None = None,
                 timeout_key: str = "timeout") -> list[int]:
        """Sorted ids of the connected nodes, waiting up to ``wait`` s for ``min_nodes``
        (``timeout_key``: the run-config key of that wait, named if it expires)."""
        deadline = time.monotonic() + (self.timeout if wait is None else wait)
        while True:
            check_stop("nodes to connect")
            ids = sorted(self.grid.get_node_ids())
            if len(ids) >= min_nodes or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        if len(ids) < min_nodes:
            raise NodeTimeoutError("connect", [f"{min_nodes - len(ids)} missing node(s)"],
                                   min_nodes, self.timeout if wait is None else wait,
                                   setting=timeout_key)
        return ids

    def label(self, node_id: int) -> str:
        return self.report.label(node_id)

    def record_dropout(self, phase: str, action: str, nodes: Iterable[int],
                       why: str | None = None) -> None:
        """Note nodes that dropped out of a round (kept for the results' ``privacy``).

        ``why`` None: each node's reason from the last round (:meth:`missing_reason`)."""
        nodes = sorted(nodes)
        for reason in sorted({why or self.missing_reason(n) for n in nodes}):
            same = [n for n in nodes if (why or self.missing_reason(n)) == reason]
            self.report.add_dropout(phase, action, same, reason)

    def missing_reason(self, node: int) -> str:
        """Why ``node`` gave no reply in the last round: the SuperLink reported it unavailable
        (its heartbeats stopped) or rejected the message, or it was silent past the
        deadline."""
        if node in self.last_unavailable:
            return UNAVAILABLE_REASON
        if node in self.last_rejected:
            return REJECTED_REASON
        return (f"no reply within {self.last_timeout:g} s (silent past the timeout; raise "
                f"the run config '{self.last_timeout_key}' if the node is only slow)")

    def lost_nodes(self) -> str:
        """Every node that dropped out during the run, with its round and reason
        (:meth:`RunReport.lost_nodes`)."""
        return self.report.lost_nodes()

    def privacy_report(self) -> dict[str, Any]:
        """The results' ``privacy`` section: the report with the ledger's receipts and the
        sealed mail the server carried (:meth:`RunReport.privacy`)."""
        return self.report.privacy(self.ledger.privacy(),
                                   self.mailroom.view if self.mailroom else [])

    def exchange(
        self,
        messages: list[Message],
        *,
        phase: str,
        timeout: float | None = None,
    ) -> Iterator[tuple[int, Message]]:
        """Push ``messages``; yield ``(node, reply Message)`` as replies arrive (errors too).

        The one push/poll loop of the project: :meth:`iter_replies` and
        :class:`AccountedGrid` both run on it. It always has a deadline: ``timeout`` (else the
        Messenger's) seconds after the push, moved to ``timeout`` after each reply while
        replies come. Why: a simulation's few workers answer a round's nodes one after
        another, so a round of 3,000 nodes takes longer than any one node; the deadline
        measures a node's silence, not the federation's size. When it passes, :attr:`last_missing` lists the silent node ids and the
        iteration ends: the caller decides whether silence is an error. Messages the grid
        rejects (unknown or offline node) count as silent, and so do the error replies the
        SuperLink writes itself for a node that stopped sending heartbeats
        (:data:`UNAVAILABLE_ERROR_CODES`): whether a dead node is noticed by its heartbeat or
        by the deadline, the caller sees the same silence. The round is recorded in the
        ledger however the iteration ends.
        """
        timeout = self.timeout if timeout is None else float(timeout)
        t0 = time.perf_counter()
        self.last_missing = []
        self.last_unavailable = set()
        self.last_timeout = timeout
        down = dict(zip((m.metadata.dst_node_id for m in messages), messages_nbytes(messages)))
        # Key by the id each grid writes into the message: a grid may leave out (in memory)
        # or return None for (deployed) a message it rejects, so positions cannot be trusted.
        accepted = {i for i in self.grid.push_messages(messages) if i}
        pending = {m.metadata.message_id: m.metadata.dst_node_id
                   for m in messages if m.metadata.message_id in accepted}
        self.last_rejected = sorted(m.metadata.dst_node_id for m in messages
                                    if m.metadata.message_id not in accepted)
        up: dict[int, int] = {}
        deadline = time.monotonic() + timeout
        next_progress = time.monotonic() + PROGRESS_SECONDS
        try:
            while pending:
                check_stop(f"'{phase}' replies")
                replies = list(self.grid.pull_messages(list(pending)))
                for reply in replies:
                    node = pending.pop(reply.metadata.reply_to_message_id, None)
                    if node is None:
                        continue
                    if reply.has_error() and reply.error.code in UNAVAILABLE_ERROR_CODES:
                        self.last_unavailable.add(node)
                        # flwr 1.42's SuperLink marks a node offline without a log line
                        # (its state tags it lazily), so the ServerApp says it, once seen
                        log.warning("%s is offline: %s (its heartbeats stopped), in '%s'",
                                    self.label(node), UNAVAILABLE_REASON, phase)
                        continue
                    up[node] = message_nbytes(reply)
                    yield node, reply
                if replies:  # the clock runs from the last reply: see ``timeout`` below
                    deadline = max(deadline, time.monotonic() + timeout)
                if pending and not replies:
                    if time.monotonic() > deadline:
                        break
                    if time.monotonic() > next_progress:
                        next_progress = time.monotonic() + PROGRESS_SECONDS
                        log.info("%s: %d of %d node(s) answered, waiting %.0f s (a node may "
                                 "take %g s after the last reply)", phase,
                                 len(messages) - len(pending), len(messages),
                                 time.perf_counter() - t0, timeout)
                    time.sleep(self.poll_wait(time.monotonic() - (deadline - timeout)))
            self.last_missing = sorted(set(pending.values()) | set(self.last_rejected)
                                       | self.last_unavailable)
            for node in self.last_missing:
                if node not in self.last_unavailable:  # logged when its error reply came
                    log.warning("%s gave no reply in '%s': %s", self.label(node), phase,
                                self.missing_reason(node))
        finally:
            self.ledger.record_round(phase, time.perf_counter() - t0, down, up)

    def missing_labels(self) -> list[str]:
        """Labels of :attr:`last_missing`, saying which ones the SuperLink reported gone."""
        return [self.label(n) + (f" ({UNAVAILABLE_REASON})" if n in self.last_unavailable
                                 else "") for n in self.last_missing]

    def missing_details(self) -> list[str]:
        """Each node of :attr:`last_missing` with why it gave no reply, e.g.
        ``node 7 (partition 2) (the SuperLink reports it unavailable)`` (its error reply,
        ``NODE_UNAVAILABLE``, came before the deadline) or ``node 7 (partition 2) (no reply
        within 45 s (silent past the timeout))``."""
        return [f"{self.label(n)} ({self.missing_reason(n)})" for n in self.last_missing]

    def iter_replies(
        self,
        action: str,
        contents: Mapping[int, RecordDict],
        *,
        phase: str | None = None,
        timeout: float | None = None,
        message_type: str | None = None,
        allow_missing: bool = False,
        timeout_key: str = "timeout",
    ) -> Iterator[tuple[int, RecordDict]]:
        """Send ``contents[node]`` to each node and yield ``(node, reply)`` as replies arrive.

        Lets a server reduce replies incrementally (it never has to hold all of them). Raises
        :class:`NodeError` on the first error reply or a rejected message, and
        :class:`NodeTimeoutError` naming every node still silent when the timeout expires,
        unless ``allow_missing``: then the silent nodes are listed in :attr:`last_missing`
        and the iteration just ends (dropout-tolerant protocols such as secure aggregation
        decide what to do). Error replies always raise. ``timeout_key`` is the run-config
        key a timeout error names (the one that sets ``timeout``).
        """
        phase = phase or action
        timeout = self.timeout if timeout is None else timeout
        self.last_timeout_key = timeout_key
        self._round += 1
        mtype = message_type or f"query.{action}"
        room, round_ = self.mailroom, self._round
        if room is not None:
            contents = {n: room.attach(n, c, round_) for n, c in contents.items()}
        messages = [
            Message(content, dst_node_id=node, message_type=mtype,
                    group_id=f"{phase}:{self._round}")
            for node, content in contents.items()
        ]
        for node, reply in self.exchange(messages, phase=phase, timeout=timeout):
            if reply.has_error():
                raise NodeError(action, self.label(node), reply.error.reason)
            self.ledger.receipts[phase].add(reply.content)
            if room is not None and room.collect(node, reply.content, round_):
                self.ledger.mark(phase, room.out_record, "sealed")
            yield node, reply.content
        if self.last_rejected:
            raise NodeError(action, ", ".join(self.label(n) for n in self.last_rejected),
                            REJECTED_REASON)
        if self.last_missing and allow_missing:
            self.record_dropout(phase, action, self.last_missing)
        if self.last_missing and not allow_missing:
            raise NodeTimeoutError(action, self.missing_labels(), len(contents), timeout,
                                   self.missing_details(), setting=timeout_key)

    def send(
        self,
        action: str,
        contents: Mapping[int, RecordDict],
        **kwargs: Any,
    ) -> dict[int, RecordDict]:
        """Per-node request; returns every node's reply keyed by node id."""
        return dict(self.iter_replies(action, contents, **kwargs))

    def broadcast(
        self,
        action: str,
        content: RecordDict,
        nodes: Iterable[int] | None = None,
        **kwargs: Any,
    ) -> dict[int, RecordDict]:
        """The same request to every node (or to ``nodes``); returns replies by node id."""
        targets = list(nodes) if nodes is not None else self.node_ids()
        return self.send(action, {node: content for node in targets}, **kwargs)


class AccountedGrid(Grid):
    """A Grid that adds short polling, byte accounting and strict failures to stock strategies.

    Stock strategies (``FedAvg`` and friends) call ``send_and_receive``; wrapping the real
    grid in this class gives them the same fast round and the same ledger as our own
    protocols without changing their code. Unlike Flower's own ``send_and_receive``, a node
    that does not answer within the timeout, or answers with an error, fails the run with an
    error naming it (``strict=True``): every protocol here assumes a fixed set of parties, so
    silently averaging over survivors would change the result without saying so.
    """

    def __init__(self, grid: Grid, messenger: Messenger, strict: bool = True) -> None:
        self._grid = grid
        self._messenger = messenger
        self.strict = strict

    def set_run(self, run: Any) -> None:
        self._grid.set_run(run)

    @property
    def run(self) -> Any:
        return self._grid.run

    def create_message(self, content: RecordDict, message_type: str, dst_node_id: int,
                       group_id: str, ttl: float | None = None) -> Message:
        return Message(content, dst_node_id=dst_node_id, message_type=message_type,
                       ttl=ttl, group_id=group_id)

    def get_node_ids(self) -> Iterable[int]:
        return self._grid.get_node_ids()

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        return self._grid.push_messages(messages)

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        return self._grid.pull_messages(message_ids)

    def send_and_receive(self, messages: Iterable[Message], *,
                         timeout: float | None = None) -> Iterable[Message]:
        """Flower's round, on the Messenger's loop: fast polling, accounted, always timed out.

        ``timeout=None`` means the Messenger's timeout (never an unbounded wait).
        """
        messages = list(messages)
        if not messages:
            return []
        phase = messages[0].metadata.message_type
        label = self._messenger.label
        self._messenger.last_timeout_key = "timeout"
        arrived = list(self._messenger.exchange(messages, phase=phase, timeout=timeout))
        # Replies in the handshake's node order, not arrival order, so a stock strategy's
        # float aggregation (e.g. FedAvg's weighted mean) is the same in every run.
        rank = {n: i for i, n in enumerate(self._messenger.report.order)}
        arrived.sort(key=lambda pair: (rank.get(pair[0], len(rank)), pair[0]))
        replies = [reply for _, reply in arrived]
        for _, reply in arrived:
            if not reply.has_error():
                self._messenger.ledger.receipts[phase].add(reply.content)
        if self.strict:
            silent = self._messenger.last_missing
            if silent:
                raise NodeTimeoutError(phase, self._messenger.missing_labels(), len(messages),
                                       self._messenger.timeout if timeout is None
                                       else float(timeout), self._messenger.missing_details())
            for node, reply in arrived:
                if reply.has_error():
                    raise NodeError(phase, label(node), reply.error.reason)
        return replies
