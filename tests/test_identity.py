"""Node identities and signed keys: a server that substitutes a public key is refused, and
SecAgg+ holds against a server that shows different nodes different survivor lists.

Every run is on the in-process grid with the real ClientApp (diagnostic actions added).
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flwr.app import ConfigRecord, RecordDict

from fedrec.secure.identity import (
    IdentityError,
    Roster,
    SignedKey,
    SigningIdentity,
    keygen,
    main,
)
from fedrec.secure.keys import NodeKeys
from fedrec.secure.sealed import MAIL_PURPOSE
from fedrec.secure.secagg import MASK_KEY_PURPOSE, SecAggError, masking_minimum, threshold_for
from fedrec.transport.mailroom import open_mailroom
from fedrec.transport.messenger import Messenger, NodeError
from fedrec.transport.relay_server import relay_secret
from fedrec.transport.secagg_server import SecureAggregator
from fl_app.client_app import build_client_app
from tests.localgrid import LocalGrid
from tests.simutil import DIAGNOSTIC_APP, diag_expected, diag_request

SHAPES = {"v": (6,)}


# -- signatures and the roster -------------------------------------------------------------
def test_a_signed_key_checks_only_for_its_run_purpose_node_and_partition(tmp_path: Path) -> None:
    roster = keygen(3, tmp_path)
    me = SigningIdentity.load(tmp_path / "node-1.key")
    pk = NodeKeys().public_bytes()
    signed = me.sign_key(MAIL_PURPOSE, run_id=7, node_id=1001, partition=1, public_key=pk)
    blob = signed.to_bytes()
    assert roster.verify(MAIL_PURPOSE, 7, 1001, SignedKey.from_bytes(blob, "x")) == pk
    assert Roster.load(tmp_path / "roster.json").keys == roster.keys
    for purpose, run, node in [(MASK_KEY_PURPOSE, 7, 1001), (MAIL_PURPOSE, 8, 1001),
                               (MAIL_PURPOSE, 7, 1002)]:
        with pytest.raises(IdentityError, match="does not carry that partition's signature"):
            roster.verify(purpose, run, node, signed)
    # the same signature claimed for another partition, or a key the server signed itself
    with pytest.raises(IdentityError, match=r"node 1001 \(partition 2\)"):
        roster.verify(MAIL_PURPOSE, 7, 1001, SignedKey(2, pk, signed.signature))
    forged = SigningIdentity.generate().sign_key(MAIL_PURPOSE, 7, 1001, 1, pk)
    with pytest.raises(IdentityError, match="substituted or forged"):
        roster.verify(MAIL_PURPOSE, 7, 1001, forged)
    with pytest.raises(IdentityError, match="not in the roster"):
        roster.verify(MAIL_PURPOSE, 7, 1001, SignedKey(9, pk, signed.signature))
    with pytest.raises(IdentityError, match="is not signed"):
        SignedKey.from_bytes(pk, "node 1001")
    assert (tmp_path / "node-0.key").stat().st_mode & 0o077 == 0  # owner-only key file


def test_bad_identity_files_are_clear_errors(tmp_path: Path, capsys) -> None:
    (tmp_path / "roster.json").write_text('{"nodes": {}}')
    with pytest.raises(IdentityError, match=r"roster .*roster.json: expected JSON"):
        Roster.load(tmp_path / "roster.json")
    (tmp_path / "k.key").write_text("not a key")
    with pytest.raises(IdentityError, match=r"k.key: cannot read"):
        SigningIdentity.load(tmp_path / "k.key")
    main(["keygen", "--partitions", "2", "--out", str(tmp_path / "ids")])
    assert "wrote 2 node keys" in capsys.readouterr().out
    assert sorted(Roster.load(tmp_path / "ids" / "roster.json").keys) == [0, 1]


def _hello(grid: LocalGrid, messenger: Messenger) -> list[int]:
    nodes = messenger.node_ids()
    data = RecordDict({"data": ConfigRecord({"dataset": "synthetic", "synthetic-users": 30,
                                             "synthetic-items": 20, "seed": 1,
                                             "partition": "shards-contiguous"})})
    messenger.broadcast("hello", data, nodes)
    for i, n in enumerate(nodes):
        messenger.report.name_node(n, f"partition {i}")
    return nodes


def _deployed_configs(tmp_path: Path, n: int, **extra: Any) -> dict[int, dict[str, Any]]:
    keygen(n, tmp_path)
    return {i: {"identity-key": str(tmp_path / f"node-{i}.key"),
                "roster": str(tmp_path / "roster.json"), **extra} for i in range(n)}


def test_nodes_with_roster_files_run_a_secure_sum(tmp_path: Path) -> None:
    configs = _deployed_configs(tmp_path, 3, **{"allow-simulated-identity": "false"})
    with LocalGrid(build_client_app(**DIAGNOSTIC_APP), 3, node_configs=configs) as grid:
        messenger = Messenger(grid, timeout=10)
        nodes = _hello(grid, messenger)
        agg = SecureAggregator(messenger, nodes, seed=1)
        agg.setup()
        got = agg.sum("diag_secure_sum", diag_request(2, SHAPES), max_abs=10.0)
    np.testing.assert_allclose(got["v"], diag_expected(2, SHAPES, [0, 1, 2])["v"], atol=1e-6)


@pytest.mark.parametrize("fault", ["no roster", "another's key", "no simulated identity"])
def test_identity_config_errors_fail_the_handshake_naming_the_node(tmp_path: Path,
                                                                   fault: str) -> None:
    configs = _deployed_configs(tmp_path, 3)
    if fault == "no roster":
        configs[1] = {"identity-key": configs[1]["identity-key"]}
        expected = "sets 'identity-key' but not 'roster'"
    elif fault == "another's key":
        configs[1]["identity-key"] = configs[0]["identity-key"]
        expected = "is not the key the roster"
    else:
        configs[1] = {"allow-simulated-identity": "false"}
        expected = "allow-simulated-identity=false"
    with LocalGrid(build_client_app(**DIAGNOSTIC_APP), 3, node_configs=configs) as grid:
        messenger = Messenger(grid, timeout=10)
        with pytest.raises(NodeError) as err:
            _hello(grid, messenger)
    assert expected in str(err.value) and "partition 1" in str(err.value)


def test_the_results_say_which_nodes_signed_with_simulated_identities(tmp_path: Path) -> None:
    from strategies.base import handshake

    configs = _deployed_configs(tmp_path, 3)
    del configs[2]
    with LocalGrid(build_client_app(**DIAGNOSTIC_APP), 3, node_configs=configs) as grid:
        messenger = Messenger(grid, timeout=10)
        handshake(messenger, {"dataset": "synthetic", "synthetic-users": 30,
                                    "synthetic-items": 20, "seed": 1,
                                    "partition": "shards-contiguous"})
        report = messenger.privacy_report()["identities"]
    assert len(report["roster"]) == 2 and report["simulated"] == [
        f"node {grid.ids[2]} (partition 2)"]


# -- a server in the middle ------------------------------------------------------------------
def _substitute(blob: bytes, node: int, partition: int, purpose: str) -> bytes:
    """The server's own key in place of ``node``'s, signed with a key the roster lacks."""
    fake = SigningIdentity.generate()
    return fake.sign_key(purpose, 1, node, partition, NodeKeys().public_bytes()).to_bytes()


@pytest.mark.parametrize("how", ["forged", "another-node's"])
def test_a_substituted_mail_key_is_refused(tmp_path: Path, how: str) -> None:
    configs = _deployed_configs(tmp_path, 3)
    with LocalGrid(build_client_app(**DIAGNOSTIC_APP), 3, node_configs=configs) as grid:
        messenger = Messenger(grid, timeout=10)
        nodes = _hello(grid, messenger)
        room = open_mailroom(messenger, nodes)
        victim = nodes[1]
        room.directory[victim] = (_substitute(room.directory[victim], victim, 1, MAIL_PURPOSE)
                                  if how == "forged" else room.directory[nodes[2]])
        with pytest.raises(NodeError) as err:  # node 0 makes a secret and mails every peer
            relay_secret(messenger, nodes, purpose="test-secret", owner=nodes[0])
        sealed_for_victim = [r for r in room.view if r.recipient == victim]
    text = str(err.value)
    assert f"node {nodes[0]} (partition 0) failed" in text
    if how == "forged":
        assert f"node {victim}" in text and "substituted or forged" in text
    else:  # the server copied node 2's genuine signed key: it is signed for node 2 only
        assert "partition 2 appears as node" in text
        assert f"node {nodes[2]}" in text and f"node {victim}" in text
    assert not sealed_for_victim  # nothing was sealed under the server's key


def test_a_substituted_mask_key_aborts_key_setup(tmp_path: Path) -> None:
    """The server swaps one node's SecAgg+ mask key in the share round: its neighbours refuse
    before any seed share is made or mailed."""

    class MiddleServer(SecureAggregator):
        def _share_seeds(self, first_sum: int) -> None:
            victim = self.nodes[2]
            self.s_pks[victim] = _substitute(self.s_pks[victim], victim, 2, MASK_KEY_PURPOSE)
            super()._share_seeds(first_sum)

    configs = _deployed_configs(tmp_path, 4)
    with LocalGrid(build_client_app(**DIAGNOSTIC_APP), 4, node_configs=configs) as grid:
        messenger = Messenger(grid, timeout=10)
        nodes = _hello(grid, messenger)
        with pytest.raises(NodeError) as err:
            MiddleServer(messenger, nodes, seed=1).setup()
        room = messenger.mailroom
        shares = [r for r in room.view if r.purpose.startswith("secagg-share")]
    assert f"node {nodes[2]} (partition 2)" in str(err.value)
    assert "secagg-mask key" in str(err.value) and "substituted or forged" in str(err.value)
    assert not shares  # the first node to see the swapped key refused before sharing


# -- keys are verified once per run; the cache of verified keys cannot be fooled ------------
def test_a_verified_key_is_remembered_only_for_its_exact_bytes_node_run_and_roster(
        tmp_path: Path) -> None:
    from clients.identity_node import NodeIdentity, VerifiedKeys

    roster = keygen(3, tmp_path)
    me = NodeIdentity(SigningIdentity.load(tmp_path / "node-0.key"), roster, 0, simulated=False)
    peer = SigningIdentity.load(tmp_path / "node-1.key")
    pk = NodeKeys().public_bytes()
    genuine = peer.sign_key(MAIL_PURPOSE, 7, 1002, 1, pk).to_bytes()
    state = RecordDict()
    assert me.check_once(state, MAIL_PURPOSE, 7, 1002, genuine) == (1, pk)
    assert len(VerifiedKeys.from_records(state).digests) == 32  # one digest
    assert me.check_once(state, MAIL_PURPOSE, 7, 1002, genuine) == (1, pk)  # remembered
    assert len(VerifiedKeys.from_records(state).digests) == 32  # one digest
    # another key for the same node, the same key claimed for another node, run or purpose:
    # each is checked in full, and refused
    forged = SigningIdentity.generate().sign_key(MAIL_PURPOSE, 7, 1002, 1, pk).to_bytes()
    for purpose, run, node, blob in [(MAIL_PURPOSE, 7, 1002, forged),
                                     (MAIL_PURPOSE, 7, 1003, genuine),
                                     (MAIL_PURPOSE, 8, 1002, genuine),
                                     (MASK_KEY_PURPOSE, 7, 1002, genuine)]:
        with pytest.raises(IdentityError, match="substituted or forged"):
            me.check_once(state, purpose, run, node, blob)
    # the same state under another roster (another federation) remembers nothing
    other = NodeIdentity(me.signer, keygen(3, tmp_path / "other"), 0, simulated=False)
    with pytest.raises(IdentityError, match="substituted or forged"):
        other.check_once(state, MAIL_PURPOSE, 7, 1002, genuine)
    assert len(VerifiedKeys.from_records(state).digests) == 32  # one digest


def test_a_peer_mail_key_changed_mid_run_aborts_naming_the_node(tmp_path: Path) -> None:
    """After a sum (every mail key verified and its pairwise key kept), the server has one node
    make a new, genuinely signed mail key and hands the new directory out: refused."""
    configs = _deployed_configs(tmp_path, 4)
    with LocalGrid(build_client_app(**DIAGNOSTIC_APP), 4, node_configs=configs) as grid:
        messenger = Messenger(grid, timeout=10)
        nodes = _hello(grid, messenger)
        agg = SecureAggregator(messenger, nodes, seed=1)
        agg.setup()
        agg.sum("diag_secure_sum", diag_request(2, SHAPES), max_abs=10.0)
        victim = nodes[2]
        fresh = messenger.send("relay_keys", {victim: RecordDict()})[victim]
        messenger.mailroom.add_keys({victim: bytes(fresh["relay-key"]["pk"])})
        with pytest.raises(NodeError) as err:
            agg.sum("diag_secure_sum", diag_request(2, SHAPES), max_abs=10.0)
    text = str(err.value)
    assert f"refuses a new mail key for node {victim}" in text
    assert "keys may not change during a run" in text


class _SwapLater(SecureAggregator):
    """Hands ``victim``'s mask key ``swap`` in the share rounds after the first."""

    victim, swap = -1, b""

    def _share_seeds(self, first_sum: int) -> None:
        if first_sum > 1:
            self.s_pks[self.victim] = self.swap
        super()._share_seeds(first_sum)


