"""Federated SVD's wire (FedPower and the two schemes of paper 002), declared once for the
strategy (``strategies/fedsvd.py``) and the node (``clients/fedsvd.py``).

Each synchronization sends the common basis ``Z`` (record ``arrays`` of
``fedrec/wire/request.py``) with the iteration window; every node runs its local power
iterations and answers with its weighted, noised update as a share of a sum
(``fedsvd_sync``), or with its last iterate when T is not a synchronization
(``fedsvd_output``). fedsvd-utility's noise removal (Algorithm 2, step 10) sends each node an
encrypted selection value and takes back encrypted products, both in record :data:`HE`. The
evaluation round sends the final basis; nodes answer with ranking metric sums.
"""

from __future__ import annotations

from enum import StrEnum


class Action(StrEnum):
    """The node actions of federated SVD (``message_type = "query.<action>"``)."""

    SYNC = "fedsvd_sync"  # local iterations, then the weighted noisy update, as a sum
    OUTPUT = "fedsvd_output"  # the output rule when T is not a synchronization, as a sum
    NOISE_PRODUCT = "fedsvd_noise_product"  # Enc(b_i) x (w_i N_i): fedsvd-utility's removal
    EVALUATE = "fedsvd_evaluate"  # ranking metrics with the basis as a filter, as a sum


#: ConfigRecord of a noise-removal request (``t``, ``public-context``, ``selection``) and of
#: its reply (``products``).
HE = "fedsvd-he"
