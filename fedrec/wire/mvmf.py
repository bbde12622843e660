"""FedMVMF / PrivMVMF's wire (paper 004), declared once for the strategy
(``strategies/mvmf.py``) and the node (``clients/mvmf.py``).

Every epoch the server sends the item-feature factors ``Q`` to the item server, which
answers in clear with its term of the item gradient (:class:`ItemTerm`, eq. 11), and ``Q``
and ``U`` to the user nodes, which answer with their summed gradients as shares of a sum
(:class:`TrainSum`; CKKS for PrivMVMF). At the end the item server names its new items and
their factors from eq. 17 (:class:`ColdFactors`); the evaluation request lists those items
(:data:`NEW_ITEMS`) and user nodes answer with ranking sums
(``fedrec.wire.evaluation.RankingSum``). Every request carries the model's public
hyperparameters (:class:`ModelRequest`); arrays named by the paper's symbols (``Q``, ``U``,
``gQ``, ``gU``) keep those names.
"""

from __future__ import annotations

from enum import StrEnum

import numpy as np

from fedrec.wire.evaluation import TOP_K
from fedrec.wire.message import Message, message, per_round, reply, run_fixed


class Action(StrEnum):
    """The node actions of FedMVMF / PrivMVMF (``message_type = "query.<action>"``)."""

    TRAIN = "mvmf_train"  # user nodes: one epoch's summed gradients, as a sum
    EVALUATE = "mvmf_evaluate"  # user nodes: ranking sums, as a sum
    ITEM_GRADIENT = "mvmf_item_gradient"  # the item server: its gradient term, in clear
    ITEM_COLD = "mvmf_item_cold"  # the item server: new items and their factors, in clear


#: Array of the item server's gradient reply: sum_d f(j, d), items x K.
ITEM_TERM = "item-term"
#: Arrays of the item server's cold-item reply: the new items' indices and factors (the
#: first also names the server's ledger phase of that round).
COLD_ITEMS = "cold-items"
COLD_FACTORS = "cold-factors"
#: Array of the evaluation request: the new (cold-start) items to rank, as indices.
NEW_ITEMS = "new-items"

#: Shapes: item factors Q (items x K), attribute factors U (attributes x K).
_Q = ("items", "K")
_U = ("attributes", "K")


@message()
class ModelRequest(Message):
    """What every MVMF request carries: the model's public hyperparameters (``MVMFConfig``,
    which checks their ranges on the node), the epoch and the evaluation's schema."""

    dim: int = run_fixed(min=1, doc="K, the latent dimension")
    lam1: float = run_fixed(doc="lambda1: weight of the attribute and item-feature views")
    lam2: float = run_fixed(doc="lambda2: L2 regularisation")
    alpha: float = run_fixed(doc="weight of an unrated (or sampled) item")
    rho: float = run_fixed(doc="sampled unrated items per rated item")
    weighting: str = run_fixed(doc="weights of unrated items")
    p_update: str = run_fixed(doc="user factors by SemiALS or an SGD step")
    lr: float = run_fixed(doc="the server's Adam rate (and the SGD step of p)")
    beta1: float = run_fixed()
    beta2: float = run_fixed()
    seed: int = run_fixed()
    epoch: int = per_round(min=0, doc="the epoch (seeds the sampled unrated items)")
    top_k: int = run_fixed(name=TOP_K, min=1, doc="length of the recommendation lists")
    threshold: float = run_fixed(doc="a test rating >= this is relevant")


@message(Action.ITEM_GRADIENT)
class ItemGradientRequest(ModelRequest):
    """The item server's epoch: its gradient term for the broadcast Q."""

    Q: np.ndarray = per_round(shape=_Q)


@message(Action.ITEM_COLD)
class ItemColdRequest(ModelRequest):
    """The item server's last step: its new items' factors from the final Q."""

    Q: np.ndarray = per_round(shape=_Q)


@message(Action.TRAIN)
class TrainRequest(ModelRequest):
    """A user node's epoch: its users' summed gradients for the server's Q and U."""

    Q: np.ndarray = per_round(shape=_Q)
    U: np.ndarray = per_round(shape=_U)


@message(Action.EVALUATE)
class EvaluateRequest(ModelRequest):
    """The final Q (cold items' rows from eq. 17) and U; the new items to rank (absent or
    empty: every item). The node checks the indices itself."""

    Q: np.ndarray = per_round(shape=_Q)
    U: np.ndarray = per_round(shape=_U)
    new_items: np.ndarray | None = per_round(None, name=NEW_ITEMS)


@message()
class ItemTerm(Message):
    """The item server's clear reply: sum_d f(j, d) and its loss term."""

    item_term: np.ndarray = reply(name=ITEM_TERM, shape=_Q)
    loss: np.ndarray = reply(shape=(1,))


@message()
class ColdFactors(Message):
    """The item server's clear reply: its new items (indices, as floats) and their factors."""

    cold_items: np.ndarray = reply(name=COLD_ITEMS, shape=("cold",))
    cold_factors: np.ndarray = reply(name=COLD_FACTORS, shape=("cold", "K"))


@message()
class TrainSum(Message):
    """A user node's share of an epoch's sum: summed gradients of Q and U, loss, users."""

    gQ: np.ndarray = reply(shape=_Q)
    gU: np.ndarray = reply(shape=_U)
    loss: np.ndarray = reply(shape=(1,))
    users: np.ndarray = reply(shape=(1,))
