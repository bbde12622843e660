"""FedMF on the aggregator: exact mode equals centralized gradient descent (plain and
SecAgg+ sums), local mode learns beyond item popularity, and the server saw item updates
only masked."""

from __future__ import annotations

import numpy as np
import pytest

from datasets import DatasetSpec, load_dataset
from fedrec.recsys.metrics import ranking_sums
from fedrec.recsys.mf import BPRMF
from fedrec.secure.fixedpoint import FixedPoint
from fl_app.simulation import run_in_simulation
from strategies.fedmf import LOSS_CAP
from tests.simutil import run_in_process

ROUNDS = 6
NODES = 5
#: The nodes opt in to plain sums where a test compares them with the reference bit for bit.
PLAIN_OK = {"allow-plain": True}
EXACT = {"protocol": "fedmf", "dataset": "synthetic", "synthetic-users": 120,
         "synthetic-items": 150, "rounds": ROUNDS, "seed": 3, "mf-dim": 8, "mf-lr": 0.5,
         "mf-reg": 1e-4, "mf-mode": "exact", "partition": "shards-random",
         "aggregator": "plain", "run-name": "test-fedmf-exact"}


@pytest.fixture(scope="module")
def exact_plain() -> dict:
    # the exact-mode comparisons run the ServerApp and ClientApp code in process; local mode
    # (below) runs on a real Flower simulation
    return run_in_process(EXACT, num_nodes=NODES, quiet=True, node_policy=PLAIN_OK)


@pytest.fixture(scope="module")
def exact_reference() -> tuple[BPRMF, dict[str, float]]:
    data = load_dataset(DatasetSpec.from_config(EXACT))
    ref = BPRMF(dim=8, lr=0.5, reg=1e-4, negatives=1, seed=3, mode="exact")
    ref.fit(data.train, ROUNDS)
    sums = ranking_sums(ref.score(np.arange(data.n_users)), data.train, data.test, k=20)
    return ref, sums.means()


def test_exact_mode_plain_matches_centralized_gradient_descent(exact_plain, exact_reference):
    # Tolerance 1e-12: both sides compute the same float64 per-triple terms; only the order
    # of the additions over users differs (per node, then over nodes in partition order, vs
    # one pass over all users). That is rounding of ~1e-16 relative per addition on values
    # of order 0.1-1, amplified at most by a few per step over 6 steps: ~1e-14. A wrong
    # weight or negative changes values at 1e-3.
    ref, central = exact_reference
    np.testing.assert_allclose(exact_plain["extra"]["item_factors"], ref.item_factors,
                               rtol=0, atol=1e-12)
    for key in ("recall@20", "ndcg@20"):
        assert exact_plain["metrics"][key] == pytest.approx(central[key], abs=1e-12)
    assert exact_plain["metrics"]["train-loss"] == pytest.approx(ref.losses[-1], abs=1e-12)
    assert exact_plain["privacy"]["sums"][0]["form"] == "plain"


def test_exact_mode_secagg_matches_within_fixed_point_resolution(exact_reference):
    ref, _ = exact_reference
    record = run_in_process({**EXACT, "aggregator": "secagg+",
                             "run-name": "test-fedmf-exact-secagg"}, num_nodes=NODES)
    # The declared range is max users per node x max(mf-factor-bound, loss cap); SecAgg+
    # picks frac_bits for it, and each decoded sum is within NODES * resolution / 2 of the
    # exact one. V moves by lr / N times that per round (N >= 100 users), and the errors of
    # ROUNDS rounds add (with the same small amplification as above): bound them by
    # ROUNDS * NODES * resolution.
    max_users = max(len(u) for u in np.array_split(np.arange(120), NODES)) + 1
    codec = FixedPoint.for_sum(max_users * max(100.0, LOSS_CAP), NODES)
    tol = ROUNDS * NODES * codec.resolution
    assert tol < 1e-9  # the check means something
    np.testing.assert_allclose(record["extra"]["item_factors"], ref.item_factors, rtol=0,
                               atol=tol)
    assert {s["form"] for s in record["privacy"]["sums"]} == {"masked"}


