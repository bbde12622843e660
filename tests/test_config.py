"""One set of defaults: pyproject's Flower run config equals fl_app.config.DEFAULTS."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from fl_app.config import DEFAULTS, ConfigError, merge_config, run_name
from strategies.base import REGISTRY, load_strategy_class

REPO = Path(__file__).resolve().parents[1]


def test_pyproject_run_config_matches_defaults() -> None:
    data = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert data["tool"]["flwr"]["app"]["config"] == DEFAULTS


def test_merge_coerces_and_reports_the_key() -> None:
    cfg = merge_config({"rounds": "7", "mf-lr": "0.5", "custom-key": 1})
    assert cfg["rounds"] == 7 and cfg["mf-lr"] == 0.5 and cfg["custom-key"] == 1
    with pytest.raises(ConfigError, match="'rounds'"):
        merge_config({"rounds": "abc"})
    with pytest.raises(ConfigError, match="'seed'"):
        merge_config({"seed": 1.5})


def test_run_name_defaults_and_override() -> None:
    assert run_name(merge_config()) == "fedmf-synthetic-0"
    assert run_name(merge_config({"run-name": "x"})) == "x"


def test_strategy_loading_errors_are_clear() -> None:
    for name in REGISTRY:
        load_strategy_class(name)
    with pytest.raises(ValueError, match="known protocols"):
        load_strategy_class("nope")
    with pytest.raises(ValueError, match="cannot import"):
        load_strategy_class("no_such_module_xyz:Thing")
    with pytest.raises(ValueError, match="has no class"):
        load_strategy_class("strategies.fedmf:Nope")
    with pytest.raises(ValueError, match="not a flwr"):
        load_strategy_class("fl_app.config:ConfigError")
