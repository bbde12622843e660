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

import numpy as np
import scipy.sparse as sp
from flwr.app import RecordDict

from clients.handlers import handler
from clients.node import NodeContext
from clients.sums_node import ranking_bytes, sum_reply
from fedrec.recsys.graph_filters import SparseItemItem, make_filter
from fedrec.recsys.linalg import (
    normalize_rows,
    symmetric_from_upper,
    upper_triangle,
    user_gram_weight,
)
from fedrec.recsys.metrics import evaluate_ranking
from fedrec.wire.privirec import (
    Action,
    DegreesSum,
    EvaluateRequest,
    FilterRankings,
    GramRequest,
    GramSum,
    PowerRequest,
    PowerSum,
    RitzSum,
    SparseGram,
)

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
    return sum_reply(node, DegreesSum(deg=np.asarray(_binary_rows(node).sum(axis=0)).ravel()))


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
    req = node.read(GramRequest)
    sparse = req.transport == "sparse"
    train = _binary_rows(node)
    n = train.shape[1]
    if sparse:  # labelled plain mode, only if this node's operator allows it
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
    _reserve_product(node, train, user_deg, sparse=sparse)
    weights = user_gram_weight(user_deg, req.alpha)
    G = upper_triangle(train.T @ sp.diags(weights) @ train)
    if sparse:
        return SparseGram.of(G).to_records()
    rows, cols = np.triu_indices(n)
    return sum_reply(node, GramSum(gram=np.asarray(G[rows, cols]).ravel()))


@handler(Action.POWER, sums=True)
def power_step(content: RecordDict, node: NodeContext) -> RecordDict:
    """Algorithm 1, one secure-sum round.

    First round (no X in the request): Y = R~_node^T Omega_node with the node's private
    Omega rows. Later rounds: Y = R~_node^T (R~_node X). With ``ritz`` set, the k x k
    Rayleigh-Ritz sum H = (R~_node X)^T (R~_node X) instead.
    """
    data = node.data()
    req = node.read(PowerRequest, items=data.n_items)
    if req.X is None:
        p = req.p
        # Omega's rows (drawn, then clipped: ~3 copies) and Y = R~^T Omega, items x p
        node.reserve(8.0 * p * (3 * len(data.user_ids) + data.n_items),
                     f"PriviRec's oversampling p={p} (Omega and R~^T Omega)")
        if req.omega == "seeded":
            node.policy.require("allow-seeded-omega", "PriviRec omega 'seeded' (the server "
                                "knows Omega and, with p >= users, recovers every row)",
                                node.who)
        A = normalize_rows(_binary_rows(node), req.item_deg)
        omega = omega_rows(data.user_ids, p, req.omega, req.seed)
        return sum_reply(node, PowerSum(Y=np.asarray(A.T @ omega)))
    X = _checked_X(node, req.X, data.n_items, len(data.user_ids))
    A = normalize_rows(_binary_rows(node), req.item_deg)
    A = A.astype(X.dtype, copy=False)  # a float32 wire keeps the node's products in float32 too
    AX = np.asarray(A @ X)
    if req.ritz:
        return sum_reply(node, RitzSum(H=AX.T @ AX))
    return sum_reply(node, PowerSum(Y=np.asarray(A.T @ AX)))


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


@handler(Action.EVALUATE, sums=True)
def evaluate(content: RecordDict, node: NodeContext) -> RecordDict:
    """Build every requested filter from the broadcast pieces and score this node's users.

    Replies (through the secure sum) the Recall/NDCG sums per filter, so the server learns
    only totals over all nodes.
    """
    data = node.data()
    train = _binary_rows(node)
    n = data.n_items
    # the read reserves the arrays' copies (the stacked triangles' values and indices among
    # them) before making them
    req = node.read(EvaluateRequest, items=n, pointers=n + 1)
    if not req.filters or len(set(req.filters)) != len(req.filters):
        raise ValueError(f"{node.who} refuses the request: its filters must be distinct and "
                         "at least one")
    triangles = req.triangles(n, node.who)
    k = req.top_k
    # each broadcast upper triangle expanded to the symmetric operator (values and indices,
    # twice: with the copy the read reserved, 36 bytes a value), then one batch of scores
    # and its ranking at a time
    node.reserve(24.0 * req.P_data.size + ranking_bytes(n, 512, k),
                 f"PriviRec's evaluation (top-k={k})")
    del content[EvaluateRequest.ARRAYS]  # the serialised copies, freed while the node works
    # One operator per alpha, shared by every filter that uses it (BSPM-LM and -EM then share
    # the blocked kernel).
    P = {alpha: SparseItemItem(symmetric_from_upper(upper), dtype=req.score_dtype)
         for alpha, upper in triangles.items()}
    ranked = []
    for name in req.filters:
        flt = make_filter(name, req.dataset, req.filter_rank, req.max_filter_rank)
        P_tilde = P.get(flt.alpha) if flt.needs_P else None
        flt.fit(req.item_deg, P_tilde, req.S, req.eigvals)
        sums = evaluate_ranking(lambda rows, f=flt: f.score(train[rows]), train, data.test,
                                k=k, batch_size=512)
        ranked.append(sums.to_vector())
    return sum_reply(node, FilterRankings(ranking=np.stack(ranked)))
