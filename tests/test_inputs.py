"""Bad inputs and server-chosen sizes: a non-finite value in a data file is an error naming
the file and the line (never kept by a cache); a sum refuses a reply holding NaN or inf; a
size the server chooses (PriviRec's p and X, FedMF's mf-dim / negatives / batch, MVMF's dim,
the synthetic sizes of the data config) is refused when not a positive integer or past the
node's ``memory-budget-mb``, before anything is allocated. Fast: tiny files, in-process grid.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import scipy.sparse as sp
from flwr.app import ConfigRecord, Message, RecordDict

from datasets import DataError, DatasetSpec, PartitionSpec, load_dataset, load_node_data, synthetic
from datasets import cache as data_cache
from datasets.containers import NodeData
from fedrec.records import to_array_record
from fedrec.transport.aggregators import PlainAggregator
from fedrec.transport.messenger import Messenger, NodeError
from fedrec.wire.sums import SHAPES_KEY, SUM_KEY, VALUES_KEY, AggregationError, reply_values
from fl_app.client_app import build_client_app
from fl_app.registry import resolve_config
from tests.localgrid import LocalGrid
from tests.malicious import MaliciousGrid, Refused, copy_content
from tests.simutil import DIAGNOSTIC_APP, diag_request

TINY = {"dataset": "synthetic", "synthetic-users": 48, "synthetic-items": 30, "seed": 1,
        "partition": "shards-contiguous"}
N_ITEMS = TINY["synthetic-items"]
BAD_SIZES = [0, -3, 2.5, "many", True]


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = tmp_path / "cache"
    monkeypatch.setenv("FEDREC_CACHE", str(cache))
    return cache


# -- 1. data files ----------------------------------------------------------------------------
def _udata(folder: Path, ratings: list[str]) -> Path:
    """An ml-100k folder whose u.data has one line per rating (a blank line after the first)."""
    folder.mkdir(parents=True, exist_ok=True)
    lines = [f"{u}\t{i}\t{r}\t88125094{u}" for u, i, r in
             ((1 + n % 3, 1 + n % 4, r) for n, r in enumerate(ratings))]
    path = folder / "u.data"
    path.write_text("\n".join(lines[:1] + [""] + lines[1:]) + "\n")
    return path


@pytest.mark.parametrize("bad", ["nan", "NaN", "inf", "-inf", "1e999"])
@pytest.mark.parametrize("implicit", [True, False])
def test_a_non_finite_rating_is_an_error_naming_file_and_line(tmp_path: Path, bad: str,
                                                              implicit: bool) -> None:
    path = _udata(tmp_path / "ml-100k", ["4", "3.5", "5", bad, "2"])
    spec = DatasetSpec(name="ml-100k", data_dir=str(tmp_path), implicit=implicit,
                       min_rating=1.0)
    with pytest.raises(DataError) as err:
        load_dataset(spec)
    text = str(err.value)
    assert f"{path} line 5: field 'rating' is not finite" in text  # blank line 2 counts
    assert "expected a finite number" in text
    assert "3.5" not in text and "881250" not in text  # no neighbouring data


def test_an_unparsable_rating_names_file_and_line(tmp_path: Path) -> None:
    path = _udata(tmp_path / "ml-100k", ["4", "x3"])
    with pytest.raises(DataError, match=rf"{path} line 3: field 'rating' is not a number"):
        load_dataset(DatasetSpec(name="ml-100k", data_dir=str(tmp_path)))


@pytest.mark.parametrize("bad", ["nan", "inf", "1.5"])
def test_a_non_integer_id_in_lightgcn_text_names_file_and_line(tmp_path: Path,
                                                               bad: str) -> None:
    folder = tmp_path / "lightgcn"
    folder.mkdir()
    (folder / "train.txt").write_text(f"0 1 2\n1 0 {bad} 2\n")
    (folder / "test.txt").write_text("0 0\n")
    with pytest.raises(DataError, match=r"train.txt line 2: expected integer ids"):
        load_dataset(DatasetSpec(name="lightgcn", data_dir=str(tmp_path)))


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_values_in_an_npz_matrix_name_file_and_array(tmp_path: Path,
                                                                bad: float) -> None:
    folder = tmp_path / "gowalla"
    folder.mkdir()
    good = sp.csr_matrix(np.eye(3))
    broken = good.copy()
    broken.data[1] = bad
    sp.save_npz(folder / "train.npz", good)
    sp.save_npz(folder / "test.npz", broken)
    with pytest.raises(DataError) as err:
        load_dataset(DatasetSpec(name="gowalla", data_dir=str(tmp_path)))
    assert str(err.value) == (f"{folder / 'test.npz'}: array 'data' has non-finite values "
                              "(NaN or inf); expected finite numbers")


def test_a_bad_read_is_not_cached_and_the_fixed_file_loads(tmp_path: Path,
                                                           _isolated_cache: Path) -> None:
    spec = DatasetSpec(name="ml-100k", data_dir=str(tmp_path), test_ratio=0.0)
    part = PartitionSpec(scheme="shards-contiguous", num_partitions=1)
    _udata(tmp_path / "ml-100k", ["4", "nan", "5"])
    with pytest.raises(DataError, match="line 3"):
        load_node_data(spec, part, 0)
    assert not list(_isolated_cache.rglob("*.npz"))  # nothing kept of the bad read
    _udata(tmp_path / "ml-100k", ["4", "1", "5", "2"])
    node = load_node_data(spec, part, 0)
    assert np.isfinite(node.train.data).all() and node.train.nnz == 4


def test_a_cache_file_with_non_finite_values_is_not_trusted(tmp_path: Path) -> None:
    train = sp.csr_matrix(np.array([[1.0, 0.0], [0.0, 1.0]]))
    train.data[0] = np.nan
    node = NodeData(partition_id=0, user_ids=np.arange(2), train=train, test=train[:0],
                    user_features=None, n_items=2, n_users_total=2)
    path = tmp_path / "node.npz"
    assert data_cache.write_node(path, "k", node)
    assert data_cache.read_node(path, "k") is None


# -- 2. non-finite replies --------------------------------------------------------------------
def _reply(values: np.ndarray) -> RecordDict:
    return RecordDict({SHAPES_KEY: ConfigRecord({"a": [2], "b": [3]}),
                       VALUES_KEY: to_array_record({"v": values})})


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_reply_values_refuses_non_finite_values_naming_node_and_field(dtype: str,
                                                                      bad: float) -> None:
    values = np.array([0.25, 1.5, 2.0, 777.125, 3.0], dtype=dtype)
    values[3] = bad
    with pytest.raises(AggregationError) as err:
        reply_values(_reply(values), "node 7", [("a", (2,)), ("b", (3,))], (dtype,))
    text = str(err.value)
    assert text == ("node 7: field 'secagg.values.v' (declared array 'b') holds non-finite "
                    "values (NaN or inf); a sum takes finite numbers only")
    finite = np.array([0.25, 1.5, 2.0, 777.125, 3.0], dtype=dtype)
    assert reply_values(_reply(finite), "node 7", [("a", (2,)), ("b", (3,))], (dtype,)) \
        is not None


def test_a_plain_sum_refuses_a_nodes_nan_reply() -> None:
    """A node (here: its reply altered on the way) answering NaN stops the plain sum with an
    error naming it; the server never adds the NaN into the total."""
    with LocalGrid(build_client_app(**DIAGNOSTIC_APP), 3) as grid:
        messenger = Messenger(grid, timeout=10)
        nodes = messenger.node_ids()
        victim, exchange = nodes[1], messenger.exchange

        def poisoned(messages: Any, **kw: Any) -> Any:
            for node, reply in exchange(messages, **kw):
                if node == victim and not reply.has_error() and \
                        VALUES_KEY in reply.content.array_records:
                    v = reply.content.array_records[VALUES_KEY]["v"].numpy().copy()
                    v[-1] = np.nan
                    reply.content[VALUES_KEY] = to_array_record({"v": v})
                yield node, reply

        messenger.exchange = poisoned
        agg = PlainAggregator(messenger, nodes)
        with pytest.raises(AggregationError, match=rf"node {victim}.*field 'secagg.values.v' "
                           r"\(declared array 'b'\) holds non-finite values"):
            agg.sum("diag_secure_sum", diag_request(4, {"a": (3,), "b": (2,)}), max_abs=10.0)


# -- 3. server-chosen sizes -------------------------------------------------------------------
def _ask(action: str, records: dict[str, Any], policy: dict | None = None,
         data: dict | None = None, node_configs: dict | None = None) -> RecordDict:
    """One made-up request to the first node of a 3-node grid with the production app.

    A sum handler checks its request's sum record before anything else, so the request
    carries a plain one (and the policy allows plain sums unless the test says otherwise):
    what these tests refuse is a size, after that check."""
    content = RecordDict({"data": ConfigRecord({**TINY, **(data or {})}),
                          SUM_KEY: ConfigRecord({"mode": "plain", "sum-id": 1}), **records})
    with MaliciousGrid(build_client_app(policy={"allow-plain": True, **(policy or {})}), 3,
                       node_configs=node_configs, data={**TINY, **(data or {})}) as grid:
        return grid.ask(grid.ids[0], action, content)


def _power(p: Any = 4, X: np.ndarray | None = None) -> dict[str, Any]:
    arrays = {"item_deg": np.ones(N_ITEMS), **({} if X is None else {"X": X})}
    return {"arrays": to_array_record(arrays),
            "privirec": ConfigRecord({"p": p, "omega": "private", "seed": 0})}


def _never(what: str) -> Any:
    def fail(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"{what} ran although the request was past the budget")
    return fail


def test_privirec_p_past_the_budget_is_refused_before_omega_is_drawn(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The honest PriviRec-k run, its power request rewritten to p = 10**9."""
    monkeypatch.setattr("clients.privirec.omega_rows", _never("omega_rows"))
    from strategies.privirec import PriviRecK

    def huge_p(msg: Message) -> RecordDict | None:
        if msg.metadata.message_type != "query.privirec_power":
            return None
        content = copy_content(msg.content)
        content["privirec"] = ConfigRecord({**dict(content["privirec"]), "p": 10**9})
        return content

    cfg = resolve_config({**TINY, "protocol": "privirec-k", "privirec-k": 6,
                          "aggregator": "plain", "privirec-filter-rank": 3,
                          "privirec-filters": "gf-cf", "privirec-L": 1})
    with MaliciousGrid(build_client_app(policy={"allow-plain": True}), 3,
                       rewrite=huge_p) as grid:
        messenger = Messenger(grid, timeout=20)
        with pytest.raises(NodeError) as err:
            PriviRecK(cfg).execute(messenger)
    text = str(err.value)
    assert "refuses PriviRec's oversampling p=1000000000" in text
    assert "memory-budget-mb=4096" in text


