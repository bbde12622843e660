"""Every handler's server-chosen sizes and iteration counts stay inside the node's policy.

For each registered handler (enumerated from the handler tables, so a new handler fails
:func:`test_every_handler_has_a_bounds_case` until it gets a case here), hypothesis draws
server-chosen sizes and iteration counts inside the run config's declared ranges
(``fedrec/config.py`` keys; unbounded above where the declaration is) and sends them to one
node of the production ClientApp. With ``tracemalloc`` on, the node's peak over the request
must stay under its ``memory-budget-mb``, or the node refuses first with an error naming
itself and the policy key; an iteration count past ``max-iterations`` is refused naming the
key and the opt-in (a SIGALRM fails an example that runs long instead). Refusals carry no
path of the node. Fast: a 4 MiB budget, 48 synthetic users over 3 nodes, a few examples each.
"""

from __future__ import annotations

import math
import re
import signal
import tracemalloc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, RecordDict
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedrec.records import to_array_record
from fl_app.client_app import build_client_app
from fl_app.registry import builtin_keys
from tests.malicious import MaliciousGrid, Refused, production_handlers

BUDGET_MB = 4
MAX_ITERATIONS = 40
SECONDS = 20  # an example still running after this ran a server-chosen loop unbounded
TINY = {"dataset": "synthetic", "synthetic-users": 48, "synthetic-items": 30, "seed": 1,
        "partition": "shards-contiguous"}
N_ITEMS, N_ATTRIBUTES = 30, 10
HUGE = 10**12  # the upper end of a range the declaration leaves open
def _plain() -> dict[str, ConfigRecord]:
    """A plain sum's record (fresh for each request: a test may alter it)."""
    return {"secagg": ConfigRecord({"mode": "plain", "sum-id": 1, "wire-dtype": "float64",
                                    "max-abs": 1e9})}
_KEYS = {name: key for name, (key, _) in builtin_keys().items()}

OUTCOMES: list | None = [] if __import__("os").environ.get("BOUNDS_DEBUG") else None
Request = tuple[str, RecordDict, dict[str, int]]  # message type, content, counts drawn


def declared(name: str, *, cap: int = HUGE) -> st.SearchStrategy[int]:
    """Integers in run-config key ``name``'s declared range (its max, else up to ``cap``):
    small ones, log-uniform ones (every order of magnitude alike) and uniform ones."""
    key = _KEYS[name]
    lo = int(key.min if key.min is not None else 0)
    hi = int(key.max) if key.max is not None else cap
    log_uniform = st.floats(0.0, math.log10(hi - lo + 1)).map(lambda e: lo + int(10**e) - 1)
    return st.one_of(st.integers(lo, min(hi, lo + 40)), log_uniform, st.integers(lo, hi))


def _content(records: dict[str, Any], data: dict | None = None) -> RecordDict:
    return RecordDict({"data": ConfigRecord({**TINY, **(data or {})}), **records})


# -- one request builder per handler ---------------------------------------------------------
@st.composite
def _fedsvd_block(draw: Any, output: bool) -> Request:
    from fedrec.recsys.power_svd import SCHEMES

    rank = draw(declared("fedsvd-rank", cap=3000))
    t_to = draw(declared("fedsvd-iterations", cap=10**9))
    p = t_to + 1 if output else t_to  # t-to is (not) a synchronization
    cfg = {"scheme": draw(st.sampled_from(SCHEMES)), "t-from": 0, "t-to": t_to,
           "rows-total": 1000.0, "n-nodes": 3, "fedsvd-k": 1, "fedsvd-rank": rank,
           "fedsvd-iterations": t_to, "fedsvd-sync-every": p, "fedsvd-sigma": 0.1,
           "fedsvd-sigma-server": 0.1, "fedsvd-z-hat": 0.2, "fedsvd-m-hat": 1.0,
           "fedsvd-delta": 1e-5, "fedsvd-ddp": False, "seed": 0}
    Z = np.linalg.qr(np.random.default_rng(0).standard_normal((N_ITEMS, min(rank, N_ITEMS))))[0]
    Z = np.resize(Z, (N_ITEMS, rank))
    return ("query", _content({"protocol": ConfigRecord(cfg), **_plain(),
                               "arrays": to_array_record({"Z": Z})}), {"t-to": t_to})


