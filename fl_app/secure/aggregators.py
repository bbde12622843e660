"""The aggregators by run-config name (``aggregator`` key): one place that builds them."""

from __future__ import annotations

from collections.abc import Sequence

from fl_app.messaging import Messenger
from fl_app.secure.aggregate import AGGREGATORS, Aggregator, CkksAggregator, PlainAggregator
from fl_app.secure.secagg import SecureAggregator


def make_aggregator(kind: str, messenger: Messenger, nodes: Sequence[int], *, seed: int = 0,
                    degree: int | None = None) -> Aggregator:
    """The aggregator a run config names, set up and ready for sums over ``nodes``.

    ``nodes`` is the fixed order plain sums run in; ``degree`` is the SecAgg+ graph degree
    (None = complete graph); ``seed`` draws public choices (graph, CKKS decrypter).
    """
    if kind == "plain":
        agg: Aggregator = PlainAggregator(messenger, nodes)
    elif kind == "ckks":
        agg = CkksAggregator(messenger, nodes, seed=seed)
    elif kind == "secagg+":
        agg = SecureAggregator(messenger, list(nodes), degree=degree, seed=seed)
    else:
        raise ValueError(f"aggregator must be one of {AGGREGATORS}, got {kind!r}")
    agg.setup()
    return agg
