"""Node opt-ins a protocol declares beside its wire, loaded by every node's policy.

Why: a node's policy (``clients/policy.py``) holds the keys its operator sets. Keys every
protocol shares (``allow-plain``, ``dp-budget``, ``memory-budget-mb``...) live there; a key
only one protocol reads (PriviRec's ``allow-seeded-omega``, LP-GCN's ``lpgcn-min-alpha``)
is declared by that protocol with :func:`declare`, next to its messages, so a user's own
protocol adds its opt-in the same way without editing the policy. The server never sets
these: a node reads them from its operator's configuration only, and a misspelt ``allow-*``
key stays an error (the policy knows every declared key).

A built-in protocol's wire module declares at import; :func:`declared` imports every module
of ``fedrec.wire`` first, so the built-in keys are known wherever a policy is read. A user's
protocol declares in the module its ClientApp plugin imports
(docs/write-your-own-protocol.md).
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass, field
from typing import Any

_DECLARED: dict[str, OptIn] = {}
_BUILT_IN_LOADED = False


@dataclass(frozen=True)
class OptIn:
    """One node-policy key a protocol reads: its name, type (``bool`` for an ``allow-*``
    opt-in, ``float`` or ``int`` for a minimum), default (the safe choice), lowest accepted
    value, and what turning it on reveals (for docs and refusals)."""

    key: str
    default: bool | float | int
    doc: str
    protocol: str
    min: float = 0.0
    metadata: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def type(self) -> type:
        return type(self.default)

    def __post_init__(self) -> None:
        self.metadata.setdefault("min", self.min)


def declare(*opt_ins: OptIn) -> tuple[OptIn, ...]:
    """Declare node-policy keys (at import of the protocol's wire module); a key declared
    twice with another meaning is an error."""
    for opt in opt_ins:
        if opt.key.startswith("allow-") and not isinstance(opt.default, bool):
            raise TypeError(f"node opt-in '{opt.key}': an allow-* key is a bool")
        known = _DECLARED.get(opt.key)
        if known is not None and known != opt:
            raise ValueError(f"node opt-in '{opt.key}' is declared by {known.protocol} and "
                             f"again by {opt.protocol}")
        _DECLARED[opt.key] = opt
    return opt_ins


def declared() -> dict[str, OptIn]:
    """Every declared opt-in by key: the built-in wire modules' and any a plugin declared."""
    global _BUILT_IN_LOADED
    if not _BUILT_IN_LOADED:
        import fedrec.wire

        for module in pkgutil.iter_modules(fedrec.wire.__path__):
            importlib.import_module(f"fedrec.wire.{module.name}")
        _BUILT_IN_LOADED = True
    return dict(_DECLARED)
