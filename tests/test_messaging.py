"""The messaging layer: byte accounting, timeouts, node errors, incremental replies.

Fast tests run the real ClientApp (``fl_app.client_app.build_client_app``) on the in-process
:class:`localgrid.LocalGrid`; one test checks the byte accounting in a real Flower simulation.
"""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.serverapp import Grid, ServerApp

from clients.handlers import handler
from clients.node import NodeContext
from fedrec.transport.messenger import (
    AccountedGrid,
    CommLedger,
    Messenger,
    NodeError,
    NodeTimeoutError,
    message_nbytes,
)
from fl_app.simulation import simulate

try:  # tests/ as a package (tests/__init__.py) or as a rootdir-inserted folder
    from tests.localgrid import LocalGrid
except ImportError:  # pragma: no cover
    from localgrid import LocalGrid

N_VALUES = 10_000
PAYLOAD = N_VALUES * 8  # float64 bytes of the array
OVERHEAD = 2_000  # npy header + Flower object headers + metadata, generously


@handler("msgtest_echo")
def _echo(content: RecordDict, node: NodeContext) -> RecordDict:
    """Send the request back unchanged."""
    return content


@handler("msgtest_fail")
def _fail(content: RecordDict, node: NodeContext) -> RecordDict:
    raise ValueError(f"boom on partition {node.partition_id}")


@handler("msgtest_count")
def _count(content: RecordDict, node: NodeContext) -> RecordDict:
    """A tiny reply carrying the node's partition and a per-node call counter (in state)."""
    n = int(node.state.config_records["msgtest"]["n"]) + 1 if "msgtest" in \
        node.state.config_records else 1
    node.state.config_records["msgtest"] = ConfigRecord({"n": n})
    return RecordDict({"r": ConfigRecord({"partition": node.partition_id, "n": n})})


def _client_app():  # built after the handlers above are registered
    from fl_app.client_app import build_client_app

    return build_client_app()


def _array_content(n: int = N_VALUES) -> RecordDict:
    return RecordDict({"x": ArrayRecord({"v": Array(np.arange(n, dtype=np.float64))})})


@pytest.fixture(scope="module")
def client_app():
    return _client_app()


@pytest.fixture
def grid3(client_app):
    with LocalGrid(client_app, 3) as grid:
        yield grid


# -- byte accounting -------------------------------------------------------------------

def test_broadcast_accounts_known_payload_size(grid3: LocalGrid) -> None:
    messenger = Messenger(grid3, timeout=5)
    replies = messenger.broadcast("msgtest_echo", _array_content())
    assert sorted(replies) == grid3.ids
    for reply in replies.values():
        np.testing.assert_array_equal(reply["x"]["v"].numpy(), np.arange(N_VALUES, dtype=float))
    ledger = messenger.ledger
    for node in grid3.ids:
        assert PAYLOAD <= ledger.node_down[node] <= PAYLOAD + OVERHEAD
        # the echo carries the same array back
        assert PAYLOAD <= ledger.node_up[node] <= PAYLOAD + OVERHEAD
    phase = ledger.phases["msgtest_echo"]
    assert phase.rounds == 1
    assert phase.messages == 6
    assert phase.bytes_down == sum(ledger.node_down.values())
    assert phase.bytes_up == sum(ledger.node_up.values())
    assert ledger.rounds[0]["nodes"] == 3


def test_message_nbytes_grows_with_the_array(grid3: LocalGrid) -> None:
    small = Message(_array_content(N_VALUES), dst_node_id=grid3.ids[0],
                    message_type="query.msgtest_echo")
    big = Message(_array_content(2 * N_VALUES), dst_node_id=grid3.ids[0],
                  message_type="query.msgtest_echo")
    grown = message_nbytes(big) - message_nbytes(small)
    assert PAYLOAD <= grown <= PAYLOAD + 100
    empty = Message(RecordDict(), dst_node_id=grid3.ids[0], message_type="query.msgtest_echo")
    assert 0 < message_nbytes(empty) < 1_000


