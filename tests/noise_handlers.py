"""A test-only sum handler for distributed noise (tests/test_distributed_noise.py): every
node answers a noisy SecAgg+ sum with ``n`` values of ``value`` (its participation drawn as
dp-fedmf draws it), so the unmasked sum is the known total plus the noise alone."""

from __future__ import annotations

import numpy as np
from flwr.app import RecordDict

from clients.handlers import handler
from clients.node import NodeContext
from clients.noise_node import participates, requested
from clients.sums_node import sum_reply

ACTION = "noisetest_sum"


@handler(ACTION, sums=True)
def noisetest_sum(content: RecordDict, node: NodeContext) -> RecordDict:
    cfg = node.config()
    n = node.size(cfg, "n")
    value = float(cfg.get("value", 0.0))
    noisy = requested(node) is not None and not cfg.get("skip-draw")
    takes = participates(node) if noisy else True
    return sum_reply(node, {"x": np.full(n, value if takes else 0.0)})
