"""A deviating server against SecAgg+ on the real ClientApp with roster-signed identities.

Each test is a sequence of requests a server could send (survivor lists, node sets, alive
lists, retries, a second key setup) and asserts what the nodes' own checks guarantee: the
server never gathers enough to rebuild one node's input, never gets a sum over another node
set than the one the nodes committed to, and learns nothing from a refusal. The property
test generates unmask schedules over neighbourhoods of 3-12 nodes.

With simulated identities (public deterministic keys) a server can forge every signature,
so these guarantees need a roster (docs/threat-model.md, "The line we hold").
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flwr.app import ConfigRecord, RecordDict
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clients.diagnostics import diagnostic_vector
from fedrec.secure.fixedpoint import FixedPoint
from fedrec.secure.identity import keygen
from fedrec.secure.sealed import MAIL_DIRECTORY, MAIL_IN
from fedrec.secure.secagg import SecAggError, neighbour_graph
from fedrec.transport.messenger import Messenger, NodeError
from fedrec.transport.secagg_server import SecureAggregator
from fedrec.wire.sums import SUM_KEY, VALUES_KEY, AggregationError
from fl_app.client_app import build_client_app
from tests.malicious import MaliciousGrid, Refused
from tests.simutil import diag_request

SHAPES = {"v": (6,)}
MAX_ABS = 10.0
#: The strongest node setting for these attacks: dropouts allowed (consistency round on).
DROPOUTS = {"allow-plain": False, "allow-dropouts": True}
APPS = {name: build_client_app(["clients.diagnostics"], policy=policy) for name, policy in
        {"default": {}, "dropouts": DROPOUTS}.items()}
MAX_NODES = 12


@pytest.fixture(scope="module")
def roster(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("roster")
    keygen(MAX_NODES, folder)
    return folder


_RUNS = itertools.count(1)
_STATES = itertools.count(1)


def _configs(folder: Path, n: int, state: Path | None = None) -> dict[int, dict[str, Any]]:
    """Roster identities for ``n`` nodes, sharing the privacy state file ``state`` (the DP
    ledger's file, which keeps the node set each identity committed to across runs); by
    default a fresh one, each run standing for a federation of its own."""
    state = state if state is not None else folder / f"state-{next(_STATES)}.json"
    return {i: {"identity-key": str(folder / f"node-{i}.key"),
                "roster": str(folder / "roster.json"), "allow-simulated-identity": "false",
                "dp-ledger": str(state)}
            for i in range(n)}


class Run:
    """One run of ``n`` nodes: key setup done, one sum's masked inputs in hand (the
    aggregator stops before its own unmasking, so the test plays the server from there)."""

    def __init__(self, folder: Path, n: int, *, policy: str = "default",
                 degree: int | None = None, identity: str = "roster") -> None:
        # simulated identities check the node set and splits through their neighbours only
        configs = _configs(folder, n) if identity == "roster" else None
        self.grid = MaliciousGrid(APPS[policy], n, node_configs=configs, run_id=next(_RUNS))
        self.messenger = Messenger(self.grid, timeout=10)
        self.nodes = self.messenger.node_ids()
        self.agg = SecureAggregator(self.messenger, self.nodes, seed=7, degree=degree,
                                    allow_dropouts=policy == "dropouts")
        self.agg.setup()
        self.masked: dict[int, np.ndarray] = {}

    def close(self) -> None:
        self.grid.close()

    def mask(self, request_seed: int = 3) -> None:
        """The masked round of the next sum, as an honest server runs it."""
        def keep(node: int, reply: RecordDict) -> None:
            self.masked[node] = reply.array_records[VALUES_KEY]["v"].numpy().copy()

        class _Stop(Exception):
            pass

        def stop(*_: Any) -> Any:
            raise _Stop

        self.agg._unmask = self.agg._confirm = stop  # type: ignore[method-assign]
        try:
            self.agg.sum("diag_secure_sum", diag_request(request_seed, SHAPES),
                         max_abs=MAX_ABS, on_reply=keep)
        except _Stop:
            pass
        finally:
            del self.agg._unmask, self.agg._confirm  # the class's own again

    def lists(self, survivors: list[int], dropped: list[int], **extra: Any) -> RecordDict:
        """A split of the current sum as the wire carries it: the dropped list (the
        survivors follow from the committed set; ``survivors`` orders ``confirmations``)."""
        return RecordDict({SUM_KEY: ConfigRecord({
            "sum-id": self.agg.sum_id, "dropped": sorted(dropped), **extra})})

    def ask(self, node: int, action: str, content: RecordDict) -> RecordDict | None:
        """The node's reply, or None if it refused."""
        try:
            return self.grid.ask(node, action, content)
        except Refused:
            return None


