"""PriviRec / PriviRec-k client (paper 000): a node's share of every secure sum, and local
scoring of its own users with the filters built from what the server broadcasts.

Every reply that carries data about the node's users goes through ``sum_reply`` (a
SecAgg+ contribution, or a labelled plain contribution when ``aggregator = plain``), except the
sparse item-item contribution in plain mode, which is the labelled full-scale shortcut of
``aggregator = plain`` (the dense masked form of an |I| x |I| matrix does not fit a node at
Gowalla scale; see docs/protocols/privirec.md).

The node's own policy (``clients/policy.py``) decides whether it answers the weaker requests:
``transport: sparse`` (its rows of R^T R unmasked) needs ``allow-sparse-transport`` and
``omega: seeded`` (Omega known to the server) needs ``allow-seeded-omega``.
"""

from __future__ import annotations

import math

import numpy as np
import scipy.sparse as sp
from flwr.app import RecordDict

from clients.handlers import handler
from clients.node import NodeContext
from clients.sums_node import ranking_bytes, sum_reply
from fedrec.records import (
    arrays_of,
    csr_from_arrays,
    csr_to_arrays,
    pop_arrays,
    to_array_record,
)
from fedrec.recsys.graph_filters import SCORE_DTYPES, SparseItemItem, make_filter
from fedrec.recsys.linalg import (
    normalize_rows,
    symmetric_from_upper,
    upper_triangle,
    user_gram_weight,
)
from fedrec.recsys.metrics import evaluate_ranking
from fedrec.wire import evaluation as evaluation_wire
from fedrec.wire import privirec as privirec_wire
from fedrec.wire import request as request_wire
from fedrec.wire.privirec import Action

#: Gaussian start rows are clipped to +-OMEGA_CLIP so their secure sum has a declared range
#: (P(|z| > 8) ~ 1e-15 per draw; the distribution is otherwise unchanged).
OMEGA_CLIP = 8.0
#: Refuse a dense masked item-item matrix larger than this many bytes per node.
MAX_DENSE_GRAM_BYTES = 2 << 30


def _binary_rows(node: NodeContext) -> sp.csr_matrix:
    train = sp.csr_matrix(node.data().train, dtype=np.float64)
    train.data[:] = 1.0
    return train


def omega_rows(user_ids: np.ndarray, p: int, mode: str, seed: int) -> np.ndarray:
    """The node's private rows of the Gaussian start Omega (paper A2: the server never sees it).

    ``private``: AES-256-CTR keyed from the OS CSPRNG, Box-Muller
    (``fedrec.secure.randomness.csprng_normal``): known to nobody but this node.
    ``seeded``: drawn from (seed, user id), reproducible by the centralized reference (tests,
    benchmarks); anyone who knows the run seed knows Omega, so use it only for evaluation.
    """
    if mode == "private":
        from fedrec.secure.randomness import csprng_normal

        rows = csprng_normal((len(user_ids), p))
    elif mode == "seeded":
        rows = np.empty((len(user_ids), p))
        for r, uid in enumerate(user_ids):
            rows[r] = np.random.default_rng([seed, 31, int(uid)]).standard_normal(p)
    else:
        raise ValueError(f"privirec omega mode must be 'private' or 'seeded', got {mode!r}")
    return np.clip(rows, -OMEGA_CLIP, OMEGA_CLIP)


@handler(Action.DEGREES, sums=True)
def degrees(content: RecordDict, node: NodeContext) -> RecordDict:
    """Secure sum #1 (Eq. 6): this node's item degree counts."""
    deg = np.asarray(_binary_rows(node).sum(axis=0)).ravel()
    return sum_reply(node, {"deg": deg})


def _reserve_product(node: NodeContext, train: sp.csr_matrix, user_deg: np.ndarray,
                     sparse: bool) -> None:
    """Reserve the sparse item-item product before computing it: it has at most
    min(n^2, sum_u d_u^2) entries (value and index, 16 bytes each), held at once by the
    product, its weighted factor's copy and its upper triangle, plus three copies of the
    node's rows (transpose, weighting, CSR conversion). Without it a catalogue the server
    names (e.g. ``synthetic-items``) is multiplied out before the dense reservation.

    Masked (dense) transport counts the rows by the handshake's published bound and the
    product by n^2 (sum_u d_u^2 is at most interactions x n): a refusal then depends on
    published numbers only. Sparse transport (``allow-sparse-transport``) sends the
    product's rows in clear, so its estimate may use the node's own counts."""
    n = train.shape[1]
    if sparse:
        nnz = float(train.nnz)
        entries = min(float(n) * n, float(np.sum(user_deg.astype(np.float64) ** 2)))
    else:
        nnz = float(node.interactions_bound())
        entries = min(float(n) * n, nnz * n)
    node.reserve(3 * 16.0 * entries + 3 * 16.0 * nnz,
                 f"PriviRec's item-item product ({n} items)")


