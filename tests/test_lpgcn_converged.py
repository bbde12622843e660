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


def _own_split(folder, users: int = 40, items: int = 30) -> None:
    """A seeded split in LightGCN list format (``user item ...``): 8 training and 2 test
    items per user, every item trained."""
    import numpy as np

    rng = np.random.default_rng(0)
    folder.mkdir(parents=True)
    train, test = [], []
    for u in range(users):  # user u trains item u % items, so every item is trained
        others = rng.permutation([i for i in range(items) if i != u % items])
        train.append(f"{u} {' '.join(map(str, sorted([u % items, *others[:7]])))}\n")
        test.append(f"{u} {' '.join(map(str, sorted(others[7:9])))}\n")
    (folder / "train.txt").write_text("".join(train))
    (folder / "test.txt").write_text("".join(test))


def _in_process_simulation(calls: list):
    """``run_in_simulation`` on the in-process grid (no Ray): the same ClientApp, ServerApp
    and comparison with the centralized reference."""
    def run(cfg, num_nodes, *, quiet=True, compare=False, **_):
        from fl_app.client_app import build_client_app
        from fl_app.registry import resolve_config
        from fl_app.server_app import build_strategy, run_protocol
        from fl_app.simulation import compare_with_references
        from tests.localgrid import LocalGrid

        calls.append(dict(cfg))
        cfg = resolve_config(cfg)
        with LocalGrid(build_client_app(policy={}), num_nodes, data=cfg) as grid:
            record = run_protocol(grid, cfg)
        if compare:
            record["comparison"] = compare_with_references(cfg, build_strategy(cfg), record)
        return record

    return run


def test_the_converged_cell_runs_on_a_users_own_split(tmp_path, monkeypatch):
    """``--datasets NAME --data-dir DIR``: the three units run on the folder's split, the
    federated check equals the centralized model, the cell goes into the split's own board,
    and a rerun takes the stored units (nothing is trained or simulated again)."""
    import json

    import benchmarks.lpgcn_converged as conv
    import fl_app.simulation

    _own_split(tmp_path / "data" / "my-split")
    calls: list = []
    monkeypatch.setattr(fl_app.simulation, "run_in_simulation", _in_process_simulation(calls))
    monkeypatch.setattr(conv, "board_plot", lambda result, path: None)
    files = {"--out": tmp_path / "units.json", "--board": tmp_path / "board.json",
             "--checkpoint-dir": tmp_path / "ckpt"}
    argv = ["--datasets", "my-split", "--data-dir", str(tmp_path / "data")]
    argv += [str(x) for kv in files.items() for x in kv]
    conv.main(argv)
    assert len(calls) == 1 and calls[0]["data-dir"] == str(tmp_path / "data")
    units = json.loads(files["--out"].read_text())
    assert units["config"]["data_dir"] == str(tmp_path / "data")
    assert units["config"]["datasets"] == ["my-split"]
    fed = units["units"]["my-split/federated"]
    assert fed["max_abs_metric_diff"] < 1e-10
    cell = json.loads(files["--board"].read_text())["cells"]["my-split/lpgcn"]
    chosen = units["units"]["my-split/select"]["epochs"]
    assert cell["config"]["lpgcn-epochs"] == chosen >= 5
    assert cell["federated"] == units["units"]["my-split/final"]["metrics"]
    assert "--data-dir" in files["--out"].with_suffix(".md").read_text()
    conv.main(argv)  # resumes: every unit stored
    assert len(calls) == 1


def test_a_users_split_never_writes_the_shipped_results(tmp_path):
    from benchmarks._board import BOARDS
    from benchmarks._board import OUT as SHIPPED_BOARD
    from benchmarks.lpgcn_converged import OUT, places
    from benchmarks.lpgcn_table4 import CHECKPOINTS

    assert places(["ml-100k", "ml-1m"]) == (SHIPPED_BOARD, OUT, CHECKPOINTS, True)
    board, units, ckpt, shipped = places(["my-split"], str(tmp_path))
    assert not shipped and board.parent == units.parent == ckpt.parent == BOARDS / "my-split"
    assert places(["ml-100k"], str(tmp_path))[3] is False  # a folder's split of that name


def test_a_missing_split_stops_before_any_unit(tmp_path, monkeypatch):
    import benchmarks.lpgcn_converged as conv

    (tmp_path / "data").mkdir()
    monkeypatch.setattr(conv, "run", lambda *a, **k: pytest.fail("a unit ran"))
    with pytest.raises(SystemExit, match="--datasets no-such-split"):
        conv.main(["--datasets", "no-such-split", "--data-dir", str(tmp_path / "data"),
                   "--out", str(tmp_path / "u.json"), "--board", str(tmp_path / "b.json")])
