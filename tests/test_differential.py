"""Nothing computed from a node's rows leaves it in clear (``tests/differential.py``).

Every registered protocol runs honestly on tiny synthetic data, under the node's default
policy plus only the opt-ins the protocol cannot run without; the victim node and its twin
(rows differing by one user's rows, or by one interaction) answer every request and every
server-chosen variant of it. A reply field, refusal or size that differs between the two is
a finding unless it travels masked, encrypted or sealed, or docs/threat-model.md's "learns
by design" table lists it under an opt-in the policy has on. A handler no run reaches fails
the coverage test, so a new handler or protocol needs a case here before it can land.

Split views: the first request of every action also goes to the victim alone in per-node
variants of its sum record and data description (every field; the other nodes keep the
honest request). Each is judged between the worlds as above, and as the server would sum
it with the others' honest answers: a variant the victim answers with the honest masks
but another masked input is a finding (``tests/differential.py`` ``split_view_leak``).
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import pytest

from fl_app.registry import client_module, protocols, resolve_config
from tests.differential import DOC, DataHook, Finding, TwinGrid, learns_by_design
from tests.malicious import production_handlers

NODES = 3
#: How the twin's rows differ (tests/differential.py ``neighbour``): one user's rows
#: replaced, one user removed, one interaction added.
KINDS = ("user", "user-removed", "interaction")
DATA = {"dataset": "synthetic", "synthetic-users": 36, "synthetic-items": 24, "seed": 1,
        "synthetic-density": 0.3, "synthetic-clusters": 2, "synthetic-popularity-skew": 0.0,
        "partition": "shards-contiguous"}
_MVMF = {"rounds": 2, "item-servers": 1, "implicit": False, "cold-start-users": 0.1,
         "cold-start-items": 0.1}
#: T = 5, p = 2: two synchronizations and the output rule's last block (fedsvd_output).
_SVD = {"fedsvd-k": 2, "fedsvd-rank": 3, "fedsvd-iterations": 5, "fedsvd-sync-every": 2}

@dataclass(frozen=True)
class Case:
    """One differential run: run-config overrides (tiny sizes), the opt-ins without which
    the protocol does not run at all, which node is the victim, and a dropout."""

    overrides: dict[str, Any]
    policy: dict[str, Any] = field(default_factory=dict)
    victim: int = 0
    nodes: int = NODES
    drop: tuple[int, int] | None = None


#: Per registered protocol (``name@variant`` for more runs of one protocol).
CASES: dict[str, Case] = {
    "fedmf": Case({"rounds": 2, "mf-dim": 3}),
    # a node drops after key setup: the sums' consistency round (secagg_confirm) runs
    "fedmf@dropouts": Case({"rounds": 2, "mf-dim": 3, "timeout": 1.0},
                           {"allow-dropouts": True}, nodes=4, drop=(3, 3)),
    "privirec": Case({"privirec-filters": "gf-cf", "privirec-filter-rank": 3,
                      "privirec-L": 2}),
    "privirec-k": Case({"privirec-filters": "gf-cf", "privirec-filter-rank": 3,
                        "privirec-L": 2, "privirec-k": 4}),
    "lpgcn": Case({"lpgcn-layers": 1, "lpgcn-dim": 3, "lpgcn-steps": 2,
                   "lpgcn-batch-size": 16, "synthetic-users": 60, "synthetic-items": 45,
                   "synthetic-density": 0.25, "synthetic-clusters": 10,
                   "partition": "shards-random"}, victim=1),
    "fedpower": Case(_SVD),
    "fedsvd-utility": Case(_SVD, {"allow-noise-removal": True}),
    "fedsvd-privacy": Case(_SVD, {"dp-budget": 1e9}),  # charged under SecAgg+ too
    "dp-prototypes": Case({"dpp-k": 2, "dpp-sparsity": 4, "dpp-rank": 2, "dpp-swaps": 1,
                           "dpp-shifts": 1}, {"dp-budget": 100.0}),
    "fedmvmf": Case(_MVMF, nodes=NODES + 1),
    # the victim creates the CKKS key and decrypts; in lpgcn it receives the shared secret
    "privmvmf": Case(_MVMF, {"allow-ckks": True}, nodes=NODES + 1),
    "dp-fedmf": Case({"rounds": 2, "dpmf-dim": 3, "dpmf-rate": 0.5, "dpmf-epsilon": 4.0},
                     {"dp-budget": 1e9}),
    "dp-svd": Case({"dpsvd-rank": 2, "dpsvd-items": 12, "dpsvd-iterations": 2,
                    "dpsvd-epsilon": 4.0}, {"dp-budget": 1e9}),
}


def _all_handlers() -> set[str]:
    """Every registered action of a production ClientApp (:func:`production_handlers`)."""
    query, train, evaluate = production_handlers()
    return set(query) | ({"train"} if train else set()) | ({"evaluate"} if evaluate else set())


@lru_cache(maxsize=None)
def _run(name: str, kind: str) -> tuple[list[Finding], frozenset[str], int, int]:
    """One honest run with a twin: the findings, the actions the victim answered, how many
    replies that read the victim's rows carried a protected record, and how many per-node
    variants (sum record, data description) were judged as the server's sums would see
    them."""
    import clients.node as node_mod
    from fl_app.client_app import build_client_app
    from fl_app.server_app import run_protocol

    case = CASES[name]
    protocol = name.split("@")[0]
    cfg = resolve_config({**DATA, **case.overrides, "protocol": protocol,
                          "run-name": f"differential-{protocol}-{kind}"})
    extra = [m for m in [client_module(protocol)] if m]
    hook = DataHook(node_mod._cached_node_data, kind, case.victim)
    # each run its own privacy state file: the cases share their data, and a node's ledger
    # charges rows across runs, so one case's releases would spend another's budget
    ledger = Path(tempfile.mkdtemp(prefix="differential-")) / f"{name}-{kind}.json"
    policy = {**case.policy, "dp-ledger": str(ledger)}
    node_mod._cached_node_data = hook
    try:
        with TwinGrid(build_client_app(extra, policy=policy), case.nodes,
                      protocol=protocol, kind=kind, policy=policy, data_hook=hook,
                      n_items=int(cfg["synthetic-items"]), drop=case.drop) as grid:
            run_protocol(grid, cfg)
    finally:
        node_mod._cached_node_data = hook.load
    return grid.findings, frozenset(grid.actions), grid.protected_replies, grid.split_compared


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", sorted(CASES))
def test_no_reply_differs_in_clear_between_neighbouring_data(name: str, kind: str) -> None:
    findings, _, protected, split = _run(name, kind)
    assert protected > 0  # the twin's rows reached what the node sends
    assert split > 0  # per-node variants of the sum record and the data were judged
    assert not findings, "\n".join(sorted({str(f) for f in findings}))


#: Handlers no victim answers, with the reason: an item server holds the catalogue's item
#: features and no user rows, so rows differing by a user or an interaction never reach it.
NOT_ON_ROW_HOLDERS = {
    "mvmf_item_gradient": "an item server's handler (no user rows)",
    "mvmf_item_cold": "an item server's handler (no user rows)",
}
#: Flower's stock rounds, sent as a stock strategy would (fedmf is the protocol with them).
STOCK_POLICIES = ({}, {"allow-plain": True})


@lru_cache(maxsize=None)
def _stock(plain: bool, kind: str) -> tuple[list[Finding], frozenset[str]]:
    """Flower's stock train and evaluate messages to the victim and its twin."""
    import numpy as np
    from flwr.app import ArrayRecord, ConfigRecord, RecordDict

    import clients.node as node_mod
    from fl_app.client_app import build_client_app

    policy = STOCK_POLICIES[plain]
    hook = DataHook(node_mod._cached_node_data, kind)
    node_mod._cached_node_data = hook
    config = ConfigRecord({"fedrec-protocol": "fedmf", "seed": 1, "mf-lr": 0.1, "mf-reg": 0.01,
                           "mf-negatives": 1, "server-round": 1, "top-k": 5, **DATA})
    model = np.random.default_rng(0).normal(size=(DATA["synthetic-items"], 3))
    try:
        with TwinGrid(build_client_app(["clients.fedmf"], policy=policy), NODES,
                      protocol="fedmf", kind=kind, policy=policy, data_hook=hook,
                      n_items=DATA["synthetic-items"]) as grid:
            for message_type in ("train", "evaluate"):
                request = RecordDict({"config": ConfigRecord(dict(config)),
                                      "arrays": ArrayRecord([model])})
                try:
                    grid.ask(grid.victim, message_type, request, message_type=message_type)
                except Exception:  # noqa: BLE001  (a refusal: compared by the grid)
                    pass
    finally:
        node_mod._cached_node_data = hook.load
    return grid.findings, frozenset(grid.actions)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("plain", [False, True], ids=["default-policy", "allow-plain"])
