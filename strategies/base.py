"""What every protocol strategy provides to the ServerApp, and the registry of built-ins."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

from fl_app.messaging import Messenger

#: Built-in protocols: run-config ``protocol`` name -> "module:Class".
REGISTRY: dict[str, str] = {
    "fedmf": "strategies.fedmf:FedMF",
    "privirec": "strategies.privirec:PriviRec",
    "privirec-k": "strategies.privirec:PriviRecK",
}


@dataclass
class RunOutcome:
    """What a protocol run returns: final metrics and a per-round history for plots."""

    metrics: dict[str, float] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class FedRecStrategy(Protocol):
    """A strategy the ServerApp can drive: built from the run config, run over a Grid.

    Built-in protocols implement this on top of ``flwr.serverapp.strategy.Strategy``. A user's
    strategy that is a plain Flower ``Strategy`` (no ``run``) is driven by the client family
    of the configured ``protocol`` instead (see ``fl_app/server_app.py``).
    """

    @classmethod
    def from_run_config(cls, cfg: Mapping[str, Any]) -> FedRecStrategy: ...

    def run(self, grid: Grid, messenger: Messenger, cfg: Mapping[str, Any]) -> RunOutcome: ...


def load_strategy_class(name: str) -> type:
    """The class for a registry name or a ``package.module:ClassName`` path.

    Raises ValueError naming the known protocols, or what could not be imported.
    """
    target = REGISTRY.get(name, name)
    if ":" not in target:
        raise ValueError(
            f"unknown protocol {name!r}: known protocols are {sorted(REGISTRY)}, "
            "or give a strategy as 'package.module:ClassName'"
        )
    module_name, _, class_name = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"strategy {name!r}: cannot import module {module_name!r}: {exc}") from exc
    cls = getattr(module, class_name, None)
    if cls is None:
        raise ValueError(f"strategy {name!r}: module {module_name!r} has no class {class_name!r}")
    if not (isinstance(cls, type) and issubclass(cls, Strategy)):
        raise ValueError(
            f"strategy {name!r}: {class_name} is not a flwr.serverapp.strategy.Strategy subclass"
        )
    return cls


def data_config(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """The dataset and partition keys a node needs to load its own rows.

    Only the description travels (dataset name, sizes, seed, partition scheme); every node
    loads its rows itself, so the interaction matrix never crosses the Grid.
    """
    from datasets import DatasetSpec, PartitionSpec

    out = dict(DatasetSpec.from_config(cfg).to_config())
    out.update(PartitionSpec.from_config(cfg, 1).to_config())
    out.pop("num-partitions", None)
    return out


@dataclass
class NodeInfo:
    """Public facts a node reported in the handshake."""

    node_id: int
    partition_id: int
    n_items: int
    n_users: int
    n_train_users: int


def handshake(messenger: Messenger, cfg: Mapping[str, Any],
              min_nodes: int = 1) -> dict[int, NodeInfo]:
    """Send the data config to every node, learn their partitions and the catalogue size.

    Also names nodes ``"node <id> (partition <p>)"`` for every later error message. Fails
    with a clear error if nodes disagree on the number of items (different data files).
    """
    from flwr.app import ConfigRecord, RecordDict

    nodes = messenger.node_ids(min_nodes=max(min_nodes, int(cfg.get("min-nodes", 1))))
    replies = messenger.broadcast(
        "hello", RecordDict({"data": ConfigRecord(data_config(cfg))}), nodes, phase="handshake"
    )
    infos = {}
    for node, reply in replies.items():
        info = reply.config_records["info"]
        infos[node] = NodeInfo(node, int(info["partition-id"]), int(info["n-items"]),
                               int(info["n-users"]), int(info["n-train-users"]))
        messenger.node_labels[node] = f"node {node} (partition {infos[node].partition_id})"
    item_counts = {i.n_items for i in infos.values()}
    if len(item_counts) != 1:
        detail = ", ".join(f"{messenger.label(n)}: {i.n_items}" for n, i in sorted(infos.items()))
        raise ValueError(f"nodes disagree on the number of items ({detail}); "
                         "they must load the same catalogue")
    return infos


class ProtocolStrategy(Strategy):
    """Base of multi-phase protocols: a Flower ``Strategy`` whose ``start`` runs the phases.

    Flower's ``Strategy.start`` loops train/evaluate rounds; the protocols here have several
    phases per run (key setup, secure sums, power steps, evaluation), so subclasses
    implement :meth:`run` and ``start`` calls it and returns Flower's ``Result``. The
    round-based hooks are not part of such a protocol and say so if called.
    """

    @classmethod
    def from_run_config(cls, cfg: Mapping[str, Any]) -> ProtocolStrategy:
        return cls()

    def run(self, grid: Grid, messenger: Messenger, cfg: Mapping[str, Any]) -> RunOutcome:
        raise NotImplementedError(f"{type(self).__name__} must implement run()")

    def summary(self) -> None:
        import logging

        logging.getLogger("fedrec").info("%s: %s", type(self).__name__, vars(self))

    def start(self, grid: Grid, initial_arrays: Any = None, num_rounds: int = 1,
              timeout: float = 3600, train_config: Any = None, evaluate_config: Any = None,
              evaluate_fn: Any = None) -> Any:
        """Run the protocol with the default config and return a Flower ``Result``."""
        from flwr.app import MetricRecord
        from flwr.serverapp.strategy import Result

        from fl_app.config import merge_config

        cfg = merge_config(dict(train_config or {}))
        outcome = self.run(grid, Messenger(grid, timeout=timeout), cfg)
        result = Result()
        result.evaluate_metrics_serverapp[1] = MetricRecord(
            {k: float(v) for k, v in outcome.metrics.items()})
        return result

    def _not_round_based(self, *_: Any, **__: Any) -> Any:
        raise TypeError(f"{type(self).__name__} is a multi-phase protocol: use start() or "
                        "run(), not Flower's per-round hooks")

    configure_train = aggregate_train = _not_round_based
    configure_evaluate = aggregate_evaluate = _not_round_based
