"""``python -m deploy.node_status``: the SuperLink's node ids mapped to status, holder,
partition and role, from what the handshake wrote to the results (``privacy.nodes``) and
the names the SuperNodes' Flower keys were registered under; a lost node is logged by the
ServerApp when it is noticed (flwr 1.42's SuperLink logs no node going offline).

The live check (a real SuperLink, a killed SuperNode) is in
``tests/test_deployment_failure.py``."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

from flwr.app import Message, RecordDict

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from deploy import node_status  # noqa: E402
from fedrec.transport.messenger import Messenger  # noqa: E402
from tests.localgrid import LocalGrid  # noqa: E402
from tests.simutil import run_in_process  # noqa: E402

TINY = {"dataset": "synthetic", "synthetic-users": 30, "synthetic-items": 20, "seed": 1,
        "protocol": "fedmf", "rounds": 1, "mf-dim": 2, "aggregator": "plain"}


def _superlink_node(node_id: int, status: str, name: str = "") -> dict[str, object]:
    return {"node-id": node_id, "status": status, "name": name, "owner": "<none>",
            "online-at": "2026-11-27T10:00:00", "offline-at": "2026-11-27T10:05:00"}


def test_the_results_map_every_node_id_to_its_partition_and_role_without_data() -> None:
    record = run_in_process({**TINY, "run-name": "node-status"}, num_nodes=3,
                            node_policy={"allow-plain": True})
    nodes = record["privacy"]["nodes"]
    assert nodes == {str(1001 + i): {"partition": i, "role": "user", "identity": "simulated"}
                     for i in range(3)}
    # what a node's data holds (user and item counts) is not in this section
    assert all(set(v) == {"partition", "role", "identity"} for v in nodes.values())


def test_node_rows_join_the_superlink_the_run_and_the_roster() -> None:
    record = {"privacy": {"nodes": {
        "11": {"partition": 1, "role": "user", "identity": "roster"},
        "12": {"partition": -1, "role": "item-server", "identity": "roster"},
        "13": {"partition": 0, "role": "user", "identity": "roster"},
        "14": {"partition": 2, "role": "user", "identity": "roster"}}}}
    nodes = [_superlink_node(11, "online", "clinic-b"), _superlink_node(12, "online", "items"),
             _superlink_node(13, "offline", "clinic-a"), _superlink_node(15, "online")]
    rows = node_status.node_rows(nodes, record, {-1: "item-server", 0: "user", 1: "user",
                                                 2: "user", 3: "user"})
    by_partition = {r["partition"]: r for r in rows}
    assert [r["partition"] for r in rows] == [0, 1, 2, 3, -1, "-"]
    assert by_partition[0] == {"node-id": 13, "status": "offline", "holder": "clinic-a",
                               "partition": 0, "role": "user", "identity": "roster",
                               "since": "2026-11-27T10:05:00"}
    assert by_partition[1]["holder"] == "clinic-b" and by_partition[1]["status"] == "online"
    assert by_partition[-1]["role"] == "item-server" and by_partition[-1]["holder"] == "items"
    assert by_partition[2]["status"] == "unknown"  # in the run, no longer on the SuperLink
    assert by_partition[3]["status"] == "no node in the run"  # in the roster only
    assert by_partition["-"]["node-id"] == 15  # joined after the run
    text = node_status.table(rows)
    assert text.splitlines()[0].split() == list(node_status.COLUMNS)
    assert "clinic-a" in text and "item-server" in text


def test_node_status_picks_the_newest_results_and_refuses_none(tmp_path: Path,
                                                               monkeypatch, capsys) -> None:
    runs = tmp_path / "runs"
    runs.mkdir()
    (runs / "old.json").write_text(json.dumps({"config": {"run-name": "old"}, "privacy": {
        "nodes": {"7": {"partition": 0, "role": "user", "identity": "roster"}}}}))
    monkeypatch.setattr(node_status, "superlink_nodes",
                        lambda conn: [_superlink_node(7, "online", "holder-0")])
    assert node_status.main(["--results", str(tmp_path / "none")]) == 2
    assert "no results file with 'privacy.nodes'" in capsys.readouterr().err
    assert node_status.main(["--results", str(runs), "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["run-name"] == "old" and out["nodes"][0]["holder"] == "holder-0"


def _simulation_record(run_name: str = "") -> dict[str, object]:
    """A local simulation's results: its node ids are the simulation's own (1001, ...)."""
    return {"config": {"run-name": run_name}, "privacy": {"nodes": {
        str(1001 + i): {"partition": i, "role": "user", "identity": "simulated"}
        for i in range(2)}}}


def test_node_status_skips_local_simulations_in_the_results_folder(
        tmp_path: Path, monkeypatch, capsys) -> None:
    """The default folder (``results/runs`` from the repo root) also holds local
    simulations, newer than the federation's run: the newest record mapping a node the
    SuperLink lists is shown, and a default-named run by its file name, not ``''``."""
    import os

    runs = tmp_path / "runs"
    runs.mkdir()
    deployed = runs / "fedmf-ml-100k-0.json"
    deployed.write_text(json.dumps({"config": {"run-name": ""}, "privacy": {"nodes": {
        "7": {"partition": 0, "role": "user", "identity": "roster"}}}}))
    newer = runs / "fedmf-synthetic-0.json"
    newer.write_text(json.dumps(_simulation_record()))
    os.utime(deployed, (1, 1))
    monkeypatch.setattr(node_status, "superlink_nodes",
                        lambda conn: [_superlink_node(7, "online", "holder-0")])
    assert node_status.main(["--results", str(runs), "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["results"] == str(deployed) and out["run-name"] == "fedmf-ml-100k-0"
    assert [(r["node-id"], r["status"], r["partition"]) for r in out["nodes"]] == \
        [(7, "online", 0)]
    deployed.unlink()
    assert node_status.main(["--results", str(runs)]) == 2
    err = capsys.readouterr().err
    assert "maps a node the SuperLink lists" in err and "--results" in err, err


def _echo(msg: Message, _context: object) -> Message:
    return Message(RecordDict(), reply_to=msg)


def test_the_serverapp_logs_a_node_that_went_offline_or_silent(caplog) -> None:
    with LocalGrid(_echo, 4, unavailable=[1003], silent=[1004]) as grid:
        messenger = Messenger(grid, timeout=0.3)
        for i, n in enumerate(grid.ids):
            messenger.report.name_node(n, f"partition {i}")
        with caplog.at_level(logging.WARNING, logger="fedrec"):
            list(messenger.iter_replies("probe", {n: RecordDict() for n in grid.ids},
                                        allow_missing=True))
    lines = [r.getMessage() for r in caplog.records]
    assert ("node 1003 (partition 2) is offline: the SuperLink reports it unavailable "
            "(its heartbeats stopped), in 'probe'") in lines
    assert any(line.startswith("node 1004 (partition 3) gave no reply in 'probe': no reply "
                               "within 0.3 s") for line in lines), lines
    assert not any("1001" in line or "1002" in line for line in lines)
