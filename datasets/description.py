"""The data a node offers, described by the keys that select and split its rows.

One place declares them: the dataset's own keys (``DatasetSpec``), the partition scheme and
its seed (``PartitionSpec``), and how many simulated nodes are item servers. A node takes
them from its operator only (``clients/node.py``): they choose which rows go into every
reply, so a server that could set them per request or per run (a cold-start fraction that
leaves one user warm, a filter, a seed it searched for) could make a legal sum over the
whole node set hold one user's rows.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ._config import coerce
from .partition import PartitionSpec
from .spec import DatasetSpec

#: Keys of the description that are the node's own business and never compared with what a
#: server names: where the files are (each holder knows its own path).
LOCAL_KEYS = ("data-dir",)
#: Simulated item servers (the last ``item-servers`` partitions; a deployed item server
#: says ``role = item-server`` in its node config).
ITEM_SERVERS = "item-servers"


def data_keys() -> tuple[str, ...]:
    """Every key of a data description, in a fixed order."""
    keys = [*DatasetSpec().to_config(), *PartitionSpec().to_config(), ITEM_SERVERS]
    return tuple(dict.fromkeys(k for k in keys if k != "num-partitions"))


def describe(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """The full data description ``cfg`` gives (defaults for keys it does not name), typed
    and checked; ``num-partitions`` is the node's own config, not part of it."""
    out = dict(DatasetSpec.from_config(cfg).to_config())
    out.update(PartitionSpec.from_config(cfg, 1).to_config())
    out.pop("num-partitions", None)
    out[ITEM_SERVERS] = coerce(ITEM_SERVERS, cfg.get(ITEM_SERVERS, 0), int)
    return out


def differing_keys(named: Mapping[str, Any], own: Mapping[str, Any]) -> list[str]:
    """The keys ``named`` (a server's description) gives another value than the full
    description ``own``, after typing both; local keys are never compared."""
    theirs = describe(named)
    return [k for k in data_keys()
            if k in named and k not in LOCAL_KEYS and theirs[k] != own.get(k)]
