"""Bad input gets one clear ``error:`` line from run_simulation.py, before Ray starts."""

from __future__ import annotations

from pathlib import Path

import pytest

import run_simulation
from fl_app.registry import protocols


@pytest.fixture(autouse=True)
def _no_simulation(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test at once if a run gets as far as starting the Flower simulation."""
    import flwr.simulation

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("bad input was not caught before the simulation (Ray) started")

    monkeypatch.setattr(flwr.simulation, "run_simulation", refuse)


def _error_line(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    code = run_simulation.main(argv + ["--quiet"])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2, err
    assert len(lines) == 1, f"expected one error line, got:\n{err}"
    assert lines[0].startswith("error: ")
    return lines[0]


def test_unknown_protocol(capsys: pytest.CaptureFixture[str]) -> None:
    line = _error_line(capsys, ["--protocol", "nope"])
    assert "'nope'" in line
    for name in protocols():
        assert name in line


def test_missing_dataset_directory(capsys: pytest.CaptureFixture[str]) -> None:
    line = _error_line(capsys, ["--dataset", "ml-100k", "--data-dir", "/nonexistent/x"])
    assert "/nonexistent/x" in line
    assert "ml-100k" in line


def test_malformed_ratings_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "ml-100k"
    folder.mkdir()
    ratings = folder / "u.data"
    ratings.write_text("1\t1\t5\t881250949\n2\t3\t4\t881250950\n3\tfour\t3\t881250951\n")
    line = _error_line(capsys, ["--dataset", "ml-100k", "--data-dir", str(tmp_path)])
    assert str(ratings) in line
    assert "line 3" in line
    assert "'item'" in line


def test_malformed_ratings_file_wrong_field_count(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "u.data").write_text("1\t1\t5\t881250949\n1 2 5 881250949\n")
    line = _error_line(capsys, ["--dataset", "ml-100k", "--data-dir", str(tmp_path)])
    assert str(tmp_path / "u.data") in line
    assert "line 2" in line


def test_config_type_error_names_the_key(capsys: pytest.CaptureFixture[str]) -> None:
    line = _error_line(capsys, ["--set", "mf-dim=abc"])
    assert "'mf-dim'" in line and "'abc'" in line


def test_rounds_type_error_names_the_key(capsys: pytest.CaptureFixture[str]) -> None:
    line = _error_line(capsys, ["--set", "rounds=abc"])
    assert "'rounds'" in line and "'abc'" in line
