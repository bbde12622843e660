"""DatasetSpec: the one value that names a dataset and how to prepare it.

Frozen and hashable so it can key caches; round-trips through Flower's run config.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any, Mapping

from ._config import ConfigError, Key

KNOWN_DATASETS: tuple[str, ...] = (
    "synthetic", "ml-100k", "ml-1m", "gowalla", "yelp2018", "lightgcn")
#: How reports and tables name a dataset. ``ml-1m`` says which users it holds because only
#: the ratings of users 1-2999 of the release are available (about half of ML-1M), so its
#: numbers are not the full data set's.
DISPLAY_NAMES: dict[str, str] = {
    "synthetic": "Synthetic",
    "ml-100k": "ML-100K",
    "ml-1m": "ML-1M (users 1-2999)",
    "gowalla": "Gowalla",
    "yelp2018": "Yelp2018",
    "lightgcn": "LightGCN split",
}


def display_name(name: str) -> str:
    """The label of dataset ``name`` in reports; a folder dataset keeps its folder name."""
    return DISPLAY_NAMES.get(name, name)
#: Any other name is a folder dataset, ``<data-dir>/<name>/`` (``datasets/sources.py``). The
#: name becomes a path component and part of cache file names, so it must be one plain
#: folder name: no separators, no leading dot (no ``..``), no spaces.
FOLDER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*")

#: The data's run-config keys, declared once: the core lists them among every run's keys
#: (``fedrec/config.py``) and :class:`DatasetSpec` takes its defaults and checks from them.
#: A spec field is its key with underscores (``test-ratio`` -> ``test_ratio``), except
#: ``dataset``, the field ``name``.
DATASET_KEYS: tuple[Key, ...] = (
    Key("dataset", "synthetic", "`synthetic`, `ml-100k`, `ml-1m` (users 1-2999 only), "
        "`gowalla`, `yelp2018`, `lightgcn`, or any plain folder name: your own split in "
        "`<data-dir>/<name>/` (docs/datasets.md)", used_by="all"),
    Key("data-dir", "", "folder holding `<dataset>/`; `\"\"` means `$FEDREC_DATA`, else "
        "`../shared/data`. A SuperNode's own `data-dir` node config wins", used_by="all"),
    Key("seed", 0, "seeds every public random draw (data, split, partition, model init, "
        "negatives, public graphs); secrets never come from it", used_by="all"),
    Key("synthetic-users", 1000, "users of the synthetic dataset (docs/datasets.md)", min=1,
        used_by="synthetic"),
    Key("synthetic-items", 500, "items of the synthetic dataset", min=1, used_by="synthetic"),
    Key("synthetic-rank", 8, "rank of the synthetic user/item latent factors", min=1,
        used_by="synthetic"),
    Key("synthetic-density", 0.05, "target fraction of non-zero synthetic entries (mean "
        "interactions per user = density x items)", min=1e-9, max=1.0, used_by="synthetic"),
    Key("synthetic-clusters", 10, "taste clusters of synthetic users and items; a user's zip "
        "starts with cluster % 10, so `silo-zip` makes one silo per cluster up to 10", min=1,
        used_by="synthetic"),
    Key("synthetic-popularity-skew", 0.7, "Zipf exponent of synthetic item propensities "
        "(rank^-skew); 0 = no popularity long tail", min=0.0, used_by="synthetic"),
    Key("synthetic-feature-noise", 1.0, "std of the noise on synthetic side features (signal "
        "std ~1.4); 0 = features are exact linear images of the latent factors", min=0.0,
        used_by="synthetic"),
    Key("test-ratio", 0.2, "per-user holdout when the dataset has no given split", min=0.0,
        max=0.99, used_by="synthetic, ml-100k"),
    Key("implicit", True, "binarize ratings (every interaction is 1.0)",
        used_by="ml-100k, ml-1m"),
    Key("min-rating", 0.0, "keep ratings >= this before binarizing (0 keeps all)", min=0.0,
        used_by="ml-100k, ml-1m"),
    Key("cold-start-users", 0.0, "fraction of users held out entirely as cold-start users",
        min=0.0, max=0.99, used_by="cold-start protocols"),
    Key("cold-start-items", 0.0, "fraction of items held out entirely as cold-start items",
        min=0.0, max=0.99, used_by="cold-start protocols"),
    Key("drop-cold-items", False, "after the split, remove the items without a training "
        "interaction from the catalogue (LP-GCN needs every item to have one)"),
)
_KEYS: dict[str, Key] = {k.name: k for k in DATASET_KEYS}


def field_key(field: str) -> Key:
    """The run-config key of :class:`DatasetSpec` field ``field``."""
    return _KEYS["dataset" if field == "name" else field.replace("_", "-")]


def _default(field: str) -> Any:
    return field_key(field).default


@dataclass(frozen=True)
class DatasetSpec:
    """Which dataset to load and how to split it; every field affects the data. Defaults,
    types and ranges are the keys' (:data:`DATASET_KEYS`)."""

    name: str = _default("name")
    data_dir: str = _default("data_dir")
    seed: int = _default("seed")
    test_ratio: float = _default("test_ratio")
    implicit: bool = _default("implicit")
    min_rating: float = _default("min_rating")
    synthetic_users: int = _default("synthetic_users")
    synthetic_items: int = _default("synthetic_items")
    synthetic_rank: int = _default("synthetic_rank")
    synthetic_density: float = _default("synthetic_density")
    synthetic_clusters: int = _default("synthetic_clusters")
    synthetic_popularity_skew: float = _default("synthetic_popularity_skew")
    synthetic_feature_noise: float = _default("synthetic_feature_noise")
    cold_start_users: float = _default("cold_start_users")
    cold_start_items: float = _default("cold_start_items")
    drop_cold_items: bool = _default("drop_cold_items")

    def __post_init__(self) -> None:
        """Reject bad values up front, before any loading work is done: each field is
        parsed by its key (type, range; ConfigError naming the key) and kept typed, so
        equal specs hash alike whatever form their values came in."""
        for field in dataclasses.fields(self):
            object.__setattr__(self, field.name,
                               field_key(field.name).parse(getattr(self, field.name)))
        if self.name not in KNOWN_DATASETS and not FOLDER_NAME.fullmatch(self.name):
            raise ConfigError(
                f"run config 'dataset': expected one of {', '.join(KNOWN_DATASETS)}, or the "
                "name of a folder <data-dir>/<name>/ holding your own split (letters, digits, "
                f"'.', '_', '+', '-'; no path separators; docs/datasets.md, 'Your own data'), "
                f"got {self.name!r}"
            )
        if self.drop_cold_items and self.cold_start_items > 0:
            raise ConfigError("drop-cold-items removes the items without a training "
                              "interaction, cold-start-items makes them: set one of the two")

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any]) -> "DatasetSpec":
        """Build from a Flower run config (dashed keys); unknown keys are ignored."""
        names = {field.name: field_key(field.name).name for field in dataclasses.fields(cls)}
        return cls(**{field: cfg[key] for field, key in names.items() if key in cfg})

    def to_config(self) -> dict[str, Any]:
        """Inverse of from_config: dashed keys, str/int/float/bool values only."""
        return {field_key(f.name).name: getattr(self, f.name) for f in dataclasses.fields(self)}