@pytest.mark.parametrize("how", ["genuine key of an earlier setup", "forged"])
def test_a_mask_key_changed_in_a_later_share_round_aborts_naming_the_node(
        tmp_path: Path, how: str) -> None:
    """The nodes verified every mask key in the first share round; in the next one (a new
    batch of seeds) the server hands one node's key of an earlier setup of this run, signed
    by that node, or a forged one: the neighbours refuse, naming the node, and share
    nothing more."""
    configs = _deployed_configs(tmp_path, 4)
    with LocalGrid(build_client_app(**DIAGNOSTIC_APP), 4, node_configs=configs) as grid:
        messenger = Messenger(grid, timeout=10)
        nodes = _hello(grid, messenger)
        earlier = SecureAggregator(messenger, nodes, seed=1)
        earlier.setup()
        agg = _SwapLater(messenger, nodes, seed=2, seed_batch=1)
        agg.victim = nodes[1]
        agg.setup()
        agg.swap = (earlier.s_pks[agg.victim] if how != "forged" else
                    _substitute(agg.s_pks[agg.victim], agg.victim, 1, MASK_KEY_PURPOSE))
        got = agg.sum("diag_secure_sum", diag_request(2, SHAPES), max_abs=10.0)
        np.testing.assert_allclose(got["v"], diag_expected(2, SHAPES, [0, 1, 2, 3])["v"],
                                   atol=1e-6)
        with pytest.raises(NodeError) as err:
            agg.sum("diag_secure_sum", diag_request(2, SHAPES), max_abs=10.0)
        # only the victim (handed its neighbours' unchanged keys) may have shared batch 2
        shared = [r for r in messenger.mailroom.view
                  if r.purpose == "secagg-share:2" and r.sender != agg.victim]
    text = str(err.value)
    assert f"the mask key of node {agg.victim} differs" in text, text
    assert not shared  # every node handed the swapped key refused before sharing a seed


