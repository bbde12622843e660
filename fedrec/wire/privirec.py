"""PriviRec's wire, declared once for the strategy (``strategies/privirec.py``) and the node
(``clients/privirec.py``).

Every round but one is a secure sum over the run's fixed node set: item degrees, the
item-item Gram matrix P' (upper triangle; with the ``plain`` aggregator each node sends its
sparse triangle in record :data:`GRAM` instead, labelled plain in the results), and the
power-method rounds of Algorithm 1 (the current ``X`` and the item degrees in record
``arrays`` of ``fedrec/wire/request.py``). Parameters travel in the protocol's own config
record :data:`CONFIG_KEY`. The evaluation request names the filters each node builds and
scores its users with, and carries one upper triangle of P~ per alpha they need, stacked
into declared arrays (:class:`EvaluateRequest`); the reply is one ranking sum per filter,
stacked in the request's order (:class:`FilterRankings`).
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum

import numpy as np
import scipy.sparse as sp

from fedrec.recsys.graph_filters import SCORE_DTYPES
from fedrec.wire.evaluation import RANKING, RankingRequest
from fedrec.wire.message import (
    Message,
    WireError,
    message,
    per_round,
    reply,
    run_fixed,
    wire_fields,
)
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

#: Where each node's Omega rows come from (``clients.privirec.omega_rows``).
OMEGA_MODES = ("private", "seeded")
#: How a node sends its item-item contribution: masked dense triangle, or sparse in clear.
TRANSPORTS = ("dense", "sparse")


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
    """What every filter is built from. The upper triangles of P~, one per alpha the
    filters need (none for PriviRec-k), travel as one CSR stack: triangle t's values and
    column indices follow triangle t-1's in ``P.data`` / ``P.indices``, and row t of
    ``P.indptr`` holds its row pointers from 0 (:func:`triangle_fields` builds it,
    :meth:`triangles` reads it back). Nodes answer :class:`FilterRankings`."""

    CONFIG = CONFIG_KEY

    dataset: str = run_fixed(doc="selects each filter's published hyperparameters")
    filter_rank: int = run_fixed(0, min=0, doc="privirec-filter-rank (0: published ranks)")
    max_filter_rank: int = run_fixed(0, min=0, doc="PriviRec-k: the columns there are")
    score_dtype: str = run_fixed("float64", choices=SCORE_DTYPES)
    filters: list[str] = run_fixed(doc="the filters to build and score with, distinct (the "
                                   "reply's rows, in this order)")
    item_deg: np.ndarray = run_fixed(name="item_deg", shape=("items",))
    S: np.ndarray | None = per_round(None, shape=("items", "rank"), doc="the power method's "
                                     "basis (absent when no filter needs it)")
    eigvals: np.ndarray | None = per_round(None, shape=("rank",),
                                           doc="PriviRec-k: the eigenvalue estimates")
    alphas: np.ndarray = per_round(shape=("triangles",), doc="the alpha each broadcast "
                                   "triangle of P~ was built with, distinct")
    P_data: np.ndarray = per_round(name="P.data", shape=("entries",),
                                   doc="the triangles' values, one triangle after another")
    P_indices: np.ndarray = per_round(name="P.indices", shape=("entries",),
                                      doc="their column indices")
    P_indptr: np.ndarray = per_round(name="P.indptr", shape=("triangles", "pointers"),
                                     doc="each triangle's row pointers, from 0 (pointers = "
                                     "items + 1)")

    def triangles(self, n_items: int, who: str) -> dict[float, sp.csr_matrix]:
        """Each broadcast upper triangle by its alpha (views of the stack), checked first:
        distinct alphas, integer indices, row pointers of ``n_items`` rows from 0 that never
        decrease and together cover every value once, column indices inside the catalogue.
        A refusal names ``who`` and the field, never a value."""
        alphas, data, indices, indptr = self.alphas, self.P_data, self.P_indices, self.P_indptr
        names = {f.attr: f.name for f in wire_fields(type(self))}

        def refuse(attr: str, why: str) -> WireError:
            return WireError(f"{who} refuses the request: {type(self).__qualname__} field "
                             f"'{names[attr]}' {why}")

        if len(np.unique(alphas)) != len(alphas):
            raise refuse("alphas", "names an alpha twice")
        for attr, a in (("P_indices", indices), ("P_indptr", indptr)):
            if a.dtype.kind not in "iu":
                raise refuse(attr, f"must hold integers, got dtype {a.dtype}")
        if indptr.shape != (len(alphas), n_items + 1) or any(
                row[0] != 0 or np.any(row[1:] < row[:-1]) for row in indptr) or \
                sum(int(row[-1]) for row in indptr) != data.size:
            raise refuse("P_indptr", f"does not hold {n_items + 1} row pointers per alpha, "
                         "from 0 and never decreasing, that together cover every value once")
        if indices.size and (int(indices.min()) < 0 or int(indices.max()) >= n_items):
            raise refuse("P_indices", f"holds column indices outside 0..{n_items - 1}")
        starts = np.cumsum([0, *(int(row[-1]) for row in indptr)])
        return {float(alpha): sp.csr_matrix(
                    (data[starts[t]:starts[t + 1]], indices[starts[t]:starts[t + 1]],
                     indptr[t]), shape=(n_items, n_items))
                for t, alpha in enumerate(alphas)}


def triangle_fields(triangles: Mapping[float, sp.spmatrix],
                    n_items: int) -> dict[str, np.ndarray]:
    """The fields of :class:`EvaluateRequest` that stack the upper ``triangles`` of P~ (by
    alpha, each n_items x n_items), by attribute: ``EvaluateRequest(**triangle_fields(...),
    ...)``."""
    parts = [sp.csr_matrix(m) for m in triangles.values()]
    if any(m.shape != (n_items, n_items) for m in parts):
        raise ValueError(f"every triangle of P~ must be {n_items} x {n_items}")
    none = np.zeros(0, dtype=np.int32)
    return {"alphas": np.asarray(list(triangles), dtype=np.float64),
            "P_data": np.concatenate([none.astype(np.float64), *(m.data for m in parts)]),
            "P_indices": np.concatenate([none, *(m.indices for m in parts)]),
            "P_indptr": (np.stack([m.indptr for m in parts]) if parts
                         else np.zeros((0, n_items + 1), dtype=np.int32))}


@message()
class FilterRankings(Message):
    """A node's ranking-metric sums for every filter of the request, one row per filter in
    the request's order (``RankingSums.to_vector``)."""

    ranking: np.ndarray = reply(name=RANKING, shape=("filters", "metrics"))


# -- node opt-ins PriviRec reads (fedrec/wire/opt_in.py; a node's operator sets them) -------
OPT_INS = declare(
    OptIn("allow-seeded-omega", False, "PriviRec's Omega rows from the run seed: the server "
          "knows Omega, and with p >= users it recovers every row of the node exactly",
          "privirec"),
    OptIn("allow-sparse-transport", False, "PriviRec's item-item contribution sent unmasked "
          "as a sparse matrix (plain mode at full scale)", "privirec"),
)
