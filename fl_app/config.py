"""Run configuration: the defaults every run starts from, and typed access to them.

The same keys appear in ``pyproject.toml`` under ``[tool.flwr.app.config]`` (what ``flwr run``
reads); ``tests/test_config.py`` checks that both lists agree, so there is one set of defaults.
Keys use dashes, as Flower run configs do.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from datasets._config import coerce

DEFAULTS: dict[str, Any] = {
    "protocol": "fedmf",
    "strategy": "",
    "dataset": "synthetic",
    "data-dir": "",
    "partition": "shards-contiguous",
    "seed": 0,
    "rounds": 20,
    "timeout": 120.0,
    "min-nodes": 1,
    "secagg": "secagg+",
    "run-name": "",
    "synthetic-users": 200,
    "synthetic-items": 300,
    "synthetic-rank": 8,
    "synthetic-density": 0.05,
    "test-ratio": 0.2,
    "mf-dim": 16,
    "mf-lr": 0.05,
    "mf-reg": 0.0001,
    "mf-negatives": 1,
    "secagg-degree": 0,
    "privirec-filters": "gf-cf,bspm-lm,bspm-em,turbo-cf",
    "privirec-L": 3,
    "privirec-rank": 0,
    "privirec-k": 1024,
    "privirec-ritz": "auto",
    "privirec-omega": "private",
    "privirec-filter-rank": 0,
    "privirec-wire-dtype": "float64",
}


class ConfigError(ValueError):
    """A run-config key has a value of the wrong type or outside its range."""


def merge_config(overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Return DEFAULTS updated with ``overrides``, coercing each value to its default's type.

    Unknown keys are kept (user strategies may read their own keys); known keys with a value
    that cannot be coerced raise :class:`ConfigError` naming the key and the expected type.
    """
    cfg = dict(DEFAULTS)
    for key, value in (overrides or {}).items():
        if key in DEFAULTS:
            cfg[key] = _coerce(key, value, type(DEFAULTS[key]))
        else:
            cfg[key] = value
    return cfg


def _coerce(key: str, value: Any, kind: type) -> Any:
    try:
        return coerce(key, value, kind)  # one coercion rule for run config and data specs
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def run_name(cfg: Mapping[str, Any]) -> str:
    """The results file stem: ``run-name`` if set, else ``<protocol>-<dataset>-<seed>``."""
    if cfg.get("run-name"):
        return str(cfg["run-name"])
    protocol = str(cfg["protocol"]).replace(":", "_").replace(".", "_")
    return f"{protocol}-{cfg['dataset']}-{cfg['seed']}"