def test_stock_flower_rounds_differ_only_under_their_opt_in(plain: bool, kind: str) -> None:
    findings, actions = _stock(plain, kind)
    assert actions == {"train", "evaluate"}
    assert not findings, "\n".join(sorted({str(f) for f in findings}))


def test_every_registered_handler_is_exercised() -> None:
    """A handler or protocol added without a case here fails: the harness must reach it."""
    covered = {name.split("@")[0] for name in CASES}
    assert set(protocols()) <= covered, f"no differential case for " \
        f"{sorted(set(protocols()) - covered)}: add one to CASES"
    reached: set[str] = set()
    for name in CASES:
        for kind in KINDS:
            reached |= _run(name, kind)[1]
    for plain in (False, True):
        reached |= _stock(plain, "user")[1]
    missing = _all_handlers() - reached - set(NOT_ON_ROW_HOLDERS)
    assert not missing, f"handlers no differential run reaches: {sorted(missing)}"


def test_the_threat_model_table_names_real_protocols_actions_and_opt_ins() -> None:
    """Every row of the "learns by design" table names registered protocols, a registered
    action and a node-policy key (or ``always``): a stale row cannot allow anything."""
    from clients.policy import NodePolicy

    keys = set(NodePolicy.keys()) | {"always"}
    rows = learns_by_design()
    assert rows, f"{DOC.name}: the learns-by-design table is empty"
    for row in rows:
        assert set(row.protocols) <= set(protocols()) | {"every"}, row
        assert row.action in _all_handlers(), row
        assert row.opt_in in keys, row


