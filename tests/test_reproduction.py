"""docs/reproduction.md: every row reads a number, the report is up to date, and a verdict
is always computed from the numbers and the rule (never stored in a row)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from benchmarks import reproduction as rep


def test_every_row_finds_its_number() -> None:
    rows = rep.rows()
    assert {row.paper for row in rows} == set(rep.PAPERS)
    for row in rows:
        if row.status in (rep.NOT_RUN, rep.NO_DATA):
            assert row.status_reason, row
            continue
        assert row.status == "run", row
        assert (rep.REPO / row.results).is_file(), row.results
        result = rep.evaluate(row)
        assert isinstance(result.ours, float), row
        assert result.verdict in (rep.HOLDS, rep.FAILS, rep.NOT_COMPARABLE), row


def test_required_rows_are_covered() -> None:
    items = {(row.paper, row.item.split(" (")[0], row.paper_dataset) for row in rep.rows()}
    for ds in ("Gowalla", "Yelp2018", "Amazon-Book"):
        assert ("000", "Table 3", ds) in items
        assert ("001", "Table 4", ds) in items
    assert ("000", "Fig. 3", "Gowalla") in items and ("000", "Fig. 3", "Yelp2018") in items
    assert any(p == "001" and i.startswith("Eq. 30") for p, i, _ in items)
    assert any(p == "002" and ds == "Netflix" for p, _, ds in items)
    assert ("004", "Table 3", "ML-1M") in items and ("004", "Table 5", "ML-1M") in items


def test_report_is_up_to_date(tmp_path) -> None:
    expected = rep.render(rep.rows())
    assert rep.REPORT.read_text() == expected, (
        "docs/reproduction.md is stale: run python benchmarks/reproduction.py")
    assert rep.main(["--check"]) == 0
    stale = tmp_path / "stale.md"
    stale.write_text(expected.replace("holds", "HOLDS", 1))
    assert rep.main(["--check", "--out", str(stale)]) == 1


def test_rows_carry_no_verdict() -> None:
    names = {f.name for f in dataclasses.fields(rep.Row)}
    assert not {n for n in names if "verdict" in n or n in ("holds", "outcome")}, names
    assert "verdict" in {f.name for f in dataclasses.fields(rep.Result)}


def test_rules_follow_the_numbers() -> None:
    assert rep.within_abs(0.001).test(0.1537, 0.1528)
    assert not rep.within_abs(0.001).test(0.1513, 0.1531)
    assert rep.within_rel(0.10).test(20.4, 19.8)
    assert not rep.within_rel(0.10).test(23.0, 19.8)
    assert rep.at_least(2.5).test(2.6, None) and not rep.at_least(2.5).test(2.39, None)
    assert rep.at_most(2.0).test(1.3, None) and not rep.at_most(2.0).test(14.3, None)
    assert rep.below(0.0).test(-1e-4, None) and not rep.below(0.0).test(1e-4, None)
    assert rep.above(0.8).test(0.93, None) and not rep.above(0.8).test(0.5, None)


def _fake(tmp_path, monkeypatch, payload: dict, **kw) -> rep.Row:
    monkeypatch.setattr(rep, "REPO", tmp_path)
    (tmp_path / "r.json").write_text(json.dumps(payload))
    base = dict(paper="000", item="Table 3", metric="NDCG@20", paper_dataset="Gowalla",
                paper_value=0.1528, source="test", rule=rep.within_abs(0.001),
                results="r.json", ours=("x",))
    base.update(kw)
    return rep.Row(**base)


def test_changing_a_number_changes_the_verdict(tmp_path, monkeypatch) -> None:
    row = _fake(tmp_path, monkeypatch, {"dataset": "gowalla", "x": 0.1530})
    assert rep.evaluate(row).verdict == rep.HOLDS
    row = _fake(tmp_path, monkeypatch, {"dataset": "gowalla", "x": 0.1500})
    assert rep.evaluate(row).verdict == rep.FAILS
    assert rep.evaluate(dataclasses.replace(row, paper_value=0.1505)).verdict == rep.HOLDS


def test_other_data_or_regime_is_not_comparable(tmp_path, monkeypatch) -> None:
    row = _fake(tmp_path, monkeypatch, {"dataset": "ml-100k", "x": 0.1530, "rows": 9.4})
    res = rep.evaluate(row)
    assert res.verdict == rep.NOT_COMPARABLE and "ml-100k" in res.reason
    assert "the rule on our numbers: holds" in res.reason
    # a claim about the protocol is judged on any data
    assert rep.evaluate(dataclasses.replace(row, data_bound=False)).verdict == rep.HOLDS
    regime = rep.Regime("rows per node", ("rows",), 3245.0)
    row = dataclasses.replace(row, paper_dataset="ml-100k", regime=regime)
    res = rep.evaluate(row)
    assert res.verdict == rep.NOT_COMPARABLE and "rows per node" in res.reason
    assert rep.evaluate(dataclasses.replace(row, regime=rep.Regime("r", ("rows",), 10.0))
                        ).verdict == rep.HOLDS


def test_status_rows_need_no_file(tmp_path, monkeypatch) -> None:
    row = _fake(tmp_path, monkeypatch, {}, results="missing.json", status=rep.NO_DATA,
                status_reason="no split")
    assert rep.evaluate(row).verdict == rep.NO_DATA


def test_missing_file_fails_clearly(tmp_path, monkeypatch, capsys) -> None:
    row = _fake(tmp_path, monkeypatch, {}, results="results/nowhere.json")
    with pytest.raises(rep.ReportError, match="results/nowhere.json does not exist"):
        rep.evaluate(row)
    monkeypatch.setattr(rep, "rows", lambda: [row])
    assert rep.main(["--check", "--out", str(tmp_path / "x.md")]) == 2
    assert "results/nowhere.json does not exist" in capsys.readouterr().err


def test_missing_key_or_non_number_fails_clearly(tmp_path, monkeypatch) -> None:
    row = _fake(tmp_path, monkeypatch, {"dataset": "gowalla", "x": "n/a"})
    with pytest.raises(rep.ReportError, match="not a number"):
        rep.evaluate(row)
    with pytest.raises(rep.ReportError, match="'y'"):
        rep.evaluate(dataclasses.replace(row, ours=("y",)))
