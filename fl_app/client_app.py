"""The ClientApp: every registered client handler, exposed as a Flower action.

The node-side modules of every registered protocol (``fl_app/registry.py``) and of users'
plugins register their handlers on import; ``query.<action>`` messages go to
:data:`clients.handlers.QUERY_HANDLERS`; Flower's stock
``train`` / ``evaluate`` messages (sent by stock strategies such as ``FedAvg``) go to the
handler of the protocol named in the message's config (``fedrec-protocol``).

Three things are fixed when the ClientApp is built, never by the server's messages: the
node policy every handler checks (``clients/policy.py``; node config keys override it per
node), the data description its nodes offer (``datasets/description.py``; node config keys
override it, and the production app has none: a deployed SuperNode names its data in node
config) and whether the diagnostic actions (``clients/diagnostics.py``, oracles by design)
exist. The production app (:data:`app`) has no diagnostics unless its operator opts in with
``FEDREC_NODE_POLICY="diagnostics=true"``.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterable, Mapping
from importlib.metadata import entry_points
from typing import Any

from flwr.app import Context, Message, RecordDict
from flwr.clientapp import ClientApp

from clients.boundary import check_finite, node_paths, scrub_exception
from clients.handlers import (
    DIAGNOSTIC_HANDLERS,
    EVALUATE_HANDLERS,
    QUERY_HANDLERS,
    TRAIN_HANDLERS,
    Handler,
    is_sum_handler,
)
from clients.node import NodeContext
from clients.policy import NodePolicy
from clients.sums_node import check_sum_request
from fedrec.secure.sealed import MAIL_DIRECTORY, MAIL_IN
from fedrec.wire import request as request_wire
from fl_app.quiet import quiet_flower_noise
from fl_app.registry import DIAGNOSTICS_MODULE, client_modules

PLUGIN_GROUP = "fedrec_privacy.clients"
PLUGIN_ENV = "FEDREC_CLIENT_MODULES"
PROTOCOL_KEY = request_wire.STOCK_PROTOCOL


def load_client_plugins(extra: Iterable[str] = ()) -> list[str]:
    """Import the registered protocols' handler modules, then users' (entry points,
    ``$FEDREC_CLIENT_MODULES`` and ``extra``); importing a module registers its handlers."""
    loaded = []
    for name in (*client_modules(), *extra):
        importlib.import_module(name)
        loaded.append(name)
    for ep in entry_points(group=PLUGIN_GROUP):
        ep.load()
        loaded.append(ep.value)
    for name in filter(None, (m.strip() for m in os.environ.get(PLUGIN_ENV, "").split(","))):
        importlib.import_module(name)
        loaded.append(name)
    return loaded


def _run(fn: Handler, message: Message, context: Context,
         policy: NodePolicy | None = None, data: Mapping[str, Any] | None = None) -> Message:
    node = NodeContext(context, message.content, policy, data)
    records = message.content.config_records
    try:
        check_finite(message.content, node.who)
        node.check_server_data()
        if MAIL_DIRECTORY in records or MAIL_IN in records:
            node.mailbox  # noqa: B018  (keeps directory and mail even if this handler reads none)
        if is_sum_handler(fn):  # before the handler computes or keeps anything
            check_sum_request(node)
        reply: RecordDict = fn(message.content, node)
    except Exception as exc:  # its text goes to the server: no path of this node in it
        scrub_exception(exc, node_paths(context.node_config, data), node.who)
        raise
    if "mailbox" in vars(node):  # the handler used the sealed relay: send its mail along
        reply = node.mailbox.attach(reply)
    return Message(reply, reply_to=message)


def _protocol_of(message: Message, table: dict[str, Handler], kind: str) -> Handler:
    protocol = ""
    for record in message.content.config_records.values():
        if PROTOCOL_KEY in record:
            protocol = str(record[PROTOCOL_KEY]).replace("-", "_")
            break
    if protocol not in table:
        raise ValueError(
            f"{kind} message names protocol {protocol!r} (config key '{PROTOCOL_KEY}'); "
            f"this node has {kind} handlers for: {sorted(table)}"
        )
    return table[protocol]


def build_client_app(extra_modules: Iterable[str] = (),
                     policy: NodePolicy | Mapping[str, Any] | None = None,
                     data: Mapping[str, Any] | None = None) -> ClientApp:
    """A ClientApp with every handler registered so far (built-in, plugins, ``extra_modules``).

    ``policy``: the node policy built into the app (a NodePolicy or ``{key: value}``;
    None reads ``$FEDREC_NODE_POLICY``); each node's config can override it. The diagnostic
    actions are added only when ``extra_modules`` names ``clients.diagnostics`` or the
    policy says ``diagnostics=true``. ``data``: the data description every node of the app
    offers (dataset, split, partition scheme: ``datasets.data_keys``), as a simulation's
    operator sets it; each node's config can override it, and a node without one refuses
    every request that needs its data (a deployed SuperNode names its own in node config).
    """
    base = NodePolicy.coerce(policy)
    offered = _data_description(data)
    extra = list(extra_modules)
    diagnostics = base.diagnostics or DIAGNOSTICS_MODULE in extra
    if diagnostics and DIAGNOSTICS_MODULE not in extra:
        extra.append(DIAGNOSTICS_MODULE)
    load_client_plugins(extra)
    client_app = ClientApp()
    actions = dict(QUERY_HANDLERS)
    if diagnostics:
        clash = sorted(set(actions) & set(DIAGNOSTIC_HANDLERS))
        if clash:
            raise ValueError(f"diagnostic action(s) {clash} clash with query actions")
        actions.update(DIAGNOSTIC_HANDLERS)

    for action, fn in sorted(actions.items()):
        client_app.query(action)(_Query(fn, base, offered))
    client_app.train()(_ByProtocol("train", TRAIN_HANDLERS, base, offered))
    client_app.evaluate()(_ByProtocol("evaluate", EVALUATE_HANDLERS, base, offered))
    return client_app


def _data_description(data: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """``data`` as a full, checked description (an error names the bad key before any node
    starts), or None."""
    if data is None:
        return None
    from datasets import data_keys, describe

    return describe({k: v for k, v in data.items() if k in data_keys()})


class _Query:
    """A ClientApp entry that runs one handler under the app's policy.

    A module-level class, not a closure, because a Flower simulation pickles the ClientApp
    with every message it hands a worker: closures travel by value (8.3 kB and ~1.3 ms of
    the server process per message with 35 actions), these by reference (2.9 kB)."""

    def __init__(self, fn: Handler, policy: NodePolicy,
                 data: Mapping[str, Any] | None = None) -> None:
        self.fn, self.policy, self.data = fn, policy, data

    def __call__(self, message: Message, context: Context) -> Message:
        return _run(self.fn, message, context, self.policy, self.data)


class _ByProtocol:
    """The ``train`` / ``evaluate`` entry: the handler the message's protocol names in
    ``table`` (the registry itself: pickled with the app, it reaches a simulation's workers
    with every protocol registered in the server process, as the closure's did)."""

    def __init__(self, kind: str, table: dict[str, Handler], policy: NodePolicy,
                 data: Mapping[str, Any] | None = None) -> None:
        self.kind, self.table, self.policy, self.data = kind, table, policy, data

    def __call__(self, message: Message, context: Context) -> Message:
        return _run(_protocol_of(message, self.table, self.kind), message, context,
                    self.policy, self.data)


def registered_actions(client_app: ClientApp) -> list[str]:
    """Every message type a ClientApp answers (``query.<action>``, ``train``, ...): what a
    review of its attack surface starts from."""
    return sorted(client_app._registered_funcs)  # noqa: SLF001  (Flower keeps no public list)


quiet_flower_noise()  # in simulation this module is imported by each Ray worker too
app = build_client_app()
