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


def _register(table: dict[str, Handler], name: str, fn: Handler, kind: str) -> None:
    if not name.isidentifier():
        raise ValueError(f"{kind} name {name!r} must be a Python identifier (Flower action rule)")
    if name in table and table[name] is not fn:
        old = table[name]
        raise ValueError(
            f"{kind} {name!r} is already registered by {old.__module__}.{old.__qualname__}"
        )
    table[name] = fn


def handler(action: str) -> Callable[[Handler], Handler]:
    """Decorator: register ``fn`` as the handler of ``query.<action>``."""

    def deco(fn: Handler) -> Handler:
        _register(QUERY_HANDLERS, action, fn, "query action")
        return fn

    return deco


def diagnostic(action: str) -> Callable[[Handler], Handler]:
    """Decorator: register ``fn`` as a diagnostic ``query.<action>`` (not in production apps)."""

    def deco(fn: Handler) -> Handler:
        _register(DIAGNOSTIC_HANDLERS, action, fn, "diagnostic action")
        return fn

    return deco


def train_handler(protocol: str) -> Callable[[Handler], Handler]:
    """Decorator: register ``fn`` for stock ``train`` messages of ``protocol``."""

    def deco(fn: Handler) -> Handler:
        _register(TRAIN_HANDLERS, protocol.replace("-", "_"), fn, "train handler")
        return fn

    return deco


def evaluate_handler(protocol: str) -> Callable[[Handler], Handler]:
    """Decorator: register ``fn`` for stock ``evaluate`` messages of ``protocol``."""

    def deco(fn: Handler) -> Handler:
        _register(EVALUATE_HANDLERS, protocol.replace("-", "_"), fn, "evaluate handler")
        return fn

    return deco
