"""FedMF: federated BPR matrix factorization, the baseline the papers compare against.

The server side is Flower's own ``FedAvg``: this subclass only knows how to build itself
and its initial model from the run config, which shows that stock Flower strategies plug in
unchanged. Client side: ``clients/fedmf.py``. Centralized reference: ``fl_app.recsys.mf.BPRMF``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flwr.app import ArrayRecord, ConfigRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg, Strategy

from fl_app.config import Key
from fl_app.messaging import Messenger
from fl_app.recsys.mf import init_item_factors
from strategies.base import RunOutcome, data_config, handshake


class FedMF(FedAvg):
    """Federated matrix factorization with private user factors (FedAvg on item factors).

    Every node trains its own users' factors and one full-batch BPR step on the item
    factors per round; FedAvg averages the item factors weighted by the node's number of
    users, which equals centralized gradient descent (see ``fl_app/recsys/mf.py``).

    Parameters are FedAvg's; full participation (``fraction_train=1``) is the default and
    is what makes the run equal the centralized reference.
    """

    config_keys = (
        Key("mf-dim", 16, "factor dimension", min=1),
        Key("mf-lr", 0.05, "gradient step", min=0.0),
        Key("mf-reg", 0.0001, "L2 weight on user and item factors", min=0.0),
        Key("mf-negatives", 1, "negatives sampled per positive per round", min=1),
    )

    @classmethod
    def from_run_config(cls, cfg: Mapping[str, Any]) -> FedMF:
        return cls(fraction_train=1.0, fraction_evaluate=1.0, min_train_nodes=1,
                   min_evaluate_nodes=1, min_available_nodes=1)

    def run(self, grid: Grid, messenger: Messenger, cfg: Mapping[str, Any]) -> RunOutcome:
        return run_fedmf_rounds(self, grid, messenger, cfg)

    @staticmethod
    def drive_stock_strategy(strategy: Strategy, grid: Grid, messenger: Messenger,
                             cfg: Mapping[str, Any]) -> RunOutcome:
        """Any message-API Strategy (e.g. a user's FedAvg subclass) drives the FedMF nodes."""
        return run_fedmf_rounds(strategy, grid, messenger, cfg)


def run_fedmf_rounds(strategy: Strategy, grid: Grid, messenger: Messenger,
                     cfg: Mapping[str, Any]) -> RunOutcome:
    """Drive any message-API Strategy (FedMF or a user's) with the FedMF clients."""
    infos = handshake(messenger, cfg)
    n_items = next(iter(infos.values())).n_items
    seed = int(cfg["seed"])
    initial = ArrayRecord([init_item_factors(n_items, int(cfg["mf-dim"]), seed)])
    train_config = ConfigRecord({
        **data_config(cfg),
        "fedrec-protocol": "fedmf",
        "mf-lr": float(cfg["mf-lr"]),
        "mf-reg": float(cfg["mf-reg"]),
        "mf-negatives": int(cfg["mf-negatives"]),
    })
    result = strategy.start(
        grid=grid,
        initial_arrays=initial,
        num_rounds=int(cfg["rounds"]),
        timeout=float(cfg["timeout"]),
        train_config=train_config,
        evaluate_config=ConfigRecord(dict(train_config)),
    )
    history = []
    for rnd in sorted(set(result.train_metrics_clientapp) | set(result.evaluate_metrics_clientapp)):
        row: dict[str, Any] = {"round": rnd}
        row.update(dict(result.train_metrics_clientapp.get(rnd, {})))
        row.update(dict(result.evaluate_metrics_clientapp.get(rnd, {})))
        row.pop("num-examples", None)
        history.append(row)
    final = {k: v for k, v in history[-1].items() if k != "round"} if history else {}
    return RunOutcome(metrics=final, history=history,
                      extra={"item_factors": result.arrays.to_numpy_ndarrays()[0]
                             if result.arrays is not None and len(result.arrays) else None})
