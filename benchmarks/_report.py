"""What every benchmark does at its end: timestamped progress lines, the machine it ran on,
and the JSON + Markdown pair under ``results/``."""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import platform
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np


def log(msg: str) -> None:
    """A progress line with the wall-clock time (long benchmarks run for many minutes)."""
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def show_protocol_phases() -> None:
    """Print the protocol's own phase lines (logger ``fedrec``: each phase's rounds, bytes and
    seconds as it ends) during a quiet run, so a run of many minutes shows where it is."""
    from fl_app.server_app import progress_to_console

    progress_to_console(indent="  ")


def machine_info() -> dict[str, Any]:
    """What the numbers depend on, recorded beside them."""
    import flwr

    return {"cpus": os.cpu_count(), "machine": platform.machine(),
            "python": platform.python_version(), "numpy": np.__version__,
            "flwr_version": flwr.__version__}


def write_report(json_path: Path, result: Any, markdown: str) -> None:
    """Write ``result`` as JSON and ``markdown`` beside it (same stem, ``.md``)."""
    json_path = Path(json_path)
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(result, indent=2, default=float) + "\n")
    json_path.with_suffix(".md").write_text(markdown)
    print(f"wrote {json_path} and {json_path.with_suffix('.md')}", flush=True)


def stored_result(json_path: Path) -> Any | None:
    """What a benchmark wrote at ``json_path`` before (None when nothing): the rows a
    ``--resume`` keeps and a ``--markdown-only`` reports again."""
    json_path = Path(json_path)
    return json.loads(json_path.read_text()) if json_path.is_file() else None


def dataset_parser(description: str) -> argparse.ArgumentParser:
    """The options every per-dataset benchmark shares (the ceiling scripts): ``--datasets``,
    ``--data-dir``, ``--resume`` (keep datasets already measured), ``--markdown-only``."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--datasets", nargs="+", default=["ml-100k", "ml-1m"])
    ap.add_argument("--data-dir", default="")
    ap.add_argument("--resume", action="store_true", help="keep datasets already measured")
    ap.add_argument("--markdown-only", action="store_true")
    return ap


def stored_datasets(json_path: Path, args: argparse.Namespace) -> dict[str, Any]:
    """The stored result to extend (``--resume``) or report (``--markdown-only``), else a
    fresh ``{"datasets": {}}``."""
    stored = stored_result(json_path) if args.resume or args.markdown_only else None
    return stored or {"datasets": {}}


def measure_datasets(json_path: Path, result: dict[str, Any], datasets: list[str],
                     measure: Callable[[str], dict[str, Any]],
                     markdown: Callable[[Any], str],
                     extra: tuple[str, str, Callable[[str, dict[str, Any]], Any]] | None = None
                     ) -> None:
    """Measure every dataset ``result`` does not hold yet (``measure(ds)``), then the
    optional ``extra`` = (key, what, step(ds, stored)) where its key is missing; the report is
    rewritten after each unit, so an interrupted run keeps what finished."""
    for ds in datasets:
        if ds not in result["datasets"]:
            log(ds)
            result["datasets"][ds] = measure(ds)
            result["machine"] = machine_info()
            write_report(json_path, result, markdown(result))
        if extra is not None and extra[0] not in result["datasets"][ds]:
            key, what, step = extra
            log(f"{ds}: {what}")
            result["datasets"][ds][key] = step(ds, result["datasets"][ds])
            write_report(json_path, result, markdown(result))
    write_report(json_path, result, markdown(result))


def rewrite_markdown(json_path: Path, markdown: Callable[[Any], str],
                     plot: Callable[[Any, Path], None] | None = None,
                     prepare: Callable[[Any], None] | None = None) -> Any:
    """``--markdown-only``: the report again from the stored JSON, nothing rerun; exits with
    an error naming the file when there is none. ``prepare`` updates the stored result in
    place first (what the report derives from other files); ``plot`` redraws the figure
    beside it (same stem, ``.png``). Returns the result reported."""
    json_path = Path(json_path)
    result = stored_result(json_path)
    if result is None:
        raise SystemExit(f"error: {json_path} does not exist: run the benchmark first")
    if prepare is not None:
        prepare(result)
    write_report(json_path, result, markdown(result))
    if plot is not None:
        plot(result, json_path.with_suffix(".png"))
    return result


class Units:
    """The finished units of a long benchmark (one seed's run, one attack, ...) kept in a JSON
    file and rewritten after each, so an interrupted run resumes with ``--resume`` where it
    stopped. The file records the benchmark's config; resuming under another config is
    refused, since its units would mix two settings in one report. Without ``resume`` the
    run starts over: the file's units are dropped at once."""

    def __init__(self, path: Path, config: dict[str, Any], resume: bool) -> None:
        self.path, self.config = Path(path), json.loads(json.dumps(config, default=float))
        self.done: dict[str, Any] = {}
        stored = stored_result(self.path)
        if resume and stored is not None:
            if stored["config"] != self.config:
                raise SystemExit(f"error: {self.path} was written with config "
                                 f"{stored['config']}, not {self.config}: rerun without "
                                 "--resume to start over")
            self.done = stored["units"]
            log(f"resuming: {len(self.done)} finished units in {self.path}")
        elif stored is not None:  # starting over: the old units must not come back
            self.path.unlink()

    def get(self, key: str, run: Callable[[], Any]) -> Any:
        """The stored unit ``key``, or ``run()``'s result, stored at once. Processes of the
        same config may share the file (``--part``): a unit another process stored since
        is taken, not rerun, and each write merges, under a lock, what others stored."""
        if key not in self.done:
            self._locked(lambda: None)
        if key not in self.done:
            value = json.loads(json.dumps(run(), default=float))
            self._locked(lambda: self.done.__setitem__(key, value))
        return self.done[key]

    def _locked(self, change: Callable[[], None]) -> None:
        """Under the file lock: merge the stored units into ours, apply ``change`` and, if
        it added anything, write the file."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.with_suffix(".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            stored = stored_result(self.path)
            if stored is not None and stored["config"] == self.config:
                self.done = {**stored["units"], **self.done}
            before = len(self.done)
            change()
            if len(self.done) != before:
                tmp = self.path.with_suffix(".tmp")
                tmp.write_text(json.dumps({"config": self.config, "units": self.done}) + "\n")
                tmp.replace(self.path)
