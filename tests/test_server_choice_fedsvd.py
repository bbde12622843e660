"""Federated SVD against a server that chooses what nodes compute (security review, issue 43).

(A) FedPower's noise scale. Algorithm 1 scales the nodes' and the server's noise by
||Z||_max of a node's local basis. Under a chosen basis Z = e_j a node's local basis after
one power iteration is its normalised column j of M'_i (a one-user node: 1/sqrt(degree) in
every entry where its user holds j, the unit vector e_1 otherwise), so anything derived
from that value (a grid indicator beside the update, or the standard deviation of the noise
in the sum) tells the server whether the node's users hold item j. The nodes answer the
update alone and scale every noise by the public bound.

(B) Work and the sum record, checked before any work: a synchronization whose iterations
times the flops of one iteration exceed what the node's ``max-iterations`` allows is
refused, and so is a request whose sum record the node's policy would refuse at the end;
neither refusal depends on the node's values, and neither charges the node's DP ledger.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest
from flwr.app import ConfigRecord, RecordDict

from datasets import DatasetSpec, PartitionSpec, load_dataset, partition_users
from fedrec.records import to_array_record
from fedrec.recsys import power_svd as svd
from fedrec.wire.sums import SHAPES_KEY
from fl_app.client_app import build_client_app
from fl_app.registry import resolve_config
from fl_app.server_app import run_protocol
from tests.localgrid import LocalGrid
from tests.malicious import MaliciousGrid, Refused

NODES = 3
#: 2 users per node over 40 items (sparse), so some item is held in one block and not another
SMALL = {"dataset": "synthetic", "synthetic-users": 6, "synthetic-items": 40, "seed": 3,
         "synthetic-density": 0.15, "partition": "row-blocks"}
#: The review's sizes: d = 1,682 (ML-100K's items) admits a rank-1,500 basis
WIDE = {**SMALL, "synthetic-users": 30, "synthetic-items": 1682, "synthetic-density": 0.02}
SENTINEL = "the power iterations ran"


def _blocks(data: dict[str, Any]) -> list:
    """Each node's training rows, as the grid's partition ids give them."""
    cfg = resolve_config({**data, "protocol": "fedpower"})
    loaded = load_dataset(DatasetSpec.from_config(cfg))
    return [loaded.train[p] for p in partition_users(loaded, PartitionSpec.from_config(cfg,
                                                                                        NODES))]


def _sync(data: dict[str, Any], Z: np.ndarray, *, scheme: str = "fedpower", t_to: int = 2,
          sum_record: dict[str, Any] | None = None, sigma: float = 0.1) -> RecordDict:
    """A fedsvd_sync request the server makes up: iterations 1..t_to from the basis Z."""
    cfg = {"scheme": scheme, "t-from": 0, "t-to": t_to, "rows-total": 1000.0,
           "n-nodes": NODES, "fedsvd-k": 1, "fedsvd-rank": Z.shape[1],
           "fedsvd-iterations": t_to, "fedsvd-sync-every": t_to, "fedsvd-sigma": sigma,
           "fedsvd-sigma-server": sigma, "fedsvd-z-hat": 0.2, "fedsvd-m-hat": 1.0,
           "fedsvd-delta": 1e-5, "fedsvd-ddp": False, "seed": 0}
    records: dict[str, Any] = {"data": ConfigRecord(data), "protocol": ConfigRecord(cfg),
                               "arrays": to_array_record({"Z": Z})}
    if sum_record is None:
        sum_record = {"mode": "plain", "sum-id": 1, "wire-dtype": "float64"}
    if sum_record:
        records["secagg"] = ConfigRecord(sum_record)
    return RecordDict(records)


@pytest.fixture
def no_work(monkeypatch: pytest.MonkeyPatch) -> None:
    """The node's power iterations fail loudly if they start (a refusal must come first)."""
    def ran(*args: Any, **kwargs: Any) -> None:
        raise AssertionError(SENTINEL)

    monkeypatch.setattr(svd, "node_block", ran)


@contextmanager
def _grid(data: dict[str, Any], policy: dict[str, Any] | None = None
          ) -> Iterator[MaliciousGrid]:
    """Nodes whose operator offers ``data`` (plain sums allowed unless ``policy`` says)."""
    app = build_client_app(policy={"allow-plain": True} if policy is None else policy)
    with MaliciousGrid(app, NODES, data=data) as g:
        yield g


@pytest.fixture
def grid() -> Iterator[MaliciousGrid]:
    with _grid(SMALL) as g:
        yield g


@pytest.fixture
def wide_grid() -> Iterator[MaliciousGrid]:
    with _grid(WIDE) as g:
        yield g


# -- (A) FedPower's noise scale -----------------------------------------------------------
def test_a_chosen_basis_gets_the_update_alone_and_a_data_independent_noise_scale(
        grid: MaliciousGrid, monkeypatch: pytest.MonkeyPatch) -> None:
    """Z = e_j, two nodes, one whose users hold item j and one whose users do not: each
    reply carries only the protocol's update Y (no z-max indicator), and both nodes draw
    their noise with the same standard deviation, sigma times the public bound."""
    blocks = _blocks(SMALL)
    held = [set(np.unique(b.indices)) for b in blocks]
    # j held in block a (by a user with other items too) and in no row of block b
    a, b, j = next((a, b, j) for a in range(NODES) for b in range(NODES)
                   for j in sorted(held[a] - held[b])
                   if (blocks[a][:, j].T @ blocks[a]).count_nonzero() >= 2)
    stds: dict[int, list[float]] = {a: [], b: []}
    node_of = {int(grid.contexts[n].node_config["partition-id"]): n for n in grid.ids}
    for pid in (a, b):
        def record(shape: tuple[int, ...], std: float, pid: int = pid) -> np.ndarray:
            stds[pid].append(std)
            return np.zeros(shape)

        monkeypatch.setattr(svd, "draw_noise", record)
        Z = np.zeros((SMALL["synthetic-items"], 1))
        Z[j, 0] = 1.0
        reply = grid.ask(node_of[pid], "fedsvd_sync", _sync(SMALL, Z))
        assert set(reply[SHAPES_KEY]) == {"Y"}, dict(reply[SHAPES_KEY])
    assert stds[a] == stds[b] == [0.1 * svd.FEDPOWER_Z_MAX], stds


