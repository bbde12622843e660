"""A simulated run's plan: what is settled before Flower starts, settled in one place.

A local simulation knows what a deployment learns only at the handshake: its nodes' policy,
their number and roles, and the data (it is on this machine). So a run that could only wait
or fail on its nodes is refused here, every refusal at once, and what the run needs is
worked out once from the keys it names: the typed config (``fl_app/registry.py``), the
results file it claims, the strategy built and checked against the simulated federation,
the protocol's node module and the data description for the ClientApp. That is the
:class:`RunPlan`; what runs it (``fl_app/simulation.py``) takes it as it is and derives
nothing from the config again.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clients.policy import NodePolicy
from datasets import DatasetSpec, describe, load_dataset
from datasets.errors import DataError
from datasets.partition import PartitionSpec, partition_users
from fedrec.config import ConfigError, RunConfig, run_name
from fedrec.results import release_run, reserve_run, results_dir
from fl_app.registry import build_strategy, client_module, protocols, resolve_config
from strategies.base import ProtocolStrategy, RoleNeed, check_roles
from strategies.policy_needs import PolicyNeed, unmet
from strategies.refusals import ChecksCatalogue, SettingRefused


@dataclass(frozen=True)
class RunPlan:
    """One simulated run, resolved, claimed and checked before Flower starts."""

    #: The run's typed config; its ``run-name`` is the results file the run claimed.
    cfg: RunConfig
    #: The protocol, built once from ``cfg`` (its ``strategy.cfg``) and checked.
    strategy: ProtocolStrategy
    #: Every simulated node's privacy policy: built into the ClientApp, never sent.
    policy: NodePolicy
    num_nodes: int
    #: The protocol's own node module (none for a protocol without one), which the
    #: simulation's ClientApp loads beside the built-in ones.
    client_modules: tuple[str, ...]
    #: The data description every simulated node offers, as a deployed SuperNode's operator
    #: sets it in node config: never sent by the server.
    data: Mapping[str, Any]

    @property
    def name(self) -> str:
        """The results file stem the run claimed."""
        return run_name(self.cfg)

    @property
    def results_path(self) -> Path:
        """Where the run's results go (``results/runs/<name>.json``)."""
        return results_dir() / "runs" / f"{self.name}.json"


@contextlib.contextmanager
def plan_run(overrides: Mapping[str, Any] | None, num_nodes: int,
             node_policy: NodePolicy | Mapping[str, Any] | None = None, *,
             overwrite: bool = False) -> Iterator[RunPlan]:
    """The plan of a run of ``overrides`` on ``num_nodes`` simulated nodes, its results file
    claimed while the block runs.

    The quick refusals come first: the config (:func:`resolve_config`: a key unknown, or
    not read by the protocol), the node policy, the results file (``reserve_run``: a
    ``run-name`` given whose file exists is refused unless ``overwrite``; a default name
    whose file exists becomes ``<name>-2``, ...); then :func:`preflight`, which may load the
    data. A claim no results replaced (a refusal, a run that wrote nothing) is released
    when the block ends, so nothing is lost and no empty file is left."""
    cfg = resolve_config(overrides)
    module = client_module(cfg["protocol"])
    policy = resolve_node_policy(node_policy)
    name = reserve_run(run_name(cfg), explicit=bool(cfg["run-name"]), overwrite=overwrite)
    cfg = RunConfig({**cfg, "run-name": name})
    try:
        strategy = preflight(cfg, num_nodes, policy)
        yield RunPlan(cfg, strategy, policy, num_nodes, (module,) if module else (),
                      describe(cfg))
    finally:
        release_run(name)


