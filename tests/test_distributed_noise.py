"""Distributed discrete Gaussian noise inside SecAgg+ sums (fedrec/secure/distributed_noise.py,
clients/noise_node.py): the accounting bound against a direct computation, the unmasked
sum's variance against its target, and the node's own refusals."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from flwr.app import ConfigRecord, RecordDict
from scipy.special import logsumexp

from fedrec.dp_sampling import discrete_gaussian
from fedrec.secure.distributed_noise import (
    NOISE_KEY,
    RDP_ORDERS,
    NoisePlan,
    composed_epsilon,
    ddg_epsilon,
    ddg_rdp,
    ddg_tau,
    gaussian_epsilon,
    truncate_l2,
)
from fedrec.secure.secagg import SecAggError
from fedrec.transport.messenger import Messenger, NodeError
from fedrec.transport.secagg_server import SecureAggregator
from tests.noise_handlers import ACTION

N = 4
#: What the nodes offer (a charge is keyed by the rows a node holds).
DATA = {"dataset": "synthetic", "synthetic-users": 40, "synthetic-items": 20}


# -------------------------------------------------------------------------- accounting
def _log_sum_of_discrete_gaussians(sigma: float, n: int, k: int = 40) -> np.ndarray:
    """log pmf of the sum of n discrete Gaussians N_Z(0, sigma^2) on its support, exactly up
    to the truncation at |x| <= k per term (mass beyond: below exp(-k^2 / 2 sigma^2))."""
    x = np.arange(-k, k + 1)
    base = -x ** 2 / (2 * sigma ** 2)
    base -= logsumexp(base)
    out = base
    for _ in range(n - 1):
        new = np.full(len(out) + len(base) - 1, -np.inf)
        for i, v in enumerate(base):
            new[i:i + len(out)] = np.logaddexp(new[i:i + len(out)], v + out)
        out = new
    return out


def _renyi_shift_one(sigma: float, n: int, alpha: float) -> float:
    """max of D_alpha(Z || Z + 1) and D_alpha(Z + 1 || Z), computed from the pmfs."""
    lp = _log_sum_of_discrete_gaussians(sigma, n)
    lq = np.concatenate([[-np.inf], lp[:-1]])
    lp, lq = lp[1:], lq[1:]
    one = logsumexp(alpha * lp + (1 - alpha) * lq) / (alpha - 1)
    two = logsumexp(alpha * lq + (1 - alpha) * lp) / (alpha - 1)
    return max(one, two)


@pytest.mark.parametrize("sigma", [0.3, 0.4, 0.5, 0.7, 1.0])
@pytest.mark.parametrize("shares", [2, 3, 5])
def test_kls_bound_holds_for_sums_of_discrete_gaussians(sigma: float, shares: int) -> None:
    for alpha in (2, 4, 8):
        true = _renyi_shift_one(sigma, shares, alpha)
        assert true <= ddg_rdp(alpha, 1.0, 1.0, sigma, shares, 1) + 1e-12


def test_the_continuous_formula_alone_is_no_bound_for_small_sigma() -> None:
    """The control: without KLS's tau term the Gaussian's alpha Delta^2 / (2 n sigma^2)
    understates the sum's divergence at small sigma, so the test above can fail."""
    sigma, shares, alpha = 0.3, 3, 4
    true = _renyi_shift_one(sigma, shares, alpha)
    gaussian = alpha / (2 * shares * sigma ** 2)
    assert true > 1.2 * gaussian
    assert ddg_tau(sigma, shares) > 0


def test_tau_is_zero_at_the_grid_the_sums_use() -> None:
    assert ddg_tau(2.0 ** 40, 10_000) == 0.0
    assert ddg_tau(0.5, 1) == 0.0  # one share is a discrete Gaussian: no extra term
    big = NoisePlan(2.0 ** 40, 943, 2.0 ** 40 * 3, 27_000, 0.1)
    assert big.rdp(8) == pytest.approx(8 * big.l2 ** 2 / (2 * 943 * big.sigma ** 2), rel=1e-12)


