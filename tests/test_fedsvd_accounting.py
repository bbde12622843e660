"""fedsvd-privacy's DP charge and the discrete noise it is charged for.

A node charges Theorem 2 for what it adds whatever aggregator carries it (a run under the
default SecAgg+ used to charge nothing: every node at dp-budget 0 completed with epsilon
155 reported); the noise is the discrete Gaussian on a grid (fedrec/dp_sampling.py), whose
accounting fedrec/dp.py states ("Discrete noise") and these tests check numerically.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

from fedrec import dp
from fedrec.dp_sampling import noise_grid
from fedrec.recsys import power_svd as svd
from fedrec.transport.messenger import NodeError
from fl_app.client_app import build_client_app
from fl_app.registry import resolve_config
from fl_app.server_app import run_protocol
from tests.localgrid import LocalGrid

NODES = 3
RUN = {"dataset": "synthetic", "synthetic-users": 60, "synthetic-items": 30, "seed": 1,
       "synthetic-rank": 2, "synthetic-density": 0.3, "synthetic-clusters": 2,
       "partition": "row-blocks", "run-name": "test-fedsvd-accounting",
       "protocol": "fedsvd-privacy", "fedsvd-k": 2, "fedsvd-rank": 3,
       "fedsvd-iterations": 4, "fedsvd-sync-every": 2, "fedsvd-sigma": 0.5}


def _run(over: dict, policy: dict):
    with LocalGrid(build_client_app(policy=policy), NODES) as grid:
        return run_protocol(grid, resolve_config({**RUN, **over}))


@pytest.mark.parametrize("aggregator", ["secagg+", "plain"])
def test_a_node_at_dp_budget_zero_refuses_fedsvd_privacy_whatever_the_aggregator(
        aggregator: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The server names the refusal before the run (its policy check, below); a server that
    skips that check meets the node's own refusal, which is the guarantee."""
    from strategies.fedsvd import FedSvd, FedSvdPrivacy

    monkeypatch.setattr(FedSvdPrivacy, "policy_needs", FedSvd.policy_needs)
    policy = {"allow-plain": True} if aggregator == "plain" else {}
    with pytest.raises(NodeError) as err:
        _run({"aggregator": aggregator}, policy)
    text = str(err.value)
    assert "refuses fedsvd-privacy iterations 1..2 released in a " + aggregator + " sum" in text
    assert "node policy dp-budget=0" in text and "partition" in text
    assert "Traceback" not in text


def test_under_secagg_every_node_charges_theorem_2_for_all_iterations(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.json"
    _run({"aggregator": "secagg+"}, {"dp-budget": 1e4, "dp-ledger": str(ledger)})
    params = svd.params_from_config(resolve_config(RUN))
    per_node = svd.release_epsilon(params, params.sigma, params.r, params.T)
    entries = json.loads(ledger.read_text())["entries"].values()
    charged = [sum(float(r["epsilon"]) for r in e["releases"]) for e in entries]
    assert len(charged) == NODES
    assert charged == pytest.approx([per_node] * NODES, rel=1e-12)


def test_a_synchronization_releases_grid_values_only() -> None:
    """With the real sampler, a node's update (weight 1) is a multiple of the noise grid:
    its value rounded to the grid plus integer noise times the grid."""
    rng = np.random.default_rng(0)
    rows = sp.csr_matrix((rng.random((20, 12)) < 0.3).astype(float))
    Z = svd.orth(rng.standard_normal((12, 3)))
    params = svd.SvdParams(k=2, r=3, sigma=0.37)
    for scheme in ("fedsvd-privacy", "fedpower", "fedsvd-utility"):
        out = svd.sync_step(scheme, rows, Z, Z, params, 0.37, 1.0, svd.draw_noise)
        steps = out.update / noise_grid(0.37)
        assert np.array_equal(steps, np.rint(steps)), scheme


def test_classical_calibration_holds_for_the_discrete_gaussian_up_to_epsilon_one() -> None:
    """Theorem 2's per-iteration epsilon is the classical formula sqrt(2 ln(1.25/delta))
    Delta / sigma, a continuous-Gaussian result; for epsilon <= 1 its sigma is at least
    the sigma whose zCDP (which the discrete Gaussian has, CKS 2020) implies the same
    (epsilon, delta), so the charge is a guarantee for the discrete noise as well."""
    for delta in (1e-12, 1e-9, 1e-6, 1e-5, 1e-3, 0.05):
        for eps in (0.01, 0.1, 0.3, 0.5, 0.8, 1.0):
            assert dp.gaussian_sigma(1.0, eps, delta) >= dp.zcdp_gaussian_sigma(1.0, eps, delta)


def test_rounding_to_the_grid_changes_the_default_sensitivity_negligibly() -> None:
    """The grid adds at most g sqrt(d r) to Theorem 1's sensitivity (fedrec/dp.py,
    "Discrete noise"): with the defaults on ML-100K's 1,682 items below 1e-12 relative,
    and at the largest setting the benchmarks run (Yelp2018's 38,048 items, sigma 0.1)
    below 1e-11."""
    for d, params in ((1682, svd.SvdParams()), (38048, svd.SvdParams(sigma=0.1))):
        excess = noise_grid(params.sigma) * math.sqrt(d * params.r) / svd.sensitivity(params)
        assert excess < (1e-12 if d == 1682 else 1e-11)


def test_the_server_names_the_budget_a_run_needs_before_it_starts() -> None:
    """An honest server checks the nodes' acknowledged policies first: a run its nodes would
    refuse fails before any protocol message, naming the key and the epsilon it needs."""
    from strategies.policy_needs import PolicyRefusal

    with pytest.raises(PolicyRefusal, match="dp-budget=0.0") as err:
        _run({"aggregator": "secagg+"}, {})
    params = svd.params_from_config(resolve_config(RUN))
    spent = svd.release_epsilon(params, params.sigma, params.r, params.T)
    assert f"{spent:.6g}" in str(err.value)