def test_the_harness_finds_a_planted_clear_value(monkeypatch: pytest.MonkeyPatch) -> None:
    """The harness's own check: a FedMF node that sends its interaction count in clear
    beside its masked sums is reported, for every kind of neighbouring rows."""
    from flwr.app import ConfigRecord

    import clients.fedmf as fedmf

    real = fedmf.sum_reply

    def leaky(node: Any, arrays: Any, extra: Any = None) -> Any:
        return real(node, arrays, {"leak": ConfigRecord({"nnz": int(node.data().train.nnz)})})

    monkeypatch.setattr(fedmf, "sum_reply", leaky)
    for kind in ("user-removed", "interaction"):
        findings, _, _, _ = _run.__wrapped__("fedmf", kind)
        assert {f.what for f in findings} == {"leak.nnz"}, kind


def test_the_threat_model_names_the_protocols_without_a_row() -> None:
    """The sentence after the table names exactly the registered protocols the table gives
    no row of their own, so a protocol cannot be left out of the list silently."""
    import re

    text = DOC.read_text(encoding="utf-8").split("<!-- learns-by-design:end -->", 1)[1]
    sentence = text.split("Protocols with no row of their own:", 1)[1].split(".", 1)[0]
    named = set(re.findall(r"`([^`]+)`", sentence))
    with_rows = {p for row in learns_by_design() for p in row.protocols}
    assert named == set(protocols()) - with_rows


def test_the_split_view_judge_finds_a_node_that_takes_per_node_sum_parameters(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The control: a node as it was before the sum record was bound and its fractional
    bits derived (the sum record left out of the digest, the bits taken from the request)
    gives the judge findings: one more or one less bit, or half the range, shown to the
    victim alone change its masked input under the honest masks."""
    import clients.secagg_node as secagg_node
    import clients.sums_node as sums_node
    from fedrec.records import content_digest
    from fedrec.secure.fixedpoint import FixedPoint
    from fedrec.wire.sums import SUM_KEY

    def unbound_digest(node: Any) -> bytes:
        return content_digest(node.request, skip=(SUM_KEY, "relay.in", "relay.directory",
                                                  "relay.round"))

    def requested_codec(node: Any, req: Any) -> FixedPoint:
        return FixedPoint(max_abs=req.max_abs, frac_bits=req.frac_bits)

    monkeypatch.setattr(sums_node, "request_digest", unbound_digest)
    monkeypatch.setattr(secagg_node, "_codec", requested_codec)
    findings, _, _, _ = _run.__wrapped__("fedmf", "user")
    leaks = {f.request for f in findings if f.what == "the masked input under the honest masks"}
    assert {"split secagg.frac-bits:plus-1", "split secagg.max-abs:half"} <= leaks, leaks
