"""What a deviating server can make a node keep: node state stays bounded across messages.

Why: the bounds tests (``tests/test_bounds.py``) hold each request to the node's
``memory-budget-mb``, but some of what a request carries outlives it in the node's Flower
state (mail waiting for a handler, the run's node set, the mail directory). A server that
sends each of many requests just under the budget would otherwise grow that state without
end, and a list long enough to exhaust the node could be copied or hashed before any
check. Each test below plays such a server against the production ClientApp and measures
the node's state (:func:`tests.bounds.state_bytes`); lists are drawn DISTINCT, so no
distinctness check refuses them first (issue 43, "Unbounded state and work").
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from flwr.app import ConfigRecord, RecordDict

from clients.sealed_node import MailInbox
from fedrec.secure.identity import keygen
from fedrec.secure.merkle import MerkleTree
from fedrec.secure.sealed import MAIL_DIRECTORY, MAIL_IN, in_key
from fl_app.client_app import build_client_app
from tests.bounds import check_refusal, state_bytes
from tests.malicious import MaliciousGrid, Refused

MiB = 2**20
#: The request the server's mail and directory ride on: any request carries them (the
#: ClientApp takes them in before the handler runs); this one needs no data and keeps
#: nothing but a fresh mail key, so what the node keeps is what the mail made it keep.
CARRIER = "relay_keys"
INBOX = "relay.inbox"  # the node-state record of mail waiting for a handler
#: A purpose no handler of this project reads, and one SecAgg+'s share round reads.
UNREAD, READ = "no-handler-reads-this", "secagg-share:7"


def _app(budget_mb: float, tmp_path: Path) -> Any:
    return build_client_app(policy={"memory-budget-mb": budget_mb,
                                    "dp-ledger": str(tmp_path / "ledger.json")})


def _ask_all(grid: MaliciousGrid, node: int, requests: list[RecordDict],
             action: str = CARRIER) -> list[str]:
    """Deliver each request to ``node``; the refusals, each checked for its shape."""
    refusals = []
    for content in requests:
        try:
            grid.ask(node, action, content)
        except Refused as err:
            check_refusal(action, str(err))
            refusals.append(str(err))
    return refusals


# -- (a) the sealed mailbox -----------------------------------------------------------------
def _mail(sender: int, round_: int, purpose: str, nbytes: int) -> dict[str, bytes]:
    return {in_key(sender, round_, purpose): bytes(nbytes)}


@pytest.mark.parametrize("purpose", [UNREAD, READ])
def test_mail_the_server_sends_never_grows_state_past_the_budget(tmp_path: Path,
                                                                 purpose: str) -> None:
    """Six requests, each carrying 3 MiB of mail under an 8 MiB budget: every request alone
    is under the budget, together 18 MiB. Mail for a purpose no handler reads is not kept;
    mail for one a handler reads is kept until the inbox would pass the budget, then the
    request is refused, naming the node and the budget. State never passes the budget."""
    budget = 8
    with MaliciousGrid(_app(budget, tmp_path), 3) as grid:
        node, sender = grid.ids[0], grid.ids[1]
        requests = [RecordDict({MAIL_IN: ConfigRecord(_mail(sender, r, purpose, 3 * MiB))})
                    for r in range(6)]
        refusals = _ask_all(grid, node, requests)
        kept = state_bytes(grid.contexts[node].state)
    assert kept <= budget * MiB, f"node state holds {kept / MiB:.1f} MiB, budget {budget}"
    if purpose == UNREAD:
        assert INBOX not in grid.contexts[node].state or \
            not grid.contexts[node].state[INBOX], "unread mail was kept"
    else:
        assert refusals and all("memory-budget-mb=8" in r for r in refusals), refusals


def test_the_inbox_keeps_a_bounded_number_of_entries(tmp_path: Path) -> None:
    """Many tiny mails (one per relay round, all for a purpose a handler reads): the byte
    budget alone would let a node keep millions; the inbox keeps at most a fixed number
    per roster partition, so requests past it are refused and the inbox stops growing."""
    with MaliciousGrid(_app(64, tmp_path), 3) as grid:
        node, sender = grid.ids[0], grid.ids[1]
        requests = [RecordDict({MAIL_IN: ConfigRecord({
            in_key(sender, 1000 * i + r, READ): b"x" for r in range(40)})})
            for i in range(6)]
        counts = []
        refusals = []
        for content in requests:
            refusals += _ask_all(grid, node, [content])
            state = grid.contexts[node].state
            counts.append(len(MailInbox.from_records(state).keys) if INBOX in state else 0)
    assert refusals and all("mail" in r for r in refusals), refusals
    assert counts[-1] == counts[-2] < 6 * 40, counts


def test_a_mail_directory_longer_than_the_roster_is_not_kept(tmp_path: Path) -> None:
    """The directory of mail keys can name no more nodes than the roster has partitions
    (each node signs as its own partition): a longer one, or entries claiming partitions
    outside the roster over several requests, are refused before they are kept."""
    with MaliciousGrid(_app(64, tmp_path), 3) as grid:
        node = grid.ids[0]

        def entry(partition: int) -> bytes:  # a signed key's shape: partition | key | sig
            return partition.to_bytes(4, "big", signed=True) + bytes(96)

        long = {str(5000 + p): entry(p) for p in range(-1, 2000)}
        forged = [{str(9000 + p): entry(p) for p in range(100 + 3 * i, 103 + 3 * i)}
                  for i in range(4)]
        refusals = _ask_all(grid, node, [RecordDict({MAIL_DIRECTORY: ConfigRecord(d)})
                                         for d in (long, *forged)])
        state = grid.contexts[node].state
        kept = state.get("relay.known-keys")
    assert len(refusals) == 5, refusals
    assert kept is None or len(bytes(kept["keys"])) <= 4 * 109, "directory kept"
    assert state_bytes(state) < MiB


# -- (b) member lists ------------------------------------------------------------------------
def _secagg_setup(members: list[int]) -> RecordDict:
    """A SecAgg+ key setup over ``members`` for the node ``members[0]``: the set's Merkle
    root, size and that node's path (all a simulated identity reads), and the whole list
    (which a roster identity needs)."""
    ids = sorted(members)
    tree = MerkleTree(ids)
    index = ids.index(members[0])
    return RecordDict({"secagg": ConfigRecord({
        "run-tag": b"t" * 16, "members": members, "members-root": tree.root,
        "members-count": len(ids), "member-index": index, "member-path": tree.path(index),
        "degree": 0, "graph-seed": 0})})


def _nodeset(members: list[int]) -> RecordDict:
    return RecordDict({"nodeset": ConfigRecord({"members": members})})


SETUPS: dict[str, Callable[[list[int]], RecordDict]] = {
    "secagg_advertise": _secagg_setup, "nodeset_commit": _nodeset}
#: Node-state records a key setup writes (none may exist after a refused one).
SETUP_STATE = ("nodeset.committed", "secagg.committed", "secagg.state")


@pytest.fixture
def no_hashing(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every digest a key setup takes of its node set (the SecAgg+ commitment, the node
    set's digest), recorded instead of computed: a refusal must come before any."""
    calls: list[str] = []

    def spy(name: str, real: Callable) -> Callable:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            calls.append(name)
            return real(*args, **kwargs)
        return wrapped

    import clients.nodeset
    import clients.secagg_node

    monkeypatch.setattr(clients.secagg_node, "commitment",
                        spy("commitment", clients.secagg_node.commitment))
    monkeypatch.setattr(clients.nodeset, "node_set_digest",
                        spy("node_set_digest", clients.nodeset.node_set_digest))
    return calls