@pytest.mark.parametrize("p", BAD_SIZES)
def test_privirec_p_that_is_not_a_positive_integer_is_refused(p: Any) -> None:
    with pytest.raises(Refused, match=r"size 'p' must be an integer >= 1, got"):
        _ask("privirec_power", _power(p))


def test_privirec_X_with_too_many_columns_is_refused_naming_the_budget() -> None:
    X = np.zeros((N_ITEMS, 6000))  # 30 items: 1.4 MiB of X, k x k Ritz sum 275 MiB
    with pytest.raises(Refused, match=r"power step with X of 6000 columns.*"
                                      r"memory-budget-mb=100"):
        _ask("privirec_power", _power(X=X), policy={"memory-budget-mb": 100})
    with pytest.raises(Refused, match=r"X has shape \(29, 2\), expected \(30, k\)"):
        _ask("privirec_power", _power(X=np.zeros((N_ITEMS - 1, 2))))


def test_privirec_evaluate_refuses_a_bad_top_k() -> None:
    records = {"arrays": to_array_record({"item_deg": np.ones(N_ITEMS)}),
               "privirec": ConfigRecord({"dataset": "synthetic", "top-k": -1}),
               "filters": ConfigRecord({"gf-cf": True})}
    with pytest.raises(Refused, match=r"size 'top-k' must be an integer >= 1, got -1"):
        _ask("privirec_evaluate", records)


