"""The project's shape as a contract: the layers (import-linter, pyproject.toml), no import
cycle, and a node process that loads no server code (docs/architecture.md)."""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_the_layers_hold() -> None:
    """fl_app on top; strategies and clients beside each other; the core under them with its
    transport above the rest; the data at the bottom. A broken contract prints the import
    chain that breaks it. Run in a child process: import-linter configures logging with
    ``disable_existing_loggers``, which would silence the 'fedrec' logger for every later
    test in this worker."""
    probe = ("import sys\nfrom importlinter.cli import lint_imports\n"
             f"sys.exit(lint_imports(config_filename={str(REPO / 'pyproject.toml')!r}, "
             "no_cache=True, no_logo=True))")
    run = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True,
                         text=True)
    assert run.returncode == 0, run.stdout + run.stderr


#: What the ClientApp's import loads, measured in a fresh interpreter: our modules and the
#: Flower modules beyond those ``import flwr`` loads on its own (flwr's package ``__init__``
#: imports ``flwr.serverapp`` itself, so that much is Flower's, not ours).
_PROBE = """
import json, sys, time
import flwr
flower_own = set(sys.modules)
t = time.perf_counter()
import fl_app.client_app
seconds = time.perf_counter() - t
print(json.dumps({"seconds": seconds, "added": sorted(set(sys.modules) - flower_own)}))
"""


def test_the_client_app_loads_no_server_code() -> None:
    out = subprocess.run([sys.executable, "-c", _PROBE], cwd=REPO, check=True,
                         capture_output=True, text=True).stdout
    added = json.loads(out.splitlines()[-1])["added"]
    server = [m for m in added if m.startswith(("fedrec.transport", "strategies",
                                                 "fl_app.server_app", "fl_app.simulation",
                                                 "flwr.serverapp", "flwr.server",
                                                 "flwr.simulation", "ray"))]
    assert not server, f"importing the ClientApp loads server code: {server}"
    assert any(m.startswith("clients.") for m in added)  # the probe measured the real import


# -- cycles -------------------------------------------------------------------------------
PACKAGES = ("fl_app", "strategies", "clients", "fedrec", "datasets")


