"""A tiny in-process Flower ``Grid`` for fast unit tests of the messaging layer (no Ray).

``LocalGrid`` holds N fake nodes, each with its own ``flwr.app.Context`` (``partition-id`` /
``num-partitions`` node config and a persistent state ``RecordDict``). ``push_messages``
assigns message ids the way Flower's ``InMemoryGrid`` does and runs the ClientApp (or any
``(message, context) -> Message`` callable) synchronously; the replies are stored and handed
out by ``pull_messages``. A handler that raises becomes an error reply, as in Flower's
simulation engine (``flwr/server/superlink/fleet/vce/vce_api.py``).

Knobs for tests:

- ``silent``: node ids that never answer (their requests vanish), to test timeouts;
- ``unavailable``: node ids whose requests get the error reply a SuperLink writes for a node
  that stopped sending heartbeats (``ErrorCode.NODE_UNAVAILABLE``);
- ``pull_limit``: at most this many replies per ``pull_messages`` call, so replies "arrive"
  one poll after another (to test incremental consumption);
- ``reverse``: hand replies out in the reverse of the requested order (another arrival
  order, to test that reductions do not depend on it);
- ``node_configs``: extra node config per node index (e.g. ``{"role": "item-server"}``);
- ``cold_start``: seconds before each node's first reply can be pulled (a node's start, as
  Flower's simulation creating its Ray actors when the first messages arrive);
- ``data``: the data description every node's operator sets (a run config or any mapping
  with the keys of ``datasets.data_keys``), put in each node's config as a deployed
  SuperNode's operator would; a node never takes it from the server. Default (None): the
  operator describes the data of the run the test's strategy starts, as
  ``run_in_simulation`` does from its run config: the first message the strategy pushes
  with a data description (before any test rewrite) sets every node's, once, all nodes
  alike. Requests a test makes up (``MaliciousGrid.ask``) never set it.

Use it as a context manager (or call :meth:`close`): creating instruction messages needs
Flower's process-wide ``TaskIdentity`` (run id, server node id), which the grid sets and
restores.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any
from uuid import uuid4

from flwr.app import Context, Error, Message, RecordDict
from flwr.common.constant import SUPERLINK_NODE_ID, ErrorCode
from flwr.serverapp import Grid
from flwr.supercore.task_identity import TaskIdentity

AppFn = Callable[[Message, Context], Message]


class LocalGrid(Grid):
    """Synchronous in-process Grid over ``num_nodes`` fake SuperNodes."""

    def __init__(
        self,
        app: AppFn,
        num_nodes: int = 3,
        *,
        silent: Iterable[int] = (),
        unavailable: Iterable[int] = (),
        pull_limit: int | None = None,
        run_id: int = 1,
        first_node_id: int = 1001,
        reverse: bool = False,
        node_configs: dict[int, dict[str, Any]] | None = None,
        cold_start: float = 0.0,
        data: Mapping[str, Any] | None = None,
    ) -> None:
        from datasets import describe

        self.app = app
        self.run_id = run_id
        self.ids = [first_node_id + i for i in range(num_nodes)]
        offered = describe(data) if data is not None else {}
        self._adopt_data = data is None
        self.contexts: dict[int, Context] = {
            nid: Context(
                run_id=run_id,
                node_id=nid,
                node_config={**offered, "partition-id": i, "num-partitions": num_nodes,
                             **(node_configs or {}).get(i, {})},
                state=RecordDict(),
                run_config={},
            )
            for i, nid in enumerate(self.ids)
        }
        self.silent = set(silent)
        self.unavailable = set(unavailable)
        self.pull_limit = pull_limit
        self.reverse = reverse
        self.cold_start = cold_start
        self._ready_at: dict[str, float] = {}  # request id -> when its reply may be pulled
        self._started: set[int] = set()
        self.pushed: list[Message] = []
        self.pull_calls = 0
        self._replies: dict[str, Message] = {}  # request id -> reply
        self._run: Any = None
        self._saved_identity = (TaskIdentity._task_id, TaskIdentity._run_id,
                                TaskIdentity._node_id)
        TaskIdentity.task_id = 1
        TaskIdentity.run_id = run_id
        TaskIdentity.node_id = SUPERLINK_NODE_ID

    # -- lifecycle -----------------------------------------------------------------------
    def close(self) -> None:
        """Restore Flower's process-wide TaskIdentity."""
        (TaskIdentity._task_id, TaskIdentity._run_id,
         TaskIdentity._node_id) = self._saved_identity

    def __enter__(self) -> LocalGrid:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- Grid API ------------------------------------------------------------------------
    def set_run(self, run: Any) -> None:
        self._run = run

    @property
    def run(self) -> Any:
        return self._run

    def create_message(self, content: RecordDict, message_type: str, dst_node_id: int,
                       group_id: str, ttl: float | None = None) -> Message:
        return Message(content, dst_node_id=dst_node_id, message_type=message_type,
                       ttl=ttl, group_id=group_id)

    def get_node_ids(self) -> Iterable[int]:
        return list(self.ids)

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        ids: list[str] = []
        messages = list(messages)
        if self._adopt_data:
            self._adopt_run_data(messages)
        for msg in messages:
            msg.metadata.__dict__["_message_id"] = str(uuid4())  # as InMemoryGrid does
            node = msg.metadata.dst_node_id
            if node not in self.contexts:  # InMemoryGrid drops messages to unknown nodes
                continue
            ids.append(msg.metadata.message_id)
            self.pushed.append(msg)
            if node in self.silent:
                continue
            self._replies[msg.metadata.message_id] = self._process(msg)
            if node not in self._started:
                self._started.add(node)
                self._ready_at[msg.metadata.message_id] = time.monotonic() + self.cold_start
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        self.pull_calls += 1
        out: list[Message] = []
        ids = list(message_ids)
        for mid in reversed(ids) if self.reverse else ids:
            if self.pull_limit is not None and len(out) >= self.pull_limit:
                break
            if self._ready_at.get(mid, 0.0) > time.monotonic():
                continue
            reply = self._replies.pop(mid, None)
            if reply is not None:
                out.append(reply)
        return out

    def send_and_receive(self, messages: Iterable[Message], *,
                         timeout: float | None = None) -> Iterable[Message]:
        pending = set(self.push_messages(messages))
        end = None if timeout is None else time.monotonic() + timeout
        out: list[Message] = []
        while pending and (end is None or time.monotonic() < end):
            got = list(self.pull_messages(pending))
            out.extend(got)
            pending -= {m.metadata.reply_to_message_id for m in got}
            if pending and not got:
                time.sleep(0.01)
        return out

    # -- the operator's data description ---------------------------------------------------
    def _adopt_run_data(self, messages: list[Message]) -> None:
        """Every node's operator describes the data the run asks for (``data=None``): the
        first pushed message naming a description sets all nodes' node config, once."""
        from datasets import data_keys, describe
        from fedrec.wire.handshake import DATA
        from fedrec.wire.request import STOCK_CONFIG

        for msg in messages:
            records = msg.content.config_records
            named = records.get(DATA) or (records.get(STOCK_CONFIG)
                                          if "dataset" in records.get(STOCK_CONFIG, {}) else None)
            if named is not None:
                offered = describe({k: v for k, v in named.items() if k in data_keys()})
                self.adopt_data(offered)
                return

    def adopt_data(self, offered: Mapping[str, Any]) -> None:
        """Set every node's data description (its node config's data keys), once."""
        self._adopt_data = False
        for context in self.contexts.values():
            for key, value in offered.items():
                context.node_config.setdefault(key, value)

    # -- node side -----------------------------------------------------------------------
    def _process(self, msg: Message) -> Message:
        if msg.metadata.dst_node_id in self.unavailable:
            reply = Message(Error(code=ErrorCode.NODE_UNAVAILABLE,
                                  reason="Error: Node Unavailable"), reply_to=msg)
            reply.metadata.__dict__["_message_id"] = str(uuid4())
            return reply
        context = self.contexts[msg.metadata.dst_node_id]
        try:
            reply = self.app(msg, context)
        except Exception as ex:  # noqa: BLE001  (reported as an error reply, like Flower)
            reason = str(type(ex)) + ":<'" + str(ex) + "'>"
            reply = Message(Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason=reason),
                            reply_to=msg)
        reply.metadata.__dict__["_message_id"] = str(uuid4())
        return reply

    def pending_replies(self) -> int:
        """Replies stored but not pulled yet."""
        return len(self._replies)