def test_replies_are_bytes_up_and_phases_count_rounds(grid3: LocalGrid) -> None:
    messenger = Messenger(grid3, timeout=5)
    # a big request and a tiny reply: down is the array, up is small
    contents = {node: _array_content() for node in grid3.ids}
    for _ in range(2):
        messenger.send("msgtest_count", contents, phase="step")
    messenger.broadcast("msgtest_count", RecordDict(), phase="final")
    ledger = messenger.ledger
    assert ledger.phases["step"].rounds == 2
    assert ledger.phases["final"].rounds == 1
    assert ledger.total_rounds == 3
    for node in grid3.ids:
        assert 2 * PAYLOAD <= ledger.node_down[node] <= 2 * (PAYLOAD + OVERHEAD) + 1_000
        assert 0 < ledger.node_up[node] < 3 * 1_000
    assert ledger.phases["step"].bytes_up < ledger.phases["step"].bytes_down / 100
    # node state persisted across the three messages
    final = messenger.broadcast("msgtest_count", RecordDict(), phase="final")
    assert {int(r["r"]["n"]) for r in final.values()} == {4}
    assert ledger.phases["final"].rounds == 2

    summary = ledger.to_dict()
    text = json.dumps(summary)  # JSON-serialisable
    back = json.loads(text)
    assert back["total_rounds"] == 4
    assert back["phases"]["step"]["rounds"] == 2
    assert set(back["node_bytes"]) == {str(n) for n in grid3.ids}
    assert back["bytes_per_node"]["mean_down"] >= 2 * PAYLOAD


def test_empty_ledger_to_dict() -> None:
    summary = CommLedger().to_dict()
    assert json.loads(json.dumps(summary))["total_rounds"] == 0


# -- timeouts and node errors ---------------------------------------------------------

def test_silent_node_times_out_and_is_named(client_app) -> None:
    with LocalGrid(client_app, 3, silent=[1002]) as grid:
        messenger = Messenger(grid, timeout=30)
        for i, nid in enumerate(grid.ids):
            messenger.report.name_node(nid, f"partition {i}")
        t0 = time.monotonic()
        with pytest.raises(NodeTimeoutError) as info:
            messenger.broadcast("msgtest_echo", RecordDict(), timeout=0.3)
        elapsed = time.monotonic() - t0
    assert 0.3 <= elapsed < 2.0
    text = str(info.value)
    assert "node 1002 (partition 1)" in text
    assert "partition 0" not in text and "partition 2" not in text
    assert "1 of 3" in text and "msgtest_echo" in text
    assert info.value.missing == ["node 1002 (partition 1)"]
    # the failed round is still in the ledger (the two answers arrived)
    assert messenger.ledger.total_rounds == 1
    assert set(messenger.ledger.node_up) == {1001, 1003}


class _Staggered(LocalGrid):
    """Replies that become ready one after another, ``gap`` seconds apart (a simulation's
    few workers answering a large round's nodes in turn)."""

    gap = 0.5

    def push_messages(self, messages):  # noqa: ANN001, ANN201
        ids = super().push_messages(messages)
        start = time.monotonic()
        for k, mid in enumerate(ids):
            self._ready_at[mid] = start + self.gap * (k + 1)
        return ids


def test_a_round_longer_than_the_timeout_completes_while_replies_keep_coming(
        client_app) -> None:
    """Six replies 0.5 s apart take 3 s, beyond a 2 s timeout: the deadline counts a node's
    silence from the last reply, so the round completes. A node silent after them still
    fails the round, naming it."""
    with _Staggered(client_app, 6) as grid:
        messenger = Messenger(grid, timeout=2.0)
        replies = messenger.broadcast("msgtest_echo", RecordDict())
        assert sorted(replies) == grid.ids
    with _Staggered(client_app, 6, silent=[1006]) as grid:
        messenger = Messenger(grid, timeout=2.0)
        with pytest.raises(NodeTimeoutError) as info:
            messenger.broadcast("msgtest_echo", RecordDict())
        assert info.value.missing == ["node 1006"]
        assert set(messenger.ledger.node_up) == set(grid.ids) - {1006}


