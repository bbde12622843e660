"""Server side of every protocol: one module per protocol, a Flower Strategy subclass each.

:data:`REGISTRY` maps run-config ``protocol`` names to ``"module:Class"``;
:func:`load_strategy_class` also accepts ``"package.module:ClassName"`` for a user's own
``flwr.serverapp.strategy.Strategy`` subclass.
"""

from strategies.base import (
    REGISTRY,
    FedRecStrategy,
    ProtocolStrategy,
    RunOutcome,
    load_strategy_class,
)

__all__ = ["REGISTRY", "FedRecStrategy", "ProtocolStrategy", "RunOutcome", "load_strategy_class"]
