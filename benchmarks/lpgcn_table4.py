"""LP-GCN's Table 4, Fig. 11 and Fig. 12 (paper 001): LightGCN and LightGCN+ trained until the
test NDCG@20 stops improving, with item popularity and the paper's numbers beside them.

Table 4's LP-GCN row is LightGCN+ trained centrally: LP-GCN computes the centralized model's
steps exactly (``results/lpgcn/ml-100k_simulation.md``: two whole ML-100K epochs through a
Flower simulation; ``results/lpgcn/late_steps.md``: federated steps continued from this run's
Gowalla checkpoint), so a federated run to convergence would give these numbers at ~24x the
cost per step (``results/lpgcn/gowalla.md``).

Settings (digest 001 section 2.12): d = 64, Adam lr 0.001, batch 2048, evaluation every 5
epochs; the layer count and lambda the paper's code uses for LightGCN+ on each dataset
(Gowalla L = 4, lambda 1e-4; Yelp2018 L = 3, lambda 1e-3), for both backbones ("all
hyperparameters set to match the backbone"). Stopping: the issue's rule, no better test
NDCG@20 for 5 evaluations (the paper: Recall@20 for 50 epochs, i.e. 10 evaluations), capped
at the paper's 1000 epochs. The reported numbers are those of the best evaluation. ML-100K
(ratings >= 4, the equality run's split and setting: L = 4, d = 20, lr 0.01, lambda 1e-3)
runs Fig. 11's layer sweep, L = 1..4, which the big datasets cannot afford here.

Training survives interruption: every epoch writes a checkpoint (tables, Adam moments, step
count; the triples are a function of (seed, epoch)) under ``--checkpoint-dir``, every
evaluation adds a point to the curve in ``results/lpgcn/table4.json`` at once, and
``--resume`` continues each job where it stopped (a resumed run equals an uninterrupted one:
``tests/test_lpgcn_table4.py``). ``--hours`` stops cleanly after the epoch that spends the
budget.

    python benchmarks/lpgcn_table4.py --jobs fig11                 # ML-100K, L = 1..4 (minutes)
    python benchmarks/lpgcn_table4.py --jobs gowalla --resume --hours 2
    python benchmarks/lpgcn_table4.py --markdown-only

``--device`` trains on a torch device (``cpu``, ``cuda``, ``cuda:N``) instead of numpy (the
reference; on CPU in float64 the two agree to rounding, ``tests/test_lightgcn_device.py``);
checkpoints are numpy either way, so a job moves between machines. ``--cost`` measures each
Table 4 row's seconds per epoch on numpy, torch CPU and, where this machine has one, CUDA
(``--cost-steps`` timed steps per row and device, times the row's steps per epoch) and
writes the cost of each row (epochs x seconds per epoch) into the report.

    python benchmarks/lpgcn_table4.py --jobs gowalla --resume --device cuda
    python benchmarks/lpgcn_table4.py --cost
"""

from __future__ import annotations

import argparse
import fcntl
import json
import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # first: Opacus installs a top-level package named benchmarks

from benchmarks._board import board_config, board_data  # noqa: E402
from benchmarks._report import (  # noqa: E402
    log,
    machine_info,
    rewrite_markdown,
    stored_result,
    write_report,
)
from datasets import DatasetSpec  # noqa: E402

OUT = REPO / "results" / "lpgcn" / "table4.json"
CHECKPOINTS = REPO / ".cache" / "lpgcn_table4"
K = 20
EVAL_EVERY = 5
PATIENCE = 5
MAX_EPOCHS = 1000
#: Table 4 (digest 001 section 4), mean over 5 seeds: (Recall@20, NDCG@20).
PAPER = {"gowalla": {"lightgcn": (0.1894, 0.1464), "lightgcn+": (0.1937, 0.1487)},
         "yelp2018": {"lightgcn": (0.0627, 0.0512), "lightgcn+": (0.0653, 0.0528)}}
LABEL = {"gowalla": "Gowalla", "yelp2018": "Yelp2018", "ml-100k": "ML-100K (ratings >= 4)"}


