"""One user per node: what a node sends, receives, computes and holds as the federation grows,
and FedMF runs at 943 and 2,999 nodes at default settings.

Two kinds of unit, each stored as it finishes (``--resume`` keeps them; results under
``results/cross_device/``):

1. ``growth-N``: FedMF on synthetic data with one user per node (N users, 500 items, one
   round, the safe node policy, SecAgg+ at its default degree 2 ceil(log2 N) above 32
   nodes) on the in-process grid (``tests/localgrid.py``: the project's ClientApp and
   ServerApp, real Flower messages, every node in this process). Per action (handshake,
   key setup rounds, train, evaluate, unmasking), over the nodes: the request and reply
   bytes (largest and mean), the node's handler seconds and its peak traced memory
   (``tracemalloc``), median and largest. The median is what is fitted: every node runs in
   this one process, so the first node of an action also pays the process's one-time costs
   (imports, the data cache), which the largest shows. Times are taken with tracemalloc on,
   so they are upper bounds; what counts is how they grow with N. The item factors are the same at
   every N, so growth is the protocol's own.
2. ``run-<dataset>-N``: FedMF with ``--partition user`` in a Flower simulation (Ray backend,
   ``fl_app.simulation.run_in_simulation``) at default settings (timeout, policy, degree;
   rounds too unless the unit names them: ML-1M's 2,999 nodes run one round, the issue's
   setting, since every round costs the same): whether it completes, its NDCG@20 beside
   item popularity, and per phase the rounds, wall seconds and bytes per node.

The report fits each growth metric against log2 N and against N (least squares, R^2 of
each) and projects the log fit to 6,040 nodes (ML-1M's users) and 30,000.

    python benchmarks/cross_device.py                              # growth, then both runs
    python benchmarks/cross_device.py --growth 64 128 --runs ml-100k:943 ml-1m:2999:1 --resume
    python benchmarks/cross_device.py --markdown-only
"""

from __future__ import annotations

import argparse
import math
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # first: Opacus installs a top-level package named benchmarks

from benchmarks._report import Units, log, machine_info, stored_result, write_report  # noqa: E402

OUT = REPO / "results" / "cross_device"
UNITS = OUT / "units.json"
REPORT = OUT / "secagg_scale.json"
PROJECT_TO = (6_040, 30_000)
#: Metrics of the growth units that are fitted and projected (per action).
METRICS = ("request_max", "reply_max", "seconds_median", "peak_mb_median")
#: Below this R^2 for both fits a metric is not projected (chosen: half its variance
#: explained; the seconds of one handler call on a loaded machine fall far below it).
MIN_R2 = 0.5


def growth(n: int) -> dict[str, Any]:
    """Per action, what one node receives, sends, spends and holds (see the module doc)."""
    from fedrec.transport.ledger import message_nbytes
    from fl_app.client_app import build_client_app
    from fl_app.registry import client_module, resolve_config
    from fl_app.server_app import run_protocol
    from tests.localgrid import LocalGrid

    rows: dict[str, dict[str, list[float]]] = {}

    class Measured(LocalGrid):
        def _process(self, msg: Any) -> Any:
            action = msg.metadata.message_type.removeprefix("query.")
            row = rows.setdefault(action, {"request": [], "reply": [], "seconds": [],
                                           "peak": []})
            tracemalloc.reset_peak()
            before = tracemalloc.get_traced_memory()[0]
            t0 = time.perf_counter()
            reply = super()._process(msg)
            row["seconds"].append(time.perf_counter() - t0)
            row["peak"].append(tracemalloc.get_traced_memory()[1] - before)
            row["request"].append(message_nbytes(msg))
            row["reply"].append(message_nbytes(reply))
            return reply

    cfg = resolve_config({"protocol": "fedmf", "dataset": "synthetic", "synthetic-users": n,
                          "partition": "user", "rounds": 1, "run-name": f"cross-device-{n}"})
    extra = [m for m in [client_module("fedmf")] if m]
    tracemalloc.start()
    t0 = time.perf_counter()
    try:
        with Measured(build_client_app(extra), n, data=cfg) as grid:
            record = run_protocol(grid, cfg)
    finally:
        tracemalloc.stop()
    out = {"nodes": n, "wall_seconds": time.perf_counter() - t0,
           "ndcg@20": record["metrics"].get("ndcg@20"), "actions": {}}
    for action, row in sorted(rows.items()):
        out["actions"][action] = {
            "messages": len(row["request"]),
            "request_max": max(row["request"]), "request_mean": float(np.mean(row["request"])),
            "reply_max": max(row["reply"]), "reply_mean": float(np.mean(row["reply"])),
            "seconds_median": float(np.median(row["seconds"])),
            "seconds_max": max(row["seconds"]),
            "peak_mb_median": float(np.median(row["peak"])) / 2**20,
            "peak_mb_max": max(row["peak"]) / 2**20}
    return out


