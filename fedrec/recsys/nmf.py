"""Regularized non-negative matrix factorization: the one solver paper 003's server, silos
and every baseline share (``fedrec/recsys/prototypes.py``, ``benchmarks/dp_prototypes.py``).

Objective (paper 003, Eq. 1, with the Frobenius norm and no 1/N factor):

    min_{U >= 0, V >= 0}  ||X - U V^T||_F^2 + reg * (||U||_F^2 + ||V||_F^2)

on the **zero-filled** matrix X (an unobserved entry counts as 0). Why zero-filled and not
the masked sum of Eq. 2: the server factorizes prototypes, which are complete vectors (a
coordinate the sparse recovery did not select is released as 0, not as missing), and the
silos' ranking metrics (mean rank, MAP, NDCG) reward predicting *which* items a user rates,
which the zero-filled fit learns and the masked one does not. It is also what the paper's
public code runs (``sklearn.decomposition.NMF`` on the dense matrix). The cost: predicted
values are shrunk towards 0, so rating RMSE is far above a masked MF's (docs/protocols/
dp-prototypes.md).

Solver: HALS (hierarchical alternating least squares, Cichocki & Phan 2009): each column of
U (then of V) is the exact minimizer of the objective with the other columns fixed,
projected on >= 0, so the objective never increases. Initialization NNDSVD (Boutsidis &
Gallopoulos 2008, sklearn's ``init='nndsvd'`` as in the paper's code), which is
deterministic: the same X gives the same factors on the server, in a silo and in a
benchmark. The silo's step (Alg. 1, line 9) is :func:`fit_user_factors`: U >= 0 with V
fixed, a convex problem HALS solves to its unique minimum.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

__all__ = ["NMFResult", "nndsvd", "nmf", "fit_user_factors", "objective"]

Matrix = np.ndarray | sp.spmatrix


@dataclass
class NMFResult:
    """Factors of X ~ U V^T and the objective after each sweep."""

    U: np.ndarray
    V: np.ndarray
    objective: list[float]


def _sq_norm(X: Matrix) -> float:
    if sp.issparse(X):
        return float(X.multiply(X).sum())
    return float(np.sum(np.asarray(X) ** 2))


def objective(X: Matrix, U: np.ndarray, V: np.ndarray, reg: float) -> float:
    """||X - U V^T||_F^2 + reg (||U||^2 + ||V||^2), without forming U V^T."""
    XV = np.asarray(X @ V)
    fit = _sq_norm(X) - 2.0 * float(np.sum(XV * U)) + float(np.sum((U.T @ U) * (V.T @ V)))
    return max(fit, 0.0) + reg * (float(np.sum(U * U)) + float(np.sum(V * V)))


def _top_singular(X: Matrix, rank: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The leading ``rank`` singular triplets (u, s, v) of X, deterministic.

    Exact from the Gram matrix of the smaller side when it is small; otherwise a randomized
    range finder (Halko et al. 2011, Alg. 4.4: 4 power iterations, 10 extra columns, a
    fixed public seed) followed by an exact SVD of the projected matrix.
    """
    n, d = X.shape
    rank = min(rank, n, d)
    if min(n, d) <= 4 * rank + 40:
        if n <= d:
            gram = X @ X.T
            vals, vecs = np.linalg.eigh(np.asarray(gram.todense() if sp.issparse(gram) else gram))
            order = np.argsort(vals)[::-1][:rank]
            sing = np.sqrt(np.clip(vals[order], 0.0, None))
            left = vecs[:, order]
            right = np.asarray(X.T @ left) / np.where(sing > 0, sing, 1.0)
            return left, sing, right
        gram = X.T @ X
        vals, vecs = np.linalg.eigh(np.asarray(gram.todense() if sp.issparse(gram) else gram))
        order = np.argsort(vals)[::-1][:rank]
        sing = np.sqrt(np.clip(vals[order], 0.0, None))
        right = vecs[:, order]
        left = np.asarray(X @ right) / np.where(sing > 0, sing, 1.0)
        return left, sing, right
    Q = np.asarray(X @ np.random.default_rng(0).standard_normal((d, rank + 10)))
    for _ in range(4):
        Q, _ = np.linalg.qr(Q)
        Q, _ = np.linalg.qr(np.asarray(X.T @ Q))
        Q = np.asarray(X @ Q)
    Q, _ = np.linalg.qr(Q)
    small_u, sing, right_t = np.linalg.svd(np.asarray(X.T @ Q).T, full_matrices=False)
    return (Q @ small_u)[:, :rank], sing[:rank], right_t[:rank].T


