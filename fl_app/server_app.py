"""The ServerApp: read the run config, build the strategy, run it, save and show results.

``protocol`` names a registered protocol (``fl_app/registry.py``) or a
``package.module:ClassName`` of a ``ProtocolStrategy``. ``strategy`` optionally names a plain
Flower ``Strategy`` (e.g. ``FedAvg`` or a user's subclass) to drive the clients of
``protocol`` instead of the protocol's own server side, for protocols whose strategy class
offers ``drive_stock_strategy``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from fedrec.config import ConfigError, run_name
from fedrec.results import print_run_table, write_run
from fedrec.transport.messenger import AccountedGrid, Messenger, RunInterrupted
from fl_app.registry import load_strategy_class, resolve_config

log = logging.getLogger("fedrec")

# Flower's log stream (``flwr run --stream``) stops as soon as it sees the run FINISHED, and
# the runtime marks it finished one second after its log queue empties; output pushed later
# (a slow PushLogs on a loaded machine) never reaches the user. Lingering a few upload and
# stream intervals (0.2 s and 0.5 s in flwr 1.42.0) before returning lets the final table through.
_LOG_DELIVERY_SECONDS = 1.5


def run_protocol(grid: Grid, cfg: Mapping[str, Any]) -> dict[str, Any]:
    """Run the configured protocol over ``grid``; return the results record."""
    messenger = Messenger(grid, timeout=float(cfg["timeout"]))
    fast_grid = AccountedGrid(grid, messenger)
    t0 = time.perf_counter()
    try:
        outcome = _run_strategy(fast_grid, messenger, cfg)
    except Exception as exc:  # keep what was measured, with the reason, for the results
        exc.fedrec_record = failed_record(  # type: ignore[attr-defined]
            cfg, exc, messenger, time.perf_counter() - t0)
        raise
    seconds = time.perf_counter() - t0
    messenger.ledger.summarize()  # the console line of the last phase
    privacy = {"aggregator": cfg["aggregator"], **messenger.privacy_report(),
               **getattr(outcome, "privacy", {})}
    return {
        "config": dict(cfg),
        "status": "completed",
        "num_nodes": len(list(grid.get_node_ids())),
        "metrics": outcome.metrics,
        "history": outcome.history,
        "extra": outcome.extra,
        "seconds": seconds,
        "communication": messenger.ledger.to_dict(),
        "privacy": privacy,
    }


class RunFailedError(RuntimeError):
    """What a deployed ServerApp raises when its run failed: the message is the results'
    ``error`` (the lost node first, with its reason), which Flower shows as the run's
    ``status-details`` (``flwr ls``); the original exception is its ``__cause__``."""


def run_status(exc: BaseException) -> str:
    """A failed run's results ``status``: ``interrupted`` when it was asked to stop (Ctrl-C
    in a local simulation), else ``failed``."""
    return "interrupted" if isinstance(exc, RunInterrupted) else "failed"


def failed_record(cfg: Mapping[str, Any], exc: BaseException, messenger: Messenger,
                  seconds: float) -> dict[str, Any]:
    """The results record of a failed run: the error, what the strategy had so far
    (``partial_record()``: metrics and history up to the failure), the communication and
    privacy accounting.

    ``error`` begins with every node that dropped out during the run and why (the SuperLink
    reported it unavailable, or it was silent past the timeout), before the exception that
    ended the run: a dropout a sum cannot go on without is what such a run failed of, even
    when the step that raised was a later one."""
    error = f"{type(exc).__name__}: {exc}"
    lost = messenger.lost_nodes()
    if lost:
        error = f"lost {lost}. {error}"
    partial = dict(getattr(exc, "fedrec_partial", None) or {})
    return {"config": dict(cfg), "status": run_status(exc), "error": error,
            "metrics": partial.pop("metrics", {}), "history": partial.pop("history", []),
            **partial, "seconds": seconds, "communication": messenger.ledger.to_dict(),
            "privacy": {"aggregator": cfg["aggregator"], **messenger.privacy_report()}}


def _run_strategy(fast_grid: AccountedGrid, messenger: Messenger, cfg: Mapping[str, Any]) -> Any:
    """The protocol's own phases, or a stock Flower strategy driving the protocol's nodes.

    If the protocol fails, its record so far (``partial_record()``, strategies/base.py) goes
    with the exception as ``fedrec_partial`` for the failed run's results."""
    protocol_cls = load_strategy_class(str(cfg["protocol"]))
    if not cfg.get("strategy"):  # a protocol with its own phases
        strategy = protocol_cls.from_run_config(cfg)
        try:
            return strategy.run(fast_grid, messenger, cfg)
        except Exception as exc:
            partial_record = getattr(strategy, "partial_record", None)
            if partial_record is not None:
                exc.fedrec_partial = partial_record()  # type: ignore[attr-defined]
            raise
    else:  # a plain Flower Strategy driving the clients of `protocol`
        drive = getattr(protocol_cls, "drive_stock_strategy", None)
        if drive is None:
            raise ConfigError(f"protocol {cfg['protocol']!r} cannot be driven by a plain Flower "
                              "strategy ('strategy' key): it has phases of its own")
        stock_cls = load_strategy_class(str(cfg["strategy"]))
        stock = (stock_cls.from_run_config(cfg) if hasattr(stock_cls, "from_run_config")
                 else stock_cls())
        outcome = drive(stock, fast_grid, messenger, cfg)
    return outcome


