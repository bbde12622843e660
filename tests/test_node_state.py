"""Typed node state (``NodeContext.load_state`` / ``save_state``): one frozen state per
mechanism, every field checked when it is reloaded; SecAgg+ on it still sums exactly."""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
from typing import Any

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, Context, RecordDict

import clients
from clients.common import HelloAnswered
from clients.dp_fedmf import DPFedMFUsers
from clients.dp_prototypes import DPPrototypesUsers
from clients.fedsvd import CheckedSelectionContext, SyncNoise
from clients.identity_node import VerifiedKeys
from clients.lpgcn import LPGCNFlags, LPGCNLosses, LPGCNParams, LPGCNSetup, StateArrays
from clients.mvmf import MVMFFactors
from clients.node import NodeContext
from clients.nodeset import NodeSetCommitted
from clients.noise_node import NoiseHistory
from clients.relay_node import SharedSecret
from clients.sealed_node import MailDirectory, MailInbox, MailKeyState
from clients.secagg_node import SecAggCommitted, SecAggState
from clients.state import state_keys
from fedrec.secure.identity import SIGNED_KEY_BYTES
from fedrec.wire.message import Message, WireError, message, reply, wire_fields

#: A value no refusal may echo (a state holds secrets).
SECRET = "do-not-echo-0x5eC12e7"


def _node(state: RecordDict | None = None) -> NodeContext:
    context = Context(run_id=1, node_id=7, node_config={"partition-id": 3},
                      state=state if state is not None else RecordDict(), run_config={})
    return NodeContext(context=context, request=RecordDict())


def _setup_state(**kw: Any) -> SecAggState:
    fields = {"run_tag": b"\x01" * 32, "s_sk": b"\x02" * 32, "last_sum": 4,
              "commit": "ab" * 32, "degree": -1, "graph_seed": 2**40 + 3}
    return SecAggState(**{**fields, **kw})


SHARED = {"neighbours": [3, 9, 11], "s_pks": [b"k3", b"k9", b"k11"], "threshold": 3,
          "batch": 16}

#: The committed node set held by its root (cross-device) and as its whole list.
BY_ROOT = NodeSetCommitted(digest=b"\x03" * 32, count=5, index=2, confirmed=False,
                           root=b"\x04" * 32)
WHOLE_SET = NodeSetCommitted(digest=b"\x05" * 32, count=3, index=0, confirmed=True,
                             members=[7, 8, 9], root=b"\x06" * 32)
#: Two directory entries (node id, 9 bytes | signed key), as ``sealed_node._pack`` makes.
DIRECTORY = MailDirectory(keys=b"".join(v.to_bytes(9, "big", signed=True)
                                        + bytes([v]) * SIGNED_KEY_BYTES for v in (3, 9)))
HISTORY = NoiseHistory(sigma=[1.5, 2.0], shares=[4, 4], l2=[8.0, 8.0], dim=[10, 10],
                       rate=[1.0, 0.5], delta=1e-5, epsilon=0.75)
#: Two verified keys' digests; two mails waiting in the inbox (``<sender>|<round>|<purpose>``).
VERIFIED = VerifiedKeys(digests=b"\x01" * 32 + b"\x02" * 32)
INBOX = MailInbox(keys=["1003|2|secret:lpgcn-S", "1004|2|secagg-share:0"],
                  mail=[b"sealed-1", b"sealed-2"])
HELLO = HelloAnswered(run=12)
CHECKED = CheckedSelectionContext(sha256="ab" * 32)
NOISE = SyncNoise(t=4, mode="secagg+", weight=0.25, std=0.5,
                  N=np.arange(6, dtype=np.float64).reshape(3, 2))
#: A relayed secret, kept per purpose.
RELAYED = SharedSecret(secret=b"\x09" * 32, make="random-key", owner=1003,
                       fingerprint=b"\x0a" * 32)
#: LP-GCN's progress: in step 5, training, its W update of step 4 waiting, some parts done.
FLAGS = LPGCNFlags(step=5, train=True, w_pending=4, done=["degrees", "deg.1003", "got.ei0"])


# -- round trip ------------------------------------------------------------------------
@pytest.mark.parametrize("state", [
    _setup_state(),
    _setup_state(**SHARED),
    SecAggCommitted(count=6, dropped=[], dropped_at=[]),
    SecAggCommitted(count=6, dropped=[1003, 1004], dropped_at=[2, 5]),
    BY_ROOT,
    WHOLE_SET,
    MailKeyState(sk=b"\x07" * 32),
    DIRECTORY,
    MailDirectory(keys=b""),
    HISTORY,
    VERIFIED,
    VerifiedKeys(digests=b""),
    INBOX,
    HELLO,
    CHECKED,
    FLAGS,
    LPGCNFlags(step=-1),
], ids=["key-setup", "after-share-round", "committed", "committed-with-dropouts",
        "nodeset-by-root", "nodeset-whole", "mail-key", "mail-directory", "empty-directory",
        "noise-history", "verified-keys", "none-verified", "mail-inbox", "hello-answered",
        "checked-selection-context", "lpgcn-flags", "lpgcn-flags-before-the-first-step"])
def test_a_state_round_trips(state: Message) -> None:
    node = _node()
    assert node.load_state(type(state)) is None  # nothing kept yet
    node.save_state(state)
    assert node.load_state(type(state)) == state
    # a fresh NodeContext over the same Flower state (the next message) reads it back too
    assert _node(node.state).load_state(type(state)) == state


def test_a_save_replaces_the_old_records_and_leaves_other_state_alone() -> None:
    node = _node()
    node.state["secagg.received"] = ConfigRecord({"5:3": b"share"})
    node.save_state(_setup_state(**SHARED))
    node.save_state(_setup_state(last_sum=9))  # a new key setup: no neighbours yet
    st = node.load_state(SecAggState)
    assert st is not None and st.last_sum == 9 and st.neighbours is None and st.batch is None
    assert set(node.state["secagg.state"]) == {
        "run_tag", "s-sk", "last-sum", "commit", "degree", "graph_seed"}
    assert bytes(node.state["secagg.received"]["5:3"]) == b"share"
    # updates go through dataclasses.replace: the state is frozen
    with pytest.raises(dataclasses.FrozenInstanceError):
        st.last_sum = 10  # type: ignore[misc]