@dataclass(frozen=True)
class Job:
    """One training run: a dataset, a backbone, its layer count and seed."""

    dataset: str
    backbone: str
    layers: int
    seed: int = 0

    @property
    def key(self) -> str:
        return f"{self.dataset}/{self.backbone}/L{self.layers}/seed{self.seed}"

    def setting(self) -> dict[str, Any]:
        """The hyperparameters of this job (module docstring)."""
        if self.dataset == "ml-100k":
            return {"dim": 20, "lr": 0.01, "reg": 1e-3, "batch_size": 2048, "dtype": "float64"}
        reg = {"gowalla": 1e-4, "yelp2018": 1e-3}[self.dataset]
        return {"dim": 64, "lr": 0.001, "reg": reg, "batch_size": 2048, "dtype": "float32"}


PAPER_LAYERS = {"gowalla": 4, "yelp2018": 3}
JOB_SETS: dict[str, list[Job]] = {
    **{ds: [Job(ds, b, L) for b in ("lightgcn+", "lightgcn")] for ds, L in PAPER_LAYERS.items()},
    "fig11": [Job("ml-100k", b, L) for L in (1, 2, 3, 4) for b in ("lightgcn", "lightgcn+")],
}


#: ML-100K ratings >= 4, 80/20 per user, items without a training positive removed (LP-GCN
#: refuses them): Fig. 11's split here and the equality runs' in benchmarks/lpgcn.py.
ML100K_WARM = DatasetSpec(name="ml-100k", min_rating=4.0, implicit=True, seed=0,
                          drop_cold_items=True)


def load_split(dataset: str) -> tuple[Any, Any]:
    """(train, test) CSR matrices: the LightGCN splits, or ML-100K's equality-run split."""
    from datasets import load_dataset

    data = load_dataset(ML100K_WARM if dataset == "ml-100k" else DatasetSpec(name=dataset))
    return data.train, data.test


def build_model(job: Job, train: Any, device: str = "numpy", threads: int = 0) -> Any:
    from fedrec.recsys.lightgcn import LightGCN

    s = job.setting()
    return LightGCN(train, dim=s["dim"], layers=job.layers, lr=s["lr"], reg=s["reg"],
                    batch_size=s["batch_size"], seed=job.seed, backbone=job.backbone,
                    dtype=np.dtype(s["dtype"]).type, device=device, threads=threads)


def model_builder(cfg: dict[str, Any], device: str = "numpy") -> Any:
    """``train -> untrained LightGCN`` with a run config's hyperparameters (the leaderboard's
    LP-GCN cells): the strategy's own centralized reference model, so the ceiling is the
    model the nodes compute, on ``device`` (numpy or a torch device; checkpoints are numpy
    either way)."""
    from strategies.lpgcn import LPGCN

    make = LPGCN(cfg).reference_model
    if device == "numpy":
        return make
    return lambda train: replace(make(train), device=device, losses=[])


def checkpoint_path(root: Path, job: Job) -> Path:
    return Path(root) / (job.key.replace("/", "_").replace("+", "plus") + ".npz")