def recoverable(run: Run, victim: int, revealed: dict[int, dict[str, bytes]]) -> bool:
    """Whether the server holds what rebuilds ``victim``'s input from its masked vector:
    ``threshold`` shares of its self-mask seed and the pairwise key with every neighbour it
    masked with (revealed by itself or by that neighbour)."""
    shares = sum(1 for r in revealed.values() if f"b:{victim}" in r)
    if shares < run.agg.thresholds[victim]:
        return False
    return all(f"k:{v}" in revealed.get(victim, {}) or f"k:{victim}" in revealed.get(v, {})
               for v in run.agg.graph[victim])


def _schedule_attack(run: Run, views: dict[int, list[int]]) -> dict[int, dict[str, bytes]]:
    """The server shows node u the dropped list ``views[u]`` (survivors: the rest of the
    node set) in both the consistency round and the unmasking, handing each node every
    signature it collected on that node's split; returns what every node revealed."""
    members = set(run.nodes)
    signatures: dict[tuple[tuple[int, ...], tuple[int, ...]], dict[int, bytes]] = {}
    for u, dropped in views.items():
        survivors = sorted(members - set(dropped))
        if dropped:
            reply = run.ask(u, "secagg_confirm", run.lists(survivors, dropped))
            if reply is not None:
                signatures.setdefault((tuple(survivors), tuple(sorted(dropped))), {})[u] = \
                    bytes(reply.config_records["confirm"]["signed"])
    revealed: dict[int, dict[str, bytes]] = {}
    for u, dropped in views.items():
        survivors = sorted(members - set(dropped))
        have = signatures.get((tuple(survivors), tuple(sorted(dropped))), {})
        # a missing signature is filled with any other signature the server holds
        spare = next((s for sigs in signatures.values() for s in sigs.values()), b"\0" * 100)
        # the signers the node asks for: every survivor, or its surviving neighbourhood
        pool = survivors if run.agg.whole[u] else \
            sorted(({u} | set(run.agg.graph[u])) & set(survivors))
        extra = {"confirmations": [have.get(v, spare) for v in pool]} if dropped else {}
        reply = run.ask(u, "secagg_unmask", run.lists(survivors, dropped, **extra))
        if reply is not None:
            revealed[u] = {k: bytes(v) for k, v in reply.config_records["revealed"].items()}
    return revealed


