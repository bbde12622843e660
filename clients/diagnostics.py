"""Diagnostic actions: check a federation's plumbing. Not part of a production ClientApp.

Why apart: ``keys_prove`` MACs a server-chosen challenge under a shared secret and
``keys_ckks_selftest`` decrypts whatever the server sends with the shared CKKS secret key;
``diag_secure_sum`` answers sums with known inputs. Each is an oracle or a test fixture for
the server, so they register in ``clients.handlers.DIAGNOSTIC_HANDLERS`` and
``fl_app.client_app.build_client_app`` adds them only when asked: tests pass
``extra_modules=["clients.diagnostics"]``; an operator checking a new deployment sets
``FEDREC_NODE_POLICY="diagnostics=true"`` in the node's environment (and removes it after).

- ``diag_secure_sum`` answers a sum request with vectors that depend only on
  (seed, partition id, shape), so the server can compare the sum with the plain sum of
  :func:`diagnostic_vector`.
- ``keys_prove`` answers HMAC-SHA256(secret, challenge): equal across nodes iff they hold the
  same relayed secret.
- ``keys_ckks_selftest`` encrypts ``values`` (mode ``encrypt``) or decrypts ``chunks`` (mode
  ``decrypt``) with the relayed CKKS context.
"""

from __future__ import annotations

import hashlib
import hmac

import numpy as np
from flwr.app import ConfigRecord, RecordDict

from clients.handlers import diagnostic
from clients.node import NodeContext
from clients.relay_node import get_shared_context, get_shared_secret
from clients.sums_node import sum_reply
from fedrec.secure.relay import RelayError
from fedrec.wire import diagnostics as diag_wire
from fedrec.wire.diagnostics import Action
from fedrec.wire.keyrelay import RELAY_KEY


def diagnostic_vector(seed: int, partition_id: int, shape: tuple[int, ...]) -> np.ndarray:
    """The known input of a partition: standard normal draws, seeded (public by design)."""
    return np.random.default_rng([seed, 99, partition_id]).standard_normal(shape)


@diagnostic(Action.SECURE_SUM, sums=True)
def diag_secure_sum(content: RecordDict, node: NodeContext) -> RecordDict:
    """A sum contribution with known values (see :func:`diagnostic_vector`)."""
    cfg = content.config_records[diag_wire.DIAG]
    shapes = {name: tuple(int(x) for x in dims) for name, dims in cfg.items() if name != "seed"}
    arrays = {name: diagnostic_vector(int(cfg["seed"]) + i, node.partition_id, shape)
              for i, (name, shape) in enumerate(sorted(shapes.items()))}
    return sum_reply(node, arrays,
                     extra={diag_wire.WHO: ConfigRecord({"partition-id": node.partition_id})})


def _relay_cfg(content: RecordDict) -> ConfigRecord:
    if RELAY_KEY not in content.config_records:
        raise RelayError(f"relay message has no '{RELAY_KEY}' ConfigRecord")
    return content.config_records[RELAY_KEY]


@diagnostic(Action.PROVE)
def prove(content: RecordDict, node: NodeContext) -> RecordDict:
    """HMAC-SHA256(secret, challenge): equal across nodes iff they hold the same secret."""
    cfg = _relay_cfg(content)
    secret = get_shared_secret(node.state, str(cfg["purpose"]))
    mac = hmac.new(secret, bytes(cfg["challenge"]), hashlib.sha256).digest()
    return RecordDict({diag_wire.PROOF: ConfigRecord({"mac": mac})})


@diagnostic(Action.CKKS_SELFTEST)
def ckks_selftest(content: RecordDict, node: NodeContext) -> RecordDict:
    """CKKS round trip with the relayed context (``encrypt`` or ``decrypt``)."""
    from fedrec.secure.he import decrypt_packed, encrypt_packed

    cfg = _relay_cfg(content)
    ctx = get_shared_context(node.state, str(cfg["purpose"]))
    mode = str(cfg["mode"])
    if mode == "encrypt":
        chunks = encrypt_packed(ctx, np.asarray(list(cfg["values"]), dtype=np.float64))
        return RecordDict({diag_wire.CKKS: ConfigRecord({"chunks": chunks})})
    if mode == "decrypt":
        values = decrypt_packed(ctx, [bytes(b) for b in cfg["chunks"]], int(cfg["n"]))
        return RecordDict({diag_wire.CKKS: ConfigRecord({"values": [float(v)
                                                                    for v in values]})})
    raise RelayError(f"{Action.CKKS_SELFTEST}: unknown mode {mode!r} (encrypt or decrypt)")