def test_exact_mode_learns_and_reports_costs(exact_plain) -> None:
    losses = [row["train-loss"] for row in exact_plain["history"]]
    assert losses[-1] < losses[0]
    comm = exact_plain["communication"]
    # handshake + one plain sum per round + the evaluation sum
    assert comm["total_rounds"] == 1 + ROUNDS + 1
    # every train request carries the 150 x 8 float64 item factors (9,600 bytes) to 5 nodes
    assert comm["phases"]["train"]["bytes_down"] >= ROUNDS * NODES * 150 * 8 * 8
    assert exact_plain["num_nodes"] == NODES


LOCAL = {"protocol": "fedmf", "dataset": "synthetic", "synthetic-users": 200,
         "synthetic-items": 300, "seed": 0, "rounds": 10, "partition": "shards-random",
         "run-name": "test-fedmf-local"}


def test_local_mode_beats_popularity_and_sends_only_masked_item_updates() -> None:
    record = run_in_simulation(LOCAL, num_nodes=4, quiet=True)
    data = load_dataset(DatasetSpec.from_config(LOCAL))
    deg = np.asarray(data.train.sum(axis=0)).ravel()
    pop = ranking_sums(np.tile(deg, (data.n_users, 1)), data.train, data.test, k=20).means()
    # Margin 1.15x: with this seed FedMF measures ~1.4x popularity's NDCG@20; on 200 users
    # with ~3 test items each, NDCG@20 moves by ~0.003 (7% of popularity's ~0.038) between
    # seeds, so 1.15x stays clear of noise yet fails a model that learned nothing (which
    # ranks at random: ~0.02) or only popularity.
    assert record["metrics"]["ndcg@20"] > 1.15 * pop["ndcg@20"]
    assert record["metrics"]["train-loss"] < 0.5 < np.log(2)
    privacy = record["privacy"]
    train_sums = [s for s in privacy["sums"] if s["phase"] == "train"]
    assert len(train_sums) == LOCAL["rounds"]
    assert all(s["form"] == "masked" and s["aggregator"] == "secagg+" for s in train_sums)
    assert train_sums[0]["arrays"]["delta"] == [data.n_items, 32]
    # what the server received in the train phase: the masked values and their layout only
    received = privacy["received"]["train"]["records"]
    assert received["secagg.values"]["form"] == "masked"
    # in clear only the layout and the digest of the request answered (public: the server
    # sent it)
    assert {name for name, r in received.items() if r["form"] == "plain"} <= {
        "secagg.shapes", "secagg.bound"}


def test_centralized_reference_is_fedmf_with_one_node() -> None:
    """The reference runs the nodes' own local-training code: a one-node federation (plain
    sums, in-process Flower grid) gives the reference's factors and metrics."""
    from fl_app.client_app import build_client_app
    from fl_app.registry import resolve_config
    from fl_app.server_app import run_protocol
    from tests.localgrid import LocalGrid

    cfg = resolve_config({**LOCAL, "rounds": 4, "aggregator": "plain",
                          "synthetic-users": 80, "synthetic-items": 100})
    with LocalGrid(build_client_app(policy=PLAIN_OK), 1) as grid:
        record = run_protocol(grid, cfg)
    data = load_dataset(DatasetSpec.from_config(cfg))
    ref = BPRMF(dim=cfg["mf-dim"], lr=cfg["mf-lr"], reg=cfg["mf-reg"], seed=cfg["seed"],
                mode="local", epochs=cfg["mf-local-epochs"], batch_size=cfg["mf-batch-size"])
    ref.fit(data.train, cfg["rounds"])
    # Not bit for bit: the server forms V + (w * delta) / w, which rounds differently from
    # the node's V_local (~1e-17 on values ~0.1 per round), and Adam's next steps carry it
    # on; 1e-12 is far below any real difference (a different triple moves values ~1e-3).
    np.testing.assert_allclose(record["extra"]["item_factors"], ref.item_factors, rtol=0,
                               atol=1e-12)
    assert record["metrics"]["train-loss"] == pytest.approx(ref.losses[-1], abs=1e-12)
    assert record["history"][-1]["clipped-fraction"] == 0.0


