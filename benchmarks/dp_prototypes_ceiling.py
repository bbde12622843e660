"""DP prototypes' centralized reference: paper 003's "Full" baseline as it ran before (the
run's L2 weight, ``dpp-nmf-iters`` HALS sweeps or the 1e-6 stop, never tuned) against the
tuned ceiling (``DPPrototypes.reference``: sweeps by early stopping and the L2 weight from a
grid, both on a validation split carved from train; ``fedrec/recsys/nmf_ceiling.py``), with
item popularity on the same splits.

Per dataset, in the leaderboard's dp-prototypes setting (``benchmarks/leaderboard.py``):
NDCG@20 on the validation rows (models trained on the fit rows, train without them) and on
the test split (models trained on all of train, scored as the silos score), the chosen
sweeps and weight, every candidate's validation NDCG and the seconds each took. Writes
``results/dp_prototypes/ceiling.{json,md}``; datasets already in the file are kept
(``--resume``).

    python benchmarks/dp_prototypes_ceiling.py --datasets ml-100k ml-1m
"""

from __future__ import annotations

import os

# One BLAS thread: the 2 cores are shared (as benchmarks/dp_prototypes.py).
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import logging  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # first: Opacus installs a top-level package named benchmarks

from benchmarks._board import cells, label  # noqa: E402
from benchmarks._report import (  # noqa: E402
    dataset_parser,
    log,
    measure_datasets,
    stored_datasets,
    stored_result,
    write_report,
)

OUT = REPO / "results" / "dp_prototypes" / "ceiling.json"
BOARD = REPO / "results" / "leaderboard.json"
COMMAND = "python benchmarks/dp_prototypes_ceiling.py --datasets ml-100k ml-1m"


