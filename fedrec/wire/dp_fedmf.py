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


class Action(StrEnum):
    """The node actions of dp-fedmf (``message_type = "query.<action>"``)."""

    TRAIN = "dpfedmf_train"  # one round: the clipped, noised item update as a masked sum
    EVALUATE = "dpfedmf_evaluate"  # refit the user factors locally, ranking metrics as a sum


#: The item-update array of a training reply.
DELTA = "dpmf-update"
