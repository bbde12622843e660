"""LP-GCN's leaderboard cells trained to convergence: the epoch count chosen by the paper's
stopping rule on a validation split, the model at that count, and a Flower simulation showing
the federated run computes that model's arithmetic.

A federated LP-GCN epoch costs ~24x a centralized one here (``results/lpgcn/gowalla.md``;
ML-100K: ~130 s per epoch at 8 nodes against ~1 s), and LP-GCN computes the centralized
LightGCN's steps exactly (``results/lpgcn/ml-100k_simulation.md``: two whole ML-100K epochs
through a Flower simulation, largest difference 2e-13; the leaderboard's earlier 3-epoch cell:
equal NDCG@20 to every printed digit). So each cell is three units:

1. ``select``: centralized LightGCN at the board's hyperparameters (those of the federated run)
   trained on ``fit`` and scored on ``valid`` (``fedrec.recsys.mf.validation_split``: 10% of
   each user's training interactions, seed 0; the test split is never read), NDCG@20 every 5
   epochs, stopped after 50 epochs without a better one or at 1000 (paper 001: evaluation every
   5 epochs, 50 epochs of patience, at most 1000 epochs; the paper watches Recall@20, the board
   ranks by NDCG@20, so NDCG@20 is watched).
2. ``final``: the same model on all of train for the chosen epoch count, scored on test. This
   is the centralized ceiling and, by the equality of unit 3, the federated run's result.
3. ``federated``: the board's run config with ``lpgcn-epochs`` = ``--fed-epochs`` through
   ``run_in_simulation`` (8 nodes, the project's ServerApp and ClientApp, the safe node policy)
   with ``compare=True``: its metrics and loss against the centralized model at the same
   epochs, and the rounds and bytes of setup and of one training epoch (its ledger's phases),
   from which the cell's rounds and bytes at the chosen epoch count follow.

Every unit is stored in ``results/lpgcn/converged.json`` as it finishes, training checkpoints
every epoch under ``--checkpoint-dir``, and a rerun continues (same config). Each dataset's
cell goes into ``results/leaderboard.json`` when its three units are done.

On a user's own split (``--datasets NAME --data-dir DIR``: any folder the project's loader
reads, docs/datasets.md) the same three units run on it, and everything goes beside that
split's board (``benchmarks/_board.default_out``: ``results/boards/NAME/``): the units in
``lpgcn_converged.json``, the checkpoints in ``checkpoints/``, the cell into its
``leaderboard.json``; the shipped results are never touched.

    python benchmarks/lpgcn_converged.py                       # ML-100K, then ML-1M
    python benchmarks/lpgcn_converged.py --datasets ml-100k --fed-epochs 1
    python benchmarks/lpgcn_converged.py --datasets my-data --data-dir DIR
    python benchmarks/lpgcn_converged.py --markdown-only
    python benchmarks/lpgcn_converged.py --device cuda         # centralized units on a GPU
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # first: Opacus installs a top-level package named benchmarks

from benchmarks._board import OUT as BOARD  # noqa: E402
from benchmarks._board import (  # noqa: E402
    board_config,
    board_data,
    cells,
    default_out,
    server_sees,
)
from benchmarks._board_report import markdown as board_markdown  # noqa: E402
from benchmarks._board_report import plot as board_plot  # noqa: E402
from benchmarks._report import (  # noqa: E402
    Units,
    log,
    machine_info,
    stored_result,
    write_report,
)
from benchmarks.lpgcn_table4 import CHECKPOINTS, available, model_builder, train_job  # noqa: E402

OUT = REPO / "results" / "lpgcn" / "converged.json"
#: Paper 001's stopping rule (digest section 2.12): evaluate every 5 epochs, stop after 50
#: epochs (10 evaluations) without a better one, at most 1000 epochs.
EVAL_EVERY, PATIENCE_EPOCHS, MAX_EPOCHS = 5, 50, 1000
NODES = 8
K = 20
DATASETS = ("ml-100k", "ml-1m")


@dataclass(frozen=True)
class Phase:
    """One centralized training unit of a cell (``select`` or ``final``)."""

    dataset: str
    phase: str
    config: tuple[tuple[str, Any], ...]

    @property
    def key(self) -> str:
        return f"leaderboard/{self.dataset}/{self.phase}"

    def setting(self) -> dict[str, Any]:
        """The hyperparameters (and, for ``final``, the epoch count) a checkpoint must match."""
        return {k: v for k, v in self.config
                if k.startswith("lpgcn-") and (self.phase == "final" or k != "lpgcn-epochs")}


def check_datasets(datasets: list[str], data_dir: str = "") -> None:
    """Load every split as the units will, so a bad name or folder stops the run before its
    first unit, naming it."""
    for ds in datasets:
        try:
            board_data(board_config(ds, data_dir))
        except (ValueError, FileNotFoundError) as exc:  # DataError is a ValueError
            raise SystemExit(f"error: --datasets {ds}: {exc}") from None


def select(dataset: str, cfg: dict[str, Any], ckpt: Path,
           device: str = "numpy") -> dict[str, Any]:
    """Unit 1: the epoch count the stopping rule picks on the validation split."""
    from fedrec.recsys.mf import validation_split

    data = board_data(cfg)
    fit, valid = validation_split(data.train, seed=int(cfg["seed"]))
    job = Phase(dataset, "select", tuple(sorted(cfg.items())))
    rec = train_job(job, fit, valid, ckpt, resume=True, max_epochs=MAX_EPOCHS,
                    eval_every=EVAL_EVERY, patience=PATIENCE_EPOCHS // EVAL_EVERY,
                    build=model_builder(cfg, device))
    best = max(rec["curve"], key=lambda p: (p[f"ndcg@{K}"], -p["epoch"]))
    return {"epochs": best["epoch"], "stopped": rec["status"], "trained_epochs": rec["epochs"],
            "valid_ndcg@20": best[f"ndcg@{K}"], "valid_recall@20": best[f"recall@{K}"],
            "curve": rec["curve"], "fit_interactions": int(fit.nnz),
            "valid_interactions": int(valid.nnz), "seconds": rec["train_seconds"],
            "s_per_epoch": rec["train_seconds"] / max(rec["epochs"], 1)}


def final(dataset: str, cfg: dict[str, Any], epochs: int, ckpt: Path,
          device: str = "numpy") -> dict[str, Any]:
    """Unit 2: the model on all of train for ``epochs``, its test metrics (the ceiling)."""
    from fedrec.recsys.metrics import evaluate_ranking, popularity_sums

    data = board_data(cfg)
    job = Phase(dataset, "final", tuple(sorted({**cfg, "lpgcn-epochs": epochs}.items())))
    build = model_builder(cfg, device)
    holder: dict[str, Any] = {}

    def make(train: Any) -> Any:
        holder["model"] = build(train)
        return holder["model"]

    rec = train_job(job, data.train, data.test, ckpt, resume=True, max_epochs=epochs,
                    eval_every=epochs, patience=10**9, build=make)
    model = holder["model"]
    uf, vf = model.final_embeddings()
    metrics = evaluate_ranking(lambda rows: uf[rows] @ vf.T, data.train, data.test,
                               k=int(cfg["lpgcn-top-k"])).means()
    pop = popularity_sums(data.train, data.test, k=int(cfg["lpgcn-top-k"])).means()
    return {"epochs": epochs, "metrics": {"train-loss": model.losses[-1], **metrics},
            "popularity": pop, "seconds": rec["train_seconds"],
            "s_per_epoch": rec["train_seconds"] / max(rec["epochs"], 1),
            "train_interactions": int(data.train.nnz), "shape": list(data.train.shape)}


def federated(given: dict[str, Any], epochs: int) -> dict[str, Any]:
    """Unit 3: ``epochs`` whole epochs through a Flower simulation of the cell's run config
    (``given``: the keys it names, as a run is started) against the centralized model at the
    same epochs; rounds and bytes of setup and per training epoch."""
    from fl_app.simulation import run_in_simulation

    logging.getLogger("flwr").setLevel(logging.WARNING)
    run_cfg = {**given, "lpgcn-epochs": epochs}
    t0 = time.perf_counter()
    record = run_in_simulation(run_cfg, NODES, quiet=True, compare=True)
    wall = time.perf_counter() - t0
    comp, comm = record["comparison"], record["communication"]
    fed, cen = comp["federated"], comp["centralized"]
    phases = comm["phases"]
    if not any(name.startswith("lpgcn-train") for name in phases):
        raise RuntimeError(f"the run's ledger has no lpgcn-train phase: {sorted(phases)}")
    return {"epochs": epochs, "nodes": NODES, "federated": fed, "centralized": cen,
            "max_abs_metric_diff": max(abs(fed[k] - cen[k]) for k in fed if k in cen),
            "rounds": comm["total_rounds"], "phases": phases,
            "bytes_per_node": comm["bytes_per_node"],
            "server_sees": server_sees("lpgcn", record["privacy"]),
            "seconds": {"wall": wall, "federated": record["seconds"],
                        "centralized": comp.get("centralized_seconds")}}


def per_epoch(fed: dict[str, Any]) -> tuple[float, float]:
    """(rounds, bytes per node) of one training epoch and (the rest) of setup + evaluation,
    from the federated unit's ledger: the train phase divided by its epochs."""
    train = [p for name, p in fed["phases"].items() if name.startswith("lpgcn-train")]
    rounds = sum(p["rounds"] for p in train) / fed["epochs"]
    total_bytes = fed["bytes_per_node"]["mean_down"] + fed["bytes_per_node"]["mean_up"]
    share = sum(p["bytes_down"] + p["bytes_up"] for p in train) / max(_all_bytes(fed), 1)
    return rounds, total_bytes * share / fed["epochs"]


