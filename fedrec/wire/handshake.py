"""The handshake's wire, declared once for the server (``strategies/base.py``) and the node
(``clients/common.py``, ``clients/node.py``).

The server sends ``hello`` with the run's data description (record :data:`DATA`: dataset,
sizes, seed, partition scheme; never rows) so each node loads its own rows. The node answers
with its public facts (record :data:`INFO`, fields :class:`Info`) and the privacy policy it
runs under (record :data:`POLICY`), which the server checks against what the run asks and
records in the results.
"""

from __future__ import annotations

from enum import StrEnum


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
    """Fields of the :data:`INFO` record."""

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
