"""Multi-view matrix factorization (paper 004, PrivMVMF): R ~ P Q^T, X ~ P U^T, Y ~ Q V^T.

One module for the math every party runs, so the federated protocols (``strategies/mvmf.py``,
``clients/mvmf.py``) and the centralized reference (:class:`MVMF`; tuned to convergence on a
validation split of train by :func:`tune_ceiling`) call the same code:

- user i (a node): its ratings r_i, dummy attributes x_i and factor p_i; p_i by the SemiALS
  closed form (eq. 8/38) or one SGD step (eqs. 9-10); the gradients f(i,j) = c_ij (r_ij -
  p_i q_j) p_i (eq. 7) and f(i,d) = (x_id - p_i u_d) p_i (eq. 5);
- the item server: V by its closed form (eq. 11) and sum_d f(j,d) = (Y - Q V^T) V;
- the FL server: Adam on Q and U (eqs. 4-7) with the summed gradients;
- cold start: eq. 15 for a new user, eq. 17 for a new item.

Weights c_ij (eq. 3 and eq. 36): ``obsonly`` (1 rated, 0 else), ``inclunc`` (1 rated, alpha
else), ``sampled`` (1 rated, alpha on rho |O_i| unrated items drawn uniformly, 0 else).

Decisions on the paper's gaps (docs/protocols/mvmf.md lists them all):

- the U gradient carries the factor lambda1 the derivative of eq. 3 has (the paper omits it;
  equal for its lambda1 = 1);
- the eq. 14 regulariser is lambda2 ||p_i||^2 (the closed form eq. 15 implies it);
- an epoch is one round: the item server and every user compute their terms from the same
  (Q, U), the server takes one Adam step on each; the paper's training budget |epo| x
  |iter| = 20 x 10 is read as 200 such rounds (one step of gamma = 0.05 per round: 10 or
  20 leave the model short of the item-mean baseline, docs/protocols/mvmf.md);
- the sampled unrated items are redrawn every epoch, uniformly, from the public run seed,
  the epoch and the user id through a counter-based hash (so a federation and the
  reference draw the same items, and a node draws its users' alone);
- SGD order: in epoch t a user sends its gradients at p^t, then steps p^{t+1} = p^t -
  gamma dJ/dp at (Q^t, U^t) (the paper's eqs. 25-32 assume exactly this);
- Q and U start N(0, 0.1^2) from the run seed; an SGD user's p starts N(0, 0.1^2) from
  (seed, user id);
- a user with no training ratings is a cold-start user: training skips it (it has no rating
  term) and it gets p from eq. 15.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import scipy.sparse as sp

from datasets.movielens import ML1M_AGE_CODES, ML1M_OCCUPATIONS
from fedrec.recsys.metrics import ranking_sums
from fedrec.recsys.mf import Adam

WEIGHTINGS = ("obsonly", "inclunc", "sampled")
P_UPDATES = ("semials", "sgd")
#: Random streams (default_rng([seed, stream, ...])): separate per purpose.
_STREAM_INIT, _STREAM_P, _STREAM_SAMPLE = 40, 41, 42
#: MovieLens-100K user attributes as dummies (u.user): 7 equal-width age groups over the
#: published age range, gender, the 21 occupations of u.occupation, 11 US ZIP regions
#: (first digit 0-9 of a numeric ZIP; anything else, e.g. Canadian codes, is "other").
ML100K_AGE_RANGE = (7, 73)
ML100K_AGE_GROUPS = 7
ML100K_OCCUPATIONS = (
    "administrator", "artist", "doctor", "educator", "engineer", "entertainment", "executive",
    "healthcare", "homemaker", "lawyer", "librarian", "marketing", "none", "other",
    "programmer", "retired", "salesman", "scientist", "student", "technician", "writer")
ML100K_REGIONS = 11


@dataclass(frozen=True)
class MVMFConfig:
    """Hyperparameters; defaults are the paper's Table 2 (K, beta1, beta2, eps, gamma,
    alpha, lambda1, lambda2, rho)."""

    dim: int = 6
    lam1: float = 1.0
    lam2: float = 10.0
    alpha: float = 0.1
    rho: float = 1.0
    weighting: str = "sampled"
    p_update: str = "semials"
    lr: float = 0.05
    beta1: float = 0.5
    beta2: float = 0.99
    eps: float = 1e-8
    seed: int = 0

    def __post_init__(self) -> None:
        if self.weighting not in WEIGHTINGS:
            raise ValueError(f"weighting must be one of {WEIGHTINGS}, got {self.weighting!r}")
        if self.p_update not in P_UPDATES:
            raise ValueError(f"p update must be one of {P_UPDATES}, got {self.p_update!r}")
        if self.dim < 1:
            raise ValueError(f"dim must be >= 1, got {self.dim}")
        if not (self.lam1 > 0 and self.lam2 > 0):
            raise ValueError("lambda1 and lambda2 must be > 0 (eqs. 11, 15 and 17 divide by "
                             "lambda1; lambda2 keeps the closed forms invertible)")
        if not 0 <= self.alpha <= 1:
            raise ValueError(f"alpha must be in [0, 1], got {self.alpha}")
        if self.rho < 0:
            raise ValueError(f"rho must be >= 0, got {self.rho}")

    def adam(self) -> Adam:
        return Adam(self.lr, self.beta1, self.beta2, self.eps)


# ---------------------------------------------------------------------------- side data
def attribute_dim(dataset: str, synthetic_clusters: int = 10) -> int:
    """l_x, the number of dummy user attributes of a dataset (public: the schema)."""
    if dataset == "ml-100k":
        return ML100K_AGE_GROUPS + 2 + len(ML100K_OCCUPATIONS) + ML100K_REGIONS
    if dataset == "ml-1m":
        return len(ML1M_AGE_CODES) + 2 + len(ML1M_OCCUPATIONS) + ML100K_REGIONS
    if dataset == "synthetic":
        return int(synthetic_clusters)
    raise ValueError(f"MVMF has no user-attribute schema for dataset {dataset!r} (it needs "
                     "dummy user attributes: ml-100k u.user, ml-1m users.dat or the synthetic "
                     "clusters)")


def _one_hot(codes: np.ndarray, n: int) -> np.ndarray:
    out = np.zeros((len(codes), n))
    out[np.arange(len(codes)), codes] = 1.0
    return out


def attribute_matrix(attrs: Mapping[str, np.ndarray], dataset: str,
                     synthetic_clusters: int = 10, who: str = "this node") -> np.ndarray:
    """The dummy attribute rows X (users x l_x) of ``attrs`` (``NodeData.user_attributes``).

    ML-100K: age group, gender, occupation, ZIP region; synthetic: the taste cluster.
    A value outside the schema is a ValueError naming the attribute and the user's local
    row (never the value).
    """
    if dataset == "synthetic":
        if "cluster" not in attrs:
            raise ValueError(f"{who}: synthetic user attributes lack 'cluster'")
        cl = np.asarray(attrs["cluster"], dtype=np.int64)
        bad = np.flatnonzero((cl < 0) | (cl >= synthetic_clusters))
        if bad.size:
            raise ValueError(f"{who}: attribute 'cluster' of local user row {int(bad[0])} is "
                             f"outside 0..{synthetic_clusters - 1}")
        return _one_hot(cl, synthetic_clusters)
    if dataset == "ml-1m":
        return _ml1m_attributes(attrs, who)
    if dataset != "ml-100k":
        attribute_dim(dataset)  # raises the schema error
    missing = [k for k in ("age", "gender", "occupation", "zip") if k not in attrs]
    if missing:
        raise ValueError(f"{who}: ML-100K user attributes lack {missing} (is u.user there?)")
    age = np.asarray(attrs["age"], dtype=np.float64)
    lo, hi = ML100K_AGE_RANGE
    bad = np.flatnonzero(~((age >= lo) & (age <= hi)))
    if bad.size:
        raise ValueError(f"{who}: attribute 'age' of local user row {int(bad[0])} is outside "
                         f"the schema's range {lo}..{hi}")
    groups = np.minimum(((age - lo) / ((hi - lo) / ML100K_AGE_GROUPS)).astype(np.int64),
                        ML100K_AGE_GROUPS - 1)
    occ_codes = _codes(attrs, "occupation", ML100K_OCCUPATIONS, "u.occupation's 21", who)
    zips = np.asarray(attrs["zip"]).astype(str)
    region = np.array([int(z[0]) if len(z) == 5 and z.isdigit() else 10 for z in zips],
                      dtype=np.int64)
    return np.hstack([_one_hot(groups, ML100K_AGE_GROUPS),
                      _gender_dummies(attrs, who),
                      _one_hot(occ_codes, len(ML100K_OCCUPATIONS)),
                      _one_hot(region, ML100K_REGIONS)])


def _codes(attrs: Mapping[str, np.ndarray], key: str, schema: tuple, what: str,
           who: str) -> np.ndarray:
    """Each user's position of attribute ``key`` in ``schema``; a value outside it is a
    ValueError naming the attribute and the local row (never the value)."""
    index = {value: i for i, value in enumerate(schema)}
    values = np.asarray(attrs[key]).tolist()
    unknown = [row for row, v in enumerate(values) if v not in index]
    if unknown:
        raise ValueError(f"{who}: attribute '{key}' of local user row {unknown[0]} is not one "
                         f"of {what}")
    return np.array([index[v] for v in values], dtype=np.int64)


def _gender_dummies(attrs: Mapping[str, np.ndarray], who: str) -> np.ndarray:
    """F / M as two dummy columns."""
    return _one_hot(_codes(attrs, "gender", ("F", "M"), "F, M", who), 2)


def _zip_regions(attrs: Mapping[str, np.ndarray]) -> np.ndarray:
    """First zip digit 0-9, or 10 for any other code (ML-100K's Canadian codes)."""
    zips = np.asarray(attrs["zip"]).astype(str)
    return np.array([int(z[0]) if z[:1].isdigit() else 10 for z in zips], dtype=np.int64)


def _ml1m_attributes(attrs: Mapping[str, np.ndarray], who: str) -> np.ndarray:
    """ML-1M users.dat as dummies: age code (7), gender, occupation (21), zip region (11)."""
    missing = [k for k in ("age", "gender", "occupation", "zip") if k not in attrs]
    if missing:
        raise ValueError(f"{who}: ML-1M user attributes lack {missing} (is users.dat there?)")
    ages = _codes(attrs, "age", ML1M_AGE_CODES, "users.dat's age codes", who)
    occ = _codes(attrs, "occupation", ML1M_OCCUPATIONS, "users.dat's 21", who)
    return np.hstack([_one_hot(ages, len(ML1M_AGE_CODES)), _gender_dummies(attrs, who),
                      _one_hot(occ, len(ML1M_OCCUPATIONS)),
                      _one_hot(_zip_regions(attrs), ML100K_REGIONS)])


def check_attributes(X: np.ndarray, who: str = "this node") -> np.ndarray:
    """X as float64, every entry a dummy in [0, 1] (eq. 43 and the attack assume it)."""
    X = np.asarray(X, dtype=np.float64)
    bad = np.argwhere(~((X >= 0) & (X <= 1)))
    if bad.size:
        raise ValueError(f"{who}: user attribute column {int(bad[0][1])} of local user row "
                         f"{int(bad[0][0])} is outside [0, 1] (MVMF takes dummy attributes)")
    return X


def check_item_features(Y: np.ndarray | None, n_items: int, who: str = "item server") -> np.ndarray:
    """Y as float64 with one finite row per item; a clear error naming the first bad row."""
    if Y is None:
        raise ValueError(f"{who} holds no item features (the dataset has none)")
    Y = np.asarray(Y, dtype=np.float64)
    if Y.ndim != 2 or Y.shape[0] != n_items:
        raise ValueError(f"{who}: item features have shape {Y.shape}, one row per item "
                         f"needs ({n_items}, l_y): an item-feature row is missing")
    bad = np.flatnonzero(~np.isfinite(Y).all(axis=1))
    if bad.size:
        raise ValueError(f"{who}: item-feature row of item {int(bad[0])} is missing "
                         "(non-finite values)")
    return Y


# ---------------------------------------------------------------------------- factors
def init_server_factors(n_items: int, n_attrs: int, dim: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Q (items x K) and U (attributes x K), N(0, 0.1^2) from the public run seed."""
    rng = np.random.default_rng([seed, _STREAM_INIT])
    return 0.1 * rng.normal(size=(n_items, dim)), 0.1 * rng.normal(size=(n_attrs, dim))


def init_user_factor(user_id: int, dim: int, seed: int) -> np.ndarray:
    """An SGD user's starting p_i, N(0, 0.1^2) from (seed, user id)."""
    return 0.1 * np.random.default_rng([seed, _STREAM_P, int(user_id)]).normal(size=dim)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer on uint64 arrays (wrapping arithmetic): a counter-based hash,
    so any subset of users draws its sample without the others'."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def _sample_keys(seed: int, epoch: int, user_ids: np.ndarray, n_items: int) -> np.ndarray:
    """One uniform 64-bit key per (user, item), a pure function of (seed, epoch, user id,
    item): the federation and the reference draw the same pseudo-items."""
    head = _mix(np.array([seed % 2**64], dtype=np.uint64) ^ np.uint64(_STREAM_SAMPLE))
    head = _mix(head ^ np.array([epoch % 2**64], dtype=np.uint64))
    users = _mix(head ^ (np.asarray(user_ids, dtype=np.int64).astype(np.uint64)
                         * np.uint64(0x9E3779B97F4A7C15)))
    items = np.arange(n_items, dtype=np.uint64) * np.uint64(0xD1B54A32D192ED03)
    return _mix(users[:, None] ^ items[None, :])


def weights_matrix(R: sp.csr_matrix, user_ids: np.ndarray, cfg: MVMFConfig,
                   epoch: int) -> np.ndarray:
    """c (dense, users x items) for the rows of ``R`` (eq. 3 / eq. 36); every row needs a
    rating. ``sampled``: the rho |O_i| unrated items with the smallest keys of
    :func:`_sample_keys` (uniform without replacement, redrawn every epoch)."""
    R = sp.csr_matrix(R)
    counts = np.diff(R.indptr)
    if (counts == 0).any():
        uid = int(np.asarray(user_ids)[np.flatnonzero(counts == 0)[0]])
        raise ValueError(f"user {uid} has no training ratings: it has no rating term "
                         "to train (a cold-start user gets p from eq. 15)")
    n, m = R.shape
    rated = np.zeros((n, m), dtype=bool)
    rated[np.repeat(np.arange(n), counts), R.indices] = True
    c = np.zeros((n, m))
    if cfg.weighting == "inclunc":
        c[:] = cfg.alpha
    elif cfg.weighting == "sampled":
        size = np.minimum(m - counts, np.rint(cfg.rho * counts).astype(np.int64))
        keys = _sample_keys(cfg.seed, epoch, user_ids, m)
        keys[rated] = np.iinfo(np.uint64).max
        top = max(int(size.max()), 1)  # the top smallest keys per row, then sorted
        head = np.sort(np.partition(keys, top - 1, axis=1)[:, :top], axis=1)
        kth = head[np.arange(n), np.maximum(size - 1, 0)]
        c[(keys <= kth[:, None]) & ~rated & (size > 0)[:, None]] = cfg.alpha
    c[rated] = 1.0
    return c


def item_weights(rated: np.ndarray, n_items: int, cfg: MVMFConfig, epoch: int,
                 user_id: int) -> np.ndarray:
    """c_i (dense, one per item) for a user who rated ``rated`` (eq. 3 / eq. 36)."""
    rated = np.asarray(rated, dtype=np.int64)
    row = sp.csr_matrix((np.ones(rated.size), rated, [0, rated.size]), shape=(1, n_items))
    return weights_matrix(row, np.array([user_id]), cfg, epoch)[0]


def semials_user(r: np.ndarray, c: np.ndarray, x: np.ndarray, Q: np.ndarray, U: np.ndarray,
                 lam1: float, lam2: float) -> np.ndarray:
    """Eq. 8: p = (r C Q + lam1 x U)(Q^T C Q + lam1 U^T U + lam2 I)^-1."""
    return semials_users(r[None], c[None], x[None], Q, U, lam1, lam2)[0]


def _rows(A: np.ndarray, B: np.ndarray) -> np.ndarray:
    """A @ B one row at a time: a user's result must not depend on which other users share
    its block (a node's users vs all users in the reference), and a matrix-matrix product
    may round a row differently with the number of rows (near-tied scores then swap)."""
    return A @ B if A.ndim == 1 else np.stack([a @ B for a in A]).reshape(len(A), B.shape[1])


def semials_users(R: np.ndarray, C: np.ndarray, X: np.ndarray, Q: np.ndarray, U: np.ndarray,
                  lam1: float, lam2: float) -> np.ndarray:
    """Eq. 8 for every row of dense R, C, X at once (one K x K system per user)."""
    n, K = R.shape[0], Q.shape[1]
    QQ = (Q[:, :, None] * Q[:, None, :]).reshape(Q.shape[0], K * K)
    A = _rows(C, QQ).reshape(n, K, K) + lam1 * (U.T @ U) + lam2 * np.eye(K)
    b = _rows(R * C, Q) + lam1 * _rows(X, U)
    return np.linalg.solve(A, b[..., None])[..., 0]


def p_gradient(p: np.ndarray, r: np.ndarray, c: np.ndarray, x: np.ndarray, Q: np.ndarray,
               U: np.ndarray, lam1: float, lam2: float) -> np.ndarray:
    """Eq. 10 (sum over j, the paper's Sigma_i is a typo): dJ/dp_i (rows: one per user)."""
    return (-2.0 * _rows(c * (r - _rows(p, Q.T)), Q) - 2.0 * lam1 * _rows(x - _rows(p, U.T), U)
            + 2.0 * lam2 * p)


def user_gradients(p: np.ndarray, r: np.ndarray, c: np.ndarray, x: np.ndarray, Q: np.ndarray,
                   U: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """f(i,j) = c_ij (r_ij - p q_j) p for every item (zero where c = 0) and f(i,d) = (x_d -
    p u_d) p for every attribute: what user i sends."""
    return (c * (r - Q @ p))[:, None] * p[None, :], (x - U @ p)[:, None] * p[None, :]


def user_loss(p: np.ndarray, r: np.ndarray, c: np.ndarray, x: np.ndarray, Q: np.ndarray,
              U: np.ndarray, lam1: float, lam2: float) -> float:
    """User i's terms of eq. 3."""
    return float(c @ (r - Q @ p) ** 2 + lam1 * np.sum((x - U @ p) ** 2) + lam2 * p @ p)


@dataclass
class UserStep:
    """What one user (or a node, summed over its users) produces in one epoch."""

    grad_Q: np.ndarray  # sum of f(i,j), items x K
    grad_U: np.ndarray  # sum of f(i,d), attributes x K
    loss: float
    n_users: int
    factors: dict[int, np.ndarray] = field(default_factory=dict)  # p_i used (for SGD: next)
    per_user: list[tuple[int, np.ndarray, np.ndarray]] = field(default_factory=list)


#: Users per block of :func:`users_step` (bounds the dense users x items arrays).
BLOCK = 256


def users_step(R: sp.csr_matrix, X: np.ndarray, user_ids: np.ndarray, Q: np.ndarray,
               U: np.ndarray, cfg: MVMFConfig, epoch: int,
               factors: Mapping[int, np.ndarray] | None = None,
               keep_per_user: bool = False) -> UserStep:
    """One epoch of every user with training ratings among ``user_ids`` (rows of ``R``, ``X``).

    SemiALS: p from eq. 8, then the gradients at p. SGD: the gradients at the stored p
    (``factors``, else the seeded start), then p steps to the next epoch's value (returned in
    ``factors``). Users without training ratings are skipped (cold start). Users are
    processed in blocks of :data:`BLOCK` rows with dense arrays (the same per-user math as
    :func:`semials_user`, :func:`user_gradients`, :func:`user_loss`).
    """
    R = sp.csr_matrix(R)
    ids = np.asarray(user_ids, dtype=np.int64)
    K = Q.shape[1]
    gQ, gU = np.zeros_like(Q), np.zeros_like(U)
    loss = 0.0
    out: dict[int, np.ndarray] = {}
    per_user = []
    warm = np.flatnonzero(np.diff(R.indptr) > 0)
    for lo in range(0, len(warm), BLOCK):
        rows = warm[lo:lo + BLOCK]
        Rb, Xb, uids = R[rows], X[rows], ids[rows]
        C, Rd = weights_matrix(Rb, uids, cfg, epoch), Rb.toarray()
        if cfg.p_update == "semials":
            P = semials_users(Rd, C, Xb, Q, U, cfg.lam1, cfg.lam2)
            out.update(zip(uids.tolist(), P))
        else:
            P = np.stack([factors[u] if factors and u in factors else
                          init_user_factor(u, K, cfg.seed) for u in uids.tolist()])
            nxt = P - cfg.lr * p_gradient(P, Rd, C, Xb, Q, U, cfg.lam1, cfg.lam2)
            out.update(zip(uids.tolist(), nxt))
        E, EX = Rd - _rows(P, Q.T), Xb - _rows(P, U.T)
        W = C * E
        gQ += W.T @ P
        gU += EX.T @ P
        loss += float(np.sum(W * E) + cfg.lam1 * np.sum(EX * EX) + cfg.lam2 * np.sum(P * P))
        if keep_per_user:
            per_user += [(u, W[i][:, None] * P[i][None, :], EX[i][:, None] * P[i][None, :])
                         for i, u in enumerate(uids.tolist())]
    return UserStep(gQ, gU, loss, len(warm), out, per_user)


def item_server_step(Y: np.ndarray, Q: np.ndarray, lam1: float,
                     lam2: float) -> tuple[np.ndarray, np.ndarray, float]:
    """Eq. 11: V = Y^T Q (Q^T Q + lam2/lam1 I)^-1; sum_d f(j,d) = (Y - Q V^T) V; its eq. 3
    terms (lam1 ||Y - Q V^T||^2 + lam2 ||V||^2)."""
    K = Q.shape[1]
    V = np.linalg.solve(Q.T @ Q + (lam2 / lam1) * np.eye(K), Q.T @ Y).T
    E = Y - Q @ V.T
    return V, E @ V, float(lam1 * np.sum(E * E) + lam2 * np.sum(V * V))


def server_gradients(Q: np.ndarray, U: np.ndarray, sum_fQ: np.ndarray, sum_fU: np.ndarray,
                     item_term: np.ndarray, lam1: float,
                     lam2: float) -> tuple[np.ndarray, np.ndarray]:
    """Eqs. 5 and 7: dJ/dQ = -2 sum f(i,j) - 2 lam1 sum f(j,d) + 2 lam2 Q; dJ/dU = -2 lam1
    sum f(i,d) + 2 lam2 U (with the lam1 the paper's eq. 5 drops)."""
    return (-2.0 * sum_fQ - 2.0 * lam1 * item_term + 2.0 * lam2 * Q,
            -2.0 * lam1 * sum_fU + 2.0 * lam2 * U)


# ---------------------------------------------------------------------------- cold start
def cold_user_factors(X: np.ndarray, U: np.ndarray, lam1: float, lam2: float) -> np.ndarray:
    """Eq. 15 for rows of X: p = x U (U^T U + lam2/lam1 I)^-1."""
    K = U.shape[1]
    return np.linalg.solve(U.T @ U + (lam2 / lam1) * np.eye(K), (X @ U).T).T


def cold_item_factors(Y: np.ndarray, V: np.ndarray, lam1: float, lam2: float) -> np.ndarray:
    """Eq. 17 for rows of Y: q = y V (V^T V + lam2/lam1 I)^-1."""
    return cold_user_factors(Y, V, lam1, lam2)


def user_factors_for_scoring(R: sp.csr_matrix, X: np.ndarray, user_ids: np.ndarray,
                             Q: np.ndarray, U: np.ndarray, cfg: MVMFConfig, epoch: int,
                             factors: Mapping[int, np.ndarray] | None = None) -> np.ndarray:
    """p of every user for scoring: the trained one (SemiALS closed form at the final Q, U;
    SGD: the stored p), eq. 15 for users without training ratings."""
    R = sp.csr_matrix(R)
    P = cold_user_factors(X, U, cfg.lam1, cfg.lam2) if len(user_ids) else \
        np.zeros((0, Q.shape[1]))
    warm = np.flatnonzero(np.diff(R.indptr) > 0)
    ids = np.asarray(user_ids, dtype=np.int64)
    for lo in range(0, len(warm), BLOCK):
        rows = warm[lo:lo + BLOCK]
        if cfg.p_update == "semials":
            C = weights_matrix(R[rows], ids[rows], cfg, epoch)
            P[rows] = semials_users(R[rows].toarray(), C, X[rows], Q, U, cfg.lam1, cfg.lam2)
        else:
            P[rows] = [(factors or {}).get(u, init_user_factor(u, Q.shape[1], cfg.seed))
                       for u in ids[rows].tolist()]
    return P


# ---------------------------------------------------------------------------- evaluation
def user_scores(P: np.ndarray, Q: np.ndarray) -> np.ndarray:
    """Predicted ratings P Q^T, row by row: a user's scores do not depend on which users a
    node holds, so near-tied items rank alike in a federation and in the reference."""
    return _rows(P, Q.T)


#: Layout of :func:`rating_ranking_sums`.
RANK_FIELDS = ("ndcg_users", "ndcg", "prf_users", "precision", "recall",
               "all_users", "all_precision", "all_recall")


def rating_ranking_sums(scores: np.ndarray, train: sp.csr_matrix, test: sp.csr_matrix,
                        k: int = 10, threshold: float = 4.0,
                        new_items: np.ndarray | None = None,
                        all_unrated: bool = True) -> np.ndarray:
    """Sums over users of the paper's App. .2 metrics (a node's share of a sum), on two
    candidate sets, since the paper does not say which items it ranks:

    - the user's test-rated items (the explicit-rating convention of
      ``fedrec.recsys.metrics.rating_topk_prf``, whose P/R these sums reproduce): NDCG@k,
      graded, sum_i (2^{r_i} - 1) / log2(i + 1) over the top k by score, divided by the ideal
      (the paper's printed limit 5 and 2^{r-1} are typos), and P/R@k;
    - every item the user has no training rating for ("all unrated", the reading of the
      paper's P/R/F1 that fits its numbers: P@10 0.29 and cold-user recall 0.04 need a large
      candidate set): P/R@k of the top k of them, relevant = a test rating >= threshold.
      With ``new_items`` (a cold-item split's new items, non-empty) the candidates are the
      user's unrated *new* items: a warm item's trained q outscores every eq. 17 estimate,
      so over all unrated items no new item reaches a top 10 and P/R would measure the
      warm items against a test set that holds none of them (the paper's cold-item P@10
      0.17 needs the new items as candidates).

    Relevant: rating >= threshold. Returns :data:`RANK_FIELDS`: ``[users with a test item,
    NDCG sum, users with a relevant item, P sum, R sum, the same three for all unrated]``;
    ``all_unrated=False`` leaves the last three 0 (early stopping reads NDCG alone, and the
    all-item ranking costs as much as the rest).
    """
    test = sp.csr_matrix(test)
    train = sp.csr_matrix(train)
    out = np.zeros(len(RANK_FIELDS))
    for row in range(test.shape[0]):
        lo, hi = test.indptr[row], test.indptr[row + 1]
        items, ratings = test.indices[lo:hi], test.data[lo:hi]
        keep = ~np.isin(items, train.indices[train.indptr[row]:train.indptr[row + 1]])
        items, ratings = items[keep], ratings[keep]
        if items.size == 0:
            continue
        order = np.argsort(-scores[row, items], kind="stable")[:k]
        top = ratings[order]
        disc = 1.0 / np.log2(np.arange(2, top.size + 2))
        ideal = np.sort(ratings)[::-1][:k]
        idcg = float(((2.0 ** ideal - 1.0) * disc[:ideal.size]).sum())
        out[0] += 1
        out[1] += float(((2.0 ** top - 1.0) * disc).sum()) / idcg if idcg > 0 else 0.0
        n_rel = int((ratings >= threshold).sum())
        if n_rel:
            hits = int((top >= threshold).sum())
            out[2] += 1
            out[3] += hits / min(k, items.size)
            out[4] += hits / n_rel
    if not all_unrated:
        return out
    # all unrated candidates: the platform's all-ranking sums (training items at -inf) on
    # the relevant test items that are not training items
    relevant = (test >= threshold).astype(np.float64) - (train != 0).multiply(test >= threshold)
    relevant = sp.csr_matrix(relevant)
    relevant.eliminate_zeros()
    scores = np.asarray(scores, dtype=np.float64)
    if new_items is not None and len(new_items):
        cols = np.asarray(new_items, dtype=np.int64)
        scores, train, relevant = scores[:, cols], train[:, cols], relevant[:, cols]
    every = ranking_sums(scores, train, relevant, k)
    out[5:] = (every.n_users, every.precision, every.recall)
    return out


def rating_ranking_means(sums: np.ndarray, k: int = 10) -> dict[str, float]:
    """NDCG@k, Precision/Recall/F1@k (test-rated candidates) and the same P/R/F1 on all
    unrated candidates (suffix ``-all``) from :func:`rating_ranking_sums` (summed over
    nodes); F1 from the averaged P and R (the paper's table recomputes that way)."""
    n_ndcg, ndcg, n_prf, p, r, n_all, p_all, r_all = (float(v) for v in sums)

    def prf(n: float, p: float, r: float, tag: str) -> dict[str, float]:
        P, R = (p / n, r / n) if n else (0.0, 0.0)
        return {f"precision@{k}{tag}": P, f"recall@{k}{tag}": R,
                f"f1@{k}{tag}": 2 * P * R / (P + R) if P + R else 0.0}

    return {f"ndcg@{k}": ndcg / n_ndcg if n_ndcg else 0.0, **prf(n_prf, p, r, ""),
            **prf(n_all, p_all, r_all, "-all"),
            "evaluated-users": float(round(n_ndcg))}  # a count (CKKS sums carry ~1e-9)


# ---------------------------------------------------------------------------- reference
@dataclass
class MVMF:
    """Centralized multi-view MF: the same per-user, item-server and server code the
    federation runs, over all users at once (the protocols' reference)."""

    cfg: MVMFConfig
    Q: np.ndarray | None = None
    U: np.ndarray | None = None
    V: np.ndarray | None = None
    factors: dict[int, np.ndarray] = field(default_factory=dict)
    losses: list[float] = field(default_factory=list)
    epoch: int = 0
    #: Called after every epoch with (epoch, per-user gradients) when set (the attack).
    on_epoch: Callable[[int, UserStep, MVMF], None] | None = None

    def fit(self, R: sp.csr_matrix, X: np.ndarray, Y: np.ndarray, epochs: int,
            groups: Iterable[np.ndarray] | None = None,
            on_round: Callable[[int, int, float], bool | None] | None = None) -> MVMF:
        """``epochs`` epochs on ratings R (users x items), attributes X, item features Y.

        ``groups``: user index sets summed first and then added in order (a federation's
        nodes), so the float64 sums run in the federation's order. ``on_round(e, epochs,
        loss)`` is called after each epoch's step (Q, U and V are then the model's, so it can
        score a validation split); a true return stops training (early stopping).
        """
        cfg = self.cfg
        R = sp.csr_matrix(R)
        X = check_attributes(X, "reference")
        Y = check_item_features(Y, R.shape[1], "reference")
        if self.Q is None or self.U is None:
            self.Q, self.U = init_server_factors(R.shape[1], X.shape[1], cfg.dim, cfg.seed)
        parts = [np.arange(R.shape[0])] if groups is None else [np.asarray(g) for g in groups]
        optQ, optU = cfg.adam(), cfg.adam()
        for _ in range(epochs):
            self.epoch += 1
            Q, U = self.Q, self.U
            _, item_term, item_loss = item_server_step(Y, Q, cfg.lam1, cfg.lam2)
            gQ, gU, loss = np.zeros_like(Q), np.zeros_like(U), item_loss
            steps = []
            for users in parts:
                step = users_step(R[users], X[users], users, Q, U, cfg, self.epoch,
                                  self.factors, keep_per_user=self.on_epoch is not None)
                gQ += step.grad_Q
                gU += step.grad_U
                loss += step.loss
                self.factors.update(step.factors)
                steps.append(step)
            if self.on_epoch is not None:
                merged = UserStep(gQ, gU, loss, sum(s.n_users for s in steps),
                                  per_user=[u for s in steps for u in s.per_user])
                self.on_epoch(self.epoch, merged, self)
            dQ, dU = server_gradients(Q, U, gQ, gU, item_term, cfg.lam1, cfg.lam2)
            self.Q, self.U = optQ.step(Q, dQ), optU.step(U, dU)
            self.losses.append(loss)
            if on_round is not None:
                self.V = item_server_step(Y, self.Q, cfg.lam1, cfg.lam2)[0]
                if on_round(len(self.losses), epochs, loss):
                    break
        self.V = item_server_step(Y, self.Q, cfg.lam1, cfg.lam2)[0]
        return self

    def user_factors(self, R: sp.csr_matrix, X: np.ndarray,
                     Q: np.ndarray | None = None) -> np.ndarray:
        """p of every user for scoring (trained, or eq. 15 for users without ratings).

        ``Q``: the item factors the users see at evaluation (the federation sends
        :meth:`item_factors`, new items from eq. 17, and SemiALS users solve eq. 8 with it);
        default the trained Q."""
        assert self.Q is not None and self.U is not None
        return user_factors_for_scoring(R, X, np.arange(R.shape[0]),
                                        self.Q if Q is None else Q, self.U, self.cfg,
                                        self.epoch, self.factors)

    def item_factors(self, Y: np.ndarray, cold_items: np.ndarray) -> np.ndarray:
        """Q with the rows of ``cold_items`` from eq. 17 (new items have no trained q)."""
        assert self.Q is not None and self.V is not None
        Q = self.Q.copy()
        if len(cold_items):
            Q[cold_items] = cold_item_factors(Y[cold_items], self.V, self.cfg.lam1,
                                              self.cfg.lam2)
        return Q


def rating_metrics(model: MVMF, R: sp.csr_matrix, X: np.ndarray, Y: np.ndarray,
                   test: sp.csr_matrix, cold_items: np.ndarray, k: int, threshold: float,
                   all_unrated: bool = True) -> dict[str, float]:
    """:func:`rating_ranking_means` of a trained model as the federation evaluates it: new
    items from eq. 17, users' p by eq. 8 at that Q (eq. 15 without ratings), ``test``
    against the ratings ``R`` the model was trained on."""
    Q = model.item_factors(Y, cold_items)
    P = model.user_factors(R, X, Q)
    sums = rating_ranking_sums(user_scores(P, Q), R, test, k, threshold, cold_items,
                               all_unrated=all_unrated)
    return rating_ranking_means(sums, k)


# ---------------------------------------------------------------------------- a ceiling
#: The centralized ceiling (:func:`tune_ceiling`): validation NDCG every EPOCHS_PER_CHECK
#: epochs (a check solves every user's p, as an epoch does), at most MAX_EPOCH_FACTOR x the
#: run's epochs (4 x 20 = 80: six candidates and the retraining took 647 s on ML-1M on 2
#: shared cores, results/mvmf/ceiling.md).
EPOCHS_PER_CHECK, MAX_EPOCH_FACTOR = 5, 4
#: Multipliers of the run's (lr, lambda1, lambda2): a first pass over the Adam step and
#: lambda2 (the run's setting is (1, 1, 1)), then lambda1 at the best of them.
CEILING_GRID = ((1.0, 1.0, 1.0), (3.0, 1.0, 1.0), (3.0, 1.0, 1 / 3), (3.0, 1.0, 3.0))
CEILING_REFINE = ((1.0, 1 / 3, 1.0), (1.0, 3.0, 1.0))
#: Refinement passes: after lambda1, a best that sits on the edge of what was tried in lr or
#: lambda2 gets one more step (x 3 or / 3) in that direction, until the best is inside or
#: this many passes are spent (a ceiling chosen at the grid's edge may not be one).
CEILING_REFINE_PASSES = 2


@dataclass
class RatingMVMF:
    """:class:`MVMF` with the side data bound, in the ``fit(train, rounds, on_round)``
    protocol of ``fedrec.recsys.mf``'s early stopping (``fit_early_stopped``,
    ``tune_early_stopped``), so the centralized ceiling reuses that selection code. A round
    is ``epochs_per_round`` epochs (a validation check after each); its validation score is
    :meth:`validation_ndcg`, MVMF's own metric."""

    cfg: MVMFConfig
    X: np.ndarray
    Y: np.ndarray
    cold_items: np.ndarray
    k: int = 10
    threshold: float = 4.0
    epochs_per_round: int = 1
    model: MVMF | None = None

    def fit(self, train: sp.csr_matrix, rounds: int,
            on_round: Callable[[int, int, float], bool | None] | None = None) -> RatingMVMF:
        """``rounds`` x ``epochs_per_round`` epochs; ``on_round(r, rounds, loss)`` after
        each round (a true return stops)."""
        per = self.epochs_per_round

        def check(epoch: int, epochs: int, loss: float) -> bool:
            return bool(epoch % per == 0 and on_round is not None
                        and on_round(epoch // per, rounds, loss))

        self.model = MVMF(self.cfg)  # before training: on_round scores it
        self.model.fit(train, self.X, self.Y, rounds * per,
                       on_round=check if on_round is not None else None)
        return self

    def metrics(self, train: sp.csr_matrix, test: sp.csr_matrix,
                all_unrated: bool = True) -> dict[str, float]:
        """:func:`rating_metrics` of the model trained on ``train``."""
        if self.model is None:
            raise RuntimeError("RatingMVMF.metrics called before fit")
        return rating_metrics(self.model, train, self.X, self.Y, test, self.cold_items,
                              self.k, self.threshold, all_unrated)

    @staticmethod
    def validation_ndcg(model: RatingMVMF, fit: sp.csr_matrix, valid: sp.csr_matrix) -> float:
        """NDCG@k of the held-out ratings ranked among themselves (the test metric's
        candidate set, graded by the rating): the early-stopping metric."""
        return model.metrics(fit, valid, all_unrated=False)[f"ndcg@{model.k}"]


@dataclass
class Ceiling:
    """The tuned ceiling: the winner retrained on all of train, its hyperparameters and
    epochs, the validation NDCG of every candidate, and whether a grid edge won."""

    model: RatingMVMF
    cfg: MVMFConfig
    epochs: int
    valid: float
    tried: dict[str, float]
    at_edge: bool


def tune_ceiling(cfg: MVMFConfig, X: np.ndarray, Y: np.ndarray, cold_items: np.ndarray,
                 train: sp.csr_matrix, epochs: int, k: int, threshold: float, *,
                 grid: Iterable[tuple[float, float, float]] = CEILING_GRID,
                 refine: Iterable[tuple[float, float, float]] = CEILING_REFINE,
                 per_check: int = EPOCHS_PER_CHECK, factor: int = MAX_EPOCH_FACTOR,
                 passes: int = CEILING_REFINE_PASSES,
                 on_candidate: Callable[[int, int, str, Any], None] | None = None,
                 **kw: Any) -> Ceiling:
    """The run's MVMF (same dim, weights, sampling) trained centrally to convergence: epochs
    by early stopping on a validation split carved from ``train`` (``validation_split``;
    the test split is never an argument), (lr, lambda1, lambda2) from ``grid`` x the run's
    ``cfg`` and then ``refine``'s lambda1 multipliers at the grid's best (lr, lambda2) and a
    step past any lr or lambda2 edge the best sits on (up to ``passes`` passes),
    at most ``factor`` x ``epochs`` epochs; the winner retrained on all of ``train``.
    ``kw``: ``fit_early_stopped``'s (patience, fraction, seed)."""
    from dataclasses import replace

    from fedrec.recsys.mf import steps_past_edges, tune_early_stopped

    configs: dict[str, MVMFConfig] = {}

    def candidates(mults: Iterable[tuple[float, float, float]]) -> dict[str, Any]:
        out = {}
        for a, b, c in mults:
            c2 = replace(cfg, lr=cfg.lr * a, lam1=cfg.lam1 * b, lam2=cfg.lam2 * c)
            label = f"{c2.lr:.6g},{c2.lam1:.6g},{c2.lam2:.6g}"
            configs[label] = c2
            out[label] = (lambda c3=c2: RatingMVMF(c3, X, Y, cold_items, k, threshold,
                                                    per_check))
        return out

    def mults(c: MVMFConfig) -> tuple[float, float, float]:
        return (c.lr / cfg.lr, c.lam1 / cfg.lam1, c.lam2 / cfg.lam2)

    def around(label: str) -> dict[str, Any]:
        """lambda1 around the best, then one step past any edge it sits on in lr or
        lambda2 (the labels already tried are skipped by the caller)."""
        best = mults(configs[label])
        steps = [(best[0] * a, best[1] * b, best[2] * c) for a, b, c in refine]
        return candidates(steps + steps_past_edges(best, map(mults, configs.values()),
                                                   dims=(0, 2)))

    first = candidates(grid)
    tuned = tune_early_stopped(first, train, max(1, factor * epochs // per_check),
                               refine=around, refine_passes=passes,
                               metric=RatingMVMF.validation_ndcg,
                               on_candidate=on_candidate, **kw)
    assert isinstance(tuned.model, RatingMVMF)
    chosen = configs[tuned.label]
    ratios = [(c.lr / cfg.lr, c.lam1 / cfg.lam1, c.lam2 / cfg.lam2) for c in configs.values()]
    at_edge = any(
        (r == min(x[i] for x in ratios) or r == max(x[i] for x in ratios))
        and min(x[i] for x in ratios) < max(x[i] for x in ratios)
        for i, r in enumerate((chosen.lr / cfg.lr, chosen.lam1 / cfg.lam1,
                               chosen.lam2 / cfg.lam2)))
    return Ceiling(tuned.model, chosen, tuned.rounds * per_check, max(tuned.curve),
                   tuned.tried, at_edge)