# -- survivor lists that differ from node to node -----------------------------------------
def _attack_succeeds(d: int, t: int, masked: int) -> bool:
    """Can the server split u's neighbourhood (``d`` neighbours + u) into a group that gives
    ``t`` seed shares (u itself may be one) and a disjoint group holding all ``masked``
    pairwise keys? Exhaustive over which neighbours u masked with and how the rest split."""
    holders = list(range(d))  # u's neighbours; u is the extra holder
    for mask_set in itertools.combinations(holders, masked):
        rest = [h for h in holders if h not in mask_set]
        if len(rest) + 1 >= t:  # u's own share plus every neighbour outside the mask set
            return True
    return False


def test_masking_minimum_is_exactly_what_blocks_the_split_survivor_attack() -> None:
    for d in range(2, 12):
        t = threshold_for(d + 1)
        need = masking_minimum(d, t)
        assert not _attack_succeeds(d, t, need), (d, t, need)
        assert need == 0 or _attack_succeeds(d, t, need - 1), (d, t, need)


class _SplitServer(SecureAggregator):
    """Shows the victim an alive list with too few neighbours: the first half of a split
    survivor attack (the neighbours it masked with are later told it dropped)."""

    victim = -1

    def _requests(self, content: Any, nodes: Any, cfg: Any) -> dict[int, RecordDict]:
        nodes = list(nodes)
        if "alive" in cfg and nodes == [self.victim]:
            others = [v for v in cfg["alive"] if v != self.victim]
            cfg = {**cfg, "alive": others[:2]}
        return super()._requests(content, nodes, cfg)


