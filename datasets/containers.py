"""Data containers: the whole dataset (InteractionData) and one node's rows (NodeData)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp


@dataclass
class RawData:
    """What a source loader returns before implicit/min-rating, split and cold start.

    Either `ratings` (all interactions, no given split) or `train` and `test`
    (the published split) is set.
    """

    ratings: sp.csr_matrix | None = None
    train: sp.csr_matrix | None = None
    test: sp.csr_matrix | None = None
    user_features: np.ndarray | None = None
    item_features: np.ndarray | None = None
    user_attributes: dict[str, np.ndarray] = field(default_factory=dict)
    has_ratings: bool = False  # True when values are ratings (min-rating applies)

    @property
    def shape(self) -> tuple[int, int]:
        """(n_users, n_items) of whichever matrix is present."""
        m = self.ratings if self.ratings is not None else self.train
        assert m is not None
        return m.shape


@dataclass
class InteractionData:
    """The whole dataset, for centralized references and for partitioning.

    Instances returned by load_dataset are shared through an in-memory cache:
    copy before mutating.
    """

    train: sp.csr_matrix
    test: sp.csr_matrix
    user_features: np.ndarray | None
    item_features: np.ndarray | None
    user_attributes: dict[str, np.ndarray]
    cold_users: np.ndarray
    cold_items: np.ndarray
    name: str

    @property
    def n_users(self) -> int:
        """Number of rows (users)."""
        return int(self.train.shape[0])

    @property
    def n_items(self) -> int:
        """Number of columns (items)."""
        return int(self.train.shape[1])


@dataclass
class NodeData:
    """What ONE node holds: only its own users' rows, never the full matrix.

    A user node (or silo) holds rows and, where the dataset has them, its users' features
    and attributes (e.g. ML-100K ``u.user``: age, gender, occupation, zip). An item server
    holds no rows (``train`` is 0 x n_items) and the catalogue's item features.
    """

    partition_id: int
    user_ids: np.ndarray
    train: sp.csr_matrix
    test: sp.csr_matrix
    user_features: np.ndarray | None
    n_items: int
    n_users_total: int
    item_features: np.ndarray | None = None
    user_attributes: dict[str, np.ndarray] = field(default_factory=dict)
    #: An item server's new (cold-start) items: catalogue metadata, no user data.
    cold_items: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))

    @property
    def holds(self) -> tuple[str, ...]:
        """What this node holds, as the handshake reports it: rows, user-features,
        user-attributes, item-features."""
        out = []
        if len(self.user_ids):
            out.append("rows")
        if self.user_features is not None and len(self.user_ids):
            out.append("user-features")
        if self.user_attributes and len(self.user_ids):
            out.append("user-attributes")
        if self.item_features is not None:
            out.append("item-features")
        return tuple(out)
