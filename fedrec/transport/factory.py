"""The aggregators by run-config name (``aggregator`` key): one place that builds them."""

from __future__ import annotations

import math
from collections.abc import Sequence

from fedrec.transport.aggregators import Aggregator, CkksAggregator, PlainAggregator
from fedrec.transport.messenger import Messenger
from fedrec.transport.secagg_server import SecureAggregator
from fedrec.wire.sums import AGGREGATORS

#: Up to this many nodes SecAgg+ uses the complete graph (at most 31 pairwise masks a node).
COMPLETE_GRAPH_UP_TO = 32


def auto_degree(n: int) -> int | None:
    """The SecAgg+ neighbour count for ``n`` nodes when the run config leaves it at 0.

    Complete graph (None) up to :data:`COMPLETE_GRAPH_UP_TO` nodes; above, a Harary graph
    of degree 2 * ceil(log2 n) (Bell et al. 2020: O(log n) neighbours keep every input hidden
    and sums recoverable against a constant fraction of corrupt or dropped nodes): 14 at 100
    nodes, 20 at 1,000. Each node then makes O(log n) masks and shares instead of n - 1.
    """
    if n <= COMPLETE_GRAPH_UP_TO:
        return None
    return 2 * math.ceil(math.log2(n))


def make_aggregator(kind: str, messenger: Messenger, nodes: Sequence[int], *, seed: int = 0,
                    degree: int | None = None) -> Aggregator:
    """The aggregator a run config names, set up and ready for sums over ``nodes``.

    ``nodes`` is the fixed order plain sums run in; ``degree`` is the SecAgg+ graph degree
    (None: :func:`auto_degree`); ``seed`` draws public choices (graph, CKKS decrypter).
    """
    if kind == "plain":
        agg: Aggregator = PlainAggregator(messenger, nodes)
    elif kind == "ckks":
        agg = CkksAggregator(messenger, nodes, seed=seed)
    elif kind == "secagg+":
        agg = SecureAggregator(messenger, list(nodes), seed=seed,
                               degree=degree if degree else auto_degree(len(nodes)))
    else:
        raise ValueError(f"aggregator must be one of {AGGREGATORS}, got {kind!r}")
    agg.setup()
    return agg
