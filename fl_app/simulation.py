"""Run a protocol in a Flower simulation from Python (the engine behind run_simulation.py).

Uses ``flwr.simulation.run_simulation`` (Ray backend) with this project's ServerApp and
ClientApp. The partition scheme decides how many nodes there are when it is ``user`` (one
per user); otherwise ``num_nodes`` is taken as given.
"""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Mapping
from typing import Any

from datasets import DatasetSpec, load_dataset
from fl_app.registry import load_strategy_class, resolve_config

#: One CPU per simulated node's worker: with 2 cores, two ClientApps run at once.
DEFAULT_BACKEND: dict[str, Any] = {
    "client_resources": {"num_cpus": 1, "num_gpus": 0.0},
    "init_args": {"include_dashboard": False, "log_to_driver": True},
}


def backend_config_for(client_cpus: int) -> dict[str, Any]:
    """The default backend with ``client_cpus`` CPUs per ClientApp worker: fewer workers run
    at once (each node's memory peak is paid once per worker), each with more threads."""
    if client_cpus < 1:
        raise ValueError(f"client_cpus must be >= 1, got {client_cpus}")
    return {**DEFAULT_BACKEND, "client_resources": {"num_cpus": client_cpus, "num_gpus": 0.0}}


def _ship_by_value(modules: list[str]) -> None:
    """Send a user protocol's node module to the simulation's workers with the ClientApp
    (by value), so it need not be importable there: Ray keeps one worker environment per
    process, fixed when the first simulation started."""
    import importlib

    import ray.cloudpickle

    for name in modules:
        module = importlib.import_module(name)
        if not name.startswith(("clients.", "examples.")):  # the project's own: by reference
            ray.cloudpickle.register_pickle_by_value(module)


def run_in_simulation(overrides: Mapping[str, Any] | None = None, num_nodes: int = 4, *,
                      quiet: bool = False, backend_config: dict[str, Any] | None = None,
                      verbose_flower: bool = False) -> dict[str, Any]:
    """Run the configured protocol on ``num_nodes`` simulated SuperNodes; return its record.

    Raises the ServerApp's exception (e.g. an unknown protocol, a node that timed out) as
    the same exception type, after Flower has shut the simulation down.
    """
    cfg = resolve_config(overrides)  # unknown keys and protocols fail before Ray starts
    from flwr.simulation import run_simulation

    from fl_app.client_app import build_client_app
    from fl_app.server_app import make_server_app

    # Fail fast, before Ray starts: missing or malformed data files. In a local simulation the
    # data is on this machine, and loading it here also fills the disk cache the node
    # processes read their rows from.
    protocol_cls = load_strategy_class(str(cfg["protocol"]))
    if cfg.get("strategy"):
        load_strategy_class(str(cfg["strategy"]))
    # A protocol's own node module runs in this simulation's ClientApp (the user's code, on
    # the user's machine); a deployed node imports only what its operator lists.
    extra = [m for m in [getattr(protocol_cls, "clients", "")] if m]
    _ship_by_value(extra)
    load_dataset(DatasetSpec.from_config(cfg))
    box: dict[str, Any] = {}
    server_app = make_server_app(cfg, on_result=box.update, quiet=quiet)
    if not verbose_flower:
        logging.getLogger("flwr").setLevel(logging.WARNING)
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        run_simulation(
            server_app=server_app,
            client_app=build_client_app(extra),
            num_supernodes=num_nodes,
            backend_config=backend_config or DEFAULT_BACKEND,
        )
    if not box:
        raise RuntimeError("the simulation ended without a result (see the log above)")
    return box
