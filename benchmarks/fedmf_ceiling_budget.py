"""FedMF's centralized ceiling tuned two ways, beside the federated run: every candidate to its
early stop (``full``) against successive halving within a budget of rounds (``halving``, the
default; ``fedrec.recsys.mf_ceiling``).

Per dataset: the leaderboard's fedmf cell (``benchmarks/_board.py``: its run config, nodes
and node policy) through a Flower simulation, the ceiling tuned by each tuner on its train
split (wall seconds, selection rounds on the fit rows, the winner's retraining on train and
its seconds, the setting chosen, validation and test NDCG@20), and item popularity. Each unit
(dataset x arm) is written as it ends, merged with the units the file holds, so a long arm
can run in a second process (``--datasets ml-1m --arms full --resume``); ``--resume`` keeps
the units already in the JSON. Every unit records when it started and the load average
before and after: the ratios divide wall times taken on a shared machine. Writes
``results/fedmf/ceiling_budget.{json,md,png}``.

    nice python benchmarks/fedmf_ceiling_budget.py --datasets ml-1m ml-100k --resume
"""

from __future__ import annotations

import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # first: Opacus installs a top-level package named benchmarks

from benchmarks._board import cells, label  # noqa: E402
from benchmarks._report import (  # noqa: E402
    dataset_parser,
    log,
    machine_info,
    show_protocol_phases,
    stored_datasets,
    stored_result,
    write_report,
)

OUT = REPO / "results" / "fedmf" / "ceiling_budget.json"
ARMS = ("federated", "halving", "full")
#: The budgeted tuner's target in the issue (#44): at most this many times the federated
#: run's wall time; the report says whether it was met.
TARGET_RATIO = 2.0


def _ndcg(score: Any, train: Any, test: Any) -> float:
    from fedrec.recsys.metrics import evaluate_ranking

    return float(evaluate_ranking(score, train, test, k=20).means()["ndcg@20"])


def _load() -> float:
    return os.getloadavg()[0]


def federated(dataset: str, data_dir: str = "") -> dict[str, Any]:
    """The leaderboard's fedmf cell as it runs there, and item popularity on its split."""
    from datasets import DatasetSpec, load_dataset
    from fedrec.recsys.metrics import popularity_sums
    from fl_app.registry import resolve_config
    from fl_app.simulation import run_in_simulation

    cell = next(c for c in cells([dataset], ["fedmf"], data_dir))
    load0, t0 = _load(), time.perf_counter()
    record = run_in_simulation(cell.config, cell.nodes, quiet=True, node_policy=cell.policy)
    wall = time.perf_counter() - t0
    data = load_dataset(DatasetSpec.from_config(resolve_config(cell.config)))
    return {"nodes": cell.nodes, "config": cell.config, "wall_seconds": wall,
            "run_seconds": float(record["seconds"]),
            "test_ndcg": float(record["metrics"]["ndcg@20"]),
            "popularity_ndcg": float(popularity_sums(data.train, data.test)
                                     .means()["ndcg@20"]),
            "load": [load0, _load()]}


def ceiling(dataset: str, budget: str, data_dir: str = "") -> dict[str, Any]:
    """``FedMF.tune`` with ``budget`` on the cell's train split, then scored on test."""
    from datasets import DatasetSpec, load_dataset
    from fedrec.recsys.mf import BPRMF
    from fedrec.recsys.mf_ceiling import (
        REFERENCE_GRID,
        REFERENCE_SPLIT_STEPS,
        halving_budget,
        parse_label,
    )
    from fl_app.registry import resolve_config
    from strategies.fedmf import FedMF

    cell = next(c for c in cells([dataset], ["fedmf"], data_dir))
    data = load_dataset(DatasetSpec.from_config(resolve_config(cell.config)))
    retrain: list[float] = []

    class Timed(BPRMF):
        """Times its fits on all of train: the winner's retraining."""

        def fit(self, train, rounds, on_round=None):  # type: ignore[no-untyped-def]
            t = time.perf_counter()
            out = super().fit(train, rounds, on_round)
            if train.nnz == data.train.nnz:
                retrain.append(time.perf_counter() - t)
            return out

    class Strategy(FedMF):
        def _untrained(self, lr=None, reg=None, item_lr=None):  # type: ignore[no-untyped-def]
            base = super()._untrained(lr, reg, item_lr)
            return Timed(**{k: getattr(base, k) for k in ("dim", "lr", "reg", "negatives",
                                                          "seed", "mode", "epochs",
                                                          "batch_size", "item_lr")})

    strategy = Strategy(resolve_config(cell.config))
    load0, t0 = _load(), time.perf_counter()
    tuned = strategy.tune(data.train, budget=budget)
    wall = time.perf_counter() - t0
    assert tuned.model is not None
    lr, item_lr, reg = parse_label(tuned.label)
    return {"wall_seconds": wall, "retrain_seconds": sum(retrain),
            "selection_rounds": sum(tuned.trained.values()), "retrain_rounds": tuned.rounds,
            "budget_rounds": (halving_budget(strategy.rounds, len(REFERENCE_GRID)
                                             + len(REFERENCE_SPLIT_STEPS))
                              if budget == "halving" else None),
            "budget_cut": tuned.exhausted, "candidates": len(tuned.tried),
            "trained": tuned.trained, "tried": tuned.tried,
            "chosen": {"lr": lr, "item_lr": item_lr, "reg": reg, "rounds": tuned.rounds},
            "valid_ndcg": max(tuned.curve),
            "test_ndcg": _ndcg(tuned.model.score, data.train, data.test),
            "load": [load0, _load()]}


