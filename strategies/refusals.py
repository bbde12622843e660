"""Run-config refusals that carry their own fix, so a command line can name the flag to type.

A protocol that cannot run with a value (FedMVMF with ``implicit = true``, PriviRec-k with
``k`` above the catalogue) raises :class:`SettingRefused` with the key and a value that
works; ``run_simulation.py`` turns it into ``--set key=value``, and a simulation's
pre-flight applies the fix to go on looking for the run's other refusals, so one try
names every change (``fl_app/plan.py``).
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from fedrec.config import ConfigError


def config_value(value: Any) -> str:
    """``value`` as a ``--set`` / ``--run-config`` assignment writes it (``false``, ``256``)."""
    return str(value).lower() if isinstance(value, bool) else str(value)


class SettingRefused(ConfigError):
    """The run config's ``key`` cannot run this protocol; ``key = value`` can. The message
    (``why``) ends naming the assignment, in run-config terms."""

    def __init__(self, why: str, key: str, value: Any) -> None:
        self.key, self.value = key, value
        super().__init__(f"{why}: set {key} = {config_value(value)}")

    @property
    def assignment(self) -> str:
        """``key=value``, as ``--set`` takes it."""
        return f"{self.key}={config_value(self.value)}"


@runtime_checkable
class ChecksCatalogue(Protocol):
    """A strategy whose settings must fit the catalogue size (known from the data, before
    Flower starts in a simulation; at the handshake in a deployment)."""

    def check_catalogue(self, n_items: int) -> None:
        """Raise :class:`SettingRefused` when the run's settings do not fit ``n_items``."""
