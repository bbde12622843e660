"""A deployment with a real item server, then a SuperNode killed mid-run.

Its own small deployment (a real SuperLink, three user SuperNodes and one SuperNode with node
config ``role="item-server"``, TLS and Flower's SuperNode authentication on, roster
identities; the SuperLink with ``--isolation process`` and ``--database`` and the ServerApp in
a separate ``flower-superexec``, as ``deploy/docker/compose.yml`` runs them), so that another test worker overlaps this file's waits with the protocol
matrix of ``tests/test_deployment.py``:

1. FedMVMF and PrivMVMF (``ITEM_SERVER_PROTOCOLS``) run side by side and must give the
   metrics of the same federation in one process (three user nodes and an item server by
   node config on ``tests.localgrid.LocalGrid``).
2. A FedMVMF run (SecAgg+ sums) loses user SuperNode 2 to SIGKILL in its second epoch: the
   run fails naming that node's partition and why (silent past the timeout, or unavailable
   per the SuperLink), its results file keeps the first epoch's history, and
   ``python -m deploy.run_status`` exits 1 for it; the ServerApp's log names the lost node and
   ``python -m deploy.node_status`` maps each node id to its holder, partition and role.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from deploy.local_deployment import DeploymentError, LocalDeployment  # noqa: E402
from tests.test_deployment import (  # noqa: E402
    _MVMF,
    ITEM_SERVER_PROTOCOLS,
    NODE_POLICY,
    NUM_NODES,
    REPLY_TIMEOUT_S,
    _config,
    assert_deployed_like_in_process,
    deployed_lines,
    line_params,
)

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None,
                                reason="openssl not found (needed to make TLS certificates)")

#: The item server: SuperNode NUM_NODES, partition -1 (``LocalDeployment(item_servers=1)``).
ITEM_SERVERS = 1


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalDeployment]:
    # the SuperLink and the ServerApp's SuperExec as deploy/docker/compose.yml runs them
    # (--isolation process with a shared secret, --database); tests/test_deployment.py's
    # deployment keeps Flower's default subprocess isolation and in-memory state
    with LocalDeployment(NUM_NODES, item_servers=ITEM_SERVERS,
                         workdir=tmp_path_factory.mktemp("deploy-kill"),
                         node_config=NODE_POLICY, isolation="process", database=True,
                         data=_config("fedmvmf", _MVMF, "data")) as dep:
        yield dep


def _count(path: Path, needle: str) -> int:
    return path.read_text(errors="replace").count(needle) if path.is_file() else 0


def _wait_for_new(path: Path, needle: str, seen: int, timeout: float) -> None:
    """Until ``needle`` occurs in ``path`` more often than the ``seen`` times before."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _count(path, needle) > seen:
            return
        time.sleep(0.5)
    raise AssertionError(f"no new {needle!r} in {path} within {timeout} s")


# ----------------------------------------------------------------------------- item server
@pytest.fixture(scope="module")
def item_server_runs(deployment: LocalDeployment
                     ) -> dict[str, dict[str, Any] | DeploymentError]:
    """Both ITEM_SERVER_PROTOCOLS lines, side by side on the deployment."""
    t0 = time.monotonic()
    runs = deployment.run_many(
        {p: _config(p, {**extra, "timeout": REPLY_TIMEOUT_S}, f"deployed-{p}")
         for p, extra, _ in deployed_lines(ITEM_SERVER_PROTOCOLS)}, timeout=900.0,
        max_concurrent=2)
    print(f"\n{len(runs)} item-server runs: {time.monotonic() - t0:.1f} s wall")
    return runs


def in_process_with_item_server(cfg: dict[str, Any]) -> dict[str, Any]:
    """The run on the deployment's federation in one process: NUM_NODES user nodes and one
    item server by node config (partition -1), the real ClientApp on LocalGrid."""
    from fl_app.client_app import build_client_app
    from fl_app.registry import client_module, resolve_config
    from fl_app.server_app import run_protocol
    from tests.localgrid import LocalGrid

    resolved = resolve_config(cfg)
    module = client_module(str(resolved["protocol"]))
    app = build_client_app([module] if module else [], policy=NODE_POLICY)
    configs = {i: {"num-partitions": NUM_NODES} for i in range(NUM_NODES)}
    configs[NUM_NODES] = {"role": "item-server", "partition-id": -1,
                          "num-partitions": NUM_NODES}
    with LocalGrid(app, NUM_NODES + ITEM_SERVERS, node_configs=configs) as grid:
        return run_protocol(grid, resolved)