def _distinct_members(grid: MaliciousGrid, n: int) -> list[int]:
    """``n`` distinct node ids: the grid's own, then ids no node has."""
    return [*grid.ids, *range(10**6, 10**6 + n - len(grid.ids))]


@pytest.mark.parametrize("action", sorted(SETUPS))
def test_a_key_setup_longer_than_the_roster_is_refused_before_it_is_stored_or_hashed(
        tmp_path: Path, no_hashing: list[str], action: str) -> None:
    """400,003 distinct members (the review's list) on a 3-node run with simulated
    identities (a roster of 4 partitions): refused on the length alone, naming the node
    and the roster, before the list is copied into state or hashed."""
    with MaliciousGrid(_app(4, tmp_path), 3) as grid:
        refusals, state = _setup_of(grid, action, 400_003)
    assert len(refusals) == 1 and "roster" in refusals[0], refusals
    _nothing_kept(no_hashing, state)


def _setup_of(grid: MaliciousGrid, action: str, n: int) -> tuple[list[str], Any]:
    """The first node's refusals of a key setup of ``n`` distinct members, and its state."""
    node = grid.ids[0]
    refusals = _ask_all(grid, node, [SETUPS[action](_distinct_members(grid, n))], action)
    return refusals, grid.contexts[node].state


