"""run_simulation.py as a command-line tool: Ctrl-C, early refusals, results kept, sizes,
progress and timeouts. CLI cases run as subprocesses; most stop before Flower starts, so
they take about a second each. Tests wait on state (a file, a history row, a process),
never on wall time: the only time bounds are generous hang guards, so a loaded machine
makes them slower, not failing."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from fedrec.config import ConfigError
from fedrec.results import ResultsError, reserve_run
from fedrec.transport.messenger import Messenger, NodeTimeoutError
from fl_app.registry import load_strategy_class, protocols, resolve_config
from strategies.base import ProtocolStrategy
from strategies.policy_needs import PolicyNeed, PolicyRefusal, check_node_policies
from tests.localgrid import LocalGrid

REPO = Path(__file__).resolve().parents[1]
TINY = ["--set", "synthetic-users=60", "--set", "synthetic-items=40", "--nodes", "3",
        "--no-compare"]


#: A hang guard, not a measurement: a refused run takes about a second on an idle machine.
HANG_SECONDS = 300.0


def cli(*args: str, tmp_path: Path, timeout: float = HANG_SECONDS
        ) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "FEDREC_NODE_POLICY": ""}
    return subprocess.run([sys.executable, "run_simulation.py", *args,
                           "--output", str(tmp_path / "out")],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


def refused_early(proc: subprocess.CompletedProcess, *needles: str) -> str:
    """The run stopped on bad input before Flower started: exit 2, one error line (and
    hints), no traceback, nothing of Flower or Ray on the console."""
    err = proc.stderr
    assert proc.returncode == 2, proc.stdout[-2000:] + err[-3000:]
    assert "Traceback" not in err and "starting Flower" not in err, err[-3000:]
    lines = err.strip().splitlines()
    assert lines[0].startswith("error: ") and len(lines) <= 2, err
    for needle in needles:
        assert needle in err, err
    return err


# -- 1. Ctrl-C ------------------------------------------------------------------------------------
def _processes_with(marker: str) -> list[int]:
    found = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if marker.encode() in environ.read_bytes():
                found.append(int(environ.parent.name))
        except (OSError, ValueError):
            continue
    return found


#: FedMF's line after a training round's history row exists (strategies/fedmf.py
#: ``_RoundLines``, always for round 1). The ledger's "train round 1: 4/4 nodes answered"
#: comes before that row, so a Ctrl-C there can leave a record without history.
_ROUND_DONE = re.compile(r"fedmf: train round \d+ of \d+ done")


@pytest.mark.timeout(900)
def test_ctrl_c_stops_writes_partial_results_and_leaves_no_process(tmp_path: Path) -> None:
    """Ctrl-C once a round is recorded: exit 130, the record has that round, and no process
    of the run (Ray's included, found by an environment marker) outlives the command. The
    stop is graceful within the run's own INTERRUPT_GRACE_SECONDS (past it the run stops
    without writing its partial results, which this checks), not within a test clock."""
    marker = f"T36_INTERRUPT_{uuid.uuid4().hex}"
    env = {**os.environ, "PYTHONPATH": str(REPO), marker: "1", "FEDREC_NODE_POLICY": ""}
    proc = subprocess.Popen(
        [sys.executable, "run_simulation.py", "--protocol", "fedmf", "--rounds", "100000",
         *TINY, "--output", str(tmp_path / "out")],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True)
    seen = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:  # interrupt once a round is in the run's history
            seen.append(line)
            if _ROUND_DONE.search(line):
                break
        else:
            pytest.fail("the run ended before a round was recorded:\n" + "".join(seen)[-3000:])
        proc.send_signal(signal.SIGINT)
        try:
            out, _ = proc.communicate(timeout=HANG_SECONDS)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the run's whole session, Ray included
            out, _ = proc.communicate()
            pytest.fail("still running after Ctrl-C:\n" + "".join(seen)[-2000:] + out)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    left = _processes_with(marker)  # at once: the command ends its processes before exiting
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)  # never leave them to the next test
    text = "".join(seen) + out
    assert proc.returncode == 130, text[-3000:]
    assert "Traceback" not in text and "KeyboardInterrupt" not in text, text[-3000:]
    assert "did not stop within" not in text, text[-3000:]
    runs = list((tmp_path / "out" / "runs").glob("*.json"))
    assert len(runs) == 1, runs
    record = json.loads(runs[0].read_text())
    assert record["status"] == "interrupted" and record["history"], (
        record.get("status"), record.get("error"), record.get("seconds"), text[-3000:])
    assert f"partial results written to {runs[0]}" in text
    assert not left, f"processes of the run outlived it: {left}"


def test_the_end_of_a_simulation_ends_every_process_it_marked() -> None:
    """What the stop relies on: the processes started under the run's marker (a child that
    ignores SIGTERM, and an orphan whose parent already exited) are ended with the run."""
    from fl_app.simulation import processes_marked, run_processes_marked

    ignore_term = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); " \
                  "time.sleep(600)"
    orphan = ("import subprocess, sys; subprocess.Popen([sys.executable, '-c', "
              "'import time; time.sleep(600)'])")
    with run_processes_marked() as token:
        child = subprocess.Popen([sys.executable, "-c", ignore_term])
        subprocess.run([sys.executable, "-c", orphan], check=True)
        while len(processes_marked(token)) < 2:  # the orphan is up
            time.sleep(0.05)
    try:
        assert child.wait(timeout=HANG_SECONDS) == -signal.SIGKILL
        assert not processes_marked(token)
    finally:
        for pid in processes_marked(token):
            os.kill(pid, signal.SIGKILL)


# -- 2, 3. node policy: at the handshake, and before Flower in a simulation -----------------------
def test_a_refusal_by_policy_is_one_line_before_flower_naming_the_flag(tmp_path: Path) -> None:
    refused_early(cli("--protocol", "fedmf", "--set", "aggregator=plain", *TINY,
                      tmp_path=tmp_path),
                  "allow-plain=false", "hint: run again with --node-policy allow-plain=true")


@pytest.mark.parametrize("protocol,flag", [
    ("dp-prototypes", "--node-policy dp-budget=1"),
    ("fedsvd-utility", "--node-policy allow-noise-removal=true"),
    ("privmvmf --set implicit=false", "--node-policy allow-ckks=true"),
    ("privmvmf", "set implicit = false"),  # the strategy's own config check, before Flower
])
def test_a_default_run_that_a_default_node_refuses_says_the_exact_opt_in(
        tmp_path: Path, protocol: str, flag: str) -> None:
    """The node's safe defaults are kept (no silent opt-in); the run stops before Flower."""
    refused_early(cli("--protocol", *protocol.split(), tmp_path=tmp_path), flag)


