"""Every benchmark script parses its command line: ``--help`` prints a usage and exits 0.

A benchmark runs for minutes to hours, so a mistake in its argument parser (a bare ``%`` in
a help text, a default of the wrong type) would otherwise show only when someone starts it.
The scripts run in one child process: importing them sets BLAS thread limits in the
environment, which must not leak into the other tests' processes.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = sorted(p.stem for p in (REPO / "benchmarks").glob("*.py") if not p.stem.startswith("_"))

CHECK = r"""
import contextlib, importlib, io, sys

failed = []
for name in sys.argv[1:]:
    module = importlib.import_module(f"benchmarks.{name}")
    sys.argv = [f"{name}.py", "--help"]
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            module.main()
    except SystemExit as stop:
        if stop.code not in (0, None) or "usage:" not in out.getvalue():
            failed.append(f"{name}: exit {stop.code!r}, output {out.getvalue()[:200]!r}")
    except Exception as err:  # the parser itself failed
        failed.append(f"{name}: {type(err).__name__}: {err}")
    else:
        failed.append(f"{name}: --help returned instead of exiting")
print("\n".join(failed))
sys.exit(1 if failed else 0)
"""


def test_every_benchmark_prints_its_usage() -> None:
    assert len(SCRIPTS) >= 15, SCRIPTS
    done = subprocess.run([sys.executable, "-c", CHECK, *SCRIPTS], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr[-2000:]}"
