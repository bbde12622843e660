"""Train/test preparation: rating filter, per-user holdout and cold-start selection."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp


def binarize(m: sp.csr_matrix, implicit: bool, min_rating: float) -> sp.csr_matrix:
    """Keep entries >= min_rating (when > 0); with implicit, set every value to 1.0."""
    m = m.tocsr(copy=True).astype(np.float64)
    if min_rating > 0:
        m.data[m.data < min_rating] = 0.0
        m.eliminate_zeros()
    if implicit:
        m.data[:] = 1.0
    return m


def _from_mask(m: sp.csr_matrix, keep: np.ndarray) -> sp.csr_matrix:
    """The entries of CSR `m` where `keep` (aligned with m.data) is True."""
    rows = np.repeat(np.arange(m.shape[0]), np.diff(m.indptr))
    out = sp.csr_matrix((m.data[keep], (rows[keep], m.indices[keep])), shape=m.shape)
    out.sort_indices()
    return out


def test_counts(counts: np.ndarray, test_ratio: float) -> np.ndarray:
    """Test interactions per user: round(test_ratio * n); when test_ratio > 0, a user with
    >= 2 interactions keeps >= 1 in train and puts >= 1 in test, one with 1 keeps it."""
    n_test = np.floor(counts * test_ratio + 0.5).astype(np.int64)
    if test_ratio > 0:
        n_test = np.where(counts >= 2, np.clip(n_test, 1, np.maximum(counts - 1, 1)), 0)
    return n_test


def holdout(m: sp.csr_matrix, test_ratio: float, rng: np.random.Generator) -> tuple[sp.csr_matrix, sp.csr_matrix]:
    """Per-user random holdout of round(test_ratio * n) interactions.

    A user with >= 2 interactions keeps >= 1 in train and (when test_ratio > 0)
    puts >= 1 in test; a user with one interaction keeps it in train.
    """
    m = m.tocsr()
    m.sort_indices()
    counts = np.diff(m.indptr)
    n_test = test_counts(counts, test_ratio)
    rows = np.repeat(np.arange(m.shape[0]), counts)
    order = np.lexsort((rng.random(m.nnz), rows))  # random order within each row
    rank = np.empty(m.nnz, dtype=np.int64)
    rank[order] = np.arange(m.nnz) - m.indptr[rows]
    is_test = rank < n_test[rows]
    return _from_mask(m, ~is_test), _from_mask(m, is_test)


def cold_start(
    train: sp.csr_matrix,
    test: sp.csr_matrix,
    user_frac: float,
    item_frac: float,
    rng: np.random.Generator,
) -> tuple[sp.csr_matrix, sp.csr_matrix, np.ndarray, np.ndarray]:
    """Move every train interaction of a random fraction of users/items into test."""
    n_users, n_items = train.shape
    cold_users = np.sort(rng.choice(n_users, int(round(user_frac * n_users)), replace=False))
    cold_items = np.sort(rng.choice(n_items, int(round(item_frac * n_items)), replace=False))
    if len(cold_users) == 0 and len(cold_items) == 0:
        return train, test, cold_users.astype(np.int64), cold_items.astype(np.int64)
    rows = np.repeat(np.arange(n_users), np.diff(train.indptr))
    move = np.isin(rows, cold_users) | np.isin(train.indices, cold_items)
    moved = _from_mask(train, move)
    test = test.maximum(moved).tocsr()  # maximum, not sum: a given split may overlap
    test.sort_indices()
    return _from_mask(train, ~move), test, cold_users.astype(np.int64), cold_items.astype(np.int64)