def measure(dataset: str, data_dir: str = "") -> dict[str, Any]:
    """Popularity, the old Full reference and the tuned ceiling on validation and test."""
    from datasets import DatasetSpec, load_dataset
    from fedrec.recsys.metrics import evaluate_ranking, popularity_sums
    from fedrec.recsys.mf import validation_split
    from fedrec.recsys.nmf_ceiling import SWEEPS_PER_CHECK, NMFModel
    from fl_app.registry import resolve_config
    from strategies.dp_prototypes import DPPrototypes

    cell = next(c for c in cells([dataset], ["dp-prototypes"], data_dir))
    cfg = resolve_config(cell.config)
    data = load_dataset(DatasetSpec.from_config(cfg))
    s = DPPrototypes(cfg)
    fit, valid = validation_split(data.train, seed=s.seed)

    def ndcg_valid(model: NMFModel) -> float:
        return float(evaluate_ranking(model.score, fit, valid, k=s.top_k)
                     .means()[f"ndcg@{s.top_k}"])

    def full() -> NMFModel:  # the old reference: dpp-nmf-iters sweeps or the 1e-6 stop
        return NMFModel(s.rank, s.reg, s.nmf_iters)

    rounds = -(-s.nmf_iters // SWEEPS_PER_CHECK)
    t0 = time.perf_counter()
    old_model = full().fit(data.train, rounds)
    old = {"test": s.model_metrics(old_model, data), "sweeps": old_model.sweeps,
           "reg": s.reg, "valid": ndcg_valid(full().fit(fit, rounds)),
           "seconds": time.perf_counter() - t0}
    log(f"  {dataset}: old Full reference: validation {old['valid']:.4f}, test "
        f"{old['test']['ndcg@20']:.4f} ({old['seconds']:.1f} s)")
    t0 = time.perf_counter()
    tuned = s.tune(data.train)
    ceiling = s.ceiling_metrics(tuned, data)
    seconds = time.perf_counter() - t0
    log(f"  {dataset}: tuned ceiling: validation {ceiling['tuned-valid']:.4f}, test "
        f"{ceiling['ndcg@20']:.4f} ({seconds:.1f} s)")
    pop = {"valid": float(popularity_sums(fit, valid).means()["ndcg@20"]),
           "test": float(popularity_sums(data.train, data.test).means()["ndcg@20"])}
    board = (stored_result(BOARD) or {}).get("cells", {}).get(cell.key, {})
    return {"config": cell.config, "nodes": cell.nodes, "shape": list(data.train.shape),
            "train_nnz": int(data.train.nnz), "popularity": pop, "old_full": old,
            "tuned": {"test": {k: v for k, v in ceiling.items() if not k.startswith("tuned-")},
                      **{k[len("tuned-"):]: v for k, v in ceiling.items()
                         if k.startswith("tuned-")},
                      "checks": tuned.rounds, "curve": tuned.curve,
                      "candidates_valid": tuned.tried, "seconds": seconds},
            "federated_board": board.get("federated", {}).get("ndcg@20")}


def markdown(result: dict[str, Any]) -> str:
    from fedrec.recsys.mf import MAX_ROUND_FACTOR, PATIENCE, VALID_FRACTION
    from fedrec.recsys.nmf_ceiling import REG_FACTORS, REG_REFINE, SWEEPS_PER_CHECK

    lines = ["# DP prototypes: the centralized ceiling", "",
             "NDCG@20 of item popularity, paper 003's Full baseline as the reference ran it "
             "before (the run's L2 weight, `dpp-nmf-iters` HALS sweeps or the 1e-6 relative "
             "stop) and the tuned ceiling (`DPPrototypes.reference`): HALS sweeps by early "
             f"stopping on a {100 * VALID_FRACTION:.0f}% validation split carved from train "
             f"(NDCG@20 every {SWEEPS_PER_CHECK} sweeps, patience {PATIENCE} checks, at most "
             f"{MAX_ROUND_FACTOR} x `dpp-nmf-iters` sweeps, or the HALS stop), the L2 weight "
             f"at {', '.join(f'{f:g}' for f in REG_FACTORS)} x the run's, then "
             f"{' and '.join(f'{f:.3g}' for f in REG_REFINE)} x the best, the rank the "
             "run's; the winner retrained on all of train. Validation: trained on the fit "
             "rows (train without the validation rows), scored on the validation rows. Test: "
             "trained on all of train, scored as the silos score (the leaderboard's "
             "centralized column). The test split is read only for the test column. "
             f"Command: `{COMMAND}`.", "",
             "| dataset | model | L2 weight | HALS sweeps | validation NDCG@20 | test NDCG@20 "
             "| seconds |", "|---|---|---|---|---|---|---|"]
    for ds, r in result["datasets"].items():
        p, o, t = r["popularity"], r["old_full"], r["tuned"]
        name = label(ds)
        lines += [f"| {name} | item popularity | - | - | {p['valid']:.4f} | "
                  f"{p['test']:.4f} | - |",
                  f"| {name} | Full NMF, untuned (old reference) | {o['reg']:g} | "
                  f"{o['sweeps']} | {o['valid']:.4f} | {o['test']['ndcg@20']:.4f} | "
                  f"{o['seconds']:.1f} |",
                  f"| {name} | Full NMF, tuned ceiling | {t['reg']:g}"
                  f"{' (grid edge)' if t['at-edge'] else ''} | {int(t['rounds'])} | "
                  f"{t['valid']:.4f} | {t['test']['ndcg@20']:.4f} | {t['seconds']:.1f} |"]
        if r.get("federated_board") is not None:
            lines.append(f"| {name} | dp-prototypes, federated at epsilon 1 (leaderboard) | "
                         f"- | - | - | {r['federated_board']:.4f} | - |")
    lines.append("")
    for ds, r in result["datasets"].items():
        t = r["tuned"]
        cands = ", ".join(f"{float(k):g}: {v:.4f}" for k, v in
                          sorted(t["candidates_valid"].items(), key=lambda kv: float(kv[0])))
        lines += [f"{label(ds)} ({r['shape'][0]:,} users x {r['shape'][1]:,} items, "
                  f"{r['train_nnz']:,} training ratings, rank "
                  f"{r['config'].get('dpp-rank', 20)}): best validation NDCG@20 per L2 weight "
                  f"(each early stopped): {cands}. The scored model ran {int(t['rounds'])} "
                  f"sweeps on train ({t['checks']} checks chosen on validation); tuning and "
                  f"retraining took {t['seconds']:.0f} s.", ""]
    lines += [f"Machine: {result.get('machine', {})}.", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = dataset_parser(__doc__.splitlines()[0])
    args = ap.parse_args(argv)
    result = stored_datasets(OUT, args)
    if not args.markdown_only:
        logging.basicConfig(level=logging.INFO, format="  %(message)s")
        logging.getLogger("flwr").setLevel(logging.WARNING)
        measure_datasets(OUT, result, args.datasets, lambda ds: measure(ds, args.data_dir),
                         markdown)
        return
    write_report(OUT, result, markdown(result))


if __name__ == "__main__":
    main()
