"""A server that asks for more than the node allows is refused; no oracles in production;
replies checked; dropouts recorded; PriviRec stops when its node set changes; secret
randomness from a CSPRNG. Fast: every run is on the in-process grid with the real ClientApp.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flwr.app import ConfigRecord, RecordDict

from clients.policy import NodePolicy, PolicyError
from fedrec.secure.fixedpoint import FixedPoint
from fedrec.secure.secagg import SecAggError
from fedrec.transport.aggregators import PlainAggregator
from fedrec.transport.messenger import Messenger, NodeError
from fedrec.transport.secagg_server import SecureAggregator
from fedrec.wire.sums import SHAPES_KEY, VALUES_KEY, AggregationError
from fl_app.client_app import build_client_app
from fl_app.registry import resolve_config
from strategies.privirec import NodeSetChanged, PriviRec, PriviRecK, check_fixed_node_set
from tests.localgrid import LocalGrid
from tests.simutil import DIAGNOSTIC_APP, diag_request

REPO = Path(__file__).resolve().parents[1]
TINY = {"dataset": "synthetic", "synthetic-users": 48, "synthetic-items": 30, "seed": 1,
        "partition": "shards-contiguous"}


def _privirec_cfg(**over: Any) -> dict[str, Any]:
    return resolve_config({**TINY, "protocol": "privirec-k", "privirec-k": 6,
                           "privirec-filter-rank": 3, "privirec-filters": "gf-cf",
                           "privirec-L": 1, **over})


def _run_privirec(cfg: dict[str, Any], policy: dict | None = None,
                  node_configs: dict | None = None, timeout: float = 30.0) -> dict:
    app = build_client_app(policy=policy or {})
    with LocalGrid(app, 3, node_configs=node_configs) as grid:
        messenger = Messenger(grid, timeout=timeout)
        cls = PriviRec if cfg["protocol"] == "privirec" else PriviRecK
        strategy = cls(cfg)
        outcome = strategy.execute(messenger)
        return {"outcome": outcome, "privacy": messenger.privacy_report()}


# -- 1. node-side policy -----------------------------------------------------------------
def test_default_policy_is_the_safe_one() -> None:
    policy = NodePolicy()
    assert not (policy.allow_plain or policy.allow_ckks or policy.allow_seeded_omega
                or policy.allow_sparse_transport or policy.diagnostics)
    assert policy.dp_budget == 0.0


@pytest.mark.usefixtures("server_skips_policy_check")
def test_a_plain_sum_request_is_refused_by_a_node_that_does_not_allow_plain() -> None:
    with pytest.raises(NodeError) as err:
        _run_privirec(_privirec_cfg(aggregator="plain"))
    text = str(err.value)
    assert "refuses a plain sum (mode 'plain'" in text
    assert "allow-plain=false" in text and "policy: allow-plain=false" in text
    assert "privirec_degrees" in text and "node 100" in text


@pytest.mark.usefixtures("server_skips_policy_check")
def test_seeded_omega_is_refused_without_the_operators_opt_in() -> None:
    with pytest.raises(NodeError) as err:
        _run_privirec(_privirec_cfg(**{"privirec-omega": "seeded"}))
    text = str(err.value)
    assert "refuses PriviRec omega 'seeded'" in text and "allow-seeded-omega=false" in text


@pytest.mark.usefixtures("server_skips_policy_check")
def test_sparse_transport_is_refused_even_when_plain_sums_are_allowed() -> None:
    cfg = resolve_config({**TINY, "protocol": "privirec", "aggregator": "plain",
                          "privirec-rank": 4, "privirec-filter-rank": 3,
                          "privirec-filters": "gf-cf", "privirec-L": 1})
    with pytest.raises(NodeError) as err:
        _run_privirec(cfg, policy={"allow-plain": True})
    text = str(err.value)
    assert "refuses PriviRec transport 'sparse'" in text
    assert "allow-sparse-transport=false" in text and "allow-plain=true" in text


@pytest.mark.usefixtures("server_skips_policy_check")
def test_node_config_opts_in_per_node_and_the_results_record_each_policy() -> None:
    # Two nodes opt in to plain sums by their node config; the third does not: refused.
    opted = {"allow-plain": "true"}
    with pytest.raises(NodeError, match=r"node 1003 \(partition 2\) refuses a plain sum"):
        _run_privirec(_privirec_cfg(aggregator="plain"), node_configs={0: opted, 1: opted})
    out = _run_privirec(_privirec_cfg(aggregator="plain"),
                        node_configs={i: opted for i in range(3)})
    privacy = out["privacy"]
    assert len(privacy["nodes_allowing_plain"]) == 3
    assert all(p["allow-plain"] is True and p["allow-seeded-omega"] is False
               for p in privacy["node_policies"].values())
    assert {s["form"] for s in privacy["sums"]} == {"plain"}


def test_policy_parsing_refuses_misspelt_keys() -> None:
    with pytest.raises(ValueError, match="unknown node policy key 'allow-plian'"):
        NodePolicy().merged({"allow-plian": True}, "node 7 config")
    with pytest.raises(ValueError, match="must be true or false"):
        NodePolicy.parse("allow-plain=maybe")
    assert NodePolicy.parse("allow-plain=true, dp-budget=2").allow_plain
    with pytest.raises(ValueError, match="unknown key"):
        build_client_app(policy={"allow-everything": True})


def test_dp_budget_is_spent_and_capped_by_the_node() -> None:
    from fedrec.dp import PrivacyLedger

    def release(epsilon: float) -> PrivacyLedger:
        ledger = PrivacyLedger()
        ledger.record("prototype release", "laplace", epsilon, sensitivity=1.0)
        return ledger

    state = RecordDict()
    policy = NodePolicy(dp_budget=1.0)
    assert policy.charge_dp(state, release(0.6), "prototype release", "node 1") == \
        pytest.approx(0.6)
    with pytest.raises(PolicyError, match=r"epsilon 0.5 on top of 0.6 spent exceeds its node "
                                          r"policy dp-budget=1"):
        policy.charge_dp(state, release(0.5), "prototype release", "node 1")
    with pytest.raises(PolicyError, match="dp-budget=0"):
        NodePolicy().charge_dp(RecordDict(), release(0.1), "a release", "node 1")


# -- 2. no oracles in production -----------------------------------------------------------
#: Every action the production ClientApp answers, with why it is not an oracle (reviewed).
#: A new action must be added here by hand, after the same review.
PRODUCTION_ACTIONS = {
    "query.hello": "public facts (role, sizes) and the node's own policy",
    "query.relay_keys": "publishes a fresh X25519 public key, signed by the node over its "
                        "own key, run and node id (nothing server-chosen is signed)",
    "query.secagg_advertise": "publishes a fresh X25519 public key (and, asked, a fresh mail "
                              "key as relay_keys does), each signed as relay_keys",
    "query.secagg_share": "Shamir-shares fresh random seeds, sealed to neighbours",
    "query.secagg_unmask": "reveals shares/keys of one sum under the refusal rules",
    "query.secagg_confirm": "signs the survivor/dropped split of the node's own latest sum, "
                            "once, only inside its committed node set; data-independent",
    "query.keys_create_secret": "creates a fresh secret, sealed to peers; returns a hash",
    "query.keys_receive_secret": "stores a sealed secret; returns its hash",
    "query.nodeset_commit": "commits to one node set per run and signs it (node ids the "
                            "server lists, checked: distinct, this node in, >= min-survivors; "
                            "data-independent)",
    "query.aggregate_decrypt": "CKKS decrypter: opens once each sum it contributed to, "
                               "summed by itself from >= min-survivors signed contributions "
                               "(residual risk in docs/threat-model.md)",
    "query.mvmf_train": "MVMF user gradients summed over the node's users (a sum contribution)",
    "query.mvmf_evaluate": "metric sums of the node's users (a sum contribution)",
    "query.mvmf_item_gradient": "item server only: sum_d f(j,d) in clear (item features are "
                                "public in paper 004)",
    "query.mvmf_item_cold": "item server only: its new items' eq. 17 factors in clear",
    "query.privirec_degrees": "a sum contribution (SecAgg+ unless the node allows more)",
    "query.privirec_gram": "a sum contribution; sparse transport needs the node's opt-in",
    "query.privirec_power": "a sum contribution; seeded Omega needs the node's opt-in",
    "query.privirec_evaluate": "metric sums of the node's users (a sum contribution)",
    "query.fedmf_train": "local BPR on the node's users; item deltas as a sum contribution",
    "query.fedmf_evaluate": "metric sums of the node's users (a sum contribution)",
    "query.fedsvd_sync": "local power iterations; the noisy update as a sum contribution "
                         "(charged to dp-budget for fedsvd-privacy, whatever the aggregator)",
    "query.fedsvd_noise_product": "own noise times the server's encrypted selection value; "
                                  "needs allow-noise-removal, once per sync, masked sums only",
    "query.fedsvd_output": "output rule: the aligned local basis as a sum contribution",
    "query.fedsvd_evaluate": "metric sums of the node's users (a sum contribution)",
    "query.lpgcn_count": "the node's number of training interactions (a sum contribution)",
    "query.lpgcn_holdings": "pseudonyms under S of held items: the whole catalogue, or "
                            "real and virtual mixed with the node's allow-sampled-holdings; "
                            "alpha 0 needs the node's allow-plain",
    "query.lpgcn_assign": "learns convolution nodes; a convolution node mails its holders "
                          "sealed confirmations of the items it convolves",
    "query.lpgcn_verify": "first: mails confirmed convolution nodes sealed per-item real-user "
                          "counts; then: true degrees, mailed back sealed",
    "query.lpgcn_round": "item rows and item-gradient partials (covers on items another node "
                         "convolves) in "
                         "clear, user rows only sealed to convolution nodes",
    "query.lpgcn_evaluate": "metric sums of the node's users (a sum contribution)",
    "query.lpgcn_losses": "the node's loss share per step (a sum contribution)",
    "query.dpp_prototypes": "an epsilon-DP release of k prototypes, charged to the node's "
                            "dp-budget; refused below k users",
    "query.dpp_evaluate": "fits the silo's user factors locally; metric sums (a sum "
                          "contribution)",
    "query.dpfedmf_train": "the node's clipped item update (zeros unless its own Poisson "
                           "draw takes it) with its distributed discrete Gaussian share, "
                           "masked; charged to its dp-budget, refused below dp-min-noise",
    "query.dpfedmf_evaluate": "metric sums of the node's users (a sum contribution)",
    "query.dpsvd_count": "the node's user's row scaled to L2 norm <= 1 with its distributed "
                         "discrete Gaussian share, masked; charged to its dp-budget, refused "
                         "below dp-min-noise or without a noise record",
    "query.dpsvd_iterate": "a_S (a_S^T X) for the run's pinned items S and the server's X, "
                           "clipped to L2 1 by the sum layer, with its noise share, masked; "
                           "charged like the count",
    "query.dpsvd_evaluate": "metric sums of the node's users (a sum contribution)",
    "train.default": "stock Flower train (fedmf): item factors in clear, only with the node's "
                     "allow-plain opt-in",
    "evaluate.default": "stock Flower evaluate (fedmf): means of the node's own users' metrics",
}
#: Forbidden: decrypts, signs or MACs what the server sends.
ORACLES = ("query.keys_prove", "query.keys_ckks_selftest", "query.diag_secure_sum")


def test_the_production_client_app_has_only_reviewed_actions_and_no_oracle() -> None:
    """Import the production app in a fresh process (nothing a test registered leaks in)."""
    code = ("import fl_app.client_app as c; "
            "print('\\n'.join(c.registered_actions(c.app)))")
    env = {k: v for k, v in os.environ.items()
           if k not in ("FEDREC_NODE_POLICY", "FEDREC_CLIENT_MODULES")}
    env["PYTHONPATH"] = str(REPO)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=str(REPO), env=env).stdout.split()
    assert set(out) == set(PRODUCTION_ACTIONS), (
        f"unreviewed: {sorted(set(out) - set(PRODUCTION_ACTIONS))}; "
        f"gone: {sorted(set(PRODUCTION_ACTIONS) - set(out))}")
    assert not set(out) & set(ORACLES)


def test_diagnostics_only_on_an_explicit_opt_in() -> None:
    from fl_app.client_app import registered_actions

    assert not set(registered_actions(build_client_app(policy={}))) & set(ORACLES)
    assert set(ORACLES) <= set(registered_actions(build_client_app(["clients.diagnostics"],
                                                                   policy={})))
    assert set(ORACLES) <= set(registered_actions(build_client_app(
        policy={"diagnostics": True})))


def test_the_decrypter_refuses_sums_it_did_not_contribute_to() -> None:
    from fedrec.transport.aggregators import CkksAggregator

    with LocalGrid(build_client_app(**DIAGNOSTIC_APP), 3) as grid:
        messenger = Messenger(grid, timeout=60)
        ckks = CkksAggregator(messenger, messenger.node_ids(), seed=0)
        ckks.setup()
        chunks, layout = ckks.sum_encrypted("diag_secure_sum",
                                            diag_request(3, {"v": (5,)}), max_abs=10.0)
        ckks.decrypt(chunks, layout, phase="ok")
        with pytest.raises(NodeError, match="refuses to decrypt sum 1"):
            ckks.decrypt(chunks, layout, phase="twice")
        ckks.sum_id += 1  # a sum id nobody encrypted for
        with pytest.raises(NodeError, match="refuses to decrypt sum 2"):
            ckks.decrypt(chunks, layout, phase="unknown")


def test_ckks_sums_need_the_nodes_opt_in() -> None:
    from fedrec.transport.aggregators import CkksAggregator

    app = build_client_app(["clients.diagnostics"], policy={})
    with LocalGrid(app, 3) as grid:
        messenger = Messenger(grid, timeout=60)
        ckks = CkksAggregator(messenger, messenger.node_ids(), seed=0)
        ckks.setup()
        with pytest.raises(NodeError, match=r"refuses a CKKS sum .* allow-ckks=false"):
            ckks.sum("diag_secure_sum", diag_request(3, {"v": (5,)}), max_abs=10.0)


# -- 3. validated replies ---------------------------------------------------------------------
def _tampered_sum(kind: str, tamper: Any) -> str:
    """Run one sum whose replies pass through ``tamper(node, reply)``; the error text."""
    with LocalGrid(build_client_app(**DIAGNOSTIC_APP), 3) as grid:
        messenger = Messenger(grid, timeout=10)
        nodes = messenger.node_ids()
        victim = nodes[1]
        orig = messenger.exchange

        def exchange(messages, **kw):
            for node, reply in orig(messages, **kw):
                if node == victim and not reply.has_error() and \
                        messages[0].metadata.message_type == "query.diag_secure_sum":
                    tamper(reply.content)
                yield node, reply

        messenger.exchange = exchange
        agg = PlainAggregator(messenger, nodes) if kind == "plain" else \
            SecureAggregator(messenger, nodes)
        agg.setup()
        with pytest.raises(AggregationError) as err:
            agg.sum("diag_secure_sum", diag_request(4, {"a": (3, 2), "b": (4,)}), max_abs=10.0)
        return f"{victim}|{err.value}"


def _short(content: RecordDict) -> None:
    from fedrec.records import to_array_record

    values = content.array_records[VALUES_KEY]["v"].numpy()
    content[VALUES_KEY] = to_array_record({"v": values[:1].copy()})


def _drop_values(content: RecordDict) -> None:
    del content[VALUES_KEY]


def _bad_shape(content: RecordDict) -> None:
    content[SHAPES_KEY] = ConfigRecord({"a": [3, 2], "b": [5]})


@pytest.mark.parametrize("kind", ["plain", "secagg+"])
def test_malformed_replies_are_errors_naming_node_and_field(kind: str) -> None:
    victim, text = _tampered_sum(kind, _short).split("|", 1)
    assert f"node {victim}" in text and "field 'secagg.values.v' has shape (1,)" in text
    # a masked reply also carries the one-value clip flag (clients.sums_node.clipped_into_range)
    assert f"need ({10 + (kind == 'secagg+')},)" in text
    victim, text = _tampered_sum(kind, _drop_values).split("|", 1)
    assert f"node {victim} answered a sum without field 'secagg.values.v'" in text
    victim, text = _tampered_sum(kind, _bad_shape).split("|", 1)
    assert f"node {victim} sent arrays" in text


def test_a_wrong_dtype_is_refused() -> None:
    from fedrec.records import to_array_record

    def as_float(content: RecordDict) -> None:
        v = content.array_records[VALUES_KEY]["v"].numpy()
        content[VALUES_KEY] = to_array_record({"v": v.astype(np.float64)})

    _, text = _tampered_sum("secagg+", as_float).split("|", 1)
    assert "has dtype float64, expected uint64" in text


def test_error_messages_contain_no_node_values() -> None:
    secret = np.array([0.5, 123.456789, -98.7654321, 1.0])
    with pytest.raises(OverflowError) as err:
        FixedPoint(max_abs=10.0, frac_bits=16).encode(secret)
    text = str(err.value)
    assert "values out of declared range max_abs = 10.0" in text
    assert " 2 " not in text and "of 4" not in text  # not even how many
    for value in secret[1:3]:
        assert f"{value}"[:5] not in text and f"{value:g}" not in text
    # through a secure sum on the nodes: no node refuses because of its values (that would
    # be an oracle); they clip, and the server learns only how many nodes did, in the sum
    with LocalGrid(build_client_app(**DIAGNOSTIC_APP), 3) as grid:
        messenger = Messenger(grid, timeout=10)
        agg = SecureAggregator(messenger, messenger.node_ids())
        agg.setup()
        with pytest.raises(AggregationError) as err:
            agg.sum("diag_secure_sum", diag_request(4, {"v": (50,)}), max_abs=0.5)
    text = str(err.value)
    assert "3 node(s) had values outside the declared range max_abs=0.5" in text
    from clients.diagnostics import diagnostic_vector

    for p in range(3):
        for value in diagnostic_vector(4, p, (50,)):
            assert f"{value:.6f}"[:6] not in text


# -- 4. dropouts ----------------------------------------------------------------------------
def test_silent_nodes_in_a_tolerant_round_are_recorded() -> None:
    with LocalGrid(build_client_app(**DIAGNOSTIC_APP), 4) as grid:
        messenger = Messenger(grid, timeout=0.5)
        nodes = messenger.node_ids()
        list(messenger.iter_replies("hello", {n: RecordDict({"data": ConfigRecord(
            {**TINY, "partition": "shards-contiguous"})}) for n in nodes}))
        grid.silent.add(nodes[2])
        got = dict(messenger.iter_replies("relay_keys", dict.fromkeys(nodes, RecordDict()),
                                          phase="probe", allow_missing=True))
    assert nodes[2] not in got
    (drop,) = messenger.privacy_report()["dropouts"]
    assert drop["phase"] == "probe" and drop["node_ids"] == [nodes[2]]
    assert drop["nodes"] == [f"node {nodes[2]}"] and "no reply" in drop["why"]


def test_privirec_stops_when_a_node_drops_between_sums_and_reveals_nothing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A node goes silent after the degree sum: the power-method sum is abandoned before its
    unmasking round (nothing revealed), the run fails naming the node, the dropout is in the
    partial results."""
    import strategies.privirec as privirec

    real = privirec.make_aggregator
    seen: dict[str, Any] = {}

    def make(*args: Any, **kwargs: Any):
        agg = real(*args, **kwargs)
        inner = agg.sum

        def sum_(action: str, *a: Any, **kw: Any):
            if action == "privirec_power":
                seen["grid"].silent.add(seen["victim"])
            return inner(action, *a, **kw)

        agg.sum = sum_
        return agg

    monkeypatch.setattr(privirec, "make_aggregator", make)
    cfg = _privirec_cfg()
    with LocalGrid(build_client_app(policy={}), 3) as grid:
        seen["grid"], seen["victim"] = grid, grid.ids[1]
        messenger = Messenger(grid, timeout=1.0)
        with pytest.raises(SecAggError) as err:
            privirec.PriviRecK(cfg).execute(messenger)
        unmasks = [m for m in grid.pushed if m.metadata.message_type == "query.secagg_unmask"]
    text = str(err.value)
    assert f"'power': node {grid.ids[1]} (partition 1) did not answer (no reply within" in text
    assert "abandoned before unmasking" in text
    assert len(unmasks) == 3  # the degree sum's unmasking only (3 nodes), none for 'power'
    report = messenger.privacy_report()
    assert [d["node_ids"] for d in report["dropouts"]] == [[grid.ids[1]]]
    assert report["dropouts"][0]["phase"] == "power"


