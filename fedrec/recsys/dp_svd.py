"""dp-svd's math: a user-level DP low-rank item subspace by the noisy power method.

Every user's interaction row r is scaled to L2 norm at most 1 (``a = r / max(1, ||r||)``),
so one user moves each of the run's sums by at most 1 in L2 (add/remove neighbours):

1. **item selection** (one noisy sum): the sum of the scaled rows, the users' item counts
   at norm <= 1 each. The ``items`` largest noisy counts are the catalogue the subspace
   lives on (all items when ``items`` is 0). The noisy counts are public from here on;
2. **subspace iteration** (``iterations`` noisy sums): from a public orthonormal X (items x
   rank: the noisy counts on S and seeded Gaussian columns, orthonormalized), each user answers ``a_S (a_S^T X)`` on the selected items S,
   the server orthonormalizes the noisy sum ``Y = A_S^T A_S X + noise`` (Hardt & Price's
   noisy power method). ``||a_S a_S^T X||_F = ||a_S|| ||X^T a_S|| <= 1`` for an
   orthonormal X, so the reply needs no further clipping (the sum layer clips it to 1 all
   the same, whatever X the server sends);
3. **scoring** (local, nothing released): a user ranks items by ``r_S X X^T`` on S, items
   outside S by nothing (score 0), plus the noisy counts scaled to max 1 times
   ``pop_weight``.

Every sum has L2 sensitivity 1, so one noise multiplier z serves all ``iterations + 1`` of
them; the accountant composes them (``strategies/dp_svd.py``). :func:`simulate` runs the
three steps in one process with the sums' noise drawn as one Gaussian of the total sigma
(the benchmark's runs); the federated protocol computes the same sums node by node
(``tests/test_dp_svd.py`` checks both agree when the noise is known).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from fedrec.recsys.linalg import qr_positive


@dataclass(frozen=True)
class DPSVDParams:
    """dp-svd's public hyperparameters (the server sends them). The defaults are the
    validation choice at epsilon 5 on ML-1M users 1-2999, Gowalla and Yelp2018 alike
    (``results/dp_svd/curve-<dataset>.md``)."""

    rank: int = 4  # columns of X: the subspace's dimension
    iterations: int = 3  # noisy power iterations (each one noisy sum)
    items: int = 250  # items kept by the noisy counts (0: every item)
    pop_weight: float = 0.1  # weight of the noisy counts beside the low-rank score


def scaled_rows(rows: sp.spmatrix) -> sp.csr_matrix:
    """Each row divided by max(1, its L2 norm): every user's row at norm <= 1."""
    rows = sp.csr_matrix(rows, dtype=np.float64)
    norms = np.sqrt(np.asarray(rows.multiply(rows).sum(axis=1)).ravel())
    return sp.csr_matrix(sp.diags(1.0 / np.maximum(1.0, norms)) @ rows)


def count_share(rows: sp.spmatrix) -> np.ndarray:
    """Step 1's share: the sum of the scaled rows (length: the catalogue)."""
    return np.asarray(scaled_rows(rows).sum(axis=0), dtype=np.float64).ravel()


def select_items(noisy_counts: np.ndarray, items: int) -> np.ndarray:
    """The ``items`` largest noisy counts' item ids, ascending (ties: the lower id first);
    every item when ``items`` is 0 or covers the catalogue."""
    counts = np.asarray(noisy_counts, dtype=np.float64)
    if items <= 0 or items >= counts.size:
        return np.arange(counts.size, dtype=np.int64)
    order = np.lexsort((np.arange(counts.size), -counts))
    return np.sort(order[:items]).astype(np.int64)


def initial_basis(n: int, rank: int, seed: int,
                  start: np.ndarray | None = None) -> np.ndarray:
    """The public starting basis: orthonormal n x rank from a Gaussian seeded by ``seed``,
    its first column replaced by ``start`` when given (the selected items' noisy counts,
    already released: the power method starts from the popularity direction, which the
    top eigenvector of A^T A is near, and needs fewer noisy iterations to settle)."""
    if rank > n:
        raise ValueError(f"rank {rank} exceeds the {n} selected items")
    rng = np.random.default_rng([seed, 7103])
    G = rng.standard_normal((n, rank))
    if start is not None and np.any(start):
        G[:, 0] = np.asarray(start, dtype=np.float64)
    return qr_positive(G)[0]


def power_share(rows: sp.spmatrix, items: np.ndarray, X: np.ndarray) -> np.ndarray:
    """Step 2's share: ``A_S^T (A_S X)`` over these users' scaled rows on the items S."""
    A = scaled_rows(rows)[:, items]
    return np.asarray(A.T @ (A @ X), dtype=np.float64)


def next_basis(Y: np.ndarray) -> np.ndarray:
    """The server's step: the noisy sum orthonormalized (positive-diagonal QR)."""
    return qr_positive(Y)[0]


def scores(rows: sp.spmatrix, items: np.ndarray, X: np.ndarray, n_items: int,
           noisy_counts: np.ndarray | None = None, pop_weight: float = 0.0) -> np.ndarray:
    """Step 3: ``r_S X X^T`` on S (zero elsewhere), plus ``pop_weight`` times the noisy
    counts scaled to max 1 (any rows: raw or scaled give the same ranking per user)."""
    rows = sp.csr_matrix(rows, dtype=np.float64)
    out = np.zeros((rows.shape[0], n_items))
    out[:, items] = np.asarray((rows[:, items] @ X) @ X.T)
    if pop_weight and noisy_counts is not None:
        top = float(np.max(np.abs(noisy_counts))) or 1.0
        out += pop_weight * np.asarray(noisy_counts, dtype=np.float64) / top
    return out


@dataclass
class SVDModel:
    """What the run releases: the noisy counts, the selected items and the final basis."""

    counts: np.ndarray
    items: np.ndarray
    X: np.ndarray


def simulate(train: sp.spmatrix, p: DPSVDParams, noise_multiplier: float, seed: int,
             noise_seed: int | None = None) -> SVDModel:
    """dp-svd in one process over every user: the sums' noise (sigma = noise_multiplier,
    the sensitivity being 1) drawn from a numpy stream seeded by ``noise_seed`` (default
    ``seed``): a simulation's draws, not a release's."""
    train = sp.csr_matrix(train, dtype=np.float64)
    rng = np.random.default_rng([seed if noise_seed is None else noise_seed, 6047])

    def noisy(x: np.ndarray) -> np.ndarray:
        return x + rng.normal(0.0, noise_multiplier, x.shape) if noise_multiplier else x

    counts = noisy(count_share(train))
    items = select_items(counts, p.items)
    X = initial_basis(items.size, p.rank, seed, counts[items])
    for _ in range(p.iterations):
        X = next_basis(noisy(power_share(train, items, X)))
    return SVDModel(counts=counts, items=items, X=X)
