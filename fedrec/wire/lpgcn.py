"""LP-GCN's wire: the actions its messages name and the arrays a training round carries,
declared once for the strategy (``strategies/lpgcn.py``) and the node (``clients/lpgcn.py``).

A round's request and reply hold one ``arrays`` record (``fedrec/wire/request.py``) whose
array names say what each array is (:class:`Part`) and, for the per-layer parts, which layer:
``e2`` is item rows of layer 2; the reply adds the node's progress (:data:`STATUS`).
:func:`parse` reads a name back exactly (the whole name, so ``gn1`` is never taken for a
``g`` part), and refuses a name that is no part of the protocol.
"""

from __future__ import annotations

import re
from enum import StrEnum


class Action(StrEnum):
    """The node actions of LP-GCN (``message_type = "query.<action>"``)."""

    COUNT = "lpgcn_count"  # training interactions, as a sum
    HOLDINGS = "lpgcn_holdings"  # held items as pseudonyms under S
    ASSIGN = "lpgcn_assign"  # the convolution assignment
    VERIFY = "lpgcn_verify"  # convolution nodes' sealed confirmations
    ROUND = "lpgcn_round"  # one message round of a training or forward step
    EVALUATE = "lpgcn_evaluate"  # ranking metrics as a sum
    LOSSES = "lpgcn_losses"  # the recorded loss shares, as a sum


class Part(StrEnum):
    """What one array of a round is. Per-layer parts are sent as ``<part><layer>``."""

    #: node -> server: pseudonyms of the negatives outside its holdings it needs rows of.
    NEG_REQUEST = "negreq"
    #: server -> node: every layer's rows of the requested negatives, (n, L+1, d).
    NEG_ROWS = "neg"
    #: LightGCN+'s W rows: a convolution node's own items up, every held item's down.
    W = "w"
    #: per layer: item rows; up from the convolution node, down for every held item.
    ITEM_ROWS = "e"
    #: per layer: item-gradient partials up (covered), gradient sums down.
    ITEM_GRAD = "g"
    #: per layer: the direct gradient terms of the requested negatives.
    NEG_GRAD = "gn"


#: ConfigRecord in a round's reply: the ``step`` the node is at and whether its
#: ``forward-done``.
STATUS = "lpgcn-status"

#: Parts that carry a layer number in their name.
LAYERED = frozenset({Part.ITEM_ROWS, Part.ITEM_GRAD, Part.NEG_GRAD})
_NAME = re.compile(r"(?P<part>[a-z]+?)(?P<layer>\d*)")


class WireError(ValueError):
    """An array name that is no part of LP-GCN's round."""


def name(part: Part, layer: int | None = None) -> str:
    """The array name of ``part`` (of ``layer`` for a per-layer part)."""
    if (part in LAYERED) != (layer is not None):
        raise WireError(f"LP-GCN part {part.value!r} "
                        + ("needs a layer" if part in LAYERED else "has no layer"))
    return part.value if layer is None else f"{part.value}{int(layer)}"


def parse(array_name: str) -> tuple[Part, int | None]:
    """``(part, layer)`` of an array name; :class:`WireError` for anything else."""
    match = _NAME.fullmatch(array_name)
    if match is not None:
        try:
            part = Part(match["part"])
        except ValueError:
            part = None
        digits = match["layer"]
        if part is not None and (part in LAYERED) == bool(digits):
            return part, int(digits) if digits else None
    raise WireError(f"unknown LP-GCN array {array_name!r}")
