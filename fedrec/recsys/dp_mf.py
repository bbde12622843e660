"""dp-fedmf's math: user-level DP federated BPR matrix factorization.

One round, for every user (each node holds its users' factors; with partition ``user`` one):

1. the user's factor u takes ``epochs`` full-batch gradient steps (step ``lr``) on the mean
   BPR loss of its triples (each training item with ``negatives`` uniform non-items) with
   the broadcast item factors V fixed: private, it never leaves the node;
2. if the user takes part in the round (its node's own Poisson draw), its item update is
   the negative gradient of its summed BPR loss with respect to V at the new u, every item
   row it touches, scaled as one vector to L2 norm at most ``clip``: all of the user's
   interactions in one bounded update (user-level sensitivity ``clip``);
3. the server adds the (noisy) sum of the updates to V with step ``server_lr / (q N)``, N
   the users, q the sampling rate: the expected number of participants, never the real one
   (dividing by the real count would reveal it).

:func:`round_updates` computes steps 1-2 for a batch of users at once; the node calls it on
its own rows, :func:`simulate` on all of them (the benchmark's tuning and its seeds, with the
noise of the sum drawn as one Gaussian of the total variance:
``benchmarks/dp_fedmf.py`` says where the federated runs and the simulation agree).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from fedrec.recsys.mf import init_item_factors, init_user_factors


@dataclass(frozen=True)
class DPMFParams:
    """dp-fedmf's hyperparameters (public: the server sends them every round)."""

    dim: int = 16
    lr: float = 0.5  # user-factor step (mean BPR loss)
    epochs: int = 3  # user-factor steps per round
    reg: float = 0.01  # L2 weight on the user factor
    negatives: int = 1
    clip: float = 2.0  # L2 bound of one user's item update
    server_lr: float = 4.0
    rate: float = 0.3  # Poisson sampling rate q


@dataclass
class RoundUpdate:
    """Steps 1-2 for a batch of users: their new factors, and the sum of the clipped item
    updates of those that take part (with how many were clipped)."""

    user_factors: np.ndarray
    item_update: np.ndarray
    n_clipped: int
    loss: float