def test_the_records_keep_their_node_local_names() -> None:
    """The record's field names are those it always had (a state kept across an upgrade
    reloads)."""
    assert [f.name for f in wire_fields(SecAggState)] == [
        "run_tag", "s-sk", "last-sum", "commit", "degree", "graph_seed", "neighbours",
        "s_pks", "threshold", "batch"]
    assert [f.name for f in wire_fields(SecAggCommitted)] == ["count", "dropped", "dropped-at"]
    assert [f.name for f in wire_fields(NodeSetCommitted)] == [
        "digest", "count", "index", "confirmed", "members", "root"]
    assert [f.name for f in wire_fields(MailKeyState)] == ["sk"]
    assert [f.name for f in wire_fields(MailDirectory)] == ["keys"]
    assert [f.name for f in wire_fields(NoiseHistory)] == [
        "sigma", "shares", "l2", "dim", "rate", "delta", "epsilon"]
    assert (NodeSetCommitted.CONFIG, MailKeyState.CONFIG, MailDirectory.CONFIG,
            NoiseHistory.CONFIG) == ("nodeset.committed", "relay.key", "relay.known-keys",
                                     "noise.history")
    assert [f.name for f in wire_fields(SharedSecret)] == [
        "secret", "make", "owner", "fingerprint"]
    assert [f.name for f in wire_fields(HelloAnswered)] == ["run"]
    assert [f.name for f in wire_fields(SyncNoise)] == ["t", "mode", "weight", "std", "N"]
    assert [f.name for f in wire_fields(CheckedSelectionContext)] == ["sha256"]
    assert (HelloAnswered.CONFIG, SyncNoise.CONFIG, SyncNoise.ARRAYS,
            CheckedSelectionContext.CONFIG) == ("handshake.answered", "fedsvd.noise-info",
                                                "fedsvd.noise", "fedsvd.he-context")
    # packed (a record entry per key or mail is type-checked at each write): new layouts
    assert [f.name for f in wire_fields(VerifiedKeys)] == ["digests"]
    assert [f.name for f in wire_fields(MailInbox)] == ["keys", "mail"]
    assert (VerifiedKeys.CONFIG, MailInbox.CONFIG) == ("identity.verified", "relay.inbox")


def test_the_records_are_stored_as_they_were_written_by_hand() -> None:
    """What ``save_state`` writes is, entry for entry and in order, the record the modules
    used to build by hand (a record written before the change reloads; nothing else
    changes)."""
    node = _node()
    for st in (WHOLE_SET, MailKeyState(sk=b"k" * 32), DIRECTORY, HISTORY):
        node.save_state(st)
    assert dict(node.state["nodeset.committed"]) == {
        "digest": b"\x05" * 32, "count": 3, "index": 0, "confirmed": True,
        "members": [7, 8, 9], "root": b"\x06" * 32}
    node.save_state(BY_ROOT)
    assert list(node.state["nodeset.committed"]) == [
        "digest", "count", "index", "confirmed", "root"]
    assert dict(node.state["relay.key"]) == {"sk": b"k" * 32}
    assert dict(node.state["relay.known-keys"]) == {"keys": DIRECTORY.keys}
    assert dict(node.state["noise.history"]) == {
        "sigma": [1.5, 2.0], "shares": [4, 4], "l2": [8.0, 8.0], "dim": [10, 10],
        "rate": [1.0, 0.5], "delta": 1e-5, "epsilon": 0.75}
    assert SECRET not in repr(MailKeyState(sk=SECRET.encode()))  # never printed
    for st in (HELLO, CHECKED, NOISE):
        node.save_state(st)
    node.save_state(RELAYED, "lpgcn-S")
    assert dict(node.state["handshake.answered"]) == {"run": 12}
    assert dict(node.state["fedsvd.he-context"]) == {"sha256": "ab" * 32}
    assert dict(node.state["fedsvd.noise-info"]) == {
        "t": 4, "mode": "secagg+", "weight": 0.25, "std": 0.5}
    assert list(node.state["fedsvd.noise"]) == ["N"]
    assert dict(node.state["secret.lpgcn-S"]) == {
        "secret": b"\x09" * 32, "make": "random-key", "owner": 1003,
        "fingerprint": b"\x0a" * 32}
    assert not [k for k in node.state if k.startswith("secret-arrays")]  # no arrays record
    for st in (SharedSecret(secret=SECRET.encode(), make="random-key", owner=1,
                            fingerprint=b""),
               SyncNoise(t=1, mode="ckks", weight=1.0, N=np.full((1, 1), 7.25))):
        assert SECRET not in repr(st) and "7.25" not in repr(st)  # never printed


@message()
class _Arrays(Message):
    CONFIG = "test.arrays-state"
    ARRAYS = "test.arrays-state.arrays"

    step: int = reply(min=0)
    u: np.ndarray | None = reply(None, shape=("users", "dim"))


def test_a_state_with_arrays_round_trips_and_a_dropped_array_leaves_no_copy() -> None:
    node = _node()
    u = np.arange(6, dtype=np.float32).reshape(3, 2)
    node.save_state(_Arrays(step=1, u=u))
    got = node.load_state(_Arrays)
    assert got is not None and got.step == 1
    np.testing.assert_array_equal(got.u, u)
    node.save_state(_Arrays(step=2))
    assert "test.arrays-state.arrays" not in node.state
    assert node.load_state(_Arrays) == _Arrays(step=2)


# -- refusals on reload ----------------------------------------------------------------
def _corrupt(cls: type[Message], state: Message, field: str, value: Any) -> NodeContext:
    node = _node()
    node.save_state(state)
    record = node.state[cls.CONFIG]
    if value is _MISSING:
        del record[field]
    else:
        record[field] = value
    return node


_MISSING = object()

