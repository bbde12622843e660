"""The ServerApp: read the run config, build the strategy, run it, save and show results.

``protocol`` names a registered protocol (``fl_app/registry.py``) or a
``package.module:ClassName`` of a ``ProtocolStrategy``. ``strategy`` optionally names a plain
Flower ``Strategy`` (e.g. ``FedAvg`` or a user's subclass) to drive the clients of
``protocol`` instead of the protocol's own server side, for protocols whose strategy class
implements ``drive_stock_strategy``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import Strategy

from clients.policy import PolicyError
from datasets.errors import DataError
from fedrec.config import ConfigError, RunConfig, run_name
from fedrec.results import print_run_table, write_run
from fedrec.transport.messenger import Messenger, NodeError, NodeTimeoutError, RunInterrupted
from fl_app.registry import build_strategy, load_strategy_class, resolve_config
from strategies.base import ProtocolStrategy, RunOutcome
from strategies.policy_needs import PolicyRefusal

log = logging.getLogger("fedrec")

# Flower's log stream (``flwr run --stream``) stops as soon as it sees the run FINISHED, and
# the runtime marks it finished one second after its log queue empties; output pushed later
# (a slow PushLogs on a loaded machine) never reaches the user. Lingering a few upload and
# stream intervals (0.2 s and 0.5 s in flwr 1.42.0) before returning lets the final table through.
_LOG_DELIVERY_SECONDS = 1.5


@dataclass
class RunAttempt:
    """One run's results record (completed, or failed with what it had) and, for a failed
    run, the exception that ended it."""

    record: dict[str, Any]
    error: Exception | None = None


def attempt_protocol(grid: Grid, cfg: Mapping[str, Any],
                     strategy: ProtocolStrategy | None = None) -> RunAttempt:
    """Run the configured protocol (``strategy``, else built from ``cfg``) over ``grid``.

    A failure is returned, not raised: its record keeps what was measured, the strategy's
    history so far (``partial_record``) and the reason, for the results."""
    messenger = Messenger(grid, timeout=cfg["timeout"])
    t0 = time.perf_counter()
    try:
        strategy = strategy or build_strategy(cfg)
        outcome = _run_strategy(strategy, messenger, cfg)
    except Exception as exc:
        partial = strategy.partial_record() if strategy is not None else {}
        return RunAttempt(failed_record(cfg, exc, messenger, time.perf_counter() - t0,
                                        partial), exc)
    seconds = time.perf_counter() - t0
    messenger.ledger.summarize()  # the console line of the last phase
    privacy = {"aggregator": cfg["aggregator"], **messenger.privacy_report(), **outcome.privacy}
    return RunAttempt({
        "config": dict(cfg),
        "status": "completed",
        "num_nodes": len(list(grid.get_node_ids())),
        "metrics": outcome.metrics,
        "history": outcome.history,
        "extra": outcome.extra,
        "seconds": seconds,
        "communication": messenger.ledger.to_dict(),
        "privacy": privacy,
    })


def run_protocol(grid: Grid, cfg: Mapping[str, Any],
                 strategy: ProtocolStrategy | None = None) -> dict[str, Any]:
    """Run the configured protocol over ``grid``; return the results record, or raise the
    exception the run failed of (:func:`attempt_protocol` keeps a failed run's record)."""
    attempt = attempt_protocol(grid, cfg, strategy)
    if attempt.error is not None:
        raise attempt.error
    return attempt.record


class RunFailedError(RuntimeError):
    """What a deployed ServerApp raises when its run failed: the message is the results'
    ``error`` (the lost node first, with its reason), which Flower shows as the run's
    ``status-details`` (``flwr ls``); the original exception is its ``__cause__``;
    ``results_path`` is where the failed run's record was written."""

    def __init__(self, message: str, results_path: str = "") -> None:
        super().__init__(message)
        self.results_path = results_path


def run_status(exc: BaseException) -> str:
    """A failed run's results ``status``: ``interrupted`` when it was asked to stop (Ctrl-C
    in a local simulation), else ``failed``."""
    return "interrupted" if isinstance(exc, RunInterrupted) else "failed"


def failed_record(cfg: Mapping[str, Any], exc: BaseException, messenger: Messenger,
                  seconds: float, partial: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The results record of a failed run: the error, what the strategy had so far
    (``partial``, its ``partial_record()``: metrics and history up to the failure), the
    communication and privacy accounting.

    ``error`` begins with every node that dropped out during the run and why (the SuperLink
    reported it unavailable, or it was silent past the timeout), before the exception that
    ended the run: a dropout a sum cannot go on without is what such a run failed of, even
    when the step that raised was a later one."""
    error = f"{type(exc).__name__}: {exc}"
    lost = messenger.lost_nodes()
    if lost:
        error = f"lost {lost}. {error}"
    partial = dict(partial or {})
    return {"config": dict(cfg), "status": run_status(exc), "error": error,
            "metrics": partial.pop("metrics", {}), "history": partial.pop("history", []),
            **partial, "seconds": seconds, "communication": messenger.ledger.to_dict(),
            "privacy": {"aggregator": cfg["aggregator"], **messenger.privacy_report()}}


def _run_strategy(strategy: ProtocolStrategy, messenger: Messenger,
                  cfg: Mapping[str, Any]) -> RunOutcome:
    """The protocol's own phases, or a stock Flower strategy (the run config's
    ``strategy``) driving the protocol's nodes."""
    if not cfg.get("strategy"):  # a protocol with its own phases
        return strategy.execute(messenger)
    stock_cls = load_strategy_class(cfg["strategy"])
    if not issubclass(stock_cls, Strategy):
        raise ConfigError(f"strategy {cfg['strategy']!r} is a ProtocolStrategy with phases of "
                          "its own: give it as 'protocol'; 'strategy' takes a Flower "
                          "Strategy (e.g. flwr.serverapp.strategy:FedAvg)")
    return strategy.drive_stock_strategy(stock_cls(), messenger)


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
EXPECTED_FAILURES: tuple[type[BaseException], ...] = (
    PolicyRefusal, ConfigError, DataError, NodeError, NodeTimeoutError, RunInterrupted,
    PolicyError)


class ExpectedFailureFilter(logging.Filter):
    """Drops the traceback Flower's deployed ServerApp runner logs with "ServerApp raised an
    exception" when the run failed of an :data:`EXPECTED_FAILURES` (our own "run failed:"
    or "run refused:" line above it says what and where); any other exception keeps its
    traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, RunFailedError):
            exc = exc.__cause__
        if expected_failure(exc):
            record.exc_info, record.exc_text = None, None
        return True


def expected_failure(exc: BaseException | None) -> bool:
    """Whether ``exc`` is an :data:`EXPECTED_FAILURES`, a refinement (e.g.
    ``SettingRefused``, a ConfigError naming its fix) included."""
    return isinstance(exc, EXPECTED_FAILURES)


_EXPECTED_FILTER = ExpectedFailureFilter()


def flower_overrides(grid: Grid) -> dict[str, Any]:
    """The keys the run's command named (``flwr run --run-config``: Flower's
    ``Run.override_config``); empty where Flower has no run record (a test's grid)."""
    return dict(getattr(getattr(grid, "run", None), "override_config", None) or {})


def server_run_config(grid: Grid, context: Context) -> RunConfig:
    """A deployed run's typed config, resolved once: Flower's run config, whose values
    ``pyproject.toml`` lists are defaults, with the keys ``--run-config`` named as the given
    ones (:func:`fl_app.registry.resolve_config` refuses those the protocol does not
    read)."""
    return resolve_config(flower_overrides(grid), defaults=context.run_config)


def make_server_app(strategy: ProtocolStrategy | None = None, *,
                    on_result: Callable[[dict[str, Any]], None] | None = None,
                    quiet: bool = False) -> ServerApp:
    """A ServerApp that runs ``strategy``, built and checked from the run's resolved config
    (``strategy.cfg``: a local simulation's plan, ``fl_app/plan.py``); without one, the
    protocol Flower's run config names (:func:`server_run_config`: a deployment).

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
        try:
            cfg = strategy.cfg if strategy is not None else server_run_config(grid, context)
        except ConfigError as exc:  # before any node is contacted
            log.error("run refused: %s", exc)
            raise
        attempt = attempt_protocol(grid, cfg, strategy)
        record, exc = attempt.record, attempt.error
        if exc is not None:
            path = write_run(record, run_name(cfg))
            if isinstance(exc, RunInterrupted):
                log.warning("run interrupted; partial results written to %s", path)
            else:
                log.error("run failed: %s; partial results written to %s", record["error"],
                          path)
            raise RunFailedError(record["error"], str(path)) from exc
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
