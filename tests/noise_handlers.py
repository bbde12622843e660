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
from fedrec.wire.message import Message, message, per_round

ACTION = "noisetest_sum"


@message(ACTION)
class NoiseTestRequest(Message):
    """How many values to send, their value, and whether to skip the participation draw."""

    n: int = per_round(min=1)
    value: float = per_round(0.0)
    skip_draw: bool = per_round(False)


@handler(ACTION, sums=True)
def noisetest_sum(content: RecordDict, node: NodeContext) -> RecordDict:
    req = node.read(NoiseTestRequest)
    noisy = requested(node) is not None and not req.skip_draw
    takes = participates(node) if noisy else True
    return sum_reply(node, {"x": np.full(req.n, req.value if takes else 0.0)})