CORRUPTIONS = [
    # (state class, state, field, stored value, what the refusal says)
    (SecAggState, _setup_state(), "last-sum", SECRET.encode(), "must be an integer"),
    (SecAggState, _setup_state(), "last-sum", -7, "must be an integer >= 0"),
    (SecAggState, _setup_state(), "last-sum", 2.5, "must be an integer"),
    (SecAggState, _setup_state(), "s-sk", SECRET, "must be bytes"),
    (SecAggState, _setup_state(), "run_tag", 12345, "must be bytes"),
    (SecAggState, _setup_state(), "commit", SECRET.encode(), "must be str"),
    (SecAggState, _setup_state(**SHARED), "neighbours", SECRET, "must be a list of int"),
    (SecAggState, _setup_state(**SHARED), "s_pks", [SECRET], "must be list of bytes"),
    (SecAggState, _setup_state(**SHARED), "threshold", 0, "must be an integer >= 1"),
    (SecAggState, _setup_state(), "s-sk", _MISSING, "has no field"),
    (SecAggState, _setup_state(), "last-sum", _MISSING, "has no field"),
    (SecAggCommitted, SecAggCommitted(count=6, dropped=[1], dropped_at=[2]), "dropped",
     [SECRET], "must be an integer"),
    (SecAggCommitted, SecAggCommitted(count=6, dropped=[], dropped_at=[]), "count",
     _MISSING, "has no field"),
    (NodeSetCommitted, BY_ROOT, "digest", SECRET, "must be bytes"),
    (NodeSetCommitted, WHOLE_SET, "members", [SECRET], "must be an integer"),
    (NodeSetCommitted, BY_ROOT, "index", -7, "must be an integer >= 0"),
    (NodeSetCommitted, BY_ROOT, "confirmed", SECRET, "must be bool"),
    (MailKeyState, MailKeyState(sk=b"\x07" * 32), "sk", SECRET, "must be bytes"),
    (MailKeyState, MailKeyState(sk=b"\x07" * 32), "sk", _MISSING, "has no field"),
    (MailDirectory, DIRECTORY, "keys", DIRECTORY.keys[:-1], "must be whole"),
    (NoiseHistory, HISTORY, "epsilon", SECRET, "must be float"),
    (NoiseHistory, HISTORY, "sigma", [2.5], "one entry per sum"),
    (NoiseHistory, HISTORY, "delta", -7.0, "must be >= 0"),
    (VerifiedKeys, VERIFIED, "digests", SECRET, "must be bytes"),
    (VerifiedKeys, VERIFIED, "digests", VERIFIED.digests[:-1], "must be whole"),
    (VerifiedKeys, VERIFIED, "digests", _MISSING, "has no field"),
    (MailInbox, INBOX, "keys", [SECRET, "1004|2|secagg-share:0"], "'<sender>|<round>|"),
    (MailInbox, INBOX, "keys", SECRET, "must be a list of str"),
    (MailInbox, INBOX, "mail", [SECRET, SECRET], "must be list of bytes"),
    (MailInbox, INBOX, "mail", [b"sealed-1"], "must pair"),
    (MailInbox, INBOX, "keys", ["1003|2|secret:lpgcn-S"] * 2, "must pair distinct keys"),
    (HelloAnswered, HELLO, "run", -7, "must be an integer >= 0"),
    (HelloAnswered, HELLO, "run", SECRET, "must be an integer"),
    (CheckedSelectionContext, CHECKED, "sha256", SECRET, "must be a hex SHA-256"),
    (CheckedSelectionContext, CHECKED, "sha256", 12345, "must be str"),
    (SyncNoise, NOISE, "mode", SECRET.encode(), "must be str"),
    (SyncNoise, NOISE, "weight", -7.0, "must be >= 0"),
    (SyncNoise, NOISE, "std", SECRET, "must be float"),
    (SyncNoise, NOISE, "t", _MISSING, "has no field"),
    (LPGCNFlags, FLAGS, "step", -7, "must be an integer >= -1"),
    (LPGCNFlags, FLAGS, "step", _MISSING, "has no field"),
    (LPGCNFlags, FLAGS, "train", SECRET, "must be bool"),
    (LPGCNFlags, FLAGS, "w-pending", SECRET.encode(), "must be an integer"),
    (LPGCNFlags, FLAGS, "done", SECRET, "must be a list of str"),
    (LPGCNFlags, FLAGS, "done", [SECRET.encode()], "must be list of str"),
]


@pytest.mark.parametrize(("cls", "state", "field", "value", "says"), CORRUPTIONS,
                         ids=[f"{c[0].__name__}-{c[2]}-{i}" for i, c in enumerate(CORRUPTIONS)])
def test_a_corrupted_or_stale_state_is_refused_naming_record_and_field_never_the_value(
        cls: type[Message], state: Message, field: str, value: Any, says: str) -> None:
    node = _corrupt(cls, state, field, value)
    with pytest.raises(WireError) as info:
        node.load_state(cls)
    text = str(info.value)
    assert f"'{cls.CONFIG}'" in text and f"'{field}'" in text and says in text, text
    assert node.who in text and "corrupted or stale" in text, text
    assert SECRET not in text and "-7" not in text and "2.5" not in text, text
    assert "refuses the request" not in text, text  # a state is no request
    assert info.value.__cause__ is None and info.value.__suppress_context__  # no echo chained


def test_a_record_of_another_kind_under_the_state_name_is_refused() -> None:
    node = _node()
    node.state["secagg.state"] = ArrayRecord()  # where its ConfigRecord belongs
    with pytest.raises(WireError, match=r"'secagg\.state'.*has no field 'run_tag'"):
        node.load_state(SecAggState)


def test_secagg_refuses_a_corrupted_state_before_using_it() -> None:
    """A handler reading the SecAgg+ state refuses a corrupted one by name (it used to fail
    deep in a handler, or take e.g. a text 'last-sum' as is)."""
    from clients.secagg_node import _state

    node = _corrupt(SecAggState, _setup_state(), "s-sk", SECRET)
    with pytest.raises(WireError, match=r"'secagg\.state'.*'s-sk'"):
        _state(node)


