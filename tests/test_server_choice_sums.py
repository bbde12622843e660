"""A server that gives one node other sum parameters than the rest learns nothing from it.

The review's attack: two sums of one honest request over the whole committed set, the
second with only the victim's fractional bits raised by one, decode to the victim's input
as their difference; a small range given to the victim alone turns its clip flag into a
yes/no answer on its values. The node now derives the fractional bits itself (from the
range and the committed set) and binds every shared field of the sum record into the
digest its pairwise masks and its CKKS signature cover, so a per-node variant is refused or
leaves the sum masked. A sum handler's request is checked before the handler runs, so a
request without a valid sum record never computes or keeps anything.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flwr.app import ConfigRecord, Context, RecordDict

from clients.diagnostics import diagnostic_vector
from clients.handlers import QUERY_HANDLERS, is_sum_handler
from clients.node import NodeContext
from clients.sums_node import request_digest
from fedrec.secure.fixedpoint import FixedPoint
from fedrec.secure.identity import keygen
from fedrec.secure.secagg import SecAggError
from fedrec.transport.messenger import Messenger, NodeError
from fedrec.transport.secagg_server import SecureAggregator
from fedrec.wire.sums import PER_NODE_SUM_FIELDS, SUM_KEY
from fl_app.client_app import build_client_app
from fl_app.registry import client_modules
from tests.malicious import MaliciousGrid, Refused
from tests.simutil import diag_request

SHAPES = {"v": (6,)}
MAX_ABS = 10.0
APP = build_client_app(["clients.diagnostics"], policy={})
_RUNS = itertools.count(100)


@pytest.fixture(scope="module")
def roster(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("roster")
    keygen(6, folder)
    return folder


def _configs(folder: Path, n: int) -> dict[int, dict[str, Any]]:
    state = folder / f"state-{next(_RUNS)}.json"
    return {i: {"identity-key": str(folder / f"node-{i}.key"),
                "roster": str(folder / "roster.json"), "allow-simulated-identity": "false",
                "dp-ledger": str(state)} for i in range(n)}


def _victim_rewrite(victim: int, **fields: Any) -> Any:
    """Every masked sum request of ``victim`` with ``fields`` of its sum record replaced."""
    def rewrite(msg: Any) -> RecordDict | None:
        if msg.metadata.dst_node_id != victim or \
                msg.metadata.message_type != "query.diag_secure_sum":
            return None
        content = RecordDict(dict(msg.content.items()))
        content[SUM_KEY] = ConfigRecord({**dict(msg.content[SUM_KEY]), **fields})
        return content
    return rewrite


def _secagg(folder: Path, n: int = 5) -> tuple[MaliciousGrid, SecureAggregator]:
    grid = MaliciousGrid(APP, n, node_configs=_configs(folder, n), run_id=next(_RUNS))
    messenger = Messenger(grid, timeout=10)
    agg = SecureAggregator(messenger, messenger.node_ids(), seed=7)
    agg.setup()
    return grid, agg


def test_one_more_fractional_bit_for_one_node_is_refused(roster: Path) -> None:
    """The review's decoding attack: the victim alone is told one more fractional bit. It
    derives the bits itself and refuses, so the second sum never holds its input twice."""
    grid, agg = _secagg(roster)
    try:
        agg.sum("diag_secure_sum", diag_request(3, SHAPES), max_abs=MAX_ABS)  # honest
        victim = grid.ids[2]
        bits = FixedPoint.for_sum(MAX_ABS, 5).frac_bits
        grid.rewrite = _victim_rewrite(victim, **{"frac-bits": bits + 1})
        with pytest.raises(NodeError, match=r"frac-bits' = \d+, but max-abs"):
            agg.sum("diag_secure_sum", diag_request(3, SHAPES), max_abs=MAX_ABS)
    finally:
        grid.close()


def test_a_range_given_to_one_node_only_leaves_the_sum_masked(roster: Path) -> None:
    """A small range for the victim alone (its fractional bits consistent with it, so the
    victim's own checks pass): the victim binds the range into its pairwise masks, which
    then do not cancel with its neighbours'. The honest check names the node; a server
    that skips it decodes noise: neither the victim's input nor a clip count."""
    grid, agg = _secagg(roster)
    victim = grid.ids[2]
    small = 1e-3
    grid.rewrite = _victim_rewrite(victim, **{
        "max-abs": small, "frac-bits": FixedPoint.for_sum(small, 5).frac_bits})
    try:
        with pytest.raises(SecAggError, match="answered another request"):
            agg.sum("diag_secure_sum", diag_request(3, SHAPES), max_abs=MAX_ABS)
        agg._bound_of = lambda reply, label: b""  # the server skips its own checks
        agg._checked = lambda sums, phase, max_abs: sums
        got = agg.sum("diag_secure_sum", diag_request(3, SHAPES), max_abs=MAX_ABS)
    finally:
        grid.close()
    known = sum(diagnostic_vector(3, p, SHAPES["v"]) for p in range(5) if p != 2)
    victim_input = np.clip(diagnostic_vector(3, 2, SHAPES["v"]), -small, small)
    assert not np.allclose(got["v"] - known, victim_input, atol=1.0)
    flag = float(np.ravel(got["secagg.clipped"])[0])
    assert not any(abs(flag - c * small) < 1e-6 for c in range(6))  # no count to read


def test_the_ckks_decrypter_refuses_a_contribution_made_with_another_range() -> None:
    """Under CKKS (node opt-in) the victim's contribution signs the digest of the sum
    record it was sent; the decrypter, sent another range, refuses to open the sum."""
    from fedrec.transport.aggregators import CkksAggregator

    app = build_client_app(["clients.diagnostics"], policy={"allow-ckks": True})
    grid = MaliciousGrid(app, 4, run_id=next(_RUNS))
    try:
        ckks = CkksAggregator(Messenger(grid, timeout=60), grid.ids, seed=0)
        ckks.setup()
        victim = next(n for n in grid.ids if n != ckks.decrypter)
        grid.rewrite = _victim_rewrite(victim, **{"max-abs": 1e-3})
        chunks, layout = ckks.sum_encrypted("diag_secure_sum", diag_request(3, {"v": (5,)}),
                                            max_abs=MAX_ABS)
        with pytest.raises(NodeError, match="signed for this sum and the request"):
            ckks.decrypt(chunks, layout, phase="per-node range")
    finally:
        grid.close()


def _context(request: RecordDict) -> NodeContext:
    ctx = Context(run_id=1, node_id=1001, node_config={"partition-id": 0,
                                                       "num-partitions": 3},
                  state=RecordDict(), run_config={})
    return NodeContext(ctx, request)


@pytest.mark.parametrize("field,other", [("max-abs", 2.0), ("frac-bits", 9), ("mode", "ckks"),
                                         ("sum-id", 8), ("purpose", "other"),
                                         ("wire-dtype", "float32")])
def test_every_shared_field_of_the_sum_record_changes_the_digest(field: str,
                                                                   other: Any) -> None:
    record = {"mode": "secagg+", "sum-id": 7, "max-abs": 1.0, "frac-bits": 8,
              "purpose": "p", "wire-dtype": "float64", "alive": [2, 3]}
    base = request_digest(_context(RecordDict({SUM_KEY: ConfigRecord(record)})))
    changed = request_digest(_context(RecordDict({SUM_KEY: ConfigRecord(
        {**record, field: other})})))
    assert changed != base
    for per_node in PER_NODE_SUM_FIELDS:  # differs per node by design: not in the digest
        assert request_digest(_context(RecordDict({SUM_KEY: ConfigRecord(
            {**record, per_node: [9]})}))) == base


def _state_snapshot(state: RecordDict) -> dict[str, str]:
    return {key: repr(sorted(dict(record).items())) if hasattr(record, "items") else
            repr(record) for key, record in state.items()}


def test_every_sum_handler_refuses_a_request_without_a_sum_record_before_it_runs(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Every handler declared to answer with a sum, sent a request without a sum record,
    is refused naming the record, and the node's state is what it was: nothing trained,
    stored or spent first."""
    import importlib

    for module in client_modules():
        importlib.import_module(module)
    actions = sorted(a for a, fn in QUERY_HANDLERS.items() if is_sum_handler(fn))
    assert len(actions) >= 12, actions  # every protocol's sums are declared
    for action, fn in list(QUERY_HANDLERS.items()):
        if is_sum_handler(fn):
            def never(content: Any, node: Any, _action: str = action) -> Any:
                raise AssertionError(f"{_action} ran without a sum record")
            monkeypatch.setitem(QUERY_HANDLERS, action, never)
            monkeypatch.setattr(never, "fedrec_sum_handler", True, raising=False)
    app = build_client_app(policy={})
    with MaliciousGrid(app, 3, run_id=next(_RUNS)) as grid:
        node = grid.ids[0]
        before = _state_snapshot(grid.contexts[node].state)
        for action in actions:
            with pytest.raises(Refused, match=f"no '{SUM_KEY}' record"):
                grid.ask(node, action, RecordDict())
        assert _state_snapshot(grid.contexts[node].state) == before
