"""What a client handler can reach: its Flower context, its own rows, its private state.

Data loading goes through ``datasets.load_node_data`` (disk cache keyed by dataset and
partition) with an in-process cache on top, so a node in a long simulation does not re-read
its rows for every message. The in-process cache is an optimisation only: a SuperNode
running the ClientApp in a fresh process loads the same rows from disk.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np
from flwr.app import ConfigRecord, Context, RecordDict

from datasets import DatasetSpec, NodeData, PartitionSpec, load_node_data
from fl_app.records import from_array_record, to_array_record

#: RecordDict key under which strategies send the dataset/partition config.
DATA_KEY = "data"
_STATE_DATA_KEY = "fedrec.data"


@lru_cache(maxsize=8)
def _cached_node_data(spec: DatasetSpec, part: PartitionSpec, partition_id: int) -> NodeData:
    return load_node_data(spec, part, partition_id)


@dataclass
class NodeContext:
    """A node's view during one handler call."""

    context: Context
    request: RecordDict

    @property
    def state(self) -> RecordDict:
        """Flower's per-node state, kept across the messages of a run."""
        return self.context.state

    @property
    def partition_id(self) -> int:
        try:
            return int(self.context.node_config["partition-id"])
        except KeyError:
            raise KeyError(
                "node config has no 'partition-id': start the SuperNode with "
                "--node-config \"partition-id=<i> num-partitions=<n>\""
            ) from None

    @property
    def num_partitions(self) -> int:
        return int(self.context.node_config["num-partitions"])

    def data_config(self) -> dict[str, Any]:
        """Dataset config from the request (remembered in state), node config overriding.

        Strategies send it in a ``data`` ConfigRecord; stock Flower strategies carry it in
        their ``config`` record (with a ``dataset`` key).

        A SuperNode's own ``data-dir`` (node config) wins over the server's, since each data
        holder knows where its files are.
        """
        records = self.request.config_records
        source = DATA_KEY if DATA_KEY in records else (
            "config" if "config" in records and "dataset" in records["config"] else None)
        if source is not None:
            cfg = dict(records[source])
            self.state.config_records[_STATE_DATA_KEY] = ConfigRecord(cfg)
        elif _STATE_DATA_KEY in self.state.config_records:
            cfg = dict(self.state.config_records[_STATE_DATA_KEY])
        else:
            raise RuntimeError(
                f"partition {self.partition_id}: no dataset config received yet "
                f"(the strategy must send a '{DATA_KEY}' ConfigRecord first)"
            )
        node_dir = self.context.node_config.get("data-dir")
        if node_dir:
            cfg["data-dir"] = str(node_dir)
        return cfg

    def data(self) -> NodeData:
        """This node's rows (train/test) and side features."""
        cfg = self.data_config()
        spec = DatasetSpec.from_config(cfg)
        part = PartitionSpec.from_config(cfg, self.num_partitions)
        return _cached_node_data(spec, part, self.partition_id)

    # -- private arrays kept in Flower's node state ------------------------------------
    def load_arrays(self, key: str) -> dict[str, np.ndarray] | None:
        """Arrays this node stored under ``key`` in an earlier message, or None."""
        if key not in self.state.array_records:
            return None
        return from_array_record(self.state.array_records[key])

    def store_arrays(self, key: str, arrays: Mapping[str, np.ndarray]) -> None:
        """Keep private arrays (e.g. user factors) in the node state for later messages."""
        self.state.array_records[key] = to_array_record(arrays)
