"""DP-Prototypes (paper 003): the budget split sums to epsilon, public bounds hold, a very
large epsilon recovers k-means, the solver is exact, the run has exactly two protocol
rounds and equals the centralized computation given its prototypes, and silos refuse what
their policy or size does not allow."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from scipy.optimize import linear_sum_assignment, nnls

from datasets import DatasetSpec, PartitionSpec, load_node_data
from fedrec.recsys.kmeans import kmeans, kmeans_loss
from fedrec.recsys.nmf import fit_user_factors, nmf
from fedrec.recsys.poisson import poisson_silos
from fedrec.recsys.prototypes import (
    PrototypeParams,
    clip_rows,
    metric_means,
    private_prototypes,
    silo_metric_sums,
)
from fedrec.transport.messenger import Messenger, NodeError
from fl_app.client_app import build_client_app
from fl_app.registry import resolve_config
from strategies.dp_prototypes import DPPrototypes
from tests.localgrid import LocalGrid

NODES = 3
#: 120 implicit users over 3 silos (40 each), 60 items; 4 prototypes of at most 10 items.
TINY = {"protocol": "dp-prototypes", "dataset": "synthetic", "synthetic-users": 120,
        "synthetic-items": 60, "seed": 1, "partition": "shards-contiguous", "dpp-k": 4,
        "dpp-value-max": 1.0, "dpp-sparsity": 10, "dpp-rank": 4, "dpp-swaps": 4,
        "dpp-shifts": 2}
POLICY = {"allow-plain": True, "dp-budget": 1.0}


def _blobs(k: int = 3, n: int = 300, d: int = 40, seed: int = 0) -> sp.csr_matrix:
    """k well-separated non-negative clusters: centre j rates items 10j..10j+9 at 4,
    members add N(0, 0.3) on those items (spread << separation)."""
    rng = np.random.default_rng(seed)
    centres = np.zeros((k, d))
    for j in range(k):
        centres[j, 10 * j:10 * (j + 1)] = 4.0
    labels = rng.integers(k, size=n)
    X = centres[labels] + rng.normal(0, 0.3, (n, d)) * (centres[labels] > 0)
    return sp.csr_matrix(np.clip(X, 0, 5))


# -- 1. the math ---------------------------------------------------------------------------
@pytest.mark.parametrize("trials", [1, 3])
def test_the_budget_split_is_explicit_and_the_ledger_sums_to_epsilon(trials: int) -> None:
    params = PrototypeParams(k=3, epsilon=0.7, value_max=5.0, sparsity=8, trials=trials,
                             shifts=2, swaps=3)
    budget = params.budget()
    total = trials * sum(budget["per_trial"].values()) + budget["final_choice"]
    assert total == pytest.approx(0.7, rel=1e-12)
    _, ledger, _ = private_prototypes(_blobs(n=60), params, seed=(0, 0))
    assert ledger.pure_epsilon() == pytest.approx(0.7, rel=1e-12)
    names = [e.name for e in ledger.entries]
    assert len(names) == 5 * trials + (trials > 1)
    assert ("final choice among trials (k-means loss)" in names) == (trials > 1)
    # Sensitivities follow the public bounds: 4 R^2 for losses, s * value_max for sums.
    R2 = params.l2_radius ** 2
    swap = next(e for e in ledger.entries if "local swap" in e.name)
    values = next(e for e in ledger.entries if "selected cluster sums" in e.name)
    assert swap.sensitivity == pytest.approx(4 * R2) and values.sensitivity == 8 * 5.0


def test_public_bounds_are_enforced_by_clipping_not_read_from_data() -> None:
    X = sp.csr_matrix(np.array([[9.0, 1, 2, 3, 0, 7], [0, 0, 0, 0, 0, 0.5],
                                [-2.0, 4, 4, 4, 4, 4]]))
    out = clip_rows(X, value_max=5.0, sparsity=3, radius=6.0,
                    rng=np.random.default_rng(0)).toarray()
    assert out.min() >= 0 and out.max() <= 5.0
    assert (np.count_nonzero(out, axis=1) <= 3).all()
    assert (np.linalg.norm(out, axis=1) <= 6.0 + 1e-12).all()
    # Row 0 keeps its three largest entries (9 -> 5, 7 -> 5, 3), scaled to norm 6.
    assert np.flatnonzero(out[0]).tolist() == [0, 3, 5]
    np.testing.assert_allclose(out[1], [0, 0, 0, 0, 0, 0.5])
    P, _, _ = private_prototypes(_blobs(n=40), PrototypeParams(
        k=2, epsilon=1.0, value_max=2.0, sparsity=5, shifts=1, swaps=2), seed=(0, 1))
    assert P.min() >= 0 and P.max() <= 2.0 and (np.count_nonzero(P, axis=1) <= 5).all()


def test_a_very_large_epsilon_approaches_non_private_kmeans() -> None:
    # Tolerance: with epsilon = 1e6 the Laplace noise on the selected sums has scale
    # s value_max / (eps 5/16) = 6.4e-4 and on the sizes 8e-6, so a prototype is the exact
    # mean of its cluster up to ~1e-5 per coordinate; the exponential mechanisms pick the
    # best swap with overwhelming probability. The blobs are separated by 4 sqrt(20) ~ 18
    # and spread 0.3 per item, so a clustering is either the true one (centres within
    # ~1e-4 of k-means') or off by a whole cluster (distance >= 5): 1e-3 separates them.
    X = _blobs()
    params = PrototypeParams(k=3, epsilon=1e6, value_max=5.0, sparsity=40, shifts=2,
                             swaps=6)
    P, _, _ = private_prototypes(X, params, seed=(3, 0))
    Z, _ = kmeans(X, 3, seed=0, restarts=3)
    cost = np.linalg.norm(P[:, None, :] - Z[None, :, :], axis=2)
    rows, cols = linear_sum_assignment(cost)
    assert cost[rows, cols].max() < 1e-3
    assert kmeans_loss(X, P) == pytest.approx(kmeans_loss(X, Z), rel=1e-6)


def test_silo_fit_is_the_exact_non_negative_ridge_solution() -> None:
    rng = np.random.default_rng(4)
    X = sp.random(25, 30, density=0.3, random_state=4, format="csr") * 5
    V = np.abs(rng.normal(size=(30, 5)))
    reg = 0.1
    U = fit_user_factors(X, V, reg, iters=2000, tol=0)
    A = np.vstack([V, np.sqrt(reg) * np.eye(5)])  # ||x - V u||^2 + reg ||u||^2 as one NNLS
    for i in range(25):
        b = np.concatenate([X[i].toarray().ravel(), np.zeros(5)])
        np.testing.assert_allclose(U[i], nnls(A, b)[0], atol=1e-7)


def test_nmf_is_deterministic_and_descends() -> None:
    X = sp.random(40, 30, density=0.4, random_state=1, format="csr") * 5
    a, b = nmf(X, 6, 0.1, iters=50), nmf(X, 6, 0.1, iters=50)
    np.testing.assert_array_equal(a.V, b.V)
    assert (a.U >= 0).all() and (a.V >= 0).all()
    assert all(x >= y - 1e-9 * x for x, y in zip(a.objective, a.objective[1:]))


def test_poisson_silos_follow_the_papers_recipe() -> None:
    data = poisson_silos(n_users=200, n_items=30, rank=10, silos=4, seed=0)
    assert data.X.shape == (200, 30) and len(data.silos) == 4
    assert sorted(np.concatenate(data.silos).tolist()) == list(range(200))
    # Row-normalized factors: U_i . V_j in [-1, 1], so rates in [1/e, e].
    assert data.rates.min() >= np.exp(-1) - 1e-12 and data.rates.max() <= np.exp(1) + 1e-12
    assert np.array_equal(data.X, np.round(data.X)) and data.X.min() >= 0


# -- 2. the protocol in a Flower simulation --------------------------------------------------
@pytest.fixture(scope="module")
def sim() -> dict:
    """One Flower simulation (Ray) for everything that needs one: a full run (plain sums,
    the nodes opt in), a run whose dpp-k exceeds the silos' 40 users (the server refuses),
    and a deviating server's direct request for such a release (each silo refuses)."""
    from flwr.app import Context
    from flwr.serverapp import Grid, ServerApp

    from fl_app.server_app import run_protocol
    from fl_app.simulation import simulate

    box: dict = {}
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        try:
            box["record"] = run_protocol(grid, resolve_config({**TINY, "aggregator": "plain"}))
            messenger = Messenger(grid, timeout=60)
            request = DPPrototypes(resolve_config({**TINY, "dpp-k": 41}))
            try:
                messenger.broadcast("dpp_prototypes", request.prototype_request().to_records(),
                                    messenger.node_ids(NODES), phase="deviate")
            except NodeError as exc:
                box["silo_refusal"] = str(exc)
        except BaseException as exc:  # hand the failure back to the test
            box["error"] = exc

    simulate(app, build_client_app(["clients.dp_prototypes"], policy=POLICY, data=TINY), NODES)
    if "error" in box:
        raise box["error"]
    return box


