"""A node's DP ledger on its own disk: what it spent, across every run, per row it released.

Why: a budget kept in Flower's per-run node state starts at zero in every new run, so a
server could ask the same silo for a fresh release per run; a budget keyed by names the
server chooses (dataset name, folder, partition label, split) starts fresh under a new name.
The ledger is a JSON file the node's operator owns (node config / policy key ``dp-ledger``,
else ``FEDREC_DP_LEDGER``, else ``~/.local/state/fedrec-privacy/dp-ledger.json``) and it
charges the *content* of what a release is about:

- rows: each release records the set of its users' row digests
  (:func:`datasets.row_digests`: the user's id and the items it has any interaction with in
  the source files, before any server-chosen filter or split), stored once per distinct set;
- what a row has spent is the sum, by basic composition, of every release in the file whose
  set holds it, whichever node identity, run, dataset name or folder made it; a release is
  refused when any of its rows would pass the budget. So the same rows under another name,
  a subset or a superset of them (another partition of the same users), all draw on the
  same per-row budget: user-level DP composes over the releases that contain the user, and
  a release that does not contain a user does not spend that user's budget.
- identity: the node's public signing key (``clients/identity_node.py``) groups the
  releases it made (for the operator's audit), and a release with no rows is charged to
  that identity. It is not part of a row's key: in a simulation the identity follows the
  partition label, which the server's config can move over other users.

Each release keeps its rows of :class:`fedrec.dp.PrivacyLedger`, the project's one accountant;
a release costs the accountant's ``spent()`` over them, or its recorded epsilon if that is
larger (a file edited by hand can only over-charge). A ledger written in an earlier format
(keyed by identity and a data-source digest, no row sets) still counts: each of its entries is
charged to every row its identity releases. A charge is recorded (file replaced atomically,
under an exclusive ``flock`` on a side lock file, so concurrent processes never lose an
update) *before* the noisy value is computed: a release that fails afterwards still counts.
A ledger that cannot be read is an error naming the file, never a silent reset to zero.

The same file keeps the other privacy state a new run must not start afresh: the node set
(roster partitions) each identity committed its sums to under each roster
(:meth:`Ledger.commit_node_set`, ``clients/nodeset.py``).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import math
import os
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedrec.dp import PrivacyLedger

#: Environment variable naming the ledger file when the policy has no ``dp-ledger``.
LEDGER_ENV = "FEDREC_DP_LEDGER"
#: The ledger file when neither the policy nor the environment names one.
DEFAULT_LEDGER = "~/.local/state/fedrec-privacy/dp-ledger.json"
_FORMAT = 3
#: Files this version reads: format 1 recorded each release's epsilon without its rows,
#: formats 1 and 2 keyed entries by identity and data source, without row sets.
_READS = (1, 2, 3)


class LedgerError(RuntimeError):
    """The ledger file cannot be read or written: the node refuses to release."""


class NodeSetDiffers(Exception):
    """A node set is not the one the key committed to in an earlier run."""


class BudgetExceeded(Exception):
    """A charge would pass the budget; ``spent`` is what the key had spent before it."""

    def __init__(self, spent: float) -> None:
        super().__init__(spent)
        self.spent = spent


@dataclass(frozen=True)
class LedgerKey:
    """Whose spending a charge draws on: the releasing node's public identity (hex) and the
    digests of the rows the release is about (:func:`datasets.row_digests`)."""

    identity: str
    rows: tuple[bytes, ...] = ()

    @property
    def row_set(self) -> frozenset[bytes]:
        """The rows charged; a release over no rows is charged to the identity itself."""
        if self.rows:
            return frozenset(bytes(r) for r in self.rows)
        return frozenset({hashlib.sha256(b"fedrec-ledger-identity|" + self.identity.encode())
                          .digest()[:16]})


def ledger_path(configured: str = "") -> Path:
    """The ledger file: the policy's ``dp-ledger`` (``configured``), else the environment,
    else home."""
    raw = configured or os.environ.get(LEDGER_ENV, "") or DEFAULT_LEDGER
    return Path(raw).expanduser()


class Ledger:
    """The ledger file at ``path`` (see the module docstring)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    @contextmanager
    def _locked(self) -> Iterator[None]:
        """An exclusive lock on ``<path>.lock`` (the ledger itself is replaced, so its inode
        cannot carry the lock)."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            handle = open(f"{self.path}.lock", "a")  # noqa: SIM115 (closed below)
        except OSError as exc:
            raise LedgerError(f"DP ledger {self.path}: cannot open its lock file: {exc}") \
                from None
        with handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def _read(self) -> dict[str, Any]:
        """The whole ledger; an empty one only when the file does not exist."""
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return {"format": _FORMAT, "entries": {}, "rowsets": {}, "node-sets": {}}
        except OSError as exc:
            raise LedgerError(f"DP ledger {self.path} cannot be read ({exc}); fix or move it "
                              "(its spending is not reset to zero)") from None
        try:
            data = json.loads(text)
            entries = data["entries"]
            rowsets = data.setdefault("rowsets", {})
            node_sets = data.setdefault("node-sets", {})
            if data.get("format") not in _READS or not isinstance(entries, dict) or \
                    not isinstance(rowsets, dict) or not isinstance(node_sets, dict):
                raise ValueError("unexpected layout")
            if not all(isinstance(v, list) and all(isinstance(p, int) for p in v)
                       for v in node_sets.values()):
                raise ValueError("a node set is not a list of partition ids")
            for entry in entries.values():
                _spent_of(entry)
                for release in entry["releases"]:
                    if "rows" in release and release["rows"] not in rowsets:
                        raise ValueError("a release names a row set the file does not hold")
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise LedgerError(f"DP ledger {self.path} is not a valid ledger ({exc}); fix or "
                              "move it (its spending is not reset to zero)") from None
        return data

    def _write(self, data: dict[str, Any]) -> None:
        """Replace the file atomically (temporary file in the same folder, fsync, rename)."""
        fd, tmp = tempfile.mkstemp(prefix=".dp-ledger.", dir=self.path.parent)
        try:
            with os.fdopen(fd, "w") as out:
                json.dump(data, out, indent=1, sort_keys=True)
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, self.path)
        except OSError as exc:
            Path(tmp).unlink(missing_ok=True)
            raise LedgerError(f"DP ledger {self.path} cannot be written: {exc}") from None

    def spent(self, key: LedgerKey) -> float:
        """The most any row of ``key`` has spent (0 when no release holds one)."""
        with self._locked():
            return _spent_by(self._read(), key)

    def releases(self, key: LedgerKey) -> list[dict[str, Any]]:
        """The recorded releases that hold a row of ``key``, oldest first."""
        with self._locked():
            return sorted((r for r, _ in _covering(self._read(), key)),
                          key=lambda r: float(r.get("time", 0.0)))

    def history(self, key: LedgerKey) -> PrivacyLedger:
        """Every release that holds a row of ``key``, as one accountant."""
        return _history_of({"releases": self.releases(key)})

    def charge(self, key: LedgerKey, release: PrivacyLedger, budget: float, what: str,
               run_id: int) -> float:
        """Record ``release`` (the accountant of what is about to be released) over the rows
        of ``key`` and return the most any of them has now spent, or raise
        :class:`BudgetExceeded` (nothing written) when its ``spent()`` on top of what some
        row spent would pass ``budget``."""
        epsilon = release.spent()
        rows = sorted(key.row_set)
        with self._locked():
            data = self._read()
            spent = _spent_by(data, key)
            if spent + epsilon > budget + 1e-12:
                raise BudgetExceeded(spent)
            data["format"] = _FORMAT
            blob = b"".join(rows)
            rowset = hashlib.sha256(blob).hexdigest()[:32]
            data["rowsets"].setdefault(rowset, blob.hex())
            entry = data["entries"].setdefault(
                key.identity, {"identity": key.identity, "epsilon": 0.0, "releases": []})
            entry["epsilon"] = float(entry["epsilon"]) + epsilon
            entry["releases"].append({"run": int(run_id), "what": what, "rows": rowset,
                                      "n-rows": len(rows), "epsilon": float(epsilon),
                                      "time": time.time(),
                                      "entries": release.to_table_rows()})
            self._write(data)
        return spent + epsilon

    def commit_node_set(self, key: str, partitions: list[int], shrink: bool) -> None:
        """Hold ``key`` (an identity under a roster) to the partition set it committed to in
        its first run: the same set again passes, a subset only if ``shrink``, anything else
        raises :class:`NodeSetDiffers` (nothing written). The first set is recorded."""
        partitions = sorted(int(p) for p in partitions)
        with self._locked():
            data = self._read()
            first = data["node-sets"].get(key)
            if first is None:
                data["format"] = _FORMAT
                data["node-sets"][key] = partitions
                self._write(data)
                return
            if partitions == sorted(first) or (shrink and set(partitions) < set(first)):
                return
            raise NodeSetDiffers(key)


def _cost(release: Mapping[str, Any]) -> float:
    """What one release spent: its accountant's ``spent()`` or its recorded epsilon, the
    larger."""
    return max(float(release["epsilon"]), _history_of({"releases": [release]}).spent())


def _rowset(data: Mapping[str, Any], rowset: str) -> frozenset[bytes]:
    blob = bytes.fromhex(data["rowsets"][rowset])
    return frozenset(blob[i:i + 16] for i in range(0, len(blob), 16))


def _covering(data: Mapping[str, Any], key: LedgerKey) -> list[tuple[dict[str, Any],
                                                                       frozenset[bytes]]]:
    """Each release holding a row of ``key``, with the rows of ``key`` it holds (an earlier
    format's release, without rows, holds every row its identity releases)."""
    rows = key.row_set
    held: dict[str, frozenset[bytes]] = {}
    out = []
    for entry in data["entries"].values():
        for release in entry["releases"]:
            if "rows" not in release:
                if entry.get("identity") == key.identity:
                    out.append((release, rows))
                continue
            if release["rows"] not in held:
                held[release["rows"]] = rows & _rowset(data, release["rows"])
            if held[release["rows"]]:
                out.append((release, held[release["rows"]]))
    return out


def _spent_by(data: Mapping[str, Any], key: LedgerKey) -> float:
    """The most any row of ``key`` has spent over the releases that hold it; an earlier
    format's entry of the same identity counts at its recorded total if that is larger."""
    by_set: dict[frozenset[bytes], float] = {}  # releases holding the same rows, summed
    for release, rows in _covering(data, key):
        by_set[rows] = by_set.get(rows, 0.0) + _cost(release)
    per_row: dict[bytes, float] = {}
    for rows, cost in by_set.items():
        for row in rows:
            per_row[row] = per_row.get(row, 0.0) + cost
    legacy = sum(max(0.0, _spent_of(e) - sum(_cost(r) for r in e["releases"]))
                 for e in data["entries"].values()
                 if e.get("identity") == key.identity and
                 not any("rows" in r for r in e["releases"]))
    return max(per_row.values(), default=0.0) + legacy


def _history_of(entry: Any) -> PrivacyLedger:
    """An entry's releases as one accountant. A format-1 release (its epsilon without rows)
    is one pure row of that epsilon."""
    rows: list[Mapping[str, Any]] = []
    for release in entry["releases"]:
        rows.extend(release.get("entries") or [{
            "name": str(release["what"]), "mechanism": "recorded",
            "epsilon": float(release["epsilon"]), "delta": 0.0, "sigma": None,
            "sensitivity": None, "sample_rate": 1.0, "steps": 1}])
    return PrivacyLedger.from_rows(rows)


def _spent_of(entry: Any) -> float:
    """What an entry has spent: the accountant over its releases, or the recorded total if
    larger; a negative or non-finite total, or a release the accountant refuses, is a
    corrupt ledger."""
    spent = float(entry["epsilon"])
    if not (math.isfinite(spent) and spent >= 0) or not isinstance(entry["releases"], list):
        raise ValueError("an entry's epsilon must be finite and >= 0 with a list of releases")
    return max(spent, _history_of(entry).spent())
