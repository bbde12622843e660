"""PriviRec / PriviRec-k against the centralized reference, on the in-process grid (the
ServerApp and ClientApp code and Flower messages without Ray's start-up). PriviRec with
SecAgg+ on a real Flower simulation (Ray) is the main job, tests/test_main_job.py."""

from __future__ import annotations

from functools import partial

import numpy as np
import pytest

from clients.privirec import omega_rows
from datasets import DatasetSpec, load_dataset
from fedrec.recsys.graph_filters import make_filter, score_all
from fedrec.recsys.linalg import (
    item_item_matrix,
    normalize_interactions,
    randomized_power_iteration,
    top_eigvecs_exact,
)
from fedrec.recsys.metrics import ranking_sums
from fl_app.registry import resolve_config
from strategies.privirec import PriviRec
from tests.simutil import run_in_process as _run_in_process

#: These runs ask for seeded Omega (comparisons with the reference), plain sums and sparse
#: transport: the simulated nodes' operator opts in explicitly (the default policy refuses).
OPT_IN = {"allow-plain": True, "allow-seeded-omega": True, "allow-sparse-transport": True}
run_in_process = partial(_run_in_process, node_policy=OPT_IN)

# Density 0.15 (6 items per user), because the comparisons below need two properties of
# the data that the clustered synthetic generator does not give at 90 x 40 with density 0.05
# (2 items per user): (1) an eigengap of P~ at k = 6 and 8 -- at 0.05 the interaction graph
# has 20 connected components, each adds an eigenvalue 1, so the top-k eigenspace is not
# unique; (2) no two equal non-zero scores at the top-20 cut-off -- the secure path's
# fixed-point rounding breaks such ties differently than the centralized path and NDCG moves
# by ~1e-2 (at density 0.1, 8 users have such ties under Turbo-CF). At 0.15 the graph is
# connected but for one unrated item, the gaps are 0.024 / 0.020 and no user has such a tie.
BASE = {"dataset": "synthetic", "synthetic-users": 90, "synthetic-items": 40, "seed": 2,
        "synthetic-density": 0.15, "partition": "shards-random", "privirec-omega": "seeded",
        "privirec-L": 3}


def _binary_train(cfg: dict):
    train = load_dataset(DatasetSpec.from_config(cfg)).train.copy()
    train.data[:] = 1.0
    return train


def _projector(S: np.ndarray) -> np.ndarray:
    return S @ S.T


@pytest.fixture(scope="module")
def secure_run() -> dict:
    cfg = {**BASE, "protocol": "privirec", "aggregator": "secagg+", "privirec-rank": 12,
           "privirec-filter-rank": 8, "privirec-ritz": "true",
           "privirec-filters": "gf-cf,bspm-em,turbo-cf", "run-name": "test-privirec"}
    return run_in_process(cfg, num_nodes=5, quiet=True) | {"cfg": cfg}


def test_secure_P_and_degrees_equal_centralized(secure_run: dict) -> None:
    R = _binary_train(secure_run["cfg"])
    R_tilde, _, item_deg = normalize_interactions(R, 0.5)
    extra = secure_run["extra"]
    np.testing.assert_allclose(extra["item_deg"], item_deg, atol=1e-6)
    P_ref = item_item_matrix(R_tilde).toarray()
    np.testing.assert_allclose(extra["P"][0.5].toarray(), P_ref, atol=1e-6)


def test_power_method_and_scores_equal_centralized(secure_run: dict) -> None:
    cfg = secure_run["cfg"]
    R = _binary_train(cfg)
    R_tilde, _, item_deg = normalize_interactions(R, 0.5)
    omega = omega_rows(np.arange(R.shape[0]), 12, "seeded", cfg["seed"])
    P = item_item_matrix(R_tilde)
    S_ref, vals_ref = randomized_power_iteration(lambda X: P @ X, R.shape[1], 12, 12,
                                                 L=cfg["privirec-L"] - 1,
                                                 start=np.asarray(R_tilde.T @ omega), ritz=True)
    S = secure_run["extra"]["S"]
    np.testing.assert_allclose(_projector(S[:, :8]), _projector(S_ref[:, :8]), atol=1e-6)
    data = load_dataset(DatasetSpec.from_config(cfg))
    for name in ("gf-cf", "bspm-em"):
        flt = make_filter(name, cfg["dataset"], 8).fit(item_deg, P, S_ref, vals_ref)
        want = ranking_sums(score_all(flt, R), R, data.test, k=20).means()
        got = secure_run["metrics"]
        assert got[f"{name}/ndcg@20"] == pytest.approx(want["ndcg@20"], abs=1e-6), name
        assert got[f"{name}/recall@20"] == pytest.approx(want["recall@20"], abs=1e-6), name


def test_turbo_cf_is_identical(secure_run: dict) -> None:
    cfg = secure_run["cfg"]
    R = _binary_train(cfg)
    data = load_dataset(DatasetSpec.from_config(cfg))
    flt = make_filter("turbo-cf", cfg["dataset"])
    R_tilde, _, item_deg = normalize_interactions(R, flt.alpha)
    flt.fit(item_deg, item_item_matrix(R_tilde))
    want = ranking_sums(score_all(flt, R), R, data.test, k=20).means()
    assert secure_run["metrics"]["turbo-cf/ndcg@20"] == pytest.approx(want["ndcg@20"], abs=1e-6)


