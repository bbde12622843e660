"""The leaderboard paragraph quotes the board: every three-decimal number in it is a value
of results/leaderboard.json (a cell's NDCG@20, its reference's, popularity's, or the
fed / cen ratio) or one of the PriviRec draws it cites, so a regenerated board that moves a
number fails here until the paragraph follows. The paragraph lives in docs/results.md, which
README.md's "Where the numbers live" links (the front page quotes no leaderboard number)."""

from __future__ import annotations

import json
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


#: where the leaderboard paragraph lives
PAGE = REPO / "docs" / "results.md"


def _paragraph() -> str:
    text = PAGE.read_text()
    start = text.index("**Leaderboard** (`results/leaderboard.md`")
    return text[start:text.index("\n\n", start)]


def _quotable() -> set[str]:
    board = json.loads((REPO / "results" / "leaderboard.json").read_text())
    values: set[float] = set()
    for cell in board["cells"].values():
        fed, cen, pop = cell["federated"], cell["centralized"], cell["popularity"]
        for key, v in fed.items():
            if key.endswith("ndcg@20"):
                values.add(v)
                if cen.get(key):
                    values.update((cen[key], v / cen[key]))
        values.update(v for k, v in pop.items() if k.endswith("ndcg@20"))
    gap = json.loads((REPO / "results" / "privirec" / "rank_gap.json").read_text())
    for g in gap["datasets"].values():
        values.update(r["ndcg20"][f] / g["exact"][f] for r in g["rows"] for f in g["exact"])
    return {f"{v:.3f}" for v in values}


def _stale(paragraph: str) -> tuple[int, list[str]]:
    """How many three-decimal numbers ``paragraph`` quotes, and those not on the board."""
    quoted = re.findall(r"(?<![\d.])0\.\d{3}(?!\d)", paragraph)
    return len(quoted), sorted(set(quoted) - _quotable())


def test_every_number_of_the_leaderboard_paragraph_is_on_the_board() -> None:
    n, stale = _stale(_paragraph())
    assert n > 20, "the paragraph lost its numbers"
    assert not stale, f"{PAGE.name}'s leaderboard paragraph quotes numbers not on the board: " \
        f"{stale}"


def test_the_readme_points_to_the_leaderboard_paragraph() -> None:
    readme = (REPO / "README.md").read_text()
    assert "(docs/results.md)" in readme and "(results/leaderboard.md)" in readme


def test_the_check_sees_a_stale_number() -> None:
    """A number the board does not hold is reported (the test above can fail)."""
    assert _stale(_paragraph() + " FedMF 0.123")[1] == ["0.123"]