@pytest.mark.filterwarnings("ignore:Optimal order is the smallest alpha:UserWarning")
def test_the_charged_epsilon_is_opacus_rdp_accountant() -> None:
    from opacus.accountants import RDPAccountant

    for z, q, steps in [(0.8, 0.1, 100), (2.0, 0.05, 300), (5.0, 1.0, 10)]:
        plan = NoisePlan(z * 2.0 ** 40 / math.sqrt(50), 50, 2.0 ** 40, 100, q)
        acc = RDPAccountant()
        acc.history = [(z, q, steps)]
        want = acc.get_epsilon(delta=1e-5, alphas=list(RDP_ORDERS))
        assert gaussian_epsilon([(plan, steps)], 1e-5) == pytest.approx(want, rel=1e-12)
        assert composed_epsilon([(plan, steps)], 1e-5) == pytest.approx(want, rel=1e-12)
        # the general bound for the discrete sum is never below the Gaussian's
        assert ddg_epsilon([(plan, steps)], 1e-5) >= want * (1 - 1e-12)
    # a history of single steps composes as the steps together
    plan = NoisePlan(2.0 ** 40, 10, 2.0 ** 41, 10, 0.2)
    assert composed_epsilon([(plan, 1)] * 7, 1e-6) == pytest.approx(
        composed_epsilon([(plan, 7)], 1e-6), rel=1e-12)


def test_the_charged_epsilon_counts_tau_where_it_is_not_zero() -> None:
    small = NoisePlan(0.4, 3, 1.0, 5, 1.0)
    assert composed_epsilon([(small, 1)], 1e-5) > gaussian_epsilon([(small, 1)], 1e-5)


def test_truncation_keeps_the_l2_bound_exactly() -> None:
    rng = np.random.default_rng(0)
    for bits in (0, 3, 20, 40):
        for _ in range(50):
            x = rng.normal(size=200) * rng.uniform(0.01, 10)
            k = truncate_l2(x, 1.0, bits)
            assert float(np.linalg.norm(k.astype(np.float64))) <= 2.0 ** bits


# -------------------------------------------------------------------------- the sum itself
def _noise(sigma: float, l2: float = 1.0, rate: float = 1.0, releases: int = 2,
           delta: float = 1e-5) -> ConfigRecord:
    return ConfigRecord({"mechanism": "ddg", "sigma": sigma, "l2": l2, "rate": rate,
                         "releases": releases, "delta": delta})


def _request(n: int, noise: ConfigRecord | None, **config: Any) -> RecordDict:
    req = RecordDict({"protocol": ConfigRecord({"n": n, **config})})
    if noise is not None:
        req[NOISE_KEY] = noise
    return req


def _on_nodes(fn: Any, policy: dict[str, Any]) -> Any:
    from fl_app.client_app import build_client_app
    from tests.localgrid import LocalGrid

    _on_nodes.runs = getattr(_on_nodes, "runs", 100) + 1
    app = build_client_app(["tests.noise_handlers"], policy=policy, data=DATA)
    with LocalGrid(app, N, run_id=_on_nodes.runs) as grid:
        messenger = Messenger(grid, timeout=60)
        nodes = messenger.node_ids(min_nodes=N)
        agg = SecureAggregator(messenger, nodes, seed=3)
        agg.setup()
        return fn(agg, nodes)


BUDGET = {"dp-budget": 1e6}
D = 4000


def _variance_matches(samples: np.ndarray, sigma: float, rel: float = 0.1) -> bool:
    """Sample variance within ``rel`` of sigma^2 (the estimator's relative standard error is
    sqrt(2 / d) = 2.2% at d = 4000, so 10% is 4.5 of them)."""
    return abs(float(np.var(samples)) / sigma ** 2 - 1) < rel


def test_the_unmasked_sum_carries_the_target_variance_once() -> None:
    sigma, value, max_abs = 0.5, 0.01, 64.0

    def run(agg: SecureAggregator, nodes: list[int]) -> np.ndarray:
        return agg.sum(ACTION, _request(D, _noise(sigma), value=value), max_abs=max_abs)["x"]

    total = _on_nodes(run, BUDGET)
    noise = total - N * value  # every node's clipped value (its norm is below l2)
    assert abs(float(noise.mean())) < 4 * sigma / math.sqrt(D)
    assert _variance_matches(noise, sigma)
    # the control: every node adding the whole noise gives N sigma^2, which the check refuses
    rng_free = sum(discrete_gaussian(D, sigma * 2 ** 20) for _ in range(N)) * 2.0 ** -20
    assert not _variance_matches(rng_free, sigma)
    assert _variance_matches(rng_free, sigma * math.sqrt(N))