def test_a_node_refuses_to_mask_with_too_few_neighbours() -> None:
    with LocalGrid(build_client_app(**DIAGNOSTIC_APP), 5) as grid:
        messenger = Messenger(grid, timeout=10)
        nodes = _hello(grid, messenger)
        agg = _SplitServer(messenger, nodes, seed=1)
        agg.victim = nodes[3]
        agg.setup()
        with pytest.raises(NodeError) as err:
            agg.sum("diag_secure_sum", diag_request(3, SHAPES), max_abs=10.0)
    text = str(err.value)
    assert f"node {nodes[3]}" in text and "alive list is not its neighbours" in text


# -- dropouts during the unmasking --------------------------------------------------------------
class _SilentInUnmask(SecureAggregator):
    """A node answers its masked input, then goes silent before the unmasking round."""

    quiet: tuple[int, ...] = ()
    grid: LocalGrid | None = None

    def _unmask(self, *args: Any) -> Any:
        self.grid.silent.update(self.quiet)
        try:
            return super()._unmask(*args)
        finally:
            self.grid.silent.difference_update(self.quiet)


def test_the_unmasking_tolerates_silent_nodes_up_to_the_threshold() -> None:
    with LocalGrid(build_client_app(**DIAGNOSTIC_APP), 5) as grid:
        messenger = Messenger(grid, timeout=0.5)
        nodes = _hello(grid, messenger)
        agg = _SilentInUnmask(messenger, nodes, seed=1)
        agg.grid, agg.quiet = grid, (nodes[1], nodes[4])  # 3 of 5 answer; threshold 3
        agg.setup()
        got = agg.sum("diag_secure_sum", diag_request(4, SHAPES), max_abs=10.0)
        # their inputs arrived, so they are in the sum, and they stay in the run's node set:
        # leaving it takes a dropout in a later sum's masking round (nodes refuse other sets)
        np.testing.assert_allclose(got["v"], diag_expected(4, SHAPES, list(range(5)))["v"],
                                   atol=1e-6)
        assert agg.alive == set(nodes)
        dropouts = messenger.privacy_report()["dropouts"]
        assert [d["node_ids"] for d in dropouts] == [[nodes[1], nodes[4]]]
        assert dropouts[0]["phase"].endswith(":unmask")


