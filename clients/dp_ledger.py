"""A node's DP ledger on its own disk: what it spent, across every run, per identity and data.

Why: a budget kept in Flower's per-run node state starts at zero in every new run, so a
server could ask the same silo for a fresh release per run. The ledger is a JSON file the
node's operator owns (node config / policy key ``dp-ledger``, else ``FEDREC_DP_LEDGER``,
else ``~/.local/state/fedrec-privacy/dp-ledger.json``) with one entry per key:

- identity: the node's public signing key (``clients/identity_node.py``), so two nodes sharing a
  file (simulated nodes, one machine) keep separate budgets;
- data: a digest of the data *source* the node holds (dataset name and real path, or the
  synthetic generator's parameters). The server chooses the split and partition
  parameters (test ratio, seeds, scheme), so they are left out: changing them must not give
  the same people a fresh budget. Leaving them out can only over-charge.

Each entry holds the list of releases (run, what, time, and the release's rows of
:class:`fedrec.dp.PrivacyLedger`, the project's one accountant) and their total epsilon.
What a key has spent is the accountant's ``spent()`` over the rows of every release it made,
or the recorded total if that is larger (a file edited by hand can only over-charge). A
charge is recorded (file replaced atomically, under an exclusive ``flock`` on a
side lock file, so concurrent processes never lose an update) *before* the noisy value is
computed: a release that fails afterwards still counts. A ledger that cannot be read is an
error naming the file, never a silent reset to zero.
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
_FORMAT = 2
#: Files this version reads: format 1 recorded each release's epsilon without its rows.
_READS = (1, 2)


class LedgerError(RuntimeError):
    """The ledger file cannot be read or written: the node refuses to release."""


class BudgetExceeded(Exception):
    """A charge would pass the budget; ``spent`` is what the key had spent before it."""

    def __init__(self, spent: float) -> None:
        super().__init__(spent)
        self.spent = spent


@dataclass(frozen=True)
class LedgerKey:
    """Whose spending an entry records: a public identity and a data digest (both hex)."""

    identity: str
    data: str

    @property
    def text(self) -> str:
        return f"{self.identity}:{self.data}"


def ledger_path(configured: str = "") -> Path:
    """The ledger file: the policy's ``dp-ledger`` (``configured``), else the environment,
    else home."""
    raw = configured or os.environ.get(LEDGER_ENV, "") or DEFAULT_LEDGER
    return Path(raw).expanduser()


def data_digest(data_config: Mapping[str, Any]) -> str:
    """SHA-256 of the data source a data config names (see the module docstring)."""
    from datasets import DatasetSpec

    spec = DatasetSpec.from_config(data_config)
    source: dict[str, Any] = {"name": spec.name}
    if spec.name == "synthetic":
        source.update({k: v for k, v in spec.to_config().items()
                       if k.startswith("synthetic-") or k == "seed"})
    else:
        source["data-dir"] = os.path.realpath(spec.data_dir) if spec.data_dir else ""
    return hashlib.sha256(json.dumps(source, sort_keys=True).encode()).hexdigest()


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
            return {"format": _FORMAT, "entries": {}}
        except OSError as exc:
            raise LedgerError(f"DP ledger {self.path} cannot be read ({exc}); fix or move it "
                              "(its spending is not reset to zero)") from None
        try:
            data = json.loads(text)
            entries = data["entries"]
            if data.get("format") not in _READS or not isinstance(entries, dict):
                raise ValueError("unexpected layout")
            for entry in entries.values():
                _spent_of(entry)
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
        """The total epsilon ``key`` has spent (0 when it has no entry)."""
        with self._locked():
            entry = self._read()["entries"].get(key.text)
        return _spent_of(entry) if entry is not None else 0.0

    def releases(self, key: LedgerKey) -> list[dict[str, Any]]:
        """The recorded releases of ``key``, oldest first."""
        with self._locked():
            entry = self._read()["entries"].get(key.text)
        return list(entry["releases"]) if entry is not None else []

    def history(self, key: LedgerKey) -> PrivacyLedger:
        """Every release ``key`` made, as one accountant (empty when it has no entry)."""
        with self._locked():
            entry = self._read()["entries"].get(key.text)
        return _history_of(entry) if entry is not None else PrivacyLedger()

    def charge(self, key: LedgerKey, release: PrivacyLedger, budget: float, what: str,
               run_id: int) -> float:
        """Record ``release`` (the accountant of what is about to be released) for ``key``
        and return the key's new total, or raise :class:`BudgetExceeded` (nothing written)
        when its ``spent()`` on top of what the key spent would pass ``budget``."""
        epsilon = release.spent()
        with self._locked():
            data = self._read()
            data["format"] = _FORMAT
            entry = data["entries"].setdefault(
                key.text, {"identity": key.identity, "data": key.data, "epsilon": 0.0,
                           "releases": []})
            spent = _spent_of(entry)
            if spent + epsilon > budget + 1e-12:
                raise BudgetExceeded(spent)
            entry["epsilon"] = spent + epsilon
            entry["releases"].append({"run": int(run_id), "what": what,
                                      "epsilon": float(epsilon), "time": time.time(),
                                      "entries": release.to_table_rows()})
            self._write(data)
        return spent + epsilon


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
