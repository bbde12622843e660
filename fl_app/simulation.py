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
from fl_app.config import run_name
from fl_app.quiet import quiet_flower_noise
from fl_app.registry import load_strategy_class, resolve_config
from fl_app.results import print_run_table, write_run

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


def simulate(server_app: Any, client_app: Any, num_nodes: int,
             backend_config: dict[str, Any] | None = None, verbose_flower: bool = False) -> None:
    """Flower's in-process simulation (Ray backend) with a quiet console: Flower at WARNING
    unless ``verbose_flower``, its two noise lines dropped, Ray's GPU-env FutureWarning
    answered as Ray asks (``RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO=0``: no GPUs here anyway)."""
    from flwr.simulation import run_simulation

    if not verbose_flower:
        logging.getLogger("flwr").setLevel(logging.WARNING)
    quiet_flower_noise()
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        run_simulation(server_app=server_app, client_app=client_app, num_supernodes=num_nodes,
                       backend_config=backend_config or DEFAULT_BACKEND)


def run_in_simulation(overrides: Mapping[str, Any] | None = None, num_nodes: int = 4, *,
                      quiet: bool = False, backend_config: dict[str, Any] | None = None,
                      verbose_flower: bool = False, compare: bool = False,
                      node_policy: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Run the configured protocol on ``num_nodes`` simulated SuperNodes; return its record.

    ``node_policy``: every simulated node's privacy policy (``clients/policy.py``), e.g.
    ``{"allow-plain": True}`` for ``aggregator = plain``; None reads ``$FEDREC_NODE_POLICY``
    (default: the safe policy, which refuses plain sums, seeded Omega and sparse transport).
    It is built into the ClientApp, never sent by the server.

    ``compare``: afterwards, on this machine (which holds all the data in a simulation), run
    the protocol's centralized reference and the item-popularity baseline and add them to
    the record and its table (``record["comparison"]``). Raises the ServerApp's exception
    (e.g. an unknown protocol, a node that timed out) as the same exception type, after
    Flower has shut the simulation down.
    """
    cfg = resolve_config(overrides)  # unknown keys and protocols fail before Ray starts

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
    server_app = make_server_app(cfg, on_result=box.update, quiet=quiet or compare)
    simulate(server_app, build_client_app(extra, policy=node_policy), num_nodes, backend_config,
             verbose_flower)
    if not box:
        raise RuntimeError("the simulation ended without a result (see the log above)")
    if compare:
        box["comparison"] = compare_with_references(cfg, protocol_cls, box)
        write_run(box, run_name(cfg))
        if not quiet:
            print_run_table(box)
            logging.getLogger("fedrec").info("results written to %s", box["results_path"])
    return box


def compare_with_references(cfg: Mapping[str, Any], protocol_cls: type,
                            record: Mapping[str, Any]) -> dict[str, Any]:
    """The federated metrics beside the protocol's centralized reference (``reference(data)``
    on its strategy, if it has one) and item popularity, each on the same split, with the
    reference's wall time for the federated/centralized ratio."""
    import time

    from fl_app.recsys.metrics import popularity_sums

    log = logging.getLogger("fedrec")
    data = load_dataset(DatasetSpec.from_config(cfg))
    out: dict[str, Any] = {"federated": dict(record["metrics"])}
    strategy = protocol_cls.from_run_config(cfg)
    if hasattr(strategy, "reference"):
        log.info("centralized reference (same math, all data in one process)")
        t0 = time.perf_counter()
        out["centralized"] = strategy.reference(data)
        out["centralized_seconds"] = time.perf_counter() - t0
    out["popularity"] = popularity_sums(data.train, data.test).means()
    return out