def _train_seconds(fed: dict[str, Any]) -> float:
    return sum(p["seconds"] for n, p in fed["phases"].items() if n.startswith("lpgcn-train"))


def _all_bytes(fed: dict[str, Any]) -> float:
    return sum(p["bytes_down"] + p["bytes_up"] for p in fed["phases"].values())


def leaderboard_cell(dataset: str, cfg: dict[str, Any], units: dict[str, Any]) -> dict[str, Any]:
    """The board's cell from the three units: metrics of the converged model (centralized and
    federated: the same arithmetic), rounds and bytes at its epoch count."""
    sel, fin, fed = units["select"], units["final"], units["federated"]
    epochs = fin["epochs"]
    r_epoch, b_epoch = per_epoch(fed)
    fixed_rounds = fed["rounds"] - r_epoch * fed["epochs"]
    bpn = fed["bytes_per_node"]["mean_down"] + fed["bytes_per_node"]["mean_up"]
    fixed_bytes = bpn - b_epoch * fed["epochs"]
    note = (f"{epochs} epochs, chosen by the paper's stopping rule on a validation split of "
            f"train (10% of each user's interactions; best validation NDCG@20 "
            f"{sel['valid_ndcg@20']:.4f}, {sel['trained_epochs']} epochs trained, stopped by "
            f"{sel['stopped']}); the number is the centralized LightGCN at that count, which "
            f"LP-GCN computes exactly: a {fed['epochs']}-epoch Flower simulation of this config "
            f"({fed['nodes']} nodes) matched the centralized model after the same epochs "
            f"(largest metric difference {fed['max_abs_metric_diff']:.1e}); rounds and bytes "
            f"are its setup plus {epochs} x its per-epoch {r_epoch:.0f} rounds and "
            f"{b_epoch / 1e6:.1f} MB per node")
    return {"protocol": "lpgcn", "dataset": dataset, "nodes": fed["nodes"],
            "config": {k: v for k, v in {**cfg, "lpgcn-epochs": epochs}.items()
                       if k.startswith("lpgcn-") or k in ("protocol", "dataset", "seed",
                                                          "drop-cold-items", "aggregator")},
            "node_policy": {}, "federated": fin["metrics"],
            "centralized": {**fin["metrics"], "tuned-rounds": float(epochs)},
            "popularity": fin["popularity"],
            "rounds": int(round(fixed_rounds + r_epoch * epochs)),
            "bytes_per_node": fixed_bytes + b_epoch * epochs,
            "server_sees": fed["server_sees"], "epsilon": None, "epsilon_not_valid": None,
            "note": note, "evidence": "results/lpgcn/converged.json",
            "seconds": {"centralized": fin["seconds"], "selection": sel["seconds"],
                        "federated_check": fed["seconds"]["wall"]}}