def test_every_default_run_passes_or_names_its_opt_ins_and_passes_with_them() -> None:
    from clients.policy import NodePolicy
    from fl_app.plan import PolicyNotAllowed, check_node_policy

    for name in protocols():
        # the multi-view protocols factorize explicit ratings (their one required change)
        cfg = resolve_config({"protocol": name, "implicit": "mvmf" not in name})
        strategy = load_strategy_class(name)(cfg)
        try:
            check_node_policy(cfg, strategy, NodePolicy())
        except PolicyNotAllowed as exc:
            opted = NodePolicy.parse(" ".join(n.opt_in for n in exc.needs))
            check_node_policy(cfg, strategy, opted)  # the named opt-ins are enough


def test_the_handshake_names_the_refusing_node_before_any_data_round() -> None:
    """Nodes report their policy at the handshake; the server stops there, naming the node
    and the node-config opt-in, before any round that reads a node's data."""
    from fl_app.client_app import build_client_app

    cfg = resolve_config({"protocol": "fedmf", "aggregator": "plain", "rounds": 1,
                          "synthetic-users": 48, "synthetic-items": 30})
    opted = {"allow-plain": "true"}
    with LocalGrid(build_client_app(policy={}), 3, node_configs={0: opted, 2: opted}) as grid:
        messenger = Messenger(grid, timeout=30)
        with pytest.raises(PolicyRefusal) as err:
            _run_with(messenger, cfg)
    text = str(err.value)
    assert text.startswith("node 1002 (partition 1) would refuse this run's plain sums")
    assert "node config 'allow-plain=true'" in text and "\n" not in text
    assert list(messenger.ledger.to_dict()["phases"]) == ["handshake"]


