"""What a client handler can reach: its Flower context, its own rows, its private state.

Data loading goes through ``datasets.load_node_data`` (disk cache keyed by dataset and
partition) with an in-process cache on top, so a node in a long simulation does not re-read
its rows for every message. The in-process cache is an optimisation only: a SuperNode
running the ClientApp in a fresh process loads the same rows from disk.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
from flwr.app import ConfigRecord, Context, RecordDict
from numpy.lib.format import BUFFER_SIZE

from clients.state import drop_state, load_state, save_state
from datasets import DatasetSpec, NodeData, PartitionSpec, load_item_server_data, load_node_data
from datasets.synthetic import footprint_bytes as synthetic_bytes
from fedrec.records import array_record, state_record
from fedrec.wire import request as wire_request
from fedrec.wire.handshake import DATA as DATA_KEY  # the data config's record, for fl_app
from fedrec.wire.message import Message, WireError, run_fixed_values, wire_fields

if TYPE_CHECKING:
    from clients.identity_node import NodeIdentity
    from clients.policy import NodePolicy
    from clients.sealed_node import Mailbox
    from fedrec.dp import PrivacyLedger

M = TypeVar("M", bound=Message)
#: The node-state record of run-fixed request fields (digests), pinned per message type.
_RUN_FIXED = "fedrec.run-fixed"

#: Roles a node can declare (node config ``role``): user rows (cross-device or shards), a silo
#: (many users, cross-silo protocols), an item server (item features, no user rows).
ROLES = ("user", "silo", "item-server")


class DataConfigError(ValueError):
    """A node without a data description, or a run that asks for other data than the one
    its operator describes."""


#: What deserialising a request's arrays takes on top of the arrays themselves: Flower's
#: ``Array.numpy`` reads an in-memory ``.npy`` through numpy's chunked reader, which holds
#: up to two chunks of ``BUFFER_SIZE`` bytes at once (the chunk read and its concatenation)
#: plus the header's parse. Measured: a 3.7 MiB array peaks 0.50 MiB above its size.
NPY_READ_BYTES = 2.0 * BUFFER_SIZE + 2**14


def _array_bytes(array: Any) -> float:
    """Bytes a Flower Array takes once deserialised: at most its serialised bytes (a
    declared shape could lie; the copy cannot be larger than the data it is read from)."""
    return float(len(array.data))


@lru_cache(maxsize=8)
def _cached_node_data(spec: DatasetSpec, part: PartitionSpec, partition_id: int) -> NodeData:
    return load_node_data(spec, part, partition_id)


@lru_cache(maxsize=2)
def _cached_item_server_data(spec: DatasetSpec) -> NodeData:
    return load_item_server_data(spec)


def in_flower_simulation() -> bool:
    """Whether this process is a worker of Flower's simulation engine (a Ray actor of
    ``flwr.simulation``), where every node belongs to whoever started the simulation."""
    import sys

    ray = sys.modules.get("ray")
    if ray is None or "flwr.simulation.ray_transport.ray_actor" not in sys.modules:
        return False
    try:
        return bool(ray.is_initialized()) and ray.get_runtime_context().get_actor_id() is not None
    except Exception:  # noqa: BLE001  (no Ray worker context: not the simulation engine)
        return False


@dataclass
class NodeContext:
    """A node's view during one handler call."""

    context: Context
    request: RecordDict
    #: The policy the ClientApp was built with (``build_client_app(policy=...)``); the node
    #: config's policy keys override it (:attr:`policy`).
    base_policy: NodePolicy | None = None
    #: The data description the ClientApp was built with (``build_client_app(data=...)``);
    #: the node config's data keys override it (:meth:`data_config`).
    base_data: Mapping[str, Any] | None = None
    #: Bytes this request's estimates reserved so far (:meth:`reserve` adds them up).
    reserved: float = field(default=0.0, init=False)
    #: What a handler reads more than once during this call, kept for the call only (a
    #: protocol's checked node state: checked once per request, not once per reader).
    memo: dict[str, Any] = field(default_factory=dict, init=False)
    #: The request's sum record once ``clients.sums_node.check_sum_request`` checked it
    #: (before a sum handler runs); ``sum_reply`` answers only a checked request.
    sum_record: ConfigRecord | None = field(default=None, init=False)

    @property
    def state(self) -> RecordDict:
        """Flower's per-node state, kept across the messages of a run."""
        return self.context.state

    @cached_property
    def mailbox(self) -> Mailbox:
        """Sealed mail from and to other nodes (``clients/sealed_node.py``) for this call."""
        from clients.sealed_node import Mailbox

        return Mailbox(self.state, self.request, self.context.node_id, self.context.run_id,
                       self.identity)

    @cached_property
    def identity(self) -> NodeIdentity:
        """This node's signing key and the roster it checks keys against
        (``clients/identity_node.py``)."""
        from clients.identity_node import load_identity

        return load_identity(self.context.node_config, self.policy, self.who)

    @cached_property
    def policy(self) -> NodePolicy:
        """This node's privacy policy (``clients/policy.py``): the ClientApp's, with the node
        config's policy keys applied. Never read from the server's messages."""
        from clients.policy import NodePolicy

        base = self.base_policy if self.base_policy is not None else NodePolicy()
        return base.merged(self.context.node_config, f"node {self.context.node_id} config")

    def charge_dp(self, release: PrivacyLedger, what: str) -> float:
        """Charge ``release`` (the accountant of what is about to be released) for ``what``
        to this node's own DP ledger (``NodePolicy.charge_dp``), over the content digests of
        the rows it holds (``datasets.row_digests``; never the names the server's config
        gives them), before anything is released; returns the most any of those rows has
        now spent."""
        return self.policy.charge_dp(self.state, release, what, self.who,
                                     key=self.ledger_key(), run_id=int(self.context.run_id))

    def ledger_key(self):  # noqa: ANN201  (clients.dp_ledger.LedgerKey, imported lazily)
        """This node's key in its DP ledger: its identity and the content digests of the
        rows it holds (``datasets.row_digests``; never the names the server's config gives
        them), so a new run or a renamed dataset spends the same rows' budget."""
        from clients.dp_ledger import LedgerKey
        from datasets import row_digests

        rows = row_digests(DatasetSpec.from_config(self.data_config()), self.data().user_ids)
        return LedgerKey(self.identity.signer.public_bytes().hex(), tuple(rows))

    @property
    def who(self) -> str:
        """This node in error messages: partition and node id."""
        pid = self.context.node_config.get("partition-id")
        if pid is None:
            return f"node {self.context.node_id}"
        return f"node {self.context.node_id} (partition {pid})"

    @property
    def partition_id(self) -> int:
        try:
            return int(self.context.node_config["partition-id"])
        except KeyError:
            raise KeyError(
                "node config has no 'partition-id': start the SuperNode with "
                "--node-config \"partition-id=<i> num-partitions=<n>\""
            ) from None

    @property
    def num_partitions(self) -> int:
        return int(self.context.node_config["num-partitions"])

    def _simulated_item_servers(self) -> int:
        """Item servers among the simulated nodes (``item-servers`` of the data description):
        Flower's simulation gives nodes no config beyond their partition."""
        return int(self.data_config().get("item-servers", 0))

    @property
    def role(self) -> str:
        """This node's role: its node config ``role``, else (simulation) ``item-server`` for
        the last ``item-servers`` partitions and ``user`` for the others."""
        explicit = str(self.context.node_config.get("role", "") or "")
        if explicit:
            if explicit not in ROLES:
                raise ValueError(f"node config role {explicit!r} is not one of {ROLES}")
            return explicit
        k = self._simulated_item_servers()
        return "item-server" if k and self.partition_id >= self.num_partitions - k else "user"

    @property
    def user_partitions(self) -> int:
        """How many nodes hold user rows: ``num-partitions`` less simulated item servers."""
        n = self.num_partitions - self._simulated_item_servers()
        if n < 1:
            raise ValueError(f"item-servers = {self._simulated_item_servers()} leaves no user "
                             f"nodes among {self.num_partitions}")
        return n

    def data_config(self) -> dict[str, Any]:
        """The data this node offers (:attr:`_described`), as a dict the caller may alter."""
        return dict(self._described)

    @cached_property
    def _described(self) -> dict[str, Any]:
        """The data this node offers, as its operator describes it: the ClientApp's
        description (:attr:`base_data`: a simulation builds its ClientApp with the run's,
        ``build_client_app(data=...)``), the node config's data keys over it (a deployed
        SuperNode: ``--node-config "dataset='ml-1m' test-ratio=0.2 ..."``).

        Never read from the server's messages: a request's description is only compared
        with it (:meth:`check_server_data`). Which rows a node holds, how they are split and
        filtered, decides what every reply sums over, so a server choosing them (per
        request, per run) could make a legal sum over the whole set hold one user's rows.
        """
        from datasets import data_keys, describe

        own = dict(self.base_data or {})
        node_config = self.context.node_config
        own.update({k: node_config[k] for k in data_keys() if k in node_config})
        if "dataset" not in own and in_flower_simulation():
            # Flower's own simulation engine (``flwr run`` on a local federation) gives its
            # nodes no config beyond their partition, and whoever starts it operates every
            # simulated node: the run config is theirs. A deployed SuperNode never runs in
            # that engine, so no server can reach this branch.
            run_config = self.context.run_config
            own.update({k: run_config[k] for k in data_keys() if k in run_config})
        if "dataset" not in own:
            raise DataConfigError(
                f"{self.who} has no data description: its operator names the data it offers "
                "(node config \"dataset='<name>'\" with the split keys, docs/deployment.md; "
                "a simulation builds its ClientApp with the run's, build_client_app(data=...)); "
                "the server's run never chooses it")
        return describe(own)

    def check_server_data(self) -> None:
        """Refuse a request whose data description (record ``data``, or a stock strategy's
        ``config`` with a ``dataset`` key) differs from this node's own in any key it
        names: the run expects other data than this node's operator offers. The refusal
        names the key and the server's value; it depends on the operator's description
        only, never on the node's rows."""
        from datasets import differing_keys

        records = self.request.config_records
        stock = wire_request.STOCK_CONFIG
        source = DATA_KEY if DATA_KEY in records else (
            stock if stock in records and "dataset" in records[stock] else None)
        if source is None:
            return
        named = dict(records[source])
        own = self.data_config()
        try:
            differ = differing_keys(named, own)
        except (TypeError, ValueError) as exc:  # the server's own values, echoed
            raise DataConfigError(f"{self.who} refuses the request: its data description "
                                  f"does not parse ({exc})") from None
        if differ:
            shown = ", ".join(f"{k}={named[k]!r}" for k in differ)
            raise DataConfigError(
                f"{self.who} refuses the request: the run asks for {shown}, and this node's "
                "operator describes its data otherwise (node config or the ClientApp's data "
                "description); a node offers only the data its operator set")

    def data(self) -> NodeData:
        """This node's rows (train/test) and side features; an item server's item features.

        The synthetic sizes of the description are checked against this node's
        ``memory-budget-mb`` before anything is generated.
        """
        cfg = self.data_config()
        spec = DatasetSpec.from_config(cfg)
        if spec.name == "synthetic":
            # checked alone: the rows are generated once and then shared by every request
            self.policy.check_size(synthetic_bytes(spec.synthetic_users, spec.synthetic_items,
                                                   spec.synthetic_rank, spec.synthetic_density,
                                                   spec.synthetic_clusters),
                                   "the data config's synthetic dataset (synthetic-users x "
                                   "synthetic-items, synthetic-rank)", self.who)
        if self.role == "item-server":
            return _cached_item_server_data(spec)
        part = PartitionSpec.from_config(cfg, self.user_partitions)
        return _cached_node_data(spec, part, self.partition_id)

    def interactions_bound(self) -> int:
        """The smallest power of two at least this node's training interactions: what its
        memory estimates count them as, published in the handshake
        (``info.interactions-bound``). Why: an estimate from the count itself would make a
        budget refusal depend on it, and a server varying its sizes against the budget
        could bisect the count; with the bound it learns nothing the handshake did not say.
        """
        nnz = int(self.data().train.nnz)
        return 1 << max(nnz - 1, 0).bit_length()

    # -- the request ---------------------------------------------------------------------
    def read(self, cls: type[M], **dims: int) -> M:
        """The request as the typed message ``cls`` (``fedrec/wire/message.py``), its
        arrays reserved against the memory budget before they are copied, every field
        checked against its declaration (``dims``: sizes shape symbols must equal, e.g.
        ``items=n_items``), and its run-fixed fields pinned: the first request of a type in a
        run fixes them, a later one that changes any is refused, naming the field."""
        record = array_record(self.request, cls.ARRAYS)
        wanted = [f.name for f in wire_fields(cls) if f.is_array]
        names = [name for name in record if name in wanted] if record is not None else []
        if names:  # only what the message unpacks (a sum record's message unpacks nothing)
            self._reserve_arrays(record, cls.ARRAYS, names)
        msg = cls.from_records(self.request, self.who, dims)
        self._pin_run_fixed(msg)
        return msg

    def undeclared_arrays(self, key: str = wire_request.ARRAYS,
                          skip: tuple[str, ...] = ()) -> dict[str, np.ndarray]:
        """The arrays of record ``key`` no message field declares (names that vary per
        request, e.g. LP-GCN's deliveries by part and layer; ``skip``: the declared ones),
        reserved against the memory budget before they are copied."""
        record = array_record(self.request, key)
        if record is None:
            return {}
        names = [name for name in record if name not in skip]
        if names:
            self._reserve_arrays(record, key, names)
        return {name: record[name].numpy() for name in names}

    def _reserve_arrays(self, record: Any, key: str, names: list[str]) -> None:
        """Reserve what unpacking ``names`` of ``record`` takes, from their serialised sizes
        and the reader's chunks, before any copy is made."""
        shown = ", ".join(names[:8]) + (", ..." if len(names) > 8 else "")
        self.reserve(sum(_array_bytes(record[n]) for n in names) + NPY_READ_BYTES,
                     f"the request's arrays '{key}' ({shown})")

    def _pin_run_fixed(self, msg: Message) -> None:
        pinned = state_record(self.state, _RUN_FIXED)
        prefix = f"{type(msg).__module__}.{type(msg).__qualname__}:"
        for name, value in run_fixed_values(msg).items():
            digest = hashlib.sha256(repr(value).encode()).digest()
            was = pinned.get(prefix + name)
            if was is None:
                pinned[prefix + name] = digest
            elif bytes(was) != digest:
                raise WireError(f"{self.who} refuses the request: field '{name}' of "
                                f"{type(msg).__qualname__} is fixed for the run and changed")

    def reserve(self, n_bytes: float, what: str) -> None:
        """Refuse, before allocating, a request whose server-chosen sizes need more than this
        node's ``memory-budget-mb`` (``clients/policy.py``).

        Reservations add up over the request (a handler's working arrays, then the sum
        layer's copies of its reply), so the budget bounds the request's peak: two
        estimates each under the budget cannot together exceed it."""
        total = self.reserved + float(n_bytes)
        self.policy.check_size(total, what, self.who)
        self.reserved = total

    def check_iterations(self, count: int, name: str, *, times: int = 1) -> None:
        """Refuse past this node's ``max-iterations`` (``clients/policy.py``) when ``times``
        x the server's iteration count ``count`` (field ``name``) exceeds it."""
        self.policy.check_iterations(int(count) * max(int(times), 1), name, self.who)

    # -- typed state kept in Flower's node state ---------------------------------------
    def load_state(self, cls: type[M], key: str | None = None, *,
                   dims: Mapping[str, int] | None = None) -> M | None:
        """This node's state of type ``cls`` (the one kept under ``key``, if given), every
        field checked on reload (``dims``: shape symbols of sizes the node knows), or None
        before the first save (``clients/state.py``)."""
        return load_state(self.state, cls, self.who, key, dims=dims)

    def save_state(self, msg: Message, key: str | None = None) -> None:
        """Keep the state ``msg`` (under ``key``) in the node state (``clients/state.py``)."""
        save_state(self.state, msg, key)

    def drop_state(self, cls: type[Message], key: str | None = None) -> None:
        """Forget this node's state of type ``cls`` (under ``key``)."""
        drop_state(self.state, cls, key)
