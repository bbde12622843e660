"""The wire format of a secure sum, shared by the server's aggregators
(``fedrec/transport/aggregators.py``, ``fedrec/transport/secagg_server.py``) and the
node's contribution (``clients/sums_node.py``): record keys, what a node signs, and how
named arrays travel as one flat vector. A sum request carries a ``secagg`` ConfigRecord
(mode, sum id, declared range); the reply's values are read back with
:func:`reply_values`, which refuses anything but finite numbers of the declared layout.
The CKKS aggregator's own rounds are :class:`Action`: every node commits to the run's node
set, and the decrypter opens each sum from the signed contributions."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from enum import StrEnum

import numpy as np
from flwr.app import RecordDict

from fedrec.secure.distributed_noise import NOISE_KEY
from fedrec.wire.message import Message, message, per_round, reply


class Action(StrEnum):
    """The CKKS aggregator's node actions (``message_type = "query.<action>"``); a sum's own
    request is the protocol's action."""

    NODESET = "nodeset_commit"  # key setup: commit to the run's node set and sign it
    DECRYPT = "aggregate_decrypt"  # the decrypter opens one sum from signed contributions


#: Implementations by run-config name.
AGGREGATORS = ("secagg+", "plain", "ckks")
#: Precisions plain-mode replies may travel in.
WIRE_DTYPES = ("float64", "float32")
#: RecordDict keys used by the sum layer inside protocol messages.
SUM_KEY = "secagg"  # ConfigRecord in requests: mode, sum id, range, wire dtype
#: Fields of a sum request's :data:`SUM_KEY` record that differ per node by design (under
#: SecAgg+, each node's live neighbours). Every other field is the same for every node of
#: the sum and is bound into the digest its masks and signature cover
#: (``clients/sums_node.py`` ``request_digest``).
PER_NODE_SUM_FIELDS = ("alive",)
VALUES_KEY = "secagg.values"  # ArrayRecord in replies: masked or plain values
CIPHER_KEY = "secagg.cipher"  # ConfigRecord in replies: CKKS chunks
SHAPES_KEY = "secagg.shapes"  # ConfigRecord in replies: name -> shape, in order
#: Array every masked or encrypted reply carries beside the protocol's arrays: ``max_abs`` if
#: the node clipped any value into the declared range, else 0. Its sum counts the nodes that
#: clipped, which is all the server learns: a node never refuses a sum because of its values
#: (a refusal, or a count of offending values, would be an oracle on them).
CLIPPED_KEY = "secagg.clipped"
#: Relay purpose of the CKKS secret context the ckks aggregator uses.
CKKS_PURPOSE = "aggregate-ckks"
#: ConfigRecords of a decrypt request: every contribution's chunks and signed digest by node.
CONTRIB_KEY = "secagg.contributions"
SIGNED_KEY = "secagg.signatures"


#: Key setup of the node set a run's CKKS sums are over: the request's ConfigRecord
#: (``members``), each node's reply (``signed``), and the record every later sum and decrypt
#: request carries (node id -> that node's signed set).
NODESET_KEY = "nodeset"
NODESET_SIGNED_KEY = "nodeset.signatures"
#: What a node's signature on the node set is bound to (with run and node id).
NODESET_PURPOSE = "node-set"


# -- the records as typed messages (fedrec/wire/message.py) ---------------------------------
# Every sum field is the server's choice per sum (or checked by the node against what it
# derives, fedrec/wire/secagg.py): none is pinned for the run, since the node's own records
# (spent sum ids, the committed node set) are what refuse a replayed or changed request.
@message()
class SumRequest(Message):
    """A sum request's :data:`SUM_KEY` record as a node first reads it: the mode says
    which aggregator's record it is (:class:`PlainSum`, :class:`CkksSum`,
    ``fedrec.wire.secagg.MaskedSum``), whose fields the node then reads."""

    CONFIG = SUM_KEY

    mode: str = per_round(doc="the aggregator: secagg+, plain or ckks")


@message()
class PlainSum(SumRequest):
    """A labelled plain sum (``allow-plain`` nodes only)."""

    mode: str = per_round("plain", choices=("plain",))
    sum_id: int | None = per_round(None, doc="absent in a protocol's own sparse plain sum")
    wire_dtype: str | None = per_round(None, choices=WIRE_DTYPES,
                                       doc="the precision replies travel in (absent: float64)")


@message()
class RangedSum(SumRequest):
    """A sum whose values are clipped into a declared range (masked or CKKS): the range is
    checked before anything else of the record."""

    max_abs: float = per_round(doc="the declared range every value is clipped into")