def measure(dataset: str, arm: str, data_dir: str = "") -> dict[str, Any]:
    started = time.strftime("%Y-%m-%dT%H:%M:%S")
    out = federated(dataset, data_dir) if arm == "federated" else ceiling(dataset, arm,
                                                                        data_dir)
    return {**out, "started": started}


def ratios(r: dict[str, Any]) -> dict[str, float]:
    """Time and quality ratios between the arms a dataset holds."""
    out: dict[str, float] = {}
    fed, half, full = (r.get(a) for a in ARMS)
    if half and full:
        out["halving_over_full_seconds"] = half["wall_seconds"] / full["wall_seconds"]
        out["halving_over_full_rounds"] = (
            (half["selection_rounds"] + half["retrain_rounds"])
            / (full["selection_rounds"] + full["retrain_rounds"]))
        out["halving_minus_full_test"] = half["test_ndcg"] - full["test_ndcg"]
        out["halving_over_full_test"] = half["test_ndcg"] / full["test_ndcg"]
        out["halving_minus_full_valid"] = half["valid_ndcg"] - full["valid_ndcg"]
    for name, arm in (("halving", half), ("full", full)):
        if fed and arm:
            out[f"{name}_over_federated_seconds"] = arm["wall_seconds"] / fed["wall_seconds"]
            out[f"{name}_retrain_over_federated_seconds"] = (arm["retrain_seconds"]
                                                            / fed["wall_seconds"])
            out[f"federated_over_{name}_test"] = fed["test_ndcg"] / arm["test_ndcg"]
    return out


def _row(name: str, a: dict[str, Any]) -> str:
    c = a["chosen"]
    budget = (f"{a['budget_rounds']}{' (cut)' if a['budget_cut'] else ''}"
              if a["budget_rounds"] else "-")
    return (f"| {name} | {a['wall_seconds']:.0f} | {a['selection_rounds']} | {budget} | "
            f"{a['retrain_rounds']} ({a['retrain_seconds']:.0f} s) | {a['candidates']} | "
            f"{c['lr']:.3g}, {c['item_lr']:.3g}, {c['reg']:.3g} | {a['valid_ndcg']:.4f} | "
            f"{a['test_ndcg']:.4f} |")


def reading(r: dict[str, Any]) -> list[str]:
    """The interpretation lines, computed from the numbers."""
    fed, half, full = (r.get(a) for a in ARMS)
    q = ratios(r)
    lines = []
    if half and full:
        same = half["chosen"] == full["chosen"]
        lines.append(
            f"- The budgeted ceiling's test NDCG@20 is {half['test_ndcg']:.4f}, "
            f"{abs(q['halving_minus_full_test']):.4f} "
            f"{'above' if q['halving_minus_full_test'] >= 0 else 'below'} the full tuner's "
            f"({q['halving_over_full_test']:.3f} of it; validation "
            f"{q['halving_minus_full_valid']:+.4f}); it "
            f"{'chose the same setting' if same else 'chose another setting'}, in "
            f"{q['halving_over_full_seconds']:.2f} of the full tuner's wall time and "
            f"{q['halving_over_full_rounds']:.2f} of its training rounds.")
    if fed and half:
        met = q["halving_over_federated_seconds"] <= TARGET_RATIO
        lines.append(
            f"- The budgeted tuning took {q['halving_over_federated_seconds']:.1f}x the "
            f"federated run's wall time (target {TARGET_RATIO:g}x: "
            f"{'met' if met else 'not met'}); the winner's retraining on train alone took "
            f"{q['halving_retrain_over_federated_seconds']:.1f}x it.")
        lines.append(
            f"- The federated run reaches {q['federated_over_halving_test']:.3f} of the "
            f"budgeted ceiling's test NDCG@20" +
            (f" and {q['federated_over_full_test']:.3f} of the full tuner's" if full else "") +
            f"; popularity {fed['popularity_ndcg']:.4f}.")
    return lines


