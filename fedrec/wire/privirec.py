"""PriviRec's wire, declared once for the strategy (``strategies/privirec.py``) and the node
(``clients/privirec.py``).

Every round but one is a secure sum over the run's fixed node set: item degrees, the
item-item Gram matrix P' (upper triangle; with the ``plain`` aggregator each node sends its
sparse triangle in record :data:`GRAM` instead, labelled plain in the results), and the
power-method rounds of Algorithm 1 (the current ``X`` and the item degrees in record
``arrays`` of ``fedrec/wire/request.py``). Parameters travel in the protocol's own config
record :data:`CONFIG_KEY`. The evaluation request adds :data:`FILTERS`, the filters each node
builds and scores its users with; the reply is a ranking sum per filter.
"""

from __future__ import annotations

from enum import StrEnum


class Action(StrEnum):
    """The node actions of PriviRec (``message_type = "query.<action>"``)."""

    DEGREES = "privirec_degrees"  # item degrees, as a sum
    GRAM = "privirec_gram"  # the item-item Gram matrix (Theorem 3.1), as a sum
    POWER = "privirec_power"  # one round of the power method (Algorithm 1), as a sum
    EVALUATE = "privirec_evaluate"  # every filter's ranking metrics, as a sum


#: ConfigRecord of every request's parameters (alpha, p, omega, top-k, ...).
CONFIG_KEY = "privirec"
#: A node's item-item contribution: the sum's array, or (``plain``) its sparse reply record.
GRAM = "gram"
#: ConfigRecord of the evaluation request: filter name -> True.
FILTERS = "filters"
