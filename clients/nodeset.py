"""The node set a run's sums are over: one per run and node, signed by every member.

Why: two sums of the same request over node sets that differ by one node give that node's
input as their difference. A node that keeps its own "first set" does not stop this when
the server shows each node another set: node A a sum with every contribution, node B one
without A. So a node commits, at key setup, to one set per run (``nodeset_commit``, the
SecAgg+ key setup or LP-GCN's ``lpgcn_holdings``, whichever comes first: every sum kind of
a run shares it) and signs it;
before it contributes to or decrypts a CKKS sum it checks that every member of that set
signed the same set (:func:`signed_set_digest`). Each node signs one set per run, so once
a node holds every member's signature on its set, no member can have been shown another
one: no two nodes' sums are over different sets. A node with a roster identity also keeps,
across runs, the set (as roster partitions) of its first run (:func:`_hold_across_runs`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, TypeVar

from flwr.app import ConfigRecord, RecordDict

from clients.handlers import handler
from clients.identity_node import signers_of
from clients.node import NodeContext
from fedrec.records import config_record
from fedrec.secure.merkle import verify_path
from fedrec.wire.message import Message, message, reply, wire_fields
from fedrec.wire.sums import (
    NODESET_PURPOSE,
    NODESET_SIGNED_KEY,
    Action,
    AggregationError,
    NodeSetRequest,
    NodeSetSignature,
    node_set_commitment,
    node_set_digest,
)

M = TypeVar("M", bound=Message)

#: Node state ConfigRecord: this run's committed set as ``digest`` (``node_set_commitment``)
#: and ``count``, its ``members`` when the node was given the whole set, the node's ``index``
#: in the sorted set, ``root`` when given by its Merkle root, and ``confirmed`` once the
#: set's signatures were checked.
STATE = "nodeset.committed"
#: The fields of the :data:`STATE` record (node-local names, read by
#: ``clients/secagg_node.py`` too).
DIGEST, COUNT, INDEX, MEMBERS, ROOT, CONFIRMED = (
    "digest", "count", "index", "members", "root", "confirmed")


# Typed so a corrupted or stale record is refused on reload naming the field, never used.
@message()
class NodeSetCommitted(Message):
    """This run's committed node set as this node keeps it (node-state record
    :data:`STATE`; ``NodeContext.load_state``), field names as the record always had them
    (:data:`DIGEST`, ...). Updated with ``dataclasses.replace`` and ``save_state``."""

    CONFIG = STATE
    ARRAYS = f"{STATE}.arrays"  # none: a node state names its own records

    digest: bytes = reply(name=DIGEST, doc="node_set_commitment of the set")
    count: int = reply(min=1, name=COUNT, doc="its size")
    index: int = reply(min=0, name=INDEX, doc="this node's place in the sorted set")
    confirmed: bool = reply(name=CONFIRMED, doc="every member's signature checked")
    members: list[int] | None = reply(None, name=MEMBERS, doc="every id, when given them")
    root: bytes | None = reply(None, name=ROOT, doc="its Merkle root, when given by it")


#: Bytes one member of a server-chosen node set takes in the node's copies of it (the ids,
#: the distinctness check's set, the sorted list, the state record), reserved before any.
MEMBER_BYTES = 64


def listed_nodes(node: NodeContext, listed: Sequence[Any], what: str,
                 error: type[Exception] = AggregationError, name: str = "the node set",
                 ) -> list[int]:
    """The server's list of nodes ``listed`` (``name`` in ``what``) as ids, once its length
    passed the roster's bound and its copies were reserved against the node's budget:
    before it is copied, checked for distinctness, stored or hashed (issue 43: a
    400,003-member key setup was all four). A refusal (``error``) says ``refuses what``."""
    node.identity.bound_nodes(len(listed), f"{node.who} refuses {what}", name, error)
    node.reserve(MEMBER_BYTES * len(listed), what)
    return [int(v) for v in listed]


def read_bounded(node: NodeContext, cls: type[M], what: str,
                 error: type[Exception] = AggregationError) -> M:
    """The request read as ``cls`` (``NodeContext.read``) once each of its lists -- nodes,
    or their paths, keys and signatures: none longer than the roster -- passed the roster's
    bound on its length alone, before the codec copies it (issue 43). A refusal
    (``error``) says ``refuses what``."""
    record = node.request.config_records.get(cls.CONFIG)
    for f in wire_fields(cls) if record is not None else ():
        listed = record.get(f.name)
        if f.is_list and isinstance(listed, list):
            node.identity.bound_nodes(len(listed), f"{node.who} refuses {what}",
                                      f"field '{cls.CONFIG}.{f.name}'", error)
    return node.read(cls)


def commit(node: NodeContext, listed: Sequence[Any], what: str) -> list[int]:
    """Commit this node to the node set ``listed`` (the server's list; sorted) for the rest
    of the run, or refuse ``what`` when it is longer than the roster or the node's budget
    allows, not distinct, lacks this node, is smaller than its ``min-survivors``, or differs
    from the set it committed to earlier in this run."""
    refuse = f"{node.who} refuses {what}"
    members = listed_nodes(node, listed, what)
    if len(set(members)) != len(members) or node.context.node_id not in members:
        raise AggregationError(f"{refuse}: the node set must list distinct node ids "
                               "including this node")
    members = sorted(members)
    _keep(node, node_set_digest(members), len(members), members.index(node.context.node_id),
          refuse, members)
    return members


def commit_root(node: NodeContext, root: bytes, count: int, index: int, path: bytes,
                what: str) -> int:
    """Commit this node to the node set given by its Merkle root, size ``count`` and this
    node's leaf ``index`` with its audit ``path`` (``fedrec/secure/merkle.py``), or refuse
    ``what`` on the same grounds as :func:`commit`; returns ``count``.

    Why: the whole set costs every node a request that grows with the federation. The root
    commits to the same set (its digest is the one a node given every id signs), the path
    proves this node is in it, and a size beyond the roster's bound is refused before
    anything is kept. Which nodes are in it the node checks where it matters to it: its
    neighbours' places, in the share round (``clients/secagg_node.py``)."""
    refuse = f"{node.who} refuses {what}"
    node.identity.bound_nodes(count, refuse, "the node set", AggregationError)
    if not verify_path(root, count, index, node.context.node_id, path):
        raise AggregationError(f"{refuse}: the node set's Merkle path does not place this "
                               f"node at index {index} of the {count} committed")
    _keep(node, node_set_commitment(root, count), count, index, refuse)
    node.save_state(dataclasses.replace(committed_state(node, what), root=bytes(root)))
    return count


def _keep(node: NodeContext, digest: bytes, count: int, index: int, refuse: str,
          members: list[int] | None = None) -> None:
    """Record the committed set (once per run; the same set again is a no-op, another one
    is refused), after the node policy's ``min-survivors``."""
    if count < node.policy.min_survivors:
        raise AggregationError(f"{refuse}: {count} node(s) in the run's set, its "
                               f"node policy's min-survivors is {node.policy.min_survivors}")
    st = node.load_state(NodeSetCommitted)
    if st is None:
        node.save_state(NodeSetCommitted(digest=digest, count=int(count), index=int(index),
                                         confirmed=False, members=members or None))
    elif st.digest != digest:
        raise AggregationError(f"{refuse}: the node set differs from the one it committed to "
                               "earlier in this run (sums over different sets could be "
                               "differenced)")
    elif members and st.members is None:  # the whole set of the root it holds
        node.save_state(dataclasses.replace(st, members=members))


def committed_state(node: NodeContext, what: str) -> NodeSetCommitted:
    """This run's committed set (:class:`NodeSetCommitted`, every field checked), or a
    refusal of ``what``."""
    st = node.load_state(NodeSetCommitted)
    if st is None:
        raise AggregationError(f"{node.who} refuses {what}: it committed to no node set in "
                               "this run (the server must run the node-set key setup first)")
    return st


def committed(node: NodeContext, what: str) -> ConfigRecord:
    """This run's committed set record (:data:`STATE`) as stored, for readers by field name
    (``clients/secagg_node.py``), once :func:`committed_state` checked every field; or a
    refusal of ``what``. Read only: a change goes through :class:`NodeSetCommitted`."""
    committed_state(node, what)
    return node.state[STATE]


def confirm_by_neighbours(node: NodeContext) -> None:
    """Mark a set held by its root alone (no ``members``) confirmed by the node's SecAgg+
    neighbours: each signed a mask key bound to this set, and the share round checked every
    one (``clients/secagg_node.py``). A node given the whole set checks every member's
    signature instead (:func:`signed_set_digest`)."""
    st = committed_state(node, "the share round")
    if st.members is not None:
        raise AggregationError(f"{node.who}: it holds the whole node set, whose every "
                               "member's signature it checks itself")
    node.save_state(dataclasses.replace(st, confirmed=True))


def needs_whole_set(node: NodeContext) -> bool:
    """Whether this node checks every member's signature on its set, not only its
    neighbours': a roster identity does, since it holds its set across runs by the members'
    partitions (:func:`_hold_across_runs`), which it learns only from every member's signed
    key. A simulated identity holds nothing across runs and its signatures authenticate
    nothing (anyone can make them), so its neighbours' checks are all it can use, and its
    requests stay polylogarithmic in the federation's size."""
    return not node.identity.simulated


@handler(Action.NODESET)
def nodeset_commit(content: RecordDict, node: NodeContext) -> RecordDict:
    """Key setup: commit to the run's node set and sign it (once per run: the same set
    again gets the same answer, another set is refused)."""
    req = read_bounded(node, NodeSetRequest, "the node set")
    members = commit(node, req.members, "the node set")
    return NodeSetSignature(signed=sign(node, members)).to_records()


def sign(node: NodeContext, members: list[int] | None = None) -> bytes:
    """This node's signature on the node set it committed to (:func:`commit`, or
    :func:`commit_root` when ``members`` is None: the same digest either way)."""
    digest = node_set_digest(members) if members is not None else \
        committed_state(node, "to sign its node set").digest
    return node.identity.sign(NODESET_PURPOSE, node.context.run_id, node.context.node_id,
                              digest)


def signed_set_digest(node: NodeContext, request: RecordDict, what: str) -> bytes:
    """The digest of this node's committed set, once the request carried every member's
    signature on exactly that set (checked against the roster, one partition per member;
    remembered for the rest of the run). A node that committed to no set, or whose set some
    member did not sign, refuses ``what``."""
    refuse = f"{node.who} refuses {what}"
    st = committed_state(node, what)
    digest = st.digest
    if st.confirmed:
        return digest
    if st.members is None:
        raise AggregationError(f"{refuse}: it holds its node set by its Merkle root only, "
                               "and its members' signatures are checked by its SecAgg+ "
                               "neighbours in the share round, which has not run")
    members = st.members
    signatures = config_record(request, NODESET_SIGNED_KEY) or ConfigRecord()
    # on its length, before any signature is verified (or kept as verified)
    node.identity.bound_nodes(len(signatures), refuse, f"field '{NODESET_SIGNED_KEY}'",
                              AggregationError)
    signed = []
    for v in members:
        blob = signatures.get(str(v))
        if not isinstance(blob, bytes):
            raise AggregationError(f"{refuse}: the request lacks node {v}'s signature on the "
                                   "node set this node committed to")
        signed.append((v, blob))
    partitions = signers_of(
        signed, digest, lambda v, blob: node.identity.check_once(
            node.state, NODESET_PURPOSE, node.context.run_id, v, blob),
        refuse, "the node set this node committed to", AggregationError)
    _hold_across_runs(node, sorted(partitions), refuse)
    node.save_state(dataclasses.replace(st, confirmed=True))
    return digest


def _hold_across_runs(node: NodeContext, partitions: list[int], refuse: str) -> None:
    """Refuse a run whose node set (as roster partitions) is not the one this identity
    committed to in its first run under this roster, kept in its privacy state file (the DP
    ledger's, ``clients/dp_ledger.py``); a subset only with its ``allow-dropouts``.

    Why: Flower's node state starts empty in every run, so a set committed per run would
    let a server run the same request over the whole set and, in a new run, over the set
    without one node: the difference is that node's input. Simulated identities are public
    keys anyone can sign with (a server can forge every signature here), so the check is
    kept for roster identities, whose runs it binds."""
    from clients.dp_ledger import Ledger, NodeSetDiffers, ledger_path

    if node.identity.simulated:
        return
    key = (f"{node.identity.signer.public_bytes().hex()}:"
           f"{node.identity.roster.fingerprint.hex()}")
    try:
        Ledger(ledger_path(node.policy.dp_ledger)).commit_node_set(
            key, partitions, shrink=node.policy.allow_dropouts)
    except NodeSetDiffers:
        raise AggregationError(
            f"{refuse}: the run's node set (partitions {partitions}) is not the one it "
            "committed to in an earlier run under this roster (sums of one request over the "
            "two sets could be differenced; a subset needs its allow-dropouts). Only its "
            "operator can start afresh, with a new roster or privacy state file") from None


def committed_members(node: NodeContext) -> list[int]:
    """The run's committed node set, as ids (:func:`commit` must have run with the whole
    set: a set held by its root alone has none to give)."""
    st = node.load_state(NodeSetCommitted)
    if st is None:
        raise AggregationError(f"{node.who}: it committed to no node set in this run")
    if st.members is None:
        raise AggregationError(f"{node.who}: it holds the run's node set by its Merkle root "
                               "only (a cross-device SecAgg+ key setup); this step needs "
                               "every member's id")
    return list(st.members)
