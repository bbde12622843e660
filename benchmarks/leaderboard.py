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
default cells take about an hour on 2 cores. A board keeps the stored cells it does not
rerun, so a partial command never drops the others.

    python benchmarks/leaderboard.py                       # ML-100K and ML-1M, every protocol
    python benchmarks/leaderboard.py --resume              # only the cells not yet in the file
    python benchmarks/leaderboard.py --datasets ml-100k --protocols fedmf privirec
    python benchmarks/leaderboard.py --datasets my-data --data-dir /path  # /path/my-data/
    python benchmarks/leaderboard.py --markdown-only

``--datasets`` takes what ``run_simulation.py --dataset`` takes: a built-in name or the
folder of your own split, ``<data-dir>/<name>/`` with ``train.npz`` + ``test.npz`` or
``train.txt`` + ``test.txt`` (docs/datasets.md). Every dataset is loaded by the project's
loader before the first cell runs, so a missing or malformed split fails at once, and every
cell that cannot run on its data (a partition that does not fit, features a protocol needs)
is named with the reason before any cell starts.

Only the shipped board (ML-100K and ML-1M from the default data location, default
``--partition`` and ``--nodes``) writes ``results/leaderboard.{json,md,png}``; any other
board goes to ``results/boards/<datasets>/`` unless ``--out`` says where, its runs' records
to ``runs/`` beside it. While a cell runs, a line every minute gives its place (k of N), its
elapsed time and its latest phase.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import shlex
import sys
import threading
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from types import SimpleNamespace
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # first: Opacus installs a top-level package named benchmarks

from benchmarks._board import (  # noqa: E402
    CONVERGED_LPGCN,
    LABEL,
    ORDER,
    OUT,
    TIMEOUT,
    Cell,
    Settings,
    board_data,
    cells,
    default_out,
    dp_epsilon,
    fit_to_data,
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
               else {}), **({"note": cell.note} if cell.note else {})}


def simulated_federation(cfg: dict[str, Any], nodes: int, data: Any) -> dict[int, Any]:
    """What each simulated node would report in the handshake (role, users, what it holds),
    from the loaded split: a simulation makes the last ``item-servers`` partitions item
    servers and the others user nodes holding their partition's rows."""
    from datasets import PartitionSpec
    from datasets.partition import partition_users
    from strategies.base import NodeInfo

    servers = int(cfg["item-servers"])
    users_hold = tuple(h for h, held in (("rows", True),
                                         ("user-features", data.user_features is not None),
                                         ("user-attributes", bool(data.user_attributes)))
                       if held)
    parts = partition_users(data, PartitionSpec.from_config(cfg, nodes - servers))
    infos = {p: NodeInfo(node_id=p, partition_id=p, n_items=data.n_items, n_users=len(u),
                         n_train_users=len(u), role="user", holds=users_hold)
             for p, u in enumerate(parts)}
    servers_hold = ("item-features",) if data.item_features is not None else ()
    infos.update({p: NodeInfo(node_id=p, partition_id=p, n_items=data.n_items, n_users=0,
                              n_train_users=0, role="item-server", holds=servers_hold)
                  for p in range(nodes - servers, nodes)})
    return infos


#: Checks a protocol's strategy runs on the handshake's public facts before its first release
#: (method names taking the Federation): run on the simulated federation too, so a cell they
#: would refuse minutes into the board is named before any cell starts.
FACT_CHECKS = ("check_silo_sizes",)


def prepare(cell: Cell, settings: Settings) -> tuple[Cell, str | None]:
    """``cell`` fitted to its data (``fit_to_data``) and why it cannot run there (None: it
    can): the checks a simulation runs before Flower starts (run config, node policy,
    federation size, the partition), then what the protocol needs each node to hold and its
    ``FACT_CHECKS``, which the nodes' handshake would otherwise meet only after the
    simulation started."""
    from fl_app.plan import (
        check_federation_size,
        check_node_policy,
        check_partitions,
        check_simulated_roles,
        resolve_node_policy,
    )
    from fl_app.registry import resolve_config
    from fl_app.server_app import build_strategy
    from strategies.base import Federation, check_federation

    try:
        cell = fit_to_data(cell, board_data(resolve_config(cell.config)), settings)
        cfg = resolve_config(cell.config)
        policy = resolve_node_policy(cell.policy)
        check_federation_size(cfg, cell.nodes, policy)
        strategy = build_strategy(cfg)
        check_node_policy(cfg, strategy, policy)
        check_simulated_roles(cfg, strategy, cell.nodes)
        check_partitions(cfg, cell.nodes, policy)
        if not cfg.get("strategy"):
            infos = simulated_federation(cfg, cell.nodes, board_data(cfg))
            label = lambda p: f"simulated node {p}"  # noqa: E731
            check_federation(infos, tuple(strategy.federation), label, cell.protocol)
            # the facts only: nothing is sent, so no messenger or aggregator is needed
            fed = Federation(messenger=SimpleNamespace(label=label), cfg=cfg, infos=infos,
                             aggregator=None)  # type: ignore[arg-type]
            for check in filter(None, (getattr(strategy, n, None) for n in FACT_CHECKS)):
                check(fed)
    except ValueError as exc:  # ConfigError and DataError are ValueErrors
        return cell, f"{type(exc).__name__}: {exc}"
    return cell, None