def _run_with(messenger: Messenger, cfg: dict) -> None:
    cls = load_strategy_class(str(cfg["protocol"]))
    cls(cfg).execute(messenger)


def test_policy_needs_compare_numbers_both_ways_and_name_the_others() -> None:
    budget = PolicyNeed("dp-budget", "epsilon 1", 1.0)
    floor = PolicyNeed("lpgcn-min-alpha", "alpha 0.2", 0.2, at_most=True)
    assert budget.met_by({"dp-budget": 1.0}) and not budget.met_by({"dp-budget": 0.5})
    assert floor.met_by({"lpgcn-min-alpha": 0.1}) and not floor.met_by({"lpgcn-min-alpha": 0.5})
    with pytest.raises(PolicyRefusal, match=r"node 2 \(and 1 other node\(s\)\) would refuse "
                                            r"this run's epsilon 1: its node policy has "
                                            r"dp-budget=0"):
        check_node_policies([budget], {1: {"dp-budget": 2}, 2: {"dp-budget": 0},
                                       3: {"dp-budget": 0}}, lambda n: f"node {n}")


# -- 4. keys the protocol does not read -----------------------------------------------------------
def test_a_key_of_another_protocol_is_an_error_naming_the_protocols_keys(tmp_path: Path) -> None:
    refused_early(cli("--set", "mf-dim=32", tmp_path=tmp_path),
                  "'mf-dim': protocol 'privirec' does not read this key", "privirec-filters")