def test_the_node_set_and_mail_refuse_a_corrupted_state_before_using_it() -> None:
    """The committed node set (read by SecAgg+ by its field names too), the mail key and
    the mail directory, the noise history: each read refuses a corrupted record by name."""
    from clients.nodeset import committed, committed_members
    from clients.noise_node import run_epsilon
    from clients.sealed_node import Mailbox

    node = _corrupt(NodeSetCommitted, WHOLE_SET, "count", SECRET)
    for read in (lambda: committed(node, "the share round"),
                 lambda: committed_members(node)):
        with pytest.raises(WireError, match=r"'nodeset\.committed'.*'count'"):
            read()
    node = _corrupt(MailKeyState, MailKeyState(sk=b"\x07" * 32), "sk", SECRET)
    box = Mailbox(node.state, RecordDict(), 7, 1, None)  # type: ignore[arg-type]
    with pytest.raises(WireError, match=r"'relay\.key'.*'sk'") as info:
        box._secret  # noqa: B018
    assert SECRET not in str(info.value) and "node 7" in str(info.value)
    node = _corrupt(MailDirectory, DIRECTORY, "keys", SECRET)
    box = Mailbox(node.state, RecordDict(), 7, 1, None)  # type: ignore[arg-type]
    with pytest.raises(WireError, match=r"'relay\.known-keys'.*'keys'"):
        box._directory  # noqa: B018
    node = _corrupt(NoiseHistory, HISTORY, "epsilon", SECRET)
    with pytest.raises(WireError, match=r"'noise\.history'.*'epsilon'"):
        run_epsilon(node)


def test_the_noise_arrays_are_checked_on_reload_and_round_trip() -> None:
    """fedsvd's noise is kept with its synchronization: a missing or reshaped noise array
    is refused on reload naming the field; the kept one reloads bit for bit."""
    node = _node()
    node.save_state(NOISE)
    back = node.load_state(SyncNoise)
    assert back is not None and (back.t, back.mode, back.weight, back.std) == (4, "secagg+",
                                                                              0.25, 0.5)
    np.testing.assert_array_equal(back.N, NOISE.N)
    node.drop_state(SyncNoise)  # answered once: both records go
    assert "fedsvd.noise-info" not in node.state and "fedsvd.noise" not in node.state
    assert node.load_state(SyncNoise) is None
    from fedrec.records import to_array_record

    for noise, says in ((None, "has no field 'N'"),
                        (np.full(5, 7.25), "array 'N' must have 2 dimension(s)")):
        node.save_state(NOISE)
        if noise is None:
            del node.state["fedsvd.noise"]
        else:
            node.state["fedsvd.noise"] = to_array_record({"N": noise})
        with pytest.raises(WireError, match=r"'fedsvd\.noise-info' does not match") as info:
            node.load_state(SyncNoise)
        assert says in str(info.value) and "7.25" not in str(info.value), str(info.value)


# -- a state kept per key (the relay's secret per purpose) -------------------------------
def test_a_keyed_state_keeps_one_instance_per_key() -> None:
    """``save_state(msg, key)`` keeps one state per key, in records ``CONFIG.<key>``; each
    reloads on its own, ``state_keys`` lists them, ``drop_state`` forgets one."""
    node = _node()
    other = dataclasses.replace(RELAYED, make="ckks-context", owner=1004)
    assert node.load_state(SharedSecret, "lpgcn-S") is None
    node.save_state(RELAYED, "lpgcn-S")
    node.save_state(other, "ckks.sums")  # a purpose may hold dots
    assert node.load_state(SharedSecret, "lpgcn-S") == RELAYED
    assert _node(node.state).load_state(SharedSecret, "ckks.sums") == other
    assert node.load_state(SharedSecret) is None  # no unkeyed instance
    assert state_keys(node.state, SharedSecret) == ["lpgcn-S", "ckks.sums"]
    node.drop_state(SharedSecret, "lpgcn-S")
    assert state_keys(node.state, SharedSecret) == ["ckks.sums"]
    assert node.load_state(SharedSecret, "lpgcn-S") is None


@pytest.mark.parametrize(("field", "value", "says"), [
    ("secret", SECRET, "must be bytes"),
    ("owner", SECRET.encode(), "must be an integer"),
    ("make", SECRET.encode(), "must be str"),
    ("fingerprint", _MISSING, "has no field"),
])
def test_a_corrupted_keyed_state_is_refused_naming_its_record_and_field(
        field: str, value: Any, says: str) -> None:
    """A kept secret off its declaration is refused, by the relay's readers too, naming the
    record of its purpose and the field, never the value."""
    from clients.relay_node import get_shared_context, get_shared_secret

    node = _node()
    node.save_state(RELAYED, "lpgcn-S")
    node.save_state(RELAYED, "other")
    record = node.state["secret.lpgcn-S"]
    if value is _MISSING:
        del record[field]
    else:
        record[field] = value
    assert node.load_state(SharedSecret, "other") == RELAYED  # the other purpose is intact
    for read in (lambda: node.load_state(SharedSecret, "lpgcn-S"),
                 lambda: get_shared_secret(node.state, "lpgcn-S", node.who),
                 lambda: get_shared_context(node.state, "lpgcn-S", node.who)):
        with pytest.raises(WireError) as info:
            read()
        text = str(info.value)
        assert "'secret.lpgcn-S'" in text and f"'{field}'" in text and says in text, text
        assert node.who in text and "corrupted or stale" in text, text
        assert SECRET not in text and info.value.__cause__ is None, text


def test_the_relay_reads_its_secret_and_names_what_it_holds() -> None:
    from clients.relay_node import get_shared_context, get_shared_secret
    from fedrec.secure.relay import RelayError

    node = _node()
    node.save_state(RELAYED, "lpgcn-S")
    assert get_shared_secret(node.state, "lpgcn-S") == RELAYED.secret
    with pytest.raises(RelayError, match=r"no shared secret 'x'.*holds: \['lpgcn-S'\]"):
        get_shared_secret(node.state, "x")
    with pytest.raises(RelayError, match="is a random-key, not a CKKS context"):
        get_shared_context(node.state, "lpgcn-S")


@message()
class _Overlapping(Message):  # key "arrays.x"'s config record would be key "x"'s arrays
    CONFIG = "test.overlap"
    ARRAYS = "test.overlap.arrays"

    x: int = reply()