@pytest.fixture(scope="module")
def sim_run(sim: dict) -> dict:
    return sim["record"]


def test_a_silo_with_fewer_than_k_users_is_refused_in_simulation(sim: dict) -> None:
    """The server refuses such a run after the handshake (a run of its own: a node answers
    one handshake per run); a deviating server's release request is refused by each silo."""
    from fl_app.server_app import run_protocol
    from tests.localgrid import LocalGrid

    with LocalGrid(build_client_app(["clients.dp_prototypes"], policy=POLICY), NODES,
                   data=TINY) as grid:
        with pytest.raises(ValueError) as refusal:
            run_protocol(grid, resolve_config({**TINY, "aggregator": "plain", "dpp-k": 41}))
    assert "needs at least dpp-k=41 users in every silo" in str(refusal.value)
    assert "holds 40" in str(refusal.value)
    assert "refuses to release dp-prototypes: it holds 40 users, fewer than k=41" in \
        sim["silo_refusal"]


def test_the_run_has_exactly_two_protocol_rounds(sim_run: dict) -> None:
    phases = {name: p["rounds"] for name, p in sim_run["communication"]["phases"].items()}
    # handshake, prototypes up (one round), item factors down with the metric sums (one)
    assert phases == {"handshake": 1, "prototypes": 1, "evaluate": 1}
    assert sim_run["communication"]["total_rounds"] == 3


