"""FedMF (the papers' baseline) against its centralized reference and item popularity.

For each dataset: item popularity (items scored by training degree), the centralized
BPR-MF reference (``BPRMF(mode="local")``: the same ``bpr_train_local`` the nodes call, on
all users in one process, same rounds x epochs, same Adam) and the federated ``fedmf``
protocol in a Flower simulation with SecAgg+ sums (the default aggregator). Writes
``results/fedmf/<dataset>.{json,md}``; the Markdown interpretation is computed from the
numbers.

    python benchmarks/fedmf.py                       # ml-100k and synthetic
    python benchmarks/fedmf.py --datasets ml-100k
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks._report import log, machine_info, write_report  # noqa: E402
from datasets import DatasetSpec, load_dataset  # noqa: E402
from fedrec.recsys.metrics import evaluate_ranking, popularity_sums  # noqa: E402
from fl_app.registry import resolve_config  # noqa: E402
from fl_app.simulation import run_in_simulation  # noqa: E402
from strategies.fedmf import FedMF  # noqa: E402

#: Per dataset: nodes and the run-config keys that differ from the defaults.
SETTINGS: dict[str, tuple[int, dict[str, Any]]] = {
    # 943 users over 10 nodes (~94 each); one epoch per round, 10 rounds = 10 epochs
    "ml-100k": (10, {"rounds": 10, "mf-local-epochs": 1}),
    # the defaults a newcomer runs (run_simulation.py --protocol fedmf: 4 nodes)
    "synthetic": (4, {}),
}
TARGET_VS_POPULARITY, TARGET_VS_CENTRAL = 1.2, 0.95


def _metrics(sums: dict[str, float]) -> dict[str, float]:
    return {"ndcg20": sums["ndcg@20"], "recall20": sums["recall@20"]}


def popularity(data: Any) -> dict[str, float]:
    return _metrics(popularity_sums(data.train, data.test, k=20).means())


def centralized(data: Any, cfg: dict[str, Any]) -> tuple[dict[str, float], float, float]:
    """The protocol's own reference with the run's keys; returns metrics, last train loss,
    seconds."""
    t0 = time.perf_counter()
    model = FedMF.from_run_config(cfg).reference_model(data.train)
    seconds = time.perf_counter() - t0
    out = _metrics(evaluate_ranking(model.score, data.train, data.test, k=20).means())
    return out, model.losses[-1], seconds


def bench(dataset: str) -> dict[str, Any]:
    nodes, keys = SETTINGS[dataset]
    overrides = {"protocol": "fedmf", "dataset": dataset, "partition": "shards-random",
                 "run-name": f"bench-fedmf-{dataset}", "timeout": 1800.0, **keys}
    cfg = resolve_config(overrides)
    data = load_dataset(DatasetSpec.from_config(cfg))
    log(f"{dataset}: popularity")
    pop = popularity(data)
    log(f"{dataset}: centralized reference")
    central, central_loss, central_s = centralized(data, cfg)
    log(f"{dataset}: federated, {nodes} nodes, aggregator {cfg['aggregator']}")
    t0 = time.perf_counter()
    record = run_in_simulation(overrides, num_nodes=nodes, quiet=True, overwrite=True)
    total_s = time.perf_counter() - t0
    fed = _metrics(record["metrics"])
    fed_keys = {k: v for k, v in record["config"].items()
                if k.startswith("mf-") or k in ("rounds", "seed", "aggregator", "partition",
                                                 "dataset")}
    return {
        "dataset": dataset, "n_users": data.n_users, "n_items": data.n_items,
        "n_train": int(data.train.nnz), "nodes": nodes, "config": fed_keys,
        "fedmf": {**fed, "train_loss": record["metrics"]["train-loss"]},
        "centralized": {**central, "train_loss": central_loss},
        "popularity": pop,
        "seconds": {"fedmf_protocol": record["seconds"], "fedmf_with_startup": total_s,
                    "centralized": central_s},
        "wall_time_ratio": record["seconds"] / central_s,
        "bytes_per_node": record["communication"]["bytes_per_node"],
        "synchronous_rounds": record["communication"]["total_rounds"],
        "sums": sorted({f"{s['aggregator']} ({s['form']})" for s in record["privacy"]["sums"]}),
        "history": record["history"],
        "machine": machine_info(),
        "command": f"python benchmarks/fedmf.py --datasets {dataset}",
    }


def markdown(r: dict[str, Any]) -> str:
    f, c, p = r["fedmf"], r["centralized"], r["popularity"]
    vs_pop, vs_central = f["ndcg20"] / p["ndcg20"], f["ndcg20"] / c["ndcg20"]
    c_vs_pop = c["ndcg20"] / p["ndcg20"]
    bpn = r["bytes_per_node"]
    overfit = ("" if not (vs_central > 1 and c["train_loss"] < f["train_loss"]) else
               f" The reference's train loss is lower ({c['train_loss']:.3f} vs "
               f"{f['train_loss']:.3f}): with the same epochs it fits the training rows harder, "
               "while averaging the nodes' item deltas damps item updates, which generalizes "
               "better here.")
    lines = [
        f"# FedMF on {r['dataset']}", "",
        f"{r['n_users']} users, {r['n_items']} items, {r['n_train']} training interactions; "
        f"{r['nodes']} nodes (`{r['config']['partition']}`), sums by "
        f"{', '.join(r['sums'])}. Reproduce: `{r['command']}`.", "",
        "| model | NDCG@20 | Recall@20 | train loss |", "|---|---|---|---|",
        f"| fedmf | {f['ndcg20']:.4f} | {f['recall20']:.4f} | {f['train_loss']:.4f} |",
        f"| centralized (same code, same budget) | {c['ndcg20']:.4f} | {c['recall20']:.4f} "
        f"| {c['train_loss']:.4f} |",
        f"| popularity | {p['ndcg20']:.4f} | {p['recall20']:.4f} | |", "",
        "## Reading", "",
        f"- FedMF NDCG@20 is {vs_pop:.2f}x popularity's: target >= {TARGET_VS_POPULARITY}x "
        f"{'met' if vs_pop >= TARGET_VS_POPULARITY else 'MISSED'}.",
        f"- FedMF NDCG@20 is {vs_central:.3f}x the centralized reference's "
        f"({'above' if vs_central > 1 else 'below'} it by {abs(vs_central - 1) * 100:.1f}%): "
        f"target >= {TARGET_VS_CENTRAL}x {'met' if vs_central >= TARGET_VS_CENTRAL else 'MISSED'}; "
        f"the reference itself reaches {c_vs_pop:.2f}x popularity.{overfit}",
        f"- FedMF train loss {f['train_loss']:.3f} vs ln 2 = {np.log(2):.3f} (nothing "
        f"learned): {'learned' if f['train_loss'] < 0.9 * np.log(2) else 'NOT clearly learned'}.",
        f"- Wall time: federated protocol {r['seconds']['fedmf_protocol']:.1f} s "
        f"({r['seconds']['fedmf_with_startup']:.1f} s with simulation start-up) vs "
        f"centralized {r['seconds']['centralized']:.1f} s: ratio {r['wall_time_ratio']:.2f} "
        f"({r['synchronous_rounds']} synchronous rounds).",
        f"- Bytes per node: {bpn['mean_down'] / 1e6:.2f} MB down, {bpn['mean_up'] / 1e6:.2f} MB "
        f"up on average ({r['config']['rounds']} rounds of the {r['n_items']} x "
        f"{r['config']['mf-dim']} item factors each way, plus SecAgg+ setup and unmasking).",
        "", "## Config", "",
        *(f"- `{k}` = {v!r}" for k, v in sorted(r["config"].items())), "",
        f"Machine: {r['machine']}.", "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    parser.add_argument("--out", default=str(REPO / "results" / "fedmf"))
    parser.add_argument("--markdown-only", action="store_true",
                        help="rewrite the .md files from the existing .json files")
    args = parser.parse_args(argv)
    for dataset in args.datasets:
        if args.markdown_only:
            path = Path(args.out) / f"{dataset}.json"
            path.with_suffix(".md").write_text(markdown(json.loads(path.read_text())))
            continue
        result = bench(dataset)
        write_report(Path(args.out) / f"{dataset}.json", result, markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
