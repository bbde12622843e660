"""The converged LP-GCN leaderboard cell (benchmarks/lpgcn_converged.py): its rounds and bytes
are the federated check's setup plus the chosen epochs x its measured per-epoch cost, and
its metrics are the converged model's, with a note saying how it was run."""

from __future__ import annotations

import pytest

from benchmarks.lpgcn_converged import leaderboard_cell, per_epoch


def _phase(rounds: int, down: int, up: int) -> dict:
    return {"rounds": rounds, "seconds": 1.0, "bytes_down": down, "bytes_up": up,
            "messages": 1}


def _units(fed_epochs: int) -> dict:
    metrics = {"ndcg@20": 0.4, "recall@20": 0.3, "train-loss": 0.1}
    early = {"ndcg@20": 0.2, "recall@20": 0.1, "train-loss": 0.3}
    # 8 nodes; setup phases 10 rounds and 800 bytes, training 100 rounds and 7,200 bytes
    # per epoch: 100 bytes per node of setup, 900 per epoch
    phases = {"lpgcn-setup": _phase(10, 500, 300),
              "lpgcn-train": _phase(100 * fed_epochs, 4000 * fed_epochs, 3200 * fed_epochs)}
    total = 800 + 7200 * fed_epochs
    return {"select": {"epochs": 40, "valid_ndcg@20": 0.25, "trained_epochs": 90,
                       "stopped": "patience", "seconds": 1.0},
            "final": {"epochs": 40, "metrics": metrics, "popularity": {"ndcg@20": 0.2},
                      "seconds": 2.0},
            "federated": {"epochs": fed_epochs, "nodes": 8, "federated": early,
                          "centralized": early, "max_abs_metric_diff": 0.0,
                          "rounds": 10 + 100 * fed_epochs, "phases": phases,
                          "bytes_per_node": {"mean_down": total / 16, "mean_up": total / 16},
                          "server_sees": "covered partials", "seconds": {"wall": 3.0}}}


@pytest.mark.parametrize("fed_epochs", [1, 2])
def test_the_cell_is_the_checks_setup_plus_the_chosen_epochs(fed_epochs):
    units = _units(fed_epochs)
    rounds, per_node = per_epoch(units["federated"])
    assert rounds == 100 and per_node == pytest.approx(900)
    cell = leaderboard_cell("ml-100k", {"lpgcn-dim": 20, "lpgcn-epochs": 3}, units)
    assert cell["rounds"] == 10 + 40 * 100
    assert cell["bytes_per_node"] == pytest.approx(100 + 40 * 900)
    assert cell["federated"]["ndcg@20"] == cell["centralized"]["ndcg@20"] == 0.4
    assert cell["centralized"]["tuned-rounds"] == 40
    assert cell["config"]["lpgcn-epochs"] == 40
    assert "40 epochs" in cell["note"] and "validation split" in cell["note"]


def test_the_board_runs_lpgcn_on_movielens_as_the_converged_cell(monkeypatch):
    """``benchmarks/leaderboard.py`` produces the ML-100K and ML-1M LP-GCN cells through the
    converged runner (resuming its units), not as a fixed-budget simulation."""
    from benchmarks import _board as board
    from benchmarks import leaderboard

    monkeypatch.setattr(leaderboard, "converged_cell",
                        lambda ds: {"from": "converged", "ds": ds})
    for ds in ("ml-100k", "ml-1m"):
        (cell,) = board.cells([ds], ["lpgcn"])
        assert leaderboard.run_cell(cell) == {"from": "converged", "ds": ds}


def test_the_centralized_units_train_on_the_device_asked(monkeypatch):
    pytest.importorskip("torch")
    import scipy.sparse as sp

    from benchmarks.lpgcn_table4 import model_builder
    from fedrec.recsys.arrays import is_torch
    from fl_app.registry import resolve_config

    cfg = resolve_config({"protocol": "lpgcn", "lpgcn-dim": 4, "lpgcn-layers": 1})
    train = sp.csr_matrix(sp.eye(6, 5))
    assert not is_torch(model_builder(cfg)(train).V)
    model = model_builder(cfg, "cpu")(train)
    assert is_torch(model.V) and model.device == "cpu" and model.dim == 4
