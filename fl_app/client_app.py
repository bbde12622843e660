"""The ClientApp: every registered client handler, exposed as a Flower action.

``query.<action>`` messages go to :data:`clients.registry.QUERY_HANDLERS`; Flower's stock
``train`` / ``evaluate`` messages (sent by stock strategies such as ``FedAvg``) go to the
handler of the protocol named in the message's config (``fedrec-protocol``).
"""

from __future__ import annotations

import importlib
import os
from importlib.metadata import entry_points

from flwr.app import Context, Message, RecordDict
from flwr.clientapp import ClientApp

import clients.common  # noqa: F401  (the imports register the built-in handlers)
import clients.diagnostics  # noqa: F401
import clients.fedmf  # noqa: F401
import clients.keyrelay  # noqa: F401
import clients.privirec  # noqa: F401
import clients.secagg  # noqa: F401
from clients.node import NodeContext
from clients.registry import EVALUATE_HANDLERS, QUERY_HANDLERS, TRAIN_HANDLERS, Handler

PLUGIN_GROUP = "fedrec_privacy.clients"
PLUGIN_ENV = "FEDREC_CLIENT_MODULES"
PROTOCOL_KEY = "fedrec-protocol"


def load_client_plugins() -> list[str]:
    """Import users' handler modules (entry points and ``$FEDREC_CLIENT_MODULES``)."""
    loaded = []
    for ep in entry_points(group=PLUGIN_GROUP):
        ep.load()
        loaded.append(ep.value)
    for name in filter(None, (m.strip() for m in os.environ.get(PLUGIN_ENV, "").split(","))):
        importlib.import_module(name)
        loaded.append(name)
    return loaded


def _run(fn: Handler, message: Message, context: Context) -> Message:
    reply: RecordDict = fn(message.content, NodeContext(context, message.content))
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


def build_client_app() -> ClientApp:
    """A ClientApp with every handler registered so far (built-in and plugins)."""
    load_client_plugins()
    client_app = ClientApp()

    for action, fn in sorted(QUERY_HANDLERS.items()):
        def query(message: Message, context: Context, _fn: Handler = fn) -> Message:
            return _run(_fn, message, context)

        client_app.query(action)(query)

    @client_app.train()
    def train(message: Message, context: Context) -> Message:
        return _run(_protocol_of(message, TRAIN_HANDLERS, "train"), message, context)

    @client_app.evaluate()
    def evaluate(message: Message, context: Context) -> Message:
        return _run(_protocol_of(message, EVALUATE_HANDLERS, "evaluate"), message, context)

    return client_app


app = build_client_app()
