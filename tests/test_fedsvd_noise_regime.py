"""Why FedSVD on Yelp2018 sits at the random-subspace distance (issue 38, anomaly 4).

A synthetic matrix with a known spectrum reproduces both patterns of results/fedsvd/yelp2018:
(1) FedPower's per-iteration curve is at the random-subspace distance exactly at the
synchronizations (p | t), where noise of standard deviation sigma (nodes) and sigma'
(server) times the public bound 1 on ||Z||_max is added to Y = M' Z (the paper's
||Z||_max itself is at least 1/sqrt(d), so the regime holds for it too), and far below it
at the local iterations between, which are noise-free power steps from that random basis;
the final distance is taken at T, a synchronization when p | T (T = 92, 200 with p = 4).
(2) fedsvd-privacy adds N(0, sigma^2) at every iteration: when sigma sqrt(d) (a noise
column's norm) exceeds lambda_1 (the most a unit column of Z can carry of the signal) no
iteration gains on the noise and the estimate stays uniformly random whatever sigma in that
range; its clip to z_hat never
binds when z_hat exceeds the largest entry of an orthonormal basis (~ sqrt(2 ln(dr)/d)), so
the result is the same to the bit for every such z_hat. With sigma sqrt(d) well below the
eigengap the same code converges: the regime, not the arithmetic, makes the numbers.
"""

from __future__ import annotations

import math

import numpy as np
import scipy.sparse as sp

from fedrec.recsys import power_svd as svd

D, K, ROWS, NODES = 200, 4, 1200, 6
SPIKES = np.array([0.95, 0.82, 0.69, 0.56])  # eigenvalues of M' ~ SPIKES^2 + 0.01


def _blocks() -> tuple[list[sp.csr_matrix], np.ndarray, np.ndarray]:
    rng = np.random.default_rng(5)
    V = np.linalg.qr(rng.standard_normal((D, K)))[0]
    M = rng.standard_normal((ROWS, K)) * SPIKES @ V.T + 0.1 * rng.standard_normal((ROWS, D))
    M = sp.csr_matrix(M)
    truth, eig = svd.true_eigenspace(M, K)
    return [M[i::NODES] for i in range(NODES)], truth, eig


def _noise(seed: int):
    rng = np.random.default_rng(seed)
    return lambda shape, std: rng.normal(0.0, std, size=shape)


def _random_distance() -> float:
    """E ||P - P*||_F for a uniformly random K-dim subspace of R^D: sqrt(2K - 2K^2/D)."""
    return math.sqrt(2 * K - 2 * K * K / D)


def _params(blocks, **kw) -> svd.SvdParams:
    m_hat = max(svd.max_gram_entry(b) for b in blocks)  # clip_gram inactive, as on Yelp2018
    base = dict(k=K, r=K, T=16, p=4, sigma=0.1, sigma_server=0.1, z_hat=1.0, seed=0)
    return svd.SvdParams(**{**base, **kw}, m_hat=m_hat)


def _curve(scheme, blocks, truth, params) -> list[float]:
    run = svd.run_in_process(scheme, blocks, params, noise=_noise(3), per_iteration=True)
    return [svd.distances(Z, truth)["subspace"] for Z in run.estimates]


def test_fedpower_is_random_exactly_at_synchronizations():
    blocks, truth, eig = _blocks()
    params = _params(blocks, sigma=10.0, sigma_server=10.0)
    # the sync noise's column norm against the largest eigenvalue it competes with
    # even at the smallest ||Z||_max of any orthonormal d x r basis, 1/sqrt(d), not only at
    # the public bound the noise is scaled by
    for z_max in (svd.FEDPOWER_Z_MAX, 1 / math.sqrt(D)):
        assert params.sigma_server * z_max * math.sqrt(D) > 5 * eig[0]
    curve = _curve("fedpower", blocks, truth, params)
    rand = _random_distance()
    syncs = [c for t, c in enumerate(curve, 1) if params.is_sync(t)]
    between = [c for t, c in enumerate(curve, 1) if not params.is_sync(t) and t > 4]
    assert all(abs(c - rand) < 0.1 * rand for c in syncs), (syncs, rand)
    assert max(between) < 0.5 * rand, between
    # the reported final distance is the last synchronization's (T = 16 = 4p)
    final = svd.run_in_process("fedpower", blocks, params, noise=_noise(3)).Z_bar
    assert abs(svd.distances(final, truth)["subspace"] - syncs[-1]) < 1e-12
    # without noise the same schedule converges at every iteration
    quiet = _curve("fedpower", blocks, truth, _params(blocks, sigma=0.0, sigma_server=0.0))
    assert max(quiet[4:]) < 0.2 * rand, quiet


def test_privacy_scheme_random_while_noise_column_exceeds_lambda1_and_zhat_never_binds():
    blocks, truth, eig = _blocks()
    rand = _random_distance()
    finals = {}
    for sigma in (0.5, 2.0, 10.0):
        assert sigma * math.sqrt(D) > 1.5 * eig[0]
        finals[sigma] = _curve("fedsvd-privacy", blocks, truth, _params(blocks, sigma=sigma))
        assert all(abs(c - rand) < 0.15 * rand for c in finals[sigma][4:]), finals[sigma]
    # z_hat above every entry of any basis the run forms: the clip is the identity, bit for bit
    base = svd.run_in_process("fedsvd-privacy", blocks, _params(blocks, z_hat=1.0),
                              noise=_noise(3)).Z_bar
    for z_hat in (0.5, 2.0):
        other = svd.run_in_process("fedsvd-privacy", blocks, _params(blocks, z_hat=z_hat),
                                   noise=_noise(3)).Z_bar
        assert np.array_equal(base, other)
    # a z_hat below the basis's entries does bind (so the equality above is the regime)
    tight = svd.run_in_process("fedsvd-privacy", blocks, _params(blocks, z_hat=0.02),
                               noise=_noise(3)).Z_bar
    assert not np.array_equal(base, tight)
    # with sigma sqrt(d) far below the eigengap the same code converges
    small = 0.002
    assert small * math.sqrt(D) < 0.1 * (eig[K - 1] - 0.01)
    conv = _curve("fedsvd-privacy", blocks, truth, _params(blocks, sigma=small))
    assert conv[-1] < 0.1 * rand, conv
