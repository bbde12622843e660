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

import numpy as np

from fedrec.wire.evaluation import RATING, RankingRequest, RankingSum
from fedrec.wire.message import Message, message, per_round, reply, run_fixed
from fedrec.wire.opt_in import OptIn, declare


class Action(StrEnum):
    """The node actions of DP prototypes (``message_type = "query.<action>"``)."""

    PROTOTYPES = "dpp_prototypes"  # the silo's DP prototypes and their release ledger
    EVALUATE = "dpp_evaluate"  # fit user factors to V; ranking and rating sums


#: ArrayRecord in the prototypes reply: ``P``, k x items.
PROTOTYPES_RECORD = "prototypes"
#: ConfigRecord in the prototypes reply: ``rows``, the release's DP ledger as JSON rows.
LEDGER_RECORD = "dp-ledger"
#: Field of the evaluation request: the silo's HALS sweeps (an iteration count it checks).
NMF_ITERS = "nmf-iters"


@message(Action.PROTOTYPES)
class PrototypesRequest(Message):
    """A silo's release: the public parameters of ``PrototypeParams`` (their wire names its
    attributes; the silo checks the ranges) and the seed of its public random streams.

    Every field is per request, not fixed for the run: a request is one release, checked
    against the silo's users and charged to its DP ledger on its own, and carries nothing
    over to a later one (a deviating server's second release is refused, or charged, by what
    it asks, whatever the first asked)."""

    k: int = per_round(min=1, doc="prototypes per silo")
    epsilon: float = per_round(doc="pure epsilon of the release")
    value_max: float = per_round(name="value_max", doc="public bound of an entry")
    sparsity: int = per_round(min=1, doc="largest entries kept per user and prototype")
    radius: float = per_round(doc="public L2 bound of a user row (0: implied by the clips)")
    delta: float = per_round(doc="failure probability of the private grid")
    trials: int = per_round(min=1, doc="independent trials")
    shifts: int = per_round(min=1, doc="shifted grids per trial")
    swaps: int = per_round(min=1, doc="local-search swaps per trial")
    jl_coef: float = per_round(name="jl_coef", doc="JL dimension coefficient")
    accounting: str = per_round(doc="strict, or the paper's printed noise scales")
    seed: int = per_round(0, doc="seed of the public (never the DP) random streams")


@message()
class PrototypesReply(Message):
    """A silo's release: its prototypes and the rows of that release's DP ledger (JSON)."""

    ARRAYS = PROTOTYPES_RECORD
    CONFIG = LEDGER_RECORD

    P: np.ndarray = reply(shape=("k", "items"))
    rows: str = reply()


@message(Action.EVALUATE)
class EvaluateRequest(RankingRequest):
    """The item factors fitted on all prototypes and what a silo needs to fit its own user
    factors against them and score them."""

    V: np.ndarray = per_round(shape=("items", "rank"))
    reg: float = run_fixed(min=0.0, doc="lambda of the silo's NMF fit")
    nmf_iters: int = run_fixed(name=NMF_ITERS, min=0, doc="HALS sweeps of the silo's fit")
    value_max: float = run_fixed(doc="predictions are clipped to [0, value-max]")


@message()
class MetricSums(RankingSum):
    """A silo's share of the evaluation sum: ranking sums and squared-error / mean-rank
    sums (``fedrec/recsys/prototypes.py``: ``silo_metric_sums``)."""

    rating: np.ndarray = reply(name=RATING, shape=("rating",))


# -- node opt-ins DP prototypes reads (fedrec/wire/opt_in.py; a node's operator sets them) --
OPT_INS = declare(
    OptIn("allow-paper-accounting", False, "answer a dp-prototypes release in paper 003's "
          "printed accounting (dpp-accounting = paper), which spends 2.25 x epsilon by basic "
          "composition and uses the exact cluster sizes; the node charges its budget what it "
          "really spends", "dp-prototypes"),
)
