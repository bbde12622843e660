"""The protocols this app knows: one registration line each, by import path only.

A protocol is a strategy class (server side, ``strategies/X.py``: a ``ProtocolStrategy`` with
``config_keys``) plus a module of node handlers (``clients/X.py``). This table names both
as strings, so the node side never imports server code and the server never imports node
code; Flower wiring (``server_app``, ``client_app``, ``simulation``) resolves them. The table
lives here, in the app layer, because resolving it loads both sides: the core (``fedrec/``)
never names a side, not even as a string (``tests/test_architecture.py``).

A user's protocol registers the same way: :func:`register` in Python, or, for nodes in a
deployment, its client module in the ``fedrec_privacy.clients`` entry-point group or
``$FEDREC_CLIENT_MODULES`` (see ``docs/write-your-own-protocol.md``). A strategy given as
``protocol = "package.module:ClassName"`` needs no registration on the server.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fedrec.config import (
    CORE_KEYS,
    ConfigError,
    Key,
    RunConfig,
    key_table,
    merge_config,
    option_assignments,
)

if TYPE_CHECKING:  # the node side imports this table: no server code at import time
    from strategies.base import ProtocolStrategy


@dataclass(frozen=True)
class Registration:
    """One protocol: its run-config name, strategy ``module:Class`` and client module."""

    name: str
    strategy: str
    clients: str
    summary: str


#: Built-in protocols, in the order the README lists them.
BUILTIN: tuple[Registration, ...] = (
    Registration("fedmf", "strategies.fedmf:FedMF", "clients.fedmf",
                 "federated BPR matrix factorization (the papers' baseline)"),
    Registration("privirec", "strategies.privirec:PriviRec", "clients.privirec",
                 "PriviRec (paper 000): graph filters from secure sums and a power method"),
    Registration("privirec-k", "strategies.privirec:PriviRecK", "clients.privirec",
                 "PriviRec-k (paper 000): the low-rank variant, no item-item sum"),
    Registration("lpgcn", "strategies.lpgcn:LPGCN", "clients.lpgcn",
                 "LP-GCN (paper 001): lossless federated LightGCN / LightGCN+"),
    Registration("fedpower", "strategies.fedsvd:FedPower", "clients.fedsvd",
                 "FedPower (paper 002, Alg. 1): federated power iteration, local + central noise"),
    Registration("fedsvd-utility", "strategies.fedsvd:FedSvdUtility", "clients.fedsvd",
                 "paper 002, Alg. 2: SecAgg+ and HE removal of all nodes' noise but one"),
    Registration("fedsvd-privacy", "strategies.fedsvd:FedSvdPrivacy", "clients.fedsvd",
                 "paper 002, Alg. 3: clipping, Gaussian noise every iteration, SecAgg+"),
    Registration("dp-prototypes", "strategies.dp_prototypes:DPPrototypes",
                 "clients.dp_prototypes",
                 "DP-Prototypes (paper 003): one-shot cross-silo NMF from epsilon-DP prototypes"),
    Registration("fedmvmf", "strategies.mvmf:FedMVMF", "clients.mvmf",
                 "FedMVMF (paper 004): multi-view MF with an item server, sums by the aggregator"),
    Registration("privmvmf", "strategies.mvmf:PrivMVMF", "clients.mvmf",
                 "PrivMVMF (paper 004): FedMVMF with CKKS-encrypted gradient sums"),
    Registration("dp-fedmf", "strategies.dp_fedmf:DPFedMF", "clients.dp_fedmf",
                 "user-level DP federated MF: distributed discrete Gaussian noise in SecAgg+ sums"),
    Registration("dp-svd", "strategies.dp_svd:DPSVD", "clients.dp_svd",
                 "user-level DP low-rank filter: noisy power method, noise inside SecAgg+ sums"),
)

#: Node-side modules every protocol may use (handshake, secure sums, relay).
MECHANISM_CLIENTS: tuple[str, ...] = ("clients.common", "clients.sealed_node", "clients.sums_node",
                                      "clients.secagg_node", "clients.relay_node")
#: Diagnostic node actions (oracles by design): loaded only on an explicit opt-in
#: (``build_client_app(extra_modules=[DIAGNOSTICS_MODULE])`` or the node policy's
#: ``diagnostics=true``), never by a production ClientApp.
DIAGNOSTICS_MODULE = "clients.diagnostics"

_REGISTRY: dict[str, Registration] = {r.name: r for r in BUILTIN}


def register(name: str, strategy: str, clients: str, summary: str = "") -> Registration:
    """Add a protocol (e.g. a user's) under ``name``; a different existing entry is an error."""
    entry = Registration(name, strategy, clients, summary)
    old = _REGISTRY.get(name)
    if old is not None and old != entry:
        raise ValueError(f"protocol {name!r} is already registered as {old.strategy}")
    _REGISTRY[name] = entry
    return entry


def protocols() -> dict[str, Registration]:
    """Every registered protocol by name."""
    return dict(_REGISTRY)


def client_modules() -> list[str]:
    """The node-side modules to import: mechanisms first, then each protocol's, once."""
    out: list[str] = []
    for name in (*MECHANISM_CLIENTS, *(r.clients for r in _REGISTRY.values())):
        if name not in out:
            out.append(name)
    return out


def client_module(protocol: str) -> str:
    """The node module of ``protocol`` (a registered name or a strategy path), declared once:
    the registration's, else the ``clients`` of the strategy class (a protocol given as
    ``package.module:Class`` without a registration), else ''."""
    entry = _REGISTRY.get(protocol) or next(
        (r for r in _REGISTRY.values() if r.strategy == protocol), None)
    if entry is not None:
        return entry.clients
    return str(getattr(load_strategy_class(protocol), "clients", "") or "")


def load_strategy_class(name: str) -> type:
    """The class for a registered name or a ``package.module:ClassName`` path.

    Raises ValueError naming the known protocols, or what could not be imported.
    """
    from flwr.serverapp.strategy import Strategy

    entry = _REGISTRY.get(name)
    target = entry.strategy if entry else name
    if ":" not in target:
        raise ConfigError(
            f"unknown protocol {name!r}: known protocols are {sorted(_REGISTRY)}, "
            "or give a strategy as 'package.module:ClassName'"
        )
    module_name, _, class_name = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"strategy {name!r}: cannot import module {module_name!r}: "
                          f"{exc}") from exc
    cls = getattr(module, class_name, None)
    if cls is None:
        raise ConfigError(f"strategy {name!r}: module {module_name!r} has no class "
                          f"{class_name!r}")
    from strategies.base import ProtocolStrategy

    if not (isinstance(cls, type) and issubclass(cls, (Strategy, ProtocolStrategy))):
        raise ConfigError(
            f"strategy {name!r}: {class_name} is neither a ProtocolStrategy nor a "
            "flwr.serverapp.strategy.Strategy subclass"
        )
    return cls


