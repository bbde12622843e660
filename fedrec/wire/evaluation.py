"""What a protocol's evaluation sum carries, declared once for the server
(``Federation.evaluate`` in ``strategies/base.py`` and each strategy that sums its own
metrics) and the node (``clients/sums_node.py``: ``ranking_reply``, and each protocol's
evaluate handler).

The server asks for ranking metrics at cut-off :data:`TOP_K` (a field of the request's
config record); every node answers with its users' metric sums as the array
:data:`RANKING` of a sum reply, so the server learns them only summed over nodes
(``fedrec/recsys/metrics.py``: ``RankingSums``).
"""

from __future__ import annotations

import numpy as np

from fedrec.wire.message import Message, message, reply, run_fixed

#: Config field of an evaluation request: the ranking cut-off K.
TOP_K = "top-k"
#: Array of a sum reply: the node's ranking metric sums (``RankingSums.to_vector``).
RANKING = "ranking"
#: Array of a sum reply of rating protocols (DP prototypes): the node's squared-error and
#: mean-rank sums (``fedrec/recsys/prototypes.py``: ``silo_metric_sums``).
RATING = "rating"


@message()
class RankingRequest(Message):
    """Base of an evaluation request: the ranking cut-off (a protocol's own evaluation
    request subclasses it and adds the model it sends)."""

    top_k: int = run_fixed(20, name=TOP_K, min=1)


@message()
class RankingSum(Message):
    """A node's share of a ranking-metrics sum (``RankingSums.to_vector``)."""

    ranking: np.ndarray = reply(name=RANKING, shape=("metrics",))
