"""The DP privacy-utility curves (``benchmarks/dp_curves.py``): the verdict rule, the
epsilon-to-noise mapping, the DP popularity baseline's bound, and that a point computed in
one process equals the Flower run's metrics with the same noise."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.sparse as sp

from benchmarks import dp_curves
from fedrec import dp
from fedrec.recsys import power_svd as svd
from fedrec.recsys.dp_popularity import clipped_counts, dp_item_counts, release_ledger
from fl_app.client_app import build_client_app
from fl_app.registry import resolve_config
from fl_app.server_app import run_protocol
from tests.localgrid import LocalGrid

NODES = 3
SYNTH = {"dataset": "synthetic", "synthetic-users": 120, "synthetic-items": 60, "seed": 1,
         "partition": "shards-contiguous", "aggregator": "plain", "run-name": "test-dp-curves"}


# -- the verdict rule ----------------------------------------------------------------------
def test_a_curve_tying_popularity_within_the_seeds_spread_is_not_useful():
    # gains over popularity of +0.004, -0.001, +0.006: mean 0.003 > 0, spread 0.0036
    assert not dp_curves.useful([0.004, -0.001, 0.006])
    assert dp_curves.useful([0.010, 0.012, 0.011])
    assert not dp_curves.useful([0.5])  # one seed: no spread, no verdict
    curve = {0.1: [-0.2, -0.19], 10.0: [0.002, -0.001], 100.0: [0.02, 0.03],
             1e3: [0.05, 0.06]}
    assert dp_curves.first_useful(curve) == 100.0
    assert dp_curves.first_useful({e: g for e, g in curve.items() if e < 100}) is None


def test_the_report_says_never_when_no_epsilon_clears_popularity():
    units = {"reference/0": {"popularity": 0.2}, "reference/1": {"popularity": 0.21}}
    for eps, (a, b) in {0.1: (0.01, 0.02), 1e6: (0.198, 0.215)}.items():  # ties at 1e6
        for seed, v in ((0, a), (1, b)):
            units[dp_curves.unit_key("dp-prototypes", eps, seed)] = {"ndcg@20": v}
    curve = dp_curves.curves({"units": units})["dp-prototypes"]
    gains = {eps: row["gain"] for eps, row in curve.items()}
    assert dp_curves.verdict(gains, [0.1, 1e6]) == "never in 0.1-1e+06"
    units[dp_curves.unit_key("dp-prototypes", 1e6, 1)] = {"ndcg@20": 0.3}
    units[dp_curves.unit_key("dp-prototypes", 1e6, 0)] = {"ndcg@20": 0.29}
    curve = dp_curves.curves({"units": units})["dp-prototypes"]
    gains = {eps: row["gain"] for eps, row in curve.items()}
    assert dp_curves.verdict(gains, [0.1, 1e6]) == "from epsilon 1e+06"
    # against the DP baseline: paired per epsilon and seed
    for seed, v in ((0, 0.28), (1, 0.31)):
        units[dp_curves.unit_key("dp-popularity", 1e6, seed)] = {"ndcg@20": v}
    assert dp_curves.gains_over({"units": units}, "dp-prototypes", "dp-popularity") == {
        1e6: [pytest.approx(0.01), pytest.approx(-0.01)]}


# -- epsilon through the protocol's own keys -------------------------------------------------
@pytest.mark.parametrize("epsilon", [0.1, 5637.987957527585, 1e6])
def test_fedsvd_sigma_gives_the_epsilon_a_node_charges(epsilon):
    cfg, nodes = dp_curves.run_config("fedsvd-privacy", 0)
    sigma = dp_curves.fedsvd_sigma(cfg, epsilon)
    params = svd.params_from_config({**cfg, "fedsvd-sigma": sigma})
    assert nodes == 4
    assert svd.release_epsilon(params, sigma, params.r, params.T) == pytest.approx(
        epsilon, rel=1e-9)
    if epsilon == 5637.987957527585:  # the leaderboard's default sigma 0.1
        assert sigma == pytest.approx(0.1, rel=1e-9)


def test_each_protocol_runs_in_its_leaderboard_setting():
    cfg, nodes = dp_curves.run_config("dp-prototypes", 2, 10.0)
    assert (nodes, cfg["dpp-k"], cfg["dpp-epsilon"], cfg["partition"], cfg["implicit"],
            cfg["seed"]) == (10, 50, 10.0, "silo-zip", False, 2)
    cfg, nodes = dp_curves.run_config("dp-popularity", 0, 1.0)
    assert (nodes, cfg["partition"], cfg["implicit"]) == (10, "silo-zip", True)


@pytest.mark.parametrize("dataset", ["gowalla", "yelp2018"])
def test_the_large_datasets_run_random_silos_and_a_delta_below_one_over_users(dataset):
    cfg, nodes = dp_curves.run_config("dp-prototypes", 1, 5.0, dataset)
    assert (nodes, cfg["partition"], cfg["implicit"], cfg["dpp-value-max"], cfg["dpp-k"],
            cfg["dpp-epsilon"], cfg["seed"]) == (10, "shards-random", True, 1.0, 50, 5.0, 1)
    cfg, nodes = dp_curves.run_config("fedsvd-ddp", 0, dataset=dataset)
    assert (nodes, cfg["fedsvd-ddp"], cfg["fedsvd-sync-every"]) == (4, True, 1)
    cfg, nodes = dp_curves.run_config("fedsvd-privacy", 0, dataset=dataset)
    assert (nodes, cfg["fedsvd-ddp"], cfg["fedsvd-sync-every"]) == (4, False, 4)
    # T delta below 1 / users: the users of both datasets (results/dp_svd/curve-*.md)
    assert cfg["fedsvd-iterations"] * cfg["fedsvd-delta"] < 1 / max(29858, 31668)
    assert dp_curves.SETTINGS[dataset].epsilons == (0.5, 1.0, 2.0, 5.0, 10.0, 20.0)


def test_fedsvd_ddp_calibrates_for_the_most_exposed_node_of_the_weighted_sum():
    """The sum is sum_i w_i (Y_i + N(0, sigma^2 / n)): node i's shift over the sum's noise,
    against Theorem 2's Delta / sigma, is the factor; its largest over nodes is what the
    grid's epsilon is calibrated to (equal weights: exactly Theorem 2)."""
    assert dp_curves.weight_factor([250, 250, 250, 250]) == pytest.approx(1.0, abs=1e-15)
    sizes = [100, 200, 300, 400]
    w = np.array(sizes) / sum(sizes)
    delta, sigma, n = 1.3, 2.0, len(sizes)
    sum_noise = math.sqrt(sum((wi * sigma / math.sqrt(n)) ** 2 for wi in w))
    worst = max(wi * delta / sum_noise for wi in w)
    assert dp_curves.weight_factor(sizes) == pytest.approx(worst / (delta / sigma),
                                                           rel=1e-12)
    assert dp_curves.weight_factor(sizes) > 1  # the larger node is the more exposed


