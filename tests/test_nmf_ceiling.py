"""The tuned centralized ceiling of DP prototypes (``fedrec/recsys/nmf_ceiling.py``,
``DPPrototypes.reference``): chosen on a validation split of train alone, never below the
run's own setting there, early stopping at the curve's argmax, and a grid that can miss."""

from __future__ import annotations

from functools import partial
from types import SimpleNamespace

import numpy as np
import pytest
import scipy.sparse as sp

from fedrec.recsys.metrics import evaluate_ranking
from fedrec.recsys.mf import fit_early_stopped, validation_split
from fedrec.recsys.nmf import nmf
from fedrec.recsys.nmf_ceiling import (
    REG_FACTORS,
    NMFModel,
    reg_at_edge,
    reg_candidates,
    tune_nmf_ceiling,
)
from fl_app.registry import resolve_config
from strategies.dp_prototypes import DPPrototypes

RANK, ITERS, SEED = 4, 30, 1


def _taste(users: int = 150, items: int = 80, groups: int = 4, per_user: int = 24,
           seed: int = 0) -> tuple[sp.csr_matrix, sp.csr_matrix]:
    """(train, test) ratings 1-5: user u mostly rates the items of its group u % groups
    (70%), the rest at random; 80/20 per user."""
    rng = np.random.default_rng(seed)
    block = items // groups
    rows: dict[str, list[tuple[int, int, float]]] = {"train": [], "test": []}
    for u in range(users):
        g = u % groups
        own = rng.choice(np.arange(g * block, (g + 1) * block), int(per_user * 0.7),
                         replace=False)
        other = rng.choice(np.setdiff1d(np.arange(items), own), per_user - len(own),
                           replace=False)
        its = rng.permutation(np.concatenate([own, other]))
        vals = rng.integers(1, 6, size=len(its)).astype(float)
        cut = int(0.8 * len(its))
        rows["train"] += [(u, int(i), v) for i, v in zip(its[:cut], vals[:cut])]
        rows["test"] += [(u, int(i), v) for i, v in zip(its[cut:], vals[cut:])]

    def matrix(t: list[tuple[int, int, float]]) -> sp.csr_matrix:
        u, i, v = (np.array(x) for x in zip(*t))
        return sp.csr_matrix((v, (u, i)), shape=(users, items))

    return matrix(rows["train"]), matrix(rows["test"])


@pytest.fixture(scope="module")
def taste() -> tuple[sp.csr_matrix, sp.csr_matrix]:
    return _taste()


def _strategy(reg: float = 0.1) -> DPPrototypes:
    return DPPrototypes(resolve_config(
        {"protocol": "dp-prototypes", "dataset": "synthetic", "seed": SEED, "dpp-rank": RANK,
         "dpp-reg": reg, "dpp-nmf-iters": ITERS}))


def _valid_ndcg(model: NMFModel, train: sp.csr_matrix) -> float:
    fit, valid = validation_split(train, seed=SEED)
    return float(evaluate_ranking(model.score, fit, valid, k=20).means()["ndcg@20"])


def test_the_ceiling_never_reads_the_test_split(taste: tuple) -> None:
    """A test split of garbage gives the same choice (and the same validation score); only
    the test metrics, computed after the choice, change."""
    train, test = taste
    garbage = sp.csr_matrix(test[np.random.default_rng(7).permutation(test.shape[0])])
    strategy = _strategy()
    real = strategy.reference(SimpleNamespace(train=train, test=test))
    fake = strategy.reference(SimpleNamespace(train=train, test=garbage))
    tuned = [k for k in real if k.startswith("tuned-")]
    assert set(tuned) == {"tuned-rounds", "tuned-reg", "tuned-valid", "tuned-candidates",
                          "tuned-at-edge"}
    assert {k: real[k] for k in tuned} == {k: fake[k] for k in tuned}
    assert real["ndcg@20"] != fake["ndcg@20"]
    assert {"ndcg@20", "rmse", "mean-rank"} <= set(real)


def test_the_runs_own_setting_is_a_candidate_and_never_beats_the_ceiling(taste: tuple
                                                                          ) -> None:
    """The untuned L2 weight is tried, early stopped the same way; the ceiling's validation
    NDCG is the best tried, so at least the run's."""
    train, _ = taste
    for reg in (0.1, 0.0):
        out = tune_nmf_ceiling(train, RANK, reg, ITERS, seed=SEED, patience=3)
        assert repr(reg) in out.tried
        assert max(out.curve) == max(out.tried.values()) >= out.tried[repr(reg)]
        alone = fit_early_stopped(partial(NMFModel, RANK, reg, ITERS), train,
                                  ITERS, patience=3, seed=SEED, retrain=False)
        assert max(alone.curve) == pytest.approx(out.tried[repr(reg)], abs=1e-12)


