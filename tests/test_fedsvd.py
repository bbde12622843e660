"""Federated SVD (paper 002): the three schemes over real Flower messages (the project's
ClientApp on an in-process grid) against the centralized eigenspace and the in-process
arithmetic the benchmark uses; the noise removal; what the server and the nodes see; the
DP accounting; bad input."""

from __future__ import annotations

import math

import numpy as np
import pytest

from datasets import DatasetSpec, PartitionSpec, load_dataset, partition_users
from fedrec.config import ConfigError
from fedrec.recsys import power_svd as svd
from fl_app.client_app import build_client_app
from fl_app.registry import resolve_config
from fl_app.server_app import run_protocol
from tests.localgrid import LocalGrid

NODES = 3
#: 60 users x 30 items, latent rank 2: top eigenvalues of M' 2.39, 0.72, 0.47, 0.34
DATA = {"dataset": "synthetic", "synthetic-users": 60, "synthetic-items": 30, "seed": 1,
        "synthetic-rank": 2, "synthetic-density": 0.3, "synthetic-clusters": 2,
        "synthetic-popularity-skew": 0.0,
        "partition": "row-blocks", "run-name": "test-fedsvd"}
EXACT = {**DATA, "fedsvd-k": 2, "fedsvd-sync-every": 1, "fedsvd-sigma": 0.0,
         "fedsvd-sigma-server": 0.0, "fedsvd-z-hat": 1.0}
#: fedsvd-privacy's nodes charge Theorem 2 for every iteration whatever carries it: a budget
#: that covers the runs here (tests/test_fedsvd_accounting.py checks the refusals).
POLICY = {"allow-plain": True, "allow-noise-removal": True, "dp-budget": 1e9}


def run(overrides: dict, policy: dict | None = None, nodes: int = NODES):
    """The protocol over the project's ClientApp; returns (record, grid)."""
    cfg = resolve_config(overrides)
    with LocalGrid(build_client_app(policy=POLICY if policy is None else policy),
                   nodes) as grid:
        return run_protocol(grid, cfg), grid


def blocks(overrides: dict, nodes: int = NODES) -> list:
    cfg = resolve_config(overrides)
    data = load_dataset(DatasetSpec.from_config(cfg))
    parts = partition_users(data, PartitionSpec.from_config(cfg, nodes))
    return [data.train[p] for p in parts]


def truth(k: int) -> np.ndarray:
    return svd.true_eigenspace(load_dataset(DatasetSpec.from_config(resolve_config(DATA))).train,
                               k)[0]


def known_noise(shape: tuple[int, ...], std: float) -> np.ndarray:
    """Known 'noise': std times a fixed pattern (the same for every call)."""
    return std * np.cos(np.arange(math.prod(shape), dtype=np.float64)).reshape(shape)


# -- convergence without noise -------------------------------------------------------------
@pytest.mark.parametrize(("protocol", "aggregator", "k", "T"), [
    ("fedpower", "plain", 2, 45), ("fedsvd-privacy", "plain", 2, 45),
    ("fedsvd-utility", "secagg+", 1, 16)])
def test_zero_noise_converges_to_the_centralized_eigenspace(protocol, aggregator, k, T):
    # The span of the first k columns converges at lambda_{k+1} / lambda_k per iteration:
    # 0.66 (k = 2) and 0.30 (k = 1; fewer SecAgg+ rounds). p = 1: local iterations bias
    # FedPower even without noise (Guo et al.'s bound grows with p and heterogeneity).
    record, _ = run({**EXACT, "protocol": protocol, "aggregator": aggregator,
                     "fedsvd-k": k, "fedsvd-rank": k, "fedsvd-iterations": T})
    dist = svd.distances(record["extra"]["Z_bar"], truth(k))
    assert dist["subspace"] < 1e-6, dist
    assert len(record["history"]) == T