def build_strategy(cfg: Mapping[str, Any]) -> ProtocolStrategy:
    """The run's protocol, built once from the typed run config (``Cls(cfg)``): a
    registered name or a ``package.module:Class`` of a ProtocolStrategy."""
    from strategies.base import ProtocolStrategy

    cls = load_strategy_class(cfg["protocol"])
    if not issubclass(cls, ProtocolStrategy):
        raise ConfigError(f"protocol {cfg['protocol']!r} is a plain Flower strategy, not a "
                          "ProtocolStrategy: give it as 'strategy', with a 'protocol' whose "
                          "nodes it drives (e.g. fedmf)")
    return cls(cfg)


def declared_keys(cls: type) -> tuple[Key, ...]:
    """The run-config keys a strategy class declares (``config_keys``), or none."""
    return tuple(getattr(cls, "config_keys", ()) or ())


def builtin_keys() -> dict[str, tuple[Key, list[str]]]:
    """Every key the core and the registered protocols declare, with who uses it."""
    table: dict[str, tuple[Key, list[str]]] = {k.name: (k, []) for k in CORE_KEYS}
    for entry in _REGISTRY.values():
        for key in declared_keys(load_strategy_class(entry.name)):
            if key.name in table and table[key.name][0] != key:
                raise ValueError(f"key '{key.name}' is declared differently by "
                                 f"{entry.strategy} and elsewhere")
            table.setdefault(key.name, (key, []))[1].append(entry.name)
    return table


