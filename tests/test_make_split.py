"""python -m datasets.make_split: reproducible by seed, leave-last-out by timestamp, no
interaction lost or duplicated, and the folder it writes loads as the given split."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from datasets import DataError, DatasetSpec, load_dataset, readers
from datasets.make_split import main, make_split


@pytest.fixture(autouse=True)
def _isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FEDREC_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("FEDREC_DATA", raising=False)


def interactions(tmp_path: Path, n_users: int = 30, seed: int = 5) -> Path:
    """A u.data-shaped file, 1-based ids, 1-12 interactions per user, one duplicated pair."""
    rng = np.random.default_rng(seed)
    lines = []
    for u in range(1, n_users + 1):
        for i in rng.choice(np.arange(1, 41), size=int(rng.integers(1, 13)), replace=False):
            lines.append(f"{u}\t{i}\t{int(rng.integers(1, 6))}\t{int(rng.integers(8e8, 9e8))}")
    lines.append(lines[0].rsplit("\t", 2)[0] + "\t2\t950000000")  # the pair again, later
    path = tmp_path / "u.data"
    path.write_text("\n".join(lines) + "\n")
    return path


def pairs(folder: Path, name: str) -> list[tuple[int, int]]:
    rec = readers.read_csv(folder / name)
    return list(zip(rec.users.tolist(), rec.items.tolist()))


def test_random_split_is_reproducible_by_seed(tmp_path: Path) -> None:
    src = interactions(tmp_path)
    for out, seed in (("a", 1), ("b", 1), ("c", 2)):
        make_split(src, tmp_path / out, seed=seed, fmt="ratings")
    same = (tmp_path / "a" / "test.csv").read_text() == (tmp_path / "b" / "test.csv").read_text()
    other = (tmp_path / "a" / "test.csv").read_text() != (tmp_path / "c" / "test.csv").read_text()
    assert same and other


@pytest.mark.parametrize("method", ["random", "last"])
def test_no_interaction_lost_or_duplicated(tmp_path: Path, method: str) -> None:
    src = interactions(tmp_path)
    make_split(src, tmp_path / "out", method=method, fmt="ratings")
    train, test = pairs(tmp_path / "out", "train.csv"), pairs(tmp_path / "out", "test.csv")
    rec = readers.read_fixed(src, "ratings")
    unique = set(zip(rec.users.tolist(), rec.items.tolist()))
    assert len(train) + len(test) == len(unique) == len(rec.users) - 1
    assert set(train) | set(test) == unique and not set(train) & set(test)
    users = {u for u, _ in unique}
    counts = {u: sum(1 for v, _ in unique if v == u) for u in users}
    with_test = {u for u, _ in test}
    assert with_test == {u for u in users if counts[u] >= 2}  # and every user keeps a train item
    assert {u for u, _ in train} == users


def test_leave_last_out_takes_each_users_latest(tmp_path: Path) -> None:
    src = interactions(tmp_path)
    make_split(src, tmp_path / "out", method="last", fmt="ratings")
    test = readers.read_csv(tmp_path / "out" / "test.csv")
    train = readers.read_csv(tmp_path / "out" / "train.csv")
    assert len(np.unique(test.users)) == len(test.users)  # one per user
    for u, t in zip(test.users, test.times):
        assert t >= train.times[train.users == u].max()
    dup_user = int(src.read_text().split("\t", 1)[0])  # the duplicated pair's last line wins
    assert test.times[test.users == dup_user].item() == 950000000
    assert test.ratings[test.users == dup_user].item() == 2


def test_split_folder_loads_with_the_same_counts(tmp_path: Path) -> None:
    src = interactions(tmp_path)
    line = make_split(src, tmp_path / "data" / "my-data", fmt="ratings", min_rating=3)
    assert "ids 1-based (detected; row = id - 1)" in line
    data = load_dataset(DatasetSpec(name="my-data", data_dir=str(tmp_path / "data")))
    n_train = len(pairs(tmp_path / "data" / "my-data", "train.csv"))
    assert data.train.nnz == n_train and data.n_users <= 30 and data.n_items <= 40


def test_last_needs_timestamps_and_refusals(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    src = tmp_path / "pairs.txt"
    src.write_text("1 1\n1 2\n2 1\n")
    with pytest.raises(DataError, match=r"--method last needs a timestamp"):
        make_split(src, tmp_path / "out", method="last")
    assert main([str(interactions(tmp_path)), "--out", str(tmp_path / "out")]) == 2
    assert "look alike; declare the format with --format ratings" in capsys.readouterr().err
    assert main([str(src), "--out", str(tmp_path / "out")]) == 0
    assert main([str(src), "--out", str(tmp_path / "out")]) == 2
    assert "already holds a split; pass --force" in capsys.readouterr().err