@message()
class CkksSum(RangedSum):
    """A CKKS sum: nodes encrypt under the run's shared context (relay ``purpose``)."""

    mode: str = per_round("ckks", choices=("ckks",))
    sum_id: int = per_round()
    purpose: str = per_round(doc="the relay purpose of the CKKS secret context")


@message(Action.DECRYPT)
class DecryptRequest(SumRequest):
    """The decrypter's request (its :data:`SUM_KEY` record): open sum ``sum-id`` of ``n``
    values from the signed contributions (records :data:`CONTRIB_KEY`, :data:`SIGNED_KEY`
    and :data:`NODESET_SIGNED_KEY`, keyed by node id, beside it)."""

    mode: str = per_round("ckks", choices=("ckks",))
    sum_id: int = per_round()
    n: int = per_round(doc="how many values the sum holds")
    purpose: str = per_round()


@message()
class SumValues(Message):
    """A sum reply's values (masked ring elements, plain or decrypted numbers), flat in the
    layout its :data:`SHAPES_KEY` record declares; read back by :func:`reply_values`."""

    ARRAYS = VALUES_KEY

    values: np.ndarray = reply(name="v", shape=("values",))


@message()
class CkksContribution(Message):
    """A CKKS sum reply: the node's ciphertext chunks and its signature over them
    (:func:`contribution_digest`)."""

    CONFIG = CIPHER_KEY

    chunks: list[bytes] = reply()
    signed_digest: bytes = reply()


@message(Action.NODESET)
class NodeSetRequest(Message):
    """Key setup of a CKKS run's node set: every member's id (each node commits to it)."""

    CONFIG = NODESET_KEY

    members: list[int] = per_round(doc="the run's node set (a node refuses another one)")


@message()
class NodeSetSignature(Message):
    """A node's signature on the node set it committed to (:func:`node_set_digest`)."""

    CONFIG = NODESET_KEY

    signed: bytes = reply()


@message()
class NoiseRequest(Message):
    """The record that opts a SecAgg+ sum into distributed noise
    (``fedrec.secure.distributed_noise.NOISE_KEY``); the node checks every field against
    its policy (``clients/noise_node.py``)."""

    CONFIG = NOISE_KEY

    mechanism: str = per_round(doc="the noise mechanism (ddg)")
    sigma: float = per_round(doc="the total sigma the unmasked sum carries")
    l2: float = per_round(doc="the L2 bound every contribution is clipped to")
    rate: float = per_round(doc="the Poisson rate each node samples its participation with")
    releases: int = per_round(doc="the noisy sums the run plans (the whole-run check)")
    delta: float = per_round(doc="the delta the run reports at")


def node_set_digest(members: Sequence[int]) -> bytes:
    """What every member signs at key setup: :func:`node_set_commitment` of the sorted ids."""
    from fedrec.secure.merkle import merkle_root

    ids = sorted(int(v) for v in members)
    return node_set_commitment(merkle_root(ids), len(ids))


def node_set_commitment(root: bytes, size: int) -> bytes:
    """SHA-256 of a node set given as the Merkle root of its sorted ids and their count
    (``fedrec/secure/merkle.py``): a node given the whole set and a node given only the root
    and a path to its own leaf commit to, and sign, the same 32 bytes."""
    import hashlib

    return hashlib.sha256(b"fedrec-node-set|v2|" + int(size).to_bytes(8, "big")
                          + bytes(root)).digest()


def node_set_signature(reply: RecordDict, label: str) -> bytes:
    """A node's signature on the node set, from its reply to the key setup (an error naming
    the node when it is missing)."""
    record = reply.config_records.get(NODESET_KEY)
    signed = record.get("signed") if record is not None else None
    if not isinstance(signed, bytes):
        raise AggregationError(f"{label} answered the key setup without field "
                               f"'{NODESET_KEY}.signed' (its signature on the node set)")
    return signed


def contribution_purpose(sum_id: int) -> str:
    """What a node's signature on its CKKS contribution is bound to (with run and node)."""
    return f"ckks-contribution:{int(sum_id)}"


def contribution_digest(sum_id: int, chunks: Sequence[bytes], bound: bytes = b"") -> bytes:
    """SHA-256 over the sum id, the digest of the request answered (``bound``) and the
    length-prefixed ciphertext chunks (32 bytes, what a node signs as its contribution).
    The decrypter recomputes it with its own request's digest, so contributions made for
    another request (a model the server gave one node only) are refused."""
    import hashlib

    h = hashlib.sha256(f"fedrec-ckks-contribution|v2|{int(sum_id)}|{len(chunks)}|".encode()
                       + bytes(bound).hex().encode() + b"|")
    for blob in chunks:
        h.update(len(blob).to_bytes(8, "big"))
        h.update(bytes(blob))
    return h.digest()

