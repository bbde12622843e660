"""FedMF's budgeted ceiling (fedrec.recsys.mf_ceiling, fedrec.recsys.halving): warm starts,
the budget, the run's setting among the candidates, the edge walk, validation only."""

from __future__ import annotations

import math

import numpy as np
import pytest

from datasets import DatasetSpec, load_dataset
from fedrec.recsys import mf_ceiling as mc
from fedrec.recsys.halving import tune_halving
from fedrec.recsys.mf import BPRMF, tune_early_stopped, validation_split

#: The candidates planned before any edge walk (the budget's first term counts them).
_PLANNED = len(mc.REFERENCE_GRID) + len(mc.REFERENCE_SPLIT_STEPS)


@pytest.fixture(scope="module")
def small():
    return load_dataset(DatasetSpec(name="synthetic", synthetic_users=80,
                                    synthetic_items=100, seed=0))


def test_resume_continues_a_fit_exactly(small) -> None:
    """fit(n) then resume(m) is fit(n + m): same triples, same Adam state, so a candidate
    the halving continues has the curve the full tuner would record for it."""
    def model() -> BPRMF:
        return BPRMF(dim=8, lr=0.01, reg=0.01, mode="local", epochs=2, seed=1, item_lr=0.003)

    once = model().fit(small.train, 5)
    staged = model().fit(small.train, 2).resume(small.train, 3)
    assert staged.rounds_done == once.rounds_done == 5
    np.testing.assert_array_equal(staged.item_factors, once.item_factors)
    np.testing.assert_array_equal(staged.user_factors, once.user_factors)
    assert staged.losses == once.losses


class Curve:
    """A resumable fake whose validation score after round r is ``curve(label, r)``; it
    counts what it was asked to do (``log``)."""

    def __init__(self, label: str, score, log: list[str]) -> None:  # type: ignore[no-untyped-def]
        self.label, self.score, self.log, self.r = label, score, log, 0

    def fit(self, train, rounds, on_round=None):  # type: ignore[no-untyped-def]
        self.log.append(f"fit {self.label} {train.nnz}")
        self.r = 0
        return self._go(rounds, on_round)

    def resume(self, train, rounds, on_round=None):  # type: ignore[no-untyped-def]
        self.log.append(f"resume {self.label}")
        return self._go(rounds, on_round)

    def _go(self, rounds, on_round):  # type: ignore[no-untyped-def]
        total = self.r + rounds
        for r in range(self.r + 1, total + 1):
            self.r = r
            if on_round is not None and on_round(r, total, 0.0):
                break
        return self


def _landscape(label: str, r: int) -> float:
    """A smooth validation landscape over (lr, item lr, reg) around the run's (0.01, 0.01,
    0.01): best at user step 0.03 (past the grid's fast edge), item step = user step, the
    run's L2 weight; faster steps rise sooner, and every curve declines slowly after."""
    lr, item, reg = mc.parse_label(label)
    peak = (0.3 - 0.02 * abs(math.log(lr / 0.03, 3)) - 0.02 * abs(math.log(item / lr, 3))
            - 0.02 * abs(math.log(reg / 0.01, 3)))
    speed = 30 * math.sqrt(lr * item)
    return peak * (1 - math.exp(-speed * r)) - 0.001 * r


def _tune(budget: str, log: list[str], train, rounds: int = 20,  # type: ignore[no-untyped-def]
          **kw):
    def make(lr: float, reg: float, item_lr: float) -> Curve:
        return Curve(mc.label_of(lr, item_lr, reg), _landscape, log)

    metric = lambda m, fit, valid: _landscape(m.label, m.r)  # noqa: E731
    tuner = tune_halving if budget == "halving" else tune_early_stopped
    original = getattr(mc, tuner.__name__)

    def with_metric(*a, **k):  # type: ignore[no-untyped-def]
        return original(*a, metric=metric, **k)

    setattr(mc, tuner.__name__, with_metric)
    try:
        return mc.tune_mf_ceiling(make, train, 0.01, 0.01, rounds, budget=budget, **kw)
    finally:
        setattr(mc, tuner.__name__, original)


def test_halving_warm_starts_within_its_budget_and_walks_past_the_edge(small) -> None:
    """On a landscape whose best lies one step past the grid's fast edge: the halving
    tries every first-grid candidate (the run's own among them), walks past the edge as the
    full tuner does and picks the same setting and rounds, never fits a candidate twice from
    scratch, spends at most its budget and a fraction of the full tuner's rounds, and
    retrains only the winner on train."""
    log: list[str] = []
    halved = _tune("halving", log, small.train)
    full = _tune("full", [], small.train)
    run_own = mc.label_of(0.01, 0.01, 0.01)
    assert run_own in halved.tried and set(full.tried) >= set(halved.tried)
    assert halved.label == full.label == mc.label_of(0.03, 0.03, 0.01)
    assert halved.rounds == full.rounds and max(halved.curve) == max(full.curve)
    assert halved.tried[halved.label] == max(halved.tried.values())
    spent = sum(halved.trained.values())
    assert spent <= mc.halving_budget(20, _PLANNED) and not halved.exhausted
    assert spent < sum(full.trained.values()) / 2
    fits = [x for x in log if x.startswith("fit")]
    fit_rows = validation_split(small.train, seed=0)[0].nnz
    assert len(fits) == len(halved.trained) + 1  # each candidate once, the winner retrained
    assert len({x for x in fits if x.endswith(f" {fit_rows}")}) == len(halved.trained)
    assert fits[-1] == f"fit {halved.label} {small.train.nnz}"
    assert any(x.startswith("resume") for x in log)


