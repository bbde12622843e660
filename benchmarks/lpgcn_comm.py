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

``--holdings-cost`` instead prices the node's holdings (``lpgcn-holdings``: the paper's
sampled virtual items against the default whole catalogue) on Gowalla in the protocol's own
messages (:func:`step_bytes`), for the benchmark's 8 nodes and for one user per client;
results/lpgcn/holdings_cost.{json,md}.

    python benchmarks/lpgcn_comm.py --holdings-cost
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

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


def step_bytes(held: np.ndarray, conv: np.ndarray, shares_in: np.ndarray, layers: int,
               dim: int, nbytes: int) -> np.ndarray:
    """Bytes per node per LightGCN training step that scale with its held items, from the
    protocol's rounds (docs/protocols/lpgcn.md, "What runs" and "Costs"): down, every
    layer's rows of its ``held`` items, the gradient sums of layers 1..L for them and layer
    0 for its ``conv`` (convolution) items; up, its convolution items' rows of every layer
    and its covered partials of every layer; sealed shares of layers 0..L-1 out for every
    held item another node convolves and, at a convolution node, ``shares_in`` (the other
    holders of its items) in. Requested negatives' rows and message framing are left out."""
    held, conv, shares_in = (np.asarray(x, dtype=np.float64) for x in (held, conv, shares_in))
    L = layers
    rows = ((L + 1) * held + L * held + conv            # down: rows, sums, layer-0 sums
            + (L + 1) * conv + (L + 1) * held           # up: convolution rows, partials
            + L * (held - conv) + L * shares_in)        # sealed shares out and in
    return rows * dim * nbytes


def _holdings_bytes(holds: sp.csr_matrix, seed: int, layers: int) -> np.ndarray:
    """:func:`step_bytes` per node for the held sets ``holds`` (nodes x items) under the
    protocol's assignment: greedy cover, one random cover holder per item."""
    cover = greedy_cover(holds)
    conv_of = assign_items(holds, cover, np.random.default_rng([seed, 53]))
    n = holds.shape[0]
    holders = np.asarray(holds.sum(axis=0)).ravel()
    conv = np.bincount(conv_of, minlength=n)
    shares_in = np.bincount(conv_of, weights=holders - 1, minlength=n)
    return step_bytes(np.asarray(holds.sum(axis=1)).ravel(), conv, shares_in, layers, D, BYTES)


def _sampled(real: sp.csr_matrix, users: np.ndarray, alpha: float,
             rng: np.random.Generator) -> sp.csr_matrix:
    """Held sets under the paper's sampled draw, distributed as
    ``fedrec.secure.pseudonyms.virtual_items`` draws them (a count uniform in
    ``[0, 2 alpha users]``, then that many distinct items uniform among the others), drawn
    without listing the others: the j-th item not in the sorted ``mine`` is
    ``j + #{r in mine : r - rank(r) <= j}`` (one user per client makes 29,858 draws)."""
    m = real.shape[1]
    rows = []
    for k in range(real.shape[0]):
        mine = np.sort(real.indices[real.indptr[k]:real.indptr[k + 1]])
        top = int(round(2 * alpha * int(users[k])))
        count = min(int(rng.random() * (top + 1)), m - len(mine))
        j = rng.choice(m - len(mine), count, replace=False)
        virtual = j + np.searchsorted(mine - np.arange(len(mine)), j, side="right")
        rows.append(np.concatenate([mine, virtual]))
    ptr = np.r_[0, np.cumsum([len(r) for r in rows])]
    return sp.csr_matrix((np.ones(ptr[-1], dtype=bool), np.concatenate(rows), ptr),
                         shape=real.shape)