def test_a_sum_without_noise_stays_exact() -> None:
    def run(agg: SecureAggregator, nodes: list[int]) -> np.ndarray:
        return agg.sum(ACTION, _request(50, None, value=0.25), max_abs=1.0)["x"]

    assert np.array_equal(_on_nodes(run, BUDGET), np.full(50, N * 0.25))


def test_a_node_refuses_a_share_below_its_policy_minimum() -> None:
    def run(agg: SecureAggregator, nodes: list[int]) -> None:
        agg.sum(ACTION, _request(10, _noise(1.0)), max_abs=64.0)

    with pytest.raises(NodeError) as err:
        _on_nodes(run, {**BUDGET, "dp-min-noise": 2.0})
    text = str(err.value)
    assert "dp-min-noise=2" in text and "noise multiplier 1" in text and "partition" in text
    _on_nodes(lambda agg, nodes: agg.sum(ACTION, _request(10, _noise(2.0)), max_abs=256.0),
              {**BUDGET, "dp-min-noise": 2.0})  # the same request at the minimum passes


def test_a_node_at_dp_budget_zero_refuses() -> None:
    def run(agg: SecureAggregator, nodes: list[int]) -> None:
        agg.sum(ACTION, _request(10, _noise(1.0)), max_abs=64.0)

    with pytest.raises(NodeError) as err:
        _on_nodes(run, {})
    text = str(err.value)
    assert "refuses the run's noisy sums" in text and "dp-budget=0" in text
    assert "Traceback" not in text


def test_rate_below_one_needs_the_nodes_own_draw() -> None:
    def run(agg: SecureAggregator, nodes: list[int]) -> None:
        agg.sum(ACTION, _request(10, _noise(1.0, rate=0.5), **{"skip-draw": True}),
                max_abs=64.0)

    with pytest.raises(NodeError, match="never drew its participation"):
        _on_nodes(run, BUDGET)


def test_another_sigma_for_one_node_breaks_the_sum() -> None:
    """The noise record is part of the digest the masks are bound to: a server that gives
    one node a smaller sigma (to learn its input less noised) gets no sum."""
    def run(agg: SecureAggregator, nodes: list[int]) -> None:
        per_node = {u: _request(10, _noise(4.0 if u != nodes[0] else 2.0)) for u in nodes}
        agg.sum(ACTION, per_node, max_abs=512.0)

    with pytest.raises((SecAggError, NodeError), match="another request"):
        _on_nodes(run, BUDGET)


def test_noise_in_a_plain_sum_is_refused() -> None:
    from fedrec.transport.aggregators import PlainAggregator
    from fl_app.client_app import build_client_app
    from tests.localgrid import LocalGrid

    app = build_client_app(["tests.noise_handlers"], policy={**BUDGET, "allow-plain": True},
                           data=DATA)
    with LocalGrid(app, N, run_id=999) as grid:
        messenger = Messenger(grid, timeout=60)
        plain = PlainAggregator(messenger, messenger.node_ids(min_nodes=N))
        with pytest.raises(NodeError, match="needs a SecAgg\\+ sum"):
            plain.sum(ACTION, _request(10, _noise(1.0)), max_abs=64.0)


def test_a_noisy_sum_clips_to_its_l2_bound_and_counts_no_clipped_node() -> None:
    """Values past the declared range are clipped, then the whole reply to L2 1: the sum is
    N / sqrt(d) per coordinate plus noise, and no clip count (a count without noise) reaches
    the server to fail the sum."""
    d, sigma = 100, 0.05

    def run(agg: SecureAggregator, nodes: list[int]) -> np.ndarray:
        return agg.sum(ACTION, _request(d, _noise(sigma), value=100.0), max_abs=64.0)["x"]

    total = _on_nodes(run, {**BUDGET, "dp-min-noise": 0.0})
    assert abs(float(total.mean()) - N / math.sqrt(d)) < 5 * sigma / math.sqrt(d)
