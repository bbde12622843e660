"""What the bounds tests measure with: the node's traced peak over a request, a deadline for
server-chosen loops, and the shape a refusal must have.

Shared by ``tests/test_bounds.py`` (one request, or one step of an honest run, with one size
drawn) and ``tests/test_bounds_runconfig.py`` (whole honest runs with the run config's sizes
drawn), so both hold nodes to the same budget and the same refusal rules.
"""

from __future__ import annotations

import re
import signal
import tracemalloc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict

BUDGET_MB = 4
MAX_ITERATIONS = 40
SECONDS = 20  # an example still running after this ran a server-chosen loop unbounded


def state_bytes(state: RecordDict) -> int:
    """Bytes a node's Flower state holds, counted from its records (bytes and text by length,
    numbers 8 each, arrays by their data): what the server made it keep across messages,
    to compare with its ``memory-budget-mb`` (Python's per-object overhead not counted)."""
    def size(value: object) -> int:
        if isinstance(value, (bytes, str)):
            return len(value)
        if isinstance(value, list):
            return sum(size(v) for v in value)
        return 8

    total = 0
    for record in state.values():
        if isinstance(record, ArrayRecord):
            total += sum(len(a.data) for a in record.values())
        elif isinstance(record, ConfigRecord):
            total += sum(len(k) + size(v) for k, v in record.items())
    return total


class TooLong(BaseException):
    """Raised by SIGALRM: not an Exception, so no handler catches it as a refusal."""


@contextmanager
def deadline(seconds: float) -> Iterator[None]:
    def fire(*_: Any) -> None:
        raise TooLong(f"still running after {seconds} s")

    old = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


class Peak:
    """The traced peak (bytes above the memory traced at the start) of a ``with`` block."""

    bytes: int = 0


@contextmanager
def traced_peak() -> Iterator[Peak]:
    """Trace Python's allocations over the block; its peak lands in the yielded
    :class:`Peak` (inside an outer trace, the outer trace goes on)."""
    outer = tracemalloc.is_tracing()
    if outer:
        tracemalloc.reset_peak()
    else:
        tracemalloc.start()
    out = Peak()
    base = tracemalloc.get_traced_memory()[0]
    try:
        yield out
    finally:
        out.bytes = tracemalloc.get_traced_memory()[1] - base
        if not outer:
            tracemalloc.stop()


class PeakMeter:
    """A ClientApp wrapped so that each request it handles is measured on its own: the
    traced peak of that one call (action, node id, peak bytes, refusal text or None)."""

    def __init__(self, app: Callable[[Message, Context], Message]) -> None:
        self.app = app
        self.calls: list[tuple[str, int, int, str | None]] = []

    def __call__(self, message: Message, context: Context) -> Message:
        refusal: str | None = None
        try:
            with traced_peak() as peak:
                try:
                    reply = self.app(message, context)
                except Exception as err:
                    refusal = str(err)
                    raise
            if reply.has_error():
                refusal = reply.error.reason
            return reply
        finally:
            self.calls.append((message.metadata.message_type, context.node_id, peak.bytes,
                               refusal))

    def over(self, budget_bytes: int) -> list[tuple[str, int, int, str | None]]:
        """The calls whose peak passed ``budget_bytes``."""
        return [c for c in self.calls if c[2] > budget_bytes]


def check_refusal(action: str, refusal: str) -> None:
    """A refusal names the node, is the node's own (not a library error deep in the math),
    and a budget refusal names the key and the opt-in."""
    assert re.search(r"node \d+|partition \d", refusal), f"{action}: {refusal}"
    assert not re.search(r"gufunc|operand|could not broadcast|out of bounds|Unable to "
                         r"allocate|index \d+ is out", refusal), f"{action}: {refusal}"
    if "MiB" in refusal or "iterations" in refusal:
        assert re.search(r"memory-budget-mb|max-iterations", refusal), refusal
        assert "node config" in refusal  # the opt-in
