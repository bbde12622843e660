"""The platform every protocol stands on: aggregators, the sealed relay, roles, layering.

Runs on an in-process grid (``tests/localgrid.py``) with this project's real ClientApp, so
every message still goes through Flower records and the node handlers.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tenseal as ts
from flwr.app import ConfigRecord, RecordDict

from clients.diagnostics import diagnostic_vector
from clients.handlers import QUERY_HANDLERS, handler
from clients.node import NodeContext
from fedrec.secure.he import load_context
from fedrec.secure.sealed import MAIL_IN, MAIL_OUT
from fedrec.transport.aggregators import CkksAggregator, PlainAggregator
from fedrec.transport.mailroom import open_mailroom
from fedrec.transport.messenger import Messenger, NodeError
from fl_app.client_app import build_client_app
from strategies.base import RoleNeed, handshake
from tests.localgrid import LocalGrid
from tests.simutil import DIAGNOSTIC_APP, diag_expected, diag_request

REPO = Path(__file__).resolve().parents[1]
SHAPES = {"matrix": (7, 5), "vector": (300,)}
SEED = 11


def _request() -> RecordDict:
    return diag_request(SEED, SHAPES)


def _expected(partitions: list[int]) -> dict[str, np.ndarray]:
    return diag_expected(SEED, SHAPES, partitions)


# -- plain sums: a fixed node order -----------------------------------------------------
def _plain_sum(reverse: bool, n: int = 5) -> dict[str, np.ndarray]:
    app = build_client_app(**DIAGNOSTIC_APP)
    with LocalGrid(app, n, reverse=reverse, pull_limit=1) as grid:
        messenger = Messenger(grid, timeout=10)
        nodes = messenger.node_ids()
        return PlainAggregator(messenger, nodes).sum("diag_secure_sum", _request(), max_abs=1e9)


def test_plain_sums_are_bit_identical_whatever_the_arrival_order() -> None:
    forward, backward = _plain_sum(False), _plain_sum(True)
    # The test can fail: adding these inputs in the two orders does change float64 bits.
    vecs = [diagnostic_vector(SEED + 1, p, SHAPES["vector"]) for p in range(5)]
    assert not np.array_equal(sum(vecs), sum(reversed(vecs)))
    for name in SHAPES:
        assert np.array_equal(forward[name], backward[name]), name
        np.testing.assert_allclose(forward[name], _expected(list(range(5)))[name], atol=1e-12)


# -- CKKS sums: the server adds ciphertexts without the secret key -----------------------
def test_ckks_sum_equals_plain_sum_and_the_server_holds_no_secret_key() -> None:
    with LocalGrid(build_client_app(**DIAGNOSTIC_APP), 4) as grid:
        messenger = Messenger(grid, timeout=60)
        nodes = messenger.node_ids()
        ckks = CkksAggregator(messenger, nodes, seed=2)
        ckks.setup()
        got = ckks.sum("diag_secure_sum", _request(), max_abs=10.0)
        plain = PlainAggregator(messenger, nodes).sum("diag_secure_sum", _request(), max_abs=10.0)
        sent = [m for m in grid.pushed]
    for name in SHAPES:
        np.testing.assert_allclose(got[name], plain[name], rtol=0, atol=1e-5)
    assert not load_context(ckks.public_context).has_secret_key()
    assert ckks.view[-1].form == "encrypted" and ckks.view[-1].nodes == 4
    # nothing the server sent is a context with a secret key
    for msg in sent:
        for record in msg.content.config_records.values():
            for value in record.values():
                for item in value if isinstance(value, list) else [value]:
                    if isinstance(item, bytes) and len(item) > 10_000:
                        try:
                            ctx = ts.context_from(item)
                        except Exception:  # noqa: BLE001  (a ciphertext, not a context)
                            continue
                        assert not ctx.has_secret_key()


# -- the sealed relay ---------------------------------------------------------------------
PURPOSE = "test-mail"


def _send_mail(content: RecordDict, node: NodeContext) -> RecordDict:
    cfg = content.config_records["mail"]
    node.mailbox.send(int(cfg["to"]), PURPOSE, bytes(cfg["payload"]))
    return RecordDict()


def _read_mail(content: RecordDict, node: NodeContext) -> RecordDict:
    got = node.mailbox.receive(PURPOSE)
    return RecordDict({"got": ConfigRecord({str(k): v for k, v in got.items()})})


for _name, _fn in (("test_send_mail", _send_mail), ("test_read_mail", _read_mail)):
    if _name not in QUERY_HANDLERS:
        handler(_name)(_fn)


def _relay(tamper: bool = False) -> dict:
    payload = b"embedding rows of node a" * 4
    with LocalGrid(build_client_app(), 3) as grid:
        messenger = Messenger(grid, timeout=10)
        a, b, c = messenger.node_ids()
        room = open_mailroom(messenger, [a, b, c])
        if tamper:
            room.tamper = lambda s, r, blob: blob[:-1] + bytes([blob[-1] ^ 1])
        messenger.send("test_send_mail", {a: RecordDict({"mail": ConfigRecord(
            {"to": b, "payload": payload})})})
        out: dict = {"nodes": (a, b, c), "view": list(room.view), "payload": payload}
        try:
            out["read"] = messenger.broadcast("test_read_mail", RecordDict(), [b, c])
        except NodeError as exc:
            out["error"] = str(exc)
        out["pushed"] = list(grid.pushed)
    return out


def test_relayed_payload_reaches_only_its_recipient_as_ciphertext() -> None:
    out = _relay()
    a, b, c = out["nodes"]
    assert out["read"][b].config_records["got"][str(a)] == out["payload"]
    assert dict(out["read"][c].config_records["got"]) == {}
    # what the server saw: endpoints and sizes, the payload only sealed
    (record,) = out["view"]
    assert (record.sender, record.recipient, record.purpose) == (a, b, PURPOSE)
    assert record.nbytes == len(out["payload"]) + 28  # nonce + tag
    carried = [bytes(v) for m in out["pushed"] if MAIL_IN in m.content.config_records
               for v in m.content.config_records[MAIL_IN].values()]
    assert carried and all(out["payload"] not in blob for blob in carried)
    assert all(MAIL_OUT not in m.content.config_records for m in out["pushed"])


def test_tampered_payload_names_the_sender() -> None:
    out = _relay(tamper=True)
    a, b, _ = out["nodes"]
    assert f"mail '{PURPOSE}' from node {a} to node {b} failed authentication" in out["error"]


# -- roles and the handshake --------------------------------------------------------------
ITEM_SERVER = (RoleNeed(("user",), min=1, holds=("rows",)),
               RoleNeed(("item-server",), min=1, max=1, holds=("item-features",)))
DATA = {"dataset": "synthetic", "synthetic-users": 40, "synthetic-items": 30, "seed": 0,
        "partition": "shards-contiguous"}


def _federation(node_configs: dict[int, dict], needs: tuple[RoleNeed, ...]) -> dict:
    with LocalGrid(build_client_app(), 3, node_configs=node_configs) as grid:
        messenger = Messenger(grid, timeout=10)
        return handshake(messenger, DATA, needs=needs, protocol="test-protocol")


def test_item_server_and_user_nodes_pass_the_handshake() -> None:
    users = {"num-partitions": 2}
    infos = _federation({0: users, 1: users, 2: {"role": "item-server"}}, ITEM_SERVER)
    roles = [i.role for i in infos.values()]
    assert sorted(roles) == ["item-server", "user", "user"]
    server = next(i for i in infos.values() if i.role == "item-server")
    assert "item-features" in server.holds and server.n_users == 0
    assert sum(i.n_users for i in infos.values()) == 40


def test_a_node_whose_role_does_not_fit_fails_naming_it() -> None:
    with pytest.raises(ValueError, match=r"node 1003 \(item server\) has role 'item-server', "
                                         r"but protocol 'test-protocol' takes only"):
        _federation({2: {"role": "item-server"}}, (RoleNeed(("user", "silo")),))
    with pytest.raises(ValueError, match=r"needs 1..1 node\(s\) of role item-server holding "
                                         r"item-features; the federation has 0"):
        _federation({}, ITEM_SERVER)


# -- results ----------------------------------------------------------------------------------
#: The smallest real run: the example protocol on 40 synthetic users.
TINY_POPULARITY = {"protocol": "examples.item_popularity:ItemPopularity",
                   "synthetic-users": 40, "synthetic-items": 30}


def test_results_record_what_the_server_received_and_keep_large_arrays(tmp_path: Path) -> None:
    import scipy.sparse as sp

    from fedrec.results import load_run_arrays, read_run, write_run
    from fl_app.registry import resolve_config
    from fl_app.server_app import run_protocol

    cfg = resolve_config(TINY_POPULARITY)
    with LocalGrid(build_client_app(["examples.item_popularity"]), 3) as grid:
        record = run_protocol(grid, cfg)
    privacy = record["privacy"]
    assert privacy["aggregator"] == "secagg+"
    assert {s["form"] for s in privacy["sums"]} == {"masked"}
    assert privacy["received"]["degrees"]["records"]["secagg.values"]["form"] == "masked"
    # 30 item degrees and the one-value clip flag every masked reply carries
    assert privacy["received"]["degrees"]["records"]["secagg.values"]["entries"]["v"] == [31]
    # the mail keys come with the SecAgg+ mask keys: no relay_keys round of their own
    assert "relay_keys" not in privacy["received"]
    setup = privacy["received"]["secagg_setup"]
    assert setup["records"]["relay-key"]["entries"] == {"pk": "config"}
    assert privacy["sealed_mail"]["secagg-share"]["payloads"] == 3 * 2
    record["extra"]["big"] = np.arange(100.0)
    path = write_run(record, "privacy-test", out_dir=tmp_path)
    import json

    data = json.loads(path.read_text())
    assert data["extra"]["big"] == {"npz": "extra.big", "shape": [100], "dtype": "float64"}
    assert np.array_equal(load_run_arrays(path)["extra.big"], np.arange(100.0))
    record["extra"]["sparse"] = sp.random(80, 90, density=0.05, random_state=0, format="csr")
    back = read_run(write_run(record, "privacy-test", out_dir=tmp_path))
    assert np.array_equal(back["extra"]["big"], np.arange(100.0))
    assert (back["extra"]["sparse"] != record["extra"]["sparse"]).nnz == 0
    assert back["metrics"] == pytest.approx(record["metrics"])


def test_a_failed_run_keeps_its_partial_results_and_reason() -> None:
    from fedrec.transport.messenger import NodeTimeoutError
    from fl_app.registry import resolve_config
    from fl_app.server_app import attempt_protocol

    cfg = resolve_config({**TINY_POPULARITY, "timeout": 0.5, "startup-timeout": 0.5})
    with LocalGrid(build_client_app(["examples.item_popularity"]), 3, silent=[1003]) as grid:
        attempt = attempt_protocol(grid, cfg)
    assert isinstance(attempt.error, NodeTimeoutError)
    partial = attempt.record
    assert partial["status"] == "failed"
    assert "did not answer 'hello'" in partial["error"] and "node 1003" in partial["error"]
    assert partial["communication"]["phases"]["handshake"]["rounds"] == 1


def test_the_handshake_waits_for_a_slow_start_that_a_later_request_may_not_take() -> None:
    """Each node's first reply comes 0.6 s after the request (a node's start), three times
    the per-request `timeout`: the handshake allows `startup-timeout`; without it the same
    start fails the run."""
    from fedrec.transport.messenger import NodeTimeoutError
    from fl_app.registry import resolve_config
    from fl_app.server_app import run_protocol

    base = {**TINY_POPULARITY, "timeout": 0.2}
    app = build_client_app(["examples.item_popularity"])
    with LocalGrid(app, 3, cold_start=0.6) as grid:
        record = run_protocol(grid, resolve_config({**base, "startup-timeout": 5.0}))
    assert record["status"] == "completed"
    with LocalGrid(app, 3, cold_start=0.6) as grid:
        with pytest.raises(NodeTimeoutError, match="did not answer 'hello' within 0.2 s"):
            run_protocol(grid, resolve_config({**base, "startup-timeout": 0.2}))


def test_secagg_graph_is_complete_for_small_federations_and_logarithmic_above() -> None:
    from fedrec.transport.factory import auto_degree

    assert auto_degree(10) is None and auto_degree(32) is None
    assert auto_degree(100) == 14 and auto_degree(1000) == 20