def test_every_fedpower_noise_is_scaled_by_the_public_bound(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A whole FedPower run: every noise the nodes and the server draw has the standard
    deviation sigma (nodes) or sigma' (server) times the public bound, whatever the bases."""
    drawn: list[float] = []

    def record(shape: tuple[int, ...], std: float) -> np.ndarray:
        drawn.append(std)
        return np.zeros(shape)

    monkeypatch.setattr(svd, "draw_noise", record)
    cfg = {**SMALL, "synthetic-users": 30, "protocol": "fedpower", "aggregator": "plain",
           "fedsvd-k": 2, "fedsvd-rank": 3, "fedsvd-iterations": 8, "fedsvd-sync-every": 2,
           "fedsvd-sigma": 0.05, "fedsvd-sigma-server": 0.07, "run-name": "server-choice"}
    with LocalGrid(build_client_app(policy={"allow-plain": True}), NODES) as g:
        run_protocol(g, resolve_config(cfg))
    bound = svd.FEDPOWER_Z_MAX
    assert sorted(set(drawn)) == [0.05 * bound, 0.07 * bound], sorted(set(drawn))
    assert drawn.count(0.07 * bound) == 4 and drawn.count(0.05 * bound) == 4 * NODES


# -- (B) work and the sum record, before any work ---------------------------------------
def test_the_reviews_oversized_sync_is_refused_before_any_work(
        wide_grid: MaliciousGrid, no_work: None) -> None:
    """Rank 1,500 for 10,000 iterations passes memory-budget-mb and max-iterations alone
    (about 45 minutes on a core); the node refuses it, naming max-iterations, before its
    power iterations start. The same rank for two iterations is within the bound."""
    Z = np.zeros((WIDE["synthetic-items"], 1500))
    node = wide_grid.ids[0]
    with pytest.raises(Refused, match="max-iterations") as err:
        wide_grid.ask(node, "fedsvd_sync", _sync(WIDE, Z, t_to=10_000))
    assert "node config" in str(err.value) and SENTINEL not in str(err.value)
    with pytest.raises(Refused, match=SENTINEL):
        wide_grid.ask(node, "fedsvd_sync", _sync(WIDE, Z, t_to=2))


def test_the_work_refusal_depends_on_sizes_the_server_knows_not_on_values(
        wide_grid: MaliciousGrid, no_work: None) -> None:
    """Nodes with equal row counts and different rows refuse the same oversized request in
    the same words (but for their names)."""
    Z = np.zeros((WIDE["synthetic-items"], 1500))
    texts = set()
    for node in wide_grid.ids:
        with pytest.raises(Refused) as err:
            wide_grid.ask(node, "fedsvd_sync", _sync(WIDE, Z, t_to=10_000))
        texts.add(re.sub(r"node \d+ \(partition \d+\)", "node ?", str(err.value)))
    assert len(texts) == 1, texts


@pytest.mark.parametrize(("record", "match"), [
    ({}, "no 'secagg' record"),
    ({"mode": "plain", "sum-id": 1}, "allow-plain"),
    ({"mode": "ckks", "sum-id": 1, "max-abs": 1.0}, "allow-ckks"),
    ({"mode": "secagg+", "sum-id": 1}, "max-abs"),
    ({"mode": "secagg+", "sum-id": 1, "max-abs": float("inf")}, "max-abs|non-finite"),
    ({"mode": "secagg+", "sum-id": 1, "max-abs": 0.0}, "max-abs"),
    ({"mode": "sideways", "sum-id": 1}, "unknown sum mode"),
])
def test_the_sum_record_is_checked_before_any_work(no_work: None, record: dict,
                                                   match: str) -> None:
    Z = np.zeros((SMALL["synthetic-items"], 1))
    with _grid(SMALL, policy={}) as grid, pytest.raises(Refused, match=match) as err:
        grid.ask(grid.ids[0], "fedsvd_sync", _sync(SMALL, Z, sum_record=record))
    assert SENTINEL not in str(err.value)


@pytest.fixture
def ledger_grid(tmp_path: Any) -> Iterator[tuple[MaliciousGrid, Any]]:
    ledger = tmp_path / "dp-ledger.json"
    policy = {"dp-budget": 1e9, "dp-ledger": str(ledger)}  # allow-plain: false (default)
    with _grid(SMALL, policy) as g:
        yield g, ledger


def test_a_refused_plain_sum_spends_no_dp_budget(ledger_grid: tuple[MaliciousGrid, Any],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """fedsvd-privacy in a plain sum is charged to the node's ledger before it computes; a
    node whose policy refuses plain sums refuses before that charge, not after the work."""
    monkeypatch.setattr(svd, "draw_noise", lambda shape, std: np.zeros(shape))
    grid, ledger = ledger_grid
    Z = np.zeros((SMALL["synthetic-items"], 1))
    with pytest.raises(Refused, match="allow-plain"):
        grid.ask(grid.ids[0], "fedsvd_sync", _sync(SMALL, Z, scheme="fedsvd-privacy"))
    spent = [r for e in json.loads(ledger.read_text())["entries"].values()
             for r in e["releases"]] if ledger.exists() else []
    assert spent == []
