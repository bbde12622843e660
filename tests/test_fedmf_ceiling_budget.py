"""benchmarks/fedmf_ceiling_budget.py: its ratios and reading lines are computed from the
numbers, for results that meet the target and results that do not."""

from __future__ import annotations

from typing import Any

from benchmarks import fedmf_ceiling_budget as fb


def _arm(seconds: float, test: float, valid: float, lr: float = 1e-3,
         budget: int | None = None) -> dict[str, Any]:
    return {"wall_seconds": seconds, "retrain_seconds": seconds / 4, "selection_rounds": 100,
            "retrain_rounds": 30, "budget_rounds": budget, "budget_cut": False,
            "candidates": 15, "trained": {}, "tried": {},
            "chosen": {"lr": lr, "item_lr": lr / 3, "reg": 0.01, "rounds": 30},
            "valid_ndcg": valid, "test_ndcg": test}


def _result(half: dict[str, Any], fed_seconds: float) -> dict[str, Any]:
    return {"datasets": {"ml-100k": {
        "federated": {"nodes": 8, "wall_seconds": fed_seconds, "test_ndcg": 0.40,
                      "popularity_ndcg": 0.21},
        "halving": half, "full": _arm(500.0, 0.41, 0.214)}}}


def _reading(result: dict[str, Any]) -> list[str]:
    return [x for x in fb.markdown(result).splitlines() if x.startswith("- ")]


def test_the_reading_follows_the_numbers() -> None:
    below = _reading(_result(_arm(100.0, 0.405, 0.211, lr=3e-3, budget=290), 60.0))
    assert below[0].startswith("- The budgeted ceiling's test NDCG@20 is 0.4050, 0.0050 "
                               "below the full tuner's (0.988 of it; validation -0.0030); "
                               "it chose another setting, in 0.20 of the full tuner's wall "
                               "time")
    assert "1.7x the federated run's wall time (target 2x: met)" in below[1]
    assert "reaches 0.988 of the budgeted ceiling's test NDCG@20" in below[2]
    same = _reading(_result(_arm(400.0, 0.41, 0.214, budget=290), 60.0))
    assert "0.0000 above the full tuner's" in same[0] and "chose the same setting" in same[0]
    assert "6.7x the federated run's wall time (target 2x: not met)" in same[1]


def test_ratios_are_taken_from_the_same_result() -> None:
    r = _result(_arm(100.0, 0.405, 0.211), 50.0)["datasets"]["ml-100k"]
    q = fb.ratios(r)
    assert q["halving_over_full_seconds"] == 0.2
    assert q["halving_over_federated_seconds"] == 2.0
    assert q["full_over_federated_seconds"] == 10.0
    assert q["halving_over_full_rounds"] == 1.0
    assert abs(q["halving_minus_full_test"] + 0.005) < 1e-12