# -- the DP popularity baseline ------------------------------------------------------------
def test_dp_popularity_bounds_each_users_contribution_by_the_clip():
    rng = np.random.default_rng(0)
    X = sp.csr_matrix((rng.random((30, 40)) < 0.4).astype(float))
    counts = clipped_counts(X, 5.0)
    for u in range(X.shape[0]):  # removing one user moves the counts by <= clip in L1
        rest = clipped_counts(X[np.arange(X.shape[0]) != u], 5.0)
        assert np.abs(counts - rest).sum() <= 5.0 + 1e-12
    light = X[np.asarray(X.sum(axis=1)).ravel() <= 5]  # users within the bound count fully
    np.testing.assert_allclose(clipped_counts(light, 5.0), np.asarray(light.sum(axis=0)).ravel())
    ledger = release_ledger(2.0, 5.0)
    assert ledger.pure_epsilon() == 2.0
    noisy = dp_item_counts(X, 1e9, 5.0)  # the project's sampler; near-noiseless at 1e9
    np.testing.assert_allclose(noisy, counts, atol=1e-6)


# -- a point in one process equals the Flower run ------------------------------------------
def known_noise(shape: tuple[int, ...], std: float) -> np.ndarray:
    """Known 'noise' (the same for every call), so both runs draw the same values."""
    return std * np.cos(np.arange(math.prod(shape), dtype=np.float64)).reshape(shape)