def _fedmf(dim: int = 4, **over: Any) -> dict[str, Any]:
    from fedrec.wire.fedmf import TrainRequest

    base = TrainRequest(V=np.zeros((N_ITEMS, dim)), round=1, mode="exact", seed=0, lr=0.1,
                        reg=0.0, negatives=1, epochs=1, batch_size=8, clip=1.0, loss_cap=10.0)
    return {"protocol": ConfigRecord({**base.to_config(), **over}),
            "arrays": to_array_record({"V": np.zeros((N_ITEMS, dim))})}


@pytest.mark.parametrize("over", [{"negatives": 10**9},
                                  {"mode": "local", "epochs": 1, "batch-size": 10**12,
                                   "negatives": 10**6}])
def test_fedmf_sizes_past_the_budget_are_refused_before_training(
        monkeypatch: pytest.MonkeyPatch, over: dict) -> None:
    monkeypatch.setattr("clients.fedmf.bpr_step", _never("bpr_step"))
    monkeypatch.setattr("clients.fedmf.bpr_train_local", _never("bpr_train_local"))
    with pytest.raises(Refused, match=r"refuses FedMF \w+ training .*memory-budget-mb="):
        _ask("fedmf_train", _fedmf(**over))


def test_fedmf_mf_dim_past_the_budget_is_refused() -> None:
    with pytest.raises(Refused, match=r"FedMF exact training \(mf-dim=20000.*"
                                      r"memory-budget-mb=10"):
        _ask("fedmf_train", _fedmf(dim=20000), policy={"memory-budget-mb": 10})