def _imports(root: Path = REPO, packages: tuple[str, ...] = PACKAGES) -> dict[str, set[str]]:
    """Module -> project modules it imports, wherever the import statement is (module level,
    inside functions, under TYPE_CHECKING): an import deferred into a function still makes a
    cycle, only a later one. Packages' ``__init__`` are not targets: importing ``pkg.mod``
    is an edge to ``pkg.mod``."""
    paths = {".".join(p.relative_to(root).with_suffix("").parts).removesuffix(".__init__"): p
             for pkg in packages for p in (root / pkg).rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for mod, path in paths.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join(parts + ([base] if base else []))
                names = [base] + [f"{base}.{a.name}" for a in node.names]
            for name in names:
                while name and name not in paths:
                    name = name.rpartition(".")[0]
                if name and name != mod and paths[name].name != "__init__.py":
                    deps.add(name)
        graph[mod] = deps
    return graph


def import_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """The first import cycle in ``graph`` (``[a, b, ..., a]``), or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for d in sorted(graph[m]):
            if state.get(d) == 1:
                return stack[stack.index(d):] + [d]
            if d not in state and (cycle := visit(d)) is not None:
                return cycle
        stack.pop()
        state[m] = 2
        return None

    for module in sorted(graph):
        if module not in state and (cycle := visit(module)) is not None:
            return cycle
    return None


def test_no_import_cycle_in_the_project() -> None:
    cycle = import_cycle(_imports())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_no_import_cycle_among_the_benchmarks() -> None:
    """benchmarks/ share the board's settings and report through modules below them
    (``benchmarks._board``, ``benchmarks._board_report``), not by importing each other back."""
    graph = _imports(REPO, ("benchmarks",))
    assert "benchmarks.leaderboard" in graph  # the check reads the real scripts
    cycle = import_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_the_cycle_check_sees_an_import_inside_a_function(tmp_path: Path) -> None:
    """Two scripts that import each other, one of them only inside a function, are a cycle."""
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "benchmarks" / "__init__.py").write_text("")
    (tmp_path / "benchmarks" / "a.py").write_text("from benchmarks.b import f\n")
    (tmp_path / "benchmarks" / "b.py").write_text(
        "def f():\n    from benchmarks import a\n    return a\n")
    (tmp_path / "benchmarks" / "c.py").write_text("from benchmarks import b\n")
    assert import_cycle(_imports(tmp_path, ("benchmarks",))) == [
        "benchmarks.a", "benchmarks.b", "benchmarks.a"]
    (tmp_path / "benchmarks" / "b.py").write_text("def f():\n    return 1\n")
    assert import_cycle(_imports(tmp_path, ("benchmarks",))) is None


# -- the core never loads the app, not even by name ------------------------------------------
#: A whole string that is an import path into a side: ``clients.x``, ``strategies.x:Class``.
_SIDE_PATH = re.compile(r"(strategies|clients)(\.[A-Za-z_]\w*)*(:[A-Za-z_]\w*)?")


def side_import_strings(tree: ast.AST) -> list[str]:
    """Strings in ``tree`` that name a module of strategies/ or clients/ as an import path
    (``importlib.import_module("clients.x")``, a table of ``"strategies.x:Class"``), whole
    or as the head of an f-string; prose that mentions a module is not an import path."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and _SIDE_PATH.fullmatch(node.value):
            found.append(node.value)
        elif isinstance(node, ast.JoinedStr) and node.values \
                and isinstance(node.values[0], ast.Constant) \
                and re.match(r"(strategies|clients)\.", str(node.values[0].value)):
            found.append(str(node.values[0].value))
    return found


def test_the_core_names_no_side_as_an_import_string() -> None:
    """import-linter sees only import statements: a core module that loads a side by name
    (``importlib.import_module("strategies.x")``) would pass it, so the strings are read too."""
    named = {str(p.relative_to(REPO)): side_import_strings(ast.parse(p.read_text()))
             for p in sorted((REPO / "fedrec").rglob("*.py"))}
    assert not {k: v for k, v in named.items() if v}, named


def test_the_string_check_sees_a_side_named_by_string() -> None:
    tree = ast.parse('import importlib\nTABLE = ("strategies.fedmf:FedMF", "clients.fedmf")\n'
                     'importlib.import_module(f"clients.{name}")\n'
                     '"""Nodes reply with clients.sums_node.sum_reply (prose)."""\n')
    assert side_import_strings(tree) == ["strategies.fedmf:FedMF", "clients.fedmf", "clients."]


def test_the_contracts_cover_a_new_core_module(tmp_path: Path) -> None:
    """A new fedrec/ module that imports a side, or the server-side transport, breaks the
    contracts without being listed in them: the linter runs on a copy of the project with
    two such modules added."""
    for pkg in PACKAGES:
        shutil.copytree(REPO / pkg, tmp_path / pkg,
                        ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    (tmp_path / "fedrec" / "probe_side.py").write_text("import strategies.base\n")
    (tmp_path / "fedrec" / "probe_transport.py").write_text(
        "from fedrec.transport import messenger\n")
    probe = ("import sys\nfrom importlinter.cli import lint_imports\n"
             "sys.exit(lint_imports(config_filename='pyproject.toml', no_cache=True, "
             "no_logo=True))")
    run = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True,
                         text=True, env={**os.environ, "PYTHONPATH": str(tmp_path)})
    out = run.stdout + run.stderr
    assert run.returncode != 0, out
    assert "fedrec.probe_side -> strategies.base" in out, out
    assert "fedrec.probe_transport -> fedrec.transport" in out, out
