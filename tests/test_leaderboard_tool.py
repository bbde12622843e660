"""The leaderboard as a tool on a user's data (issue 44): the documented command leaves the
shipped board alone and writes the user's to its own folder, with a Markdown whose plot link
resolves; ``--timeout``, ``--partition`` and ``--nodes`` reach the cells; DP prototypes run on
data without zip codes as stated on the board; every cell that cannot run says why before
any cell starts; a running cell prints its place, elapsed time and phase.

No protocol runs here: the cell runner is replaced by one that returns a board cell."""

from __future__ import annotations

import logging
import re
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import scipy.sparse as sp

from benchmarks import _board as board
from benchmarks import leaderboard as lb

SHIPPED = [board.OUT.with_suffix(s) for s in (".json", ".md", ".png")]


@pytest.fixture(autouse=True)
def _isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Data caches, run records and user boards under tmp_path, never the repository's."""
    monkeypatch.setenv("FEDREC_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("FEDREC_RESULTS", str(tmp_path / "cwd-results"))
    monkeypatch.setattr(board, "BOARDS", tmp_path / "boards")


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    """A user's folder split ``my-data``: 48 users x 30 items, every item trained, no zip
    codes, no features (as tests/test_user_data.py writes one)."""
    rng = np.random.default_rng(0)
    train = (rng.random((48, 30)) < 0.3).astype(float)
    train[0] = 1.0
    test = ((rng.random((48, 30)) < 0.1) & (train == 0)).astype(float)
    folder = tmp_path / "data" / "my-data"
    folder.mkdir(parents=True)
    sp.save_npz(folder / "train.npz", sp.csr_matrix(train))
    sp.save_npz(folder / "test.npz", sp.csr_matrix(test))
    return folder.parent


def fake_cell(cell: board.Cell, result: dict | None = None) -> dict[str, Any]:
    """What run_cell returns for ``cell``, without running it."""
    return {"protocol": cell.protocol, "dataset": cell.dataset, "nodes": cell.nodes,
            "config": cell.config, "node_policy": cell.policy,
            "federated": {"ndcg@20": 0.3, "recall@20": 0.2}, "centralized": {"ndcg@20": 0.31},
            "popularity": {"ndcg@20": 0.1, "recall@20": 0.1}, "rounds": 3,
            "bytes_per_node": 1e6, "server_sees": "masked", "epsilon": None,
            **({"note": cell.note} if cell.note else {})}


def test_the_documented_command_on_a_users_data_leaves_results_unchanged(
        data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    before = {p: p.read_bytes() for p in SHIPPED}
    seen: list[board.Cell] = []
    monkeypatch.setattr(lb, "run_cell", lambda cell, result=None: (seen.append(cell),
                                                                   fake_cell(cell))[1])
    lb.main(["--datasets", "my-data", "--data-dir", str(data_dir)])
    assert {p: p.read_bytes() for p in SHIPPED} == before
    out = board.BOARDS / "my-data" / "leaderboard.json"
    assert out.is_file() and out.with_suffix(".png").is_file()
    text = out.with_suffix(".md").read_text()
    (link,) = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text)
    assert (out.parent / link).is_file()
    assert "results/leaderboard.png" not in text
    assert f"Command: `python benchmarks/leaderboard.py --datasets my-data --data-dir " \
           f"{data_dir} --resume`" in text
    assert seen and {c.dataset for c in seen} == {"my-data"}
    # ... and the default folder itself is the user's, not the shipped board's
    monkeypatch.undo()
    assert board.default_out(["my-data"], str(data_dir)).parent == board.BOARDS / "my-data"
    assert board.default_out(["ml-100k"], str(data_dir)) != board.OUT  # a user's copy
    assert board.default_out(["ml-100k", "ml-1m"]) == board.OUT
    assert board.default_out(["ml-100k"], settings=board.Settings(nodes=4)) != board.OUT


def test_the_board_reruns_cells_and_keeps_the_others(data_dir: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A partial command on an existing board replaces its own cells only; --markdown-only
    keeps the plot link relative to the Markdown."""
    monkeypatch.setattr(lb, "run_cell", fake_cell)
    out = data_dir.parent / "elsewhere" / "board.json"
    args = ["--datasets", "my-data", "--data-dir", str(data_dir), "--out", str(out)]
    lb.main([*args, "--protocols", "fedmf", "privirec"])
    lb.main([*args, "--protocols", "fedmf"])
    assert set(lb.stored_result(out)["cells"]) == {"my-data/fedmf", "my-data/privirec"}
    lb.main([*args, "--markdown-only"])
    assert "![NDCG@20 per protocol, beside centralized and popularity](board.png)" in \
        out.with_suffix(".md").read_text()


def test_timeout_partition_and_nodes_reach_every_cell(data_dir: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[board.Cell] = []
    monkeypatch.setattr(lb, "run_cell", lambda cell, result=None: (seen.append(cell),
                                                                   fake_cell(cell))[1])
    lb.main(["--datasets", "my-data", "--data-dir", str(data_dir), "--protocols", "fedmf",
             "fedpower", "--timeout", "2000", "--partition", "shards-random", "--nodes", "3"])
    assert [c.config["timeout"] for c in seen] == [2000.0, 2000.0]
    assert [c.config["partition"] for c in seen] == ["shards-random"] * 2
    assert [c.nodes for c in seen] == [3, 3]
    text = (board.BOARDS / "my-data" / "leaderboard.md").read_text()
    assert "--timeout 2000 --partition shards-random --nodes 3 --resume" in text
    # the default is the board's own, and a node timeout names the board's option
    assert all(c.config["timeout"] == board.TIMEOUT for c in board.cells(["ml-100k"],
                                                                          board.ORDER))
    from fedrec.transport.messenger import NodeTimeoutError

    why = lb.failure(NodeTimeoutError("evaluate", ["node 1"], 8, 900.0))
    assert why.startswith("NodeTimeoutError: 1 of 8") and why.endswith("--timeout SECONDS.")
    with pytest.raises(SystemExit):
        lb.main(["--datasets", "my-data", "--data-dir", str(data_dir), "--timeout", "0"])


def test_dp_prototypes_without_zip_codes_run_on_the_boards_partition(
        data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without zip codes the silo-zip cell takes the board's partition and nodes, and the
    board says so; with zip codes it has one node per zip region."""
    monkeypatch.setattr(lb, "run_cell", fake_cell)
    lb.main(["--datasets", "my-data", "--data-dir", str(data_dir), "--protocols",
             "dp-prototypes", "--nodes", "4"])
    stored = lb.stored_result(board.BOARDS / "my-data" / "leaderboard.json")
    cell = stored["cells"]["my-data/dp-prototypes"]
    assert cell["config"]["partition"] == "shards-contiguous" and cell["nodes"] == 4
    note = "shards-contiguous on 4 nodes instead of silo-zip: my-data has no user zip codes"
    assert f"- dp-prototypes: {note}." in (board.BOARDS / "my-data" / "leaderboard.md").read_text()
    # on 8 nodes a silo holds 6 users, fewer than dpp-k = 10: refused before any cell
    lb.main(["--datasets", "my-data", "--data-dir", str(data_dir), "--protocols",
             "dp-prototypes"])
    stored = lb.stored_result(board.BOARDS / "my-data" / "leaderboard.json")
    assert "needs at least dpp-k=10 users in every silo: simulated node 0 holds 6" in \
        stored["failed"]["my-data/dp-prototypes"]
    assert "my-data/dp-prototypes" not in stored["cells"]  # the latest attempt only
    (silo,) = board.cells(["my-data"], ["dp-prototypes"])
    zips = SimpleNamespace(user_attributes={"zip": np.array(["12345", "23456", "1", "K1A"])})
    assert board.fit_to_data(silo, zips).nodes == 3  # regions 1, 2 and other


def test_cells_that_cannot_run_say_why_before_any_cell_starts(
        data_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    """MVMF needs user attributes, a silo-zip partition asked for needs zip codes: both are
    named, with the reason, before the first cell starts, and shown on the board."""
    monkeypatch.setattr(lb, "run_cell", lambda cell, result=None: (print("CELL RUNS"),
                                                                   fake_cell(cell))[1])
    lb.main(["--datasets", "my-data", "--data-dir", str(data_dir), "--protocols", "fedmf",
             "fedmvmf"])
    out = capsys.readouterr().out
    refused = out.index("my-data/fedmvmf cannot run on this data: ")
    assert refused < out.index("CELL RUNS") and "user-attributes" in out[refused:]
    failed = lb.stored_result(board.BOARDS / "my-data" / "leaderboard.json")["failed"]
    assert failed["my-data/fedmvmf"].startswith("not run: ValueError: simulated node 0")
    lb.main(["--datasets", "my-data", "--data-dir", str(data_dir), "--protocols", "fedmf",
             "--partition", "silo-zip"])
    assert "my-data/fedmf cannot run on this data: DataError: partition scheme 'silo-zip' " \
           "needs user zip codes" in capsys.readouterr().out


def test_a_running_cell_prints_its_place_elapsed_time_and_phase(
        data_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    monkeypatch.setattr(lb, "PROGRESS_SECONDS", 0.05)
    level = logging.getLogger("fedrec").level

    def slow(cell: board.Cell, result: dict | None = None) -> dict[str, Any]:
        logging.getLogger("fedrec").info("power-iteration 2 round(s) 0.10 s")
        time.sleep(0.3)
        if cell.protocol == "privirec":
            raise RuntimeError("a node fell over")
        return fake_cell(cell)

    monkeypatch.setattr(lb, "run_cell", slow)
    lb.main(["--datasets", "my-data", "--data-dir", str(data_dir), "--protocols", "fedmf",
             "privirec"])
    out = capsys.readouterr().out
    assert "[1/2] my-data/fedmf: 8 nodes, partition default, timeout 900 s per request" in out
    assert re.search(r"\[1/2\] my-data/fedmf: \d+ s elapsed; latest phase: power-iteration 2 "
                     r"round\(s\)", out)
    assert re.search(r"\[1/2\] my-data/fedmf: done after \d+ s", out)
    assert re.search(r"\[2/2\] my-data/privirec: failed after \d+ s", out)
    assert "my-data/privirec failed: RuntimeError: a node fell over" in out
    fedrec = logging.getLogger("fedrec")  # the cell's handler and level are gone
    assert not any(isinstance(h, lb.CellProgress) for h in fedrec.handlers)
    assert fedrec.level == level