def _nothing_kept(no_hashing: list[str], state: Any) -> None:
    assert not no_hashing, f"hashed before the refusal: {no_hashing}"
    assert not [k for k in SETUP_STATE if k in state], list(state)


@pytest.fixture(scope="module")
def large_roster(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A deployed federation's roster of 20,003 partitions (nodes 0-2 with their key files;
    the others' public keys made up, as a roster only lists them)."""
    folder = tmp_path_factory.mktemp("large-roster")
    keygen(3, folder)
    path = folder / "roster.json"
    roster = json.loads(path.read_text())
    roster["nodes"].update({str(p): f"{p:064x}" for p in range(3, 20_003)})
    path.write_text(json.dumps(roster))
    return folder


@pytest.mark.parametrize("action", sorted(SETUPS))
def test_a_key_setup_is_reserved_against_the_budget_before_it_is_copied(
        tmp_path: Path, large_roster: Path, no_hashing: list[str], action: str) -> None:
    """With a roster of 20,003 partitions, a set of 20,003 distinct members passes the
    roster's bound, and its copies (the ids, the distinctness check's set, the sorted list,
    the state record) would pass a 1 MiB budget: refused by the reservation, naming the
    node and the budget, before it is stored or hashed."""
    configs = {i: {"identity-key": str(large_roster / f"node-{i}.key"),
                   "roster": str(large_roster / "roster.json"),
                   "allow-simulated-identity": "false"} for i in range(3)}
    with MaliciousGrid(_app(1, tmp_path), 3, node_configs=configs) as grid:
        refusals, state = _setup_of(grid, action, 20_003)
    assert len(refusals) == 1 and "memory-budget-mb=1" in refusals[0], refusals
    _nothing_kept(no_hashing, state)


def test_node_set_signatures_beyond_the_set_are_refused_before_any_is_checked(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A roster node's key-share request carries the members' signatures on the node set
    (it holds the whole set): a record listing more signatures than the roster has
    partitions (here 10,000 made-up ones besides the real three) is refused on its length,
    before any signature is verified."""
    import clients.nodeset
    from fedrec.transport.messenger import Messenger, NodeError
    from fedrec.transport.secagg_server import SecureAggregator
    from fedrec.wire.sums import NODESET_SIGNED_KEY

    checked: list[int] = []
    real = clients.nodeset.signers_of
    monkeypatch.setattr(clients.nodeset, "signers_of",
                        lambda *a, **k: checked.append(1) or real(*a, **k))

    def pad(msg: Any) -> RecordDict | None:
        if msg.metadata.message_type != "query.secagg_share":
            return None
        content = RecordDict(dict(msg.content.items()))
        content[NODESET_SIGNED_KEY] = ConfigRecord({
            **dict(msg.content[NODESET_SIGNED_KEY]),
            **{str(10**6 + i): bytes(100) for i in range(10_000)}})
        return content

    folder = tmp_path / "roster"
    keygen(3, folder)
    configs = {i: {"identity-key": str(folder / f"node-{i}.key"),
                   "roster": str(folder / "roster.json"),
                   "allow-simulated-identity": "false"} for i in range(3)}
    with MaliciousGrid(_app(64, tmp_path), 3, rewrite=pad, node_configs=configs) as grid:
        messenger = Messenger(grid, timeout=10)
        with pytest.raises(NodeError, match="nodeset.signatures. lists 10,003 nodes") as err:
            SecureAggregator(messenger, messenger.node_ids(), seed=7).setup()
    check_refusal("secagg_share", str(err.value))
    assert not checked, "signatures were verified before the record's length was checked"
