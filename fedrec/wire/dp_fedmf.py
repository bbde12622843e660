"""dp-fedmf's wire, declared once for the strategy (``strategies/dp_fedmf.py``) and the node
(``clients/dp_fedmf.py``).

A training round sends the item factors ``V`` (record ``arrays`` of
``fedrec/wire/request.py``) with the round's public hyperparameters (record ``protocol``)
and a noise record (``fedrec.secure.distributed_noise.NOISE_KEY``): every node answers a
SecAgg+ sum with its clipped item update (zeros when its own Poisson draw leaves it out)
plus its share of the distributed discrete Gaussian noise. The evaluation round sends the
final ``V``; nodes refit their own user factors locally and answer with ranking metric sums
(``fedrec/wire/evaluation.py``).
"""

from __future__ import annotations

from enum import StrEnum

import numpy as np

from fedrec.wire import fedmf as fedmf_wire
from fedrec.wire.message import Message, message, per_round, reply, run_fixed


class Action(StrEnum):
    """The node actions of dp-fedmf (``message_type = "query.<action>"``)."""

    TRAIN = "dpfedmf_train"  # one round: the clipped, noised item update as a masked sum
    EVALUATE = "dpfedmf_evaluate"  # refit the user factors locally, ranking metrics as a sum


#: The item-update array of a training reply.
DELTA = "dpmf-update"
#: A round's item factors: items x dpmf-dim (the dimension is the server's choice).
_V_SHAPE = ("items", "dim")


@message(Action.TRAIN)
class TrainRequest(Message):
    """One round: the item factors and the public hyperparameters of the users' local steps
    (the clip the node applies and accounts is the noise record's ``l2``)."""

    V: np.ndarray = per_round(shape=_V_SHAPE, doc="the item factors of this round")
    round: int = per_round(min=1, doc="the round number (seeds the node's sampling)")
    seed: int = run_fixed()
    lr: float = run_fixed(min=0.0, doc="step of the user factor's local gradient steps")
    epochs: int = run_fixed(min=1, doc="local gradient steps of the user factor per round")
    reg: float = run_fixed(min=0.0, doc="L2 weight on the user factor")
    negatives: int = run_fixed(min=1, doc="negatives per training item per round")
    clip: float = run_fixed(min=0.0, doc="dpmf-clip, the L2 bound of one user's update")


@message()
class TrainSum(Message):
    """A node's share: its clipped item update (zeros when it does not take part)."""

    update: np.ndarray = reply(name=DELTA, shape=_V_SHAPE)


@message(Action.EVALUATE)
class EvaluateRequest(fedmf_wire.EvaluateRequest):
    """FedMF's evaluation request (the final V, the seed of the user factors, top-k), sent
    as dp-fedmf's action; nodes answer ``fedrec.wire.evaluation.RankingSum``."""
