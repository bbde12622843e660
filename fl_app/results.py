"""Writing a run's results: ``results/runs/<name>.json`` and a table a person can read."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table


def _jsonable(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items() if _jsonable(v) is not _SKIP}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return value.tolist() if value.size <= 64 else _SKIP
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return None if not math.isfinite(float(value)) else float(value)
    if value is None or isinstance(value, (str, int, bool)):
        return value
    return _SKIP


_SKIP = object()


def results_dir() -> Path:
    """``$FEDREC_RESULTS`` or ``./results``."""
    return Path(os.environ.get("FEDREC_RESULTS", "results"))


def write_run(record: Mapping[str, Any], name: str, out_dir: Path | None = None) -> Path:
    """Write ``record`` as JSON to ``<out_dir>/runs/<name>.json`` (atomically); return the path.

    Large arrays are left out (they are results of the run, not its report).
    """
    path = (out_dir or results_dir()) / "runs" / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(_jsonable(record), indent=2, sort_keys=True))
    os.replace(tmp, path)
    return path


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4f}" if abs(value) < 1e4 else f"{value:.3g}"
    return str(value)


def print_run_table(record: Mapping[str, Any], console: Console | None = None) -> None:
    """Final metrics, cost and per-phase communication of one run, as console tables."""
    console = console or Console()
    cfg = record.get("config", {})
    table = Table(title=f"{cfg.get('protocol')} on {cfg.get('dataset')} "
                        f"({record.get('num_nodes')} nodes, seed {cfg.get('seed')})")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key, value in sorted(record.get("metrics", {}).items()):
        table.add_row(key, _fmt(value))
    comm = record.get("communication", {})
    table.add_row("wall time (s)", _fmt(float(record.get("seconds", 0.0))))
    table.add_row("synchronous rounds", _fmt(comm.get("total_rounds", 0)))
    per_node = comm.get("bytes_per_node", {})
    if per_node:
        table.add_row("bytes per node (down / up)",
                      f"{per_node['mean_down']:.3g} / {per_node['mean_up']:.3g}")
    console.print(table)
    phases = comm.get("phases", {})
    if phases:
        ptable = Table(title="communication per phase")
        for col in ("phase", "rounds", "seconds", "bytes down", "bytes up"):
            ptable.add_column(col, justify="left" if col == "phase" else "right")
        for name, st in phases.items():
            ptable.add_row(name, str(st["rounds"]), f"{st['seconds']:.2f}",
                           f"{st['bytes_down']:.3g}", f"{st['bytes_up']:.3g}")
        console.print(ptable)
