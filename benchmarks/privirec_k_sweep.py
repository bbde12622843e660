"""PriviRec-k rank sweep (paper 000, Figure 3): NDCG@20 and bytes per node against k,
next to PriviRec, from federated runs in a Flower simulation.

    python benchmarks/privirec_k_sweep.py --datasets gowalla yelp2018 --nodes 8

Writes ``results/privirec/k_sweep_<dataset>.json`` and a PNG plot beside it. The paper sweeps
k = 256..3584 in steps of 256 (the default here). Every node receives and sends |I| x k dense
matrices per power round (1.2 GB per matrix at k = 3584 on Gowalla in float64); the sweep
therefore uses ``privirec-wire-dtype = float32`` by default (half the bytes and node memory;
k = 2048 in float64 ran the 8-node simulation out of 24 GiB). Each k is a separate federated
run; results are written after every k, and ``--resume`` skips the ks already in the JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks._report import log, machine_info, write_report  # noqa: E402
from fl_app.simulation import backend_config_for, run_in_simulation  # noqa: E402


def run_k(dataset: str, k: int, nodes: int, L: int, filters: str, wire_dtype: str,
          client_cpus: int = 1) -> dict:
    cfg = {"protocol": "privirec-k", "dataset": dataset, "aggregator": "plain", "privirec-k": k,
           "privirec-L": L, "privirec-filters": filters, "partition": "shards-random",
           "privirec-wire-dtype": wire_dtype,
           "run-name": f"bench-privirec-k{k}-{dataset}", "timeout": 3600.0}
    t0 = time.perf_counter()
    rec = run_in_simulation(cfg, num_nodes=nodes, quiet=True,
                            backend_config=backend_config_for(client_cpus),
                            node_policy={"allow-plain": True},  # plain sums, opted in
                            overwrite=True)
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
    if "privirec_mb_per_node" in res:
        ax2.axhline(res["privirec_mb_per_node"], linestyle=":", color="tab:red", alpha=0.5,
                    label="PriviRec MB per node")
    ax2.set_ylabel("MB per node (down + up)")
    handles = ax1.get_legend_handles_labels()
    more = ax2.get_legend_handles_labels()
    ax1.legend(handles[0] + more[0], handles[1] + more[1], loc="lower right")
    ax1.set_title(f"PriviRec-k on {res['dataset']} ({res['nodes']} nodes, L={res['L']}, "
                  f"{res.get('wire_dtype', 'float64')} wire)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def sweep(dataset: str, args: argparse.Namespace, out: Path) -> None:
    path = out / f"k_sweep_{dataset}.json"
    res: dict = {"dataset": dataset, "nodes": args.nodes, "L": args.L, "filters": args.filters,
                 "wire_dtype": args.wire_dtype, "runs": []}
    if args.resume and path.is_file():
        res["runs"] = [r for r in json.loads(path.read_text())["runs"] if r["k"] in args.ks]
    privirec_file = out / f"{dataset}.json"
    if privirec_file.is_file():  # PriviRec's federated numbers from benchmarks/privirec.py
        fed = json.loads(privirec_file.read_text())
        res["privirec"] = {name: v["ndcg20"] for name, v in fed["federated"].items()}
        bpn = fed["bytes_per_node"]
        res["privirec_mb_per_node"] = (bpn["mean_down"] + bpn["mean_up"]) / 1e6
        res["privirec_L"] = fed.get("L")
    done = {r["k"] for r in res["runs"]}
    todo = [k for k in args.ks if k not in done]
    for k in todo:  # the report is rewritten after each k, so a crash keeps what was measured
        log(f"{dataset}: privirec-k k={k}")
        res["runs"].append(run_k(dataset, k, args.nodes, args.L, args.filters, args.wire_dtype,
                                 args.client_cpus))
        res["runs"].sort(key=lambda r: r["k"])
        write_report(path, res | {"machine": machine_info()}, markdown(res))
    if not todo:  # nothing rerun: refresh the PriviRec comparison, keep the runs' machine
        kept = json.loads(path.read_text()) if path.is_file() else {}
        write_report(path, res | {"machine": kept.get("machine", machine_info())}, markdown(res))
    plot(res, out / f"k_sweep_{dataset}.png")
    print(markdown(res), flush=True)


def markdown(res: dict) -> str:
    names = res["filters"].split(",")
    ref = res.get("privirec", {})
    lines = [f"# PriviRec-k rank sweep on {res['dataset']} ({res['nodes']} nodes, L={res['L']}, "
             f"{res['wire_dtype']} wire)", "",
             "| k | " + " | ".join(f"{n} NDCG@20 | vs PriviRec" for n in names)
             + " | MB per node (down + up) | seconds |",
             "|---|" + "---|---|" * len(names) + "---|---|"]
    for r in res["runs"]:
        cells = []
        for n in names:
            v = r["metrics"][f"{n}/ndcg@20"]
            cells.append(f"{v:.4f} | {v - ref[n]:+.4f}" if n in ref else f"{v:.4f} | -")
        mb = (r["bytes_per_node"]["mean_down"] + r["bytes_per_node"]["mean_up"]) / 1e6
        lines.append(f"| {r['k']} | " + " | ".join(cells) + f" | {mb:.0f} | {r['seconds']:.0f} |")
    if ref:
        lines += ["", f"PriviRec (L={res.get('privirec_L')}, `benchmarks/privirec.py`): "
                  + ", ".join(f"{n} {v:.4f}" for n, v in ref.items() if n in names)
                  + (f"; {res['privirec_mb_per_node']:.0f} MB per node"
                     if "privirec_mb_per_node" in res else "") + "."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--datasets", nargs="+", default=["gowalla", "yelp2018"])
    p.add_argument("--ks", nargs="+", type=int, default=list(range(256, 3585, 256)))
    p.add_argument("--wire-dtype", default="float32", choices=["float32", "float64"])
    p.add_argument("--resume", action="store_true", help="keep the ks already in the JSON")
    p.add_argument("--nodes", type=int, default=8)
    p.add_argument("--client-cpus", type=int, default=1,
                   help="CPUs per simulated ClientApp worker (2 = one worker at a time, half the memory)")
    p.add_argument("--L", type=int, default=3)
    p.add_argument("--filters", default="gf-cf")
    p.add_argument("--out", default=str(REPO / "results" / "privirec"))
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for dataset in args.datasets:
        sweep(dataset, args, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