def save_checkpoint(path: Path, model: Any, record: dict[str, Any]) -> None:
    """Model state and the job's record, written atomically (a kill leaves the old file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.npz")
    np.savez(tmp, record=np.array(json.dumps(record)), **model.state_arrays())
    os.replace(tmp, path)


def load_checkpoint(path: Path, model: Any) -> dict[str, Any]:
    with np.load(path) as z:
        arrays = {k: z[k] for k in z.files}
    model.load_state_arrays(arrays)
    return json.loads(str(arrays["record"]))


def evaluate(model: Any, train: Any, test: Any) -> dict[str, float]:
    from fedrec.recsys.metrics import evaluate_ranking

    uf, vf = model.final_embeddings()
    m = evaluate_ranking(lambda rows: uf[rows] @ vf.T, train, test, k=K).means()
    return {f"recall@{K}": m[f"recall@{K}"], f"ndcg@{K}": m[f"ndcg@{K}"]}


def new_record(job: Job, nbatches: int) -> dict[str, Any]:
    return {**asdict(job), "setting": job.setting(), "steps_per_epoch": nbatches,
            "eval_every": EVAL_EVERY, "patience": PATIENCE, "max_epochs": MAX_EPOCHS,
            "curve": [], "epochs": 0, "train_seconds": 0.0, "status": "running"}


def best_point(record: dict[str, Any]) -> dict[str, Any] | None:
    curve = record["curve"]
    return max(curve, key=lambda p: (p[f"ndcg@{K}"], -p["epoch"])) if curve else None


def trend(record: dict[str, Any]) -> str:
    """Where the curve stands, from its points: best at the latest evaluation, or how many
    evaluations have passed without a better one."""
    best = best_point(record)
    if best is None:
        return "no evaluation yet"
    later = sum(p["epoch"] > best["epoch"] for p in record["curve"])
    return ("best NDCG@20 at its latest evaluation" if not later else
            f"no better NDCG@20 for {later} evaluation(s)")


def stopped(record: dict[str, Any], patience: int, max_epochs: int) -> str | None:
    """Why training is over ("patience", "cap") or None while it goes on."""
    best = best_point(record)
    if best is not None:
        later = [p for p in record["curve"] if p["epoch"] > best["epoch"]]
        if len(later) >= patience:
            return "patience"
    return "cap" if record["epochs"] >= max_epochs else None


def train_job(job: Any, train: Any, test: Any, ckpt_root: Path, *, resume: bool,
              deadline: float = math.inf, max_epochs: int = MAX_EPOCHS,
              eval_every: int = EVAL_EVERY, patience: int = PATIENCE,
              on_record: Callable[[dict[str, Any]], None] | None = None,
              build: Callable[[Any], Any] | None = None) -> dict[str, Any]:
    """Train ``job`` until it stops, the deadline passes, or ``max_epochs``; checkpoint each
    epoch and hand every evaluated record to ``on_record``.

    ``job`` is a dataclass with ``key`` and ``setting()`` (:class:`Job` by default);
    ``build(train)`` makes its untrained model (default :func:`build_model`). A checkpoint
    written under another setting is refused, never continued."""
    model = (build or (lambda tr: build_model(job, tr)))(train)
    path = checkpoint_path(ckpt_root, job)
    if path.exists() and not resume:
        raise SystemExit(f"error: {path} holds an earlier run of {job.key}: pass --resume to "
                         "continue it, or delete the file to start again")
    if path.exists():
        record = load_checkpoint(path, model)
        if record.get("setting") != json.loads(json.dumps(job.setting())):
            raise SystemExit(f"error: {path} holds {job.key} trained with {record.get('setting')}"
                             f", not {job.setting()}: delete it to start again")
        log(f"{job.key}: resumed at epoch {record['epochs']}")
    else:
        record = new_record(job, model.nbatches)
    record.update(eval_every=eval_every, patience=patience, max_epochs=max_epochs)
    while (reason := stopped(record, patience, max_epochs)) is None:
        if time.time() >= deadline:
            log(f"{job.key}: time budget spent at epoch {record['epochs']}; --resume continues")
            break
        t0 = time.perf_counter()
        model.fit(model.nbatches)
        record["epochs"] += 1
        record["train_seconds"] += time.perf_counter() - t0
        epoch = record["epochs"]
        per_epoch = record["train_seconds"] / epoch
        evaluating = epoch % eval_every == 0 or epoch == max_epochs
        if not evaluating:
            nxt = eval_every - epoch % eval_every
            log(f"{job.key}: epoch {epoch}, loss {np.mean(model.losses[-model.nbatches:]):.5f}, "
                f"{per_epoch:.0f} s/epoch, next evaluation in ~{nxt * per_epoch / 60:.0f} min")
        if evaluating:
            t1 = time.perf_counter()
            point = {"epoch": epoch, "loss": float(np.mean(model.losses[-model.nbatches:])),
                     **evaluate(model, train, test)}
            point["eval_seconds"] = time.perf_counter() - t1
            record["curve"].append(point)
            best = best_point(record)
            left = max_epochs - epoch
            log(f"{job.key}: epoch {epoch}, loss {point['loss']:.5f}, NDCG@{K} "
                f"{point[f'ndcg@{K}']:.4f} (best {best[f'ndcg@{K}']:.4f} at {best['epoch']}), "
                f"{per_epoch:.1f} s/epoch, at most {left * per_epoch / 3600:.1f} h to the "
                f"{max_epochs}-epoch cap")
        save_checkpoint(path, model, record)
        if epoch % eval_every == 0 and on_record is not None:
            on_record(record)
    else:
        record["status"] = reason
        save_checkpoint(path, model, record)
        log(f"{job.key}: stopped ({reason}) after {record['epochs']} epochs")
    if on_record is not None:
        on_record(record)
    return record


# ------------------------------------------------------------------------------ the cost
#: What each row's cost is measured on, in the report's column order: (device, threads).
#: torch CPU both ways: with 2 OpenMP threads on this shared 2-core machine a step measured
#: up to 80x slower than with 1 (threads spinning against other processes).
COST_DEVICES = {"numpy": ("numpy", 0), "cpu-1": ("cpu", 1), "cpu-2": ("cpu", 2),
                "cuda": ("cuda", 0)}
#: The LP-GCN leaderboard's settings, timed beside Table 4 for scale (whole epochs).
BOARD_DATASETS = ("ml-100k", "ml-1m")


def available(device: str) -> str | None:
    """Why ``device`` cannot be measured here, or None."""
    from fedrec.recsys.arrays import DeviceError, check_device

    try:
        check_device(device)
    except DeviceError as exc:
        return str(exc)
    return None


def _sync(model: Any) -> None:
    if model.device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


def time_epoch(model: Any, steps: int | None = None) -> dict[str, float]:
    """Seconds of one epoch of ``model``: drawing the epoch's triples, then ``steps`` timed
    training steps (all of the epoch when None) after one untimed warm-up step, scaled to the
    epoch's ``nbatches`` steps."""
    t0 = time.perf_counter()
    model.batch(model.step_count)  # draws the epoch's triples (once per epoch)
    triples = time.perf_counter() - t0
    model.fit(1)
    _sync(model)
    n = model.nbatches - 1 if steps is None else min(int(steps), model.nbatches)
    t0 = time.perf_counter()
    model.fit(n)
    _sync(model)
    per_step = (time.perf_counter() - t0) / max(n, 1)
    return {"triples_seconds": triples, "s_per_step": per_step, "steps_timed": n,
            "steps_per_epoch": model.nbatches,
            "s_per_epoch": triples + per_step * model.nbatches}