@handler(Action.GRAM, sums=True)
def gram(content: RecordDict, node: NodeContext) -> RecordDict:
    """Secure sum #2 (Theorem 3.1): sum over this node's users of d_u^{-2 alpha} R_u^T R_u."""
    cfg = content.config_records[privirec_wire.CONFIG_KEY]
    transport = str(cfg.get("transport", "dense"))
    if transport not in ("dense", "sparse"):
        raise ValueError(f"{node.who}: privirec transport must be 'dense' or 'sparse', got "
                         f"{transport!r}")
    train = _binary_rows(node)
    n = train.shape[1]
    if transport == "sparse":  # labelled plain mode, only if this node's operator allows it
        node.policy.require("allow-sparse-transport", "PriviRec transport 'sparse' (its rows "
                            "of R^T R unmasked)", node.who)
        node.policy.require("allow-plain", "PriviRec transport 'sparse' (a plain sum)",
                            node.who)
    else:
        if n * (n + 1) // 2 * 8 > MAX_DENSE_GRAM_BYTES:
            raise MemoryError(
                f"partition {node.partition_id}: a dense masked item-item matrix for {n} items "
                f"needs {n * (n + 1) * 4 / 2**30:.1f} GiB; use secagg='none' or privirec-k")
        # the upper triangle's values and its two int64 index arrays
        node.reserve(24.0 * (n * (n + 1) // 2), f"PriviRec's dense item-item sum ({n} items)")
    user_deg = np.asarray(train.sum(axis=1)).ravel()
    _reserve_product(node, train, user_deg, sparse=transport == "sparse")
    weights = user_gram_weight(user_deg, float(cfg["alpha"]))
    G = upper_triangle(train.T @ sp.diags(weights) @ train)
    if transport == "sparse":
        return RecordDict({privirec_wire.GRAM: to_array_record(csr_to_arrays(G, "G"))})
    rows, cols = np.triu_indices(n)
    dense = np.asarray(G[rows, cols]).ravel()
    return sum_reply(node, {privirec_wire.GRAM: dense})


@handler(Action.POWER, sums=True)
def power_step(content: RecordDict, node: NodeContext) -> RecordDict:
    """Algorithm 1, one secure-sum round.

    First round (no X in the request): Y = R~_node^T Omega_node with the node's private
    Omega rows. Later rounds: Y = R~_node^T (R~_node X). With ``ritz`` set, the k x k
    Rayleigh-Ritz sum H = (R~_node X)^T (R~_node X) instead.
    """
    cfg = content.config_records[privirec_wire.CONFIG_KEY]
    arrays = arrays_of(content)
    data = node.data()
    if "X" not in arrays:
        p = node.size(cfg, "p")
        # Omega's rows (drawn, then clipped: ~3 copies) and Y = R~^T Omega, items x p
        node.reserve(8.0 * p * (3 * len(data.user_ids) + data.n_items),
                     f"PriviRec's oversampling p={p} (Omega and R~^T Omega)")
        if str(cfg["omega"]) == "seeded":
            node.policy.require("allow-seeded-omega", "PriviRec omega 'seeded' (the server "
                                "knows Omega and, with p >= users, recovers every row)",
                                node.who)
        A = normalize_rows(_binary_rows(node), arrays["item_deg"])
        omega = omega_rows(data.user_ids, p, str(cfg["omega"]), int(cfg["seed"]))
        out = {"Y": np.asarray(A.T @ omega)}
    else:
        X = _checked_X(node, arrays["X"], data.n_items, len(data.user_ids))
        A = normalize_rows(_binary_rows(node), arrays["item_deg"])
        A = A.astype(X.dtype, copy=False)  # a float32 wire keeps the node's products in float32 too
        AX = np.asarray(A @ X)
        out = {"H": AX.T @ AX} if cfg.get("ritz") else {"Y": np.asarray(A.T @ AX)}
    return sum_reply(node, out)


def _checked_X(node: NodeContext, X: np.ndarray, n_items: int, n_users: int) -> np.ndarray:
    """The request's X, items x k, refused unless its k columns fit the node's budget for
    R~ X (users x k), R~^T R~ X (items x k) and the k x k Ritz sum."""
    if X.ndim != 2 or X.shape[0] != n_items:
        raise ValueError(f"{node.who}: the request's X has shape {X.shape}, expected "
                         f"({n_items}, k) for {n_items} items")
    k = X.shape[1]
    node.reserve(float(X.dtype.itemsize) * k * (n_users + n_items + k),
                 f"PriviRec's power step with X of {k} columns")
    return X


def _check_triangles(node: NodeContext, declared: dict[str, int], n_items: int) -> None:
    """Each broadcast upper triangle P~ (CSR: data, indices, indptr, shape) as declared: one index
    per value and a row pointer per item, so its values bound its memory."""
    for name in (n for n in declared if n.startswith("P@") and n.endswith(".data")):
        stem = name.removesuffix(".data")
        if declared.get(f"{stem}.indices") != declared[name] or \
                declared.get(f"{stem}.indptr") != n_items + 1 or \
                declared.get(f"{stem}.shape") != 2:
            raise ValueError(f"{node.who}: the request's '{stem}' is not an upper triangle of "
                             f"{n_items} items (one index per value, {n_items + 1} row "
                             "pointers, a shape of 2 numbers)")


@handler(Action.EVALUATE, sums=True)
def evaluate(content: RecordDict, node: NodeContext) -> RecordDict:
    """Build every requested filter from the broadcast pieces and score this node's users.

    Replies (through the secure sum) the Recall/NDCG sums per filter, so the server learns
    only totals over all nodes.
    """
    cfg = content.config_records[privirec_wire.CONFIG_KEY]
    filters = content.config_records[privirec_wire.FILTERS]
    data = node.data()
    train = _binary_rows(node)
    dtype = str(cfg.get("score-dtype", "float64"))
    if dtype not in SCORE_DTYPES:
        raise ValueError(f"{node.who}: privirec score-dtype must be one of {SCORE_DTYPES}, "
                         f"got {dtype!r}")
    # One operator per alpha, shared by every filter that uses it (BSPM-LM and -EM then share
    # the blocked kernel); the broadcast upper triangles are dropped once expanded, because
    # at Yelp2018 scale each P~ is ~0.8 GB on a node.
    k = node.size(cfg, evaluation_wire.TOP_K, default=20)
    ranks = [node.size(cfg, key, minimum=0, default=0)
             for key in ("filter-rank", "max-filter-rank")]
    # reserved from the request before any array is deserialised: the other arrays'
    # copies, each broadcast upper triangle expanded to the symmetric operator (values and
    # indices, twice), then one batch of scores and its ranking at a time
    record = content.array_records.get(request_wire.ARRAYS, {})
    declared = {name: math.prod(a.shape) for name, a in record.items()}
    _check_triangles(node, declared, data.n_items)
    triangles = sum(n for name, n in declared.items() if name.startswith("P@")
                    and name.endswith(".data"))
    node.reserve(sum(float(len(a.data)) for name, a in record.items()
                     if not name.startswith("P@")) + 36.0 * triangles
                 + ranking_bytes(data.n_items, 512, k), f"PriviRec's evaluation (top-k={k})")
    arrays = pop_arrays(content)
    if any(arrays[name].size != n for name, n in declared.items()):
        raise ValueError(f"{node.who}: the request's arrays hold other sizes than their "
                         "declared shapes")
    P: dict[str, SparseItemItem] = {}
    for key in [k for k in arrays if k.startswith("P@") and k.endswith(".shape")]:
        alpha = key.removeprefix("P@").removesuffix(".shape")
        P[alpha] = SparseItemItem(symmetric_from_upper(csr_from_arrays(arrays, f"P@{alpha}")),
                                  dtype=dtype)
        for part in ("data", "indices", "indptr", "shape"):
            del arrays[f"P@{alpha}.{part}"]
    out: dict[str, np.ndarray] = {}
    for name in sorted(filters):
        flt = make_filter(name, str(cfg["dataset"]), *ranks)
        P_tilde = P.get(f"{flt.alpha:g}") if flt.needs_P else None
        flt.fit(arrays["item_deg"], P_tilde, arrays.get("S"), arrays.get("eigvals"))
        sums = evaluate_ranking(lambda rows, f=flt: f.score(train[rows]), train, data.test,
                                k=k, batch_size=512)
        out[name] = sums.to_vector()
    return sum_reply(node, out)
