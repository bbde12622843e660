"""Every built-in protocol keeps the one contract of ``strategies.base.ProtocolStrategy``:
built once from the typed run config, run the Flower way (``strategy.start(grid)``), a
failed run's history kept. Tiny federations on the in-process grid (no Ray)."""

from __future__ import annotations

import math
from typing import Any

import pytest

from fedrec.config import Key
from fl_app.client_app import build_client_app
from fl_app.registry import BUILTIN, client_module, load_strategy_class, resolve_config
from strategies.base import ProtocolStrategy
from tests.localgrid import LocalGrid

#: Every opt-in some built-in protocol's tiny run needs (each node still checks each one).
POLICY = {"allow-plain": True, "allow-ckks": True, "allow-noise-removal": True,
          "allow-sparse-transport": True, "allow-seeded-omega": True, "dp-budget": 100.0}
_SMALL = {"dataset": "synthetic", "synthetic-users": 60, "synthetic-items": 30, "seed": 1,
          "aggregator": "plain"}
_FEDSVD = {**_SMALL, "synthetic-rank": 2, "synthetic-density": 0.3, "partition": "row-blocks",
           "fedsvd-k": 2, "fedsvd-rank": 2, "fedsvd-iterations": 2, "fedsvd-sync-every": 1}
_MVMF = {**_SMALL, "synthetic-density": 0.3, "synthetic-clusters": 4, "implicit": False,
         "rounds": 1, "item-servers": 1, "partition": "shards-random"}
#: One tiny run per built-in registration: (run config, nodes).
TINY: dict[str, tuple[dict[str, Any], int]] = {
    "fedmf": ({**_SMALL, "rounds": 1, "mf-dim": 4, "mf-local-epochs": 1}, 3),
    "privirec": ({**_SMALL, "privirec-filters": "gf-cf", "privirec-filter-rank": 3,
                  "privirec-L": 1}, 3),
    "privirec-k": ({**_SMALL, "privirec-filters": "gf-cf", "privirec-filter-rank": 3,
                    "privirec-k": 6, "privirec-L": 1}, 3),
    "lpgcn": ({**_SMALL, "synthetic-items": 45, "synthetic-density": 0.25,
               "synthetic-popularity-skew": 0.0, "partition": "shards-random",
               "lpgcn-layers": 1, "lpgcn-dim": 4, "lpgcn-batch-size": 128,
               "lpgcn-steps": 1}, 3),
    "fedpower": (_FEDSVD, 3),
    "fedsvd-utility": ({**_FEDSVD, "aggregator": "secagg+"}, 3),
    "fedsvd-privacy": (_FEDSVD, 3),
    "dp-prototypes": ({**_SMALL, "synthetic-users": 120, "synthetic-items": 60,
                       "partition": "shards-contiguous", "dpp-k": 4, "dpp-value-max": 1.0,
                       "dpp-sparsity": 10, "dpp-rank": 4, "dpp-swaps": 4, "dpp-shifts": 2},
                      3),
    "fedmvmf": (_MVMF, 4),
    "privmvmf": (_MVMF, 4),  # a CKKS sum needs min-survivors = 3 user nodes
    # noise is shared inside SecAgg+ sums only (a plain sum with noise is refused)
    "dp-fedmf": ({**_SMALL, "aggregator": "secagg+", "rounds": 2, "dpmf-dim": 3,
                  "dpmf-rate": 0.5, "dpmf-epsilon": 4.0}, 3),
    "dp-svd": ({**_SMALL, "aggregator": "secagg+", "dpsvd-rank": 2, "dpsvd-items": 12,
                "dpsvd-iterations": 2, "dpsvd-epsilon": 4.0}, 3),
}


def _strategy(name: str, **extra: Any) -> tuple[ProtocolStrategy, int]:
    over, nodes = TINY[name]
    cfg = resolve_config({**over, "protocol": name, "run-name": f"contract-{name}", **extra})
    return load_strategy_class(name)(cfg), nodes