# -- 1. split unmask lists --------------------------------------------------------------------
@pytest.mark.parametrize("identity", ["roster", "simulated"])
@pytest.mark.parametrize("n", [5, 6, 7])
def test_split_survivor_lists_never_unmask_the_victim(roster: Path, n: int,
                                                      identity: str) -> None:
    """The review's attack: the victim is told its neighbours dropped (it reveals its pairwise
    keys with them), the others are told the victim survived (they reveal shares of its
    seed); padded lists name node ids that do not exist. Nodes allow dropouts here. With
    simulated identities each node checks only its neighbourhood's signatures: the victim's
    neighbours are exactly the nodes whose signatures its split lacks."""
    run = Run(roster, n, policy="dropouts", identity=identity)
    assert set(run.agg.whole.values()) == {identity == "roster"}  # the path under test
    try:
        run.mask()
        victim = run.nodes[0]
        views = {u: [] for u in run.nodes}
        views[victim] = [v for v in run.nodes if v != victim][:n // 2]
        revealed = _schedule_attack(run, views)
    finally:
        run.close()
    assert not recoverable(run, victim, revealed)
    assert victim not in revealed  # it holds no survivor's signature on its split


@pytest.mark.parametrize("lists", ["outsider dropped", "itself dropped", "listed twice"])
def test_a_dropped_list_must_name_nodes_of_the_committed_set(roster: Path, lists: str) -> None:
    """A dropped list naming a node id outside the run's set, the asked node itself, or (in
    a later sum) a node dropped before is refused: a node counts only its committed set,
    and the survivors follow from it."""
    run = Run(roster, 5, policy="dropouts")
    try:
        run.mask()
        members = run.nodes
        dropped = {"outsider dropped": [10**9], "itself dropped": [members[1]],
                   "listed twice": [members[2], members[2]]}[lists]
        content = run.lists(members, dropped)
        if lists == "listed twice":  # a duplicate is one dropout; the split is then unsigned
            with pytest.raises(Refused, match="signature on the split"):
                run.grid.ask(members[1], "secagg_unmask", content)
            return
        with pytest.raises(Refused, match="dropped list must name nodes of the run's "
                                          "committed node set"):
            run.grid.ask(members[1], "secagg_unmask", content)
    finally:
        run.close()


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_no_unmask_schedule_reconstructs_a_single_input(roster: Path, data: Any) -> None:
    """Any per-node survivor/dropped split over 3-12 nodes, complete or sparse graph, nodes
    allowing dropouts, roster identities (every survivor's signature checked) or simulated
    ones (the neighbourhood's): the server never holds both enough seed shares and every
    pairwise key of any one node."""
    n = data.draw(st.integers(3, MAX_NODES), label="nodes")
    degree = data.draw(st.sampled_from([None, 2, 4]), label="degree")
    identity = data.draw(st.sampled_from(["roster", "simulated"]), label="identity")
    run = Run(roster, n, policy="dropouts", degree=degree if degree and degree < n - 1
              else None, identity=identity)
    try:
        run.mask()
        subsets = st.lists(st.sampled_from(run.nodes), unique=True, max_size=n - 1)
        views = {u: data.draw(subsets.filter(lambda d, u=u: u not in d), label=f"drop@{u}")
                 for u in run.nodes}
        revealed = _schedule_attack(run, views)
    finally:
        run.close()
    for victim in run.nodes:
        assert not recoverable(run, victim, revealed), (victim, views)


# -- 2. differencing: node sets ------------------------------------------------------------------
def test_a_node_set_without_the_victim_is_refused(roster: Path) -> None:
    """After a sum over every node, the server asks the same request with the victim left
    out of the alive lists, or declares it dropped: nodes refuse both under the default
    policy, so no sum over the smaller set exists to difference."""
    run = Run(roster, 5)
    try:
        run.mask()
        total_before = run.agg.sum_id
        victim = run.nodes[0]

        class Shrink(SecureAggregator):
            def _requests(self, content: Any, nodes: Any, cfg: Any) -> dict[int, RecordDict]:
                if "alive" in cfg:
                    cfg = {**cfg, "alive": [v for v in cfg["alive"] if v != victim]}
                return super()._requests(content, [u for u in nodes if u != victim], cfg)

        run.agg.__class__ = Shrink
        with pytest.raises(NodeError, match="alive list is not its neighbours"):
            run.agg.sum("diag_secure_sum", diag_request(3, SHAPES), max_abs=MAX_ABS)
        # the victim "dropped" during the masked round: the consistency round is refused
        run.agg.__class__ = SecureAggregator
        run.agg._allow_dropouts = True  # the server pretends the nodes allow dropouts
        run.agg.drop = {victim}
        with pytest.raises(NodeError, match="allow-dropouts=false"):
            run.agg.sum("diag_secure_sum", diag_request(3, SHAPES), max_abs=MAX_ABS)
    finally:
        run.close()
    assert run.agg.sum_id > total_before


def test_a_sum_asked_of_fewer_nodes_stays_masked(roster: Path) -> None:
    """The server asks only part of the node set (honest alive lists) and claims everyone
    survived: the pairwise masks with the node it left out never cancel."""
    run = Run(roster, 5)
    try:
        left_out = run.nodes[4]

        class Partial(SecureAggregator):
            def _requests(self, content: Any, nodes: Any, cfg: Any) -> dict[int, RecordDict]:
                return super()._requests(content, [u for u in nodes if u != left_out], cfg)

        run.agg.__class__ = Partial
        run.agg._allow_dropouts = True  # past the server's own check of who answered
        run.mask()
        asked = [u for u in run.nodes if u != left_out]
        revealed = {u: run.ask(u, "secagg_unmask", run.lists(run.nodes, [])) for u in asked}
    finally:
        run.close()
    assert all(r is not None for r in revealed.values())  # honest lists: they answer
    codec = FixedPoint.for_sum(MAX_ABS, 5)
    total = sum(run.masked.values())
    from fedrec.secure.keys import combine_secret
    from fedrec.secure.secagg import self_mask

    for u in asked:  # remove every self mask the server could rebuild
        shares = [bytes(r.config_records["revealed"][f"b:{u}"]) for r in revealed.values()]
        total = total - self_mask(combine_secret(shares[:run.agg.thresholds[u]]),
                                  run.agg.sum_id, total.shape[0])
    want = sum(diagnostic_vector(3, p, SHAPES["v"]) for p in range(4))
    got = codec.decode(total)
    assert not np.allclose(np.sort(got)[:6], np.sort(want), atol=1.0)
    assert not any(np.allclose(got[i:i + 6], want, atol=1.0) for i in range(len(got) - 5))


def test_a_second_key_setup_with_another_node_set_is_refused(roster: Path) -> None:
    run = Run(roster, 5)
    try:
        fewer = SecureAggregator(run.messenger, run.nodes[:4], seed=8)
        with pytest.raises(NodeError, match="differs from the one it committed to"):
            fewer.setup()
        same = SecureAggregator(run.messenger, run.nodes, seed=9, degree=2)
        same.setup()  # the same node set with another public graph is fine
    finally:
        run.close()


def test_a_second_key_setup_does_not_reuse_sum_ids(roster: Path) -> None:
    """Sum ids stay spent across key setups of a run: a new setup's seeds for sum 1, after
    sum 1 was masked, are refused (a refused or answered id is never answered again)."""
    run = Run(roster, 4)
    try:
        run.mask()
        with pytest.raises(NodeError, match=r"seeds must be for sums after its last \(1\)"):
            SecureAggregator(run.messenger, run.nodes, seed=9).setup()
    finally:
        run.close()


def test_sums_of_both_kinds_in_a_run_share_one_node_set(roster: Path) -> None:
    """A run's SecAgg+ key setup commits the node set for its CKKS sums too: a CKKS key
    setup over one node fewer is refused (the two sums could be differenced)."""
    from fedrec.transport.aggregators import CkksAggregator

    run = Run(roster, 5)
    try:
        with pytest.raises(NodeError, match="differs from the one it committed to"):
            CkksAggregator(run.messenger, run.nodes[:4], seed=0).setup()
    finally:
        run.close()


def test_neighbours_other_than_the_committed_graph_are_refused(roster: Path) -> None:
    """A server choosing neighbourhoods could cut the graph into pieces whose sums it learns
    separately; nodes recompute their neighbours from the committed set and seed."""
    grid = MaliciousGrid(APPS["default"], 6, node_configs=_configs(roster, 6),
                         run_id=next(_RUNS))
    try:
        messenger = Messenger(grid, timeout=10)
        nodes = messenger.node_ids()
        agg = SecureAggregator(messenger, nodes, seed=7, degree=2)
        real_graph = neighbour_graph(sorted(nodes), 2, 7)
        cut = {u: [v for v in nodes if v != u and (v < nodes[3]) == (u < nodes[3])]
               for u in nodes}
        assert cut != real_graph

        def rewrite(msg: Any) -> RecordDict | None:
            if msg.metadata.message_type != "query.secagg_share":
                return None
            u = msg.metadata.dst_node_id
            cfg = dict(msg.content.config_records[SUM_KEY])
            keys = dict(zip(agg.graph[u], cfg["s-pks"]))
            keys.update({v: agg.s_pks[v] for v in cut[u]})
            cfg.update({"neighbours": cut[u], "s-pks": [keys[v] for v in cut[u]]})
            content = RecordDict(dict(msg.content.items()))
            content[SUM_KEY] = ConfigRecord(cfg)
            return content

        grid.rewrite = rewrite
        with pytest.raises(NodeError, match="neighbours are not the ones the committed"):
            agg.setup()
    finally:
        grid.close()


# -- 3. retries: a refused request spends its sum id -----------------------------------------
def test_the_stock_evaluate_round_is_no_oracle() -> None:
    """Flower's stock evaluate message answers metrics in clear for a V the server chooses:
    refused unless the node's operator allows plain replies."""
    from flwr.app import ArrayRecord

    data = ConfigRecord({"dataset": "synthetic", "synthetic-users": 30,
                         "synthetic-items": 20, "seed": 1, "partition": "shards-contiguous"})
    grid = MaliciousGrid(build_client_app(), 3, run_id=next(_RUNS), data=dict(data))
    try:
        request = RecordDict({"config": ConfigRecord({"fedrec-protocol": "fedmf", "seed": 1}),
                              "data": data,
                              "arrays": ArrayRecord([np.ones((20, 4))])})
        with pytest.raises(Refused, match="allow-plain=false"):
            grid.ask(grid.ids[0], "evaluate", request, message_type="evaluate")
    finally:
        grid.close()


def test_a_refused_request_spends_its_sum_id(roster: Path) -> None:
    run = Run(roster, 4)
    try:
        run.mask()
        u = run.nodes[1]
        bad = run.lists(run.nodes[:3], [run.nodes[3]])
        assert run.ask(u, "secagg_unmask", bad) is None
        with pytest.raises(Refused, match="twice"):
            run.grid.ask(u, "secagg_unmask", run.lists(run.nodes, []))
        # the masked request again, without its (spent) relayed mail
        request = run.grid.requests("diag_secure_sum")[1]
        retry = RecordDict({k: v for k, v in request.content.items()
                            if k not in (MAIL_IN, MAIL_DIRECTORY)})
        with pytest.raises(Refused, match="ids must increase"):
            run.grid.ask(request.metadata.dst_node_id, "diag_secure_sum", retry)
    finally:
        run.close()


# -- 4. refusals are no oracle -------------------------------------------------------------------
def test_values_out_of_range_give_the_server_a_count_of_nodes_only(roster: Path) -> None:
    """A server shrinking the declared range sum after sum learns, per sum, only how many
    nodes clipped (inside the masked sum): every node answers alike, none refuses."""
    run = Run(roster, 4)
    try:
        counts = []
        for bound in (1.0, 0.5, 0.25, 0.1):
            with pytest.raises(AggregationError) as err:
                run.agg.sum("diag_secure_sum", diag_request(3, SHAPES), max_abs=bound)
            counts.append(str(err.value).split("'diag_secure_sum': ")[1].split(" node")[0])
        refusals = [reply for _, reply in run.grid.log if reply.has_error()]
    finally:
        run.close()
    assert not refusals
    assert all(c.isdigit() and 0 < int(c) <= 4 for c in counts)


@contextmanager
def _ckks_run(rewrite_for: Any = None) -> Iterator[tuple[MaliciousGrid, Any]]:
    """A run of 4 nodes that opted in to CKKS sums, key relay and node-set setup done
    (``rewrite_for(sorted node ids)``, if given, is a rewrite altering messages from the
    start)."""
    from fedrec.transport.aggregators import CkksAggregator

    app = build_client_app(["clients.diagnostics"], policy={"allow-ckks": True})
    grid = MaliciousGrid(app, 4, run_id=next(_RUNS))
    if rewrite_for is not None:
        grid.rewrite = rewrite_for(sorted(grid.ids))
    try:
        ckks = CkksAggregator(Messenger(grid, timeout=60), grid.ids, seed=0)
        ckks.setup()
        yield grid, ckks
    finally:
        grid.close()


def test_the_ckks_decrypter_opens_sums_over_one_node_set() -> None:
    """CKKS (node opt-in): after opening a sum over every node, the decrypter refuses a sum
    of the same request over one node fewer (still above min-survivors): the difference
    would be that node's input."""
    with _ckks_run() as (grid, ckks):
        request = diag_request(3, {"v": (5,)})
        chunks, layout = ckks.sum_encrypted("diag_secure_sum", request, max_abs=MAX_ABS)
        ckks.decrypt(chunks, layout, phase="all")
        chunks, layout = ckks.sum_encrypted("diag_secure_sum", request, max_abs=MAX_ABS)
        victim = next(n for n in grid.ids if n != ckks.decrypter)
        del ckks.contributions[ckks.sum_id][victim]
        with pytest.raises(NodeError, match="not the node set every member signed"):
            ckks.decrypt(chunks, layout, phase="without the victim")


def test_two_decrypters_cannot_be_shown_different_node_sets() -> None:
    """The attack: node X opens a sum of every contribution; the server then has another
    node B open, as its first sum, the same request without the victim A's contribution,
    and differences the two. B's node set is the one all four signed at key setup, so it
    refuses, and the server gets no second sum."""
    with _ckks_run() as (grid, ckks):
        request = diag_request(3, {"v": (5,)})
        chunks, layout = ckks.sum_encrypted("diag_secure_sum", request, max_abs=MAX_ABS)
        ckks.decrypt(chunks, layout, phase="all")
        victim, other = [n for n in grid.ids if n != ckks.decrypter][:2]
        chunks, layout = ckks.sum_encrypted("diag_secure_sum", request, max_abs=MAX_ABS)
        del ckks.contributions[ckks.sum_id][victim]
        ckks.decrypter = other
        with pytest.raises(NodeError, match=f"node {other} .*refuses to decrypt sum 2: its "
                                            "contributors are not the node set"):
            ckks.decrypt(chunks, layout, phase="without the victim")
    replies = [r for m, r in grid.log if m.metadata.message_type == "query.aggregate_decrypt"]
    assert len(replies) == 2 and replies[1].has_error()  # nothing decrypted the second time


def _another_set_for_the_second(ids: list[int]) -> Any:
    """A rewrite showing node ``ids[1]`` the node set without ``ids[0]`` at key setup; the
    others are shown the set of all nodes."""
    def rewrite(msg: Any) -> RecordDict | None:
        if msg.metadata.message_type != "query.nodeset_commit" or \
                msg.metadata.dst_node_id != ids[1]:
            return None
        content = RecordDict(dict(msg.content.items()))
        content["nodeset"] = ConfigRecord({"members": ids[1:]})
        return content
    return rewrite


def test_a_node_shown_another_node_set_at_key_setup_makes_no_sum() -> None:
    """Key setup shows node B the set without A, the others the set of all four. B signed
    its set, but A, C and D signed theirs: B refuses to contribute (so it has no sum to
    decrypt), and every other node refuses too, B's signature not being on their set. The
    server gets no ciphertext, over either set."""
    with _ckks_run(_another_set_for_the_second) as (grid, ckks):
        with pytest.raises(NodeError, match="did not sign the node set"):
            ckks.sum_encrypted("diag_secure_sum", diag_request(3, {"v": (5,)}),
                               max_abs=MAX_ABS)
        request = grid.requests("diag_secure_sum")[0].content
        for node in grid.ids:  # each node, asked on its own, refuses
            with pytest.raises(Refused, match="did not sign the node set"):
                grid.ask(node, "diag_secure_sum", RecordDict(dict(request.items())))
    answered = [r for m, r in grid.log
                if m.metadata.message_type == "query.diag_secure_sum" and not r.has_error()]
    assert not answered


def _sum_in_a_new_run(folder: Path, state: Path, partitions: list[int], kind: str,
                      policy: dict[str, Any]) -> np.ndarray:
    """A new run (fresh Flower node state) of 4 roster nodes sharing the privacy state file
    ``state``, summing one request over the nodes of ``partitions``."""
    from fedrec.transport.factory import make_aggregator

    app = build_client_app(["clients.diagnostics"], policy={"allow-ckks": True, **policy})
    grid = MaliciousGrid(app, 4, node_configs=_configs(folder, 4, state), run_id=next(_RUNS))
    try:
        nodes = sorted(n for n in grid.ids
                       if int(grid.contexts[n].node_config["partition-id"]) in partitions)
        agg = make_aggregator(kind, Messenger(grid, timeout=60), nodes, seed=7)
        return agg.sum("diag_secure_sum", diag_request(3, {"v": (5,)}), max_abs=MAX_ABS)["v"]
    finally:
        grid.close()


@pytest.mark.parametrize("kind", ["secagg+", "ckks"])
def test_a_new_run_cannot_sum_over_another_node_set(roster: Path, tmp_path: Path,
                                                    kind: str) -> None:
    """The attack across runs: a sum of one request over partitions 0-3, then, in a new run
    (Flower's node state starts empty), the same request over 1-3; the difference is node
    0's input. Each roster node keeps the set of its first run in its privacy state file,
    so the new run's nodes refuse it and the server gets no second sum; the first set again
    is answered, and a subset is accepted only by nodes that allow dropouts."""
    state = tmp_path / "state.json"
    _sum_in_a_new_run(roster, state, [0, 1, 2, 3], kind, {})
    with pytest.raises(NodeError, match="not the one it committed to in an earlier run"):
        _sum_in_a_new_run(roster, state, [1, 2, 3], kind, {})
    with pytest.raises(NodeError, match="not the one it committed to in an earlier run"):
        _sum_in_a_new_run(roster, state, [0, 1, 3], kind, {})
    _sum_in_a_new_run(roster, state, [0, 1, 2, 3], kind, {})
    _sum_in_a_new_run(roster, state, [1, 2, 3], kind, {"allow-dropouts": True})


# -- 5. chosen models: every node must have been sent the same request ----------------------
def _inconsistent(victim: int, victim_seed: int, shapes: dict = SHAPES) -> Any:
    """A rewrite giving ``victim`` another sum request (another model) than the others."""
    def rewrite(msg: Any) -> RecordDict | None:
        if msg.metadata.dst_node_id != victim or \
                msg.metadata.message_type != "query.diag_secure_sum":
            return None
        content = RecordDict(dict(msg.content.items()))
        content["diag"] = diag_request(victim_seed, shapes)["diag"]
        return content
    return rewrite


def test_a_model_given_to_one_node_only_leaves_the_sum_masked(roster: Path) -> None:
    """Model inconsistency (Pasquini et al. 2022): the victim is sent a request of the
    server's choice, the others one whose replies the server knows. Each node binds its
    pairwise masks to the request it answered, so the masks between the victim and the
    others do not cancel: an honest server's check names the node, and a server that skips
    the check decodes noise, not the victim's input."""
    run = Run(roster, 5)
    victim = run.nodes[2]
    run.grid.rewrite = _inconsistent(victim, victim_seed=11)
    try:
        with pytest.raises(SecAggError, match="answered another request"):
            run.agg.sum("diag_secure_sum", diag_request(3, SHAPES), max_abs=MAX_ABS)
        run.agg._bound_of = lambda reply, label: b""  # the server skips its own checks
        run.agg._checked = lambda sums, phase, max_abs: sums
        got = run.agg.sum("diag_secure_sum", diag_request(3, SHAPES), max_abs=MAX_ABS)["v"]
    finally:
        run.close()
    known = sum(diagnostic_vector(3, p, SHAPES["v"]) for p in range(5) if p != 2)
    victim_input = diagnostic_vector(11, 2, SHAPES["v"])
    assert not np.allclose(got - known, victim_input, atol=1.0)


def test_the_ckks_decrypter_refuses_contributions_to_another_request() -> None:
    with _ckks_run() as (grid, ckks):
        grid.rewrite = _inconsistent(next(n for n in grid.ids if n != ckks.decrypter), 11,
                                     {"v": (5,)})
        chunks, layout = ckks.sum_encrypted("diag_secure_sum", diag_request(3, {"v": (5,)}),
                                            max_abs=MAX_ABS)
        with pytest.raises(NodeError, match="signed for this sum and the request"):
            ckks.decrypt(chunks, layout, phase="inconsistent")


def test_a_node_unmasks_only_with_min_survivors_it_checked_itself(roster: Path) -> None:
    """In a sparse graph a node has checked the signed keys of its neighbours only: it
    unmasks only if at least its min-survivors of them (itself included) are in the sum,
    whatever the survivor list says about nodes it cannot check."""
    app = build_client_app(["clients.diagnostics"],
                           policy={"allow-dropouts": True, "min-survivors": 4})
    grid = MaliciousGrid(app, 7, node_configs=_configs(roster, 7), run_id=next(_RUNS))
    try:
        messenger = Messenger(grid, timeout=10)
        nodes = messenger.node_ids()
        agg = SecureAggregator(messenger, nodes, seed=7, degree=4, allow_dropouts=True)
        agg.setup()
        victim = nodes[0]
        agg.drop = set(agg.graph[victim][:2])  # two of its four neighbours "drop"
        with pytest.raises(NodeError, match=f"node {victim}.*refuses to unmask sum 1: 3 "
                                            "node.s. with signed keys it checked"):
            agg.sum("diag_secure_sum", diag_request(3, SHAPES), max_abs=MAX_ABS)
    finally:
        grid.close()
