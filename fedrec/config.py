"""Run configuration: typed keys, one parser for ``key=value`` strings, and validation.

Every key is declared once as a :class:`Key` (name, default, one-line doc, allowed values or
range). The core declares :data:`CORE_KEYS` (dataset, partition, run control, aggregation);
each protocol declares its own on its strategy class (``config_keys``). ``pyproject.toml``'s
``[tool.flwr.app.config]`` and ``docs/configuration.md`` are generated from the declarations
(``python -m fl_app.configdoc --write``) and a test fails when they drift.

A key that no declaration knows is an error naming the closest known key, so a typo never
runs silently with a default. Keys use dashes, as Flower run configs do.
"""

from __future__ import annotations

import difflib
import math
import shlex
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from datasets._config import coerce

Value = bool | int | float | str


class ConfigError(ValueError):
    """A run-config key is unknown, or its value has the wrong type or is out of range."""


@dataclass(frozen=True)
class Key:
    """One typed run-config key.

    ``choices`` lists the allowed values (strings); ``min``/``max`` bound numbers
    (inclusive); ``used_by`` says who reads it, for the configuration reference. A float
    key takes finite numbers only: NaN passes every ``<``/``>`` bound (each comparison is
    false), so a ``timeout = nan`` would otherwise be accepted and never expire.
    """

    name: str
    default: Value
    doc: str
    choices: tuple[Value, ...] = ()
    min: float | None = None
    max: float | None = None
    used_by: str = ""

    @property
    def type(self) -> type:
        return type(self.default)

    def parse(self, value: Any) -> Value:
        """``value`` coerced to this key's type and checked; ConfigError naming the key."""
        try:
            out = coerce(self.name, value, self.type)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        if isinstance(out, float) and not math.isfinite(out):
            raise ConfigError(f"run config '{self.name}': expected a finite number, got {out!r}")
        if self.choices and out not in self.choices:
            allowed = " | ".join(str(c) for c in self.choices)
            raise ConfigError(f"run config '{self.name}': expected one of {allowed}, "
                              f"got {out!r}")
        if self.min is not None and out < self.min:
            raise ConfigError(f"run config '{self.name}': must be >= {self.min:g}, got {out!r}")
        if self.max is not None and out > self.max:
            raise ConfigError(f"run config '{self.name}': must be <= {self.max:g}, got {out!r}")
        return out


#: Keys renamed in the past: old name -> hint shown when a config still uses it.
RENAMED: dict[str, str] = {
    "secagg": "'aggregator' (secagg+ | plain | ckks; 'secagg = none' is 'aggregator = plain')",
}

#: Keys every run understands, whatever the protocol.
CORE_KEYS: tuple[Key, ...] = (
    Key("protocol", "privirec", "built-in protocol name (`fl_app.registry`) or "
        "`package.module:ClassName` of a ProtocolStrategy", used_by="all"),
    Key("strategy", "", "a plain Flower `Strategy` (`module:Class`) that drives the clients of "
        "`protocol` (a protocol with a stock driver: `fedmf`)", used_by="stock-strategy runs"),
    Key("options", "", "the protocol's own keys as `key=value` pairs separated by spaces, for "
        "keys `pyproject.toml` does not list (a user's protocol run with `flwr run`)",
        used_by="user protocols"),
    Key("dataset", "synthetic", "`synthetic`, `ml-100k`, `ml-1m` (users 1-2999 only), `gowalla`, "
        "`yelp2018`, `lightgcn`, or "
        "any plain folder name: your own split in `<data-dir>/<name>/` (docs/datasets.md)",
        used_by="all"),
    Key("data-dir", "", "folder holding `<dataset>/`; `\"\"` means `$FEDREC_DATA`, else "
        "`../shared/data`. A SuperNode's own `data-dir` node config wins", used_by="all"),
    Key("partition", "shards-contiguous", "how users are spread over nodes: `user` (one user "
        "per node), contiguous or random shards, row blocks, one silo per first zip digit",
        choices=("user", "shards-contiguous", "shards-random", "row-blocks", "silo-zip"),
        used_by="all"),
    Key("seed", 0, "seeds every public random draw (data, split, partition, model init, "
        "negatives, public graphs); secrets never come from it", used_by="all"),
    Key("rounds", 20, "training rounds (FedMVMF/PrivMVMF: epochs)", min=1,
        used_by="fedmf, fedmvmf, privmvmf"),
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
    Key("synthetic-users", 1000, "users of the synthetic dataset (docs/datasets.md)", min=1,
        used_by="synthetic"),
    Key("synthetic-items", 500, "items of the synthetic dataset", min=1, used_by="synthetic"),
    Key("synthetic-rank", 8, "rank of the synthetic user/item latent factors", min=1,
        used_by="synthetic"),
    Key("synthetic-density", 0.05, "target fraction of non-zero synthetic entries (mean "
        "interactions per user = density x items)", min=1e-9, max=1.0, used_by="synthetic"),
    Key("synthetic-clusters", 10, "taste clusters of synthetic users and items; a user's zip "
        "starts with cluster % 10, so `silo-zip` makes one silo per cluster up to 10", min=1,
        used_by="synthetic"),
    Key("synthetic-popularity-skew", 0.7, "Zipf exponent of synthetic item propensities "
        "(rank^-skew); 0 = no popularity long tail", min=0.0, used_by="synthetic"),
    Key("synthetic-feature-noise", 1.0, "std of the noise on synthetic side features (signal "
        "std ~1.4); 0 = features are exact linear images of the latent factors", min=0.0,
        used_by="synthetic"),
    Key("test-ratio", 0.2, "per-user holdout when the dataset has no given split", min=0.0,
        max=0.99, used_by="synthetic, ml-100k"),
    Key("implicit", True, "binarize ratings (every interaction is 1.0)",
        used_by="ml-100k, ml-1m"),
    Key("min-rating", 0.0, "keep ratings >= this before binarizing (0 keeps all)", min=0.0,
        used_by="ml-100k, ml-1m"),
    Key("cold-start-users", 0.0, "fraction of users held out entirely as cold-start users",
        min=0.0, max=0.99, used_by="cold-start protocols"),
    Key("cold-start-items", 0.0, "fraction of items held out entirely as cold-start items",
        min=0.0, max=0.99, used_by="cold-start protocols"),
    Key("drop-cold-items", False, "after the split, remove the items without a training "
        "interaction from the catalogue (LP-GCN needs every item to have one)"),
)


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


def merge_config(overrides: Mapping[str, Any] | None, keys: Iterable[Key]) -> dict[str, Any]:
    """Defaults of ``keys`` updated with ``overrides`` (and the pairs in their ``options``).

    Every value is parsed by its key (type, choices, range). A key not in ``keys`` raises
    :class:`ConfigError` naming the closest known key.
    """
    table = key_table(keys)
    cfg: dict[str, Any] = {name: key.default for name, key in table.items()}
    items = dict(overrides or {})
    options = str(items.get("options", "") or "")
    merged = {**items, **parse_assignments(shlex.split(options))} if options else items
    for name, value in merged.items():
        if name not in table:
            raise ConfigError(f"unknown run-config key '{name}'{closest_key(name, table)}")
        cfg[name] = table[name].parse(value)
    return cfg


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
