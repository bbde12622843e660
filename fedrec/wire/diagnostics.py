"""The diagnostic actions' wire, declared once for the node (``clients/diagnostics.py``, whose
handlers a ClientApp adds only on an explicit opt-in) and whoever sends them (tests,
``benchmarks/secure.py``); no protocol strategy sends them.

``diag_secure_sum`` is a sum contribution of seeded, public values (request record
:data:`DIAG`: the seed and the arrays' shapes; the reply adds :data:`WHO`, the node's
partition), so a sum's result can be checked exactly. ``keys_prove`` and
``keys_ckks_selftest`` check the shared-secret relay (request record ``RELAY_KEY`` of
``fedrec/wire/keyrelay.py``): an HMAC of a challenge under the shared secret
(:data:`PROOF`), and a CKKS round trip with the relayed context (:data:`CKKS`). They are
oracles by design, hence never in a production app.
"""

from __future__ import annotations

from enum import StrEnum


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
