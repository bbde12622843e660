"""Is MVMF's centralized reference a ceiling? The leaderboard's fedmvmf config, its old
reference (the same model at the run's budget, equal to the federated run by construction)
and the tuned ceiling (``FedMVMF.reference``), on validation and on test.

Per dataset, with the leaderboard's fedmvmf cell config (item-servers 1, implicit false,
mvmf-top-k 20, seed 0):

- the federated run's test metrics, read from ``results/leaderboard.json`` (the cell; the
  lossless tests in ``tests/test_mvmf.py`` show the run equals the old reference);
- the old reference (``FedMVMF.budget_metrics``): the run's hyperparameters and epochs on
  all of train, scored on test; and the same trained on the ceiling's ``fit`` rows, scored
  on its validation rows (what the federated run would score there);
- the tuned ceiling (``FedMVMF.tune``: epochs by early stopping on a validation split carved
  from train, lr / lambda1 / lambda2 from a grid around the run's; the winner retrained on
  all of train), its validation NDCG, every candidate's, and its test metrics;
- two naive scores on MVMF's own candidate sets (a user's test-rated items for NDCG and P/R,
  all unrated items for the ``-all`` P/R): item popularity (training ratings per item) and
  the item's mean training rating.

Writes ``results/mvmf/ceiling.{json,md}``; datasets already in the file are kept
(``--resume``).

``--beyond-cap`` adds, per dataset, the chosen setting trained on the fit rows to twice the
epoch cap with its validation curve (what the cap leaves when the choice sits at it).

    FEDREC_DATA=/work/shared/data python benchmarks/mvmf_ceiling.py --datasets ml-100k ml-1m \
        --resume --beyond-cap
"""

from __future__ import annotations

import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

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

OUT = REPO / "results" / "mvmf" / "ceiling.json"
BOARD = REPO / "results" / "leaderboard.json"
K = 20


def naive(data: Any, k: int, threshold: float) -> dict[str, dict[str, float]]:
    """Item popularity and item mean rating, scored like MVMF (same candidate sets)."""
    from fedrec.recsys.multiview import rating_ranking_means, rating_ranking_sums

    train = data.train.tocsc()
    counts = np.diff(train.indptr).astype(np.float64)
    sums = np.asarray(train.sum(axis=0)).ravel()
    mean = np.where(counts > 0, sums / np.maximum(counts, 1), sums.sum() / counts.sum())
    out = {}
    for name, item_score in (("popularity", counts), ("item-mean", mean)):
        scores = np.tile(item_score, (data.n_users, 1))
        out[name] = rating_ranking_means(rating_ranking_sums(
            scores, data.train, data.test, k, threshold, data.cold_items), k)
    return out


def measure(dataset: str, board: dict[str, Any], data_dir: str = "") -> dict[str, Any]:
    """The old reference and the tuned ceiling on validation and test, with their cost."""
    from datasets import DatasetSpec, load_dataset
    from fedrec.recsys import multiview as M
    from fedrec.recsys.mf import PATIENCE, VALID_FRACTION, validation_split
    from fl_app.registry import resolve_config
    from strategies.mvmf import FedMVMF

    cell = next(c for c in cells([dataset], ["fedmvmf"], data_dir))
    cfg = resolve_config(cell.config)
    data = load_dataset(DatasetSpec.from_config(cfg))
    strategy = FedMVMF(cfg)
    run = strategy.model
    stored = board["cells"].get(cell.key, {})
    out: dict[str, Any] = {
        "config": cell.config, "rounds": strategy.epochs,
        "model": {"dim": run.dim, "lr": run.lr, "lam1": run.lam1, "lam2": run.lam2,
                  "weighting": run.weighting, "p_update": run.p_update},
        "tuning": {"valid_fraction": VALID_FRACTION, "patience_checks": PATIENCE,
                   "epochs_per_check": M.EPOCHS_PER_CHECK,
                   "max_epochs": M.MAX_EPOCH_FACTOR * strategy.epochs,
                   "grid": M.CEILING_GRID, "refine": M.CEILING_REFINE,
                   "selected_on": f"validation ndcg@{K} (validation-rated candidates)"},
        "federated": {k: stored["federated"][k] for k in (f"ndcg@{K}", f"recall@{K}")}
        if stored else {}, "seconds": {}}
    log(f"  {dataset}: old reference ({strategy.epochs} epochs at the run's setting)")
    t0 = time.perf_counter()
    old = strategy.budget_metrics(data)
    out["seconds"]["old-reference"] = time.perf_counter() - t0
    fit, valid = validation_split(data.train, seed=run.seed)
    X = strategy.attributes(data)
    at_budget = M.RatingMVMF(run, X, data.item_features, data.cold_items, K,
                             strategy.threshold).fit(fit, strategy.epochs)
    out["old"] = {"test": old, "valid": M.RatingMVMF.validation_ndcg(at_budget, fit, valid),
                  "epochs": strategy.epochs}
    log(f"  {dataset}: tuned ceiling")
    t0, c0, load = time.perf_counter(), time.process_time(), os.getloadavg()[0]
    tuned = strategy.tune(data)
    out["seconds"]["tuning"] = time.perf_counter() - t0
    # the machine is shared: this process's CPU time and the load beside the wall time
    out["seconds"]["tuning-cpu"] = time.process_time() - c0
    out["load_average"] = [load, os.getloadavg()[0]]
    t0 = time.perf_counter()
    out["ceiling"] = {"test": strategy.ceiling_metrics(data, tuned), "valid": tuned.valid,
                      "epochs": tuned.epochs, "lr": tuned.cfg.lr, "lam1": tuned.cfg.lam1,
                      "lam2": tuned.cfg.lam2, "candidates": tuned.tried,
                      "at_edge": tuned.at_edge}
    out["seconds"]["ceiling-test-scoring"] = time.perf_counter() - t0
    out["naive"] = naive(data, K, strategy.threshold)
    return out


