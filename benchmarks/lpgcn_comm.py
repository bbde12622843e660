"""LP-GCN's per-client communication (paper 001, Eq. 30) and neighbour reuse (Eqs. 31-32)
against the proportion k of convolution clients, in the paper's setting of one user per
client.

    C = d L B sum_{u in U~} |N_u| / |U|         (bytes per client per iteration)
    r_u = (sum_{i in I~_u} |U_i \\ u| - |N_u|) / |N_u|,   R = mean of r_u over U~

U~ is the set of convolution clients: the greedy cover of the items by users (the smallest k,
as the protocol builds it: ``fedrec.recsys.cover``), grown by random users for larger k as
the authors' code does; each item then goes to one random convolution client holding it, and
N_u is the set of distinct other users whose rows client u receives for its items. d = 64,
B = 4 bytes (float32), 1 KB = 1024 B, as in the paper (19.8 KB on Gowalla at L = 4, 22.0 KB
on Yelp2018 at L = 3).

    python benchmarks/lpgcn_comm.py                      # gowalla and yelp2018
    python benchmarks/lpgcn_comm.py --datasets gowalla --seeds 3
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks._report import log, machine_info, write_report  # noqa: E402
from datasets import DatasetSpec, load_dataset  # noqa: E402
from datasets.errors import DataError  # noqa: E402
from fedrec.recsys.cover import assign_items, greedy_cover, neighbour_counts  # noqa: E402

#: The paper's setting per dataset: layers, reported C (KB) and k range (%), section 5.2.
PAPER = {"gowalla": {"L": 4, "C_kb": 19.8, "k_range": [7.57, 59.30]},
         "yelp2018": {"L": 3, "C_kb": 22.0, "k_range": [7.26, 57.05]}}
D, BYTES = 64, 4
K_GRID = (10.0, 20.0, 30.0, 40.0, 50.0, 60.0)


def sweep(train: Any, layers: int, seed: int) -> dict[str, Any]:
    """C and R at the minimal cover and at each k of K_GRID above it."""
    n = train.shape[0]
    t0 = time.perf_counter()
    cover = greedy_cover(train)
    cover_seconds = time.perf_counter() - t0
    rng = np.random.default_rng([seed, 30])
    rest = rng.permutation(np.setdiff1d(np.arange(n), cover))
    k_min = 100.0 * len(cover) / n
    rows = []
    for k in (k_min, *[k for k in K_GRID if k > k_min]):
        size = max(len(cover), int(round(k * n / 100.0)))
        members = np.concatenate([cover, rest[:size - len(cover)]])
        conv_of = assign_items(train, members, np.random.default_rng([seed, 31, size]))
        distinct, repeats = neighbour_counts(train, conv_of)
        sending = distinct[members] > 0
        reuse = (repeats[members][sending] - distinct[members][sending]) / distinct[members][sending]
        rows.append({"k_percent": 100.0 * size / n, "convolution_clients": int(size),
                     "C_bytes": float(D * layers * BYTES * distinct.sum() / n),
                     "neighbours_per_client": float(distinct.sum() / n),
                     "R_reuse": float(reuse.mean()) if len(reuse) else 0.0,
                     "clients_receiving_nothing": int((~sending).sum())})
        log(f"  k = {rows[-1]['k_percent']:.2f}%: C = {rows[-1]['C_bytes'] / 1024:.1f} KB, "
            f"R = {rows[-1]['R_reuse']:.2f}")
    return {"k_min_percent": k_min, "cover_seconds": cover_seconds, "rows": rows}


def plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_c, ax_r) = plt.subplots(1, 2, figsize=(10, 4))
    for name, res in results.items():
        rows = res["seeds"][0]["rows"]
        ks = [r["k_percent"] for r in rows]
        ax_c.plot(ks, [r["C_bytes"] / 1024 for r in rows], "o-", label=f"{name} (L={res['L']})")
        ax_c.axhline(PAPER[name]["C_kb"], ls=":", color=ax_c.lines[-1].get_color(),
                     label=f"{name}: paper {PAPER[name]['C_kb']} KB")
        ax_r.plot(ks, [r["R_reuse"] for r in rows], "o-", label=name)
    ax_c.set(xlabel="convolution clients k (% of users)", ylabel="C (KB per client per iteration)",
             title="Eq. 30: per-client communication")
    ax_r.set(xlabel="convolution clients k (% of users)", ylabel="R",
             title="Eq. 32: reuse of received neighbour rows")
    ax_c.legend(fontsize=8)
    ax_r.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def markdown(results: dict[str, Any], command: str) -> str:
    lines = ["# LP-GCN per-client communication (paper 001, Eq. 30) and reuse (Eq. 32)", "",
             "One user per client, d = 64, B = 4 bytes, KB = 1024 B. k = convolution clients as "
             "a share of users; the first row of each dataset is the greedy cover (smallest k).",
             "", "| dataset | L | k (%) | C (KB) | neighbours / client | R | paper C (KB) |",
             "|---|---|---|---|---|---|---|"]
    verdicts = []
    for name, res in results.items():
        rows = res["seeds"][0]["rows"]
        for r in rows:
            lines.append(f"| {name} | {res['L']} | {r['k_percent']:.2f} | "
                         f"{r['C_bytes'] / 1024:.1f} | {r['neighbours_per_client']:.1f} | "
                         f"{r['R_reuse']:.2f} | {PAPER[name]['C_kb']} |")
        paper = PAPER[name]["C_kb"]
        at_min = np.array([sd["rows"][0]["C_bytes"] / 1024 for sd in res["seeds"]])
        rises = rows[-1]["C_bytes"] > rows[0]["C_bytes"]
        verdicts.append(
            f"- {name}: smallest k {res['seeds'][0]['k_min_percent']:.2f}% (the greedy cover; "
            f"the paper's range starts at {PAPER[name]['k_range'][0]}%); C there "
            f"{at_min.mean():.1f} KB (sd {at_min.std():.2f} over {len(at_min)} assignment "
            f"seed(s)), {at_min.mean() / paper:.2f}x the paper's {paper} KB; C "
            + ("rises with k, as the paper reports" if rises else
               "does not rise with k, unlike the paper")
            + f" ({rows[0]['C_bytes'] / 1024:.1f} -> {rows[-1]['C_bytes'] / 1024:.1f} KB at "
            f"{rows[-1]['k_percent']:.0f}%), and R falls from {rows[0]['R_reuse']:.2f} to "
            f"{rows[-1]['R_reuse']:.2f}.")
    return "\n".join(lines + ["", *verdicts, "", f"Command: `{command}`", ""])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--datasets", nargs="+", default=list(PAPER), choices=list(PAPER))
    ap.add_argument("--seeds", type=int, default=1)
    ap.add_argument("--out", default=str(REPO / "results" / "lpgcn"))
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {}
    for name in args.datasets:
        try:
            data = load_dataset(DatasetSpec(name=name))
        except DataError as exc:
            log(f"{name}: skipped ({exc})")
            continue
        L = PAPER[name]["L"]
        log(f"{name}: {data.train.shape[0]} users, {data.train.shape[1]} items, L = {L}")
        results[name] = {"L": L, "users": int(data.train.shape[0]),
                         "items": int(data.train.shape[1]), "paper": PAPER[name],
                         "seeds": [sweep(data.train, L, seed) for seed in range(args.seeds)]}
    if not results:
        raise SystemExit("no dataset found (see docs/datasets.md)")
    command = "python benchmarks/lpgcn_comm.py " + " ".join(sys.argv[1:])
    stem = "comm" if len(results) > 1 else f"comm_{next(iter(results))}"
    write_report(out / f"{stem}.json", {"dimension": D, "bytes_per_float": BYTES,
                                         "datasets": results, "command": command.strip(),
                                         "machine": machine_info()},
                 markdown(results, command.strip()))
    plot(results, out / f"{stem}.png")


if __name__ == "__main__":
    main()