def test_validation_split_is_carved_from_train_only() -> None:
    from fedrec.recsys.mf import validation_split

    data = load_dataset(DatasetSpec(name="synthetic", synthetic_users=60, synthetic_items=80))
    fit, valid = validation_split(data.train, 0.2, seed=1)
    assert (fit + valid != data.train).nnz == 0
    assert fit.multiply(valid).nnz == 0
    n = np.diff(data.train.indptr)
    assert np.all(np.diff(valid.indptr)[n >= 2] >= 1)
    assert np.all(np.diff(fit.indptr)[n >= 1] >= 1)


def test_fedmf_ceiling_is_early_stopped_on_validation_and_not_beaten() -> None:
    """The centralized reference picks its rounds, step sizes and L2 weight from the
    validation split alone (the best validation NDCG, then retrained on train for that many
    rounds), and on a small split the federated run does not beat it."""
    from fedrec.recsys.metrics import evaluate_ranking
    from fedrec.recsys.mf import fit_early_stopped, tune_early_stopped, validation_split
    from fedrec.recsys.mf_ceiling import EDGE_PASSES, REFERENCE_GRID, REFERENCE_SPLIT_STEPS
    from fl_app.registry import resolve_config
    from strategies.fedmf import FedMF

    cfg = resolve_config({**LOCAL, "rounds": 3, "aggregator": "plain",
                          "synthetic-users": 80, "synthetic-items": 100})
    data = load_dataset(DatasetSpec.from_config(cfg))
    strategy = FedMF(cfg)
    tuned = fit_early_stopped(strategy._untrained, data.train, 12, patience=3,
                              seed=cfg["seed"])
    assert tuned.rounds == int(np.argmax(tuned.curve)) + 1
    fit, valid = validation_split(data.train, seed=cfg["seed"])
    check = strategy._untrained().fit(fit, tuned.rounds)
    assert evaluate_ranking(check.score, fit, valid).means()["ndcg@20"] == pytest.approx(
        max(tuned.curve), abs=1e-12)
    again = strategy._untrained().fit(data.train, tuned.rounds)
    assert tuned.model is not None
    np.testing.assert_array_equal(again.item_factors, tuned.model.item_factors)
    record = run_in_process(cfg, num_nodes=4, quiet=True, node_policy=PLAIN_OK)
    assert record["metrics"]["ndcg@20"] <= strategy.reference(data)["ndcg@20"] + 1e-9
    # the full tuner: every planned candidate and the walk (the default halving may stop
    # short of them at 3 rounds: its budget; tests/test_fedmf_halving.py)
    strategy.ceiling_budget = "full"
    ceiling = strategy.reference(data)
    assert ceiling["tuned-rounds"] >= 1
    lr, reg = cfg["mf-lr"], cfg["mf-reg"]
    grid = {(lr * a, lr * b, reg * c) for a, b, c in REFERENCE_GRID}
    grid |= {(lr * a, lr * b, reg * c) for a, b in REFERENCE_SPLIT_STEPS
             for c in {c for *_, c in REFERENCE_GRID}}
    n = len(REFERENCE_GRID) + len(REFERENCE_SPLIT_STEPS)
    # the edge walk adds at most one step per coordinate (user step, ratio) per pass
    assert n <= ceiling["tuned-candidates"] <= n + 2 * EDGE_PASSES
    if ceiling["tuned-candidates"] == n:
        assert any(ceiling["tuned-lr"] == pytest.approx(a) and ceiling["tuned-item-lr"] ==
                   pytest.approx(b) and ceiling["tuned-reg"] == pytest.approx(c)
                   for a, b, c in grid)
    picked = tune_early_stopped({"run": strategy._untrained,
                                 "slow": lambda: strategy._untrained(cfg["mf-lr"] / 10)},
                                data.train, 12, patience=3, seed=cfg["seed"])
    assert picked.tried[picked.label] == max(picked.tried.values()) == max(picked.curve)
    assert record["metrics"]["ndcg@20"] <= ceiling["ndcg@20"] + 1e-9, (
        record["metrics"]["ndcg@20"], ceiling)