def markdown(result: dict[str, Any]) -> str:
    units = result["units"]
    lines = ["# LP-GCN trained to convergence: the leaderboard's cells", "",
             "Centralized LightGCN at the board's LP-GCN hyperparameters; epochs chosen on a "
             "validation split of train (10% of each user's interactions, seed 0), NDCG@20 "
             f"every {EVAL_EVERY} epochs, stopped after {PATIENCE_EPOCHS} epochs without a "
             f"better one or at {MAX_EPOCHS} (paper 001's rule); then retrained on all of "
             "train for that count and scored on test. The federated check runs whole epochs "
             "of the same config through a Flower simulation against the centralized model "
             "at the same epochs.", "",
             "| dataset | epochs chosen | stopped | valid NDCG@20 | test NDCG@20 | test "
             "Recall@20 | popularity NDCG@20 | fed check: epochs, max metric diff | rounds / "
             "epoch | MB per node / epoch | s/epoch centralized | s/epoch federated |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for ds in result["config"]["datasets"]:
        sel, fin, fed = (units.get(f"{ds}/{u}") for u in ("select", "final", "federated"))
        if sel is None:
            continue
        row = [ds, str(sel["epochs"]), f"{sel['stopped']} at {sel['trained_epochs']}",
               f"{sel['valid_ndcg@20']:.4f}"]
        row += ([f"{fin['metrics']['ndcg@20']:.4f}", f"{fin['metrics']['recall@20']:.4f}",
                 f"{fin['popularity']['ndcg@20']:.4f}"] if fin else ["-"] * 3)
        if fed:
            r, b = per_epoch(fed)
            row += [f"{fed['epochs']}, {fed['max_abs_metric_diff']:.1e}", f"{r:.0f}",
                    f"{b / 1e6:.1f}", f"{sel['s_per_epoch']:.2f}",
                    f"{_train_seconds(fed) / fed['epochs']:.0f}"]
        else:
            row += ["-", "-", "-", f"{sel['s_per_epoch']:.2f}", "-"]
        lines.append("| " + " | ".join(row) + " |")
    config = result["config"]
    own = (f" --datasets {' '.join(config['datasets'])} --data-dir {config['data_dir']}"
           if config.get("data_dir") else "")
    lines += ["", f"Config: {config}.", "",
              f"Command: `python benchmarks/lpgcn_converged.py{own}` (continues where it "
              "stopped).",
              f"Machine: {result.get('machine', {})}.", ""]
    return "\n".join(lines)


def write(units: Units) -> None:
    result = {"config": units.config, "units": units.done, "machine": machine_info()}
    write_report(units.path, result, markdown(result))


def put_cell(board: Path, cell: dict[str, Any]) -> None:
    """Put the cell into the leaderboard file and regenerate its Markdown and plot."""
    result = stored_result(board) or {"cells": {}}
    key = f"{cell['dataset']}/lpgcn"
    result["cells"][key] = cell
    result.get("failed", {}).pop(key, None)
    write_report(board, result, board_markdown(result))
    board_plot(result, board.with_suffix(".png"))


def run(dataset: str, units: Units, fed_epochs: int, ckpt: Path,
        device: str = "numpy", data_dir: str = "") -> dict[str, Any]:
    """The three units of ``dataset`` (from ``data_dir`` when given; stored ones are kept)
    and its leaderboard cell."""
    cfg = board_config(dataset, data_dir)
    (cell,) = cells([dataset], ["lpgcn"], data_dir)  # its run config as given
    done: dict[str, Any] = {}
    for name, work in (("select", lambda: select(dataset, cfg, ckpt, device)),
                       ("final", lambda: final(dataset, cfg, done["select"]["epochs"], ckpt,
                                               device)),
                       ("federated", lambda: federated(cell.config, fed_epochs))):
        log(f"{dataset}/{name}")
        done[name] = units.get(f"{dataset}/{name}", work)
        write(units)
    return leaderboard_cell(dataset, cfg, done)


def units_for(fed_epochs: int = 1, out: Path = OUT, datasets: tuple[str, ...] = DATASETS,
              data_dir: str = "") -> Units:
    """The units file of this config, its stored units kept (a user's split records its
    folder, so units of another folder's split of the same name are never taken)."""
    config: dict[str, Any] = {
        "datasets": list(datasets), "fed_epochs": fed_epochs,
        "eval_every": EVAL_EVERY, "patience_epochs": PATIENCE_EPOCHS,
        "max_epochs": MAX_EPOCHS, "nodes": NODES,
        "lpgcn": {ds: {k: v for k, v in board_config(ds, data_dir).items()
                       if k.startswith("lpgcn-") or k == "drop-cold-items"}
                  for ds in datasets}}
    if data_dir:
        config["data_dir"] = data_dir
    return Units(out, config, resume=True)


def places(datasets: list[str], data_dir: str = "") -> tuple[Path, Path, Path, bool]:
    """(board, units file, checkpoint folder, shipped): the shipped board's files for its own
    datasets at the default data location, else the folder of that split's own board."""
    board = default_out(datasets, data_dir)
    if board == BOARD:
        return BOARD, OUT, CHECKPOINTS, True
    return board, board.parent / "lpgcn_converged.json", board.parent / "checkpoints", False


def converged_cell(dataset: str, ckpt: Path = CHECKPOINTS) -> dict[str, Any]:
    """The leaderboard's converged LP-GCN cell of ``dataset``, running the units it lacks."""
    return run(dataset, units_for(), 1, ckpt)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--datasets", nargs="+", default=list(DATASETS),
                    help="built-in names or the folder names of splits under --data-dir")
    ap.add_argument("--data-dir", default="", help="where a user's split folders are "
                    "(docs/datasets.md, 'Your own data')")
    ap.add_argument("--fed-epochs", type=int, default=1, help="whole epochs of the federated "
                    "check (Flower simulation)")
    ap.add_argument("--checkpoint-dir", type=Path, default=None, help="default: "
                    f"{CHECKPOINTS.relative_to(REPO)}, a user's split: checkpoints/ beside its "
                    "board")
    ap.add_argument("--out", type=Path, default=None, help=f"default: {OUT.relative_to(REPO)}, "
                    "a user's split: lpgcn_converged.json beside its board")
    ap.add_argument("--board", type=Path, default=None, help=f"default: "
                    f"{BOARD.relative_to(REPO)}, a user's split: results/boards/<datasets>/")
    ap.add_argument("--markdown-only", action="store_true")
    ap.add_argument("--device", default="numpy", help="centralized training on numpy (the "
                    "reference) or a torch device: cpu, cuda, cuda:N")
    args = ap.parse_args(argv)
    if (why := available(args.device)) is not None:
        raise SystemExit(f"error: --device: {why}")
    board, out, ckpt, shipped = places(args.datasets, args.data_dir)
    board, out = args.board or board, args.out or out
    ckpt = args.checkpoint_dir or ckpt
    if not args.markdown_only:
        check_datasets(args.datasets, args.data_dir)
    units = units_for(args.fed_epochs, out, DATASETS if shipped else tuple(args.datasets),
                      args.data_dir)
    if args.markdown_only:
        write(units)
        return
    for ds in args.datasets:
        put_cell(board, run(ds, units, args.fed_epochs, ckpt, args.device, args.data_dir))
        log(f"{ds}: cell written to {board}")


if __name__ == "__main__":
    main()