# -- the Flower protocol equals the in-process arithmetic ----------------------------------
@pytest.mark.parametrize("protocol", ["fedpower", "fedsvd-privacy"])
def test_flower_run_equals_in_process_run_bit_for_bit(protocol, monkeypatch):
    monkeypatch.setattr(svd, "draw_noise", known_noise)
    cfg = {**DATA, "protocol": protocol, "aggregator": "plain", "fedsvd-k": 2,
           "fedsvd-rank": 3, "fedsvd-iterations": 7, "fedsvd-sync-every": 2,
           "fedsvd-sigma": 0.05, "fedsvd-sigma-server": 0.05, "fedsvd-z-hat": 0.5}
    # plain sums release fedsvd-privacy's noisy updates outside a secure sum: charged
    record, _ = run(cfg, policy={**POLICY, "dp-budget": 1e4})
    params = svd.params_from_config(resolve_config(cfg))
    local = svd.run_in_process(protocol, blocks(cfg), params, noise=known_noise)
    # T = 7, p = 2: three synchronizations, then the output rule's last block
    assert [h["t"] for h in record["history"]] == [2, 4, 6]
    np.testing.assert_array_equal(record["extra"]["Z_bar"], local.Z_bar)


def test_noise_removal_leaves_exactly_one_nodes_noise(monkeypatch):
    """T = p = 1: Y'' = sum_i w_i M'_i Z_0 + w_j N for exactly one j (SecAgg+ and CKKS add
    ~1e-9); the in-process run with the same kept node agrees."""
    monkeypatch.setattr(svd, "draw_noise", known_noise)
    cfg = {**DATA, "protocol": "fedsvd-utility", "fedsvd-k": 2, "fedsvd-rank": 3,
           "fedsvd-iterations": 1, "fedsvd-sync-every": 1, "fedsvd-sigma": 0.5}
    record, grid = run(cfg)
    params = svd.params_from_config(resolve_config(cfg))
    parts = blocks(cfg)
    s = sum(b.shape[0] for b in parts)
    Z0 = svd.initial_basis(30, 3, params.seed)
    clean = sum((b.shape[0] / s) * svd.gram_product(b, Z0) @ svd.procrustes(Z0, Z0)
                for b in parts)
    pattern = known_noise(clean.shape, 0.5)
    residual = record["extra"]["Y"] - clean
    share = float(np.sum(residual * pattern) / np.sum(pattern * pattern))
    weights = [b.shape[0] / s for b in parts]
    assert min(abs(share - w) for w in weights) < 1e-6, (share, weights)
    np.testing.assert_allclose(residual, share * pattern, atol=1e-6)
    # what the nodes received in the noise-removal round: one ciphertext each, no index
    he_msgs = [m for m in grid.pushed if m.metadata.message_type.endswith("noise_product")]
    assert len(he_msgs) == NODES
    import tenseal as ts

    from fedrec.secure.he import load_context
    records = [m.content.config_records["fedsvd-he"] for m in he_msgs]
    assert {tuple(sorted(r.keys())) for r in records} == {("public-context", "selection", "t")}
    assert len({bytes(r["public-context"]) for r in records}) == 1  # the same for everyone
    assert len({len(bytes(r["selection"])) for r in records}) == 1
    ctx = load_context(bytes(records[0]["public-context"]))
    assert not ctx.has_secret_key()
    from fedrec.secure.he import unpad_ciphertext
    with pytest.raises(Exception):  # a node cannot open its selection value
        ts.ckks_vector_from(ctx, unpad_ciphertext(bytes(records[0]["selection"]))).decrypt()


def test_server_saw_updates_masked_and_noise_products_encrypted(monkeypatch):
    from fedrec.secure.selection import NodeSelection

    monkeypatch.setattr(svd, "draw_noise", known_noise)
    loads = []
    original = NodeSelection.load.__func__
    monkeypatch.setattr(NodeSelection, "load",
                        classmethod(lambda cls, public: loads.append(1) or original(cls, public)))
    record, _ = run({**DATA, "protocol": "fedsvd-utility", "fedsvd-k": 2, "fedsvd-rank": 3,
                     "fedsvd-iterations": 2, "fedsvd-sync-every": 1})
    # two noise removals x 3 nodes, one public context: checked once for the run (the
    # in-process nodes share the checked public context)
    assert len(loads) == 1
    received = record["privacy"]["received"]
    assert received["sync"]["records"]["secagg.values"]["form"] == "masked"
    assert received["noise-removal"]["records"]["fedsvd-he"]["form"] == "encrypted"
    plain = {(phase, name) for phase, r in received.items() for name, rec in r["records"].items()
             if rec["form"] == "plain" and phase in ("sync", "noise-removal")}
    # in clear: the layout and the digest of the request answered (the server sent it)
    assert plain <= {("sync", "secagg.shapes"), ("sync", "secagg.bound")}, plain
    assert [v["t"] for v in record["privacy"]["fedsvd"]["noise-removal"]] == [1, 2]
    assert "kept" not in str(record["privacy"]["fedsvd"])


