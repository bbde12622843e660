"""Did a deployed run succeed? Exit 0 only if it completed; for scripts and CI.

``flwr run`` exits 0 once the run is submitted (and, with ``--stream``, when the stream
ends), whether the ServerApp completed or failed. This command asks the SuperLink
(``flwr ls --run-id``) or reads the run's results file, and exits:

* ``0``: the run finished and completed (``finished:completed`` / results ``"status":
  "completed"``);
* ``1``: the run failed or was stopped (the reason is printed: the SuperLink's
  ``status-details``, or the results' ``error``, which names a lost node and why);
* ``2``: no answer: the run is not finished within ``--wait`` seconds, the run id is
  unknown, the results file is missing or unreadable, or ``flwr`` failed.

Usage::

    python -m deploy.run_status <run-id> [<connection>] [--wait SECONDS]
    python -m deploy.run_status <results-file.json> [--wait SECONDS]
    python -m deploy.run_status --submit <app-dir> [<connection>] [--run-config "k=v ..."]

``--submit`` runs ``flwr run <app-dir> [<connection>] --format json`` first and then waits
for that run (default ``--wait`` 3600 s). The ``flwr`` calls use the ``FLWR_HOME`` of the
environment (where the connection is defined), as ``flwr`` itself does.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

BIN = Path(sys.executable).parent

OK, FAILED, UNKNOWN = 0, 1, 2


def _flwr(*args: str, timeout: float = 120.0) -> dict[str, Any]:
    """``flwr <args> --format json`` as a dict; raises RuntimeError on failure."""
    exe = BIN / "flwr"
    cmd = [str(exe) if exe.exists() else "flwr", *args, "--format", "json"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    out = res.stdout
    try:
        payload = json.loads(out[out.index("{"):])
    except ValueError:
        raise RuntimeError(f"`{' '.join(cmd)}` gave no JSON (exit {res.returncode}): "
                           f"{(out + res.stderr).strip()[-1500:]}") from None
    if payload.get("success") is False:
        raise RuntimeError(f"`{' '.join(cmd)}` failed: {payload.get('error-message', out)}")
    return payload


def run_row(run_id: int, connection: str | None) -> dict[str, Any]:
    """The run's row of ``flwr ls --run-id`` (``status``, ``status-details``, ...)."""
    payload = _flwr("ls", *([connection] if connection else []), "--run-id", str(run_id))
    runs = payload.get("runs") or []
    if not runs:
        raise RuntimeError(f"the SuperLink knows no run {run_id}")
    return dict(runs[0])


def check_run(run_id: int, connection: str | None, wait: float, poll: float = 5.0
              ) -> tuple[int, str]:
    """(exit code, message) for a run id, waiting up to ``wait`` s for it to finish."""
    deadline = time.monotonic() + wait
    while True:
        try:
            row = run_row(run_id, connection)
        except (RuntimeError, subprocess.TimeoutExpired) as exc:
            return UNKNOWN, f"run {run_id}: {exc}"
        status = str(row.get("status", ""))
        if status.startswith("finished"):
            if status == "finished:completed":
                return OK, f"run {run_id}: {status}"
            return FAILED, f"run {run_id}: {status}: {row.get('status-details', '')}"
        if time.monotonic() >= deadline:
            return UNKNOWN, f"run {run_id}: still {status or 'unknown'} after {wait:g} s"
        time.sleep(poll)


def check_results(path: Path, wait: float, poll: float = 2.0) -> tuple[int, str]:
    """(exit code, message) for a results file (``fedrec/results.py``), waiting up to
    ``wait`` s for the ServerApp to write it."""
    deadline = time.monotonic() + wait
    while not path.is_file() and time.monotonic() < deadline:
        time.sleep(poll)
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return UNKNOWN, f"{path}: no results file (not written within {wait:g} s)"
    except (OSError, ValueError) as exc:
        return UNKNOWN, f"{path}: unreadable results file: {exc}"
    status = record.get("status", "completed")  # records before the field: completed
    if status == "completed":
        return OK, f"{path}: completed"
    return FAILED, f"{path}: {status}: {record.get('error', '(no error recorded)')}"


def submit(app: str, connection: str | None, run_config: str | None) -> int:
    """``flwr run`` and the new run's id."""
    args = ["run", app, *([connection] if connection else [])]
    if run_config:
        args += ["--run-config", run_config]
    payload = _flwr(*args, timeout=600.0)
    if not payload.get("run-id"):
        raise RuntimeError(f"flwr run did not start a run: {payload}")
    return int(payload["run-id"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m deploy.run_status",
        description="Exit 0 if a deployed run completed, 1 if it failed, 2 if unknown.")
    parser.add_argument("target", help="a run id, a results file (.json), or with --submit "
                                       "the app directory")
    parser.add_argument("connection", nargs="?", default=None,
                        help="SuperLink connection (default: the flwr config's default)")
    parser.add_argument("--wait", type=float, default=None,
                        help="seconds to wait for the run to finish (default 0; 3600 with "
                             "--submit)")
    parser.add_argument("--submit", action="store_true",
                        help="flwr run the app first, then wait for that run")
    parser.add_argument("--run-config", default=None, help="with --submit: flwr run's "
                                                           "--run-config")
    args = parser.parse_args(argv)
    wait = args.wait if args.wait is not None else (3600.0 if args.submit else 0.0)
    if args.submit:
        try:
            run_id = submit(args.target, args.connection, args.run_config)
        except (RuntimeError, subprocess.TimeoutExpired) as exc:
            print(f"flwr run: {exc}", file=sys.stderr)
            return UNKNOWN
        print(f"run {run_id} submitted", file=sys.stderr)
        code, message = check_run(run_id, args.connection, wait)
    elif args.target.isdigit():
        code, message = check_run(int(args.target), args.connection, wait)
    else:
        code, message = check_results(Path(args.target), wait)
    print(message, file=sys.stdout if code == OK else sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
