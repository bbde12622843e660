"""The typed-message codec (``fedrec/wire/message.py``) and how a node reads a request
(``clients/node.py``: ``NodeContext.read``): every field checked against its declaration,
the run-fixed ones pinned for the run, and the built-in protocols' wire byte-identical to
what the typed messages encode."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from flwr.app import ConfigRecord, Context, RecordDict

from clients.node import NodeContext
from fedrec.records import to_array_record
from fedrec.wire.evaluation import RankingRequest
from fedrec.wire.fedmf import EvaluateRequest, TrainRequest
from fedrec.wire.message import (
    Message,
    WireError,
    derived,
    message,
    per_round,
    reply,
    run_fixed,
    wire_fields,
)


@message("demo_action")
class Demo(Message):
    V: np.ndarray = per_round(shape=("items", "dim"))
    W: np.ndarray | None = per_round(None, shape=("dim",))
    batch_size: int = run_fixed(min=1)
    lr: float = run_fixed(min=0.0)
    mode: str = run_fixed("a", choices=("a", "b"))
    ids: list[int] = per_round([])
    n_items: int = derived(name="items")


@message()
class DemoReply(Message):
    total: np.ndarray = reply(shape=(1,))


def _demo(**over: object) -> Demo:
    base = dict(V=np.zeros((5, 3)), batch_size=8, lr=0.1, ids=[1, 2], n_items=5)
    return Demo(**{**base, **over})  # type: ignore[arg-type]


def test_a_message_round_trips_through_flower_records() -> None:
    msg = _demo(W=np.ones(3))
    back = Demo.from_records(msg.to_records(), dims={"items": 5})
    assert back.batch_size == 8 and back.lr == 0.1 and back.mode == "a"
    assert back.ids == [1, 2] and back.n_items == 5
    np.testing.assert_array_equal(back.V, msg.V)
    np.testing.assert_array_equal(back.W, np.ones(3))
    assert set(msg.to_config()) == {"batch-size", "lr", "mode", "ids", "items"}
    assert Demo.ACTION == "demo_action" and DemoReply.ACTION is None


@pytest.mark.parametrize("config, arrays, match", [
    ({"batch-size": 0}, {}, r"size 'batch-size' must be an integer >= 1, got 0"),
    ({"batch-size": 2.5}, {}, r"size 'batch-size' must be an integer >= 1, got 2.5"),
    ({"batch-size": True}, {}, r"size 'batch-size' must be an integer >= 1, got True"),
    ({"lr": -1.0}, {}, r"field 'lr' must be >= 0"),
    ({"lr": float("nan")}, {}, r"field 'lr' must be a finite number"),
    ({"lr": "fast"}, {}, r"field 'lr' must be float"),
    ({"mode": "c"}, {}, r"field 'mode' must be one of 'a', 'b'"),
    ({"ids": 3}, {}, r"field 'ids' must be a list of int"),
    ({}, {"V": np.zeros(5)}, r"array 'V' must have 2 dimension"),
    ({}, {"V": np.zeros((4, 3))}, r"array 'V' has shape \(4, 3\), axis 0 expected items = 5"),
    ({}, {"W": np.zeros(4)}, r"array 'W' has shape \(4,\), axis 0 expected dim"),
])
def test_a_field_off_its_declaration_is_refused_naming_it(config: dict, arrays: dict,
                                                         match: str) -> None:
    content = _demo().to_records()
    content["protocol"] = ConfigRecord({**dict(content["protocol"]), **config})
    if arrays:
        content["arrays"] = to_array_record({**_demo().to_arrays(), **arrays})
    with pytest.raises(WireError, match=match):
        Demo.from_records(content, "node 7", dims={"items": 5})


def test_a_missing_field_is_refused_and_a_default_stands() -> None:
    content = _demo().to_records()
    del content["protocol"]["lr"]
    with pytest.raises(WireError, match=r"node 7 refuses the request: Demo has no field 'lr'"):
        Demo.from_records(content, "node 7")
    content = _demo().to_records()
    del content["protocol"]["mode"]
    assert Demo.from_records(content).mode == "a"


def test_a_reply_never_echoes_a_node_value() -> None:
    with pytest.raises(WireError) as err:
        DemoReply.from_parts({"total": np.array([1.0, 2.0])}, {}, "node 3")
    assert "1.0" not in str(err.value) and "node 3" in str(err.value)


def test_a_declaration_that_cannot_travel_fails_at_import() -> None:
    with pytest.raises(TypeError, match="cannot travel"):
        @message()
        class Bad(Message):
            x: dict = reply()
    with pytest.raises(TypeError, match="declare it with"):
        @message()
        class Undeclared(Message):
            x: int = 3


def _node(content: RecordDict, state: Context | None = None) -> NodeContext:
    ctx = state or Context(run_id=1, node_id=7, node_config={}, state=RecordDict(),
                           run_config={})
    return NodeContext(ctx, content)


def test_a_node_pins_run_fixed_fields_and_lets_per_round_ones_change() -> None:
    """The first request of a type fixes its run-fixed fields for the run (the node state
    is per run); a later one that changes any is refused naming it, never the value."""
    V = np.zeros((4, 2))
    first = TrainRequest(V=V, round=1, mode="local", seed=0, lr=0.01, reg=0.01, negatives=1,
                         epochs=1, batch_size=8, clip=1.0, loss_cap=20.0)
    node = _node(first.to_records())
    node.read(TrainRequest)
    ctx = node.context
    second = TrainRequest(**{**first.__dict__, "V": V + 1, "round": 2})
    _node(second.to_records(), ctx).read(TrainRequest)  # per round: accepted
    changed = TrainRequest(**{**first.__dict__, "lr": 0.5})
    with pytest.raises(WireError, match=r"field 'lr' of TrainRequest is fixed for the run"):
        _node(changed.to_records(), ctx).read(TrainRequest)
    # another message type pins its own fields; a fresh run (new state) starts afresh
    _node(EvaluateRequest(V=V, seed=0).to_records(), ctx).read(EvaluateRequest)
    _node(changed.to_records()).read(TrainRequest)


def test_every_request_field_says_what_the_run_contract_makes_of_it() -> None:
    from fedrec.wire.message import Fixed
    from tests.test_wire import _messages

    kinds = {f.spec.fixed for cls in _messages() if cls.ACTION for f in wire_fields(cls)}
    assert Fixed.REPLY not in kinds and kinds <= {Fixed.RUN, Fixed.ROUND, Fixed.DERIVED}


def test_the_evaluation_base_carries_its_cut_off() -> None:
    assert RankingRequest().to_config() == {"top-k": 20}
    with pytest.raises(WireError, match="size 'top-k' must be an integer >= 1, got 0"):
        RankingRequest.from_parts({}, {"top-k": 0})


def test_fedmf_requests_keep_their_wire_names() -> None:
    """The typed FedMF request encodes exactly the names the nodes always read."""
    req = TrainRequest(V=np.zeros((2, 2)), round=1, mode="exact", seed=0, lr=0.1, reg=0.0,
                       negatives=1, epochs=1, batch_size=8, clip=1.0, loss_cap=20.0)
    assert set(req.to_config()) == {"round", "mode", "seed", "lr", "reg", "negatives",
                                    "epochs", "batch-size", "clip", "loss-cap"}
    assert set(req.to_arrays()) == {"V"}
    assert SimpleNamespace(**req.to_config()).mode == "exact"
