"""PriviRec-k rank sweep (paper 000, Figure 3): NDCG@20 and bytes per node against k,
next to PriviRec, from federated runs in a Flower simulation.

    python benchmarks/privirec_k_sweep.py --dataset gowalla --ks 256 512 1024 --nodes 8

Writes ``results/privirec/k_sweep_<dataset>.json`` and a PNG plot beside it. The paper sweeps
k = 256..3584 in steps of 256; every node receives and sends |I| x k float64 per power round
(1.2 GB at k = 3584 on Gowalla), so the full sweep needs more memory than the simulation of 8
nodes on one 24 GiB machine has (see the issue notes).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from fl_app.simulation import run_in_simulation  # noqa: E402


def run_k(dataset: str, k: int, nodes: int, L: int, filters: str) -> dict:
    cfg = {"protocol": "privirec-k", "dataset": dataset, "secagg": "none", "privirec-k": k,
           "privirec-L": L, "privirec-filters": filters, "partition": "shards-random",
           "run-name": f"bench-privirec-k{k}-{dataset}", "timeout": 3600.0}
    t0 = time.perf_counter()
    rec = run_in_simulation(cfg, num_nodes=nodes, quiet=True)
    return {"k": k, "seconds": time.perf_counter() - t0, "metrics": rec["metrics"],
            "bytes_per_node": rec["communication"]["bytes_per_node"],
            "rounds": rec["communication"]["total_rounds"]}


def plot(res: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ks = [r["k"] for r in res["runs"]]
    fig, ax1 = plt.subplots(figsize=(7, 4))
    for name in res["filters"].split(","):
        ax1.plot(ks, [r["metrics"][f"{name}/ndcg@20"] for r in res["runs"]], "o-",
                 label=f"PriviRec-k {name}")
        ref = res.get("privirec", {}).get(name)
        if ref is not None:
            ax1.axhline(ref, linestyle="--", color="gray", label=f"PriviRec {name}")
    ax1.set_xlabel("k")
    ax1.set_ylabel("NDCG@20")
    ax2 = ax1.twinx()
    ax2.plot(ks, [(r["bytes_per_node"]["mean_down"] + r["bytes_per_node"]["mean_up"]) / 1e6
                  for r in res["runs"]], "s:", color="tab:red", label="MB per node")
    ax2.set_ylabel("MB per node (down + up)")
    handles = ax1.get_legend_handles_labels()
    more = ax2.get_legend_handles_labels()
    ax1.legend(handles[0] + more[0], handles[1] + more[1], loc="lower right")
    ax1.set_title(f"PriviRec-k on {res['dataset']} ({res['nodes']} nodes)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dataset", default="gowalla")
    p.add_argument("--ks", nargs="+", type=int, default=[256, 512, 1024])
    p.add_argument("--nodes", type=int, default=8)
    p.add_argument("--L", type=int, default=2)
    p.add_argument("--filters", default="gf-cf")
    p.add_argument("--out", default=str(REPO / "results" / "privirec"))
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    res: dict = {"dataset": args.dataset, "nodes": args.nodes, "L": args.L,
                 "filters": args.filters, "runs": []}
    privirec_file = out / f"{args.dataset}.json"
    if privirec_file.is_file():  # PriviRec's federated numbers from benchmarks/privirec.py
        fed = json.loads(privirec_file.read_text())["federated"]
        res["privirec"] = {name: v["ndcg20"] for name, v in fed.items()}
    for k in args.ks:
        print(f"[{time.strftime('%H:%M:%S')}] {args.dataset}: privirec-k k={k}", flush=True)
        res["runs"].append(run_k(args.dataset, k, args.nodes, args.L, args.filters))
        (out / f"k_sweep_{args.dataset}.json").write_text(json.dumps(res, indent=2))
    plot(res, out / f"k_sweep_{args.dataset}.png")
    for r in res["runs"]:
        print(r["k"], {k: round(v, 4) for k, v in r["metrics"].items() if "ndcg" in k},
              f"{(r['bytes_per_node']['mean_down'] + r['bytes_per_node']['mean_up']) / 1e6:.0f} MB",
              f"{r['seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