def test_privirec_checks_that_every_sum_ran_over_the_same_nodes() -> None:
    with LocalGrid(build_client_app(**DIAGNOSTIC_APP), 3) as grid:
        messenger = Messenger(grid, timeout=10)
        nodes = messenger.node_ids()
        agg = PlainAggregator(messenger, nodes)
        agg.sum("diag_secure_sum", diag_request(1, {"v": (3,)}), max_abs=10.0, phase="degrees")
        check_fixed_node_set(agg)
        agg.record_sum("power", "privirec_power", [("Y", (3,))], 2, [nodes[2]],
                    members=nodes[:2])
        with pytest.raises(NodeSetChanged, match=rf"sum 'power' ran without node {nodes[2]} "
                                                 r"compared with sum 'degrees'"):
            check_fixed_node_set(agg)


# -- 5. randomness ----------------------------------------------------------------------------
def test_private_omega_is_a_csprng_gaussian() -> None:
    from clients.privirec import OMEGA_CLIP, omega_rows
    from fedrec.secure.randomness import csprng_normal, csprng_uniform

    z = csprng_normal((400, 500))
    assert z.shape == (400, 500)
    assert abs(z.mean()) < 0.01 and abs(z.std() - 1) < 0.01
    # Gaussian kurtosis: E[z^4] = 3 with variance 96 / n per sample mean, so 2M draws give a
    # standard error of 0.007 and the bound 0.05 sits at 7 standard errors (200k draws left it
    # at 2.3, a 2% chance of failing a correct sampler)
    assert abs(float(np.mean(csprng_normal(2_000_000) ** 4)) - 3.0) < 0.05
    assert abs(float(np.mean(z[:, :-1] * z[:, 1:]))) < 0.01  # no lag-1 correlation
    u = csprng_uniform(100_000)
    assert 0.0 < u.min() and u.max() < 1.0 and abs(u.mean() - 0.5) < 0.005
    # keyed: reproducible from the key (the construction is deterministic given the key)
    assert np.array_equal(csprng_normal(7, key=b"k" * 32), csprng_normal(7, key=b"k" * 32))
    a = omega_rows(np.arange(5), 8, "private", seed=0)
    b = omega_rows(np.arange(5), 8, "private", seed=0)
    assert a.shape == (5, 8) and not np.array_equal(a, b)  # fresh OS entropy each call
    assert np.abs(a).max() <= OMEGA_CLIP


