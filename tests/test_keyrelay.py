"""Shared-secret relay over Flower messages, on 5 nodes of the in-process grid.

Checks that a random key and a CKKS secret context created by one node reach every node,
that no message the server sends or receives carries the secret, that the nodes prove they
hold the same secret (HMAC of a server challenge), that the server's public CKKS context
adds but cannot decrypt while the nodes' relayed context round-trips, and that tampering
and disagreement are reported naming the nodes.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import random

import numpy as np
import pytest
import tenseal as ts
from flwr.app import ConfigRecord, RecordDict

from clients.handlers import QUERY_HANDLERS, handler
from clients.node import NodeContext
from fedrec.secure.he import EncryptedSum, load_context
from fedrec.secure.relay import RELAY_KEY, RelayError
from fedrec.transport.messenger import Messenger, NodeError
from fedrec.transport.relay_server import relay_secret

N = 5
KEY_PURPOSE = "lpgcn-S"
CKKS_PURPOSE = "privmvmf-ckks"
VALUES = [1.5, -2.25, 3.0, 0.125, -7.0]
REVEAL = "test_keys_reveal"


# Test-only handler: lets the TEST (never the server of a real run) read what a node stored,
# after the logged protocol is over, to search the server's view for it. Not in the ClientApp
# outside this test module.
def _reveal(content: RecordDict, node: NodeContext) -> RecordDict:
    from clients.relay_node import get_shared_secret

    purpose = str(content.config_records[RELAY_KEY]["purpose"])
    return RecordDict({"secret": ConfigRecord({"secret": get_shared_secret(node.state, purpose)})})


if REVEAL not in QUERY_HANDLERS:
    handler(REVEAL)(_reveal)


def _relay_cfg(**kw) -> RecordDict:
    return RecordDict({RELAY_KEY: ConfigRecord(kw)})


def _scenarios(messenger: Messenger) -> dict:
    out: dict = {"log": []}
    nodes = messenger.node_ids(min_nodes=N)
    out["nodes"] = nodes
    log = out["log"]
    orig = messenger.exchange
    hooks: dict = {}

    def logged(messages, **kw):
        """Everything the server sends and receives, as the Grid carries it (mail included)."""
        for m in messages:
            action = m.metadata.message_type.removeprefix("query.")
            log.append(("sent", action, m.metadata.dst_node_id, _raw_values(m.content)))
        for node, reply in orig(messages, **kw):
            action = messages[0].metadata.message_type.removeprefix("query.")
            if not reply.has_error():
                if "after" in hooks:
                    hooks["after"](action, node, reply.content)
                log.append(("received", action, node, _raw_values(reply.content)))
            yield node, reply

    messenger.exchange = logged  # every round of the messenger goes through it

    # 1. relay a random key (owner drawn from the seed) and a CKKS context (owner given)
    out["key"] = relay_secret(messenger, nodes, purpose=KEY_PURPOSE, seed=3)
    out["ckks"] = relay_secret(messenger, nodes, purpose=CKKS_PURPOSE, owner=nodes[1],
                               make="ckks-context")

    # 2. nodes prove they hold the same secrets: HMAC of a fresh server challenge
    challenge = os.urandom(16)
    out["challenge"] = challenge
    for purpose in (KEY_PURPOSE, CKKS_PURPOSE):
        replies = messenger.broadcast("keys_prove", _relay_cfg(purpose=purpose,
                                                               challenge=challenge), nodes)
        out[f"macs.{purpose}"] = {n: bytes(r.config_records["relay-proof"]["mac"])
                                  for n, r in replies.items()}

    # 3. CKKS: two nodes encrypt, the server adds with the public context, a third decrypts
    enc = messenger.broadcast("keys_ckks_selftest", _relay_cfg(
        purpose=CKKS_PURPOSE, mode="encrypt", values=VALUES), [nodes[0], nodes[2]])
    acc = EncryptedSum(out["ckks"].public_context)
    for n in (nodes[0], nodes[2]):
        acc.add([bytes(b) for b in enc[n].config_records["ckks"]["chunks"]])
    summed = acc.result()
    public = load_context(out["ckks"].public_context)
    out["server_has_secret_key"] = public.has_secret_key()
    try:
        ts.ckks_vector_from(public, summed[0]).decrypt()
        out["server_decrypt"] = "decrypted"
    except Exception as exc:  # TenSEAL refuses: no secret key
        out["server_decrypt"] = f"{type(exc).__name__}: {exc}"
    dec = messenger.send("keys_ckks_selftest", {nodes[4]: _relay_cfg(
        purpose=CKKS_PURPOSE, mode="decrypt", chunks=summed, n=len(VALUES))})
    out["ckks_sum"] = [float(v) for v in dec[nodes[4]].config_records["ckks"]["values"]]

    # 4. a secret nobody relayed: clear error naming the purpose
    try:
        messenger.broadcast("keys_prove", _relay_cfg(purpose="nope", challenge=b"x"), nodes[:1])
        out["missing"] = "answered"
    except NodeError as exc:
        out["missing"] = str(exc)

    # 5. a blob altered in transit fails authentication at its recipient, naming both nodes
    victim = {}

    def flip_blob(sender: int, recipient: int, blob: bytes) -> bytes:
        if "node" not in victim:
            victim["node"] = recipient
            return blob[:-1] + bytes([blob[-1] ^ 1])
        return blob

    messenger.mailroom.tamper = flip_blob
    try:
        res = relay_secret(messenger, nodes, purpose="tampered", owner=nodes[0])
        out["tamper"] = f"completed with owner {res.owner}"
    except NodeError as exc:
        out["tamper"] = str(exc)
    out["tamper_victim"] = victim.get("node")
    messenger.mailroom.tamper = None
    messenger.mailroom.queues.clear()

    # 6. a node acknowledging a different fingerprint is named by the server
    def bad_ack(action, node, reply):
        if action == "keys_receive_secret" and node == nodes[3]:
            reply.config_records["relay-ack"]["fingerprint"] = b"\0" * 32

    hooks["after"] = bad_ack
    try:
        relay_secret(messenger, nodes, purpose="disagree", owner=nodes[0])
        out["disagree"] = "completed"
    except RelayError as exc:
        out["disagree"] = str(exc)
    del hooks["after"]

    # 7. bad arguments are refused before any message
    for name, kwargs in {"bad_make": {"make": "rsa"}, "bad_owner": {"owner": -1}}.items():
        try:
            relay_secret(messenger, nodes, purpose="x", **kwargs)
            out[name] = "accepted"
        except ValueError as exc:
            out[name] = str(exc)

    # Test only, after the logged protocol: read what the nodes stored (not logged).
    messenger.exchange = orig
    for purpose in (KEY_PURPOSE, CKKS_PURPOSE):
        replies = messenger.broadcast(REVEAL, _relay_cfg(purpose=purpose), nodes)
        out[f"stored.{purpose}"] = {n: bytes(r.config_records["secret"]["secret"])
                                    for n, r in replies.items()}
    return out


@pytest.fixture(scope="module")
def results() -> dict:
    # In process: the same ClientApp and messages; the relay on a real Flower simulation runs
    # in tests/test_lpgcn.py (LP-GCN's S key) and tests/test_mvmf.py (PrivMVMF's CKKS context)
    from tests.simutil import run_on_local_nodes

    return run_on_local_nodes(_scenarios, N)


def _raw_values(content: RecordDict) -> list[bytes]:
    """Every value in a RecordDict as raw bytes: config values (and list items), arrays."""
    blobs: list[bytes] = []
    for record in content.config_records.values():
        for value in record.values():
            items = value if isinstance(value, list) else [value]
            for item in items:
                if isinstance(item, (bytes, bytearray)):
                    blobs.append(bytes(item))
                elif isinstance(item, str):
                    blobs.append(item.encode())
    for record in content.array_records.values():
        for array in record.values():
            blobs.append(bytes(array.data))
    return blobs


def test_every_node_holds_the_same_secret(results: dict) -> None:
    nodes = results["nodes"]
    for purpose, res in ((KEY_PURPOSE, results["key"]), (CKKS_PURPOSE, results["ckks"])):
        stored = results[f"stored.{purpose}"]
        assert sorted(stored) == nodes
        assert len(set(stored.values())) == 1
        secret = next(iter(stored.values()))
        assert res.fingerprint == hashlib.sha256(secret).digest()
    assert len(next(iter(results[f"stored.{KEY_PURPOSE}"].values()))) == 32
    assert results["key"].owner == random.Random(3).choice(sorted(nodes))
    assert results["key"].public_context is None
    assert results["ckks"].owner == nodes[1]


def test_secret_never_crosses_the_server(results: dict) -> None:
    log = results["log"]
    actions = {action for _, action, _, _ in log}
    assert {"relay_keys", "keys_create_secret", "keys_receive_secret"} <= actions
    sealed = [blob for _, action, _, blobs in log if action == "keys_create_secret"
              for blob in blobs if len(blob) > 32]
    assert sealed, "the owner's reply carries the sealed copies"
    for purpose in (KEY_PURPOSE, CKKS_PURPOSE):
        secret = next(iter(results[f"stored.{purpose}"].values()))
        for direction, action, node, blobs in log:
            for blob in blobs:
                assert secret not in blob, f"{purpose} secret found in {direction} {action} ({node})"
    # no value the server saw is a TenSEAL context holding a secret key
    for _, action, _, blobs in log:
        for blob in blobs:
            if len(blob) > 10_000 and action != "keys_ckks_selftest":
                try:
                    ctx = ts.context_from(blob)
                except Exception:
                    continue
                assert not ctx.has_secret_key(), f"secret context in {action}"


def test_nodes_prove_the_same_secret(results: dict) -> None:
    for purpose in (KEY_PURPOSE, CKKS_PURPOSE):
        macs = results[f"macs.{purpose}"]
        assert sorted(macs) == results["nodes"]
        assert len(set(macs.values())) == 1
        secret = next(iter(results[f"stored.{purpose}"].values()))
        want = hmac.new(secret, results["challenge"], hashlib.sha256).digest()
        assert next(iter(macs.values())) == want
    assert results[f"macs.{KEY_PURPOSE}"] != results[f"macs.{CKKS_PURPOSE}"]


def test_ckks_public_context_adds_but_cannot_decrypt(results: dict) -> None:
    assert results["server_has_secret_key"] is False
    assert results["server_decrypt"] != "decrypted"
    np.testing.assert_allclose(results["ckks_sum"], 2 * np.asarray(VALUES), atol=1e-5)


def test_errors_name_the_nodes(results: dict) -> None:
    nodes = results["nodes"]
    assert "no shared secret 'nope'" in results["missing"]
    victim = results["tamper_victim"]
    assert "failed authentication" in results["tamper"]
    assert f"from node {nodes[0]} to node {victim}" in results["tamper"]
    assert f"node {nodes[3]}" in results["disagree"] and "fingerprint" in results["disagree"]
    assert "make must be one of" in results["bad_make"]
    assert "owner -1 is not one of the nodes" in results["bad_owner"]


def test_a_node_keeps_a_bounded_number_of_relayed_secrets() -> None:
    """The purposes are the server's names and each kept secret outlives its request (a CKKS
    context is about 10 MiB once loaded): a node keeps at most MAX_SECRETS per run, refuses a
    new purpose past them naming itself and the field, and its loaded-context cache stays
    bounded too."""
    from clients import relay_node
    from tests.simutil import run_on_local_nodes

    def scenario(messenger: Messenger) -> str:
        nodes = messenger.node_ids(min_nodes=3)
        for i in range(relay_node.MAX_SECRETS):
            relay_secret(messenger, nodes, purpose=f"bounded-{i}", seed=i)
        relay_secret(messenger, nodes, purpose="bounded-0", seed=0)  # a kept purpose again
        with pytest.raises(NodeError) as err:
            relay_secret(messenger, nodes, purpose="one-too-many", seed=9)
        return str(err.value)

    text = run_on_local_nodes(scenario, 3)
    assert f"at most {relay_node.MAX_SECRETS} relayed secrets" in text, text
    assert "node" in text and f"'{RELAY_KEY}.purpose'" in text, text


def test_the_loaded_context_cache_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """Contexts of many runs or purposes (each about 10 MiB native) never pile up in a node
    process: the oldest is dropped past the cache's size."""
    from clients import relay_node
    from fedrec.secure import he

    monkeypatch.setattr(relay_node, "_CONTEXT_CACHE", {})
    monkeypatch.setattr(he, "load_context", lambda secret: object())
    state = RecordDict()
    for i in range(5):
        state[f"secret.ctx-{i}"] = ConfigRecord({"secret": bytes([i]) * 8, "make": "ckks-context",
                                                 "owner": 1, "fingerprint": b""})
        relay_node.get_shared_context(state, f"ctx-{i}")
        assert len(relay_node._CONTEXT_CACHE) <= relay_node._CONTEXT_CACHE_SIZE
