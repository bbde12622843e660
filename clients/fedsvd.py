"""Federated SVD node (paper 002): local power iterations on this node's rows, its noisy
update as a share of a sum, and fedsvd-utility's homomorphic noise product.

The node never sends M'_i, its local bases or its noise in clear. What it checks on its own
(``clients/policy.py``): its entries respect the declared bound m_hat (the sensitivity and the
sums' range stand on it); fedsvd-privacy's noisy release outside a secure sum (plain mode)
is charged to its DP budget; the noise product needs ``allow-noise-removal``, is answered
once per synchronization and only if its update went into a masked sum.
"""

from __future__ import annotations

import numpy as np
from flwr.app import ConfigRecord, RecordDict

from clients.aggregate import ranking_reply, sum_reply
from clients.node import NodeContext
from clients.registry import handler
from fl_app.records import config_record
from fl_app.recsys import fedsvd as svd
from fl_app.secure.aggregate import SUM_KEY

_NOISE = "fedsvd.noise"  # arrays in node state: this node's weighted noise of the last sync
_NOISE_INFO = "fedsvd.noise-info"  # ConfigRecord: its iteration t and the sum's mode


def _rows(node: NodeContext, params: svd.SvdParams):
    """This node's rows, checked against the declared bound m_hat (no values in errors)."""
    rows = node.data().train
    if rows.shape[0] == 0:
        raise ValueError(f"{node.who} holds no rows: it cannot take part in federated SVD")
    if svd.max_gram_entry(rows) > params.m_hat:
        raise ValueError(f"{node.who} refuses: an entry of its M'_i = M_i^T M_i / s_i exceeds "
                         f"the declared fedsvd-m-hat = {params.m_hat:g}, so the sensitivity "
                         "and the sums' range would not hold; raise fedsvd-m-hat to the data's "
                         "bound (1 for 0/1 data, max rating^2 otherwise)")
    return rows


def _noise(shape: tuple[int, ...], std: float) -> np.ndarray:
    return svd.draw_noise(shape, std)  # looked up per call (tests substitute known noise)


@handler("fedsvd_sync")
def sync(content: RecordDict, node: NodeContext) -> RecordDict:
    """Local iterations t_from+1 .. t_to-1 from the common basis, then this node's weighted
    noisy update of synchronization t_to as its share of the sum."""
    cfg = node.config()
    scheme, params = str(cfg["scheme"]), svd.params_from_config(cfg)
    rows = _rows(node, params)
    t_from, t_to = int(cfg["t-from"]), int(cfg["t-to"])
    sigma = params.node_sigma(scheme, int(cfg["n-nodes"]))
    weight = rows.shape[0] / float(cfg["rows-total"])
    mode = str(node.request.config_records[SUM_KEY]["mode"]) \
        if SUM_KEY in node.request.config_records else ""
    if scheme == "fedsvd-privacy" and mode == "plain" and sigma > 0:
        node.policy.charge_dp(node.state, (t_to - t_from) * svd.theorem2_epsilon(params, sigma),
                              f"fedsvd-privacy iterations {t_from + 1}..{t_to} released in a "
                              "plain sum", node.who)
    out = svd.node_block(scheme, rows, node.arrays()["Z"], t_from, t_to, params, sigma, weight,
                         _noise)
    assert isinstance(out, svd.SyncContribution)
    extra = None
    if scheme == "fedpower":
        extra = {"fedsvd": ConfigRecord({"z-max": out.z_max})}
    if out.noise is not None:
        node.store_arrays(_NOISE, {"N": out.noise})
        node.state[_NOISE_INFO] = ConfigRecord({"t": t_to, "mode": mode,
                                                                "weight": weight})
    return sum_reply(node, {"Y": out.update}, extra)


