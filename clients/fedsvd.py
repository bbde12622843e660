"""Federated SVD node (paper 002): local power iterations on this node's rows, its noisy
update as a share of a sum, and fedsvd-utility's homomorphic noise product.

The node never sends M'_i, its local bases or its noise in clear. What it enforces on its
own (``clients/policy.py``), whatever the request declares: its M'_i is clipped to the
declared bound m_hat and fedsvd-privacy's basis to z_hat (clips, not refusals, so no answer
depends on the data); fedsvd-privacy's noisy release is charged to its DP ledger
(``clients/dp_ledger.py``) before it is computed, whatever carries it (SecAgg+, plain or
CKKS sums: Theorem 2 bounds what the node's own noise protects, and a secure sum is no DP
guarantee of its own), by Theorem 2 with the rank, bounds, sigma and iteration count the
node itself uses, and a delta outside (0, 1) is refused; server-chosen sizes are bounded by
``memory-budget-mb`` and a request's work (iterations times the flops of one,
:func:`block_flops`) by ``max-iterations`` iterations of
:data:`ITERATION_FLOPS` each, both from sizes the server knows, before any work; the noise
product needs ``allow-noise-removal``, is answered once per synchronization and only if its
update went into a masked sum. A reply holds the protocol's values alone: FedPower's noise
scale is a public bound (``power_svd.FEDPOWER_Z_MAX``), never the node's ||Z||_max.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from flwr.app import RecordDict

from clients.handlers import handler
from clients.node import NodeContext
from clients.state import save_state
from clients.sums_node import ranking_reply, sum_reply
from fedrec.recsys import power_svd as svd
from fedrec.wire.fedsvd import (
    Action,
    BlockRequest,
    EvaluateRequest,
    NoiseProductRequest,
    NoiseProducts,
    OutputRequest,
    OutputSum,
    SyncRequest,
    SyncSum,
)
from fedrec.wire.message import Message, WireError, message, reply
from fedrec.wire.sums import SumRequest

#: A noise must fit the selection's range within this many standard deviations (exceeded
#: with probability < 1e-32; the node then clips it rather than refuse on its value).
_RANGE_STDS = 12.0


# Typed so a corrupted or stale record is refused on reload naming the field, never used.
@message()
class SyncNoise(Message):
    """fedsvd-utility's noise of this node's last synchronization, kept for the one noise
    product that may remove it (node-state records ``fedsvd.noise-info`` and
    ``fedsvd.noise``, fields as they always were); dropped once that product is answered."""

    CONFIG = "fedsvd.noise-info"
    ARRAYS = "fedsvd.noise"

    t: int = reply(min=0, doc="the synchronization")
    mode: str = reply(doc="the sum its update went into (secagg+, plain or ckks)")
    weight: float = reply(min=0.0, doc="w_i, this node's weight")
    std: float = reply(0.0, min=0.0, doc="the noise's standard deviation")
    N: np.ndarray = reply(shape=("cols", "rank"), doc="w_i N_i, its weighted noise")

    def __repr__(self) -> str:  # a traceback or log line never shows the noise
        return f"SyncNoise(t={self.t}, mode={self.mode!r}, N=<hidden>)"


# Typed so a corrupted or stale record is refused on reload naming the field, never used.
@message()
class CheckedSelectionContext(Message):
    """The public selection context this node last checked (node-state record
    ``fedsvd.he-context``): its SHA-256, as ``fedrec.secure.selection.context_hash_of``
    gives it."""

    CONFIG = "fedsvd.he-context"
    ARRAYS = "fedsvd.he-context.arrays"  # none: a node state names its own records

    sha256: str = reply(doc="hex SHA-256 of the serialized context")

    def __post_init__(self) -> None:
        if len(self.sha256) != 64 or self.sha256.strip("0123456789abcdef"):
            raise WireError("CheckedSelectionContext field 'sha256' must be a hex SHA-256")


@dataclass(frozen=True)
class _Block:
    """One request's work, every server-chosen value checked by the node."""

    scheme: str
    params: svd.SvdParams
    rows: Any
    Z: np.ndarray
    sigma: float
    t_from: int
    t_to: int
    weight: float
    mode: str


