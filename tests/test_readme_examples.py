"""README.md's ``run_simulation.py`` command lines run as written.

Each command is taken from README.md itself (continuation lines joined, ``&&`` chains
split), so an edited example is tested as edited. ``--help`` runs as written; every other
command goes through everything ``run_simulation.py`` checks before Flower starts (its
parser, the keys its protocol reads, the node policy, and the simulation's pre-flight:
federation size, settings, roles, partitions, catalogue), on tiny synthetic data in place
of the command's dataset, so a refusal any of them would meet fails here in seconds.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
sys.path.insert(0, str(REPO))

#: The data the checks run on instead of the command's (real data need not be here).
TINY_DATA = {"dataset": "synthetic", "synthetic-users": 60, "synthetic-items": 40,
             "data-dir": ""}
#: README examples known to be refused, with why (a strict xfail each; none at present).
KNOWN_REFUSED: dict[str, str] = {}


def readme_commands() -> list[list[str]]:
    """The arguments of every ``run_simulation.py`` command in README.md's bash blocks."""
    text = README.read_text(encoding="utf-8")
    out = []
    for block in re.findall(r"^```bash\n(.*?)^```", text, flags=re.S | re.M):
        for line in re.sub(r"\\\n", " ", block).splitlines():
            for part in line.split("&&"):
                words = shlex.split(part, comments=True)
                if words and any(w.endswith("run_simulation.py") for w in words):
                    start = next(i for i, w in enumerate(words)
                                 if w.endswith("run_simulation.py"))
                    out.append(words[start + 1:])
    return out


def _param(args: list[str]) -> Any:
    text = " ".join(args)
    marks = [pytest.mark.xfail(strict=True, reason=KNOWN_REFUSED[text])] \
        if text in KNOWN_REFUSED else []
    return pytest.param(args, id=text or "(no arguments)", marks=marks)


def test_readme_has_run_simulation_examples() -> None:
    commands = readme_commands()
    assert [] in commands and ["--help"] in commands and len(commands) >= 4, commands


def test_the_help_example_runs_as_written() -> None:
    proc = subprocess.run([sys.executable, "run_simulation.py", "--help"], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "--protocol" in proc.stdout, proc.stderr


@pytest.mark.parametrize("args", [_param(a) for a in readme_commands() if a != ["--help"]])
def test_a_readme_example_passes_every_check_before_flower(args: list[str]) -> None:
    import run_simulation
    from clients.policy import NodePolicy
    from fedrec.config import parse_assignments
    from fl_app.registry import check_keys_read, resolve_config
    from fl_app.simulation import preflight

    ns = run_simulation.build_parser().parse_args(args)
    assigned = parse_assignments(ns.set)
    overrides = {"protocol": ns.protocol, "strategy": ns.strategy, "dataset": ns.dataset,
                 "partition": ns.partition, "rounds": ns.rounds, "seed": ns.seed,
                 **assigned}
    check_keys_read(assigned, resolve_config(overrides))
    policy = NodePolicy.coerce(parse_assignments(ns.node_policy, "--node-policy") or None)
    # a named dataset is replaced by tiny synthetic data (its files may be absent); the
    # embedded synthetic data the default commands use is checked as written
    data = {} if overrides["dataset"] in (None, "synthetic") else TINY_DATA
    preflight(resolve_config({**{k: v for k, v in overrides.items() if v is not None},
                              **data}), ns.nodes, policy)
