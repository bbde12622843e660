"""Shared linear algebra for the graph-filter recommenders and the federated SVD.

This module holds the *math* that PriviRec (paper 000, "Secure Federated Graph-Filtering
for Recommender Systems") needs, split into the pieces that the federated protocol
computes through secure sums:

* item / user degrees and the normalized interaction matrix (Eq. 1),
* the normalized item-item matrix (Eq. 2, Theorem 3.1),
* the QR step and the randomized power method (Algorithm 1, Appendix A),
* the Rayleigh-Ritz projection (Halko et al. 2011, Alg. 5.1; the paper's S = QZ),
* exact reference eigenvectors (what the public GF-CF / BSPM code get from ``sparsesvd``).

Every function only sees the matrix through its arguments; in particular
:func:`randomized_power_iteration` and :func:`rayleigh_ritz` only touch the matrix through
``matvec``, so the federated strategy can pass a callable that runs one secure-sum round.

Normalization convention (paper Eq. 1)::

    R~ = U^{-alpha} R V^{alpha-1},   U = Diag(R 1), V = Diag(1^T R)

With alpha = 1/2 (GF-CF, BSPM, PriviRec) this is R~ = U^{-1/2} R V^{-1/2}.  Turbo-CF uses
alpha = 0.6 / 0.5 in the same formula (its public ``normalize_sparse_adjacency_matrix``
scales rows by d_u^{-alpha} and columns by d_i^{alpha-1}).  Users or items of degree 0 get a
scale of 0 (their rows / columns of R~ are zero anyway), never a division by zero.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import scipy.sparse as sp

# scipy.sparse.linalg (ARPACK, ~0.1 s) is imported in the two functions that call it: every
# deployed message starts a fresh ClientApp process that imports this module.

__all__ = [
    "safe_power",
    "degrees",
    "normalize_interactions",
    "normalize_rows",
    "item_item_matrix",
    "item_item_from_gram",
    "user_gram_weight",
    "upper_triangle",
    "symmetric_from_upper",
    "qr_positive",
    "randomized_power_iteration",
    "privirec_power_method",
    "rayleigh_ritz",
    "rayleigh_ritz_from_products",
    "rayleigh_ritz_from_gram",
    "top_eigvecs_exact",
    "top_right_singular_vectors",
    "projector_distance",
]

Matvec = Callable[[np.ndarray], np.ndarray]


# --------------------------------------------------------------------------------------------
# Degrees and normalization (Eq. 1, Eq. 2, Theorem 3.1)
# --------------------------------------------------------------------------------------------


def safe_power(values: np.ndarray, exponent: float) -> np.ndarray:
    """``values ** exponent`` element-wise, with 0 wherever ``values == 0``.

    Used for every degree scaling (U^{-alpha}, V^{alpha-1}, V^{+-1/2}): a zero-degree user or
    item gets scale 0 instead of inf / nan.  Negative values are rejected (degrees are counts).
    """
    v = np.asarray(values, dtype=np.float64)
    if np.any(v < 0):
        raise ValueError("safe_power: degrees must be non-negative")
    out = np.zeros_like(v)
    nz = v > 0
    out[nz] = np.power(v[nz], exponent)
    return out


def degrees(R: sp.spmatrix) -> tuple[np.ndarray, np.ndarray]:
    """(user_deg, item_deg) = (R 1, 1^T R) as float64 vectors."""
    R = sp.csr_matrix(R)
    user_deg = np.asarray(R.sum(axis=1), dtype=np.float64).ravel()
    item_deg = np.asarray(R.sum(axis=0), dtype=np.float64).ravel()
    return user_deg, item_deg


def normalize_interactions(
    R: sp.spmatrix, alpha: float = 0.5
) -> tuple[sp.csr_matrix, np.ndarray, np.ndarray]:
    """Paper Eq. 1: R~ = U^{-alpha} R V^{alpha-1}.

    alpha = 0.5 gives GF-CF's / BSPM's R~ = U^{-1/2} R V^{-1/2}.

    Returns ``(R_tilde, user_deg, item_deg)`` with ``R_tilde`` a float64 CSR matrix of the
    same sparsity as ``R`` and the raw (un-normalized) degree vectors.  Zero-degree users and
    items get scale 0.
    """
    R = sp.csr_matrix(R, dtype=np.float64)
    user_deg, item_deg = degrees(R)
    return normalize_rows(R, item_deg, alpha), user_deg, item_deg


def normalize_rows(R_rows: sp.spmatrix, item_deg: np.ndarray,
                   alpha: float = 0.5) -> sp.csr_matrix:
    """Eq. 1 for a subset of users: their rows of R~ given the *global* item degrees.

    User degrees are row sums (each user's own); item degrees must be those of the whole
    matrix, which a federated node gets from the first secure sum.
    """
    R_rows = sp.csr_matrix(R_rows, dtype=np.float64)
    du = safe_power(np.asarray(R_rows.sum(axis=1)).ravel(), -alpha)
    di = safe_power(item_deg, alpha - 1.0)
    R_tilde = sp.csr_matrix(sp.diags(du) @ R_rows @ sp.diags(di))
    R_tilde.sort_indices()
    return R_tilde


def item_item_matrix(R_tilde: sp.spmatrix) -> sp.csr_matrix:
    """Paper Eq. 2: P~ = R~^T R~ as a sparse CSR matrix (symmetric, PSD)."""
    R_tilde = sp.csr_matrix(R_tilde)
    P = sp.csr_matrix(R_tilde.T @ R_tilde)
    P.sort_indices()
    return P


def user_gram_weight(user_deg: np.ndarray | float, alpha: float = 0.5) -> np.ndarray:
    """Per-user weight d_u^{-2 alpha} of the local Gram R^(u)T R^(u) in P'.

    Theorem 3.1 writes 1/d_user(u), which is this weight for alpha = 1/2 only; for a general
    alpha (Turbo-CF uses 0.6) the weight that makes ``item_item_from_gram`` equal R~^T R~ is
    d_u^{-2 alpha}.  Zero-degree users get 0.
    """
    return safe_power(np.asarray(user_deg, dtype=np.float64), -2.0 * alpha)


def item_item_from_gram(
    P_prime: sp.spmatrix | np.ndarray, item_deg: np.ndarray, alpha: float = 0.5
) -> sp.csr_matrix | np.ndarray:
    """Theorem 3.1 / Fig. 4: P~ = V^{alpha-1} P' V^{alpha-1}.

    ``P_prime = sum_u d_u^{-2 alpha} R^(u)T R^(u)`` is what the server obtains from the second
    secure sum (see :func:`user_gram_weight`); ``item_deg`` is the first secure sum.
    Returns the same kind (sparse CSR or dense ndarray) as ``P_prime``.
    """
    di = safe_power(item_deg, alpha - 1.0)
    if sp.issparse(P_prime):
        D = sp.diags(di)
        out = sp.csr_matrix(D @ P_prime @ D)
        out.sort_indices()
        return out
    P_prime = np.asarray(P_prime, dtype=np.float64)
    return di[:, None] * P_prime * di[None, :]


def upper_triangle(G: sp.spmatrix) -> sp.csr_matrix:
    """Upper triangle with the diagonal: a symmetric matrix travels as half its entries."""
    return sp.csr_matrix(sp.triu(G, format="csr"))


def symmetric_from_upper(upper: sp.spmatrix) -> sp.csr_matrix:
    """The symmetric matrix whose upper triangle (with diagonal) is ``upper``."""
    upper = sp.csr_matrix(upper)
    out = (upper + sp.triu(upper, k=1, format="csr").T).tocsr()
    out.sort_indices()
    return out


# --------------------------------------------------------------------------------------------
# QR and the randomized power method (Algorithm 1)
# --------------------------------------------------------------------------------------------


def qr_positive(A: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Thin QR ``A = Q R`` with ``diag(R) >= 0`` (the Gram-Schmidt sign convention).

    LAPACK's Householder QR may return negative diagonal entries; the paper's Algorithm 1 uses
    Gram-Schmidt (positive diagonal), and PriviRec-k reads eigenvalue estimates off diag(T)
    (Approximation 3.3), so the sign is fixed here: columns of Q and rows of R whose diagonal
    entry is negative are negated.  For a full-column-rank A the result is unique, hence
    deterministic across platforms up to rounding.  Shapes: A (n, p) with n >= p gives
    Q (n, p), R (p, p).
    """
    A = np.asarray(A, dtype=np.float64)
    if A.ndim != 2:
        raise ValueError(f"qr_positive: expected a 2-D array, got shape {A.shape}")
    Q, R = np.linalg.qr(A, mode="reduced")
    signs = np.sign(np.diag(R))
    signs[signs == 0] = 1.0
    Q = Q * signs[None, :]
    R = R * signs[:, None]
    return Q, R


def rayleigh_ritz_from_products(Q: np.ndarray, PQ: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rayleigh-Ritz from a basis ``Q`` (n x p, orthonormal) and the product ``PQ = P @ Q``.

    Solves the p x p projected eigenproblem H = Q^T P Q (symmetrized) and returns
    ``(Q @ Z, theta)`` sorted by decreasing Ritz value theta.  Split out so that a federated
    caller can obtain ``PQ`` (or directly H = sum_u (A^(u) Q)^T (A^(u) Q), p x p) through
    a secure sum.
    """
    H = np.asarray(Q).T @ np.asarray(PQ)
    return _ritz_from_H(Q, H)


def rayleigh_ritz_from_gram(Q: np.ndarray, H: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rayleigh-Ritz from a basis ``Q`` and the projected matrix ``H = Q^T P Q`` itself.

    The federated path gets H directly as a k x k secure sum of (A^(u) Q)^T (A^(u) Q), which
    is far smaller than the |I| x k product P Q. Returns ``(Q @ Z, theta)`` sorted by
    decreasing Ritz value, as :func:`rayleigh_ritz_from_products`.
    """
    return _ritz_from_H(Q, np.asarray(H, dtype=np.float64))


def _ritz_from_H(Q: np.ndarray, H: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    H = 0.5 * (H + H.T)
    theta, Z = np.linalg.eigh(H)
    order = np.argsort(-theta, kind="stable")
    theta = theta[order]
    Z = Z[:, order]
    # Deterministic sign: the largest-magnitude entry of each Ritz vector in Z is positive.
    idx = np.argmax(np.abs(Z), axis=0)
    s = np.sign(Z[idx, np.arange(Z.shape[1])])
    s[s == 0] = 1.0
    Z = Z * s[None, :]
    return np.asarray(Q) @ Z, theta


def rayleigh_ritz(matvec: Matvec, Q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rayleigh-Ritz on span(Q): eigenpairs of the projected matrix Q^T P Q.

    ``matvec(X)`` must return ``P @ X`` for an (n x m) block X.  Returns ``(eigvecs, eigvals)``
    with eigvecs = Q Z (n x p) and eigvals (p,) sorted in decreasing order.  This is the
    paper's Appendix-A step S = QZ (Z from the SVD of B = Q^T R~^T, equivalently the
    eigenvectors of Q^T P~ Q), which is *not* run in Algorithm 1 itself.
    """
    Q = np.asarray(Q, dtype=np.float64)
    return rayleigh_ritz_from_products(Q, np.asarray(matvec(Q), dtype=np.float64))


def randomized_power_iteration(
    matvec: Matvec,
    n: int,
    k: int,
    p: int | None = None,
    L: int = 2,
    rng: np.random.Generator | int | None = None,
    start: np.ndarray | None = None,
    ritz: bool | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Algorithm 1 (distributed randomized power method), centralized form.

    ``matvec(X) -> P @ X`` (X of shape (n, p)) is the *only* access to the symmetric PSD
    matrix P (n x n); the federated strategy passes a callable that runs one secure-sum round
    (sum over users of A^(u)T A^(u) X).

    Steps:
      1. X_0 = Q of ``qr_positive(start)`` if ``start`` is given (e.g. the first aggregate
         Y_0 = R~^T Omega of the paper), else of an (n x p) standard Gaussian drawn from ``rng``.
      2. repeat ``L`` times: Y = matvec(X); X, T = qr_positive(Y).
      3. selection of the k output columns:
         * ``ritz=False`` (the paper, Approximation 3.3): S_k = X[:, :k] and the eigenvalue
           estimates are diag(T)[:k] of the last QR.
         * ``ritz=True`` (Halko et al. / paper Appendix A, S = QZ): one extra ``matvec`` on the
           final basis and a Rayleigh-Ritz step; S_k = top-k Ritz vectors, estimates = Ritz
           values.  With p > k this is what makes the oversampled columns useful: the leading k
           columns of a QR only span P^L X_0[:, :k], whatever p is.
         Default ``ritz=None`` means ``ritz = (p > k)``; for p == k both give the same projector
         S_k S_k^T.

    Counting ``L``: here L is the number of ``matvec`` calls.  The paper's L counts secure-sum
    rounds including the first R~^T Omega round, i.e. paper-L = L + 1 when ``start`` is
    R~^T Omega (see :func:`privirec_power_method`).

    Returns ``(S_k, eigvals)``: S_k (n x k) with orthonormal columns, eigvals (k,) >= 0
    estimates in the column order of S_k.
    """
    if p is None:
        p = k
    if not (1 <= k <= p <= n):
        raise ValueError(f"randomized_power_iteration: need 1 <= k <= p <= n, got k={k}, p={p}, n={n}")
    if L < 0:
        raise ValueError(f"randomized_power_iteration: L must be >= 0, got {L}")
    if ritz is None:
        ritz = p > k
    if start is None:
        gen = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
        start = gen.standard_normal((n, p))
    start = np.asarray(start, dtype=np.float64)
    if start.shape != (n, p):
        raise ValueError(f"randomized_power_iteration: start has shape {start.shape}, expected {(n, p)}")
    X, T = qr_positive(start)
    for _ in range(L):
        Y = np.asarray(matvec(X), dtype=np.float64)
        X, T = qr_positive(Y)
    if ritz:
        V, theta = rayleigh_ritz(matvec, X)
        return V[:, :k], np.maximum(theta[:k], 0.0)
    return X[:, :k], np.abs(np.diag(T))[:k].copy()


def privirec_power_method(
    R_tilde: sp.spmatrix,
    k: int,
    p: int | None = None,
    L: int = 2,
    rng: np.random.Generator | int | None = None,
    ritz: bool | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """The paper's reading of Algorithm 1 on A = R~ with L secure-sum rounds in total.

    Round 1: Y_0 = R~^T Omega with Omega an (n_users x p) Gaussian (paper: drawn by the
    server); rounds 2..L: Y = P~ X = R~^T (R~ X).  Result X = orth((R~^T R~)^{L-1} R~^T Omega),
    as in Appendix A.  Returns ``(S_k, eigvals)`` as :func:`randomized_power_iteration`.
    """
    if L < 1:
        raise ValueError(f"privirec_power_method: L counts the R~^T Omega round, need L >= 1, got {L}")
    R_tilde = sp.csr_matrix(R_tilde)
    n_users, n_items = R_tilde.shape
    p = k if p is None else p
    gen = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
    omega = gen.standard_normal((n_users, p))
    Y0 = np.asarray(R_tilde.T @ omega)
    RT = sp.csr_matrix(R_tilde.T)

    def matvec(X: np.ndarray) -> np.ndarray:
        return np.asarray(RT @ (R_tilde @ X))

    return randomized_power_iteration(matvec, n_items, k, p, L - 1, rng=None, start=Y0, ritz=ritz)


# --------------------------------------------------------------------------------------------
# Exact references
# --------------------------------------------------------------------------------------------


def _v0(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(n)


def top_eigvecs_exact(P_sparse: sp.spmatrix | np.ndarray, k: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Top-k eigenpairs of the symmetric PSD matrix P (largest algebraic), decreasing order.

    Uses ``scipy.sparse.linalg.eigsh`` (ARPACK, deterministic start vector from ``seed``), or a
    dense ``eigh`` when k is too close to n for ARPACK.  Returns ``(vecs (n x k), vals (k,))``.
    """
    n = P_sparse.shape[0]
    if k >= n - 1:
        dense = P_sparse.toarray() if sp.issparse(P_sparse) else np.asarray(P_sparse, dtype=np.float64)
        vals, vecs = np.linalg.eigh(0.5 * (dense + dense.T))
    else:
        import scipy.sparse.linalg as spla  # lazy: see the module imports

        vals, vecs = spla.eigsh(P_sparse, k=k, which="LA", v0=_v0(n, seed))
    order = np.argsort(-vals, kind="stable")[:k]
    return vecs[:, order], vals[order]


def top_right_singular_vectors(R_tilde: sp.spmatrix, k: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Top-k right singular vectors of R~ (= top-k eigenvectors of P~ = R~^T R~).

    The centralized reference the public GF-CF / BSPM code uses (``sparsesvd(R~, k)``), here
    through ``scipy.sparse.linalg.svds`` (ARPACK on the much sparser R~, not on P~).
    Returns ``(S_k (n_items x k), eigvals = sigma^2 (k,))`` in decreasing order.
    """
    R_tilde = sp.csr_matrix(R_tilde)
    if k >= min(R_tilde.shape) - 1:
        P = (R_tilde.T @ R_tilde).toarray()
        return top_eigvecs_exact(P, k)
    import scipy.sparse.linalg as spla  # lazy: see the module imports

    _, s, vt = spla.svds(R_tilde, k=k, v0=_v0(min(R_tilde.shape), seed))
    order = np.argsort(-s, kind="stable")
    return np.ascontiguousarray(vt[order].T), s[order] ** 2


def projector_distance(A: np.ndarray, B: np.ndarray) -> float:
    """Frobenius norm ||A A^T - B B^T||_F without forming n x n matrices (uses the identity
    ||AA^T - BB^T||_F^2 = ||A^TA||^2 + ||B^TB||^2 - 2||A^TB||^2)."""
    a = np.linalg.norm(A.T @ A) ** 2 + np.linalg.norm(B.T @ B) ** 2 - 2 * np.linalg.norm(A.T @ B) ** 2
    return float(np.sqrt(max(a, 0.0)))