def block_bytes(n_rows: int, n_cols: int, rank: int, nnz: int) -> float:
    """What one block allocates at most: the clipped copy of the rows (values and indices),
    per iteration M_i Z (rows x r) and about a dozen d x r arrays (M'_i Z, noise, the QR's
    copies, the clip, Z D, the update), and the alignment's r x r matrices (Z^T Z_common,
    the SVD's factors and LAPACK work space, D): r x r is what a large server-chosen rank
    costs, so it is counted, not only the d x r part."""
    r = float(rank)
    return 8.0 * r * (2.0 * n_rows + 12.0 * n_cols) + 8.0 * 8.0 * r * r + 24.0 * nnz


#: The work one of ``max-iterations``' iterations stands for: 1e8 floating-point operations
#: (one power iteration at rank 10 on ~1,000 rows of 2,000 items counted dense). A request
#: may do max-iterations x this (1e12 at the default 10,000); a larger iteration counts as
#: several, so rank and iterations cannot each pass their own bound and together keep the
#: node busy for 45 minutes (the review's rank 1,500 x 10,000 iterations on ML-100K's 1,682
#: items: 1.5e14).
ITERATION_FLOPS = 1e8


def block_flops(n_rows: int, n_cols: int, rank: int, iterations: int) -> float:
    """An upper bound on one block's floating-point operations from sizes the server knows
    (the node's row count and items, the rank and iteration count it chose; never the
    node's interactions, so a refusal says nothing the server did not know): per iteration
    the products M_i Z and M_i^T (M_i Z) counted dense (4 s_i d r) and the QR of the d x r
    result with its Q (4 d r^2); once, the alignment's Z^T Z_common and Y D (4 d r^2) and
    the r x r SVD (LAPACK's ~22 r^3)."""
    r = float(rank)
    per_iteration = 4.0 * r * n_cols * (n_rows + r)
    return iterations * per_iteration + 4.0 * n_cols * r * r + 22.0 * r ** 3


def _check_work(node: NodeContext, n_rows: int, n_cols: int, rank: int,
                iterations: int) -> None:
    """Refuse, before any work, a block that is more than ``max-iterations`` iterations of
    :data:`ITERATION_FLOPS` (an iteration never counts as less than one)."""
    units = max(iterations, math.ceil(block_flops(n_rows, n_cols, rank, iterations)
                                      / ITERATION_FLOPS))
    node.policy.check_iterations(
        units, f"t-to - t-from = {iterations:,} at rank {rank:,} on {n_rows:,} x {n_cols:,} "
        f"rows, in iterations of {ITERATION_FLOPS:.0e} flops", node.who)


def _params(req: BlockRequest) -> svd.SvdParams:
    """The paper's parameters as the request declares them."""
    return svd.SvdParams(k=req.k, r=req.rank, T=req.iterations, p=req.sync_every,
                         sigma=req.sigma, sigma_server=req.sigma_server, z_hat=req.z_hat,
                         m_hat=req.m_hat, delta=req.delta, ddp=req.ddp, seed=req.seed)


def _block(node: NodeContext, cls: type[BlockRequest]) -> _Block:
    """The request's parameters, rows and basis, checked before any work: clear errors for
    unknown, non-finite or out-of-range values and for sizes past ``memory-budget-mb`` or
    work past ``max-iterations`` (:func:`_check_work`); then the rows clipped so every entry
    of M'_i is within the declared m_hat (``svd.clip_gram``: a clip, never a refusal, so the
    answer does not depend on the data) and fedsvd-privacy's basis clipped to the declared
    z_hat (Alg. 3's honest server sends it clipped already), so Theorem 2's bound holds for
    what the node multiplies."""
    who = node.who
    rows = node.data().train
    n_rows, d = rows.shape
    req = node.read(cls, items=d)
    params = _params(req)
    try:
        params.check_release()
    except ValueError as exc:
        raise ValueError(f"{who} refuses the fedsvd request: {exc}") from None
    t_from, t_to = req.t_from, req.t_to
    if not t_from < t_to:
        raise ValueError(f"{who} refuses the fedsvd request: it needs 0 <= t-from < t-to, got "
                         f"t-from={t_from}, t-to={t_to}")
    node.check_iterations(t_to - t_from, "t-to - t-from")
    if n_rows == 0:
        raise ValueError(f"{who} holds no rows: it cannot take part in federated SVD")
    Z = np.asarray(req.Z, dtype=np.float64)
    if not 1 <= Z.shape[1] <= d:
        raise ValueError(f"{who} refuses the fedsvd request: the basis Z has shape {Z.shape}, "
                         f"expected ({d}, r) with 1 <= r <= {d} (an orthonormal basis has at "
                         "most as many columns as rows)")
    r = Z.shape[1]
    # the published bound on the interactions (clients/node.py), never their count
    node.reserve(block_bytes(n_rows, d, r, node.interactions_bound()),
                 f"a fedsvd block of rank {r}")
    _check_work(node, n_rows, d, r, t_to - t_from)
    if not np.all(np.isfinite(Z)):
        raise ValueError(f"{who} refuses the fedsvd request: the basis Z is not finite")
    if req.rows_total < n_rows:
        raise ValueError(f"{who} refuses the fedsvd request: rows-total must be at least this "
                         f"node's row count, got {req.rows_total!r}")
    rows, Z = svd.clip_gram(rows, params.m_hat), svd.node_basis(req.scheme, Z, params)
    return _Block(req.scheme, params, rows, Z, params.node_sigma(req.scheme, req.n_nodes),
                  t_from, t_to, n_rows / req.rows_total, _sum_mode(node))