def bpr_triples(train: sp.csr_matrix, user_ids: np.ndarray, seed: int, round_: int,
                negatives: int = 1) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(row, positive, negative) triples: every training item of every row with
    ``negatives`` items drawn uniformly from those the row's user has not interacted with
    (rejection: redraw the draws that hit one of its items; a row holding every item gets
    no triples). The stream is keyed by the seed, the round and the first user id, so a
    node holding one user draws as its own stream."""
    train = sp.csr_matrix(train)
    n_items = train.shape[1]
    counts = np.diff(train.indptr)
    ok = (counts > 0) & (counts < n_items)
    owner = np.repeat(np.arange(train.shape[0]), counts)
    rows, pos = np.tile(owner, negatives), np.tile(train.indices.astype(np.int64), negatives)
    keep = ok[rows]
    rows, pos = rows[keep], pos[keep]
    first = int(user_ids[0]) if len(user_ids) else 0
    rng = np.random.default_rng([seed, 29, round_, first])
    keys = np.sort(owner.astype(np.int64) * n_items + train.indices)
    neg = rng.integers(0, n_items, size=rows.size)
    todo = np.arange(rows.size)
    while todo.size:
        k = rows[todo] * n_items + neg[todo]
        at = np.searchsorted(keys, k)
        hit = (at < keys.size) & (keys[np.minimum(at, keys.size - 1)] == k)
        todo = todo[hit]
        neg[todo] = rng.integers(0, n_items, size=todo.size)
    return rows, pos, neg


def round_updates(U: np.ndarray, V: np.ndarray, train: sp.csr_matrix, user_ids: np.ndarray,
                  takes_part: np.ndarray, p: DPMFParams, *, seed: int, round_: int
                  ) -> RoundUpdate:
    """See the module docstring; ``takes_part`` is a boolean per row of ``train``."""
    train = sp.csr_matrix(train)
    rows, pos, neg = bpr_triples(train, user_ids, seed, round_, p.negatives)
    U = U.copy()
    n_users = U.shape[0]
    counts = np.bincount(rows, minlength=n_users).astype(np.float64)
    active = counts > 0
    inv = np.zeros(n_users)
    inv[active] = 1.0 / counts[active]
    diff = V[pos] - V[neg]
    # users x triples: grad_U = S @ (per-triple rows), a sparse product instead of add.at
    S = sp.csr_matrix((np.ones(rows.size), (rows, np.arange(rows.size))),
                      shape=(n_users, rows.size))
    for _ in range(p.epochs):
        x = np.einsum("td,td->t", U[rows], diff)
        coef = -inv[rows] / (1.0 + np.exp(x))
        grad = S @ (coef[:, None] * diff)
        grad[active] += 2.0 * p.reg * U[active]
        U = U - p.lr * grad
    x = np.einsum("td,td->t", U[rows], diff)
    loss = float((np.logaddexp(0.0, -x) * inv[rows]).sum() / max(int(active.sum()), 1))
    item_update = np.zeros_like(V)
    n_clipped = 0
    keep = takes_part[rows]
    if keep.any():
        r, pp, nn = rows[keep], pos[keep], neg[keep]
        c = 1.0 / (1.0 + np.exp(x[keep]))  # -d loss / d x, per triple (summed loss)
        # every (user, item) entry of the users' updates, aggregated
        keys = np.concatenate([r * V.shape[0] + pp, r * V.shape[0] + nn])
        vals = np.concatenate([c[:, None] * U[r], -c[:, None] * U[r]])
        uniq, at = np.unique(keys, return_inverse=True)
        entry = sp.csr_matrix((np.ones(at.size), (at, np.arange(at.size))),
                              shape=(uniq.size, at.size)) @ vals
        owner = uniq // V.shape[0]
        norms = np.sqrt(np.bincount(owner, weights=(entry * entry).sum(axis=1),
                                    minlength=n_users))
        scale = np.ones(n_users)
        over = norms > p.clip
        scale[over] = p.clip / norms[over]
        n_clipped = int(over.sum())
        items = uniq % V.shape[0]
        item_update = sp.csr_matrix((np.ones(items.size), (items, np.arange(items.size))),
                                    shape=(V.shape[0], items.size)) @ (
                                        entry * scale[owner][:, None])
    return RoundUpdate(U, item_update, n_clipped, loss)


def server_step(V: np.ndarray, noisy_sum: np.ndarray, p: DPMFParams, n_users: int
                ) -> np.ndarray:
    """V + server_lr * noisy_sum / (q N): step 3 of the module docstring."""
    return V + p.server_lr * noisy_sum / (p.rate * n_users)


def init_factors(train: sp.csr_matrix, user_ids: np.ndarray, p: DPMFParams, seed: int
                 ) -> tuple[np.ndarray, np.ndarray]:
    """(U, V) at round 0, the same draws FedMF makes."""
    return (init_user_factors(user_ids, p.dim, seed),
            init_item_factors(train.shape[1], p.dim, seed))


def simulate(train: sp.csr_matrix, p: DPMFParams, rounds: int, noise_multiplier: float,
             seed: int, on_round: Callable[[int, np.ndarray, np.ndarray], None] | None = None,
             noise_seed: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """dp-fedmf in one process, every user its own node: Poisson participation and the
    sum's noise (one Gaussian of the total sigma = noise_multiplier x clip per entry) from
    a numpy stream seeded by ``noise_seed`` (default ``seed``): a simulation's draws, not
    a release's. Returns (U, V); ``on_round(r, U, V)`` after each round."""
    train = sp.csr_matrix(train)
    user_ids = np.arange(train.shape[0])
    U, V = init_factors(train, user_ids, p, seed)
    rng = np.random.default_rng([seed if noise_seed is None else noise_seed, 4517])
    for r in range(1, rounds + 1):
        takes = rng.random(train.shape[0]) < p.rate
        step = round_updates(U, V, train, user_ids, takes, p, seed=seed, round_=r)
        noise = rng.normal(0.0, noise_multiplier * p.clip, V.shape) if noise_multiplier \
            else 0.0
        U, V = step.user_factors, server_step(V, step.item_update + noise, p, train.shape[0])
        if on_round is not None:
            on_round(r, U, V)
    return U, V
