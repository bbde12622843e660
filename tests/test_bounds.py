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
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, Context, RecordDict
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clients.boundary import node_paths, scrub_exception
from fedrec.records import to_array_record
from fl_app.client_app import build_client_app
from fl_app.registry import builtin_keys
from tests.bounds import (
    BUDGET_MB,
    MAX_ITERATIONS,
    SECONDS,
    TooLong,
    check_refusal,
    deadline,
    traced_peak,
)
from tests.differential import copy_records
from tests.malicious import MaliciousGrid, Refused, production_handlers
from tests.stateful import Step, capture

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
    from fedrec.wire.mvmf import ModelRequest
    from strategies.mvmf import model_fields

    base = ModelRequest(**model_fields(MVMFConfig(dim=dim), 0, top_k, 4.0))
    return ConfigRecord(base.to_config())


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
def _nodeset(draw: Any) -> Request:
    """The run's node set, as long as the server likes: distinct ids from 1001 (the tiny
    grid's nodes first, so the node is a member), so that no distinctness or membership
    check refuses it before its length is measured."""
    n = draw(st.one_of(st.integers(1, 40), st.integers(1, 10**6)))
    return ("query", _content({"nodeset": ConfigRecord({"members": list(range(1001,
                                                                              1001 + n))})}),
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
ROLES = {"mvmf_item_gradient": "item-server", "mvmf_item_cold": "item-server",
         "dpp_prototypes": "silo", "dpp_evaluate": "silo"}


def all_actions() -> list[str]:
    query, train, evaluate = production_handlers()
    return sorted([*query, *(f"train.{p}" for p in train),
                   *(f"evaluate.{p}" for p in evaluate)])


def test_every_handler_has_a_bounds_case(stateful_steps: dict) -> None:
    """Each registered handler is measured: from a request built here (:data:`REQUESTS`),
    or at its step of an honest run (:func:`stateful_steps`); a new handler that neither
    reaches fails here."""
    missing = [a for a in all_actions() if a not in REQUESTS and a not in stateful_steps]
    assert not missing, f"handlers without a bounds case in tests/test_bounds.py and reached " \
        f"by no honest run of tests/stateful.py: {missing}"


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


def _offered(content: RecordDict) -> dict[str, Any] | None:
    """The data description the request names, as the nodes' operator's (sizes drawn here
    are the operator's then: the node still checks them against its budget); None when it
    names none or one that does not parse (the node then refuses the request)."""
    from datasets import describe

    if "data" not in content.config_records:
        return None
    named = dict(content.config_records["data"])
    try:
        describe(named)
    except (TypeError, ValueError):
        return None
    return named


def measure(app: Any, action: str, request: Request) -> tuple[int, str | None]:
    """(peak bytes traced while the node handles ``request``, its refusal or None)."""
    kind, content, _ = request
    role = ROLES.get(action)
    configs = {0: {"role": role}} if role else None
    with MaliciousGrid(app, 3, node_configs=configs, data=_offered(content)) as grid:
        node = grid.ids[0]
        if action != "hello":  # the node's rows, loaded before tracing (requests share them)
            try:
                grid.ask(node, "hello", RecordDict({"data": content["data"]}))
            except Refused:
                pass
        message_type = kind if kind != "query" else f"query.{action.split('.')[-1]}"
        refusal = None
        with traced_peak() as peak, deadline(SECONDS):
            try:
                grid.ask(node, action, content, message_type=message_type)
            except Refused as err:
                refusal = str(err)
    return peak.bytes, refusal


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
    except TooLong as err:
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


# -- handlers at their step of a run ----------------------------------------------------------
@pytest.fixture(scope="module")
def stateful_steps(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[Step]]:
    """Every registered handler without a request builder above, at its step of an honest
    run (``tests/stateful.py``): the state its earlier steps set up is there, so its work
    after the state checks is what gets measured."""
    import os

    from tests.test_differential import CASES, DATA

    os.environ.setdefault("FEDREC_CACHE", str(tmp_path_factory.mktemp("cache")))
    ledger = tmp_path_factory.mktemp("ledger") / "dp-ledger.json"
    return capture(set(all_actions()) - set(REQUESTS), CASES, DATA, {"dp-ledger": str(ledger)})


def _stateful_app(step: Step, ledger: Path) -> Any:
    """The run's ClientApp under the bounds' policy (the run's opt-ins kept)."""
    from fl_app.registry import client_module
    from tests.test_differential import CASES

    protocol = step.case.split("@")[0]
    return build_client_app([m for m in [client_module(protocol)] if m],
                            policy={**CASES[step.case].policy, "memory-budget-mb": BUDGET_MB,
                                    "max-iterations": MAX_ITERATIONS,
                                    "dp-ledger": str(ledger)})


def _size_fields(content: RecordDict) -> list[tuple[str, str, str]]:
    """(record, field, kind) of every size a server may choose in a request: each integer
    config value, each list's length, each array's length along each axis (the dataset
    config is the data hook's, measured by ``hello``)."""
    out = []
    for key, record in content.items():
        if key == "data":
            continue
        if isinstance(record, ArrayRecord):
            out += [(key, name, f"axis {axis}") for name, arr in record.items()
                    for axis in range(len(arr.shape))]
        elif isinstance(record, ConfigRecord):
            for name, value in record.items():
                if isinstance(value, int) and not isinstance(value, bool):
                    out.append((key, name, "int"))
                elif isinstance(value, list):
                    out.append((key, name, "length"))
    return out


def _declared_for(name: str) -> st.SearchStrategy[int]:
    """A request field's values: its run-config key's range where exactly one key names it
    (``dim`` -> ``lpgcn-dim``), else any count up to 10^12."""
    keys = [k for k in _KEYS if k == name or k.endswith(f"-{name}")]
    return declared(keys[0]) if len(keys) == 1 else st.one_of(
        st.integers(0, 64), st.floats(0.0, 12.0).map(lambda e: int(10**e)))


#: The largest array a drawn size makes in the test process itself (past the node's budget).
ARRAY_CAP = 8 * BUDGET_MB * 2**20


class Resized:
    """A drawn request, shown by what changed (the content can be megabytes)."""

    def __init__(self, content: RecordDict, what: str) -> None:
        self.content, self.what = content, what

    def __repr__(self) -> str:
        return self.what


def _lengthened(values: list, n: int) -> list:
    """``values`` cut or lengthened to ``n``: a list of ids (integers) grows by distinct ids
    past its largest, so that a longer list of node ids reaches the node's length bounds,
    not its distinctness check; other lists repeat their values."""
    if n <= len(values):
        return values[:n]
    if all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        top = max(values, default=0)
        return [*values, *range(top + 1, top + 1 + n - len(values))]
    return [values[i % len(values)] for i in range(n)]


def resized(step: Step, key: str, name: str, kind: str, n: int) -> RecordDict:
    """The step's honest request with one size set to ``n``: an integer (``int``), a list's
    length (``length``: :func:`_lengthened`) or an array's length along an axis (``axis
    <i>``: its rows repeated)."""
    content = step.request()
    record = content[key]
    if kind == "int":
        record[name] = n
    elif kind == "length":
        record[name] = _lengthened(list(record[name]), n)
    else:
        arrays = {k: a.numpy() for k, a in record.items()}
        a, axis = arrays[name], int(kind.split()[1])
        arrays[name] = np.take(a, np.arange(n) % a.shape[axis], axis=axis) if a.shape[axis] \
            else np.zeros(a.shape[:axis] + (n,) + a.shape[axis + 1:], a.dtype)
        content[key] = to_array_record(arrays)
    return content


@st.composite
def _resized(draw: Any, step: Step) -> Resized:
    """The step's honest request with one server-chosen size drawn (:func:`resized`)."""
    fields = _size_fields(step.content)
    if not fields:
        return Resized(step.request(), "no size")
    key, name, kind = draw(st.sampled_from(fields), label="field")
    if kind == "int":
        n = draw(_declared_for(name), label="value")
    elif kind == "length":
        n = draw(st.one_of(st.integers(0, 64), st.floats(0.0, 6.0).map(lambda e: int(10**e))),
                 label="length")
    else:
        a = step.content[key][name]
        axis = int(kind.split()[1])
        row = max(len(a.data) // max(a.shape[axis], 1), 8)
        n = draw(st.one_of(st.integers(0, 64), st.floats(0.0, math.log10(ARRAY_CAP // row + 1))
                           .map(lambda e: int(10**e))), label="length")
    what = f"{key}.{name} = {n}" if kind == "int" else \
        f"len({key}.{name}) = {n}" if kind == "length" else f"{key}.{name} {kind} = {n}"
    return Resized(resized(step, key, name, kind, n), what)


def measure_step(step: Step, content: RecordDict, ledger: Path) -> tuple[int, str | None]:
    """(peak bytes traced while the step's node handles ``content``, its refusal or None)."""
    app = _stateful_app(step, ledger)
    refusal = None
    with traced_peak() as peak, deadline(SECONDS):
        try:
            step.deliver(app, content)
        except Refused as err:
            refusal = str(err)
    return peak.bytes, refusal


def test_every_stateful_step_is_answered_honestly(stateful_steps: dict, tmp_path: Path) -> None:
    """The harness's own check: each captured step, replayed as the honest run sent it, is
    answered (the state before it is complete) within the budget; so the drawn sizes below
    reach the handler's work, not its state checks."""
    for action, steps in sorted(stateful_steps.items()):
        peak, refusal = measure_step(steps[0], steps[0].request(), tmp_path / "ledger.json")
        assert refusal is None, f"{action}: the honest step was refused: {refusal}"
        assert peak <= BUDGET_MB * 2**20, (action, peak)


@pytest.mark.parametrize("action", sorted(set(all_actions()) - set(REQUESTS)))
@settings(max_examples=int(__import__("os").environ.get("BOUNDS_EXAMPLES", 10)), deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                 HealthCheck.data_too_large])
@given(data=st.data())
def test_a_stateful_step_stays_under_the_budget_or_is_refused_first(
        stateful_steps: dict, tmp_path: Path, action: str, data: st.DataObject) -> None:
    """A handler at its step of an honest run (the state its earlier steps set up in
    place), sent the honest request with one server-chosen size drawn: the node's peak
    stays under its memory-budget-mb, or it refuses first, naming itself (and the key)."""
    if action not in stateful_steps:
        pytest.fail(f"{action}: no honest run reaches it (test_every_handler_has_a_bounds_case)")
    step = data.draw(st.sampled_from(stateful_steps[action]), label="step")
    drawn = data.draw(_resized(step), label="request")
    content, what = drawn.content, drawn.what
    try:
        peak, refusal = measure_step(step, content, tmp_path / "ledger.json")
    except TooLong as err:
        pytest.fail(f"{action} ({what}): a server-chosen loop ran unbounded ({err})")
    if OUTCOMES is not None:
        OUTCOMES.append((action, what, peak, refusal))
    assert peak <= BUDGET_MB * 2**20, (
        f"{action} ({what}): the node's peak was {peak / 2**20:.1f} MiB over its "
        f"memory-budget-mb={BUDGET_MB} without a refusal ({refusal!r})")
    if refusal is not None:
        check_refusal(action, refusal)


#: Sizes at a step that once passed the node's checks (found by the property above): the
#: owner's peer list (one sealing per listed peer), the decrypter's contributions, the sum
#: layer's fixed-point bits, PriviRec's broadcast arrays, LP-GCN's deliveries.
STATEFUL_CASES = [
    ("keys_create_secret", "relay", "peers", "length", 10**6),
    ("aggregate_decrypt", "secagg.contributions", "*", "length", 10**5),
    ("lpgcn_count", "secagg", "frac-bits", "int", 10_000),
    ("privirec_degrees", "secagg", "frac-bits", "int", 10_000),
    ("privirec_evaluate", "arrays", "item_deg", "axis 0", 10**6),
    ("privirec_evaluate", "arrays", "P.data", "axis 0", 10**6),
    ("privirec_evaluate", "arrays", "P.indices", "axis 0", 10**6),
    ("privirec_evaluate", "arrays", "P.indptr", "axis 1", 10**6),
    ("lpgcn_round", "arrays", "e0", "axis 0", 0),
    # the review's SecAgg+ key setup: 400,003 distinct members, stored and hashed unchecked
    # (the set now travels as its Merkle root and size: the size is what is bounded)
    ("secagg_advertise", "secagg", "members-count", "int", 400_003),
]


@pytest.mark.parametrize("action, key, name, kind, n", STATEFUL_CASES)
def test_a_reviews_stateful_size_is_refused_first(stateful_steps: dict, tmp_path: Path,
                                                   action: str, key: str, name: str,
                                                   kind: str, n: int) -> None:
    """Each size above, at the first step of its handler that carries it, is refused by the
    node, naming itself, within its budget and in time."""
    step = next(s for s in stateful_steps[action] if key in s.content and (
        name == "*" or name in s.content[key]))
    if name == "*":  # the first contributor's list
        name = sorted(step.content[key])[0]
    try:
        peak, refusal = measure_step(step, resized(step, key, name, kind, n),
                                     tmp_path / "ledger.json")
    except TooLong as err:
        pytest.fail(f"{action}: {key}.{name} = {n} ran unbounded ({err})")
    assert refusal is not None and peak <= BUDGET_MB * 2**20, (peak, refusal)
    check_refusal(action, refusal)


def test_a_noise_product_of_a_large_rank_is_refused_before_its_ciphertexts(
        stateful_steps: dict, tmp_path: Path) -> None:
    """fedsvd-utility's noise product encrypts the noise a synchronization at the server's
    rank left on the node: 24 x 3000 values (nine padded ciphertexts, ~4.7 MiB) are refused
    by the node's budget before the first ciphertext is made."""
    from fedrec.records import array_record, from_array_record, to_array_record

    step = stateful_steps["fedsvd_noise_product"][0]
    state = copy_records(step.state)
    noise = from_array_record(array_record(state, "fedsvd.noise"))["N"]
    state["fedsvd.noise"] = to_array_record({"N": np.resize(noise, (noise.shape[0], 3000))})
    large = Step(step.case, step.action, step.message_type, step.node_index, step.num_nodes,
                 step.node_config, state, step.content)
    peak, refusal = measure_step(large, large.request(), tmp_path / "ledger.json")
    assert refusal is not None and "memory-budget-mb=4" in refusal, (peak, refusal)
    assert peak <= BUDGET_MB * 2**20
    check_refusal("fedsvd_noise_product", refusal)


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
def _ml100k_with(folder: Path, fault: str) -> None:
    """An ml-100k folder with one fault of the node's own data: a NaN rating, or a gender
    code the format does not have (a value of the node's users)."""
    folder.mkdir(parents=True)
    rating = "nan" if fault == "nan rating" else "3"
    (folder / "u.data").write_text(f"1\t1\t4\t881250949\n2\t2\t{rating}\t881250950\n")
    if fault == "bad gender":
        (folder / "u.user").write_text("1|24|M|technician|85711\n2|53|Q|other|94043\n")


#: Each fault a node's config or files can hold, the node config key the refusal names
#: (``""``: a data fault, named by what the server may learn of it).
FAULTS = {"another's key": "identity-key", "unreadable key": "identity-key",
          "bad roster": "roster", "missing data-dir": "", "missing dataset folder": "",
          "nan rating": "", "bad gender": "", "unreadable lpgcn-init": ""}


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_a_refusal_names_the_key_never_the_nodes_path(tmp_path: Path, fault: str) -> None:
    """Whatever is wrong with a node's keys, roster, data directory, data files or
    checkpoint, the refusal the server gets names the node and the config key, never a
    path of the node, a file below its data-dir, a line of its files or a value in them."""
    from fedrec.secure.identity import keygen

    ids = tmp_path / "secret-ids"
    keygen(3, ids)
    config: dict[str, Any] = {"identity-key": str(ids / "node-0.key"),
                              "roster": str(ids / "roster.json"),
                              "allow-simulated-identity": "false"}
    data: dict[str, Any] = {}
    key, action = FAULTS[fault], "relay_keys" if FAULTS[fault] else "hello"
    holder = tmp_path / "holder-data"
    if fault == "another's key":
        config["identity-key"] = str(ids / "node-1.key")
    elif fault == "unreadable key":
        (ids / "node-0.key").write_text("not a key")
    elif fault == "bad roster":
        (ids / "roster.json").write_text("{}")
    elif fault in ("missing data-dir", "missing dataset folder"):
        if fault == "missing dataset folder":
            (holder / "elsewhere").mkdir(parents=True)
        config["data-dir"] = str(holder)
        data = {"dataset": "ml-100k"}
    elif fault in ("nan rating", "bad gender"):
        _ml100k_with(holder / "ml-100k", fault)
        config["data-dir"] = str(holder)
        data = {"dataset": "ml-100k", "test-ratio": 0.0}
    else:  # the lpgcn-init checkpoint: read at LP-GCN's setup, the handler is not needed
        from clients.lpgcn import _initial_params
        from clients.node import NodeContext

        (tmp_path / "holder-ckpt.npz").write_text("not a checkpoint")
        context = Context(run_id=1, node_id=1001, state=RecordDict(), run_config={},
                          node_config={"partition-id": 0, "num-partitions": 3, **TINY,
                                       "lpgcn-init": str(tmp_path / "holder-ckpt.npz")})
        from fedrec.wire.lpgcn import Hyper

        hp = Hyper(backbone="lightgcn", layers=1, dim=2, lr=0.1, reg=0.0, batch_size=1, seed=0,
                   alpha=1.0, holdings="catalogue", mask_scale=1.0, init_std=0.1,
                   dtype="float64", start_step=1)
        with pytest.raises(Exception) as err:
            _initial_params(NodeContext(context, _content({})), hp, np.zeros(0, np.int64))
        scrub_exception(err.value, node_paths(context.node_config), "node 1001 (partition 0)")
        text = str(err.value)
        assert "holder-ckpt" not in text and str(tmp_path) not in text, text
        assert "<lpgcn-init>" in text and "node 1001" in text, text
        return
    with MaliciousGrid(build_client_app(policy={}), 3, node_configs={0: config},
                       data=dict(_content({}, data).config_records["data"])) as grid:
        with pytest.raises(Refused) as err:
            grid.ask(grid.ids[0], action, _content({}, data))
    text = str(err.value)
    assert str(tmp_path) not in text and "secret-ids" not in text and "holder" not in text, \
        text
    assert re.search(r"node 1001|partition 0", text), text
    if key:
        assert f"'{key}'" in text, text
    elif fault.startswith("missing"):
        assert "<data-dir>" in text and "ml-100k" in text and not re.search(
            r"<data-dir>/\w|u\.data|elsewhere", text), text
    else:  # the file, its lines and its values are the node's data
        assert "cannot load its data" in text and not re.search(
            r"u\.data|u\.user|line \d|'Q'|nan|\.\.\.", text), text
        assert f"field '{'gender' if fault == 'bad gender' else 'rating'}'" in text, text


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


def test_the_default_policy_bounds_what_the_server_makes_a_node_keep() -> None:
    """Under the default memory-budget-mb (4096), what a node keeps across messages is still
    bounded by what it reads and by its roster, not by the budget: six requests carrying
    3 MiB each of mail for a purpose no handler reads leave nothing in its state, and a node
    set of 400,003 distinct members (a roster of 4 partitions here) is refused."""
    from fedrec.secure.sealed import MAIL_IN, in_key
    from tests.bounds import state_bytes

    with MaliciousGrid(build_client_app(policy={}), 3) as grid:
        node = grid.ids[0]
        for r in range(6):  # any request carries mail: this one needs no data
            grid.ask(node, "relay_keys", RecordDict({MAIL_IN: ConfigRecord({
                in_key(grid.ids[1], r, "no-handler-reads-this"): bytes(3 * 2**20)})}))
        kept = state_bytes(grid.contexts[node].state)
        with pytest.raises(Refused) as err:
            grid.ask(node, "nodeset_commit", RecordDict({"nodeset": ConfigRecord(
                {"members": list(range(1001, 1001 + 400_003))})}))
    assert kept < 2**20, f"{kept / 2**20:.1f} MiB of unread mail kept"
    assert "roster" in str(err.value) and "node 1001" in str(err.value), str(err.value)


# -- memory tracemalloc cannot see -------------------------------------------------------------
_NATIVE = """
import json
import numpy as np
import tenseal as ts
from clients.fedsvd import block_bytes
from fedrec.recsys.power_svd import procrustes
from fedrec.secure.he import make_secret_context

def status(key):  # VmRSS: now; VmHWM: the peak since the last reset
    with open("/proc/self/status") as fh:
        return next(int(l.split()[1]) * 1024 for l in fh if l.startswith(key))

r = 400  # FedSVD's alignment at rank r on r items (the most r x r per d x r)
rng = np.random.default_rng(0)
Z, reference = rng.standard_normal((r, r)), rng.standard_normal((r, r))
with open("/proc/self/clear_refs", "w") as fh:
    fh.write("5")  # the peak restarts from the current RSS
before = status("VmHWM")
procrustes(Z, reference)
lapack = status("VmHWM") - before
ctx = make_secret_context()
blobs = [ts.ckks_vector(ctx, rng.standard_normal(4096).tolist()).serialize()
         for _ in range(24)]
warm = [ts.ckks_vector_from(ctx, b) for b in blobs]  # the allocator's first touches
before = status("VmRSS")
vectors = [ts.ckks_vector_from(ctx, b) for b in blobs]  # what each further one costs
native = status("VmRSS") - before
print(json.dumps({"lapack": lapack, "estimate": block_bytes(0, r, r, 0),
                  "native": native, "serialised": sum(len(b) for b in blobs)}))
"""


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="reads VmHWM (Linux)")
def test_the_estimates_cover_native_memory_tracemalloc_cannot_see() -> None:
    """LAPACK's work space (numpy's linalg mallocs it) and TenSEAL's ciphertexts live outside
    Python's allocator, so the property tests above cannot see them. The node's estimates
    that stand for them are checked against the RSS growth of a fresh process instead, on
    a moderate case: FedSVD's alignment at rank 400 (its SVD's factors and work space within
    ``block_bytes``), and 24 CKKS ciphertexts loaded as the decrypter loads contributions,
    after as many loads that warm the allocator up (within ``CKKS_NATIVE_PER_BYTE`` of their
    serialised size)."""
    import json
    import os
    import subprocess
    import sys

    from clients.sums_node import CKKS_NATIVE_PER_BYTE

    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", _NATIVE], capture_output=True, text=True,
                         timeout=120, env=env, check=True)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["lapack"] > 0 and got["native"] > 0, got  # the measurement saw something
    assert got["lapack"] <= got["estimate"], got
    assert got["native"] <= CKKS_NATIVE_PER_BYTE * got["serialised"], got
