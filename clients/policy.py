"""A node's own privacy policy: which weaker modes it accepts, decided by its operator.

Why: the server's messages choose the aggregator and a protocol's options (PriviRec's
``transport`` and ``omega``), so a server that wants more than the protocol reveals only has
to ask. A node therefore checks every request for a weaker mode against a policy that comes
from its operator, never from the server, and refuses with an error naming the mode and the
policy. The defaults are the safe choice: every weaker mode is off.

Where the policy comes from (later sources override earlier ones):

1. built into the ClientApp: ``fl_app.client_app.build_client_app(policy=...)``; a local
   simulation passes ``run_in_simulation(..., node_policy={...})``. Flower's simulation
   gives nodes no config beyond ``partition-id`` / ``num-partitions``, and the ClientApp
   object (with the policy inside) is what the simulation ships to its workers;
2. the environment of the process that builds the ClientApp: ``FEDREC_NODE_POLICY``, e.g.
   ``FEDREC_NODE_POLICY="allow-plain=true,allow-seeded-omega=true"`` (also for
   ``python run_simulation.py ...``);
3. the node config of a deployed SuperNode:
   ``flower-supernode --node-config "allow-plain=true ..."``.

Keys (``docs/threat-model.md`` says what each weaker mode reveals). The keys below are the
ones every protocol shares; a key only one protocol reads (PriviRec's
``allow-seeded-omega`` and ``allow-sparse-transport``, FedSVD's ``allow-noise-removal``,
LP-GCN's ``allow-sampled-holdings``, ``lpgcn-min-alpha`` and ``lpgcn-min-mask-scale``, DP
prototypes' ``allow-paper-accounting``) is declared with what it reveals beside that
protocol's wire (``OPT_INS`` in ``fedrec/wire/<protocol>.py``, ``fedrec/wire/opt_in.py``)
and read here the same way:

- ``allow-plain``: answer plain sums (the server sees this node's values); LP-GCN without
  virtual items (``lpgcn-alpha = 0``: the server sees exactly which pseudonymous items the
  node holds).
- ``allow-ckks``: answer CKKS sums. Off by default: every node holds the CKKS secret key
  and the decrypter is handed every node's ciphertext, so a server colluding with any node,
  or a curious decrypter, learns every node's input (a server deviating alone gets only
  sums over the one node set every member signed, ``clients/nodeset.py``).
- ``allow-dropouts``: let a run's SecAgg+ sums go on over a node set shrunk by dropouts
  that every survivor signed (a consistency round). Off by default: every sum of a run is
  then over exactly the node set this node committed to at key setup, and a dropout abandons
  the sum before anything is unmasked. With it on, a server that declares this node dropped
  and repeats a request can learn its input as the difference of two sums.
- ``dp-budget``: total epsilon this node spends on noised releases, whatever carries them
  (a secure sum hides one node's input, not the rows in it), across every run (``0``:
  none; the ledger below).
- ``dp-min-noise`` (default 0.5): the smallest noise multiplier (total sigma over the clip
  norm, with the fewest noise shares the sum can hold) this node accepts in a sum with
  distributed noise (``clients/noise_node.py``).
- ``dp-max-delta`` (default 1e-5): the largest delta this node accounts a noisy sum at (the
  request's, if smaller).
- ``dp-ledger``: path of the node's privacy state file: its DP spending (per row it
  releases, by the rows' content) and the node set its roster identity committed to
  (``clients/nodeset.py``), so a new run or a new name does not start either afresh.
- ``min-neighbours`` (default 2): the fewest SecAgg+ neighbours the node accepts.
- ``memory-budget-mb`` (default 4096): the most a server-chosen size (oversampling, batch,
  dimension, rank) may make this node allocate for one request. A handler's estimates add
  up over the request (its working arrays, then the sum layer's copies of its reply), so
  the budget bounds the request's peak, not each allocation alone.
- ``max-iterations`` (default 10000): the most iterations one request may make this node
  run in a loop whose count the server chooses (NMF sweeps, power iterations, local epochs
  times mini-batch steps, the local search's swaps and the grid's shifts, trials). Each
  iteration's cost is bounded by the sizes above, so the two bound a request's time too.
- ``min-survivors`` (default 3): the fewest nodes, itself included, this node masks a secure
  sum with, shares its mask seeds among and unmasks for. With 2, each of two nodes learns the
  other's input from the sum; the server's message cannot lower it (nor the Shamir
  threshold, which the node computes itself).
- ``allow-simulated-identity`` (default true): without ``identity-key`` / ``roster`` node
  config, sign and check keys with the public simulated identities
  (``fedrec/secure/identity.py``). The one default that is not the safe choice: Flower's
  simulation cannot hand nodes key files. They authenticate nothing, and results say so
  (``privacy.identities``); a deployed SuperNode's operator sets it to false.
- ``diagnostics``: build the diagnostic actions into the ClientApp (``clients/diagnostics.py``;
  oracles by design). Read when the ClientApp is built (sources 1 and 2), never per message.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any

from flwr.app import ConfigRecord, RecordDict

from fedrec.records import config_record
from fedrec.wire.opt_in import OptIn
from fedrec.wire.opt_in import declared as declared_opt_ins

if TYPE_CHECKING:
    from clients.dp_ledger import LedgerKey
    from fedrec.dp import PrivacyLedger

#: Environment variable read by ``build_client_app`` (comma-separated ``key=value``).
POLICY_ENV = "FEDREC_NODE_POLICY"
#: Node state record of the DP budget this run spent (``epsilon``) and the ledger's total
#: after the last charge (``total``); the ledger file is what enforces the budget.
_DP_SPENT = "policy.dp-spent"


class PolicyError(PermissionError):
    """A request asks for a mode this node's policy does not allow."""


