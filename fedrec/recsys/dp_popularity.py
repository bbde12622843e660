"""Item popularity released with pure epsilon-DP by each node: the DP baseline a DP
recommender has to beat.

Non-private popularity is the naive baseline every quality table shows
(:func:`fedrec.recsys.metrics.popularity_sums`). Its DP version is what a user could run
instead of a DP protocol: each node adds Laplace noise to its own item counts and releases
them (they can go through a secure sum; each node's release is already DP by itself, so the
guarantee does not rest on the other nodes), the server ranks items by the summed noisy
counts. The guarantee is the same as DP prototypes': pure epsilon-DP per node at user level
(add or remove one user's row), hence epsilon-DP for the run by parallel composition over
nodes holding disjoint users.

Why the clip: a user's row of 0/1 interactions has L1 norm equal to the user's item count,
which has no public bound. Each user's row is scaled by min(1, clip / |row|_1), so a user
adds at most ``clip`` to the counts (L1 sensitivity ``clip``) and users within the bound
count exactly as in non-private popularity.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from fedrec import dp


def clipped_counts(rows: sp.spmatrix, clip: float) -> np.ndarray:
    """The node's item counts with every user's row scaled to L1 norm <= ``clip``."""
    X = sp.csr_matrix(rows, dtype=np.float64)
    X.data = np.abs(X.data)
    norms = np.asarray(X.sum(axis=1)).ravel()
    scale = np.minimum(1.0, clip / np.maximum(norms, np.finfo(np.float64).tiny))
    return np.asarray((sp.diags(scale) @ X).sum(axis=0)).ravel()


def release_ledger(epsilon: float, clip: float) -> dp.PrivacyLedger:
    """What one node's release spends: one Laplace release of L1 sensitivity ``clip``."""
    ledger = dp.PrivacyLedger()
    ledger.record("item counts (Laplace)", "laplace", epsilon, sensitivity=clip)
    return ledger


def dp_item_counts(rows: sp.spmatrix, epsilon: float, clip: float) -> np.ndarray:
    """One node's epsilon-DP item counts: :func:`clipped_counts` plus Laplace(clip /
    epsilon) per item, from the project's exact discrete sampler (``fedrec.dp``)."""
    return dp.laplace_mechanism(clipped_counts(rows, clip), clip, epsilon)
