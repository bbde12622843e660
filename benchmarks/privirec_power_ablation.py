"""How many power rounds (L) and how wide a basis (p) PriviRec needs: each filter scored with
S from Algorithm 1 (+ Rayleigh-Ritz, as the federated protocol computes it) against S from an
exact SVD, centrally and in one process.

Why centrally: the federated protocol computes exactly this S (``tests/test_privirec.py``
checks federated == this computation for the same Omega), but a federated run on Gowalla costs
~30 min of node-side scoring, while this costs one centralized scoring per setting.

    python benchmarks/privirec_power_ablation.py --dataset gowalla --filters gf-cf bspm-em \\
        --settings 2:448 3:448 2:896

``L`` counts secure-sum rounds including the R~^T Omega round (the protocol's ``privirec-L``);
``p`` is the iteration rank (``privirec-rank``). Writes
``results/privirec/power_ablation_<dataset>.{json,md}``.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks._report import log, machine_info, write_report  # noqa: E402
from datasets import DatasetSpec, load_dataset  # noqa: E402
from fedrec.recsys.graph_filters import FactoredItemItem, make_filter  # noqa: E402
from fedrec.recsys.linalg import (  # noqa: E402
    normalize_interactions,
    projector_distance,
    randomized_power_iteration,
    top_right_singular_vectors,
)
from fedrec.recsys.metrics import evaluate_ranking  # noqa: E402

#: Same clipping as the nodes' Omega rows (clients/privirec.py).
OMEGA_CLIP = 8.0


def power_basis(R_tilde, P: FactoredItemItem, L: int, p: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """S and Ritz values as the federated protocol computes them (Omega private per user)."""
    omega = np.clip(np.random.default_rng(seed).standard_normal((R_tilde.shape[0], p)),
                    -OMEGA_CLIP, OMEGA_CLIP)
    start = np.asarray(R_tilde.T @ omega)
    return randomized_power_iteration(P.matvec, R_tilde.shape[1], p, p, L=L - 1, start=start,
                                      ritz=True)


@dataclass
class Case:
    """One dataset prepared for the ablation: the normalized interactions, P~ in factored
    form, the filters (published per-dataset settings) and the exact top basis."""

    dataset: str
    train: Any
    test: Any
    R_tilde: Any
    item_deg: np.ndarray
    P: FactoredItemItem
    filters: dict[str, Any]
    S_exact: np.ndarray
    vals_exact: np.ndarray

    @property
    def max_rank(self) -> int:
        return max(f.rank for f in self.filters.values())

    @classmethod
    def load(cls, dataset: str, filters: list[str], seed: int = 0) -> Case:
        """ValueError for a filter that does not depend on L and p."""
        data = load_dataset(DatasetSpec(name=dataset))
        train = data.train.copy()
        train.data[:] = 1.0
        R_tilde, _, item_deg = normalize_interactions(train, 0.5)
        flts = {name: make_filter(name, dataset) for name in filters}
        if any(f.alpha != 0.5 or not f.needs_S for f in flts.values()):
            raise ValueError("only filters with an ideal low-pass part and alpha = 1/2 depend "
                             "on L and p")
        max_rank = max(f.rank for f in flts.values())
        log(f"{dataset}: exact top-{max_rank} singular vectors")
        S_exact, vals_exact = top_right_singular_vectors(R_tilde, max_rank, seed=seed)
        return cls(dataset, train, data.test, R_tilde, item_deg, FactoredItemItem(R_tilde),
                   flts, S_exact, vals_exact)

    def score(self, S: np.ndarray, vals: np.ndarray,
              batch_size: int = 1024) -> dict[str, dict[str, float]]:
        """Each filter fitted with the basis ``S`` (Ritz values ``vals``) and scored on the
        test split: NDCG@20, Recall@20 and the basis's projector distance to the exact one
        at the filter's rank."""
        out = {}
        train = self.train
        for name, flt in self.filters.items():
            t = time.perf_counter()
            flt.fit(self.item_deg, self.P, S, vals)
            m = evaluate_ranking(lambda rows, f=flt: f.score(train[rows]), train, self.test,
                                 k=20, batch_size=batch_size).means()
            out[name] = {"ndcg20": m["ndcg@20"], "recall20": m["recall@20"],
                         "projector_dist_rel": projector_distance(S[:, :flt.rank],
                                                                  self.S_exact[:, :flt.rank])
                         / np.sqrt(2 * flt.rank),
                         "seconds": time.perf_counter() - t}
            log(f"   {name}: NDCG@20 {m['ndcg@20']:.4f} ({out[name]['seconds']:.0f} s)")
        return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dataset", default="gowalla")
    ap.add_argument("--filters", nargs="+", default=["gf-cf", "bspm-em"])
    ap.add_argument("--settings", nargs="+", default=["2:448", "3:448"],
                    help="L:p pairs (L counts the R~^T Omega round)")
    ap.add_argument("--exact", action="store_true", help="also score with the exact SVD basis")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--batch-size", type=int, default=1024)
    ap.add_argument("--out", default=str(REPO / "results" / "privirec"))
    args = ap.parse_args(argv)

    try:
        case = Case.load(args.dataset, args.filters, args.seed)
    except ValueError as exc:
        ap.error(str(exc))
    R_tilde, P = case.R_tilde, case.P
    S_exact, vals_exact, max_rank = case.S_exact, case.vals_exact, case.max_rank

    def score(S: np.ndarray, vals: np.ndarray) -> dict[str, dict[str, float]]:
        return case.score(S, vals, args.batch_size)

    rows = []
    if args.exact:
        log(f"{args.dataset}: exact basis")
        rows.append({"setting": "exact", "L": None, "p": max_rank, "filters": score(S_exact, vals_exact)})
    for setting in args.settings:
        L, p = (int(x) for x in setting.split(":"))
        if p < max_rank:
            ap.error(f"setting {setting}: p must be at least the filters' rank {max_rank}")
        log(f"{args.dataset}: Algorithm 1 + Rayleigh-Ritz, L={L}, p={p}")
        t = time.perf_counter()
        S, vals = power_basis(R_tilde, P, L, p, args.seed)
        rows.append({"setting": setting, "L": L, "p": p, "power_seconds": time.perf_counter() - t,
                     "filters": score(S, vals)})
    res = {"dataset": args.dataset, "seed": args.seed, "rows": rows, "machine": machine_info()}
    write_report(Path(args.out) / f"power_ablation_{args.dataset}.json", res, markdown(res))
    print(markdown(res))
    return 0


def markdown(res: dict) -> str:
    names = list(res["rows"][0]["filters"])
    lines = [f"# PriviRec power-method ablation on {res['dataset']} (centralized, seed {res['seed']})",
             "", "S from Algorithm 1 with Rayleigh-Ritz (L secure-sum rounds incl. the R~^T Omega "
             "round, iteration rank p), as the federated protocol computes it; projector distance "
             "||S S^T - S* S*^T||_F / sqrt(2 r) to the exact top-r basis at each filter's rank r.",
             "", "| L:p | " + " | ".join(f"{n} NDCG@20 | {n} dist" for n in names) + " |",
             "|---|" + "---|---|" * len(names)]
    for r in res["rows"]:
        cells = " | ".join(f"{r['filters'][n]['ndcg20']:.4f} | {r['filters'][n]['projector_dist_rel']:.3f}"
                           for n in names)
        lines.append(f"| {r['setting']} | {cells} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    np.seterr(all="ignore")
    sys.exit(main())
