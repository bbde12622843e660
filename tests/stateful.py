"""Handlers at the step of a run where they do their work: each request captured with the
node's state just before it, from honest runs of the registered protocols.

Why: many handlers (key setup, sums, LP-GCN's setup and rounds, PriviRec's evaluation) refuse
at once without the state earlier requests of the run set up, so a request sent alone never
reaches the allocations that matter. An honest run on a :class:`tests.malicious.MaliciousGrid`
records, for every request a node receives, the request and a copy of that node's Flower
state before it (:class:`Step`); a test then sends the same node, from a fresh copy of that
state, the request as the server altered it (:meth:`Step.deliver`), as often as it likes.

The runs are ``tests/test_differential.py``'s cases (one per registered protocol, tiny
synthetic data), taken in :data:`ORDER` until every wanted action is reached.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from flwr.app import Context, Message, RecordDict

from tests.differential import copy_records
from tests.malicious import MaliciousGrid

#: The cases run first (between them, every stateful handler at the time of writing);
#: the other cases follow only while an action is still missing.
ORDER = ("fedmf@dropouts", "lpgcn", "privirec", "fedsvd-utility", "privmvmf")
#: Requests kept per action (a handler's later steps, e.g. LP-GCN's rounds, differ).
PER_ACTION = 12


class Step:
    """One request a node received in an honest run, with that node's state before it.

    A plain class: hypothesis prints a dataclass field by field (megabytes of state)."""

    def __init__(self, case: str, action: str, message_type: str, node_index: int,
                 num_nodes: int, node_config: dict[str, Any], state: RecordDict,
                 content: RecordDict) -> None:
        self.case, self.action, self.message_type = case, action, message_type
        self.node_index, self.num_nodes, self.node_config = node_index, num_nodes, node_config
        self.state, self.content = state, content

    def __repr__(self) -> str:  # what hypothesis prints for a drawn step (not its state)
        return f"Step({self.case}: {self.action} at node index {self.node_index})"

    def request(self) -> RecordDict:
        """A fresh copy of the honest request (to alter before :meth:`deliver`)."""
        return copy_records(self.content)

    def deliver(self, app: Any, content: RecordDict) -> RecordDict:
        """``content`` to this step's node, from a fresh copy of its state, on ``app``;
        the reply content or :class:`tests.malicious.Refused`."""
        with MaliciousGrid(app, self.num_nodes) as grid:
            node = grid.ids[self.node_index]
            grid.contexts[node] = Context(run_id=grid.run_id, node_id=node,
                                          node_config=dict(self.node_config),
                                          state=copy_records(self.state), run_config={})
            return grid.ask(node, self.action, content, message_type=self.message_type)


class _Recorder(MaliciousGrid):
    """A grid that keeps each wanted request with its node's state before it."""

    def __init__(self, app: Any, num_nodes: int, case: str, wanted: set[str],
                 **kwargs: Any) -> None:
        super().__init__(app, num_nodes, **kwargs)
        self.case, self.wanted = case, wanted
        self.steps: dict[str, list[Step]] = {}

    def _process(self, msg: Message) -> Message:
        action = msg.metadata.message_type.removeprefix("query.")
        node = msg.metadata.dst_node_id
        kept = self.steps.setdefault(action, []) if action in self.wanted else None
        if kept is not None and len(kept) < PER_ACTION and node not in self.silent and (
                not kept or kept[0].node_index == self.ids.index(node)):
            context = self.contexts[node]
            kept.append(Step(self.case, action, msg.metadata.message_type,
                             self.ids.index(node), len(self.ids), dict(context.node_config),
                             copy_records(context.state), copy_records(msg.content)))
        return super()._process(msg)


def capture(wanted: Iterable[str], cases: Mapping[str, Any], data: Mapping[str, Any],
            policy: Mapping[str, Any]) -> dict[str, list[Step]]:
    """The steps of every action in ``wanted`` that honest runs of ``cases`` (in
    :data:`ORDER`, then the others) reach, each run under its case's policy plus
    ``policy``; stops once every wanted action has steps."""
    from fl_app.client_app import build_client_app
    from fl_app.registry import client_module, resolve_config
    from fl_app.server_app import run_protocol

    wanted = set(wanted)
    steps: dict[str, list[Step]] = {}
    for name in [*ORDER, *sorted(set(cases) - set(ORDER))]:
        if name not in cases or wanted <= set(steps):
            continue
        case, protocol = cases[name], name.split("@")[0]
        cfg = resolve_config({**data, **case.overrides, "protocol": protocol,
                              "run-name": f"stateful-{protocol}"})
        app = build_client_app([m for m in [client_module(protocol)] if m],
                               policy={**case.policy, **policy})
        with _Recorder(app, case.nodes, name, wanted - set(steps), drop=case.drop) as grid:
            run_protocol(grid, cfg)
        steps.update({a: s for a, s in grid.steps.items() if s})
    return steps
