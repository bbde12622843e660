"""The run report's privacy section: who the nodes are, what each agreed to, what every sum
and relay showed the server, and who dropped out.

The handshake names the nodes and records their policies and identities; each aggregator
adds itself so its sums are listed; the push/poll loop adds dropouts. Each through a method:
no other object writes these fields. The results file's ``privacy`` section is
:meth:`RunReport.privacy`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol


class SumView(Protocol):
    """What an aggregator shows the report: one record per sum it formed."""

    view: list[Any]


@dataclass
class RunReport:
    """Node names, order, policies, identities, dropouts and the sums of one run."""

    _labels: dict[int, str] = field(default_factory=dict)
    _nodes: dict[int, dict[str, Any]] = field(default_factory=dict)
    _order: list[int] = field(default_factory=list)
    _policies: dict[int, dict[str, Any]] = field(default_factory=dict)
    _identities: dict[int, str] = field(default_factory=dict)
    _dropouts: list[dict[str, Any]] = field(default_factory=list)
    _aggregators: list[SumView] = field(default_factory=list)

    # -- what the handshake learns -------------------------------------------------------
    def name_node(self, node: int, where: str, partition: int | None = None,
                  role: str | None = None) -> None:
        """``node`` in every later message as ``node <id> (<where>)``; with ``partition``
        and ``role`` (what the handshake learns) also in the results' ``privacy.nodes``,
        which maps the SuperLink's node ids to partitions (``deploy/node_status.py``)."""
        self._labels[node] = f"node {node} ({where})"
        if partition is not None:
            self._nodes[node] = {"partition": int(partition), "role": role or "user"}

    def add_policy(self, node: int, policy: Mapping[str, Any]) -> None:
        """The privacy policy ``node`` acknowledged in the handshake."""
        self._policies[node] = dict(policy)

    def add_identity(self, node: int, source: str) -> None:
        """Where ``node``'s signing identity comes from (``roster`` or ``simulated``)."""
        self._identities[node] = source

    def set_order(self, order: Iterable[int]) -> None:
        """The fixed order reductions run in (partition order)."""
        self._order = list(order)

    def identity_source(self, node: int) -> str:
        """Where ``node``'s signing identity comes from, as the handshake reported it
        (``roster``, ``simulated``; empty if it reported none)."""
        return self._identities.get(node, "")

    def label(self, node: int) -> str:
        return self._labels.get(node, f"node {node}")

    def policy(self, node: int) -> dict[str, Any]:
        """The policy ``node`` acknowledged (empty if it sent none)."""
        return dict(self._policies.get(node, {}))

    @property
    def order(self) -> list[int]:
        return list(self._order)

    # -- what the run adds ---------------------------------------------------------------
    def add_aggregator(self, aggregator: SumView) -> None:
        """List every sum ``aggregator`` forms (its ``view``) in the report."""
        self._aggregators.append(aggregator)

    def add_dropout(self, phase: str, action: str, nodes: list[int], why: str) -> None:
        """``nodes`` dropped out of ``phase`` (``action``) because ``why``."""
        self._dropouts.append({"phase": phase, "action": action, "node_ids": list(nodes),
                               "why": why})

    def dropouts(self) -> list[dict[str, Any]]:
        """Every dropout so far: phase, action, node ids and why."""
        return [dict(d) for d in self._dropouts]

    def lost_nodes(self) -> str:
        """Every node that dropped out during the run, with the round and the reason, e.g.
        ``node 7 (partition 2) in 'train' (fedmf_train): no reply within 45 s (silent past
        the timeout)``; empty if none. A failed run's error ends with it
        (``fl_app/server_app.py``), so the lost node is named even when a later step is what
        failed."""
        return "; ".join(f"{', '.join(self.label(n) for n in d['node_ids'])} in "
                         f"'{d['phase']}' ({d['action']}): {d['why']}" for d in self._dropouts)

    def privacy(self, received: Mapping[str, Any], mail: Iterable[Any]) -> dict[str, Any]:
        """What the server received, for the results' ``privacy`` section: per phase the reply
        records and their form (``received``, from the ledger); every sum (aggregator, form,
        shapes, nodes, dropouts); the sealed mail it carried (endpoints and sizes only); every
        dropout; the policy each node acknowledged in the handshake; whose keys were signed
        with simulated identities (which authenticate nothing)."""
        sums = [vars(r) for agg in self._aggregators for r in agg.view]
        sealed: dict[str, dict[str, int]] = {}
        for m in mail:
            entry = sealed.setdefault(m.purpose.split(":")[0], {"payloads": 0, "bytes": 0})
            entry["payloads"] += 1
            entry["bytes"] += m.nbytes
        dropouts = [{**d, "nodes": [self.label(n) for n in d["node_ids"]]}
                    for d in self._dropouts]
        policies = {self.label(n): p for n, p in sorted(self._policies.items())}
        plain_ok = sorted(self.label(n) for n, p in self._policies.items()
                          if p.get("allow-plain"))
        identities: dict[str, list[str]] = {}
        for n, source in sorted(self._identities.items()):
            identities.setdefault(source, []).append(self.label(n))
        # node id -> partition, role, identity source: what the handshake told the server,
        # no count or value of a node's data
        nodes = {str(n): {**info, "identity": self._identities.get(n, "")}
                 for n, info in sorted(self._nodes.items())}
        return {"received": dict(received), "sums": sums, "sealed_mail": sealed,
                "dropouts": dropouts, "node_policies": policies,
                "nodes_allowing_plain": plain_ok, "identities": identities, "nodes": nodes}
