"""Centralized graph-filter references for PriviRec (paper 000, Table 3 "Centr." column).

Loads the LightGCN train/test splits (scipy ``.npz``) of Gowalla and Yelp2018, fits every
graph filter (GF-CF, BSPM-LM, BSPM-EM, Turbo-CF, plus the linear and ideal parts alone) from
the centrally computed pieces (item degrees, P~, exact top-k singular vectors of R~), scores
all users in batches and reports Recall@20 / NDCG@20 (LightGCN all-ranking protocol:
training items excluded, every other item ranked) with wall times.  Optionally also GF-CF
with S_k from the paper's randomized power method (Algorithm 1, L rounds) for comparison with
Table 3's "Priv." column.

Usage::

    python benchmarks/centralized_filters.py [--datasets gowalla yelp2018] [--filters ...]
        [--data-dir DIR] [--batch-size 1024] [--power-L 2] [--out results/privirec]

Data: ``--data-dir`` or ``$FEDREC_DATA`` or ``<repo>/../shared/data``; each dataset folder
holds ``train.npz`` and ``test.npz`` (users x items, 1.0 per interaction).
Writes ``<out>/centralized_<dataset>.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import sys
import time
from pathlib import Path

import numpy as np
import scipy
import scipy.sparse as sp

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks._report import log, machine_info, write_report  # noqa: E402
from datasets import DatasetSpec, load_dataset  # noqa: E402
from fedrec.recsys.graph_filters import (  # noqa: E402
    FILTER_NAMES,
    FactoredItemItem,
    build_filter,
)
from fedrec.recsys.linalg import (  # noqa: E402
    item_item_matrix,
    normalize_interactions,
    privirec_power_method,
    projector_distance,
    top_right_singular_vectors,
)
from fedrec.recsys.metrics import evaluate_ranking  # noqa: E402

# Paper 000, Table 3 (NDCG@20; the Centr. column equals the published numbers of each method)
PAPER_NDCG = {
    "gowalla": {"gf-cf": (0.1518, 0.1528), "turbo-cf": (0.1531, 0.1531),
                "bspm-lm": (0.1570, 0.1580), "bspm-em": (0.1597, 0.1595)},
    "yelp2018": {"gf-cf": (0.0571, 0.0561), "turbo-cf": (0.0574, 0.0574),
                 "bspm-lm": (0.0584, 0.0576), "bspm-em": (0.0593, 0.0589)},
}
DEFAULT_FILTERS = ("gf-cf", "turbo-cf", "bspm-lm", "bspm-em", "linear", "ideal")


def load(data_dir: str, name: str) -> tuple[sp.csr_matrix, sp.csr_matrix]:
    """Train/test of ``name`` through the project's loader (same files, same errors)."""
    data = load_dataset(DatasetSpec(name=name, data_dir=data_dir))
    return data.train, data.test


def peak_rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def evaluate(flt, train: sp.csr_matrix, test: sp.csr_matrix, batch_size: int) -> dict:
    t = time.perf_counter()
    sums = evaluate_ranking(lambda idx: flt.score(train[idx]), train, test, k=20, batch_size=batch_size)
    m = sums.means()
    return {"recall@20": m["recall@20"], "ndcg@20": m["ndcg@20"], "n_users": sums.n_users,
            "score_eval_s": time.perf_counter() - t}