def _sum_mode(node: NodeContext) -> str:
    """The aggregator the checked sum record names (a sum handler's request has one)."""
    if node.sum_record is None:
        return ""
    return SumRequest.from_parts({}, node.sum_record, node.who).mode


def _charge(node: NodeContext, block: _Block) -> None:
    """fedsvd-privacy: charge the node's ledger before computing, from what the node itself
    uses (its rank, its clipped bounds, its sigma, its iterations), whatever aggregator
    carries the release: the masks of a secure sum hide the node's update from the server,
    but the sum is released, and the node's own noise is what Theorem 2 accounts (its
    ledger cannot count on the other nodes' noise)."""
    if block.scheme != "fedsvd-privacy" or block.sigma <= 0:
        return
    release = svd.release_ledger(block.params, block.sigma, block.Z.shape[1],
                                 block.t_to - block.t_from)
    carrier = f"a {block.mode} sum" if block.mode else "a sum"
    node.charge_dp(release, f"fedsvd-privacy iterations {block.t_from + 1}..{block.t_to} "
                   f"released in {carrier}")


def _noise(shape: tuple[int, ...], std: float) -> np.ndarray:
    return svd.draw_noise(shape, std)  # looked up per call (tests substitute known noise)


def _work(node: NodeContext,
          cls: type[BlockRequest]) -> tuple[_Block, svd.SyncContribution | np.ndarray]:
    """Check, charge, then compute this node's block (the charge is written first)."""
    block = _block(node, cls)
    _charge(node, block)
    return block, svd.node_block(block.scheme, block.rows, block.Z, block.t_from, block.t_to,
                                 block.params, block.sigma, block.weight, _noise)


@handler(Action.SYNC, sums=True)
def sync(content: RecordDict, node: NodeContext) -> RecordDict:
    """Local iterations t_from+1 .. t_to-1 from the common basis, then this node's weighted
    noisy update of synchronization t_to as its share of the sum."""
    block, out = _work(node, SyncRequest)
    if not isinstance(out, svd.SyncContribution):
        raise ValueError(f"{node.who} refuses {Action.SYNC}: t-to = {block.t_to} is not a "
                         f"synchronization (the output rule is '{Action.OUTPUT}')")
    if out.noise is not None:
        node.save_state(SyncNoise(t=block.t_to, mode=block.mode, weight=block.weight,
                                  std=block.sigma, N=out.noise))
    return sum_reply(node, SyncSum(Y=out.update))


