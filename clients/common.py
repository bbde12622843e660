"""Handlers every protocol uses: the opening handshake and the sealed relay's key round."""

from __future__ import annotations

from flwr.app import ConfigRecord, RecordDict

from clients.handlers import handler
from clients.node import NodeContext
from clients.sealed_node import new_mail_key
from fedrec.wire import handshake as handshake_wire
from fedrec.wire.handshake import Info
from fedrec.wire.mail import MAIL_KEY_REPLY
from fedrec.wire.mail import Action as MailAction

#: Node state record: this run's hello was answered (:func:`hello`).
_HELLO_ANSWERED = "handshake.answered"


@handler(handshake_wire.Action.HELLO)
def hello(content: RecordDict, node: NodeContext) -> RecordDict:
    """Load this node's data and report public facts: role, partition, what it holds, sizes,
    and the node's privacy policy (what it will accept; recorded in the results).

    The catalogue size (number of items) is public in every protocol here; the number of
    users a node holds is what any Flower deployment reveals anyway (who takes part). An
    item server reports partition -1 unless its node config gives one.

    Answered once per run (Flower's node state is per run), refused after that: the
    description it reports is the operator's and so the same every time, and a second
    answer would only be a second chance to read a count.
    """
    if node.state.get(_HELLO_ANSWERED) is not None:
        raise RuntimeError(f"{node.who} refuses a second hello in run {node.context.run_id}: "
                           "it answers the handshake once per run")
    node.state[_HELLO_ANSWERED] = ConfigRecord({"run": int(node.context.run_id)})
    role = node.role
    pid = node.partition_id if role != "item-server" or "partition-id" in \
        node.context.node_config else -1
    data = node.data()
    return RecordDict({handshake_wire.INFO: ConfigRecord({
        Info.ROLE: role,
        Info.PARTITION: pid,
        Info.HOLDS: list(data.holds),
        Info.N_ITEMS: int(data.n_items),
        Info.N_USERS: int(len(data.user_ids)),
        Info.N_TRAIN_USERS: int((data.train.getnnz(axis=1) > 0).sum()),
        Info.INTERACTIONS_BOUND: node.interactions_bound(),
        # where the keys this node signs with come from (simulated ones authenticate nothing)
        Info.IDENTITY: "simulated" if node.identity.simulated else "roster",
    }), handshake_wire.POLICY: ConfigRecord(node.policy.as_config())})


@handler(MailAction.RELAY_KEYS)
def relay_keys(content: RecordDict, node: NodeContext) -> RecordDict:
    """Make this run's mail key pair (kept in state) and publish the public key, signed with
    this node's identity (``clients/identity_node.py``) so the server cannot substitute it."""
    signed = new_mail_key(node.state, node.identity, node.context.run_id, node.context.node_id)
    return RecordDict({MAIL_KEY_REPLY: ConfigRecord({"pk": signed})})