@st.composite
def _fedsvd_evaluate(draw: Any) -> Request:
    rank = draw(declared("fedsvd-rank", cap=3000))
    Z = np.full((N_ITEMS, rank), 0.1)
    cfg = {"top-k": draw(declared("lpgcn-top-k", cap=10**6))}
    return ("query", _content({"protocol": ConfigRecord(cfg), **_plain(),
                               "arrays": to_array_record({"Z": Z})}), {})


@st.composite
def _dpp_prototypes(draw: Any) -> Request:
    counts = {key: draw(declared(f"dpp-{key}", cap=10**9)) for key in ("trials", "shifts",
                                                                       "swaps")}
    cfg = {"k": draw(st.integers(1, 16)), "epsilon": 1.0, "value_max": 5.0,
           "sparsity": draw(declared("dpp-sparsity", cap=10**6)), "radius": 0.0,
           "delta": 0.1, "jl_coef": 0.5, "accounting": "strict", "seed": 0, **counts}
    total = {"trials": counts["trials"], "shifts": counts["trials"] * counts["shifts"],
             "swaps": counts["trials"] * counts["swaps"]}
    return ("query", _content({"protocol": ConfigRecord(cfg)}), total)


@st.composite
def _dpp_evaluate(draw: Any) -> Request:
    rank = draw(declared("dpp-rank", cap=5000))
    iters = draw(declared("dpp-nmf-iters", cap=10**9))
    cfg = {"reg": 0.1, "nmf-iters": iters, "value-max": 5.0,
           "top-k": draw(declared("lpgcn-top-k", cap=10**6))}
    V = np.full((N_ITEMS, rank), 0.5)
    return ("query", _content({"protocol": ConfigRecord(cfg), **_plain(),
                               "arrays": to_array_record({"V": V})}), {"nmf-iters": iters})


@st.composite
def _fedmf_train(draw: Any) -> Request:
    dim = draw(declared("mf-dim", cap=5000))
    mode = draw(st.sampled_from(("exact", "local")))
    cfg = {"seed": 0, "mode": mode, "negatives": draw(declared("mf-negatives", cap=10**6)),
           "lr": 0.01, "reg": 0.01, "round": 1, "factor-bound": 100.0, "loss-cap": 10.0,
           "epochs": draw(declared("mf-local-epochs", cap=10**9)),
           "batch-size": draw(declared("mf-batch-size", cap=10**6)), "clip": 1.0}
    counts = {"epochs": cfg["epochs"]} if mode == "local" else {}
    return ("query", _content({"protocol": ConfigRecord(cfg), **_plain(),
                               "arrays": to_array_record({"V": np.zeros((N_ITEMS, dim))})}),
            counts)


@st.composite
def _fedmf_evaluate(draw: Any) -> Request:
    dim = draw(declared("mf-dim", cap=5000))
    cfg = {"seed": 0, "top-k": draw(declared("lpgcn-top-k", cap=10**6))}
    return ("query", _content({"protocol": ConfigRecord(cfg), **_plain(),
                               "arrays": to_array_record({"V": np.zeros((N_ITEMS, dim))})}),
            {})


@st.composite
def _fedmf_stock(draw: Any, kind: str) -> Request:
    dim = draw(declared("mf-dim", cap=5000))
    cfg = {"fedrec-protocol": "fedmf", "seed": 0, "mf-lr": 0.01, "mf-reg": 0.01,
           "server-round": 1, "mf-negatives": draw(declared("mf-negatives", cap=10**6)),
           "top-k": draw(declared("lpgcn-top-k", cap=10**6))}
    return (kind, _content({"config": ConfigRecord(cfg),
                            "arrays": ArrayRecord([np.zeros((N_ITEMS, dim))])}), {})


def _mvmf_config(dim: int, top_k: int) -> ConfigRecord:
    from fedrec.recsys.multiview import MVMFConfig
    from strategies.mvmf import node_config

    cfg = node_config(MVMFConfig(), 0, {"mvmf-top-k": top_k, "mvmf-threshold": 4.0})
    return ConfigRecord({**cfg, "dim": dim})


