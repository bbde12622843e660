"""A user's own data under a neutral name, and the console lines a person follows a run by:
published presets when applied, "k of N" on multi-round phases, the centralized reference's
progress and time, and whether the run is reproducible by its seed."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

from datasets import DataError, DatasetSpec, load_dataset

TRAIN = np.array([[1, 1, 0, 0, 1], [0, 1, 1, 0, 0], [1, 0, 0, 1, 0], [0, 0, 1, 1, 1]], float)
TEST = np.array([[0, 0, 1, 0, 0], [1, 0, 0, 0, 0], [0, 1, 0, 0, 0], [1, 0, 0, 0, 0]], float)


@pytest.fixture(autouse=True)
def _isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FEDREC_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("FEDREC_DATA", raising=False)


def write_npz(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    sp.save_npz(folder / "train.npz", sp.csr_matrix(TRAIN))
    sp.save_npz(folder / "test.npz", sp.csr_matrix(TEST))
    return folder


def write_txt(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, m in (("train.txt", TRAIN), ("test.txt", TEST)):
        lines = [" ".join(str(x) for x in [u, *np.flatnonzero(row)]) for u, row in enumerate(m)]
        (folder / name).write_text("\n".join(lines) + "\n")
    return folder


# --- loader --------------------------------------------------------------------------------


@pytest.mark.parametrize("writer", [write_npz, write_txt], ids=["npz", "txt"])
def test_own_data_under_a_neutral_name(tmp_path: Path, writer) -> None:
    """Either file set under <data-dir>/<any name>/ loads as the same given split."""
    writer(tmp_path / "my-data")
    data = load_dataset(DatasetSpec(name="my-data", data_dir=str(tmp_path)))
    assert (data.n_users, data.n_items) == TRAIN.shape
    np.testing.assert_array_equal(data.train.toarray(), TRAIN)
    np.testing.assert_array_equal(data.test.toarray(), TEST)
    assert data.name == "my-data"


def test_lightgcn_name_reads_npz_too(tmp_path: Path) -> None:
    write_npz(tmp_path / "lightgcn")
    data = load_dataset(DatasetSpec(name="lightgcn", data_dir=str(tmp_path)))
    np.testing.assert_array_equal(data.train.toarray(), TRAIN)


def test_data_dir_holding_the_files_itself(tmp_path: Path) -> None:
    """--set data-dir=/path/my-data (the folder itself) works as well as its parent."""
    folder = write_txt(tmp_path / "my-data")
    data = load_dataset(DatasetSpec(name="my-data", data_dir=str(folder)))
    np.testing.assert_array_equal(data.test.toarray(), TEST)


ALL_SETS = r"train\.npz \+ test\.npz .*; or train\.txt \+ test\.txt"


def test_error_names_folder_and_every_accepted_file_set(tmp_path: Path) -> None:
    folder = tmp_path / "my-data"
    folder.mkdir()
    (folder / "ratings.csv").write_text("1,2,3\n")
    with pytest.raises(FileNotFoundError, match=rf"my-data: no train/test split in "
                                                rf"{folder}; expected {ALL_SETS}"):
        load_dataset(DatasetSpec(name="my-data", data_dir=str(tmp_path)))
    with pytest.raises(FileNotFoundError, match=rf"folder {tmp_path / 'nothing'} does not "
                                                rf"exist .*own data.*{ALL_SETS}"):
        load_dataset(DatasetSpec(name="nothing", data_dir=str(tmp_path)))
    sp.save_npz(folder / "train.npz", sp.csr_matrix(TRAIN))
    with pytest.raises(FileNotFoundError, match=rf"holds train\.npz but not test\.npz; "
                                                rf"expected {ALL_SETS}"):
        load_dataset(DatasetSpec(name="my-data", data_dir=str(tmp_path)))


def test_folder_name_must_be_one_plain_folder() -> None:
    for bad in ("../up", "a/b", "", "my data", ".hidden"):
        with pytest.raises(ValueError, match="name of a folder"):
            DatasetSpec(name=bad)


def test_bad_npz_names_the_file(tmp_path: Path) -> None:
    folder = write_npz(tmp_path / "my-data")
    (folder / "test.npz").write_bytes(b"not a zip")
    with pytest.raises(DataError, match=r"test\.npz: not a scipy sparse \.npz"):
        load_dataset(DatasetSpec(name="my-data", data_dir=str(tmp_path)))


# --- console lines -------------------------------------------------------------------------


@pytest.fixture
def fedrec_lines() -> list[str]:
    """The messages the 'fedrec' logger emits at INFO during the test."""
    lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    logger = logging.getLogger("fedrec")
    handler, level = Keep(level=logging.INFO), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    yield lines
    logger.removeHandler(handler)
    logger.setLevel(level)


def test_preset_line_names_applied_keys_and_overrides() -> None:
    from strategies.privirec import DEFAULT_FILTERS, preset_line

    line = preset_line(DEFAULT_FILTERS, "gowalla")
    assert "dataset 'gowalla' selects published filter presets" in line
    assert "bspm-lm rank=448" in line and "turbo-cf alpha=0.6 power=0.7" in line
    assert "--set privirec-filter-rank=N" in line and "another dataset name" in line
    assert "gf-cf" not in line  # gowalla's GF-CF settings are the generic ones
    # an explicit filter rank wins over the preset: the line no longer claims it
    assert "rank=448" not in preset_line(DEFAULT_FILTERS, "gowalla", filter_rank=32)
    for neutral in ("my-data", "synthetic", "lightgcn"):
        assert preset_line(DEFAULT_FILTERS, neutral) == ""


def _fake_simulate(monkeypatch: pytest.MonkeyPatch) -> None:
    """run_in_simulation's own code, with the ServerApp on the in-process LocalGrid
    instead of Ray (seconds faster, same ServerApp and ClientApp)."""
    from flwr.app import Context, RecordDict

    import fl_app.simulation as simulation
    from tests.localgrid import LocalGrid

    def simulate(server_app, client_app, num_nodes, backend_config=None, verbose_flower=False):
        with LocalGrid(client_app, num_nodes) as grid:
            server_app(grid, Context(run_id=1, node_id=0, node_config={}, state=RecordDict(),
                                     run_config={}))

    monkeypatch.setattr(simulation, "simulate", simulate)


TINY = {"synthetic-users": 40, "synthetic-items": 30, "synthetic-density": 0.2,
        "aggregator": "plain"}


def test_fedmf_rounds_say_k_of_n_and_reference_progress(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture,
        fedrec_lines: list[str]) -> None:
    """FedMF's rounds and its centralized reference's rounds print 'k of N'; the wall-time
    table shows both; a fully seeded protocol prints no reproducibility note."""
    from fl_app.simulation import run_in_simulation

    monkeypatch.setenv("FEDREC_RESULTS", str(tmp_path / "results"))
    _fake_simulate(monkeypatch)
    run_in_simulation({"protocol": "fedmf", "rounds": 3, "mf-dim": 4, **TINY}, 2,
                      compare=True, node_policy={"allow-plain": True})
    assert any(line.startswith("fedmf: train round 3 of 3 done, loss") for line in fedrec_lines)
    assert "fedmf: train round 1 of 3 done" in " ".join(fedrec_lines)
    assert any("fedmf reference: centralized BPR-MF to convergence" in line
               for line in fedrec_lines)
    assert any(line.startswith("fedmf reference: candidate 15 of 15 (lr, item lr, reg = ")
               for line in fedrec_lines)
    assert any(line.startswith("centralized reference done in") for line in fedrec_lines)
    out = capsys.readouterr().out
    assert "federated run" in out and "centralized reference" in out  # wall-time table
    assert "not reproducible" not in out


def test_privirec_run_says_it_is_not_reproducible_by_seed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture,
        fedrec_lines: list[str]) -> None:
    """One line after the results table, from the strategy's own declaration."""
    from fl_app.simulation import run_in_simulation

    monkeypatch.setenv("FEDREC_RESULTS", str(tmp_path / "results"))
    _fake_simulate(monkeypatch)
    cfg = {"protocol": "privirec", "privirec-filters": "gf-cf", "privirec-filter-rank": 4,
           **TINY}
    policy = {"allow-plain": True, "allow-sparse-transport": True}
    run_in_simulation(cfg, 2, node_policy=policy)
    out = capsys.readouterr().out
    table_end = out.rindex("wall time")
    note = [line for line in out.splitlines() if line.startswith("note: not reproducible")]
    assert len(note) == 1 and out.index(note[0]) > table_end
    assert "OS CSPRNG" in note[0] and "privirec-omega=seeded" in note[0]
    assert any(line.startswith("privirec: power round 3 of 3") for line in fedrec_lines)
    assert any(line.startswith("privirec: evaluation done in") for line in fedrec_lines)
    run_in_simulation({**cfg, "privirec-omega": "seeded"}, 2,
                      node_policy={**policy, "allow-seeded-omega": True})
    assert "not reproducible" not in capsys.readouterr().out