def plan(todo: list[Cell], settings: Settings) -> tuple[list[Cell], dict[str, str]]:
    """The cells that can run, fitted to their data, and why each other cannot, said at
    once: a board of an hour must not stop at its twelfth cell on what was known before."""
    runnable, refused = [], {}
    for cell in todo:
        cell, why = prepare(cell, settings)
        if why is None:
            runnable.append(cell)
            if cell.note:
                log(f"{cell.key}: {cell.note}")
        else:
            refused[cell.key] = f"not run: {why}"
            log(f"{cell.key} cannot run on this data: {why}")
    return runnable, refused


#: Seconds between a running cell's progress lines.
PROGRESS_SECONDS = 60.0


class CellProgress(logging.Handler):
    """A running cell's lines on stdout: its place (k of N) and settings as it starts, every
    ``every`` seconds its elapsed time and latest phase (the protocol's own lines, logger
    ``fedrec``), and its time as it ends, so a half-hour cell (a ceiling's tuning) is not
    taken for a hang."""

    def __init__(self, place: str, cell: Cell, every: float | None = None) -> None:
        super().__init__(logging.INFO)
        self.place, self.cell, self.phase = place, cell, "starting"
        self.every = PROGRESS_SECONDS if every is None else every
        self._done = threading.Event()
        self._t0 = time.perf_counter()
        self._level = logging.NOTSET

    def emit(self, record: logging.LogRecord) -> None:
        self.phase = record.getMessage()

    def elapsed(self) -> str:
        return f"{time.perf_counter() - self._t0:.0f} s"

    def _beat(self) -> None:
        while not self._done.wait(self.every):
            log(f"{self.place}: {self.elapsed()} elapsed; latest phase: {self.phase}")

    def __enter__(self) -> CellProgress:
        cfg = self.cell.config
        log(f"{self.place}: {self.cell.nodes} nodes, partition "
            f"{cfg.get('partition', 'default')}, timeout {cfg['timeout']:g} s per request")
        fedrec = logging.getLogger("fedrec")
        self._level = fedrec.level
        if fedrec.getEffectiveLevel() > logging.INFO:  # the phase lines are INFO
            fedrec.setLevel(logging.INFO)
        fedrec.addHandler(self)
        self._t0 = time.perf_counter()
        threading.Thread(target=self._beat, name=f"progress {self.cell.key}",
                         daemon=True).start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *_: Any) -> None:
        self._done.set()
        fedrec = logging.getLogger("fedrec")
        fedrec.removeHandler(self)
        fedrec.setLevel(self._level)
        log(f"{self.place}: {'done' if exc_type is None else 'failed'} after "
            f"{self.elapsed()}")


def failure(exc: Exception) -> str:
    """How a failed cell reads on the board; a node timeout names the board's own option
    (its message names the run config key, which a board user does not set)."""
    why = f"{type(exc).__name__}: {exc}"
    if getattr(exc, "setting", None) == "timeout":
        why += " On the board: --timeout SECONDS."
    return why


@contextlib.contextmanager
def records_beside(out: Path) -> Iterator[None]:
    """The cells' run records in ``runs/`` beside the board (``$FEDREC_RESULTS`` while they
    run): a user's board then never replaces the records the shipped board reads back
    (``--markdown-only``), even for a split named like a shipped one."""
    before = os.environ.get("FEDREC_RESULTS")
    os.environ["FEDREC_RESULTS"] = str(out.parent)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("FEDREC_RESULTS", None)
        else:
            os.environ["FEDREC_RESULTS"] = before


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


#: The shipped board's datasets, the default of ``--datasets``.
DEFAULT_DATASETS = ["ml-100k", "ml-1m"]