def nndsvd(X: Matrix, rank: int) -> tuple[np.ndarray, np.ndarray]:
    """NNDSVD initialization of X (n x d) ~ U V^T with U (n x rank), V (d x rank).

    Deterministic (:func:`_top_singular`, signs fixed); ranks beyond the numerical rank of
    X get zero columns.
    """
    n, d = X.shape
    rank = int(rank)
    if rank < 1:
        raise ValueError(f"rank must be >= 1, got {rank}")
    left, sing, right = _top_singular(X, rank)
    U = np.zeros((n, rank))
    V = np.zeros((d, rank))
    tiny = max(float(sing[0]) if sing.size else 0.0, 1.0) * 1e-12
    for j, s in enumerate(sing):
        if s <= tiny:
            break
        u, v = left[:, j], right[:, j]
        if j == 0:  # the leading pair can be chosen non-negative (Perron-Frobenius)
            U[:, 0], V[:, 0] = np.sqrt(s) * np.abs(u), np.sqrt(s) * np.abs(v)
            continue
        up, un = np.maximum(u, 0), np.maximum(-u, 0)
        vp, vn = np.maximum(v, 0), np.maximum(-v, 0)
        pos = np.linalg.norm(up) * np.linalg.norm(vp)
        neg = np.linalg.norm(un) * np.linalg.norm(vn)
        a, b, m = (up, vp, pos) if pos >= neg else (un, vn, neg)
        if m <= 0:
            continue
        scale = np.sqrt(s * m)
        U[:, j] = scale * a / np.linalg.norm(a)
        V[:, j] = scale * b / np.linalg.norm(b)
    return U, V


def _hals(W: np.ndarray, XH: np.ndarray, HtH: np.ndarray, reg: float) -> np.ndarray:
    """One HALS sweep over the columns of W for min ||X - W H^T||^2 + reg ||W||^2."""
    for r in range(W.shape[1]):
        denom = HtH[r, r] + reg
        if denom <= 0:
            W[:, r] = 0.0
            continue
        W[:, r] = np.maximum(0.0, (XH[:, r] - W @ HtH[:, r] + W[:, r] * HtH[r, r]) / denom)
    return W


def nmf(X: Matrix, rank: int, reg: float = 0.1, iters: int = 200, tol: float = 1e-6,
        on_sweep: Callable[[int, NMFResult, bool], bool | None] | None = None) -> NMFResult:
    """Regularized NMF of the zero-filled X by HALS from NNDSVD.

    Stops after ``iters`` sweeps or when a sweep lowers the objective by less than ``tol``
    relative; deterministic for a given X. ``on_sweep(s, result, last)`` is called after
    sweep s with the factors so far (``last``: no sweep follows), e.g. to score a
    validation split; a true return stops the fit there.
    """
    if reg < 0:
        raise ValueError(f"reg must be >= 0, got {reg}")
    X = X.tocsr() if sp.issparse(X) else np.asarray(X, dtype=np.float64)
    U, V = nndsvd(X, rank)
    out = NMFResult(U, V, [objective(X, U, V, reg)])
    history = out.objective
    for s in range(1, int(iters) + 1):
        out.U = _hals(out.U, np.asarray(X @ out.V), out.V.T @ out.V, reg)
        out.V = _hals(out.V, np.asarray(X.T @ out.U), out.U.T @ out.U, reg)
        history.append(objective(X, out.U, out.V, reg))
        done = history[-2] - history[-1] <= tol * max(history[-2], 1e-300)
        if on_sweep is not None and on_sweep(s, out, done or s == int(iters)):
            break
        if done:
            break
    return out


def fit_user_factors(X: Matrix, V: np.ndarray, reg: float = 0.1, iters: int = 200,
                     tol: float = 1e-8) -> np.ndarray:
    """argmin_{U >= 0} ||X - U V^T||_F^2 + reg ||U||_F^2 with V fixed (paper 003, Alg. 1
    line 9): each row is an independent non-negative ridge regression, solved by HALS from
    the clipped unconstrained ridge solution."""
    X = X.tocsr() if sp.issparse(X) else np.asarray(X, dtype=np.float64)
    V = np.asarray(V, dtype=np.float64)
    VtV = V.T @ V
    XV = np.asarray(X @ V)
    U = np.maximum(0.0, np.linalg.solve(VtV + max(reg, 1e-12) * np.eye(V.shape[1]), XV.T).T)
    last = np.inf
    for _ in range(int(iters)):
        U = _hals(U, XV, VtV, reg)
        value = -2.0 * float(np.sum(XV * U)) + float(np.sum((U.T @ U) * VtV)) \
            + reg * float(np.sum(U * U))
        if last - value <= tol * max(abs(last), 1.0):
            break
        last = value
    return U