def measure_cost(steps: int) -> dict[str, Any]:
    """Seconds per epoch of each Table 4 row (``steps`` timed steps) and of the LP-GCN
    leaderboard's ML-100K and ML-1M settings (whole epochs) on every device of this
    machine; the devices it lacks say why."""
    out: dict[str, Any] = {"rows": {}, "board": {}, "steps_timed": steps,
                           "load_average": os.getloadavg()[0],
                           "unavailable": {name: why for name, (d, _) in COST_DEVICES.items()
                                           if (why := available(d)) is not None}}
    devices = {k: v for k, v in COST_DEVICES.items() if k not in out["unavailable"]}
    for ds in PAPER_LAYERS:
        train, _ = load_split(ds)
        for job in JOB_SETS[ds]:
            for name, (device, threads) in devices.items():
                log(f"cost {job.key} on {name}: {steps} steps")
                out["rows"].setdefault(job.key, {})[name] = time_epoch(
                    build_model(job, train, device, threads), steps)
    for ds in BOARD_DATASETS:
        cfg = board_config(ds)
        train = board_data(cfg).train
        for name, (device, threads) in devices.items():
            log(f"cost leaderboard {ds} on {name}: one epoch")
            model = replace(model_builder(cfg)(train), device=device,
                                        threads=threads, losses=[])
            out["board"].setdefault(ds, {})[name] = time_epoch(model)
    return out


