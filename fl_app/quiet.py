"""Keep two Flower log lines that say nothing about a run off the console.

Both come on every in-process simulation: the notice that ``flwr.simulation.run_simulation`` is
deprecated (in flwr 1.42.0 it is still the only in-process simulation entry point, which the
main job, tests and benchmarks need to get results back in process; ``flwr run`` is the CLI path and
works too, see README), and each Ray actor's "Manually terminating" at shutdown, logged in
the worker process. The filter is installed in the driver (``fl_app.simulation``) and in every
process that imports the ClientApp (``fl_app.client_app``).
"""

from __future__ import annotations

import logging


class FlowerNoise(logging.Filter):
    """Drops the two lines above; everything else Flower logs passes."""

    NOISE = ("`run_simulation` function is deprecated", "Manually terminating")

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(noise in message for noise in self.NOISE)


_FILTER = FlowerNoise()


def quiet_flower_noise() -> None:
    """Install the filter on Flower's logger (once per process)."""
    flwr_log = logging.getLogger("flwr")
    if _FILTER not in flwr_log.filters:
        flwr_log.addFilter(_FILTER)
