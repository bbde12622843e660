"""benchmarks/fedmf.py's reading: fed / cen is against the tuned ceiling, its verdict can say
MISSED, a ceiling beaten on test is called so, and the same-budget row is never called one."""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks import fedmf as bench  # noqa: E402


def _result(fed: float, ceiling: float, same: float) -> dict:
    ceil = {"ndcg20": ceiling, "recall20": 0.3, "tuned-rounds": 37.0, "tuned-lr": 0.001,
            "tuned-item-lr": 0.001, "tuned-reg": 0.01, "tuned-valid": 0.2,
            "tuned-candidates": 15.0, "tuned-at-edge": 0.0}
    return {"dataset": "toy", "n_users": 10, "n_items": 20, "n_train": 100, "nodes": 2,
            "config": {"partition": "shards-random", "rounds": 10, "mf-lr": 0.01,
                       "mf-reg": 0.01, "mf-dim": 8},
            "sums": ["secagg+ (masked)"], "command": "python benchmarks/fedmf.py",
            "fedmf": {"ndcg20": fed, "recall20": 0.3, "train_loss": 0.23},
            "ceiling": ceil, "same_budget": {"ndcg20": same, "recall20": 0.3, "train_loss": 0.2},
            "popularity": {"ndcg20": 0.2, "recall20": 0.15},
            "seconds": {"fedmf_protocol": 10.0, "fedmf_with_startup": 12.0, "same_budget": 2.0,
                        "ceiling": 60.0},
            "wall_time_ratio": 5.0, "synchronous_rounds": 25,
            "bytes_per_node": {"mean_down": 1e6, "mean_up": 1e6}, "machine": {"cpus": 2}}


def test_the_ratio_is_against_the_ceiling_and_can_miss() -> None:
    text = bench.markdown(_result(fed=0.36, ceiling=0.40, same=0.34))
    assert "0.900x the centralized ceiling's" in text and "MISSED" in text
    assert "beaten" not in text
    assert "rounds 37, lr 0.001, item lr 0.001 on validation" in text  # what the ceiling changed
    assert "same code, the run's budget (not a ceiling)" in text


def test_a_ceiling_beaten_on_test_is_said() -> None:
    text = bench.markdown(_result(fed=0.42, ceiling=0.40, same=0.34))
    assert "1.050x the centralized ceiling's" in text and "The ceiling is beaten on test" in text