def flower_run(overrides: dict, policy: dict) -> dict:
    cfg = resolve_config(overrides)
    with LocalGrid(build_client_app(policy={"allow-plain": True, **policy}), NODES) as grid:
        return run_protocol(grid, cfg)


@pytest.mark.parametrize("variant", [{"fedsvd-sync-every": 2},
                                     {"fedsvd-sync-every": 1, "fedsvd-ddp": True}])
def test_a_fedsvd_privacy_point_equals_the_flower_runs_metrics(monkeypatch, variant):
    """The paper's form and its distributed variant (each node's noise sigma / sqrt(n))."""
    monkeypatch.setattr(svd, "draw_noise", known_noise)
    over = {**SYNTH, "protocol": "fedsvd-privacy", "fedsvd-k": 2, "fedsvd-rank": 3,
            "fedsvd-iterations": 7, "fedsvd-sigma": 0.05, **variant}
    record = flower_run(over, {"dp-budget": 1e5})
    point = dp_curves.fedsvd_point(resolve_config(over), NODES, known_noise)
    for key in ("ndcg@20", "recall@20"):
        assert record["metrics"][key] == pytest.approx(point[key], abs=1e-12), key


def test_a_dp_prototypes_point_equals_the_flower_runs_metrics(monkeypatch):
    # OpenDP's noise is never seeded, so both runs release with the noise taken out (the
    # mechanisms' noiseless choices); everything else is the protocol's own code path
    monkeypatch.setattr(dp, "laplace_mechanism", lambda x, s, e: np.asarray(x, float).copy())
    monkeypatch.setattr(dp, "exponential_mechanism",
                        lambda u, s, e: int(np.argmax(np.asarray(u))))
    monkeypatch.setattr(dp, "gumbel_top_s",
                        lambda u, s, sens, e: np.argsort(-np.asarray(u), kind="stable")[:s])
    over = {**SYNTH, "protocol": "dp-prototypes", "dpp-k": 4, "dpp-value-max": 1.0,
            "dpp-sparsity": 10, "dpp-rank": 4, "dpp-swaps": 4, "dpp-shifts": 2}
    record = flower_run(over, {"dp-budget": 1.0})
    point = dp_curves.dp_prototypes_point(resolve_config(over), NODES)
    for key in ("ndcg@20", "recall@20", "rmse"):
        assert record["metrics"][key] == pytest.approx(point[key], abs=1e-12), key
    assert point["ndcg@20"] > 0


def test_a_curve_at_the_random_level_is_never_called_above_random():
    """The 'beats random ranking' verdict is the same rule against the split's random
    ranking: points within the seeds' spread of it claim nothing; references without it
    (ML-1M's) leave the column out."""
    units = {f"reference/{s}": {"popularity": 0.03, "random": 0.0004} for s in range(3)}
    for s, v in enumerate((0.0003, 0.0006, 0.0004)):
        units[dp_curves.unit_key("dp-prototypes", 10.0, s)] = {"ndcg@20": v, "seconds": 1.0}
    result = {"config": {"dataset": "gowalla", "pop_clip": 50.0, "fedsvd_delta": 1e-7,
                         "machine": {"flwr_version": "1.42.0"}}, "units": units}
    gains = {e: r["gain"] for e, r in dp_curves.curves(result, "random")["dp-prototypes"].items()}
    assert dp_curves.verdict(gains, [10.0]) == "never in 10-10"
    assert "| dp-prototypes | never in 10-10 | never in 10-10 | 0.0004 (10) | never in 10-10 |" \
        in dp_curves.markdown(result)
    for s, v in enumerate((0.010, 0.012, 0.011)):  # above random with every seed
        units[dp_curves.unit_key("dp-prototypes", 10.0, s)]["ndcg@20"] = v
    assert "| 0.0110 (10) | from epsilon 10 |" in dp_curves.markdown(result)
    for s in range(3):
        del units[f"reference/{s}"]["random"]
    assert "beats random ranking" not in dp_curves.markdown(result)
