"""``benchmarks._report.Units``: the finished units of a long benchmark, kept so that an
interrupted run resumes where it stopped (``benchmarks/mvmf.py --resume``).

A resumed run must reuse every stored unit and compute only the rest; a run under another
config must not mix its units into the file; processes sharing the file (``--part``) must not
lose each other's units.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # first: Opacus installs a top-level package named benchmarks

from benchmarks._report import Units  # noqa: E402

CONFIG = {"seeds": 5, "dataset": "ml-1m"}


def test_a_resumed_run_reuses_stored_units_and_computes_the_rest(tmp_path: Path) -> None:
    path = tmp_path / "units.json"
    calls: list[str] = []

    def work(key: str, value: float):
        def run() -> dict[str, float]:
            calls.append(key)
            return {"value": value}
        return run

    first = Units(path, CONFIG, resume=False)
    assert first.get("a", work("a", 1.0)) == {"value": 1.0}
    # interrupted here; the resumed run asks for a and b
    again = Units(path, CONFIG, resume=True)
    assert again.get("a", work("a", 99.0)) == {"value": 1.0}
    assert again.get("b", work("b", 2.0)) == {"value": 2.0}
    assert calls == ["a", "b"]
    # without --resume the stored units are not reused
    fresh = Units(path, CONFIG, resume=False)
    assert fresh.get("a", work("a", 3.0)) == {"value": 3.0}
    # ... and do not come back in the file either (b belonged to the run started over)
    assert Units(path, CONFIG, resume=True).done == {"a": {"value": 3.0}}


def test_resuming_under_another_config_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "units.json"
    Units(path, CONFIG, resume=False).get("a", lambda: 1)
    with pytest.raises(SystemExit, match="written with config .*rerun without --resume"):
        Units(path, {**CONFIG, "seeds": 1}, resume=True)


def test_processes_sharing_the_file_keep_each_others_units(tmp_path: Path) -> None:
    path = tmp_path / "units.json"
    one, two = Units(path, CONFIG, resume=True), Units(path, CONFIG, resume=True)
    one.get("table4/a", lambda: 1)
    two.get("attack/b", lambda: 2)
    one.get("table4/c", lambda: 3)
    assert Units(path, CONFIG, resume=True).done == {"table4/a": 1, "attack/b": 2,
                                                     "table4/c": 3}


def test_a_unit_another_process_stored_meanwhile_is_taken_not_rerun(tmp_path: Path) -> None:
    path = tmp_path / "units.json"
    one, two = Units(path, CONFIG, resume=True), Units(path, CONFIG, resume=True)
    two.get("attack/b", lambda: 2)

    def never() -> int:
        raise AssertionError("a unit another process stored was run again")

    assert one.get("attack/b", never) == 2


def test_markdown_only_reports_the_stored_result_or_names_the_missing_file(
        tmp_path: Path) -> None:
    """``rewrite_markdown`` (every ``--markdown-only``): ``prepare`` changes the stored
    result before the report and the plot see it, both get the same result, and a missing
    file stops with its name instead of writing an empty report."""
    from benchmarks._report import rewrite_markdown, write_report

    path = tmp_path / "bench.json"
    with pytest.raises(SystemExit, match="bench.json does not exist"):
        rewrite_markdown(path, lambda r: "never")
    assert not path.exists()
    write_report(path, {"rows": [1, 2]}, "old\n")
    plotted: list[tuple[dict, Path]] = []
    result = rewrite_markdown(path, lambda r: f"rows {r['rows']}, {r['note']}\n",
                              plot=lambda r, png: plotted.append((r, png)),
                              prepare=lambda r: r.__setitem__("note", "prepared"))
    assert result == {"rows": [1, 2], "note": "prepared"}
    assert path.with_suffix(".md").read_text() == "rows [1, 2], prepared\n"
    assert plotted == [(result, path.with_suffix(".png"))]
    assert '"note": "prepared"' in path.read_text()


def test_measure_datasets_runs_only_what_the_stored_result_lacks(tmp_path) -> None:
    """A stored dataset is not measured again; the extra step runs where its key is
    missing; the report is written after each unit."""
    from benchmarks._report import measure_datasets, stored_result

    path = tmp_path / "r.json"
    result = {"datasets": {"a": {"x": 1, "more": 0}}}
    seen: list[str] = []

    def measure(ds: str) -> dict:
        seen.append(ds)
        return {"x": 2}

    measure_datasets(path, result, ["a", "b"], measure, lambda r: f"{sorted(r['datasets'])}",
                     ("more", "extra", lambda ds, stored: stored["x"] * 10))
    assert seen == ["b"]
    assert result["datasets"] == {"a": {"x": 1, "more": 0}, "b": {"x": 2, "more": 20}}
    assert stored_result(path)["datasets"]["b"]["more"] == 20
    assert path.with_suffix(".md").read_text().startswith("['a', 'b']")
