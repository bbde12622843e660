"""Sizes a server fixes at one step bound what a node allocates at every later step.

``tests/test_bounds.py`` changes one size in one request; a size the server fixes early (a
rank at the first synchronization, LP-GCN's dimension and layers at setup, MVMF's K) is then
only ever the honest tiny one when the later steps run. Here hypothesis draws the run
config's sizes instead (each protocol's ``config_keys`` of integer type that
:data:`SIZES` lists, inside their declared ranges), the registered protocol runs honestly
end to end on tiny synthetic data in process, and every request each node handles is
measured on its own with ``tracemalloc``: its peak stays under the node's
``memory-budget-mb``, or the run ends in a refusal that names the node and the key. A
protocol's new integer key fails :func:`test_every_integer_key_is_a_size_or_not` until it
is listed here as a size or as a count of requests.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fl_app.client_app import build_client_app
from fl_app.registry import (
    client_module,
    declared_keys,
    load_strategy_class,
    protocols,
    resolve_config,
)
from tests.bounds import (
    BUDGET_MB,
    MAX_ITERATIONS,
    SECONDS,
    PeakMeter,
    TooLong,
    check_refusal,
    deadline,
)
from tests.localgrid import LocalGrid
from tests.test_differential import CASES, DATA

#: Integer keys that size what a node allocates or loops over within one request, with
#: the largest value drawn (the test process builds the server's side too; a declared max
#: wins where it is lower). Each is drawn log-uniformly from its declared minimum.
SIZES: dict[str, int] = {
    "mf-dim": 10**5, "mf-negatives": 10**5, "mf-batch-size": 10**6, "mf-local-epochs": 10**4,
    "privirec-L": 64, "privirec-rank": 64, "privirec-filter-rank": 64, "privirec-k": 10**5,
    "lpgcn-layers": 24, "lpgcn-dim": 10**4, "lpgcn-batch-size": 10**6, "lpgcn-top-k": 10**5,
    "fedsvd-k": 64, "fedsvd-rank": 64, "fedsvd-sync-every": 10**4,
    "dpp-k": 64, "dpp-rank": 10**4, "dpp-nmf-iters": 10**4, "dpp-sparsity": 10**5,
    "dpp-trials": 10**4, "dpp-shifts": 10**4, "dpp-swaps": 10**4,
    "mvmf-dim": 10**4, "mvmf-top-k": 10**5,
    "dpmf-dim": 10**4, "dpmf-negatives": 10**5,
    "dpsvd-rank": 10**4, "dpsvd-items": 10**6,
}
#: Integer keys that count requests (rounds, steps, blocks) or name a step, never a size
#: inside one request: each request they add is bounded by the sizes above.
NOT_SIZES: dict[str, str] = {
    "lpgcn-epochs": "rounds of requests", "lpgcn-steps": "rounds of requests",
    "lpgcn-eval-every": "which rounds evaluate", "lpgcn-start-step": "a checkpoint's step",
    "fedsvd-iterations": "T: blocks of at most fedsvd-sync-every iterations each",
    "fedsvd-min-rows": "the fewest rows a node answers with (a threshold, not a size)",
    "rounds": "rounds of requests",
    "dpmf-epochs": "local passes over the node's own rows inside one request",
    "dpsvd-iterations": "rounds of requests (one noisy sum each)",
}
#: Keys drawn in one example (the others keep the case's tiny values).
PER_EXAMPLE = 2
#: The catalogue the server names for a synthetic run (a rank or a filter is at most the
#: items, so only a larger catalogue lets those sizes reach the budget): drawn in half the
#: examples, up to this many items.
ITEMS = 600
#: The honest runs' own iteration counts under the test's ``max-iterations`` (the default
#: 200 NMF sweeps would be refused before any drawn size is reached), for the protocols
#: that read them.
BASE = {"dp-prototypes": {"dpp-nmf-iters": MAX_ITERATIONS // 2}}


def _protocol_keys() -> dict[str, list[Any]]:
    """Each registered protocol's declared integer keys."""
    return {name: [k for k in declared_keys(load_strategy_class(name))
                   if type(k.default) is int] for name in protocols()}


