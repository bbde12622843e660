"""What every protocol strategy provides to the ServerApp: the outcome record, the handshake,
and :class:`ProtocolStrategy`, the base of multi-phase protocols."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

from flwr.app import ConfigRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

from fedrec.config import CORE_KEYS, ConfigError, Key, RunConfig, key_table, merge_config
from fedrec.recsys.metrics import RankingSums
from fedrec.transport.aggregators import Aggregator, in_node_order
from fedrec.transport.factory import make_aggregator
from fedrec.transport.messenger import Messenger
from fedrec.wire import handshake as handshake_wire
from fedrec.wire.evaluation import RankingRequest, RankingSum
from fedrec.wire.handshake import HelloInfo
from fedrec.wire.message import Message
from fedrec.wire.sums import NoiseRequest, PlainSum
from strategies.policy_needs import PolicyNeed, aggregator_needs, check_node_policies

R = TypeVar("R", bound=Message)


def _action(request: Message) -> str:
    """The action a typed request is sent as (a reply type has none)."""
    if request.ACTION is None:
        raise TypeError(f"{type(request).__qualname__} is not a request (declare it with "
                        "@message(Action.X))")
    return request.ACTION


@dataclass
class RunOutcome:
    """What a protocol run returns: final metrics and a per-round history for plots."""

    metrics: dict[str, float] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)
    #: Protocol-specific privacy facts for the results (e.g. a DP ledger under ``"dp"``).
    privacy: dict[str, Any] = field(default_factory=dict)


def data_config(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """The data description of the run (dataset, split, seed, partition scheme), as the
    run expects every node to offer it.

    Only the description travels, and a node never takes it from the server: each node's
    operator sets its own (``clients/node.py``), and the node refuses a run whose
    description differs, naming the key. Every node loads its rows itself, so the
    interaction matrix never crosses the Grid.
    """
    from datasets import describe

    return describe(cfg)


@dataclass
class NodeInfo:
    """Public facts a node reported in the handshake."""

    node_id: int
    partition_id: int
    n_items: int
    n_users: int
    n_train_users: int
    role: str = "user"
    holds: tuple[str, ...] = ("rows",)


@dataclass(frozen=True)
class RoleNeed:
    """What a protocol needs of the nodes of some roles.

    ``roles``: the roles this line covers (e.g. ``("user", "silo")``); ``min``/``max``: how
    many such nodes the federation must have (``max=None``: no limit); ``holds``: what
    each of them must hold (``rows``, ``user-features``, ``user-attributes``,
    ``item-features``).
    """

    roles: tuple[str, ...]
    min: int = 1
    max: int | None = None
    holds: tuple[str, ...] = ()

    def describe(self) -> str:
        count = f"{self.min}..{'' if self.max is None else self.max}"
        held = f" holding {', '.join(self.holds)}" if self.holds else ""
        return f"{count} node(s) of role {' or '.join(self.roles)}{held}"


#: The default: one or more user nodes (or silos) with rows, nothing else.
USER_NODES: tuple[RoleNeed, ...] = (RoleNeed(("user", "silo"), min=1, holds=("rows",)),)


def check_roles(roles: Mapping[int, str], needs: tuple[RoleNeed, ...],
                label: Callable[[int], str], protocol: str) -> list[tuple[RoleNeed, list[int]]]:
    """Fail with an error naming the node unless every node's role is covered by a need and
    each need's node count is in range; return each need with its nodes. This much the
    roles alone decide, so a simulation checks it before Flower starts (it assigns them)."""
    covered = {role for need in needs for role in need.roles}
    for node, role in sorted(roles.items()):
        if role not in covered:
            raise ValueError(f"{label(node)} has role {role!r}, but protocol {protocol!r} "
                             f"takes only {' / '.join(n.describe() for n in needs)}")
    out = []
    for need in needs:
        members = sorted(n for n, r in roles.items() if r in need.roles)
        if len(members) < need.min or (need.max is not None and len(members) > need.max):
            listed = ", ".join(f"{label(n)}: {r}" for n, r in sorted(roles.items()))
            raise ValueError(f"protocol {protocol!r} needs {need.describe()}; the federation "
                             f"has {len(members)} ({listed})")
        out.append((need, members))
    return out


def check_federation(infos: Mapping[int, NodeInfo], needs: tuple[RoleNeed, ...],
                     label: Callable[[int], str], protocol: str) -> None:
    """Fail with an error naming the node and what was expected unless the federation fits.

    Every node's role must be covered by a need and each need's node count in range
    (:func:`check_roles`); each of a need's nodes must hold what it asks for.
    """
    for need, members in check_roles({n: i.role for n, i in infos.items()}, needs, label,
                                     protocol):
        for node in members:
            held = list(infos[node].holds) or "nothing"
            lacking = [h for h in need.holds if h not in infos[node].holds]
            if lacking:
                raise ValueError(
                    f"{label(node)} ({infos[node].role}) holds {held} but protocol "
                    f"{protocol!r} needs each {' or '.join(need.roles)} node to hold "
                    f"{', '.join(lacking)} (does the dataset have them?)")


def node_order(infos: Mapping[int, NodeInfo]) -> list[int]:
    """The fixed order every reduction runs in: by partition id, then node id."""
    return sorted(infos, key=lambda n: (infos[n].partition_id, n))


def handshake(messenger: Messenger, cfg: Mapping[str, Any], min_nodes: int = 1,
              needs: tuple[RoleNeed, ...] = USER_NODES,
              protocol: str | None = None,
              policy_needs: tuple[PolicyNeed, ...] = (),
              policy_roles: tuple[str, ...] = ()) -> dict[int, NodeInfo]:
    """Send the data config to every node, learn roles, partitions and the catalogue size.

    Names nodes ``"node <id> (partition <p>)"`` for every later error message, checks the
    federation against ``needs`` and every node's reported policy against ``policy_needs``
    (a refusal then comes here, before any data-dependent round, naming the node and its
    opt-in: ``strategies/policy_needs.py``; only the nodes of ``policy_roles`` when given,
    e.g. the roles that take part in the sums), and fails with a clear error if nodes disagree
    on the number of items (different data files). Returns the infos in :func:`node_order`.
    """
    # The first contact also pays each node's start (a simulation's Ray actors are created
    # when the first messages arrive, a process each importing Flower and the ClientApp), so
    # it gets its own, longer deadline than a later request.
    startup = max(messenger.timeout, float(cfg.get("startup-timeout", messenger.timeout)))
    nodes = messenger.node_ids(min_nodes=max(min_nodes, int(cfg.get("min-nodes", 1))),
                               wait=startup, timeout_key="startup-timeout")
    logging.getLogger("fedrec").info("handshake: contacting %d node(s) (each loads its data; "
                                     "a simulation first starts its workers)", len(nodes))
    replies = messenger.broadcast(
        handshake_wire.Action.HELLO,
        RecordDict({handshake_wire.DATA: ConfigRecord(data_config(cfg))}), nodes,
        phase="handshake", timeout=startup, timeout_key="startup-timeout")
    infos = {}
    policies: dict[int, dict[str, Any]] = {}
    for node, reply in replies.items():
        if HelloInfo.CONFIG not in reply.config_records:
            raise ValueError(f"{messenger.label(node)} answered the handshake without its "
                             f"'{HelloInfo.CONFIG}' record")
        info = HelloInfo.from_records(reply, messenger.label(node))
        infos[node] = NodeInfo(node, info.partition_id, info.n_items, info.n_users,
                               info.n_train_users, role=info.role, holds=tuple(info.holds))
        where = (f"partition {infos[node].partition_id}" if infos[node].role != "item-server"
                 else "item server")
        messenger.report.name_node(node, where, infos[node].partition_id, infos[node].role)
        if handshake_wire.POLICY in reply.config_records:  # what it accepts, for the results
            messenger.report.add_policy(node, reply.config_records[handshake_wire.POLICY])
            policies[node] = dict(reply.config_records[handshake_wire.POLICY])
        if info.identity is not None:
            messenger.report.add_identity(node, info.identity)
    item_counts = {i.n_items for i in infos.values()}
    if len(item_counts) != 1:
        detail = ", ".join(f"{messenger.label(n)}: {i.n_items}" for n, i in sorted(infos.items()))
        raise ValueError(f"nodes disagree on the number of items ({detail}); "
                         "they must load the same catalogue")
    check_federation(infos, needs, messenger.label, protocol or str(cfg.get("protocol", "")))
    check_node_policies(policy_needs, {n: p for n, p in policies.items()
                                       if not policy_roles or infos[n].role in policy_roles},
                        messenger.label)
    order = node_order(infos)
    messenger.report.set_order(order)
    return {n: infos[n] for n in order}


@dataclass
class Federation:
    """What a protocol works with after the handshake: the nodes in their fixed order, the
    aggregator the run config names, and one-line helpers for the usual rounds.

    ``send``, ``ask``, ``sum_of``, ``plain_replies`` and ``evaluate_ranking`` take a typed
    request (``fedrec/wire/message.py``), which encodes itself into Flower records, so a
    protocol states only its own logic and never spells a field.
    """

    messenger: Messenger
    cfg: Mapping[str, Any]
    infos: dict[int, NodeInfo]
    aggregator: Aggregator

    @property
    def nodes(self) -> list[int]:
        """Every node, in the fixed reduction order."""
        return list(self.infos)

    def of_role(self, *roles: str) -> list[int]:
        """The nodes of the given roles, in order."""
        return [n for n, i in self.infos.items() if i.role in roles]

    @property
    def n_items(self) -> int:
        return next(iter(self.infos.values())).n_items

    @property
    def max_users(self) -> int:
        """The most users any node holds (bounds of per-node counts in sums)."""
        return max(i.n_users for i in self.infos.values())

    def send(self, request: Message, *, nodes: list[int] | None = None,
             phase: str | None = None) -> dict[int, RecordDict]:
        """The typed ``request`` to every node (or ``nodes``); the raw replies by node."""
        return self.messenger.broadcast(_action(request), request.to_records(),
                                        self.nodes if nodes is None else nodes, phase=phase)

    def ask(self, request: Message, reply: type[R], *, nodes: list[int] | None = None,
            phase: str | None = None) -> dict[int, R]:
        """The typed ``request`` to every node (or ``nodes``); each reply read as ``reply``
        (its fields checked, naming the node)."""
        return {n: reply.from_records(content, f"node {n}")
                for n, content in self.send(request, nodes=nodes, phase=phase).items()}

    def sum_of(self, request: Message, reply: type[R], *, max_abs: float,
               phase: str | None = None, wire_dtype: str = "float64",
               noise: NoiseRequest | None = None) -> R:
        """Every node's ``reply`` to ``request`` (array fields only), summed by the run's
        aggregator: the server learns the sum, typed as ``reply``. ``wire_dtype``: the
        precision plain replies travel in (masked and encrypted sums ignore it); ``noise``:
        the record that asks every node for its share of distributed noise
        (``clients/noise_node.py`` checks it; SecAgg+ only)."""
        content = request.to_records()
        if noise is not None:
            content.update(noise.to_records())
        total = self.aggregator.sum(_action(request), content, max_abs=max_abs,
                                    phase=phase, wire_dtype=wire_dtype)
        return reply.from_parts(total, {}, "the sum")

    def plain_replies(self, request: Message, reply: type[R], *, phase: str,
                      layout: Sequence[tuple[str, tuple[int, ...]]]
                      ) -> Iterator[tuple[int, R]]:
        """Every sum node's ``reply`` to ``request`` sent as a labelled plain sum, each read
        as it arrives (its fields checked, naming the node) and yielded in the fixed node
        order, for a sum the server forms itself because its replies are no flat arrays (a
        sparse matrix): only replies ahead of their turn are held. Nodes check the plain-sum
        record (their ``allow-plain``) before any work; once every node answered, the run's
        results list the sum as plain, of ``layout`` (array name and shape, as the sum's
        total)."""
        agg, messenger = self.aggregator, self.messenger
        content = request.to_records()
        content.update(PlainSum().to_records())
        replies = messenger.iter_replies(_action(request), dict.fromkeys(agg.nodes, content),
                                         phase=phase)
        for node, answer in in_node_order(replies, agg.nodes):
            yield node, reply.from_records(answer, messenger.label(node))
        agg.record_sum(phase, _action(request), list(layout), len(agg.nodes), form="plain")

    def evaluate_ranking(self, request: RankingRequest, *,
                         phase: str = "evaluate") -> dict[str, float]:
        """Ranking metrics of every node's users at ``request.top_k``, learned only as a sum
        over nodes (nodes answer :class:`fedrec.wire.evaluation.RankingSum`)."""
        total = self.sum_of(request, RankingSum, max_abs=float(self.max_users) + 1.0,
                            phase=phase)
        return RankingSums.from_vector(request.top_k, total.ranking).means()


class ProtocolStrategy:
    """Base of multi-phase protocols, run by Flower's ServerApp through :meth:`start`.

    The contract every protocol keeps (as Flower's for a strategy, RecBole's for a model):

    - built from the typed run config, once per run: ``Cls(cfg)``; the strategy reads the
      config from :attr:`cfg` only;
    - :meth:`run` over the :class:`Federation` that :meth:`federate` set up; :meth:`execute`
      is that one path (handshake, then the phases), for the ServerApp and :meth:`start`;
    - per-round rows in :attr:`history`, which :meth:`partial_record` reports when a run fails;
    - :meth:`reference`, the centralized reference (None: the protocol has none);
    - :meth:`policy_needs` and :meth:`drive_stock_strategy`, optional hooks with defaults.

    Not a Flower ``Strategy``: Flower's strategy is a loop of train/evaluate rounds whose
    four hooks (``configure_train`` ...) its wrappers (differential privacy, ...) call; the
    protocols here have several phases per run (key setup, secure sums, power steps,
    evaluation) that those hooks cannot express, so a protocol offers only what it can keep:
    ``start(grid, ...)`` runs :meth:`execute` and returns Flower's ``Result``, as
    ``Strategy.start`` does. A stock Flower strategy drives FedMF's nodes instead
    (:meth:`drive_stock_strategy`).

    ``config_keys`` declares the protocol's own run-config keys (typed, with defaults and
    ranges); :attr:`cfg` has every one of them and every core key, parsed.
    """

    config_keys: ClassVar[tuple[Key, ...]] = ()
    #: The federation the protocol needs (checked at the handshake).
    federation: ClassVar[tuple[RoleNeed, ...]] = USER_NODES
    #: The module of the protocol's node handlers, for a protocol given as
    #: ``package.module:Class`` without a registration; a registered protocol declares it in
    #: its registration instead (``fl_app/registry.py``), once. A local simulation's ClientApp
    #: imports it; deployed nodes import it only if their operator lists it.
    clients: ClassVar[str] = ""
    #: The protocol's name in error messages (the run config's ``protocol`` when empty).
    name: ClassVar[str] = ""
    #: The roles whose nodes contribute to the run's sums (every node when empty).
    sum_roles: ClassVar[tuple[str, ...]] = ()
    #: What a stock Flower strategy driving this protocol's nodes asks of their policy
    #: (:meth:`drive_stock_strategy`); empty when no stock strategy can drive them.
    STOCK_NEEDS: ClassVar[tuple[PolicyNeed, ...]] = ()
    #: Why a run's numbers change when it is run again with the same seed ("" when the seed
    #: fixes every draw); a subclass states its reason, as a class attribute or property.
    unseeded_randomness: str = ""
    #: The one aggregator the protocol's guarantee needs, and why ("" when any will do):
    #: a config naming another is refused when the strategy is built, before any message.
    only_aggregator: ClassVar[tuple[str, str]] = ("", "")

    def __init__(self, cfg: Mapping[str, Any] | None = None) -> None:
        """``cfg``: the run's typed config (a :class:`RunConfig`, resolved where the run
        started: taken as is, its values never parsed again), or a plain mapping parsed here
        (keys of other protocols in either are ignored); keys it lacks take their defaults."""
        self.cfg: RunConfig
        if isinstance(cfg, RunConfig):
            missing = {k.name: k.default for k in self.run_keys() if k.name not in cfg}
            self.cfg = RunConfig({**missing, **cfg}) if missing else cfg
        else:
            table = key_table(self.run_keys())
            self.cfg = self.run_config({k: v for k, v in dict(cfg or {}).items()
                                        if k in table and k != "options"})
        #: The run's per-round rows (what a failed run's results keep: :meth:`partial_record`).
        self.history: list[dict[str, Any]] = []
        only, why = self.only_aggregator
        if only and self.cfg["aggregator"] != only:
            raise ValueError(f"{self.name or self.cfg['protocol']} {why}: aggregator must be "
                             f"{only}, got {self.cfg['aggregator']!r}")

    @classmethod
    def run_keys(cls) -> tuple[Key, ...]:
        """Every key a run of this protocol reads: the core's and its own."""
        return (*CORE_KEYS, *cls.config_keys)

    @classmethod
    def run_config(cls, overrides: Mapping[str, Any] | None = None) -> RunConfig:
        """A typed run config for this protocol alone: defaults of :meth:`run_keys`,
        ``overrides`` parsed (an unknown key is a ConfigError naming the closest)."""
        return merge_config({"protocol": f"{cls.__module__}:{cls.__qualname__}",
                             **dict(overrides or {})}, cls.run_keys())

    # -- optional hooks ------------------------------------------------------------------
    def policy_needs(self) -> tuple[PolicyNeed, ...]:
        """What this run asks of the policy of every node in its sums (the nodes of
        :attr:`sum_roles`; checked at the handshake, and before Flower starts in a local
        simulation): by default what the run config's ``aggregator`` asks; a protocol with
        weaker modes of its own adds them."""
        return aggregator_needs(self.cfg["aggregator"])

    def reference(self, data: Any) -> dict[str, float] | None:
        """The centralized reference: the same math on all of ``data`` in one process,
        metrics keyed as the federated run's; None for a protocol without one."""
        return None

    @property
    def has_reference(self) -> bool:
        """Whether the protocol defines :meth:`reference`."""
        return type(self).reference is not ProtocolStrategy.reference

    def drive_stock_strategy(self, strategy: Strategy, messenger: Messenger) -> RunOutcome:
        """A plain Flower ``strategy`` (the run config's ``strategy``) driving this
        protocol's nodes instead of its own phases; most protocols cannot be driven so."""
        raise ConfigError(f"protocol {self.cfg['protocol']!r} cannot be driven by a plain "
                          "Flower strategy ('strategy' key): it has phases of its own")

    # -- the run -------------------------------------------------------------------------
    def run(self, fed: Federation) -> RunOutcome:
        """The protocol's phases over the federation :meth:`federate` set up."""
        raise NotImplementedError(f"{type(self).__name__} must implement run()")

    def execute(self, messenger: Messenger) -> RunOutcome:
        """One run: a fresh :attr:`history`, :meth:`federate`, :meth:`run`."""
        self.history = []
        return self.run(self.federate(messenger))

    def new_history(self) -> list[dict[str, Any]]:
        """:attr:`history`, emptied: the strategy appends its rows to it, and
        :meth:`partial_record` reports them if the run fails before returning."""
        self.history.clear()
        return self.history

    def partial_record(self) -> dict[str, Any]:
        """What the run had when it failed: ``history`` (the rows of :attr:`history`) and
        ``metrics``, the last row's numbers (the latest measured; round, epoch and step
        counters left out). The ServerApp puts them in a failed run's results
        (``fl_app/server_app.py``)."""
        history = [dict(row) for row in self.history]
        counters = {"round", "epoch", "step", "t", "sync", "rounds", "users"}
        last = history[-1] if history else {}
        metrics = {k: float(v) for k, v in last.items()
                   if k not in counters and isinstance(v, (int, float))
                   and not isinstance(v, bool)}
        return {"metrics": metrics, "history": history}

    def federate(self, messenger: Messenger) -> Federation:
        """Every protocol's one setup path: the handshake (roles checked against
        :attr:`federation`, nodes named, identities and policies reported), then the run's
        aggregator (:meth:`sum_aggregator`) over the nodes of :attr:`sum_roles`, set up."""
        cfg = self.cfg
        infos = handshake(messenger, cfg, needs=self.federation, protocol=self.name or None,
                          policy_needs=self.policy_needs(), policy_roles=self.sum_roles)
        nodes = [n for n, i in infos.items() if not self.sum_roles or i.role in self.sum_roles]
        return Federation(messenger, cfg, infos, self.sum_aggregator(messenger, nodes))

    def sum_aggregator(self, messenger: Messenger, nodes: list[int]) -> Aggregator:
        """The aggregator of the run's sums over ``nodes``: the run config's ``aggregator``,
        ``seed`` and ``secagg-degree``. A protocol with a scheme of its own overrides this."""
        cfg = self.cfg
        return make_aggregator(cfg["aggregator"], messenger, nodes, seed=cfg["seed"],
                               degree=cfg["secagg-degree"] or None)

    def summary(self) -> None:
        logging.getLogger("fedrec").info("%s: %s", type(self).__name__, self.cfg)

    def start(self, grid: Grid, initial_arrays: Any = None, num_rounds: int = 1,
              timeout: float = 3600, train_config: Any = None, evaluate_config: Any = None,
              evaluate_fn: Any = None) -> Any:
        """Flower's entry point: run the protocol (:meth:`execute`) over ``grid`` with the
        run config it was built with, ``timeout`` seconds per request; return a Flower
        ``Result`` with the final metrics as round 1's ServerApp-side evaluation. The
        round-based arguments mean nothing to a multi-phase protocol; a ``train_config``
        is refused (the run config is given once, to the constructor)."""
        from flwr.app import MetricRecord
        from flwr.serverapp.strategy import Result

        if train_config:
            raise TypeError(f"{type(self).__name__}.start: the run config goes to the "
                            f"constructor ({type(self).__name__}({type(self).__name__}"
                            ".run_config({...}))), not to train_config")
        outcome = self.execute(Messenger(grid, timeout=timeout))
        result = Result()
        result.evaluate_metrics_serverapp[1] = MetricRecord(
            {k: float(v) for k, v in outcome.metrics.items()})
        return result