def keys_for(cfg: Mapping[str, Any]) -> list[Key]:
    """Keys valid for a run: the core's, every registered protocol's (``flwr run`` passes
    all of pyproject's keys) and those of a strategy given by path."""
    keys = [key for key, _ in builtin_keys().values()]
    for field in ("protocol", "strategy"):
        name = str(cfg.get(field) or "")
        if name and name not in _REGISTRY:
            keys.extend(declared_keys(load_strategy_class(name)))
    return keys


def protocol_keys(cfg: Mapping[str, Any]) -> dict[str, list[str]]:
    """The keys a run of ``cfg``'s protocol reads, by who declares them: ``core`` (every
    run) and the protocol's own (and a driving ``strategy``'s), for an error naming them."""
    out: dict[str, list[str]] = {"core": [k.name for k in CORE_KEYS]}
    for field in ("protocol", "strategy"):
        name = str(cfg.get(field) or "")
        if name:
            out[name] = [k.name for k in declared_keys(load_strategy_class(name))]
    return out


def check_keys_read(keys: Iterable[str], cfg: Mapping[str, Any]) -> None:
    """ConfigError for keys ``cfg``'s protocol does not read (another protocol's key, e.g.
    ``mf-dim`` or ``rounds`` with privirec, would otherwise be accepted and ignored),
    naming the protocol and the keys it does read."""
    table = protocol_keys(cfg)
    known = {k for names in table.values() for k in names}
    unread = [k for k in dict.fromkeys(keys) if k not in known]
    if unread:
        own = "; ".join(f"{who}: {', '.join(names) or '(none)'}"
                        for who, names in table.items() if who != "core")
        these = "this key" if len(unread) == 1 else "these keys"
        raise ConfigError(f"run config {', '.join(repr(k) for k in unread)}: protocol "
                          f"{cfg['protocol']!r} does not read {these} (its own keys: {own}; "
                          "every run also reads the core keys, docs/configuration.md)")


def resolve_config(given: Mapping[str, Any] | None,
                   defaults: Mapping[str, Any] | None = None) -> RunConfig:
    """The run's typed config, resolved once where the run starts and handed down as is.

    Every applicable key's declared default, then ``defaults`` (values a run takes without
    naming them: ``flwr run`` passes every key ``pyproject.toml`` lists), then ``given``
    (the keys the run's command names). Each value is parsed by its key. A key in
    ``given`` or in ``options`` that the protocol does not read is refused, so a setting is
    never accepted and ignored; ``defaults`` may list any known key, and the config keeps
    only the keys its protocol reads (the core's and its own). An unknown protocol or
    key raises :class:`fedrec.config.ConfigError`. A :class:`RunConfig` is resolved
    already: it comes back as it is.
    """
    if isinstance(given, RunConfig) and not defaults:
        return given
    given, merged = dict(given or {}), {**dict(defaults or {}), **dict(given or {})}
    known = key_table(CORE_KEYS)
    head = {k: known[k].parse(v) for k, v in merged.items() if k in ("protocol", "strategy")}
    cfg = merge_config(merged, keys_for(head))
    check_keys_read([*given, *option_assignments(cfg)], cfg)
    # what the run reads, and only that: the record of the run lists its protocol's keys,
    # and a strategy that reads another protocol's key fails at once (KeyError)
    read = {k for names in protocol_keys(cfg).values() for k in names}
    return RunConfig({k: v for k, v in cfg.items() if k in read})


def used_by(keys: Iterable[Key]) -> dict[str, str]:
    """Key name -> who reads it, for the configuration reference."""
    table = builtin_keys()
    return {k.name: k.used_by or ", ".join(table.get(k.name, (k, []))[1]) for k in keys}