def test_every_integer_key_is_a_size_or_not() -> None:
    """A new integer key of a protocol is drawn here (:data:`SIZES`) or says why not."""
    keys = {k.name for ks in _protocol_keys().values() for k in ks}
    unlisted = sorted(keys - set(SIZES) - set(NOT_SIZES))
    assert not unlisted, f"protocol integer keys neither in SIZES nor NOT_SIZES of " \
        f"tests/test_bounds_runconfig.py: {unlisted}"
    assert not (set(SIZES) | set(NOT_SIZES)) - keys, "listed keys no protocol declares"


@st.composite
def _sizes(draw: Any, protocol: str) -> dict[str, int]:
    """Up to :data:`PER_EXAMPLE` of the protocol's size keys, each drawn in its range."""
    keys = [k for k in _protocol_keys()[protocol] if k.name in SIZES]
    chosen = draw(st.lists(st.sampled_from(keys), min_size=1, max_size=PER_EXAMPLE,
                           unique_by=lambda k: k.name), label="keys")
    out = {}
    for key in chosen:
        lo = int(key.min if key.min is not None else 0)
        hi = min(int(key.max), SIZES[key.name]) if key.max is not None else SIZES[key.name]
        out[key.name] = draw(st.one_of(
            st.integers(lo, min(hi, lo + 8)),
            st.floats(0.0, math.log10(hi - lo + 1)).map(lambda e, lo=lo: lo + int(10**e) - 1)),
            label=key.name)
    if draw(st.booleans(), label="larger catalogue"):
        out["synthetic-items"] = draw(st.integers(DATA["synthetic-items"], ITEMS),
                                      label="synthetic-items")
    return out


def run_measured(case_name: str, sizes: dict[str, int], ledger: Path) -> tuple[PeakMeter,
                                                                              str | None]:
    """The case's honest run with ``sizes`` in its run config, every request measured;
    (the meter, the error the run ended with or None). A run config the server itself
    rejects (a rank above the items, say) ends with that error before any node works."""
    from fl_app.server_app import run_protocol

    case = CASES[case_name]
    protocol = case_name.split("@")[0]
    app = build_client_app([m for m in [client_module(protocol)] if m],
                           policy={**case.policy, "memory-budget-mb": BUDGET_MB,
                                   "max-iterations": MAX_ITERATIONS, "dp-budget": 1e9,
                                   "dp-ledger": str(ledger)})
    meter = PeakMeter(app)
    cfg = {**DATA, **case.overrides, **BASE.get(protocol, {}), **sizes, "protocol": protocol,
           "run-name": f"bounds-{protocol}"}
    error = None
    with deadline(SECONDS), LocalGrid(meter, case.nodes) as grid:
        try:
            run_protocol(grid, resolve_config(cfg))
        except Exception as err:  # noqa: BLE001  (judged by the caller)
            error = str(err)
    return meter, error


def judge(case_name: str, sizes: dict[str, int], meter: PeakMeter, error: str | None) -> None:
    """Every request's peak under the budget; every node refusal the node's own, naming it
    (and the policy key when it is a budget's)."""
    over = meter.over(BUDGET_MB * 2**20)
    assert not over, "\n".join(
        f"{case_name} {sizes}: {action} on node {node} peaked at {peak / 2**20:.1f} MiB over "
        f"memory-budget-mb={BUDGET_MB} ({'refused: ' + refusal if refusal else 'answered'})"
        for action, node, peak, refusal in over)
    for action, _, _, refusal in meter.calls:
        if refusal is not None:
            check_refusal(f"{case_name} {sizes} {action}", refusal)
    if error is not None and any(r for *_, r in meter.calls):
        check_refusal(f"{case_name} {sizes}", error)