@pytest.mark.parametrize("key", ["negatives", "batch-size", "epochs"])
@pytest.mark.parametrize("bad", BAD_SIZES)
def test_fedmf_sizes_that_are_not_positive_integers_are_refused(key: str, bad: Any) -> None:
    over = {"mode": "local", "epochs": 1, "batch-size": 8, key: bad}
    with pytest.raises(Refused, match=rf"size '{key}' must be an integer >= 1"):
        _ask("fedmf_train", _fedmf(**over))


def _mvmf(**over: Any) -> dict[str, Any]:
    from fedrec.recsys.multiview import MVMFConfig
    from fedrec.wire.mvmf import TrainRequest
    from strategies.mvmf import model_fields

    base = TrainRequest(Q=np.zeros((N_ITEMS, 6)), U=np.zeros((10, 6)),
                        **model_fields(MVMFConfig(), 0, 10, 4.0))
    return {"protocol": ConfigRecord({**base.to_config(), **over}),
            "arrays": to_array_record({"Q": np.zeros((N_ITEMS, 6)), "U": np.zeros((10, 6))})}


def test_mvmf_dim_past_the_budget_is_refused_by_users_and_item_server() -> None:
    with pytest.raises(Refused, match=r"refuses MVMF user step \(dim=100000\).*"
                                      r"memory-budget-mb=4096"):
        _ask("mvmf_train", _mvmf(dim=100_000))
    big_Q = {"arrays": to_array_record({"Q": np.zeros((N_ITEMS, 3000))})}
    with pytest.raises(Refused, match=r"MVMF item-server step \(K=3000\).*memory-budget-mb=50"):
        _ask("mvmf_item_gradient", {**_mvmf(), **big_Q}, policy={"memory-budget-mb": 50},
             node_configs={0: {"role": "item-server"}})


@pytest.mark.parametrize("key", ["dim", "top-k", "epoch"])
def test_mvmf_sizes_that_are_not_integers_are_refused(key: str) -> None:
    with pytest.raises(Refused, match=rf"size '{key}' must be an integer >= \d, got -2"):
        _ask("mvmf_evaluate", _mvmf(**{key: -2}))


