"""The communication ledger: what crossed the Grid, measured as Flower serializes it.

Every request and reply is measured in bytes (the deflated message and all its records,
arrays and array chunks), per node, per phase and per direction, and every phase is timed
(:class:`CommLedger`). Per phase it also keeps what the server received: record names and
shapes, never values, and each record's form as the mechanism that owns it declares it
(:meth:`CommLedger.mark`). The push/poll loop (``messenger.py``) writes it; results read it.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any

from flwr.app import Message, RecordDict

#: Rounds slower than this are reported at INFO (progress inside long phases).
SLOW_ROUND_SECONDS = 5.0
#: The console gets a summary of the phases run since the last line when a phase ends and at
#: least this long has passed (alternating short phases, e.g. train/evaluate, share a line).
PROGRESS_SECONDS = 2.0

log = logging.getLogger("fedrec")


def message_nbytes(message: Message, sizes: dict[str, int] | None = None) -> int:
    """Bytes Flower carries for ``message``: its deflated body plus every unique descendant.

    This is the size of the objects Flower's object store moves between SuperLink and
    SuperNode (metadata, records, arrays and their chunks); identical chunks count once, as
    Flower sends them once. ``sizes`` (object id -> deflated length) can be shared across the
    messages of a broadcast, so a payload sent to every node is serialized for measuring once,
    not once per node; it is still counted for every node that receives it.
    """
    return messages_nbytes([message], sizes)[0]


def messages_nbytes(messages: list[Message], sizes: dict[str, int] | None = None) -> list[int]:
    """:func:`message_nbytes` of each of ``messages``, measured together.

    Object ids are computed once per object for the whole batch (Flower's
    ``no_object_id_recompute``, as its own grid does when it pushes): otherwise each record
    is serialized again for every ancestor that asks for its id (four times per record), and
    a record that several messages share (a broadcast payload, the relay's directory) once
    per message. Nothing changes while measuring, so no id can go stale.
    """
    sizes = {} if sizes is None else sizes
    out = []
    with _no_object_id_recompute():
        for message in messages:
            seen: set[str] = set()
            total = len(message.deflate())
            stack = list((message.children or {}).items())
            while stack:
                obj_id, obj = stack.pop()
                if obj_id in seen:
                    continue
                seen.add(obj_id)
                if obj_id not in sizes:
                    sizes[obj_id] = len(obj.deflate())
                total += sizes[obj_id]
                stack.extend((obj.children or {}).items())
            out.append(total)
    return out


def _no_object_id_recompute() -> AbstractContextManager[None]:
    """Flower's object-id cache for one measurement; a no-op on a Flower without it."""
    try:
        from flwr.supercore.inflatable.inflatable_object import no_object_id_recompute
    except ImportError:  # pragma: no cover - older Flower: ids are recomputed, sizes the same
        return nullcontext()
    return no_object_id_recompute()


@dataclass
class PhaseStats:
    """Totals of one named phase (e.g. ``power_step``) over all its rounds."""

    rounds: int = 0
    seconds: float = 0.0
    bytes_down: int = 0  # server -> nodes
    bytes_up: int = 0  # nodes -> server
    messages: int = 0


@dataclass
class Receipt:
    """What the server received in one phase: each reply record's entries and their shapes
    (never values), how many replies, and what form each record had (``plain`` unless the
    mechanism that owns it says ``masked``, ``encrypted``, ``sealed`` or ``noised``)."""

    replies: int = 0
    records: dict[str, dict[str, Any]] = field(default_factory=dict)
    forms: dict[str, str] = field(default_factory=dict)

    def add(self, content: RecordDict) -> None:
        self.replies += 1
        for name, record in content.array_records.items():
            self.records.setdefault(name, {k: list(a.shape) for k, a in record.items()})
        for kind, group in (("config", content.config_records),
                            ("metrics", content.metric_records)):
            for name, record in group.items():
                self.records.setdefault(name, {k: kind for k in record})

    def to_dict(self) -> dict[str, Any]:
        return {"replies": self.replies,
                "records": {name: {"form": self.forms.get(name, "plain"), "entries": entries}
                            for name, entries in self.records.items()}}


@dataclass
class CommLedger:
    """Accounting of what crossed the Grid: per phase, per node and per round."""

    phases: dict[str, PhaseStats] = field(default_factory=lambda: defaultdict(PhaseStats))
    node_down: dict[int, int] = field(default_factory=lambda: defaultdict(int))
    node_up: dict[int, int] = field(default_factory=lambda: defaultdict(int))
    rounds: list[dict[str, Any]] = field(default_factory=list)
    receipts: dict[str, Receipt] = field(default_factory=lambda: defaultdict(Receipt))
    _current: str = ""
    _since: int = 0  # index in ``rounds`` of the first round not yet summarized on the console
    _last_line: float = field(default_factory=time.monotonic)

    def mark(self, phase: str, record: str, form: str) -> None:
        """Say what form a reply record of ``phase`` has (e.g. SecAgg+ values: ``masked``)."""
        self.receipts[phase].forms[record] = form

    def summarize(self, force: bool = True) -> None:
        """One console line for the phases run since the last line: rounds and seconds per
        phase, megabytes in total. Unless ``force``, only after :data:`PROGRESS_SECONDS`."""
        run = self.rounds[self._since:]
        if not run or (not force and time.monotonic() - self._last_line < PROGRESS_SECONDS):
            return
        per_phase: dict[str, list[float]] = {}
        for r in run:
            acc = per_phase.setdefault(r["phase"], [0, 0.0])
            acc[0] += 1
            acc[1] += r["seconds"]
        parts = ", ".join(f"{p} {int(n)} round(s) {sec:.2f} s" for p, (n, sec) in per_phase.items())
        log.info("%s (%.3g MB down, %.3g MB up)", parts,
                 sum(r["bytes_down"] for r in run) / 1e6, sum(r["bytes_up"] for r in run) / 1e6)
        self._since = len(self.rounds)
        self._last_line = time.monotonic()

    def record_round(
        self,
        phase: str,
        seconds: float,
        down: Mapping[int, int],
        up: Mapping[int, int],
    ) -> None:
        """Add one synchronous round (requests out, replies back) to the ledger."""
        if phase != self._current:
            self.summarize(force=False)
            self._current = phase
        stats = self.phases[phase]
        stats.rounds += 1
        stats.seconds += seconds
        stats.bytes_down += sum(down.values())
        stats.bytes_up += sum(up.values())
        stats.messages += len(down) + len(up)
        log.log(logging.INFO if seconds >= SLOW_ROUND_SECONDS else logging.DEBUG,
                "%s round %d: %d/%d nodes answered in %.2f s (%.3g MB down, %.3g MB up)",
                phase, stats.rounds, len(up), len(down), seconds,
                sum(down.values()) / 1e6, sum(up.values()) / 1e6)
        for node, n in down.items():
            self.node_down[node] += n
        for node, n in up.items():
            self.node_up[node] += n
        self.rounds.append(
            {
                "phase": phase,
                "seconds": seconds,
                "nodes": len(down),
                "bytes_down": sum(down.values()),
                "bytes_up": sum(up.values()),
            }
        )

    @property
    def total_rounds(self) -> int:
        return len(self.rounds)

    def bytes_per_node(self) -> dict[str, float]:
        """Mean, max bytes per node in each direction (what a data holder pays)."""
        nodes = set(self.node_down) | set(self.node_up)
        if not nodes:
            return {"mean_down": 0.0, "mean_up": 0.0, "max_down": 0.0, "max_up": 0.0}
        down = [self.node_down.get(n, 0) for n in nodes]
        up = [self.node_up.get(n, 0) for n in nodes]
        return {
            "mean_down": sum(down) / len(nodes),
            "mean_up": sum(up) / len(nodes),
            "max_down": float(max(down)),
            "max_up": float(max(up)),
        }

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary: per-phase totals, per-node bytes, and the round log."""
        return {
            "total_rounds": self.total_rounds,
            "phases": {name: vars(stats) for name, stats in self.phases.items()},
            "bytes_per_node": self.bytes_per_node(),
            "node_bytes": {
                str(n): {"down": self.node_down.get(n, 0), "up": self.node_up.get(n, 0)}
                for n in sorted(set(self.node_down) | set(self.node_up))
            },
            "rounds": self.rounds,
        }

    def privacy(self) -> dict[str, Any]:
        """Per phase, what the server received: records, entries, shapes and form."""
        return {phase: receipt.to_dict() for phase, receipt in self.receipts.items()}