def test_selection_sums_products_and_a_node_checks_the_context():
    """sum_i b_i v_i from one decryption (flooding and CKKS: < 1e-7); the kept node's own
    product decrypts to flooding only; a node loads a context once per run and hash,
    checks a different one again, and refuses a secret or foreign context."""
    from types import SimpleNamespace

    from flwr.app import RecordDict

    from clients.fedsvd import _selection_context
    from fedrec.secure import he, selection

    ctx = selection.make_context()
    public = selection.public_context_bytes(ctx)
    node = SimpleNamespace(context=SimpleNamespace(run_id=77), state=RecordDict(),
                           who="node 1")
    checked = _selection_context(node, public)
    assert _selection_context(node, public) is checked  # cached for this run and hash
    rng = np.random.default_rng(3)
    values = [rng.normal(0, 0.01, 9000) for _ in range(3)]  # 2 ciphertexts each
    acc, alone = selection.ProductSum(ctx, 9000), selection.ProductSum(ctx, 9000)
    for bit, v in zip((0, 1, 1), values):
        products = checked.product(selection.selection_ciphertext(ctx, bit), v)
        assert len(products) == 2
        acc.add(products)
        if bit == 0:
            alone.add(products)
    np.testing.assert_allclose(acc.decrypt(), values[1] + values[2], atol=1e-7, rtol=0)
    assert np.abs(alone.decrypt()).max() <= 1.01 * selection.flood_width()
    other = selection.public_context_bytes(selection.make_context())
    assert _selection_context(node, other) is not checked  # another key: checked again
    with pytest.raises(ValueError, match="must be public"):
        _selection_context(node, he.secret_context_bytes(ctx))
    with pytest.raises(ValueError, match="expected CKKS parameters"):
        _selection_context(node, he.public_context_bytes(he.make_secret_context()))
    with pytest.raises(ValueError, match="within"):
        checked.product(selection.selection_ciphertext(ctx, 1), np.full(3, 100.0))


# -- the node's policy ----------------------------------------------------------------------
@pytest.mark.usefixtures("server_skips_policy_check")
def test_node_refuses_noise_removal_without_its_opt_in():
    with pytest.raises(Exception, match="allow-noise-removal"):
        run({**EXACT, "protocol": "fedsvd-utility", "fedsvd-rank": 3, "fedsvd-iterations": 1},
            policy={})


def test_dp_charged_by_the_node_sums_to_the_accounted_epsilon(tmp_path):
    from clients.policy import _DP_SPENT

    cfg = {**DATA, "protocol": "fedsvd-privacy", "aggregator": "plain", "fedsvd-k": 2,
           "fedsvd-rank": 2, "fedsvd-iterations": 3, "fedsvd-sync-every": 1,
           "fedsvd-sigma": 2.0}
    record, grid = run(cfg, policy={"allow-plain": True, "dp-budget": 5.0})
    dp = record["privacy"]["dp"]
    assert dp["epsilon"] == pytest.approx(3 * dp["epsilon_per_iteration"], rel=1e-12)
    for ctx in grid.contexts.values():
        assert float(ctx.state.config_records[_DP_SPENT]["epsilon"]) == \
            pytest.approx(dp["epsilon"], rel=1e-12)
    with pytest.raises(Exception, match="dp-budget"):  # a fresh ledger, one iteration more
        run({**cfg, "fedsvd-iterations": 4}, policy={
            "allow-plain": True, "dp-budget": dp["epsilon"],
            "dp-ledger": str(tmp_path / "fresh.json")})


# -- a server that declares other parameters than the node uses ------------------------------
PRIVATE = {**DATA, "protocol": "fedsvd-privacy", "aggregator": "plain", "fedsvd-k": 2,
           "fedsvd-rank": 2, "fedsvd-iterations": 1, "fedsvd-sync-every": 1,
           "fedsvd-sigma": 2.0}


