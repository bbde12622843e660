"""The leaderboard's user-level DP section: the curves of the DP protocols that guarantee
user-level (epsilon, delta) at one user per node (``benchmarks/dp_fedmf.py``,
``benchmarks/dp_svd.py``), read from their result files at epsilon <= 10, each beside item
popularity and DP popularity on the same split.

A point "beats" a baseline only when every seed is above it (the curves' own rule,
``benchmarks/dp_fedmf.py`` ``verdicts``); "below" only when every seed is below; else a tie
within the seeds' spread.
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
LABELS = {"ml-1m": "ML-1M (users 1-2999)", "gowalla": "Gowalla", "yelp2018": "Yelp2018"}
MAX_EPSILON = 10.0


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
    return out


def lines(root: Path = Path(".")) -> list[str]:
    """The section's Markdown (nothing when no curve file exists)."""
    pts = points(root)
    if not pts:
        return []
    out = ["## User-level DP at epsilon <= 10", "",
           "One user per node; each point is the protocol's curve (settings chosen on a "
           "validation split, 3 seeds on test), read from the file named. \"above\" / "
           "\"below\": every seed above / below the baseline; \"tie\": within the seeds' "
           "spread. DP popularity: item counts released at the same (epsilon, delta).", "",
           "| dataset | protocol | epsilon | NDCG@20 (mean) | seeds (min - max) | popularity | "
           "vs popularity | DP popularity (mean) | vs DP popularity | file |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for p in sorted(pts, key=lambda p: (list(LABELS).index(p["dataset"]), -p["epsilon"],
                                        p["protocol"])):
        dp = f"{np.mean(p['dp-popularity']):.4f}" if p["dp-popularity"] else "-"
        out.append(f"| {LABELS[p['dataset']]} | {p['protocol']} | {p['epsilon']:g} | "
                   f"{np.mean(p['ndcg']):.4f} | {min(p['ndcg']):.4f} - {max(p['ndcg']):.4f} | "
                   f"{p['popularity']:.4f} | {p['vs-popularity']} | {dp} | "
                   f"{p['vs-dp-popularity']} | `{p['file']}` |")
    out += [""]
    for dataset in LABELS:
        here = [p for p in pts if p["dataset"] == dataset]
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
            out.append(f"- {LABELS[dataset]}: no DP protocol above item popularity with "
                       "every seed at epsilon 10.")
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
