"""dp-svd end to end on tiny synthetic data (one user per node): with the noise shares
replaced by zeros the federated basis equals the in-process math's exactly (the secure sums
are plain sums); the server sees every reply masked; the reported epsilon is the
accountant's and what every node charged, per sum; a node whose budget the run would pass
refuses it; and the math's pieces hold what the module promises."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

from fedrec.recsys import dp_svd
from fedrec.secure.distributed_noise import (
    RDP_ORDERS,
    calibrate,
    composed_epsilon,
    multiplier_plan,
)
from fedrec.transport.messenger import NodeError
from tests.simutil import run_in_process

USERS = 6
RUN = {"protocol": "dp-svd", "dataset": "synthetic", "synthetic-users": USERS,
       "synthetic-items": 40, "synthetic-density": 0.2, "partition": "user",
       "aggregator": "secagg+", "dpsvd-rank": 3, "dpsvd-items": 20, "dpsvd-iterations": 3,
       "dpsvd-epsilon": 8.0, "seed": 2, "run-name": "test-dp-svd"}


@pytest.fixture(scope="module")
def ledger_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("dpsvd")


@pytest.fixture(scope="module")
def record(ledger_dir: Path) -> dict:
    return run_in_process(RUN, num_nodes=USERS,
                          node_policy={"dp-budget": 10.0,
                                       "dp-ledger": str(ledger_dir / "ledger.json")})


def _train() -> sp.csr_matrix:
    from datasets import DatasetSpec, load_dataset
    from fl_app.registry import resolve_config

    return sp.csr_matrix(load_dataset(DatasetSpec.from_config(resolve_config(RUN))).train)


def test_without_noise_the_federated_basis_is_the_math_s(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Zero noise shares: the count sum and every iteration's sum are the plain sums, so
    the released items and basis equal :func:`dp_svd.simulate` at z = 0 (up to the fixed-
    point grid)."""
    import clients.noise_node as noise_node

    monkeypatch.setattr(noise_node, "discrete_gaussian",
                        lambda n, scale: np.zeros(n, dtype=np.int64))
    rec = run_in_process({**RUN, "run-name": "test-dp-svd-exact"}, num_nodes=USERS,
                         node_policy={"dp-budget": 10.0,
                                      "dp-ledger": str(tmp_path / "ledger.json")})
    p = dp_svd.DPSVDParams(rank=3, iterations=3, items=20)
    want = dp_svd.simulate(_train(), p, 0.0, seed=RUN["seed"])
    extra = rec["extra"]
    np.testing.assert_allclose(extra["counts"], want.counts, atol=1e-9)
    np.testing.assert_array_equal(extra["items"], want.items)
    np.testing.assert_allclose(extra["basis"], want.X, atol=1e-8)


def test_it_runs_and_every_reply_is_masked(record: dict) -> None:
    assert 0.0 <= record["metrics"]["ndcg@20"] <= 1.0
    assert len(record["history"]) == RUN["dpsvd-iterations"]
    sums = record["privacy"]["sums"]
    assert {s["form"] for s in sums} == {"masked"}
    assert [s["phase"] for s in sums if s["phase"] != "evaluate"] == \
        ["count"] + ["iterate"] * RUN["dpsvd-iterations"]


def test_the_reported_epsilon_is_the_accountants_and_every_nodes_charge(
        record: dict, ledger_dir: Path) -> None:
    from opacus.accountants import RDPAccountant

    dp = record["privacy"]["dp"]
    z, sums = dp["noise-multiplier"], dp["noisy-sums"]
    assert sums == RUN["dpsvd-iterations"] + 1
    assert z == pytest.approx(calibrate(RUN["dpsvd-epsilon"] * (1 - 1e-9), 1e-5, 1.0, sums,
                                        USERS))
    acc = RDPAccountant()
    acc.history = [(z, 1.0, sums)]
    assert dp["epsilon"] == pytest.approx(
        acc.get_epsilon(delta=dp["delta"], alphas=list(RDP_ORDERS)), rel=1e-9)
    assert dp["epsilon"] == pytest.approx(
        composed_epsilon([(multiplier_plan(z, 1.0, USERS), sums)], dp["delta"]), rel=1e-12)
    assert dp["epsilon"] <= RUN["dpsvd-epsilon"]
    entries = json.loads((ledger_dir / "ledger.json").read_text())["entries"].values()
    charged = [sum(float(r["epsilon"]) for r in e["releases"]) for e in entries]
    assert charged == pytest.approx([dp["epsilon"]] * USERS, rel=1e-9)
    assert all(len(e["releases"]) == sums for e in entries)


