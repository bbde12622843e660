"""What both sides of the shared-secret relay agree on: the kinds of secret, the request's
record key and the sealed-mail purpose a secret travels under.

The relay's rounds are in ``fedrec/transport/relay_server.py`` (server) and
``clients/relay_node.py`` (node)."""

from __future__ import annotations

from fedrec.secure.sealed import RelayError

__all__ = ["MAKES", "RELAY_KEY", "RelayError", "secret_mail_purpose"]

#: Kinds of secret the owner can create.
MAKES = ("random-key", "ckks-context")
#: ConfigRecord key of relay parameters inside relay messages.
RELAY_KEY = "relay"


def secret_mail_purpose(purpose: str) -> str:
    """The sealed-relay purpose under which the secret of ``purpose`` travels."""
    return f"secret:{purpose}"
