"""The sealed relay: node-to-node payloads through the server, which sees only who sends how
many bytes to whom.

Why one mechanism: LP-GCN routes embeddings between nodes, the key relay hands a secret from
its creator to every node, and SecAgg+ hands Shamir shares to neighbours. All three need the
same guarantee: the server carries the payload but cannot read, alter, redirect or replay it.

How: once per run every node makes an X25519 key pair for mail and publishes the public key
signed with its long-term identity (``relay_keys``, one round; ``identity.py``); the server
hands each node the directory of signed keys with its next request, and each node checks
every signature against its roster, so the server cannot put a key of its own in the
middle. A payload from a to b is sealed with AES-256-GCM under
``HKDF(X25519(a, b), "fedrec-mail|<run>")`` with associated data binding sender, recipient,
run, relay round and purpose. A sender puts mail in its reply (``relay.out``); the server
queues it and attaches it to the recipient's next request (``relay.in``) with the round it
was sealed in. A tampered, misrouted or replayed payload fails at the recipient with an error
naming the sender. Node side: ``clients/sealed_node.py``; server side (the directory and the
queues): ``fedrec/transport/mailroom.py``; the records both sides name:
``fedrec/wire/mail.py``. This module holds the sealing both sides agree on.
"""

from __future__ import annotations

from fedrec.wire.mail import (  # noqa: F401  (the relay's records, re-exported)
    MAIL_DIRECTORY,
    MAIL_IN,
    MAIL_KEY_REPLY,
    MAIL_KEYGEN,
    MAIL_OUT,
    MAIL_ROUND,
)

#: Purpose under which nodes sign their mail keys (``fedrec/secure/identity.py``).
MAIL_PURPOSE = "mail"

_KEY_CONTEXT = b"fedrec-mail|"


class RelayError(RuntimeError):
    """A relayed payload cannot be delivered or opened; the message names the sender."""


def mail_context(run_id: int) -> bytes:
    """HKDF context of the pairwise mail key: the run, so keys never serve two runs."""
    return _KEY_CONTEXT + str(int(run_id)).encode()


def mail_aad(run_id: int, sender: int, recipient: int, round_: int, purpose: str) -> bytes:
    """Associated data of one payload: what it is bound to besides the key."""
    return f"fedrec-mail|run={int(run_id)}|from={int(sender)}|to={int(recipient)}|" \
           f"round={int(round_)}|purpose={purpose}".encode()


def out_key(recipient: int, purpose: str) -> str:
    return f"{int(recipient)}|{purpose}"


def in_key(sender: int, round_: int, purpose: str) -> str:
    return f"{int(sender)}|{int(round_)}|{purpose}"


def parse_in_key(key: str) -> tuple[int, int, str]:
    sender, round_, purpose = key.split("|", 2)
    return int(sender), int(round_), purpose