def test_the_runs_privacy_ledger_sums_to_epsilon(sim_run: dict) -> None:
    report = sim_run["privacy"]["dp"]
    assert report["epsilon"] == 1.0 and report["run_epsilon"] == pytest.approx(1.0)
    assert len(report["epsilon_per_silo"]) == NODES
    for label, ledger in report["ledgers"].items():
        assert ledger["pure_epsilon"] == pytest.approx(1.0, rel=1e-12), label
        assert sum(e["epsilon"] * e["steps"] for e in ledger["entries"]) == \
            pytest.approx(1.0, rel=1e-12)


def test_the_server_receives_only_prototypes_and_sums(sim_run: dict) -> None:
    received = sim_run["privacy"]["received"]
    proto = received["prototypes"]["records"]
    assert proto["prototypes"] == {"form": "noised", "entries": {"P": [4, 60]}}
    assert set(proto) == {"prototypes", "dp-ledger"}
    evaluate = received["evaluate"]["records"]
    assert set(evaluate) == {"secagg.values", "secagg.shapes"}  # a plain sum here
    assert evaluate["secagg.values"]["entries"]["v"] == [10]  # 6 ranking + 4 rating sums
    shapes = [s for r in received.values() for rec in r["records"].values()
              for s in rec["entries"].values() if isinstance(s, list)]
    assert all(40 not in s for s in shapes)  # nothing per user (40 users per silo)