def run_dataset(name: str, d: str, filters: list[str], batch_size: int, power_L: list[int],
                seed: int, log) -> dict:
    train, test = load(d, name)
    log(f"== {name}: {train.shape[0]} users x {train.shape[1]} items, "
        f"{train.nnz} train / {test.nnz} test interactions")
    flts = {f: build_filter(f, dataset=name) for f in filters}
    timings: dict[str, float] = {}

    # ---- shared pieces for alpha = 1/2 filters -----------------------------------------
    t = time.perf_counter()
    R_t, _, item_deg = normalize_interactions(train, 0.5)
    P_half = FactoredItemItem(R_t)
    timings["normalize_s"] = time.perf_counter() - t
    t = time.perf_counter()
    nnz_P = item_item_matrix(R_t).nnz  # size of what PriviRec broadcasts (timed for reference)
    timings["item_item_sparse_s"] = time.perf_counter() - t
    rank = max([f.rank for f in flts.values() if f.needs_S and f.alpha == 0.5] + [0])
    S = vals = None
    if rank:
        t = time.perf_counter()
        S, vals = top_right_singular_vectors(R_t, rank, seed=seed)
        timings[f"svds_rank{rank}_s"] = time.perf_counter() - t
        log(f"   svds rank {rank}: {timings[f'svds_rank{rank}_s']:.1f} s "
            f"(top sigma^2 {vals[0]:.6f}, sigma^2_{rank} {vals[-1]:.6f})")
    log(f"   P~ nnz {nnz_P} ({nnz_P / train.shape[1] ** 2:.2%} dense), built in {timings['item_item_sparse_s']:.1f} s")

    rows = []
    for fname, flt in flts.items():
        t = time.perf_counter()
        if flt.alpha == 0.5:
            P_in = P_half
        else:  # Turbo-CF's own normalization exponent
            R_a, _, _ = normalize_interactions(train, flt.alpha)
            P_in = item_item_matrix(R_a) if getattr(flt, "power", 1.0) != 1.0 else FactoredItemItem(R_a)
        flt.fit(item_deg, P_in if flt.needs_P else None, S if flt.needs_S else None, vals)
        fit_s = time.perf_counter() - t
        res = evaluate(flt, train, test, batch_size)
        paper = PAPER_NDCG.get(name, {}).get(fname)
        row = {"filter": fname, "hyperparams": flt.get_params(), "fit_s": fit_s, **res,
               "paper_ndcg@20_centr": paper[0] if paper else None,
               "paper_ndcg@20_priv": paper[1] if paper else None,
               "delta_vs_paper": (res["ndcg@20"] - paper[0]) if paper else None,
               "peak_rss_gib": peak_rss_gib()}
        rows.append(row)
        log(f"   {fname:<22} recall@20 {res['recall@20']:.4f}  ndcg@20 {res['ndcg@20']:.4f}"
            f"  paper {paper[0] if paper else float('nan'):.4f}  fit {fit_s:6.1f} s"
            f"  score+eval {res['score_eval_s']:6.1f} s  rss {row['peak_rss_gib']:.1f} GiB")

    # ---- GF-CF with the paper's randomized power method (Alg. 1), p = k = 256 -----------
    for L in power_L:
        t = time.perf_counter()
        S_pw, T_pw = privirec_power_method(R_t, 256, p=256, L=L, rng=np.random.default_rng(seed))
        pw_s = time.perf_counter() - t
        flt = build_filter("gf-cf", dataset=name).fit(item_deg, P_half, S_pw, T_pw)
        res = evaluate(flt, train, test, batch_size)
        dist = projector_distance(S_pw, S[:, :256]) / np.sqrt(2 * 256) if S is not None and S.shape[1] >= 256 else None
        paper = PAPER_NDCG.get(name, {}).get("gf-cf")
        fname = f"gf-cf[power L={L}]"
        rows.append({"filter": fname, "hyperparams": {**flt.get_params(), "L": L, "p": 256, "seed": seed},
                     "fit_s": pw_s, **res, "paper_ndcg@20_centr": paper[0] if paper else None,
                     "paper_ndcg@20_priv": paper[1] if paper else None,
                     "delta_vs_paper": (res["ndcg@20"] - paper[1]) if paper else None,
                     "projector_dist_to_exact_rel": dist, "peak_rss_gib": peak_rss_gib()})
        log(f"   {fname:<22} recall@20 {res['recall@20']:.4f}  ndcg@20 {res['ndcg@20']:.4f}"
            f"  paper(Priv) {paper[1] if paper else float('nan'):.4f}  power {pw_s:6.1f} s"
            f"  score+eval {res['score_eval_s']:6.1f} s  ||SS'-S*S*'||_F/sqrt(2k) {dist if dist is None else round(dist, 4)}")

    return {"dataset": name, "n_users": train.shape[0], "n_items": train.shape[1],
            "n_train": int(train.nnz), "n_test": int(test.nnz), "P_nnz": int(nnz_P),
            "metric_protocol": "LightGCN all-ranking: train items excluded, binary relevance, "
                               "recall = hits/|test_u|, NDCG IDCG over min(|test_u|, 20), users with test items",
            "batch_size": batch_size, "seed": seed, "timings": timings, "results": rows,
            "environment": {"python": platform.python_version(), "numpy": np.__version__,
                            "scipy": scipy.__version__, "cpus": os.cpu_count(),
                            "machine": platform.machine()}}


def markdown(res: dict) -> str:
    lines = [f"# Centralized graph filters on {res['dataset']} (PriviRec paper 000, Table 3)", "",
             f"{res['n_users']} users x {res['n_items']} items, {res['n_train']} train / {res['n_test']} "
             f"test; P~ nnz {res['P_nnz']}. Protocol: {res['metric_protocol']}.", "",
             "| filter | Recall@20 | NDCG@20 | paper NDCG@20 (Centr. / Priv.) | fit s | score+eval s |",
             "|---|---|---|---|---|---|"]
    for r in res["results"]:
        p = (f"{r['paper_ndcg@20_centr']:.4f} / {r['paper_ndcg@20_priv']:.4f}"
             if r["paper_ndcg@20_centr"] is not None else "-")
        lines.append(f"| {r['filter']} | {r['recall@20']:.4f} | {r['ndcg@20']:.4f} | {p} | "
                     f"{r['fit_s']:.1f} | {r['score_eval_s']:.1f} |")
    lines += ["", "Shared steps: " + ", ".join(f"{k} {v:.1f}" for k, v in res["timings"].items()), ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--datasets", nargs="+", default=["gowalla", "yelp2018"])
    ap.add_argument("--filters", nargs="+", default=list(DEFAULT_FILTERS), choices=list(FILTER_NAMES))
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--batch-size", type=int, default=1024)
    ap.add_argument("--power-L", type=int, nargs="*", default=[2],
                    help="also run GF-CF with S_k from Alg. 1 with these L (paper: 2); empty to skip")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(REPO / "results" / "privirec"))
    args = ap.parse_args(argv)

    d = args.data_dir or ""
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    for name in args.datasets:
        t = time.perf_counter()
        res = run_dataset(name, d, args.filters, args.batch_size, args.power_L, args.seed, log)
        res["total_s"] = time.perf_counter() - t
        res["machine"] = machine_info()
        write_report(out / f"centralized_{name}.json", res, markdown(res))
        log(f"   total {res['total_s']:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