@handler("fedsvd_noise_product")
def noise_product(content: RecordDict, node: NodeContext) -> RecordDict:
    """Alg. 2 step 10: Enc(b_i) x (w_i N_i), re-randomized with a fresh Enc(0) and
    statistically flooded (``fl_app/secure/selection.py``).

    The selection value arrives encrypted under the server's key; this node holds no secret
    key and cannot tell Enc(0) from Enc(1), so it never learns whether its noise is kept.
    """
    from fl_app.secure.selection import VALUE_BOUND

    node.policy.require("allow-noise-removal", "fedsvd-utility's noise removal (the server "
                        "learns this node's noise unless the node is the one kept)", node.who)
    if "fedsvd-he" not in content.config_records:
        raise ValueError(f"{node.who}: noise-removal request has no 'fedsvd-he' record")
    req = content.config_records["fedsvd-he"]
    info = config_record(node.state, _NOISE_INFO)
    stored = node.load_arrays(_NOISE)
    if info is None or stored is None or int(info["t"]) != int(req["t"]):
        raise ValueError(f"{node.who} refuses noise removal for t = {int(req['t'])}: it holds "
                         "no noise of that synchronization (each noise is used once)")
    if str(info["mode"]) not in ("secagg+", "ckks"):
        raise ValueError(f"{node.who} refuses noise removal: its update of t = {int(req['t'])} "
                         f"went into a '{info['mode']}' sum, which the server saw unmasked")
    del node.state[_NOISE_INFO]  # one answer per synchronization
    weighted = stored["N"]
    if np.abs(weighted).max(initial=0.0) > float(info["weight"]) * VALUE_BOUND:
        raise ValueError(f"{node.who} refuses noise removal: its noise exceeds the CKKS "
                         f"selection's range +-{VALUE_BOUND:g} (lower fedsvd-sigma)")
    ctx = _selection_context(node, bytes(req["public-context"]))
    products = ctx.product(bytes(req["selection"]), weighted)
    return RecordDict({"fedsvd-he": ConfigRecord({"products": products})})


#: Checked public selection contexts, keyed by (run, SHA-256 of the context bytes): a node
#: loads and checks the server's 0.36 MB context once per run instead of per request; a
#: different context (another hash) is loaded and checked again. Public data only, so
#: nodes simulated in one process may share an entry.
_SELECTION_CONTEXTS: dict[tuple[int, str], object] = {}
_SELECTION_CACHE_SIZE = 4
_HE_CONTEXT = "fedsvd.he-context"  # ConfigRecord in node state: the hash this node checked


def _selection_context(node: NodeContext, public: bytes):
    """The checked :class:`NodeSelection` for ``public`` (public key only, expected CKKS
    parameters), from the cache when this run already checked these exact bytes."""
    from fl_app.secure.selection import NodeSelection, context_hash_of

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
    node.state[_HE_CONTEXT] = ConfigRecord({"sha256": key[1]})
    return hit


@handler("fedsvd_output")
def output(content: RecordDict, node: NodeContext) -> RecordDict:
    """The output rule when T is not a synchronization: the last local iterations, then
    w_i Z_T^(i) D_{T+1}^(i) as this node's share of a sum."""
    cfg = node.config()
    scheme, params = str(cfg["scheme"]), svd.params_from_config(cfg)
    rows = _rows(node, params)
    sigma = params.node_sigma(scheme, int(cfg["n-nodes"]))
    t_from, t_to = int(cfg["t-from"]), int(cfg["t-to"])
    mode = str(node.request.config_records[SUM_KEY]["mode"])
    if scheme == "fedsvd-privacy" and mode == "plain" and sigma > 0:
        node.policy.charge_dp(node.state, (t_to - t_from) * svd.theorem2_epsilon(params, sigma),
                              f"fedsvd-privacy iterations {t_from + 1}..{t_to} released in a "
                              "plain sum", node.who)
    Z = svd.node_block(scheme, rows, node.arrays()["Z"], t_from, t_to, params, sigma,
                       rows.shape[0] / float(cfg["rows-total"]), _noise)
    return sum_reply(node, {"Z": np.asarray(Z)})


@handler("fedsvd_evaluate")
def evaluate(content: RecordDict, node: NodeContext) -> RecordDict:
    """Recall/NDCG sums of this node's users scored r_u Z Z^T (the subspace as a low-pass
    filter), as its share of a sum."""
    Z = node.arrays()["Z"]
    return ranking_reply(node, lambda rows: np.asarray(rows @ Z) @ Z.T)