def test_early_stopping_picks_the_argmax_of_the_validation_curve(taste: tuple) -> None:
    """One sweep per check: the chosen count is the curve's argmax, a model trained that
    long on the fit rows scores the curve's maximum, and the retrained model is the NMF of
    all of train for that many sweeps."""
    train, _ = taste
    make = partial(NMFModel, RANK, 10.0, ITERS, sweeps_per_round=1)
    out = fit_early_stopped(make, train, 200, patience=3, seed=SEED)
    assert out.rounds == int(np.argmax(out.curve)) + 1
    assert len(out.curve) >= out.rounds  # it went on past the best (or HALS stopped)
    fit, _ = validation_split(train, seed=SEED)
    again = make().fit(fit, out.rounds)
    assert _valid_ndcg(again, train) == pytest.approx(max(out.curve), abs=1e-12)
    assert out.model is not None
    np.testing.assert_array_equal(out.model.item_factors,
                                  nmf(train, RANK, 10.0, out.rounds).V)


def test_a_grid_without_the_best_weight_scores_lower_on_validation(taste: tuple) -> None:
    """Should fail if the grid did not matter: leaving out the winner's weight (and its
    refinement) must lose on validation."""
    train, _ = taste
    full = tune_nmf_ceiling(train, RANK, 0.1, ITERS, seed=SEED, patience=3)
    best = float(full.label)
    assert best != 0.1  # the data is chosen so the run's weight is not the best
    narrow = tuple(f for f in REG_FACTORS if f * 0.1 < best / 3)
    missed = tune_nmf_ceiling(train, RANK, 0.1, ITERS, seed=SEED, patience=3,
                              factors=narrow, refine=())
    assert repr(best) not in missed.tried
    assert max(missed.curve) < max(full.curve)


def test_hals_convergence_ends_the_curve_with_a_scored_partial_round() -> None:
    """When HALS stops at its 1e-6 relative change inside a round, that last model is
    scored too (a shorter last round), so convergence never hides the final factors."""
    X = sp.csr_matrix(np.outer(np.arange(1, 9), np.arange(1, 7)).astype(float))
    seen: list[int] = []
    model = NMFModel(1, 0.0, sweeps_per_round=10).fit(
        X, 50, on_round=lambda r, n, obj: seen.append(r) is not None)
    assert model.sweeps % 10 != 0  # rank 1 data: HALS stops inside the first round
    assert seen == [-(-model.sweeps // 10)]
    np.testing.assert_allclose(model.score(np.arange(8)), X.toarray(), rtol=1e-6)


def test_zero_and_edge_weights() -> None:
    """A run at reg 0 keeps 0 as a candidate beside a public grid; 0 chosen is not an edge
    (nothing lies below it), the largest or the smallest positive weight is."""
    assert reg_candidates(0.0) == pytest.approx([0.0, *(0.1 * f for f in REG_FACTORS)])
    assert reg_candidates(0.1)[:2] == [0.01, 0.1]
    assert not reg_at_edge(0.0, [0.0, 0.01, 1.0])
    assert reg_at_edge(1.0, [0.0, 0.01, 1.0]) and reg_at_edge(0.01, [0.01, 1.0])
    assert not reg_at_edge(0.1, [0.01, 0.1, 1.0])


def test_the_ceiling_scores_users_in_blocks_as_at_once(taste: tuple, monkeypatch) -> None:
    """The ceiling's metrics summed over user blocks (how it fits Gowalla's catalogue in
    memory) equal one block of every user: the sums add over users as over silos."""
    import strategies.dp_prototypes as module

    train, test = taste
    strategy = _strategy()
    model = NMFModel(RANK, 0.1, ITERS)
    model.fit(train, ITERS)
    data = SimpleNamespace(train=train, test=test)
    whole = strategy.model_metrics(model, data)
    monkeypatch.setattr(module, "SCORE_BLOCK", 7)  # 150 users: 22 blocks, the last short
    blocks = strategy.model_metrics(model, data)
    assert blocks.keys() == whole.keys()
    for key, value in whole.items():
        assert blocks[key] == pytest.approx(value, rel=1e-12, abs=1e-12), key
