"""PriviRec with SecAgg+ at many nodes: the secure run matches its plain (`aggregator="plain"`)
run, with the server's peak memory and the bytes per node.

Cases: ML-100K over 100 nodes (shards), and a synthetic set with one user per node (300
nodes), written to ``results/privirec/secagg.json`` and ``.md``; and the full-scale secure
run, PriviRec-k (k = 2048) on Gowalla over 8 nodes, written to
``results/privirec/gowalla_secure.json`` and ``.md``:

    python benchmarks/privirec_secagg.py [--cases ml-100k synthetic-300]
    python benchmarks/privirec_secagg.py --cases gowalla-k2048 --name gowalla_secure
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks._report import (  # noqa: E402
    log,
    machine_info,
    show_protocol_phases,
    write_report,
)
from fl_app.simulation import run_in_simulation  # noqa: E402

CASES = {
    "ml-100k": ({"dataset": "ml-100k", "partition": "shards-random",
                 "privirec-filters": "gf-cf,turbo-cf", "privirec-rank": 64,
                 "privirec-filter-rank": 64, "secagg-degree": 14}, 100),
    "synthetic-300": ({"dataset": "synthetic", "partition": "user", "synthetic-users": 300,
                       "synthetic-items": 200, "privirec-filters": "gf-cf,turbo-cf",
                       "privirec-rank": 32, "privirec-filter-rank": 32,
                       "secagg-degree": 16}, 300),
    # seeded Omega (run_case) so that the secure and the plain run start from the same
    # Omega and their NDCG can be compared exactly
    "gowalla-k2048": ({"protocol": "privirec-k", "dataset": "gowalla",
                       "partition": "shards-random", "privirec-k": 2048,
                       "privirec-filters": "gf-cf"}, 8),
}


def run_case(name: str) -> dict:
    base, nodes = CASES[name]
    cfg = {"protocol": "privirec", **base, "privirec-omega": "seeded", "seed": 0,
           "timeout": 3600.0}
    out = {"case": name, "nodes": nodes, "config": cfg}
    for mode in ("secagg+", "plain"):
        log(f"{name}: {mode} on {nodes} nodes")
        t0 = time.perf_counter()
        rec = run_in_simulation({**cfg, "aggregator": mode, "run-name": f"bench-{name}-{mode}"},
                                num_nodes=nodes, quiet=True,
                                # seeded Omega (both runs start alike) and the plain run:
                                # opted in by the simulated nodes' operator
                                node_policy={"allow-plain": True, "allow-seeded-omega": True,
                                             "allow-sparse-transport": True})
        comm = rec["communication"]
        out[mode] = {"seconds": time.perf_counter() - t0, "metrics": rec["metrics"],
                     "bytes_per_node": comm["bytes_per_node"], "rounds": comm["total_rounds"],
                     "server_peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
                     / 2**20, "P": rec["extra"].get("P"), "S": rec["extra"].get("S")}
    a, b = out["secagg+"], out["plain"]
    diff = {"metrics": max(abs(a["metrics"][k] - b["metrics"][k]) for k in a["metrics"])}
    if a["P"] is not None:  # PriviRec-k has no item-item matrix
        diff["P"] = max(float(abs(a["P"][k] - b["P"][k]).max()) for k in a["P"])
    if a["S"] is not None:
        diff["S_projector"] = float(np.abs(a["S"] @ a["S"].T - b["S"] @ b["S"].T).max())
    out["max_abs_diff"] = diff
    out["machine"] = machine_info()
    for mode in ("secagg+", "plain"):
        out[mode].pop("P")
        out[mode].pop("S")
    return out


def _bytes(run: dict) -> float:
    b = run["bytes_per_node"]
    return b["mean_down"] + b["mean_up"]


def markdown(results: list[dict]) -> str:
    lines = ["# PriviRec with SecAgg+ vs plain sums", "",
             "| case | nodes | mode | seconds | rounds | MB/node down | MB/node up | "
             "server peak RSS GiB | gf-cf NDCG@20 |", "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        for mode in ("secagg+", "plain"):
            m = r[mode]
            b = m["bytes_per_node"]
            lines.append(f"| {r['case']} | {r['nodes']} | {mode} | {m['seconds']:.0f} | "
                         f"{m['rounds']} | {b['mean_down'] / 1e6:.1f} | {b['mean_up'] / 1e6:.1f}"
                         f" | {m['server_peak_rss_gib']:.1f} | "
                         f"{m['metrics']['gf-cf/ndcg@20']:.4f} |")
        lines.append("")
        lines.append(f"{r['case']}: max |secure - plain|: {r['max_abs_diff']}; secure/plain "
                     f"time {r['secagg+']['seconds'] / r['plain']['seconds']:.2f}x, bytes "
                     f"per node {_bytes(r['secagg+']) / _bytes(r['plain']):.2f}x")
        lines.append("")
    lines.append("The server adds masked inputs as they arrive (one running total); the "
                 "server peak RSS is that of the whole simulation driver process. Machine: "
                 f"{results[0]['machine'] if results and 'machine' in results[0] else '?'}; "
                 "configs in the JSON.")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # the full-scale Gowalla case runs only when named: it needs a quiet machine for ~15 min
    p.add_argument("--cases", nargs="+", default=[c for c in CASES if not c.startswith("gowalla")],
                   choices=list(CASES))
    p.add_argument("--out", default=str(REPO / "results" / "privirec"))
    p.add_argument("--name", default="secagg", help="file stem of the results")
    args = p.parse_args(argv)
    show_protocol_phases()
    results = [run_case(c) for c in args.cases]
    write_report(Path(args.out) / f"{args.name}.json", results, markdown(results))
    print(markdown(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
