"""The main job as a new user runs it: README's first command, in a subprocess."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


#: Hang guards, not measurements: the main job takes about a minute on an idle 2-core
#: machine and several under load.
HANG_SECONDS = 840


@pytest.mark.timeout(HANG_SECONDS + 60)
def test_main_job_shows_federated_centralized_and_popularity(tmp_path: Path) -> None:
    marker = f"T44_MAIN_JOB_{uuid.uuid4().hex}"
    env = {**os.environ, "FEDREC_RESULTS": str(tmp_path / "results"),
           "FEDREC_CACHE": str(tmp_path / "cache"), "COLUMNS": "160", marker: "1"}
    proc = subprocess.run([sys.executable, "run_simulation.py"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=HANG_SECONDS)
    left = _processes_with_env(marker, "1")  # the command ends Ray's processes before exiting
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not left, f"processes of the run outlived it: {left}"
    out, err = proc.stdout, proc.stderr
    header = re.search(r"metric\s*┃\s*federated\s*┃\s*centralized\s*┃.*┃\s*popularity", out)
    assert header, out[-3000:]
    rows = [line for line in out.splitlines() if "ndcg@20" in line and "│" in line]
    numbers = [re.findall(r"\d+\.\d{3,4}", row) for row in rows]
    # a comparison row has federated, centralized, their ratio and popularity
    assert any(len(n) >= 4 for n in numbers), rows
    assert "secagg+ (masked)" in out  # the default run is private
    # both wall times, and after the tables why the same command gives other numbers
    assert re.search(r"federated run .*│\s*[\d.]+", out)
    assert re.search(r"centralized reference \(one process\)\s*│\s*[\d.]+", out)
    assert re.search(r"\nnote: not reproducible by seed: .*OS CSPRNG", out), out[-1500:]
    # progress a person can follow: the reference's start and end, PriviRec's phases
    for line in ("centralized reference: PriviRec.reference on all", "centralized reference "
                 "done in", "privirec: power round 1 of", "privirec: evaluation done in"):
        assert line in err, line
    for noise in ("deprecated", "DEPRECATED", "FutureWarning", "Manually terminating"):
        assert noise not in err and noise not in out, noise
    assert list((tmp_path / "results" / "runs").glob("*.json"))


@pytest.mark.timeout(HANG_SECONDS + 60)
def test_readme_flwr_run_block_works_as_written(tmp_path: Path) -> None:
    """README's `flwr run` block, run by bash from the repo root on a fresh FLWR_HOME."""
    text = (REPO / "README.md").read_text()
    block = re.search(r"<!-- flwr-run:begin.*?```bash\n(.*?)```", text, re.S)
    assert block, "README lost its flwr-run block"
    env = {**os.environ, "FLWR_HOME": str(tmp_path / "flwr-home"),
           "FEDREC_RESULTS": str(tmp_path / "results"), "FEDREC_CACHE": str(tmp_path / "cache")}
    env.pop("VIRTUAL_ENV", None)
    env["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep)
                                  if not p.startswith(str(REPO / ".venv")))
    stop = re.search(r"<!-- flwr-stop:begin.*?```bash\n(.*?)```", text, re.S)
    assert stop, "README lost the block that stops the local SuperLink"
    try:
        proc = subprocess.run(["bash", "-euc", block.group(1)], cwd=REPO, env=env,
                              capture_output=True, text=True, timeout=HANG_SECONDS)
        assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
        # what README says the block leaves behind, and its way to stop it
        assert (Path(env["FLWR_HOME"]) / "config.toml").is_file()
        assert _processes_with_env("FLWR_HOME", env["FLWR_HOME"]), "no SuperLink left?"
        subprocess.run(["bash", "-euc", stop.group(1)], cwd=REPO, env=env, timeout=30)
        deadline = time.monotonic() + 120  # a wait on state, bounded for a hang only
        while _processes_with_env("FLWR_HOME", env["FLWR_HOME"]) and \
                time.monotonic() < deadline:
            time.sleep(0.5)
        assert not _processes_with_env("FLWR_HOME", env["FLWR_HOME"]), \
            "README's stop command left processes of the run behind"
    finally:  # `flwr run` leaves its local SuperLink running, detached; its log file is
        # under this FLWR_HOME, so its command line names the folder
        _stop_processes_naming(env["FLWR_HOME"])
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    runs = [json.loads(p.read_text()) for p in (tmp_path / "results" / "runs").glob("*.json")]
    assert [r["status"] for r in runs] == ["completed"], out[-3000:]
    assert runs[0]["config"]["protocol"] == "fedmf" and "ndcg@20" in runs[0]["metrics"]
    assert "fedmf on synthetic" in out and "ndcg@20" in out, out[-3000:]


def _processes_with_env(name: str, value: str) -> list[int]:
    """Ids of the processes whose environment has ``name=value`` (every process a command
    started inherits it, detached or not)."""
    entry = f"{name}={value}".encode()
    found = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if entry in environ.read_bytes().split(b"\0"):
                found.append(int(environ.parent.name))
        except (OSError, ValueError):
            continue
    return found


def _stop_processes_naming(text: str) -> None:
    """SIGTERM every process whose command line contains ``text`` (Linux /proc)."""
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if text in cmdline.read_bytes().decode(errors="replace"):
                os.kill(int(cmdline.parent.name), signal.SIGTERM)
        except (OSError, ValueError):
            continue