def test_a_node_with_no_budget_refuses_the_first_sum(
        server_skips_policy_check: None, tmp_path: Path) -> None:
    with pytest.raises(NodeError) as err:
        run_in_process({**RUN, "run-name": "test-dp-svd-refused"}, num_nodes=USERS,
                       node_policy={"dp-budget": 0.0,
                                    "dp-ledger": str(tmp_path / "ledger.json")})
    text = str(err.value)
    assert "refuses the run's noisy sums" in text and "dp-budget=0" in text
    assert "Traceback" not in text


@pytest.mark.parametrize("protocol", ["dp-svd", "dp-fedmf"])
def test_a_plain_aggregator_is_refused_before_any_message(protocol: str) -> None:
    from fl_app.registry import load_strategy_class, resolve_config

    base = {k: v for k, v in RUN.items() if not k.startswith("dpsvd-")}
    base.update(RUN if protocol == "dp-svd" else {})
    cfg = resolve_config({**base, "protocol": protocol, "aggregator": "plain"})
    with pytest.raises(ValueError, match=f"^{protocol} adds its noise inside SecAgg\\+ "
                       "sums: aggregator must be secagg\\+, got 'plain'$"):
        load_strategy_class(protocol)(cfg)
    load_strategy_class(protocol)(resolve_config({**base, "protocol": protocol}))  # secagg+


def test_every_share_is_within_sensitivity_one_whatever_the_basis() -> None:
    """A user's count share and iteration share have L2 norm <= 1 for any orthonormal X,
    whatever rows the user holds (one item or many, weighted)."""
    rng = np.random.default_rng(0)
    rows = sp.random(50, 30, density=0.3, random_state=1, format="csr") * 5
    items = np.arange(30)
    X = dp_svd.initial_basis(30, 4, seed=3)
    for u in range(rows.shape[0]):
        row = rows[u]
        assert np.linalg.norm(dp_svd.count_share(row)) <= 1 + 1e-12
        Y = np.linalg.qr(rng.standard_normal((30, 4)))[0]
        for basis in (X, Y):
            assert np.linalg.norm(dp_svd.power_share(row, items, basis)) <= 1 + 1e-12


def test_item_selection_keeps_the_largest_counts_ties_to_the_lower_id() -> None:
    counts = np.array([3.0, 5.0, 5.0, 1.0, 4.0])
    assert dp_svd.select_items(counts, 2).tolist() == [1, 2]
    assert dp_svd.select_items(counts, 3).tolist() == [1, 2, 4]
    assert dp_svd.select_items(np.array([2.0, 2.0, 2.0]), 1).tolist() == [0]
    assert dp_svd.select_items(counts, 0).tolist() == [0, 1, 2, 3, 4]


def test_the_filter_recovers_a_planted_subspace_without_noise() -> None:
    """Sanity of the power method: users drawn from two item blocks; with no noise the
    basis spans the blocks and each user's top item is in its own block."""
    rng = np.random.default_rng(4)
    blocks = [np.arange(0, 10), np.arange(10, 20)]
    rows = np.zeros((40, 20))
    for u in range(40):
        rows[u, rng.choice(blocks[u % 2], 5, replace=False)] = 1.0
    model = dp_svd.simulate(sp.csr_matrix(rows), dp_svd.DPSVDParams(rank=2, iterations=8,
                                                                    items=0), 0.0, seed=0)
    s = dp_svd.scores(sp.csr_matrix(rows), model.items, model.X, 20)
    own = [int(np.argmax(s[u]) // 10) == u % 2 for u in range(40)]
    assert all(own)


def test_calibration_meets_the_target_and_no_less_noise_would() -> None:
    z = calibrate(5.0, 1e-5, 1.0, 4, 100)
    assert composed_epsilon([(multiplier_plan(z, 1.0, 100), 4)], 1e-5) <= 5.0
    assert composed_epsilon([(multiplier_plan(z * 0.99, 1.0, 100), 4)], 1e-5) > 5.0
    assert math.isfinite(z)


def test_the_defaults_are_the_validation_choice_at_epsilon_5() -> None:
    """docs/protocols/dp-svd.md: the defaults are what validation chose at epsilon 5 on
    every curve (a curve that chose otherwise fails this)."""
    root = Path(__file__).resolve().parents[1] / "results" / "dp_svd"
    curves = sorted(root.glob("curve-*.json"))
    if not curves:
        pytest.skip("no dp-svd curve in results/dp_svd")
    d = dp_svd.DPSVDParams()
    for path in curves:
        point = next(r for r in json.loads(path.read_text())["curve"] if r["epsilon"] == 5)
        assert point["chosen"] == {"items": d.items, "rank": d.rank,
                                   "iterations": d.iterations, "pop_weight": d.pop_weight}, \
            path.name