def resolve_node_policy(node_policy: NodePolicy | Mapping[str, Any] | None) -> NodePolicy:
    """The simulated nodes' policy (None: ``$FEDREC_NODE_POLICY``), checked before Flower
    starts: a misspelt or out-of-range key is a ConfigError, not a node failure later."""
    try:
        return NodePolicy.coerce(node_policy)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def check_federation_size(cfg: Mapping[str, Any], num_nodes: int, policy: NodePolicy) -> None:
    """Refuse, before Flower starts, a simulation that could only wait or fail on its nodes.

    Zero nodes, or fewer than ``min-nodes``, would make the handshake wait
    ``startup-timeout`` for nodes that never connect; too few user nodes for the
    partition scheme fail on every node; a built-in protocol's SecAgg+ sums need the node
    policy's ``min-survivors`` user nodes (a user protocol may not sum at all, so it is
    left to its nodes).
    """
    if num_nodes < 1:
        raise ConfigError(f"simulated nodes (--nodes / num_nodes): expected at least 1, got "
                          f"{num_nodes}")
    if cfg["min-nodes"] > num_nodes:
        raise ConfigError(f"run config 'min-nodes' = {cfg['min-nodes']}: expected at most the "
                          f"{num_nodes} simulated nodes (--nodes / num_nodes); the run would "
                          f"wait startup-timeout ({cfg['startup-timeout']:g} s) for the rest")
    users = num_nodes - cfg["item-servers"]
    if users < 1:
        raise ConfigError(f"run config 'item-servers' = {cfg['item-servers']}: expected fewer "
                          f"than the {num_nodes} simulated nodes (--nodes / num_nodes), so "
                          "that some hold user rows")
    if (cfg["aggregator"] == "secagg+" and cfg["protocol"] in protocols()
            and users < policy.min_survivors):
        raise ConfigError(
            f"{users} user node(s) (--nodes / num_nodes {num_nodes}, item-servers "
            f"{cfg['item-servers']}): a SecAgg+ sum needs at least the node policy's "
            f"min-survivors = {policy.min_survivors} (with fewer, each node could learn the "
            "others' inputs from the sum); use more nodes, or aggregator = plain with the "
            "node policy allow-plain=true")


class PolicyNotAllowed(ConfigError):
    """The simulated nodes' policy refuses what the run needs (``needs``: the unmet ones);
    the message says how to opt in from Python, and ``run_simulation.py`` names its own
    ``--node-policy`` flag instead."""

    def __init__(self, needs: list[PolicyNeed], policy: Mapping[str, Any]) -> None:
        self.needs = needs
        self.refused = "; ".join(n.why for n in needs)
        self.has = ", ".join(n.has(policy) for n in needs)
        keys = ", ".join(f"'{n.key}': {n.opt_in.split('=', 1)[1].replace('true', 'True')}"
                         for n in needs)
        super().__init__(
            f"every simulated node would refuse this run's {self.refused} (node policy "
            f"{self.has}); opt in with run_in_simulation(..., node_policy={{{keys}}}) or "
            f"FEDREC_NODE_POLICY='{','.join(n.opt_in for n in needs)}'")


def policy_needs_of(cfg: Mapping[str, Any], strategy: ProtocolStrategy
                    ) -> tuple[PolicyNeed, ...]:
    """What the run asks of every node's policy: a stock strategy driving the protocol's
    nodes (the protocol's ``STOCK_NEEDS``) or the protocol's own ``policy_needs()``."""
    return strategy.STOCK_NEEDS if cfg.get("strategy") else strategy.policy_needs()


def check_node_policy(cfg: Mapping[str, Any], strategy: ProtocolStrategy,
                      policy: NodePolicy) -> None:
    """Refuse, before Flower starts, a run every simulated node would refuse (they share
    ``policy``): the same check the handshake makes on each node's reported policy."""
    config = policy.as_config()
    missing = unmet(policy_needs_of(cfg, strategy), config)
    if missing:
        raise PolicyNotAllowed(missing, config)


def check_simulated_roles(cfg: Mapping[str, Any], strategy: ProtocolStrategy,
                          num_nodes: int) -> None:
    """Refuse, before Flower starts, a federation the protocol cannot run on: a simulation
    assigns the roles itself (the last ``item-servers`` partitions are item servers, the
    others users: ``NodeContext.role``), so the handshake's role check can run here first."""
    needs = strategy.federation
    if cfg.get("strategy"):
        return
    k = cfg["item-servers"]
    roles = {p: "item-server" if p >= num_nodes - k else "user" for p in range(num_nodes)}
    try:
        check_roles(roles, tuple(needs), lambda p: f"simulated node {p}", cfg["protocol"])
    except ValueError as exc:
        fits = _item_servers_that_fit(tuple(needs), k)
        if fits is not None:
            raise SettingRefused(str(exc), "item-servers", fits) from None
        raise ConfigError(f"{exc}; set the run config 'item-servers' (--set item-servers=N) "
                          "or --nodes") from None


def _item_servers_that_fit(needs: tuple[RoleNeed, ...], k: int) -> int | None:
    """The item-server count nearest ``k`` that the protocol's needs allow (None when the
    item servers are not what is wrong), so a role refusal can name the value to set."""
    bounds = [(n.min, n.max) for n in needs if "item-server" in n.roles]
    if not bounds:
        return 0 if k else None
    low, high = bounds[0]
    fit = max(k, low) if high is None else min(max(k, low), high)
    return None if fit == k else fit