def test_tuning_refines_around_the_first_pass_best_and_retrains_only_the_winner() -> None:
    """``refine`` gets the first pass's best label; its candidates are tried the same way;
    the winner overall is the one retrained on train (the others are never fit on it)."""
    from fedrec.recsys.mf import tune_early_stopped

    data = load_dataset(DatasetSpec(name="synthetic", synthetic_users=60, synthetic_items=80))
    fits: list[str] = []

    class Counted(BPRMF):
        def fit(self, train, rounds, on_round=None):  # type: ignore[no-untyped-def]
            fits.append(f"{self.lr:g}/{train.nnz}")
            return super().fit(train, rounds, on_round)

    def make(lr: float):  # type: ignore[no-untyped-def]
        return lambda: Counted(dim=8, lr=lr, reg=1e-3, mode="local", epochs=1, seed=1)

    seen: list[str] = []

    def refine(best: str) -> dict:  # type: ignore[type-arg]
        seen.append(best)
        return {"x3": make(3 * float(best)), best: make(float(best))}  # a repeat is skipped

    out = tune_early_stopped({"0.001": make(0.001), "0.01": make(0.01)}, data.train, 6,
                             patience=2, refine=refine, seed=1)
    first = max(("0.001", "0.01"), key=lambda k: out.tried[k])
    assert seen == [first] and set(out.tried) == {"0.001", "0.01", "x3"}
    assert out.label == max(out.tried, key=out.tried.get)
    on_train = [f for f in fits if f.endswith(f"/{data.train.nnz}")]
    assert len(fits) == 4 and len(on_train) == 1  # three selection runs, one retrain


def test_local_training_is_the_plain_adam_arithmetic() -> None:
    """bpr_train_local (torch's fused Adam, float64) computes what the module docstring's
    recipe computes written plainly with numpy and :meth:`Adam.step`: same triples, order,
    gradients and Adam state, over two calls that carry the state (as a node's rounds)."""
    from fedrec.recsys.mf import (
        _SHUFFLE,
        Adam,
        bpr_train_local,
        init_item_factors,
        init_user_factors,
        sample_bpr_triples,
    )

    data = load_dataset(DatasetSpec(name="synthetic", synthetic_users=50, synthetic_items=70))
    users = np.arange(10, 40)  # a node's users: rows 10..39
    train = data.train[users]
    reg, lr, batch, epochs, seed = 0.01, 0.02, 32, 2, 5

    def plain(U, V, round_, uo, io):  # type: ignore[no-untyped-def]
        for e in range(epochs):
            rows, pos, neg = sample_bpr_triples(train, users, seed,
                                                (round_ - 1) * epochs + e + 1, 1)
            order = np.random.default_rng([seed, _SHUFFLE, round_, e, int(users[0])]
                                          ).permutation(len(rows))
            for s in range(0, len(order), batch):
                b = order[s:s + batch]
                r, i, j = rows[b], pos[b], neg[b]
                d = V[i] - V[j]
                x = np.einsum("td,td->t", U[r], d)
                coef = (-1.0 / (1.0 + np.exp(x)) / len(b))[:, None]
                gU, gV = np.zeros_like(U), np.zeros_like(V)
                np.add.at(gU, r, coef * d + 2 * reg / len(b) * U[r])
                np.add.at(gV, i, coef * U[r] + 2 * reg / len(b) * V[i])
                np.add.at(gV, j, -coef * U[r] + 2 * reg / len(b) * V[j])
                U, V = uo.step(U, gU), io.step(V, gV)
        return U, V

    U0 = init_user_factors(users, 8, seed)
    V0 = init_item_factors(data.n_items, 8, seed)
    want_U, want_V, wu, wv = U0, V0, Adam(lr), Adam(lr / 3)
    got_U, got_V, gu, gv = U0, V0, Adam(lr), Adam(lr / 3)
    for round_ in (1, 2):
        want_U, want_V = plain(want_U, want_V, round_, wu, wv)
        out = bpr_train_local(got_U, got_V, train, users, seed=seed, round_=round_,
                              epochs=epochs, batch_size=batch, reg=reg, negatives=1,
                              user_opt=gu, item_opt=gv)
        got_U, got_V = out.user_factors, out.item_factors
    # float64 on both sides; torch folds Adam's bias corrections into the step size and the
    # denominator (different rounding, ~1e-16 relative per step). After ~100 steps the
    # difference stays ~1e-15; a changed gradient or step moves values by >= 1e-6.
    np.testing.assert_allclose(got_U, want_U, rtol=0, atol=1e-12)
    np.testing.assert_allclose(got_V, want_V, rtol=0, atol=1e-12)
    for got, want in ((gu, wu), (gv, wv)):
        assert got.t == want.t > 0
        np.testing.assert_allclose(got.m, want.m, rtol=0, atol=1e-12)
        np.testing.assert_allclose(got.v, want.v, rtol=0, atol=1e-12)
    assert isinstance(got_U, np.ndarray) and got_U.dtype == np.float64


