"""Run a protocol in a Flower simulation from Python (the engine behind run_simulation.py).

Uses ``flwr.simulation.run_simulation`` (Ray backend) with this project's ServerApp and
ClientApp. A run is planned first (``fl_app/plan.py``: config, results file, strategy and
every check before Flower starts); this module runs the plan and keeps the console and the
processes in order around it. The partition scheme decides how many nodes there are when it
is ``user`` (one per user); otherwise ``num_nodes`` is taken as given.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import sys
import threading
import time
import uuid
import warnings
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from clients.boundary import NonFiniteRequest
from clients.policy import NodePolicy, PolicyError
from datasets import DatasetSpec, load_dataset
from datasets.errors import DataError
from fedrec.config import ConfigError
from fedrec.results import print_run_table, write_run
from fedrec.secure.identity import IdentityError
from fedrec.transport.messenger import STOP
from fedrec.wire.sums import AggregationError
from fl_app.plan import RunPlan, plan_run
from fl_app.quiet import quiet_flower_noise
from strategies.base import ProtocolStrategy

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


#: Node errors that are answers to the run's input (a refusal by the node's policy, bad data
#: or config, a roster that does not fit), not bugs: the ServerApp reports each in one line
#: naming the node, so Flower's copy of the node's traceback is dropped from the console.
REFUSALS: tuple[type[Exception], ...] = (
    PolicyError, AggregationError, IdentityError, DataError, ConfigError, NonFiniteRequest)
#: Flower's header before each ClientApp traceback; the traceback itself says the same.
_HEADER = "An exception was raised when processing a message by"
#: An exception line of a traceback: ``package.module.Class: message``.
_EXCEPTION_LINE = re.compile(r"^\s*([A-Za-z_][\w.]*\.[A-Za-z_]\w*): ", re.M)


def raised_types(text: str) -> list[type]:
    """The exception classes a traceback ``text`` names (``module.Class: ...`` lines): a
    node's exception reaches the driver as Ray's text only (its pickled wrapper loses the
    ``__cause__``), so its type is found by its qualified name among the modules this
    process has loaded; a log line never makes it import one."""
    found = []
    for qualified in _EXCEPTION_LINE.findall(text):
        module, _, name = qualified.rpartition(".")
        cls = getattr(sys.modules.get(module), name, None)
        if isinstance(cls, type):
            found.append(cls)
    return found


class NodeRefusalFilter(logging.Filter):
    """Drops Flower's ERROR records of a node's refusal (an exception of a :data:`REFUSALS`
    type, subclasses included) and the bare header before each; any other node exception
    (e.g. a user's protocol code) keeps its traceback on the console."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.ERROR:
            return True
        message = record.getMessage()
        if message.startswith(_HEADER):
            return False
        return not any(issubclass(cls, REFUSALS) for cls in raised_types(message))


_REFUSAL_FILTER = NodeRefusalFilter()


def _ship_by_value(modules: Iterable[str]) -> None:
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
    logging.getLogger("fedrec").info("starting Flower's simulation: %d node(s) on Ray",
                                     num_nodes)
    quiet_flower_noise()
    flwr_log = logging.getLogger("flwr")
    if _REFUSAL_FILTER not in flwr_log.filters:
        flwr_log.addFilter(_REFUSAL_FILTER)
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")
    with warnings.catch_warnings(), run_processes_marked() as token, stop_on_interrupt(token):
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            run_simulation(server_app=server_app, client_app=client_app,
                           num_supernodes=num_nodes,
                           backend_config=backend_config or DEFAULT_BACKEND)
        except BaseException:
            stop_server_thread()
            raise


#: The environment variable that marks every process a simulation starts (Ray's GCS,
#: raylet, workers: they inherit the driver's environment), so its end can find them all,
#: even those Ray's shutdown left behind or that lost their parent.
RUN_TOKEN_VAR = "FEDREC_SIMULATION_TOKEN"
#: Seconds Ray's own shutdown gets to end its processes before they are sent SIGTERM, and
#: SIGTERM before SIGKILL.
PROCESS_EXIT_SECONDS = 5.0


def processes_marked(token: str) -> list[int]:
    """Pids of the live processes whose environment carries ``token`` (this process aside;
    a zombie's environment reads empty)."""
    needle = f"{RUN_TOKEN_VAR}={token}".encode() + b"\0"
    found = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        pid = int(environ.parent.name)
        try:
            if pid != os.getpid() and needle in environ.read_bytes():
                found.append(pid)
        except OSError:  # gone, or not ours to read
            continue
    return found


def end_marked_processes(token: str, grace: float = PROCESS_EXIT_SECONDS) -> list[int]:
    """Wait ``grace`` s for the processes marked ``token`` to exit, then SIGTERM and after
    ``grace`` s more SIGKILL what is left: a stopped or finished run leaves no process.
    Returns the pids that had to be signalled."""
    signalled: list[int] = []
    for sig in (None, signal.SIGTERM, signal.SIGKILL):
        deadline = time.monotonic() + (grace if sig != signal.SIGKILL else 1.0)
        alive = processes_marked(token)
        for pid in alive if sig is not None else ():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
            signalled.append(pid)
        while alive and time.monotonic() < deadline:
            time.sleep(0.1)
            alive = processes_marked(token)
        if not alive:
            break
    return sorted(set(signalled))


@contextlib.contextmanager
def run_processes_marked() -> Iterator[str]:
    """Mark the processes started inside the block (:data:`RUN_TOKEN_VAR`, a fresh token)
    and end them all when it exits, however it exits. Only where ``/proc`` lists processes
    (Linux); elsewhere Ray's own shutdown is all there is."""
    token = uuid.uuid4().hex
    previous = os.environ.get(RUN_TOKEN_VAR)
    os.environ[RUN_TOKEN_VAR] = token
    try:
        yield token
    finally:
        if previous is None:
            os.environ.pop(RUN_TOKEN_VAR, None)
        else:
            os.environ[RUN_TOKEN_VAR] = previous
        if Path("/proc/self/environ").exists():
            left = end_marked_processes(token)
            if left:
                logging.getLogger("fedrec").debug("ended %d process(es) Ray left: %s",
                                                  len(left), left)


#: The name Flower's simulation gives the ServerApp's thread (its target function's).
_SERVERAPP_THREAD = "server_th_with_start_checks"


def stop_server_thread(wait: float = 10.0) -> None:
    """After the simulation runtime failed (e.g. Ray did not start on a loaded machine), stop
    the ServerApp's thread too: it is no daemon and would keep the process alive waiting for
    nodes up to ``startup-timeout``. :data:`STOP` ends its wait at the next poll."""
    STOP.set()
    for thread in threading.enumerate():
        if _SERVERAPP_THREAD in thread.name and thread is not threading.current_thread():
            thread.join(wait)


#: Seconds a Ctrl-C waits for the run to stop at its next wait for nodes (and write its
#: partial results) before the process stops at once.
INTERRUPT_GRACE_SECONDS = 20.0


def _stop_now(message: str, token: str = "") -> None:
    """Stop this process at once (second Ctrl-C, or no stop within the grace time), with
    the processes the run started (marked ``token``): not every Ray process dies with its
    parent."""
    print(message, file=sys.stderr, flush=True)
    if token:
        for pid in processes_marked(token):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
    os._exit(130)


@contextlib.contextmanager
def stop_on_interrupt(token: str = "") -> Iterator[None]:
    """Ctrl-C during a simulation stops the run, not the interpreter mid-way: it sets
    :data:`fedrec.transport.messenger.STOP`, the ServerApp stops at its next wait for nodes
    (raising ``RunInterrupted``), writes its partial results, and Flower shuts Ray down as
    after any run. A second Ctrl-C, or no stop within :data:`INTERRUPT_GRACE_SECONDS` (a
    long local step), stops the process at once, and the processes marked ``token``
    (:func:`run_processes_marked`). Only in the main thread (where Python delivers
    signals); elsewhere a no-op."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    STOP.clear()
    timers: list[threading.Timer] = []

    def on_interrupt(signum: int, frame: Any) -> None:
        if STOP.is_set():
            _stop_now("interrupted again: stopping at once", token)
        STOP.set()
        print("interrupted: stopping the run and writing its partial results "
              "(Ctrl-C again to stop at once)", file=sys.stderr, flush=True)
        timer = threading.Timer(INTERRUPT_GRACE_SECONDS, _stop_now,
                                (f"the run did not stop within {INTERRUPT_GRACE_SECONDS:g} s: "
                                 "stopping at once", token))
        timer.daemon = True
        timer.start()
        timers.append(timer)

    previous = signal.signal(signal.SIGINT, on_interrupt)
    try:
        yield
    finally:  # the run stopped: what is left (ending its processes) needs no deadline
        for timer in timers:
            timer.cancel()
        signal.signal(signal.SIGINT, previous)
        STOP.clear()


def run_in_simulation(overrides: Mapping[str, Any] | None = None, num_nodes: int = 4, *,
                      quiet: bool = False, backend_config: dict[str, Any] | None = None,
                      verbose_flower: bool = False, compare: bool = False,
                      node_policy: NodePolicy | Mapping[str, Any] | None = None,
                      overwrite: bool = False) -> dict[str, Any]:
    """Run the configured protocol on ``num_nodes`` simulated SuperNodes; return its record.

    ``overrides``: the keys the run names, each one its protocol reads (the others take
    their defaults), or the run's whole config already resolved (a :class:`RunConfig`, as
    ``run_simulation.py`` hands it down).

    ``node_policy``: every simulated node's privacy policy (``clients/policy.py``), e.g.
    ``{"allow-plain": True}`` for ``aggregator = plain``; None reads ``$FEDREC_NODE_POLICY``
    (default: the safe policy, which refuses plain sums, seeded Omega and sparse transport).
    It is built into the ClientApp, never sent by the server.

    ``compare``: afterwards, on this machine (which holds all the data in a simulation), run
    the protocol's centralized reference and the item-popularity baseline and add them to
    the record and its table (``record["comparison"]``). Raises the ServerApp's exception
    (e.g. an unknown protocol, a node that timed out) as the same exception type, after
    Flower has shut the simulation down. Input that could only hang or fail on the nodes
    (:func:`fl_app.plan.check_federation_size`, :func:`fl_app.plan.check_partitions`, a bad
    ``node_policy``) raises ConfigError or DataError before Flower starts.

    ``overwrite``: the results file (``results/runs/<run-name>.json``) is claimed before
    Flower starts, as ``run_simulation.py`` does (:func:`fl_app.plan.plan_run`): a
    ``run-name`` given in ``overrides`` whose file exists raises ResultsError unless
    ``overwrite``; a default name whose file exists becomes ``<name>-2``, ``<name>-3``, ...
    (the record's ``config`` says which).
    """
    with plan_run(overrides, num_nodes, node_policy, overwrite=overwrite) as plan:
        return run_plan(plan, quiet=quiet, backend_config=backend_config,
                        verbose_flower=verbose_flower, compare=compare)


def run_plan(plan: RunPlan, *, quiet: bool = False,
             backend_config: dict[str, Any] | None = None, verbose_flower: bool = False,
             compare: bool = False) -> dict[str, Any]:
    """Run ``plan`` in Flower's simulation (:func:`run_in_simulation` says what each option
    does) and return its record: the ServerApp runs the plan's strategy, the ClientApp
    loads its node modules with its node policy and data description."""
    from fl_app.client_app import build_client_app
    from fl_app.server_app import RunFailedError, make_server_app

    # A protocol's own node module runs in this simulation's ClientApp (the user's code, on
    # the user's machine); a deployed node imports only what its operator lists.
    _ship_by_value(plan.client_modules)
    box: dict[str, Any] = {}
    server_app = make_server_app(plan.strategy, on_result=box.update, quiet=quiet or compare)
    client_app = build_client_app(plan.client_modules, policy=plan.policy, data=plan.data)
    try:
        simulate(server_app, client_app, plan.num_nodes, backend_config, verbose_flower)
    except RunFailedError as exc:  # the ServerApp's own exception, as documented above
        if isinstance(exc.__cause__, Exception):
            raise exc.__cause__ from None
        raise
    if not box:
        raise RuntimeError("the simulation ended without a result (see the log above)")
    if compare:
        box["comparison"] = compare_with_references(plan.cfg, plan.strategy, box)
        write_run(box, plan.name)
        if not quiet:
            print_run_table(box)
            print_wall_times(box)
    if not quiet:  # after the table (the ServerApp prints it when there is no comparison)
        why = unseeded_randomness(plan.cfg, plan.strategy)
        if why:
            print(f"note: not reproducible by seed: {why}", flush=True)
    if compare and not quiet:
        logging.getLogger("fedrec").info("results written to %s", box["results_path"])
    return box


def unseeded_randomness(cfg: Mapping[str, Any], strategy: ProtocolStrategy) -> str:
    """Why this run's numbers change when the same command is run again with the same seed,
    as the protocol's strategy declares it (``unseeded_randomness``: a reason, "" when the
    seed fixes every draw); "" when a stock strategy drives the nodes."""
    return "" if cfg.get("strategy") else str(strategy.unseeded_randomness or "")


def print_wall_times(record: Mapping[str, Any]) -> None:
    """Wall time of the federated run beside the centralized reference's, so neither is
    mistaken for the other (the run table's wall time is the federated run's)."""
    from rich.console import Console
    from rich.table import Table

    comparison = record.get("comparison", {})
    table = Table(title="wall time")
    table.add_column("what")
    table.add_column("seconds", justify="right")
    table.add_row("federated run (all phases, all nodes)",
                  f"{float(record.get('seconds', 0.0)):.3g}")
    if "centralized_seconds" in comparison:
        table.add_row("centralized reference (one process)",
                      f"{comparison['centralized_seconds']:.3g}")
    Console().print(table)


def compare_with_references(cfg: Mapping[str, Any], strategy: ProtocolStrategy,
                            record: Mapping[str, Any]) -> dict[str, Any]:
    """The federated metrics beside the protocol's centralized reference (``reference(data)``
    on its strategy, if it has one) and item popularity, each on the same split, with the
    reference's wall time for the federated/centralized ratio."""
    from fedrec.recsys.metrics import popularity_sums

    log = logging.getLogger("fedrec")
    data = load_dataset(DatasetSpec.from_config(cfg))
    out: dict[str, Any] = {"federated": dict(record["metrics"])}
    if strategy.has_reference:
        log.info("centralized reference: %s.reference on all %d users x %d items in one "
                 "process (same math as the federated run, no federation)",
                 type(strategy).__name__, data.n_users, data.n_items)
        t0 = time.perf_counter()
        with still_running("centralized reference"):
            out["centralized"] = strategy.reference(data)
        out["centralized_seconds"] = time.perf_counter() - t0
        log.info("centralized reference done in %.1f s", out["centralized_seconds"])
    out["popularity"] = popularity_sums(data.train, data.test).means()
    return out


#: Seconds between "still running" lines of a long step that prints nothing of its own.
STILL_RUNNING_SECONDS = 30.0


@contextlib.contextmanager
def still_running(what: str, every: float | None = None) -> Iterator[None]:
    """Log ``<what> still running, <t> s`` every ``every`` seconds (default
    :data:`STILL_RUNNING_SECONDS`) until the block ends, from a daemon thread: a step without
    progress lines of its own (e.g. an exact SVD) then does not look hung."""
    import threading

    every = STILL_RUNNING_SECONDS if every is None else every
    done = threading.Event()
    t0 = time.perf_counter()

    def beat() -> None:
        while not done.wait(every):
            logging.getLogger("fedrec").info("%s still running, %.0f s", what,
                                             time.perf_counter() - t0)

    thread = threading.Thread(target=beat, name=f"still-running: {what}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
