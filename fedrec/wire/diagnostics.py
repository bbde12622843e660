"""The diagnostic actions' wire, declared once for the node (``clients/diagnostics.py``, whose
handlers a ClientApp adds only on an explicit opt-in) and whoever sends them (tests,
``benchmarks/secure.py``); no protocol strategy sends them.

``diag_secure_sum`` is a sum contribution of seeded, public values (request
:class:`SecureSumRequest` in record :data:`DIAG`: the seed and the arrays' shapes; the reply
adds :class:`Who`, the node's partition), so a sum's result can be checked exactly.
``keys_prove`` and ``keys_ckks_selftest`` check the shared-secret relay (record ``RELAY_KEY``
of ``fedrec/wire/keyrelay.py``): an HMAC of a challenge under the shared secret
(:class:`Proof`), and a CKKS round trip with the relayed context (:class:`CkksResult`). They
are oracles by design, hence never in a production app.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Any

from fedrec.wire.handshake import Info
from fedrec.wire.keyrelay import RelayRequest
from fedrec.wire.message import Message, field_names, message, per_round, reply


class Action(StrEnum):
    """The diagnostic node actions (``message_type = "query.<action>"``)."""

    SECURE_SUM = "diag_secure_sum"  # a sum contribution of known values
    PROVE = "keys_prove"  # HMAC-SHA256(shared secret, challenge)
    CKKS_SELFTEST = "keys_ckks_selftest"  # encrypt or decrypt with the relayed CKKS context


#: ConfigRecord of a ``diag_secure_sum`` request: ``seed`` and ``<array>`` -> shape.
DIAG = "diag"
#: ConfigRecord in a ``diag_secure_sum`` reply: the node's ``partition-id``.
WHO = "who"
#: ConfigRecord in a ``keys_prove`` reply: ``mac``.
PROOF = "relay-proof"
#: ConfigRecord in a ``keys_ckks_selftest`` reply: ``chunks`` (encrypt) or ``values``.
CKKS = "ckks"


@message(Action.SECURE_SUM)
class SecureSumRequest(Message):
    """A sum of known vectors. Beside ``seed`` the record names one array per entry
    (name -> shape): an open set, so they are entries of the record, not fields
    (:func:`secure_sum_shapes`)."""

    CONFIG = DIAG

    seed: int = per_round(doc="seeds the vectors (array i draws with seed + i)")


def secure_sum_shapes(config: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    """The array shapes a ``diag_secure_sum`` record names: every entry but the fields."""
    fields = set(field_names(SecureSumRequest))
    return {name: tuple(int(x) for x in dims) for name, dims in config.items()
            if name not in fields}


@message()
class Who(Message):
    """Beside a ``diag_secure_sum`` contribution, in clear: the node's partition."""

    CONFIG = WHO

    partition_id: int = reply(name=Info.PARTITION)


@message(Action.PROVE)
class ProveRequest(RelayRequest):
    """MAC ``challenge`` under the secret relayed for ``purpose``."""

    challenge: bytes = per_round()


@message()
class Proof(Message):
    """HMAC-SHA256(shared secret, challenge)."""

    CONFIG = PROOF

    mac: bytes = reply()


@message(Action.CKKS_SELFTEST)
class CkksSelftest(RelayRequest):
    """Encrypt ``values`` or decrypt ``chunks`` (``n`` values) with the relayed context."""

    mode: str = per_round(choices=("encrypt", "decrypt"))
    values: list[float] | None = per_round(None, doc="encrypt: the values")
    chunks: list[bytes] | None = per_round(None, doc="decrypt: the packed ciphertexts")
    n: int | None = per_round(None, doc="decrypt: how many values the chunks pack")


@message()
class CkksResult(Message):
    """The ciphertexts (encrypt) or the decrypted values (decrypt)."""

    CONFIG = CKKS

    chunks: list[bytes] | None = reply(None)
    values: list[float] | None = reply(None)
