"""SecAgg+ at cross-device scale: the node set as a Merkle root, each node's neighbours
by their paths, and requests that do not grow linearly with the federation (issue 44)."""

from __future__ import annotations

import math
from typing import Any

import pytest

from fedrec.secure.merkle import HASH_BYTES, MerkleTree, merkle_root, verify_path
from fedrec.secure.secagg import neighbour_graph, neighbour_indices
from fedrec.transport.factory import auto_degree
from fedrec.transport.ledger import message_nbytes
from fedrec.wire.sums import node_set_commitment, node_set_digest


# -- the Merkle tree --------------------------------------------------------------------------
@pytest.mark.parametrize("n", [1, 2, 3, 5, 8, 13, 31, 32, 33])
def test_every_leaf_verifies_at_its_index_and_nowhere_else(n: int) -> None:
    ids = [10 * i + 7 for i in range(n)]
    tree = MerkleTree(ids)
    assert tree.root == merkle_root(ids)
    for i, v in enumerate(ids):
        path = tree.path(i)
        assert len(path) <= HASH_BYTES * max(1, math.ceil(math.log2(n)))
        assert verify_path(tree.root, n, i, v, path)
        assert not verify_path(tree.root, n, i, v + 1, path)  # another id
        if n > 1:
            assert not verify_path(tree.root, n, (i + 1) % n, v, path)  # another place
            flipped = bytes([path[0] ^ 1]) + path[1:]
            assert not verify_path(tree.root, n, i, v, flipped)
            assert not verify_path(tree.root, n, i, v, path[:-1])
            assert not verify_path(tree.root, n, i, v, path + bytes(HASH_BYTES))


def test_a_wrong_size_or_index_is_false_not_an_error() -> None:
    tree = MerkleTree([1, 2, 3])
    assert not verify_path(tree.root, 0, 0, 1, b"")
    assert not verify_path(tree.root, 3, 3, 1, tree.path(2))
    assert not verify_path(tree.root, 3, -1, 1, tree.path(0))
    assert not verify_path(tree.root, 3, 0, 2**80, tree.path(0))


def test_the_root_commits_to_the_same_digest_as_the_whole_set() -> None:
    """A node given every id and a node given only the root sign the same 32 bytes; one id
    more, less or changed gives another."""
    ids = [5, 9, 1200, 3, 77]
    digest = node_set_digest(ids)
    assert digest == node_set_commitment(merkle_root(sorted(ids)), len(ids))
    for other in ([5, 9, 1200, 3], [5, 9, 1200, 3, 77, 78], [5, 9, 1201, 3, 77]):
        assert node_set_digest(other) != digest


# -- the graph from an index alone ------------------------------------------------------------
@pytest.mark.parametrize("n,degree,seed", [(5, None, 0), (40, 4, 3), (100, 14, 7),
                                            (257, 18, 11), (6, 4, 1)])
