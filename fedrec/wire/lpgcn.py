"""LP-GCN's wire: the actions its messages name and the arrays a training round carries,
declared once for the strategy (``strategies/lpgcn.py``) and the node (``clients/lpgcn.py``).

A round's request and reply hold one ``arrays`` record (``fedrec/wire/request.py``) whose
array names say what each array is (:class:`Part`) and, for the per-layer parts, which layer:
``e2`` is item rows of layer 2; the reply adds the node's progress (:data:`STATUS`).
:func:`parse` reads a name back exactly (the whole name, so ``gn1`` is never taken for a
``g`` part), and refuses a name that is no part of the protocol.

Every request is a typed message (``fedrec/wire/message.py``) carrying the run's public
hyperparameters (:class:`Hyper`, and :class:`RunHyper` once the batch count is known); a
round's parts travel beside it, in the request's ``arrays`` record, under the names above
(their layers are the run's, so no fixed message field can name them).
"""

from __future__ import annotations

import re
from enum import StrEnum

import numpy as np

from fedrec.secure.pseudonyms import HOLDINGS
from fedrec.wire.evaluation import RankingRequest
from fedrec.wire.message import Message, message, per_round, reply, run_fixed
from fedrec.wire.opt_in import OptIn, declare


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


#: The relay purpose of the shared key S (``fedrec.transport.relay_server.relay_secret``).
SECRET_PURPOSE = "lpgcn-S"
#: The arithmetic precisions a run may choose.
DTYPES = ("float64", "float32")
#: The held set and the assignment's arrays: a node keeps them in its setup under these
#: same names (what it sent, and what the server assigned).
HELD, CONV_OF, HOLD_PTR, HOLD_NODES = "held", "conv_of", "hold_ptr", "hold_nodes"


# -- messages ----------------------------------------------------------------------------------
@message()
class Hyper(Message):
    """The public hyperparameters every LP-GCN request carries, fixed for the run: the
    node's memory and cover checks read them on every request (``clients/lpgcn.py``)."""

    backbone: str = run_fixed(doc="lightgcn or lightgcn+")
    layers: int = run_fixed(min=0, doc="graph convolution layers L (a loop count too)")
    dim: int = run_fixed(min=1, doc="embedding dimension")
    lr: float = run_fixed(min=0.0, doc="Adam learning rate")
    reg: float = run_fixed(min=0.0, doc="L2 weight on each triple's layer-0 rows")
    batch_size: int = run_fixed(min=1, doc="nominal triples per step (the loss divides by it)")
    seed: int = run_fixed()
    alpha: float = run_fixed(min=0.0, doc="virtual items per user (sampled holdings)")
    holdings: str = run_fixed(choices=HOLDINGS, doc="which virtual items a node holds")
    mask_scale: float = run_fixed(min=0.0, doc="std of the cover values")
    init_std: float = run_fixed(min=0.0, doc="std of the initial layer-0 rows")
    dtype: str = run_fixed(choices=DTYPES, doc="arithmetic precision")
    start_step: int = run_fixed(0, min=0, doc="first training step (a continued run)")


@message(Action.COUNT)
class CountRequest(Hyper):
    """This node's training interactions, as a sum (sent before the batch count is known)."""


@message()
class CountSum(Message):
    """A node's share of the interaction count."""

    n: np.ndarray = reply(shape=(1,))


@message()
class RunHyper(Hyper):
    """:class:`Hyper` and the batches per epoch (from the interaction count), which every
    request after ``lpgcn_count`` carries."""

    nbatches: int = run_fixed(min=1, doc="batches per epoch")


@message(Action.HOLDINGS)
class HoldingsRequest(RunHyper):
    """Draw the virtual items and send the held set; the run's node set to commit to and
    sign travels beside it (``fedrec.wire.sums.NodeSetRequest``)."""


@message()
class Holdings(Message):
    """A node's held items (real and virtual) as sorted pseudonyms under S; its signature
    on the node set travels beside them (``fedrec.wire.sums.NodeSetSignature``)."""

    held: np.ndarray = reply(name=HELD, shape=("held",))


@message(Action.ASSIGN)
class AssignRequest(RunHyper):
    """The convolution assignment: each held item's convolution node and, for a convolution
    node, its items' holder lists (CSR: ``hold_ptr`` into ``hold_nodes``); the node-set
    signatures travel beside it (``NODESET_SIGNED_KEY``)."""

    conv_of: np.ndarray = per_round(name=CONV_OF, shape=("held",))
    hold_ptr: np.ndarray | None = per_round(None, name=HOLD_PTR, shape=("lists",))
    hold_nodes: np.ndarray | None = per_round(None, name=HOLD_NODES, shape=("slots",))


@message(Action.VERIFY)
class VerifyRequest(RunHyper):
    """One of the verification's two rounds (counts, then degrees)."""


@message(Action.ROUND)
class RoundRequest(RunHyper):
    """One synchronous round of a training step (``train``) or of a forward pass; the
    deliveries travel beside it as :class:`Part` arrays."""

    step: int = per_round(min=0)
    train: bool = per_round()


@message()
class RoundStatus(Message):
    """A round's reply besides its uploads: the step the node is at, whether its forward
    pass is done (every layer of its users' rows formed)."""

    CONFIG = STATUS

    step: int = reply()
    forward_done: bool = reply()


@message(Action.EVALUATE)
class EvaluateRequest(RankingRequest, RunHyper):
    """Every item's final embedding, ascending pseudonym; nodes answer
    ``fedrec.wire.evaluation.RankingSum``."""

    V: np.ndarray = per_round(shape=("items", "dim"))


@message(Action.LOSSES)
class LossesRequest(RunHyper):
    """The loss shares of the first ``steps`` steps."""

    steps: int = per_round(min=0)


@message()
class LossSum(Message):
    """A node's loss share of every step so far (zero where it did not train)."""

    loss: np.ndarray = reply(shape=("steps",))


# -- node opt-ins LP-GCN reads (fedrec/wire/opt_in.py; a node's operator sets them) ---------
OPT_INS = declare(
    OptIn("allow-sampled-holdings", False, "LP-GCN with the paper's sampled virtual items "
          "(about lpgcn-alpha per user, drawn afresh every run) instead of the whole "
          "catalogue: the server's per-pseudonym holder counts then name real holdings, and "
          "linking runs intersects the fresh draws", "lpgcn"),
    OptIn("lpgcn-min-alpha", 0.5, "the smallest virtual-item rate the node accepts on every "
          "LP-GCN request (near 0 the server sees the real holdings; alpha = 0 is the plain "
          "mode: allow-plain, or a minimum of 0)", "lpgcn"),
    OptIn("lpgcn-min-mask-scale", 0.1, "the smallest cover scale the node accepts (covers "
          "not far above the item-gradient partials, ~1e-6 to 1e-3, let row magnitudes show "
          "the holdings; a float32 run needs a lower minimum)", "lpgcn"),
)
