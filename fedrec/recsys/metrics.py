"""Vectorized, batched recommendation metrics.

Top-K ranking metrics follow the LightGCN evaluation convention: training items
are excluded, all remaining items are ranked, Recall@K = hits / |test_u|, and
NDCG@K uses binary relevance. Ranking metrics come back as *sums* over users
(:class:`RankingSums`), because in federated evaluation the server only ever
receives per-client sums. The server adds them up and divides once, so every
user counts equally no matter which client holds them.

The module also has explicit-rating metrics (RMSE, MAE, thresholded P/R/F1@K),
the "mean average rank" of paper 003 (Ribero et al. 2022, Eq. 4), and
rotation-invariant subspace distances for comparing federated SVD / power
iteration outputs (paper 002, Liu et al. 2023).

Everything works on a batch of users at once. Memory is O(batch x n_items) and
there is no Python loop over users.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass, fields
from typing import Callable, Mapping

import numpy as np
import scipy.sparse as sp

# scipy.stats (rankdata) is imported where it is used: it costs ~0.8 s, and every deployed
# message starts a fresh ClientApp process that imports this module.

__all__ = [
    "RankingSums",
    "ranking_sums",
    "evaluate_ranking",
    "rating_topk_prf",
    "rmse",
    "mae",
    "average_rank_sums",
    "mean_average_rank",
    "principal_angles",
    "subspace_distance",
]

_METRIC_NAMES = ("recall", "ndcg", "precision", "hit", "map")
# Lowest finite float64. Model scores are clipped to it so that a genuine -inf
# score can never tie with the -inf used to mark excluded items.
_LOWEST = np.finfo(np.float64).min
_HIGHEST = np.finfo(np.float64).max


# --------------------------------------------------------------------------- #
# Validation helpers
# --------------------------------------------------------------------------- #
def _check_k(k: object, name: str = "k") -> int:
    """Return k as a Python int. Rejects bools, non-integers and k < 1."""
    if isinstance(k, bool) or not isinstance(k, numbers.Integral):
        raise ValueError(f"{name} must be an integer >= 1, got {k!r}")
    if k < 1:
        raise ValueError(f"{name} must be >= 1, got {k}")
    return int(k)


def _check_scores(scores: object, name: str = "scores") -> np.ndarray:
    """Return a 2-D float64 score matrix (users x items), rejecting NaN."""
    arr = np.asarray(scores, dtype=np.float64)
    if arr.ndim != 2:
        raise ValueError(
            f"{name} must be a 2-D array of shape (n_users, n_items), got ndim={arr.ndim} "
            f"with shape {arr.shape}"
        )
    if arr.shape[1] < 1:
        raise ValueError(f"{name} must have at least one item column, got shape {arr.shape}")
    if np.isnan(arr).any():
        raise ValueError(f"{name} contains NaN; scores must be comparable numbers")
    return arr


def _as_csr(
    m: object, name: str, shape: tuple[int, int] | None
) -> sp.csr_matrix:
    """Return m as a canonical csr_matrix with no stored zeros.

    The caller's matrix is never modified, because we copy before
    sum_duplicates / eliminate_zeros. "Interaction" means "stored non-zero".
    """
    if sp.issparse(m):
        out = sp.csr_matrix(m)
    elif isinstance(m, np.ndarray):
        if m.ndim != 2:
            raise ValueError(f"{name} must be 2-D, got shape {m.shape}")
        out = sp.csr_matrix(m)
    else:
        raise TypeError(f"{name} must be a scipy sparse matrix (csr), got {type(m).__name__}")
    if shape is not None and out.shape != tuple(shape):
        raise ValueError(
            f"{name} must have shape {tuple(shape)} (same as scores: n_users x n_items), "
            f"got {out.shape}"
        )
    copied = False
    if not out.has_canonical_format:
        out = out.copy()
        copied = True
        out.sum_duplicates()
    if out.nnz and (out.data == 0).any():
        if not copied:
            out = out.copy()
        out.eliminate_zeros()
    return out


def _row_ids(m: sp.csr_matrix) -> np.ndarray:
    """Row index of every stored entry of a csr matrix (vectorized COO rows)."""
    return np.repeat(np.arange(m.shape[0]), np.diff(m.indptr))


def _dense_mask(m: sp.csr_matrix) -> np.ndarray:
    """Boolean dense mask of the stored entries. Size is batch x items."""
    mask = np.zeros(m.shape, dtype=bool)
    mask[_row_ids(m), m.indices] = True
    return mask


def _topk_indices(key: np.ndarray, k: int) -> np.ndarray:
    """Column indices of the k largest entries per row, best first.

    np.argpartition is O(n_items) per row, and only the k selected entries get
    sorted. Ties are broken arbitrarily (deterministically for given inputs).
    """
    n_items = key.shape[1]
    if k >= n_items:
        part = np.broadcast_to(np.arange(n_items), key.shape)
    else:
        part = np.argpartition(-key, k - 1, axis=1)[:, :k]
    part_vals = np.take_along_axis(key, part, axis=1)
    order = np.argsort(-part_vals, axis=1, kind="stable")
    return np.take_along_axis(part, order, axis=1)


# --------------------------------------------------------------------------- #
# Top-K ranking metrics (implicit feedback, LightGCN convention)
# --------------------------------------------------------------------------- #
@dataclass
class RankingSums:
    """Per-user top-K metrics summed over users, not averaged.

    Federated evaluation only ever reveals sums to the server, so the sums and
    the user count travel together and the division happens once, at the end
    (:meth:`means`). Adding two ``RankingSums`` merges disjoint user sets.
    """

    k: int
    n_users: int
    recall: float = 0.0
    ndcg: float = 0.0
    precision: float = 0.0
    hit: float = 0.0
    map: float = 0.0

    def __add__(self, other: RankingSums) -> RankingSums:
        """Merge sums from disjoint user sets. They must have the same k."""
        if not isinstance(other, RankingSums):
            return NotImplemented
        if other.k != self.k:
            raise ValueError(f"cannot add RankingSums with different k: {self.k} vs {other.k}")
        return RankingSums(
            k=self.k,
            n_users=self.n_users + other.n_users,
            recall=self.recall + other.recall,
            ndcg=self.ndcg + other.ndcg,
            precision=self.precision + other.precision,
            hit=self.hit + other.hit,
            map=self.map + other.map,
        )

    def __radd__(self, other: object) -> RankingSums:
        """Allow ``sum(list_of_sums)``, where the builtin starts from 0."""
        if isinstance(other, numbers.Number) and other == 0:
            return self
        if isinstance(other, RankingSums):
            return other.__add__(self)
        return NotImplemented

    def means(self) -> dict[str, float]:
        """Per-user averages keyed ``'recall@K'`` etc. All are 0.0 when no users were evaluated."""
        n = self.n_users
        return {
            f"{name}@{self.k}": (float(getattr(self, name)) / n if n > 0 else 0.0)
            for name in _METRIC_NAMES
        }

    def to_vector(self) -> np.ndarray:
        """``[n_users, recall, ndcg, precision, hit, map]`` as float64: the form a secure sum
        adds (the server learns only the totals over nodes)."""
        return np.array([self.n_users, *(getattr(self, n) for n in _METRIC_NAMES)], np.float64)

    @classmethod
    def from_vector(cls, k: int, vec: np.ndarray) -> RankingSums:
        """Inverse of :meth:`to_vector` (the user count is rounded: sums may carry noise)."""
        n, *values = (float(x) for x in np.asarray(vec).ravel())
        return cls(k, int(round(n)), **dict(zip(_METRIC_NAMES, values)))

    def to_dict(self, prefix: str = "") -> dict[str, int | float]:
        """Raw sums as plain int/float values, ready for a Flower ``MetricRecord``.

        ``prefix`` lets several records share one MetricRecord without key clashes.
        """
        out: dict[str, int | float] = {f"{prefix}k": int(self.k), f"{prefix}n_users": int(self.n_users)}
        for name in _METRIC_NAMES:
            out[f"{prefix}{name}"] = float(getattr(self, name))
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, int | float], prefix: str = "") -> RankingSums:
        """Inverse of :meth:`to_dict`. Transport may turn ints into floats, so they are cast back."""
        missing = [f.name for f in fields(cls) if f"{prefix}{f.name}" not in d]
        if missing:
            raise ValueError(f"from_dict: missing keys {[prefix + m for m in missing]}")
        k, n_users = d[f"{prefix}k"], d[f"{prefix}n_users"]
        for key, val in ((f"{prefix}k", k), (f"{prefix}n_users", n_users)):
            if float(val) != int(val):
                raise ValueError(f"from_dict: {key} must be integral, got {val!r}")
        return cls(
            k=int(k),
            n_users=int(n_users),
            **{name: float(d[f"{prefix}{name}"]) for name in _METRIC_NAMES},
        )


def ranking_sums(
    scores: np.ndarray,
    train: sp.csr_matrix | None,
    test: sp.csr_matrix,
    k: int = 20,
) -> RankingSums:
    """Summed Recall/NDCG/Precision/Hit/MAP@K for one batch of users (LightGCN protocol).

    Args:
        scores: (batch_users, n_items) predicted scores. Higher means better.
        train: csr with the same shape as ``scores``, or None. Its stored non-zeros are the
            training interactions. They get score -inf, so the model is not rewarded
            for re-recommending known items (the standard all-ranking protocol).
        test: csr with the same shape. Stored non-zeros are the relevant items. Values are
            ignored (binary relevance).
        k: cut-off K >= 1.

    Definitions, per user u with T_u = |test_u| > 0 (users with T_u = 0 are skipped and
    not counted in ``n_users``):

    * hits = number of test items among the top-K.
    * recall = hits / T_u (LightGCN, *not* hits / min(K, T_u)).
    * precision = hits / K.
    * hit = 1 if hits > 0.
    * ndcg = sum_{j<K} rel_j / log2(j + 2) divided by IDCG = sum_{j < min(T_u, K)} 1 / log2(j + 2).
    * map = sum_{j<K} rel_j * precision@(j+1) / min(T_u, K).

    Positions j are 0-based. A test item that is also a training item is excluded
    from the ranking, so it can never be hit, but it still counts in T_u (as in
    LightGCN's evaluation). Ties are broken arbitrarily. If K exceeds the number of
    items, every item is ranked, but precision still divides by K.
    """
    s = _check_scores(scores)
    k = _check_k(k)
    test_c = _as_csr(test, "test", s.shape)
    train_c = None if train is None else _as_csr(train, "train", s.shape)

    n_test = np.diff(test_c.indptr)
    users = np.flatnonzero(n_test > 0)
    if users.size == 0:
        return RankingSums(k=k, n_users=0)
    if users.size != s.shape[0]:
        s = s[users]
        test_c = test_c[users]
        train_c = None if train_c is None else train_c[users]
        n_test = n_test[users]
    else:
        s = s.copy()  # we write -inf into it below and must not touch the caller's array

    # Clip genuine +-inf model scores to finite values, then mark excluded items -inf.
    np.clip(s, _LOWEST, _HIGHEST, out=s)
    relevant = _dense_mask(test_c)
    if train_c is not None and train_c.nnz:
        s[_row_ids(train_c), train_c.indices] = -np.inf
        relevant[_row_ids(train_c), train_c.indices] = False

    n_items = s.shape[1]
    k_eff = min(k, n_items)
    top = _topk_indices(s, k_eff)  # (B, k_eff), best first
    hits = np.take_along_axis(relevant, top, axis=1).astype(np.float64)

    n_hits = hits.sum(axis=1)
    discounts = 1.0 / np.log2(np.arange(k_eff) + 2.0)
    dcg = hits @ discounts
    ideal_len = np.minimum(n_test, k_eff)  # n_test <= n_items, so min(T_u, K) == min(T_u, k_eff)
    idcg = np.cumsum(discounts)[ideal_len - 1]
    prec_at_pos = np.cumsum(hits, axis=1) / np.arange(1, k_eff + 1)
    ap = (prec_at_pos * hits).sum(axis=1) / ideal_len

    return RankingSums(
        k=k,
        n_users=int(users.size),
        recall=float((n_hits / n_test).sum()),
        ndcg=float((dcg / idcg).sum()),
        precision=float(n_hits.sum() / k),
        hit=float((n_hits > 0).sum()),
        map=float(ap.sum()),
    )


def evaluate_ranking(
    score_fn: Callable[[np.ndarray], np.ndarray],
    train: sp.csr_matrix | None,
    test: sp.csr_matrix,
    k: int = 20,
    batch_size: int = 1024,
) -> RankingSums:
    """Run :func:`ranking_sums` over all users that have test items, in batches.

    ``score_fn(user_rows)`` gets an int64 array of row indices into ``train`` and ``test``.
    It must return a dense (len(user_rows), n_items) score array (numpy, or anything
    ``np.asarray`` accepts). Peak memory is O(batch_size x n_items) instead of
    O(n_users x n_items). The result is the same as scoring every user in one batch,
    up to tie-breaking.
    """
    k = _check_k(k)
    batch_size = _check_k(batch_size, "batch_size")
    test_c = _as_csr(test, "test", None)
    train_c = None if train is None else _as_csr(train, "train", test_c.shape)
    n_items = test_c.shape[1]

    users = np.flatnonzero(np.diff(test_c.indptr) > 0).astype(np.int64)
    total = RankingSums(k=k, n_users=0)
    for start in range(0, users.size, batch_size):
        idx = users[start : start + batch_size]
        batch_scores = np.asarray(score_fn(idx))
        if batch_scores.shape != (idx.size, n_items):
            raise ValueError(
                f"score_fn must return shape (len(user_rows), n_items) = {(idx.size, n_items)}, "
                f"got {batch_scores.shape}"
            )
        total = total + ranking_sums(
            batch_scores, None if train_c is None else train_c[idx], test_c[idx], k
        )
    return total


# --------------------------------------------------------------------------- #
# Explicit-rating metrics
# --------------------------------------------------------------------------- #
def rating_topk_prf(
    scores: np.ndarray,
    test_ratings: sp.csr_matrix,
    k: int,
    threshold: float,
    train: sp.csr_matrix | None = None,
) -> dict[str, float]:
    """Precision/Recall/F1@K for explicit ratings (e.g. MovieLens 1-5 stars).

    This is the usual convention for rating data (e.g. the Surprise FAQ). An
    explicit-rating test set only tells us about items the user actually rated, so
    unrated items cannot be judged:

    * candidates C_u = items with a stored non-zero test rating (0 means "unrated").
      If ``train`` is given, items it contains are removed from C_u, which guards
      against overlapping splits.
    * relevant R_u = {i in C_u : r_ui >= threshold}.
    * recommended = the top-min(K, |C_u|) of C_u by predicted score.
    * precision_u = |rec ∩ R_u| / min(K, |C_u|). Dividing by the number actually
      recommended means users with fewer than K rated test items are not penalised.
    * recall_u = |rec ∩ R_u| / |R_u|.

    P and R are averaged over users with |R_u| >= 1. Users without relevant items
    are skipped. F1 is the harmonic mean of the *averaged* P and R,
    2PR / (P + R), not the mean of per-user F1 scores. It is 0.0 if P + R == 0.
    Returns ``{'precision', 'recall', 'f1'}``, all 0.0 if no user has a relevant item.
    """
    s = _check_scores(scores)
    k = _check_k(k)
    if isinstance(threshold, bool) or not isinstance(threshold, numbers.Real) or not np.isfinite(threshold):
        raise ValueError(f"threshold must be a finite number, got {threshold!r}")
    test_c = _as_csr(test_ratings, "test_ratings", s.shape)
    train_c = None if train is None else _as_csr(train, "train", s.shape)

    rows = _row_ids(test_c)
    cand = np.zeros(s.shape, dtype=bool)
    cand[rows, test_c.indices] = True
    rel = np.zeros(s.shape, dtype=bool)
    is_rel = test_c.data >= threshold
    rel[rows[is_rel], test_c.indices[is_rel]] = True
    if train_c is not None and train_c.nnz:
        cand[_row_ids(train_c), train_c.indices] = False
        rel[_row_ids(train_c), train_c.indices] = False

    n_rel = rel.sum(axis=1)
    users = np.flatnonzero(n_rel > 0)
    if users.size == 0:
        return {"precision": 0.0, "recall": 0.0, "f1": 0.0}
    s, cand, rel, n_rel = s[users], cand[users], rel[users], n_rel[users]

    # Non-candidates get -inf; candidates are clipped finite so they always rank first.
    key = np.where(cand, np.clip(s, _LOWEST, _HIGHEST), -np.inf)
    top = _topk_indices(key, min(k, s.shape[1]))
    n_hit = np.take_along_axis(rel, top, axis=1).sum(axis=1)
    n_rec = np.minimum(k, cand.sum(axis=1))  # >= n_rel >= 1

    p = float(np.mean(n_hit / n_rec))
    r = float(np.mean(n_hit / n_rel))
    f1 = 0.0 if p + r == 0 else 2.0 * p * r / (p + r)
    return {"precision": p, "recall": r, "f1": f1}


def _check_pair(pred: object, true: object) -> tuple[np.ndarray, np.ndarray]:
    """Validate two non-empty 1-D arrays of equal length."""
    p = np.asarray(pred, dtype=np.float64)
    t = np.asarray(true, dtype=np.float64)
    if p.ndim != 1 or t.ndim != 1:
        raise ValueError(f"pred and true must be 1-D arrays, got shapes {p.shape} and {t.shape}")
    if p.shape != t.shape:
        raise ValueError(f"pred and true must have the same length, got {p.size} and {t.size}")
    if p.size == 0:
        raise ValueError("pred and true must be non-empty")
    return p, t


def rmse(pred: np.ndarray, true: np.ndarray) -> float:
    """Root mean squared error over 1-D arrays of predicted and observed ratings."""
    p, t = _check_pair(pred, true)
    return float(np.sqrt(np.mean((p - t) ** 2)))


def mae(pred: np.ndarray, true: np.ndarray) -> float:
    """Mean absolute error over 1-D arrays of predicted and observed ratings."""
    p, t = _check_pair(pred, true)
    return float(np.mean(np.abs(p - t)))


# --------------------------------------------------------------------------- #
# Mean average rank (paper 003, Eq. 4; Hu, Koren & Volinsky 2008)
# --------------------------------------------------------------------------- #
def _mid_rank_above(
    neg: np.ndarray, rows: np.ndarray, cols: np.ndarray, method: str | None = None
) -> np.ndarray:
    """For entries (rows[j], cols[j]): #items strictly better + 0.5 * #other tied items.

    ``neg`` is the negated score (smaller is better). Two exact strategies:

    * "compare": compare each queried entry with its row. Cost is O(n_queries x n_items),
      which is cheapest when each user has only a few test items (the usual case).
    * "sort": full per-row mid-ranks via scipy.stats.rankdata. Cost is O(B n log n);
      it wins when test sets are dense.

    By default "compare" is used when the average number of queries per row is at most
    4 * log2(n_items). That ratio was measured as the rough break-even point.
    """
    n_rows, n_items = neg.shape
    if method is None:
        method = "compare" if rows.size <= max(n_rows, 1) * 4.0 * max(np.log2(n_items), 1.0) else "sort"
    if method == "sort":
        from scipy.stats import rankdata  # lazy: see the module imports

        return rankdata(neg, method="average", axis=1)[rows, cols] - 1.0
    if method != "compare":
        raise ValueError(f"method must be 'compare' or 'sort', got {method!r}")
    vals = neg[rows, cols]
    out = np.empty(rows.size, dtype=np.float64)
    step = max(1, (1 << 22) // n_items)  # bound the temporary to ~4M entries
    for s in range(0, rows.size, step):
        r = neg[rows[s : s + step]]
        v = vals[s : s + step, None]
        out[s : s + step] = (r < v).sum(axis=1) + 0.5 * ((r == v).sum(axis=1) - 1)
    return out


def average_rank_sums(
    scores: np.ndarray,
    test: sp.csr_matrix,
    train: sp.csr_matrix | None = None,
    batch_size: int = 1024,
) -> tuple[float, float]:
    """Return the numerator and denominator of Eq. 4: (sum r_ui * rank_ui, sum r_ui).

    These two sums are what a federated client should report, so the server can
    compute the global weighted mean. :func:`mean_average_rank` documents the
    definition. Rows are processed ``batch_size`` at a time to bound the
    temporaries used for ranking.
    """
    s = _check_scores(scores)
    batch_size = _check_k(batch_size, "batch_size")
    test_c = _as_csr(test, "test", s.shape)
    train_c = None if train is None else _as_csr(train, "train", s.shape)
    if test_c.nnz and (test_c.data < 0).any():
        raise ValueError("test values r_ui are weights and must be non-negative")

    users = np.flatnonzero(np.diff(test_c.indptr) > 0)
    num = 0.0
    den = 0.0
    for start in range(0, users.size, batch_size):
        idx = users[start : start + batch_size]
        # Negate so that rank 1 = highest score. Finite clipping keeps genuine +-inf
        # model scores apart from the +inf used to push excluded (training) items last.
        neg = -np.clip(s[idx], _LOWEST, _HIGHEST)
        t = test_c[idx]
        t_rows, t_cols, w = _row_ids(t), t.indices, t.data.astype(np.float64)
        n_cand = np.full(idx.size, s.shape[1], dtype=np.int64)
        if train_c is not None:
            tr = train_c[idx]
            if tr.nnz:
                tr_rows = _row_ids(tr)
                neg[tr_rows, tr.indices] = np.inf
                n_cand -= np.diff(tr.indptr)
                in_train = np.zeros(neg.shape, dtype=bool)
                in_train[tr_rows, tr.indices] = True
                keep = ~in_train[t_rows, t_cols]
                t_rows, t_cols, w = t_rows[keep], t_cols[keep], w[keep]
        # Excluded items sit at +inf, behind every candidate, so candidate ranks are unaffected.
        above = _mid_rank_above(neg, t_rows, t_cols)
        denom = (n_cand[t_rows] - 1).astype(np.float64)
        pct = np.where(denom > 0, above / np.where(denom > 0, denom, 1.0), 0.5)
        num += float(np.dot(w, pct))
        den += float(w.sum())
    return num, den


def mean_average_rank(
    scores: np.ndarray,
    test: sp.csr_matrix,
    train: sp.csr_matrix | None = None,
) -> float:
    """Expected percentile rank of the held-out items (paper 003, Eq. 4). Lower is better.

    Paper 003 (Ribero et al. 2022, Sec. 4.2): "let rank_ui be the percentile of the
    predicted ranking of item i for user u, where 0 means very highly ranked and above
    all other items", and

        rank = sum_{(u,i) in T} x_ui * rank_ui / sum_{(u,i) in T} x_ui        (Eq. 4)

    "for a random ranking the expected rank_ui is 0.5, so rank >= 0.5 means a ranking
    no better than random." The metric comes from Hu, Koren & Volinsky (2008).

    Definition chosen here:

    * The candidate list for user u is all items, minus u's training items if
      ``train`` is given (the paper ranks "all items"; excluding training items matches
      recommending only unobserved items). Test entries that are also training items
      are dropped from both sums.
    * rank_ui = (#candidates scored strictly higher than i + 0.5 * #other candidates
      tied with i) / (N_u - 1), where N_u is the number of candidates. The best item
      gets exactly 0, the worst exactly 1, and ties get the mid-rank, so a constant
      predictor gets exactly 0.5 (no credit for ties). If N_u == 1, rank_ui = 0.5.
      (The authors' public code uses ``scipy.stats.percentileofscore`` /100, which
      gives the top item 1/N rather than 0. For large N the difference is negligible.)
    * Weights x_ui are the stored test values: ratings or counts, or 1 for binary
      data, in which case this is a plain mean. They must be non-negative.

    Raises ValueError if the total test weight is zero.
    """
    num, den = average_rank_sums(scores, test, train)
    if den <= 0:
        raise ValueError("test has no positive entries; mean average rank is undefined")
    return num / den


# --------------------------------------------------------------------------- #
# Subspace distances (paper 002: federated SVD / power iteration)
# --------------------------------------------------------------------------- #
def _orthonormal_basis(A: np.ndarray, name: str) -> np.ndarray:
    """Thin-QR orthonormal basis of the column span. Raises on rank deficiency."""
    q, r = np.linalg.qr(A, mode="reduced")
    diag = np.abs(np.diag(r))
    scale = max(float(diag.max(initial=0.0)), np.finfo(np.float64).tiny)
    if diag.size and diag.min() <= scale * max(A.shape) * np.finfo(np.float64).eps:
        raise ValueError(f"{name} must have full column rank (its columns span < {A.shape[1]} dims)")
    return q


def _check_pair_2d(U: object, V: object) -> tuple[np.ndarray, np.ndarray]:
    u = np.asarray(U, dtype=np.float64)
    v = np.asarray(V, dtype=np.float64)
    for name, a in (("U", u), ("V", v)):
        if a.ndim != 2:
            raise ValueError(f"{name} must be a 2-D (n x k) matrix, got shape {a.shape}")
        if not np.isfinite(a).all():
            raise ValueError(f"{name} contains non-finite values")
    if u.shape != v.shape:
        raise ValueError(f"U and V must have the same shape (n x k), got {u.shape} and {v.shape}")
    n, k = u.shape
    if k < 1 or k > n:
        raise ValueError(f"U and V must be n x k with 1 <= k <= n, got shape {u.shape}")
    return u, v


def principal_angles(U: np.ndarray, V: np.ndarray) -> np.ndarray:
    """Principal angles (radians, ascending) between the column spans of U and V (n x k).

    Both inputs are orthonormalized with QR, so any basis of the span gives the same
    answer. cos(theta) are the singular values of Qu^T Qv (k x k). For small angles,
    where arccos is inaccurate (~1e-8 resolution), sin(theta) are taken from the
    singular values of the n x k residual Qv - Qu (Qu^T Qv) (Knyazev & Argentati 2002).
    No n x n matrix is ever formed.
    """
    u, v = _check_pair_2d(U, V)
    qu, qv = _orthonormal_basis(u, "U"), _orthonormal_basis(v, "V")
    m = qu.T @ qv
    cos = np.clip(np.linalg.svd(m, compute_uv=False), 0.0, 1.0)  # descending
    sin = np.clip(np.linalg.svd(qv - qu @ m, compute_uv=False)[::-1], 0.0, 1.0)  # ascending
    theta_cos = np.arccos(cos)  # ascending
    theta_sin = np.arcsin(sin)  # ascending
    return np.where(theta_cos < np.pi / 4, theta_sin, theta_cos)


def subspace_distance(U: np.ndarray, V: np.ndarray, kind: str = "spectral") -> float:
    """Distance between the column spans of two n x k matrices.

    kind:
      * ``"spectral"`` (default): ||Pu - Pv||_2 = sin(largest principal angle), in [0, 1].
        Pu = Qu Qu^T is the orthogonal projector onto span(U). The value is invariant to
        rotations and sign flips of the basis: 0 for identical spans, 1 when some
        direction of one span is orthogonal to the other.
      * ``"frobenius"``: ||Pu - Pv||_F = sqrt(2 * sum_i sin^2 theta_i), in [0, sqrt(2k)].
        This is the rotation-invariant Frobenius version that the paper-002 notes recommend
        reporting.
      * ``"euclidean"``: the literal metric of paper 002 (Liu, Pejó, Tang 2023, Sec. 6):
        "We use Euclidean distance ... dist(A, B) = sqrt(sum_ij (a_ij - b_ij)^2)", i.e.
        ||U - V||_F on the matrices *as given*, without QR. It is NOT rotation or sign
        invariant. Use it only to reproduce the paper's numbers.

    Both projector forms use the principal angles (SVD of Qu^T Qv), never an n x n matrix.
    """
    u, v = _check_pair_2d(U, V)
    if kind == "euclidean":
        return float(np.linalg.norm(u - v))
    if kind not in ("spectral", "frobenius"):
        raise ValueError(f"kind must be 'spectral', 'frobenius' or 'euclidean', got {kind!r}")
    sin = np.sin(principal_angles(u, v))
    if kind == "spectral":
        return float(sin.max())
    return float(np.sqrt(2.0 * np.sum(sin**2)))


def popularity_sums(train: sp.csr_matrix, test: sp.csr_matrix, k: int = 20) -> RankingSums:
    """The naive baseline every quality table shows: rank items by training degree."""
    degree = np.asarray(sp.csr_matrix(train).sum(axis=0), dtype=np.float64).ravel()
    return evaluate_ranking(lambda rows: np.tile(degree, (len(rows), 1)), train, test, k=k)
