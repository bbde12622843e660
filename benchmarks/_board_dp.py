"""The leaderboard's DP section: every DP protocol's curve points at epsilon <= 10, read from
their result files, each beside item popularity and DP popularity on the same split, with
what a neighbouring dataset differs in. The user-level protocols at one user per node
(``benchmarks/dp_fedmf.py``, ``benchmarks/dp_svd.py``) and the papers' own DP protocols
(``benchmarks/dp_curves.py``: dp-prototypes, user level per silo; fedsvd-privacy and its
distributed variant, whose neighbours differ in one entry of a node's Gram matrix, not
in a user).

A point "beats" a baseline only when every seed is above it (the curves' own rule,
``benchmarks/dp_fedmf.py`` ``verdicts``; item popularity per seed's split where the seed
draws the split); "below" only when every seed is below; else a tie within the seeds'
spread. The crossings the section states are the user-level protocols'.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

#: (protocol, its curve files by dataset) in the order the section lists them.
CURVES: tuple[tuple[str, dict[str, str]], ...] = (
    ("dp-svd", {"ml-1m": "results/dp_svd/curve-ml-1m.json",
                "gowalla": "results/dp_svd/curve-gowalla.json",
                "yelp2018": "results/dp_svd/curve-yelp2018.json"}),
    ("dp-fedmf", {"ml-1m": "results/dp_fedmf/curve-ml-1m.json",
                  "gowalla": "results/dp_fedmf/curve-gowalla.json",
                  "yelp2018": "results/dp_fedmf/curve-yelp2018.json"}),
)
#: The papers' DP protocols (``benchmarks/dp_curves.py``'s files, one per dataset).
PAPER_CURVES = {"ml-1m": "results/dp_curves/ml-1m.json",
                "gowalla": "results/dp_curves/gowalla.json",
                "yelp2018": "results/dp_curves/yelp2018.json"}
#: What neighbouring datasets differ in, per protocol (the unit epsilon protects).
NEIGHBOURS = {"dp-svd": "a user", "dp-fedmf": "a user", "dp-prototypes": "a user (per silo)",
              "fedsvd-privacy": "a Gram entry", "fedsvd-ddp": "a Gram entry"}
USER_LEVEL = ("dp-svd", "dp-fedmf", "dp-prototypes")
LABELS = {"ml-1m": "ML-1M (users 1-2999)", "gowalla": "Gowalla", "yelp2018": "Yelp2018"}
MAX_EPSILON = 10.0


def paired(gains: list[float]) -> str:
    """:func:`verdict` of per-seed gains over a baseline on each seed's own split."""
    return "above" if min(gains) > 0 else "below" if max(gains) < 0 else "tie"


def verdict(seeds: list[float], baseline: list[float]) -> str:
    """"above" when every seed is above every baseline draw, "below" when every seed is
    below every draw, else "tie" (the spreads overlap)."""
    if min(seeds) > max(baseline):
        return "above"
    if max(seeds) < min(baseline):
        return "below"
    return "tie"


def points(root: Path = Path(".")) -> list[dict[str, Any]]:
    """Every curve point at epsilon <= :data:`MAX_EPSILON` whose result file exists."""
    out = []
    for protocol, files in CURVES:
        for dataset, rel in files.items():
            path = root / rel
            if not path.exists():
                continue
            result = json.loads(path.read_text())
            pop = float(result["popularity"])
            for r in result["curve"]:
                if r["epsilon"] > MAX_EPSILON:
                    continue
                seeds = [float(x) for x in r["ndcg@20"]]
                dp_pop = [float(x) for x in r.get("dp-popularity", [])]
                out.append({"protocol": protocol, "dataset": dataset, "file": rel,
                            "epsilon": float(r["epsilon"]), "delta": float(r["delta"]),
                            "ndcg": seeds, "popularity": pop, "dp-popularity": dp_pop,
                            "vs-popularity": verdict(seeds, [pop]),
                            "vs-dp-popularity": verdict(seeds, dp_pop) if dp_pop else "-"})
    for dataset, rel in PAPER_CURVES.items():
        if (root / rel).exists():
            out += paper_points(json.loads((root / rel).read_text()), dataset, rel)
    return out


