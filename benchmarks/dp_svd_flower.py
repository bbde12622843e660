"""dp-svd as users run it: one user per node in a Flower simulation (Ray nodes, SecAgg+, each
node's discrete Gaussian share inside every sum, each node's own ledger), beside the same
math in one process, so the curves' in-process points (``benchmarks/dp_svd.py``) stand for
what the federation computes at a real node count, not only at the tests' dozens.

The run: ML-100K's 943 users, one per node, dp-svd at its defaults and ``dpsvd-epsilon``
(default 5), each node's policy ``dp-budget`` = epsilon and a ledger file of its own run
(``fedrec`` node policy). Beside it: the in-process math (``fedrec.recsys.dp_svd.simulate``)
on the same split at the run's noise multiplier, ``--seeds`` noise draws, item popularity
and random ranking. The federated run's noise is unseeded (OS-keyed, as every release), so
the comparison is distributional: the verdict "within" holds when the federated NDCG@20 lies
inside the in-process draws' mean +- 3 sample standard deviations (chosen: a draw of the same
distribution falls outside with probability ~0.3% under normality), else "outside".

    python benchmarks/dp_svd_flower.py            # ~25 min on 2 cores
    python benchmarks/dp_svd_flower.py --markdown-only
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # first: Opacus installs a top-level package named benchmarks

from benchmarks._report import log, machine_info, write_report  # noqa: E402

OUT = REPO / "results" / "dp_svd" / "flower-ml-100k.json"
DATASET, NODES = "ml-100k", 943
#: The verdict's band: in-process mean +- this many sample standard deviations.
BAND = 3.0


def within(value: float, draws: list[float], band: float = BAND) -> bool:
    """Whether ``value`` lies inside ``draws``' mean +- ``band`` sample standard deviations
    (at least 2 draws: one has no spread)."""
    a = np.asarray(draws, dtype=np.float64)
    if a.size < 2:
        return False
    return bool(abs(value - a.mean()) <= band * a.std(ddof=1))


def in_process(seeds: int, run: dict[str, Any]) -> dict[str, Any]:
    """The same math in one process on the run's split (``benchmarks/dp_svd.py``'s point):
    the run's own initial basis (its ``seed``) and ``seeds`` noise draws at the noise
    multiplier the run calibrates for its node count (the run's noise is its only
    randomness), item popularity and random ranking."""
    from benchmarks.dp_svd import _run
    from datasets import DatasetSpec, load_dataset
    from fedrec.recsys.metrics import evaluate_ranking, popularity_sums
    from fl_app.registry import resolve_config
    from strategies.dp_svd import DPSVD

    cfg = resolve_config(run["overrides"])
    data = load_dataset(DatasetSpec.from_config(cfg))
    strategy = DPSVD(cfg)
    p = strategy.params
    z = strategy.noise_multiplier(run["nodes"])
    setting = (p.items, p.rank, p.iterations, p.pop_weight)
    draws = [_run(data.train, data.test, setting, z, int(cfg["seed"]), 1000 + s)["ndcg@20"]
             for s in range(seeds)]
    rng = np.random.default_rng([0, 77])
    rand = evaluate_ranking(lambda r: rng.random((len(r), data.train.shape[1])), data.train,
                            data.test, k=20).means()["ndcg@20"]
    return {"noise_multiplier": z, "setting": list(setting), "ndcg@20": draws,
            "random": rand,
            "popularity": popularity_sums(data.train, data.test).means()["ndcg@20"]}


def markdown(result: dict[str, Any]) -> str:
    run, ref = result["run"], result["in_process"]
    draws = ref["ndcg@20"]
    mean, sd = float(np.mean(draws)), float(np.std(draws, ddof=1))
    lines = [f"# dp-svd in a Flower simulation: {result['nodes']} nodes, one user each", "",
             f"ML-100K (943 users, one per node), dp-svd at its defaults (items kept, rank, "
             f"iterations, counts' weight: {tuple(ref['setting'])}), `dpsvd-epsilon` "
             f"{result['epsilon']:g}, SecAgg+ with each node's discrete Gaussian share inside "
             "every sum, every node's policy `dp-budget` = epsilon and its own ledger. Beside "
             f"it the same math in one process at the run's noise multiplier "
             f"({ref['noise_multiplier']:.4g}) and the run's initial basis (its seed), "
             f"{len(draws)} noise draws. Command: "
             "`python benchmarks/dp_svd_flower.py`. flwr "
             f"{result['machine']['flwr_version']}, machine {result['machine']}.", ""]
    if not run["completed"]:
        return "\n".join([*lines, f"The simulation did not complete: {run['error']}", ""])
    fed = run["ndcg@20"]
    verdict = "within" if within(fed, draws) else "outside"
    lines += [
        "| what | NDCG@20 |", "|---|---|",
        f"| dp-svd, Flower simulation (epsilon {run['dp']['epsilon']:.4g} reported, delta "
        f"{run['dp']['delta']:g}) | {fed:.4f} |",
        f"| dp-svd, same math in one process (mean +- std of {len(draws)} noise draws; min - "
        "max) "
        f"| {mean:.4f} +- {sd:.4f} ({min(draws):.4f} - {max(draws):.4f}) |",
        f"| item popularity | {ref['popularity']:.4f} |",
        f"| random ranking | {ref['random']:.4f} |", "",
        f"Verdict (computed; rule: the federated value inside the in-process mean +- {BAND:g} "
        f"sample standard deviations): **{verdict}**.", "",
        f"The run completed in {run['wall_seconds']:.0f} s; per phase:", "",
        "| phase | rounds | wall s | bytes down per node | bytes up per node |",
        "|---|---|---|---|---|"]
    for name, ph in run["phases"].items():
        lines.append(f"| {name} | {ph['rounds']} | {ph['seconds']:.1f} | "
                     f"{ph['down_per_node']:,.0f} | {ph['up_per_node']:,.0f} |")
    return "\n".join([*lines, ""])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epsilon", type=float, default=5.0)
    ap.add_argument("--seeds", type=int, default=20, help="in-process noise draws")
    ap.add_argument("--markdown-only", action="store_true")
    args = ap.parse_args(argv)
    if args.markdown_only:
        result = json.loads(OUT.read_text())
        write_report(OUT, result, markdown(result))
        return 0
    from benchmarks.cross_device import simulated_run

    with tempfile.TemporaryDirectory() as tmp:  # this run's ledgers, gone after it
        log(f"dp-svd on {DATASET}, {NODES} nodes, epsilon {args.epsilon:g}")
        t0 = time.perf_counter()
        run = simulated_run(DATASET, NODES, None, "dp-svd",
                            {"dpsvd-epsilon": args.epsilon},
                            {"dp-budget": args.epsilon,
                             "dp-ledger": str(Path(tmp) / "ledger.json")})
        log(f"  completed: {run['completed']} ({time.perf_counter() - t0:.0f} s)")
    log("in-process draws")
    result = {"epsilon": args.epsilon, "nodes": NODES, "machine": machine_info(), "run": run,
              "in_process": in_process(args.seeds, run)}
    write_report(OUT, result, markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