def beyond_cap(dataset: str, stored: dict[str, Any], data_dir: str = "") -> dict[str, Any]:
    """The chosen setting trained on the ceiling's fit rows for twice the cap, validation
    NDCG at every check: what the cap leaves when the choice sits at it."""
    from dataclasses import replace

    from datasets import DatasetSpec, load_dataset
    from fedrec.recsys import multiview as M
    from fedrec.recsys.mf import fit_early_stopped
    from fl_app.registry import resolve_config
    from strategies.mvmf import FedMVMF

    cell = next(c for c in cells([dataset], ["fedmvmf"], data_dir))
    cfg = resolve_config(cell.config)
    data = load_dataset(DatasetSpec.from_config(cfg))
    strategy = FedMVMF(cfg)
    c = stored["ceiling"]
    chosen = replace(strategy.model, lr=c["lr"], lam1=c["lam1"], lam2=c["lam2"])
    per, cap = M.EPOCHS_PER_CHECK, stored["tuning"]["max_epochs"]
    t0 = time.perf_counter()
    out = fit_early_stopped(
        lambda: M.RatingMVMF(chosen, strategy.attributes(data), data.item_features,
                             data.cold_items, K, strategy.threshold, per),
        data.train, 2 * cap // per, patience=2 * cap, seed=strategy.model.seed,
        retrain=False, metric=M.RatingMVMF.validation_ndcg)
    return {"epochs": [per * (i + 1) for i in range(len(out.curve))], "valid": out.curve,
            "best_epochs": out.rounds * per, "best_valid": max(out.curve),
            "seconds": time.perf_counter() - t0}


