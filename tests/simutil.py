"""Run a server-side function against real simulated nodes (Flower simulation, Ray backend).

The function gets a Messenger over the simulation's Grid; its return value comes back to the
test. Node side: this project's ClientApp with every registered handler.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from flwr.app import ConfigRecord, Context, RecordDict
from flwr.serverapp import Grid, ServerApp

from fedrec.transport.messenger import Messenger
from fedrec.wire.diagnostics import DIAG
from fl_app.simulation import simulate

#: What the diagnostic tests run with: the diagnostic actions, and plain and CKKS sums opted in
#: (the comparisons need a plain sum; the node policy's safe defaults refuse both).
DIAGNOSTIC_APP = {"extra_modules": ["clients.diagnostics"],
                  "policy": {"allow-plain": True, "allow-ckks": True}}


def run_on_simulated_nodes(fn: Callable[[Messenger], Any], num_nodes: int,
                           timeout: float = 60.0) -> Any:
    from fl_app.client_app import build_client_app

    box: dict[str, Any] = {}
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        messenger = Messenger(grid, timeout=timeout)
        messenger.node_ids(min_nodes=num_nodes)
        try:
            box["value"] = fn(messenger)
        except BaseException as exc:  # hand the failure back to the test
            box["error"] = exc

    simulate(app, build_client_app(**DIAGNOSTIC_APP), num_nodes)
    if "error" in box:
        raise box["error"]
    return box["value"]


def diag_request(seed: int, shapes: dict[str, tuple[int, ...]]) -> RecordDict:
    """A ``diag_secure_sum`` request: every node answers known vectors of these shapes."""
    return RecordDict({DIAG: ConfigRecord({"seed": seed,
                                           **{k: list(v) for k, v in shapes.items()}})})


def diag_expected(seed: int, shapes: dict[str, tuple[int, ...]],
                  partitions: list[int]) -> dict[str, np.ndarray]:
    """The plain sum over ``partitions`` of what ``diag_request`` makes the nodes answer."""
    from clients.diagnostics import diagnostic_vector

    return {name: sum(diagnostic_vector(seed + i, p, shape) for p in partitions)
            for i, (name, shape) in enumerate(sorted(shapes.items()))}


def run_in_process(overrides: dict[str, Any], num_nodes: int = 4, *,
                   node_policy: dict[str, Any] | None = None, quiet: bool = True,
                   **_: Any) -> dict[str, Any]:
    """The record :func:`fl_app.simulation.run_in_simulation` returns, from the same
    ServerApp code (``run_protocol``) and the real ClientApp on the in-process
    :class:`tests.localgrid.LocalGrid` instead of Ray: the protocol's messages and
    arithmetic are the same, without seconds of Ray start-up per run. Each protocol keeps
    at least one test on a real Flower simulation."""
    from fl_app.client_app import build_client_app
    from fl_app.registry import client_module, resolve_config
    from fl_app.server_app import run_protocol
    from tests.localgrid import LocalGrid

    cfg = resolve_config(overrides)
    extra = [m for m in [client_module(str(cfg["protocol"]))] if m]
    with LocalGrid(build_client_app(extra, policy=node_policy or {}), num_nodes) as grid:
        return run_protocol(grid, cfg)


def run_on_local_nodes(fn: Callable[[Messenger], Any], num_nodes: int,
                       timeout: float = 60.0) -> Any:
    """:func:`run_on_simulated_nodes` on the in-process grid: the same ClientApp (diagnostic
    actions added) and Flower messages, without Ray's start-up."""
    from fl_app.client_app import build_client_app
    from tests.localgrid import LocalGrid

    with LocalGrid(build_client_app(**DIAGNOSTIC_APP), num_nodes) as grid:
        messenger = Messenger(grid, timeout=timeout)
        messenger.node_ids(min_nodes=num_nodes)
        return fn(messenger)
