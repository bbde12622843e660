"""benchmarks/dp_accountant_check.py's verdict: the accountants "agree" only when every
point is within the tolerance, and the control (a 10% larger noise multiplier) must fall
outside it, or the rule could not tell a different noise apart."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.dp_accountant_check import verdict  # noqa: E402


def _points(flower: float, control: float) -> list[dict]:
    return [{"dataset": "d", "target": 1.0, "kind": "point", "charged": 1.0, "flower": flower},
            {"dataset": "d", "target": 1.0, "kind": "control", "charged": control}]


def test_agreement_within_the_tolerance_and_a_control_outside_it() -> None:
    v = verdict(_points(1.004, 0.9))
    assert v["agree"] and v["control_separates"]


def test_a_point_off_by_more_than_the_tolerance_does_not_agree() -> None:
    assert not verdict(_points(1.05, 0.9))["agree"]


def test_a_control_inside_the_tolerance_says_the_rule_cannot_separate() -> None:
    assert not verdict(_points(1.0, 0.995))["control_separates"]


def test_a_disagreement_is_called_conservative_only_when_the_node_charges_more() -> None:
    over = [{"dataset": "d", "target": 10.0, "kind": "point", "charged": 10.0,
             "flower": 9.7, "opacus_fractional": 9.71},
            {"dataset": "d", "target": 10.0, "kind": "control", "charged": 8.8}]
    v = verdict(over)
    assert not v["agree"] and v["disagreements_conservative"] and v["fractional_agree"]
    under = [{**over[0], "flower": 10.3, "opacus_fractional": 10.0}, over[1]]
    v = verdict(under)
    assert not v["disagreements_conservative"] and not v["fractional_agree"]