def check_partitions(cfg: Mapping[str, Any], num_nodes: int, policy: NodePolicy) -> int:
    """Partition the data as the user nodes will (DataError naming an empty partition or a
    scheme that does not fit), before Flower starts instead of on every node; return the
    catalogue size (what the strategy's settings must fit: :class:`ChecksCatalogue`). A synthetic
    dataset's size is checked first against the nodes' ``memory-budget-mb`` (what each node
    checks before generating it), so an oversized one is refused before it is generated."""
    users = num_nodes - cfg["item-servers"]
    spec = DatasetSpec.from_config(cfg)  # ConfigError naming the key, e.g. a path as name
    if spec.name == "synthetic":
        from datasets.synthetic import footprint_bytes

        mib = footprint_bytes(spec.synthetic_users, spec.synthetic_items, spec.synthetic_rank,
                              spec.synthetic_density, spec.synthetic_clusters) / 2**20
        if mib > policy.memory_budget_mb:
            raise ConfigError(
                f"run config synthetic-users = {spec.synthetic_users}, synthetic-items = "
                f"{spec.synthetic_items}: generating this dataset needs about {mib:,.0f} MiB, "
                f"more than the nodes' memory-budget-mb = {policy.memory_budget_mb:g} (each "
                "node generates it); use smaller sizes or raise the node policy's "
                "memory-budget-mb")
    data = load_dataset(spec)
    partition_users(data, PartitionSpec.from_config(cfg, users))
    return int(data.n_items)


class RunRefused(ConfigError):
    """Every refusal a simulated run meets before Flower starts (``problems``, in the order
    met), raised together: one try names every change, not one change per try."""

    def __init__(self, problems: list[ValueError]) -> None:
        self.problems = problems
        super().__init__("; ".join(str(p) for p in problems))


def _build_strategy(cfg: Mapping[str, Any]) -> ProtocolStrategy:
    """The run's strategy; its own config checks (e.g. a misspelt filter name) as
    ConfigError."""
    try:
        return build_strategy(cfg)
    except ConfigError:
        raise
    except ValueError as exc:
        raise ConfigError(f"run config of protocol {cfg['protocol']!r}: {exc}") from None


def preflight(cfg: Mapping[str, Any], num_nodes: int, policy: NodePolicy) -> ProtocolStrategy:
    """The run's strategy, built once and checked against the simulated federation before
    Ray starts: federation size, the protocol's own settings, node policy, roles, the
    partitions and the catalogue size. In a local simulation the data is on this machine,
    and loading it here also fills the disk cache the node processes read their rows from.

    Every check runs: the refusals are raised together (:class:`RunRefused`; a single one
    as itself). A :class:`SettingRefused` names a value that works; the checks after it
    run with that value, so they report what the corrected run would still meet."""
    problems: list[ValueError] = []
    fixed = RunConfig(cfg) if isinstance(cfg, RunConfig) else dict(cfg)  # the fixes: typed

    def attempt(check: Callable[[], Any]) -> Any:
        try:
            return check()
        except SettingRefused as exc:
            problems.append(exc)
            fixed[exc.key] = exc.value
        except (ConfigError, DataError) as exc:
            problems.append(exc)
        return None

    strategy, fixed_keys = None, set()
    while strategy is None:  # each fix may uncover the strategy's next setting check
        strategy = attempt(lambda: _build_strategy(fixed))
        last = problems[-1] if strategy is None else None
        if not isinstance(last, SettingRefused) or last.key in fixed_keys:
            break
        fixed_keys.add(last.key)
    sized = attempt(lambda: check_federation_size(fixed, num_nodes, policy) is None)
    if strategy is not None:
        attempt(lambda: check_node_policy(fixed, strategy, policy))
        attempt(lambda: check_simulated_roles(fixed, strategy, num_nodes))
        if sized:
            n_items = attempt(lambda: check_partitions(fixed, num_nodes, policy))
            if n_items is not None and isinstance(strategy, ChecksCatalogue):
                attempt(lambda: strategy.check_catalogue(n_items))
    if len(problems) == 1:
        raise problems[0]
    if problems:
        raise RunRefused(problems)
    assert strategy is not None  # built from ``cfg`` itself: nothing needed a fix
    return strategy

