"""Writing a run's results: ``results/runs/<name>.json`` and a table a person can read."""

from __future__ import annotations

import contextlib
import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

#: Arrays up to this many elements are written into the JSON; larger ones go to the .npz.
INLINE_ARRAY_SIZE = 64


def _jsonable(value: Any, path: str, arrays: dict[str, np.ndarray]) -> Any:
    """``value`` as JSON data; arrays over :data:`INLINE_ARRAY_SIZE` elements are moved to
    ``arrays`` (saved beside the JSON) and replaced by a reference naming key and shape."""
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v, f"{path}.{k}" if path else str(k), arrays)
                for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v, f"{path}.{i}", arrays) for i, v in enumerate(value)]
    if isinstance(value, np.ndarray):
        if value.size <= INLINE_ARRAY_SIZE and value.dtype != object:
            return _jsonable(value.tolist(), path, arrays)
        arrays[path] = value
        return {"npz": path, "shape": list(value.shape), "dtype": str(value.dtype)}
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return None if not math.isfinite(float(value)) else float(value)
    if value is None or isinstance(value, (str, int, bool)):
        return value
    if isinstance(value, bytes):
        return {"bytes": len(value)}
    if hasattr(value, "shape") and hasattr(value, "nnz"):  # a scipy sparse matrix
        arrays.update({f"{path}.{k}": v for k, v in _sparse_parts(value).items()})
        return {"npz": path, "sparse": True, "shape": list(value.shape), "nnz": int(value.nnz)}
    return repr(value)


def _sparse_parts(matrix: Any) -> dict[str, np.ndarray]:
    csr = matrix.tocsr()
    return {"data": csr.data, "indices": csr.indices, "indptr": csr.indptr}


def results_dir() -> Path:
    """``$FEDREC_RESULTS`` or ``./results``."""
    return Path(os.environ.get("FEDREC_RESULTS", "results"))


#: What :func:`reserve_run` writes until the run's results replace it.
_PLACEHOLDER = json.dumps({"status": "running"})


class ResultsError(ValueError):
    """The results folder cannot take this run's results (not a folder, not writable, or
    the run's file exists and overwriting was not asked for)."""


def reserve_run(name: str, *, explicit: bool, overwrite: bool = False,
                out_dir: Path | None = None) -> str:
    """Check the results folder and claim ``<out_dir>/runs/<name>.json`` before a run
    starts, so nothing is lost or overwritten without a word; return the stem to write.

    The file is created empty-exclusively (``O_EXCL``): of two runs started at once with
    one name, one gets it. An ``explicit`` name (the user's) that exists is refused unless
    ``overwrite``; a default name that exists becomes ``<name>-2``, ``<name>-3``, ...
    """
    base = out_dir or results_dir()
    if base.exists() and not base.is_dir():
        raise ResultsError(f"results folder {base}: exists and is not a folder (--output "
                           "names the folder results/runs/<run-name>.json goes under)")
    runs = base / "runs"
    try:
        runs.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ResultsError(f"results folder {runs}: cannot create it ({exc.strerror})") from None
    stem, n = name, 1
    while True:
        path = runs / f"{stem}.json"
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            if overwrite:
                return stem
            if explicit:
                raise ResultsError(
                    f"{path} exists (an earlier run's results): give another --run-name, or "
                    "--overwrite to replace it (run_in_simulation(..., overwrite=True) from "
                    "Python)") from None
            n += 1
            stem = f"{name}-{n}"
            continue
        except OSError as exc:
            raise ResultsError(f"{path}: cannot write it ({exc.strerror})") from None
        with os.fdopen(fd, "w") as fh:  # a placeholder the run's results replace
            fh.write(_PLACEHOLDER)
        return stem


def release_run(name: str, out_dir: Path | None = None) -> None:
    """Remove the placeholder :func:`reserve_run` claimed if no results replaced it (the
    run stopped before it started, e.g. on bad input)."""
    path = (out_dir or results_dir()) / "runs" / f"{name}.json"
    with contextlib.suppress(OSError):
        if path.read_text() == _PLACEHOLDER:
            path.unlink()


