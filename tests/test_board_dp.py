"""The leaderboard's DP section claims "above popularity" only where every seed is, from
the lowest epsilon whose every larger point is too; a tie within the seeds' spread or a
dip at a larger epsilon leaves no claim."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks import _board_dp


def _write(root: Path, rel: str, points: dict[float, list[float]], pop: float = 0.2) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"popularity": pop, "curve": [
        {"epsilon": e, "delta": 1e-5, "ndcg@20": v, "dp-popularity": [0.18, 0.19, 0.19]}
        for e, v in points.items()]}))


def test_the_crossing_needs_every_seed_at_every_larger_epsilon(tmp_path: Path) -> None:
    files = dict(_board_dp.CURVES)
    _write(tmp_path, files["dp-svd"]["gowalla"],
           {1: [0.10, 0.11, 0.12], 5: [0.21, 0.22, 0.23], 10: [0.25, 0.26, 0.27],
            20: [0.05, 0.05, 0.05]})  # above 10 is no part of the section
    text = "\n".join(_board_dp.lines(tmp_path))
    assert "Gowalla: above item popularity with every seed at every epsilon >= 5" in text
    assert "| 20 |" not in text


def test_a_tie_or_a_dip_claims_nothing(tmp_path: Path) -> None:
    files = dict(_board_dp.CURVES)
    _write(tmp_path, files["dp-svd"]["yelp2018"],
           {1: [0.25, 0.26, 0.27], 5: [0.21, 0.22, 0.23], 10: [0.19, 0.26, 0.27]})
    pts = _board_dp.points(tmp_path)
    assert [p["vs-popularity"] for p in sorted(pts, key=lambda p: p["epsilon"])] == \
        ["above", "above", "tie"]
    text = "\n".join(_board_dp.lines(tmp_path))
    assert "Yelp2018: no user-level DP protocol above item popularity" in text
    assert _board_dp.verdict([0.1, 0.2], [0.15]) == "tie"
    assert _board_dp.verdict([0.1, 0.12], [0.15, 0.2]) == "below"


def test_the_papers_curves_pair_each_seed_with_its_split_and_a_gram_entry_claims_no_crossing(
        tmp_path: Path) -> None:
    units = {"reference/0": {"popularity": 0.2}, "reference/1": {"popularity": 0.3},
             # above its own split's popularity with both seeds, not above their mean
             "fedsvd-privacy/5/0": {"ndcg@20": 0.25}, "fedsvd-privacy/5/1": {"ndcg@20": 0.35},
             "fedsvd-privacy/20/0": {"ndcg@20": 0.9}, "fedsvd-privacy/20/1": {"ndcg@20": 0.9},
             "dp-prototypes/5/0": {"ndcg@20": 0.1}, "dp-prototypes/5/1": {"ndcg@20": 0.5},
             "dp-popularity/5/0": {"ndcg@20": 0.01}, "dp-popularity/5/1": {"ndcg@20": 0.02}}
    path = tmp_path / _board_dp.PAPER_CURVES["gowalla"]
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"config": {"fedsvd_delta": 1e-7}, "units": units}))
    pts = {p["protocol"]: p for p in _board_dp.points(tmp_path)}
    assert set(pts) == {"fedsvd-privacy", "dp-prototypes"}  # 20 > 10; dp-popularity a baseline
    assert pts["fedsvd-privacy"]["vs-popularity"] == "above"
    assert pts["dp-prototypes"]["vs-popularity"] == "tie"
    assert pts["fedsvd-privacy"]["delta"] == 92 * 1e-7 and pts["dp-prototypes"]["delta"] == 0
    assert pts["fedsvd-privacy"]["vs-dp-popularity"] == "above"
    text = "\n".join(_board_dp.lines(tmp_path))
    assert "| Gowalla | fedsvd-privacy | a Gram entry | 5 |" in text
    assert "Gowalla: no user-level DP protocol above item popularity" in text