@st.composite
def _mvmf_user(draw: Any) -> Request:
    dim = draw(declared("mvmf-dim", cap=2000))
    arrays = {"Q": np.zeros((N_ITEMS, dim)), "U": np.zeros((N_ATTRIBUTES, dim))}
    return ("query", _content({"protocol": _mvmf_config(dim, draw(declared("mvmf-top-k",
                                                                           cap=10**6))),
                               **_plain(), "arrays": to_array_record(arrays)}), {})


@st.composite
def _mvmf_item(draw: Any) -> Request:
    dim = draw(declared("mvmf-dim", cap=2000))
    return ("query", _content({"protocol": _mvmf_config(dim, 10),
                               "arrays": to_array_record({"Q": np.zeros((N_ITEMS, dim))})}),
            {})


@st.composite
def _privirec_power(draw: Any) -> Request:
    cfg = {"p": draw(declared("privirec-k", cap=10**9)), "omega": "private", "seed": 0}
    arrays: dict[str, np.ndarray] = {"item_deg": np.ones(N_ITEMS)}
    if draw(st.booleans()):
        arrays["X"] = np.zeros((N_ITEMS, draw(declared("privirec-k", cap=3000))))
        cfg["ritz"] = draw(st.booleans())
    return ("query", _content({"privirec": ConfigRecord(cfg), **_plain(),
                               "arrays": to_array_record(arrays)}), {})


@st.composite
def _privirec_gram(draw: Any) -> Request:
    items = draw(declared("synthetic-items", cap=2000))
    return ("query", _content({"privirec": ConfigRecord({"alpha": 0.5}), **_plain()},
                              {"synthetic-items": items}), {})


@st.composite
def _hello(draw: Any) -> Request:
    sizes = {key: draw(declared(key, cap=cap)) for key, cap in
             (("synthetic-users", 10**7), ("synthetic-items", 10**6),
              ("synthetic-rank", 10**4))}
    return ("query", _content({}, sizes), {})


@st.composite
def _no_sizes(draw: Any) -> Request:
    """A handler whose allocations the server sizes only through state it set up earlier
    in the run (key setup, sums, LP-GCN's setup): the request alone, drawn ids, no state."""
    record = {"sum-id": draw(st.integers(0, 2**40)), "batch": draw(st.integers(1, 10**6)),
              "n": draw(st.integers(0, 10**9)), "purpose": "x", "mode": "plain"}
    return ("query", _content({"secagg": ConfigRecord(record)}), {})


@st.composite
def _nodeset(draw: Any) -> Request:
    """The run's node set, as long as the server likes (ids from 1: the tiny grid's nodes)."""
    n = draw(st.one_of(st.integers(1, 40), st.integers(1, 10**6)))
    return ("query", _content({"nodeset": ConfigRecord({"members": list(range(1, n + 1))})}),
            {})


REQUESTS: dict[str, Callable[[], st.SearchStrategy[Request]]] = {
    "hello": _hello,
    "nodeset_commit": _nodeset,
    "fedsvd_sync": lambda: _fedsvd_block(False),
    "fedsvd_output": lambda: _fedsvd_block(True),
    "fedsvd_evaluate": _fedsvd_evaluate,
    "dpp_prototypes": _dpp_prototypes,
    "dpp_evaluate": _dpp_evaluate,
    "fedmf_train": _fedmf_train,
    "fedmf_evaluate": _fedmf_evaluate,
    "train.fedmf": lambda: _fedmf_stock("train"),
    "evaluate.fedmf": lambda: _fedmf_stock("evaluate"),
    "mvmf_train": _mvmf_user,
    "mvmf_evaluate": _mvmf_user,
    "mvmf_item_gradient": _mvmf_item,
    "mvmf_item_cold": _mvmf_item,
    "privirec_power": _privirec_power,
    "privirec_gram": _privirec_gram,
}
#: Handlers sized only through earlier state of the run (or not by the server at all).
STATEFUL = ("relay_keys", "secagg_advertise", "secagg_share", "secagg_confirm",
            "secagg_unmask", "keys_create_secret", "keys_receive_secret", "aggregate_decrypt",
            "fedsvd_noise_product", "privirec_degrees", "privirec_evaluate", "lpgcn_count",
            "lpgcn_holdings", "lpgcn_assign", "lpgcn_verify", "lpgcn_round",
            "lpgcn_evaluate", "lpgcn_losses")