def test_federated_equals_centralized_given_the_released_prototypes(sim_run: dict) -> None:
    # After the DP release everything is deterministic: the server's NMF of the stacked
    # prototypes and each silo's fit and metrics, recomputed here in one process, must equal
    # the run's up to float64 summation order (the plain sum adds the silos' vectors).
    cfg = resolve_config({**TINY, "aggregator": "plain"})
    P = sim_run["extra"]["prototypes"]
    V = nmf(P, 4, 0.1, 200).V
    np.testing.assert_array_equal(sim_run["extra"]["item_factors"], V)
    spec, part = DatasetSpec.from_config(cfg), PartitionSpec.from_config(cfg, NODES)
    ranking, rating = 0.0, 0.0
    for pid in range(NODES):
        node = load_node_data(spec, part, pid)
        U = fit_user_factors(node.train, V, 0.1, 200)
        sums = silo_metric_sums(U @ V.T, node.train, node.test, 1.0, 20)
        ranking, rating = ranking + sums["ranking"], rating + sums["rating"]
    central = metric_means(20, ranking, rating)
    for key, value in central.items():
        assert sim_run["metrics"][key] == pytest.approx(value, abs=1e-12), key


# -- 3. what silos refuse (in-process grid) --------------------------------------------------
def _run(over: dict, policy: dict = POLICY, node_configs: dict | None = None,
         deviate: int = 0) -> tuple[Messenger, object]:
    """Run the protocol (``deviate`` = 0) or, as a deviating server, send ``deviate``
    prototype requests right after the handshake without the server's own checks."""
    cfg = resolve_config({**TINY, "aggregator": "plain", **over})
    strategy = DPPrototypes(cfg)
    with LocalGrid(build_client_app(policy=policy), NODES,
                   node_configs=node_configs) as grid:
        messenger = Messenger(grid, timeout=30)
        if not deviate:
            return messenger, strategy.execute(messenger)
        fed = strategy.federate(messenger)
        for i in range(deviate):
            fed.send(strategy.prototype_request(), phase=f"ask{i}")
        return messenger, None


def test_a_silo_with_fewer_than_k_users_is_refused_before_any_release() -> None:
    with pytest.raises(ValueError) as err:
        _run({"dpp-k": 41})
    text = str(err.value)
    assert "needs at least dpp-k=41 users in every silo" in text
    assert "node 1001 (partition 0) holds 40" in text


def test_a_silo_with_fewer_than_k_users_refuses_by_itself() -> None:
    with pytest.raises(NodeError) as err:
        _run({"dpp-k": 41}, deviate=1)
    assert "refuses to release dp-prototypes: it holds 40 users, fewer than k=41" in \
        str(err.value)


@pytest.mark.usefixtures("server_skips_policy_check")
def test_a_silo_refuses_an_epsilon_beyond_its_policy() -> None:
    with pytest.raises(NodeError) as err:
        _run({"dpp-epsilon": 2.0})
    text = str(err.value)
    assert "epsilon 2 on top of 0 spent exceeds its node policy dp-budget=1" in text
    with pytest.raises(NodeError, match="dp-budget=0"):  # the safe default: no DP releases
        _run({}, policy={"allow-plain": True})


def test_a_second_release_is_refused_once_the_budget_is_spent() -> None:
    with pytest.raises(NodeError, match=r"epsilon 1 on top of 1 spent exceeds"):
        _run({}, policy={"allow-plain": True, "dp-budget": 1.5}, deviate=2)


