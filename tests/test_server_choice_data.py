"""The server names no data: a node offers the rows its operator describes, whatever the
request says, and answers the handshake once per run.

The review's attacks: a ``data`` record in any request re-selected the node's rows (a
cold-start fraction of (n-1)/n with a searched seed left one user warm, so a legal sum over
the whole set was that user's rows; min-rating, test ratio, seeds and the partition scheme
gave the same lever), and ``hello`` answered under each request's description read a
user's rows bit by bit through its clear count of training users. Every data key the
server could vary is varied here, per node and across runs.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from flwr.app import ConfigRecord, RecordDict

from datasets import data_keys, describe
from fedrec.wire import handshake as handshake_wire
from fedrec.wire.handshake import Info
from fl_app.client_app import build_client_app
from tests.malicious import MaliciousGrid, Refused

TINY = {"dataset": "synthetic", "synthetic-users": 60, "synthetic-items": 30}
APP = build_client_app(policy={})
_RUNS = itertools.count(500)

#: A value other than the operator's for every key a server could name.
OTHER: dict[str, Any] = {
    "dataset": "ml-100k", "seed": 7, "test-ratio": 0.5, "implicit": False, "min-rating": 4.0,
    "synthetic-users": 61, "synthetic-items": 31, "synthetic-rank": 3,
    "synthetic-density": 0.5, "synthetic-clusters": 2, "synthetic-popularity-skew": 0.1,
    "synthetic-feature-noise": 0.0, "cold-start-users": 0.9, "cold-start-items": 0.5,
    "drop-cold-items": True, "partition": "shards-random", "item-servers": 1,
}


def _hello(data: dict[str, Any] | None = None) -> RecordDict:
    content = RecordDict()
    if data is not None:
        content[handshake_wire.DATA] = ConfigRecord(data)
    return content


def _grid(**kwargs: Any) -> MaliciousGrid:
    return MaliciousGrid(APP, 3, data=TINY, run_id=next(_RUNS), **kwargs)


def test_every_data_key_the_server_could_choose_is_covered() -> None:
    assert set(OTHER) == set(data_keys()) - {"data-dir"}


@pytest.mark.parametrize("key", sorted(OTHER))
def test_a_request_naming_other_data_is_refused_naming_the_key(key: str) -> None:
    """Each data key, changed for one node only in a request: refused before the handler,
    naming the key; no reply depends on the node's rows."""
    with _grid() as grid:
        victim = grid.ids[1]
        with pytest.raises(Refused, match=f"run asks for {key}="):
            grid.ask(victim, "hello", _hello({**describe(TINY), key: OTHER[key]}))


def test_the_rows_are_the_operators_whatever_the_request_names() -> None:
    """A request with no description, or with the operator's own, loads the operator's
    rows; the counts a node reports never change with what the server sends."""
    counts = []
    for data in (None, describe(TINY), {"dataset": "synthetic"}):
        with _grid() as grid:
            reply = grid.ask(grid.ids[0], "hello", _hello(data))
            info = reply.config_records[handshake_wire.INFO]
            counts.append((info[Info.N_USERS], info[Info.N_TRAIN_USERS]))
    assert len(set(counts)) == 1


def test_a_node_without_a_data_description_names_what_its_operator_must_set() -> None:
    with MaliciousGrid(APP, 2, run_id=next(_RUNS)) as grid:  # no operator description
        assert "dataset" not in grid.contexts[grid.ids[0]].node_config
        with pytest.raises(Refused, match="no data description: its operator names"):
            grid.ask(grid.ids[0], "hello", _hello())


def test_hello_is_answered_once_per_run() -> None:
    """The review read 4 users' rows with 64 hellos under chosen filters: now a second hello
    in a run is refused, and a new run reports the same counts (the operator's data)."""
    with _grid() as grid:
        node = grid.ids[0]
        first = grid.ask(node, "hello", _hello(describe(TINY)))
        with pytest.raises(Refused, match="second hello"):
            grid.ask(node, "hello", _hello(describe(TINY)))
    with _grid() as grid:  # a new run: Flower's node state starts empty
        again = grid.ask(grid.ids[0], "hello", _hello())
    assert dict(first.config_records[handshake_wire.INFO]) == \
        dict(again.config_records[handshake_wire.INFO])


def test_a_split_view_of_the_data_fails_the_honest_run() -> None:
    """The server's FedMF run with the victim alone shown cold-start-users = 0.9: the victim
    refuses at the handshake, so no sum of the run is over its re-selected rows."""
    from fedrec.transport.messenger import Messenger, NodeError
    from fl_app.registry import resolve_config
    from strategies.fedmf import FedMF

    def rewrite(msg: Any) -> RecordDict | None:
        if msg.metadata.dst_node_id != victim or handshake_wire.DATA not in msg.content:
            return None
        content = RecordDict(dict(msg.content.items()))
        content[handshake_wire.DATA] = ConfigRecord(
            {**dict(msg.content[handshake_wire.DATA]), "cold-start-users": 0.9})
        return content

    cfg = resolve_config({**TINY, "protocol": "fedmf", "rounds": 1, "mf-dim": 2})
    with MaliciousGrid(build_client_app(["clients.fedmf"], policy={}), 3, data=cfg,
                       run_id=next(_RUNS), rewrite=rewrite) as grid:
        victim = grid.ids[1]
        with pytest.raises(NodeError, match="cold-start-users=0.9"):
            FedMF(cfg).execute(Messenger(grid, timeout=20))
        sums = [m for m, _ in grid.log if m.metadata.message_type != "query.hello"]
    assert not sums  # the run stopped at the handshake
