"""Eq. 30 (paper 001, RQ5) on the training data LP-GCN trains on: ``train.txt`` less the
random 10% the authors hold out for validation (digest 001 section 4, "(code) Validation is a
random 10% of train.txt").

``benchmarks/lpgcn_comm.py`` computes C over the whole ``train.txt``; this drops a uniformly
random 10% of the training interactions first (numpy, seed 2022 + the assignment seed: the
authors' exact draw, scikit-learn's ``random_state=2022``, is not reproduced) and runs the same
sweep (:func:`benchmarks.lpgcn_comm.sweep`: greedy cover, one random convolution client per
item, d = 64, B = 4 bytes, KB = 1024 B). Users stay clients even when the holdout leaves them
no interaction (Eq. 30 divides by |U|). Writes ``results/lpgcn/comm_holdout.json``:

    python benchmarks/_repro_eq30.py --seeds 3      # about a minute on 2 CPUs
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import scipy.sparse as sp

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks._report import machine_info  # noqa: E402
from benchmarks.lpgcn_comm import BYTES, PAPER, D, sweep  # noqa: E402
from datasets import DatasetSpec, load_dataset  # noqa: E402

HOLDOUT = 0.10


def held_in(train: sp.spmatrix, seed: int) -> sp.csr_matrix:
    """``train`` without a uniformly random ``HOLDOUT`` share of its interactions."""
    coo = sp.coo_matrix(train)
    rng = np.random.default_rng(2022 + seed)
    keep = rng.permutation(coo.nnz)[int(round(HOLDOUT * coo.nnz)):]
    return sp.csr_matrix((np.ones(len(keep), dtype=bool), (coo.row[keep], coo.col[keep])),
                         shape=coo.shape)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--datasets", nargs="+", default=list(PAPER), choices=list(PAPER))
    ap.add_argument("--seeds", type=int, default=3)
    args = ap.parse_args()
    out: dict = {"dimension": D, "bytes_per_float": BYTES, "validation_holdout": HOLDOUT,
                 "datasets": {}}
    for name in args.datasets:
        train = load_dataset(DatasetSpec(name=name)).train
        layers = PAPER[name]["L"]
        seeds = []
        for seed in range(args.seeds):
            kept = held_in(train, seed)
            seeds.append({**sweep(kept, layers, seed), "train_interactions": int(kept.nnz)})
        out["datasets"][name] = {"L": layers, "users": int(train.shape[0]),
                                 "items": int(train.shape[1]),
                                 "train_file_interactions": int(sp.csr_matrix(train).nnz),
                                 "paper": PAPER[name], "seeds": seeds}
    out["command"] = f"python benchmarks/_repro_eq30.py --seeds {args.seeds}"
    out["machine"] = machine_info()
    path = REPO / "results" / "lpgcn" / "comm_holdout.json"
    path.write_text(json.dumps(out, indent=1) + "\n")
    for name, v in out["datasets"].items():
        c = [s["rows"][0]["C_bytes"] / 1024 for s in v["seeds"]]
        print(f"{name}: C at the greedy cover {np.mean(c):.2f} KB (paper {v['paper']['C_kb']})")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
