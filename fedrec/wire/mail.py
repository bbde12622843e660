"""The sealed relay's wire, declared once for the server (``fedrec/transport/mailroom.py``,
``fedrec/transport/secagg_server.py``) and the node (``clients/sealed_node.py``,
``clients/common.py``, ``clients/secagg_node.py``); the sealing itself is
``fedrec/secure/sealed.py``.

Once per run each node publishes its mail key, signed with its identity (``relay_keys``, or
:class:`MailKeygen` in a protocol's first request; reply :class:`MailKey`). A node puts
sealed payloads in its reply (:data:`MAIL_OUT`); the server queues them and attaches them to
the recipient's next request (:data:`MAIL_IN`), with the signed key directory
(:data:`MAIL_DIRECTORY`) and the round the recipient seals in (:class:`MailRound`).

:data:`MAIL_OUT`, :data:`MAIL_IN` and :data:`MAIL_DIRECTORY` are maps, not messages: their
keys name a recipient, a sender or a node (``fedrec.secure.sealed.in_key`` / ``out_key``),
so they have no fixed fields to declare.
"""

from __future__ import annotations

from enum import StrEnum

from fedrec.wire.message import Message, message, per_round, reply


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


@message()
class MailRound(Message):
    """Beside any request through a mailroom: the round this node's mail is sealed in
    (bound into every payload's associated data)."""

    CONFIG = MAIL_ROUND

    round: int = per_round()


@message()
class MailKeygen(Message):
    """Beside a protocol's request: make and publish this run's mail key with the reply
    (its presence is the ask)."""

    CONFIG = MAIL_KEYGEN

    make: bool = per_round(True)


@message()
class MailKey(Message):
    """A node's mail public key, signed with its identity (``relay_keys`` reply, or beside
    the reply to a request that carried :class:`MailKeygen`)."""

    CONFIG = MAIL_KEY_REPLY

    pk: bytes = reply()
