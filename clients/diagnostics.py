"""Diagnostic actions: check a federation's plumbing with inputs whose sum is known.

``diag_secure_sum`` answers a secure-sum request with a vector that depends only on
(seed, partition id, shape), so the server (or a test, or an operator checking a new
deployment) can compare the secure sum with the plain sum of :func:`diagnostic_vector`.
"""

from __future__ import annotations

import numpy as np
from flwr.app import ConfigRecord, RecordDict

from clients.aggregate import sum_reply
from clients.node import NodeContext
from clients.registry import handler


def diagnostic_vector(seed: int, partition_id: int, shape: tuple[int, ...]) -> np.ndarray:
    """The known input of a partition: standard normal draws, seeded."""
    return np.random.default_rng([seed, 99, partition_id]).standard_normal(shape)


@handler("diag_secure_sum")
def diag_secure_sum(content: RecordDict, node: NodeContext) -> RecordDict:
    cfg = content.config_records["diag"]
    shapes = {name: tuple(int(x) for x in dims) for name, dims in cfg.items() if name != "seed"}
    arrays = {name: diagnostic_vector(int(cfg["seed"]) + i, node.partition_id, shape)
              for i, (name, shape) in enumerate(sorted(shapes.items()))}
    return sum_reply(node, arrays,
                        extra={"who": ConfigRecord({"partition-id": node.partition_id})})
