"""LP-GCN (paper 001) on ML-100K: federated and centralized LightGCN curves in one run.

The authors' equivalence setting (digest section 2.12): ratings >= 4 as positives, L = 4,
d = 20, Adam lr 0.01, batch 2048, lambda 1e-3, top-5 metrics. The split is the project's
per-user 80/20 holdout of those positives (``u1.base`` is not in the shared data); items
without a training interaction are dropped from the catalogue (LP-GCN refuses them:
docs/protocols/lpgcn.md), and the JSON says how many. The federated run uses the in-process
Flower grid of the tests (``tests/localgrid.py``: the project's ClientApp and ServerApp,
real Flower messages, no Ray round floor) with plain sums (the nodes opt in), so its losses
and metrics can be compared with the centralized ones to printing precision.

    python benchmarks/lpgcn.py                 # 3 epochs, 5 nodes, both backbones
    python benchmarks/lpgcn.py --epochs 5 --backbones lightgcn
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks._report import log, machine_info, write_report  # noqa: E402
from datasets import DatasetSpec, load_dataset  # noqa: E402
from fl_app.recsys.metrics import evaluate_ranking, popularity_sums  # noqa: E402
from fl_app.registry import resolve_config  # noqa: E402
from strategies.lpgcn import LPGCN  # noqa: E402

SETTING = {"lpgcn-layers": 4, "lpgcn-dim": 20, "lpgcn-lr": 0.01, "lpgcn-batch-size": 2048,
           "lpgcn-reg": 1e-3, "lpgcn-top-k": 5, "lpgcn-eval-every": 1, "lpgcn-alpha": 1.0,
           "aggregator": "plain", "partition": "shards-random", "seed": 0}
K = 5


def ml100k_without_cold_items(folder: Path) -> dict[str, Any]:
    """ML-100K ratings >= 4, 80/20 per user, items with no training positive removed,
    written as a LightGCN-format dataset under ``folder``."""
    data = load_dataset(DatasetSpec(name="ml-100k", min_rating=4.0, implicit=True, seed=0))
    keep = np.flatnonzero(data.train.getnnz(axis=0) > 0)
    train, test = data.train[:, keep].tocsr(), data.test[:, keep].tocsr()
    sub = folder / "lightgcn"
    sub.mkdir(parents=True, exist_ok=True)
    for name, m in (("train.txt", train), ("test.txt", test)):
        lines = [" ".join(map(str, [u, *m.indices[m.indptr[u]:m.indptr[u + 1]]]))
                 for u in range(m.shape[0])]
        (sub / name).write_text("\n".join(lines) + "\n")
    return {"dataset": "lightgcn", "data-dir": str(folder),
            "dropped_items": int(data.n_items - len(keep)),
            "dropped_test_interactions": int(data.test.nnz - test.nnz),
            "users": int(train.shape[0]), "items": int(len(keep)),
            "train_interactions": int(train.nnz), "test_interactions": int(test.nnz)}


def centralized(cfg: dict[str, Any], data: Any, steps: int) -> dict[str, Any]:
    model = LPGCN(cfg).reference_model(data.train)
    curve, seconds = [], 0.0
    while model.step_count < steps:
        todo = min(model.nbatches, steps - model.step_count)
        t0 = time.perf_counter()
        model.fit(todo)
        seconds += time.perf_counter() - t0
        uf, vf = model.final_embeddings()
        m = evaluate_ranking(lambda r: uf[r] @ vf.T, data.train, data.test, k=K).means()
        epoch = model.step_count / model.nbatches
        curve.append({"epoch": round(epoch), f"recall@{K}": m[f"recall@{K}"],
                      f"ndcg@{K}": m[f"ndcg@{K}"]})
        log(f"  centralized epoch {epoch:g}: loss {np.mean(model.losses[-todo:]):.6f}, "
            f"recall@{K} {m[f'recall@{K}']:.4f}")
    return {"losses": model.losses, "curve": curve, "seconds_per_step": seconds / steps,
            "nbatches": model.nbatches}


def federated(cfg: dict[str, Any], nodes: int) -> dict[str, Any]:
    from fl_app.client_app import build_client_app
    from fl_app.server_app import run_protocol
    from tests.localgrid import LocalGrid

    with LocalGrid(build_client_app(policy={"allow-plain": True}), nodes) as grid:
        t0 = time.perf_counter()
        record = run_protocol(grid, resolve_config(cfg))
        wall = time.perf_counter() - t0
    comm = record["communication"]
    steps = len(record["extra"]["rounds_per_step"])
    train = comm["phases"]["lpgcn-train"]
    curve = [{"epoch": round(row["epoch"]), f"recall@{K}": row[f"recall@{K}"],
              f"ndcg@{K}": row[f"ndcg@{K}"]} for row in record["history"] if f"recall@{K}" in row]
    mail = record["privacy"]["sealed_mail"]
    shares = sum(v["bytes"] for k, v in mail.items() if k.startswith("lpgcn-e"))
    return {"losses": list(map(float, record["extra"]["losses"])), "curve": curve,
            "seconds_per_step": train["seconds"] / steps,
            "rounds_per_step": record["extra"]["rounds_per_step"],
            "bytes_per_node_per_iteration": (train["bytes_down"] + train["bytes_up"])
            / steps / nodes,
            "sealed_share_bytes_per_node_per_iteration": shares / steps / nodes,
            "convolution_nodes": record["extra"]["convolution_nodes"], "wall_seconds": wall,
            "metrics": record["metrics"]}


def max_abs_diff(a: dict[str, Any], b: dict[str, Any]) -> float:
    diffs = [np.max(np.abs(np.asarray(a["losses"]) - np.asarray(b["losses"])))]
    for ra, rb in zip(a["curve"], b["curve"]):
        diffs += [abs(ra[k] - rb[k]) for k in (f"recall@{K}", f"ndcg@{K}")]
    return float(max(diffs))


def epoch_loss(losses: list[float], nb: int) -> list[float]:
    return [float(np.mean(losses[i:i + nb])) for i in range(0, len(losses), nb)]


def plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(results), 3, figsize=(12, 3.2 * len(results)), squeeze=False)
    for row, (backbone, res) in enumerate(results.items()):
        nb = res["nbatches"]
        for side, style in (("centralized", "-"), ("federated", "--")):
            r = res[side]
            axes[row][0].plot(np.arange(len(r["losses"])) / nb, r["losses"], style, label=side)
            for col, key in ((1, f"recall@{K}"), (2, f"ndcg@{K}")):
                axes[row][col].plot([c["epoch"] for c in r["curve"]],
                                    [c[key] for c in r["curve"]], style + "o", label=side)
        for col, title in enumerate(("train loss per step", f"Recall@{K}", f"NDCG@{K}")):
            axes[row][col].set_title(f"{backbone}: {title}")
            axes[row][col].set_xlabel("epoch")
            axes[row][col].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--nodes", type=int, default=5)
    ap.add_argument("--backbones", nargs="+", default=["lightgcn", "lightgcn+"])
    ap.add_argument("--out", default=str(REPO / "results" / "lpgcn"))
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        prep = ml100k_without_cold_items(Path(tmp))
        base = {"protocol": "lpgcn", "dataset": "lightgcn", "data-dir": prep["data-dir"],
                **SETTING, "lpgcn-epochs": args.epochs, "run-name": "bench-lpgcn-ml100k"}
        data = load_dataset(DatasetSpec.from_config(base))
        results: dict[str, Any] = {}
        for backbone in args.backbones:
            cfg = resolve_config({**base, "lpgcn-backbone": backbone})
            log(f"{backbone}: centralized, {args.epochs} epochs")
            cen = centralized(cfg, data, args.epochs * LPGCN(cfg).reference_model(
                data.train).nbatches)
            log(f"{backbone}: federated, {args.nodes} nodes")
            fed = federated({**base, "lpgcn-backbone": backbone}, args.nodes)
            results[backbone] = {
                "nbatches": cen["nbatches"], "centralized": cen, "federated": fed,
                "max_abs_diff": max_abs_diff(cen, fed),
                "seconds_per_step": {"centralized": cen["seconds_per_step"],
                                     "federated": fed["seconds_per_step"]},
                "rounds_per_step": max(fed["rounds_per_step"]),
                "bytes_per_node_per_iteration": fed["bytes_per_node_per_iteration"],
                "epoch_loss": {"centralized": epoch_loss(cen["losses"], cen["nbatches"]),
                               "federated": epoch_loss(fed["losses"], cen["nbatches"])},
                "metrics": {"centralized": cen["curve"][-1], "federated": fed["curve"][-1]}}
            log(f"{backbone}: max |federated - centralized| = "
                f"{results[backbone]['max_abs_diff']:.3g}")
    pop = popularity_sums(data.train, data.test, k=K).means()
    result = {"dataset": "ml-100k", "data": {k: v for k, v in prep.items() if k != "data-dir"},
              "config": {k: v for k, v in base.items() if k != "data-dir"},
              "nodes": args.nodes, "grid": "in-process Flower grid (tests/localgrid.py)",
              "popularity": {f"recall@{K}": pop[f"recall@{K}"], f"ndcg@{K}": pop[f"ndcg@{K}"]},
              "backbones": results, "machine": machine_info(),
              "gowalla": "not measured in this run"}
    lines = [f"# LP-GCN on ML-100K ({args.epochs} epochs, {args.nodes} nodes)", "",
             "| backbone | max abs diff | rounds/step | s/step cen | s/step fed | "
             f"bytes/node/step | Recall@{K} cen / fed | NDCG@{K} cen / fed |",
             "|---|---|---|---|---|---|---|---|"]
    for b, r in results.items():
        mc, mf = r["metrics"]["centralized"], r["metrics"]["federated"]
        lines.append(f"| {b} | {r['max_abs_diff']:.2e} | {r['rounds_per_step']} | "
                     f"{r['seconds_per_step']['centralized']:.4f} | "
                     f"{r['seconds_per_step']['federated']:.3f} | "
                     f"{r['bytes_per_node_per_iteration']:.0f} | "
                     f"{mc[f'recall@{K}']:.4f} / {mf[f'recall@{K}']:.4f} | "
                     f"{mc[f'ndcg@{K}']:.4f} / {mf[f'ndcg@{K}']:.4f} |")
    lines += ["", f"Item popularity: Recall@{K} {pop[f'recall@{K}']:.4f}, NDCG@{K} "
              f"{pop[f'ndcg@{K}']:.4f}. Dropped {prep['dropped_items']} items without a "
              f"training positive ({prep['dropped_test_interactions']} test interactions).",
              "Command: `python benchmarks/lpgcn.py --epochs "
              f"{args.epochs} --nodes {args.nodes}`", ""]
    write_report(out / "ml-100k.json", result, "\n".join(lines))
    plot(results, out / "ml-100k.png")


if __name__ == "__main__":
    main()
