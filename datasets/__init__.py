"""fedrec-privacy data: loaders, synthetic generator, user partitioners, node cache.

A node calls load_node_data and receives only its own users' rows; centralized
references call load_dataset. Not Hugging Face `datasets` (this package shadows it).
"""

from .containers import InteractionData, NodeData
from .description import data_keys, describe, differing_keys
from .errors import DataError
from .load import load_dataset, load_item_server_data, load_node_data, row_digests
from .partition import KNOWN_PARTITIONS, PartitionSpec, partition_users
from .spec import DISPLAY_NAMES, KNOWN_DATASETS, DatasetSpec, display_name

__all__ = [
    "DISPLAY_NAMES",
    "KNOWN_DATASETS",
    "KNOWN_PARTITIONS",
    "DataError",
    "DatasetSpec",
    "InteractionData",
    "NodeData",
    "PartitionSpec",
    "load_dataset",
    "load_item_server_data",
    "load_node_data",
    "partition_users",
    "row_digests",
    "display_name",
    "data_keys",
    "describe",
    "differing_keys",
]
