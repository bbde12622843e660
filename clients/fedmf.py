"""FedMF client: private user factors stay on the node; only item factors travel.

Handles Flower's stock ``train`` / ``evaluate`` messages (the server side is Flower's own
``FedAvg``, see ``strategies/fedmf.py``). The node keeps its users' factors in
``context.state`` between rounds; the server never sees them.
"""

from __future__ import annotations

import numpy as np
from flwr.app import ArrayRecord, MetricRecord, RecordDict

from clients.node import NodeContext
from clients.registry import evaluate_handler, train_handler
from fl_app.recsys.metrics import ranking_sums
from fl_app.recsys.mf import bpr_step, init_user_factors

_STATE = "fedmf.users"


def _user_factors(node: NodeContext, user_ids: np.ndarray, dim: int, seed: int) -> np.ndarray:
    stored = node.load_arrays(_STATE)
    if stored is None:
        return init_user_factors(user_ids, dim, seed)
    return stored["U"]


@train_handler("fedmf")
def fedmf_train(content: RecordDict, node: NodeContext) -> RecordDict:
    """One local full-batch BPR step; reply with the updated item factors.

    FedAvg weights the reply by ``num-examples`` = users with training items here, which
    makes the average exactly the centralized step (``fl_app/recsys/mf.py``).
    """
    cfg = content.config_records["config"]
    V = content.array_records["arrays"].to_numpy_ndarrays()[0]
    data = node.data()
    seed = int(cfg["seed"])
    U = _user_factors(node, data.user_ids, V.shape[1], seed)
    lr = float(cfg["mf-lr"])
    step = bpr_step(U, V, data.train, data.user_ids, seed=seed,
                    round_=int(cfg["server-round"]), lr=lr, reg=float(cfg["mf-reg"]),
                    negatives=int(cfg["mf-negatives"]))
    node.store_arrays(_STATE, {"U": step.user_factors})
    return RecordDict({
        "arrays": ArrayRecord([V - lr * step.grad_items]),
        "metrics": MetricRecord({"num-examples": step.n_users, "train-loss": step.loss}),
    })


@evaluate_handler("fedmf")
def fedmf_evaluate(content: RecordDict, node: NodeContext) -> RecordDict:
    """Recall/NDCG@K of this node's users on their own test rows (means, weighted by users)."""
    cfg = content.config_records["config"]
    V = content.array_records["arrays"].to_numpy_ndarrays()[0]
    data = node.data()
    U = _user_factors(node, data.user_ids, V.shape[1], int(cfg["seed"]))
    sums = ranking_sums(U @ V.T, data.train, data.test, k=int(cfg.get("top-k", 20)))
    metrics = {name: float(value) for name, value in sums.means().items()}
    return RecordDict({"metrics": MetricRecord({"num-examples": sums.n_users, **metrics})})
