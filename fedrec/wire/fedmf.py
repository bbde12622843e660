"""FedMF's wire, declared once for the strategy (``strategies/fedmf.py``) and the node
(``clients/fedmf.py``).

A training round sends the item factors ``V`` (record ``arrays`` of
``fedrec/wire/request.py``) with the round's parameters; every node trains its own user
factors locally and answers with its item-gradient sum as a share of a secure sum
(``fedrec/wire/sums.py``), so the server learns only the total. The evaluation round sends
the final ``V``; nodes answer with ranking metric sums (``fedrec/wire/evaluation.py``).
A stock Flower strategy (``FedAvg``) drives the same nodes with Flower's ``train`` and
``evaluate`` messages instead (records of ``fedrec/wire/request.py``), answered in clear.
"""

from __future__ import annotations

from enum import StrEnum


class Action(StrEnum):
    """The node actions of FedMF (``message_type = "query.<action>"``)."""

    TRAIN = "fedmf_train"  # one round of local training: the item-gradient sum
    EVALUATE = "fedmf_evaluate"  # ranking metrics as a sum
