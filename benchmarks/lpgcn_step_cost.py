"""LP-GCN: where a federated training step's seconds and bytes go, against centralized
LightGCN at the same run config (issue 44), before and after a change, in one run.

For each dataset the leaderboard's LP-GCN run config (``benchmarks/_board.py``: LightGCN,
L = 3, d = 20, batch 2048, float64, the default cover; plain sums, which no training
step uses) runs ``--steps``
training steps on the in-process Flower grid of the tests (``tests/localgrid.py``: the
project's ClientApp and ServerApp, real Flower messages, nodes one after another, no Ray),
and the centralized reference (``LPGCN.reference_model``) trains one whole epoch. Reported:

- seconds per step (the mean over the steps after the first, which also uploads the initial
  rows) both ways, their ratio, and per epoch (federated: per step x steps per epoch);
- where the federated seconds go: every function of the step's path is wrapped by a clock
  that charges each call's own time (its time less that of wrapped calls inside it) to one
  phase (:data:`PHASES`), so the phases are disjoint and add up to the measured step;
- bytes per node per step: the ledger's total (what Flower carries), the arrays by part
  (``fedrec/wire/lpgcn.py``), the sealed mail and the rest (Flower's framing, configs);
- with ``--simulation-steps N``: the same config through a Flower simulation (Ray nodes),
  whose extra seconds per step are Flower's simulation overhead, reported apart.

``--baseline REV`` measures the tree of git revision REV first (``git archive`` into a
temporary folder; this script imports that tree's modules there) and then the working tree,
in the same run and machine, as ``before`` and ``after``.

    python benchmarks/lpgcn_step_cost.py --datasets ml-100k ml-1m --baseline 61c0586
    python benchmarks/lpgcn_step_cost.py --markdown-only
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parents[1]
OUT = HERE / "results" / "lpgcn" / "step_cost.json"
NODES = 8

#: (module, object path, phase): each wrapped function's own time goes to its phase. Names
#: missing in a measured tree are skipped (a baseline may lack a later helper).
PHASES: tuple[tuple[str, str, str], ...] = (
    ("strategies.lpgcn", "_Run.step", "server: routing, sums (strategy)"),
    ("fedrec.transport.messenger", "Messenger.send", "server: Flower messages, transport"),
    ("fedrec.transport.messenger", "messages_nbytes", "server: byte ledger (measurement)"),
    ("fedrec.transport.messenger", "message_nbytes", "server: byte ledger (measurement)"),
    ("tests.localgrid", "LocalGrid._process", "node: Flower ClientApp, request checks"),
    ("clients.lpgcn", "lpgcn_round", "node: round handler (rest)"),
    ("clients.lpgcn", "_hp", "node: request checks (policy, sizes)"),
    ("clients.lpgcn", "Session.__init__", "node: per-request setup"),
    ("clients.lpgcn", "StateArrays.__getitem__", "node: state load"),
    ("clients.lpgcn", "StateArrays.__setitem__", "node: state save"),
    ("clients.lpgcn", "StateArrays.__delitem__", "node: state save"),
    ("clients.lpgcn", "Session.save", "node: state save"),
    ("clients.node", "NodeContext.load_state", "node: state load"),
    ("clients.node", "NodeContext.save_state", "node: state save"),
    ("clients.lpgcn", "to_array_record", "node: (de)serialization"),
    ("clients.lpgcn", "reply_arrays", "node: (de)serialization"),
    ("clients.lpgcn", "pack", "node: (de)serialization"),
    ("clients.lpgcn", "unpack", "node: (de)serialization"),
    ("clients.sealed_node", "Mailbox.send", "node: sealed relay (seal, open)"),
    ("clients.sealed_node", "Mailbox.receive", "node: sealed relay (seal, open)"),
    ("clients.sealed_node", "Mailbox._absorb_mail", "node: sealed relay (seal, open)"),
    ("clients.sealed_node", "Mailbox.attach", "node: sealed relay (seal, open)"),
    ("clients.lpgcn", "Session.triples", "node: triples"),
    ("clients.lpgcn", "Session.begin", "node: triples"),
    ("clients.lpgcn", "Session.absorb", "node: delivery checks"),
    ("clients.lpgcn", "Session.absorb_degrees", "node: delivery checks"),
    ("clients.lpgcn", "Session.rule_users", "node: forward math"),
    ("clients.lpgcn", "Session.rule_mail", "node: forward math"),
    ("clients.lpgcn", "Session.mail_items", "node: forward math"),
    ("clients.lpgcn", "Session.rule_conv", "node: forward math"),
    ("clients.lpgcn", "Session.gather", "node: forward math"),
    ("clients.lpgcn", "Session.rule_loss", "node: loss"),
    ("clients.lpgcn", "Session.rule_backward", "node: backward math"),
    ("clients.lpgcn", "Session.masked", "node: backward math"),
    ("clients.lpgcn", "Session.cover", "node: covers (keyed AES-CTR normals)"),
    ("clients.lpgcn", "Session.step_param", "node: Adam"),
    ("clients.lpgcn", "Session.finish", "node: Adam"),
)


class PhaseClock:
    """Own CPU time of wrapped calls per (protocol phase, phase of :data:`PHASES`): this
    process's CPU seconds, which other processes on a shared machine disturb far less than
    wall-clock seconds."""

    def __init__(self) -> None:
        self.seconds: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        self.protocol_phase = "other"
        self._stack: list[float] = []
        self._undo: list[tuple[Any, str, Any]] = []

    def wrap(self, owner: Any, attr: str, phase: str) -> None:
        fn = owner.__dict__.get(attr) if isinstance(owner, type) else getattr(owner, attr, None)
        if fn is None:
            return
        clock = self

        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.process_time()
            clock._stack.append(0.0)
            try:
                return fn(*args, **kwargs)
            finally:
                total = time.process_time() - t0
                inner = clock._stack.pop()
                clock.seconds[clock.protocol_phase][phase] += total - inner
                if clock._stack:
                    clock._stack[-1] += total

        self._undo.append((owner, attr, fn))
        setattr(owner, attr, timed)

    @contextmanager
    def installed(self) -> Iterator[PhaseClock]:
        import importlib

        for module, path, phase in PHASES:
            try:
                owner: Any = importlib.import_module(module)
            except ImportError:
                continue
            *parents, attr = path.split(".")
            for name in parents:
                owner = getattr(owner, name, None)
            if owner is not None:
                self.wrap(owner, attr, phase)
        try:
            yield self
        finally:
            for owner, attr, fn in reversed(self._undo):
                setattr(owner, attr, fn)
            self._undo.clear()


def _part(name: str) -> str:
    """The wire part of an array name (``e2`` -> ``e``), or the name itself."""
    return name.rstrip("0123456789") or name


#: Plain sums: a training step uses no sum (only the interaction count, the evaluation and the
#: losses do), so the aggregator changes no step's cost; the nodes opt in to plain sums.
AGGREGATOR, POLICY = "plain", {"allow-plain": True}


def run_config(dataset: str, steps: int, name: str) -> dict[str, Any]:
    """The board's LP-GCN cell config on ``dataset`` for ``steps`` steps, plain sums, as a
    run is started with (the keys it names; resolved once where the run starts)."""
    from benchmarks._board import cells

    (cell,) = cells([dataset], ["lpgcn"])
    return {**cell.config, "lpgcn-steps": steps, "lpgcn-eval-every": 0,
            "aggregator": AGGREGATOR, "run-name": f"{name}-{dataset}"}


def federated(dataset: str, steps: int) -> dict[str, Any]:
    """``steps`` training steps of the board's LP-GCN config on the in-process grid, timed
    and counted per phase and part."""
    import numpy as np

    import strategies.lpgcn as strategy
    from fl_app.client_app import build_client_app
    from fl_app.registry import resolve_config
    from fl_app.server_app import run_protocol
    from tests.localgrid import LocalGrid

    cfg = run_config(dataset, steps, "bench-lpgcn-step-cost")
    resolved = resolve_config(cfg)
    clock = PhaseClock()
    step_seconds: list[float] = []
    step_cpu: list[float] = []
    parts: dict[str, dict[str, float]] = {"down": defaultdict(float), "up": defaultdict(float)}
    counting = {"on": False}
    state_bytes: list[float] = []  # per train round: the nodes' mean state size
    step_fn, send_fn = strategy._Run.step, strategy._Run.send

    def step(run: Any, s: int, train: bool, *args: Any) -> Any:
        counting["on"] = train and s > run.s.start_step  # steps after the first
        t0, c0 = time.perf_counter(), time.process_time()
        out = step_fn(run, s, train, *args)
        if counting["on"]:
            step_seconds.append(time.perf_counter() - t0)
            step_cpu.append(time.process_time() - c0)
        counting["on"] = False
        return out

    def send(run: Any, action: str, contents: dict[int, Any], phase: str) -> Any:
        clock.protocol_phase = phase if counting["on"] else "other"
        replies = send_fn(run, action, contents, phase)
        if counting["on"]:
            for side, msgs in (("down", contents), ("up", replies)):
                for content in msgs.values():
                    if "arrays" in content.array_records:  # sizes only: no copy
                        for k, v in content["arrays"].items():
                            parts[side][_part(k)] += np.prod(v.shape) * np.dtype(v.dtype).itemsize
            state_bytes.append(float(np.mean([_state_bytes(c.state)
                                              for c in grid.contexts.values()])))
        clock.protocol_phase = "other"
        return replies

    grid = LocalGrid(build_client_app(policy=POLICY), NODES, data=cfg)
    strategy._Run.step, strategy._Run.send = step, send
    try:
        load_before = os.getloadavg()[0]
        with grid, clock.installed():
            t0 = time.perf_counter()
            record = run_protocol(grid, resolved)
            wall = time.perf_counter() - t0
    finally:
        strategy._Run.step, strategy._Run.send = step_fn, send_fn
    train = record["communication"]["phases"]["lpgcn-train"]
    n_steps = len(record["extra"]["rounds_per_step"])
    mail = {k: v["bytes"] for k, v in record["privacy"].get("sealed_mail", {}).items()
            if k.startswith("lpgcn-")}
    per_node_step = 1.0 / (NODES * max(len(step_seconds), 1))
    phase_s = {k: v / len(step_seconds) for k, v in clock.seconds["lpgcn-train"].items()}
    return {"steps": n_steps, "nodes": NODES, "wall_seconds": wall,
            "load_average": [load_before, os.getloadavg()[0]],
            "seconds_per_step": float(np.median(step_seconds)),
            "cpu_seconds_per_step": float(np.median(step_cpu)),
            "seconds_per_step_all": step_seconds, "cpu_seconds_per_step_all": step_cpu,
            "phase_seconds_per_step": dict(sorted(phase_s.items(), key=lambda kv: -kv[1])),
            "rounds_per_step": record["extra"]["rounds_per_step"],
            "nbatches": record["extra"]["nbatches"],
            "ledger_bytes_per_node_per_step":
                (train["bytes_up"] + train["bytes_down"]) / n_steps / NODES,
            "array_bytes_per_node_per_step": {
                side: {p: b * per_node_step for p, b in sorted(v.items())}
                for side, v in parts.items()},
            "sealed_mail_bytes_run": mail,
            "node_state_bytes": {"mean": float(np.mean(state_bytes)),
                                 "max": float(np.max(state_bytes))},
            "config": {k: v for k, v in resolved.items()
                       if k.startswith("lpgcn-") or k in cfg and k != "run-name"}}


def _state_bytes(state: Any) -> int:
    """Bytes of the arrays a node keeps between messages (what a Flower simulation ships to
    a Ray worker and back with every message, and a deployed ClientApp process loads)."""
    from flwr.app import ArrayRecord

    return sum(len(a.data) for r in state.values() if isinstance(r, ArrayRecord)
               for a in r.values())


def centralized(dataset: str) -> dict[str, Any]:
    """One whole epoch of the centralized reference at the same config."""
    from benchmarks._board import board_config, board_data
    from strategies.lpgcn import LPGCN

    cfg = board_config(dataset)
    data = board_data(cfg)
    model = LPGCN(cfg).reference_model(data.train)
    t0, c0 = time.perf_counter(), time.process_time()
    model.fit(model.nbatches)
    epoch, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {"epoch_seconds": epoch, "seconds_per_step": epoch / model.nbatches,
            "epoch_cpu_seconds": cpu, "cpu_seconds_per_step": cpu / model.nbatches,
            "threads": model.A.threads,
            "nbatches": model.nbatches, "shape": list(data.train.shape),
            "train_interactions": int(data.train.nnz)}


def simulation(dataset: str, steps: int) -> dict[str, Any]:
    """The same config through a Flower simulation (Ray nodes): seconds per step."""
    from fl_app.simulation import run_in_simulation

    cfg = run_config(dataset, steps, "bench-lpgcn-step-cost-sim")
    t0 = time.perf_counter()
    record = run_in_simulation(cfg, NODES, quiet=True, overwrite=True, node_policy=POLICY)
    train = record["communication"]["phases"]["lpgcn-train"]
    return {"steps": steps, "wall_seconds": time.perf_counter() - t0,
            "seconds_per_step": train["seconds"] / steps,
            "rounds_per_step": train["rounds"] / steps}


def measure_tree(datasets: list[str], steps: int, sim_steps: int) -> dict[str, Any]:
    """Every measurement of this process's tree."""
    import flwr

    out: dict[str, Any] = {"flwr_version": flwr.__version__}
    for ds in datasets:
        print(f"[{time.strftime('%H:%M:%S')}] {ds}: federated, {steps} steps", flush=True)
        fed = federated(ds, steps)
        print(f"[{time.strftime('%H:%M:%S')}] {ds}: centralized epoch", flush=True)
        cen = centralized(ds)
        unit = {"federated": fed, "centralized": cen}
        if sim_steps:
            print(f"[{time.strftime('%H:%M:%S')}] {ds}: Flower simulation, {sim_steps} steps",
                  flush=True)
            try:  # Ray may fail to start on an overloaded machine: the rest still counts
                unit["simulation"] = simulation(ds, sim_steps)
            except Exception as exc:  # noqa: BLE001
                unit["simulation_error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
        out[ds] = unit
    return out


def measure_in(tree: Path, args: argparse.Namespace) -> dict[str, Any]:
    """:func:`measure_tree` in a fresh process importing ``tree`` (no cache of an earlier
    measurement carries over)."""
    with tempfile.TemporaryDirectory() as tmp:
        got = Path(tmp) / "measured.json"
        cmd = [sys.executable, str(Path(__file__).resolve()), "--tree", str(tree),
               "--measure-only", str(got), "--datasets", *args.datasets,
               "--steps", str(args.steps), "--simulation-steps", str(args.simulation_steps)]
        # a copied tree's default data location (../shared/data beside it) is this one's
        env = {**os.environ, "FEDREC_DATA": os.environ.get("FEDREC_DATA")
               or str(HERE.parent / "shared" / "data")}
        subprocess.run(cmd, check=True, cwd=tree, env=env)
        return json.loads(got.read_text())


def measure_revision(rev: str, args: argparse.Namespace) -> dict[str, Any]:
    """:func:`measure_tree` of git revision ``rev`` (its files from ``git archive``)."""
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "tree"
        tree.mkdir()
        archive = subprocess.run(["git", "-C", str(HERE), "archive", rev], check=True,
                                 capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
        return measure_in(tree, args)


def fastest(runs: list[dict[str, Any]], datasets: list[str]) -> dict[str, Any]:
    """Per dataset, each unit from the repeat where it ran fastest (the least disturbed by
    other processes on a shared machine), with every repeat's seconds per step kept."""
    out: dict[str, Any] = {"flwr_version": runs[0]["flwr_version"]}
    for ds in datasets:
        units = [r[ds] for r in runs]
        best = {"federated": min((u["federated"] for u in units),
                                 key=lambda f: f["cpu_seconds_per_step"]),
                "centralized": min((u["centralized"] for u in units),
                                   key=lambda c: c["epoch_cpu_seconds"])}
        best["federated"]["repeats_cpu_seconds_per_step"] = [
            u["federated"]["cpu_seconds_per_step"] for u in units]
        best["centralized"]["repeats_epoch_cpu_seconds"] = [
            u["centralized"]["epoch_cpu_seconds"] for u in units]
        if all("simulation" in u for u in units):
            best["simulation"] = min((u["simulation"] for u in units),
                                     key=lambda m: m["seconds_per_step"])
            best["simulation"]["repeats_seconds_per_step"] = [
                u["simulation"]["seconds_per_step"] for u in units]
        out[ds] = best
    return out


# -- report ----------------------------------------------------------------------------------
def _ratios(unit: dict[str, Any]) -> dict[str, float]:
    """CPU seconds (the headline on a shared machine) and wall seconds, both ways."""
    fed, cen = unit["federated"], unit["centralized"]
    return {"fed_s_per_step": fed["cpu_seconds_per_step"],
            "cen_s_per_step": cen["cpu_seconds_per_step"],
            "ratio": fed["cpu_seconds_per_step"] / cen["cpu_seconds_per_step"],
            "fed_epoch_s": fed["cpu_seconds_per_step"] * cen["nbatches"],
            "cen_epoch_s": cen["epoch_cpu_seconds"],
            "wall_ratio": fed["seconds_per_step"] / cen["seconds_per_step"],
            "fed_wall": fed["seconds_per_step"], "cen_wall": cen["seconds_per_step"],
            "mb_per_node_step": fed["ledger_bytes_per_node_per_step"] / 1e6}


def markdown(result: dict[str, Any]) -> str:
    sides = [s for s in ("before", "after") if s in result]
    lines = ["# LP-GCN: the cost of a federated training step against centralized LightGCN",
             "", f"The leaderboard's LP-GCN config ({_config_line(result)}), {NODES} nodes on "
             "the in-process Flower grid (nodes one after another, no Ray), "
             f"{result['steps']} federated steps (seconds: the median of the steps after the "
             "first); centralized: one whole epoch of the reference at the same config. Per "
             "epoch federated = seconds per step x steps per epoch. "
             + (f"Each side measured {result['repeats']} times, alternating, each number "
                "from its fastest repeat (the machine is shared). "
                if result.get("repeats", 1) > 1 else "")
             + (f"`before`: revision {result['baseline']}; `after`: the working tree at "
                f"{result.get('revision', '?')}, both measured in this run." if len(sides) > 1
                else ""), "",
             "CPU seconds are this process's (the federation's nodes and server, one after "
             "another, against the centralized model on its "
             f"{result[sides[0]][result['datasets'][0]]['centralized'].get('threads', '?')} "
             "threads): another process on the machine changes them far less than wall "
             "seconds, which are shown beside them. Load average (1 min) while measuring: "
             + ", ".join(f"{s} {min(v)}-{max(v)}" for s, v in _loads(result, sides).items())
             + ".", "",
             "| dataset | side | CPU s/step fed | CPU s/step cen | CPU ratio | CPU epoch fed "
             "| CPU epoch cen | wall s/step fed / cen (ratio) | MB per node per step | "
             "node state MB | rounds/step |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for ds in result["datasets"]:
        for side in sides:
            unit = result[side][ds]
            r = _ratios(unit)
            lines.append(f"| {ds} | {side} | {r['fed_s_per_step']:.3f} | "
                         f"{r['cen_s_per_step']:.4f} | {r['ratio']:.1f}x | "
                         f"{r['fed_epoch_s']:.0f} s | {r['cen_epoch_s']:.1f} s | "
                         f"{r['fed_wall']:.3f} / {r['cen_wall']:.4f} ({r['wall_ratio']:.1f}x) | "
                         f"{r['mb_per_node_step']:.2f} | "
                         f"{unit['federated']['node_state_bytes']['mean'] / 1e6:.2f} | "
                         f"{max(unit['federated']['rounds_per_step'])} |")
    for ds in result["datasets"]:
        lines += ["", f"## {ds}: where a federated step's seconds go", "",
                  "Own CPU time of each phase per step (the steps after the first, as seconds "
                  "per step; an epoch's triples are drawn at its first step, so they are "
                  "left out with it), in seconds and as a share of their sum."]
        phases: list[str] = []
        for side in sides:
            for p in result[side][ds]["federated"]["phase_seconds_per_step"]:
                if p not in phases:
                    phases.append(p)
        lines += ["", "| phase | " + " | ".join(sides) + " |", "|---|" + "---|" * len(sides)]
        totals = {s: sum(result[s][ds]["federated"]["phase_seconds_per_step"].values())
                  for s in sides}
        for p in phases:
            cells = []
            for s in sides:
                v = result[s][ds]["federated"]["phase_seconds_per_step"].get(p, 0.0)
                cells.append(f"{v:.3f} ({100 * v / totals[s]:.0f}%)")
            lines.append(f"| {p} | " + " | ".join(cells) + " |")
        lines.append("| sum | " + " | ".join(f"{totals[s]:.3f}" for s in sides) + " |")
        lines += ["", f"## {ds}: bytes per node per step", "",
                  "| what | " + " | ".join(sides) + " |", "|---|" + "---|" * len(sides)]
        for name, get in _byte_rows(result, sides, ds):
            lines.append(f"| {name} | " + " | ".join(
                f"{get(result[s][ds]) / 1e6:.3f} MB" for s in sides) + " |")
        if all("simulation" in result[s][ds] for s in sides):
            lines += ["", "Flower simulation (Ray nodes, same config; wall seconds, the nodes "
                      "being other processes): "
                      + "; ".join(f"{s} {result[s][ds]['simulation']['seconds_per_step']:.2f} s "
                                  "per step ("
                                  f"{_sim_overhead(result[s][ds]):+.2f} s against the "
                                  "in-process grid's wall seconds)" for s in sides) + "."]
    lines += ["", "## Reading", ""] + _interpretation(result, sides)
    lines += ["", f"Command: `{result['command']}`", f"Machine: {result['machine']}.", ""]
    return "\n".join(lines)


def _config_line(result: dict[str, Any]) -> str:
    side = "after" if "after" in result else "before"
    cfg = result[side][result["datasets"][0]]["federated"]["config"]
    keys = ("lpgcn-backbone", "lpgcn-layers", "lpgcn-dim", "lpgcn-batch-size", "lpgcn-dtype",
            "aggregator", "lpgcn-holdings", "lpgcn-mask-scale")
    return ", ".join(f"{k} {cfg.get(k)}" for k in keys)


def _loads(result: dict[str, Any], sides: list[str]) -> dict[str, list[float]]:
    """Each side's load averages recorded while measuring."""
    return {s: [round(x, 1) for ds in result["datasets"]
                for x in result[s][ds]["federated"].get("load_average", [])] or ["?"]
            for s in sides}


def _sim_overhead(unit: dict[str, Any]) -> float:
    return unit["simulation"]["seconds_per_step"] - unit["federated"]["seconds_per_step"]


def _byte_rows(result: dict[str, Any], sides: list[str],
               ds: str) -> list[tuple[str, Callable[[dict[str, Any]], float]]]:
    """Rows of the bytes table: the ledger's total, then arrays by direction and part."""
    names = {"e": "item rows", "g": "item-gradient partials / sums", "gn": "negatives' "
             "gradients", "neg": "negatives' rows", "negreq": "negative requests", "w": "W rows"}
    rows: list[tuple[str, Callable[[dict[str, Any]], float]]] = [
        ("Flower messages (ledger total, up + down)",
         lambda u: u["federated"]["ledger_bytes_per_node_per_step"])]
    for direction in ("down", "up"):
        seen: list[str] = []
        for s in sides:
            for p in result[s][ds]["federated"]["array_bytes_per_node_per_step"][direction]:
                if p not in seen:
                    seen.append(p)
        for p in seen:
            rows.append((f"arrays {direction}: {names.get(p, p)} (`{p}`)",
                         lambda u, d=direction, p=p:
                         u["federated"]["array_bytes_per_node_per_step"][d].get(p, 0.0)))
    rows.append(("the rest: sealed mail (shares), configs, Flower framing",
                 lambda u: u["federated"]["ledger_bytes_per_node_per_step"] - sum(
                     sum(v.values()) for v in
                     u["federated"]["array_bytes_per_node_per_step"].values())))
    rows.append(("not sent: the node state kept between rounds (mean over nodes and rounds; "
                 "a Flower simulation ships it to a Ray worker and back with every message)",
                 lambda u: u["federated"]["node_state_bytes"]["mean"]))
    return rows


def _interpretation(result: dict[str, Any], sides: list[str]) -> list[str]:
    """Sentences computed from the numbers."""
    out = []
    for ds in result["datasets"]:
        for s in sides:
            fed = result[s][ds]["federated"]
            ph = fed["phase_seconds_per_step"]
            total = sum(ph.values())
            top = sorted(ph.items(), key=lambda kv: -kv[1])[:3]
            node = sum(v for k, v in ph.items() if k.startswith("node:"))
            out.append(f"- {ds}, {s}: {_ratios(result[s][ds])['ratio']:.1f}x centralized CPU "
                       f"seconds per step; the nodes' own work is {100 * node / total:.0f}% of "
                       "the step "
                       "(the grid runs them one after another), the three largest phases "
                       + ", ".join(f"{k} {100 * v / total:.0f}%" for k, v in top) + ".")
        if len(sides) == 2:
            b, a = (_ratios(result[s][ds]) for s in sides)
            out.append(f"- {ds}: CPU seconds per step {b['fed_s_per_step']:.3f} -> "
                       f"{a['fed_s_per_step']:.3f} (before / after "
                       f"{b['fed_s_per_step'] / a['fed_s_per_step']:.2f}), ratio to centralized "
                       f"{b['ratio']:.1f}x -> {a['ratio']:.1f}x, "
                       f"bytes per node per step {b['mb_per_node_step']:.2f} -> "
                       f"{a['mb_per_node_step']:.2f} MB.")
    return out


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sides = [s for s in ("before", "after") if s in result]
    datasets = result["datasets"]
    phases = sorted({p for s in sides for ds in datasets
                     for p in result[s][ds]["federated"]["phase_seconds_per_step"]})
    fig, axes = plt.subplots(1, 2, figsize=(14, 5.5))
    labels = [f"{ds}\n{s}" for ds in datasets for s in sides]
    bottom = [0.0] * len(labels)
    cmap = plt.get_cmap("tab20")
    for k, p in enumerate(phases):
        vals = [result[s][ds]["federated"]["phase_seconds_per_step"].get(p, 0.0)
                for ds in datasets for s in sides]
        axes[0].bar(labels, vals, bottom=bottom, label=p, color=cmap(k % 20))
        bottom = [b + v for b, v in zip(bottom, vals)]
    axes[0].set_ylabel("CPU seconds per federated step (own time per phase)")
    axes[0].legend(fontsize=7, loc="upper left")
    ratio = [_ratios(result[s][ds])["ratio"] for ds in datasets for s in sides]
    mb = [_ratios(result[s][ds])["mb_per_node_step"] for ds in datasets for s in sides]
    axes[1].bar(labels, ratio, color="tab:blue")
    axes[1].set_ylabel("federated / centralized CPU seconds per step", color="tab:blue")
    twin = axes[1].twinx()
    twin.plot(labels, mb, "o", color="tab:red")
    twin.set_ylabel("MB per node per step", color="tab:red")
    twin.set_ylim(0, max(mb) * 1.2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--datasets", nargs="+", default=["ml-100k", "ml-1m"])
    ap.add_argument("--steps", type=int, default=6, help="federated steps (the first is "
                    "left out of seconds per step)")
    ap.add_argument("--simulation-steps", type=int, default=0)
    ap.add_argument("--baseline", default="", help="git revision measured as 'before'")
    ap.add_argument("--repeats", type=int, default=1, help="measure each side this many "
                    "times, alternating; each unit is reported from its fastest repeat")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--markdown-only", action="store_true")
    ap.add_argument("--tree", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--measure-only", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    tree = args.tree or HERE
    sys.path.insert(0, str(tree))  # first: Opacus installs a top-level package named benchmarks
    from benchmarks._report import machine_info, rewrite_markdown, write_report

    if args.markdown_only:
        rewrite_markdown(args.out, markdown, plot)
        return
    if args.measure_only:
        args.measure_only.write_text(json.dumps(
            measure_tree(args.datasets, args.steps, args.simulation_steps), default=float))
        return
    result: dict[str, Any] = {"datasets": args.datasets, "steps": args.steps,
                              "command": "python benchmarks/lpgcn_step_cost.py "
                              + " ".join(argv if argv is not None else sys.argv[1:])}
    revision = subprocess.run(["git", "-C", str(HERE), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", str(HERE), "status", "--porcelain", "--",
                            "clients/lpgcn.py", "strategies/lpgcn.py", "fedrec"],
                           capture_output=True, text=True).stdout.strip()
    result["revision"] = revision + (" (with uncommitted changes)" if dirty else "")
    runs: dict[str, list[dict[str, Any]]] = {"before": [], "after": []}
    for _ in range(args.repeats):  # alternating, so both sides meet the machine's load
        if args.baseline:
            runs["before"].append(measure_revision(args.baseline, args))
        runs["after" if args.baseline else "before"].append(measure_in(HERE, args))
    if args.baseline:
        result["baseline"] = args.baseline
    result["repeats"] = args.repeats
    for side, measured in runs.items():
        if measured:
            result[side] = fastest(measured, args.datasets)
    result["machine"] = machine_info()
    write_report(args.out, result, markdown(result))
    plot(result, args.out.with_suffix(".png"))


if __name__ == "__main__":
    main()