def paper_points(result: dict[str, Any], dataset: str, rel: str) -> list[dict[str, Any]]:
    """:func:`points` of a ``benchmarks/dp_curves.py`` file: its units grouped by protocol
    and epsilon, item popularity per seed's split, its dp-popularity (Laplace counts at the
    same epsilon) as the DP baseline; delta is fedsvd's over its T = 92 iterations and 0
    for the pure-DP protocols."""
    units = result["units"]
    groups: dict[tuple[str, float], list[tuple[float, float]]] = {}
    for key, unit in units.items():
        if key.count("/") != 2:  # the references: reference/<seed>
            continue
        protocol, eps, seed = key.split("/")
        ref = units.get(f"reference/{seed}")
        if ref is None or protocol == "dp-popularity" or float(eps) > MAX_EPSILON:
            continue
        groups.setdefault((protocol, float(eps)), []).append((unit["ndcg@20"],
                                                              ref["popularity"]))
    out = []
    for (protocol, eps), pairs in sorted(groups.items()):
        seeds = [v for v, _ in pairs]
        dp_pop = [u["ndcg@20"] for k, u in units.items()
                  if k.startswith(f"dp-popularity/{eps:g}/")]
        delta = 92 * result["config"]["fedsvd_delta"] if protocol.startswith("fedsvd") else 0
        out.append({"protocol": protocol, "dataset": dataset, "file": rel, "epsilon": eps,
                    "delta": delta, "ndcg": seeds,
                    "popularity": float(np.mean([p for _, p in pairs])),
                    "dp-popularity": dp_pop,
                    "vs-popularity": paired([v - p for v, p in pairs]) if len(pairs) > 1
                    else "tie",
                    "vs-dp-popularity": verdict(seeds, dp_pop) if dp_pop else "-"})
    return out


def lines(root: Path = Path(".")) -> list[str]:
    """The section's Markdown (nothing when no curve file exists)."""
    pts = points(root)
    if not pts:
        return []
    out = ["## DP at epsilon <= 10", "",
           "Each point is a protocol's curve, read from the file named: dp-svd and dp-fedmf "
           "one user per node (settings chosen on a validation split, 3 seeds on test); "
           "the papers' dp-prototypes (silos of users) and fedsvd-privacy / fedsvd-ddp (4 "
           "nodes) in their own settings, 3 seeds (5 at some ML-1M points). \"neighbours "
           "differ in\": what epsilon protects (a Gram entry is one entry of a node's M_i^T M_i / s_i, the paper's "
           "relation, weaker than a user). \"above\" / \"below\": every seed above / "
           "below the baseline; \"tie\": within the seeds' spread. DP popularity: item "
           "counts released at the same epsilon (Gaussian at the same delta for the "
           "user-level curves, Laplace per silo for the papers').", "",
           "| dataset | protocol | neighbours differ in | epsilon | delta | NDCG@20 (mean) | "
           "seeds (min - max) | popularity | vs popularity | DP popularity (mean) | "
           "vs DP popularity | file |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    order = list(NEIGHBOURS)
    for p in sorted(pts, key=lambda p: (list(LABELS).index(p["dataset"]), -p["epsilon"],
                                        order.index(p["protocol"]))):
        dp = f"{np.mean(p['dp-popularity']):.4f}" if p["dp-popularity"] else "-"
        out.append(f"| {LABELS[p['dataset']]} | {p['protocol']} | "
                   f"{NEIGHBOURS[p['protocol']]} | {p['epsilon']:g} | {p['delta']:.2g} | "
                   f"{np.mean(p['ndcg']):.4f} | {min(p['ndcg']):.4f} - {max(p['ndcg']):.4f} | "
                   f"{p['popularity']:.4f} | {p['vs-popularity']} | {dp} | "
                   f"{p['vs-dp-popularity']} | `{p['file']}` |")
    out += [""]
    for dataset in LABELS:
        here = [p for p in pts if p["dataset"] == dataset and p["protocol"] in USER_LEVEL]
        if not here:
            continue
        found = sorted((e, proto) for proto in {p["protocol"] for p in here}
                       if (e := crossing([p for p in here if p["protocol"] == proto]))
                       is not None)
        if found:
            e, proto = found[0]
            out.append(f"- {LABELS[dataset]}: above item popularity with every seed at every "
                       f"epsilon >= {e:g} of its curve up to 10 ({proto}).")
        else:
            out.append(f"- {LABELS[dataset]}: no user-level DP protocol above item "
                       "popularity with every seed at epsilon 10.")
    return [*out, ""]


def crossing(curve: list[dict[str, Any]]) -> float | None:
    """The smallest epsilon of one protocol's points from which every point is "above"
    item popularity (None when the largest is not)."""
    out = None
    for p in sorted(curve, key=lambda p: -p["epsilon"]):
        if p["vs-popularity"] != "above":
            break
        out = p["epsilon"]
    return out