ROLES = {"mvmf_item_gradient": "item-server", "mvmf_item_cold": "item-server",
         "dpp_prototypes": "silo", "dpp_evaluate": "silo"}


def all_actions() -> list[str]:
    query, train, evaluate = production_handlers()
    return sorted([*query, *(f"train.{p}" for p in train),
                   *(f"evaluate.{p}" for p in evaluate)])


def test_every_handler_has_a_bounds_case() -> None:
    missing = [a for a in all_actions() if a not in REQUESTS and a not in STATEFUL]
    assert not missing, f"handlers without a bounds case in tests/test_bounds.py: {missing}"


# -- the property ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> Any:
    ledger = tmp_path_factory.mktemp("ledger") / "dp-ledger.json"
    return build_client_app(policy={"allow-plain": True, "memory-budget-mb": BUDGET_MB,
                                    "max-iterations": MAX_ITERATIONS, "dp-budget": 1e9,
                                    "dp-ledger": str(ledger)})


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FEDREC_CACHE", str(tmp_path / "cache"))


class _TooLong(BaseException):
    """Raised by SIGALRM: not an Exception, so no handler catches it as a refusal."""


@contextmanager
def _deadline(seconds: float) -> Iterator[None]:
    def fire(*_: Any) -> None:
        raise _TooLong(f"still running after {seconds} s")

    old = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def measure(app: Any, action: str, request: Request) -> tuple[int, str | None]:
    """(peak bytes traced while the node handles ``request``, its refusal or None)."""
    kind, content, _ = request
    role = ROLES.get(action)
    configs = {0: {"role": role}} if role else None
    with MaliciousGrid(app, 3, node_configs=configs) as grid:
        node = grid.ids[0]
        if action != "hello":  # the node's rows, loaded before tracing (requests share them)
            try:
                grid.ask(node, "hello", RecordDict({"data": content["data"]}))
            except Refused:
                pass
        message_type = kind if kind != "query" else f"query.{action.split('.')[-1]}"
        tracemalloc.start()
        try:
            base = tracemalloc.get_traced_memory()[0]
            refusal = None
            with _deadline(SECONDS):
                try:
                    grid.ask(node, action, content, message_type=message_type)
                except Refused as err:
                    refusal = str(err)
            peak = tracemalloc.get_traced_memory()[1] - base
        finally:
            tracemalloc.stop()
    return peak, refusal