def test_a_node_finds_its_neighbours_from_its_index(n: int, degree: int | None,
                                                    seed: int) -> None:
    ids = sorted(1000 + 3 * i for i in range(n))
    graph = neighbour_graph(ids, degree, seed)
    for i, u in enumerate(ids):
        assert [ids[j] for j in neighbour_indices(n, i, degree, seed)] == graph[u]
        assert all(u in graph[v] for v in graph[u])  # undirected
    if degree is not None and degree < n - 1:
        assert all(len(vs) == 2 * (degree // 2) for vs in graph.values())


# -- request sizes against the federation's size ----------------------------------------------
def _request_bytes(n: int) -> dict[str, int]:
    """The largest request any node receives per SecAgg+ action, over key setup and one sum,
    on ``n`` in-process nodes with simulated identities and the default degree."""
    from fedrec.transport.messenger import Messenger
    from fedrec.transport.secagg_server import SecureAggregator
    from fl_app.client_app import build_client_app
    from tests.localgrid import LocalGrid
    from tests.simutil import DIAGNOSTIC_APP, diag_request

    sizes: dict[str, int] = {}

    class Measured(LocalGrid):
        def push_messages(self, messages: Any) -> Any:
            messages = list(messages)
            for msg in messages:
                kind = msg.metadata.message_type.removeprefix("query.")
                sizes[kind] = max(sizes.get(kind, 0), message_nbytes(msg))
            return super().push_messages(messages)

    app = build_client_app(DIAGNOSTIC_APP["extra_modules"], policy=DIAGNOSTIC_APP["policy"])
    with Measured(app, n, run_id=100 + n) as grid:
        messenger = Messenger(grid, timeout=120)
        nodes = messenger.node_ids(min_nodes=n)
        for u in nodes:  # what the handshake reports of each node
            messenger.report.add_identity(u, "simulated")
        agg = SecureAggregator(messenger, nodes, degree=auto_degree(n), seed=3)
        agg.setup()
        agg.sum("diag_secure_sum", diag_request(1, {"v": (4,)}), max_abs=10.0)
    return sizes


def test_no_request_grows_linearly_with_the_federation() -> None:
    """From 48 to 192 nodes (4x), the largest advertise, key-share, masked-sum and unmask
    request of any node grows by less than 2x, where a request listing every member (8-10
    bytes each) or carrying every member's signature (about 100 bytes each) grows about 4x.
    The logarithmic model: neighbours 2 ceil(log2 n) (12 -> 16), each with a path of
    ceil(log2 n) hashes (6 -> 8)."""
    small, large = _request_bytes(48), _request_bytes(192)
    for action in ("secagg_advertise", "secagg_share", "diag_secure_sum", "secagg_unmask"):
        assert action in small and action in large, (action, sorted(small))
        growth = large[action] / small[action]
        assert growth < 2.0, (action, small[action], large[action])
    # the model's own ratio for the key share: (16 x (id + key + 8 hashes)) / (12 x (... 6))
    per = 8 + 140
    model = 16 * (per + 8 * HASH_BYTES) / (12 * (per + 6 * HASH_BYTES))
    assert large["secagg_share"] / small["secagg_share"] < 1.5 * model


# -- what a node given only the root still refuses --------------------------------------------
N_SPARSE, DEGREE = 40, 4  # a sparse graph: most nodes are not a given node's neighbours


def _setup(rewrite: Any = None) -> tuple[Any, Any]:
    """Key setup (and a sum, if it passes) over N_SPARSE simulated nodes under a server that
    rewrites requests with ``rewrite(msg)``; returns (the error or None, the aggregator)."""
    from fedrec.transport.messenger import Messenger, NodeError
    from fedrec.transport.secagg_server import SecureAggregator
    from fl_app.client_app import build_client_app
    from tests.malicious import MaliciousGrid
    from tests.simutil import DIAGNOSTIC_APP, diag_request

    app = build_client_app(DIAGNOSTIC_APP["extra_modules"], policy=DIAGNOSTIC_APP["policy"])
    with MaliciousGrid(app, N_SPARSE, rewrite=rewrite, run_id=7000) as grid:
        messenger = Messenger(grid, timeout=60)
        nodes = messenger.node_ids(min_nodes=N_SPARSE)
        for u in nodes:
            messenger.report.add_identity(u, "simulated")
        agg = SecureAggregator(messenger, nodes, degree=DEGREE, seed=5)
        try:
            agg.setup()
            agg.sum("diag_secure_sum", diag_request(2, {"v": (3,)}), max_abs=10.0)
        except NodeError as err:
            return err, agg
    return None, agg


def _rewriting(action: str, victim_index: int, change: Any) -> Any:
    """A rewrite that applies ``change(fields, ids)`` to the victim's ``action`` request."""
    def rewrite(msg: Any) -> Any:
        if msg.metadata.message_type != f"query.{action}":
            return None
        ids = sorted(1001 + i for i in range(N_SPARSE))
        if msg.metadata.dst_node_id != ids[victim_index]:
            return None
        from flwr.app import ConfigRecord, RecordDict

        content = RecordDict(dict(msg.content.items()))
        fields = dict(content["secagg"])
        change(fields, ids)
        content["secagg"] = ConfigRecord(fields)
        return content
    return rewrite


def test_the_honest_sparse_run_passes_and_each_node_holds_the_root_only() -> None:
    err, agg = _setup()
    assert err is None
    assert not any(agg.whole.values())


def test_a_set_without_one_far_node_shown_to_one_node_is_refused() -> None:
    """The victim is shown the set less one node that is not its neighbour (a valid root,
    size and path for that smaller set): its neighbours signed mask keys over the real set,
    so the share round refuses; no sum exists over the smaller set."""
    def smaller(fields: dict, ids: list[int]) -> None:
        victim = ids[0]
        near = set(neighbour_graph(ids, DEGREE, 5)[victim])
        far = next(v for v in reversed(ids) if v not in near and v != victim)
        rest = [v for v in ids if v != far]
        tree = MerkleTree(rest)
        fields.update({"members-root": tree.root, "members-count": len(rest),
                       "member-index": 0, "member-path": tree.path(0)})
    err, _ = _setup(_rewriting("secagg_advertise", 0, smaller))
    assert err is not None and "secagg_share" in str(err), err
    assert "committed node set" in str(err)


@pytest.mark.parametrize("lie", ["a far node as a neighbour", "a forged path",
                                 "a neighbour left out"])
def test_neighbours_the_graph_does_not_give_are_refused(lie: str) -> None:
    def change(fields: dict, ids: list[int]) -> None:
        listed, paths = list(fields["neighbours"]), list(fields["neighbour-paths"])
        tree = MerkleTree(ids)
        if lie == "a far node as a neighbour":
            far = next(v for v in reversed(ids) if v not in listed and v != ids[0])
            listed[-1], paths[-1] = far, tree.path(ids.index(far))
            order = sorted(range(len(listed)), key=lambda k: listed[k])
            listed, paths = [listed[k] for k in order], [paths[k] for k in order]
        elif lie == "a forged path":
            paths[0] = bytes(len(paths[0]))
        else:
            listed, paths = listed[1:], paths[1:]
            fields["s-pks"] = list(fields["s-pks"])[1:]
        fields.update({"neighbours": listed, "neighbour-paths": paths})
    err, _ = _setup(_rewriting("secagg_share", 0, change))
    assert err is not None and "its neighbours are not the ones" in str(err), err


def test_the_scale_report_projects_by_the_fit_that_holds() -> None:
    """benchmarks/cross_device.py's projection: a metric growing with N is projected
    linearly (never flattered by the log model), one growing with log2 N by the log model,
    and noise not at all."""
    from benchmarks.cross_device import fit

    ns = [64, 128, 256, 512, 1024]
    linear = fit(ns, [100 + 3 * n for n in ns])
    assert linear["model"] == "linear" and linear["at_30000"] == pytest.approx(90_100)
    log = fit(ns, [1000 + 50 * math.log2(n) for n in ns])
    assert log["model"] == "log" and log["at_30000"] == pytest.approx(1000 + 50 * math.log2(30000))
    noise = fit(ns, [5.0, 1.0, 4.0, 1.5, 4.5])
    assert noise["model"] == "none" and math.isnan(noise["at_6040"])
