"""Deployment: a real SuperLink and real SuperNodes (processes on 127.0.0.1, TLS on).

Slow (about two minutes): every message starts a fresh ``flwr-clientapp`` process on each
SuperNode, and an idle SuperNode polls the SuperLink every 3 s (docs/deployment.md).
"""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from deploy.local_deployment import LocalDeployment, seconds_per_round  # noqa: E402

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None,
                                reason="openssl not found (needed to make TLS certificates)")

SMALL = {"protocol": "fedmf", "dataset": "synthetic", "rounds": 3, "synthetic-users": 60,
         "synthetic-items": 80, "mf-dim": 4}


@pytest.mark.timeout(300)
def test_deployed_fedmf_equals_simulation(tmp_path: Path) -> None:
    from fl_app.simulation import run_in_simulation

    t0 = time.monotonic()
    with LocalDeployment(3, workdir=tmp_path / "deploy") as dep:
        record = dep.run({**SMALL, "run-name": "deployed-fedmf"}, timeout=240)
    deployed_seconds = time.monotonic() - t0

    assert record["deployment"]["status"] == "finished:completed"
    assert record["deployment"]["tls"] is True
    assert record["num_nodes"] == 3
    assert Path(record["deployment"]["results_path"]).is_file()
    logs = Path(record["deployment"]["log_dir"])
    assert {p.name for p in logs.glob("*.log")} >= {
        "superlink.log", "supernode-0.log", "supernode-1.log", "supernode-2.log", "flwr-cli.log"}

    sim = run_in_simulation({**SMALL, "run-name": "simulated-fedmf"}, num_nodes=3, quiet=True)
    assert set(record["metrics"]) == set(sim["metrics"])
    for key, value in sim["metrics"].items():
        assert record["metrics"][key] == pytest.approx(value, abs=1e-9, rel=0), key

    per_round = seconds_per_round(record)
    print(f"\ndeployed: {deployed_seconds:.1f} s wall (start, run, stop); "
          f"{per_round['round']:.2f} s per FedMF round; phases "
          f"{ {k: round(v, 2) for k, v in per_round.items()} }")
    assert deployed_seconds < 240


def _wait_for(path: Path, needle: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.is_file() and needle in path.read_text(errors="replace"):
            return
        time.sleep(0.5)
    raise AssertionError(f"{needle!r} not seen in {path} within {timeout} s")


@pytest.mark.timeout(200)
def test_killed_supernode_fails_the_run_naming_it(tmp_path: Path) -> None:
    from deploy.local_deployment import DeploymentError

    cfg = {**SMALL, "rounds": 2, "timeout": 15.0, "run-name": "killed-node"}
    with LocalDeployment(3, workdir=tmp_path / "deploy") as dep:
        run_id = dep.submit(cfg)
        _wait_for(dep.nodes[2].log_path, "query.hello", 90)
        dep.kill_node(2)
        killed = time.monotonic()
        with pytest.raises(DeploymentError) as err:
            dep.wait(run_id, timeout=90)
        failed_after = time.monotonic() - killed
    text = str(err.value)
    assert "finished:failed" in text
    # The node is named by its label: "node <id> (partition 2)" once the handshake has
    # finished, "node <id>" if it died during the handshake itself.
    assert "1 of 3 node(s) did not answer" in text
    assert failed_after < 60
