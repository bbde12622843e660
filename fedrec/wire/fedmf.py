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

import numpy as np

from fedrec.wire import request as request_wire
from fedrec.wire.evaluation import TOP_K, RankingRequest
from fedrec.wire.message import Message, message, per_round, reply, run_fixed


class Action(StrEnum):
    """The node actions of FedMF (``message_type = "query.<action>"``)."""

    TRAIN = "fedmf_train"  # one round of local training: the item-gradient sum
    EVALUATE = "fedmf_evaluate"  # ranking metrics as a sum


#: The round's item factors: items x mf-dim (the dimension is the server's choice).
_V_SHAPE = ("items", "dim")


@message(Action.TRAIN)
class TrainRequest(Message):
    """One training round: the item factors and the round's public hyperparameters."""

    V: np.ndarray = per_round(shape=_V_SHAPE, doc="the item factors of this round")
    round: int = per_round(min=1, doc="the round number (seeds the node's sampling)")
    mode: str = run_fixed(choices=("local", "exact"), doc="mf-mode")
    seed: int = run_fixed()
    lr: float = run_fixed(min=0.0, doc="the nodes' step size")
    reg: float = run_fixed(min=0.0, doc="L2 weight")
    negatives: int = run_fixed(min=1, doc="negatives per positive")
    epochs: int = run_fixed(min=1, doc="local mode: epochs per round")
    batch_size: int = run_fixed(min=1, doc="local mode: triples per mini-batch")
    clip: float = run_fixed(min=0.0, doc="local mode: per-element clip of the item delta")
    loss_cap: float = run_fixed(min=0.0, doc="cap of the reported mean loss")


@message()
class LocalSum(Message):
    """A node's share in local mode: its user-weighted, clipped item delta, the weight (its
    users with training items), the weighted capped loss and clipped fraction."""

    delta: np.ndarray = reply(shape=_V_SHAPE)
    weight: np.ndarray = reply(shape=(1,))
    loss: np.ndarray = reply(shape=(1,))
    clipped: np.ndarray = reply(shape=(1,))


@message()
class ExactSum(Message):
    """A node's share in exact mode: its users' summed V-gradient, user count, loss sum."""

    grad: np.ndarray = reply(shape=_V_SHAPE)
    weight: np.ndarray = reply(shape=(1,))
    loss: np.ndarray = reply(shape=(1,))


@message(Action.EVALUATE)
class EvaluateRequest(RankingRequest):
    """The final item factors; nodes answer ``fedrec.wire.evaluation.RankingSum``."""

    V: np.ndarray = per_round(shape=_V_SHAPE)
    seed: int = run_fixed()


@message()
class StockConfig(Message):
    """What a stock Flower strategy's ``train`` / ``evaluate`` config carries for FedMF
    nodes (``FedMF.drive_stock_strategy``; ``server-round`` is Flower's own)."""

    CONFIG = request_wire.STOCK_CONFIG

    mf_lr: float = run_fixed(min=0.0)
    mf_reg: float = run_fixed(min=0.0)
    mf_negatives: int = run_fixed(min=1)
    seed: int = run_fixed()
    server_round: int = per_round(1, min=0)
    top_k: int = run_fixed(20, name=TOP_K, min=1, doc="evaluate: the ranking cut-off")
