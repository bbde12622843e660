"""Assign users (rows) to nodes: cross-device (one user per node) or cross-silo.

Schemes:
  user               one user per node; num_partitions must equal n_users
  shards-contiguous  contiguous near-equal ranges of user ids
  shards-random      seeded random permutation, then near-equal shards
  row-blocks         alias of shards-random: N random row blocks (the federated-SVD papers' wording)
  silo-zip           one silo per distinct zip region: the first zip character when it is
                     a digit, else "other" (ml-100k's 18 Canadian postal codes); silos sorted
                     by region, so partition i is the i-th region in sorted order. ML-1M's
                     ZIP+4 codes ("55117-1234") and malformed ones ("5849574") go by their
                     first character too
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from ._config import coerce
from .containers import InteractionData
from .errors import DataError

KNOWN_PARTITIONS: tuple[str, ...] = (
    "user",
    "shards-contiguous",
    "shards-random",
    "row-blocks",
    "silo-zip",
)
OTHER_REGION = "other"


@dataclass(frozen=True)
class PartitionSpec:
    """How users are spread over nodes; hashable so it can key the node cache."""

    scheme: str = "shards-contiguous"
    num_partitions: int = 1
    seed: int = 0

    def __post_init__(self) -> None:
        """Reject unknown schemes and non-positive node counts early."""
        if self.scheme not in KNOWN_PARTITIONS:
            raise DataError(
                f"unknown partition scheme {self.scheme!r}; known: {', '.join(KNOWN_PARTITIONS)}"
            )
        if self.num_partitions < 1:
            raise DataError(f"num-partitions must be >= 1, got {self.num_partitions}")

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any], num_partitions: int | None = None) -> "PartitionSpec":
        """From run config keys `partition` and `seed`; num_partitions falls back to
        the `num-partitions` key (Flower's node_config), then 1."""
        n = num_partitions if num_partitions is not None else cfg.get("num-partitions", 1)
        return cls(
            scheme=coerce("partition", cfg.get("partition", cls.scheme), str),
            num_partitions=coerce("num-partitions", n, int),
            seed=coerce("seed", cfg.get("seed", cls.seed), int),
        )

    def to_config(self) -> dict[str, Any]:
        """Inverse of from_config (dashed keys, Flower ConfigRecord values)."""
        return {"partition": self.scheme, "num-partitions": self.num_partitions, "seed": self.seed}


def zip_region(zip_code: str) -> str:
    """The silo key of a zip code: its first digit, or OTHER_REGION if not a digit."""
    first = str(zip_code).strip()[:1]
    return first if first.isdigit() else OTHER_REGION


def _silo_zip(data: InteractionData, part: PartitionSpec) -> list[np.ndarray]:
    zips = data.user_attributes.get("zip")
    if zips is None:
        raise DataError(
            f"partition scheme 'silo-zip' needs user zip codes, which dataset {data.name!r} does not have"
        )
    regions = np.array([zip_region(z) for z in zips])
    keys = sorted(set(regions.tolist()))
    if len(keys) != part.num_partitions:
        raise DataError(
            f"partition scheme 'silo-zip' on {data.name!r} makes {len(keys)} silos "
            f"(first zip digits {', '.join(keys)}), but num-partitions is {part.num_partitions}"
        )
    return [np.flatnonzero(regions == k) for k in keys]


def partition_users(data: InteractionData, part: PartitionSpec) -> list[np.ndarray]:
    """Sorted global user indices per node; every user appears in exactly one node."""
    n = data.n_users
    if part.scheme == "user":
        if part.num_partitions != n:
            raise DataError(
                f"partition scheme 'user' needs one node per user: num-partitions is "
                f"{part.num_partitions} but dataset {data.name!r} has {n} users"
            )
        parts = [np.array([u], dtype=np.int64) for u in range(n)]
    elif part.scheme == "shards-contiguous":
        parts = np.array_split(np.arange(n, dtype=np.int64), part.num_partitions)
    elif part.scheme in ("shards-random", "row-blocks"):
        perm = np.random.default_rng([part.seed, 4]).permutation(n)
        parts = [np.sort(p) for p in np.array_split(perm, part.num_partitions)]
    else:
        parts = _silo_zip(data, part)
    for pid, users in enumerate(parts):
        if len(users) == 0:
            raise DataError(
                f"partition {pid} of scheme {part.scheme!r} is empty: dataset {data.name!r} "
                f"has {n} users for {part.num_partitions} partitions"
            )
    return [np.asarray(p, dtype=np.int64) for p in parts]
