"""LP-GCN against a deviating server: the node's virtual-item cover holds whatever the server
sends (run config, assignment, sizes, replays), checked against the production ClientApp
with the default node policy."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from flwr.app import Message, RecordDict

from fedrec.records import array_record, from_array_record, to_array_record
from fedrec.transport.messenger import NodeError
from fl_app.client_app import build_client_app
from fl_app.registry import resolve_config
from fl_app.server_app import run_protocol
from tests.malicious import MaliciousGrid, Refused, copy_content

NODES, LAYERS, DIM = 4, 2, 4
FIRST = 2**63 + 11  # Flower node ids are unsigned 64-bit
#: 48 users x 30 items, every item with a real holder; alpha 2 gives many virtual holdings.
BASE = {"protocol": "lpgcn", "dataset": "synthetic", "synthetic-users": 48,
        "synthetic-items": 30, "synthetic-density": 0.25, "synthetic-popularity-skew": 0.0,
        "seed": 3, "aggregator": "plain", "partition": "shards-random",
        "lpgcn-layers": LAYERS, "lpgcn-dim": DIM, "lpgcn-batch-size": 64, "lpgcn-steps": 2,
        "lpgcn-alpha": 2.0, "run-name": "test-lpgcn-attacks"}
#: The plain aggregator keeps these tests small; it is the sums' business, not the cover's.
PLAIN_SUMS = {"allow-plain": True}


def _grid(rewrite: Callable[[Message], RecordDict | None] | None = None,
          policy: dict[str, Any] | None = None) -> MaliciousGrid:
    app = build_client_app(policy={**PLAIN_SUMS, **(policy or {})})
    return MaliciousGrid(app, NODES, rewrite=rewrite, first_node_id=FIRST)


def _run(rewrite: Callable[[Message], RecordDict | None] | None = None,
         policy: dict[str, Any] | None = None, keep: list[MaliciousGrid] | None = None,
         **extra: Any) -> tuple[dict, MaliciousGrid]:
    """A run against the production ClientApp; ``keep`` gets the grid even if a node refuses
    (what was sent before the refusal is in its log)."""
    grid = _grid(rewrite, policy)
    if keep is not None:
        keep.append(grid)
    with grid:
        return run_protocol(grid, resolve_config({**BASE, **extra})), grid


def _config_rewrite(actions: set[str], nodes: set[int] | None = None,
                    **values: Any) -> Callable[[Message], RecordDict | None]:
    """A server that sends ``values`` in the LP-GCN config of ``actions`` (to ``nodes``)."""
    def rewrite(msg: Message) -> RecordDict | None:
        action = msg.metadata.message_type.removeprefix("query.")
        if action not in actions or (nodes and msg.metadata.dst_node_id not in nodes):
            return None
        content = copy_content(msg.content)
        for key, value in values.items():
            content["protocol"][key] = value
        return content
    return rewrite


def _mail_sent(grid: MaliciousGrid, purpose: str) -> list[int]:
    """Nodes whose replies carried sealed mail of ``purpose``."""
    out = []
    for req, reply in grid.log:
        if reply.has_error() or "relay.out" not in reply.content.config_records:
            continue
        if any(k.endswith(f"|{purpose}") for k in reply.content.config_records["relay.out"]):
            out.append(req.metadata.dst_node_id)
    return out


# -- the cover's parameters ---------------------------------------------------------------------
@pytest.mark.parametrize("alpha", [1e-9, 0.49])
def test_an_alpha_below_the_node_minimum_is_refused(alpha: float) -> None:
    rewrite = _config_rewrite({"lpgcn_holdings"}, alpha=alpha)
    with pytest.raises(NodeError, match=r"refuses LP-GCN with lpgcn-alpha = .*node policy "
                                        r"lpgcn-min-alpha = 0\.5"):
        _run(rewrite)


@pytest.mark.parametrize("scale", [0.0, 1e-4, 0.099])
def test_a_cover_scale_below_the_node_minimum_is_refused(scale: float) -> None:
    with pytest.raises(NodeError, match=r"lpgcn-mask-scale = .*node policy "
                                        r"lpgcn-min-mask-scale = 0\.1 "):
        _run(_config_rewrite({"lpgcn_holdings"}, **{"mask-scale": scale}))


def test_the_operator_can_lower_the_minimums() -> None:
    record, _ = _run(policy={"lpgcn-min-alpha": 0.1, "lpgcn-min-mask-scale": 0.0},
                     **{"lpgcn-alpha": 0.2, "lpgcn-mask-scale": 1e-9, "lpgcn-steps": 1})
    assert len(record["extra"]["losses"]) == 1


@pytest.mark.parametrize("key,value", [("mask-scale", 0.0), ("mask-scale", 2.0),
                                       ("alpha", 4.0)])
def test_the_cover_cannot_change_after_the_virtual_items_were_drawn(key: str,
                                                                    value: float) -> None:
    # a larger value passes the policy minimum, yet changes what the node drew its cover for
    rewrite = _config_rewrite({"lpgcn_round"}, {FIRST + 1}, **{key: value})
    with pytest.raises(NodeError, match=rf"node {FIRST + 1} \(partition 1\) refuses "
                                        "(an )?LP-GCN.*(drawn for|lpgcn-min-mask-scale = )"):
        _run(rewrite)


@pytest.mark.parametrize("action", ["lpgcn_holdings", "lpgcn_assign", "lpgcn_verify"])
def test_setup_requests_are_not_answered_twice(action: str) -> None:
    """A second draw of virtual items differs from the first in the virtual items only; a
    second assignment would mail the verification elsewhere."""
    with _grid() as grid:
        run_protocol(grid, resolve_config({**BASE, "lpgcn-steps": 1}))
        with pytest.raises(Refused, match=rf"refuses a (second|third) {action}"):
            grid.replay(grid.requests(action)[-1])


# -- what the server receives for real and virtual holdings -------------------------------------
def _holdings_rows(grid: MaliciousGrid) -> dict[tuple[int, int], list[np.ndarray]]:
    """Per (node, held position): the gradient rows of layers 1..L of every training step."""
    rows: dict[tuple[int, int], list[np.ndarray]] = {}
    for req, reply in grid.log:
        cfg = req.content.config_records.get("protocol", {})
        if (req.metadata.message_type != "query.lpgcn_round" or not cfg.get("train")
                or reply.has_error() or "arrays" not in reply.content.array_records):
            continue
        got = from_array_record(reply.content["arrays"])
        if not all(f"g{layer}" in got for layer in range(1, LAYERS + 1)):
            continue
        stack = np.stack([got[f"g{layer}"] for layer in range(1, LAYERS + 1)], axis=1)
        for pos, layers in enumerate(stack):
            rows.setdefault((req.metadata.dst_node_id, pos), []).append(layers)
    return rows


def _reviewer_flags(layers: list[np.ndarray]) -> bool:
    """The review's classifier: a holding is virtual if in some step its g1 and g2 rows
    (every layer >= 1) are identical."""
    return any(np.array_equal(x[0], y) for x in layers for y in x[1:])


def _sparse_dataset(tmp_path) -> dict[str, Any]:
    """12 users x 16 items, 4 training items each, every item with >= 2 users: each node's
    users hold about half the catalogue, so it draws virtual items and convolves some."""
    rng = np.random.default_rng(5)
    while True:
        train = [sorted(rng.choice(16, 4, replace=False).tolist()) for _ in range(12)]
        if np.bincount(np.concatenate(train), minlength=16).min() >= 2:
            break
    return _lightgcn_files(tmp_path, train, 16)


def _lightgcn_files(tmp_path, train: list[list[int]], items: int) -> dict[str, Any]:
    """``train`` (items per user) as a LightGCN-format dataset, one test item per user."""
    test = [[i for i in range(items) if i not in r][:1] for r in train]
    folder = tmp_path / "lightgcn"
    folder.mkdir()
    for name, rows in (("train.txt", train), ("test.txt", test)):
        (folder / name).write_text("".join(" ".join(map(str, [u, *r])) + "\n"
                                           for u, r in enumerate(rows)))
    return {"dataset": "lightgcn", "data-dir": str(tmp_path), "partition": "shards-contiguous"}


def test_self_convolved_virtual_holdings_look_like_real_ones(monkeypatch, tmp_path) -> None:
    import clients.lpgcn as node_side

    # the nodes' private draws from a seeded stream: the same virtual items on every run
    rng = np.random.default_rng(5)
    monkeypatch.setattr(node_side, "csprng_uniform", lambda n: rng.random(n))
    _, grid = _run(**{**_sparse_dataset(tmp_path), "lpgcn-steps": 3})
    rows = _holdings_rows(grid)
    self_virtual = flagged_virtual = flagged = 0
    for nid in grid.ids:
        setup = from_array_record(array_record(grid.contexts[nid].state, "lpgcn.setup"))
        own = setup["conv_of"] == np.uint64(nid)
        for pos in np.flatnonzero(own & ~setup["isreal"].astype(bool)):
            self_virtual += 1
            flagged_virtual += _reviewer_flags(rows[nid, pos])
        # and no holding of any kind stands out by it
        flagged += sum(_reviewer_flags(rows[nid, pos]) for pos in range(len(setup["held"])))
    assert self_virtual >= 3  # the run has what the classifier looks for
    assert flagged_virtual == flagged == 0


def _server_view(grid: MaliciousGrid) -> tuple[dict[int, np.ndarray],
                                               dict[tuple[int, int], np.ndarray],
                                               dict[int, np.ndarray]]:
    """What the server holds after a run: each node's held pseudonyms, each node's rows of
    every (step, layer) stacked as (steps x layers, held, d), and per node the sum it formed
    for each of those rows' items (every node's rows and requested negatives' rows added by
    pseudonym: the gradient it sends back)."""
    held: dict[int, np.ndarray] = {}
    rows: dict[tuple[int, int, int], np.ndarray] = {}
    negs: list[tuple[int, int, np.ndarray, np.ndarray]] = []
    asked: dict[tuple[int, int], np.ndarray] = {}
    for req, reply in grid.log:
        nid, kind = req.metadata.dst_node_id, req.metadata.message_type
        if reply.has_error() or "arrays" not in reply.content.array_records:
            continue
        got = from_array_record(reply.content["arrays"])
        if kind == "query.lpgcn_holdings":
            held[nid] = got["held"]
        cfg = req.content.config_records.get("protocol", {})
        if kind != "query.lpgcn_round" or not cfg.get("train"):
            continue
        step = int(cfg["step"])
        if "negreq" in got:
            asked[nid, step] = got["negreq"]
        for name, value in got.items():
            if name[:1] == "g" and name[1:].isdigit():
                rows[nid, step, int(name[1:])] = value
            elif name[:2] == "gn":
                negs.append((nid, step, int(name[2:]), value))
    sums: dict[tuple[int, int], dict[int, np.ndarray]] = {}
    for (nid, step, layer), value in rows.items():
        into = sums.setdefault((step, layer), {})
        for p, row in zip(held[nid].tolist(), value):
            into[p] = into.get(p, 0) + row
    for nid, step, layer, value in negs:
        into = sums.setdefault((step, layer), {})
        for p, row in zip(asked[nid, step].tolist(), value):
            into[p] = into.get(p, 0) + row
    stacked, summed = {}, {}
    for nid in held:
        keys = sorted(k[1:] for k in rows if k[0] == nid)
        stacked[nid] = np.stack([rows[(nid, *k)] for k in keys])
        summed[nid] = np.stack([[sums[k][p] for p in held[nid].tolist()] for k in keys])
    return held, stacked, summed


def _auc(real: np.ndarray, virtual: np.ndarray) -> float:
    """P(a real holding scores above a virtual one), ties half (Mann-Whitney, from ranks)."""
    from scipy.stats import rankdata

    ranks = rankdata(np.concatenate([real, virtual]))[:len(real)]
    return float((ranks.sum() - len(real) * (len(real) + 1) / 2) / (len(real) * len(virtual)))


def magnitude_aucs(grid: MaliciousGrid) -> dict[str, Any]:
    """The reviewer's magnitude classifiers on a finished run (also run by
    ``benchmarks/lpgcn.py --magnitude``): the server's view scored per holding, AUC of real
    against virtual holdings with the labels only the nodes know. A holding's cover count m
    is 1, or at the item's convolution node the other holders' covers it takes off (the
    server knows both from the assignment); a sole holder is real, and the server knows it,
    so it is left out. Also the rms of real holdings' rows at non-convolution holders (the
    partials themselves when the cover scale is 0) and of the published sums."""
    held, rows, sums = _server_view(grid)
    holders: dict[int, int] = {}
    for pseudonyms in held.values():
        for p in pseudonyms.tolist():
            holders[p] = holders.get(p, 0) + 1
    scores: dict[str, list[np.ndarray]] = {"second moment": [], "largest coordinate": [],
                                           "projection on the sum": []}
    labels, real_rows, sum_rows = [], [], []
    for nid in grid.ids:
        setup = from_array_record(array_record(grid.contexts[nid].state, "lpgcn.setup"))
        conv = setup["conv_of"] == np.uint64(nid)
        m = np.where(conv, np.array([holders[p] for p in held[nid].tolist()]) - 1, 1)
        keep = m > 0
        isreal = setup["isreal"].astype(bool)
        real_rows.append(rows[nid][:, isreal & ~conv].ravel())
        sum_rows.append(sums[nid][:, isreal].ravel())
        X, G = rows[nid][:, keep], sums[nid][:, keep]
        m = m[keep].astype(float)
        norm = np.linalg.norm(G, axis=-1)
        unit = np.divide(G, norm[..., None], out=np.zeros_like(G), where=norm[..., None] > 0)
        scores["second moment"].append((X ** 2).sum(-1).mean(0) / m)
        scores["largest coordinate"].append(np.abs(X).max(axis=(0, 2)) / np.sqrt(m))
        scores["projection on the sum"].append((X * unit).sum(-1).sum(0)
                                               / np.sqrt(m * len(X)))
        labels.append(isreal[keep])
    real = np.concatenate(labels)
    rms = lambda parts: float(np.sqrt(np.mean(np.concatenate(parts) ** 2)))  # noqa: E731
    return {"auc": {name: _auc(np.concatenate(s)[real], np.concatenate(s)[~real])
                    for name, s in scores.items()},
            "real": int(real.sum()), "virtual": int((~real).sum()),
            "real_row_rms": rms(real_rows), "sum_rms": rms(sum_rows)}


def test_the_cover_hides_virtual_holdings_by_magnitude_at_the_defaults(monkeypatch,
                                                                       tmp_path) -> None:
    """The reviewer's magnitude classifiers, from the server's view only, at the default
    cover scale and node policy. A holding's rows are partial + cover (real) or cover alone
    (virtual; + direct terms if a held negative); the server knows each holding's cover
    count m (1, or at the item's convolution node the other holders' covers it takes off)
    and the sum of every item's rows. Scores per holding over all steps and layers: mean
    squared row norm / m, largest coordinate / sqrt(m), and the rows' projection on the
    item's published sum / sqrt(m). A cover that hides gives each an AUC within 4 standard
    deviations of 0.5 under "no signal" (Mann-Whitney: sqrt((n1 + n2 + 1) / (12 n1 n2)));
    with covers near the partials (~3e-4 here) they separate: at scale 1e-4, AUC 0.82-0.86,
    0.72-0.83 and 0.85-0.86 (3 runs).
    """
    import clients.lpgcn as node_side

    rng = np.random.default_rng(7)  # the nodes' private draws: the same virtual items each run
    monkeypatch.setattr(node_side, "csprng_uniform", lambda n: rng.random(n))
    # 32 users x 32 items, 3 training items each, every item held by >= 2 users (each item
    # dealt twice, then random): 4 nodes of 8 users each hold about half the catalogue
    # really and draw most of the other half as virtual items
    deal = np.random.default_rng(7)
    while True:
        slots = np.concatenate([np.repeat(np.arange(32), 2), deal.integers(0, 32, 32)])
        train = deal.permutation(slots).reshape(32, 3)
        if all(len(set(r)) == 3 for r in train.tolist()):
            break
    data = _lightgcn_files(tmp_path, [sorted(r) for r in train.tolist()], 32)
    base = {k: v for k, v in BASE.items() if k != "lpgcn-mask-scale"}
    with _grid() as grid:  # default node policy; default lpgcn-mask-scale
        run_protocol(grid, resolve_config({**base, **data, "lpgcn-steps": 4}))
    got = magnitude_aucs(grid)
    n1, n2 = got["real"], got["virtual"]
    assert n1 >= 30 and n2 >= 30  # enough of both for the bound below to mean something
    sd = np.sqrt((n1 + n2 + 1) / (12 * n1 * n2))
    assert all(abs(a - 0.5) <= 4 * sd for a in got["auc"].values()), (
        got["auc"], f"bound 0.5 +- {4 * sd:.3f}")


# -- structure: holder counts and co-holding, across nodes and across runs -----------------------
def link_items(grid: MaliciousGrid) -> dict[int, int]:
    """The server's map from a run's pseudonyms to item ids, whatever S was: a convolution
    node's first upload of the run is its items' initial rows, and the server draws every
    id's initial row itself from the public seed streams (``init_rows``) and matches them.
    Runs are therefore joinable item by item, so a cover must not rely on fresh pseudonyms."""
    from fedrec.recsys.lightgcn import init_rows

    held: dict[int, np.ndarray] = {}
    mine: dict[int, np.ndarray] = {}
    first: dict[int, np.ndarray] = {}
    cfg: dict[str, Any] = {}
    for req, reply in grid.log:
        nid, kind = req.metadata.dst_node_id, req.metadata.message_type
        if reply.has_error():
            continue
        if kind == "query.lpgcn_holdings":
            held[nid] = from_array_record(reply.content["arrays"])["held"]
        elif kind == "query.lpgcn_assign":
            conv_of = from_array_record(req.content["arrays"])["conv_of"]
            mine[nid] = held[nid][conv_of == np.uint64(nid)]
        elif (kind == "query.lpgcn_round" and nid not in first
              and "arrays" in reply.content.array_records):
            got = from_array_record(reply.content["arrays"])
            if "e0" in got:
                first[nid], cfg = got["e0"], dict(req.content.config_records["protocol"])
    pseudonyms = np.concatenate([mine[n] for n in first])
    rows = np.concatenate([first[n] for n in first]).astype(np.float64)
    m = len(np.unique(np.concatenate(list(held.values()))))
    table = init_rows(np.arange(m), int(cfg["dim"]), int(cfg["seed"]), "V",
                      float(cfg["init-std"]), np.dtype(str(cfg["dtype"])))
    dist = ((rows ** 2).sum(1)[:, None] - 2 * rows @ table.T.astype(np.float64)
            + (table.astype(np.float64) ** 2).sum(1)[None, :])
    return dict(zip(pseudonyms.tolist(), np.argmin(dist, axis=1).tolist()))


def _co_holding(holds: np.ndarray) -> np.ndarray:
    """Per (node, item): the mean Jaccard similarity of the item's other holders with the
    other holders of each other item the node holds (a node's real items follow its users'
    tastes, and so do other nodes' real items; sampled virtual items follow nothing)."""
    n_nodes, m = holds.shape
    out = np.zeros(holds.shape)
    for n in range(n_nodes):
        rest = np.delete(holds, n, axis=0).astype(np.int64)
        inter = rest.T @ rest
        size = rest.sum(0)
        union = size[:, None] + size[None, :] - inter
        jac = np.divide(inter, union, out=np.ones(inter.shape), where=union > 0)
        mask = holds[n].astype(float)
        np.fill_diagonal(jac, 0.0)
        out[n] = (jac @ mask) / max(mask.sum() - 1, 1)
    return out


def structure_attack(grids: list[MaliciousGrid]) -> dict[str, Any]:
    """The structural attacker over runs of the same nodes on the same data, from the
    server's view only (held pseudonyms, the assignment and the first item rows, which
    join the runs: :func:`link_items`), scored with the labels only the nodes know.

    Per run, per holding: the item's holder count (an item one node holds is that node's
    real item, since a run refuses an item without a real holder: *named*), and its
    co-holding pattern (:func:`_co_holding`). Across runs, per (node, item): the number of
    runs in which the node held it (real items are held every run) and whether any run
    named it. AUCs of real against virtual holdings for "fewer holders", "co-holding" and
    "runs held"; 0.5 is a coin, ``sd`` its standard deviation without signal."""
    per_run, labels, names = [], [], {}
    held_pairs: dict[tuple[int, int], int] = {}
    real_pairs: set[tuple[int, int]] = set()
    for grid in grids:
        link = link_items(grid)
        nodes = sorted(grid.ids)
        m = len(link)
        holds = np.zeros((len(nodes), m), dtype=bool)
        real = np.zeros((len(nodes), m), dtype=bool)
        for k, nid in enumerate(nodes):
            setup = from_array_record(array_record(grid.contexts[nid].state, "lpgcn.setup"))
            items = np.array([link[p] for p in setup["held"].tolist()], dtype=np.int64)
            holds[k, items] = True
            real[k, items[setup["isreal"].astype(bool)]] = True
        count = holds.sum(0)
        co = _co_holding(holds)
        for k, i in zip(*np.nonzero(holds)):
            pair = (nodes[k], int(i))
            held_pairs[pair] = held_pairs.get(pair, 0) + 1
            names[pair] = names.get(pair, False) or bool(count[i] == 1)
            if real[k, i]:
                real_pairs.add(pair)
            per_run.append((1.0 / count[i], co[k, i]))
            labels.append(bool(real[k, i]))
    lab, scores = np.array(labels), np.array(per_run)
    pairs = sorted(held_pairs)
    pair_real = np.array([p in real_pairs for p in pairs])
    runs_held = np.array([held_pairs[p] for p in pairs], dtype=float)

    def auc_sd(score: np.ndarray, is_real: np.ndarray) -> tuple[float, float]:
        n1, n2 = int(is_real.sum()), int((~is_real).sum())
        return _auc(score[is_real], score[~is_real]), float(np.sqrt((n1 + n2 + 1)
                                                                    / (12 * n1 * n2)))

    aucs = {"fewer holders": auc_sd(scores[:, 0], lab), "co-holding": auc_sd(scores[:, 1], lab),
            "runs held": auc_sd(runs_held, pair_real)}
    named = [p for p in pairs if names[p]]
    return {"runs": len(grids), "real": int(pair_real.sum()), "virtual": int((~pair_real).sum()),
            "named": len(named), "named_wrong": sum(p not in real_pairs for p in named),
            "auc": {k: v[0] for k, v in aucs.items()}, "sd": {k: v[1] for k, v in aucs.items()}}


def _sparse_catalogue(tmp_path, users: int = 36, items: int = 120,
                      per_user: int = 4) -> dict[str, Any]:
    """``users`` x ``items``, ``per_user`` training items each, every item dealt at least
    once: three nodes of 12 users really hold ~40% of the catalogue, many items at one node."""
    deal = np.random.default_rng(11)
    while True:
        slots = np.concatenate([np.arange(items),
                                deal.integers(0, items, users * per_user - items)])
        train = deal.permutation(slots).reshape(users, per_user)
        if all(len(set(r)) == per_user for r in train.tolist()):
            break
    return _lightgcn_files(tmp_path, [sorted(r) for r in train.tolist()], items)


def _two_runs(tmp_path, policy: dict[str, Any] | None = None, runs: int = 2,
              **extra: Any) -> list[MaliciousGrid]:
    """Two runs of the same three nodes on the same data (new S, new draws each run)."""
    data = _sparse_catalogue(tmp_path)
    cfg = {**BASE, **data, "lpgcn-alpha": 1.0, "lpgcn-steps": 1, **extra}
    grids = []
    for run in range(runs):
        app = build_client_app(policy={**PLAIN_SUMS, **(policy or {})})
        with MaliciousGrid(app, 3, first_node_id=FIRST) as grid:
            run_protocol(grid, resolve_config({**cfg, "run-name": f"structure-{run}"}))
        grids.append(grid)
    return grids


def test_runs_are_joined_item_by_item_through_the_initial_rows(tmp_path) -> None:
    """The attacker's premise: fresh pseudonyms per run do not keep runs apart."""
    grid = _two_runs(tmp_path, runs=1)[0]
    link = link_items(grid)
    nid = grid.ids[0]
    setup = from_array_record(array_record(grid.contexts[nid].state, "lpgcn.setup"))
    truth = {int(p): i for i, p in enumerate(setup["pseudo_all"].tolist())}
    assert link == truth


def test_no_holder_count_or_co_holding_pattern_names_a_real_holding_at_the_defaults(
        tmp_path) -> None:
    """Default node policy and run config (every node holds the catalogue): over two runs
    of three nodes the structural attacker names no holding and scores at a coin."""
    got = structure_attack(_two_runs(tmp_path))
    assert got["named"] == 0, got
    assert all(abs(a - 0.5) <= 4 * got["sd"][k] for k, a in got["auc"].items()), got
    assert got["real"] >= 100 and got["virtual"] >= 100, got  # the bound means something


def test_the_structural_attacker_names_sampled_holdings(tmp_path) -> None:
    """The paper's sampled virtual items (the nodes' opt-in): an item one node holds is its
    real item, named with no error, and the runs' fresh draws give the real items away."""
    got = structure_attack(_two_runs(tmp_path, {"allow-sampled-holdings": True},
                                     **{"lpgcn-holdings": "sampled"}))
    assert got["named"] >= 20 and got["named_wrong"] == 0, got
    assert got["auc"]["runs held"] > 0.5 + 4 * got["sd"]["runs held"], got
    assert got["auc"]["fewer holders"] > 0.5 + 4 * got["sd"]["fewer holders"], got


def test_sampled_holdings_need_the_nodes_opt_in(tmp_path) -> None:
    with pytest.raises(NodeError, match=r"refuses LP-GCN with sampled virtual items.*"
                                        r"allow-sampled-holdings=false"):
        _run(**{"lpgcn-holdings": "sampled", "lpgcn-steps": 1})


def test_the_holdings_mode_cannot_change_after_the_draw() -> None:
    rewrite = _config_rewrite({"lpgcn_round"}, {FIRST + 1}, holdings="sampled")
    with pytest.raises(NodeError, match=rf"node {FIRST + 1} \(partition 1\) refuses an LP-GCN "
                                        r"request .*lpgcn-holdings = sampled: its virtual items "
                                        r"were drawn for .*catalogue"):
        _run(rewrite, policy={"allow-sampled-holdings": True})


# -- the convolution assignment -----------------------------------------------------------------
def _assign_rewrite(victims: set[int], conv: int) -> Callable[[Message], RecordDict | None]:
    """A server that assigns every item of ``victims`` to node ``conv`` (its colluder)."""
    def rewrite(msg: Message) -> RecordDict | None:
        if (msg.metadata.message_type != "query.lpgcn_assign"
                or msg.metadata.dst_node_id not in victims):
            return None
        content = copy_content(msg.content)
        held = len(from_array_record(content["arrays"])["conv_of"])
        arrays = {"conv_of": np.full(held, conv, np.uint64)}
        if msg.metadata.dst_node_id == conv:  # the colluder: one holder list per item
            arrays.update(hold_ptr=np.arange(held + 1, dtype=np.int64),
                          hold_nodes=np.full(held, conv, np.uint64))
        content["arrays"] = to_array_record(arrays)
        return content
    return rewrite


@pytest.mark.parametrize("victims", ["one", "all"])
def test_an_assignment_to_one_node_sends_it_no_verification(victims: str) -> None:
    colluder = FIRST + 3
    targets = {FIRST} if victims == "one" else {FIRST + k for k in range(NODES)}
    grids: list[MaliciousGrid] = []
    # a victim refuses its colluder's missing confirmation; when the colluder runs this
    # node code too ("all"), its own lists, naming only itself under catalogue holdings,
    # are refused first (tests/test_server_choice_refusals.py)
    with pytest.raises(NodeError, match=r"refuses the convolution assignment: (node \d+ does "
                                        "not confirm|under catalogue holdings)"):
        _run(_assign_rewrite(targets, colluder), keep=grids)
    # nothing about which holdings are real left a victim; a node the server left alone may
    # have sent its counts to convolution nodes that confirmed its own, honest assignment
    # (whether such a node exists depends on the run's random pseudonyms)
    assert not set(_mail_sent(grids[0], "lpgcn-verify")) & targets


def test_a_holder_list_without_the_convolution_node_is_refused() -> None:
    def rewrite(msg: Message) -> RecordDict | None:
        if msg.metadata.message_type != "query.lpgcn_assign":
            return None
        got = from_array_record(msg.content["arrays"])
        if "hold_nodes" not in got:
            return None
        me, other = msg.metadata.dst_node_id, msg.metadata.dst_node_id ^ 1
        got["hold_nodes"] = np.where(got["hold_nodes"] == me, other, got["hold_nodes"])
        content = copy_content(msg.content)
        content["arrays"] = to_array_record(got)
        return content
    with pytest.raises(NodeError, match="holder lists must name this node once"):
        _run(rewrite)


# -- sizes ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("action,key,value", [("lpgcn_holdings", "dim", 5000),
                                              ("lpgcn_round", "layers", 2000),
                                              ("lpgcn_losses", "steps", 10**6)])
def test_server_chosen_sizes_are_bounded_by_the_memory_budget(action: str, key: str,
                                                              value: int) -> None:
    with pytest.raises(NodeError, match="memory-budget-mb=1"):
        _run(_config_rewrite({action}, **{key: value}), policy={"memory-budget-mb": 1})
