"""DP prototypes' wire (paper 003), declared once for the strategy
(``strategies/dp_prototypes.py``) and the node (``clients/dp_prototypes.py``).

The server asks every silo for its k differentially private prototypes
(``dpp_prototypes``); a silo charges the release to its own DP ledger first and answers with
the prototypes (record :data:`PROTOTYPES_RECORD`) and the rows of that release's ledger
(record :data:`LEDGER_RECORD`), which the run's privacy section reports. The evaluation round
(``dpp_evaluate``) sends the item factors fitted on all prototypes; silos answer with ranking
and rating sums (``fedrec/wire/evaluation.py``) as shares of a sum.
"""

from __future__ import annotations

from enum import StrEnum


class Action(StrEnum):
    """The node actions of DP prototypes (``message_type = "query.<action>"``)."""

    PROTOTYPES = "dpp_prototypes"  # the silo's DP prototypes and their release ledger
    EVALUATE = "dpp_evaluate"  # fit user factors to V; ranking and rating sums


#: ArrayRecord in the prototypes reply: ``P``, k x items.
PROTOTYPES_RECORD = "prototypes"
#: ConfigRecord in the prototypes reply: ``rows``, the release's DP ledger as JSON rows.
LEDGER_RECORD = "dp-ledger"
