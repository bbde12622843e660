"""FedMVMF / PrivMVMF (paper 004): the model's closed forms, federated equals centralized,
CKKS equals plaintext, the server's view, the decrypter's refusals, cold start, bad input."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from datasets import DatasetSpec, load_dataset
from fedrec.recsys import multiview as M

PLAIN_CKKS = {"allow-plain": True, "allow-ckks": True}
#: 5 nodes: 4 user nodes and the item server (the last partition); cold users and items too.
BASE = {"dataset": "synthetic", "synthetic-users": 60, "synthetic-items": 50,
        "synthetic-density": 0.3, "synthetic-clusters": 4, "seed": 1, "implicit": False,
        "rounds": 5, "item-servers": 1, "partition": "shards-random", "mvmf-lambda2": 1.0,
        "cold-start-users": 0.1, "cold-start-items": 0.1}
NODES = 5


def _toy(seed: int = 0, users: int = 8, items: int = 12, attrs: int = 5, feats: int = 4):
    rng = np.random.default_rng(seed)
    R = sp.random(users, items, density=0.4, random_state=seed, format="csr")
    R.data = rng.integers(1, 6, R.nnz).astype(float)
    X = (rng.random((users, attrs)) < 0.4).astype(float)
    return R, X, rng.normal(size=(items, feats)), rng.normal(size=(items, 3)), \
        rng.normal(size=(attrs, 3))


# -- 1. the model -----------------------------------------------------------------------------
def test_closed_forms_are_stationary_points() -> None:
    R, X, Y, Q, U = _toy()
    cfg = M.MVMFConfig(dim=3, lam1=0.7, lam2=2.0, weighting="inclunc", alpha=0.2)
    r = R[0].toarray().ravel()
    c = M.item_weights(R[0].indices, R.shape[1], cfg, 1, 0)
    p = M.semials_user(r, c, X[0], Q, U, cfg.lam1, cfg.lam2)
    np.testing.assert_allclose(M.p_gradient(p, r, c, X[0], Q, U, cfg.lam1, cfg.lam2), 0,
                               atol=1e-10)
    # eq. 11: V minimizes lam1 ||Y - Q V^T||^2 + lam2 ||V||^2
    V, term, _ = M.item_server_step(Y, Q, cfg.lam1, cfg.lam2)
    np.testing.assert_allclose(-2 * cfg.lam1 * (Y - Q @ V.T).T @ Q + 2 * cfg.lam2 * V, 0,
                               atol=1e-10)
    np.testing.assert_allclose(term, sum(np.outer(Y[:, d] - Q @ V[d], V[d])
                                         for d in range(Y.shape[1])), atol=1e-12)
    # eq. 15: p minimizes lam1 ||x - U p||^2 + lam2 ||p||^2 (the regulariser the closed form implies)
    p0 = M.cold_user_factors(X[:1], U, cfg.lam1, cfg.lam2)[0]
    np.testing.assert_allclose(-2 * cfg.lam1 * (X[0] - U @ p0) @ U + 2 * cfg.lam2 * p0, 0,
                               atol=1e-10)


def test_server_gradient_is_the_gradient_of_the_objective() -> None:
    """dJ/dQ and dJ/dU from the summed f terms equal finite differences of eq. 3 (with the
    lambda1 on the U gradient that the paper's eq. 5 drops)."""
    R, X, Y, Q, U = _toy(1)
    cfg = M.MVMFConfig(dim=3, lam1=0.5, lam2=1.5, weighting="inclunc", p_update="sgd")
    P = np.random.default_rng(3).normal(size=(R.shape[0], 3))
    factors = dict(enumerate(P))
    V, term, _ = M.item_server_step(Y, Q, cfg.lam1, cfg.lam2)

    def J(Q_, U_):
        step = M.users_step(R, X, np.arange(R.shape[0]), Q_, U_, cfg, 1, factors)
        E = Y - Q_ @ V.T
        return step.loss - cfg.lam2 * np.sum(P * P) + cfg.lam1 * np.sum(E * E) + \
            cfg.lam2 * (np.sum(Q_ * Q_) + np.sum(U_ * U_))

    step = M.users_step(R, X, np.arange(R.shape[0]), Q, U, cfg, 1, factors)
    dQ, dU = M.server_gradients(Q, U, step.grad_Q, step.grad_U, term, cfg.lam1, cfg.lam2)
    h = 1e-6
    for G, which in ((dQ, 0), (dU, 1)):
        A = (Q, U)[which]
        i, j = 2, 1
        Ap, Am = A.copy(), A.copy()
        Ap[i, j] += h
        Am[i, j] -= h
        num = (J(*((Ap, U) if which == 0 else (Q, Ap))) -
               J(*((Am, U) if which == 0 else (Q, Am)))) / (2 * h)
        assert G[i, j] == pytest.approx(num, rel=1e-6)


def test_weights_obsonly_inclunc_sampled() -> None:
    rated = np.array([1, 4, 7])
    ob = M.item_weights(rated, 10, M.MVMFConfig(weighting="obsonly"), 1, 5)
    assert ob.sum() == 3 and set(np.flatnonzero(ob)) == {1, 4, 7}
    inc = M.item_weights(rated, 10, M.MVMFConfig(weighting="inclunc", alpha=0.1), 1, 5)
    assert inc[rated].tolist() == [1, 1, 1] and np.allclose(np.delete(inc, rated), 0.1)
    cfg = M.MVMFConfig(weighting="sampled", alpha=0.1, rho=1.0, seed=2)
    s1, s2 = M.item_weights(rated, 10, cfg, 1, 5), M.item_weights(rated, 10, cfg, 1, 5)
    np.testing.assert_array_equal(s1, s2)  # seeded: the federation and reference agree
    assert np.isclose(s1, 0.1).sum() == 3 and (s1 == 1).sum() == 3  # rho |O_i| pseudo-items
    draws = {tuple(np.flatnonzero(np.isclose(M.item_weights(rated, 10, cfg, e, 5), 0.1)))
             for e in range(1, 6)}
    assert len(draws) > 1  # redrawn every epoch


def _ratings_and_scores(seed: int, test_state: int) -> tuple[sp.csr_matrix, sp.csr_matrix,
                                                             np.ndarray]:
    """(training R, test ratings 1..5 on items outside R, random scores): 30 users x 40."""
    rng = np.random.default_rng(seed)
    R, *_ = _toy(2, users=30, items=40)
    test = sp.random(30, 40, density=0.3, random_state=test_state, format="csr")
    test.data = rng.integers(1, 6, test.nnz).astype(float)
    test = (test - test.multiply(R > 0)).tocsr()
    test.eliminate_zeros()
    return R, test, rng.normal(size=(30, 40))


def test_rating_sums_match_the_platform_prf_and_graded_ndcg() -> None:
    from fedrec.recsys.metrics import rating_topk_prf

    R, test, scores = _ratings_and_scores(0, 1)
    means = M.rating_ranking_means(M.rating_ranking_sums(scores, R, test, 10, 4.0), 10)
    ref = rating_topk_prf(scores, test, 10, 4.0, R)
    assert means["precision@10"] == pytest.approx(ref["precision"], abs=1e-12)
    assert means["recall@10"] == pytest.approx(ref["recall"], abs=1e-12)
    # perfect scores (the true ratings) give NDCG 1
    perfect = test.toarray()
    assert M.rating_ranking_means(M.rating_ranking_sums(perfect, R, test), 10)["ndcg@10"] == \
        pytest.approx(1.0)


def _brute_all(scores: np.ndarray, R: sp.csr_matrix, test: sp.csr_matrix,
               candidates: np.ndarray) -> tuple[float, float]:
    """Mean P/R@10 by brute force: the top 10 of ``candidates`` the user has not rated in
    training, against its test items rated >= 4 among them."""
    p, r = [], []
    for u in range(test.shape[0]):
        row = test.getrow(u)
        relevant = set(row.indices[row.data >= 4]) & set(candidates.tolist())
        if not relevant:
            continue
        s = np.full(scores.shape[1], -np.inf)
        s[candidates] = scores[u, candidates]
        s[R.getrow(u).indices] = -np.inf
        hits = len(relevant & set(np.argsort(-s)[:10].tolist()))
        p.append(hits / 10)
        r.append(hits / len(relevant))
    return float(np.mean(p)), float(np.mean(r))


def test_all_unrated_candidates_rank_every_item_without_a_training_rating() -> None:
    """P/R@10 on all unrated candidates (the paper's P/R reading): the top 10 of every item
    the user has not rated in training, against its test items rated >= 4."""
    R, test, scores = _ratings_and_scores(3, 4)
    means = M.rating_ranking_means(M.rating_ranking_sums(scores, R, test, 10, 4.0), 10)
    p, r = _brute_all(scores, R, test, np.arange(40))
    assert means["precision@10-all"] == pytest.approx(p, abs=1e-12)
    assert means["recall@10-all"] == pytest.approx(r, abs=1e-12)
    # a user's training items are never candidates: scoring them highest changes nothing
    boosted = scores + 100.0 * (R.toarray() != 0)
    again = M.rating_ranking_means(M.rating_ranking_sums(boosted, R, test, 10, 4.0), 10)
    assert again["precision@10-all"] == means["precision@10-all"]


def test_new_items_are_the_only_all_unrated_candidates_of_a_cold_item_split() -> None:
    """With new items named, P/R@10-all rank only them: warm items scored highest change
    nothing, and the sums equal brute force over the new items."""
    R, test, scores = _ratings_and_scores(5, 6)
    new = np.array([1, 4, 9, 15, 22, 23, 30, 31, 35, 38, 39, 2])
    warm = np.setdiff1d(np.arange(40), new)
    test = test.tolil()
    test[:, warm] = 0
    test = test.tocsr()
    test.eliminate_zeros()
    boosted = scores.copy()
    boosted[:, warm] += 100.0  # trained warm items outscore every new one
    means = M.rating_ranking_means(M.rating_ranking_sums(boosted, R, test, 10, 4.0, new), 10)
    p, r = _brute_all(scores, R, test, new)
    assert means["precision@10-all"] == pytest.approx(p, abs=1e-12)
    assert means["recall@10-all"] == pytest.approx(r, abs=1e-12)
    assert p > 0
    # without the new items named, the warm items fill every top 10
    every = M.rating_ranking_means(M.rating_ranking_sums(boosted, R, test, 10, 4.0), 10)
    assert every["precision@10-all"] == 0.0


# -- bad input ----------------------------------------------------------------------------------
def test_bad_input_gives_clear_errors() -> None:
    with pytest.raises(ValueError, match="user 7 has no training ratings.*eq. 15"):
        M.item_weights(np.array([], dtype=np.int64), 5, M.MVMFConfig(), 1, 7)
    attrs = {"age": np.array([30, 99]), "gender": np.array(["F", "M"]),
             "occupation": np.array(["artist", "writer"]), "zip": np.array(["12345", "T8H1N"])}
    with pytest.raises(ValueError, match="'age' of local user row 1 is outside"):
        M.attribute_matrix(attrs, "ml-100k", who="node 3")
    with pytest.raises(ValueError, match="'occupation' of local user row 0"):
        M.attribute_matrix({**attrs, "age": np.array([30, 40]),
                            "occupation": np.array(["pilot", "writer"])}, "ml-100k")
    with pytest.raises(ValueError, match="'cluster' of local user row 0 is outside 0..3"):
        M.attribute_matrix({"cluster": np.array([4, 0])}, "synthetic", 4)
    with pytest.raises(ValueError, match="column 2 of local user row 1 is outside"):
        M.check_attributes(np.array([[0, 1, 0], [1, 0, 3.0]]))
    with pytest.raises(ValueError, match="item-feature row is missing"):
        M.check_item_features(np.ones((4, 2)), 5)
    Y = np.ones((5, 2))
    Y[3, 1] = np.nan
    with pytest.raises(ValueError, match="row of item 3 is missing"):
        M.check_item_features(Y, 5)
    assert "99" not in str(pytest.raises(ValueError, M.attribute_matrix, attrs, "ml-100k").value)


def test_ml100k_attribute_schema() -> None:
    attrs = {"age": np.array([7, 73, 40]), "gender": np.array(["F", "M", "M"]),
             "occupation": np.array(["administrator", "writer", "none"]),
             "zip": np.array(["02139", "T8H1N", "94305"])}
    X = M.attribute_matrix(attrs, "ml-100k")
    assert X.shape == (3, M.attribute_dim("ml-100k")) == (3, 41)
    assert (X.sum(axis=1) == 4).all()  # one dummy per attribute
    assert X[0, 0] == 1 and X[1, 6] == 1  # youngest and oldest age groups
    assert X[1, 7 + 2 + 21 + 10] == 1  # a non-numeric ZIP is region "other"


def test_implicit_data_is_refused() -> None:
    from fedrec.config import ConfigError
    from fl_app.registry import load_strategy_class, resolve_config

    cls = load_strategy_class("fedmvmf")
    with pytest.raises(ConfigError, match="explicit ratings: set implicit = false"):
        cls(resolve_config({"protocol": "fedmvmf"}))


# -- 2. the protocols -------------------------------------------------------------------------
def _run(protocol: str, aggregator: str, extra: dict | None = None, record_replies=None):
    from fl_app.client_app import build_client_app
    from fl_app.registry import resolve_config
    from fl_app.server_app import run_protocol
    from tests.localgrid import LocalGrid

    cfg = resolve_config({**BASE, **(extra or {}), "protocol": protocol,
                          "aggregator": aggregator, "run-name": f"test-{protocol}"})
    with LocalGrid(build_client_app(policy=PLAIN_CKKS), NODES) as grid:
        if record_replies is not None:
            process = grid._process

            def recording(msg):
                reply = process(msg)
                record_replies.append((msg.metadata.message_type, msg.metadata.dst_node_id,
                                       reply))
                return reply

            grid._process = recording
        record = run_protocol(grid, cfg)
        states = {n: c.state for n, c in grid.contexts.items()}
    return cfg, record, states


@pytest.fixture(scope="module")
def data():
    return load_dataset(DatasetSpec.from_config(BASE))


@pytest.fixture(scope="module")
def fed_plain():
    return _run("fedmvmf", "plain")


@pytest.fixture(scope="module")
def priv():
    replies: list = []
    cfg, record, states = _run("privmvmf", "ckks", record_replies=replies)
    return cfg, record, states, replies


def _groups(data, cfg):
    """The user sets of the federation's user nodes, in partition order."""
    from datasets import PartitionSpec, partition_users

    return partition_users(data, PartitionSpec.from_config(cfg, NODES - 1))


def _top10(data, strategy, Q, U, model_cfg, factors=None):
    X = strategy.attributes(data)
    P = M.user_factors_for_scoring(data.train, X, np.arange(data.n_users), Q, U, model_cfg,
                                   strategy.epochs, factors)
    scores = P @ Q.T
    scores[data.train.nonzero()] = -np.inf
    return np.argsort(-scores, axis=1, kind="stable")[:, :10]


def test_fedmvmf_equals_the_centralized_reference(fed_plain, data) -> None:
    from strategies.mvmf import FedMVMF

    cfg, record, _ = fed_plain
    strategy = FedMVMF(cfg)
    ref = strategy.reference_model(data, _groups(data, cfg))
    # Same float64 terms summed in the same order (per node, then nodes in partition order);
    # only the server's Adam runs on one side: agreement to rounding (1e-12 relative).
    np.testing.assert_allclose(record["extra"]["Q"], ref.Q, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(record["extra"]["U"], ref.U, rtol=1e-12, atol=1e-14)
    assert [h["loss"] for h in record["history"]] == pytest.approx(ref.losses, rel=1e-12)
    central = strategy.budget_metrics(data)
    for key in ("ndcg@10", "precision@10", "recall@10", "f1@10", "precision@10-all",
                "recall@10-all"):
        assert record["metrics"][key] == pytest.approx(central[key], abs=1e-9), key
    # cold items from eq. 17 on the item server; cold users evaluated with eq. 15
    np.testing.assert_array_equal(record["extra"]["cold_items"], data.cold_items)
    assert len(data.cold_users) and record["metrics"]["evaluated-users"] > len(data.cold_users)
    assert record["history"][-1]["loss"] < record["history"][0]["loss"]
    assert all(s["form"] == "plain" for s in record["privacy"]["sums"])


def test_privmvmf_equals_fedmvmf_and_gives_the_same_top10(fed_plain, priv, data) -> None:
    from strategies.mvmf import FedMVMF

    cfg, fed, _ = fed_plain
    _, pr, _, _ = priv
    for name in ("Q", "U"):
        a, b = fed["extra"][name], pr["extra"][name]
        # "within 1e-5 relative": Frobenius norm of the difference over the norm
        assert np.linalg.norm(a - b) / np.linalg.norm(a) < 1e-5, name
    strategy = FedMVMF(cfg)
    tops = [_top10(data, strategy, r["extra"]["Q"], r["extra"]["U"], strategy.model)
            for r in (fed, pr)]
    np.testing.assert_array_equal(*tops)
    for key in ("ndcg@10", "precision@10", "recall@10"):
        assert pr["metrics"][key] == pytest.approx(fed["metrics"][key], abs=1e-6)
    assert {s["form"] for s in pr["privacy"]["sums"]} == {"encrypted"}
    assert pr["privacy"]["user-sums"] == "ckks"


def test_the_privmvmf_server_sees_no_per_user_gradient_and_no_secret_key(priv) -> None:
    from fedrec.wire.sums import VALUES_KEY

    _, record, states, replies = priv
    secrets = [bytes(s.config_records[k]["secret"]) for s in states.values()
               for k in s.config_records if k.startswith("secret.")]
    assert len(secrets) == NODES - 1  # user nodes only; the item server holds no key
    seen_plain_values = []
    for mtype, node, reply in replies:
        content = reply.content
        for rec in content.config_records.values():
            for value in rec.values():
                blobs = value if isinstance(value, list) else [value]
                assert not any(isinstance(b, bytes) and b in secrets for b in blobs)
        if mtype == "query.mvmf_train":
            assert VALUES_KEY not in content.array_records  # ciphertexts only
            assert not content.array_records
        if VALUES_KEY in content.array_records:
            seen_plain_values.append(mtype)
    # the only plaintext sums the server receives are the decrypter's totals
    assert set(seen_plain_values) == {"query.aggregate_decrypt"}
    received = record["privacy"]["received"]["train"]["records"]
    assert received["secagg.cipher"]["form"] == "encrypted"


def test_a_decrypter_refuses_a_single_nodes_or_a_relabelled_ciphertext() -> None:
    from fedrec.transport.aggregators import CkksAggregator
    from fedrec.transport.messenger import Messenger, NodeError
    from fl_app.client_app import build_client_app
    from tests.localgrid import LocalGrid
    from tests.simutil import DIAGNOSTIC_APP, diag_request

    with LocalGrid(build_client_app(**DIAGNOSTIC_APP), 4) as grid:
        messenger = Messenger(grid, timeout=60)
        nodes = messenger.node_ids()
        ckks = CkksAggregator(messenger, nodes, seed=0)
        ckks.setup()
        others = [n for n in nodes if n != ckks.decrypter]

        def attempt(tamper):
            chunks, layout = ckks.sum_encrypted("diag_secure_sum", diag_request(3, {"v": (5,)}),
                                                max_abs=10.0)
            tamper(ckks.contributions[ckks.sum_id])
            with pytest.raises(NodeError, match=f"refuses to decrypt sum {ckks.sum_id}") as err:
                ckks.decrypt(chunks, layout, phase="attack")
            return str(err.value)

        def single(c):  # the server asks for one node's ciphertext alone
            keep = others[0]
            for n in list(c):
                if n != keep:
                    del c[n]

        assert "fewer than its policy's min-survivors=3" in attempt(single)

        def relabel(c):  # one node's ciphertext under every node's id
            for n in others[1:]:
                c[n] = (c[others[0]][0], c[n][1])

        assert "not the ones it signed" in attempt(relabel)

        def forge(c):  # the server signs for a node itself
            c[others[0]] = (c[others[0]][0], c[others[1]][1])

        assert "refuses to decrypt" in attempt(forge)
        # an honest request still decrypts
        chunks, layout = ckks.sum_encrypted("diag_secure_sum", diag_request(3, {"v": (5,)}),
                                            max_abs=10.0)
        assert ckks.decrypt(chunks, layout, phase="ok")["v"].shape == (5,)


def test_sgd_path_equals_the_reference(data) -> None:
    from strategies.mvmf import FedMVMF

    cfg, record, _ = _run("fedmvmf", "plain", {"mvmf-p-update": "sgd", "rounds": 3,
                                               "mvmf-weighting": "obsonly"})
    strategy = FedMVMF(cfg)
    ref = strategy.reference_model(data, _groups(data, cfg))
    np.testing.assert_allclose(record["extra"]["Q"], ref.Q, rtol=1e-12, atol=1e-14)
    assert record["metrics"]["ndcg@10"] == pytest.approx(strategy.budget_metrics(data)["ndcg@10"],
                                                         abs=1e-9)


def test_privmvmf_in_a_flower_simulation() -> None:
    """One small real-simulation run (Ray backend): 3 user nodes + the item server."""
    from fl_app.simulation import run_in_simulation

    record = run_in_simulation({**BASE, "protocol": "privmvmf", "rounds": 2,
                                "run-name": "test-privmvmf-sim"}, num_nodes=4, quiet=True,
                               node_policy={"allow-ckks": True})
    assert record["num_nodes"] == 4
    assert record["metrics"]["ndcg@10"] > 0
    assert {s["form"] for s in record["privacy"]["sums"]} == {"encrypted"}
    assert set(record["communication"]["phases"]) >= {"item-server", "train", "train:decrypt"}


def test_ml1m_users_become_dummy_attributes_and_bad_values_are_named() -> None:
    """PrivMVMF on ML-1M: users.dat's age code, gender, occupation and zip region as dummies
    (7 + 2 + 21 + 11 columns), one per group per user; an unknown code names the attribute
    and the local row, never the value."""
    from fedrec.recsys.multiview import attribute_dim, attribute_matrix

    attrs = {"age": np.array([1, 56, 25]), "gender": np.array(["F", "M", "M"]),
             "occupation": np.array(["other", "writer", "scientist"]),
             "zip": np.array(["48067", "55455", "T8N 2P1"])}
    X = attribute_matrix(attrs, "ml-1m")
    assert X.shape == (3, attribute_dim("ml-1m")) == (3, 41)
    np.testing.assert_array_equal(X.sum(axis=1), [4, 4, 4])  # one dummy per group
    assert X[0, 0] == 1 and X[1, 6] == 1  # age codes 1 and 56: first and last group
    assert X[2, -1] == 1  # a zip that does not start with a digit: the 'other' region
    with pytest.raises(ValueError, match="attribute 'age' of local user row 1"):
        attribute_matrix({**attrs, "age": np.array([1, 30, 25])}, "ml-1m")
    with pytest.raises(ValueError, match="attribute 'occupation' of local user row 2"):
        attribute_matrix({**attrs, "occupation": np.array(["writer", "writer", "pilot"])},
                         "ml-1m")


# -- the centralized ceiling ------------------------------------------------------------------
class _NoTest:
    """``data`` whose test split cannot be read: the ceiling's tuning must not touch it."""

    def __init__(self, data) -> None:
        self._data = data

    def __getattr__(self, name: str):
        if name == "test":
            raise AssertionError("the ceiling's tuning read the test split")
        return getattr(self._data, name)


def _ceiling_strategy(**over):
    from fl_app.registry import resolve_config
    from strategies.mvmf import FedMVMF

    cfg = resolve_config({**BASE, "protocol": "fedmvmf", "rounds": 4, **over})
    return FedMVMF(cfg)


def test_mvmf_ceiling_is_tuned_on_validation_without_the_test_split(data) -> None:
    """Epochs, lr and lambdas come from a validation split of train (the test split is never
    read); the run's own setting is a candidate, so the ceiling is at least as good there;
    the reference reports what it chose in the keys the leaderboard reads."""
    strategy = _ceiling_strategy()
    run = strategy.model
    tuned = strategy.tune(_NoTest(data))
    own = f"{run.lr:.6g},{run.lam1:.6g},{run.lam2:.6g}"
    assert own in tuned.tried
    assert tuned.valid == max(tuned.tried.values()) >= tuned.tried[own]
    assert len(tuned.tried) >= len(M.CEILING_GRID) + len(M.CEILING_REFINE)
    assert tuned.cfg.dim == run.dim and tuned.cfg.weighting == run.weighting
    assert tuned.epochs % M.EPOCHS_PER_CHECK == 0
    assert 1 <= tuned.epochs <= M.MAX_EPOCH_FACTOR * strategy.epochs
    ref = strategy.reference(data)
    for key in ("ndcg@10", "precision@10-all", "train-loss", "tuned-rounds", "tuned-lr",
                "tuned-lam1", "tuned-lam2", "tuned-valid", "tuned-candidates",
                "tuned-at-edge"):
        assert key in ref, key
    assert ref["tuned-valid"] == pytest.approx(tuned.valid)


def test_mvmf_early_stopping_picks_the_curves_argmax(data) -> None:
    """The chosen epochs are the validation curve's argmax (x the epochs per check); the
    selection run stops ``patience`` checks after it; the retrained model is the same model
    trained on all of train for that many epochs."""
    from fedrec.recsys.mf import fit_early_stopped, validation_split

    strategy = _ceiling_strategy()
    X = strategy.attributes(data)

    def make() -> M.RatingMVMF:
        return M.RatingMVMF(strategy.model, X, data.item_features, data.cold_items, 10, 4.0, 2)

    out = fit_early_stopped(make, data.train, 15, patience=2, seed=1,
                            metric=M.RatingMVMF.validation_ndcg)
    best = int(np.argmax(out.curve)) + 1
    assert out.rounds == best
    assert len(out.curve) == min(15, best + 2)
    fit, valid = validation_split(data.train, seed=1)
    check = make().fit(fit, best)
    assert M.RatingMVMF.validation_ndcg(check, fit, valid) == pytest.approx(max(out.curve),
                                                                            abs=1e-12)
    again = M.MVMF(strategy.model).fit(data.train, X, data.item_features, 2 * best)
    assert out.model is not None and out.model.model is not None
    np.testing.assert_array_equal(again.Q, out.model.model.Q)


def test_mvmf_ceiling_grid_without_its_best_setting_scores_lower(data) -> None:
    """The grid matters (a test that can fail): leaving out the setting the full grid
    chooses gives a lower validation score."""
    strategy = _ceiling_strategy()
    run, X = strategy.model, strategy.attributes(data)
    grid = ((1.0, 1.0, 1.0), (1.0, 1.0, 1 / 30), (1.0, 1.0, 30.0))

    def tune(mults):
        return M.tune_ceiling(run, X, data.item_features, data.cold_items, data.train,
                              strategy.epochs, 10, 4.0, grid=mults, refine=(), seed=1)

    full = tune(grid)
    chosen = (full.cfg.lr / run.lr, full.cfg.lam1 / run.lam1, full.cfg.lam2 / run.lam2)
    rest = tuple(g for g in grid if not np.allclose(g, chosen))
    assert len(rest) == len(grid) - 1
    assert tune(rest).valid < full.valid


def test_mvmf_ceiling_steps_past_a_grid_edge_its_best_sits_on(data) -> None:
    """With two lambda2 values the first best is an edge of what was tried, so the walk
    tries one step (x 3 or / 3) past it; a walk of zero passes does not."""
    strategy = _ceiling_strategy()
    run, X = strategy.model, strategy.attributes(data)

    def tune(passes: int):
        return M.tune_ceiling(run, X, data.item_features, data.cold_items, data.train,
                              strategy.epochs, 10, 4.0, grid=((1.0, 1.0, 1.0), (1.0, 1.0, 3.0)),
                              refine=(), passes=passes, seed=1)

    def lam2s(tuned) -> set[float]:
        return {round(float(label.split(",")[2]) / run.lam2, 6) for label in tuned.tried}

    flat = tune(0)
    assert lam2s(flat) == {1.0, 3.0} and flat.at_edge
    first = flat.cfg.lam2 / run.lam2
    walked = tune(1)
    assert round(first * (3.0 if np.isclose(first, 3.0) else 1 / 3), 6) in lam2s(walked)
    assert walked.valid >= flat.valid