def write_run(record: Mapping[str, Any], name: str, out_dir: Path | None = None) -> Path:
    """Write ``record`` to ``<out_dir>/runs/<name>.json`` (atomically); return the path.

    Arrays larger than :data:`INLINE_ARRAY_SIZE` go to ``<name>.npz`` beside it, under the
    dotted path the JSON names (``{"npz": "extra.S", "shape": [...]}``): nothing is dropped.
    """
    path = (out_dir or results_dir()) / "runs" / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    arrays: dict[str, np.ndarray] = {}
    data = _jsonable(record, "", arrays)
    npz = path.with_suffix(".npz")
    if arrays:
        tmp_npz = path.with_suffix(".tmp.npz")
        np.savez_compressed(tmp_npz, **arrays)
        os.replace(tmp_npz, npz)
        data["arrays_file"] = npz.name
    else:
        npz.unlink(missing_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True))
    os.replace(tmp, path)
    return path


def load_run_arrays(json_path: Path) -> dict[str, np.ndarray]:
    """The arrays a run moved to its ``.npz`` (dotted path -> array), or {} if none."""
    npz = Path(json_path).with_suffix(".npz")
    if not npz.is_file():
        return {}
    with np.load(npz, allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


def read_run(json_path: Path) -> dict[str, Any]:
    """A run as :func:`write_run` wrote it, with the ``.npz`` arrays back in place (sparse
    matrices as CSR): what a report rebuilt from saved runs reads."""
    arrays = load_run_arrays(json_path)

    def restore(value: Any) -> Any:
        if isinstance(value, dict) and "npz" in value:
            key = value["npz"]
            if value.get("sparse"):
                import scipy.sparse as sp

                return sp.csr_matrix((arrays[f"{key}.data"], arrays[f"{key}.indices"],
                                      arrays[f"{key}.indptr"]), shape=tuple(value["shape"]))
            return arrays[key]
        if isinstance(value, dict):
            return {k: restore(v) for k, v in value.items()}
        if isinstance(value, list):
            return [restore(v) for v in value]
        return value

    return restore(json.loads(Path(json_path).read_text()))


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4f}" if abs(value) < 1e4 else f"{value:.3g}"
    return str(value)


def _privacy_mode(privacy: Mapping[str, Any]) -> str:
    """What the server saw of the sums, in words; plain sums are flagged."""
    forms = sorted({s["form"] for s in privacy.get("sums", [])})
    if not forms:
        return "no sums"
    text = f"{privacy.get('aggregator', '?')} ({', '.join(forms)})"
    if privacy.get("identities", {}).get("simulated") and "plain" not in forms:
        text += "; keys signed with simulated identities (no roster)"
    if "plain" not in forms:
        return text
    allowing = privacy.get("nodes_allowing_plain")
    opted = f"; {len(allowing)} node(s) opted in (allow-plain)" if allowing else ""
    return f"[bold red]{text}: the server saw every node's values{opted}[/]"


#: Metrics the comparison table shows (suffixes of the metric names).
COMPARED = ("ndcg@20", "recall@20")


def comparison_table(comparison: Mapping[str, Any]) -> Table:
    """Federated beside the centralized reference and item popularity, per quality metric."""
    fed = comparison.get("federated", {})
    cen = comparison.get("centralized", {})
    pop = comparison.get("popularity", {})
    table = Table(title="federated vs centralized reference vs item popularity")
    for col in ("metric", "federated", "centralized", "fed / centralized", "popularity"):
        table.add_column(col, justify="left" if col == "metric" else "right")
    for key in sorted(k for k in fed if k.endswith(COMPARED)):
        suffix = key.rsplit("/", 1)[-1]
        ref = cen.get(key)
        ratio = f"{fed[key] / ref:.3f}" if ref else "-"
        table.add_row(key, _fmt(fed[key]), _fmt(ref) if ref is not None else "-", ratio,
                      _fmt(pop[suffix]) if suffix in pop else "-")
    return table


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
    table.add_row("sums", _privacy_mode(record.get("privacy", {})))
    table.add_row("synchronous rounds", _fmt(comm.get("total_rounds", 0)))
    per_node = comm.get("bytes_per_node", {})
    if per_node:
        table.add_row("bytes per node (down / up)",
                      f"{per_node['mean_down']:.3g} / {per_node['mean_up']:.3g}")
    console.print(table)
    if record.get("comparison"):
        console.print(comparison_table(record["comparison"]))
    phases = comm.get("phases", {})
    if phases:
        ptable = Table(title="communication per phase")
        for col in ("phase", "rounds", "seconds", "bytes down", "bytes up"):
            ptable.add_column(col, justify="left" if col == "phase" else "right")
        for name, st in phases.items():
            ptable.add_row(name, str(st["rounds"]), f"{st['seconds']:.2f}",
                           f"{st['bytes_down']:.3g}", f"{st['bytes_up']:.3g}")
        console.print(ptable)