#: One run per registered protocol (the first case of each in tests/test_differential.py).
RUNS = sorted({name.split("@")[0]: name for name in sorted(CASES, reverse=True)}.values())


@pytest.fixture(scope="module")
def warm(tmp_path_factory: pytest.TempPathFactory) -> None:
    """One honest run of each protocol first: imports and caches a first run makes once
    per process are not a request's allocation."""
    os.environ.setdefault("FEDREC_CACHE", str(tmp_path_factory.mktemp("cache")))
    for name in RUNS:
        run_measured(name, {}, tmp_path_factory.mktemp("warm") / "ledger.json")


def test_each_honest_run_completes_under_the_budget(warm: None, tmp_path: Path) -> None:
    """The harness's own check: with no size drawn, every protocol runs to its end under
    the test's policy with every request under the budget, so a drawn size's refusal is
    the size's, not the harness's."""
    for name in RUNS:
        meter, error = run_measured(name, {}, tmp_path / f"{name}.json")
        assert error is None, f"{name}: {error}"
        assert meter.calls and not meter.over(BUDGET_MB * 2**20), (name, meter.over(0)[:3])


@pytest.mark.parametrize("case_name", RUNS)
@settings(max_examples=int(os.environ.get("BOUNDS_EXAMPLES", 4)), deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_a_run_configs_sizes_stay_under_the_budget_at_every_step(
        warm: None, case_name: str, tmp_path: Path, data: st.DataObject) -> None:
    """The protocol's honest run with its drawn sizes: every request each node handles
    stays under the budget, or the run ends in a refusal naming the node (and the key)."""
    sizes = data.draw(_sizes(case_name.split("@")[0]), label="sizes")
    try:
        meter, error = run_measured(case_name, sizes, tmp_path / "ledger.json")
    except TooLong as err:
        pytest.fail(f"{case_name} {sizes}: a server-chosen loop ran unbounded ({err})")
    judge(case_name, sizes, meter, error)


#: Run configs that passed a node's checks at the step that fixed them and then peaked
#: past its budget at a later request (found with the harness above), with the refusal
#: the node gives first: FedMF's item factors just under the budget (numpy's chunked reader
#: of the request's V peaked 4.2 MiB before the training refusal), and PriviRec on a
#: 500-item catalogue (the sparse item-item product was multiplied out before any
#: reservation: 5.0 MiB).
RUN_CASES = [("fedmf", {"mf-dim": 20000}, "fedmf_train", "the request's arrays 'arrays'"),
             ("privirec", {"synthetic-items": 500}, "privirec_gram", "item-item product")]


@pytest.mark.parametrize("case_name, sizes, action, refusal", RUN_CASES)
def test_a_run_configs_size_is_refused_within_the_budget(
        warm: None, case_name: str, sizes: dict[str, int], action: str, refusal: str,
        tmp_path: Path) -> None:
    """Each case is refused by the handler that would have gone past the budget, before it
    does, naming the node, the key and the estimate's cause."""
    meter, error = run_measured(case_name, sizes, tmp_path / "ledger.json")
    judge(case_name, sizes, meter, error)
    assert error is not None and f"failed in '{action}'" in error and refusal in error \
        and "memory-budget-mb=4" in error, error


def test_lpgcn_layers_are_a_loop_count_bounded_by_the_nodes_policy(warm: None,
                                                                    tmp_path: Path) -> None:
    """Each layer is a round and a pass on every step: 60 layers (inside the run config's
    range, under the memory budget on tiny data) ran honestly for 19 s before this bound; the
    node refuses them at setup against its max-iterations, naming the key."""
    meter, error = run_measured("lpgcn", {"lpgcn-layers": 60}, tmp_path / "ledger.json")
    judge("lpgcn", {"lpgcn-layers": 60}, meter, error)
    assert error is not None and "'layers'" in error and "max-iterations=" in error, error