# -- the node's own minimum and threshold (a server that lies about who takes part) -------
class _ShrinkingServer(SecureAggregator):
    """A server that tells one node nobody else is alive, so that node would add no pairwise
    masks and its input would be unmasked by its self-mask shares alone."""

    victim = -1

    def _requests(self, content: Any, nodes: Any, cfg: Any) -> dict[int, RecordDict]:
        nodes = list(nodes)
        if "alive" in cfg and nodes == [self.victim]:
            cfg = {**cfg, "alive": []}
        return super()._requests(content, nodes, cfg)


def test_a_node_refuses_a_sum_the_server_says_it_masks_alone() -> None:
    with LocalGrid(build_client_app(**DIAGNOSTIC_APP), 4) as grid:
        messenger = Messenger(grid, timeout=10)
        nodes = messenger.node_ids()
        agg = _ShrinkingServer(messenger, nodes, seed=1)
        agg.victim = nodes[2]
        agg.setup()
        with pytest.raises(NodeError) as err:
            agg.sum("diag_secure_sum", diag_request(3, {"v": (5,)}), max_abs=10.0)
    text = str(err.value)
    assert f"node {nodes[2]}" in text and "alive list is not its neighbours" in text


def test_a_federation_below_the_nodes_minimum_gets_no_secure_sum() -> None:
    with LocalGrid(build_client_app(**DIAGNOSTIC_APP), 2) as grid:
        messenger = Messenger(grid, timeout=10)
        with pytest.raises(NodeError, match="min-survivors is 3"):
            SecureAggregator(messenger, messenger.node_ids(), seed=1).setup()
    assert NodePolicy().merged({"min-survivors": "2"}, "test").min_survivors == 2
    with pytest.raises(ValueError, match=">= 2"):
        NodePolicy().merged({"min-survivors": "1"}, "test")
