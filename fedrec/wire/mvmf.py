"""FedMVMF / PrivMVMF's wire (paper 004), declared once for the strategy
(``strategies/mvmf.py``) and the node (``clients/mvmf.py``).

Every epoch the server sends the item-feature factors ``Q`` to the item server, which
answers in clear with its term of the item gradient (:data:`ITEM_TERM`, eq. 11), and ``Q``
and ``U`` to the user nodes, which answer with their summed gradients as shares of a sum
(CKKS for PrivMVMF). At the end the item server names its new items (:data:`COLD_ITEMS`) and
their factors from eq. 17 (:data:`COLD_FACTORS`); the evaluation request lists those items
(:data:`NEW_ITEMS`) and user nodes answer with ranking sums. Arrays travel in record
``arrays`` (``fedrec/wire/request.py``); arrays named by the paper's symbols (``Q``, ``U``,
``gQ``, ``gU``) keep those names.
"""

from __future__ import annotations

from enum import StrEnum


class Action(StrEnum):
    """The node actions of FedMVMF / PrivMVMF (``message_type = "query.<action>"``)."""

    TRAIN = "mvmf_train"  # user nodes: one epoch's summed gradients, as a sum
    EVALUATE = "mvmf_evaluate"  # user nodes: ranking sums, as a sum
    ITEM_GRADIENT = "mvmf_item_gradient"  # the item server: its gradient term, in clear
    ITEM_COLD = "mvmf_item_cold"  # the item server: new items and their factors, in clear


#: Array of the item server's gradient reply: sum_d f(j, d), items x K.
ITEM_TERM = "item-term"
#: Arrays of the item server's cold-item reply: the new items' indices and factors.
COLD_ITEMS = "cold-items"
COLD_FACTORS = "cold-factors"
#: Array of the evaluation request: the new (cold-start) items to rank, as indices.
NEW_ITEMS = "new-items"