def board_command(args: argparse.Namespace) -> str:
    """The command that continues this board (``--resume``), for its Markdown: the options
    that define the board, where they differ from the defaults."""
    given = [("--datasets", args.datasets if args.datasets != DEFAULT_DATASETS else []),
             ("--data-dir", [args.data_dir] if args.data_dir else []),
             ("--timeout", [f"{args.timeout:g}"] if args.timeout != TIMEOUT else []),
             ("--partition", [args.partition] if args.partition else []),
             ("--nodes", [str(args.nodes)] if args.nodes else []),
             ("--out", [str(args.out)] if args.out != args.default_out else [])]
    words = [w for flag, values in given if values for w in (flag, *values)]
    return " ".join(["python benchmarks/leaderboard.py", *map(shlex.quote, words), "--resume"])


def positive(text: str) -> float:
    """A positive number of seconds (argparse type)."""
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text}")
    return value


def save(out: Path, result: dict[str, Any]) -> None:
    """The board's JSON, its Markdown (pointing at the plot beside it) and its plot."""
    result["machine"] = machine_info()
    write_report(out, result, markdown(result, png=out.with_suffix(".png").name))
    plot(result, out.with_suffix(".png"))


def main(argv: list[str] | None = None) -> None:
    from datasets.partition import KNOWN_PARTITIONS

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--datasets", nargs="+", default=DEFAULT_DATASETS,
                    help="built-in names (" + ", ".join(LABEL) + ") or the folder of your "
                         "own split in <data-dir>/<name>/ (train.npz + test.npz or train.txt "
                         "+ test.txt; docs/datasets.md)")
    ap.add_argument("--data-dir", default="", help="where real data lives (default: "
                    "$FEDREC_DATA or ../shared/data), as run_simulation.py --data-dir")
    ap.add_argument("--protocols", nargs="+", default=ORDER, choices=ORDER)
    ap.add_argument("--resume", action="store_true", help="skip cells already in the file")
    ap.add_argument("--timeout", type=positive, default=TIMEOUT,
                    help=f"seconds a node may take to answer one request (default "
                         f"{TIMEOUT:g}): raise it on a large split or a loaded machine")
    ap.add_argument("--partition", default="", choices=KNOWN_PARTITIONS,
                    help="how users are spread over every cell's nodes (default: each "
                         "cell's own: shards-contiguous, DP prototypes' silo-zip where the "
                         "data has zip codes)")
    ap.add_argument("--nodes", type=int, default=0,
                    help="nodes of every cell but silo-zip ones, which have one per zip "
                         "region (default: each cell's own, mostly 8)")
    ap.add_argument("--out", type=Path, default=None,
                    help="the board's JSON, its .md and .png beside it (default: "
                         f"{OUT.relative_to(REPO)} for the shipped board of ML-100K and ML-1M, "
                         "else results/boards/<datasets>/leaderboard.json)")
    ap.add_argument("--markdown-only", action="store_true")
    args = ap.parse_args(argv)
    if args.nodes < 0:
        ap.error(f"--nodes must be positive, got {args.nodes}")
    settings = Settings(args.timeout, args.partition, args.nodes)
    args.default_out = default_out(args.datasets, args.data_dir, settings)
    args.out = args.out or args.default_out
    if args.markdown_only:
        rewrite_markdown(args.out, partial(markdown, png=args.out.with_suffix(".png").name),
                         plot, prepare=partial(refresh_from_runs, runs=args.out.parent / "runs"))
        return
    logging.getLogger("flwr").setLevel(logging.WARNING)
    check_datasets(args.datasets, args.data_dir)
    # the cells not rerun stay on the board; a rerun cell shows its latest attempt only
    result = stored_result(args.out) or {"cells": {}}
    todo = [c for c in cells(args.datasets, args.protocols, args.data_dir, settings)
            if not (args.resume and c.key in result["cells"])]
    todo, refused = plan(todo, settings)
    result["command"] = board_command(args)
    failed = result.setdefault("failed", {})
    failed.update(refused)
    for key in refused:
        result["cells"].pop(key, None)
    if refused:
        save(args.out, result)
    with records_beside(args.out):
        for i, cell in enumerate(todo, 1):
            try:
                with CellProgress(f"[{i}/{len(todo)}] {cell.key}", cell):
                    result["cells"][cell.key] = run_cell(cell, result)
                failed.pop(cell.key, None)
            except Exception as exc:  # a failed cell is reported, the board goes on
                result["cells"].pop(cell.key, None)
                failed[cell.key] = failure(exc)
                log(f"  {cell.key} failed: {failed[cell.key]}")
            save(args.out, result)


if __name__ == "__main__":
    main()