def test_dp_noise_protocols_declare_unseeded_randomness() -> None:
    from fl_app.registry import load_strategy_class, resolve_config
    from fl_app.simulation import unseeded_randomness

    for protocol, needle in (("dp-prototypes", "OS-keyed"), ("fedpower", "OS-keyed"),
                             ("privmvmf", "CKKS"), ("privirec", "Omega")):
        cfg = resolve_config({"protocol": protocol, "implicit": protocol != "privmvmf"})
        assert needle in unseeded_randomness(cfg, load_strategy_class(protocol)(cfg)), protocol
    cfg = resolve_config({"protocol": "fedmf"})
    assert unseeded_randomness(cfg, load_strategy_class("fedmf")(cfg)) == ""


def test_still_running_lines_until_the_block_ends(fedrec_lines: list[str]) -> None:
    import time

    from fl_app.simulation import still_running

    with still_running("slow step", every=0.05):
        time.sleep(0.18)
    n = len(fedrec_lines)
    time.sleep(0.12)
    assert n >= 2 and len(fedrec_lines) == n  # beats while running, none after
    assert all(line.startswith("slow step still running,") for line in fedrec_lines)


def test_nodes_train_on_own_data_under_a_neutral_name(tmp_path: Path) -> None:
    """A FedMF run whose nodes read <data-dir>/my-data/ (the run config's dataset key itself
    is checked by fedrec/config.py; the nodes and the loader take any plain folder name)."""
    from fl_app.client_app import build_client_app
    from fl_app.registry import resolve_config
    from fl_app.server_app import run_protocol
    from tests.localgrid import LocalGrid

    write_npz(tmp_path / "data" / "my-data")
    cfg = dict(resolve_config({"protocol": "fedmf", "rounds": 1, "mf-dim": 2,
                               "aggregator": "plain"}))
    cfg.update({"dataset": "my-data", "data-dir": str(tmp_path / "data")})
    with LocalGrid(build_client_app(["clients.fedmf"], policy={"allow-plain": True}), 2) as grid:
        record = run_protocol(grid, cfg)
    assert record["config"]["dataset"] == "my-data"
    assert 0.0 <= record["metrics"]["recall@20"] <= 1.0
