"""A malicious server for the tests: any protocol, run against the real ClientApp, with a
server that rewrites requests before a node sees them and replays or invents requests.

Why: the privacy a node promises must hold against a server that deviates, and a security
review replays attacks that were not foreseen. The attacks of a class (survivor lists, node
sets, configs, chosen models, sizes, retries) are all sequences of requests; this grid lets a
test write such a sequence in a few lines against the production handlers
(``fl_app.client_app:app`` or ``build_client_app(policy=...)``), each node keeping its own
Flower ``Context`` (state) across the run, as a SuperNode does.

Use:

- ``MaliciousGrid(app, n, rewrite=fn)``: ``fn(message) -> RecordDict | None`` sees every
  request the (honest) strategy or aggregator pushes; a returned RecordDict replaces the
  content the node receives (None keeps it). Every (request as delivered, reply) pair is in
  ``grid.log``.
- ``grid.ask(node, action, content)``: a request the server makes up (``query.<action>``
  unless ``message_type`` is given), delivered now; returns the reply content or raises
  :class:`Refused` with the node's error text.
- ``grid.replay(message, content=None)``: deliver an earlier request again (optionally with
  other content) to the same node.
- ``grid.requests(action)``: the requests of an action as delivered, in order.
- ``MaliciousGrid(app, n, drop=(i, k))``: node index ``i`` stops answering after ``k``
  requests (a dropout, so that the sums' consistency round runs).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from flwr.app import Message, RecordDict

from tests.localgrid import AppFn, LocalGrid

Rewrite = Callable[[Message], RecordDict | None]


class Refused(RuntimeError):
    """A node answered a request with an error (its text is the node's)."""


def copy_content(content: RecordDict) -> RecordDict:
    """A deep copy of a request's records (a rewrite must not alter what other nodes get)."""
    return RecordDict({key: value.copy() if hasattr(value, "copy") else value
                       for key, value in content.items()})


class MaliciousGrid(LocalGrid):
    """:class:`LocalGrid` whose server rewrites, replays and invents requests."""

    def __init__(self, app: AppFn, num_nodes: int = 3, *, rewrite: Rewrite | None = None,
                 drop: tuple[int, int] | None = None, **kwargs: Any) -> None:
        super().__init__(app, num_nodes, **kwargs)
        self.rewrite = rewrite
        self.log: list[tuple[Message, Message]] = []
        #: (node index, requests): that node stops answering after so many requests
        self.drop = drop
        self._asked: dict[int, int] = {}

    def push_messages(self, messages: Any) -> Any:
        if self.drop is not None:
            messages = list(messages)
            node = self.ids[self.drop[0]]
            asked = self._asked.get(node, 0) + sum(m.metadata.dst_node_id == node
                                                   for m in messages)
            self._asked[node] = asked
            if asked > self.drop[1]:
                self.silent.add(node)
        return super().push_messages(messages)

    def _process(self, msg: Message) -> Message:
        if self.rewrite is not None:
            content = self.rewrite(msg)
            if content is not None:
                msg = self._with_content(msg, content)
        reply = super()._process(msg)
        self.log.append((msg, reply))
        return reply

    @staticmethod
    def _with_content(msg: Message, content: RecordDict) -> Message:
        out = Message(content, dst_node_id=msg.metadata.dst_node_id,
                      message_type=msg.metadata.message_type, group_id=msg.metadata.group_id)
        out.metadata.__dict__["_message_id"] = msg.metadata.message_id
        return out

    # -- the server's own requests -------------------------------------------------------
    def deliver(self, msg: Message) -> RecordDict:
        """Run one request on its node now; the reply content, or :class:`Refused`."""
        msg.metadata.__dict__["_message_id"] = msg.metadata.message_id or "forged"
        reply = LocalGrid._process(self, msg)
        self.log.append((msg, reply))
        if reply.has_error():
            raise Refused(reply.error.reason)
        return reply.content

    def ask(self, node: int, action: str, content: RecordDict, *,
            message_type: str | None = None) -> RecordDict:
        """A request the server makes up, to ``node``."""
        msg = Message(content, dst_node_id=node,
                      message_type=message_type or f"query.{action}", group_id="attack")
        msg.metadata.__dict__["_message_id"] = f"attack-{len(self.log)}"
        return self.deliver(msg)

    def replay(self, message: Message, content: RecordDict | None = None) -> RecordDict:
        """An earlier request delivered again to its node (with ``content`` if given)."""
        new = Message(copy_content(message.content) if content is None else content,
                      dst_node_id=message.metadata.dst_node_id,
                      message_type=message.metadata.message_type,
                      group_id=message.metadata.group_id)
        new.metadata.__dict__["_message_id"] = f"replay-{len(self.log)}"
        return self.deliver(new)

    def requests(self, action: str) -> list[Message]:
        """The requests of ``action`` (``query.<action>`` or a message type), as delivered."""
        wanted = {action, f"query.{action}"}
        return [req for req, _ in self.log if req.metadata.message_type in wanted]


def production_handlers() -> tuple[list[str], list[str], list[str]]:
    """(query actions, train protocols, evaluate protocols) of a production ClientApp: the
    handlers the project's own ``clients`` package registers once every registered
    protocol's modules are imported. Handlers that tests or examples registered in the same
    process (a test worker runs several files) are not the project's, so harnesses that
    must cover every handler enumerate these."""
    from clients.handlers import EVALUATE_HANDLERS, QUERY_HANDLERS, TRAIN_HANDLERS
    from fl_app.client_app import load_client_plugins

    load_client_plugins()

    def ours(table: dict) -> list[str]:
        return sorted(name for name, fn in table.items()
                      if fn.__module__.split(".")[0] == "clients")

    return ours(QUERY_HANDLERS), ours(TRAIN_HANDLERS), ours(EVALUATE_HANDLERS)
