"""The handshake's wire, declared once for the server (``strategies/base.py``) and the node
(``clients/common.py``, ``clients/node.py``).

The server sends ``hello`` with the run's data description (record :data:`DATA`: dataset,
sizes, seed, partition scheme; never rows) so each node loads its own rows. The node answers
with its public facts (:class:`HelloInfo`, record :data:`INFO`) and the privacy policy it
runs under (record :data:`POLICY`), which the server checks against what the run asks and
records in the results.

:data:`DATA` and :data:`POLICY` are descriptions, not messages: their keys are those of
``datasets.describe`` and ``clients.policy.NodePolicy.as_config``, an open set each side
compares key by key (``datasets.differing_keys``, ``strategies/policy_needs.py``), so
declaring them again here would be a second spelling that could drift.
"""

from __future__ import annotations

from enum import StrEnum

from fedrec.wire.message import Message, message, reply


class Action(StrEnum):
    """The handshake's node action (``message_type = "query.<action>"``)."""

    HELLO = "hello"


#: ConfigRecord in the request: the dataset and partition description a node loads rows by.
DATA = "data"
#: ConfigRecord in the reply: the node's public facts (:class:`Info`).
INFO = "info"
#: ConfigRecord in the reply: the node's privacy policy, acknowledged for the results.
POLICY = "policy"


class Info(StrEnum):
    """Wire names of the :data:`INFO` record's fields (:class:`HelloInfo`)."""

    ROLE = "role"  # user, silo or item-server
    PARTITION = "partition-id"  # -1 for an item server without one
    HOLDS = "holds"  # what the node holds: rows, user-features, ...
    N_ITEMS = "n-items"  # catalogue size (public in every protocol here)
    N_USERS = "n-users"
    N_TRAIN_USERS = "n-train-users"  # users with training interactions
    #: the smallest power of two at least its training interactions: the count its memory
    #: estimates use, so a budget refusal depends on published numbers only
    INTERACTIONS_BOUND = "interactions-bound"
    IDENTITY = "identity"  # where its signing keys come from: simulated or roster


@message()
class HelloInfo(Message):
    """A node's public facts, its reply to ``hello``. ``role`` and ``holds`` default to a
    user node holding rows, ``identity`` to unreported (what a reply without them meant)."""

    CONFIG = INFO

    role: str = reply("user", name=Info.ROLE)
    partition_id: int = reply(name=Info.PARTITION)
    holds: list[str] = reply(("rows",), name=Info.HOLDS)
    n_items: int = reply(name=Info.N_ITEMS)
    n_users: int = reply(name=Info.N_USERS)
    n_train_users: int = reply(name=Info.N_TRAIN_USERS)
    interactions_bound: int = reply(name=Info.INTERACTIONS_BOUND)
    identity: str | None = reply(None, name=Info.IDENTITY)
