"""A new protocol in one file: most-popular-items recommendation from a secure sum.

Shows how to add a protocol without editing the project: its messages are typed
(``fedrec/wire/message.py``), node handlers register with ``clients.handlers.handler``, the
server side is a ``ProtocolStrategy`` naming its handler module in ``clients``. Run it:

    python run_simulation.py --protocol examples.item_popularity:ItemPopularity

The server learns only the item degree vector (a sum through the run's aggregator, SecAgg+
by default) and the sums of the nodes' ranking metrics; each node scores its own users.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Any

import numpy as np
from flwr.app import RecordDict

from clients.handlers import handler
from clients.node import NodeContext
from clients.sums_node import ranking_reply, sum_reply
from fedrec.config import Key
from fedrec.wire.evaluation import RankingRequest
from fedrec.wire.message import Message, message, per_round, reply
from strategies.base import Federation, ProtocolStrategy, RunOutcome


class Action(StrEnum):
    """The protocol's wire, declared once for both sides (the built-in protocols keep theirs
    in ``fedrec/wire/<protocol>.py``): a misspelt action fails at import, not mid-run."""

    DEGREES = "popularity_degrees"
    EVALUATE = "popularity_evaluate"


@message(Action.DEGREES)
class DegreesRequest(Message):
    """No fields: each node counts its own interactions."""


@message()
class Degrees(Message):
    """A node's share of the degree sum: interactions per item."""

    deg: np.ndarray = reply(shape=("items",))


@message(Action.EVALUATE)
class EvaluateRequest(RankingRequest):
    """The summed degrees, which every node ranks its users' unseen items by."""

    deg: np.ndarray = per_round(shape=("items",))


@handler(Action.DEGREES, sums=True)
def degrees(content: RecordDict, node: NodeContext) -> RecordDict:
    """This node's item degrees (interactions per item), as its share of a sum."""
    return sum_reply(node, Degrees(deg=np.asarray(node.data().train.sum(axis=0)).ravel()))


@handler(Action.EVALUATE, sums=True)
def evaluate(content: RecordDict, node: NodeContext) -> RecordDict:
    """Score this node's users by global popularity; reply the ranking sums."""
    deg = node.read(EvaluateRequest, items=node.data().n_items).deg
    return ranking_reply(node, lambda rows: np.tile(deg, (rows.shape[0], 1)))


class ItemPopularity(ProtocolStrategy):
    """Most-popular recommendation with the item degrees aggregated securely."""

    clients = "examples.item_popularity"
    config_keys = (Key("popularity-top-k", 20, "K of the reported Recall/NDCG@K", min=1),)

    def __init__(self, cfg: Mapping[str, Any] | None = None) -> None:
        super().__init__(cfg)  # self.cfg: the typed run config, with this protocol's keys
        self.k = self.cfg["popularity-top-k"]

    def run(self, fed: Federation) -> RunOutcome:
        deg = fed.sum_of(DegreesRequest(), Degrees, max_abs=fed.max_users + 1,
                         phase="degrees").deg
        metrics = fed.evaluate_ranking(EvaluateRequest(deg=deg, top_k=self.k))
        return RunOutcome(metrics=metrics, extra={"top_items": np.argsort(-deg)[:10].tolist()})


__all__ = ["ItemPopularity"]
