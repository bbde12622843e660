"""A lost node fails the run naming it (node id and partition) and why, on every path.

In process (``tests.localgrid.LocalGrid``): a node either goes *unavailable* (its requests
get the error reply a SuperLink writes for a node whose heartbeats stopped,
``NODE_UNAVAILABLE``) or *silent* (its requests vanish; the server's deadline notices).
Each path a request takes is checked: ``Messenger.send`` / ``iter_replies`` / ``broadcast``,
``AccountedGrid.send_and_receive`` (stock strategies), a plain sum and a SecAgg+ masked sum
in the middle of a FedMF run, whose failed record must also keep the history up to the
failure. The deployed version (a SuperNode killed with SIGKILL) is
``tests/test_deployment_failure.py``.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
from flwr.app import Message, RecordDict

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from fedrec.transport.messenger import AccountedGrid, Messenger, NodeTimeoutError  # noqa: E402
from tests.localgrid import LocalGrid  # noqa: E402

#: Tiny synthetic data, as the deployment matrix's (tests/test_deployment.py).
TINY = {"dataset": "synthetic", "synthetic-users": 60, "synthetic-items": 80, "seed": 2}
POLICY = {"allow-plain": True}
UNAVAILABLE = "the SuperLink reports it unavailable"
SILENT = "silent past the timeout"


def _echo(msg: Message, _context: Any) -> Message:
    return Message(RecordDict(), reply_to=msg)


def _labelled(grid: LocalGrid, timeout: float) -> Messenger:
    messenger = Messenger(grid, timeout=timeout)
    for i, n in enumerate(grid.ids):
        messenger.report.name_node(n, f"partition {i}")
    return messenger


@pytest.mark.parametrize(("knob", "reason"), [("unavailable", UNAVAILABLE), ("silent", SILENT)])
@pytest.mark.parametrize("path", ["send", "iter_replies", "broadcast", "send_and_receive"])
def test_every_request_path_names_the_lost_node_and_why(knob: str, reason: str,
                                                        path: str) -> None:
    with LocalGrid(_echo, 3, **{knob: [1003]}) as grid:
        messenger = _labelled(grid, timeout=0.3)
        contents = {n: RecordDict() for n in grid.ids}
        with pytest.raises(NodeTimeoutError) as err:
            if path == "send":
                messenger.send("probe", contents)
            elif path == "iter_replies":
                list(messenger.iter_replies("probe", contents))
            elif path == "broadcast":
                messenger.broadcast("probe", RecordDict())
            else:
                AccountedGrid(grid, messenger).send_and_receive(
                    [grid.create_message(RecordDict(), "query.probe", n, "g") for n in grid.ids])
    text = str(err.value)
    assert "node 1003 (partition 2)" in text and reason in text, text
    assert "1001" not in text and "1002" not in text  # no survivor is blamed


def test_a_tolerated_dropout_is_recorded_with_its_reason() -> None:
    """``allow_missing`` rounds (SecAgg+) record each node with its own reason."""
    with LocalGrid(_echo, 4, unavailable=[1003], silent=[1004]) as grid:
        messenger = _labelled(grid, timeout=0.3)
        replies = dict(messenger.iter_replies("probe", {n: RecordDict() for n in grid.ids},
                                              allow_missing=True))
    assert set(replies) == {1001, 1002}
    why = {tuple(d["node_ids"]): d["why"] for d in messenger.report.dropouts()}
    assert UNAVAILABLE in why[(1003,)] and SILENT in why[(1004,)]
    lost = messenger.lost_nodes()
    assert "node 1003 (partition 2) in 'probe'" in lost and "node 1004 (partition 3)" in lost


class _LosingGrid(LocalGrid):
    """A LocalGrid whose ``victim`` goes unavailable or silent from its ``nth`` request of
    ``action`` on (a node lost mid-run)."""

    def __init__(self, app: Any, num_nodes: int, *, victim_index: int, action: str, nth: int,
                 knob: str) -> None:
        super().__init__(app, num_nodes)
        self.victim, self.action, self.nth, self.knob = self.ids[victim_index], action, nth, knob
        self.seen = 0

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        messages = list(messages)
        for msg in messages:
            if (msg.metadata.dst_node_id == self.victim
                    and msg.metadata.message_type == f"query.{self.action}"):
                self.seen += 1
                if self.seen == self.nth:
                    getattr(self, self.knob).add(self.victim)
        return super().push_messages(messages)


@pytest.mark.parametrize("aggregator", ["plain", "secagg+"])
@pytest.mark.parametrize(("knob", "reason"), [("unavailable", UNAVAILABLE), ("silent", SILENT)])
def test_a_node_lost_in_round_two_fails_the_run_naming_it_with_the_history_so_far(
        aggregator: str, knob: str, reason: str) -> None:
    """FedMF, three rounds; partition 2 is lost at round 2's training sum. The run fails
    naming that node and the reason before any survivor is asked to unmask (SecAgg+: the
    sum is abandoned under the default node policy); the failed record has round 1's row."""
    from fl_app.client_app import build_client_app
    from fl_app.registry import resolve_config
    from fl_app.server_app import attempt_protocol

    cfg = resolve_config({**TINY, "protocol": "fedmf", "rounds": 3, "mf-dim": 4,
                          "aggregator": aggregator, "timeout": 0.5, "run-name": "lost-node"})
    app = build_client_app(["clients.fedmf"], policy=POLICY)
    with _LosingGrid(app, 3, victim_index=2, action="fedmf_train", nth=2, knob=knob) as grid:
        attempt = attempt_protocol(grid, cfg)
        victim, ids = grid.victim, list(grid.ids)
        asked_to_unmask = [m.metadata.dst_node_id for m in grid.pushed
                           if m.metadata.message_type == "query.secagg_unmask"]
    record = attempt.record
    assert attempt.error is not None
    error = record["error"]
    assert f"node {victim} (partition 2)" in error and reason in error, error
    assert "refuses" not in error  # no survivor refused on the lost node's behalf
    # SecAgg+: round 1's unmasking asked every node; round 2's sum was abandoned before any
    # survivor was asked to unmask
    assert sorted(asked_to_unmask) == (ids if aggregator == "secagg+" else [])
    assert record["status"] == "failed"
    assert [row["round"] for row in record["history"]] == [1]
    assert record["metrics"] == {k: v for k, v in record["history"][0].items()
                                 if k != "round"}
    assert record["communication"]["phases"]["train"]["rounds"] >= 2


def test_the_deployed_serverapp_raises_the_record_error() -> None:
    """Flower shows the ServerApp's exception as the run's status details (``flwr ls``), so
    the deployed ServerApp raises the record's error, lost node first."""
    from fl_app.registry import resolve_config
    from fl_app.server_app import RunFailedError, failed_record

    with LocalGrid(_echo, 3, unavailable=[1003]) as grid:
        messenger = _labelled(grid, timeout=0.3)
        list(messenger.iter_replies("probe", {n: RecordDict() for n in grid.ids},
                                    allow_missing=True))
    cfg = resolve_config({**TINY, "protocol": "fedmf"})
    record = failed_record(cfg, ValueError("a later step failed"), messenger, 1.0)
    assert record["error"].startswith(f"lost node 1003 (partition 2) in 'probe' (probe): "
                                      f"{UNAVAILABLE}. ValueError: a later step failed")
    assert record["history"] == [] and record["metrics"] == {}
    assert issubclass(RunFailedError, RuntimeError)