def test_a_keyed_state_whose_records_extend_one_another_is_refused() -> None:
    node = _node()
    node.save_state(_Overlapping(x=1))  # unkeyed: one record each, no clash
    assert node.load_state(_Overlapping) == _Overlapping(x=1)
    with pytest.raises(TypeError, match="may not extend one another"):
        node.save_state(_Overlapping(x=1), "x")
    with pytest.raises(TypeError, match="may not extend one another"):
        node.load_state(_Overlapping, "x")


# -- the readers of the converted states refuse a corrupted one before using it ------------
def test_hello_refuses_a_corrupted_answered_record() -> None:
    from clients.common import hello

    node = _corrupt(HelloAnswered, HELLO, "run", SECRET)
    with pytest.raises(WireError, match=r"'handshake\.answered'.*'run'") as info:
        hello(RecordDict(), node)
    assert SECRET not in str(info.value)
    with pytest.raises(RuntimeError, match="refuses a second hello"):
        hello(RecordDict(), _node(_corrupt(HelloAnswered, HELLO, "run", 13).state))


def test_a_verified_key_is_found_only_at_a_digest_boundary() -> None:
    """The packed digests hold a digest only where one starts: bytes straddling two are
    not a verified key."""
    a, b = bytes(range(32)), bytes(range(32, 64))
    kept = VerifiedKeys(digests=a + b)
    assert kept.holds(a) and kept.holds(b)
    assert not kept.holds(a[16:] + b[:16]) and not VerifiedKeys(digests=b"").holds(a)


def test_the_identity_refuses_a_corrupted_verified_record() -> None:
    from clients.identity_node import NodeIdentity
    from fedrec.secure.identity import SigningIdentity, simulated_roster_of

    node = _corrupt(VerifiedKeys, VERIFIED, "digests", VERIFIED.digests[:-1])
    me = NodeIdentity(SigningIdentity.simulated(0), simulated_roster_of(2), 0,
                      simulated=True, who=node.who)
    with pytest.raises(WireError, match=r"'identity\.verified'.*'digests'") as info:
        me.check_once(node.state, "mail", 1, 8, b"\x00" * 8)
    assert node.who in str(info.value)


def test_the_mailbox_refuses_a_corrupted_inbox_and_empties_it_as_it_reads() -> None:
    """The inbox reloads checked; mail read is taken out, and an inbox read empty is no
    longer kept."""
    from clients.sealed_node import Mailbox

    node = _corrupt(MailInbox, INBOX, "mail", [b"sealed-1"])
    box = Mailbox(node.state, RecordDict(), 7, 1, None)  # type: ignore[arg-type]
    with pytest.raises(WireError, match=r"'relay\.inbox'.*'mail'"):
        box.receive("secret:lpgcn-S")
    node = _node()
    node.save_state(INBOX)
    box = Mailbox(node.state, RecordDict(), 7, 1, None)  # type: ignore[arg-type]
    assert box.receive("nobody-sent-this") == {}
    assert node.load_state(MailInbox) == INBOX
    box._peer_key = lambda peer: b"\x00" * 32  # type: ignore[method-assign]
    with pytest.raises(Exception, match="failed authentication"):  # not sealed for real
        box.receive("secret:lpgcn-S")
    assert node.load_state(MailInbox) == MailInbox(keys=INBOX.keys[1:], mail=INBOX.mail[1:])
    with pytest.raises(Exception, match="failed authentication"):
        box.receive("secagg-share:0")
    assert "relay.inbox" not in node.state  # read empty: no longer kept


# -- declarations ----------------------------------------------------------------------
@message()
class _OnTheWire(Message):  # forgot to name its own records
    x: int = reply()


@message()
class _SameRecord(Message):
    CONFIG = "test.same"
    ARRAYS = "test.same"

    x: int = reply()


@pytest.mark.parametrize("cls", [_OnTheWire, _SameRecord])
def test_a_state_must_name_its_own_records(cls: type[Message]) -> None:
    node = _node()
    with pytest.raises(TypeError, match="names its own records"):
        node.save_state(cls(x=1))
    with pytest.raises(TypeError, match="names its own records"):
        node.load_state(cls)
    assert not list(node.state)


def _subclasses(cls: type) -> set[type]:
    out = set()
    for sub in cls.__subclasses__():
        out |= {sub, *_subclasses(sub)}
    return out


def test_node_states_name_distinct_records_never_a_wire_one() -> None:
    """Every state class of the clients package names records of its own: no two share
    one, none is a record some wire message travels in."""
    for info in pkgutil.iter_modules(clients.__path__, "clients."):
        importlib.import_module(info.name)
    import fedrec.wire

    for info in pkgutil.iter_modules(fedrec.wire.__path__, "fedrec.wire."):
        importlib.import_module(info.name)
    every = _subclasses(Message)
    states = [c for c in every if c.__module__.startswith("clients.")]
    wire = {name for c in every if c.__module__.startswith("fedrec.wire.")
            for name in (c.CONFIG, c.ARRAYS)} | {Message.CONFIG, Message.ARRAYS}
    assert {SecAggState, SecAggCommitted, NodeSetCommitted, MailKeyState, MailDirectory,
            NoiseHistory, SharedSecret, VerifiedKeys, MailInbox, HelloAnswered, SyncNoise,
            CheckedSelectionContext, DPFedMFUsers, DPPrototypesUsers, MVMFFactors,
            LPGCNSetup, LPGCNParams, LPGCNLosses, LPGCNFlags} <= set(states)
    names = [name for c in states for name in (c.CONFIG, c.ARRAYS)]
    assert len(names) == len(set(names)), sorted(names)
    assert not set(names) & wire, sorted(set(names) & wire)


