"""Theorem 2's per-round epsilon (paper 002, section 6) at the paper's own parameters.

The paper states "epsilon = 30.6" per round for r = 10, delta = 1e-5, m_hat = 0.05,
z_hat = 0.2 and sigma = 0.1 (digest 002, sections 2.5 and 3.3). This evaluates the project's
accountant (:func:`fedrec.recsys.power_svd.theorem2_epsilon`, the formula of Theorem 2) at
those parameters, with sigma read as a standard deviation and as a variance, and writes
``results/fedsvd/theorem2_paper.json``:

    python benchmarks/_repro_fedsvd_eps.py
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from fedrec.recsys.power_svd import SvdParams, theorem2_epsilon  # noqa: E402

#: digest 002 section 3.3 (r, delta, m_hat, z_hat, sigma as the paper sets them)
PAPER = {"r": 10, "delta": 1e-5, "m_hat": 0.05, "z_hat": 0.2, "sigma": 0.1}


def main() -> None:
    params = dataclasses.replace(SvdParams(), r=PAPER["r"], delta=PAPER["delta"],
                                 m_hat=PAPER["m_hat"], z_hat=PAPER["z_hat"])
    out = {"dataset": "none (a formula at the paper's parameters)", "params": PAPER,
           "epsilon_per_round": theorem2_epsilon(params, PAPER["sigma"]),
           "epsilon_per_round_sigma_as_variance": theorem2_epsilon(
               params, math.sqrt(PAPER["sigma"])),
           "sigma_giving_30.6": theorem2_epsilon(params, 1.0) / 30.6,
           "command": "python benchmarks/_repro_fedsvd_eps.py"}
    path = REPO / "results" / "fedsvd" / "theorem2_paper.json"
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