def test_tuned_ceiling_is_not_beaten_on_validation(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The ceiling property where the choice is made: the federated configuration, run on
    the same split (train = the reference's fit rows, test = its validation rows, a folder
    split) scores no better validation NDCG@20 than the tuned centralized reference."""
    import scipy.sparse as sp

    from fedrec.recsys.mf import validation_split
    from fl_app.registry import resolve_config
    from strategies.fedmf import FedMF

    cfg = resolve_config({**LOCAL, "rounds": 10, "aggregator": "plain",
                          "synthetic-users": 80, "synthetic-items": 100})
    data = load_dataset(DatasetSpec.from_config(cfg))
    fit, valid = validation_split(data.train, seed=cfg["seed"])
    (tmp_path / "fitvalid").mkdir()
    sp.save_npz(tmp_path / "fitvalid" / "train.npz", fit.tocsr())
    sp.save_npz(tmp_path / "fitvalid" / "test.npz", valid.tocsr())
    on_valid = {k: v for k, v in {**LOCAL, "rounds": 10, "aggregator": "plain"}.items()
                if not k.startswith("synthetic-")}
    on_valid.update({"dataset": "fitvalid", "data-dir": str(tmp_path)})
    record = run_in_process(on_valid, num_nodes=8, quiet=True, node_policy=PLAIN_OK)
    ceiling = FedMF(cfg).reference(data)
    assert record["metrics"]["ndcg@20"] <= ceiling["tuned-valid"], (
        record["metrics"]["ndcg@20"], ceiling)


def test_steps_past_edges_walks_only_off_an_edge_it_sits_on() -> None:
    """A best on the largest tried value of a coordinate gets a step x 3, on the smallest a
    step / 3, inside none; a coordinate tried at one value has no edge; only ``dims`` walk."""
    from fedrec.recsys.mf import steps_past_edges

    tried = [(1.0, 1.0, 1.0), (1 / 3, 1.0, 1.0), (0.1, 1.0, 3.0), (1 / 3, 1 / 3, 1.0)]
    assert steps_past_edges((1.0, 1.0, 1.0), tried, dims=(0, 1)) == [(3.0, 1.0, 1.0),
                                                                    (1.0, 3.0, 1.0)]
    assert steps_past_edges((1 / 3, 1 / 3, 1.0), tried, dims=(0, 1)) == [
        (1 / 3, 1 / 9, 1.0)]
    assert steps_past_edges((1 / 3, 1.0, 1.0), tried, dims=(0,)) == []
    assert steps_past_edges((1.0, 1.0, 1.0), [(1.0, 1.0, 1.0)], dims=(0, 1, 2)) == []
    assert steps_past_edges((0.1, 1.0, 3.0), tried, dims=(2,)) == [(0.1, 1.0, 9.0)]