def progress_to_console(indent: str = "") -> None:
    """Phase lines on the console wherever the ServerApp runs (a deployed ServerApp process
    has no handler for them otherwise, and a long run would print nothing for minutes).
    ``indent`` sets them under a caller's own lines (the benchmarks)."""
    fedrec_log = logging.getLogger("fedrec")
    if not fedrec_log.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter(f"[%(asctime)s] {indent}%(message)s", "%H:%M:%S"))
        fedrec_log.addHandler(handler)
        fedrec_log.setLevel(logging.INFO)
        fedrec_log.propagate = False


#: Failures that are answers to the run's input or to the nodes' policies (each already
#: logged in one line naming the node, key or file): no traceback for them on the console.
EXPECTED_FAILURES = ("PolicyRefusal", "ConfigError", "DataError", "NodeError",
                     "NodeTimeoutError", "RunInterrupted", "PolicyError")


class ExpectedFailureFilter(logging.Filter):
    """Drops the traceback Flower's deployed ServerApp runner logs with "ServerApp raised an
    exception" when the run failed of an :data:`EXPECTED_FAILURES` (our own "run failed:"
    line above it says what and where); any other exception keeps its traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, RunFailedError) and \
                type(exc.__cause__).__name__ in EXPECTED_FAILURES:
            record.exc_info, record.exc_text = None, None
        return True


_EXPECTED_FILTER = ExpectedFailureFilter()


def make_server_app(overrides: Mapping[str, Any] | None = None,
                    on_result: Callable[[dict[str, Any]], None] | None = None,
                    quiet: bool = False) -> ServerApp:
    """A ServerApp whose run config is Flower's (``context.run_config``) plus ``overrides``.

    ``on_result`` receives the results record in the server's process (used by
    ``run_simulation.py`` and the tests); it is never a channel to or from the nodes.
    """
    server_app = ServerApp()
    flwr_log = logging.getLogger("flwr")
    if _EXPECTED_FILTER not in flwr_log.filters:
        flwr_log.addFilter(_EXPECTED_FILTER)

    @server_app.main()
    def main(grid: Grid, context: Context) -> None:
        if not quiet:
            progress_to_console()
        cfg = resolve_config({**dict(context.run_config), **dict(overrides or {})})
        try:
            record = run_protocol(grid, cfg)
        except Exception as exc:
            partial = getattr(exc, "fedrec_record", None) or {
                "config": cfg, "status": run_status(exc),
                "error": f"{type(exc).__name__}: {exc}"}
            path = write_run(partial, run_name(cfg))
            if isinstance(exc, RunInterrupted):
                log.warning("run interrupted; partial results written to %s", path)
            else:
                log.error("run failed: %s; partial results written to %s", partial["error"],
                          path)
            failure = RunFailedError(partial["error"])
            failure.results_path = exc.results_path = str(path)  # type: ignore[attr-defined]
            raise failure from exc
        path = write_run(record, run_name(cfg))
        record["results_path"] = str(path)
        if not quiet:
            print_run_table(record)
            log.info("results written to %s", path)
        if on_result is not None:
            on_result(record)
        else:  # under Flower's runtime: let the table reach `flwr run --stream`
            time.sleep(_LOG_DELIVERY_SECONDS)

    return server_app


app = make_server_app()
