"""The leaderboard's definition, shared by every script that runs or reads a board cell: its
datasets and their headings, each protocol's cell (run config, node count, node policy), and
what a run's record says about the server's view and its DP epsilon.

Kept apart from the runners (``benchmarks/leaderboard.py``, ``benchmarks/lpgcn_converged.py``)
and the report (``benchmarks/_board_report.py``) so each imports it from below and none imports
another back.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]

OUT = REPO / "results" / "leaderboard.json"
#: The shipped board's datasets, read from the default data location: only a board of these
#: writes ``OUT``; any other goes to its own folder under ``BOARDS`` (``default_out``).
SHIPPED = ("ml-100k", "ml-1m")
BOARDS = REPO / "results" / "boards"
#: Per-request timeout of every cell unless ``--timeout``: generous, since a board runs for an
#: hour on a shared machine (ML-1M's PriviRec evaluate has taken 1,127 s on a loaded one).
TIMEOUT = 900.0
#: Node count of a cell without one of its own (``NODES``) unless ``--nodes``.
BOARD_NODES = 8
LABEL = {"ml-100k": "ML-100K", "ml-1m": "ML-1M (users 1-2999)", "gowalla": "Gowalla",
         "yelp2018": "Yelp2018"}


@dataclass(frozen=True)
class Cell:
    """One protocol on one dataset: its run config, node count and node policy."""

    protocol: str
    dataset: str
    nodes: int
    config: dict[str, Any] = field(default_factory=dict)
    policy: dict[str, Any] = field(default_factory=dict)
    #: Why the cell runs otherwise than its protocol's board setting (shown on the board).
    note: str = ""

    @property
    def key(self) -> str:
        return f"{self.dataset}/{self.protocol}"


#: What each protocol needs from its nodes' policy beyond the safe default.
POLICY = {
    "dp-prototypes": {"dp-budget": 1.0},
    "fedsvd-privacy": {"dp-budget": 1e9},
    "fedpower": {"dp-budget": 1e9},
    "fedsvd-utility": {"allow-noise-removal": True, "allow-ckks": True},
    "privmvmf": {"allow-ckks": True},
}
#: Per protocol, the run config on a MovieLens split (everything else at its default).
SETTINGS: dict[str, dict[str, Any]] = {
    "fedmf": {},
    "privirec": {},
    "privirec-k": {},
    # LP-GCN needs every item to have a training interaction: the split without the items
    # it left cold (1 of ML-100K's 1,682), the same interactions otherwise. On ML-100K and
    # ML-1M the cell is trained to convergence (CONVERGED_LPGCN); lpgcn-epochs is the
    # fixed budget elsewhere
    "lpgcn": {"lpgcn-epochs": 3, "lpgcn-dim": 20, "lpgcn-layers": 3, "lpgcn-lr": 0.01,
              "lpgcn-reg": 1e-3, "drop-cold-items": True},
    "fedpower": {},
    "fedsvd-utility": {},
    "fedsvd-privacy": {},
    "dp-prototypes": {"implicit": False, "partition": "silo-zip", "dpp-k": 10},
    "fedmvmf": {"implicit": False, "mvmf-top-k": 20, "item-servers": 1},
    "privmvmf": {"implicit": False, "mvmf-top-k": 20, "item-servers": 1},
}
#: Node counts other than the default 8: DP prototypes' zip silos; FedSVD's nodes draw every
#: noise value with OpenDP's exact sampler (~5,000 values/s here: d x r per iteration), so
#: its cells use 4 nodes to stay within the hour.
NODES = {"dp-prototypes": {"ml-100k": 11, "ml-1m": 10},
         **{p: {"ml-100k": 4, "ml-1m": 4} for p in ("fedpower", "fedsvd-utility",
                                                   "fedsvd-privacy")}}
#: Datasets whose LP-GCN cell is the converged model (benchmarks/lpgcn_converged.py).
CONVERGED_LPGCN = ("ml-100k", "ml-1m")
ORDER = ["fedmf", "privirec", "privirec-k", "lpgcn", "fedpower", "fedsvd-utility",
         "fedsvd-privacy", "dp-prototypes", "fedmvmf", "privmvmf"]


def label(dataset: str) -> str:
    """The board's heading for ``dataset``: a user's split keeps its folder name."""
    from datasets.spec import display_name

    return LABEL.get(dataset, display_name(dataset))


@dataclass(frozen=True)
class Settings:
    """What a user sets for every cell of a board: the per-request timeout, and the partition
    and node count that replace each cell's own ("" / 0: the cell's own)."""

    timeout: float = TIMEOUT
    partition: str = ""
    nodes: int = 0

    @property
    def custom(self) -> bool:
        """Whether the cells' results differ from the shipped board's settings (the timeout
        changes only whether a cell finishes, not its numbers)."""
        return bool(self.partition or self.nodes)


def cells(datasets: list[str], protocols: list[str], data_dir: str = "",
          settings: Settings = Settings()) -> list[Cell]:
    """Every (dataset, protocol) cell of the board, datasets outermost, in the given order.
    A ``silo-zip`` cell keeps its one node per zip region whatever ``settings.nodes`` says
    (``fit_to_data`` counts the regions)."""
    out = []
    for ds in datasets:
        for proto in protocols:
            cfg = {"protocol": proto, "dataset": ds, "seed": 0, "timeout": settings.timeout,
                   **SETTINGS[proto]}
            if settings.partition:
                cfg["partition"] = settings.partition
            if data_dir:
                cfg["data-dir"] = data_dir
            if proto == "dp-prototypes" and ds == "ml-1m":
                cfg["dpp-k"] = 50  # Fig. 3's k on ML-1M
            own = NODES.get(proto, {}).get(ds, BOARD_NODES)
            nodes = own if cfg.get("partition") == "silo-zip" else settings.nodes or own
            out.append(Cell(proto, ds, nodes, cfg, POLICY.get(proto, {})))
    return out


def fit_to_data(cell: Cell, data: Any, settings: Settings = Settings()) -> Cell:
    """``cell`` as it can run on ``data`` (the loaded split): a ``silo-zip`` cell gets one
    node per zip region of the data; on data without user zip codes it takes the board's
    partition and node count instead, and its note says so (so DP prototypes still run on a
    user's split, as cross-silo shards). A ``--partition silo-zip`` the user asked for is
    kept: the board's check before any cell then says why it cannot run."""
    from datasets.partition import PartitionSpec, zip_region

    if cell.config.get("partition") != "silo-zip":
        return cell
    zips = data.user_attributes.get("zip")
    if zips is not None:
        return replace(cell, nodes=len({zip_region(z) for z in zips}))
    if settings.partition:
        return cell
    partition = PartitionSpec.scheme
    nodes = settings.nodes or BOARD_NODES
    return replace(cell, nodes=nodes, config={**cell.config, "partition": partition},
                   note=f"{partition} on {nodes} nodes instead of silo-zip: "
                        f"{label(cell.dataset)} has no user zip codes")


def default_out(datasets: list[str], data_dir: str = "",
                settings: Settings = Settings()) -> Path:
    """Where a board goes without ``--out``: the shipped board (``OUT``) only for its own
    datasets from the default data location at its own settings; any other board to
    ``results/boards/<datasets>/leaderboard.json``, so a user's board never replaces the
    shipped results."""
    if not data_dir and set(datasets) <= set(SHIPPED) and not settings.custom:
        return OUT
    return BOARDS / "+".join(datasets) / OUT.name


def dp_epsilon(privacy: Any, valid: bool = True) -> float | None:
    """The run's DP epsilon, wherever its protocol reports it (``run_epsilon`` first); with
    ``valid=False``, a claimed epsilon the record marks as not a guarantee (FedPower's)."""
    found: list[float] = []

    def walk(x: Any) -> None:
        if isinstance(x, dict):
            if (x.get("valid") is not False) == valid:  # this dict's kind of epsilon
                for key in ("run_epsilon", "epsilon"):
                    v = x.get(key)
                    if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0:
                        found.append(float(v))
                        return
            for v in x.values():
                walk(v)

    walk(privacy)
    return found[0] if found else None


def server_sees(protocol: str, privacy: dict[str, Any]) -> str:
    """masked / encrypted / noised / plain, from the sums the run recorded and its DP."""
    forms = {s.get("form") for s in privacy.get("sums", []) if isinstance(s, dict)}
    kinds = []
    if "plain" in forms:
        kinds.append("plain")
    if forms & {"masked"}:
        kinds.append("masked")
    if forms & {"encrypted", "ckks"}:
        kinds.append("encrypted")
    if protocol in ("dp-prototypes", "fedpower", "fedsvd-privacy", "fedsvd-utility"):
        kinds.append("noised")
    if protocol == "lpgcn":
        kinds.append("sealed mail + covered partials")
    return " + ".join(kinds) or "-"


def board_config(dataset: str, data_dir: str = "") -> dict[str, Any]:
    """The leaderboard's LP-GCN run config on ``dataset`` (a user's split read from
    ``data_dir``), every default resolved."""
    from fl_app.registry import resolve_config

    (cell,) = cells([dataset], ["lpgcn"], data_dir)
    return resolve_config(cell.config)


def board_data(cfg: dict[str, Any]) -> Any:
    """The split a resolved run config runs on, loaded by the project's loader."""
    from datasets import DatasetSpec, load_dataset

    return load_dataset(DatasetSpec.from_config(cfg))