class AggregationError(RuntimeError):
    """A sum cannot complete (no replies, inconsistent shapes, too many dropouts)."""


def flatten(arrays: Mapping[str, np.ndarray]) -> tuple[np.ndarray, list[tuple[str, tuple]]]:
    """Concatenate named arrays (sorted by name) into one vector plus their layout.

    The vector is float32 when every array is float32 (a float32 wire then needs no float64
    copy of a large reply), float64 otherwise.
    """
    layout = [(name, tuple(np.shape(arrays[name]))) for name in sorted(arrays)]
    if not layout:
        return np.zeros(0), layout
    dtype = np.result_type(np.float32, *(np.asarray(arrays[n]).dtype for n, _ in layout))
    vec = np.concatenate([np.asarray(arrays[n], dtype=dtype).ravel() for n, _ in layout])
    return vec, layout


def unflatten(vec: np.ndarray, layout: list[tuple[str, tuple]]) -> dict[str, np.ndarray]:
    """Inverse of :func:`flatten`."""
    out, off = {}, 0
    for name, shape in layout:
        size = int(np.prod(shape)) if shape else 1
        out[name] = vec[off:off + size].reshape(shape)
        off += size
    return out


def layout_of(reply: RecordDict, label: str) -> list[tuple[str, tuple]]:
    """The (name, shape) list a node declared in its sum reply, checked: names sorted and
    unique (as :func:`flatten` makes them), shapes lists of non-negative ints. A clear error
    naming the node and the field otherwise; never the node's values."""
    if SHAPES_KEY not in reply.config_records:
        raise AggregationError(f"{label} answered a sum without '{SHAPES_KEY}' (its handler "
                               "must reply with clients.sums_node.sum_reply)")
    layout: list[tuple[str, tuple]] = []
    for name, dims in reply.config_records[SHAPES_KEY].items():
        items = dims if isinstance(dims, list) else [dims]
        if not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in items):
            raise AggregationError(f"{label}: field '{SHAPES_KEY}.{name}' is not a shape (a "
                                   "list of non-negative ints)")
        layout.append((str(name), tuple(int(d) for d in items)))
    names = [n for n, _ in layout]
    if names != sorted(set(names)):
        raise AggregationError(f"{label}: field '{SHAPES_KEY}' names {names} are not sorted "
                               "and unique")
    return layout


def layout_size(layout: list[tuple[str, tuple]]) -> int:
    """How many values the flattened arrays of ``layout`` hold (sum of declared shapes)."""
    return sum(int(np.prod(s)) if s else 1 for _, s in layout)


def reply_values(reply: RecordDict, label: str, layout: list[tuple[str, tuple]],
                 dtypes: tuple[str, ...]) -> np.ndarray:
    """The value vector of a sum reply, checked against the declared layout: present, 1-D,
    one of ``dtypes``, exactly :func:`layout_size` values (a short reply must never be
    broadcast onto every coordinate), and finite when floating point (one NaN or inf would
    make every node's coordinate of the total unusable). Errors name the node and the
    field, never values nor how many are bad (a refusal is no oracle)."""
    field = f"{VALUES_KEY}.v"
    if VALUES_KEY not in reply.array_records or "v" not in reply.array_records[VALUES_KEY]:
        raise AggregationError(f"{label} answered a sum without field '{field}'")
    values = reply.array_records[VALUES_KEY]["v"].numpy()
    n = layout_size(layout)
    if values.dtype.name not in dtypes:
        raise AggregationError(f"{label}: field '{field}' has dtype {values.dtype.name}, "
                               f"expected {' or '.join(dtypes)}")
    if values.shape != (n,):
        raise AggregationError(f"{label}: field '{field}' has shape {values.shape}; its "
                               f"declared arrays {dict(layout)} need ({n},)")
    _require_finite(values, label, field, layout)
    return values


def _require_finite(values: np.ndarray, label: str, field: str,
                    layout: list[tuple[str, tuple]]) -> None:
    """Refuse a floating-point reply holding NaN or inf (masked integer replies have none),
    naming the first declared array that holds one."""
    if values.dtype.kind != "f" or np.isfinite(values).all():
        return
    first = int(np.argmin(np.isfinite(values)))
    ends = np.cumsum([int(np.prod(s)) if s else 1 for _, s in layout])
    array = layout[int(np.searchsorted(ends, first, side="right"))][0]
    raise AggregationError(f"{label}: field '{field}' (declared array '{array}') holds "
                           "non-finite values (NaN or inf); a sum takes finite numbers only")
