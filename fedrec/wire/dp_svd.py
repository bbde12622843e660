"""dp-svd's wire, declared once for the strategy (``strategies/dp_svd.py``) and the node
(``clients/dp_svd.py``).

Every request of the run's noisy sums travels with a noise record
(``fedrec.secure.distributed_noise.NOISE_KEY``): the node answers a SecAgg+ sum with its
share plus its share of the distributed discrete Gaussian noise. The count request asks for
the users' scaled rows summed; an iteration request sends the selected items (fixed for
the run once chosen) and the round's basis X; the evaluation sends the final basis, the
selected items and the noisy counts, and nodes answer ranking metric sums
(``fedrec/wire/evaluation.py``).
"""

from __future__ import annotations

from enum import StrEnum

import numpy as np

from fedrec.wire.evaluation import RankingRequest
from fedrec.wire.message import Message, message, per_round, reply, run_fixed


class Action(StrEnum):
    """The node actions of dp-svd (``message_type = "query.<action>"``)."""

    COUNT = "dpsvd_count"  # the scaled rows summed, noised inside SecAgg+
    ITERATE = "dpsvd_iterate"  # one power iteration's share, noised inside SecAgg+
    EVALUATE = "dpsvd_evaluate"  # score locally with the released basis, metric sums


#: The selected items' ids and a basis over them.
_ITEMS = ("selected",)
_BASIS = ("selected", "rank")


@message(Action.COUNT)
class CountRequest(Message):
    """Step 1: every node's scaled rows summed (its ``CountSum``); nothing to choose (the
    scale, L2 norm 1, is the node's, and the noise record says the rest)."""


@message()
class CountSum(Message):
    """A node's share of the item counts: its users' rows, each at L2 norm <= 1, summed."""

    counts: np.ndarray = reply(name="dpsvd-counts", shape=("items",))


@message(Action.ITERATE)
class IterateRequest(Message):
    """Step 2: one power iteration on the selected items from the basis ``X``."""

    items: np.ndarray = run_fixed(shape=_ITEMS, doc="the selected item ids (ascending)")
    X: np.ndarray = per_round(shape=_BASIS, doc="this iteration's orthonormal basis")
    round: int = per_round(min=1, doc="the iteration number")


@message()
class IterateSum(Message):
    """A node's share of one iteration: ``A_S^T A_S X`` over its users' scaled rows."""

    product: np.ndarray = reply(name="dpsvd-product", shape=_BASIS)


@message(Action.EVALUATE)
class EvaluateRequest(RankingRequest):
    """The released model: the selected items, the final basis and the noisy counts;
    nodes answer ``fedrec.wire.evaluation.RankingSum``."""

    items: np.ndarray = run_fixed(shape=_ITEMS)
    X: np.ndarray = per_round(shape=_BASIS)
    counts: np.ndarray = per_round(shape=("items",))
    pop_weight: float = run_fixed(0.0, min=0.0, doc="weight of the noisy counts")