_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off", ""}


def _as_bool(key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ValueError(f"node policy key '{key}' must be true or false, got {value!r}")


def _parse_value(f: Any, key: str, value: Any, source: str) -> Any:
    """One policy value from its config text, checked against the field's type and minimum
    (an error names the source and the key, never silently a default)."""
    if f.type in (bool, "bool"):
        return _as_bool(key, value)
    if f.type in (str, "str"):
        return str(value)
    lowest = f.metadata.get("min", 0)
    if f.type in (int, "int"):
        try:
            count = int(str(value).strip())
        except ValueError:
            count = None
        if count is None or count < lowest:
            raise ValueError(f"{source}: node policy key '{key}' must be an integer >= "
                             f"{lowest}, got {value!r}")
        return count
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = math.nan
    if not (math.isfinite(number) and number >= lowest):
        raise ValueError(f"{source}: node policy key '{key}' must be a finite number >= "
                         f"{lowest:g}, got {value!r}")
    return number


@dataclass(frozen=True)
class NodePolicy:
    """What this node accepts; every default is the safe choice except
    ``allow_simulated_identity`` (see the module docstring)."""

    allow_plain: bool = False
    allow_ckks: bool = False
    allow_dropouts: bool = False
    dp_budget: float = 0.0
    dp_ledger: str = ""
    dp_min_noise: float = field(default=0.5, metadata={"min": 0.0})
    dp_max_delta: float = field(default=1e-5, metadata={"min": 0.0})
    diagnostics: bool = False
    min_survivors: int = field(default=3, metadata={"min": 2})
    min_neighbours: int = field(default=2, metadata={"min": 1})
    memory_budget_mb: float = field(default=4096.0, metadata={"min": 1.0})
    max_iterations: int = field(default=10_000, metadata={"min": 1})
    allow_simulated_identity: bool = True
    #: The protocols' own opt-ins (``fedrec/wire/opt_in.py``) this policy sets, by key; an
    #: opt-in not set here has its declared (safe) default.
    opt_ins: Mapping[str, Any] = field(default_factory=dict, hash=False)

    @staticmethod
    def key_of(name: str) -> str:
        """Config key of a field (``allow_plain`` -> ``allow-plain``)."""
        return name.replace("_", "-")

    @classmethod
    def _fields(cls) -> dict[str, Any]:
        """Every policy key -> its declaration: the shared fields, then the protocols'."""
        shared = {cls.key_of(f.name): f for f in fields(cls) if f.name != "opt_ins"}
        return {**shared, **declared_opt_ins()}

    @classmethod
    def keys(cls) -> tuple[str, ...]:
        return tuple(cls._fields())

    def __getattr__(self, name: str) -> Any:
        """A protocol's opt-in read as an attribute (``policy.allow_seeded_omega``)."""
        opt = declared_opt_ins().get(self.key_of(name)) if not name.startswith("_") else None
        if opt is None:
            raise AttributeError(f"{type(self).__name__} has no key {self.key_of(name)!r}")
        return self.opt_ins.get(opt.key, opt.default)

    def merged(self, config: Mapping[str, Any], source: str) -> NodePolicy:
        """This policy with the policy keys of ``config`` applied.

        An unknown ``allow-*`` key is an error (a misspelt opt-in must not pass silently);
        other keys (``partition-id``, ``data-dir``, ...) are not the policy's business.
        """
        known = self._fields()
        updates: dict[str, Any] = {}
        opt_ins = dict(self.opt_ins)
        for key, value in config.items():
            if key not in known:
                if str(key).startswith("allow-"):
                    raise ValueError(f"{source}: unknown node policy key '{key}' (known: "
                                     f"{', '.join(sorted(known))})")
                continue
            parsed = _parse_value(known[key], key, value, source)
            if isinstance(known[key], OptIn):
                opt_ins[key] = parsed
            else:
                updates[known[key].name] = parsed
        return replace(self, **updates, opt_ins=opt_ins)

    @classmethod
    def parse(cls, text: str, source: str = POLICY_ENV) -> NodePolicy:
        """A policy from ``key=value`` pairs separated by commas or spaces."""
        pairs: dict[str, str] = {}
        for item in text.replace(",", " ").split():
            key, sep, value = item.partition("=")
            if not sep:
                raise ValueError(f"{source}: expected key=value, got {item!r}")
            pairs[key.strip()] = value.strip()
        unknown = sorted(set(pairs) - set(cls.keys()))
        if unknown:
            raise ValueError(f"{source}: unknown node policy key(s) {unknown} (known: "
                             f"{', '.join(cls.keys())})")
        return cls().merged(pairs, source)

    @classmethod
    def from_env(cls) -> NodePolicy:
        return cls.parse(os.environ.get(POLICY_ENV, ""))

    @classmethod
    def coerce(cls, value: NodePolicy | Mapping[str, Any] | None) -> NodePolicy:
        """A policy from a NodePolicy, a ``{key: value}`` mapping, or None (environment)."""
        if value is None:
            return cls.from_env()
        if isinstance(value, NodePolicy):
            return value
        unknown = sorted(set(value) - set(cls.keys()))
        if unknown:
            raise ValueError(f"node policy: unknown key(s) {unknown} (known: "
                             f"{', '.join(cls.keys())})")
        return cls().merged(value, "node policy")

    def as_config(self) -> dict[str, bool | int | float | str]:
        """The policy as ``{key: value}`` (what a node acknowledges in its handshake)."""
        shared = {self.key_of(f.name): getattr(self, f.name) for f in fields(self)
                  if f.name != "opt_ins"}
        return {**shared, **{key: self.opt_ins.get(key, opt.default)
                             for key, opt in declared_opt_ins().items()}}

    def describe(self) -> str:
        return ", ".join(f"{k}={str(v).lower() if isinstance(v, bool) else v}"
                         for k, v in self.as_config().items())

    # -- checks --------------------------------------------------------------------------
    def require(self, key: str, mode: str, who: str) -> None:
        """Refuse ``mode`` unless the boolean policy ``key`` allows it."""
        if getattr(self, key.replace("-", "_")):
            return
        raise PolicyError(
            f"{who} refuses {mode}: its node policy does not allow it ({key}=false; policy: "
            f"{self.describe()}). Only the node's operator can opt in: node config "
            f"'{key}=true' (flower-supernode --node-config \"{key}=true\"), or in a "
            f"simulation run_in_simulation(..., node_policy={{'{key}': True}}) or "
            f"{POLICY_ENV}='{key}=true'")

    def check_size(self, n_bytes: float, what: str, who: str) -> None:
        """Refuse a request whose server-chosen sizes would make this node allocate more than
        its ``memory-budget-mb`` for ``what`` (checked before allocating anything)."""
        mb = float(n_bytes) / 2**20
        if not math.isfinite(mb) or mb > self.memory_budget_mb:
            raise PolicyError(
                f"{who} refuses {what}: the request's sizes need {mb:,.0f} MiB, more than its "
                f"node policy memory-budget-mb={self.memory_budget_mb:g}. Only the node's "
                f"operator can raise it (node config 'memory-budget-mb=<MiB>')")

    def check_iterations(self, count: int, key: str, who: str) -> None:
        """Refuse a request whose server-chosen iteration count ``key`` (the request's own
        number, so the refusal may echo it) exceeds this node's ``max-iterations``."""
        if count > self.max_iterations:
            raise PolicyError(
                f"{who} refuses the request: '{key}' asks for {count:,} iterations, more than "
                f"its node policy max-iterations={self.max_iterations}. Only the node's "
                f"operator can raise it (node config 'max-iterations=<count>')")

    def charge_dp(self, state: RecordDict, release: PrivacyLedger, what: str, who: str, *,
                  key: LedgerKey | None = None, run_id: int = 0) -> float:
        """Spend ``release.spent()`` of the node's DP budget on ``what``; refuse past the
        budget. ``release`` is the accountant of what the node is about to release, built by
        the node from what it uses (never from numbers the server declares).

        The spending is recorded in the node's own ledger file (``clients/dp_ledger.py``,
        path :func:`clients.dp_ledger.ledger_path`) under ``key`` (the node's identity and
        data; ``NodeContext.charge_dp`` passes it), before anything is released, so
        the budget holds across runs. Without a key the charge falls on ``who`` only.
        Returns the most any row of the key has now spent; the node state keeps this run's share
        (``_DP_SPENT``: ``epsilon`` of the run, ``total`` of the ledger) for the results.
        """
        from clients.dp_ledger import BudgetExceeded, Ledger, LedgerKey, ledger_path

        try:
            epsilon = float(release.spent())
        except ValueError as exc:  # a release row without its epsilon
            raise PolicyError(f"{who} refuses {what}: {exc}") from None
        if not (math.isfinite(epsilon) and epsilon > 0):
            raise PolicyError(f"{who} refuses {what}: epsilon must be finite and > 0, got "
                              f"{epsilon!r}")
        if epsilon > self.dp_budget + 1e-12:  # refused without touching the ledger
            raise self._over_budget(epsilon, 0.0, what, who)
        key = key if key is not None else LedgerKey(f"unidentified {who}")
        try:
            total = Ledger(ledger_path(self.dp_ledger)).charge(key, release, self.dp_budget,
                                                               what, run_id)
        except BudgetExceeded as exc:
            raise self._over_budget(epsilon, exc.spent, what, who) from None
        record = config_record(state, _DP_SPENT)
        if record is None:
            record = state[_DP_SPENT] = ConfigRecord({"epsilon": 0.0, "total": 0.0})
        record["epsilon"] = float(record["epsilon"]) + epsilon
        record["total"] = total
        return total

    def _over_budget(self, epsilon: float, spent: float, what: str, who: str) -> PolicyError:
        """The refusal of a charge past ``dp-budget`` (public amounts only)."""
        return PolicyError(
            f"{who} refuses {what}: epsilon {epsilon:g} on top of {spent:g} spent exceeds its "
            f"node policy dp-budget={self.dp_budget:g} (its DP ledger counts every run). Only "
            f"the node's operator can raise it (node config 'dp-budget=<epsilon>')")