@handler(Action.NOISE_PRODUCT)
def noise_product(content: RecordDict, node: NodeContext) -> RecordDict:
    """Alg. 2 step 10: Enc(b_i) x (w_i N_i), re-randomized with a fresh Enc(0) and
    statistically flooded (``fedrec/secure/selection.py``).

    The selection value arrives encrypted under the server's key; this node holds no secret
    key and cannot tell Enc(0) from Enc(1), so it never learns whether its noise is kept.
    """
    from fedrec.secure.he import padded_size
    from fedrec.secure.selection import PARAMS, REALS, VALUE_BOUND, chunks_for

    node.policy.require("allow-noise-removal", "fedsvd-utility's noise removal (the server "
                        "learns this node's noise unless the node is the one kept)", node.who)
    req = node.read(NoiseProductRequest)
    kept = node.load_state(SyncNoise)
    if kept is None or kept.t != req.t:
        raise ValueError(f"{node.who} refuses noise removal for t = {req.t}: it holds "
                         "no noise of that synchronization (each noise is used once)")
    if kept.mode not in ("secagg+", "ckks"):
        raise ValueError(f"{node.who} refuses noise removal: its update of t = {req.t} "
                         f"went into a '{kept.mode}' sum, which the server saw unmasked")
    node.drop_state(SyncNoise)  # one answer per synchronization
    std, weight = kept.std, kept.weight
    if _RANGE_STDS * std > VALUE_BOUND:  # public parameters only: never the noise drawn
        raise ValueError(f"{node.who} refuses noise removal: noise of standard deviation "
                         f"{std:g} does not fit the CKKS selection's range +-{VALUE_BOUND:g} "
                         f"({_RANGE_STDS:g} standard deviations; lower fedsvd-sigma)")
    # the products' padded ciphertexts and the padded noise (its size is the rank the server
    # chose at the synchronization), before the first is made
    noise = kept.N
    node.reserve(chunks_for(noise.size) * (padded_size(PARAMS.poly_modulus_degree)
                                           + 8.0 * REALS),
                 f"the encrypted products of its noise ({noise.size} values)")
    weighted = np.clip(noise, -weight * VALUE_BOUND, weight * VALUE_BOUND)
    ctx = _selection_context(node, req.public_context)
    return NoiseProducts(products=ctx.product(req.selection, weighted)).to_records()


#: Checked public selection contexts, keyed by (run, SHA-256 of the context bytes): a node
#: loads and checks the server's 0.36 MB context once per run instead of per request; a
#: different context (another hash) is loaded and checked again. Public data only, so
#: nodes simulated in one process may share an entry.
_SELECTION_CONTEXTS: dict[tuple[int, str], object] = {}
_SELECTION_CACHE_SIZE = 4


def _selection_context(node: NodeContext, public: bytes):
    """The checked :class:`NodeSelection` for ``public`` (public key only, expected CKKS
    parameters), from the cache when this run already checked these exact bytes."""
    from fedrec.secure.selection import NodeSelection, context_hash_of

    key = (int(node.context.run_id), context_hash_of(public))
    hit = _SELECTION_CONTEXTS.get(key)
    if hit is None:
        try:
            hit = NodeSelection.load(public)
        except ValueError as err:
            raise ValueError(f"{node.who}: {err}") from None
        while len(_SELECTION_CONTEXTS) >= _SELECTION_CACHE_SIZE:
            _SELECTION_CONTEXTS.pop(next(iter(_SELECTION_CONTEXTS)))
        _SELECTION_CONTEXTS[key] = hit
    save_state(node.state, CheckedSelectionContext(sha256=key[1]))
    return hit


@handler(Action.OUTPUT, sums=True)
def output(content: RecordDict, node: NodeContext) -> RecordDict:
    """The output rule when T is not a synchronization: the last local iterations, then
    w_i Z_T^(i) D_{T+1}^(i) as this node's share of a sum."""
    block, Z = _work(node, OutputRequest)
    if isinstance(Z, svd.SyncContribution):
        raise ValueError(f"{node.who} refuses {Action.OUTPUT}: t-to = {block.t_to} is a "
                         f"synchronization (its request is '{Action.SYNC}')")
    return sum_reply(node, OutputSum(Z=np.asarray(Z)))


@handler(Action.EVALUATE, sums=True)
def evaluate(content: RecordDict, node: NodeContext) -> RecordDict:
    """Recall/NDCG sums of this node's users scored r_u Z Z^T (the subspace as a low-pass
    filter), as its share of a sum."""
    n_cols = node.data().n_items
    Z = node.read(EvaluateRequest, items=n_cols).Z
    if Z.shape[1] < 1:
        raise ValueError(f"{node.who} refuses {Action.EVALUATE}: the basis Z has shape "
                         f"{Z.shape}, expected ({n_cols}, r) with r >= 1")
    batch = 512
    node.reserve(8.0 * (batch * Z.shape[1] + n_cols * Z.shape[1]),
                 f"fedsvd evaluation with a basis of rank {Z.shape[1]}")
    return ranking_reply(node, lambda rows: np.asarray(rows @ Z) @ Z.T, batch)
