"""LP-GCN (paper 001): the federated run equals centralized LightGCN / LightGCN+ (float64,
5 steps, every step's loss and every layer-0 row), the server never receives a user row, an
item id or S, and bad input stops the run with a clear error."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import pytest
import scipy.sparse as sp

from clients.lpgcn import stored_params
from datasets import DatasetSpec, load_dataset
from fedrec.recsys.lightgcn import LightGCN, inv_sqrt
from fedrec.transport.messenger import NodeError
from fl_app.client_app import build_client_app
from fl_app.registry import resolve_config
from fl_app.server_app import run_protocol
from strategies.lpgcn import LPGCN, LosslessRunError
from tests.localgrid import LocalGrid

NODES, STEPS, LAYERS, DIM = 5, 5, 3, 8
PLAIN_OK = {"allow-plain": True}
#: 60 users x 45 items, every item and user with >= 2 training interactions (checked below).
BASE = {"protocol": "lpgcn", "dataset": "synthetic", "synthetic-users": 60,
        "synthetic-items": 45, "synthetic-density": 0.25, "synthetic-popularity-skew": 0.0,
        "seed": 1, "aggregator": "plain", "partition": "shards-random", "lpgcn-layers": LAYERS,
        "lpgcn-dim": DIM, "lpgcn-lr": 0.05, "lpgcn-reg": 1e-2, "lpgcn-batch-size": 128,
        "lpgcn-steps": STEPS, "lpgcn-alpha": 1.0, "run-name": "test-lpgcn"}


class RecordingGrid(LocalGrid):
    """LocalGrid that keeps every reply the server pulls (what the server received), and can
    silence one node after a number of requests (a node dropping mid-run)."""

    def __init__(self, *args: Any, drop_after: tuple[int, int] | None = None, **kw: Any):
        super().__init__(*args, **kw)
        self.received: list[Any] = []
        self.drop_after = drop_after
        self.seen: dict[int, int] = {}

    def push_messages(self, messages: Iterable[Any]) -> Iterable[str]:
        messages = list(messages)
        if self.drop_after is not None:
            node, after = self.drop_after
            for m in messages:
                if m.metadata.dst_node_id == node:
                    self.seen[node] = self.seen.get(node, 0) + 1
                    if self.seen[node] > after:
                        self.silent.add(node)
        return super().push_messages(messages)

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Any]:
        out = list(super().pull_messages(message_ids))
        self.received.extend(m.content for m in out if not m.has_error())
        return out


def _run(extra: dict[str, Any], policy: dict[str, Any] | None = None,
         **grid_kw: Any) -> tuple[dict[str, Any], RecordingGrid]:
    cfg = resolve_config({**BASE, **extra})
    # Flower's node ids are unsigned 64-bit: ids above 2**63 catch int64 node-id arrays
    grid_kw.setdefault("first_node_id", 2**63 + 11)
    app = build_client_app(policy=PLAIN_OK if policy is None else policy)
    with RecordingGrid(app, grid_kw.pop("nodes", NODES), **grid_kw) as grid:
        return run_protocol(grid, cfg), grid


@pytest.fixture(scope="module")
def data():
    d = load_dataset(DatasetSpec.from_config(BASE))
    assert d.train.getnnz(axis=0).min() >= 2 and d.train.getnnz(axis=1).min() >= 2
    return d


@pytest.fixture(scope="module", params=["lightgcn", "lightgcn+"])
def runs(request, data) -> dict[str, Any]:
    """The federated run, its grid, and the centralized run with the forward of every step."""
    extra = {"lpgcn-backbone": request.param}
    record, grid = _run(extra)
    ref = LPGCN(resolve_config({**BASE, **extra})).reference_model(data.train)
    forwards = []
    for _ in range(STEPS):
        forwards.append(ref.forward()[0])
        ref.step()
    forwards.append(ref.forward()[0])
    return {"backbone": request.param, "record": record, "grid": grid, "ref": ref,
            "user_layers": forwards}


def test_federated_equals_centralized(runs) -> None:
    # 1e-10: both sides do the same float64 operations; only the order of additions differs
    # (per node, then over nodes; cover values of std 1 added and taken off: ~1e-16 absolute
    # per addition), carried by Adam (lr 0.05) over 5 steps; measured
    # 3e-12 at the default cover scale 1 (9e-11 at 10; 3e-16 at 1e-4). A wrong edge, degree
    # or triple moves values by ~1e-3.
    record, ref, grid = runs["record"], runs["ref"], runs["grid"]
    np.testing.assert_allclose(record["extra"]["losses"], ref.losses, rtol=0, atol=1e-10)
    seen_users, seen_items = set(), set()
    for nid in grid.ids:
        p = stored_params(grid.contexts[nid].state)
        if "U" in p:
            np.testing.assert_allclose(p["U"], ref.U[p["user_ids"]], rtol=0, atol=1e-10)
            seen_users.update(p["user_ids"].tolist())
        if len(p["conv_real"]):
            np.testing.assert_allclose(p["V"], ref.V[p["conv_real"]], rtol=0, atol=1e-10)
            if runs["backbone"] == "lightgcn+":
                np.testing.assert_allclose(p["W"], ref.W[p["conv_real"]], rtol=0, atol=1e-10)
            seen_items.update(p["conv_real"].tolist())
    assert seen_items == set(range(ref.R.shape[1]))  # every item has one convolution node
    if runs["backbone"] == "lightgcn":
        assert seen_users == set(range(ref.R.shape[0]))
    uf, vf = ref.final_embeddings()
    from fedrec.recsys.metrics import evaluate_ranking

    data = load_dataset(DatasetSpec.from_config(BASE))
    central = evaluate_ranking(lambda r: uf[r] @ vf.T, data.train, data.test, k=20).means()
    for key in ("recall@20", "ndcg@20"):
        assert record["metrics"][key] == pytest.approx(central[key], abs=1e-10)


def test_rounds_per_step_within_2L_plus_2(runs) -> None:
    rounds = runs["record"]["extra"]["rounds_per_step"]
    expected = LAYERS + 1 + -(-(LAYERS + 1) // 2) + (2 if runs["backbone"] == "lightgcn+" else 0)
    assert max(rounds) == expected <= 2 * LAYERS + 2
    phases = runs["record"]["communication"]["phases"]
    assert phases["lpgcn-train"]["rounds"] == sum(rounds)


def _arrays(content) -> Iterable[tuple[str, np.ndarray]]:
    for rname, record in content.array_records.items():
        for name, arr in record.items():
            yield f"{rname}.{name}", arr.numpy()


def test_server_never_receives_user_rows_item_ids_or_the_key(runs, data) -> None:
    grid, record = runs["grid"], runs["record"]
    from clients.relay_node import get_shared_secret

    secrets = {get_shared_secret(grid.contexts[n].state, "lpgcn-S") for n in grid.ids}
    assert len(secrets) == 1
    S = secrets.pop()
    # every user row of every layer of every step, raw and pre-scaled by 1/sqrt(d_u)
    inv_du = inv_sqrt(data.train.getnnz(axis=1))
    users = np.concatenate([np.concatenate([u, inv_du[:, None] * u]) for layers in
                            runs["user_layers"] for u in layers])
    users = users[np.linalg.norm(users, axis=1) > 1e-12]
    integer_arrays = float_rows = 0
    for content in grid.received:
        for name, rec in content.config_records.items():
            for key, value in rec.items():
                blobs = value if isinstance(value, list) else [value]
                for b in blobs:
                    assert not (isinstance(b, bytes) and S in b), f"S in {name}.{key}"
        for name, x in _arrays(content):
            assert S not in x.tobytes(), f"S inside {name}"
            if np.issubdtype(x.dtype, np.integer):
                integer_arrays += 1
                # pseudonyms only (>= 2^62): never an item id, a user id or a count
                assert x.size == 0 or int(x.min()) >= 1 << 62, name
            elif x.dtype == np.float64 and x.ndim >= 1 and x.shape[-1] == DIM:
                rows = x.reshape(-1, DIM)
                float_rows += len(rows)
                sq = ((rows ** 2).sum(1)[:, None] + (users ** 2).sum(1)[None, :]
                      - 2 * rows @ users.T)
                assert sq.min() > 1e-14, f"a user row in {name}"
    assert integer_arrays >= 2 * NODES and float_rows > 1000  # the check saw real traffic
    # the relay: endpoints and sizes only; the ledger: LP-GCN rounds carry arrays, a status
    # and sealed mail, nothing else
    privacy = record["privacy"]
    assert privacy["sealed_mail"]["lpgcn-verify"]["payloads"] > 0
    train = privacy["received"]["lpgcn-train"]["records"]
    assert set(train) <= {"arrays", "lpgcn-status", "relay.out"}
    assert train["relay.out"]["form"] == "sealed"


def _txt_dataset(tmp_path, train_rows: list[list[int]], test_rows: list[list[int]]) -> dict:
    folder = tmp_path / "lightgcn"
    folder.mkdir()
    for name, rows in (("train.txt", train_rows), ("test.txt", test_rows)):
        (folder / name).write_text("".join(" ".join(map(str, [u, *r])) + "\n"
                                           for u, r in enumerate(rows)))
    return {"dataset": "lightgcn", "data-dir": str(tmp_path), "partition": "shards-contiguous",
            "lpgcn-steps": 1}


def test_a_node_whose_users_have_no_items_is_refused(tmp_path) -> None:
    rng = np.random.default_rng(0)
    train = [sorted(rng.choice(8, 3, replace=False).tolist()) for _ in range(4)] + [[], []]
    test = [[i for i in range(8) if i not in r][:1] for r in train]
    with pytest.raises(NodeError, match="none of its 2 user.s. has a training interaction"):
        _run(_txt_dataset(tmp_path, train, test), nodes=3)


def test_an_item_without_a_training_interaction_trains_as_centralized(tmp_path) -> None:
    """Item 6 has no training interaction: every node holds it virtually (catalogue
    holdings) and its convolution node finds degree 0. No node refuses it (whether it did
    would answer whether the listed holders' users hold the item); the run equals
    centralized LightGCN, where such an item has zero rows at layers >= 1 and moves by
    negative-sampling gradients only. Held by no node at all (alpha = 0: no virtual items),
    the server refuses it: no node could convolve it."""
    train = [[0, 1, 2], [1, 2, 3], [0, 3, 4], [2, 4, 5], [0, 5, 1], [3, 4, 5]]
    test = [[6], [6], [5], [1], [2], [0]]
    cfg = {**_txt_dataset(tmp_path, train, test), "lpgcn-steps": 3}
    data = load_dataset(DatasetSpec.from_config({**BASE, **cfg}))
    assert data.train.shape[1] == 7 and data.train.getnnz(axis=0)[6] == 0
    record, grid = _run(cfg, nodes=3)
    ref = LPGCN(resolve_config({**BASE, **cfg})).reference_model(data.train)
    for _ in range(3):
        ref.step()
    np.testing.assert_allclose(record["extra"]["losses"], ref.losses, rtol=0, atol=1e-10)
    rows = [stored_params(grid.contexts[n].state) for n in grid.ids]
    conv = next(p for p in rows if 6 in p["conv_real"])
    np.testing.assert_allclose(conv["V"][list(conv["conv_real"]).index(6)], ref.V[6],
                               rtol=0, atol=1e-10)
    with pytest.raises(LosslessRunError, match="1 of 7 catalogue items are held by no node"):
        _run({**cfg, "lpgcn-alpha": 0.0}, nodes=3)


@pytest.mark.usefixtures("server_skips_policy_check")
def test_alpha_zero_needs_the_nodes_opt_in(data) -> None:
    with pytest.raises(NodeError, match="allow-plain=false"):
        _run({"lpgcn-alpha": 0.0, "aggregator": "secagg+", "lpgcn-steps": 1}, policy={})


def test_a_node_dropping_mid_step_stops_the_run_naming_it() -> None:
    victim = 2**63 + 12  # the second node (the grid's ids start at 2**63 + 11)
    with pytest.raises(LosslessRunError, match=rf"did not answer 'lpgcn_round'.*node {victim}.*"
                                               r"no longer equal centralized training"):
        _run({"timeout": 1.0}, drop_after=(victim, 12))


def test_centralized_reference_gradient_step_matches_torch() -> None:
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    R = sp.csr_matrix((rng.random((30, 20)) < 0.2).astype(float))
    for backbone in ("lightgcn", "lightgcn+"):
        m = LightGCN(R, dim=4, layers=2, lr=0.01, reg=1e-2, batch_size=16, seed=1,
                     backbone=backbone)
        A = torch.tensor((sp.diags(m.inv_du) @ m.R @ sp.diags(m.inv_di)).toarray())
        V = torch.tensor(m.V.copy(), requires_grad=True)
        P = torch.tensor((m.W if m.plus else m.U).copy(), requires_grad=True)
        U0 = torch.tensor(m.inv_du)[:, None] * (torch.tensor(m.R.toarray()) @ P) if m.plus \
            else P
        us, its = [U0], [V]
        for _ in range(2):
            us.append(A @ its[-1])
            its.append(A.T @ us[-2])
        uf, vf = sum(us) / 3, sum(its) / 3
        u, i, j = (torch.tensor(x) for x in m.batch(0))
        x = (uf[u] * (vf[j] - vf[i])).sum(1)
        loss = (torch.nn.functional.softplus(x).sum() + 0.5e-2 * (
            (U0[u] ** 2).sum() + (V[i] ** 2).sum() + (V[j] ** 2).sum())) / 16
        opt = torch.optim.Adam([V, P], lr=0.01)
        opt.zero_grad()
        loss.backward()
        opt.step()
        assert m.step() == pytest.approx(loss.item(), abs=1e-14)
        np.testing.assert_allclose(m.V, V.detach().numpy(), rtol=0, atol=1e-14)
        np.testing.assert_allclose(m.W if m.plus else m.U, P.detach().numpy(), rtol=0,
                                   atol=1e-14)


def test_flower_simulation_smoke_with_secure_sums(data) -> None:
    """A real Flower simulation (Ray) with SecAgg+ sums: same losses and metrics."""
    from fl_app.simulation import run_in_simulation

    cfg = {**BASE, "aggregator": "secagg+", "lpgcn-steps": 2, "lpgcn-layers": 2,
           "run-name": "test-lpgcn-sim"}
    record = run_in_simulation(cfg, num_nodes=4, quiet=True)
    ref = LPGCN(resolve_config(cfg)).reference_model(data.train).fit(2)
    # SecAgg+ sums in fixed point: the per-step losses within its resolution
    np.testing.assert_allclose(record["extra"]["losses"], ref.losses, rtol=0, atol=1e-9)
    assert {s["form"] for s in record["privacy"]["sums"]} == {"masked"}
    assert record["extra"]["rounds_per_step"] == [3 + 2] * 2


def test_the_wire_names_parse_back_exactly_and_nothing_else() -> None:
    """Each part of a round travels under one name both sides read with ``wire.parse``; a
    per-layer part needs its layer, a plain part refuses one, and a prefix is no match
    (``gn1`` is never a ``g`` part, ``negreq`` never ``neg``)."""
    from fedrec.wire import lpgcn as wire
    from fedrec.wire.lpgcn import Part

    for part in Part:
        layers = [0, 3, 12] if part in wire.LAYERED else [None]
        for layer in layers:
            assert wire.parse(wire.name(part, layer)) == (part, layer)
    for bad in ["g", "gn", "e", "e-1", "w0", "neg1", "negreq2", "x1", "G1", "g1x", ""]:
        with pytest.raises(wire.WireError, match="unknown LP-GCN array"):
            wire.parse(bad)
    with pytest.raises(wire.WireError, match="needs a layer"):
        wire.name(Part.ITEM_GRAD)
    with pytest.raises(wire.WireError, match="has no layer"):
        wire.name(Part.W, 1)


def test_a_node_refuses_a_delivery_the_protocol_does_not_send_it() -> None:
    """A part only nodes send (or an unknown name), a layer past the model's or a delivery of
    another shape than the node's held items, convolution items or requested negatives
    give it, is refused by name."""
    from types import SimpleNamespace

    from clients.lpgcn import LosslessnessError, Session

    step = Session.__new__(Session)
    step.node, step.cur, step.flags = type("N", (), {"who": "node 7"})(), {}, {"step": 0}
    step.hp, step.L, step.setup, step.conv_hpos = (SimpleNamespace(dim=2), 2,
                                                   {"held": np.zeros(3)}, [0])
    step.cur["negreal"] = np.zeros(1)
    for name in ["gn0", "negreq", "x1", "e3"]:
        with pytest.raises(LosslessnessError, match="node 7"):
            step.absorb({name: np.zeros((3, 2))})
    for name, shape in [("e1", (2, 2)), ("g0", (3, 2)), ("neg", (1, 2, 2)), ("w", (0, 2))]:
        with pytest.raises(LosslessnessError, match=f"node 7: LP-GCN array '{name}' has shape"):
            step.absorb({name: np.zeros(shape)})
    step.absorb({"e1": np.ones((3, 2)), "g2": np.ones((3, 2)), "g0": np.ones((1, 2)),
                 "w": np.ones((3, 2)), "neg": np.ones((1, 3, 2))})
    assert sorted(step.cur) == ["ei1", "gsum0", "gsum2", "neg", "negreal", "w_held"]


# -- a warm start: continuing a training run from the operators' checkpoints -----------------
@pytest.mark.parametrize("backbone", ["lightgcn", "lightgcn+"])
def test_a_run_continued_from_a_checkpoint_equals_centralized_training(tmp_path, data,
                                                                       backbone) -> None:
    """Nodes that start at step 7 from a centralized checkpoint (their operators' node config
    ``lpgcn-init``) take the centralized run's next steps exactly: late steps, not only the
    first ones, are lossless."""
    extra = {"lpgcn-backbone": backbone}
    ref = LPGCN(resolve_config({**BASE, **extra})).reference_model(data.train)
    ref.fit(7)  # across an epoch boundary (5 batches per epoch)
    path = tmp_path / "ck.npz"
    np.savez(path, **ref.state_arrays())
    configs = {i: {"lpgcn-init": str(path)} for i in range(NODES)}
    record, grid = _run({**extra, "lpgcn-start-step": 7, "lpgcn-steps": 4},
                        node_configs=configs)
    ref.fit(4)
    np.testing.assert_allclose(record["extra"]["losses"], ref.losses[7:], rtol=0, atol=1e-10)
    assert [row["step"] for row in record["history"]][:4] == [7, 8, 9, 10]
    for nid in grid.ids:
        p = stored_params(grid.contexts[nid].state)
        if len(p["conv_real"]):
            np.testing.assert_allclose(p["V"], ref.V[p["conv_real"]], rtol=0, atol=1e-10)
        if "U" in p:
            np.testing.assert_allclose(p["U"], ref.U[p["user_ids"]], rtol=0, atol=1e-10)


def test_a_continued_run_needs_each_operators_checkpoint_at_that_step(tmp_path, data) -> None:
    with pytest.raises(NodeError, match="named no checkpoint to start from"):
        _run({"lpgcn-start-step": 3, "lpgcn-steps": 1})
    ref = LPGCN(resolve_config(BASE)).reference_model(data.train)
    ref.fit(2)
    path = tmp_path / "ck.npz"
    np.savez(path, **ref.state_arrays())
    with pytest.raises(NodeError, match="checkpoint .* is at step 2, the run starts at step 3"):
        _run({"lpgcn-start-step": 3, "lpgcn-steps": 1},
             node_configs={i: {"lpgcn-init": str(path)} for i in range(NODES)})