def simulated_run(dataset: str, n: int, rounds: int | None, protocol: str = "fedmf",
                  config: dict[str, Any] | None = None,
                  policy: dict[str, Any] | None = None) -> dict[str, Any]:
    """``protocol`` (FedMF), one user per node, in a Flower simulation at default settings
    but ``config`` and the nodes' ``policy``; item popularity on the same split beside it
    (the centralized ceiling is its own unit)."""
    from fl_app.simulation import run_in_simulation

    name = "cross-device" if protocol == "fedmf" else protocol
    overrides: dict[str, Any] = {"protocol": protocol, "dataset": dataset,
                                 "partition": "user", "run-name": f"{name}-{dataset}-{n}",
                                 **(config or {})}
    if rounds is not None:
        overrides["rounds"] = rounds
    t0 = time.perf_counter()
    try:
        record = run_in_simulation(overrides, n, quiet=True, overwrite=True,
                                   node_policy=policy)
    except Exception as exc:  # noqa: BLE001  (a failed run is a result here)
        return {"dataset": dataset, "nodes": n, "completed": False,
                "error": f"{type(exc).__name__}: {exc}"[:2000],
                "wall_seconds": time.perf_counter() - t0}
    comm = record["communication"]
    phases = {name: {"rounds": p["rounds"], "seconds": p["seconds"],
                     "down_per_node": p["bytes_down"] / n, "up_per_node": p["bytes_up"] / n}
              for name, p in comm["phases"].items()}
    return {"dataset": dataset, "nodes": n, "completed": True,
            "rounds": record["config"].get("rounds"), "overrides": overrides,
            "dp": {k: (record.get("privacy") or {}).get("dp", {}).get(k)
                   for k in ("epsilon", "delta")},
            "wall_seconds": time.perf_counter() - t0,
            "ndcg@20": record["metrics"].get("ndcg@20"),
            "popularity_ndcg@20": _popularity(overrides),
            "bytes_per_node": comm["bytes_per_node"], "phases": phases}


def _popularity(overrides: dict[str, Any]) -> float:
    """Item popularity's NDCG@20 on the run's own split."""
    from datasets import DatasetSpec, load_dataset
    from fedrec.recsys.metrics import popularity_sums
    from fl_app.registry import resolve_config

    data = load_dataset(DatasetSpec.from_config(resolve_config(overrides)))
    return float(popularity_sums(data.train, data.test, k=20).means()["ndcg@20"])


def ceiling(run: dict[str, Any]) -> dict[str, Any]:
    """FedMF's centralized ceiling for a run's config (``FedMF.reference``: tuned on a
    validation split carved from train, never the test split): one user per node changes
    no centralized model, so this is the ceiling of every partition of the same data."""
    from datasets import DatasetSpec, load_dataset
    from fl_app.registry import load_strategy_class, resolve_config

    cfg = resolve_config(run["overrides"])
    data = load_dataset(DatasetSpec.from_config(cfg))
    t0 = time.perf_counter()
    metrics = load_strategy_class("fedmf")(cfg).reference(data)
    return {"ndcg@20": float(metrics["ndcg@20"]), "seconds": time.perf_counter() - t0,
            "tuned": {k: v for k, v in metrics.items() if k.startswith("tuned-")}}


# -- the report -------------------------------------------------------------------------------
def fit(ns: list[int], ys: list[float]) -> dict[str, Any]:
    """Least-squares fits y = a + b log2 N and y = a + b N: coefficients, R^2 of each, and
    the projections to :data:`PROJECT_TO` by the better fit."""
    out: dict[str, Any] = {}
    y = np.asarray(ys, float)
    for name, x in (("log", np.log2(ns)), ("linear", np.asarray(ns, float))):
        b, a = np.polyfit(x, y, 1)
        resid = y - (a + b * x)
        total = float(((y - y.mean()) ** 2).sum())
        out[f"{name}_a"], out[f"{name}_b"] = float(a), float(b)
        out[f"{name}_r2"] = 1.0 - float((resid ** 2).sum()) / total if total > 0 else 1.0
    # projected by the model that fits better: a metric that grows linearly is projected
    # linearly, never flattered by the log model
    out["model"] = "log" if out["log_r2"] >= out["linear_r2"] else "linear"
    if max(out["log_r2"], out["linear_r2"]) < MIN_R2:  # the noise is larger than any trend
        out["model"] = "none"
    for target in PROJECT_TO:
        if out["model"] == "none":
            out[f"at_{target}"] = float("nan")
            continue
        x = math.log2(target) if out["model"] == "log" else float(target)
        out[f"at_{target}"] = out[f"{out['model']}_a"] + out[f"{out['model']}_b"] * x
    return out


