"""Secure aggregation over Flower messages, on 6 nodes of the in-process grid."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import RecordDict

from clients.diagnostics import diagnostic_vector
from fl_app.messaging import Messenger, NodeError
from fl_app.secure.aggregate import PlainAggregator
from fl_app.secure.fixedpoint import FixedPoint
from fl_app.secure.secagg import SecAggError, SecureAggregator, neighbour_graph
from tests.simutil import diag_expected, diag_request

N = 6
SHAPES = {"matrix": (7, 5), "vector": (300,)}
SEED = 5
MAX_ABS = 10.0


def _request() -> RecordDict:
    return diag_request(SEED, SHAPES)


def _expected(partitions: list[int]) -> dict[str, np.ndarray]:
    return diag_expected(SEED, SHAPES, partitions)


def _scenarios(messenger: Messenger) -> dict:
    out: dict = {}
    nodes = messenger.node_ids(min_nodes=N)
    partition: dict[int, int] = {}
    seen: dict[int, np.ndarray] = {}

    def record(node: int, reply: RecordDict) -> None:
        partition[node] = int(reply.config_records["who"]["partition-id"])
        seen[node] = reply.array_records["secagg.values"]["v"].numpy().copy()

    # 1. no dropouts, complete graph; also keep everything the server received
    agg = SecureAggregator(messenger, nodes, seed=1)
    agg.setup()
    out["full"] = agg.sum("diag_secure_sum", _request(), max_abs=MAX_ABS, on_reply=record)
    out["partitions"] = dict(partition)
    out["seen"] = dict(seen)
    out["full2"] = agg.sum("diag_secure_sum", _request(), max_abs=MAX_ABS)  # fresh masks
    # 2. one node drops after key sharing, then a second one in a later sum
    agg.drop = {nodes[0]}
    out["drop1"] = agg.sum("diag_secure_sum", _request(), max_abs=MAX_ABS)
    agg.drop = {nodes[0], nodes[1]}
    out["drop2"] = agg.sum("diag_secure_sum", _request(), max_abs=MAX_ABS)
    out["dropped"] = [nodes[0], nodes[1]]
    # 3. plain mode: same interface, same sum
    plain = PlainAggregator(messenger, nodes)
    out["plain"] = plain.sum("diag_secure_sum", _request(), max_abs=MAX_ABS)
    # 4. sparse neighbour graph (degree 2) with a dropout
    # degree 4: after one dropout every node still masks with 3 or more (itself included),
    # the nodes' default min-survivors (with degree 2 a node would be left with 2 and refuse)
    sparse = SecureAggregator(messenger, nodes, degree=4, seed=3)
    sparse.setup()
    sparse.drop = {nodes[2]}
    out["sparse_drop"] = sparse.sum("diag_secure_sum", _request(), max_abs=MAX_ABS)
    out["sparse_dropped"] = nodes[2]
    # 5. too many dropouts: 4 of 6 gone, threshold 4 of 6 cannot be met
    many = SecureAggregator(messenger, nodes, seed=4)
    many.setup()
    many.drop = set(nodes[:4])
    try:
        many.sum("diag_secure_sum", _request(), max_abs=MAX_ABS)
        out["many"] = "completed"
    except (SecAggError, NodeError) as exc:
        out["many"] = str(exc)
    # 6. a tampered share relayed by the server is detected by its receiver
    def flip(sender: int, receiver: int, blob: bytes) -> bytes:
        if sender == nodes[3] and receiver == nodes[4]:
            return blob[:-1] + bytes([blob[-1] ^ 1])
        return blob

    bad = SecureAggregator(messenger, nodes, seed=5)
    messenger.mailroom.tamper = flip  # the server alters the shares it relays
    try:
        bad.setup()
        bad.sum("diag_secure_sum", _request(), max_abs=MAX_ABS)
        out["tamper"] = "completed"
    except NodeError as exc:
        out["tamper"] = str(exc)
    finally:
        messenger.mailroom.tamper = None
        messenger.mailroom.queues.clear()
    # 7. an input outside the declared range is refused, not wrapped
    over = SecureAggregator(messenger, nodes, seed=6)
    over.setup()
    try:
        over.sum("diag_secure_sum", _request(), max_abs=0.5)
        out["overflow"] = "completed"
    except NodeError as exc:
        out["overflow"] = str(exc)
    out["nodes"] = nodes
    return out


@pytest.fixture(scope="module")
def results() -> dict:
    # In process: the same ClientApp and messages; SecAgg+ on a real Flower simulation runs
    # in tests/test_main_job.py (PriviRec), tests/test_fedmf.py (local mode) and
    # tests/test_lpgcn.py
    from tests.simutil import run_on_local_nodes

    return run_on_local_nodes(_scenarios, N)


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
    assert "refuses to unmask" in msg or "threshold" in msg


def test_tampered_share_is_detected_and_names_sender(results: dict) -> None:
    nodes = results["nodes"]
    assert "failed authentication" in results["tamper"]
    assert f"from node {nodes[3]} to node {nodes[4]}" in results["tamper"]


def test_out_of_range_input_is_refused(results: dict) -> None:
    assert "out of declared range" in results["overflow"]


def test_server_view_reveals_no_single_input(results: dict) -> None:
    codec = FixedPoint.for_sum(MAX_ABS, N)
    for node, masked in results["seen"].items():
        p = results["partitions"][node]
        flat = np.concatenate([diagnostic_vector(SEED + i, p, shape).ravel()
                               for i, (_, shape) in enumerate(sorted(SHAPES.items()))])
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