def test_a_silent_node_holding_a_dropped_nodes_pairwise_key_abandons_the_sum() -> None:
    app = build_client_app(DIAGNOSTIC_APP["extra_modules"],
                           policy={**DIAGNOSTIC_APP["policy"], "allow-dropouts": True})
    with LocalGrid(app, 6) as grid:
        messenger = Messenger(grid, timeout=0.5)
        nodes = _hello(grid, messenger)
        agg = _SilentInUnmask(messenger, nodes, seed=1, allow_dropouts=True)
        agg.grid, agg.quiet, agg.drop = grid, (nodes[1],), {nodes[0]}
        agg.setup()
        with pytest.raises(SecAggError) as err:
            agg.sum("diag_secure_sum", diag_request(4, SHAPES), max_abs=10.0)
    text = str(err.value)
    assert f"node {nodes[1]} (partition 1) went silent" in text
    assert f"dropped node {nodes[0]} (partition 0)" in text and "abandoned" in text


# -- item servers in the roster --------------------------------------------------------------
def test_keygen_gives_item_servers_negative_partitions_and_roles(tmp_path: Path,
                                                                 capsys) -> None:
    main(["keygen", "--partitions", "2", "--item-servers", "2", "--out", str(tmp_path)])
    assert "wrote 4 node keys" in capsys.readouterr().out
    roster = Roster.load(tmp_path / "roster.json")
    assert roster.roles == {-2: "item-server", -1: "item-server", 0: "user", 1: "user"}
    for k in (1, 2):
        key = SigningIdentity.load(tmp_path / f"item-server-{k}.key").public_bytes()
        assert roster.keys[-k] == key
    assert Roster.load(tmp_path / "roster.json").fingerprint == roster.fingerprint
    assert keygen(3, tmp_path / "silos", role="silo").roles == {0: "silo", 1: "silo", 2: "silo"}
    with pytest.raises(SystemExit):
        main(["keygen", "--partitions", "0", "--out", str(tmp_path / "none")])


