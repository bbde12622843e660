"""Tests for the datasets package: synthetic data, splits, partitions, node cache, loaders."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

import datasets
from datasets import (
    KNOWN_DATASETS,
    KNOWN_PARTITIONS,
    DataError,
    DatasetSpec,
    PartitionSpec,
    load_dataset,
    load_node_data,
    partition_users,
    synthetic,
)

SHARED_DATA = Path(__file__).resolve().parent.parent.parent / "shared" / "data"


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test gets its own disk cache and no inherited FEDREC_DATA."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("FEDREC_CACHE", str(cache))
    monkeypatch.delenv("FEDREC_DATA", raising=False)
    return cache


# --- spec ---------------------------------------------------------------------


def test_spec_config_roundtrip() -> None:
    spec = DatasetSpec(name="ml-100k", seed=3, test_ratio=0.1, implicit=False, cold_start_users=0.1)
    cfg = spec.to_config()
    assert all(isinstance(v, (str, int, float, bool)) for v in cfg.values())
    assert "test-ratio" in cfg and cfg["dataset"] == "ml-100k"
    assert DatasetSpec.from_config({**cfg, "protocol": "fedmf"}) == spec
    assert DatasetSpec.from_config({}) == DatasetSpec()
    assert DatasetSpec.from_config({"test-ratio": 0, "implicit": "false"}).test_ratio == 0.0
    part = PartitionSpec("silo-zip", 11, 5)
    assert PartitionSpec.from_config(part.to_config()) == part
    assert PartitionSpec.from_config({"partition": "user"}, 7).num_partitions == 7


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"name": "../netflix"}, "expected one of synthetic, ml-100k, .* or the name of a folder"),
        ({"test_ratio": 1.0}, "test-ratio"),
        ({"synthetic_density": 0.0}, "synthetic-density"),
        ({"synthetic_users": 0}, "synthetic-users"),
    ],
)
def test_spec_rejects_bad_values(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        DatasetSpec(**kwargs)


def test_unknown_partition_scheme() -> None:
    with pytest.raises(ValueError, match="unknown partition scheme"):
        PartitionSpec("by-zip")
    assert set(KNOWN_PARTITIONS) >= {"user", "silo-zip"} and "gowalla" in KNOWN_DATASETS


# --- synthetic ----------------------------------------------------------------


def test_synthetic_deterministic_and_sized() -> None:
    spec = DatasetSpec(synthetic_users=120, synthetic_items=90, synthetic_density=0.08, seed=7)
    a = synthetic.generate(120, 90, 8, 0.08, 7)
    b = synthetic.generate(120, 90, 8, 0.08, 7)
    assert (a.ratings != b.ratings).nnz == 0
    assert np.array_equal(a.user_features, b.user_features)
    data = load_dataset(spec)
    assert (data.n_users, data.n_items) == (120, 90)
    total = data.train + data.test
    assert total.nnz / (120 * 90) == pytest.approx(0.08, rel=0.25)
    assert np.all(total.getnnz(axis=1) >= 1) and np.all(total.getnnz(axis=0) >= 1)
    assert set(np.unique(total.data)) == {1.0}
    assert data.user_features.shape == (120, 8) and data.item_features.shape == (90, 6)
    assert len(data.user_attributes["zip"]) == 120
    other = load_dataset(DatasetSpec(synthetic_users=120, synthetic_items=90, synthetic_density=0.08, seed=8))
    assert (other.train != data.train).nnz > 0


def test_synthetic_explicit_ratings_in_range() -> None:
    data = load_dataset(DatasetSpec(implicit=False))
    values = np.concatenate([data.train.data, data.test.data])
    assert values.min() >= 1 and values.max() <= 5 and len(np.unique(values)) > 1


# --- split / cold start -----------------------------------------------------------


def test_split_disjoint_and_keeps_train() -> None:
    data = load_dataset(DatasetSpec(test_ratio=0.3))
    assert data.train.multiply(data.test).nnz == 0
    n_train = data.train.getnnz(axis=1)
    n_test = data.test.getnnz(axis=1)
    assert np.all(n_train >= 1)
    assert np.all(n_test[(n_train + n_test) >= 2] >= 1)
    assert data.test.nnz / (data.train.nnz + data.test.nnz) == pytest.approx(0.3, abs=0.05)


def test_cold_start_users_and_items() -> None:
    spec = DatasetSpec(cold_start_users=0.1, cold_start_items=0.1)
    data = load_dataset(spec)
    # round(0.1 * n): 100 of the default 1000 users, 50 of the default 500 items
    assert len(data.cold_users) == round(0.1 * spec.synthetic_users) == 100
    assert len(data.cold_items) == round(0.1 * spec.synthetic_items) == 50
    assert data.train[data.cold_users].nnz == 0
    assert data.train[:, data.cold_items].nnz == 0
    assert data.test[data.cold_users].nnz > 0


# --- partitions ---------------------------------------------------------------


@pytest.mark.parametrize("scheme", ["shards-contiguous", "shards-random", "row-blocks"])
def test_partitions_cover_every_user_once(scheme: str) -> None:
    data = load_dataset(DatasetSpec())
    parts = partition_users(data, PartitionSpec(scheme, 7, seed=1))
    assert len(parts) == 7
    assert all(np.all(np.diff(p) > 0) for p in parts)
    assert np.array_equal(np.sort(np.concatenate(parts)), np.arange(data.n_users))
    assert max(map(len, parts)) - min(map(len, parts)) <= 1


def test_user_partition_and_mismatch_error() -> None:
    data = load_dataset(DatasetSpec(synthetic_users=10, synthetic_items=20, synthetic_density=0.3))
    parts = partition_users(data, PartitionSpec("user", 10))
    assert [p.tolist() for p in parts] == [[u] for u in range(10)]
    with pytest.raises(ValueError, match=r"num-partitions is 9 .* has 10 users"):
        partition_users(data, PartitionSpec("user", 9))


def test_silo_zip() -> None:
    data = load_dataset(DatasetSpec())
    firsts = sorted({z[0] for z in data.user_attributes["zip"]})
    parts = partition_users(data, PartitionSpec("silo-zip", len(firsts)))
    assert np.array_equal(np.sort(np.concatenate(parts)), np.arange(data.n_users))
    for digit, users in zip(firsts, parts):
        assert {data.user_attributes["zip"][u][0] for u in users} == {digit}
    with pytest.raises(ValueError, match="first zip digits 0, 1"):
        partition_users(data, PartitionSpec("silo-zip", len(firsts) + 1))


def test_empty_node_error() -> None:
    data = load_dataset(DatasetSpec(synthetic_users=3, synthetic_items=20, synthetic_density=0.3))
    with pytest.raises(ValueError, match=r"partition 3 of scheme 'shards-contiguous' is empty"):
        partition_users(data, PartitionSpec("shards-contiguous", 4))


# --- node data + cache --------------------------------------------------------


def test_load_node_data_slices_and_caches(_isolated_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = DatasetSpec(seed=2)
    part = PartitionSpec("shards-random", 4, seed=3)
    full = load_dataset(spec)
    users = partition_users(full, part)[2]
    node = load_node_data(spec, part, 2)
    assert np.array_equal(node.user_ids, users)
    assert node.train.shape == (len(users), full.n_items)
    assert (node.train != full.train[users]).nnz == 0
    assert (node.test != full.test[users]).nnz == 0
    assert np.array_equal(node.user_features, full.user_features[users])
    assert (node.n_items, node.n_users_total) == (full.n_items, full.n_users)

    files = list((_isolated_cache / "nodes").glob("*.npz"))
    assert len(files) == 1 and "p2" in files[0].name

    def _no_full_load(*args: object) -> None:
        raise AssertionError("second call must read the cache file")

    monkeypatch.setattr(datasets.load, "_load_by_key", _no_full_load)
    again = load_node_data(spec, part, 2)
    assert np.array_equal(again.user_ids, users)
    assert (again.train != node.train).nnz == 0
    with pytest.raises(ValueError, match="partition id 4 out of range"):
        load_node_data(spec, part, 4)


# --- file loaders and their errors -----------------------------------------------


def _write_ml100k(folder: Path, data_lines: list[str]) -> Path:
    folder.mkdir(parents=True)
    (folder / "u.data").write_text("\n".join(data_lines) + "\n")
    return folder


def test_malformed_udata_names_file_and_line(tmp_path: Path) -> None:
    lines = [f"{u}\t{i}\t3\t88125094{u}" for u in (1, 2) for i in (1, 2, 3)]
    lines.insert(4, "2\t5\t4")  # line 5: only 3 fields
    _write_ml100k(tmp_path / "ml-100k", lines)
    with pytest.raises(DataError, match=r"u\.data line 5: expected 4 tab-separated fields .* got 3"):
        load_dataset(DatasetSpec(name="ml-100k", data_dir=str(tmp_path)))


def test_non_numeric_field(tmp_path: Path) -> None:
    _write_ml100k(tmp_path / "ml-100k", ["1\t1\t3\t1", "1\tx\t3\t1"])
    with pytest.raises(DataError, match=r"line 2: field 'item'"):
        load_dataset(DatasetSpec(name="ml-100k", data_dir=str(tmp_path)))


def test_missing_file_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"ml-100k: expected file .*u\.data .*FEDREC_DATA"):
        load_dataset(DatasetSpec(name="ml-100k", data_dir=str(tmp_path)))


def test_lightgcn_txt(tmp_path: Path) -> None:
    (tmp_path / "train.txt").write_text("0 0 1 2\n1 2 3\n2 4\n")
    (tmp_path / "test.txt").write_text("0 3\n1 0\n2\n")
    data = load_dataset(DatasetSpec(name="lightgcn", data_dir=str(tmp_path)))
    assert (data.n_users, data.n_items) == (3, 5)
    assert data.train.nnz == 6 and data.test.nnz == 2
    assert data.train[0].indices.tolist() == [0, 1, 2] and data.test[1].indices.tolist() == [0]
    (tmp_path / "test.txt").write_text("0 3\n1 a\n")
    with pytest.raises(DataError, match=r"test\.txt line 2"):
        load_dataset(DatasetSpec(name="lightgcn", data_dir=str(tmp_path)))


_ML1M_USERS = [
    "1::F::1::10::48067",
    "2::M::56::16::55117-1234",   # ZIP+4: silo by its first character
    "3::M::25::15::A1B2C3",       # non-digit first character: the "other" silo
    "4::F::35::0::10001",         # no ratings: not a row
    "5::M::45::20::55413",
]
_ML1M_MOVIES = [
    "1::Toy Story (1995)::Animation|Children's|Comedy",
    "3::Misérables, Les (1995)::Drama|Musical",          # Latin-1 title
    "10::Cité des enfants perdus, La (1995)::Adventure|Sci-Fi",  # in no rating: kept
]
_ML1M_RATINGS = [
    "1::1::5::978300760",
    "1::3::3::978302109",
    "2::3::4::978301968",
    "3::1::2::978300275",
    "5::3::1::978824291",
]


def _write_ml1m(folder: Path, ratings: list[str] = _ML1M_RATINGS) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "ratings.dat").write_text("\n".join(ratings) + "\n", encoding="latin-1")
    (folder / "users.dat").write_text("\n".join(_ML1M_USERS) + "\n", encoding="latin-1")
    (folder / "movies.dat").write_bytes(("\n".join(_ML1M_MOVIES) + "\n").encode("latin-1"))
    return folder


def test_ml1m_tiny(tmp_path: Path) -> None:
    _write_ml1m(tmp_path / "ml-1m")
    data = load_dataset(DatasetSpec(name="ml-1m", data_dir=str(tmp_path), implicit=False,
                                    test_ratio=0.0))
    # Rows: rated users 1, 2, 3, 5 in UserID order; columns: movies 1, 3, 10 (10 unrated).
    assert (data.n_users, data.n_items) == (4, 3)
    assert data.train.toarray().tolist() == [[5, 3, 0], [0, 4, 0], [2, 0, 0], [0, 1, 0]]
    attrs = data.user_attributes
    assert attrs["zip"].tolist() == ["48067", "55117-1234", "A1B2C3", "55413"]
    assert attrs["gender"].tolist() == ["F", "M", "M", "M"]
    assert attrs["age"].tolist() == [1, 56, 25, 45]
    assert attrs["occupation"].tolist() == ["K-12 student", "self-employed", "scientist",
                                            "writer"]
    genres = datasets.movielens.ML1M_GENRES
    assert data.item_features.shape == (3, 18)
    on = [{genres[k] for k in np.flatnonzero(row)} for row in data.item_features]
    assert on == [{"Animation", "Children's", "Comedy"}, {"Drama", "Musical"},
                  {"Adventure", "Sci-Fi"}]
    assert data.user_features.shape[0] == 4
    parts = partition_users(data, PartitionSpec("silo-zip", 3))  # "4", "5", "other"
    assert [p.tolist() for p in parts] == [[0], [1, 3], [2]]
    assert datasets.display_name("ml-1m") == "ML-1M (users 1-2999)"


@pytest.mark.parametrize(
    "line, match",
    [
        ("2::1::4", r"expected 4 '::'-separated fields .* got 3"),
        ("2::1::nan::978301968", r"field 'Rating' is not finite"),
        ("2::1::inf::978301968", r"field 'Rating' is not finite"),
        ("2::x::4::978301968", r"field 'MovieID' is not an integer"),
        ("2::7::4::978301968", r"MovieID 7 is not in .*movies\.dat"),
        ("6::1::4::978301968", r"UserID 6 is not in .*users\.dat"),
    ],
)
def test_ml1m_bad_rating_line_names_file_and_line(tmp_path: Path, line: str, match: str) -> None:
    ratings = list(_ML1M_RATINGS)
    ratings.insert(3, line)  # line 4
    _write_ml1m(tmp_path / "ml-1m", ratings)
    with pytest.raises(DataError, match=r"ratings\.dat line 4: " + match):
        load_dataset(DatasetSpec(name="ml-1m", data_dir=str(tmp_path)))


def test_ml1m_bad_users_and_movies_lines(tmp_path: Path) -> None:
    folder = _write_ml1m(tmp_path / "ml-1m")
    spec = DatasetSpec(name="ml-1m", data_dir=str(tmp_path))
    (folder / "users.dat").write_text("\n".join(_ML1M_USERS[:2] + ["3::M::30::15::55117"]) + "\n")
    with pytest.raises(DataError, match=r"users\.dat line 3: field 'Age' must be one of"):
        load_dataset(spec)
    _write_ml1m(folder)
    (folder / "movies.dat").write_text("1::Toy Story (1995)::Animation|Cartoon\n")
    with pytest.raises(DataError, match=r"movies\.dat line 1: field 'Genres' holds 'Cartoon'"):
        load_dataset(spec)


# --- real data (skipped when ../shared/data is absent) ---------------------------


def test_ml100k_real() -> None:
    if not (SHARED_DATA / "ml-100k" / "u.data").is_file():
        pytest.skip(f"no ml-100k at {SHARED_DATA}")
    data = load_dataset(DatasetSpec(name="ml-100k", data_dir=str(SHARED_DATA), implicit=False))
    assert (data.n_users, data.n_items) == (943, 1682)
    assert data.train.nnz + data.test.nnz == 100_000
    assert data.item_features.shape == (1682, 19)
    assert data.user_features.shape[0] == 943
    assert len(data.user_attributes["zip"]) == 943
    # data-dir "" falls back to <repo>/../shared/data; min-rating filters before binarizing.
    liked = load_dataset(DatasetSpec(name="ml-100k", min_rating=4.0))
    assert liked.train.nnz + liked.test.nnz == 55_375
    parts = partition_users(liked, PartitionSpec("silo-zip", 11))  # 10 digits + "other"
    assert sum(map(len, parts)) == 943 and len(parts[-1]) == 18


@pytest.mark.parametrize(
    "name, shape, nnz",
    [
        ("gowalla", (29858, 40981), (810_128, 217_242)),
        ("yelp2018", (31668, 38048), (1_237_259, 324_147)),
    ],
)
def test_lightgcn_npz_real(name: str, shape: tuple[int, int], nnz: tuple[int, int]) -> None:
    # Reads the given .npz split directly (about 0.1 s each), no re-splitting.
    if not (SHARED_DATA / name / "train.npz").is_file():
        pytest.skip(f"no {name} at {SHARED_DATA}")
    data = load_dataset(DatasetSpec(name=name, data_dir=str(SHARED_DATA)))
    assert data.train.shape == shape == data.test.shape
    assert (data.train.nnz, data.test.nnz) == nnz


def test_ml1m_real(shared_data: Path) -> None:
    # The README of ../shared/data/ml-1m: every rating of users 1..2999 (487,650), all 3,883
    # movies of movies.dat (3,615 rated), 18 genres, users.dat lists all 6,040 users.
    if not (shared_data / "ml-1m" / "ratings.dat").is_file():
        pytest.skip(f"no ml-1m at {shared_data}")
    data = load_dataset(DatasetSpec(name="ml-1m", data_dir=str(shared_data), implicit=False))
    assert (data.n_users, data.n_items) == (2999, 3883)
    assert data.train.nnz + data.test.nnz == 487_650
    assert int(((data.train + data.test).getnnz(axis=0) > 0).sum()) == 3615
    assert data.item_features.shape == (3883, 18)
    assert len(data.user_attributes["zip"]) == 2999
    parts = partition_users(data, PartitionSpec("silo-zip", 10))  # first digits 0-9
    assert sum(map(len, parts)) == 2999


def test_drop_cold_items_removes_exactly_the_items_without_a_training_interaction() -> None:
    """LP-GCN needs every catalogue item to have a training interaction; drop-cold-items
    removes the others after the split, test interactions on them included, and nothing
    else, so the rest of the split is the one every other protocol sees."""
    base = DatasetSpec(name="synthetic", synthetic_users=60, synthetic_items=200,
                       synthetic_density=0.01, seed=2)
    full = load_dataset(base)
    cold = np.flatnonzero(full.train.getnnz(axis=0) == 0)
    assert len(cold) > 0  # the sparse synthetic split leaves some items without training
    warm = load_dataset(dataclasses.replace(base, drop_cold_items=True))
    keep = np.setdiff1d(np.arange(full.n_items), cold)
    assert warm.n_items == full.n_items - len(cold)
    assert warm.train.getnnz(axis=0).min() >= 1
    assert (warm.train != full.train[:, keep]).nnz == 0
    assert (warm.test != full.test[:, keep]).nnz == 0
    with pytest.raises(ValueError, match="set one of the two"):
        dataclasses.replace(base, drop_cold_items=True, cold_start_items=0.1)
