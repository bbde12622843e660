"""DP noise sampling throughput: the exact discrete samplers of ``fedrec/dp_sampling.py``
against OpenDP's ``make_gaussian`` (what ``fedrec/dp.py`` used before) and numpy's
``normal`` (a memory-speed reference, not a DP sampler), in one run.

Why: FedPower / FedSVD draw d x r noise values per node per iteration, so the sampler's
rate decides whether a LastFM-size run spends minutes or an hour drawing noise.

Measures samples per CPU second of this process (``time.process_time``, one thread: the
numbers are per core and hold on a shared machine), best of ``--repeats`` after one
warm-up, and writes ``results/dp_sampler/sampler.{json,md,png}``.

Run: ``nice python benchmarks/noise_sampler.py [--n 1000000] [--repeats 3]``
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")  # per-core numbers: one thread everywhere

import argparse  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._report import log, machine_info, write_report  # noqa: E402
from fedrec import dp_sampling as ds  # noqa: E402

OUT = ROOT / "results" / "dp_sampler" / "sampler.json"
GAUSSIAN_SIGMAS = [0.5, 1.0, 10.0, 1e3, 2.0 ** 44]  # 2^44: the grid scale FedSVD uses
LAPLACE_SCALES = [0.5, 10.0, 1e3, 2.0 ** 44]


def per_cpu_second(fn, n: int, repeats: int) -> float:
    """Samples per CPU second of ``fn()`` drawing ``n``: best of ``repeats`` after a warm-up."""
    fn()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.process_time()
        fn()
        best = min(best, time.process_time() - t0)
    return n / best


def opendp_gaussian(n: int):
    """OpenDP's make_gaussian on n zeros (fedrec/dp.py's former sampler)."""
    import opendp.prelude as odp

    odp.enable_features("contrib")
    meas = odp.m.make_gaussian(odp.vector_domain(odp.atom_domain(T=float, nan=False)),
                               odp.l2_distance(T=float), scale=1.0)
    zeros = [0.0] * n
    return lambda: meas(zeros)


def measure(n: int, n_opendp: int, repeats: int) -> list[dict]:
    rows = []
    for sigma in GAUSSIAN_SIGMAS:
        rate = per_cpu_second(lambda: ds.discrete_gaussian(n, sigma), n, repeats)
        rows.append({"sampler": "discrete Gaussian (exact)", "scale": sigma, "n": n,
                     "per_cpu_s": rate})
        log(f"discrete Gaussian sigma {sigma:g}: {rate:,.0f}/s")
    for scale in LAPLACE_SCALES:
        rate = per_cpu_second(lambda: ds.discrete_laplace(n, scale), n, repeats)
        rows.append({"sampler": "discrete Laplace (exact)", "scale": scale, "n": n,
                     "per_cpu_s": rate})
        log(f"discrete Laplace scale {scale:g}: {rate:,.0f}/s")
    x = np.linspace(-1.0, 1.0, n)
    rate = per_cpu_second(lambda: ds.add_discrete_gaussian(x, 0.1), n, repeats)
    rows.append({"sampler": "x + discrete Gaussian on the grid (FedSVD's path)", "scale": 0.1,
                 "n": n, "per_cpu_s": rate})
    log(f"add_discrete_gaussian sigma 0.1: {rate:,.0f}/s")
    rate = per_cpu_second(opendp_gaussian(n_opendp), n_opendp, repeats)
    rows.append({"sampler": "OpenDP make_gaussian", "scale": 1.0, "n": n_opendp,
                 "per_cpu_s": rate})
    log(f"OpenDP make_gaussian: {rate:,.0f}/s")
    rng = np.random.default_rng(0)
    n_numpy = 10 * n
    rate = per_cpu_second(lambda: rng.normal(0.0, 1.0, n_numpy), n_numpy, repeats)
    rows.append({"sampler": "numpy normal (not DP-safe)", "scale": 1.0, "n": n_numpy,
                 "per_cpu_s": rate})
    log(f"numpy normal: {rate:,.0f}/s")
    opendp = next(r["per_cpu_s"] for r in rows if r["sampler"].startswith("OpenDP"))
    numpy = rows[-1]["per_cpu_s"]
    for r in rows:
        r["vs_opendp"] = r["per_cpu_s"] / opendp
        r["vs_numpy"] = r["per_cpu_s"] / numpy
    return rows


def markdown(result: dict) -> str:
    lines = [
        "# DP noise sampling throughput",
        "",
        "Samples per CPU second of one process, one thread (best of "
        f"{result['config']['repeats']} after a warm-up), on {result['machine']['cpus']} "
        f"CPUs ({result['machine']['machine']}), numpy {result['machine']['numpy']}, flwr "
        f"{result['machine']['flwr_version']}. Reproduce: `nice python "
        "benchmarks/noise_sampler.py`.",
        "",
        "| sampler | scale | samples | samples / CPU s | x OpenDP | x numpy normal |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in result["rows"]:
        lines.append(f"| {r['sampler']} | {r['scale']:g} | {r['n']:,} | {r['per_cpu_s']:,.0f} | "
                     f"{r['vs_opendp']:.1f} | {r['vs_numpy']:.3f} |")
    lines += [
        "",
        "The discrete samplers are exact (Canonne, Kamath & Steinke 2020, Algorithms 1-3, "
        "batched; `fedrec/dp_sampling.py`) and draw from ChaCha20 keyed by `os.urandom`; "
        "OpenDP's is exact too, one value per call; numpy's normal is the speed of memory "
        "and a seedable floating-point sampler, shown as a reference only. Scale 2^44 "
        "(1.76e13) is the scale in grid steps every real-valued mechanism uses "
        "(`noise_grid`). The FedSVD row includes rounding x to the grid.",
        "",
        "![throughput](sampler.png)",
        "",
    ]
    return "\n".join(lines)


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["rows"]
    labels = [f"{r['sampler']}\n(scale {r['scale']:g})" for r in rows]
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(rows) + 1.2))
    ax.barh(range(len(rows)), [r["per_cpu_s"] for r in rows], color="tab:blue")
    ax.set_yticks(range(len(rows)), labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("samples per CPU second (one thread)")
    ax.axvline(1e6, color="grey", linestyle=":", linewidth=1)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1_000_000, help="samples per discrete draw")
    ap.add_argument("--n-opendp", type=int, default=20_000, help="samples per OpenDP draw")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    result = {"config": {"n": args.n, "n_opendp": args.n_opendp, "repeats": args.repeats,
                         "timer": "time.process_time", "threads": 1},
              "machine": machine_info(),
              "rows": measure(args.n, args.n_opendp, args.repeats)}
    write_report(args.out, result, markdown(result))
    plot(result, args.out.with_suffix(".png"))


if __name__ == "__main__":
    main()