def holdings_cost(data: Any, nodes_list: list[int], alpha: float, layers: int,
                  measured: dict[str, float], seed: int = 0) -> dict[str, Any]:
    """Bytes per node per step under sampled and catalogue holdings on ``train``, for each
    node count (``shards-random`` with ``seed``, as the protocol's partition; the number of
    users for one user per client). Seconds per step scale the measured in-process step
    (``measured``: results/lpgcn/gowalla.json, 8 nodes, sampled) by the federation's total
    bytes, since serialising those bytes dominates it (docs/protocols/lpgcn.md, "Gowalla")."""
    from datasets.partition import PartitionSpec, partition_users

    n_users, m = data.train.shape
    R = sp.csr_matrix(data.train, dtype=bool)
    out = []
    per_byte = None
    for nodes in nodes_list:
        scheme = "user" if nodes == n_users else "shards-random"
        parts = partition_users(data, PartitionSpec(scheme=scheme, num_partitions=nodes,
                                                    seed=seed))
        owner = np.empty(n_users, dtype=np.int64)
        for k, p in enumerate(parts):
            owner[p] = k
        A = sp.csr_matrix((np.ones(n_users, dtype=bool), (owner, np.arange(n_users))),
                          shape=(nodes, n_users))
        real = sp.csr_matrix((A.astype(np.int64) @ R.astype(np.int64)) > 0)
        users = np.asarray((A.astype(np.int64) @ (R.getnnz(axis=1) > 0).astype(np.int64)))
        sampled = _holdings_bytes(_sampled(real, users.ravel(), alpha,
                                           np.random.default_rng([seed, 35])), seed, layers)
        # catalogue: every node holds all m items, so the greedy cover is one node that
        # convolves them all and takes the other nodes' shares of every item
        conv = np.zeros(nodes)
        conv[0] = m
        shares_in = np.zeros(nodes)
        shares_in[0] = (nodes - 1) * m
        catalogue = step_bytes(np.full(nodes, m), conv, shares_in, layers, D, BYTES)
        row = {"nodes": nodes, "real_items_per_node": float(real.getnnz(axis=1).mean()),
               "sampled": {"mean": float(sampled.mean()), "max": float(sampled.max()),
                           "total": float(sampled.sum())},
               "catalogue": {"mean": float(catalogue.mean()), "max": float(catalogue.max()),
                             "total": float(catalogue.sum())}}
        if nodes == measured["nodes"]:
            per_byte = measured["seconds_per_step"] / row["sampled"]["total"]
            row["measured_bytes_per_node"] = measured["bytes_per_node"]
        out.append(row)
        log(f"  {nodes} nodes: sampled {row['sampled']['mean'] / 2**20:.3g} MiB/node, "
            f"catalogue {row['catalogue']['mean'] / 2**20:.3g} MiB/node")
    for row in out:
        for mode in ("sampled", "catalogue"):
            row[mode]["seconds_per_step"] = (row[mode]["total"] * per_byte
                                             if per_byte is not None else None)
    return {"alpha": alpha, "layers": layers, "seconds_per_byte": per_byte, "rows": out}


def holdings_markdown(res: dict[str, Any], command: str) -> str:
    mib = 2 ** 20
    lines = ["# LP-GCN: what holding the whole catalogue costs on Gowalla", "",
             f"Bytes per node per LightGCN training step that scale with the held items "
             f"(`benchmarks/lpgcn_comm.py`, `step_bytes`; d = {D}, {BYTES}-byte floats, "
             f"L = {res['layers']}), under the paper's sampled virtual items (lpgcn-alpha "
             f"{res['alpha']:g}, one seeded draw) and the default `catalogue` holdings (every "
             "node holds all items; the greedy cover is then one node, which convolves every "
             "item and takes the other nodes' sealed shares). Seconds per step: the measured "
             "in-process Gowalla step (results/lpgcn/gowalla.json) scaled by the federation's "
             f"total bytes ({res['seconds_per_byte'] * 1e9:.2f} ns per byte there).", "",
             "| nodes | real items / node | sampled: MiB / node (max) | catalogue: MiB / node "
             "(max) | ratio (mean) | s / step sampled | s / step catalogue |",
             "|---|---|---|---|---|---|---|"]
    for r in res["rows"]:
        s_, c_ = r["sampled"], r["catalogue"]
        lines.append(f"| {r['nodes']} | {r['real_items_per_node']:.0f} | "
                     f"{s_['mean'] / mib:.3g} ({s_['max'] / mib:.3g}) | "
                     f"{c_['mean'] / mib:.3g} ({c_['max'] / mib:.3g}) | "
                     f"{c_['mean'] / s_['mean']:.3g} | {s_['seconds_per_step']:.3g} | "
                     f"{c_['seconds_per_step']:.3g} |")
    for r in res["rows"]:
        if "measured_bytes_per_node" in r:
            ratio = r["sampled"]["mean"] / r["measured_bytes_per_node"]
            lines += ["", f"Check of the model: at {r['nodes']} nodes it gives "
                      f"{r['sampled']['mean'] / mib:.1f} MiB per node for sampled holdings; the "
                      f"measured run (same setting, its own private draws) sent "
                      f"{r['measured_bytes_per_node'] / mib:.1f} MiB per node per step "
                      f"(model / measured {ratio:.2f})."]
    return "\n".join(lines + ["", f"Command: `{command}`", ""])


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
    ap.add_argument("--holdings-cost", action="store_true",
                    help="Gowalla: bytes and seconds per step of sampled against catalogue "
                    "holdings (results/lpgcn/holdings_cost.*)")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.holdings_cost:
        import json

        data = load_dataset(DatasetSpec(name="gowalla"))
        bench = json.loads((REPO / "results" / "lpgcn" / "gowalla.json").read_text())
        measured = {"nodes": bench["nodes"], "bytes_per_node": bench[
            "bytes_per_node_per_iteration"], "seconds_per_step": bench["seconds_per_step"][
            "federated"]}
        res = holdings_cost(data, [bench["nodes"], 100, data.train.shape[0]],
                            float(bench["config"]["lpgcn-alpha"]),
                            int(bench["config"]["lpgcn-layers"]), measured)
        command = "python benchmarks/lpgcn_comm.py --holdings-cost"
        write_report(out / "holdings_cost.json", {**res, "dimension": D, "bytes_per_float": BYTES,
                                                  "measured": measured, "command": command,
                                                  "machine": machine_info()},
                     holdings_markdown(res, command))
        return
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
