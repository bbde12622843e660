"""Node side of every sum (``fedrec/wire/sums.py``): one reply function for the three
aggregators, and the CKKS decrypter's step.

A protocol handler answers a sum request with ``sum_reply(node, {name: array})``; the request
says which aggregator the server runs, and this module masks (SecAgg+), encrypts (CKKS) or
sends in clear (plain) -- the latter two only if the node's own policy allows them
(``clients/policy.py``): the server's request alone never weakens what a node reveals.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np
import scipy.sparse as sp
from flwr.app import ConfigRecord, RecordDict

from clients.handlers import handler
from clients.node import NodeContext
from clients.nodeset import committed_members, signed_set_digest
from fedrec.records import config_record, content_digest, state_record
from fedrec.wire.evaluation import RankingRequest, RankingSum
from fedrec.wire.message import Message
from fedrec.wire.secagg import MaskBound, MaskedSum
from fedrec.wire.sums import (
    CLIPPED_KEY,
    CONTRIB_KEY,
    PER_NODE_SUM_FIELDS,
    SHAPES_KEY,
    SIGNED_KEY,
    SUM_KEY,
    Action,
    AggregationError,
    CkksContribution,
    CkksSum,
    DecryptRequest,
    PlainSum,
    RangedSum,
    SumRequest,
    SumValues,
    contribution_digest,
    contribution_purpose,
    flatten,
)

_DECRYPTED = "aggregate.decrypted"  # ConfigRecord in node state: CKKS sums already decrypted
_CONTRIBUTED = "aggregate.contributed"  # ConfigRecord in node state: CKKS sums contributed to


#: Bytes per value the sum layer allocates besides the handler's arrays: the flat copy and
#: its serialized record (plain); the clipped copy, the fixed-point words, the self mask,
#: one pairwise mask at a time and the record (secagg+); CKKS ciphertexts (~16 x the values
#: for the run's parameters, plus the packed copy).
CKKS_BYTES_PER_VALUE = 160.0
_SUM_BYTES = {"plain": 24.0, "secagg+": 56.0, "ckks": CKKS_BYTES_PER_VALUE}
#: TenSEAL's native memory for a loaded CKKS vector per byte of its serialised form (its
#: serialisation is compressed): 1.19 per further vector at the run's parameters (N = 8192),
#: which ``tests/test_bounds.py`` checks against the process's RSS (tracemalloc cannot see
#: it); a fresh process's first loads measured 1.25-1.37 (once 1.75) while its allocator
#: warms up.
CKKS_NATIVE_PER_BYTE = 1.5
#: The sum record's message by mode (``fedrec/wire/sums.py``, ``fedrec/wire/secagg.py``).
_MODES: dict[str, type[SumRequest]] = {"plain": PlainSum, "secagg+": MaskedSum,
                                       "ckks": CkksSum}


def sum_reply(node: NodeContext, arrays: Message | Mapping[str, np.ndarray],
              extra: Mapping[str, ConfigRecord] | None = None) -> RecordDict:
    """This node's contribution to the sum its request asks for: a typed reply (its array
    fields) or named arrays.

    ``extra`` records travel in clear beside the values (only what the protocol already
    reveals, e.g. a public count).
    """
    if isinstance(arrays, Message):
        arrays = arrays.to_arrays()
    req = sum_request(node)
    mode = req.mode
    node.reserve(_SUM_BYTES.get(mode, 0.0) * sum(np.size(a) for a in arrays.values()),
                 f"its share of a '{mode}' sum")
    if isinstance(req, RangedSum):
        arrays = clipped_into_range(arrays, _declared_range(req, node))
    vec, layout = flatten(arrays)
    reply = RecordDict({SHAPES_KEY: ConfigRecord({name: list(s) for name, s in layout})})
    if isinstance(req, PlainSum):
        if not np.isfinite(vec).all():  # the server sees plain values anyway: no oracle
            raise AggregationError(f"{node.who} refuses plain sum {req.sum_id}: its "
                                   "arrays hold non-finite values (NaN or inf)")
        values = vec.astype(req.wire_dtype or "float64", copy=False)
        reply.update(SumValues(values=values).to_records())
    elif isinstance(req, MaskedSum):  # fixed-point encoding needs float64 precision
        from clients.secagg_node import mask_values

        bound = request_digest(node)
        encode = None
        from clients.noise_node import noisy_encoder, requested

        if requested(node) is not None:  # distributed noise (clients/noise_node.py)
            encode = noisy_encoder(node, req, layout)
        values = mask_values(node, req, vec.astype(np.float64, copy=False), bound, encode)
        reply.update(SumValues(values=values).to_records())
        reply.update(MaskBound(digest=bound).to_records())
    else:  # ckks: check_sum_request refused every other mode before the handler ran
        sum_id = req.sum_id
        # bound to the request and to the node set every member signed: a decrypter that
        # committed to another set refuses this contribution
        bound = request_digest(node) + signed_set_digest(node, node.request,
                                                         f"CKKS sum {sum_id}")
        chunks = _encrypt(node, vec, req.purpose)
        state_record(node.state, _CONTRIBUTED)[str(sum_id)] = bound
        signed = node.identity.sign(contribution_purpose(sum_id), node.context.run_id,
                                    node.context.node_id,
                                    contribution_digest(sum_id, chunks, bound))
        reply.update(CkksContribution(chunks=chunks, signed_digest=signed).to_records())
    for key, record in (extra or {}).items():
        reply[key] = record
    return reply


def check_sum_request(node: NodeContext) -> ConfigRecord:
    """The request's sum record, checked before the handler computes or keeps anything
    (the ClientApp calls this first for every handler declared with ``sums=True``).

    Every check depends on the request and the node's policy only: the record is present,
    its mode is one the policy allows, its declared range is finite and > 0, and under
    SecAgg+ its sum id is spent and its alive list and fixed-point parameters are the ones
    this node derives itself (``clients/secagg_node.py`` ``begin_masked_sum``). Checked
    once per request (:attr:`NodeContext.sum_record`)."""
    if node.sum_record is not None:
        return node.sum_record
    cfg = config_record(node.request, SUM_KEY)
    if cfg is None:
        raise AggregationError(f"{node.who}: request has no '{SUM_KEY}' record: it is not a "
                               "sum request")
    mode = node.read(SumRequest).mode
    req: SumRequest
    if mode == "plain":
        node.policy.require("allow-plain", "a plain sum (mode 'plain': the server would see "
                            "this node's values)", node.who)
        req = node.read(PlainSum)
    elif mode == "ckks":
        node.policy.require("allow-ckks", "a CKKS sum (mode 'ckks': every node and the "
                            "decrypter hold the secret key)", node.who)
        _declared_range(node.read(RangedSum), node)
        req = node.read(CkksSum)
    elif mode == "secagg+":
        from clients.secagg_node import begin_masked_sum, read_masked_sum

        _declared_range(node.read(RangedSum), node)
        req = read_masked_sum(node)
        begin_masked_sum(node, req)
    else:
        raise AggregationError(f"{node.who}: unknown sum mode {mode!r} (secagg+, plain or "
                               "ckks)")
    from clients.noise_node import check_noise_request, requested

    if requested(node) is not None:  # a sum with distributed noise (clients/noise_node.py)
        check_noise_request(node, req)
    node.sum_record = cfg
    return cfg


def sum_request(node: NodeContext) -> SumRequest:
    """The request's sum record as its mode's message (:class:`~fedrec.wire.sums.PlainSum`,
    :class:`~fedrec.wire.secagg.MaskedSum` or :class:`~fedrec.wire.sums.CkksSum`), once
    :func:`check_sum_request` checked it."""
    if node.sum_record is None:
        raise AggregationError(f"{node.who}: a handler replied with a sum without being "
                               "declared a sum handler (@handler(..., sums=True)), so its "
                               "request was not checked before it ran")
    record = dict(node.sum_record)
    cls = _MODES[SumRequest.from_parts({}, record, node.who).mode]
    return cls.from_parts({}, record, node.who)


def request_digest(node: NodeContext) -> bytes:
    """Digest of the request this node answers, less what differs per node by design (the
    sum record's :data:`~fedrec.wire.sums.PER_NODE_SUM_FIELDS`, relayed mail): what its
    masked or encrypted contribution is bound to.

    Why the sum record's other fields are in it: the node encodes its input with them
    (declared range, fixed-point bits, mode, sum id), so a server that gives one node
    other parameters than its neighbours -- one more fractional bit, a smaller range whose
    clip flag answers yes or no -- gets masks that do not cancel (SecAgg+) or a contribution
    the decrypter refuses (CKKS), never that node's input as a difference of two sums.
    Nodes sent different models cannot be summed either (``fedrec.records``)."""
    from fedrec.wire.mail import MAIL_DIRECTORY, MAIL_IN, MAIL_ROUND

    shared = RecordDict(dict(node.request.items()))
    for key in (MAIL_IN, MAIL_DIRECTORY, MAIL_ROUND):
        if key in shared:
            del shared[key]
    record = config_record(node.request, SUM_KEY)
    if record is not None:
        shared[SUM_KEY] = ConfigRecord({k: v for k, v in record.items()
                                        if k not in PER_NODE_SUM_FIELDS})
    return content_digest(shared)


def _declared_range(req: RangedSum, node: NodeContext) -> float:
    """The sum's declared ``max-abs``: finite and > 0, else a refusal (it depends only on the
    request, so refusing it reveals nothing about this node's values)."""
    max_abs = req.max_abs
    if not (np.isfinite(max_abs) and max_abs > 0):
        raise AggregationError(f"{node.who}: sum request field '{SUM_KEY}.max-abs' must be a "
                               f"finite number > 0, got {max_abs!r}")
    return max_abs


def clipped_into_range(arrays: Mapping[str, np.ndarray],
                       max_abs: float) -> dict[str, np.ndarray]:
    """``arrays`` clipped into [-max_abs, max_abs] (NaN to 0), plus :data:`CLIPPED_KEY`.

    Why clip instead of refusing: whether a node refuses would depend on its values, and a
    server could ask again with other ranges (each a fresh sum id) to learn a histogram of
    them. Clipping answers every request alike; the flag (``max_abs`` if anything was
    clipped, else 0) travels inside the masked or encrypted sum, so the server learns only
    how many nodes clipped, and fails the sum.
    """
    out: dict[str, np.ndarray] = {}
    clipped = False
    for name, arr in arrays.items():
        a = np.asarray(arr)
        inside = np.abs(a) <= max_abs  # False for NaN and inf
        if not inside.all():
            clipped = True
            a = np.where(np.isnan(a), 0.0, np.clip(a, -max_abs, max_abs)).astype(a.dtype)
        out[name] = a
    if CLIPPED_KEY in out:
        raise AggregationError(f"array name {CLIPPED_KEY!r} is reserved for the sum layer")
    out[CLIPPED_KEY] = np.array([max_abs if clipped else 0.0])
    return out


def ranking_bytes(n_items: int, batch_size: int, k: int) -> float:
    """What ranking a batch of users allocates (``fedrec/recsys/metrics.py``): the scores,
    their masked copy, the partition's indices and the relevance rows (batch x items each),
    and the top-k lists."""
    return 8.0 * max(batch_size, 1) * (5.0 * n_items + 4.0 * min(k, n_items))


def ranking_reply(node: NodeContext, score: Callable[[sp.csr_matrix], np.ndarray],
                  batch_size: int = 512) -> RecordDict:
    """Recall/NDCG/... sums of this node's users as its share of a sum (``Federation.evaluate``).

    ``score(train_rows)`` returns dense scores for a batch of this node's training rows;
    ``top-k`` comes from the request (default 20). The server learns only sums over nodes.
    """
    from fedrec.recsys.metrics import evaluate_ranking

    data = node.data()
    k = node.read(RankingRequest).top_k
    node.reserve(ranking_bytes(data.n_items, min(batch_size, data.test.shape[0]), k),
                 f"ranking {batch_size} users at a time (top-k={k})")
    sums = evaluate_ranking(lambda rows: score(data.train[rows]), data.train, data.test, k=k,
                            batch_size=batch_size)
    return sum_reply(node, RankingSum(ranking=sums.to_vector()))


def _encrypt(node: NodeContext, vec: np.ndarray, purpose: str) -> list[bytes]:
    from clients.relay_node import get_shared_context
    from fedrec.secure.he import encrypt_packed

    ctx = get_shared_context(node.state, purpose)
    return encrypt_packed(ctx, vec.astype(np.float64, copy=False))


def _signed_sum(node: NodeContext, content: RecordDict, sum_id: int, ctx,
                bound: bytes) -> list:
    """The decrypter's own sum of the signed contributions it was sent (as TenSEAL vectors).

    Every contribution must carry its node's signature (checked against this node's roster)
    over the digest of exactly these ciphertexts under this run and sum id, and there must be
    at least this node's ``min-survivors`` distinct partitions: a single node's ciphertext,
    a forged or re-labelled one, or too small a set is refused.
    """
    import tenseal as ts

    refuse = f"{node.who} refuses to decrypt sum {sum_id}"
    if CONTRIB_KEY not in content.config_records or SIGNED_KEY not in content.config_records:
        raise AggregationError(f"{refuse}: the request carries no signed contributions "
                               f"('{CONTRIB_KEY}', '{SIGNED_KEY}'), so it cannot check that it "
                               "opens a sum")
    contribs, sigs = content.config_records[CONTRIB_KEY], content.config_records[SIGNED_KEY]
    # the ciphertexts' copies and TenSEAL's vectors (native memory): how many the request
    # lists is the server's choice, reserved before any exists
    node.reserve((1.0 + CKKS_NATIVE_PER_BYTE)
                 * sum(len(b) for chunks in contribs.values() for b in chunks),
                 f"the contributions' ciphertexts of sum {sum_id}")
    partitions: dict[int, int] = {}
    total: list = []
    for key in sorted(contribs, key=int):
        sender = int(key)
        chunks = [bytes(b) for b in contribs[key]]
        if key not in sigs:
            raise AggregationError(f"{refuse}: the contribution of node {sender} is unsigned")
        digest = contribution_digest(sum_id, chunks, bound)
        try:
            partition, signed = node.identity.check(contribution_purpose(sum_id),
                                                    node.context.run_id, sender,
                                                    bytes(sigs[key]))
        except PermissionError as exc:
            raise AggregationError(f"{refuse}: {exc}") from None
        if signed != digest:
            raise AggregationError(f"{refuse}: node {sender}'s ciphertexts are not the ones it "
                                   "signed for this sum and the request this node answered")
        if partition in partitions:
            raise AggregationError(f"{refuse}: partition {partition} contributes twice (nodes "
                                   f"{partitions[partition]} and {sender})")
        partitions[partition] = sender
        vecs = [ts.ckks_vector_from(ctx, blob) for blob in chunks]
        if total and len(vecs) != len(total):
            raise AggregationError(f"{refuse}: node {sender} sent {len(vecs)} ciphertexts, "
                                   f"others {len(total)}")
        if not total:
            total = vecs
        else:
            for acc, vec in zip(total, vecs):
                acc.add_(vec)
    need = node.policy.min_survivors
    if len(partitions) < need:
        raise AggregationError(f"{refuse}: it holds {len(partitions)} signed contribution(s), "
                               f"fewer than its policy's min-survivors={need} (it never opens "
                               "a single node's or a too small set's ciphertexts)")
    _check_contributors(node, sorted(partitions.values()), refuse)
    return total


def _check_contributors(node: NodeContext, senders: list[int], refuse: str) -> None:
    """The decrypter opens only sums over exactly the run's signed node set
    (``clients/nodeset.py``): every member signed that set at key setup, so no other node
    opens a sum over another set, and a sum missing a member (whose difference with a full
    one would be that member's input) is refused. A dropout abandons the sum."""
    if senders != committed_members(node):
        raise AggregationError(f"{refuse}: its contributors are not the node set every member "
                               "signed at key setup (sums over different sets could be "
                               "differenced; a CKKS sum is abandoned when a node drops out)")


@handler(Action.DECRYPT)
def decrypt(content: RecordDict, node: NodeContext) -> RecordDict:
    """The CKKS decrypter: open a sum this node contributed to, summed by itself.

    Refuses a sum id it did not encrypt for, one it decrypted already, and any request whose
    signed contributions do not check or come from fewer than its ``min-survivors`` nodes
    (:func:`_signed_sum`): a decrypter opens each sum once, never arbitrary ciphertexts.
    """
    from clients.relay_node import get_shared_context

    if SUM_KEY not in content.config_records:
        raise AggregationError(f"{node.who}: decrypt request needs record '{SUM_KEY}'")
    req = node.read(DecryptRequest)
    sum_id = str(req.sum_id)
    contributed = config_record(node.state, _CONTRIBUTED) or ConfigRecord()
    done = state_record(node.state, _DECRYPTED)
    if sum_id not in contributed or sum_id in done:
        raise AggregationError(f"partition {node.partition_id} refuses to decrypt sum {sum_id}: "
                               "it decrypts once each sum it contributed to, nothing else")
    done[sum_id] = True  # spent before any check: a refused request is not retried
    signed_set_digest(node, content, f"to decrypt sum {sum_id}")
    ctx = get_shared_context(node.state, req.purpose)
    total = _signed_sum(node, content, int(sum_id), ctx, bytes(contributed[sum_id]))
    n = req.n
    values = np.concatenate([np.asarray(v.decrypt(), np.float64) for v in total]) if total \
        else np.zeros(0)
    if values.size != n:
        raise AggregationError(f"{node.who}: the contributions hold {values.size} values, the "
                               f"request declares {n}")
    return SumValues(values=np.asarray(values, np.float64)).to_records()
