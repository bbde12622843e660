"""The shared-secret relay's wire, declared once for the server
(``fedrec/transport/relay_server.py``) and the node (``clients/relay_node.py``); the kinds of
secret and the sealed-mail purpose are ``fedrec/secure/relay.py``.

The server asks one node, the owner, to create a secret (``keys_create_secret``) and mail a
sealed copy to every peer; the owner answers with the secret's fingerprint (and a CKKS
context's public part) in :data:`CREATED`. Every peer then opens its copy
(``keys_receive_secret``) and answers with the fingerprint only (:data:`ACK`), so the server
checks that all hold one secret without seeing it. Both requests carry their parameters
(purpose, kind, peers or owner) in :data:`RELAY_KEY`.
"""

from __future__ import annotations

from enum import StrEnum


class Action(StrEnum):
    """The relay's node actions (``message_type = "query.<action>"``)."""

    CREATE = "keys_create_secret"  # the owner: create, keep, mail sealed copies to the peers
    RECEIVE = "keys_receive_secret"  # each peer: open the owner's copy, keep it, acknowledge


#: ConfigRecord of both requests: ``purpose``, ``make``, and ``peers`` or ``owner``.
RELAY_KEY = "relay"
#: ConfigRecord in the owner's reply: ``fingerprint`` (and ``public-context`` of a CKKS one).
CREATED = "relay-created"
#: ConfigRecord in a peer's reply: ``fingerprint`` of the secret it opened.
ACK = "relay-ack"