def test_declared_silos_take_part_and_item_servers_do_not() -> None:
    silos = {i: {"role": "silo"} for i in range(NODES)}
    messenger, outcome = _run({"aggregator": "secagg+"}, node_configs=silos)
    assert 0 <= outcome.metrics["mean-rank"] <= 1
    sums = messenger.privacy_report()["sums"]
    assert [s["form"] for s in sums] == ["masked"]  # metrics through SecAgg+: totals only
    phases = messenger.ledger.to_dict()["phases"]
    assert phases["prototypes"]["rounds"] == 1 and phases["evaluate"]["rounds"] == 1
    with pytest.raises(ValueError, match="has role 'item-server'"):
        _run({}, node_configs={2: {"role": "item-server"}})



def test_a_silo_bounds_server_chosen_sizes_and_refuses_non_finite_bounds() -> None:
    with pytest.raises(NodeError, match="dp-prototypes with k=4.*memory-budget-mb=1"):
        _run({"dpp-shifts": 100}, policy={**POLICY, "memory-budget-mb": 1}, deviate=1)
    for field in ("radius", "jl_coef"):
        with pytest.raises(ValueError, match=f"'{field}'.*finite"):
            PrototypeParams(k=2, epsilon=1.0, value_max=1.0, sparsity=3,
                            **{field: float("inf")})


# -- paper accounting: a labelled comparison mode, never the default --------------------------
def test_paper_accounting_is_never_the_default_and_says_what_it_spends() -> None:
    assert PrototypeParams(k=3, epsilon=1.0, value_max=5.0, sparsity=8).accounting == "strict"
    assert resolve_config({"protocol": "dp-prototypes"})["dpp-accounting"] == "strict"
    params = PrototypeParams(k=3, epsilon=0.8, value_max=5.0, sparsity=8, shifts=2, swaps=3,
                             accounting="paper")
    _, ledger, _ = private_prototypes(_blobs(n=60), params, seed=(0, 0))
    # candidates eps/8 + local swap eps/8 + selection eps + values eps, sizes exact
    assert ledger.pure_epsilon() == pytest.approx(2.25 * 0.8, rel=1e-12)
    assert params.spent_epsilon() == pytest.approx(2.25 * 0.8, rel=1e-12)
    assert all("[paper accounting" in e.name for e in ledger.entries)
    assert not any("Laplace on the cluster sizes" in e.name
                   for e in ledger.entries)
    values = next(e for e in ledger.entries if "selected cluster sums" in e.name)
    assert values.sensitivity == 2 * 8 * 5.0  # the printed 2 Lambda s (a user replaced)
    with pytest.raises(ValueError, match="accounting"):
        PrototypeParams(k=3, epsilon=1.0, value_max=5.0, sparsity=8, accounting="loose")
    with pytest.raises(ValueError, match="trials"):
        PrototypeParams(k=3, epsilon=1.0, value_max=5.0, sparsity=8, trials=2,
                        accounting="paper")


@pytest.mark.usefixtures("server_skips_policy_check")
def test_a_silo_refuses_paper_accounting_unless_its_operator_allows_it() -> None:
    with pytest.raises(NodeError, match="allow-paper-accounting=false"):
        _run({"dpp-accounting": "paper"}, policy={"allow-plain": True, "dp-budget": 10.0})
    # Allowed, the silo charges what the release really spends (2.25 epsilon), so a budget
    # that covers the claimed epsilon but not the real one refuses.
    with pytest.raises(NodeError, match=r"epsilon 2.25 on top of 0 spent exceeds"):
        _run({"dpp-accounting": "paper"},
             policy={"allow-plain": True, "dp-budget": 2.0, "allow-paper-accounting": True})
    _, outcome = _run({"dpp-accounting": "paper"},
                      policy={"allow-plain": True, "dp-budget": 2.25,
                              "allow-paper-accounting": True})
    report = outcome.privacy["dp"] if "dp" in outcome.privacy else outcome.privacy
    text = str(report)
    assert "PAPER ACCOUNTING" in text and "2.25" in text
