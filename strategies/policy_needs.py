"""What a run asks of every node's privacy policy, checked before any data-dependent round.

Why: a node refuses a weaker mode only when the request for it arrives (``clients/policy.py``),
which can be after rounds that already used its data, and then on every node at once. Every
node reports its policy in the handshake, so the server can see up front which node would
refuse, and stop there with one line naming the node and the node-config opt-in. A local
simulation knows its nodes' policy before Flower starts and checks it there
(``fl_app/plan.py``). The node still checks every request itself: this check only
makes the refusal early, it never decides for the node.

A protocol declares its needs with ``ProtocolStrategy.policy_needs()`` (strategies/base.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any


class PolicyRefusal(ValueError):
    """Some node's reported policy refuses what the run needs (raised at the handshake)."""


@dataclass(frozen=True)
class PolicyNeed:
    """One thing a run needs of a node policy key.

    ``value`` True: the boolean opt-in ``key`` must be on. A number with ``at_most`` False:
    the node's ``key`` must be at least ``value`` (e.g. ``dp-budget``); with ``at_most`` True:
    at most ``value`` (a node's minimum, e.g. ``lpgcn-min-alpha``). ``why``: the mode in
    words, for the refusal. ``alternative``: another need that satisfies this one as well
    (LP-GCN's alpha = 0 is allowed by ``allow-plain`` or by ``lpgcn-min-alpha = 0``).
    """

    key: str
    why: str
    value: bool | float = True
    at_most: bool = False
    alternative: PolicyNeed | None = None

    def met_by(self, policy: Mapping[str, Any]) -> bool:
        if self.key not in policy:  # a node that does not know the key decides for itself
            return True
        have = policy[self.key]
        if isinstance(self.value, bool):
            ok = have is True or str(have).lower() == "true"
        else:
            ok = float(have) <= self.value if self.at_most else float(have) >= self.value
        return ok or (self.alternative is not None and self.alternative.met_by(policy))

    @property
    def opt_in(self) -> str:
        """The ``key=value`` that meets this need."""
        value = "true" if isinstance(self.value, bool) else f"{self.value:g}"
        return f"{self.key}={value}"

    def has(self, policy: Mapping[str, Any]) -> str:
        """What the node's policy says now, e.g. ``allow-plain=false``."""
        have = policy.get(self.key)
        return f"{self.key}={str(have).lower() if isinstance(have, bool) else have}"


def unmet(needs: Iterable[PolicyNeed], policy: Mapping[str, Any]) -> list[PolicyNeed]:
    """The needs ``policy`` (a node's ``{key: value}``) does not meet, in order."""
    return [need for need in needs if not need.met_by(policy)]


def aggregator_needs(aggregator: str) -> tuple[PolicyNeed, ...]:
    """What the run config's ``aggregator`` asks of every summing node."""
    if aggregator == "plain":
        return (PolicyNeed("allow-plain", "plain sums (the server sees each node's values)"),)
    if aggregator == "ckks":
        return (PolicyNeed("allow-ckks", "CKKS sums (every node and the decrypter hold the "
                                         "secret key)"),)
    return ()


def check_node_policies(needs: Iterable[PolicyNeed],
                        policies: Mapping[int, Mapping[str, Any]],
                        label: Callable[[int], str]) -> None:
    """Raise :class:`PolicyRefusal` naming the first node whose reported policy refuses a
    need (and how many others would), with the node-config opt-in its operator can give."""
    needs = tuple(needs)
    refusing = {node: unmet(needs, policy) for node, policy in sorted(policies.items())}
    refusing = {node: missing for node, missing in refusing.items() if missing}
    if not refusing:
        return
    node, missing = next(iter(refusing.items()))
    others = len(refusing) - 1
    also = f" (and {others} other node(s))" if others else ""
    opt = " ".join(n.opt_in for n in missing)
    raise PolicyRefusal(
        f"{label(node)}{also} would refuse this run's {'; '.join(n.why for n in missing)}: its "
        f"node policy has {', '.join(n.has(policies[node]) for n in missing)}. Only its "
        f"operator can opt in: node config '{opt}' (flower-supernode --node-config \"{opt}\")")