def test_a_roster_without_roles_still_loads_and_a_wrong_role_is_refused(tmp_path: Path) -> None:
    roster = keygen(2, tmp_path)
    legacy = tmp_path / "legacy.json"
    legacy.write_text(json.dumps({"version": 1, "nodes": {
        str(p): k.hex() for p, k in roster.keys.items()}}))
    assert Roster.load(legacy).keys == roster.keys and not Roster.load(legacy).roles
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"version": 1, "nodes": {"0": roster.keys[0].hex()},
                               "roles": {"0": "server"}}))
    with pytest.raises(IdentityError, match="partition 0 has role 'server'"):
        Roster.load(bad)


def _item_server_federation(tmp_path: Path) -> dict[int, dict[str, Any]]:
    """Nodes 0-2 hold partitions 0-2 of 3, node 3 is the item server (partition -1), every
    one with its key from ``keygen --item-servers 1`` and no simulated identity allowed."""
    main(["keygen", "--partitions", "3", "--item-servers", "1", "--out", str(tmp_path)])
    strict = {"roster": str(tmp_path / "roster.json"), "allow-simulated-identity": "false",
              "num-partitions": 3}
    configs = {i: {"identity-key": str(tmp_path / f"node-{i}.key"), **strict}
               for i in range(3)}
    configs[3] = {"identity-key": str(tmp_path / "item-server-1.key"), "partition-id": -1,
                  "role": "item-server", **strict}
    return configs


def test_an_item_server_loads_its_keygen_identity(tmp_path: Path) -> None:
    from strategies.base import USER_NODES, RoleNeed, handshake

    configs = _item_server_federation(tmp_path)
    needs = (*USER_NODES, RoleNeed(("item-server",), min=1, max=1))
    with LocalGrid(build_client_app(**DIAGNOSTIC_APP), 4, node_configs=configs) as grid:
        messenger = Messenger(grid, timeout=10)
        infos = handshake(messenger, {"dataset": "synthetic", "synthetic-users": 30,
                                      "synthetic-items": 20, "seed": 1,
                                      "partition": "shards-contiguous"}, needs=needs)
        report = messenger.privacy_report()["identities"]
    assert infos[grid.ids[3]].role == "item-server" and infos[grid.ids[3]].partition_id == -1
    assert len(report["roster"]) == 4 and "simulated" not in report