def test_full_rank_iteration_gives_exact_truncated_projector() -> None:
    cfg = {**BASE, "protocol": "privirec", "aggregator": "plain", "privirec-rank": 40,
           "privirec-filter-rank": 6, "privirec-ritz": "true", "privirec-filters": "gf-cf",
           "run-name": "test-privirec-full"}
    record = run_in_process(cfg, num_nodes=3, quiet=True)
    R_tilde, _, _ = normalize_interactions(_binary_train(cfg), 0.5)
    vecs, _ = top_eigvecs_exact(item_item_matrix(R_tilde), 6)
    S = record["extra"]["S"][:, :6]
    np.testing.assert_allclose(_projector(S), _projector(vecs), atol=1e-6)


def test_auto_ritz_turns_on_when_the_iteration_rank_oversamples() -> None:
    """An iteration rank above the filters' rank helps only through Rayleigh-Ritz (the leading
    QR columns of the p-block are no better than p = r; ML-1M: docs/protocols/privirec.md), so
    ``auto`` runs it: the full-rank iteration then gives the exact top-6 projector."""
    cfg = {**BASE, "protocol": "privirec", "aggregator": "plain", "privirec-rank": 40,
           "privirec-filter-rank": 6, "privirec-ritz": "auto", "privirec-filters": "gf-cf",
           "run-name": "test-privirec-auto-ritz"}
    record = run_in_process(cfg, num_nodes=3, quiet=True)
    R_tilde, _, _ = normalize_interactions(_binary_train(cfg), 0.5)
    vecs, _ = top_eigvecs_exact(item_item_matrix(R_tilde), 6)
    np.testing.assert_allclose(_projector(record["extra"]["S"][:, :6]), _projector(vecs),
                               atol=1e-6)
    same = PriviRec(resolve_config({**cfg, "privirec-rank": 0}))
    assert not same._use_ritz()  # p = the filters' one rank: nothing to pick from


def test_privirec_k_runs_and_rejects_bad_rank() -> None:
    cfg = {**BASE, "protocol": "privirec-k", "aggregator": "plain", "privirec-k": 20,
           "privirec-filter-rank": 6, "privirec-filters": "gf-cf", "run-name": "test-pk"}
    record = run_in_process(cfg, num_nodes=3, quiet=True)
    assert 0.0 < record["metrics"]["gf-cf/ndcg@20"] <= 1.0
    assert record["extra"]["P"] == {}
    with pytest.raises(Exception, match="larger than the number of items"):
        run_in_process({**cfg, "privirec-k": 500}, num_nodes=3, quiet=True)


def test_cold_items_and_users_without_training_rows_are_handled() -> None:
    """Items no user touched in training and users with no training items: the run completes,
    zero-degree items get zero scores instead of a division by zero."""
    cfg = {**BASE, "protocol": "privirec", "aggregator": "plain", "privirec-rank": 10,
           "privirec-filter-rank": 6, "privirec-filters": "gf-cf,turbo-cf",
           "cold-start-items": 0.1, "cold-start-users": 0.1, "run-name": "test-privirec-cold"}
    data = load_dataset(DatasetSpec.from_config(cfg))
    assert len(data.cold_items) > 0 and len(data.cold_users) > 0
    assert (np.asarray(data.train.sum(axis=0)).ravel() == 0).any()
    record = run_in_process(cfg, num_nodes=3, quiet=True)
    for name in ("gf-cf", "turbo-cf"):
        assert np.isfinite(record["metrics"][f"{name}/ndcg@20"])
    assert np.all(np.isfinite(record["extra"]["S"]))


def test_float32_wire_halves_bytes_and_keeps_results() -> None:
    """privirec-wire-dtype = float32: the |I| x k matrices travel in float32 (about half the
    bytes), the subspace and metrics stay those of the float64 run; SecAgg+ refuses it.

    Omega is seeded and plain sums run in node order, so each run is deterministic: two
    float64 runs agree bit for bit, and float32 differs from float64 only by its rounding.
    """
    cfg = {**BASE, "protocol": "privirec-k", "aggregator": "plain", "privirec-k": 24,
           "privirec-omega": "seeded", "privirec-filter-rank": 6,
           "privirec-filters": "gf-cf,bspm-em", "run-name": "test-pk64"}
    r64 = run_in_process(cfg, num_nodes=3, quiet=True)
    again = run_in_process({**cfg, "run-name": "test-pk64-again"}, num_nodes=3, quiet=True)
    assert np.array_equal(again["extra"]["S"], r64["extra"]["S"])
    assert again["metrics"] == r64["metrics"]
    r32 = run_in_process({**cfg, "privirec-wire-dtype": "float32", "run-name": "test-pk32"},
                            num_nodes=3, quiet=True)
    np.testing.assert_allclose(_projector(r32["extra"]["S"][:, :6]),
                               _projector(r64["extra"]["S"][:, :6]), atol=1e-4)
    for name in ("gf-cf", "bspm-em"):
        assert r32["metrics"][f"{name}/ndcg@20"] == pytest.approx(
            r64["metrics"][f"{name}/ndcg@20"], abs=2e-3)
    up32 = r32["communication"]["bytes_per_node"]["mean_up"]
    up64 = r64["communication"]["bytes_per_node"]["mean_up"]
    assert up32 < 0.7 * up64, (up32, up64)
    with pytest.raises(Exception, match="float32 needs aggregator"):
        run_in_process({**cfg, "aggregator": "secagg+", "privirec-wire-dtype": "float32"},
                          num_nodes=3, quiet=True)


