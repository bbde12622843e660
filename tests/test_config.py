"""Run config: one declaration per key; pyproject and the docs follow it; typos are errors."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from fedrec.config import ConfigError, Key, parse_assignments, run_name
from fl_app import configdoc
from fl_app.registry import builtin_keys, load_strategy_class, protocols, resolve_config

REPO = Path(__file__).resolve().parents[1]


def test_pyproject_lists_every_declared_key_with_its_default() -> None:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]
    declared = {name: key.default for name, (key, _) in builtin_keys().items()}
    assert config == declared
    assert configdoc.render_pyproject((REPO / "pyproject.toml").read_text()) == \
        (REPO / "pyproject.toml").read_text(), "run python -m fl_app.configdoc --write"


def test_configuration_doc_lists_every_declared_key() -> None:
    text = (REPO / "docs" / "configuration.md").read_text()
    assert configdoc.render_doc(text) == text, "run python -m fl_app.configdoc --write"
    for name in builtin_keys():
        assert f"| `{name}` |" in text, name


def test_a_missing_key_is_caught() -> None:
    """The check above can fail: drop a key from the generated section and it differs."""
    text = (REPO / "pyproject.toml").read_text()
    broken = "\n".join(line for line in text.splitlines() if not line.startswith("mf-lr ="))
    assert configdoc.render_pyproject(broken) != broken


def test_values_are_typed_and_range_checked() -> None:
    cfg = resolve_config({"rounds": "7", "mf-lr": "0.5", "privirec-L": 2.0})
    assert cfg["rounds"] == 7 and cfg["mf-lr"] == 0.5 and cfg["privirec-L"] == 2
    with pytest.raises(ConfigError, match="'rounds'"):
        resolve_config({"rounds": "abc"})
    with pytest.raises(ConfigError, match="'seed'"):
        resolve_config({"seed": 1.5})
    with pytest.raises(ConfigError, match="'rounds': must be >= 1"):
        resolve_config({"rounds": 0})
    with pytest.raises(ConfigError, match="expected one of secagg\\+ \\| plain \\| ckks"):
        resolve_config({"aggregator": "none"})


def test_unknown_key_names_the_closest_known_key() -> None:
    with pytest.raises(ConfigError, match="unknown run-config key 'privirec-l'; did you mean "
                                          "'privirec-L'"):
        resolve_config({"privirec-l": 2})
    with pytest.raises(ConfigError, match="did you mean 'mf-dim'"):
        resolve_config({"mf-dims": 8})
    with pytest.raises(ConfigError, match="renamed to 'aggregator'"):
        resolve_config({"secagg": "none"})


def test_a_user_strategy_declares_its_own_keys() -> None:
    cfg = resolve_config({"protocol": "examples.item_popularity:ItemPopularity",
                          "popularity-top-k": "5"})
    assert cfg["popularity-top-k"] == 5
    with pytest.raises(ConfigError, match="did you mean 'popularity-top-k'"):
        resolve_config({"protocol": "examples.item_popularity:ItemPopularity",
                        "popularity-topk": 5})
    with pytest.raises(ConfigError, match="unknown run-config key 'popularity-top-k'"):
        resolve_config({"popularity-top-k": 5})  # not a key of the default protocol


def test_options_carry_a_user_protocols_keys() -> None:
    cfg = resolve_config({"protocol": "examples.item_popularity:ItemPopularity",
                          "options": "popularity-top-k=7"})
    assert cfg["popularity-top-k"] == 7


def test_one_parser_for_key_value_strings() -> None:
    assert parse_assignments(["a=3", "b=0.5", "c=true", "d='x y'", "e=gf-cf,bspm-lm"]) == {
        "a": 3, "b": 0.5, "c": True, "d": "x y", "e": "gf-cf,bspm-lm"}
    with pytest.raises(ConfigError, match="key=value"):
        parse_assignments(["novalue"])


def test_key_declarations_reject_bad_defaults_and_values() -> None:
    key = Key("k", 1, "doc", min=0, max=3)
    assert key.parse("2") == 2
    with pytest.raises(ConfigError, match="<= 3"):
        key.parse(4)


def test_run_name_defaults_and_override() -> None:
    assert run_name(resolve_config({})) == "privirec-synthetic-0"
    assert run_name(resolve_config({"run-name": "x"})) == "x"


def test_strategy_loading_errors_are_clear() -> None:
    for name in protocols():
        load_strategy_class(name)
    with pytest.raises(ValueError, match="known protocols"):
        load_strategy_class("nope")
    with pytest.raises(ValueError, match="cannot import"):
        load_strategy_class("no_such_module_xyz:Thing")
    with pytest.raises(ValueError, match="has no class"):
        load_strategy_class("strategies.fedmf:Nope")
    with pytest.raises(ValueError, match="not a flwr"):
        load_strategy_class("fedrec.config:ConfigError")


@pytest.mark.parametrize("raw", ["nan", "inf", "-inf"])
def test_float_keys_take_finite_numbers_only(raw: str) -> None:
    """NaN passes every range check and inf is no deadline: both are refused for every
    float key, timeouts included, whether given as text or as a parsed float."""
    value = parse_assignments([f"timeout={raw}"])["timeout"]
    for key in ("timeout", "startup-timeout", "test-ratio", "mf-lr"):
        for given in (value, raw):
            with pytest.raises(ConfigError, match=rf"'{key}': expected a finite number"):
                resolve_config({key: given})
    assert resolve_config({"timeout": "2.5"})["timeout"] == 2.5
