"""Server side of every protocol: one module per protocol, a Flower Strategy subclass each.

Protocols are registered by import path in ``fl_app/registry.py``; ``strategies.base`` holds
what they share (handshake, :class:`ProtocolStrategy`, :class:`RunOutcome`).
"""

from strategies.base import ProtocolStrategy, RunOutcome

__all__ = ["ProtocolStrategy", "RunOutcome"]
