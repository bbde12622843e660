"""Every protocol on the same splits, side by side: NDCG@20 and Recall@20 beside item
popularity and the protocol's own centralized reference, bytes per node, synchronous rounds,
what the server sees and epsilon where DP applies.

Each cell is one protocol on one dataset, run as a user runs it (``run_in_simulation``: a
Flower simulation, the project's ServerApp and ClientApp, ``compare=True`` for the
centralized reference and popularity on the same split). Every dataset's split is its
loader's: seed 0, each user's interactions 80/20 (ML-100K, ML-1M), or the published LightGCN
split (Gowalla, Yelp2018). Implicit protocols read the interactions as 1s; the explicit ones
(DP prototypes, FedMVMF/PrivMVMF) read the ratings of the same interactions. Every
protocol's metrics are its own nodes' sums: binary relevance of held-out interactions over
the unseen catalogue, except MVMF's, which ranks the paper's candidate set with test ratings
>= 4 relevant (marked in the table).

Cells are written as they finish, so ``--resume`` continues an interrupted board; the
default cells take about an hour on 2 cores.

    python benchmarks/leaderboard.py                       # ML-100K and ML-1M, every protocol
    python benchmarks/leaderboard.py --resume              # only the cells not yet in the file
    python benchmarks/leaderboard.py --datasets ml-100k --protocols fedmf privirec
    python benchmarks/leaderboard.py --datasets my-data --data-dir /path  # /path/my-data/
    python benchmarks/leaderboard.py --markdown-only

``--datasets`` takes what ``run_simulation.py --dataset`` takes: a built-in name or the
folder of your own split, ``<data-dir>/<name>/`` with ``train.npz`` + ``test.npz`` or
``train.txt`` + ``test.txt`` (docs/datasets.md). Every dataset is loaded by the project's
loader before the first cell runs, so a missing or malformed split fails at once.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # first: Opacus installs a top-level package named benchmarks

from benchmarks._board import (  # noqa: E402
    CONVERGED_LPGCN,
    LABEL,
    ORDER,
    OUT,
    Cell,
    cells,
    dp_epsilon,
    server_sees,
)
from benchmarks._board_report import markdown, plot  # noqa: E402
from benchmarks._report import (  # noqa: E402
    log,
    machine_info,
    rewrite_markdown,
    stored_result,
    write_report,
)
from benchmarks.lpgcn_converged import converged_cell  # noqa: E402


def check_datasets(datasets: list[str], data_dir: str = "") -> None:
    """Load every dataset the way a run will (the project's loader: built-in names and any
    folder split), so a bad name or split stops the board before its first cell."""
    from datasets import DatasetSpec, load_dataset

    for ds in datasets:
        try:
            load_dataset(DatasetSpec(name=ds, data_dir=data_dir))
        except (ValueError, FileNotFoundError) as exc:  # DataError is a ValueError
            raise SystemExit(f"error: --datasets {ds}: {exc}") from None


#: Protocols whose centralized reference is another's, computed the same way on the same data
#: and keys (PrivMVMF inherits FedMVMF.reference; the aggregator never enters it): the board
#: copies that cell's reference instead of tuning it twice, and says so in the cell.
SHARED_REFERENCE = {"privmvmf": "fedmvmf"}
#: Keys that differ between such a pair without entering the reference.
NOT_IN_REFERENCE = ("protocol", "aggregator")


def shared_reference(cell: Cell, board: dict[str, Any]) -> tuple[str, dict[str, Any]] | None:
    """The board cell whose reference ``cell`` may copy (its key and the cell), or None."""
    other = SHARED_REFERENCE.get(cell.protocol)
    source = board.get("cells", {}).get(f"{cell.dataset}/{other}") if other else None
    if source is None or "centralized_from" in source:
        return None

    def keys(config: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in config.items() if k not in NOT_IN_REFERENCE}

    same = keys(source["config"]) == keys(cell.config)
    return (f"{cell.dataset}/{other}", source) if same and source["centralized"] else None


def run_cell(cell: Cell, board: dict[str, Any] | None = None) -> dict[str, Any]:
    from fl_app.simulation import run_in_simulation

    if (cell.protocol == "lpgcn" and cell.dataset in CONVERGED_LPGCN
            and "data-dir" not in cell.config):
        return converged_cell(cell.dataset)  # its units resume from results/lpgcn/converged.json

    shared = shared_reference(cell, board or {})
    t0 = time.perf_counter()
    record = run_in_simulation(cell.config, cell.nodes, quiet=True, compare=shared is None,
                               node_policy=cell.policy, overwrite=True)
    wall = time.perf_counter() - t0
    if shared is None:
        comp = record["comparison"]
    else:  # the same reference, on the same split (dataset and seed are among the keys)
        key, source = shared
        comp = {"federated": dict(record["metrics"]), "centralized": source["centralized"],
                "popularity": source["popularity"], "centralized_from": key}
    comm = record["communication"]
    bpn = comm["bytes_per_node"]
    return {"protocol": cell.protocol, "dataset": cell.dataset, "nodes": cell.nodes,
            "config": {k: v for k, v in record["config"].items()
                       if k in cell.config or k in ("aggregator",)},
            "node_policy": cell.policy, "federated": comp["federated"],
            "centralized": comp.get("centralized", {}), "popularity": comp["popularity"],
            "rounds": comm["total_rounds"], "bytes_per_node": bpn["mean_down"] + bpn["mean_up"],
            "server_sees": server_sees(cell.protocol, record["privacy"]),
            "epsilon": dp_epsilon(record["privacy"].get("dp", record["privacy"])),
            "epsilon_not_valid": dp_epsilon(record["privacy"].get("dp", record["privacy"]),
                                          valid=False),
            "seconds": {"wall": wall, "federated": record["seconds"],
                        "centralized": comp.get("centralized_seconds")},
            **({"centralized_from": comp["centralized_from"]} if "centralized_from" in comp
               else {})}


def refresh_from_runs(result: dict[str, Any], runs: Path) -> None:
    """Re-read what the board derives from each run's stored record (``results/runs``), so
    a change in how it reads a record reaches cells run before the change."""
    for cell in result["cells"].values():
        path = runs / f"{cell['protocol']}-{cell['dataset']}-0.json"
        if path.is_file():
            privacy = json.loads(path.read_text()).get("privacy", {})
            dp = privacy.get("dp", privacy)
            cell["epsilon"] = dp_epsilon(dp)
            cell["epsilon_not_valid"] = dp_epsilon(dp, valid=False)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--datasets", nargs="+", default=["ml-100k", "ml-1m"],
                    help="built-in names (" + ", ".join(LABEL) + ") or the folder of your "
                         "own split in <data-dir>/<name>/ (train.npz + test.npz or train.txt "
                         "+ test.txt; docs/datasets.md)")
    ap.add_argument("--data-dir", default="", help="where real data lives (default: "
                    "$FEDREC_DATA or ../shared/data), as run_simulation.py --data-dir")
    ap.add_argument("--protocols", nargs="+", default=ORDER, choices=ORDER)
    ap.add_argument("--resume", action="store_true", help="skip cells already in the file")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--markdown-only", action="store_true")
    args = ap.parse_args(argv)
    if args.markdown_only:
        rewrite_markdown(args.out, markdown, plot,
                         prepare=partial(refresh_from_runs, runs=REPO / "results" / "runs"))
        return
    logging.getLogger("flwr").setLevel(logging.WARNING)
    check_datasets(args.datasets, args.data_dir)
    result = (stored_result(args.out) if args.resume else None) or {"cells": {}}
    todo = [c for c in cells(args.datasets, args.protocols, args.data_dir)
            if c.key not in result["cells"]]
    for i, cell in enumerate(todo, 1):
        log(f"[{i}/{len(todo)}] {cell.key}: {cell.nodes} nodes")
        try:
            result["cells"][cell.key] = run_cell(cell, result)
            result.get("failed", {}).pop(cell.key, None)
        except Exception as exc:  # a failed cell is reported, the board goes on
            log(f"  {cell.key} failed: {type(exc).__name__}: {exc}")
            result.setdefault("failed", {})[cell.key] = f"{type(exc).__name__}: {exc}"
        result["machine"] = machine_info()
        write_report(args.out, result, markdown(result))
        plot(result, args.out.with_suffix(".png"))


if __name__ == "__main__":
    main()