# -- SecAgg+ on the typed state ----------------------------------------------------------
def test_secagg_still_sums_exactly_on_the_typed_state() -> None:
    """A full sum equals, bit for bit, the decoded ring sum of every node's fixed-point
    input; a second sum with a dropout (confirm and unmask) equals the plain sum of the
    survivors; afterwards each node's state reloads, typed, as the rounds left it."""
    from clients.diagnostics import diagnostic_vector
    from clients.sums_node import clipped_into_range
    from fedrec.secure.fixedpoint import FixedPoint
    from fedrec.transport.secagg_server import SecureAggregator
    from fedrec.wire.sums import flatten, unflatten
    from tests.test_secagg import (
        DROPOUTS,
        MAX_ABS,
        SEED,
        SHAPES,
        N,
        _check,
        _on_fresh_run,
        _request,
    )

    out: dict[str, Any] = {}

    def run(messenger: Any, nodes: list[int]) -> None:
        contexts = messenger.grid.contexts
        out["parts"] = {v: int(contexts[v].node_config["partition-id"]) for v in nodes}
        agg = SecureAggregator(messenger, nodes, seed=2, allow_dropouts=True)
        agg.setup()
        out["full"] = agg.sum("diag_secure_sum", _request(), max_abs=MAX_ABS)
        agg.drop = {nodes[0]}
        out["drop"] = agg.sum("diag_secure_sum", _request(), max_abs=MAX_ABS)
        out["nodes"] = nodes
        out["states"] = {v: (NodeContext(context=contexts[v], request=RecordDict())
                             .load_state(SecAggState),
                             NodeContext(context=contexts[v], request=RecordDict())
                             .load_state(SecAggCommitted)) for v in nodes}

    _on_fresh_run(run, DROPOUTS)
    nodes, parts = out["nodes"], out["parts"]

    codec = FixedPoint.for_sum(MAX_ABS, N)
    ring = np.zeros(0, dtype=np.uint64)
    for p in parts.values():
        arrays = {name: diagnostic_vector(SEED + i, p, shape)
                  for i, (name, shape) in enumerate(sorted(SHAPES.items()))}
        flat, layout = flatten(clipped_into_range(arrays, MAX_ABS))
        encoded = codec.encode(flat)
        ring = encoded if not ring.size else ring + encoded  # wraps mod 2^64
    want = unflatten(codec.decode(ring), layout)  # with the nodes' clip flags, left out
    for name in SHAPES:
        np.testing.assert_array_equal(out["full"][name], want[name])
    _check(out["full"], sorted(parts.values()))
    _check(out["drop"], [p for v, p in parts.items() if v != nodes[0]])

    for v in nodes:
        st, committed = out["states"][v]
        assert isinstance(st, SecAggState) and isinstance(committed, SecAggCommitted)
        assert st.neighbours == sorted(set(nodes) - {v})  # the complete graph
        assert len(st.s_pks or []) == N - 1 and st.threshold and st.batch
        assert committed.count == N
        assert st.last_sum == 2  # the dropped node masked too; its reply was discarded
        if v == nodes[0]:  # never asked to confirm the split that dropped it
            assert committed.dropped == []
        else:
            assert (committed.dropped, committed.dropped_at) == ([nodes[0]], [2])
        assert "s_sk" not in repr(st) and repr(st.s_sk) not in repr(st)  # never printed


def test_fedmf_state_with_mismatched_moments_is_refused_on_reload() -> None:
    """FedMF's typed state checks its arrays against each other: Adam moments of another
    dimension than the user factors (a stale or corrupted state) are refused on reload,
    naming the record and the field."""
    import numpy as np
    from flwr.app import Context, RecordDict

    from clients.fedmf import FedMFState
    from clients.node import NodeContext
    from fedrec.wire.message import WireError

    ctx = Context(run_id=1, node_id=7, node_config={}, state=RecordDict(), run_config={})
    node = NodeContext(ctx, RecordDict())
    good = FedMFState(U=np.ones((3, 4)), user_m=np.zeros((3, 4)), user_v=np.zeros((3, 4)),
                      user_t=np.array([2]))
    node.save_state(good)
    back = node.load_state(FedMFState)
    assert back is not None and np.array_equal(back.U, good.U) and back.item_m is None
    node.save_state(FedMFState(U=np.ones((3, 4)), user_m=np.zeros((3, 5))))
    with pytest.raises(WireError, match=r"'fedmf.state' does not match FedMFState.*adamU.m"):
        node.load_state(FedMFState)


# -- the protocols' private arrays (dp-fedmf, dp-prototypes, MVMF, LP-GCN) --------------------
#: An array value no refusal may echo.
VALUE = 7.25


def _array_states() -> list[tuple[Message, dict[str, int]]]:
    """Each protocol's array state with the sizes its node checks it against on reload."""
    rows = np.full((3, 4), VALUE)
    return [(DPFedMFUsers(U=rows), {"users": 3}),
            (DPPrototypesUsers(U=rows), {"users": 3}),
            (MVMFFactors(ids=np.array([2, 5, 9], np.int64), P=rows), {"dim": 4})]


def _equal(a: Message, b: Message | None) -> bool:
    """Two states field for field (arrays by value, dtype and shape)."""
    assert b is not None and type(a) is type(b)
    for f in wire_fields(type(a)):
        x, y = getattr(a, f.attr), getattr(b, f.attr)
        if f.is_array and x is not None and y is not None:
            if x.dtype != y.dtype or not np.array_equal(x, y):
                return False
        elif x is not None or y is not None:
            if f.is_array or x != y:
                return False
    return True


@pytest.mark.parametrize("index", range(3), ids=["dp-fedmf", "dp-prototypes", "mvmf"])
def test_a_protocol_array_state_round_trips(index: int) -> None:
    state, dims = _array_states()[index]
    node = _node()
    assert node.load_state(type(state), dims=dims) is None
    node.save_state(state)
    assert _equal(state, node.load_state(type(state), dims=dims))
    assert _equal(state, _node(node.state).load_state(type(state), dims=dims))


#: (state index, array, stored value, what the refusal says): an array reshaped, of other
#: rows than the node's users or of another dimension than the model's, or dropped.
ARRAY_CORRUPTIONS = [
    (0, "U", np.full((2, 4), VALUE), "axis 0 expected users = 3"),
    (0, "U", np.full(12, VALUE), "must have 2 dimension(s)"),
    (0, "U", None, "has no field 'U'"),
    (1, "U", np.full((5, 4), VALUE), "axis 0 expected users = 3"),
    (1, "U", None, "has no field 'U'"),
    (2, "P", np.full((3, 6), VALUE), "axis 1 expected dim = 4"),
    (2, "P", np.full((2, 4), VALUE), "axis 0 expected kept"),
    (2, "ids", np.zeros((3, 1)), "must have 1 dimension(s)"),
    (2, "ids", None, "has no field 'ids'"),
]