def analyse(units: dict[str, Any]) -> dict[str, Any]:
    """Fits per action and metric over the growth units; the growth from the smallest to
    the largest N beside the node-count ratio."""
    grown = sorted((u for k, u in units.items() if k.startswith("growth-")),
                   key=lambda u: u["nodes"])
    out: dict[str, Any] = {}
    if len(grown) < 3:
        return out
    ns = [u["nodes"] for u in grown]
    actions = sorted(set.intersection(*(set(u["actions"]) for u in grown)))
    for action in actions:
        out[action] = {}
        for metric in METRICS:
            ys = [u["actions"][action][metric] for u in grown]
            out[action][metric] = {**fit(ns, ys), "first": ys[0], "last": ys[-1],
                                   "growth": ys[-1] / ys[0] if ys[0] else float("nan")}
    return out


def markdown(result: dict[str, Any]) -> str:
    units, fits = result["units"], result["fits"]
    grown = sorted((u for k, u in units.items() if k.startswith("growth-")),
                   key=lambda u: u["nodes"])
    lines = ["# One user per node: SecAgg+ at cross-device scale", "",
             "Written by `python benchmarks/cross_device.py`; machine: "
             f"{result['machine']}.", ""]
    if grown:
        ns = [u["nodes"] for u in grown]
        lines += [f"## Per node, by action ({ns[0]} to {ns[-1]} nodes, in-process grid)", "",
                  "FedMF on synthetic data, one user per node, 500 items, one round. "
                  "Largest request and reply of any node (bytes); a node's handler seconds "
                  "and peak traced memory (MB), median over the nodes.", "",
                  "| action | nodes | request | reply | seconds | peak MB |",
                  "|---|---|---|---|---|---|"]
        for action in sorted(grown[-1]["actions"]):
            for u in grown:
                a = u["actions"].get(action)
                if a:
                    lines.append(f"| {action} | {u['nodes']:,} | {a['request_max']:,} | "
                                 f"{a['reply_max']:,} | {a['seconds_median']:.4f} | "
                                 f"{a['peak_mb_median']:.3f} |")
        lines += [""]
    if fits:
        first, last = grown[0]["nodes"], grown[-1]["nodes"]
        lines += [f"## Growth and projection ({last / first:.0f}x the nodes)", "",
                  "Each metric fitted as a + b log2 N and as a + b N and projected by the "
                  f"better fit (R^2), none below R^2 {MIN_R2} for both. A metric "
                  "proportional to N would grow "
                  f"{last / first:.0f}x here. Seconds and memory are medians of one handler "
                  "call on a loaded shared machine: their R^2 is low where the noise is "
                  "larger than the trend.", "",
                  "| action | metric | growth | R^2 log | R^2 linear | projected by | "
                  "at 6,040 | at 30,000 |",
                  "|---|---|---|---|---|---|---|---|"]
        for action, metrics in sorted(fits.items()):
            for metric, f in metrics.items():
                at = [("-" if math.isnan(f[f"at_{t}"]) else f"{f[f'at_{t}']:,.3g}")
                      for t in PROJECT_TO]
                lines.append(f"| {action} | {metric} | {f['growth']:.2f}x | {f['log_r2']:.3f} "
                             f"| {f['linear_r2']:.3f} | {f['model']} | {at[0]} | {at[1]} |")
        worst = max(((a, m, f["growth"]) for a, ms in fits.items() for m, f in ms.items()
                     if m in ("request_max", "reply_max")), key=lambda t: t[2])
        lines += ["", f"Largest growth of a node's request or reply: {worst[2]:.2f}x "
                  f"({worst[0]}, {worst[1]}) for {last / first:.0f}x the nodes."]
        lines += [""]
    runs = sorted(({**u, "spec": k.removeprefix("run-")} for k, u in units.items()
                   if k.startswith("run-")), key=lambda u: u["nodes"])
    if runs:
        lines += ["## Flower simulation runs at default settings", ""]
        for r in runs:
            head = (f"**{r['dataset']}, {r['nodes']:,} nodes** ("
                    f"{'completed' if r['completed'] else 'failed'} in "
                    f"{r['wall_seconds']:.0f} s")
            if not r["completed"]:
                lines += [head + f"): {r['error']}", ""]
                continue
            pop = r.get("popularity_ndcg@20")
            top = units.get(f"ceiling-{r['spec']}") if "spec" in r else None
            lines += [head + f", {r['rounds']} round(s)): NDCG@20 {r['ndcg@20']:.4f}, "
                      f"item popularity {pop:.4f}"
                      + (f", FedMF's tuned centralized ceiling {top['ndcg@20']:.4f}"
                         if top else ", no centralized ceiling measured") + ".", "",
                      "| phase | rounds | wall s | bytes down per node | bytes up per node |",
                      "|---|---|---|---|---|"]
            for name, p in r["phases"].items():
                lines.append(f"| {name} | {p['rounds']} | {p['seconds']:.1f} | "
                             f"{p['down_per_node']:,.0f} | {p['up_per_node']:,.0f} |")
            train = r["phases"].get("train")
            if train and train["seconds"] > 0:
                rate = r["nodes"] * train["rounds"] / train["seconds"]
                lines += ["", f"The simulation answered {rate:.1f} nodes per second in the "
                          "train rounds (its workers take the nodes a few at a time): a train "
                          f"round of 6,040 nodes would take about {6040 / rate:.0f} s and "
                          f"one of 30,000 about {30000 / rate:.0f} s here, the simulation's "
                          "cost on this machine, not a node's (each node's own share is the "
                          "per-action table above)."]
            lines += [""]
    return "\n".join(lines) + "\n"


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    grown = sorted((u for k, u in result["units"].items() if k.startswith("growth-")),
                   key=lambda u: u["nodes"])
    if not grown:
        return
    ns = [u["nodes"] for u in grown]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for action in sorted(grown[-1]["actions"]):
        ys = [u["actions"].get(action, {}).get("request_max") for u in grown]
        if None not in ys:
            axes[0].plot(ns, np.asarray(ys) / 1024, marker="o", label=action)
        ms = [u["actions"].get(action, {}).get("peak_mb_median") for u in grown]
        if None not in ms:
            axes[1].plot(ns, ms, marker="o", label=action)
    axes[0].plot(ns, np.asarray(ns) * 100 / 1024, "k--", label="100 bytes per member")
    for ax, title in zip(axes, ("largest request per node (KiB)",
                                      "peak memory per handler, median (MB)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("nodes (one user each)")
        ax.set_title(title)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--growth", type=int, nargs="*", default=[64, 128, 256, 512, 1024])
    ap.add_argument("--runs", nargs="*", default=["ml-100k:943", "ml-1m:2999:1"],
                    help="DATASET:NODES[:ROUNDS] Flower simulation runs (rounds: the run "
                         "config's default unless given)")
    ap.add_argument("--no-ceiling", action="store_true",
                    help="skip FedMF's tuned centralized ceiling beside each run")
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--markdown-only", action="store_true")
    args = ap.parse_args()
    config = {"growth": "fedmf synthetic one user per node, 500 items, rounds 1"}
    if not args.markdown_only:
        units = Units(UNITS, config, args.resume)
        for n in args.growth:
            log(f"growth at {n} nodes")
            units.get(f"growth-{n}", lambda n=n: growth(n))
        for spec in args.runs:
            dataset, n, *rounds = spec.split(":")
            log(f"Flower simulation: {dataset} on {n} nodes")
            run = units.get(f"run-{spec}", lambda d=dataset, n=int(n), r=rounds:
                            simulated_run(d, n, int(r[0]) if r else None))
            if run["completed"] and not args.no_ceiling:
                log(f"FedMF's centralized ceiling on {dataset}")
                units.get(f"ceiling-{spec}", lambda run=run: ceiling(run))
    stored = stored_result(UNITS)
    if stored is None:
        raise SystemExit(f"error: {UNITS} does not exist: run the benchmark first")
    result = {"config": stored["config"], "units": stored["units"],
              "fits": analyse(stored["units"]), "machine": machine_info()}
    write_report(REPORT, result, markdown(result))
    plot(result, REPORT.with_suffix(".png"))


if __name__ == "__main__":
    main()
