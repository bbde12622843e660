"""The node set a run's sums are over: one per run and node, signed by every member.

Why: two sums of the same request over node sets that differ by one node give that node's
input as their difference. A node that keeps its own "first set" does not stop this when
the server shows each node another set: node A a sum with every contribution, node B one
without A. So a node commits, at key setup, to one set per run (``nodeset_commit``, or the
SecAgg+ key setup, whichever comes first: both sum kinds of a run share it) and signs it;
before it contributes to or decrypts a CKKS sum it checks that every member of that set
signed the same set (:func:`signed_set_digest`). Each node signs one set per run, so once
a node holds every member's signature on its set, no member can have been shown another
one: no two nodes' sums are over different sets. A node with a roster identity also keeps,
across runs, the set (as roster partitions) of its first run (:func:`_hold_across_runs`).
"""

from __future__ import annotations

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


def commit(node: NodeContext, members: list[int], what: str) -> list[int]:
    """Commit this node to ``members`` (sorted) for the rest of the run, or refuse ``what``
    when they are not distinct, lack this node, are fewer than its ``min-survivors``, or
    differ from the set it committed to earlier in this run."""
    refuse = f"{node.who} refuses {what}"
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
    # The list's length is the server's choice: its copies are reserved before they exist.
    node.reserve(64.0 * len(cfg["members"]), "the node set")
    members = commit(node, [int(v) for v in cfg["members"]], "the node set")
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