def test_node_the_superlink_reports_unavailable_counts_as_silent(client_app) -> None:
    """A dead SuperNode is noticed by its missed heartbeats or by the deadline, whichever
    comes first; either way the run reports the same silence (a timeout error naming it,
    or a recorded dropout where the phase tolerates one), never a handler failure."""
    with LocalGrid(client_app, 3, unavailable=[1003]) as grid:
        messenger = Messenger(grid, timeout=30)
        for i, nid in enumerate(grid.ids):
            messenger.report.name_node(nid, f"partition {i}")
        t0 = time.monotonic()
        with pytest.raises(NodeTimeoutError) as info:
            messenger.broadcast("msgtest_echo", RecordDict())
        assert time.monotonic() - t0 < 2.0  # the error reply ends the wait at once
        assert "1 of 3 node(s) did not answer" in str(info.value)
        assert info.value.missing == [
            "node 1003 (partition 2) (the SuperLink reports it unavailable)"]
        replies = dict(messenger.iter_replies("msgtest_echo",
                                              {n: RecordDict() for n in grid.ids},
                                              allow_missing=True))
        assert set(replies) == {1001, 1002}
        assert messenger.last_missing == [1003]
        with pytest.raises(NodeTimeoutError, match="unavailable"):
            AccountedGrid(grid, messenger).send_and_receive(
                [grid.create_message(RecordDict(), "query.msgtest_echo", n, "g")
                 for n in grid.ids])


def test_handler_exception_becomes_node_error(client_app) -> None:
    with LocalGrid(client_app, 2) as grid:
        messenger = Messenger(grid, timeout=5)
        messenger.report.name_node(grid.ids[1], "silo B")
        with pytest.raises(NodeError) as info:
            messenger.send("msgtest_fail", {grid.ids[1]: RecordDict()})
    err = info.value
    assert err.node == f"node {grid.ids[1]} (silo B)"
    assert err.action == "msgtest_fail"
    assert "boom on partition 1" in err.reason
    assert "silo B" in str(err) and "boom on partition 1" in str(err)


# -- incremental replies ----------------------------------------------------------------

def test_iter_replies_yields_as_replies_arrive_and_records_early_stop(client_app) -> None:
    with LocalGrid(client_app, 4, pull_limit=1) as grid:
        messenger = Messenger(grid, timeout=5, poll_interval=0.001)
        gen = messenger.iter_replies("msgtest_echo", {n: _array_content() for n in grid.ids})
        node, reply = next(gen)
        # the first reply is yielded after one pull, while three are still waiting
        assert grid.pull_calls == 1
        assert grid.pending_replies() == 3
        assert node in grid.ids and reply["x"]["v"].numpy().shape == (N_VALUES,)
        node2, _ = next(gen)
        assert node2 != node and grid.pull_calls == 2
        assert messenger.ledger.total_rounds == 0  # the round is still open
        gen.close()  # the consumer stops early
    ledger = messenger.ledger
    assert ledger.total_rounds == 1
    row = ledger.rounds[0]
    assert row["nodes"] == 4  # four requests went out
    assert PAYLOAD * 4 <= row["bytes_down"] <= (PAYLOAD + OVERHEAD) * 4
    assert set(ledger.node_up) == {node, node2}  # only the two replies read
    assert ledger.phases["msgtest_echo"].messages == 4 + 2


# -- AccountedGrid (stock strategies) ---------------------------------------------------

def test_accounted_grid_send_and_receive_records_round(grid3: LocalGrid) -> None:
    messenger = Messenger(grid3, timeout=5)
    fast = AccountedGrid(grid3, messenger)
    assert list(fast.get_node_ids()) == grid3.ids
    msgs = [Message(_array_content(), dst_node_id=n, message_type="query.msgtest_count",
                    group_id="1") for n in grid3.ids]
    replies = list(fast.send_and_receive(msgs, timeout=5))
    assert sorted(r.metadata.src_node_id for r in replies) == grid3.ids
    assert all(not r.has_error() for r in replies)
    ledger = messenger.ledger
    assert ledger.total_rounds == 1
    assert ledger.phases["query.msgtest_count"].rounds == 1
    for node in grid3.ids:
        assert PAYLOAD <= ledger.node_down[node] <= PAYLOAD + OVERHEAD
        assert 0 < ledger.node_up[node] < 1_000


