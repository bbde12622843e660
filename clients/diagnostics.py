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
from flwr.app import RecordDict

from clients.handlers import diagnostic
from clients.node import NodeContext
from clients.relay_node import get_shared_context, get_shared_secret
from clients.sums_node import sum_reply
from fedrec.records import config_record
from fedrec.secure.relay import RelayError
from fedrec.wire.diagnostics import (
    Action,
    CkksResult,
    CkksSelftest,
    Proof,
    ProveRequest,
    SecureSumRequest,
    Who,
    secure_sum_shapes,
)


def diagnostic_vector(seed: int, partition_id: int, shape: tuple[int, ...]) -> np.ndarray:
    """The known input of a partition: standard normal draws, seeded (public by design)."""
    return np.random.default_rng([seed, 99, partition_id]).standard_normal(shape)


@diagnostic(Action.SECURE_SUM, sums=True)
def diag_secure_sum(content: RecordDict, node: NodeContext) -> RecordDict:
    """A sum contribution with known values (see :func:`diagnostic_vector`)."""
    req = node.read(SecureSumRequest)
    shapes = secure_sum_shapes(config_record(content, SecureSumRequest.CONFIG) or {})
    arrays = {name: diagnostic_vector(req.seed + i, node.partition_id, shape)
              for i, (name, shape) in enumerate(sorted(shapes.items()))}
    return sum_reply(node, arrays, extra=Who(partition_id=node.partition_id).to_records())


@diagnostic(Action.PROVE)
def prove(content: RecordDict, node: NodeContext) -> RecordDict:
    """HMAC-SHA256(secret, challenge): equal across nodes iff they hold the same secret."""
    req = node.read(ProveRequest)
    secret = get_shared_secret(node.state, req.purpose, node.who)
    return Proof(mac=hmac.new(secret, req.challenge, hashlib.sha256).digest()).to_records()


@diagnostic(Action.CKKS_SELFTEST)
def ckks_selftest(content: RecordDict, node: NodeContext) -> RecordDict:
    """CKKS round trip with the relayed context (``encrypt`` or ``decrypt``)."""
    from fedrec.secure.he import decrypt_packed, encrypt_packed

    req = node.read(CkksSelftest)
    ctx = get_shared_context(node.state, req.purpose, node.who)
    if req.mode == "encrypt" and req.values is not None:
        chunks = encrypt_packed(ctx, np.asarray(req.values, dtype=np.float64))
        return CkksResult(chunks=chunks).to_records()
    if req.mode == "decrypt" and req.chunks is not None and req.n is not None:
        values = decrypt_packed(ctx, req.chunks, req.n)
        return CkksResult(values=[float(v) for v in values]).to_records()
    raise RelayError(f"{Action.CKKS_SELFTEST}: mode {req.mode!r} needs values (encrypt) or "
                     "chunks and n (decrypt)")