def test_a_spent_budget_stops_training_and_says_so(small) -> None:
    """A budget too small to finish: no more rounds than it allows, the best so far wins,
    and the result says the budget cut it."""
    log: list[str] = []
    def metric(model, fit, valid):  # type: ignore[no-untyped-def]
        return model.r / 100 + (0.001 if model.label == "c2" else 0.0)

    out = tune_halving({f"c{i}": (lambda i=i: Curve(f"c{i}", None, log)) for i in range(4)},
                       small.train, 40, budget=11, first_rung=2, metric=metric)
    assert sum(out.trained.values()) == 11 and out.exhausted
    assert out.label == "c2" and out.rounds == len(out.curve)


def test_the_ceiling_reads_validation_only_and_keeps_the_run_setting(small) -> None:
    """Real BPR-MF: the halving ceiling is chosen from ``train`` alone (its validation
    score is that of the chosen setting refit on the fit rows), the run's own setting is
    among what it trained, and its keys say what it spent."""
    from fedrec.recsys.metrics import evaluate_ranking
    from fl_app.registry import resolve_config
    from strategies.fedmf import FedMF

    cfg = resolve_config({"protocol": "fedmf", "rounds": 3, "synthetic-users": 80,
                          "synthetic-items": 100, "mf-dim": 8, "mf-local-epochs": 1})
    strategy = FedMF(cfg)
    tuned = strategy.tune(small.train)
    assert mc.label_of(strategy.lr, strategy.lr, strategy.reg) in tuned.tried
    lr, item_lr, reg = mc.parse_label(tuned.label)
    fit, valid = validation_split(small.train, seed=strategy.seed)
    check = strategy._untrained(lr, reg, item_lr).fit(fit, tuned.rounds)
    assert evaluate_ranking(check.score, fit, valid).means()["ndcg@20"] == pytest.approx(
        max(tuned.curve), abs=1e-12)
    keys = mc.ceiling_keys(tuned, strategy.lr, strategy.reg)
    assert 0 < keys["tuned-selection-rounds"] <= mc.halving_budget(strategy.rounds, _PLANNED)
    assert keys["tuned-valid"] == max(tuned.tried.values())
    assert keys["tuned-halving"] == 1.0
    assert mc.ceiling_keys(tuned, strategy.lr, strategy.reg, "full")["tuned-halving"] == 0.0


def test_the_halving_ceiling_loses_when_its_best_setting_is_removed(small) -> None:
    """The grid matters (a test that can fail): without the setting the budgeted tuner
    chooses, it ends lower on validation. The candidates share one step size (L2 weights
    apart), so ranking them at equal rounds is fair and the halving agrees with the full
    tuner; across step sizes it may not (a slow step that overtakes late is cut early:
    docs/protocols/fedmf.md)."""
    from fl_app.registry import resolve_config
    from strategies.fedmf import FedMF

    cfg = resolve_config({"protocol": "fedmf", "rounds": 3, "mf-dim": 8,
                          "mf-local-epochs": 1})
    strategy = FedMF(cfg)
    grid = ((0.3, 0.3, 0.1), (0.3, 0.3, 1.0), (0.3, 0.3, 10.0), (0.3, 0.3, 100.0))

    def tune(g, budget="halving"):  # type: ignore[no-untyped-def]
        return mc.tune_mf_ceiling(strategy._untrained, small.train, strategy.lr, strategy.reg,
                                  strategy.rounds, split_steps=False, grid=g, budget=budget)

    halved = tune(grid)
    assert halved.label == tune(grid, "full").label
    lr, item_lr, reg = mc.parse_label(halved.label)
    chosen = (lr / strategy.lr, item_lr / strategy.lr, reg / strategy.reg)
    rest = tuple(g for g in grid if not np.allclose(g, chosen))
    assert len(rest) == len(grid) - 1
    assert max(tune(rest).curve) < max(halved.curve)


def test_an_unknown_budget_is_refused(small) -> None:
    with pytest.raises(ValueError, match="halving | full"):
        mc.tune_mf_ceiling(lambda *a: BPRMF(), small.train, 0.01, 0.01, 2, budget="some")