def test_a_node_whose_role_is_not_the_rosters_is_refused(tmp_path: Path) -> None:
    configs = _item_server_federation(tmp_path)
    configs[0]["role"] = "silo"  # the roster lists partition 0 as a user node
    with LocalGrid(build_client_app(**DIAGNOSTIC_APP), 4, node_configs=configs) as grid:
        with pytest.raises(NodeError, match="role 'silo', but the roster .* lists partition 0 "
                                            "as 'user'"):
            _hello(grid, Messenger(grid, timeout=10))


def test_keygen_into_a_folder_keeps_every_key_and_adds_the_item_server(tmp_path: Path,
                                                                       capsys) -> None:
    """The doc's flow: keys for the data holders, then ``--item-servers 1`` into the same
    folder adds the item server's key and roster entry and rewrites no node key."""
    main(["keygen", "--partitions", "3", "--out", str(tmp_path)])
    before = {p: (tmp_path / f"node-{p}.key").read_bytes() for p in range(3)}
    first = Roster.load(tmp_path / "roster.json")
    main(["keygen", "--partitions", "3", "--item-servers", "1", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert "wrote 1 node keys (partitions [-1])" in out and "kept partitions [0, 1, 2]" in out
    assert {p: (tmp_path / f"node-{p}.key").read_bytes() for p in range(3)} == before
    roster = Roster.load(tmp_path / "roster.json")
    assert {p: roster.keys[p] for p in range(3)} == dict(first.keys)
    assert roster.roles == {-1: "item-server", 0: "user", 1: "user", 2: "user"}
    assert roster.keys[-1] == SigningIdentity.load(tmp_path / "item-server-1.key").public_bytes()
    # a fourth holder later: added, the rest kept; fewer partitions remove nothing
    main(["keygen", "--partitions", "4", "--out", str(tmp_path)])
    main(["keygen", "--partitions", "1", "--out", str(tmp_path)])
    assert sorted(Roster.load(tmp_path / "roster.json").keys) == [-1, 0, 1, 2, 3]
    assert (tmp_path / "node-0.key").read_bytes() == before[0]


def test_keygen_never_overwrites_keys_without_force(tmp_path: Path, capsys) -> None:
    main(["keygen", "--partitions", "2", "--out", str(tmp_path)])
    key0 = (tmp_path / "node-0.key").read_bytes()
    # a holder's own key listed in the roster, its private key elsewhere: kept, not remade
    (tmp_path / "node-1.key").unlink()
    main(["keygen", "--partitions", "2", "--out", str(tmp_path)])
    assert not (tmp_path / "node-1.key").exists()
    assert (tmp_path / "node-0.key").read_bytes() == key0
    # a key file that is not the roster's key: refused, naming the partition, nothing written
    roster_text = (tmp_path / "roster.json").read_text()
    SigningIdentity.generate().save(tmp_path / "node-1.key")
    with pytest.raises(SystemExit):
        main(["keygen", "--partitions", "2", "--out", str(tmp_path)])
    assert "node-1.key does not hold the key" in capsys.readouterr().err
    assert (tmp_path / "roster.json").read_text() == roster_text
    # another role for a listed partition: refused
    with pytest.raises(SystemExit):
        main(["keygen", "--partitions", "2", "--role", "silo", "--out", str(tmp_path)])
    assert "lists partition 0 as 'user', not 'silo'" in capsys.readouterr().err
    # --force: every key anew, the roster of exactly this federation
    main(["keygen", "--partitions", "1", "--role", "silo", "--force", "--out", str(tmp_path)])
    roster = Roster.load(tmp_path / "roster.json")
    assert roster.roles == {0: "silo"} and (tmp_path / "node-0.key").read_bytes() != key0
    assert roster.keys[0] == SigningIdentity.load(tmp_path / "node-0.key").public_bytes()