def test_rounds_is_refused_by_a_protocol_without_rounds_but_not_by_default(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """``--rounds`` given to privirec is refused before Flower, naming its keys; the flag's
    default is no given value (privirec's default run has no ``rounds``), and the Python
    entry point refuses the same key."""
    import fl_app.simulation as simulation
    import run_simulation

    def no_flower(*_: object) -> None:
        raise AssertionError("Flower started")

    monkeypatch.setattr(simulation, "simulate", no_flower)
    assert run_simulation.main(["--rounds", "50", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: run config 'rounds': protocol 'privirec' does not read"), err
    assert "privirec-filters" in err
    parser = run_simulation.build_parser()
    assert "rounds" not in run_simulation.given_keys(parser.parse_args([]))
    assert run_simulation.run_config(parser.parse_args(["--protocol", "fedmf", "--rounds",
                                                        "3"]))["rounds"] == 3
    with pytest.raises(ConfigError, match="'rounds': protocol 'privirec'"):
        simulation.run_in_simulation({"protocol": "privirec", "rounds": 5}, 3, quiet=True)


# -- 5. results never lost or overwritten ---------------------------------------------------------
def test_output_naming_a_file_is_refused_first(tmp_path: Path) -> None:
    (tmp_path / "out").write_text("not a folder")
    refused_early(cli(*TINY, tmp_path=tmp_path), "exists and is not a folder")
    assert (tmp_path / "out").read_text() == "not a folder"


def test_an_existing_run_name_is_refused_without_overwrite(tmp_path: Path) -> None:
    runs = tmp_path / "out" / "runs"
    runs.mkdir(parents=True)
    (runs / "mine.json").write_text('{"status": "completed"}')
    refused_early(cli("--run-name", "mine", *TINY, tmp_path=tmp_path),
                  "mine.json exists", "--overwrite")
    assert (runs / "mine.json").read_text() == '{"status": "completed"}'


def test_the_python_api_claims_the_results_file_as_the_cli_does(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """run_in_simulation keeps an earlier run's results: an explicit run-name whose file
    exists is refused before Flower starts (ResultsError naming the file and ``overwrite``),
    unless ``overwrite=True``; a default name that exists gets a suffix. Flower itself is
    replaced by a stub here: what is checked is the name the ServerApp would write under."""
    import fl_app.server_app as server_app
    import fl_app.simulation as simulation

    class Started(Exception):
        pass

    names: list[str] = []

    def fake_server_app(strategy: ProtocolStrategy, **_: object) -> None:
        names.append(str(strategy.cfg["run-name"]))

    def fake_simulate(*_: object) -> None:
        raise Started

    monkeypatch.setenv("FEDREC_RESULTS", str(tmp_path))
    monkeypatch.setattr(server_app, "make_server_app", fake_server_app)
    monkeypatch.setattr(simulation, "simulate", fake_simulate)
    runs = tmp_path / "runs"
    runs.mkdir()
    done = '{"status": "completed"}'
    (runs / "mine.json").write_text(done)
    (runs / "fedmf-synthetic-1.json").write_text(done)
    tiny = {"protocol": "fedmf", "synthetic-users": 30, "synthetic-items": 20, "seed": 1}
    with pytest.raises(ResultsError, match=r"mine\.json exists.*overwrite=True"):
        simulation.run_in_simulation({**tiny, "run-name": "mine"}, 3, quiet=True)
    assert names == [] and (runs / "mine.json").read_text() == done
    for overrides, overwrite in (({**tiny, "run-name": "mine"}, True), (tiny, False)):
        with pytest.raises(Started):
            simulation.run_in_simulation(overrides, 3, quiet=True, overwrite=overwrite)
    assert names == ["mine", "fedmf-synthetic-1-2"]
    # nothing was written: the claims are released, the earlier results kept
    assert sorted(p.name for p in runs.iterdir()) == ["fedmf-synthetic-1.json", "mine.json"]
    assert (runs / "fedmf-synthetic-1.json").read_text() == done


def test_default_names_are_unique_and_a_name_is_claimed_once(tmp_path: Path) -> None:
    assert reserve_run("fedmf-synthetic-0", explicit=False, out_dir=tmp_path) == \
        "fedmf-synthetic-0"
    assert reserve_run("fedmf-synthetic-0", explicit=False, out_dir=tmp_path) == \
        "fedmf-synthetic-0-2"
    with pytest.raises(ResultsError, match="exists"):  # a second run of the same name
        reserve_run("fedmf-synthetic-0", explicit=True, out_dir=tmp_path)
    assert reserve_run("fedmf-synthetic-0", explicit=True, overwrite=True,
                       out_dir=tmp_path) == "fedmf-synthetic-0"


def test_an_early_refusal_leaves_no_placeholder(tmp_path: Path) -> None:
    refused_early(cli("--protocol", "dp-prototypes", tmp_path=tmp_path), "dp-budget")
    assert not list((tmp_path / "out" / "runs").glob("*.json"))


# -- 6. sizes and bad files -----------------------------------------------------------------------
def test_an_oversized_synthetic_dataset_is_refused_before_it_is_generated(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    refused_early(cli("--set", "synthetic-users=100000000", tmp_path=tmp_path),
                  "synthetic-users = 100000000", "memory-budget-mb")
    import datasets.synthetic
    from fedrec.config import ConfigError
    from fl_app.simulation import run_in_simulation

    def never(*args: object, **kwargs: object) -> None:
        raise AssertionError("the oversized dataset was generated")

    monkeypatch.setattr(datasets.synthetic, "generate", never)
    monkeypatch.setenv("FEDREC_RESULTS", str(tmp_path / "api"))
    with pytest.raises(ConfigError, match="memory-budget-mb"):
        run_in_simulation({"synthetic-users": 100_000_000})


def test_random_bytes_as_train_txt_name_the_file(tmp_path: Path) -> None:
    folder = tmp_path / "data" / "noise"
    folder.mkdir(parents=True)
    (folder / "train.txt").write_bytes(bytes(range(128, 256)) * 8)
    (folder / "test.txt").write_text("0 1\n")
    refused_early(cli("--dataset", "noise", "--data-dir", str(tmp_path / "data"),
                      tmp_path=tmp_path), f"{folder / 'train.txt'}: not a UTF-8 text file")


# -- 7, 8. progress while waiting; a timeout names its setting ------------------------------------
def test_a_slow_handshake_shows_progress_and_a_timeout_names_its_setting(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    import fedrec.transport.messenger as messenger_module
    from fl_app.client_app import build_client_app
    from strategies.base import handshake

    monkeypatch.setattr(messenger_module, "PROGRESS_SECONDS", 0.1)
    cfg = resolve_config({"protocol": "fedmf", "synthetic-users": 48, "synthetic-items": 30,
                          "startup-timeout": 0.5, "timeout": 0.2})
    with LocalGrid(build_client_app(policy={}), 3, cold_start=5.0) as grid:
        with caplog.at_level(logging.INFO, logger="fedrec"), \
                pytest.raises(NodeTimeoutError) as err:
            handshake(Messenger(grid, timeout=0.2), cfg)
    assert "handshake: 0 of 3 node(s) answered" in caplog.text
    assert "raise the run config 'startup-timeout' (now 0.5 s)" in str(err.value)
    assert "--set startup-timeout=SECONDS" in str(err.value)
    assert "raise the run config 'startup-timeout' if the node is only slow" in str(err.value)


def test_a_deployed_refusal_is_logged_without_a_traceback() -> None:
    """Flower's deployed ServerApp runner logs a failed ServerApp with its traceback; for a
    refusal by policy (one line already names node and opt-in) the traceback is dropped, a
    bug keeps it."""
    from fl_app.server_app import ExpectedFailureFilter, RunFailedError

    def record_of(cause: Exception) -> logging.LogRecord:
        try:
            try:
                raise cause
            except Exception as exc:
                raise RunFailedError(str(exc)) from exc
        except RunFailedError as failure:
            info = (type(failure), failure, failure.__traceback__)
        return logging.LogRecord("flwr", logging.ERROR, __file__, 1,
                                 "ServerApp raised an exception", None, info)

    refused = record_of(PolicyRefusal("node 7 (partition 1) would refuse ..."))
    assert ExpectedFailureFilter().filter(refused) and refused.exc_info is None
    bug = record_of(KeyError("x"))
    assert ExpectedFailureFilter().filter(bug) and bug.exc_info is not None
    # by type: a user's own class named like an expected one is a bug with its traceback
    lookalike = record_of(type("ConfigError", (RuntimeError,), {})("x"))
    assert ExpectedFailureFilter().filter(lookalike) and lookalike.exc_info is not None
    # a run config refused before any node (raised as itself, not as a failed run)
    early = logging.LogRecord("flwr", logging.ERROR, __file__, 1, "ServerApp raised an "
                              "exception", None, (ConfigError, ConfigError("x"), None))
    assert ExpectedFailureFilter().filter(early) and early.exc_info is None


def test_a_node_silent_in_a_secure_sum_round_names_the_timeout_to_raise() -> None:
    """A silent node in a round that tolerates it (a secure sum's dropout) is reported with
    the key that sets the deadline, as the 943-node fedmf run needed (timeout 120 -> 500)."""
    from flwr.app import ConfigRecord, RecordDict

    from fl_app.client_app import build_client_app
    from strategies.base import data_config

    cfg = resolve_config({"synthetic-users": 48, "synthetic-items": 30})
    hello = RecordDict({"data": ConfigRecord(data_config(cfg))})
    with LocalGrid(build_client_app(policy={}), 3, silent={1003}) as grid:
        messenger = Messenger(grid, timeout=0.2)
        replies = dict(messenger.iter_replies("hello", {n: hello for n in grid.ids},
                                              allow_missing=True))
        assert 1003 not in replies
        assert "raise the run config 'timeout' if the node is only slow" in \
            messenger.missing_reason(1003)


def test_a_misspelt_value_the_strategy_checks_is_refused_before_flower(tmp_path: Path) -> None:
    """A filter name is checked by the strategy, not by its key: refused in one line before
    Flower starts (it took the ServerApp's start, 10-40 s, to be refused)."""
    refused_early(cli("--set", "privirec-filters=gf-cff", tmp_path=tmp_path),
                  "unknown graph filter 'gf-cff'")


def test_a_failed_simulation_runtime_stops_the_serverapp_thread() -> None:
    """Flower's simulation runs the ServerApp in a thread that is no daemon; when the
    runtime fails (Ray not starting on a loaded machine), the thread must stop waiting for
    nodes, or the process lives on for startup-timeout (600 s)."""
    import threading

    from fedrec.transport.messenger import STOP, RunInterrupted, check_stop
    from fl_app.simulation import stop_server_thread

    STOP.clear()
    stopped = []

    def server_th_with_start_checks() -> None:  # Flower's thread target's name
        for _ in range(600):
            try:
                check_stop("nodes")
            except RunInterrupted:
                stopped.append(True)
                return
            time.sleep(0.01)

    thread = threading.Thread(target=server_th_with_start_checks,
                              name="Thread-9 (server_th_with_start_checks)")
    thread.start()
    try:
        stop_server_thread(wait=5)
        assert not thread.is_alive() and stopped
    finally:
        STOP.clear()
        thread.join()


def test_only_the_nodes_that_sum_are_held_to_the_aggregators_needs() -> None:
    """PrivMVMF's item server sends in clear and takes no part in the CKKS sums: its policy
    need not allow CKKS (strategies/mvmf.py ``sum_roles``)."""
    from fl_app.client_app import build_client_app
    from strategies.base import handshake
    from strategies.mvmf import FedMVMF
    from strategies.policy_needs import aggregator_needs

    needs = FedMVMF.federation
    cfg = resolve_config({"protocol": "fedmvmf", "synthetic-users": 48, "synthetic-items": 30,
                          "implicit": False, "item-servers": 1})
    ckks = {"allow-ckks": "true"}
    configs = {0: ckks, 1: ckks, 2: {"role": "item-server"}}
    with LocalGrid(build_client_app(policy={}), 3, node_configs=configs) as grid:
        infos = handshake(Messenger(grid, timeout=30), cfg, needs=needs,
                          policy_needs=aggregator_needs("ckks"), policy_roles=("user",))
        assert sorted(i.role for i in infos.values()) == ["item-server", "user", "user"]
    with LocalGrid(build_client_app(policy={}), 3, node_configs=configs) as grid:
        with pytest.raises(PolicyRefusal, match=r"^node 1003 \(item server\) would refuse"):
            handshake(Messenger(grid, timeout=30), cfg, needs=needs,
                      policy_needs=aggregator_needs("ckks"))


def test_a_federation_the_protocol_cannot_run_on_is_refused_before_flower(
        tmp_path: Path) -> None:
    """A simulation assigns the roles itself, so a protocol's role needs (FedMVMF's one item
    server) are checked before Flower starts, in one line naming the setting."""
    refused_early(cli("--protocol", "fedmvmf", "--set", "implicit=false", tmp_path=tmp_path),
                  "needs 1..1 node(s) of role item-server", "item-servers")


# -- 9. a default run stops before Flower naming every flag at once, and the flags suffice ------
@pytest.mark.parametrize("protocol,flags", [
    ("privirec-k", ["--set privirec-k=256"]),
    ("fedmvmf", ["--set implicit=false", "--set item-servers=1"]),
    ("privmvmf", ["--set implicit=false", "--node-policy allow-ckks=true",
                  "--set item-servers=1"]),
])
def test_a_default_run_names_every_flag_it_needs_in_one_try(
        tmp_path: Path, protocol: str, flags: list[str]) -> None:
    """Each refusal's flag on one hint line (the settings checked after a refused one run
    with its fix), and that command line passes every check made before Flower starts."""
    err = refused_early(cli("--protocol", protocol, tmp_path=tmp_path))
    hint = err.strip().splitlines()[-1]
    assert hint.startswith("hint: run again with ") and all(f in hint for f in flags), err
    from clients.policy import NodePolicy
    from fedrec.config import parse_assignments
    from fl_app.plan import preflight

    words = hint.removeprefix("hint: run again with ").split(" (")[0].split()
    pairs = list(zip(words[::2], words[1::2]))
    cfg = resolve_config({"protocol": protocol, **parse_assignments(
        [v for f, v in pairs if f == "--set"])})
    policy = NodePolicy.coerce(parse_assignments([v for f, v in pairs if f == "--node-policy"],
                                                 "--node-policy"))
    preflight(cfg, 4, policy)


def test_a_rank_above_the_catalogue_names_the_key_that_set_it() -> None:
    """PriviRec's iteration rank comes from privirec-rank, else the filters' ranks;
    PriviRec-k's from privirec-k (lowering privirec-rank there changed nothing)."""
    from strategies.refusals import SettingRefused

    for overrides, key in [({"protocol": "privirec-k"}, "privirec-k"),
                           ({"protocol": "privirec", "privirec-rank": 600}, "privirec-rank"),
                           ({"protocol": "privirec", "privirec-filter-rank": 600},
                            "privirec-filter-rank")]:
        strategy = load_strategy_class(overrides["protocol"])(
            resolve_config(overrides))
        with pytest.raises(SettingRefused) as err:
            strategy.check_catalogue(500)
        assert (err.value.key, err.value.value) == (key, 256), overrides
        strategy.check_catalogue(2048)
