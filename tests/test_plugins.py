"""Plugging in strategies: stock Flower FedAvg, a user's module, and a new protocol."""

from __future__ import annotations

import sys
import textwrap

import numpy as np
import pytest

import run_simulation
from datasets import DatasetSpec, load_dataset
from fedrec.recsys.metrics import ranking_sums
from fl_app.simulation import run_in_simulation
from tests.simutil import run_in_process

SMALL = ["--protocol", "fedmf", "--set", "synthetic-users=60", "--set", "synthetic-items=80",
         "--set", "mf-dim=4", "--node-policy", "allow-plain=true",
         "--rounds", "2", "--quiet"]


def test_user_strategy_module_through_run_simulation(tmp_path, monkeypatch, capsys) -> None:
    """A FedAvg subclass in a module outside the package drives the FedMF clients."""
    (tmp_path / "my_strategies.py").write_text(textwrap.dedent("""
        from flwr.serverapp.strategy import FedAvg

        CALLS = []

        class LoggingFedAvg(FedAvg):
            def aggregate_train(self, server_round, replies):
                CALLS.append(server_round)
                return super().aggregate_train(server_round, replies)
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    code = run_simulation.main(["--strategy", "my_strategies:LoggingFedAvg", "--nodes", "3",
                                "--run-name", "plugin-test", *SMALL])
    assert code == 0, capsys.readouterr().err
    assert sys.modules["my_strategies"].CALLS == [1, 2]


def test_new_protocol_with_own_client_handlers(monkeypatch) -> None:
    """examples/item_popularity.py: registered without editing the project's files."""
    monkeypatch.setenv("FEDREC_CLIENT_MODULES", "examples.item_popularity")
    cfg = {"protocol": "examples.item_popularity:ItemPopularity", "synthetic-users": 80,
           "synthetic-items": 60, "run-name": "popularity-test"}
    record = run_in_process(cfg, num_nodes=4)  # the Ray path: the documented protocol below
    data = load_dataset(DatasetSpec.from_config(cfg))
    deg = np.asarray(data.train.sum(axis=0)).ravel()
    want = ranking_sums(np.tile(deg, (data.n_users, 1)), data.train, data.test, k=20).means()
    assert record["metrics"]["ndcg@20"] == pytest.approx(want["ndcg@20"], abs=1e-9)
    assert record["extra"]["top_items"][:3] == np.argsort(-deg)[:3].tolist()
    assert "secagg_setup" in record["communication"]["phases"]


def test_protocol_strategy_start_returns_a_flower_result(monkeypatch) -> None:
    """A ProtocolStrategy used the Flower way (``strategy.start(grid)``) runs its phases."""
    from flwr.app import ConfigRecord

    from examples.item_popularity import ItemPopularity
    from fl_app.client_app import build_client_app
    from tests.localgrid import LocalGrid

    monkeypatch.setenv("FEDREC_CLIENT_MODULES", "examples.item_popularity")
    with LocalGrid(build_client_app(policy={"allow-plain": True}), 3) as grid:
        strategy = ItemPopularity(ItemPopularity.run_config({
            "synthetic-users": 60, "synthetic-items": 50, "aggregator": "plain"}))
        result = strategy.start(grid)
        with pytest.raises(TypeError, match="goes to the constructor"):
            strategy.start(grid, train_config=ConfigRecord({"aggregator": "plain"}))
    assert 0.0 < result.evaluate_metrics_serverapp[1]["ndcg@20"] <= 1.0
    # not a Flower Strategy: Flower's wrappers that call the per-round hooks cannot take it,
    # and none of those hooks exists to fail later
    from flwr.serverapp.strategy import Strategy

    assert not isinstance(strategy, Strategy)
    assert not hasattr(strategy, "configure_train")


def test_a_protocol_strategy_is_refused_where_a_flower_strategy_goes() -> None:
    """The ``strategy`` key takes a Flower Strategy (it drives FedMF's nodes round by round);
    a ProtocolStrategy there is refused before any message, naming the key to use."""
    from fedrec.config import ConfigError
    from fl_app.simulation import run_in_simulation

    with pytest.raises(ConfigError, match="give it as 'protocol'"):
        run_in_simulation({"protocol": "fedmf", "strategy": "privirec",
                           "synthetic-users": 30, "synthetic-items": 20}, num_nodes=3,
                          quiet=True, node_policy={"allow-plain": True})


def _doc_files() -> dict[str, str]:
    """The files docs/write-your-own-protocol.md shows: name -> code."""
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "write-your-own-protocol.md").read_text()
    return dict(re.findall(r"`(\w+\.py)`, the [^\n]*:\n\n```python\n(.*?)```", text, re.S))


def test_the_documented_protocol_runs_from_two_files(tmp_path, monkeypatch) -> None:
    """The co-occurrence filter of the docs: one strategies file, one clients file, the
    ``clients`` registration; its typed key is read; the result equals the same filter
    computed centrally."""
    files = _doc_files()
    assert set(files) == {"cooc_wire.py", "cooc_server.py", "cooc_client.py"}
    lines = sum(len(code.strip().splitlines()) for code in files.values())
    assert lines < 80, f"the documented protocol takes {lines} lines"
    for name, code in files.items():
        (tmp_path / name).write_text(code)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))  # the simulation's node workers
    cfg = {"protocol": "cooc_server:Cooc", "synthetic-users": 60, "synthetic-items": 40,
           "cooc-min-count": "2", "aggregator": "plain", "run-name": "cooc-test"}
    record = run_in_simulation(cfg, num_nodes=3, quiet=True, node_policy={"allow-plain": True})
    assert record["config"]["cooc-min-count"] == 2
    data = load_dataset(DatasetSpec.from_config(cfg))
    C = (data.train.T @ data.train).toarray()
    C[C < 2] = 0
    want = ranking_sums(np.asarray(data.train @ C), data.train, data.test, k=20).means()
    assert record["metrics"]["ndcg@20"] == pytest.approx(want["ndcg@20"], abs=1e-12)
    with pytest.raises(Exception, match="did you mean 'cooc-min-count'"):
        run_in_simulation({**cfg, "cooc-min-cnt": 2}, num_nodes=3, quiet=True)
    # the protocol's own node opt-in: set by the node's operator, read by its handler
    with pytest.raises(Exception, match="holds fewer users than its cooc-min-users"):
        run_in_simulation({**cfg, "run-name": "cooc-min-users"}, num_nodes=3, quiet=True,
                          node_policy={"allow-plain": True, "cooc-min-users": 10**6})
    from clients.policy import NodePolicy

    assert NodePolicy.coerce({"cooc-min-users": 7}).cooc_min_users == 7
    assert NodePolicy().cooc_min_users == 1  # the declared default
    with pytest.raises(ValueError, match="unknown node policy key 'allow-cooc-min-users'"):
        NodePolicy().merged({"allow-cooc-min-users": "true"}, "node config")
