"""Handlers every protocol uses: the opening handshake and the sealed relay's key round."""

from __future__ import annotations

from flwr.app import ConfigRecord, RecordDict

from clients.handlers import handler
from clients.node import NodeContext
from clients.sealed_node import new_mail_key
from fedrec.wire import handshake as handshake_wire
from fedrec.wire.handshake import HelloInfo
from fedrec.wire.mail import Action as MailAction
from fedrec.wire.mail import MailKey
from fedrec.wire.message import Message, message, reply


# Typed so a corrupted or stale record is refused on reload naming the field, never used.
@message()
class HelloAnswered(Message):
    """This run's hello was answered (:func:`hello`; node-state record
    ``handshake.answered``, its field as it always was)."""

    CONFIG = "handshake.answered"
    ARRAYS = "handshake.answered.arrays"  # none: a node state names its own records

    run: int = reply(min=0, doc="the run it was answered in")


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
    if node.load_state(HelloAnswered) is not None:
        raise RuntimeError(f"{node.who} refuses a second hello in run {node.context.run_id}: "
                           "it answers the handshake once per run")
    node.save_state(HelloAnswered(run=int(node.context.run_id)))
    role = node.role
    partition = _reported_partition(node, role)
    data = node.data()
    info = HelloInfo(
        role=role,
        partition_id=partition,
        holds=list(data.holds),
        n_items=int(data.n_items),
        n_users=int(len(data.user_ids)),
        n_train_users=int((data.train.getnnz(axis=1) > 0).sum()),
        interactions_bound=node.interactions_bound(),
        # where the keys this node signs with come from (simulated ones authenticate nothing)
        identity="simulated" if node.identity.simulated else "roster",
    )
    reply = info.to_records()
    reply[handshake_wire.POLICY] = ConfigRecord(node.policy.as_config())
    return reply


def _reported_partition(node: NodeContext, role: str) -> int:
    """The partition a node reports: its own; an item server's only if its node config
    gives one (-1 otherwise)."""
    try:
        return node.partition_id
    except KeyError:  # no partition-id in its node config: an item server's is optional
        if role != "item-server":
            raise
        return -1


@handler(MailAction.RELAY_KEYS)
def relay_keys(content: RecordDict, node: NodeContext) -> RecordDict:
    """Make this run's mail key pair (kept in state) and publish the public key, signed with
    this node's identity (``clients/identity_node.py``) so the server cannot substitute it."""
    signed = new_mail_key(node.state, node.identity, node.context.run_id, node.context.node_id)
    return MailKey(pk=signed).to_records()
