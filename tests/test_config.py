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
    cfg = resolve_config({"protocol": "fedmf", "rounds": "7", "mf-lr": "0.5"})
    assert cfg["rounds"] == 7 and cfg["mf-lr"] == 0.5
    assert resolve_config({"privirec-L": 2.0})["privirec-L"] == 2
    with pytest.raises(ConfigError, match="'rounds'"):
        resolve_config({"protocol": "fedmf", "rounds": "abc"})
    with pytest.raises(ConfigError, match="'seed'"):
        resolve_config({"seed": 1.5})
    with pytest.raises(ConfigError, match="'rounds': must be >= 1"):
        resolve_config({"protocol": "fedmf", "rounds": 0})
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
    with pytest.raises(ValueError, match="neither a ProtocolStrategy nor a flwr"):
        load_strategy_class("fedrec.config:ConfigError")


@pytest.mark.parametrize("raw", ["nan", "inf", "-inf"])
def test_float_keys_take_finite_numbers_only(raw: str) -> None:
    """NaN passes every range check and inf is no deadline: both are refused for every
    float key, timeouts included, whether given as text or as a parsed float."""
    value = parse_assignments([f"timeout={raw}"])["timeout"]
    for key in ("timeout", "startup-timeout", "test-ratio", "mf-lr"):
        for given in (value, raw):
            with pytest.raises(ConfigError, match=rf"'{key}': expected a finite number"):
                resolve_config({"protocol": "fedmf", key: given})
    assert resolve_config({"timeout": "2.5"})["timeout"] == 2.5


# -- a key the protocol does not read --------------------------------------------------------
def test_a_given_key_the_protocol_does_not_read_is_refused_naming_its_keys() -> None:
    """``rounds`` is read by the protocols that train in rounds only: given to privirec it
    would be accepted and ignored, so it is refused, naming the protocol and its keys."""
    with pytest.raises(ConfigError, match=r"'rounds': protocol 'privirec' does not read this "
                                          r"key \(its own keys: privirec: privirec-filters"):
        resolve_config({"protocol": "privirec", "rounds": 50})
    with pytest.raises(ConfigError, match=r"'mf-dim', 'rounds': protocol 'lpgcn' does not "
                                          "read these keys"):
        resolve_config({"protocol": "lpgcn", "mf-dim": 8, "rounds": 5})
    with pytest.raises(ConfigError, match="'mf-dim': protocol 'examples.item_popularity"):
        resolve_config({"protocol": "examples.item_popularity:ItemPopularity",
                        "options": "mf-dim=8"})
    assert resolve_config({"protocol": "fedmf", "rounds": 5})["rounds"] == 5
    assert resolve_config({"protocol": "fedmvmf", "rounds": 5})["rounds"] == 5
    # a stock strategy driving fedmf's nodes reads the protocol's keys
    assert resolve_config({"protocol": "fedmf", "strategy": "flwr.serverapp.strategy:FedAvg",
                           "rounds": 2})["rounds"] == 2


def test_defaults_a_run_takes_without_naming_them_are_not_refused() -> None:
    """``flwr run`` passes every key pyproject.toml lists: those values are defaults, so
    only the keys the command names are held to the protocol."""
    listed = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]
    cfg = resolve_config({"protocol": "privirec"}, defaults={**listed, "rounds": 50})
    assert cfg["protocol"] == "privirec" and "rounds" not in cfg  # not a key privirec reads
    assert resolve_config({"protocol": "fedmf"}, defaults={**listed, "rounds": 50})[
        "rounds"] == 50
    with pytest.raises(ConfigError, match="'rounds': protocol 'privirec'"):
        resolve_config({"protocol": "privirec", "rounds": 50}, defaults=listed)
    with pytest.raises(ConfigError, match="unknown run-config key 'mf-dims'"):
        resolve_config({}, defaults={**listed, "mf-dims": 3})  # still known keys only


class _Run:
    def __init__(self, override_config: dict) -> None:
        self.override_config = override_config


class _UntouchableGrid:
    """A grid whose run has Flower's record of ``--run-config``; any contact is an error."""

    def __init__(self, override_config: dict) -> None:
        self.run = _Run(override_config)

    def __getattr__(self, name: str) -> object:
        raise AssertionError(f"the ServerApp used the grid ({name}) before refusing")


def _flwr_context(overrides: dict) -> object:
    from flwr.app import Context, RecordDict

    listed = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]
    return Context(run_id=1, node_id=0, node_config={}, state=RecordDict(),
                   run_config={**listed, **overrides})


def test_flwr_run_refuses_a_named_key_the_protocol_does_not_read_before_any_node() -> None:
    """``flwr run --run-config "rounds=50"`` (default protocol privirec): the ServerApp
    refuses before it touches the grid; the same run without ``rounds`` resolves with every
    key of pyproject.toml in its run config."""
    from fl_app.server_app import make_server_app, server_run_config

    given = {"rounds": 50}
    with pytest.raises(ConfigError, match="'rounds': protocol 'privirec' does not read"):
        make_server_app(quiet=True)(_UntouchableGrid(given), _flwr_context(given))
    fine = {"protocol": "fedmf", "rounds": 3}
    cfg = server_run_config(_UntouchableGrid(fine), _flwr_context(fine))
    assert cfg["protocol"] == "fedmf" and cfg["rounds"] == 3
    cfg = server_run_config(_UntouchableGrid({}), _flwr_context({}))
    assert cfg["protocol"] == "privirec"


# -- the data's keys -----------------------------------------------------------------------
def test_the_data_keys_are_declared_once_and_the_spec_checks_with_them() -> None:
    """DatasetSpec's fields are the data keys' (defaults included), the core lists the same
    declarations, and the spec refuses what the key refuses, naming the key."""
    import dataclasses

    from datasets import DatasetSpec
    from datasets.spec import DATASET_KEYS, field_key
    from fedrec.config import CORE_KEYS

    fields = dataclasses.fields(DatasetSpec)
    assert sorted(field_key(f.name).name for f in fields) == sorted(k.name for k in DATASET_KEYS)
    assert all(f.default == field_key(f.name).default for f in fields)
    assert all(key in CORE_KEYS for key in DATASET_KEYS)
    assert DatasetSpec.from_config({"test-ratio": "0.5", "seed": 3.0}) == \
        DatasetSpec(test_ratio=0.5, seed=3)
    for field, value, key in (("test_ratio", 0.995, "test-ratio"),
                              ("cold_start_users", 0.995, "cold-start-users"),
                              ("synthetic_users", 0, "synthetic-users"),
                              ("implicit", "maybe", "implicit")):
        with pytest.raises(ConfigError, match=f"run config '{key}'"):
            DatasetSpec(**{field: value})