def markdown(result: dict[str, Any]) -> str:
    lines = ["# FedMF: the ceiling's tuning, full against budgeted", "",
             "The leaderboard's fedmf cell (Flower simulation, SecAgg+) and its centralized "
             "ceiling tuned on a validation split of train by each tuner: `full` trains every "
             "candidate to its early stop, `halving` (the default) trains all a few rounds "
             "and continues the best third from their state, within a budget of selection "
             "rounds (`fedrec.recsys.mf_ceiling`). Selection rounds are on the fit rows (90% "
             "of train); the winner is then retrained on train for its chosen rounds. Wall "
             "times were taken on a 2-core machine shared with other jobs, the arms of a "
             "dataset not always in one process or at one time (the JSON has each unit's "
             "start and load averages): the time ratios carry that noise, the rounds do "
             "not. LastFM is not on this machine. Command: "
             "`nice python benchmarks/fedmf_ceiling_budget.py --resume`.", ""]
    for ds, r in result["datasets"].items():
        fed = r.get("federated")
        lines += [f"## {label(ds)}", "",
                  "| | wall s | selection rounds | budget | retrain rounds | candidates | "
                  "lr, item lr, reg | valid NDCG@20 | test NDCG@20 |",
                  "|---|---|---|---|---|---|---|---|---|"]
        lines += [_row(name, r[arm]) for name, arm in (("full tuner", "full"),
                                                      ("budgeted (halving)", "halving"))
                  if arm in r]
        if fed:
            lines += [f"| federated run ({fed['nodes']} nodes) | {fed['wall_seconds']:.0f} | "
                      "- | - | - | - | the run's | - | " f"{fed['test_ndcg']:.4f} |",
                      f"| item popularity | - | - | - | - | - | - | - | "
                      f"{fed['popularity_ndcg']:.4f} |"]
        missing = [arm for arm in ARMS if arm not in r]
        lines += ["", *reading(r)]
        if missing:
            lines.append(f"- Not measured yet: {', '.join(missing)} (`--resume` runs "
                         "them).")
        lines.append("")
    lines += [f"Machine: {result.get('machine', {})}.", ""]
    return "\n".join(lines)


def plot(result: dict[str, Any], path: Path) -> None:
    """Wall seconds (log scale) and test NDCG@20 per dataset and arm."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(result["datasets"])
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    width = 0.25
    for k, (arm, colour) in enumerate(zip(ARMS, ("tab:blue", "tab:green", "tab:orange"))):
        xs = [i + (k - 1) * width for i in range(len(names))]
        got = [result["datasets"][d].get(arm) for d in names]
        ax1.bar(xs, [g["wall_seconds"] if g else 0 for g in got], width, label=arm,
                color=colour)
        ax2.bar(xs, [g["test_ndcg"] if g else 0 for g in got], width, label=arm, color=colour)
    pop = [result["datasets"][d].get("federated", {}).get("popularity_ndcg") for d in names]
    for i, p in enumerate(pop):
        if p is not None:
            ax2.hlines(p, i - 1.5 * width, i + 1.5 * width, colors="grey", linestyles="--",
                       label="popularity" if i == 0 else None)
    for ax, title in ((ax1, "wall seconds"), (ax2, "test NDCG@20")):
        ax.set_xticks(range(len(names)), [label(d) for d in names])
        ax.set_title(title)
    ax1.set_yscale("log")
    ax2.legend(fontsize=8)
    ax1.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def merge(result: dict[str, Any], paths: list[Path]) -> None:
    """Add the units (dataset x arm) the JSON files at ``paths`` hold and ``result`` lacks:
    two processes may measure at once (a long arm in the background), each writing its
    units as they end without dropping the other's."""
    for path in paths:
        stored = stored_result(path) or {"datasets": {}}
        for ds, arms in stored["datasets"].items():
            mine = result["datasets"].setdefault(ds, {})
            mine.update({k: v for k, v in arms.items() if k in ARMS and k not in mine})


def report(result: dict[str, Any], out: Path = OUT) -> None:
    merge(result, [out])
    for r in result["datasets"].values():
        r["ratios"] = ratios(r)
    write_report(out, result, markdown(result))
    plot(result, out.with_suffix(".png"))


def main(argv: list[str] | None = None) -> None:
    ap = dataset_parser(__doc__.splitlines()[0])
    ap.add_argument("--arms", nargs="+", default=list(ARMS), choices=ARMS)
    ap.add_argument("--out", type=Path, default=OUT, help="the JSON to write")
    ap.add_argument("--merge", type=Path, nargs="*", default=[],
                    help="add the units of these JSON files (those in --out win)")
    args = ap.parse_args(argv)
    result = stored_datasets(args.out, args)
    merge(result, args.merge)
    if not args.markdown_only:
        logging.getLogger("flwr").setLevel(logging.WARNING)
        show_protocol_phases()  # the tuners' candidate lines: a tuning of many minutes
        result["config"] = {"arms": list(args.arms), "datasets": list(args.datasets)}
        for ds in args.datasets:
            stored = result["datasets"].setdefault(ds, {})
            for arm in args.arms:
                if arm in stored:
                    continue
                log(f"{ds}: {arm}")
                stored[arm] = measure(ds, arm, args.data_dir)
                result["machine"] = machine_info()
                report(result, args.out)
    report(result, args.out)


if __name__ == "__main__":
    main()