@pytest.fixture
def attacked(tmp_path, monkeypatch):
    """An honest fedsvd-privacy run on a MaliciousGrid (zero 'noise', so a reply shows the
    signal), then ``attack(changes, Z=None) -> (reply values, charge, node rows)`` replays
    its first sync request with the config ``changes`` (and basis ``Z``)."""
    import json
    import time

    from flwr.app import ArrayRecord

    from fedrec.records import from_array_record, to_array_record
    from fedrec.wire.sums import VALUES_KEY
    from tests.malicious import MaliciousGrid, copy_content

    monkeypatch.setattr(svd, "draw_noise", lambda shape, std: np.zeros(shape))
    ledger = tmp_path / "ledger.json"
    policy = {"allow-plain": True, "dp-budget": 1e12, "dp-ledger": str(ledger),
              "memory-budget-mb": 1}
    grid = MaliciousGrid(build_client_app(policy=policy), NODES)
    grid.__enter__()
    run_protocol(grid, resolve_config(PRIVATE))
    request = grid.requests("fedsvd_sync")[0]
    pid = int(grid.contexts[request.metadata.dst_node_id].node_config["partition-id"])
    rows = blocks(PRIVATE)[pid]

    def charged_since(start: float) -> float:
        entries = json.loads(ledger.read_text())["entries"].values()
        return sum(float(r["epsilon"]) for e in entries for r in e["releases"]
                   if r["time"] >= start)

    def attack(changes: dict, Z: np.ndarray | None = None):
        content = copy_content(request.content)
        content["protocol"] = content["protocol"].copy()
        content["protocol"].update(changes)
        if Z is not None:
            content["arrays"] = to_array_record({"Z": Z})
        start = time.time()
        reply = grid.replay(request, content)
        assert isinstance(reply[VALUES_KEY], ArrayRecord)
        return from_array_record(reply[VALUES_KEY])["v"], charged_since(start), rows

    yield attack
    grid.__exit__(None, None, None)


def test_a_declared_tiny_z_hat_cannot_release_a_large_basis_cheaply(attacked):
    """A server that declares z-hat = 2e-7 and rank 1 but sends a large 5-column Z: the node
    clips Z to the declared bound (so the release is what the charge covers) and charges by
    the 5 columns it multiplies, not the declared rank."""
    big = 1000.0 * np.ones((30, 5))
    values, charge, rows = attacked({"fedsvd-z-hat": 2e-7, "fedsvd-rank": 1}, big)
    params = svd.SvdParams(r=1, z_hat=2e-7, sigma=2.0)
    honest = svd.release_epsilon(params, 2.0, 5, 1)
    assert charge == pytest.approx(honest, rel=1e-12)
    assert charge > svd.release_epsilon(params, 2.0, 1, 1)  # the declared rank's charge
    weight = rows.shape[0] / 60.0
    # the node's value on the grid of its noise (power_svd.on_noise_grid), noise zero here
    expected = weight * svd.on_noise_grid(svd.gram_product(rows, svd.clip_entries(big, 2e-7)),
                                          2.0)
    np.testing.assert_allclose(values, expected.ravel(), rtol=1e-12, atol=0)


@pytest.mark.parametrize("delta", [1.0, 2.0, 0.0, -1e-5, float("nan")])
def test_delta_outside_the_unit_interval_is_refused_clearly(attacked, delta):
    from tests.malicious import Refused

    # NaN is refused where the request enters the node (clients/boundary.py), naming the field
    with pytest.raises(Refused, match=r"fedsvd-delta must be in \(0, 1\)|field "
                                      r"'protocol\.fedsvd-delta' holds non-finite") as err:
        attacked({"fedsvd-delta": delta})
    assert "partition" in str(err.value)


@pytest.mark.parametrize(("key", "value"), [("fedsvd-z-hat", float("inf")),
                                            ("fedsvd-z-hat", 0.0),
                                            ("fedsvd-m-hat", float("nan")),
                                            ("fedsvd-sigma", float("inf"))])
def test_non_finite_bounds_are_refused_clearly(attacked, key, value):
    from tests.malicious import Refused

    with pytest.raises(Refused, match=rf"{key} must be finite|field 'protocol\.{key}' holds "
                                      "non-finite values"):
        attacked({key: value})


