"""Handlers every protocol uses: the opening handshake."""

from __future__ import annotations

from flwr.app import ConfigRecord, RecordDict

from clients.node import NodeContext
from clients.registry import handler


@handler("hello")
def hello(content: RecordDict, node: NodeContext) -> RecordDict:
    """Load this node's rows and report public metadata: partition, catalogue size, row count.

    The catalogue size (number of items) is public in every protocol here; the number of
    users a node holds is what any Flower deployment reveals anyway (who takes part).
    """
    data = node.data()
    return RecordDict({"info": ConfigRecord({
        "partition-id": node.partition_id,
        "num-partitions": node.num_partitions,
        "n-items": int(data.n_items),
        "n-users": int(len(data.user_ids)),
        "n-train-users": int((data.train.getnnz(axis=1) > 0).sum()),
    })})