@pytest.mark.parametrize("action", sorted(REQUESTS))
@settings(max_examples=12, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture,
                                 HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_a_request_stays_under_the_budget_or_is_refused_first(app: Any, action: str,
                                                               data: st.DataObject) -> None:
    request = data.draw(REQUESTS[action](), label="request")
    try:
        peak, refusal = measure(app, action, request)
    except _TooLong as err:
        pytest.fail(f"{action}: a server-chosen loop ran unbounded ({err}); counts "
                    f"{request[2]}")
    if OUTCOMES is not None:
        OUTCOMES.append((action, request[2], peak, refusal))
    assert peak <= BUDGET_MB * 2**20, (
        f"{action}: the node's peak was {peak / 2**20:.1f} MiB over its "
        f"memory-budget-mb={BUDGET_MB} without a refusal ({refusal!r})")
    over = {k: v for k, v in request[2].items() if v > MAX_ITERATIONS}
    if over:
        assert refusal is not None and "max-iterations" in refusal, (
            f"{action}: counts {over} past max-iterations={MAX_ITERATIONS} were not refused "
            f"for it ({refusal!r})")
    if refusal is not None:
        assert re.search(r"node 1001|partition 0", refusal), refusal
        # a clear refusal of the node's own, not a library error deep in the math
        assert not re.search(r"gufunc|operand|could not broadcast|out of bounds", refusal), \
            refusal
        if "MiB" in refusal or "iterations" in refusal:
            assert re.search(r"memory-budget-mb|max-iterations", refusal), refusal
            assert "node config" in refusal  # the opt-in


@pytest.mark.parametrize("items", [30, 2000])
def test_a_fedsvd_rank_is_bounded_with_its_alignment(app: Any, items: int) -> None:
    """Rank 1500: on 30 items the d x r part of a block is 0.4 MiB but the alignment's r x r
    matrices are 17 MiB each (and no orthonormal basis has more columns than rows); on 2000
    items the basis alone is 23 MiB, refused from its serialised size before the node
    deserialises a copy. Either way the node refuses before computing."""
    cfg = {"scheme": "fedpower", "t-from": 0, "t-to": 1, "rows-total": 1000.0, "n-nodes": 3,
           "fedsvd-k": 1, "fedsvd-rank": 1500, "fedsvd-iterations": 1,
           "fedsvd-sync-every": 1, "fedsvd-sigma": 0.1, "fedsvd-sigma-server": 0.1,
           "fedsvd-z-hat": 0.2, "fedsvd-m-hat": 1.0, "fedsvd-delta": 1e-5, "fedsvd-ddp": False,
           "seed": 0}
    Z = np.resize(np.eye(items), (items, 1500))
    content = _content({"protocol": ConfigRecord(cfg), **_plain(),
                        "arrays": to_array_record({"Z": Z})}, {"synthetic-items": items})
    peak, refusal = measure(app, "fedsvd_sync", ("query", content, {}))
    expected = r"1 <= r <= 30" if items == 30 else r"refuses the request's arrays 'arrays' " \
        r"\(Z\).*memory-budget-mb=4"
    assert refusal is not None and re.search(expected, refusal), (refusal, peak)
    assert peak <= BUDGET_MB * 2**20


@pytest.mark.parametrize("action", STATEFUL)
@settings(max_examples=3, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_a_stateful_handler_sent_the_request_alone_stays_under_the_budget(
        app: Any, action: str, data: st.DataObject) -> None:
    """Handlers sized through earlier state of the run, sent drawn ids and counts with no
    state: the node answers or refuses within its budget, naming itself."""
    peak, refusal = measure(app, action, data.draw(_no_sizes(), label="request"))
    assert peak <= BUDGET_MB * 2**20, (action, peak, refusal)
    assert refusal is None or re.search(r"node 1001|partition 0", refusal), refusal


# -- non-finite values the server sends ------------------------------------------------------
def _float_fields(content: RecordDict) -> list[tuple[str, str]]:
    out = [(r, n) for r, rec in content.array_records.items() for n in rec
           if np.dtype(rec[n].dtype).kind == "f"]
    out += [(r, n) for r, rec in content.config_records.items() if r != "data"
            for n, v in rec.items() if isinstance(v, float)]
    return out


#: Requests that carry no float the server chooses (only sizes and ids).
NO_FLOATS = ("hello", "nodeset_commit")


@pytest.mark.parametrize("action", sorted(a for a in REQUESTS if a not in NO_FLOATS))
@settings(max_examples=2, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_a_non_finite_server_value_is_refused_naming_node_and_field(
        app: Any, action: str, data: st.DataObject) -> None:
    """Every float the server sends (model arrays, config numbers) must be finite; the
    refusal names the node and the field, before any handler math ("scores contains NaN")."""
    kind, content, counts = data.draw(REQUESTS[action](), label="request")
    fields = _float_fields(content)
    record, name = data.draw(st.sampled_from(fields), label="field")
    bad = data.draw(st.sampled_from([np.nan, np.inf, -np.inf]), label="value")
    if name in content.config_records.get(record, {}):
        content.config_records[record][name] = float(bad)
    else:
        arrays = dict(ArrayRecord.items(content.array_records[record]))
        values = arrays[name].numpy().copy()
        values.flat[data.draw(st.integers(0, values.size - 1))] = bad
        if record == "arrays" and kind != "query":  # the stock path's unnamed list
            content[record] = ArrayRecord([values])
        else:
            content[record] = to_array_record({**{k: v.numpy() for k, v in arrays.items()},
                                               name: values})
    _, refusal = measure(app, action, (kind, content, counts))
    assert refusal is not None and re.search(
        rf"node 1001 \(partition 0\) refuses the request: field '{re.escape(record)}\."
        rf"{re.escape(name)}' holds non-finite values", refusal), refusal


# -- errors carry no node path and no node value ---------------------------------------------
def _ml100k_with_nan(folder: Path) -> None:
    folder.mkdir(parents=True)
    (folder / "u.data").write_text("1\t1\t4\t881250949\n2\t2\tnan\t881250950\n")


@pytest.mark.parametrize("fault", ["another's key", "unreadable key", "bad roster",
                                   "missing data-dir", "bad data file"])
def test_a_refusal_names_the_key_never_the_nodes_path(tmp_path: Path, fault: str) -> None:
    from fedrec.secure.identity import keygen

    ids = tmp_path / "secret-ids"
    keygen(3, ids)
    config: dict[str, Any] = {"identity-key": str(ids / "node-0.key"),
                              "roster": str(ids / "roster.json"),
                              "allow-simulated-identity": "false"}
    data: dict[str, Any] = {}
    key = "identity-key"
    if fault == "another's key":
        config["identity-key"] = str(ids / "node-1.key")
    elif fault == "unreadable key":
        (ids / "node-0.key").write_text("not a key")
    elif fault == "bad roster":
        (ids / "roster.json").write_text("{}")
        key = "roster"
    elif fault == "missing data-dir":
        config["data-dir"] = str(tmp_path / "holder-data")
        data, key = {"dataset": "ml-100k"}, ""
    else:
        _ml100k_with_nan(tmp_path / "holder-data" / "ml-100k")
        config["data-dir"] = str(tmp_path / "holder-data")
        data, key = {"dataset": "ml-100k", "test-ratio": 0.0}, ""
    with MaliciousGrid(build_client_app(policy={}), 3, node_configs={0: config}) as grid:
        with pytest.raises(Refused) as err:
            grid.ask(grid.ids[0], "relay_keys" if key else "hello", _content({}, data))
    text = str(err.value)
    assert str(tmp_path) not in text and "secret-ids" not in text and "holder-data" not in \
        text, text
    assert re.search(r"node 1001|partition 0", text), text
    assert f"'{key}'" in text if key else "<data-dir>" in text, text


def test_a_factor_bound_refusal_does_not_show_the_factor(app: Any) -> None:
    """FedMF's exact mode refuses when a user factor passes the declared bound: the
    refusal says so, never the factor's value (a value of the node's model)."""
    cfg = {"seed": 0, "mode": "exact", "negatives": 1, "lr": 0.01, "reg": 0.01, "round": 1,
           "factor-bound": 1e-9, "loss-cap": 10.0}
    request = ("query", _content({"protocol": ConfigRecord(cfg), **_plain(), "arrays":
                                  to_array_record({"V": np.zeros((N_ITEMS, 4))})}), {})
    _, refusal = measure(app, "fedmf_train", request)
    assert refusal is not None and "exceeds mf-factor-bound=1e-09" in refusal, refusal
    assert not re.search(r"reached|\d\.\d+e-0[1-3]|0\.0\d", refusal), refusal


def test_the_default_policy_bounds_the_reviews_requests() -> None:
    """Under the default max-iterations (10000), nmf-iters = 10^9 (hours of HALS sweeps) is
    refused at once, naming the node, the key and the opt-in."""
    app = build_client_app(policy={"allow-plain": True})
    nmf = ("query", _content({"protocol": ConfigRecord({"reg": 0.1, "nmf-iters": 10**9,
                                                        "value-max": 5.0}), **_plain(),
                              "arrays": to_array_record({"V": np.full((N_ITEMS, 4), 0.5)})}),
           {})
    _, refusal = measure(app, "dpp_evaluate", nmf)
    assert refusal is not None and "'nmf-iters' asks for 1,000,000,000 iterations" in refusal \
        and "max-iterations=10000" in refusal and "node config 'max-iterations=" in refusal
    assert "node 1001 (partition 0)" in refusal