def cost_lines(result: dict[str, Any]) -> list[str]:
    """The report's cost section: each Table 4 row's seconds per epoch per device and the
    epochs x seconds it needs (to its stopping point where it stopped, else to the cap)."""
    cost = result.get("cost")
    if not cost:
        return []
    missing = cost.get("unavailable", {})
    columns = ("numpy", "cpu-1", "cpu-2", "cuda")

    def cell(t: dict[str, Any], name: str, fmt: str = "{:.1f}") -> str:
        if name in missing:
            return "not measured: no accelerator on this machine" if name == "cuda" else "-"
        return fmt.format(t[name]["s_per_epoch"]) if name in t else "-"

    def best_cpu(t: dict[str, Any]) -> float | None:
        got = [t[n]["s_per_epoch"] for n in ("cpu-1", "cpu-2") if n in t]
        return min(got) if got else None

    load = cost.get("load_average")
    lines = ["", "## Cost of each Table 4 row", "",
             f"Seconds per epoch: the epoch's triples plus {cost['steps_timed']} timed steps "
             "(after a warm-up step) x the row's steps per epoch, on numpy (the reference, "
             "sparse products on both cores), torch on this machine's CPU with 1 and with 2 "
             "threads, and CUDA. A row's epochs: where it stopped, its epochs; otherwise the "
             f"{MAX_EPOCHS}-epoch cap (the stopping rule may end it sooner; the ML-100K runs of "
             "Fig. 11 stopped after 55-170). Hours = epochs x s/epoch (torch CPU: the faster "
             "thread count).", "",
             "| dataset | model | L | steps/epoch | s/epoch numpy | s/epoch torch CPU, 1 thread "
             "| s/epoch torch CPU, 2 threads | s/epoch GPU | epochs | hours numpy | hours torch "
             "CPU |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    jobs = result.get("jobs", {})
    for key, t in cost["rows"].items():
        ds, backbone, layers, _ = key.split("/")
        rec = jobs.get(key, {})
        done = rec.get("status") in ("patience", "cap")
        epochs = rec["epochs"] if done else MAX_EPOCHS
        when = f"{epochs} (stopped)" if done else f"{epochs} (cap; {rec.get('epochs', 0)} run)"
        hours = [f"{epochs * x / 3600:.0f}" if x is not None else "-"
                 for x in (t.get("numpy", {}).get("s_per_epoch"), best_cpu(t))]
        name = "LP-GCN (LightGCN+)" if backbone == "lightgcn+" else "LightGCN"
        first = next(iter(t.values()))
        lines.append(f"| {LABEL[ds]} | {name} | {layers[1:]} | {first['steps_per_epoch']} | "
                     + " | ".join(cell(t, c) for c in columns) + f" | {when} | "
                     + " | ".join(hours) + " |")
    if cost.get("board"):
        lines += ["", "For scale, whole epochs of the LP-GCN leaderboard's setting (d = 20, L = "
                  "3, float64; `results/lpgcn/converged.md`):", "",
                  "| dataset | steps/epoch | s/epoch numpy | torch CPU, 1 thread | torch CPU, 2 "
                  "threads | GPU |", "|---|---|---|---|---|---|"]
        for ds, t in cost["board"].items():
            first = next(iter(t.values()))
            lines.append(f"| {ds} | {first['steps_per_epoch']} | "
                         + " | ".join(cell(t, c, "{:.2f}") for c in columns) + " |")
    lines += ["", f"Measured on {cost.get('machine', {})}, a machine shared with other work"
              + (f" (load average {load:.1f} on 2 cores when the measurement began)"
                 if load is not None else "")
              + "; timings are of one run each, and torch's 2 OpenMP threads lose most to "
              "other processes on the cores. Command: `python benchmarks/lpgcn_table4.py "
              "--cost`."]
    return lines


# ------------------------------------------------------------------------------ the report

def update_results(out: Path, job: Job, record: dict[str, Any],
                   extra: dict[str, Any] | None = None) -> None:
    """Put one job's record into ``out`` under a lock (two processes may train two jobs)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        result = stored_result(out) or {"jobs": {}, "popularity": {}}
        result["jobs"][job.key] = {k: v for k, v in record.items()}
        result.update(extra or {})
        result["machine"] = machine_info()
        write_report(out, result, markdown(result))
        plot(result, out.with_suffix(".png"))


def _verdict(ours: float, paper: float) -> str:
    gap = ours - paper
    return f"{gap:+.4f}"


def markdown(result: dict[str, Any]) -> str:
    jobs = result["jobs"]
    pop = result.get("popularity", {})
    lines = ["# LP-GCN: Table 4, Fig. 11 and Fig. 12 (paper 001)", "",
             "Centralized LightGCN and LightGCN+ (LP-GCN computes these steps exactly: "
             "`results/lpgcn/ml-100k_simulation.md`, `results/lpgcn/late_steps.md`), the test "
             "NDCG@20 "
             f"evaluated every {EVAL_EVERY} epochs, stopped after {PATIENCE} evaluations without "
             f"a better one or at {MAX_EPOCHS} epochs; numbers at the best evaluation. "
             "Amazon-Book is not available here (its LightGCN train split cannot be obtained).",
             "", "## Table 4", "",
             "| dataset | model | L | Recall@20 | NDCG@20 | paper R@20 / N@20 | gap N@20 | "
             "epochs (best) | status | s/epoch |", "|---|---|---|---|---|---|---|---|---|---|"]
    for ds in ("gowalla", "yelp2018"):
        rows = [r for r in jobs.values() if r["dataset"] == ds]
        if ds in pop:
            lines.append(f"| {LABEL[ds]} | item popularity | - | {pop[ds][f'recall@{K}']:.4f} | "
                         f"{pop[ds][f'ndcg@{K}']:.4f} | | | | | |")
        for r in sorted(rows, key=lambda r: r["backbone"]):
            best = best_point(r)
            pr, pn = PAPER[ds][r["backbone"]]
            name = "LP-GCN (LightGCN+)" if r["backbone"] == "lightgcn+" else "LightGCN"
            if best is None:
                lines.append(f"| {LABEL[ds]} | {name} | {r['layers']} | - | - | {pr} / {pn} | "
                             f"| {r['epochs']} | {r['status']} | |")
                continue
            status = {"running": f"in progress ({r['epochs']} of at most {r['max_epochs']})",
                      "patience": "converged", "cap": "epoch cap"}[r["status"]]
            lines.append(
                f"| {LABEL[ds]} | {name} | {r['layers']} | {best[f'recall@{K}']:.4f} | "
                f"{best[f'ndcg@{K}']:.4f} | {pr} / {pn} | "
                f"{_verdict(best[f'ndcg@{K}'], pn)} | {r['epochs']} ({best['epoch']}) | "
                f"{status} | {r['train_seconds'] / max(r['epochs'], 1):.0f} |")
    if not any(r["dataset"] in PAPER for r in jobs.values()):
        lines += ["", "No Gowalla or Yelp2018 evaluation yet: `python benchmarks/lpgcn_table4.py "
                  "--jobs gowalla yelp2018 --resume`."]
    running = [r for r in jobs.values() if r["status"] == "running" and r["dataset"] in PAPER]
    if running:
        lines += ["", "A row in progress is not a reproduction yet. " + "; ".join(
                      f"{r['dataset']}/{r['backbone']}: {r['epochs']} epochs, "
                      f"{trend(r)}, at most "
                      f"{(r['max_epochs'] - r['epochs']) * r['train_seconds'] / max(r['epochs'], 1) / 3600:.0f}"
                      " h more on this machine" for r in running) + "."]
    fig11 = [r for r in jobs.values() if r["dataset"] == "ml-100k"]
    if fig11:
        spent = sum(r["train_seconds"] for r in fig11)
        lines += ["", "## Fig. 11: layers (ML-100K, ratings >= 4)", "",
                  f"The paper plots its three big datasets; this sweep's {len(fig11)} runs "
                  f"took {spent / 60:.0f} min of training here.", "",
                  "| L | LightGCN NDCG@20 | LightGCN+ NDCG@20 | LightGCN Recall@20 | "
                  "LightGCN+ Recall@20 |", "|---|---|---|---|---|"]
        by = {(r["backbone"], r["layers"]): best_point(r) for r in fig11}
        for L in sorted({r["layers"] for r in fig11}):
            cells = [by.get((b, L)) for b in ("lightgcn", "lightgcn+")]
            lines.append(f"| {L} | " + " | ".join(
                f"{c[f'ndcg@{K}']:.4f}" if c else "-" for c in cells) + " | " + " | ".join(
                f"{c[f'recall@{K}']:.4f}" if c else "-" for c in cells) + " |")
        if "ml-100k" in pop:
            lines += ["", f"Item popularity: NDCG@20 {pop['ml-100k'][f'ndcg@{K}']:.4f}, "
                      f"Recall@20 {pop['ml-100k'][f'recall@{K}']:.4f}."]
        wins = [L for (b, L), c in by.items() if b == "lightgcn+" and c and by.get(
            ("lightgcn", L)) and c[f"ndcg@{K}"] > by[("lightgcn", L)][f"ndcg@{K}"]]
        total = len({L for _, L in by})
        lines += ["", f"LightGCN+ beats LightGCN at {len(wins)} of {total} layer counts "
                  "(the paper: at every layer count)."]
    lines += cost_lines(result)
    lines += ["", "Fig. 12 (convergence): `results/lpgcn/table4.png`, test NDCG@20 against "
              "epochs.", "",
              "Command: `python benchmarks/lpgcn_table4.py --jobs gowalla yelp2018 fig11 "
              "--resume`.", ""]
    return "\n".join(lines)


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    datasets = [ds for ds in ("gowalla", "yelp2018", "ml-100k")
                if any(r["dataset"] == ds for r in result["jobs"].values())]
    if not datasets:
        return
    fig, axes = plt.subplots(1, len(datasets), figsize=(4.5 * len(datasets), 3.4), squeeze=False)
    for ax, ds in zip(axes[0], datasets):
        for r in sorted(result["jobs"].values(), key=lambda r: (r["backbone"], r["layers"])):
            if r["dataset"] != ds or not r["curve"]:
                continue
            ax.plot([p["epoch"] for p in r["curve"]], [p[f"ndcg@{K}"] for p in r["curve"]],
                    label=f"{r['backbone']} L={r['layers']}")
        if ds in result.get("popularity", {}):
            ax.axhline(result["popularity"][ds][f"ndcg@{K}"], color="grey", ls=":",
                       label="popularity")
        for backbone, (_, n) in PAPER.get(ds, {}).items():
            ax.axhline(n, ls="--", lw=0.8, color="black" if backbone == "lightgcn+" else "tab:red",
                       label=f"paper {backbone}")
        ax.set_title(f"{LABEL[ds]}: test NDCG@20")
        ax.set_xlabel("epoch")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", nargs="+", default=["fig11", "gowalla", "yelp2018"],
                    choices=sorted(JOB_SETS), help="job sets, run in this order")
    ap.add_argument("--backbones", nargs="+", default=None, help="only these backbones")
    ap.add_argument("--resume", action="store_true", help="continue from the checkpoints")
    ap.add_argument("--hours", type=float, default=math.inf, help="stop after this much time")
    ap.add_argument("--checkpoint-dir", type=Path, default=CHECKPOINTS)
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--markdown-only", action="store_true")
    ap.add_argument("--device", default="numpy", help="numpy (the reference) or a torch "
                    "device: cpu, cuda, cuda:N")
    ap.add_argument("--cost", action="store_true", help="measure each row's seconds per "
                    "epoch on every device here and write the cost section")
    ap.add_argument("--cost-steps", type=int, default=10, help="timed steps per row and "
                    "device (--cost)")
    args = ap.parse_args()
    if (why := available(args.device)) is not None:
        raise SystemExit(f"error: --device: {why}")
    if args.cost:
        cost = {**measure_cost(args.cost_steps), "machine": machine_info()}
        with open(args.out.with_suffix(".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            result = stored_result(args.out) or {"jobs": {}, "popularity": {}}
            result["cost"] = cost
            write_report(args.out, result, markdown(result))
        return
    if args.markdown_only:
        rewrite_markdown(args.out, markdown, plot)
        return
    deadline = time.time() + args.hours * 3600
    from fedrec.recsys.metrics import popularity_sums

    for name in args.jobs:
        jobs = [j for j in JOB_SETS[name] if not args.backbones or j.backbone in args.backbones]
        dataset = jobs[0].dataset
        log(f"{dataset}: loading")
        train, test = load_split(dataset)
        pop = popularity_sums(train, test, k=K).means()
        stored = stored_result(args.out) or {}
        extra = {"popularity": {**stored.get("popularity", {}),
                                dataset: {k: pop[k] for k in (f"recall@{K}", f"ndcg@{K}")}}}
        for job in jobs:
            if time.time() >= deadline:
                break
            done = (stored.get("jobs", {}).get(job.key, {}).get("status") in ("patience", "cap"))
            if done and args.resume:
                log(f"{job.key}: finished earlier, kept")
                continue
            log(f"{job.key}: training ({train.shape[0]} users, {train.shape[1]} items, "
                f"{train.nnz} interactions)")
            train_job(job, train, test, args.checkpoint_dir, resume=args.resume,
                      deadline=deadline, build=lambda tr, job=job: build_model(job, tr,
                                                                               args.device),
                      on_record=lambda rec, job=job: update_results(args.out, job, rec, extra))


if __name__ == "__main__":
    main()
