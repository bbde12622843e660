"""Every benchmark script parses its command line: ``--help`` prints a usage and exits 0,
run as a user runs it (``python benchmarks/<name>.py``, from any folder).

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
import contextlib, io, runpy, sys

failed = []
base_path = list(sys.path)
for path in sys.argv[1:]:
    # as `python benchmarks/<name>.py --help` from another folder: the script's folder first
    # on the path, the repository only where the script puts it, and no `benchmarks` package
    # imported yet (Opacus installs a top-level package of that name)
    sys.path[:] = [str(__import__("pathlib").Path(path).parent)] + base_path
    for mod in [m for m in sys.modules if m == "benchmarks" or m.startswith("benchmarks.")]:
        del sys.modules[mod]
    sys.argv = [path, "--help"]
    out = io.StringIO()
    name = path.rsplit("/", 1)[-1]
    try:
        with contextlib.redirect_stdout(out):
            runpy.run_path(path, run_name="__main__")
    except SystemExit as stop:
        if stop.code not in (0, None) or "usage:" not in out.getvalue():
            failed.append(f"{name}: exit {stop.code!r}, output {out.getvalue()[:200]!r}")
    except Exception as err:  # the script or its parser failed
        failed.append(f"{name}: {type(err).__name__}: {err}")
    else:
        failed.append(f"{name}: --help returned instead of exiting")
print("\n".join(failed))
sys.exit(1 if failed else 0)
"""


def test_every_benchmark_prints_its_usage(tmp_path: Path) -> None:
    assert len(SCRIPTS) >= 15, SCRIPTS
    paths = [str(REPO / "benchmarks" / f"{name}.py") for name in SCRIPTS]
    done = subprocess.run([sys.executable, "-c", CHECK, *paths], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr[-2000:]}"


def _missing_imports(root: Path) -> list[str]:
    """``from benchmarks.X import name`` statements anywhere in ``root``'s scripts (inside
    functions too, which ``--help`` never runs) whose ``name`` module X does not bind at its
    top level: a name moved to another module leaves such an import broken until the line
    runs, hours into a benchmark or in a ``--markdown-only``."""
    import ast

    bound: dict[str, set[str]] = {}
    for path in root.glob("*.py"):
        names: set[str] = set()
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                names.update((a.asname or a.name).split(".")[0] for a in node.names)
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names.update(n.id for t in targets for n in ast.walk(t)
                             if isinstance(n, ast.Name))
        bound[path.stem] = names
    missing = []
    for path in sorted(root.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("benchmarks."):
                module = node.module.split(".", 1)[1]
                missing += [f"{path.name}:{node.lineno} {node.module}.{a.name}"
                            for a in node.names if module in bound
                            and a.name not in bound[module]]
    return missing


def test_every_benchmark_import_names_what_its_module_binds() -> None:
    assert _missing_imports(REPO / "benchmarks") == []


def test_the_import_check_sees_a_moved_name(tmp_path: Path) -> None:
    (tmp_path / "board.py").write_text("def cells():\n    return []\n")
    (tmp_path / "runner.py").write_text(
        "def main():\n    from benchmarks.board import cells, label\n    return cells, label\n")
    assert _missing_imports(tmp_path) == ["runner.py:2 benchmarks.board.label"]
