"""Registry of client handlers, so protocols (built-in or a user's) plug in without edits.

A handler takes the request's ``RecordDict`` and a :class:`clients.node.NodeContext` and
returns the reply's ``RecordDict``. Built-in protocols register at import of their module;
a user's module registers the same way and is loaded through the ``fedrec_privacy.clients``
entry-point group or the ``FEDREC_CLIENT_MODULES`` environment variable (comma-separated
module names), see ``docs/write-your-own-protocol.md``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from flwr.app import RecordDict

if TYPE_CHECKING:
    from clients.node import NodeContext

Handler = Callable[[RecordDict, "NodeContext"], RecordDict]

#: ``query.<action>`` handlers by action name.
QUERY_HANDLERS: dict[str, Handler] = {}
#: Handlers for Flower's stock ``train`` / ``evaluate`` messages, keyed by protocol name: stock
#: strategies such as ``FedAvg`` send those, and the config names which protocol's client runs.
TRAIN_HANDLERS: dict[str, Handler] = {}
EVALUATE_HANDLERS: dict[str, Handler] = {}
#: Diagnostic ``query.<action>`` handlers (``clients/diagnostics.py``): kept apart from
#: :data:`QUERY_HANDLERS` because some are oracles by design (they decrypt or MAC what the
#: server sends); ``build_client_app`` adds them only on an explicit opt-in.
DIAGNOSTIC_HANDLERS: dict[str, Handler] = {}
#: Attribute marking a handler whose reply is a share of a sum (``clients/sums_node.py``
#: ``sum_reply``): the ClientApp checks such a request's sum record before the handler
#: computes or keeps anything (``clients.sums_node.check_sum_request``), so a request with a
#: missing or bad record never trains, stores state or spends budget before it fails. An
#: attribute, not a set: it travels with a handler a simulation worker unpickles by value.
SUM_HANDLER_ATTR = "fedrec_sum_handler"


def is_sum_handler(fn: Handler) -> bool:
    """Whether ``fn`` was registered with ``sums=True``."""
    return bool(getattr(fn, SUM_HANDLER_ATTR, False))


def _mark(fn: Handler, sums: bool) -> None:
    if sums:
        setattr(fn, SUM_HANDLER_ATTR, True)


def _register(table: dict[str, Handler], name: str, fn: Handler, kind: str) -> None:
    if not name.isidentifier():
        raise ValueError(f"{kind} name {name!r} must be a Python identifier (Flower action rule)")
    if name in table and table[name] is not fn:
        old = table[name]
        raise ValueError(
            f"{kind} {name!r} is already registered by {old.__module__}.{old.__qualname__}"
        )
    table[name] = fn


def handler(action: str, *, sums: bool = False) -> Callable[[Handler], Handler]:
    """Decorator: register ``fn`` as the handler of ``query.<action>``; ``sums=True`` for a
    handler that answers with a share of a sum (:data:`SUM_HANDLER_ATTR`)."""

    def deco(fn: Handler) -> Handler:
        _register(QUERY_HANDLERS, action, fn, "query action")
        _mark(fn, sums)
        return fn

    return deco


def diagnostic(action: str, *, sums: bool = False) -> Callable[[Handler], Handler]:
    """Decorator: register ``fn`` as a diagnostic ``query.<action>`` (not in production apps)."""

    def deco(fn: Handler) -> Handler:
        _register(DIAGNOSTIC_HANDLERS, action, fn, "diagnostic action")
        _mark(fn, sums)
        return fn

    return deco


def train_handler(protocol: str, *, sums: bool = False) -> Callable[[Handler], Handler]:
    """Decorator: register ``fn`` for stock ``train`` messages of ``protocol``."""

    def deco(fn: Handler) -> Handler:
        _register(TRAIN_HANDLERS, protocol.replace("-", "_"), fn, "train handler")
        _mark(fn, sums)
        return fn

    return deco


def evaluate_handler(protocol: str, *, sums: bool = False) -> Callable[[Handler], Handler]:
    """Decorator: register ``fn`` for stock ``evaluate`` messages of ``protocol``."""

    def deco(fn: Handler) -> Handler:
        _register(EVALUATE_HANDLERS, protocol.replace("-", "_"), fn, "evaluate handler")
        _mark(fn, sums)
        return fn

    return deco
