"""Refusals that could depend on a node's data, against a deviating server (issue 43).

Why: a node that refuses a request exactly when its rows have some property answers the
server's question through the refusal itself, whatever the protocol sends masked. Every
check a node runs on a server's request must depend on the request and the node's policy
only; a bound on the node's own values becomes clipping reported inside a sum, and every
check runs before the node keeps anything. Each test is a sequence of requests a server
could send, on the production ClientApp:

- LP-GCN under catalogue holdings: a holder list that leaves out a node of the run's
  committed set is refused at the assignment, and the review's probe (the victim made the
  sole holder of one item) gets the same answers whether its users hold the item or not;
- FedMF exact mode: a chosen V that pushes a node's stored user factor past
  ``mf-factor-bound`` makes no node refuse, and a holder and its non-holder twin answer
  alike outside the masked sum;
- a FedMF train request without a valid sum record, and an LP-GCN round with a malformed
  delivery, leave the node's state as it was.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, Message, RecordDict

from fedrec.records import array_record, from_array_record, to_array_record
from fedrec.recsys.mf import init_user_factors
from fedrec.transport.messenger import NodeError
from fedrec.wire.sums import SHAPES_KEY, SUM_KEY, VALUES_KEY, AggregationError
from fl_app.client_app import build_client_app
from fl_app.registry import resolve_config
from fl_app.server_app import run_protocol
from tests.differential import copy_records
from tests.malicious import MaliciousGrid, Refused, copy_content

FIRST = 2**63 + 11  # Flower node ids are unsigned 64-bit
Rewrite = Callable[[Message], RecordDict | None]


def _run(cfg: dict[str, Any], nodes: int, policy: dict[str, Any],
         rewrite: Callable[[MaliciousGrid], Rewrite] | None = None,
         then: Callable[[MaliciousGrid], None] | None = None
         ) -> tuple[MaliciousGrid, Exception | None]:
    """A run on the production ClientApp whose server rewrites requests with
    ``rewrite(grid)``, then sends what ``then(grid)`` sends; the grid (its log) and the error
    that stopped the run, if any."""
    grid = MaliciousGrid(build_client_app(policy=policy), nodes, first_node_id=FIRST, data=cfg)
    if rewrite is not None:
        grid.rewrite = rewrite(grid)
    with grid:
        try:
            run_protocol(grid, resolve_config(cfg))
        except (NodeError, AggregationError) as exc:
            return grid, exc
        if then is not None:
            then(grid)
    return grid, None


def _answers(grid: MaliciousGrid, node: int) -> list[tuple[str, str]]:
    """(action, the node's error text or '') of every request ``node`` answered."""
    return [(req.metadata.message_type.removeprefix("query."),
             reply.error.reason if reply.has_error() else "")
            for req, reply in grid.log if req.metadata.dst_node_id == node]


def _mail_sent(grid: MaliciousGrid, purpose: str) -> set[int]:
    """Nodes whose replies carried sealed mail of ``purpose``."""
    return {req.metadata.dst_node_id for req, reply in grid.log
            if not reply.has_error() and "relay.out" in reply.content.config_records
            and any(k.endswith(f"|{purpose}")
                    for k in reply.content.config_records["relay.out"])}


# -- LP-GCN: holder lists under catalogue holdings --------------------------------------------
LPGCN_NODES = 4
#: 48 users x 30 items, every item with real holders; the default catalogue holdings.
LPGCN = {"protocol": "lpgcn", "dataset": "synthetic", "synthetic-users": 48,
         "synthetic-items": 30, "synthetic-density": 0.25, "synthetic-popularity-skew": 0.0,
         "seed": 3, "aggregator": "plain", "partition": "shards-random", "lpgcn-layers": 1,
         "lpgcn-dim": 3, "lpgcn-batch-size": 64, "lpgcn-steps": 1,
         "run-name": "test-server-choice-lpgcn"}
#: Plain sums keep the runs small; the holder lists are no business of the sums.
LPGCN_POLICY = {"allow-plain": True}
LIST_REFUSAL = r"refuses the convolution assignment: under catalogue holdings"


def _assign_arrays(msg: Message) -> dict[str, np.ndarray] | None:
    if msg.metadata.message_type != "query.lpgcn_assign":
        return None
    return from_array_record(msg.content["arrays"])


def _with_arrays(msg: Message, arrays: dict[str, np.ndarray]) -> RecordDict:
    content = copy_content(msg.content)
    content["arrays"] = to_array_record(arrays)
    return content


def _without(arrays: dict[str, np.ndarray], node: int,
             lists: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """The holder lists (all, or only the ``lists`` given) with ``node`` left out."""
    ptr, holders = arrays["hold_ptr"], arrays["hold_nodes"]
    which = np.repeat(np.arange(len(ptr) - 1), np.diff(ptr))
    keep = (holders != np.uint64(node)) | (
        False if lists is None else ~np.isin(which, lists))
    kept = np.r_[0, np.cumsum(keep)]
    return {**arrays, "hold_ptr": kept[ptr].astype(np.int64), "hold_nodes": holders[keep]}


def test_a_holder_list_that_leaves_out_a_committed_node_is_refused() -> None:
    """Every node holds every item, so every holder list names the whole node set; a list
    without one of them would let the convolution node's degrees and rows leave that node
    out. The convolution node refuses it before it confirms anything or any count moves."""
    def rewrite(grid: MaliciousGrid) -> Rewrite:
        def fn(msg: Message) -> RecordDict | None:
            arrays = _assign_arrays(msg)
            if arrays is None or "hold_nodes" not in arrays:
                return None
            me = msg.metadata.dst_node_id
            return _with_arrays(msg, _without(arrays, max(n for n in grid.ids if n != me)))
        return fn

    grid, err = _run(LPGCN, LPGCN_NODES, LPGCN_POLICY, rewrite)
    assert isinstance(err, NodeError) and re.search(LIST_REFUSAL, str(err)), err
    assert not _mail_sent(grid, "lpgcn-confirm") & {
        req.metadata.dst_node_id for req, _ in grid.log
        if "hold_nodes" in (_assign_arrays(req) or {})}
    assert not _mail_sent(grid, "lpgcn-verify")


def _sole_holder(probe_real: bool) -> Callable[[MaliciousGrid], Rewrite]:
    """The review's probe: the victim (a node that convolves nothing) is told it convolves
    one item alone, with itself as the item's only holder, and the convolution node's list
    of that item leaves the victim out. The probe is an item the victim's users hold
    (``probe_real``) or one they do not."""
    def rewrite(grid: MaliciousGrid) -> Rewrite:
        def fn(msg: Message) -> RecordDict | None:
            arrays = _assign_arrays(msg)
            if arrays is None:
                return None
            conv = np.unique(arrays["conv_of"])
            assert len(conv) == 1  # the whole catalogue's greedy cover: one node
            victim = min(n for n in grid.ids if n != int(conv[0]))
            setup = from_array_record(array_record(grid.contexts[victim].state, "lpgcn.setup"))
            probe = int(np.flatnonzero(setup["isreal"] == probe_real)[0])
            if msg.metadata.dst_node_id == victim:
                arrays["conv_of"] = arrays["conv_of"].copy()
                arrays["conv_of"][probe] = victim
                arrays.update(hold_ptr=np.array([0, 1], np.int64),
                              hold_nodes=np.array([victim], np.uint64))
            elif msg.metadata.dst_node_id == int(conv[0]):
                # every node holds the catalogue in one pseudonym order: list k is item k
                arrays = _without(arrays, victim, np.array([probe]))
            else:
                return None
            return _with_arrays(msg, arrays)
        return fn
    return rewrite


def test_the_sole_holder_probe_gets_the_same_answers_from_a_holder_and_a_non_holder() -> None:
    """Made the sole holder of a probe item, the victim once refused exactly when its users
    never interacted with it (the item's degree was 0). Now its answers, refusals included,
    are the same whether it really holds the probe or not, and it refuses before it mails
    anything about its holdings."""
    answers = {}
    for real in (True, False):
        grid, err = _run(LPGCN, LPGCN_NODES, LPGCN_POLICY, _sole_holder(real))
        assert isinstance(err, NodeError), err
        victim = next(req.metadata.dst_node_id for req, _ in grid.log
                      if (_assign_arrays(req) or {}).get("hold_ptr", np.zeros(0)).tolist()
                      == [0, 1])
        answers[real] = _answers(grid, victim)
        assert victim not in _mail_sent(grid, "lpgcn-verify")
    assert answers[True] == answers[False]
    assert any(re.search(LIST_REFUSAL, text) for _, text in answers[True]), answers


# -- FedMF exact mode: a chosen V against mf-factor-bound ---------------------------------------
FEDMF_SEED, FEDMF_DIM, PROBE = 3, 4, 9
#: Six users, ten items; user 0 (the victim node's first user) holds the probe item 9 in one
#: twin and item 8 instead in the other; nobody else trains on item 9 (user 5 tests it).
_TRAIN = [[0, 1, 2], [2, 3, 4], [0, 2, 5], [1, 3, 6], [4, 5, 7], [6, 7, 8]]
_TEST = [[3], [5], [6], [7], [8], [9]]


def _fedmf_twin(tmp_path: Path, holds_probe: bool) -> dict[str, Any]:
    train = [list(r) for r in _TRAIN]
    train[0] = [0, 1, PROBE if holds_probe else 8]
    folder = tmp_path / ("holder" if holds_probe else "non-holder") / "lightgcn"
    folder.mkdir(parents=True)
    for name, rows in (("train.txt", train), ("test.txt", _TEST)):
        (folder / name).write_text("".join(" ".join(map(str, [u, *r])) + "\n"
                                           for u, r in enumerate(rows)))
    return {"protocol": "fedmf", "dataset": "lightgcn", "data-dir": str(folder.parent),
            "partition": "shards-contiguous", "mf-mode": "exact", "rounds": 2,
            "mf-dim": FEDMF_DIM, "mf-lr": 0.5, "mf-reg": 1e-4, "seed": FEDMF_SEED,
            "aggregator": "secagg+", "run-name": "test-server-choice-fedmf"}


def _chosen_V(grid: MaliciousGrid, seen: dict[int, float]) -> Rewrite:
    """Round 1: every node gets V = 0 but for the probe's row, pointed against user 0's
    (public) initial factor, so a user holding the probe has its factor pushed far past
    mf-factor-bound while one that samples it as a negative is not moved. Round 2: the
    server notes each node's largest stored user factor entry before it answers."""
    U0 = init_user_factors(np.array([0]), FEDMF_DIM, FEDMF_SEED)[0]

    def fn(msg: Message) -> RecordDict | None:
        if msg.metadata.message_type != "query.fedmf_train":
            return None
        round_ = int(msg.content.config_records["protocol"]["round"])
        if round_ == 2:
            stored = array_record(grid.contexts[msg.metadata.dst_node_id].state, "fedmf.users")
            seen[msg.metadata.dst_node_id] = float(np.abs(stored["U"].numpy()).max())
            return None
        V = np.zeros_like(from_array_record(msg.content["arrays"])["V"])
        V[PROBE] = -1e6 * U0 / np.linalg.norm(U0)
        content = copy_content(msg.content)
        content["arrays"] = to_array_record({"V": V})
        return content
    return fn


@pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")  # the attack's
def test_a_chosen_V_past_the_factor_bound_makes_no_node_refuse(tmp_path: Path) -> None:
    """The bound was a refusal on the node's stored factors, which the server moves with
    the V it sends: a holder of the probe refused the next round, a non-holder did not.
    Now a value outside the declared range is clipped inside the masked sum (the server
    learns how many nodes clipped); the victim and its twin answer alike in clear."""
    bound = 100.0  # the default mf-factor-bound
    replies, largest = {}, {}
    for holds in (True, False):
        seen: dict[int, float] = {}
        grid, err = _run(_fedmf_twin(tmp_path, holds), 3, {},
                         lambda g, seen=seen: _chosen_V(g, seen))
        victim = grid.ids[0]  # partition 0: users 0 and 1
        assert err is None or "outside the declared range" in str(err), err
        answers = _answers(grid, victim)
        assert all(not text for _, text in answers), answers
        round2 = [reply.content for req, reply in grid.log
                  if req.metadata.dst_node_id == victim
                  and req.metadata.message_type == "query.fedmf_train"
                  and int(req.content.config_records["protocol"]["round"]) == 2]
        assert len(round2) == 1
        reply = round2[0]
        replies[holds] = (sorted(reply.keys()), dict(reply[SHAPES_KEY]),
                          {k: v.numpy().shape for k, v in reply[VALUES_KEY].items()})
        largest[holds] = seen[victim]
    assert largest[True] > bound >= largest[False]  # the chosen V did what the attack needs
    assert replies[True] == replies[False]


# -- every check before any state changes -----------------------------------------------------
FEDMF_SMALL = {"protocol": "fedmf", "dataset": "synthetic", "synthetic-users": 30,
               "synthetic-items": 20, "seed": 1, "mf-mode": "exact", "rounds": 1,
               "mf-dim": 3, "mf-lr": 0.5, "aggregator": "secagg+",
               "run-name": "test-server-choice-fedmf-state"}


def _sum_record_variants() -> dict[str, Callable[[RecordDict], None]]:
    """Ways a server breaks a train request's sum record (the node's policy: no plain)."""
    def drop(content: RecordDict) -> None:
        del content[SUM_KEY]

    def field(key: str, value: Any) -> Callable[[RecordDict], None]:
        def edit(content: RecordDict) -> None:
            record = dict(content[SUM_KEY])
            if value is None:
                record.pop(key)
            else:
                record[key] = value
            content[SUM_KEY] = ConfigRecord(record)
        return edit

    return {"no record": drop, "no mode": field("mode", None),
            "plain, not allowed": field("mode", "plain"), "max-abs 0": field("max-abs", 0.0),
            "max-abs < 0": field("max-abs", -5.0)}


@pytest.mark.parametrize("variant", sorted(_sum_record_variants()))
def test_a_train_request_without_a_valid_sum_record_keeps_no_state(variant: str) -> None:
    """The node trains on V and keeps its users' new factors only once the request's sum
    record checked: a refused request leaves them as they were."""
    def replay(grid: MaliciousGrid) -> None:
        request = grid.requests("fedmf_train")[0]
        state = grid.contexts[request.metadata.dst_node_id].state
        before = from_array_record(array_record(state, "fedmf.users"))
        content = copy_records(request.content)
        _sum_record_variants()[variant](content)
        with pytest.raises(Refused):
            grid.replay(request, content)
        after = from_array_record(array_record(state, "fedmf.users"))
        assert sorted(after) == sorted(before)
        for key, value in before.items():
            np.testing.assert_array_equal(after[key], value)

    _, err = _run(FEDMF_SMALL, 3, {}, then=replay)
    assert err is None


def test_an_lpgcn_round_with_a_malformed_delivery_keeps_nothing_of_it() -> None:
    """A round whose deliveries check only in part is refused before the node keeps any of
    them (it used to keep the valid ones it read first, then refuse the malformed one)."""
    kept: dict[str, Any] = {}

    def rewrite(grid: MaliciousGrid) -> Rewrite:
        def fn(msg: Message) -> RecordDict | None:
            if (kept or msg.metadata.message_type != "query.lpgcn_round"
                    or "arrays" not in msg.content.array_records):
                return None
            arrays = from_array_record(msg.content["arrays"])
            node = msg.metadata.dst_node_id
            state = grid.contexts[node].state
            kept.update(node=node, before=sorted(array_record(state, "lpgcn.step") or {}))
            content = copy_content(msg.content)
            content["arrays"] = ArrayRecord({**dict(content["arrays"].items()),
                                             **to_array_record({"e9": np.zeros((1, 1))})})
            assert list(content["arrays"])[:len(arrays)] == list(arrays)  # valid ones first
            return content
        return fn

    grid, err = _run(LPGCN, LPGCN_NODES, LPGCN_POLICY, rewrite)
    assert isinstance(err, NodeError) and "e9" in str(err), err
    after = sorted(array_record(grid.contexts[kept["node"]].state, "lpgcn.step") or {})
    assert after == kept["before"]