@pytest.mark.parametrize("new", [[-1.0], [N_ITEMS], [2.5], [3.0, 3.0]])
def test_mvmf_new_items_that_are_not_distinct_item_indices_are_refused(new: list) -> None:
    request = _mvmf()
    arrays = {"Q": np.zeros((N_ITEMS, 6)), "U": np.zeros((10, 6)), "new-items": np.array(new)}
    with pytest.raises(Refused, match=rf"'new-items' must be distinct integer item indices "
                                      rf"in \[0, {N_ITEMS}\); its {len(new)} values are not"):
        _ask("mvmf_evaluate", {**request, "arrays": to_array_record(arrays)})


@pytest.mark.parametrize("sizes", [{"synthetic-users": 10**12},
                                   {"synthetic-items": 10**9, "synthetic-rank": 64}])
def test_a_synthetic_data_config_past_the_budget_is_refused_before_generating(
        monkeypatch: pytest.MonkeyPatch, sizes: dict) -> None:
    monkeypatch.setattr(synthetic, "generate", _never("synthetic.generate"))
    with pytest.raises(Refused, match=r"refuses the data config's synthetic dataset .*"
                                      r"memory-budget-mb=4096"):
        _ask("hello", {}, data=sizes)


@pytest.mark.parametrize("bad", [-5, 0, 2.5, "lots"])
def test_a_synthetic_size_that_is_not_a_positive_integer_is_refused(bad: Any) -> None:
    """A request naming a bad size is refused naming the key; the node's own description
    (its operator's) is what it would have loaded anyway."""
    content = RecordDict({"data": ConfigRecord({**TINY, "synthetic-users": bad})})
    with MaliciousGrid(build_client_app(policy={}), 3, data=TINY) as grid:
        with pytest.raises(Refused, match=r"synthetic-users"):
            grid.ask(grid.ids[0], "hello", content)


@pytest.mark.parametrize("bad", [-5, 0, 2.5, "lots"])
def test_an_operators_bad_synthetic_size_is_refused_before_any_node_starts(bad: Any) -> None:
    from tests.localgrid import LocalGrid

    with pytest.raises(ValueError, match=r"synthetic-users"):
        LocalGrid(build_client_app(policy={}), 3, data={**TINY, "synthetic-users": bad})
    with pytest.raises(ValueError, match=r"synthetic-users"):
        build_client_app(policy={}, data={**TINY, "synthetic-users": bad})


def test_honest_sizes_pass() -> None:
    plain = {"secagg": ConfigRecord({"mode": "plain", "sum-id": 1, "wire-dtype": "float64"})}
    reply = _ask("privirec_power", {**_power(4), **plain}, policy={"allow-plain": True})
    assert reply.config_records[SHAPES_KEY]["Y"] == [N_ITEMS, 4]
    reply = _ask("fedmf_train", {**_fedmf(), **plain}, policy={"allow-plain": True})
    assert reply.config_records[SHAPES_KEY]["grad"] == [N_ITEMS, 4]
    assert _ask("hello", {}).config_records["info"]["n-items"] == N_ITEMS


def test_privirec_dense_item_item_sum_past_the_budget_is_refused() -> None:
    """The catalogue size comes from the server's data config, so the dense |I| x |I| sum
    is checked against the budget too."""
    with pytest.raises(Refused, match=r"PriviRec's dense item-item sum \(600 items\).*"
                                      r"memory-budget-mb=3"):
        _ask("privirec_gram", {"privirec": ConfigRecord({"alpha": 0.5})},
             policy={"memory-budget-mb": 3}, data={"synthetic-items": 600})


def test_fedmf_evaluate_checks_top_k_and_the_dimension() -> None:
    records = _fedmf()
    records["protocol"] = ConfigRecord({"seed": 0, "top-k": 0})
    with pytest.raises(Refused, match=r"size 'top-k' must be an integer >= 1, got 0"):
        _ask("fedmf_evaluate", records)
    # V itself (4.6 MiB) is refused from its serialised size before it is deserialised
    with pytest.raises(Refused, match=r"(FedMF evaluation \(mf-dim=20000\)|the request's "
                                      r"arrays 'arrays' \(V\)).*memory-budget-mb=1"):
        _ask("fedmf_evaluate", _fedmf(dim=20000), policy={"memory-budget-mb": 1})
