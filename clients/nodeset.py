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

from collections.abc import Sequence
from typing import Any

from flwr.app import ConfigRecord, RecordDict

from clients.handlers import handler
from clients.identity_node import signers_of
from clients.node import NodeContext
from fedrec.records import config_record
from fedrec.wire.sums import (
    NODESET_KEY,
    NODESET_PURPOSE,
    NODESET_SIGNED_KEY,
    Action,
    AggregationError,
    node_set_digest,
)

#: Node state ConfigRecord: this run's committed ``members`` and, once every member's
#: signature on them checked, ``confirmed``.
STATE = "nodeset.committed"
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
    if len(members) < node.policy.min_survivors:
        raise AggregationError(f"{refuse}: {len(members)} node(s) in the run's set, its "
                               f"node policy's min-survivors is {node.policy.min_survivors}")
    members = sorted(members)
    record = config_record(node.state, STATE)
    if record is None:
        node.state[STATE] = ConfigRecord({"members": members, "confirmed": False})
    elif [int(v) for v in record["members"]] != members:
        raise AggregationError(f"{refuse}: the node set differs from the one it committed to "
                               "earlier in this run (sums over different sets could be "
                               "differenced)")
    return members


@handler(Action.NODESET)
def nodeset_commit(content: RecordDict, node: NodeContext) -> RecordDict:
    """Key setup: commit to the run's node set and sign it (once per run: the same set
    again gets the same answer, another set is refused)."""
    cfg = config_record(content, NODESET_KEY)
    if cfg is None or "members" not in cfg:
        raise AggregationError(f"{node.who}: node-set request lacks field "
                               f"'{NODESET_KEY}.members'")
    members = commit(node, cfg["members"], "the node set")
    return RecordDict({NODESET_KEY: ConfigRecord({"signed": sign(node, members)})})


def sign(node: NodeContext, members: list[int]) -> bytes:
    """This node's signature on the node set ``members`` it committed to (:func:`commit`)."""
    return node.identity.sign(NODESET_PURPOSE, node.context.run_id, node.context.node_id,
                              node_set_digest(members))


def signed_set_digest(node: NodeContext, request: RecordDict, what: str) -> bytes:
    """The digest of this node's committed set, once the request carried every member's
    signature on exactly that set (checked against the roster, one partition per member;
    remembered for the rest of the run). A node that committed to no set, or whose set some
    member did not sign, refuses ``what``."""
    refuse = f"{node.who} refuses {what}"
    record = config_record(node.state, STATE)
    if record is None:
        raise AggregationError(f"{refuse}: it committed to no node set in this run (the "
                               "server must run the node-set key setup first)")
    members = [int(v) for v in record["members"]]
    digest = node_set_digest(members)
    if bool(record["confirmed"]):
        return digest
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
    record["confirmed"] = True
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
    """The run's committed node set (:func:`commit` must have run)."""
    record = config_record(node.state, STATE)
    if record is None:
        raise AggregationError(f"{node.who}: it committed to no node set in this run")
    return [int(v) for v in record["members"]]