def test_float32_scoring_keeps_metrics_and_is_checked() -> None:
    """privirec-score-dtype = float32: the nodes apply P~ in float32 (the blocked kernel), the
    metrics stay those of float64 scoring to float32's rounding (~1e-6 relative on the
    scores, so only near-ties could reorder), any aggregator accepts it (nothing it computes
    travels), and an unknown precision is refused before any message."""
    cfg = {**BASE, "protocol": "privirec", "aggregator": "plain", "privirec-filter-rank": 6,
           "privirec-filters": "bspm-em,turbo-cf", "run-name": "test-score64"}
    policy = {"allow-plain": True, "allow-seeded-omega": True, "allow-sparse-transport": True}
    r64 = run_in_process(cfg, num_nodes=3, quiet=True, node_policy=policy)
    r32 = run_in_process({**cfg, "privirec-score-dtype": "float32", "run-name": "test-score32"},
                         num_nodes=3, quiet=True, node_policy=policy)
    for name in ("bspm-em", "turbo-cf"):
        for metric in ("ndcg@20", "recall@20"):
            key = f"{name}/{metric}"
            assert r32["metrics"][key] == pytest.approx(r64["metrics"][key], abs=1e-3), key
    assert r32["communication"]["total_rounds"] == r64["communication"]["total_rounds"]
    with pytest.raises(Exception, match="privirec-score-dtype.: expected one of float64"):
        run_in_process({**cfg, "privirec-score-dtype": "float16"}, num_nodes=3, quiet=True,
                       node_policy=policy)


def test_table1_terms_with_the_papers_parameters_give_its_gowalla_figures() -> None:
    """Section 3.6's Gowalla figures (1,679M / 246M / 4,534M floats per client) come from
    PAPER_TABLE1 and Gowalla's catalogue; a report written before |I| and n were stored
    recovers them exactly from the terms it kept (computed then with k2 = p)."""
    from benchmarks.privirec import with_table1
    from strategies.privirec import PAPER_TABLE1, paper_float_counts

    paper = paper_float_counts(40981, n_users=29858, **PAPER_TABLE1)
    assert [round(v / 1e6) for v in paper.values()] == [1679, 246, 4534]
    old = {"L": 3, "paper_floats_per_client": paper_float_counts(40981, 3, k2=448,
                                                                  n_users=29858)}
    res = with_table1(old)
    assert (res["n_items"], res["n_users"], res["rank"]) == (40981, 29858, 448)
    assert res["paper_floats_per_client"] == paper
    assert res["floats_per_client_this_run"]["privirec-k"] == 3 * 448 * 40981


def test_the_l_sweep_verdicts_follow_the_numbers() -> None:
    """benchmarks/privirec_l_sweep.py decides 'L = 2 reaches Table 3' from each setting's mean
    over Omega seeds at the best p; a change of one number flips it."""
    from benchmarks.privirec_l_sweep import FILTERS, PAPER_TABLE3, TOLERANCE, markdown

    def row(L: int, p: int, seed: int, v: float) -> dict:
        return {"dataset": "gowalla", "setting": f"{L}:{p}", "L": L, "p": p, "p_over_r": 1.0,
                "seed": seed, "filters": {n: {"ndcg20": v, "projector_dist_rel": 0.5}
                                          for n in FILTERS}}

    exact = {"dataset": "gowalla", "setting": "exact", "L": None, "p": 448, "seed": None,
             "popularity_ndcg20": 0.03,
             "filters": {n: {"ndcg20": 0.16, "projector_dist_rel": 0.0} for n in FILTERS}}
    res = {"command": "x", "tolerance": TOLERANCE, "paper_table3": PAPER_TABLE3,
           "machine": {}, "rows": [exact, row(2, 448, 0, 0.1590), row(2, 448, 1, 0.1600),
                                   row(3, 448, 0, 0.1597)]}
    text = markdown(res)
    assert "- gf-cf: best at L = 2 0.1595 (p = 448)" in text  # the mean of the two seeds
    assert "gf-cf: best at L = 2 0.1595 (p = 448), Table 3's Priv. 0.1528: reaches it" in text
    res["rows"][1]["filters"]["gf-cf"]["ndcg20"] = res["rows"][2]["filters"]["gf-cf"][
        "ndcg20"] = 0.1500
    assert "Table 3's Priv. 0.1528: does not reach it" in markdown(res)
