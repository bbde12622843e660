"""Matrix factorization with the BPR loss: the math FedMF's nodes and its centralized
reference share.

Objective (implicit feedback). For each user u with training items T_u, one round samples
``negatives`` items j not in T_u per positive i (seeded by ``(seed, round, user id)`` so a
node and the centralized reference draw the same triples) and

    l_u(U_u, V) = mean over (i, j) of -log sigmoid(U_u . (V_i - V_j)) + reg * |U_u|^2
    L(U, V)     = (1 / N) * sum_u l_u + reg * |V|^2          (N = users with training items)

One round is one full-batch gradient step, simultaneous in U and V:

    U_u <- U_u - lr * grad_{U_u} l_u        (a user's own loss: computed where U_u lives)
    V   <- V   - lr * grad_V L

Why this split: a node holding users S computes ``grad_V`` of ``(1/|S|) sum_{u in S} l_u +
reg |V|^2`` and FedAvg averages the nodes' updated V weighted by |S|, which gives exactly
``V - lr * grad_V L``. So FedMF with full participation and one local step is centralized
gradient descent, up to floating-point summation order.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp

#: Stream tags, so item init, user init and negative sampling never share random draws.
_ITEM_INIT, _USER_INIT, _NEGATIVES = 11, 13, 17


def init_item_factors(n_items: int, dim: int, seed: int, scale: float = 0.1) -> np.ndarray:
    """Item factors V0 (the server's initial model)."""
    return np.random.default_rng([seed, _ITEM_INIT]).normal(0.0, scale, (n_items, dim))


def init_user_factors(user_ids: np.ndarray, dim: int, seed: int,
                      scale: float = 0.1) -> np.ndarray:
    """User factors, each drawn from its own stream so any partition draws the same values."""
    out = np.empty((len(user_ids), dim))
    for row, uid in enumerate(user_ids):
        out[row] = np.random.default_rng([seed, _USER_INIT, int(uid)]).normal(0.0, scale, dim)
    return out


def sample_bpr_triples(train: sp.csr_matrix, user_ids: np.ndarray, seed: int, round_: int,
                       negatives: int = 1) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(row, positive, negative) triples: every positive with ``negatives`` uniform negatives.

    Negatives are drawn uniformly from the items the user has not interacted with, exactly
    (no rejection loop): draw r in [0, n_items - |T_u|) and map it to the r-th non-positive
    item with one ``searchsorted`` on the sorted positives.
    """
    train = sp.csr_matrix(train)
    n_items = train.shape[1]
    rows, pos, neg = [], [], []
    for r in range(train.shape[0]):
        items = np.sort(train.indices[train.indptr[r]:train.indptr[r + 1]])
        if len(items) == 0 or len(items) >= n_items:
            continue
        rng = np.random.default_rng([seed, _NEGATIVES, round_, int(user_ids[r])])
        draws = rng.integers(0, n_items - len(items), size=len(items) * negatives)
        neg_items = draws + np.searchsorted(items - np.arange(len(items)), draws, side="right")
        rows.append(np.full(len(draws), r))
        pos.append(np.repeat(items, negatives))
        neg.append(neg_items)
    if not rows:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, empty
    return np.concatenate(rows), np.concatenate(pos), np.concatenate(neg)


@dataclass
class BPRStep:
    """One round's result for a set of users: their new factors and the V gradient."""

    user_factors: np.ndarray  # updated U for the rows given
    grad_items: np.ndarray  # grad_V of (1/n_users) sum_u l_u + reg |V|^2
    loss: float  # mean over users of l_u
    n_users: int  # users with at least one training item


def bpr_step(user_factors: np.ndarray, item_factors: np.ndarray, train: sp.csr_matrix,
             user_ids: np.ndarray, *, seed: int, round_: int, lr: float, reg: float,
             negatives: int = 1) -> BPRStep:
    """One full-batch BPR gradient step for the given users (see the module docstring)."""
    U, V = user_factors, item_factors
    rows, pos, neg = sample_bpr_triples(train, user_ids, seed, round_, negatives)
    counts = np.bincount(rows, minlength=U.shape[0]).astype(float)
    active = counts > 0
    n_users = int(active.sum())
    grad_V = 2.0 * reg * V
    if n_users == 0:
        return BPRStep(U.copy(), grad_V, 0.0, 0)
    diff = V[pos] - V[neg]
    x = np.einsum("td,td->t", U[rows], diff)
    weight = 1.0 / counts[rows]  # mean over the user's triples
    loss_u = np.bincount(rows, weights=np.logaddexp(0.0, -x) * weight, minlength=U.shape[0])
    coef = -weight / (1.0 + np.exp(x))  # d l / d x, per triple
    grad_U = np.zeros_like(U)
    np.add.at(grad_U, rows, coef[:, None] * diff)
    grad_U[active] += 2.0 * reg * U[active]
    loss_u[active] += reg * np.einsum("ud,ud->u", U[active], U[active])
    g_items = np.zeros_like(V)
    np.add.at(g_items, pos, coef[:, None] * U[rows])
    np.add.at(g_items, neg, -coef[:, None] * U[rows])
    grad_V += g_items / n_users
    return BPRStep(U - lr * grad_U, grad_V, float(loss_u[active].mean()), n_users)


@dataclass
class BPRMF:
    """Centralized BPR matrix factorization, trained by the same rounds FedMF runs.

    ``fit`` runs ``rounds`` full-batch steps of :func:`bpr_step` over all users; ``score``
    returns dense scores for a batch of users. Same seed and schedule as FedMF give the same
    factors.
    """

    dim: int = 16
    lr: float = 0.05
    reg: float = 1e-4
    negatives: int = 1
    seed: int = 0
    user_factors: np.ndarray | None = field(default=None, repr=False)
    item_factors: np.ndarray | None = field(default=None, repr=False)
    losses: list[float] = field(default_factory=list, repr=False)

    def fit(self, train: sp.csr_matrix, rounds: int) -> BPRMF:
        n_users, n_items = train.shape
        user_ids = np.arange(n_users)
        U = init_user_factors(user_ids, self.dim, self.seed)
        V = init_item_factors(n_items, self.dim, self.seed)
        for r in range(1, rounds + 1):
            step = bpr_step(U, V, train, user_ids, seed=self.seed, round_=r, lr=self.lr,
                            reg=self.reg, negatives=self.negatives)
            U, V = step.user_factors, V - self.lr * step.grad_items
            self.losses.append(step.loss)
        self.user_factors, self.item_factors = U, V
        return self

    def score(self, users: np.ndarray) -> np.ndarray:
        if self.user_factors is None or self.item_factors is None:
            raise RuntimeError("BPRMF.score called before fit")
        return self.user_factors[users] @ self.item_factors.T
