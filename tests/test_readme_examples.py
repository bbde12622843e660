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
    from fl_app.plan import preflight
    from fl_app.registry import resolve_config

    ns = run_simulation.build_parser().parse_args(args)
    given = run_simulation.given_keys(ns)
    resolve_config(given)  # as the command resolves it: keys the protocol does not read fail
    policy = NodePolicy.coerce(parse_assignments(ns.node_policy, "--node-policy") or None)
    # a named dataset is replaced by tiny synthetic data (its files may be absent); the
    # embedded synthetic data the default commands use is checked as written
    data = {} if given["dataset"] == "synthetic" else TINY_DATA
    preflight(resolve_config({**given, **data}), ns.nodes, policy)


def own_data_block() -> list[str]:
    """The command lines of README.md's own-data block."""
    text = README.read_text(encoding="utf-8")
    block = re.search(r"<!-- own-data:begin.*?```bash\n(.*?)```", text, re.S)
    assert block, "README lost its own-data block"
    return [line for line in block.group(1).splitlines() if line.strip()]


def test_the_own_data_example_works_as_written(tmp_path: Path, monkeypatch) -> None:
    """From a folder holding the user's ``ratings.csv`` (MovieLens' own shape), the block's
    split line runs as written, and its run line passes every check before Flower on the
    split it wrote (the data is loaded: the sizes, ids and partitions are checked)."""
    import numpy as np

    import run_simulation
    from clients.policy import NodePolicy
    from fl_app.plan import preflight
    from fl_app.registry import resolve_config

    lines = own_data_block()
    assert 2 <= len(lines) <= 5, lines
    rng = np.random.default_rng(0)
    rows = {(int(u), int(i)) for u, i in zip(rng.integers(1, 121, 3000),
                                             rng.integers(1, 61, 3000))}
    (tmp_path / "ratings.csv").write_text(
        "userId,movieId,rating,timestamp\n" + "".join(
            f"{u},{i},{1 + (u * i) % 5},{978300000 + n}\n" for n, (u, i) in
            enumerate(sorted(rows))))
    (tmp_path / ".venv").symlink_to(REPO / ".venv")
    env = {k: v for k, v in __import__("os").environ.items() if k != "PYTHONPATH"}
    env |= {"PYTHONPATH": str(REPO), "FEDREC_CACHE": str(tmp_path / "cache")}
    runs = 0
    for line in lines:
        words = shlex.split(line, comments=True)
        if any(w.endswith("run_simulation.py") for w in words):
            ns = run_simulation.build_parser().parse_args(
                words[next(i for i, w in enumerate(words) if w.endswith("run_simulation.py"))
                      + 1:])
            monkeypatch.setenv("FEDREC_CACHE", str(tmp_path / "cache"))
            cfg = {"protocol": ns.protocol, "dataset": ns.dataset, "partition": ns.partition,
                   "rounds": ns.rounds, "seed": ns.seed,
                   "data-dir": str(tmp_path / ns.data_dir)}
            preflight(resolve_config({k: v for k, v in cfg.items() if v is not None}),
                      ns.nodes, NodePolicy.coerce(None))
            runs += 1
        else:  # as written, from the user's folder
            proc = subprocess.run(["bash", "-euc", line], cwd=tmp_path, env=env,
                                  capture_output=True, text=True, timeout=300)
            assert proc.returncode == 0, proc.stdout + proc.stderr
    assert runs == 1 and (tmp_path / "data" / "my-data" / "train.csv").is_file()


def test_the_main_module_says_its_default_protocol() -> None:
    """run_simulation.py's docstring names the protocol ``--help`` gives as the default."""
    import run_simulation

    action = next(a for a in run_simulation.build_parser()._actions
                  if "--protocol" in a.option_strings)
    names = {"privirec": "PriviRec", "fedmf": "FedMF"}
    default = action.default
    assert f"default protocol is {names.get(default, default)}" in \
        " ".join(run_simulation.__doc__.split())
    assert f"--protocol {default}" in run_simulation.__doc__
