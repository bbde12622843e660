"""Secure aggregation over Flower messages, on 6 nodes of the in-process grid."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from flwr.app import RecordDict

from clients.diagnostics import diagnostic_vector
from clients.sums_node import clipped_into_range
from fedrec.secure.fixedpoint import FixedPoint
from fedrec.secure.secagg import SecAggError, neighbour_graph
from fedrec.transport.aggregators import PlainAggregator
from fedrec.transport.messenger import Messenger, NodeError
from fedrec.transport.secagg_server import SecureAggregator
from fedrec.wire.sums import AggregationError, flatten
from tests.simutil import DIAGNOSTIC_APP, diag_expected, diag_request

N = 6
SHAPES = {"matrix": (7, 5), "vector": (300,)}
SEED = 5
MAX_ABS = 10.0


def _request() -> RecordDict:
    return diag_request(SEED, SHAPES)


def _expected(partitions: list[int]) -> dict[str, np.ndarray]:
    return diag_expected(SEED, SHAPES, partitions)


#: Nodes that let sums go on over fewer nodes (the dropout scenarios need it; the default
#: policy abandons a sum with a dropout before unmasking).
DROPOUTS = {**DIAGNOSTIC_APP["policy"], "allow-dropouts": True}


def _on_fresh_run(fn: Any, policy: dict[str, Any] | None = None) -> Any:
    """``fn(messenger, nodes)`` on a fresh run of N in-process nodes: every key setup here
    starts a run (a node commits to one node set per run, with its dropouts)."""
    from fl_app.client_app import build_client_app
    from tests.localgrid import LocalGrid

    _on_fresh_run.runs = getattr(_on_fresh_run, "runs", 0) + 1
    app = build_client_app(DIAGNOSTIC_APP["extra_modules"],
                           policy=policy or DIAGNOSTIC_APP["policy"])
    with LocalGrid(app, N, run_id=_on_fresh_run.runs) as grid:
        messenger = Messenger(grid, timeout=60)
        return fn(messenger, messenger.node_ids(min_nodes=N))


def _scenarios() -> dict:
    out: dict = {}
    partition: dict[int, int] = {}
    seen: dict[int, np.ndarray] = {}

    def record(node: int, reply: RecordDict) -> None:
        partition[node] = int(reply.config_records["who"]["partition-id"])
        seen[node] = reply.array_records["secagg.values"]["v"].numpy().copy()

    def full(messenger: Messenger, nodes: list[int]) -> None:
        # 1. no dropouts, complete graph; also keep everything the server received
        agg = SecureAggregator(messenger, nodes, seed=1)
        agg.setup()
        out["full"] = agg.sum("diag_secure_sum", _request(), max_abs=MAX_ABS, on_reply=record)
        out["partitions"] = dict(partition)
        out["seen"] = dict(seen)
        out["full2"] = agg.sum("diag_secure_sum", _request(), max_abs=MAX_ABS)  # fresh masks
        # 3. plain mode: same interface, same sum
        plain = PlainAggregator(messenger, nodes)
        out["plain"] = plain.sum("diag_secure_sum", _request(), max_abs=MAX_ABS)
        out["nodes"] = nodes

    def drops(messenger: Messenger, nodes: list[int]) -> None:
        # 2. one node drops after key sharing, then a second one in a later sum
        agg = SecureAggregator(messenger, nodes, seed=1, allow_dropouts=True)
        agg.setup()
        agg.drop = {nodes[0]}
        out["drop1"] = agg.sum("diag_secure_sum", _request(), max_abs=MAX_ABS)
        agg.drop = {nodes[1]}
        out["drop2"] = agg.sum("diag_secure_sum", _request(), max_abs=MAX_ABS)
        out["dropped"] = [nodes[0], nodes[1]]

    def sparse(messenger: Messenger, nodes: list[int]) -> None:
        # 4. sparse neighbour graph with a dropout; degree 4: after one dropout every node
        # still masks with 3 or more (itself included), the nodes' default min-survivors
        agg = SecureAggregator(messenger, nodes, degree=4, seed=3, allow_dropouts=True)
        agg.setup()
        agg.drop = {nodes[2]}
        out["sparse_drop"] = agg.sum("diag_secure_sum", _request(), max_abs=MAX_ABS)
        out["sparse_dropped"] = nodes[2]

    def many(messenger: Messenger, nodes: list[int]) -> None:
        # 5. too many dropouts: 4 of 6 gone, threshold 4 of 6 cannot be met
        agg = SecureAggregator(messenger, nodes, seed=4, allow_dropouts=True)
        agg.setup()
        agg.drop = set(nodes[:4])
        try:
            agg.sum("diag_secure_sum", _request(), max_abs=MAX_ABS)
            out["many"] = "completed"
        except (SecAggError, NodeError) as exc:
            out["many"] = str(exc)

    def tamper(messenger: Messenger, nodes: list[int]) -> None:
        # 6. a tampered share relayed by the server is detected by its receiver
        def flip(sender: int, receiver: int, blob: bytes) -> bytes:
            if sender == nodes[3] and receiver == nodes[4]:
                return blob[:-1] + bytes([blob[-1] ^ 1])
            return blob

        SecureAggregator(messenger, nodes, seed=4).setup()  # opens the sealed relay
        bad = SecureAggregator(messenger, nodes, seed=5)  # a second key setup, same node set
        messenger.mailroom.tamper = flip  # the server alters the shares it relays
        try:
            bad.setup()
            bad.sum("diag_secure_sum", _request(), max_abs=MAX_ABS)
            out["tamper"] = "completed"
        except NodeError as exc:
            out["tamper"] = str(exc)
        # 7. inputs outside the declared range are clipped, never wrapped; the sum fails
        # with only the count of nodes that clipped, learnt inside the masked sum
        messenger.mailroom.tamper = None
        messenger.mailroom.queues.clear()

    def over(messenger: Messenger, nodes: list[int]) -> None:
        agg = SecureAggregator(messenger, nodes, seed=6)
        agg.setup()
        try:
            agg.sum("diag_secure_sum", _request(), max_abs=0.5)
            out["overflow"] = "completed"
        except (SecAggError, AggregationError, NodeError) as exc:
            out["overflow"] = str(exc)

    _on_fresh_run(full)
    for scenario in (drops, sparse, many):
        _on_fresh_run(scenario, DROPOUTS)
    _on_fresh_run(tamper)
    _on_fresh_run(over)
    return out


@pytest.fixture(scope="module")
def results() -> dict:
    # In process: the same ClientApp and messages; SecAgg+ on a real Flower simulation runs
    # in tests/test_main_job.py (PriviRec), tests/test_fedmf.py (local mode) and
    # tests/test_lpgcn.py
    return _scenarios()


def _tolerance(n: int) -> float:
    # quantization (n summands, half a resolution step each) plus float64 rounding of the sums
    return n * FixedPoint.for_sum(MAX_ABS, n).resolution + 1e-12


def _check(got: dict, partitions: list[int]) -> None:
    want = _expected(partitions)
    for name in SHAPES:
        assert got[name].shape == SHAPES[name]
        np.testing.assert_allclose(got[name], want[name], rtol=0, atol=_tolerance(N))


def test_secure_sum_equals_plain_sum_1d_and_2d(results: dict) -> None:
    parts = sorted(results["partitions"].values())
    assert parts == list(range(N))
    _check(results["full"], parts)
    _check(results["full2"], parts)
    _check(results["plain"], parts)
    for name in SHAPES:  # plain mode and secure mode agree within quantization
        np.testing.assert_allclose(results["plain"][name], results["full"][name], atol=_tolerance(N))


def test_dropouts_after_key_sharing_are_recovered(results: dict) -> None:
    part = results["partitions"]
    d0, d1 = results["dropped"]
    _check(results["drop1"], [p for n, p in part.items() if n != d0])
    _check(results["drop2"], [p for n, p in part.items() if n not in (d0, d1)])
    _check(results["sparse_drop"], [p for n, p in part.items() if n != results["sparse_dropped"]])


def test_too_many_dropouts_fail_without_revealing(results: dict) -> None:
    msg = results["many"]
    assert msg != "completed"
    assert "refuses to confirm" in msg or "refuses to unmask" in msg or "threshold" in msg


def test_tampered_share_is_detected_and_names_sender(results: dict) -> None:
    nodes = results["nodes"]
    assert "failed authentication" in results["tamper"]
    assert f"from node {nodes[3]} to node {nodes[4]}" in results["tamper"]


def test_out_of_range_inputs_are_clipped_and_fail_the_sum_without_a_node_oracle(
        results: dict) -> None:
    # every node's diagnostic vector exceeds 0.5 somewhere: all 6 clipped, and the server
    # learns just that count (from inside the sum), not which node or how many values
    assert f"{N} node(s) had values outside the declared range max_abs=0.5" in \
        results["overflow"]


def test_server_view_reveals_no_single_input(results: dict) -> None:
    codec = FixedPoint.for_sum(MAX_ABS, N)
    for node, masked in results["seen"].items():
        p = results["partitions"][node]
        arrays = {name: diagnostic_vector(SEED + i, p, shape)
                  for i, (name, shape) in enumerate(sorted(SHAPES.items()))}
        flat, _ = flatten(clipped_into_range(arrays, MAX_ABS))  # the layout the node sends
        encoded = codec.encode(flat)
        assert masked.dtype == np.uint64
        assert not np.any(masked == encoded)  # no coordinate is sent in the clear
        # masked values look uniform over the ring, unrelated to the input
        top_bits = (masked >> np.uint64(56)).astype(np.int64)
        assert abs(np.corrcoef(top_bits, flat)[0, 1]) < 0.2
    # the masked vectors sum to the total only together, after the self masks are removed
    total = sum(results["seen"].values())
    assert not np.allclose(codec.decode(total)[:35].reshape(7, 5),
                           _expected(list(range(N)))["matrix"], atol=1.0)


def test_neighbour_graph_degree_and_symmetry() -> None:
    nodes = list(range(20))
    graph = neighbour_graph(nodes, 4, seed=0)
    for u, vs in graph.items():
        assert u not in vs and len(vs) == 4
        for v in vs:
            assert u in graph[v]
    assert all(len(vs) == 19 for vs in neighbour_graph(nodes, None, 0).values())
