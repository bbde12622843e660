"""A new protocol in one file: most-popular-items recommendation from a *secure* sum.

Shows how to add a protocol without editing the project: the client handler registers
with ``clients.registry.handler`` and the server side is a ``ProtocolStrategy``. Run it:

    FEDREC_CLIENT_MODULES=examples.item_popularity \\
        python run_simulation.py --protocol examples.item_popularity:ItemPopularity

(or list the module under the ``fedrec_privacy.clients`` entry-point group of your own
package). The server learns only the item degree vector (a SecAgg+ sum) and the sums of the
nodes' ranking metrics; each node scores its own users locally.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from flwr.app import MetricRecord, RecordDict
from flwr.serverapp import Grid

from clients.node import NodeContext
from clients.registry import handler
from fl_app.messaging import Messenger
from fl_app.records import arrays_of, to_array_record
from fl_app.recsys.metrics import RankingSums, ranking_sums
from fl_app.secure.secagg import SecureAggregator, masked_reply
from strategies.base import ProtocolStrategy, RunOutcome, handshake


@handler("popularity_degrees")
def degrees(content: RecordDict, node: NodeContext) -> RecordDict:
    """This node's item degrees (interactions per item), masked."""
    data = node.data()
    deg = np.asarray(data.train.sum(axis=0)).ravel()
    return masked_reply(content, node.state, node.context.node_id, {"deg": deg})


@handler("popularity_evaluate")
def evaluate(content: RecordDict, node: NodeContext) -> RecordDict:
    """Score every user by global popularity; reply the sums of Recall/NDCG@20."""
    data = node.data()
    deg = arrays_of(content)["deg"]
    scores = np.broadcast_to(deg, (data.train.shape[0], deg.shape[0]))
    sums = ranking_sums(np.array(scores), data.train, data.test, k=20)
    return RecordDict({"sums": MetricRecord(sums.to_dict())})


class ItemPopularity(ProtocolStrategy):
    """Most-popular recommendation with the item degrees aggregated by SecAgg+."""

    def __init__(self, secagg: str = "secagg+") -> None:
        self.secagg = secagg

    @classmethod
    def from_run_config(cls, cfg: Mapping[str, Any]) -> ItemPopularity:
        return cls(secagg=str(cfg.get("secagg", "secagg+")))

    def run(self, grid: Grid, messenger: Messenger, cfg: Mapping[str, Any]) -> RunOutcome:
        infos = handshake(messenger, cfg)
        agg = SecureAggregator(messenger, list(infos), mode=self.secagg, seed=int(cfg["seed"]))
        agg.setup()
        max_users = max(i.n_users for i in infos.values())
        deg = agg.sum("popularity_degrees", RecordDict(), max_abs=float(max_users) + 1,
                      phase="degrees")["deg"]
        replies = messenger.broadcast("popularity_evaluate",
                                      RecordDict({"arrays": to_array_record({"deg": deg})}),
                                      phase="evaluate")
        total = sum(RankingSums.from_dict(dict(r.metric_records["sums"]))
                    for r in replies.values())
        return RunOutcome(metrics=total.means(),
                          extra={"top_items": np.argsort(-deg)[:10].tolist()})


__all__ = ["ItemPopularity"]
