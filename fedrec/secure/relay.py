"""What both sides of the shared-secret relay agree on: the kinds of secret and the
sealed-mail purpose a secret travels under (its records: ``fedrec/wire/keyrelay.py``).

The relay's rounds are in ``fedrec/transport/relay_server.py`` (server) and
``clients/relay_node.py`` (node)."""

from __future__ import annotations

from fedrec.secure.sealed import RelayError
from fedrec.wire.keyrelay import RELAY_KEY

__all__ = ["MAKES", "RELAY_KEY", "RelayError", "secret_mail_purpose"]

#: Kinds of secret the owner can create.
MAKES = ("random-key", "ckks-context")


def secret_mail_purpose(purpose: str) -> str:
    """The sealed-relay purpose under which the secret of ``purpose`` travels."""
    return f"secret:{purpose}"
