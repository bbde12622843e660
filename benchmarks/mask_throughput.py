"""Mask generation throughput: our AES-256-CTR ``expand_mask`` vs Flower's ``pseudo_rand_gen``.

Why: secure aggregation expands one mask per peer per sum, so the generator must be fast as
well as sound. Flower's generator (32-bit Mersenne-Twister seed, flwr issue 7522) is shown
only for comparison; it is never used for masks.

Measures MB/s (1 MB = 1e6 bytes of uint64 output) for 1e7 values, best of 3, on one thread,
prints both numbers and writes ``results/mask_throughput.json``.

Run: ``python benchmarks/mask_throughput.py [--n 10000000] [--repeats 3]``
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from flwr.common.secure_aggregation.secaggplus_utils import pseudo_rand_gen  # noqa: E402

from benchmarks._report import machine_info, write_report  # noqa: E402
from fedrec.secure.masks import expand_mask  # noqa: E402


def best_time(fn, repeats: int) -> float:
    """Best wall time of ``repeats`` calls (after one warm-up call)."""
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def markdown(result: dict) -> str:
    return (f"# Mask generation throughput\n\n| generator | MB/s |\n|---|---:|\n"
            f"| AES-256-CTR (`fedrec/secure/masks.py`) | {result['aes_ctr_mb_per_s']:.1f} |\n"
            f"| Flower pseudo_rand_gen (Mersenne Twister) | {result['flower_mt_mb_per_s']:.1f} |\n\n"
            f"{result['n_values']:,} int64 values, best of {result['repeats']} on one core.\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=10_000_000, help="uint64 values per mask")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "mask_throughput.json")
    args = parser.parse_args()

    key = os.urandom(32)
    nbytes = args.n * 8
    t_aes = best_time(lambda: expand_mask(key, 0, args.n), args.repeats)
    # Flower draws int64 in [0, num_range - 1); 2^62 keeps the draw within int64 range.
    t_mt = best_time(lambda: pseudo_rand_gen(key, 1 << 62, [(args.n,)]), args.repeats)

    aes = nbytes / t_aes / 1e6
    mt = nbytes / t_mt / 1e6
    print(f"expand_mask (AES-256-CTR) : {aes:9.1f} MB/s  ({args.n:,} uint64 in {t_aes * 1e3:.1f} ms)")
    print(f"flwr pseudo_rand_gen (MT) : {mt:9.1f} MB/s  ({args.n:,} int64 in {t_mt * 1e3:.1f} ms)")
    print(f"ratio                     : {aes / mt:9.1f}x")

    result = {
        "aes_ctr_mb_per_s": round(aes, 1),
        "flower_mt_mb_per_s": round(mt, 1),
        "n_values": args.n,
        "repeats": args.repeats,
        **machine_info(),
    }
    write_report(args.out, result, markdown(result))


if __name__ == "__main__":
    main()
