"""Tests for fedrec.recsys.metrics against small hand-computed cases.

Shorthand used in the comments:
    L3 = log2(3) = 1.5849625, so 1/L3 = 0.6309298
    L5 = log2(5) = 2.3219281, so 1/L5 = 0.4306766
    IDCG with 2 relevant items = 1 + 1/L3 = 1.6309298
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.sparse as sp

from fedrec.recsys.metrics import (
    RankingSums,
    average_rank_sums,
    evaluate_ranking,
    mae,
    mean_average_rank,
    principal_angles,
    ranking_sums,
    rating_topk_prf,
    rmse,
    subspace_distance,
)

INV_L3 = 1.0 / math.log2(3)
INV_L5 = 1.0 / math.log2(5)
IDCG2 = 1.0 + INV_L3


def csr(rows: list[list[float]]) -> sp.csr_matrix:
    return sp.csr_matrix(np.array(rows, dtype=float))


# Two users, five items, no ties.
# u0 ranks the items 0 > 1 > 2 > 3 > 4.
# u1 ranks the items 3 > 4 > 1 > 2 > 0.
SCORES = np.array(
    [
        [0.9, 0.8, 0.7, 0.6, 0.5],
        [0.1, 0.5, 0.3, 0.9, 0.7],
    ]
)
# u0's test items are {1, 3}; u1's are {0, 3}.
TEST = csr([[0, 1, 0, 1, 0], [1, 0, 0, 1, 0]])


# --------------------------------------------------------------------------- #
# ranking_sums
# --------------------------------------------------------------------------- #
def test_ranking_sums_hand_computed_k2():
    # k=2.
    # u0: top2 = [0, 1], hits = [0, 1]
    #   recall = 1/2, precision = 1/2, hit = 1
    #   dcg = 1/L3, idcg = 1 + 1/L3, so ndcg = 0.6309/1.6309 = 0.386853
    #   AP = P@2 * 1 / min(2, 2) = (1/2) / 2 = 0.25
    # u1: top2 = [3, 4], hits = [1, 0]
    #   recall = 1/2, precision = 1/2, hit = 1
    #   ndcg = 1 / 1.6309 = 0.613147
    #   AP = P@1 / 2 = 1/2
    # Sums: recall 1, precision 1, hit 2, ndcg = (1/L3 + 1)/(1 + 1/L3) = 1, map 0.75
    r = ranking_sums(SCORES, None, TEST, k=2)
    assert r.k == 2 and r.n_users == 2
    assert r.recall == pytest.approx(1.0)
    assert r.precision == pytest.approx(1.0)
    assert r.hit == pytest.approx(2.0)
    assert r.ndcg == pytest.approx(1.0)
    assert r.map == pytest.approx(0.75)

    # The single-user values, checked directly.
    r0 = ranking_sums(SCORES[:1], None, TEST[:1], k=2)
    assert r0.ndcg == pytest.approx(INV_L3 / IDCG2)  # 0.386853
    assert r0.map == pytest.approx(0.25)
    r1 = ranking_sums(SCORES[1:], None, TEST[1:], k=2)
    assert r1.ndcg == pytest.approx(1.0 / IDCG2)  # 0.613147
    assert r1.map == pytest.approx(0.5)


def test_ranking_sums_k4_map_and_ndcg():
    # u0, k=4: top4 = [0, 1, 2, 3], hits = [0, 1, 0, 1]
    #   recall = 2/2 = 1, precision = 2/4 = 0.5
    #   dcg = 1/L3 + 1/L5 = 0.630930 + 0.430677 = 1.061606, idcg = 1.630930, so ndcg = 0.650921
    #   AP = (P@2 + P@4) / min(2, 4) = (1/2 + 2/4) / 2 = 0.5
    r = ranking_sums(SCORES[:1], None, TEST[:1], k=4)
    assert r.recall == pytest.approx(1.0)
    assert r.precision == pytest.approx(0.5)
    assert r.ndcg == pytest.approx((INV_L3 + INV_L5) / IDCG2)
    assert r.ndcg == pytest.approx(0.650921, abs=1e-6)
    assert r.map == pytest.approx(0.5)
    assert r.hit == 1.0


def test_recall_uses_full_test_size_lightgcn_convention():
    # One user ranking 0 > 1 > 2 > 3 > 4, test = {0, 1, 2}, k = 2.
    # top2 = [0, 1], both hits.
    #   recall = 2/|test| = 2/3 (NOT 2/min(k, |test|) = 1)
    #   precision = 2/2 = 1
    #   ndcg: IDCG over min(3, 2) = 2 positions, so ndcg = 1
    #   AP = (P@1 + P@2) / min(3, 2) = (1 + 1)/2 = 1
    r = ranking_sums(SCORES[:1], None, csr([[1, 1, 1, 0, 0]]), k=2)
    assert r.recall == pytest.approx(2 / 3)
    assert r.precision == pytest.approx(1.0)
    assert r.ndcg == pytest.approx(1.0)
    assert r.map == pytest.approx(1.0)


def test_training_items_are_excluded_and_change_the_result():
    # u0 has item 0 (its top-scored item) in train. Its ranking becomes 1 > 2 > 3 > 4.
    # k=2: top2 = [1, 2], hits = [1, 0]
    #   ndcg = 1/1.6309 = 0.613147 (0.386853 without exclusion)
    #   AP = 1/2 (0.25 without exclusion)
    #   recall and precision stay 1/2
    train = csr([[1, 0, 0, 0, 0]])
    without = ranking_sums(SCORES[:1], None, TEST[:1], k=2)
    with_train = ranking_sums(SCORES[:1], train, TEST[:1], k=2)
    assert without.ndcg == pytest.approx(INV_L3 / IDCG2)
    assert with_train.ndcg == pytest.approx(1.0 / IDCG2)
    assert with_train.map == pytest.approx(0.5)
    assert with_train.recall == pytest.approx(0.5)
    # Exclusion happens on a copy: the caller's scores are unchanged.
    assert SCORES[0, 0] == 0.9


def test_train_explicit_zero_is_not_an_interaction():
    # A stored 0 in train must not exclude item 0, so the result equals the no-train result.
    train = sp.csr_matrix((np.array([0.0]), np.array([0]), np.array([0, 1])), shape=(1, 5))
    assert train.nnz == 1
    r = ranking_sums(SCORES[:1], train, TEST[:1], k=2)
    assert r.ndcg == pytest.approx(INV_L3 / IDCG2)


def test_test_item_also_in_train_cannot_be_hit_but_counts():
    # u0: train = {1}, test = {1, 3}. Ranking without item 1: 0 > 2 > 3 > 4.
    # k=3: top3 = [0, 2, 3], hits = [0, 0, 1]
    #   recall = 1/|test| = 1/2 (item 1 still counts in the denominator, as in LightGCN)
    r = ranking_sums(SCORES[:1], csr([[0, 1, 0, 0, 0]]), TEST[:1], k=3)
    assert r.recall == pytest.approx(0.5)
    assert r.precision == pytest.approx(1 / 3)


def test_users_without_test_items_are_skipped():
    # Add a third user with no test items. n_users and the sums are unchanged from the k=2 case.
    scores = np.vstack([SCORES, [[1.0, 2.0, 3.0, 4.0, 5.0]]])
    test = sp.vstack([TEST, csr([[0, 0, 0, 0, 0]])]).tocsr()
    r = ranking_sums(scores, None, test, k=2)
    assert r.n_users == 2
    assert r.recall == pytest.approx(1.0)
    assert r.map == pytest.approx(0.75)
    empty = ranking_sums(scores[2:], None, test[2:], k=2)
    assert empty.n_users == 0
    assert empty.means() == {"recall@2": 0.0, "ndcg@2": 0.0, "precision@2": 0.0, "hit@2": 0.0, "map@2": 0.0}


def test_k_larger_than_n_items():
    # k=10 > 5 items: every item is ranked. u0 hits both test items at positions 2 and 4.
    #   precision = 2/10 (divides by the nominal K)
    #   recall = 1
    #   ndcg = (1/L3 + 1/L5)/IDCG2, as in the k=4 case
    r = ranking_sums(SCORES[:1], None, TEST[:1], k=10)
    assert r.precision == pytest.approx(0.2)
    assert r.recall == pytest.approx(1.0)
    assert r.ndcg == pytest.approx((INV_L3 + INV_L5) / IDCG2)


def test_batched_evaluation_equals_single_batch():
    rng = np.random.default_rng(0)
    n_users, n_items = 53, 40
    S = rng.normal(size=(n_users, n_items))
    train = sp.csr_matrix(rng.random((n_users, n_items)) < 0.2, dtype=float)
    test_dense = (rng.random((n_users, n_items)) < 0.1) & (train.toarray() == 0)
    test_dense[5] = False  # guarantee one user with no test items
    test = sp.csr_matrix(test_dense, dtype=float)

    seen: list[np.ndarray] = []

    def score_fn(rows: np.ndarray) -> np.ndarray:
        seen.append(rows)
        return S[rows]

    batched = evaluate_ranking(score_fn, train, test, k=5, batch_size=7)
    whole = ranking_sums(S, train, test, k=5)
    assert batched.n_users == whole.n_users == int((np.diff(test.indptr) > 0).sum())
    for name in ("recall", "ndcg", "precision", "hit", "map"):
        assert getattr(batched, name) == pytest.approx(getattr(whole, name), rel=1e-12)
    assert max(len(r) for r in seen) <= 7
    assert 5 not in np.concatenate(seen)  # users without test items are never scored


def test_evaluate_ranking_bad_score_fn_shape():
    with pytest.raises(ValueError, match="score_fn"):
        evaluate_ranking(lambda rows: np.zeros((len(rows), 3)), None, TEST, k=2)


# --------------------------------------------------------------------------- #
# RankingSums
# --------------------------------------------------------------------------- #
def test_ranking_sums_addition_and_means():
    a = RankingSums(k=20, n_users=2, recall=1.0, ndcg=0.5, precision=0.1, hit=2.0, map=0.3)
    b = RankingSums(k=20, n_users=3, recall=0.5, ndcg=1.0, precision=0.15, hit=1.0, map=0.2)
    c = a + b
    assert c == RankingSums(k=20, n_users=5, recall=1.5, ndcg=1.5, precision=0.25, hit=3.0, map=0.5)
    assert sum([a, b]) == c  # __radd__ with the builtin's 0 start
    m = c.means()
    # means = sums / 5
    assert m == pytest.approx(
        {"recall@20": 0.3, "ndcg@20": 0.3, "precision@20": 0.05, "hit@20": 0.6, "map@20": 0.1}
    )
    with pytest.raises(ValueError, match="different k"):
        a + RankingSums(k=10, n_users=1)


def test_ranking_sums_batches_add_up():
    # Per-user results added together equal the joint result (k=2 case above).
    r = ranking_sums(SCORES[:1], None, TEST[:1], k=2) + ranking_sums(SCORES[1:], None, TEST[1:], k=2)
    assert r.n_users == 2 and r.map == pytest.approx(0.75) and r.ndcg == pytest.approx(1.0)


def test_ranking_sums_dict_roundtrip():
    a = RankingSums(k=20, n_users=2, recall=1.0, ndcg=0.5, precision=0.1, hit=2.0, map=0.3)
    d = a.to_dict()
    assert all(type(v) in (int, float) for v in d.values())
    assert isinstance(d["k"], int) and isinstance(d["n_users"], int)
    assert RankingSums.from_dict(d) == a
    # Transport may turn ints into floats.
    assert RankingSums.from_dict({**d, "k": 20.0, "n_users": 2.0}) == a
    assert RankingSums.from_dict(a.to_dict(prefix="val_"), prefix="val_") == a
    with pytest.raises(ValueError, match="missing"):
        RankingSums.from_dict({"k": 20})


# --------------------------------------------------------------------------- #
# Validation
# --------------------------------------------------------------------------- #
@pytest.mark.parametrize("k", [0, -1, 1.5, True])
def test_bad_k(k):
    with pytest.raises(ValueError, match="k"):
        ranking_sums(SCORES, None, TEST, k=k)


def test_shape_mismatch_errors():
    with pytest.raises(ValueError, match="test must have shape"):
        ranking_sums(SCORES, None, csr([[1, 0, 0, 0]]), k=2)
    with pytest.raises(ValueError, match="train must have shape"):
        ranking_sums(SCORES, csr([[1, 0, 0, 0, 0]]), TEST, k=2)
    with pytest.raises(ValueError, match="scores must be a 2-D"):
        ranking_sums(SCORES[0], None, TEST[:1], k=2)
    with pytest.raises(ValueError, match="NaN"):
        ranking_sums(np.full((2, 5), np.nan), None, TEST, k=2)


# --------------------------------------------------------------------------- #
# Explicit-rating metrics
# --------------------------------------------------------------------------- #
# u0 rated items 0:5, 1:2, 2:4, 3:1 (item 4 unrated).
# u1 rated items 3:5, 4:3.
# u2 rated item 0:2 only.
RATINGS = csr([[5, 2, 4, 1, 0], [0, 0, 0, 5, 3], [2, 0, 0, 0, 0]])
R_SCORES = np.array(
    [
        [0.2, 0.9, 0.8, 0.1, 5.0],  # item 4 scores highest but is not a candidate (unrated)
        [9.0, 9.0, 9.0, 0.5, 0.7],  # items 0-2 are unrated, so they are not candidates
        [1.0, 2.0, 3.0, 4.0, 5.0],
    ]
)


def test_rating_topk_prf_threshold4_k2():
    # threshold 4: relevant u0 = {0, 2}, u1 = {3}, u2 = {} (skipped).
    # u0: candidates by score 1(.9) > 2(.8) > 0(.2) > 3(.1); top2 = {1, 2}, hits = 1
    #   P = 1/2, R = 1/2
    # u1: candidates 4(.7) > 3(.5); top2 = {4, 3}, hits = 1
    #   P = 1/min(2, 2) = 1/2, R = 1/1
    # Averages: P = 0.5, R = 0.75, F1 = 2*.5*.75/1.25 = 0.6
    out = rating_topk_prf(R_SCORES, RATINGS, k=2, threshold=4)
    assert out == pytest.approx({"precision": 0.5, "recall": 0.75, "f1": 0.6})


def test_rating_topk_prf_k3_fewer_candidates_than_k():
    # k=3.
    # u0: top3 = {1, 2, 0}, hits = 2, so P = 2/3, R = 2/2 = 1
    # u1: only 2 candidates, rec = {4, 3}, hits = 1, so P = 1/min(3, 2) = 1/2, R = 1
    # P = (2/3 + 1/2)/2 = 7/12, R = 1, F1 = 2*(7/12)/(19/12) = 14/19
    out = rating_topk_prf(R_SCORES, RATINGS, k=3, threshold=4)
    assert out == pytest.approx({"precision": 7 / 12, "recall": 1.0, "f1": 14 / 19})


def test_rating_topk_prf_lower_threshold_and_train():
    # threshold 2: relevant u0 = {0, 1, 2}, u1 = {3, 4}, u2 = {0}.
    # k=2:
    #   u0: top2 = {1, 2}, hits 2, so P = 1, R = 2/3
    #   u1: top2 = {4, 3}, hits 2, so P = 1, R = 1
    #   u2: 1 candidate, rec = {0}, hit, so P = 1/1, R = 1
    # P = 1, R = (2/3 + 1 + 1)/3 = 8/9, F1 = 2*(8/9)/(17/9) = 16/17
    out = rating_topk_prf(R_SCORES, RATINGS, k=2, threshold=2)
    assert out == pytest.approx({"precision": 1.0, "recall": 8 / 9, "f1": 16 / 17})
    # With train containing u0's item 1, u0's candidates become 2 > 0 > 3 and relevant = {0, 2}.
    #   u0: top2 = {2, 0}, hits 2, so P = 1, R = 1
    # P = 1, R = 1, F1 = 1
    train = csr([[0, 1, 0, 0, 0], [0, 0, 0, 0, 0], [0, 0, 0, 0, 0]])
    out = rating_topk_prf(R_SCORES, RATINGS, k=2, threshold=2, train=train)
    assert out == pytest.approx({"precision": 1.0, "recall": 1.0, "f1": 1.0})


def test_rating_topk_prf_no_relevant_users():
    out = rating_topk_prf(R_SCORES, RATINGS, k=2, threshold=6)
    assert out == {"precision": 0.0, "recall": 0.0, "f1": 0.0}


def test_rmse_mae():
    # errors = [0, 1, -2]
    # RMSE = sqrt((0 + 1 + 4)/3) = sqrt(5/3) = 1.290994
    # MAE = (0 + 1 + 2)/3 = 1
    pred, true = np.array([1.0, 2.0, 3.0]), np.array([1.0, 1.0, 5.0])
    assert rmse(pred, true) == pytest.approx(math.sqrt(5 / 3))
    assert mae(pred, true) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="same length"):
        rmse(pred, true[:2])
    with pytest.raises(ValueError, match="non-empty"):
        mae(np.array([]), np.array([]))
    with pytest.raises(ValueError, match="1-D"):
        rmse(pred[None, :], true[None, :])


# --------------------------------------------------------------------------- #
# Mean average rank (paper 003, Eq. 4)
# --------------------------------------------------------------------------- #
ONE_USER = np.array([[5.0, 4.0, 3.0, 2.0, 1.0]])  # ranking 0 > 1 > 2 > 3 > 4, N = 5


def test_mean_average_rank_perfect_and_reversed():
    # rank_ui = (#items scored above i)/(N - 1)
    # test = {0}: rank 0/4 = 0 (perfect). test = {4}: rank 4/4 = 1 (reversed).
    assert mean_average_rank(ONE_USER, csr([[1, 0, 0, 0, 0]])) == pytest.approx(0.0)
    assert mean_average_rank(ONE_USER, csr([[0, 0, 0, 0, 1]])) == pytest.approx(1.0)
    # Two test items ranked best possible: (0 + 1/4)/2 = 0.125 (near 0).
    # Ranked worst: (1 + 3/4)/2 = 0.875 (near 1).
    assert mean_average_rank(ONE_USER, csr([[1, 1, 0, 0, 0]])) == pytest.approx(0.125)
    assert mean_average_rank(ONE_USER, csr([[0, 0, 0, 1, 1]])) == pytest.approx(0.875)


def test_mean_average_rank_weighted_and_train_exclusion():
    # test r_u0 = 3, r_u2 = 1: ranks 0 and 2/4 = 0.5, so (3*0 + 1*0.5)/(3 + 1) = 0.125
    test = csr([[3, 0, 1, 0, 0]])
    assert mean_average_rank(ONE_USER, test) == pytest.approx(0.125)
    assert average_rank_sums(ONE_USER, test) == pytest.approx((0.5, 4.0))
    # Exclude item 1 (train). Candidates {0, 2, 3, 4}, N = 4.
    # Item 2 has 1 candidate above it, so rank 1/3: (3*0 + 1*(1/3))/4 = 1/12
    assert mean_average_rank(ONE_USER, test, train=csr([[0, 1, 0, 0, 0]])) == pytest.approx(1 / 12)


def test_mean_average_rank_ties_and_random():
    # Constant scores: every item ties with 4 others, so rank = 0.5*4/4 = 0.5 (no credit for ties).
    assert mean_average_rank(np.zeros((1, 5)), csr([[1, 0, 1, 0, 0]])) == pytest.approx(0.5)
    # Random scores give about 0.5.
    rng = np.random.default_rng(1)
    test = sp.csr_matrix(rng.random((200, 100)) < 0.05, dtype=float)
    assert mean_average_rank(rng.random((200, 100)), test) == pytest.approx(0.5, abs=0.03)


def test_mean_average_rank_batches_and_errors():
    rng = np.random.default_rng(2)
    S = rng.normal(size=(30, 20))
    test = sp.csr_matrix(rng.random((30, 20)) < 0.2, dtype=float)
    train = sp.csr_matrix(rng.random((30, 20)) < 0.2, dtype=float)
    a = average_rank_sums(S, test, train, batch_size=4)
    b = average_rank_sums(S, test, train, batch_size=1000)
    assert a == pytest.approx(b)
    with pytest.raises(ValueError, match="no positive entries"):
        mean_average_rank(ONE_USER, csr([[0, 0, 0, 0, 0]]))
    with pytest.raises(ValueError, match="non-negative"):
        mean_average_rank(ONE_USER, csr([[-1, 0, 0, 0, 0]]))


# --------------------------------------------------------------------------- #
# Subspace distances
# --------------------------------------------------------------------------- #
def e(n: int, *idx: int) -> np.ndarray:
    return np.eye(n)[:, list(idx)]


def test_subspace_distance_invariant_to_basis_change():
    rng = np.random.default_rng(3)
    U = rng.normal(size=(8, 3))
    A = rng.normal(size=(3, 3)) + 3 * np.eye(3)  # invertible: same column span
    V = U @ A
    assert subspace_distance(U, V) == pytest.approx(0.0, abs=1e-10)
    assert subspace_distance(U, V, kind="frobenius") == pytest.approx(0.0, abs=1e-10)
    assert np.allclose(principal_angles(U, V), 0.0, atol=1e-10)
    # Sign flip: subspace distance 0, but paper 002's literal Euclidean distance is ||2 e1|| = 2.
    assert subspace_distance(e(4, 0), -e(4, 0)) == pytest.approx(0.0, abs=1e-12)
    assert subspace_distance(e(4, 0), -e(4, 0), kind="euclidean") == pytest.approx(2.0)


def test_subspace_distance_orthogonal_spans():
    # span{e1, e2} vs span{e3, e4}: both principal angles are pi/2.
    #   spectral = sin(pi/2) = 1
    #   frobenius = sqrt(2*(1 + 1)) = 2
    U, V = e(5, 0, 1), e(5, 2, 3)
    assert subspace_distance(U, V) == pytest.approx(1.0)
    assert subspace_distance(U, V, kind="frobenius") == pytest.approx(2.0)
    assert principal_angles(U, V) == pytest.approx([np.pi / 2, np.pi / 2])


@pytest.mark.parametrize("t", [1e-6, 0.3, np.pi / 4, 1.2])
def test_subspace_distance_known_angle(t):
    # U = [e1, e2], V = [e1, cos t e2 + sin t e3], so the principal angles are {0, t}.
    #   spectral = sin t
    #   frobenius = sqrt(2) sin t
    U = e(4, 0, 1)
    V = np.column_stack([e(4, 0)[:, 0], math.cos(t) * e(4, 1)[:, 0] + math.sin(t) * e(4, 2)[:, 0]])
    assert subspace_distance(U, V) == pytest.approx(math.sin(t), rel=1e-9)
    assert subspace_distance(V, U) == pytest.approx(math.sin(t), rel=1e-9)
    assert subspace_distance(U, V, kind="frobenius") == pytest.approx(math.sqrt(2) * math.sin(t), rel=1e-9)
    assert principal_angles(U, V) == pytest.approx([0.0, t], rel=1e-9, abs=1e-12)


def test_subspace_distance_errors():
    with pytest.raises(ValueError, match="same shape"):
        subspace_distance(e(4, 0, 1), e(4, 0))
    with pytest.raises(ValueError, match="full column rank"):
        subspace_distance(np.ones((4, 2)), e(4, 0, 1))
    with pytest.raises(ValueError, match="kind"):
        subspace_distance(e(4, 0), e(4, 1), kind="nope")
    with pytest.raises(ValueError, match="1 <= k <= n"):
        subspace_distance(np.ones((2, 3)), np.ones((2, 3)))


def _naive_ranking(S, train, test, k):
    """Per-user loop reference implementation (slow, obviously correct)."""
    tot = dict(recall=0.0, ndcg=0.0, precision=0.0, hit=0.0, map=0.0)
    n = 0
    tr, te = train.toarray() != 0, test.toarray() != 0
    for u in range(S.shape[0]):
        t = set(np.flatnonzero(te[u]))
        if not t:
            continue
        n += 1
        cand = [i for i in np.argsort(-S[u], kind="stable") if not tr[u, i]]
        rel = [1.0 if (i in t) else 0.0 for i in cand[:k]]
        h = sum(rel)
        tot["recall"] += h / len(t)
        tot["precision"] += h / k
        tot["hit"] += float(h > 0)
        dcg = sum(r / math.log2(j + 2) for j, r in enumerate(rel))
        idcg = sum(1 / math.log2(j + 2) for j in range(min(len(t), k)))
        tot["ndcg"] += dcg / idcg
        ap, c = 0.0, 0
        for j, r in enumerate(rel):
            if r:
                c += 1
                ap += c / (j + 1)
        tot["map"] += ap / min(len(t), k)
    return n, tot


def test_ranking_sums_matches_naive_loop():
    rng = np.random.default_rng(4)
    S = rng.normal(size=(25, 30))
    train = sp.csr_matrix(rng.random((25, 30)) < 0.3, dtype=float)
    test = sp.csr_matrix((rng.random((25, 30)) < 0.15) & (train.toarray() == 0), dtype=float)
    for k in (1, 3, 10):
        r = ranking_sums(S, train, test, k=k)
        n, tot = _naive_ranking(S, train, test, k)
        assert r.n_users == n
        for name, v in tot.items():
            assert getattr(r, name) == pytest.approx(v), (k, name)


def test_mid_rank_strategies_agree():
    # Internal helper: the "compare" and "sort" paths must give identical mid-ranks, ties included.
    from fedrec.recsys.metrics import _mid_rank_above

    rng = np.random.default_rng(5)
    neg = rng.integers(0, 4, size=(6, 9)).astype(float)  # many ties
    neg[0, 2] = np.inf
    rows = np.repeat(np.arange(6), 3)
    cols = rng.integers(0, 9, size=rows.size)
    cols[0] = 3
    a = _mid_rank_above(neg, rows, cols, method="compare")
    b = _mid_rank_above(neg, rows, cols, method="sort")
    assert np.array_equal(a, b)
    # Hand check of row [5, 4, 3, 2, 1] negated: item 2 has 2 better items and no ties, so 2.
    assert _mid_rank_above(-ONE_USER, np.array([0]), np.array([2]), method="compare")[0] == 2.0