def markdown(result: dict[str, Any]) -> str:

    lines = ["# MVMF: the tuned centralized ceiling against the old reference", "",
             f"MVMF's own metric (NDCG@{K} and Recall@{K} on each user's test-rated items, "
             "ratings >= 4 relevant; `-all`: every unrated item a candidate). The old "
             "reference is the run's model at the run's epochs and hyperparameters (equal "
             "to the federated run by construction); the ceiling is the same model (same "
             "dim, weighting, sampling, solver) with epochs chosen by early stopping on a "
             "10% validation split carved from train and (lr, lambda1, lambda2) chosen on "
             "it, then retrained on all of train. Validation: NDCG of the held-out training "
             "ratings ranked among themselves, models trained on the other 90%. Command: "
             "`FEDREC_DATA=/work/shared/data python benchmarks/mvmf_ceiling.py --datasets "
             "ml-100k ml-1m --resume --beyond-cap`.", ""]
    for ds, r in result["datasets"].items():
        o, c, t = r["old"], r["ceiling"], r["tuning"]
        fed = r.get("federated", {})
        lines += [f"## {label(ds)}", "",
                  f"Run: {r['rounds']} epochs, lr {r['model']['lr']:g}, lambda1 "
                  f"{r['model']['lam1']:g}, lambda2 {r['model']['lam2']:g}, dim "
                  f"{r['model']['dim']}. Tuning: a check every {t['epochs_per_check']} "
                  f"epochs, patience {t['patience_checks']} checks, at most "
                  f"{t['max_epochs']} epochs, {len(c['candidates'])} candidates; "
                  f"{r['seconds']['tuning']:.0f} s wall"
                  + (f", {r['seconds']['tuning-cpu']:.0f} s CPU of this process, 1-minute "
                     "load average {:.1f} at the start and {:.1f} at the end".format(
                         *r["load_average"]) if "tuning-cpu" in r["seconds"] else "")
                  + f" (old reference {r['seconds']['old-reference']:.1f} s).", "",
                  f"| model | epochs | lr | lambda1 | lambda2 | validation NDCG@{K} | "
                  f"test NDCG@{K} | test Recall@{K} | test Recall@{K}-all |",
                  "|---|---|---|---|---|---|---|---|---|"]
        if fed:
            lines.append(f"| federated run (leaderboard) | {r['rounds']} | "
                         f"{r['model']['lr']:g} | {r['model']['lam1']:g} | "
                         f"{r['model']['lam2']:g} | - | {fed[f'ndcg@{K}']:.4f} | "
                         f"{fed[f'recall@{K}']:.4f} | - |")
        for name, m, v in (("old reference (run's budget)", o, o["valid"]),
                           ("tuned ceiling", c, c["valid"])):
            hp = (r["model"] if m is o else m)
            lines.append(f"| {name} | {m['epochs']} | {hp['lr']:g} | {hp['lam1']:g} | "
                         f"{hp['lam2']:g} | {v:.4f} | {m['test'][f'ndcg@{K}']:.4f} | "
                         f"{m['test'][f'recall@{K}']:.4f} | "
                         f"{m['test'][f'recall@{K}-all']:.4f} |")
        for name, m in r["naive"].items():
            lines.append(f"| {name} (naive) | - | - | - | - | - | {m[f'ndcg@{K}']:.4f} | "
                         f"{m[f'recall@{K}']:.4f} | {m[f'recall@{K}-all']:.4f} |")
        ratio = (fed or o["test"])[f"ndcg@{K}"] / c["test"][f"ndcg@{K}"]
        limits = (["a chosen lr or lambda is its grid's smallest or largest"]
                  if c["at_edge"] else []) + (
            [f"the chosen epochs are the cap ({t['max_epochs']}): the best validation check "
             "was the last one allowed"] if c["epochs"] >= t["max_epochs"] else [])
        b = r.get("beyond_cap")
        if b:
            at_cap = b["valid"][b["epochs"].index(t["max_epochs"])]
            limits.append(f"trained on to {b['epochs'][-1]} epochs at the chosen setting, "
                          f"validation NDCG@{K} peaks at {b['best_valid']:.4f} at "
                          f"{b['best_epochs']} epochs against {at_cap:.4f} at the cap")
        lines += ["", f"fed / cen (NDCG@{K}, test): {ratio:.3f}"
                  + (f" ({'; '.join(limits)})" if limits else "") + ".",
                  "", "Candidates (lr, lambda1, lambda2: best validation NDCG): "
                  + "; ".join(f"{k}: {v:.4f}" for k, v in c["candidates"].items()) + ".", ""]
    lines += [f"Machine: {result.get('machine', {})}.", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = dataset_parser(__doc__.splitlines()[0])
    ap.add_argument("--beyond-cap", action="store_true",
                    help="also train the chosen setting on fit to twice the cap (the "
                         "validation curve past it)")
    args = ap.parse_args(argv)
    result = stored_datasets(OUT, args)
    if not args.markdown_only:
        logging.getLogger("flwr").setLevel(logging.WARNING)
        logging.basicConfig(level=logging.INFO, format="  %(message)s")
        board = stored_result(BOARD) or {"cells": {}}
        measure_datasets(
            OUT, result, args.datasets, lambda ds: measure(ds, board, args.data_dir), markdown,
            ("beyond_cap", "the chosen setting to twice the cap",
             lambda ds, stored: beyond_cap(ds, stored, args.data_dir))
            if args.beyond_cap else None)
    refresh_federated(result, stored_result(BOARD) or {"cells": {}})
    write_report(OUT, result, markdown(result))


def refresh_federated(result: dict[str, Any], board: dict[str, Any]) -> None:
    """Each dataset's federated metrics from the board's fedmvmf cell as it is now (the
    board may be regenerated after the ceiling was measured; no cell: kept as stored)."""
    for ds, r in result["datasets"].items():
        cell = board["cells"].get(f"{ds}/fedmvmf")
        if cell is not None:
            r["federated"] = {k: cell["federated"][k] for k in (f"ndcg@{K}", f"recall@{K}")}


if __name__ == "__main__":
    main()
