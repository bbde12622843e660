"""Where PriviRec's Turbo-CF gap comes from (paper 000, Table 3): Turbo-CF centrally, over a
grid of its two settings around the published ones.

Table 3 gives Turbo-CF 0.1531 NDCG@20 on Gowalla (0.0574 on Yelp2018), numbers taken from the
Turbo-CF paper; with the Turbo-CF README's "optimal parameters" (Gowalla alpha 0.6, power 0.7,
filter 1; Yelp alpha 0.6, power 1, filter 2) our centralized Turbo-CF gives 0.1513 on Gowalla
(``results/privirec/centralized_gowalla.json``), while GF-CF and BSPM-EM match the paper to
1e-4 on the same split. If some (alpha, power) near the published ones reached 0.1531, the
gap would be the settings; if none does, it is not. Every row scores R P~_alpha^{o power}
(the polynomial of the dataset's filter) on all users with the LightGCN all-ranking protocol;
the published setting is also scored in float32, as the authors' code computes it.

    python benchmarks/turbo_cf_settings.py                       # gowalla
    python benchmarks/turbo_cf_settings.py --dataset yelp2018 --resume

Writes ``results/privirec/turbo_cf_<dataset>.{json,md}``, each row as it finishes.
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
sys.path.insert(0, str(REPO))  # first: Opacus installs a top-level package named benchmarks

from benchmarks._report import (  # noqa: E402
    log,
    machine_info,
    rewrite_markdown,
    stored_result,
    write_report,
)
from datasets import DatasetSpec, load_dataset  # noqa: E402
from fedrec.recsys.graph_filters import SparseItemItem, TurboCF, default_hyperparams  # noqa: E402
from fedrec.recsys.linalg import normalize_interactions  # noqa: E402
from fedrec.recsys.metrics import evaluate_ranking, popularity_sums  # noqa: E402

#: Table 3's Turbo-CF NDCG@20 (Centr. = Priv.).
PAPER = {"gowalla": 0.1531, "yelp2018": 0.0574}
#: A setting "reaches" the paper's number within this (the digest's +-0.001 criterion, halved:
#: the gap to explain is 0.0018).
REACH = 0.0005


def score(train: sp.csr_matrix, test: sp.csr_matrix, alpha: float, power: float, flt: int,
          dtype: Any, batch_size: int) -> dict[str, float]:
    """Turbo-CF with these settings, scored on all users."""
    R_tilde, _, item_deg = normalize_interactions(train, alpha)
    P = (R_tilde.T @ R_tilde).tocsr().astype(dtype)
    P.data = np.power(P.data, dtype(power))
    turbo = TurboCF(alpha=alpha, power=1.0, filter=flt)  # P already carries the power
    turbo.fit(item_deg, SparseItemItem(P, dtype=dtype))
    t = time.perf_counter()
    m = evaluate_ranking(lambda rows: turbo.score(train[rows].astype(dtype)), train, test, k=20,
                         batch_size=batch_size).means()
    return {"ndcg20": m["ndcg@20"], "recall20": m["recall@20"],
            "seconds": time.perf_counter() - t}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dataset", default="gowalla", choices=list(PAPER))
    ap.add_argument("--alphas", nargs="+", type=float, default=[0.5, 0.55, 0.6, 0.65, 0.7])
    ap.add_argument("--powers", nargs="+", type=float, default=[0.6, 0.7, 0.8, 0.9, 1.0])
    ap.add_argument("--batch-size", type=int, default=1024)
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--markdown-only", action="store_true")
    ap.add_argument("--out", default=str(REPO / "results" / "privirec"))
    args = ap.parse_args(argv)
    path = Path(args.out) / f"turbo_cf_{args.dataset}.json"
    if args.markdown_only:
        rewrite_markdown(path, markdown)
        return 0
    stored = stored_result(path)
    published = default_hyperparams("turbo-cf", args.dataset)
    res = {"dataset": args.dataset, "paper_ndcg20": PAPER[args.dataset], "reach": REACH,
           "published": published, "rows": [], "machine": machine_info(),
           "command": "python benchmarks/turbo_cf_settings.py " + " ".join(
               argv if argv is not None else sys.argv[1:])}
    if args.resume and stored is not None:
        res["rows"], res["popularity_ndcg20"] = stored["rows"], stored.get("popularity_ndcg20")
    data = load_dataset(DatasetSpec(name=args.dataset))
    train = sp.csr_matrix(data.train, dtype=np.float64, copy=True)
    train.data[:] = 1.0
    if res.get("popularity_ndcg20") is None:
        res["popularity_ndcg20"] = popularity_sums(train, data.test, k=20).means()["ndcg@20"]
    done = {(r["alpha"], r["power"], r["dtype"]) for r in res["rows"]}
    grid = [(a, p, "float64") for a in args.alphas for p in args.powers]
    grid.insert(0, (published["alpha"], published["power"], "float32"))
    for alpha, power, dtype in grid:
        if (alpha, power, dtype) in done:
            continue
        log(f"{args.dataset}: alpha {alpha:g}, power {power:g}, filter {published['filter']}, "
            f"{dtype}")
        row = {"alpha": alpha, "power": power, "filter": published["filter"], "dtype": dtype,
               **score(train, data.test, alpha, power, published["filter"],
                       getattr(np, dtype), args.batch_size)}
        log(f"   NDCG@20 {row['ndcg20']:.4f}")
        res["rows"].append(row)
        done.add((alpha, power, dtype))
        write_report(path, res, markdown(res))
    print(markdown(res))
    return 0


def markdown(res: dict[str, Any]) -> str:
    pub, paper = res["published"], res["paper_ndcg20"]
    rows = [r for r in res["rows"] if r["dtype"] == "float64"]
    alphas = sorted({r["alpha"] for r in rows})
    powers = sorted({r["power"] for r in rows})
    cell = {(r["alpha"], r["power"]): r["ndcg20"] for r in rows}
    lines = [f"# Turbo-CF on {res['dataset']}: NDCG@20 over (alpha, power), filter "
             f"{pub['filter']}", "",
             f"Paper 000 Table 3 (from the Turbo-CF paper): {paper:.4f}. Published setting "
             f"(Turbo-CF README): alpha {pub['alpha']:g}, power {pub['power']:g}. Item "
             f"popularity: {res['popularity_ndcg20']:.4f}. Centralized, all users, float64 "
             "unless stated.", "",
             "| alpha \\ power | " + " | ".join(f"{p:g}" for p in powers) + " |",
             "|---|" + "---|" * len(powers)]
    for a in alphas:
        lines.append(f"| {a:g} | " + " | ".join(
            f"{cell[(a, p)]:.4f}" if (a, p) in cell else "" for p in powers) + " |")
    lines.append("")
    at_pub = cell.get((pub["alpha"], pub["power"]))
    f32 = next((r["ndcg20"] for r in res["rows"] if r["dtype"] == "float32"), None)
    if at_pub is not None:
        lines.append(f"- Published setting: {at_pub:.4f} in float64"
                     + (f", {f32:.4f} in float32 (the authors' precision)" if f32 else "")
                     + f"; the paper's {paper:.4f} is {paper - at_pub:+.4f} from it.")
    if rows:
        best = max(rows, key=lambda r: r["ndcg20"])
        reached = best["ndcg20"] >= paper - res["reach"]
        lines.append(
            f"- Best over the {len(rows)} settings: {best['ndcg20']:.4f} at alpha "
            f"{best['alpha']:g}, power {best['power']:g}: "
            + ("the paper's number is reached within "
               f"{res['reach']:g}, so the settings explain the gap: on this split the "
               "README's setting is not the best one, and a nearby one gives the paper's "
               "number" if reached else
               f"still {paper - best['ndcg20']:.4f} below the paper's, so no setting on this "
               "grid explains the gap: the settings are not its cause (the data split or the "
               "evaluation behind the paper's number differ from ours)") + ".")
    lines += ["", f"Command: `{res['command'].strip()}`. Machine: {res['machine']}."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    np.seterr(all="ignore")
    sys.exit(main())