def test_every_builtin_registration_has_a_tiny_run() -> None:
    assert sorted(TINY) == sorted(r.name for r in BUILTIN)


@pytest.mark.parametrize("name", sorted(TINY))
def test_every_protocol_runs_as_a_flower_strategy(name: str) -> None:
    """``strategy.start(grid)``, Flower's entry point of a strategy, runs the protocol's
    phases against the real ClientApp and returns Flower's ``Result`` with its metrics."""
    strategy, nodes = _strategy(name)
    app = build_client_app([client_module(name)], policy=POLICY)
    with LocalGrid(app, nodes) as grid:
        result = strategy.start(grid, timeout=60)
    metrics = dict(result.evaluate_metrics_serverapp[1])
    assert metrics and all(math.isfinite(v) for v in metrics.values()), metrics


@pytest.mark.parametrize("name", ["privirec", "dp-prototypes", "lpgcn"])
def test_a_failed_run_keeps_the_history_it_had(name: str) -> None:
    """A run that fails after some rows keeps them for the results (``partial_record``),
    whichever protocol (the three that had no such rows before included): the last
    evaluation or sum is made to fail on the node side."""
    from fl_app.server_app import attempt_protocol

    strategy, nodes = _strategy(name)
    last = {"privirec": "privirec_evaluate", "dp-prototypes": "dpp_evaluate",
            "lpgcn": "lpgcn_losses"}[name]
    app = build_client_app([client_module(name)], policy=POLICY)

    def failing(message: Any, context: Any) -> Any:
        if message.metadata.message_type == f"query.{last}":
            raise RuntimeError("node failure for the test")
        return app(message, context)

    with LocalGrid(failing, nodes) as grid:
        attempt = attempt_protocol(grid, strategy.cfg, strategy)
    assert attempt.error is not None and attempt.record["status"] == "failed"
    if name == "privirec":  # no per-round rows: its history is empty, and says so
        assert attempt.record["history"] == []
    else:
        assert attempt.record["history"], attempt.record
        assert attempt.record["history"] == strategy.history


def test_a_simulated_run_builds_its_strategy_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The checks before Flower starts, the ServerApp, the centralized reference and the
    reproducibility note all use the one strategy built from the run config."""
    import fl_app.simulation as simulation

    built: list[str] = []
    init = ProtocolStrategy.__init__

    def counting(self: ProtocolStrategy, cfg: Any = None) -> None:
        built.append(type(self).__name__)
        init(self, cfg)

    def on_local_grid(server_app: Any, client_app: Any, num_nodes: int, *_: Any) -> None:
        from flwr.app import Context, RecordDict

        with LocalGrid(client_app, num_nodes) as grid:
            server_app(grid, Context(run_id=1, node_id=0, node_config={},
                                     state=RecordDict(), run_config={}))

    parsed: list[str] = []
    parse = Key.parse

    def counting_parse(self: Key, value: Any) -> Any:
        parsed.append(self.name)
        return parse(self, value)

    monkeypatch.setattr(ProtocolStrategy, "__init__", counting)
    monkeypatch.setattr(Key, "parse", counting_parse)
    monkeypatch.setattr(simulation, "simulate", on_local_grid)
    over, nodes = TINY["fedpower"]
    record = simulation.run_in_simulation({**over, "protocol": "fedpower",
                                           "run-name": "contract-once"}, nodes,
                                          compare=True, node_policy=POLICY)
    assert record["status"] == "completed" and "centralized" in record["comparison"]
    assert built == ["FedPower"]
    # the run config is resolved once, where the run starts: each of the protocol's own
    # keys parsed once (the data's keys are parsed again where data is described)
    own = [k for k in over if k.startswith("fedsvd-")]
    assert own and {k: parsed.count(k) for k in own} == {k: 1 for k in own}
