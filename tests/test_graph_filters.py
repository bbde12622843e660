"""Tests for fedrec.recsys.linalg and fedrec.recsys.graph_filters (PriviRec, paper 000).

Every filter is compared against a dense NumPy re-implementation of its formula written out
here, on a tiny seeded random dataset.
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from fedrec.recsys import graph_filters as gfm
from fedrec.recsys.graph_filters import (
    BSPM,
    FILTER_NAMES,
    FactoredItemItem,
    GraphFilter,
    LowRankItemItem,
    SparseItemItem,
    build_filter,
    centralized_pieces,
    default_hyperparams,
    fit_centralized,
    score_all,
)
from fedrec.recsys.linalg import (
    item_item_from_gram,
    item_item_matrix,
    normalize_interactions,
    privirec_power_method,
    projector_distance,
    qr_positive,
    randomized_power_iteration,
    rayleigh_ritz,
    top_eigvecs_exact,
    top_right_singular_vectors,
    user_gram_weight,
)

N_USERS, N_ITEMS = 60, 40


@pytest.fixture(scope="module")
def R() -> sp.csr_matrix:
    rng = np.random.default_rng(12345)
    dense = (rng.random((N_USERS, N_ITEMS)) < 0.15).astype(np.float64)
    dense[0, :] = 0.0  # a user without interactions
    dense[:, 3] = 0.0  # an item without interactions
    dense[1, 5] = 1.0
    return sp.csr_matrix(dense)


def dense_norm(R: sp.csr_matrix, alpha: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    D = R.toarray()
    du, di = D.sum(1), D.sum(0)
    su = np.array([d ** -alpha if d > 0 else 0.0 for d in du])
    si = np.array([d ** (alpha - 1) if d > 0 else 0.0 for d in di])
    return np.diag(su) @ D @ np.diag(si), du, di


def dense_idl(di: np.ndarray, S: np.ndarray) -> np.ndarray:
    vm = np.array([d ** -0.5 if d > 0 else 0.0 for d in di])
    vp = np.sqrt(di)
    return np.diag(vm) @ S @ S.T @ np.diag(vp)


def exact_S(Rt: np.ndarray, k: int) -> np.ndarray:
    _, _, vt = np.linalg.svd(Rt)
    return vt[:k].T


# --------------------------------------------------------------------------------------------
# linalg
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("alpha", [0.5, 0.6])
def test_normalization_matches_dense(R, alpha):
    Rt, du, di = normalize_interactions(R, alpha)
    ref, du_ref, di_ref = dense_norm(R, alpha)
    assert sp.isspmatrix_csr(Rt)
    np.testing.assert_allclose(Rt.toarray(), ref, rtol=0, atol=1e-14)
    np.testing.assert_array_equal(du, du_ref)
    np.testing.assert_array_equal(di, di_ref)
    assert np.all(np.isfinite(Rt.data))
    if alpha == 0.5:  # GF-CF: U^{-1/2} R V^{-1/2}
        D = R.toarray()
        with np.errstate(divide="ignore"):
            a = np.where(du > 0, du ** -0.5, 0)[:, None] * D * np.where(di > 0, di ** -0.5, 0)[None, :]
        np.testing.assert_allclose(Rt.toarray(), a, atol=1e-14)


@pytest.mark.parametrize("alpha", [0.5, 0.6])
def test_item_item_symmetric_and_equals_secure_sum_form(R, alpha):
    Rt, du, di = normalize_interactions(R, alpha)
    P = item_item_matrix(Rt)
    ref = dense_norm(R, alpha)[0]
    np.testing.assert_allclose(P.toarray(), ref.T @ ref, atol=1e-14)
    assert abs(P - P.T).max() < 1e-15
    # Theorem 3.1 generalised: P' = sum_u d_u^{-2 alpha} r_u^T r_u, P~ = V^{a-1} P' V^{a-1}
    D = R.toarray()
    w = user_gram_weight(du, alpha)
    P_prime = sum(w[u] * np.outer(D[u], D[u]) for u in range(D.shape[0]))
    np.testing.assert_allclose(item_item_from_gram(P_prime, di, alpha), P.toarray(), atol=1e-14)
    np.testing.assert_allclose(item_item_from_gram(sp.csr_matrix(P_prime), di, alpha).toarray(),
                               P.toarray(), atol=1e-14)


def test_qr_positive():
    rng = np.random.default_rng(0)
    for shape in [(30, 7), (10, 10), (50, 1)]:
        A = rng.standard_normal(shape)
        Q, Rr = qr_positive(A)
        assert Q.shape == (shape[0], shape[1]) and Rr.shape == (shape[1], shape[1])
        assert np.all(np.diag(Rr) > 0)
        np.testing.assert_allclose(Q @ Rr, A, atol=1e-12)
        np.testing.assert_allclose(Q.T @ Q, np.eye(shape[1]), atol=1e-12)
        np.testing.assert_allclose(np.tril(Rr, -1), 0, atol=0)
        Q2, R2 = qr_positive(A)
        np.testing.assert_array_equal(Q, Q2)


def _psd_with_gap(n: int, k: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    Qm, _ = np.linalg.qr(rng.standard_normal((n, n)))
    lam = np.concatenate([np.linspace(10.0, 5.0, k), np.linspace(2.0, 0.1, n - k)])
    return (Qm * lam) @ Qm.T, lam


def test_power_iteration_large_L_recovers_top_k_subspace():
    n, k = 40, 5
    P, lam = _psd_with_gap(n, k, 1)
    vecs, vals = top_eigvecs_exact(sp.csr_matrix(P), k)
    np.testing.assert_allclose(vals, lam[:k], rtol=1e-10)
    S, T = randomized_power_iteration(lambda X: P @ X, n, k, p=k, L=60, rng=np.random.default_rng(7))
    assert S.shape == (n, k) and T.shape == (k,)
    np.testing.assert_allclose(S.T @ S, np.eye(k), atol=1e-12)
    assert np.abs(S @ S.T - vecs @ vecs.T).max() < 1e-6
    # Approximation 3.3: diag(T) of the last QR estimates the eigenvalues (column order)
    np.testing.assert_allclose(T, lam[:k], rtol=1e-3)
    # a given start block gives a deterministic result
    G = np.random.default_rng(3).standard_normal((n, k))
    S1, _ = randomized_power_iteration(lambda X: P @ X, n, k, L=10, rng=None, start=G)
    S2, _ = randomized_power_iteration(lambda X: P @ X, n, k, L=10, rng=None, start=G)
    np.testing.assert_array_equal(S1, S2)


def test_power_iteration_on_interaction_data(R):
    Rt, _, _ = normalize_interactions(R)
    P = item_item_matrix(Rt)
    k = 4
    vecs, vals = top_eigvecs_exact(P, k)
    S, T = randomized_power_iteration(lambda X: P @ X, N_ITEMS, k, p=k, L=300, rng=1)
    assert projector_distance(S, vecs) < 1e-6
    # the paper's Alg. 1 reading (first round R~^T Omega) converges to the same subspace
    S2, _ = privirec_power_method(Rt, k, L=301, rng=2)
    assert projector_distance(S2, vecs) < 1e-6


def test_power_iteration_full_rank_is_exact(R):
    Rt, _, _ = normalize_interactions(R)
    P = item_item_matrix(Rt).toarray()
    n, k = N_ITEMS, 6
    vecs, vals = top_eigvecs_exact(P, k)
    for L in (1, 2):
        S, T = randomized_power_iteration(lambda X: P @ X, n, k, p=n, L=L, rng=5)
        assert np.abs(S @ S.T - vecs @ vecs.T).max() < 1e-6
        np.testing.assert_allclose(T, vals, rtol=1e-8, atol=1e-12)


def test_rayleigh_ritz_matches_eigsh():
    n, k = 40, 5
    P, lam = _psd_with_gap(n, k, 2)
    Ps = sp.csr_matrix(P)
    vecs, vals = top_eigvecs_exact(Ps, k)
    # basis containing the top-k subspace: exact Ritz pairs
    rng = np.random.default_rng(0)
    Q, _ = qr_positive(np.hstack([vecs, rng.standard_normal((n, 3))]))
    V, theta = rayleigh_ritz(lambda X: Ps @ X, Q)
    np.testing.assert_allclose(theta[:k], vals, rtol=1e-10)
    assert np.abs(V[:, :k] @ V[:, :k].T - vecs @ vecs.T).max() < 1e-8
    # converged power iteration + Ritz
    S, _ = randomized_power_iteration(lambda X: Ps @ X, n, k, p=k + 4, L=80, rng=3)
    V, theta = rayleigh_ritz(lambda X: Ps @ X, S)
    np.testing.assert_allclose(theta, vals, rtol=1e-10)


def test_svds_reference_equals_eigsh(R):
    Rt, _, _ = normalize_interactions(R)
    P = item_item_matrix(Rt)
    S1, v1 = top_right_singular_vectors(Rt, 5)
    S2, v2 = top_eigvecs_exact(P, 5)
    np.testing.assert_allclose(v1, v2, rtol=1e-9)
    assert projector_distance(S1, S2) < 1e-8
    assert abs(v1[0] - 1.0) < 1e-10  # symmetric normalization: top singular value is 1


# --------------------------------------------------------------------------------------------
# filters vs dense formulas
# --------------------------------------------------------------------------------------------

K = 6


@pytest.fixture(scope="module")
def pieces(R):
    Rt, du, di = normalize_interactions(R, 0.5)
    Rt_d = Rt.toarray()
    return dict(Rt=Rt, Rt_d=Rt_d, P=Rt_d.T @ Rt_d, di=di, S=exact_S(Rt_d, 12), D=R.toarray())


def _fit(flt, pieces, P=None):
    return flt.fit(pieces["di"], pieces["Rt"].T @ pieces["Rt"] if P is None else P, pieces["S"], None)


def test_linear_ideal_gfcf(pieces, R):
    D, P, F = pieces["D"], pieces["P"], dense_idl(pieces["di"], pieces["S"][:, :K])
    lin = _fit(build_filter("linear"), pieces)
    np.testing.assert_allclose(lin.score(R), D @ P, atol=1e-12)
    ide = _fit(build_filter("ideal", rank=K), pieces)
    np.testing.assert_allclose(ide.score(R), D @ F, atol=1e-12)
    gf = _fit(build_filter("gf-cf", rank=K, gamma=0.3), pieces)
    np.testing.assert_allclose(gf.score(R), D @ (P + 0.3 * F), atol=1e-12)
    # zero-degree item column of F is zero (no inf/nan)
    assert np.all(np.isfinite(gf.score(R)))
    # amazon-book default: no IDL, no S needed
    gfa = build_filter("gf-cf", dataset="amazon-book")
    assert not gfa.needs_S
    gfa.fit(pieces["di"], sp.csr_matrix(P))
    np.testing.assert_allclose(gfa.score(R), D @ P, atol=1e-12)


def _dense_ode(f, y0, T, K, method):
    h = T / K
    ys = [y0]
    y = y0
    for _ in range(K):
        if method == "euler":
            y = y + h * f(y)
        else:  # classical RK4 (equal to the 3/8 rule for linear autonomous systems)
            k1 = f(y)
            k2 = f(y + h / 2 * k1)
            k3 = f(y + h / 2 * k2)
            k4 = f(y + h * k3)
            y = y + h / 6 * (k1 + 2 * k2 + 2 * k3 + k4)
        ys.append(y)
    return ys


@pytest.mark.parametrize("variant", ["em", "lm"])
@pytest.mark.parametrize("cfg", [
    dict(solver_shr="rk4", K_s=1, T_s=2.5, beta=0.2),
    dict(solver_shr="euler", K_s=1, T_s=1.2, beta=0.3, t_point_combination=True),
    dict(solver_shr="rk4", K_s=2, T_s=2.2, beta=0.3, K_b=2, T_b=1.5, K_idl=3, T_idl=0.7),
    dict(solver_shr="euler", K_s=3, T_s=1.0, beta=0.3, t_point_combination=True, K_b=2),
])
def test_bspm_matches_dense(pieces, R, variant, cfg):
    D, P, F = pieces["D"], pieces["P"], dense_idl(pieces["di"], pieces["S"][:, :K])
    flt = _fit(build_filter(f"bspm-{variant}", rank=K, **cfg), pieces)
    T_b, K_b = cfg.get("T_b", 1.0), cfg.get("K_b", 1)
    T_i, K_i = cfg.get("T_idl", 1.0), cfg.get("K_idl", 1)
    beta, tpc = cfg["beta"], cfg.get("t_point_combination", False)
    blur = _dense_ode(lambda y: y @ P - y, D, T_b, K_b, "euler")
    idl = _dense_ode(lambda y: y @ F - y, D, T_i, K_i, "euler")[-1]
    y0 = beta * idl + blur[-1] if variant == "em" else blur[-1]
    sharp = _dense_ode(lambda y: -(y @ P), y0, cfg["T_s"], cfg["K_s"], cfg["solver_shr"])
    out = np.mean(blur[1:] + sharp[1:], axis=0) if tpc else sharp[-1]
    if variant == "lm":
        out = out + beta * idl
    np.testing.assert_allclose(flt.score(R), out, rtol=1e-10, atol=1e-10)


def test_bspm_simple_closed_forms(pieces, R):
    """Defaults (K=T=1 euler everywhere): EM = (beta r F + r P)(I - P); amazon-book path = no IDL."""
    D, P, F = pieces["D"], pieces["P"], dense_idl(pieces["di"], pieces["S"][:, :K])
    em = _fit(BSPM("em", rank=K, beta=0.3), pieces)
    np.testing.assert_allclose(em.score(R), (0.3 * D @ F + D @ P) @ (np.eye(N_ITEMS) - P), atol=1e-10)
    lm = _fit(BSPM("lm", rank=K, beta=0.3), pieces)
    np.testing.assert_allclose(lm.score(R), D @ P @ (np.eye(N_ITEMS) - P) + 0.3 * D @ F, atol=1e-10)
    am = build_filter("bspm-lm", dataset="amazon-book")
    assert not am.needs_S
    am.fit(pieces["di"], sp.csr_matrix(P))
    h = 1.1  # rk4, K_s=2, T_s=2.2
    step = np.eye(N_ITEMS) - h * P + (h * P) @ (h * P) / 2 - np.linalg.matrix_power(h * P, 3) / 6 \
        + np.linalg.matrix_power(h * P, 4) / 24
    np.testing.assert_allclose(am.score(R), D @ P @ step @ step, atol=1e-10)


@pytest.mark.parametrize("alpha,power,filt", [(0.5, 1.0, 1), (0.6, 0.7, 1), (0.6, 1.0, 2), (0.55, 1.4, 3)])
def test_turbo_cf_matches_dense(R, alpha, power, filt):
    Rt, _, di = normalize_interactions(R, alpha)
    Rt_d = dense_norm(R, alpha)[0]
    Pbar = np.power(Rt_d.T @ Rt_d, power)
    polys = {1: Pbar, 2: 2 * Pbar - Pbar @ Pbar,
             3: Pbar + 0.01 * (-Pbar @ Pbar @ Pbar + 10 * Pbar @ Pbar - 29 * Pbar)}
    D = R.toarray()
    for P_in in (item_item_matrix(Rt), FactoredItemItem(Rt), Rt_d.T @ Rt_d):
        flt = build_filter("turbo-cf", alpha=alpha, power=power, filter=filt)
        assert flt.alpha == alpha and not flt.needs_S
        flt.fit(di, P_in)
        np.testing.assert_allclose(flt.score(R), D @ polys[filt], rtol=1e-10, atol=1e-12)


def test_operators_agree(pieces, R):
    Rt, P = pieces["Rt"], pieces["P"]
    X_sparse = R[5:20]
    X_dense = np.random.default_rng(0).standard_normal((7, N_ITEMS))
    for op in (SparseItemItem(item_item_matrix(Rt)), SparseItemItem(P), FactoredItemItem(Rt)):
        np.testing.assert_allclose(op.apply(X_sparse), X_sparse.toarray() @ P, atol=1e-12)
        np.testing.assert_allclose(op.apply(X_dense), X_dense @ P, atol=1e-12)
        np.testing.assert_allclose(op.matvec(X_dense.T), P @ X_dense.T, atol=1e-12)
    S, d = pieces["S"][:, :5], np.arange(5, 0, -1.0)
    lr = LowRankItemItem(S, d)
    np.testing.assert_allclose(lr.apply(X_dense), X_dense @ (S * d) @ S.T, atol=1e-12)


def test_privirec_k_lowrank_path(pieces, R):
    """fit(P_tilde=None, S_k, eigvals) uses P~_k = S_k diag(eigvals) S_k^T and the leading
    ``rank`` columns of S_k for F_IDL (paper Fig. 5)."""
    S, D = pieces["S"], pieces["D"]
    d = np.linspace(1.0, 0.2, S.shape[1])
    gf = build_filter("gf-cf", rank=K).fit(pieces["di"], None, S, d)
    F = dense_idl(pieces["di"], S[:, :K])
    np.testing.assert_allclose(gf.score(R), D @ ((S * d) @ S.T + 0.3 * F), atol=1e-12)


@pytest.mark.parametrize("name", FILTER_NAMES)
def test_batched_equals_unbatched_and_interface(R, name):
    hp = dict(rank=K) if name in ("gf-cf", "ideal", "bspm-lm", "bspm-em") else {}
    flt = build_filter(name, dataset="gowalla", **hp)
    assert isinstance(flt, GraphFilter)
    fit_centralized(flt, R)
    full = flt.score(R)
    for bs in (1, 7, 64):
        np.testing.assert_allclose(score_all(flt, R, batch_size=bs), full, rtol=1e-12, atol=1e-12)
    # a node scoring its own row gets the same numbers with the explicit sparse P~
    flt2 = build_filter(name, dataset="gowalla", **hp)
    fit_centralized(flt2, R, P_form="sparse")
    np.testing.assert_allclose(flt2.score(R[10:11]), full[10:11], rtol=1e-10, atol=1e-12)
    # dense input rows work too
    np.testing.assert_allclose(flt.score(R[:5].toarray()), full[:5], rtol=1e-12, atol=1e-12)


def test_default_hyperparams_and_errors():
    g = default_hyperparams("bspm-em", "gowalla")
    assert (g["rank"], g["beta"], g["solver_shr"], g["T_s"], g["K_s"]) == (448, 0.2, "rk4", 2.5, 1)
    y = default_hyperparams("bspm-em", "yelp2018")
    assert (y["rank"], y["beta"], y["solver_shr"], y["T_s"], y["t_point_combination"]) == (384, 0.3, "euler", 1.2, True)
    assert default_hyperparams("turbo-cf", "yelp") == dict(alpha=0.6, power=1.0, filter=2)
    assert default_hyperparams("gf-cf", "gowalla") == dict(gamma=0.3, rank=256)
    with pytest.raises(ValueError, match="unknown graph filter"):
        build_filter("svd++")
    with pytest.raises(ValueError, match="needs S_k"):
        build_filter("gf-cf").fit(np.ones(4), np.eye(4))
    with pytest.raises(RuntimeError, match="fit"):
        build_filter("linear").score(sp.csr_matrix((1, 4)))
    with pytest.raises(ValueError, match="rank"):
        build_filter("gf-cf", rank=10).fit(np.ones(4), np.eye(4), np.eye(4)[:, :2])
    with pytest.raises(ValueError, match="solver"):
        BSPM("em", rank=1, solver_shr="dopri5").fit(np.ones(4), np.eye(4), np.eye(4)[:, :1]).score(np.eye(4))


def test_centralized_pieces_shapes(R):
    pcs = centralized_pieces(R, 0.5, rank=5, P_form="sparse")
    assert pcs.S_k.shape == (N_ITEMS, 5) and pcs.eigvals.shape == (5,)
    assert sp.isspmatrix_csr(pcs.P_tilde)
    assert gfm.safe_power is not None