def test_m_hat_is_a_clip_not_a_data_dependent_refusal(attacked):
    """Any declared m-hat is answered (no bit about the data), and the release is within it:
    entries of the clipped M'_i are at most m_hat, so |M'_i Z| <= d m_hat max|Z|."""
    for m_hat in (1e-6, 0.05, 10.0):
        values, _, rows = attacked({"fedsvd-m-hat": m_hat})
        weight = rows.shape[0] / 60.0
        assert np.abs(values).max() <= weight * 30 * m_hat * 1.0 * (1 + 1e-9)
    assert svd.max_gram_entry(svd.clip_gram(rows, 0.05)) <= 0.05 * (1 + 1e-12)
    exact = svd.max_gram_entry(rows)
    assert svd.clip_gram(rows, exact) is rows  # data within the bound: unchanged


def test_server_chosen_rank_is_bounded_by_the_memory_budget(attacked):
    from tests.malicious import Refused

    with pytest.raises(Refused, match="memory-budget-mb"):
        attacked({}, np.zeros((30, 5000)))


# -- accounting -----------------------------------------------------------------------------
def test_theorem2_with_the_papers_values():
    """sqrt(8 r ln(1.25/delta)) m_hat z_hat / sigma with r = 10, m_hat = 0.05, z_hat = 0.2,
    delta = 1e-5, sigma = 0.1 (a standard deviation): 3.064, a tenth of the paper's 30.6."""
    p = svd.SvdParams(m_hat=0.05, z_hat=0.2, sigma=0.1)
    assert svd.theorem2_epsilon(p, 0.1) == pytest.approx(3.0642, abs=1e-4)
    acc = svd.accounting("fedsvd-privacy", p, 100, 10)
    assert acc["epsilon"] == pytest.approx(92 * 3.0642, abs=1e-2)
    assert acc["total_delta"] == pytest.approx(92e-5)
    assert acc["epsilon_rdp"] is not None and acc["epsilon_rdp"] > 0
    ddp = svd.accounting("fedsvd-privacy", svd.SvdParams(m_hat=0.05, ddp=True), 100, 10)
    assert ddp["node_sigma"] == pytest.approx(0.01)
    assert svd.accounting("fedsvd-utility", p, 100, 10)["epsilon"] is None
    assert svd.accounting("fedpower", p, 100, 10)["valid"] is False


# -- bad input ------------------------------------------------------------------------------
@pytest.mark.parametrize(("extra", "match"), [
    ({"fedsvd-k": 31, "fedsvd-rank": 31}, "number of columns d = 30"),
    ({"fedsvd-k": 3, "fedsvd-rank": 2}, "k = 3 <= r"),
    ({"fedsvd-min-rows": 21}, "fewer than fedsvd-min-rows = 21"),
    ({"fedsvd-epsilon": 10.0, "fedsvd-sigma": 0.1}, "cannot meet fedsvd-epsilon"),
])
def test_bad_input_fails_before_any_protocol_message(extra, match):
    with pytest.raises(ConfigError, match=match):
        run({**DATA, "protocol": "fedsvd-privacy", "aggregator": "plain", **extra})


def test_utility_refuses_a_plain_aggregator_and_nodes_clip_entries_over_m_hat():
    with pytest.raises(ConfigError, match="secure aggregator"):
        run({**DATA, "protocol": "fedsvd-utility", "aggregator": "plain"})
    record, _ = run({**EXACT, "protocol": "fedpower", "aggregator": "plain",
                     "fedsvd-m-hat": 0.05, "fedsvd-rank": 2, "fedsvd-iterations": 1})
    assert record["metrics"]


def test_the_sparse_true_eigenspace_equals_the_dense_one(monkeypatch) -> None:
    """Large d (Yelp2018's 38,048 items) takes the sparse SVD path; it must give the dense
    eigendecomposition's basis, eigenvalues and signs."""
    import scipy.sparse as sp

    from fedrec.recsys import power_svd

    M = sp.random(400, 250, density=0.05, format="csr", random_state=3)
    V_dense, w_dense = power_svd.true_eigenspace(M, 6)
    monkeypatch.setattr(power_svd, "DENSE_EIGH_MAX_D", 10)
    V_sparse, w_sparse = power_svd.true_eigenspace(M, 6)
    # measured 1e-16 on the eigenvalues and 3.5e-14 on the vectors (ARPACK at tol = 0 against
    # LAPACK); a wrong scaling, order or sign is off by O(1)
    np.testing.assert_allclose(w_sparse, w_dense, rtol=1e-10, atol=1e-14)
    np.testing.assert_allclose(V_sparse, V_dense, atol=1e-9)
