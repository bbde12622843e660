"""Folder datasets' readers: declared or detected formats, fixed-width and id-range checks,
0/1-based ids, errors that name file, line and field but no value or path, the summary."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from datasets import DataError, DatasetSpec, load_dataset

# user item rating timestamp (MovieLens u.data shape), 1-based ids: 3 users x 4 items
UDATA_TRAIN = [(1, 1, 5, 881250949), (1, 2, 3, 881250950), (2, 2, 4, 881250951),
               (2, 3, 1, 881250952), (3, 4, 2, 881250953), (3, 1, 4, 881250954)]
UDATA_TEST = [(1, 3, 4, 881250960), (2, 4, 5, 881250961), (3, 2, 3, 881250962)]


@pytest.fixture(autouse=True)
def _isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FEDREC_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("FEDREC_DATA", raising=False)


def write(folder: Path, train: list, test: list, sep: str = "\t", name: str = "txt",
          header: str | None = None, meta: str | None = None) -> Path:
    """train.<name> / test.<name> from rows of fields, and dataset.toml when given."""
    folder.mkdir(parents=True, exist_ok=True)
    for stem, rows in (("train", train), ("test", test)):
        lines = ([header] if header else []) + [sep.join(map(str, r)) for r in rows]
        (folder / f"{stem}.{name}").write_text("\n".join(lines) + "\n")
    if meta is not None:
        (folder / "dataset.toml").write_text(meta)
    return folder


def load(tmp_path: Path, **kw) -> object:
    return load_dataset(DatasetSpec(name="my-data", data_dir=str(tmp_path), **kw))


def refused(tmp_path: Path, match: str, **kw) -> str:
    """The DataError's message, checked to hold no path beyond the dataset folder's name."""
    with pytest.raises(DataError, match=match) as info:
        load(tmp_path, **kw)
    message = str(info.value)
    assert str(tmp_path) not in message
    return message


# --- the u.data shape -----------------------------------------------------------------------


def test_udata_shape_undeclared_is_refused_not_read_as_lists(tmp_path: Path) -> None:
    """Issue 44: four fields per line read as lists made timestamps item ids."""
    write(tmp_path / "my-data", UDATA_TRAIN, UDATA_TEST)
    message = refused(tmp_path, r"my-data/train\.txt \+ my-data/test\.txt: every line has 4 "
                                r"fields.*format = \"ratings\"")
    assert "881250949" not in message


@pytest.mark.parametrize("sep", ["\t", " ", "  \t "], ids=["tab", "space", "mixed"])
def test_udata_shape_declared_ratings_reads_right(tmp_path: Path, sep: str) -> None:
    write(tmp_path / "my-data", UDATA_TRAIN, UDATA_TEST, sep=sep, meta='format = "ratings"\n')
    data = load(tmp_path, implicit=False)
    assert (data.n_users, data.n_items) == (3, 4)  # 1-based: no empty user 0 / item 0
    assert data.train.nnz == 6 and data.test.nnz == 3
    assert data.train[0].toarray().tolist() == [[5, 3, 0, 0]]  # user 1: item 1 -> 5, 2 -> 3
    assert data.test[2].toarray().tolist() == [[0, 3, 0, 0]]


def test_ratings_min_rating_thresholds(tmp_path: Path) -> None:
    write(tmp_path / "my-data", UDATA_TRAIN, UDATA_TEST, meta='format = "ratings"\n')
    data = load(tmp_path, min_rating=4)
    assert data.train.nnz == 3 and data.test.nnz == 2  # ratings 5, 4, 4 and 4, 5
    assert set(data.train.data) == {1.0}


def test_udata_shape_declared_lists_trips_the_id_range_check(tmp_path: Path) -> None:
    write(tmp_path / "my-data", UDATA_TRAIN, UDATA_TEST, meta='format = "lists"\n')
    message = refused(tmp_path, r"field 'item': the ids span more than 10x the .* distinct "
                                r"item ids.*ids = \"remap\"")
    assert "881250" not in message


def test_fixed_width_names_file_line_and_count(tmp_path: Path) -> None:
    train = [*UDATA_TRAIN[:3], (2, 3, 1), *UDATA_TRAIN[4:]]  # line 4: 3 fields
    write(tmp_path / "my-data", train, UDATA_TEST, meta='format = "ratings"\n')
    refused(tmp_path, r"my-data/train\.txt line 4: 3 fields; expected 4 'user item rating "
                      r"timestamp' \(format 'ratings'\)")


@pytest.mark.parametrize("field, bad, match", [
    (1, "x7", r"line 2: field 'item' is not an integer; expected an integer id >= 0"),
    (0, "-3", r"line 2: field 'user' is negative"),
    (2, "nan", r"line 2: field 'rating' is not finite"),
    (3, "soon", r"line 2: field 'timestamp' is not a number"),
])
def test_bad_field_named_without_its_value(tmp_path: Path, field: int, bad: str,
                                           match: str) -> None:
    row = list(UDATA_TEST[1])
    row[field] = bad
    write(tmp_path / "my-data", UDATA_TRAIN, [UDATA_TEST[0], row], meta='format = "ratings"\n')
    message = refused(tmp_path, r"my-data/test\.txt " + match)
    assert bad not in message


# --- pairs, lists, ids ----------------------------------------------------------------------


def test_pairs_detected_one_based_without_empty_row_zero(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    write(tmp_path / "my-data", [(1, 1), (1, 2), (2, 3)], [(1, 3), (2, 1)], sep=" ")
    with caplog.at_level(logging.INFO, logger="fedrec"):
        data = load(tmp_path)
    assert (data.n_users, data.n_items) == (2, 3)
    assert data.train[0].indices.tolist() == [0, 1] and data.test[1].indices.tolist() == [0]
    assert ("my-data/train.txt + my-data/test.txt read as pairs 'user item': 2 users, 3 items, "
            "5 interactions (3 train + 2 test), ids 1-based (detected; row = id - 1)"
            in caplog.messages)


def test_zero_based_lists_keep_their_ids(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """LightGCN lists as before: an id 0 anywhere means 0-based; a user without items counts."""
    (tmp_path / "my-data").mkdir()
    (tmp_path / "my-data" / "train.txt").write_text("0 1 2\n1 0\n2 3 1 2\n")
    (tmp_path / "my-data" / "test.txt").write_text("0 3\n2\n")
    with caplog.at_level(logging.INFO, logger="fedrec"):
        data = load(tmp_path)
    assert (data.n_users, data.n_items) == (3, 4)
    assert data.train[0].indices.tolist() == [1, 2]
    assert any("read as lists" in m and "ids 0-based (detected)" in m for m in caplog.messages)


def test_declared_one_based_refuses_id_zero_at_its_line(tmp_path: Path) -> None:
    write(tmp_path / "my-data", [(1, 1), (2, 0)], [(1, 2)], sep=" ",
          meta='format = "pairs"\nids = "1-based"\n')
    refused(tmp_path, r"my-data/train\.txt line 2: field 'item' is 0; expected ids >= 1")


def test_declared_zero_based_keeps_row_zero(tmp_path: Path) -> None:
    write(tmp_path / "my-data", [(1, 1), (2, 2)], [(1, 2)], sep=" ", meta='ids = "0-based"\n')
    data = load(tmp_path)
    assert (data.n_users, data.n_items) == (3, 3) and data.train[0].nnz == 0


def test_remap_makes_sparse_ids_dense(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    write(tmp_path / "my-data", [(10, 5_000_000), (20, 7_000_000)], [(10, 7_000_000)], sep=" ",
          meta='ids = "remap"\n')
    with caplog.at_level(logging.INFO, logger="fedrec"):
        data = load(tmp_path)
    assert (data.n_users, data.n_items) == (2, 2)
    assert data.test[0].indices.tolist() == [1]
    assert any("ids remapped to 0..n-1 in id order (declared)" in m for m in caplog.messages)


# --- csv ------------------------------------------------------------------------------------


def test_csv_with_movielens_header(tmp_path: Path) -> None:
    write(tmp_path / "my-data", UDATA_TRAIN, UDATA_TEST, sep=",", name="csv",
          header="userId,movieId,rating,timestamp")
    data = load(tmp_path, implicit=False)
    assert (data.n_users, data.n_items) == (3, 4)
    assert data.train[0].toarray().tolist() == [[5, 3, 0, 0]]


def test_csv_pairs_columns_in_any_order_and_extra_columns(tmp_path: Path) -> None:
    write(tmp_path / "my-data", [(0, "a", 1), (1, "b", 0)], [(2, "c", 0)], sep=",", name="csv",
          header="item_id,note,User")
    data = load(tmp_path)
    assert (data.n_users, data.n_items) == (2, 3)  # users 1, 0: 0-based
    assert data.train[1].indices.tolist() == [0] and data.test[0].indices.tolist() == [2]


def test_csv_header_and_width_errors(tmp_path: Path) -> None:
    folder = write(tmp_path / "my-data", [(1, 2)], [(1, 3)], sep=",", name="csv",
                   header="user,product")
    refused(tmp_path, r"my-data/train\.csv line 1: header has no column item")
    write(folder, [(1, 2), (1, 3, 9)], [(1, 4)], sep=",", name="csv", header="user,item")
    refused(tmp_path, r"my-data/train\.csv line 3: 3 fields; expected 2, as the header")


# --- dataset.toml ---------------------------------------------------------------------------


def test_dataset_toml_refuses_unknown_keys_and_values(tmp_path: Path) -> None:
    folder = write(tmp_path / "my-data", UDATA_TRAIN, UDATA_TEST, meta='fromat = "ratings"\n')
    refused(tmp_path, r"my-data/dataset\.toml: unknown key\(s\) fromat")
    (folder / "dataset.toml").write_text('format = "tsv"\n')
    refused(tmp_path, r"my-data/dataset\.toml: key 'format' must be one of 'lists', 'pairs'")
    (folder / "dataset.toml").write_text('format = ratings\n')
    refused(tmp_path, r"my-data/dataset\.toml: not valid TOML")


def test_declared_format_needs_its_files(tmp_path: Path) -> None:
    write(tmp_path / "my-data", UDATA_TRAIN, UDATA_TEST, meta='format = "csv"\n')
    with pytest.raises(FileNotFoundError, match=r"dataset\.toml declares format 'csv', but .* "
                                                r"does not hold train\.csv \+ test\.csv"):
        load(tmp_path)


def test_one_file_without_split_points_to_the_split_command(tmp_path: Path) -> None:
    (tmp_path / "my-data").mkdir()
    (tmp_path / "my-data" / "ratings.txt").write_text("1 2\n")
    with pytest.raises(FileNotFoundError, match=r"python -m datasets\.make_split FILE"):
        load(tmp_path)
