"""Run configuration: typed keys, one parser for ``key=value`` strings, and validation.

Every key is declared once as a :class:`Key` (name, default, one-line doc, allowed values or
range). The core declares :data:`CORE_KEYS`, the keys every run reads (run control,
aggregation, and the data's keys, which ``datasets/spec.py`` declares); each protocol
declares its own on its strategy class (``config_keys``), :data:`ROUNDS` among them for a
protocol with training rounds. ``pyproject.toml``'s ``[tool.flwr.app.config]`` and
``docs/configuration.md`` are generated from the declarations (``python -m fl_app.configdoc
--write``) and a test fails when they drift.

A key that no declaration knows is an error naming the closest known key, so a typo never
runs silently with a default. Keys use dashes, as Flower run configs do.
"""

from __future__ import annotations

import difflib
import shlex
import tomllib
from collections.abc import Iterable, Mapping
from typing import Any

from datasets import KNOWN_PARTITIONS
from datasets._config import ConfigError, Key, Value
from datasets.spec import DATASET_KEYS

__all__ = ["CORE_KEYS", "ROUNDS", "ConfigError", "Key", "RunConfig", "Value", "closest_key",
           "key_table", "merge_config", "option_assignments", "parse_assignments",
           "run_name"]


class RunConfig(dict[str, Any]):
    """A run config whose every value its key has parsed (:func:`merge_config` makes it):
    what the run's start hands down, so nothing below parses or casts a value again."""


#: Keys renamed in the past: old name -> hint shown when a config still uses it.
RENAMED: dict[str, str] = {
    "secagg": "'aggregator' (secagg+ | plain | ckks; 'secagg = none' is 'aggregator = plain')",
}

#: Keys every run reads, whatever the protocol.
CORE_KEYS: tuple[Key, ...] = (
    Key("protocol", "privirec", "built-in protocol name (`fl_app.registry`) or "
        "`package.module:ClassName` of a ProtocolStrategy", used_by="all"),
    Key("strategy", "", "a plain Flower `Strategy` (`module:Class`) that drives the clients of "
        "`protocol` (a protocol with a stock driver: `fedmf`)", used_by="stock-strategy runs"),
    Key("options", "", "the protocol's own keys as `key=value` pairs separated by spaces, for "
        "keys `pyproject.toml` does not list (a user's protocol run with `flwr run`)",
        used_by="user protocols"),
    Key("partition", "shards-contiguous", "how users are spread over nodes: `user` (one user "
        "per node), contiguous or random shards, row blocks, one silo per first zip digit",
        choices=KNOWN_PARTITIONS, used_by="all"),
    Key("timeout", 120.0, "seconds a node may take to answer one request, counted from the "
        "request or from the round's last reply (a simulation answers its nodes a few at a "
        "time); a silent node then fails the run with an error naming it (secure sums treat "
        "it as a dropout)",
        min=0.001, used_by="all"),
    Key("startup-timeout", 600.0, "seconds the first contact may take (waiting for "
        "`min-nodes`, then the handshake): it also pays each node's start, e.g. Flower's "
        "simulation starting its Ray actors (measured at 70 s on a loaded 2-core machine); "
        "the larger of this and `timeout` applies", min=0.001, used_by="all"),
    Key("min-nodes", 1, "wait (up to `startup-timeout`) until this many SuperNodes are "
        "connected; set it to the number of data holders in a deployment", min=1,
        used_by="all"),
    Key("aggregator", "secagg+", "how sums over nodes are formed: `secagg+` (masked fixed-point "
        "sums, exact), `plain` (labelled clear sums in a fixed node order, for full-scale "
        "accuracy runs), `ckks` (server adds CKKS ciphertexts; a node decrypts)",
        choices=("secagg+", "plain", "ckks"), used_by="protocols with sums"),
    Key("secagg-degree", 0, "neighbours per node in the SecAgg+ graph (Harary graph); `0` = "
        "automatic: the complete graph up to 32 nodes, 2 ceil(log2 n) neighbours above "
        "(`fedrec/transport/aggregators.py`)", min=0, used_by="protocols with sums"),
    Key("item-servers", 0, "simulation only: how many simulated nodes (the highest partition "
        "ids) act as item servers (item features, no user rows); deployed nodes declare "
        "`role` in their node config instead", min=0, used_by="protocols with an item server"),
    Key("run-name", "", "results file stem; `\"\"` means `<protocol>-<dataset>-<seed>`",
        used_by="all"),
    *DATASET_KEYS,
)

#: Training rounds: declared here once, listed in ``config_keys`` by each protocol that
#: trains in rounds (a run of any other protocol refuses it, as every key it does not read).
ROUNDS = Key("rounds", 20, "training rounds (FedMVMF/PrivMVMF: epochs)", min=1)


def key_table(keys: Iterable[Key]) -> dict[str, Key]:
    """Keys by name; two declarations of one name must agree exactly."""
    out: dict[str, Key] = {}
    for key in keys:
        old = out.get(key.name)
        if old is not None and old != key:
            raise ValueError(f"run-config key '{key.name}' is declared twice with different "
                             f"defaults or rules: {old} vs {key}")
        out[key.name] = key
    return out


def closest_key(name: str, known: Iterable[str]) -> str:
    """A hint naming the closest known key (case-insensitive), or listing nothing."""
    if name in RENAMED:
        return f"; it was renamed to {RENAMED[name]}"
    known = list(known)
    lower = {k.lower(): k for k in known}
    if name.lower() in lower:
        return f"; did you mean '{lower[name.lower()]}'?"
    match = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    return f"; did you mean '{match[0]}'?" if match else ""


def merge_config(overrides: Mapping[str, Any] | None, keys: Iterable[Key]) -> RunConfig:
    """Defaults of ``keys`` updated with ``overrides`` (and the pairs in their ``options``).

    Every value is parsed by its key (type, choices, range). A key not in ``keys`` raises
    :class:`ConfigError` naming the closest known key.
    """
    table = key_table(keys)
    cfg = RunConfig({name: key.default for name, key in table.items()})
    items = dict(overrides or {})
    for name, value in {**items, **option_assignments(items)}.items():
        if name not in table:
            raise ConfigError(f"unknown run-config key '{name}'{closest_key(name, table)}")
        cfg[name] = table[name].parse(value)
    return cfg


def option_assignments(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """The ``key=value`` pairs of ``cfg``'s ``options`` (the keys ``pyproject.toml`` does not
    list, for ``flwr run``), unparsed."""
    return parse_assignments(shlex.split(str(cfg.get("options", "") or "")), "options")


def parse_assignments(items: Iterable[str], what: str = "--set") -> dict[str, Any]:
    """``key=value`` strings as a dict: the one parser for ``--set``, ``options`` and scripts.

    Values are read as TOML where they are TOML (``3``, ``0.5``, ``true``, ``'text'``) and
    kept as text otherwise (``gf-cf,bspm-lm``); each key's own type decides in the end.
    """
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(f"{what} expects key=value, got {item!r}")
        raw = raw.strip()
        try:
            out[key] = tomllib.loads(f"v = {raw}")["v"]
        except tomllib.TOMLDecodeError:
            out[key] = raw.strip("'\"")
    return out


def run_name(cfg: Mapping[str, Any]) -> str:
    """The results file stem: ``run-name`` if set, else ``<protocol>-<dataset>-<seed>``."""
    if cfg.get("run-name"):
        return str(cfg["run-name"])
    protocol = str(cfg["protocol"]).replace(":", "_").replace(".", "_")
    return f"{protocol}-{cfg['dataset']}-{cfg['seed']}"