def test_accounted_grid_non_strict_returns_what_arrived_by_timeout(client_app) -> None:
    with LocalGrid(client_app, 3, silent=[1003]) as grid:
        messenger = Messenger(grid, timeout=5)
        fast = AccountedGrid(grid, messenger, strict=False)
        msgs = [Message(RecordDict(), dst_node_id=n, message_type="query.msgtest_echo")
                for n in grid.ids]
        t0 = time.monotonic()
        replies = list(fast.send_and_receive(msgs, timeout=0.3))
        assert time.monotonic() - t0 < 2.0
    assert sorted(r.metadata.src_node_id for r in replies) == [1001, 1002]
    row = messenger.ledger.rounds[0]
    assert row["nodes"] == 3 and set(messenger.ledger.node_up) == {1001, 1002}


def test_accounted_grid_strict_names_the_silent_node(client_app) -> None:
    with LocalGrid(client_app, 3, silent=[1003]) as grid:
        messenger = Messenger(grid, timeout=5)
        messenger.report.name_node(1003, "partition 2")
        fast = AccountedGrid(grid, messenger)
        msgs = [Message(RecordDict(), dst_node_id=n, message_type="query.msgtest_echo")
                for n in grid.ids]
        with pytest.raises(NodeTimeoutError, match=r"1 of 3 .*partition 2"):
            fast.send_and_receive(msgs, timeout=0.3)
    assert messenger.ledger.total_rounds == 1


def test_message_to_unknown_node_is_reported_not_misattributed(grid3: LocalGrid) -> None:
    messenger = Messenger(grid3, timeout=0.3)
    unknown = 999
    contents = {grid3.ids[0]: RecordDict(), unknown: RecordDict(), grid3.ids[1]: RecordDict()}
    try:
        replies = messenger.send("msgtest_count", contents)
    except (NodeError, NodeTimeoutError) as exc:
        assert "999" in str(exc)
        return
    # without an error, every reply must at least come from the node it is keyed by
    for node, reply in replies.items():
        assert node != unknown
        assert int(reply["r"]["partition"]) == grid3.ids.index(node)


# -- one real Flower simulation ----------------------------------------------------------

SIM_NODES = 4


@pytest.mark.timeout(300)
def test_byte_accounting_in_a_real_simulation(client_app) -> None:

    box: dict = {}
    server_app = ServerApp()

    @server_app.main()
    def main(grid: Grid, context: Context) -> None:
        messenger = Messenger(grid, timeout=120)
        ids = messenger.node_ids(SIM_NODES, wait=60)
        replies = messenger.broadcast("msgtest_echo", _array_content(), nodes=ids)
        box["replies"] = {n: r["x"]["v"].numpy().copy() for n, r in replies.items()}
        box["ids"] = ids
        box["ledger"] = messenger.ledger.to_dict()

    simulate(server_app, client_app, SIM_NODES,
             {"client_resources": {"num_cpus": 1, "num_gpus": 0.0},
              "init_args": {"include_dashboard": False}})
    assert "ledger" in box, "the ServerApp did not finish (see the log above)"
    assert len(box["ids"]) == SIM_NODES
    for arr in box["replies"].values():
        np.testing.assert_array_equal(arr, np.arange(N_VALUES, dtype=float))
    ledger = box["ledger"]
    assert ledger["total_rounds"] == 1
    assert len(ledger["node_bytes"]) == SIM_NODES
    for sizes in ledger["node_bytes"].values():
        assert PAYLOAD <= sizes["down"] <= PAYLOAD + OVERHEAD
        assert PAYLOAD <= sizes["up"] <= PAYLOAD + OVERHEAD
