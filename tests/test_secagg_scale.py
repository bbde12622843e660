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
