"""The project's shape as a contract: the layers (import-linter, pyproject.toml), no import
cycle, and a node process that loads no server code (docs/architecture.md)."""

from __future__ import annotations

import ast
import json
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


def _imports() -> dict[str, set[str]]:
    """Module -> project modules it imports, wherever the import statement is (module level,
    inside functions, under TYPE_CHECKING). Packages' ``__init__`` are not targets: importing
    ``pkg.mod`` is an edge to ``pkg.mod``."""
    paths = {".".join(p.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__"): p
             for pkg in PACKAGES for p in (REPO / pkg).rglob("*.py")}
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


def test_no_import_cycle_in_the_project() -> None:
    graph = _imports()
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for d in sorted(graph[m]):
            if state.get(d) == 1:
                cycle = stack[stack.index(d):] + [d]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if d not in state:
                visit(d)
        stack.pop()
        state[m] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module)
