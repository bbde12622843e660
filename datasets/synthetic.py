"""Seeded low-rank Poisson ratings with side features: the no-download default dataset.

Users and items get nonnegative latent factors with a cluster boost; counts are
Poisson(scale * U V^T) with `scale` calibrated to the target density, so the data
has real low-rank structure for the protocols to find. Features are noisy linear
maps of the factors (so multi-view models have signal), and a fake zip code's first
digit follows the user's dominant latent dimension (so silo-zip makes coherent silos).
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from .containers import RawData

USER_FEATURE_DIM = 8
ITEM_FEATURE_DIM = 6
_CHUNK_ENTRIES = 4_000_000  # dense entries materialized at once


def _factors(rng: np.random.Generator, n: int, rank: int) -> np.ndarray:
    """Nonnegative factors: diffuse gamma noise plus a strong boost on one cluster dim."""
    f = rng.gamma(0.5, 0.5, size=(n, rank))
    cluster = rng.integers(0, rank, size=n)
    f[np.arange(n), cluster] += rng.gamma(4.0, 0.5, size=n)
    return f


def _calibrate(u: np.ndarray, v: np.ndarray, density: float) -> float:
    """Scale s with mean(1 - exp(-s U V^T)) ~= density, by bisection on log s."""
    rows = max(1, min(u.shape[0], _CHUNK_ENTRIES // max(1, v.shape[0])))
    sample = u[np.linspace(0, u.shape[0] - 1, rows).astype(int)] @ v.T
    target = min(density, 1.0 - 1e-9)
    lo, hi = -30.0, 30.0
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        if np.mean(-np.expm1(-np.exp(mid) * sample)) < target:
            lo = mid
        else:
            hi = mid
    return float(np.exp(hi))


def generate(n_users: int, n_items: int, rank: int, density: float, seed: int) -> RawData:
    """Explicit ratings clip(Poisson counts, 1, 5) with every user and item nonempty."""
    rng = np.random.default_rng([seed, 1])
    u = _factors(rng, n_users, rank)
    v = _factors(rng, n_items, rank)
    scale = _calibrate(u, v, density)

    rows_per_chunk = max(1, _CHUNK_ENTRIES // n_items)
    r_idx, c_idx, vals = [], [], []
    for start in range(0, n_users, rows_per_chunk):
        rates = scale * (u[start : start + rows_per_chunk] @ v.T)
        counts = rng.poisson(rates)
        empty = np.flatnonzero(counts.sum(axis=1) == 0)
        counts[empty, rates[empty].argmax(axis=1)] = 1  # every user rates something
        r, c = np.nonzero(counts)
        r_idx.append(r + start)
        c_idx.append(c)
        vals.append(np.clip(counts[r, c], 1, 5).astype(np.float64))
    rows, cols, data = np.concatenate(r_idx), np.concatenate(c_idx), np.concatenate(vals)

    empty_items = np.setdiff1d(np.arange(n_items), cols)
    if len(empty_items):  # every item is rated by its best-matching user
        best = (u @ v[empty_items].T).argmax(axis=0)
        rows = np.concatenate([rows, best])
        cols = np.concatenate([cols, empty_items])
        data = np.concatenate([data, np.ones(len(empty_items))])
    ratings = sp.csr_matrix((data, (rows, cols)), shape=(n_users, n_items))
    ratings.sort_indices()

    a = rng.normal(size=(rank, USER_FEATURE_DIM))
    b = rng.normal(size=(rank, ITEM_FEATURE_DIM))
    user_features = u @ a + 0.1 * rng.normal(size=(n_users, USER_FEATURE_DIM))
    item_features = v @ b + 0.1 * rng.normal(size=(n_items, ITEM_FEATURE_DIM))

    dominant = u.argmax(axis=1)
    tail = rng.integers(0, 10_000, size=n_users)
    zips = np.array([f"{d % 10}{t:04d}" for d, t in zip(dominant, tail)])
    return RawData(
        ratings=ratings,
        user_features=user_features,
        item_features=item_features,
        user_attributes={"zip": zips, "cluster": dominant.astype(np.int64)},
        has_ratings=True,
    )
