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
