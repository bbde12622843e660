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
from fedrec.results import read_run, results_dir  # noqa: E402
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


def run_case(name: str, reuse_runs: bool = False) -> dict:
    """Both runs of case ``name`` (SecAgg+ and plain) and their differences.

    ``reuse_runs``: take each run's record from the results folder instead of running it
    (every run writes ``runs/bench-<case>-<mode>.json``, with its large arrays in the
    ``.npz`` beside it); ``seconds`` is then the protocol's own wall time from the record,
    without the simulation's start-up.
    """
    base, nodes = CASES[name]
    cfg = {"protocol": "privirec", **base, "privirec-omega": "seeded", "seed": 0,
           "timeout": 3600.0}
    out = {"case": name, "nodes": nodes, "config": cfg}
    arrays: dict[str, dict] = {}
    for mode in ("secagg+", "plain"):
        run = f"bench-{name}-{mode}"
        if reuse_runs:
            rec, seconds = _saved_run(run)
            log(f"{name}: {mode} from {results_dir() / 'runs' / (run + '.json')}")
        else:
            log(f"{name}: {mode} on {nodes} nodes")
            t0 = time.perf_counter()
            rec = run_in_simulation({**cfg, "aggregator": mode, "run-name": run},
                                    num_nodes=nodes, quiet=True,
                                    # seeded Omega (both runs start alike) and the plain
                                    # run: opted in by the simulated nodes' operator
                                    node_policy={"allow-plain": True,
                                                 "allow-seeded-omega": True,
                                                 "allow-sparse-transport": True},
                                    overwrite=True)
            seconds = time.perf_counter() - t0
        comm = rec["communication"]
        out[mode] = {"seconds": seconds, "metrics": rec["metrics"],
                     "bytes_per_node": comm["bytes_per_node"], "rounds": comm["total_rounds"],
                     "server_peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
                     / 2**20}
        arrays[mode] = {"P": rec["extra"].get("P") or {}, "S": rec["extra"].get("S")}
    if reuse_runs:
        out["seconds_note"] = "protocol wall time from each run's record (no Ray start-up)"
        for mode in ("secagg+", "plain"):
            out[mode].pop("server_peak_rss_gib")
    a, b = arrays["secagg+"], arrays["plain"]
    diff = {"metrics": max(abs(out["secagg+"]["metrics"][k] - out["plain"]["metrics"][k])
                           for k in out["secagg+"]["metrics"])}
    if a["P"]:  # PriviRec-k has no item-item matrix
        diff["P"] = max(float(abs(a["P"][k] - b["P"][k]).max()) for k in a["P"])
    if a["S"] is not None:
        diff["S_projector"] = _projector_diff(np.asarray(a["S"]), np.asarray(b["S"]))
    out["max_abs_diff"] = diff
    out["machine"] = machine_info()
    return out


def _projector_diff(Sa: np.ndarray, Sb: np.ndarray, block: int = 2048) -> float:
    """max |Sa Sa^T - Sb Sb^T| over items x items, a row block at a time (on Gowalla the full
    40,981^2 projector would take 13 GB)."""
    worst = 0.0
    for lo in range(0, Sa.shape[0], block):
        worst = max(worst, float(np.abs(Sa[lo:lo + block] @ Sa.T
                                        - Sb[lo:lo + block] @ Sb.T).max()))
    return worst


def _saved_run(run: str) -> tuple[dict, float]:
    """A run's record as the ServerApp saved it, and its protocol wall time."""
    path = results_dir() / "runs" / f"{run}.json"
    if not path.is_file():
        raise SystemExit(f"{path}: no saved run (run the case without --reuse-runs first)")
    rec = read_run(path)
    return rec, float(rec["seconds"])


def _rss(run: dict) -> str:
    return f"{run['server_peak_rss_gib']:.1f}" if "server_peak_rss_gib" in run else "-"


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
                         f" | {_rss(m)} | "
                         f"{m['metrics']['gf-cf/ndcg@20']:.4f} |")
        lines.append("")
        if "seconds_note" in r:
            lines.append(f"{r['case']} seconds: {r['seconds_note']}.")
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
    p.add_argument("--reuse-runs", action="store_true",
                   help="rebuild the report from the runs saved in the results folder")
    args = p.parse_args(argv)
    show_protocol_phases()
    results = [run_case(c, args.reuse_runs) for c in args.cases]
    write_report(Path(args.out) / f"{args.name}.json", results, markdown(results))
    print(markdown(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
