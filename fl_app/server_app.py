"""The ServerApp: read the run config, build the strategy, run it, save and show results.

``protocol`` names a built-in protocol (``strategies.REGISTRY``) or a
``package.module:ClassName`` implementing :class:`strategies.FedRecStrategy`. ``strategy``
optionally names a plain Flower ``Strategy`` (e.g. ``FedAvg`` or a user's subclass) to drive
the clients of ``protocol`` instead of the protocol's own server side.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from fl_app.config import merge_config, run_name
from fl_app.messaging import AccountedGrid, Messenger
from fl_app.results import print_run_table, write_run
from strategies.base import RunOutcome, load_strategy_class

log = logging.getLogger("fedrec")

#: Client families that a plain Flower Strategy can drive: protocol -> runner.
STOCK_DRIVERS: dict[str, str] = {"fedmf": "strategies.fedmf:run_fedmf_rounds"}


def _driver(protocol: str) -> Callable[..., RunOutcome]:
    if protocol not in STOCK_DRIVERS:
        raise ValueError(
            f"a plain Flower strategy can drive the clients of {sorted(STOCK_DRIVERS)}, "
            f"not {protocol!r}; give a strategy with its own run() as 'protocol' instead"
        )
    module, _, attr = STOCK_DRIVERS[protocol].partition(":")
    return getattr(__import__(module, fromlist=[attr]), attr)


def run_protocol(grid: Grid, cfg: Mapping[str, Any]) -> dict[str, Any]:
    """Run the configured protocol over ``grid``; return the results record."""
    messenger = Messenger(grid, timeout=float(cfg["timeout"]))
    fast_grid = AccountedGrid(grid, messenger)
    t0 = time.perf_counter()
    own = not cfg.get("strategy")
    strategy_cls = load_strategy_class(str(cfg["protocol"] if own else cfg["strategy"]))
    has_run = hasattr(strategy_cls, "run")
    strategy = (strategy_cls.from_run_config(cfg) if hasattr(strategy_cls, "from_run_config")
                else strategy_cls())
    if own and has_run:  # a protocol with its own phases
        outcome = strategy.run(fast_grid, messenger, cfg)
    else:  # a plain Flower Strategy driving the clients of `protocol`
        outcome = _driver(str(cfg["protocol"]))(strategy, fast_grid, messenger, cfg)
    seconds = time.perf_counter() - t0
    return {
        "config": dict(cfg),
        "num_nodes": len(list(grid.get_node_ids())),
        "metrics": outcome.metrics,
        "history": outcome.history,
        "extra": outcome.extra,
        "seconds": seconds,
        "communication": messenger.ledger.to_dict(),
    }


def make_server_app(overrides: Mapping[str, Any] | None = None,
                    on_result: Callable[[dict[str, Any]], None] | None = None,
                    quiet: bool = False) -> ServerApp:
    """A ServerApp whose run config is Flower's (``context.run_config``) plus ``overrides``.

    ``on_result`` receives the results record in the server's process (used by
    ``run_simulation.py`` and the tests); it is never a channel to or from the nodes.
    """
    server_app = ServerApp()

    @server_app.main()
    def main(grid: Grid, context: Context) -> None:
        cfg = merge_config({**dict(context.run_config), **dict(overrides or {})})
        record = run_protocol(grid, cfg)
        path = write_run(record, run_name(cfg))
        record["results_path"] = str(path)
        if not quiet:
            print_run_table(record)
            log.info("results written to %s", path)
        if on_result is not None:
            on_result(record)

    return server_app


app = make_server_app()
