"""Handlers every protocol uses: the opening handshake and the sealed relay's key round."""

from __future__ import annotations

from flwr.app import ConfigRecord, RecordDict

from clients.handlers import handler
from clients.node import NodeContext
from clients.policy import POLICY_RECORD
from clients.sealed_node import new_mail_key
from fedrec.secure.sealed import MAIL_KEY_REPLY


@handler("hello")
def hello(content: RecordDict, node: NodeContext) -> RecordDict:
    """Load this node's data and report public facts: role, partition, what it holds, sizes,
    and the node's privacy policy (what it will accept; recorded in the results).

    The catalogue size (number of items) is public in every protocol here; the number of
    users a node holds is what any Flower deployment reveals anyway (who takes part). An
    item server reports partition -1 unless its node config gives one.
    """
    role = node.role
    pid = node.partition_id if role != "item-server" or "partition-id" in \
        node.context.node_config else -1
    data = node.data()
    return RecordDict({"info": ConfigRecord({
        "role": role,
        "partition-id": pid,
        "holds": list(data.holds),
        "n-items": int(data.n_items),
        "n-users": int(len(data.user_ids)),
        "n-train-users": int((data.train.getnnz(axis=1) > 0).sum()),
        # where the keys this node signs with come from (simulated ones authenticate nothing)
        "identity": "simulated" if node.identity.simulated else "roster",
    }), POLICY_RECORD: ConfigRecord(node.policy.as_config())})


@handler("relay_keys")
def relay_keys(content: RecordDict, node: NodeContext) -> RecordDict:
    """Make this run's mail key pair (kept in state) and publish the public key, signed with
    this node's identity (``clients/identity_node.py``) so the server cannot substitute it."""
    signed = new_mail_key(node.state, node.identity, node.context.run_id, node.context.node_id)
    return RecordDict({MAIL_KEY_REPLY: ConfigRecord({"pk": signed})})
