"""Typed run-config keys: :class:`Key`, its parser and :class:`ConfigError`.

They live in the lowest layer because the data declares its own keys (``datasets/spec.py``
``DATASET_KEYS``) and the core (``fedrec/config.py``) builds on them: one declaration per
key, however high the layer that reads it.

Flower parses ``--run-config "test-ratio=0"`` as an int and CLI strings stay strings, so
every value is converted explicitly and an error names the offending key.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

Value = bool | int | float | str


class ConfigError(ValueError):
    """A run-config key is unknown, or its value has the wrong type or is out of range."""

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def coerce(key: str, value: Any, typ: type) -> Any:
    """Convert `value` of run-config `key` to `typ` (bool, int, float or str)."""
    try:
        if typ is bool:
            if isinstance(value, bool):
                return value
            if isinstance(value, (int, float)) and value in (0, 1):
                return bool(value)
            text = str(value).strip().lower()
            if text in _TRUE:
                return True
            if text in _FALSE:
                return False
            raise ValueError
        if typ is int:
            if isinstance(value, bool):
                raise ValueError
            if isinstance(value, float):
                if not value.is_integer():
                    raise ValueError
                return int(value)
            return int(str(value).strip()) if isinstance(value, str) else int(value)
        if typ is float:
            if isinstance(value, bool):
                raise ValueError
            return float(value)
        return str(value)
    except (TypeError, ValueError):
        raise ValueError(
            f"run config '{key}': expected {typ.__name__}, got {value!r}"
        ) from None


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
