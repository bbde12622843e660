"""Bad input gets one clear ``error:`` line from run_simulation.py, before Ray starts."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
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


# -- through the command line: bad input ends at once, in one line, with no traceback ------
REPO = Path(__file__).resolve().parents[1]
#: argv -> texts its one error line must contain. Each would otherwise wait for nodes that
#: never come (startup-timeout), be accepted (nan), or end in a Python or Flower traceback.
CLI_CASES: dict[tuple[str, ...], tuple[str, ...]] = {
    ("--nodes", "0"): ("--nodes", "at least 1, got 0"),
    ("--nodes", "-3"): ("--nodes", "at least 1, got -3"),
    ("--set", "min-nodes=1000000000000"): ("'min-nodes'", "at most the 4 simulated nodes"),
    ("--set", "timeout=nan"): ("'timeout'", "expected a finite number, got nan"),
    ("--set", "test-ratio=nan"): ("'test-ratio'", "expected a finite number, got nan"),
    ("--node-policy", "min-survivors=-5"): ("--node-policy", "'min-survivors'", ">= 2",
                                            "-5"),
    ("--node-policy", "alow-plain=true"): ("--node-policy", "'alow-plain'", "allow-plain"),
    ("--nodes", "2"): ("--nodes", "min-survivors = 3", "SecAgg+"),
    ("--set", "synthetic-users=3"): ("partition 3", "is empty", "3 users for 4 partitions"),
}


@pytest.fixture(scope="module")
def cli_results() -> dict[tuple[str, ...], subprocess.CompletedProcess[str]]:
    """Every case of :data:`CLI_CASES` run as ``python run_simulation.py ...``, all at once
    (each is a separate process: Python, imports, the check, exit)."""
    env = {k: v for k, v in os.environ.items() if k != "FEDREC_NODE_POLICY"}
    procs = {argv: subprocess.Popen([sys.executable, "run_simulation.py", *argv, "--quiet"],
                                    cwd=REPO, env=env, text=True, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE) for argv in CLI_CASES}
    out = {}
    try:
        for argv, proc in procs.items():
            stdout, stderr = proc.communicate(timeout=60)
            out[argv] = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return out


@pytest.mark.parametrize("argv", list(CLI_CASES), ids=" ".join)
def test_bad_input_on_the_command_line_is_one_line(
        cli_results: dict[tuple[str, ...], subprocess.CompletedProcess[str]],
        argv: tuple[str, ...]) -> None:
    result = cli_results[argv]
    output = result.stdout + result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2, output
    assert "Traceback" not in output and "ERROR" not in output, output
    assert len(lines) == 1 and lines[0].startswith("error: "), output
    for text in CLI_CASES[argv]:
        assert text in lines[0], lines[0]


def test_help_gives_each_default_once() -> None:
    text = run_simulation.build_parser().format_help()
    assert "(default: )" not in text
    options = re.split(r"\n  (?=-)", " ".join(text.split("\n\n")[2:]))
    for option in options:
        assert " ".join(option.split()).count("default:") <= 1, option
    assert "(default: 4)" in text and "(default: 0)" in text  # --nodes, --seed


def test_a_node_policy_refusal_names_the_flag(monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    """A node refusing during the run: its own error line, then how to opt in from here."""
    import fl_app.plan
    import fl_app.simulation
    from clients.policy import NodePolicy, PolicyError
    from fedrec.transport.messenger import NodeError

    def refuse(*args: object, **kwargs: object) -> None:
        try:
            NodePolicy().require("allow-plain", "plain sums", "node 7 (partition 1)")
        except PolicyError as exc:
            raise NodeError("plain_sum", "node 7 (partition 1)", str(exc)) from None

    monkeypatch.setattr(fl_app.plan, "preflight", lambda *_: None)  # a run that starts
    monkeypatch.setattr(fl_app.simulation, "run_plan", refuse)
    assert run_simulation.main(["--set", "aggregator=plain", "--quiet"]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2 and lines[0].startswith("error: node 7 (partition 1)")
    assert lines[1].startswith("hint: ") and "--node-policy allow-plain=true" in lines[1]


def test_flower_copies_of_node_refusals_are_dropped_but_bugs_keep_theirs() -> None:
    from fl_app.simulation import NodeRefusalFilter

    def record(message: str, level: int = logging.ERROR) -> logging.LogRecord:
        return logging.LogRecord("flwr", level, __file__, 1, message, None, None)

    keep = NodeRefusalFilter().filter
    assert not keep(record("An exception was raised when processing a message by RayBackend"))
    assert not keep(record("Traceback ...\nclients.policy.PolicyError: node 1 refuses ..."))
    assert not keep(record("ray::ClientAppActor.run()\nfedrec.secure.secagg.SecAggError: x"))
    # a node's refusal of a sum or node set it was not committed to (clients/nodeset.py)
    assert not keep(record("Traceback ...\nfedrec.wire.sums.AggregationError: node 1 refuses"))
    assert keep(record("Traceback ...\nZeroDivisionError: division by zero"))  # user's code
    assert keep(record("clients.policy.PolicyError: x", logging.WARNING))


def test_node_refusals_are_recognised_by_type_subclasses_included() -> None:
    """A refusal is known by its class, not its name: a subclass of a refusal (a setting
    refused with its fix, a ConfigError) is dropped like its base, and a user's exception
    that only shares a refusal's name keeps its traceback."""
    import sys
    import types

    from fl_app.simulation import NodeRefusalFilter, raised_types
    from strategies.refusals import SettingRefused

    def record(message: str) -> logging.LogRecord:
        return logging.LogRecord("flwr", logging.ERROR, __file__, 1, message, None, None)

    keep = NodeRefusalFilter().filter
    assert raised_types("x\nstrategies.refusals.SettingRefused: k too large") == [SettingRefused]
    assert not keep(record("Traceback ...\nstrategies.refusals.SettingRefused: set k = 6"))
    assert not keep(record("Traceback ...\nfedrec.secure.secagg.SecAggError: x"))
    mine = types.ModuleType("users_protocol_errors")
    mine.PolicyError = type("PolicyError", (RuntimeError,), {})
    sys.modules[mine.__name__] = mine
    try:
        assert keep(record("Traceback ...\nusers_protocol_errors.PolicyError: a bug"))
    finally:
        del sys.modules[mine.__name__]
