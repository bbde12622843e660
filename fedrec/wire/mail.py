"""The sealed relay's wire, declared once for the server (``fedrec/transport/mailroom.py``,
``fedrec/transport/secagg_server.py``) and the node (``clients/sealed_node.py``,
``clients/common.py``, ``clients/secagg_node.py``); the sealing itself is
``fedrec/secure/sealed.py``.

Once per run each node publishes its mail key, signed with its identity (``relay_keys``, or
:data:`MAIL_KEYGEN` in a protocol's first request; reply record :data:`MAIL_KEY_REPLY`). A
node puts sealed payloads in its reply (:data:`MAIL_OUT`); the server queues them and attaches
them to the recipient's next request (:data:`MAIL_IN`), with the signed key directory
(:data:`MAIL_DIRECTORY`) and the round the recipient seals in (:data:`MAIL_ROUND`).
"""

from __future__ import annotations

from enum import StrEnum


class Action(StrEnum):
    """The relay's own node action (``message_type = "query.<action>"``)."""

    RELAY_KEYS = "relay_keys"  # make this run's mail key pair, publish the signed public key


MAIL_OUT = "relay.out"  # ConfigRecord in replies: "<recipient>|<purpose>" -> sealed blob
MAIL_IN = "relay.in"  # ConfigRecord in requests: "<sender>|<round>|<purpose>" -> sealed blob
MAIL_DIRECTORY = "relay.directory"  # ConfigRecord in requests: "<node>" -> signed mail key
MAIL_ROUND = "relay.round"  # ConfigRecord in requests: the round this node seals mail in
#: ConfigRecord in a protocol's request: "also make and publish your mail key" (so a
#: protocol's first round can open the relay, without a ``relay_keys`` round of its own).
MAIL_KEYGEN = "relay.keygen"
MAIL_KEY_REPLY = "relay-key"  # ConfigRecord in replies: {"pk": the node's signed mail key}