@pytest.mark.parametrize(("index", "name", "value", "says"), ARRAY_CORRUPTIONS,
                         ids=[f"{c[0]}-{c[1]}-{i}" for i, c in enumerate(ARRAY_CORRUPTIONS)])
def test_a_corrupted_protocol_array_state_is_refused_naming_record_and_field(
        index: int, name: str, value: np.ndarray | None, says: str) -> None:
    from fedrec.records import from_array_record, to_array_record

    state, dims = _array_states()[index]
    cls = type(state)
    node = _node()
    node.save_state(state)
    arrays = from_array_record(node.state[cls.ARRAYS])
    if value is None:
        del arrays[name]
    else:
        arrays[name] = value
    node.state[cls.ARRAYS] = to_array_record(arrays)
    with pytest.raises(WireError) as info:
        node.load_state(cls, dims=dims)
    text = str(info.value)
    assert f"'{cls.CONFIG}'" in text and f"'{name}'" in text and says in text, text
    assert node.who in text and "corrupted or stale" in text and str(VALUE) not in text, text
    assert info.value.__cause__ is None


def test_the_protocol_array_states_keep_their_records() -> None:
    """The arrays stay in the records they always had (a reader of the node state, such as
    the LP-GCN attack tests, finds them where it did), under their node-local names."""
    assert [(c.ARRAYS, [f.name for f in wire_fields(c)]) for c in (
        DPFedMFUsers, DPPrototypesUsers, MVMFFactors, LPGCNLosses)] == [
        ("dpfedmf.users", ["U"]), ("dpp.users", ["U"]), ("mvmf.factors", ["ids", "P"]),
        ("lpgcn.losses", ["step", "loss"])]
    assert (LPGCNSetup.ARRAYS, LPGCNParams.ARRAYS, LPGCNFlags.CONFIG) == (
        "lpgcn.setup", "lpgcn.params", "lpgcn.flags")
    assert [f.name for f in wire_fields(LPGCNSetup)] == [
        "pseudo_all", "held_real", "held", "isreal", "cover", "conv_of", "conv_hpos",
        "hold_ptr", "hold_nodes", "own_count", "counts_sent", "hold_cnt", "conv_degree",
        "degree"]
    assert [f.name for f in wire_fields(LPGCNParams)] == [
        "conv_real", "user_ids", "V", "V.m", "V.v", "V.t", "U", "U.m", "U.v", "U.t", "W",
        "W.m", "W.v", "W.t"]


def test_the_array_state_readers_refuse_a_corrupted_state_before_using_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """dp-fedmf's user factors of other rows than the node's users, MVMF's factors of
    another dimension than the request's: each read refuses by record and field."""
    from types import SimpleNamespace

    from clients.dp_fedmf import _users
    from clients.mvmf import _factors

    monkeypatch.setattr(NodeContext, "data",
                        lambda self: SimpleNamespace(user_ids=np.arange(4)))
    node = _node()
    node.save_state(DPFedMFUsers(U=np.full((3, 2), VALUE)))
    with pytest.raises(WireError, match=r"'dpfedmf\.state'.*'U'.*expected users = 4"):
        _users(node, 2, 0)
    node.save_state(MVMFFactors(ids=np.arange(2), P=np.full((2, 3), VALUE)))
    assert set(_factors(node, SimpleNamespace(dim=3))) == {0, 1}  # type: ignore[arg-type]
    with pytest.raises(WireError, match=r"'mvmf\.state'.*'P'.*expected dim = 5"):
        _factors(node, SimpleNamespace(dim=5))  # type: ignore[arg-type]


# LP-GCN keeps its setup, rows and losses array by array (StateArrays: a round reads and
# writes a few), each checked on reload against its declaration as load_state checks.
SETUP = {"pseudo_all": np.array([9, 4, 7, 1], np.uint64), "held_real": np.array([3, 1, 2]),
         "held": np.array([1, 4, 7], np.uint64), "isreal": np.array([True, False, True]),
         "cover": np.array([0.5, 0.1, 0.0]), "conv_of": np.array([7, 8, 7], np.uint64),
         "conv_hpos": np.array([0, 2]), "hold_ptr": np.array([0, 2, 4]),
         "hold_nodes": np.array([7, 8, 7, 8], np.uint64), "degree": np.full(3, VALUE)}
PARAMS = {"conv_real": np.array([3, 2]), "user_ids": np.array([11, 12, 13]),
          "V": np.full((2, 4), VALUE), "U": np.full((3, 4), VALUE),
          "U.m": np.zeros((3, 4)), "U.v": np.zeros((3, 4)), "U.t": np.array([2], np.int64)}
LOSSES = {"step": np.array([0, 1], np.int64), "loss": np.array([VALUE, 0.5])}
#: (class, arrays, the node's sizes)
LAZY = [(LPGCNSetup, SETUP, {"items": 4}), (LPGCNParams, PARAMS, {"users": 3, "dim": 4}),
        (LPGCNLosses, LOSSES, {})]


@pytest.mark.parametrize(("cls", "arrays", "dims"), LAZY, ids=["setup", "params", "losses"])
def test_an_lpgcn_state_round_trips_array_by_array(cls: type[Message],
                                                   arrays: dict[str, np.ndarray],
                                                   dims: dict[str, int]) -> None:
    """Written array by array, reloaded checked (by a later request, or whole through
    ``load_state``); an array written later and one deleted round-trip too."""
    node = _node()
    kept = StateArrays(node, cls, dims)
    assert not list(kept) and cls.ARRAYS not in node.state  # nothing kept, nothing written
    kept.replace(arrays)
    kept.flush()
    assert cls.CONFIG in node.state  # marked kept
    back = StateArrays(_node(node.state), cls, dims)
    assert sorted(back) == sorted(arrays)
    for name, value in arrays.items():
        assert back[name].dtype == value.dtype and np.array_equal(back[name], value), name
    whole = node.load_state(cls, dims=dims)
    assert whole is not None and all(np.array_equal(whole.to_arrays()[k], v)
                                     for k, v in arrays.items())
    first = next(iter(arrays))
    back[first] = arrays[first] + 1
    back.flush()
    again = StateArrays(_node(node.state), cls, dims)
    assert np.array_equal(again[first], arrays[first] + 1)


