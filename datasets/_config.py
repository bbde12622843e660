"""Coerce Flower run-config values (str/int/float/bool) into typed spec fields.

Flower parses `--run-config "test-ratio=0"` as an int and CLI strings stay strings,
so specs convert explicitly and name the offending key when they cannot.
"""

from __future__ import annotations

from typing import Any

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
