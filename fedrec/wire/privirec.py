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

import numpy as np
import scipy.sparse as sp

from fedrec.recsys.graph_filters import SCORE_DTYPES
from fedrec.wire.evaluation import RankingRequest
from fedrec.wire.message import Message, message, per_round, reply, run_fixed
from fedrec.wire.opt_in import OptIn, declare


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
#: Name prefix of a broadcast upper triangle of P~ in the evaluation request's arrays
#: (``P@<alpha>.data`` / ``.indices`` / ``.indptr`` / ``.shape``, ``datasets.csr``): one per
#: alpha the filters need, so the triangles are not fields of :class:`EvaluateRequest`.
TRIANGLE = "P@"

#: Where each node's Omega rows come from (``clients.privirec.omega_rows``).
OMEGA_MODES = ("private", "seeded")
#: How a node sends its item-item contribution: masked dense triangle, or sparse in clear.
TRANSPORTS = ("dense", "sparse")


def triangle_prefix(alpha: float) -> str:
    """The array-name prefix of the upper triangle of P~ built with ``alpha``."""
    return f"{TRIANGLE}{alpha:g}"


@message()
class _Protocol(Message):
    """Base of PriviRec's requests: their parameters travel in record :data:`CONFIG_KEY`."""

    CONFIG = CONFIG_KEY


@message(Action.DEGREES)
class DegreesRequest(_Protocol):
    """Eq. 6: every node's item degree counts (nothing to send but the sum record)."""


@message()
class DegreesSum(Message):
    """A node's item degree counts."""

    deg: np.ndarray = reply(shape=("items",))


@message(Action.GRAM)
class GramRequest(_Protocol):
    """Theorem 3.1: sum over a node's users of d_u^{-2 alpha} R_u^T R_u."""

    alpha: float = per_round(doc="the normalization exponent (one request per alpha the "
                             "filters need)")
    transport: str = run_fixed("dense", choices=TRANSPORTS,
                               doc="dense: a masked sum of the upper triangle; sparse: the "
                               "triangle in clear (aggregator plain, allow-sparse-transport)")


@message()
class GramSum(Message):
    """A node's upper triangle of the weighted item-item matrix, row-major, dense."""

    gram: np.ndarray = reply(name=GRAM, shape=("pairs",))


@message()
class SparseGram(Message):
    """A node's upper triangle in clear as CSR parts (the ``sparse`` transport's reply, in
    record :data:`GRAM`)."""

    ARRAYS = GRAM

    data: np.ndarray = reply(name="G.data", shape=("entries",))
    indices: np.ndarray = reply(name="G.indices", shape=("entries",))
    indptr: np.ndarray = reply(name="G.indptr", shape=("pointers",))
    shape: np.ndarray = reply(name="G.shape", shape=(2,))

    @classmethod
    def of(cls, m: sp.spmatrix) -> SparseGram:
        """The CSR parts of ``m`` (as ``datasets.csr.csr_to_arrays`` lays them out)."""
        m = sp.csr_matrix(m)
        return cls(data=m.data, indices=m.indices, indptr=m.indptr,
                   shape=np.asarray(m.shape, dtype=np.int64))

    def matrix(self) -> sp.csr_matrix:
        """The CSR matrix these parts describe."""
        return sp.csr_matrix((self.data, self.indices, self.indptr),
                             shape=tuple(int(x) for x in self.shape))


@message(Action.POWER)
class PowerRequest(_Protocol):
    """Algorithm 1, one secure-sum round: without ``X`` the sketch R~^T Omega, with it
    R~^T R~ X, with ``ritz`` too the k x k sum (R~ X)^T (R~ X)."""

    item_deg: np.ndarray = run_fixed(name="item_deg", shape=("items",),
                                     doc="the summed item degrees")
    X: np.ndarray | None = per_round(None, doc="the current basis, items x k (absent in the "
                                     "sketch round); the node checks its shape and budget")
    p: int = run_fixed(min=1, doc="the iteration rank: Omega's columns")
    omega: str = run_fixed(choices=OMEGA_MODES)
    seed: int = run_fixed()
    ritz: bool | None = per_round(None, doc="the Rayleigh-Ritz round (absent otherwise)")


@message()
class PowerSum(Message):
    """A node's R~^T Omega or R~^T R~ X."""

    Y: np.ndarray = reply(shape=("items", "k"))


@message()
class RitzSum(Message):
    """A node's (R~ X)^T (R~ X)."""

    H: np.ndarray = reply(shape=("k", "k"))


@message(Action.EVALUATE)
class EvaluateRequest(RankingRequest):
    """What every filter is built from; the upper triangles of P~ travel beside these
    arrays (:data:`TRIANGLE`) and the filters' names in record :data:`FILTERS`. Nodes answer
    a ranking sum per filter, named by the filter."""

    CONFIG = CONFIG_KEY

    dataset: str = run_fixed(doc="selects each filter's published hyperparameters")
    filter_rank: int = run_fixed(0, min=0, doc="privirec-filter-rank (0: published ranks)")
    max_filter_rank: int = run_fixed(0, min=0, doc="PriviRec-k: the columns there are")
    score_dtype: str = run_fixed("float64", choices=SCORE_DTYPES)
    item_deg: np.ndarray = run_fixed(name="item_deg", shape=("items",))
    S: np.ndarray | None = per_round(None, shape=("items", "rank"), doc="the power method's "
                                     "basis (absent when no filter needs it)")
    eigvals: np.ndarray | None = per_round(None, shape=("rank",),
                                           doc="PriviRec-k: the eigenvalue estimates")


# -- node opt-ins PriviRec reads (fedrec/wire/opt_in.py; a node's operator sets them) -------
OPT_INS = declare(
    OptIn("allow-seeded-omega", False, "PriviRec's Omega rows from the run seed: the server "
          "knows Omega, and with p >= users it recovers every row of the node exactly",
          "privirec"),
    OptIn("allow-sparse-transport", False, "PriviRec's item-item contribution sent unmasked "
          "as a sparse matrix (plain mode at full scale)", "privirec"),
)