#: (class, arrays, sizes, array, stored value (None: dropped), what the refusal says)
LAZY_CORRUPTIONS = [
    (LPGCNSetup, SETUP, {"items": 4}, "conv_of", np.zeros(5, np.uint64),
     "axis 0 expected held"),
    (LPGCNSetup, SETUP, {"items": 4}, "pseudo_all", np.zeros(6, np.uint64),
     "axis 0 expected items = 4"),
    (LPGCNSetup, SETUP, {"items": 4}, "cover", np.full(2, VALUE), "axis 0 expected 3"),
    (LPGCNSetup, SETUP, {"items": 4}, "held", None, "has no field 'held'"),
    (LPGCNSetup, SETUP, {"items": 4}, "degree", np.full((3, 1), VALUE),
     "must have 1 dimension(s)"),
    (LPGCNParams, PARAMS, {"users": 3, "dim": 4}, "U", np.full((4, 4), VALUE),
     "axis 0 expected users = 3"),
    (LPGCNParams, PARAMS, {"users": 3, "dim": 4}, "U.m", np.zeros((3, 5)),
     "axis 1 expected dim = 4"),
    (LPGCNParams, PARAMS, {"users": 3, "dim": 4}, "V", np.full((3, 4), VALUE),
     "axis 0 expected conv"),
    (LPGCNParams, PARAMS, {"users": 3, "dim": 4}, "V", None, "has no field 'V'"),
    (LPGCNLosses, LOSSES, {}, "loss", np.full(3, VALUE), "axis 0 expected steps"),
    (LPGCNLosses, LOSSES, {}, "step", None, "has no field 'step'"),
]


@pytest.mark.parametrize(("cls", "arrays", "dims", "name", "value", "says"), LAZY_CORRUPTIONS,
                         ids=[f"{c[0].__name__}-{c[3]}-{i}"
                              for i, c in enumerate(LAZY_CORRUPTIONS)])
def test_a_corrupted_lpgcn_state_is_refused_on_reload_naming_record_and_field(
        cls: type[Message], arrays: dict[str, np.ndarray], dims: dict[str, int], name: str,
        value: np.ndarray | None, says: str) -> None:
    from fedrec.records import to_array_record

    node = _node()
    kept = StateArrays(node, cls, dims)
    kept.replace(arrays)
    kept.flush()
    changed = {k: v for k, v in arrays.items() if k != name}
    if value is not None:
        changed[name] = value
    node.state[cls.ARRAYS] = to_array_record(changed)
    for read in (lambda: StateArrays(node, cls, dims), lambda: node.load_state(cls, dims=dims)):
        with pytest.raises(WireError) as info:
            read()
        text = str(info.value)
        assert f"'{name}'" in text and says in text and "corrupted or stale" in text, text
        assert node.who in text and str(VALUE) not in text and info.value.__cause__ is None
    with pytest.raises(WireError, match=rf"'{cls.ARRAYS}' does not match"):
        StateArrays(node, cls, dims)  # the record its arrays are in


def test_an_lpgcn_state_whose_arrays_are_gone_or_unreadable_is_refused() -> None:
    """Marked kept but its arrays record gone, an array whose record entry declares no
    shape, or whose bytes do not hold the shape declared: refused by record and array
    (the bytes when first read, before any use), never used."""
    node = _node()
    kept = StateArrays(node, LPGCNLosses)
    kept.replace(LOSSES)
    kept.flush()
    record = node.state[LPGCNLosses.ARRAYS]
    loss = record["loss"]
    record["loss"] = type(loss)(dtype=loss.dtype, shape=loss.shape, stype=loss.stype,
                                data=loss.data[:-8])
    reloaded = StateArrays(node, LPGCNLosses)  # the shapes match: read when used
    with pytest.raises(WireError, match=r"'lpgcn\.losses' does not deserialise: array "
                                        r"'loss' does not hold the shape"):
        reloaded["loss"]  # noqa: B018
    record["loss"] = type(loss)(dtype=loss.dtype, shape=(-1,), stype=loss.stype,
                                data=loss.data)
    with pytest.raises(WireError, match=r"'lpgcn\.losses' does not deserialise: array 'loss'"):
        StateArrays(node, LPGCNLosses)
    del node.state[LPGCNLosses.ARRAYS]
    with pytest.raises(WireError, match=r"'lpgcn\.losses' does not match.*has no field"):
        StateArrays(node, LPGCNLosses)


def test_lpgcn_stored_params_refuses_corrupted_rows() -> None:
    from clients.lpgcn import stored_params
    from fedrec.records import to_array_record

    node = _node()
    kept = StateArrays(node, LPGCNParams, {"users": 3, "dim": 4})
    kept.replace(PARAMS)
    kept.flush()
    assert sorted(stored_params(node.state)) == sorted(PARAMS)
    node.state[LPGCNParams.ARRAYS] = to_array_record({**PARAMS, "U.v": np.zeros((3, 2))})
    with pytest.raises(WireError, match=r"'lpgcn\.params\.config'.*'U\.v'"):
        stored_params(node.state)


def test_lpgcn_flags_hold_what_a_session_marks() -> None:
    """A session's flags (a dict, a mark a key set True) and the typed state hold the same:
    a mark not set is no mark, ``train`` is absent before the first step."""
    flags = {"step": 5, "train": True, "w-pending": 4, "degrees": True, "deg.1003": True,
             "got.ei0": True, "sum.ei0": False}
    assert LPGCNFlags.of(flags) == FLAGS
    assert FLAGS.as_dict() == {k: v for k, v in flags.items() if v is not False}
    assert LPGCNFlags(step=-1).as_dict() == {"step": -1, "w-pending": -1}
