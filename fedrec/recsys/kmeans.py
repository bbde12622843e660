"""Non-private k-means (k-means++ then Lloyd) and the k-means loss of paper 003, Eq. 3.

The loss is the yardstick of the private prototypes (paper 003, App. B3) and the
non-private "MF + k-means" baseline is built from :func:`kmeans` (the paper used
scikit-learn, which this project does not depend on).
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

__all__ = ["squared_distances", "kmeans_loss", "kmeans"]


def squared_distances(X: np.ndarray | sp.spmatrix, Z: np.ndarray) -> np.ndarray:
    """||x_i - z_j||^2 for every row of X (n x d, dense or sparse) and Z (k x d)."""
    Z = np.asarray(Z, dtype=np.float64)
    xx = (np.asarray(X.multiply(X).sum(axis=1)).ravel() if sp.issparse(X)
          else np.einsum("ij,ij->i", X, X))
    cross = np.asarray(X @ Z.T)
    return np.maximum(xx[:, None] - 2.0 * cross + np.einsum("ij,ij->i", Z, Z)[None, :], 0.0)


def kmeans_loss(X: np.ndarray | sp.spmatrix, Z: np.ndarray) -> float:
    """Paper 003, Eq. 3: sum_i min_j ||x_i - z_j||^2 (a sum of squares, although the text
    calls it "the average Euclidean distance")."""
    return float(squared_distances(X, Z).min(axis=1).sum())


def kmeans(X: np.ndarray | sp.spmatrix, k: int, seed: int, iters: int = 100,
           restarts: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Centres (k x d) and labels of Lloyd's k-means from k-means++ seeding; the best of
    ``restarts`` runs by :func:`kmeans_loss`. An empty cluster keeps its previous centre."""
    n = X.shape[0]
    k = int(k)
    if not 1 <= k <= n:
        raise ValueError(f"k must be in [1, {n}] (the number of rows), got {k}")
    dense = X.toarray() if sp.issparse(X) else np.asarray(X, dtype=np.float64)
    best: tuple[float, np.ndarray, np.ndarray] | None = None
    for r in range(int(restarts)):
        rng = np.random.default_rng([seed, 29, r])
        centres = [dense[rng.integers(n)]]
        d2 = squared_distances(dense, np.array(centres))[:, 0]
        for _ in range(1, k):
            total = d2.sum()
            i = rng.choice(n, p=d2 / total) if total > 0 else rng.integers(n)
            centres.append(dense[i])
            d2 = np.minimum(d2, squared_distances(dense, dense[i:i + 1])[:, 0])
        Z = np.array(centres)
        labels = np.full(n, -1)
        for _ in range(int(iters)):
            new = squared_distances(dense, Z).argmin(axis=1)
            if np.array_equal(new, labels):
                break
            labels = new
            for j in range(k):
                members = labels == j
                if members.any():
                    Z[j] = dense[members].mean(axis=0)
        loss = kmeans_loss(dense, Z)
        if best is None or loss < best[0]:
            best = (loss, Z.copy(), labels.copy())
    assert best is not None
    return best[1], best[2]