@pytest.mark.timeout(1200)
@pytest.mark.parametrize(("protocol", "extra", "tol"), line_params(ITEM_SERVER_PROTOCOLS))
def test_deployed_item_server_run_equals_in_process_run(
        item_server_runs: dict[str, dict[str, Any] | DeploymentError], protocol: str,
        extra: dict[str, Any], tol: float) -> None:
    record = item_server_runs[protocol]
    if isinstance(record, DeploymentError):
        raise record
    assert "item-servers" not in extra  # the role comes from the node config
    assert any("(item server)" in label for label in record["privacy"]["node_policies"])
    sim = in_process_with_item_server(
        _config(protocol, {**extra, "timeout": REPLY_TIMEOUT_S}, f"simulated-{protocol}"))
    # every node, the item server too, signed with its roster identity
    assert_deployed_like_in_process(record, sim, NUM_NODES + ITEM_SERVERS, tol)


# ----------------------------------------------------------------------------- killed node
#: Server-side reply timeout for the killed-node run: long enough for a healthy node's
#: answer on a loaded 2-core machine, short enough to keep the test quick. The node dies in
#: the second epoch, before the SuperLink notices it (missed heartbeats: 2 x 30 s in flwr
#: 1.42.0), so the server's deadline is what names it.
KILL_TIMEOUT_S = 45.0
#: Epochs of the killed-node run: the node dies in the second, so one is in the history.
KILL_EPOCHS = 3


def _run_status(dep: LocalDeployment, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "deploy.run_status", *args],
                          capture_output=True, text=True, timeout=180, check=False,
                          cwd=str(REPO), env={**os.environ, "FLWR_HOME": str(dep.cli_home)})


@pytest.mark.timeout(300)
def test_killed_supernode_fails_the_run_naming_it(deployment: LocalDeployment) -> None:
    """A FedMVMF run with SecAgg+ sums; user SuperNode 2 (partition 2) is killed when its
    second epoch's training request arrives."""
    cfg = _config("fedmvmf", {**_MVMF, "rounds": KILL_EPOCHS, "timeout": KILL_TIMEOUT_S,
                              "startup-timeout": KILL_TIMEOUT_S}, "killed-node")
    dep = deployment
    log, needle = dep.nodes[2].log_path, "Receiving: query.mvmf_train"
    seen = _count(log, needle)
    results = dep.results_path(cfg)
    results.unlink(missing_ok=True)
    run_id = dep.submit(cfg)
    _wait_for_new(log, needle, seen, 180)  # epoch 1
    _wait_for_new(log, needle, seen + 1, 120)  # epoch 2
    dep.kill_node(2)
    killed = time.monotonic()
    with pytest.raises(DeploymentError) as err:
        dep.wait(run_id, timeout=KILL_TIMEOUT_S + 90, results_path=results)
    failed_after = time.monotonic() - killed
    text = str(err.value)
    assert "finished:failed" in text
    assert failed_after < KILL_TIMEOUT_S + 60

    # The results file: the error names the killed node and why, before anything a survivor
    # said; the first epoch's history and metrics are kept.
    record = json.loads(results.read_text(encoding="utf-8"))
    assert record["status"] == "failed"
    error = record["error"]
    reasons = ("silent past the timeout", "the SuperLink reports it unavailable")
    assert "(partition 2)" in error and any(r in error for r in reasons), error
    assert "refuses" not in error, error
    assert "(partition 2)" in text  # flwr ls status details / ServerApp log say it too
    # the node dies as its second epoch's request arrives: that sum is abandoned (or, had
    # it answered first, the next one), so the history has the epochs before, not all
    epochs = [row["epoch"] for row in record["history"]]
    assert epochs == list(range(1, len(epochs) + 1)) and 1 <= len(epochs) < KILL_EPOCHS
    assert record["metrics"]["loss"] == record["history"][-1]["loss"]

    # The documented check exits 1 for the failed run, by results file and by run id
    by_file = _run_status(dep, str(results))
    assert by_file.returncode == 1, by_file
    assert "(partition 2)" in by_file.stderr
    by_id = _run_status(dep, str(run_id), "fedrec-local")
    assert by_id.returncode == 1, by_id
    assert "finished:failed" in by_id.stderr and "(partition 2)" in by_id.stderr

    # The ServerApp logged the lost node when it noticed (the SuperLink logs nothing), and
    # deploy.node_status maps every node id of the run to the name its SuperNode-auth key
    # was registered under (LocalDeployment: supernode-<index>), its partition and role
    server_log = dep.flwr("log", str(run_id), "fedrec-local", "--show", timeout=60, check=False)
    assert re.search(r"node \d+ \(partition 2\) (is offline|gave no reply in)", server_log)
    status = subprocess.run(
        [sys.executable, "-m", "deploy.node_status", "fedrec-local", "--results", str(results),
         "--format", "json"], capture_output=True, text=True, timeout=180, check=False,
        cwd=str(REPO), env={**os.environ, "FLWR_HOME": str(dep.cli_home)})
    assert status.returncode == 0, status
    rows = {row["partition"]: row for row in json.loads(status.stdout)["nodes"]}
    assert {p: (r["holder"], r["role"]) for p, r in rows.items()} == {
        **{i: (f"supernode-{i}", "user") for i in range(NUM_NODES)},
        -1: (f"supernode-{NUM_NODES}", "item-server")}
