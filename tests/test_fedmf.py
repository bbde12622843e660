"""FedMF in a Flower simulation equals centralized gradient descent (same seed, schedule)."""

from __future__ import annotations

import numpy as np
import pytest

from datasets import DatasetSpec, load_dataset
from fl_app.recsys.metrics import ranking_sums
from fl_app.recsys.mf import BPRMF
from fl_app.simulation import run_in_simulation

ROUNDS = 6
CFG = {"protocol": "fedmf", "dataset": "synthetic", "synthetic-users": 120,
       "synthetic-items": 150, "rounds": ROUNDS, "seed": 3, "mf-dim": 8, "mf-lr": 0.5,
       "partition": "shards-random", "run-name": "test-fedmf"}


@pytest.fixture(scope="module")
def federated() -> dict:
    return run_in_simulation(CFG, num_nodes=5, quiet=True)


def test_fedmf_matches_centralized_gradient_descent(federated: dict) -> None:
    # Tolerance: both sides compute the same float64 gradients; only the order of the sum
    # over users differs (per node, then FedAvg's weighted mean), so the difference is
    # rounding, ~1e-15 relative per round. 1e-9 leaves room for 6 rounds of that and would
    # still catch any real mismatch (a wrong weight or negative changes values at 1e-3).
    data = load_dataset(DatasetSpec.from_config(CFG))
    ref = BPRMF(dim=8, lr=0.5, reg=CFG.get("mf-reg", 1e-4), negatives=1, seed=3)
    ref.fit(data.train, ROUNDS)
    np.testing.assert_allclose(federated["extra"]["item_factors"], ref.item_factors,
                               rtol=0, atol=1e-9)
    sums = ranking_sums(ref.score(np.arange(data.n_users)), data.train, data.test, k=20)
    central = sums.means()
    for key in ("recall@20", "ndcg@20"):
        assert federated["metrics"][key] == pytest.approx(central[key], abs=1e-9)
    assert federated["metrics"]["train-loss"] == pytest.approx(ref.losses[-1], abs=1e-9)


def test_fedmf_learns_and_reports_costs(federated: dict) -> None:
    losses = [row["train-loss"] for row in federated["history"]]
    assert losses[-1] < losses[0]
    comm = federated["communication"]
    # handshake + (train + evaluate) per round
    assert comm["total_rounds"] == 1 + 2 * ROUNDS
    # every train request carries the 150 x 8 float64 item factors (9,600 bytes) to 5 nodes
    assert comm["phases"]["train"]["bytes_down"] >= ROUNDS * 5 * 150 * 8 * 8
    assert federated["num_nodes"] == 5
