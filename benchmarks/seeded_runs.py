"""Every protocol whose seed fixes its draws, run small, for checking that a refactor changes
no result: run it at two commits and compare the two files.

    python benchmarks/seeded_runs.py OUT.json        # at each commit (a git worktree each)
    python benchmarks/seeded_runs.py --compare A.json B.json

Each protocol runs 4 simulated nodes on the embedded synthetic data (120 users x 60 items);
PriviRec with seeded Omega (its default private Omega is drawn from the OS, so two runs
differ by design). A protocol whose run is not reproducible by its seed
(``unseeded_randomness``) is run and recorded but not compared. Bytes per node are
recorded and reported, not compared: they vary by tens of bytes between two runs of the same
code (simulated node ids are random and lists of them are varint-encoded).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

BASE = {"synthetic-users": 120, "synthetic-items": 60}
EXTRA = {"privirec": {"privirec-omega": "seeded"},
         "privirec-k": {"privirec-omega": "seeded", "privirec-k": 32},
         "lpgcn": {"lpgcn-epochs": 1}, "fedmvmf": {"implicit": False, "item-servers": 1},
         "privmvmf": {"implicit": False, "item-servers": 1}}
POLICY = {"allow-seeded-omega": True, "dp-budget": 1e9, "allow-plain": True,
          "allow-noise-removal": True, "allow-ckks": True}


def run(out: Path, only: list[str] | None = None) -> None:
    from fl_app.registry import load_strategy_class, protocols, resolve_config
    from fl_app.simulation import run_in_simulation

    result = {}
    for name in sorted(only or protocols()):
        cfg = {"protocol": name, **BASE, **EXTRA.get(name, {}), "run-name": f"seeded-{name}"}
        try:
            why = load_strategy_class(name)(resolve_config(cfg)).unseeded_randomness
            rec = run_in_simulation(cfg, num_nodes=4, quiet=True, node_policy=POLICY,
                                    overwrite=True)
            result[name] = {"unseeded": why, "metrics": rec["metrics"],
                            "bytes": rec["communication"]["bytes_per_node"]}
        except Exception as exc:  # a protocol this setting cannot run: recorded, not compared
            result[name] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
        print(name, "error" if "error" in result[name] else "ok", flush=True)
    out.write_text(json.dumps(result, indent=1, default=str) + "\n")


def compare(a: Path, b: Path) -> int:
    """0 when every seeded protocol both files ran has equal metrics."""
    x, y = json.loads(a.read_text()), json.loads(b.read_text())
    bad = 0
    for name in sorted(set(x) & set(y)):
        p, q = x[name], y[name]
        if "error" in p or "error" in q or p["unseeded"] or q["unseeded"]:
            print(f"{name}: not compared ({p.get('error') or q.get('error') or 'unseeded'})"[:120])
            continue
        same = p["metrics"] == q["metrics"]
        bad += not same
        print(f"{name}: metrics {'equal' if same else 'DIFFER'}; bytes down per node "
              f"{p['bytes']['mean_down']:,.1f} vs {q['bytes']['mean_down']:,.1f}")
    return 1 if bad else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", nargs="?", type=Path)
    ap.add_argument("--compare", nargs=2, type=Path)
    ap.add_argument("--protocols", nargs="+", help="only these (default: every registered)")
    args = ap.parse_args(argv)
    if args.compare:
        return compare(*args.compare)
    if args.out is None:
        ap.error("give OUT.json or --compare A.json B.json")
    run(args.out, args.protocols)
    return 0


if __name__ == "__main__":
    sys.exit(main())
