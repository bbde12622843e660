"""The main job's numbers, as README shows them: `run_simulation.py` with its defaults.

Runs the default protocol (PriviRec with SecAgg+, 4 simulated nodes, the embedded synthetic
data) with the comparison on, and writes ``results/main_job.{json,md}``: federated,
centralized reference and item popularity per filter, rounds, bytes per node, wall times,
config, flwr version and machine. ``--protocol fedmf`` writes ``results/main_job_fedmf.*``.

    python benchmarks/main_job.py [--protocol privirec] [--nodes 4]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._report import log, machine_info, write_report  # noqa: E402
from fl_app.simulation import run_in_simulation  # noqa: E402


def summarize(record: dict[str, Any], wall: float) -> dict[str, Any]:
    """What the table shows, plus what it depends on."""
    comparison = record["comparison"]
    comm = record["communication"]
    return {
        "config": record["config"], "num_nodes": record["num_nodes"],
        "federated": comparison["federated"], "centralized": comparison.get("centralized", {}),
        "popularity": comparison["popularity"],
        "seconds": {"run_simulation": wall, "federated_protocol": record["seconds"],
                    "handshake": comm["phases"]["handshake"]["seconds"],
                    "centralized": comparison.get("centralized_seconds")},
        "rounds": comm["total_rounds"], "bytes_per_node": comm["bytes_per_node"],
        "sums": sorted({s["form"] for s in record["privacy"]["sums"]}),
        **machine_info(),
    }


def markdown(res: dict[str, Any]) -> str:
    """The comparison table and an interpretation computed from it."""
    fed, cen, pop = res["federated"], res["centralized"], res["popularity"]
    rows, ratios, lifts = [], [], []
    for key in sorted(k for k in fed if k.endswith(("ndcg@20", "recall@20"))):
        suffix = key.rsplit("/", 1)[-1]
        ratio = fed[key] / cen[key] if cen.get(key) else None
        lift = fed[key] / pop[suffix] if pop.get(suffix) else None
        if key.endswith("ndcg@20"):
            ratios += [(ratio, key)] if ratio is not None else []
            lifts += [(lift, key)] if lift is not None else []
        cells = [f"{fed[key]:.4f}", f"{cen[key]:.4f}" if key in cen else "-",
                 f"{ratio:.3f}" if ratio is not None else "-",
                 f"{pop[suffix]:.4f}" if suffix in pop else "-"]
        rows.append(f"| {key} | " + " | ".join(cells) + " |")
    sec = res["seconds"]
    cfg = res["config"]
    lines = [
        f"# The main job: {cfg['protocol']} on {cfg['dataset']} "
        f"({res['num_nodes']} nodes, aggregator {cfg['aggregator']})",
        "",
        f"`python run_simulation.py` defaults; flwr {res['flwr_version']}, {res['cpus']} CPU cores, "
        f"Python {res['python']}. Produced by `python benchmarks/main_job.py`.",
        "",
        "| metric | federated | centralized | fed / centralized | popularity |",
        "|---|---:|---:|---:|---:|",
        *rows,
        "",
        f"Sums the server saw: {', '.join(res['sums']) or 'none'}; {res['rounds']} synchronous "
        f"rounds; {res['bytes_per_node']['mean_down'] / 1e6:.2f} MB down and "
        f"{res['bytes_per_node']['mean_up'] / 1e6:.2f} MB up per node.",
        "",
    ]
    if ratios:
        worst, best = min(ratios), max(ratios)
        lines.append(f"Federated NDCG@20 is {worst[0]:.3f}x ({worst[1]}) to {best[0]:.3f}x "
                     f"({best[1]}) the centralized reference's.")
    if lifts:
        low = min(lifts)
        lines.append(f"Every federated filter's NDCG@20 is at least {low[0]:.2f}x item "
                     f"popularity's ({low[1]} lowest).")
    lines.append(
        f"Wall time: {sec['run_simulation']:.1f} s for the whole job. The federated run took "
        f"{sec['federated_protocol']:.1f} s, {sec['handshake']:.1f} s of it in the handshake "
        f"round (Ray starts its workers, each imports the ClientApp and loads its rows); the "
        f"centralized reference took {sec['centralized'] or 0:.1f} s.")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--protocol", default="")
    parser.add_argument("--nodes", type=int, default=4)
    args = parser.parse_args(argv)
    overrides = {"protocol": args.protocol} if args.protocol else {}
    log(f"main job {overrides or '(defaults)'} on {args.nodes} nodes")
    t0 = time.perf_counter()
    record = run_in_simulation({**overrides, "run-name": "bench-main-job"}, num_nodes=args.nodes,
                               quiet=True, compare=True, overwrite=True)
    res = summarize(record, time.perf_counter() - t0)
    stem = "main_job" if not args.protocol or args.protocol == "privirec" else \
        f"main_job_{args.protocol}"
    write_report(ROOT / "results" / f"{stem}.json", res, markdown(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
