"""DatasetSpec: the one value that names a dataset and how to prepare it.

Frozen and hashable so it can key caches; round-trips through Flower's run config.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any, Mapping

from ._config import coerce

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

# Spec field -> Flower run-config key (dashes, as in pyproject.toml).
_CONFIG_KEYS: dict[str, str] = {
    "name": "dataset",
    "data_dir": "data-dir",
    "seed": "seed",
    "test_ratio": "test-ratio",
    "implicit": "implicit",
    "min_rating": "min-rating",
    "synthetic_users": "synthetic-users",
    "synthetic_items": "synthetic-items",
    "synthetic_rank": "synthetic-rank",
    "synthetic_density": "synthetic-density",
    "synthetic_clusters": "synthetic-clusters",
    "synthetic_popularity_skew": "synthetic-popularity-skew",
    "synthetic_feature_noise": "synthetic-feature-noise",
    "cold_start_users": "cold-start-users",
    "cold_start_items": "cold-start-items",
    "drop_cold_items": "drop-cold-items",
}


@dataclass(frozen=True)
class DatasetSpec:
    """Which dataset to load and how to split it; every field affects the data."""

    name: str = "synthetic"
    data_dir: str = ""
    seed: int = 0
    test_ratio: float = 0.2
    implicit: bool = True
    min_rating: float = 0.0
    synthetic_users: int = 1000
    synthetic_items: int = 500
    synthetic_rank: int = 8
    synthetic_density: float = 0.05
    synthetic_clusters: int = 10
    synthetic_popularity_skew: float = 0.7
    synthetic_feature_noise: float = 1.0
    cold_start_users: float = 0.0
    cold_start_items: float = 0.0
    drop_cold_items: bool = False

    def __post_init__(self) -> None:
        """Reject bad values up front, before any loading work is done."""
        if self.name not in KNOWN_DATASETS and not FOLDER_NAME.fullmatch(self.name):
            raise ValueError(
                f"dataset {self.name!r}: expected one of {', '.join(KNOWN_DATASETS)}, or the "
                "name of a folder <data-dir>/<name>/ holding your own split (letters, digits, "
                "'.', '_', '+', '-'; no path separators; docs/datasets.md, 'Your own data')"
            )
        if not 0.0 <= self.test_ratio < 1.0:
            raise ValueError(f"test-ratio must be in [0, 1), got {self.test_ratio}")
        if not 0.0 < self.synthetic_density <= 1.0:
            raise ValueError(
                f"synthetic-density must be in (0, 1], got {self.synthetic_density}"
            )
        for field in ("synthetic_users", "synthetic_items", "synthetic_rank", "synthetic_clusters"):
            if getattr(self, field) < 1:
                raise ValueError(f"{_CONFIG_KEYS[field]} must be >= 1, got {getattr(self, field)}")
        for field in ("synthetic_popularity_skew", "synthetic_feature_noise"):
            if getattr(self, field) < 0:
                raise ValueError(f"{_CONFIG_KEYS[field]} must be >= 0, got {getattr(self, field)}")
        for field in ("cold_start_users", "cold_start_items"):
            if not 0.0 <= getattr(self, field) < 1.0:
                raise ValueError(
                    f"{_CONFIG_KEYS[field]} must be in [0, 1), got {getattr(self, field)}"
                )
        if self.min_rating < 0:
            raise ValueError(f"min-rating must be >= 0, got {self.min_rating}")
        if self.drop_cold_items and self.cold_start_items > 0:
            raise ValueError("drop-cold-items removes the items without a training "
                             "interaction, cold-start-items makes them: set one of the two")

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any]) -> "DatasetSpec":
        """Build from a Flower run config (dashed keys); unknown keys are ignored."""
        kwargs: dict[str, Any] = {}
        for field in dataclasses.fields(cls):
            key = _CONFIG_KEYS[field.name]
            if key in cfg:
                kwargs[field.name] = coerce(key, cfg[key], type(field.default))
        return cls(**kwargs)

    def to_config(self) -> dict[str, Any]:
        """Inverse of from_config: dashed keys, str/int/float/bool values only."""
        return {
            _CONFIG_KEYS[f.name]: getattr(self, f.name) for f in dataclasses.fields(self)
        }
