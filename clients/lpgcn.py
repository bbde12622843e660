"""LP-GCN node (paper 001): its users' rows and its convolution items live here; only item
rows, item-gradient partials and sealed mail leave it.

Server side ``strategies/lpgcn.py``, math ``fedrec/recsys/lightgcn.py``, decisions
``docs/protocols/lpgcn.md``. Setup actions, in order: ``lpgcn_count`` (this node's number of
training interactions, as a share of a sum), ``lpgcn_holdings`` (pseudonyms of the items its
users hold plus virtual items), ``lpgcn_assign`` (which node convolves each held item; a
convolution node confirms to each holder, sealed, the items it convolves for it),
``lpgcn_verify`` twice (first: with every confirmation matching the server's assignment, mail
each convolution node how many of its users really hold each shared item; then: a
convolution node learns its items' true degrees, mails them back and initialises its item
rows). Every request is checked against the node's policy and the run's committed node set
first (cover rate and scale, sizes, holder lists; ``docs/protocols/lpgcn.md``, "Against a
deviating server"), and no check depends on what the node's users hold.

``lpgcn_round`` is one synchronous round of training or of a forward pass. The node is
data-driven: it takes what the request and its mail carry, computes everything that has
become computable, and replies with what others need (see the module's rules in
:class:`Session.advance`). Every input reaches every node in the same round, so all nodes
move in lockstep and the server can sum a layer's partials once every node sent them.
"""

from __future__ import annotations

import hashlib
import io
import json
from collections.abc import Iterator, Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import numpy.lib.format as npy_format
import scipy.sparse as sp
from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict

from clients.handlers import handler
from clients.node import NodeContext
from clients.nodeset import commit as commit_node_set
from clients.nodeset import committed_members, read_bounded, signed_set_digest
from clients.nodeset import sign as sign_node_set
from clients.policy import PolicyError
from clients.relay_node import get_shared_secret
from clients.state import check_state, load_state
from clients.sums_node import ranking_bytes, sum_reply
from fedrec.records import array_record
from fedrec.recsys.arrays import (
    NUMPY,
    DeviceError,
    check_device,
    concat,
    to_device,
    to_numpy,
    zeros_like,
)
from fedrec.recsys.lightgcn import (
    bpr_terms,
    direct_terms,
    epoch_triples,
    init_rows,
    inv_sqrt,
    item_partial,
    layer_mean,
    scatter_rows,
    to_users,
)
from fedrec.recsys.metrics import evaluate_ranking
from fedrec.recsys.mf import Adam
from fedrec.secure.pseudonyms import HOLDINGS, item_pseudonyms, keyed_normal, virtual_items
from fedrec.secure.randomness import csprng_uniform
from fedrec.wire import lpgcn as wire
from fedrec.wire import request as request_wire
from fedrec.wire.evaluation import RankingSum
from fedrec.wire.lpgcn import (
    CONV_OF,
    HELD,
    HOLD_NODES,
    HOLD_PTR,
    Action,
    AssignRequest,
    CountRequest,
    CountSum,
    EvaluateRequest,
    Holdings,
    HoldingsRequest,
    Hyper,
    LossesRequest,
    LossSum,
    Part,
    RoundRequest,
    RoundStatus,
    VerifyRequest,
)
from fedrec.wire.message import Message, WireError, message, reply
from fedrec.wire.sums import NodeSetRequest, NodeSetSignature

H = TypeVar("H", bound=Hyper)

#: This node's state records (node-local names, never sent): its setup (held items, the
#: assignment, degrees), its layer-0 rows and their Adam moments, the current step's arrays,
#: its progress flags, and its loss of each step it trained.
_SETUP, _PARAMS, _STEP, _FLAGS = "lpgcn.setup", "lpgcn.params", "lpgcn.step", "lpgcn.flags"
_LOSSES = "lpgcn.losses"
#: Keys of the setup record besides the held set and the assignment (kept under their wire
#: names, ``wire.HELD``...): every item's pseudonym, the held items' ids and which are real,
#: the cover it drew them for, its convolution items' positions, its real users per item it
#: shares (and that it mailed them), the holders' counts, its convolution items' degrees,
#: every held item's degree.
_PSEUDO_ALL, _HELD_REAL, _ISREAL, _COVER = "pseudo_all", "held_real", "isreal", "cover"
_CONV_HPOS, _OWN_COUNT, _COUNTS_SENT = "conv_hpos", "own_count", "counts_sent"
_HOLD_CNT, _CONV_DEGREE, _DEGREE = "hold_cnt", "conv_degree", "degree"
#: Keys of the params record: the item, user and W tables, the ids of their rows.
_V, _U, _W, _CONV_REAL, _USER_IDS = "V", "U", "W", "conv_real", "user_ids"
#: Keys of the flags record: the step and whether it trains; a W update waiting for its
#: gradient mail; what is done (the marks); the mark of every degree in.
_AT, _TRAIN, _W_PENDING, _DONE, _DEGREES = "step", "train", "w-pending", "done", "degrees"
#: Keys of the losses record: the steps this node trained, its loss share of each.
_LOSS_STEPS, _LOSS = "step", "loss"
#: The step's array of the requested negatives' rows (every layer).
_NEG = "neg"
#: The backbone whose user rows come from W (``lpgcn-backbone``).
_PLUS = "lightgcn+"
#: Sealed mail (node to node): purposes, and the one array each letter carries.
_CONFIRM, _VERIFY, _DEGREE_MAIL = "lpgcn-confirm", "lpgcn-verify", "lpgcn-degree"
_MAIL_ITEMS, _MAIL_COUNT, _MAIL_DEGREE, _MAIL_ROWS = "items", "count", "degree", "x"


#: Where a delivered part goes in the step's state (a per-layer part's key gets its layer).
_DELIVERED = {Part.NEG_ROWS: _NEG, Part.W: "w_held", Part.ITEM_ROWS: "ei",
              Part.ITEM_GRAD: "gsum"}


# -- this node's typed state (clients/state.py) --------------------------------------------
# Shape symbols: items = the node's catalogue, held = its held items (real and virtual, in
# ascending pseudonym order), conv = the held items it convolves, lists / slots = their
# holder lists' pointers and entries, users = its users, dim = lpgcn-dim, steps = the steps
# it trained. A setup request adds its arrays to the setup, so those after the holdings'
# are optional.
@message()
class LPGCNSetup(Message):
    """This node's setup: its pseudonyms and held items with the cover it drew them for
    (``lpgcn_holdings``), the convolution assignment (``lpgcn_assign``), its counts and
    the degrees (the two ``lpgcn_verify``)."""

    CONFIG = f"{_SETUP}.config"  # empty: marks the state kept (its arrays: StateArrays)
    ARRAYS = _SETUP

    pseudo_all: np.ndarray = reply(name=_PSEUDO_ALL, shape=("items",))
    held_real: np.ndarray = reply(name=_HELD_REAL, shape=("held",))
    held: np.ndarray = reply(name=HELD, shape=("held",))
    isreal: np.ndarray = reply(name=_ISREAL, shape=("held",))
    cover: np.ndarray = reply(name=_COVER, shape=(3,), doc="alpha, mask scale, holdings")
    conv_of: np.ndarray | None = reply(None, name=CONV_OF, shape=("held",))
    conv_hpos: np.ndarray | None = reply(None, name=_CONV_HPOS, shape=("conv",))
    hold_ptr: np.ndarray | None = reply(None, name=HOLD_PTR, shape=("lists",))
    hold_nodes: np.ndarray | None = reply(None, name=HOLD_NODES, shape=("slots",))
    own_count: np.ndarray | None = reply(None, name=_OWN_COUNT, shape=("conv",))
    counts_sent: np.ndarray | None = reply(None, name=_COUNTS_SENT, shape=(1,))
    hold_cnt: np.ndarray | None = reply(None, name=_HOLD_CNT, shape=("slots",))
    conv_degree: np.ndarray | None = reply(None, name=_CONV_DEGREE, shape=("conv",))
    degree: np.ndarray | None = reply(None, name=_DEGREE, shape=("held",))


@message()
class LPGCNParams(Message):
    """This node's layer-0 rows: its convolution items' V (and W, LightGCN+) rows, its
    users' U rows (LightGCN), the ids of their rows, and each table's Adam moments once it
    stepped (or from the operator's checkpoint)."""

    CONFIG = f"{_PARAMS}.config"  # empty: marks the state kept (its arrays: StateArrays)
    ARRAYS = _PARAMS

    conv_real: np.ndarray = reply(name=_CONV_REAL, shape=("conv",))
    user_ids: np.ndarray | None = reply(None, name=_USER_IDS, shape=("users",))
    V: np.ndarray = reply(name=_V, shape=("conv", "dim"))
    V_m: np.ndarray | None = reply(None, name=f"{_V}.m", shape=("conv", "dim"))
    V_v: np.ndarray | None = reply(None, name=f"{_V}.v", shape=("conv", "dim"))
    V_t: np.ndarray | None = reply(None, name=f"{_V}.t", shape=(1,))
    U: np.ndarray | None = reply(None, name=_U, shape=("users", "dim"))
    U_m: np.ndarray | None = reply(None, name=f"{_U}.m", shape=("users", "dim"))
    U_v: np.ndarray | None = reply(None, name=f"{_U}.v", shape=("users", "dim"))
    U_t: np.ndarray | None = reply(None, name=f"{_U}.t", shape=(1,))
    W: np.ndarray | None = reply(None, name=_W, shape=("conv", "dim"))
    W_m: np.ndarray | None = reply(None, name=f"{_W}.m", shape=("conv", "dim"))
    W_v: np.ndarray | None = reply(None, name=f"{_W}.v", shape=("conv", "dim"))
    W_t: np.ndarray | None = reply(None, name=f"{_W}.t", shape=(1,))


@message()
class LPGCNLosses(Message):
    """This node's loss share of each step it trained (appended once per step, in a record
    of its own: the flags, rewritten every round, would grow with the run)."""

    CONFIG = f"{_LOSSES}.config"  # empty: marks the state kept (its arrays: StateArrays)
    ARRAYS = _LOSSES

    steps: np.ndarray = reply(name=_LOSS_STEPS, shape=("steps",))
    loss: np.ndarray = reply(name=_LOSS, shape=("steps",))


@message()
class LPGCNFlags(Message):
    """Where this node is in the run: its step (-1 before the first) and whether it trains,
    the step whose W update waits for its gradient mail (-1: none), and the marks of what
    it has done (parts received, sums added, mail sent, uploads; degrees in). A
    :class:`Session` holds them as a dict, a mark a key set True (:meth:`of`, :meth:`as_dict`)."""

    CONFIG = _FLAGS
    ARRAYS = f"{_FLAGS}.arrays"  # none: a node state names its own records

    step: int = reply(name=_AT, min=-1)
    train: bool | None = reply(None, name=_TRAIN)
    w_pending: int = reply(-1, name=_W_PENDING, min=-1)
    done: list[str] = reply([], name=_DONE)

    @classmethod
    def of(cls, flags: Mapping[str, Any]) -> LPGCNFlags:
        """The flags a :class:`Session` holds, as the typed state."""
        return cls(step=int(flags[_AT]), train=flags.get(_TRAIN),
                   w_pending=int(flags.get(_W_PENDING, -1)),
                   done=[k for k, v in flags.items()
                         if k not in (_AT, _TRAIN, _W_PENDING) and v])

    def as_dict(self) -> dict[str, Any]:
        """The flags as a :class:`Session` holds them (``train`` only once a step began)."""
        out: dict[str, Any] = {_AT: self.step, _W_PENDING: self.w_pending}
        if self.train is not None:
            out[_TRAIN] = self.train
        return {**out, **dict.fromkeys(self.done, True)}


#: This process's rows per (run, node), for the many rounds of a run in one process.
_DATA: dict[tuple[int, int, str, str], Any] = {}
#: Each node's triples of its current epoch, per process, under the key of its rows: a pure
#: function of its rows, the seed, the epoch and the batch count, so recomputed where missing
#: (once per epoch) rather than kept in the node state, which a Flower simulation ships to a
#: worker and back with every message (1.3 MB for an ML-1M node of 8). Like
#: :data:`_GRAPHS`, an entry holds the rows object it was derived from and serves only that
#: object (whoever replaces or clears :data:`_DATA` replaces what derives from it).
_TRIPLES: dict[tuple[int, int, str, str], tuple[Any, tuple[int, int, int], tuple[Any, ...]]] = {}


class LosslessnessError(RuntimeError):
    """The request or the mail cannot give the centralized result (missing or extra input)."""


#: First bytes of a payload :func:`pack` wrote (format version 1).
_PACK = b"LPGCN1"
#: Array kinds a payload may carry (numbers and booleans; never objects).
_PACK_KINDS = "fiub"


def pack(arrays: dict[str, np.ndarray]) -> bytes:
    """Named arrays as bytes for a sealed payload: a JSON header (name, dtype, shape per
    array) and their C-order data (a tensor of a node computing on a device leaves it
    first). Why not ``np.savez``: its zip container (a member and a CRC per array) cost
    more than sealing the letter, and a letter carries one array."""
    arrays = {k: np.ascontiguousarray(to_numpy(v)) for k, v in arrays.items()}
    head = json.dumps([[k, v.dtype.str, list(v.shape)] for k, v in arrays.items()]).encode()
    return b"".join([_PACK, len(head).to_bytes(4, "little"), head,
                     *(v.tobytes() for v in arrays.values())])


def unpack(blob: bytes) -> dict[str, np.ndarray]:
    """The arrays of a :func:`pack` payload (read-only views of it); a payload of another
    form, an array kind other than numbers, or sizes that do not add up to its length are
    refused."""
    try:
        start = len(_PACK) + 4
        if blob[:len(_PACK)] != _PACK:
            raise ValueError("not an LP-GCN payload")
        end = start + int.from_bytes(blob[len(_PACK):start], "little")
        out, offset = {}, end
        for name, dtype, shape in json.loads(blob[start:end]):
            dtype = np.dtype(dtype)
            if dtype.kind not in _PACK_KINDS or not all(int(n) >= 0 for n in shape):
                raise ValueError(f"array {name!r} of {dtype} {shape}")
            count = int(np.prod(shape, dtype=np.int64))
            if offset + count * dtype.itemsize > len(blob):
                raise ValueError("shorter than its header says")
            out[str(name)] = np.frombuffer(blob, dtype, count, offset).reshape(shape)
            offset += count * dtype.itemsize
        if offset != len(blob):
            raise ValueError("longer than its header says")
    except (ValueError, TypeError, KeyError, IndexError) as exc:  # json errors are ValueErrors
        raise LosslessnessError(f"malformed LP-GCN mail: {exc}") from None
    return out


_NPY_MAGIC = b"\x93NUMPY"


def state_view(array: Array) -> np.ndarray:
    """A read-only view of an array this node kept in its own state.

    Why not ``Array.numpy()``: ``np.load`` parses each header's text with ``ast``, which
    cost more than the data in a round that reads a few dozen small arrays. The node wrote
    these arrays itself (C order, ``Array(ndarray)``), so the Array's dtype and shape say
    everything; anything else takes numpy's reader."""
    data = array.data
    major = data[6] if len(data) > 9 and data[:6] == _NPY_MAGIC else 0
    offset = {1: 10 + int.from_bytes(data[8:10], "little"),
              2: 12 + int.from_bytes(data[8:12], "little")}.get(major, 0)
    dtype = np.dtype(array.dtype) if offset else None
    if (dtype is None or dtype.hasobject or array.stype != "numpy.ndarray"
            or b"'fortran_order': False" not in data[:offset]):
        return array.numpy()
    count = int(np.prod(array.shape, dtype=np.int64))
    return np.frombuffer(data, dtype=dtype, count=count, offset=offset).reshape(array.shape)


#: .npy headers by (dtype, shape): a round stores arrays of a few shapes again and again.
_HEADERS: dict[tuple[str, tuple[int, ...]], bytes] = {}


def state_array(value: np.ndarray) -> Array:
    """``Array(value)`` with its .npy header made once per dtype and shape (``np.save``
    formats it anew for every array, which cost more than copying a round's small arrays);
    the same bytes as ``Array(value)`` for a C-ordered array."""
    value = np.asarray(value)
    if not value.flags.c_contiguous:
        value = np.ascontiguousarray(value)
    key = (value.dtype.str, value.shape)
    head = _HEADERS.get(key)
    if head is None:
        buf = io.BytesIO()
        npy_format.write_array_header_1_0(buf, npy_format.header_data_from_array_1_0(value))
        head = buf.getvalue()
        if len(_HEADERS) > 4096:
            _HEADERS.clear()
        _HEADERS[key] = head
    return Array(dtype=str(value.dtype), shape=tuple(int(n) for n in value.shape),
                 stype="numpy.ndarray", data=head + value.tobytes())


def reply_arrays(arrays: dict[str, Any]) -> ArrayRecord:
    """A round's uploads as the reply's record (:func:`state_array`: the same bytes)."""
    return ArrayRecord({k: state_array(to_numpy(v)) for k, v in arrays.items()})


class StateArrays(MutableMapping):
    """The arrays of one of this node's typed states (``state``: its class, whose ``ARRAYS``
    record holds them), each written at :meth:`flush`, if still there: a round touches a
    few of a node's arrays, and re-serializing all of them every round dominated the
    round's cost; an array a round both receives and uses up (a layer's item rows, a
    gradient sum) is never written. Arrays set are not copied: nothing may change one after
    setting it.

    Checked on reload: every kept array's shape (as its record entry declares it, which is
    what :func:`state_view` reads the bytes by) against the class's declaration (rank, fixed
    sizes, sizes that agree across arrays and with ``dims``, the arrays every such state
    has), refused naming the record and the field (``clients.state.check_state``); an
    array's bytes are read on first use, and refused there, by name, if they do not hold
    that shape. The check reads no array: a round uses a few of them. The one record not
    declared is the step's scratch (``state`` the record name :data:`_STEP`): its arrays are
    named by layer, sender and step, and each is checked where it enters (a delivery's shape
    in :meth:`Session.checked_deliveries`, a letter's rows in :meth:`Session.gather`)."""

    def __init__(self, node: NodeContext, state: type[Message] | str,
                 dims: Mapping[str, int] | None = None) -> None:
        self.state, self.who = node.state, node.who
        self.cls = state if isinstance(state, type) else None
        self.name = state if isinstance(state, str) else state.ARRAYS
        kept = self.cls is None or self.cls.CONFIG in node.state
        self.record = array_record(node.state, self.name) if kept else None
        self.cache: dict[str, np.ndarray] = {}
        self.dirty: set[str] = set()  # set since the last flush
        if self.cls is not None and kept:
            self._check(self.cls, dims)

    def _check(self, cls: type[Message], dims: Mapping[str, int] | None) -> None:
        """Every kept array's declared shape against the declaration of ``cls``."""
        shapes = {}
        for key in self.record or ():
            try:
                shapes[key] = _shaped(self.record[key].shape)
            except (ValueError, TypeError):
                raise self._unreadable(key) from None
        check_state(cls, shapes, {}, self.who, self.name, dims)

    def _unreadable(self, key: str) -> WireError:
        return WireError(f"{self.who}: its node state '{self.name}' does not deserialise: "
                         f"array '{key}' does not hold the shape its record declares")

    def __getitem__(self, key: str) -> np.ndarray:
        if key not in self.cache:
            if self.record is None:
                raise KeyError(key)
            array = self.record[key]
            try:
                view = state_view(array)
            except (ValueError, TypeError):
                raise self._unreadable(key) from None
            if view.shape != tuple(array.shape):  # read by numpy's own header instead
                raise self._unreadable(key)
            self.cache[key] = view
        return self.cache[key]

    def __setitem__(self, key: str, value: np.ndarray) -> None:
        self.cache[key] = to_numpy(value)  # a tensor of a node computing on a device
        self.dirty.add(key)

    def __delitem__(self, key: str) -> None:
        if key not in self:
            raise KeyError(key)
        if self.record is not None and key in self.record:
            del self.record[key]
        self.cache.pop(key, None)
        self.dirty.discard(key)

    def __iter__(self) -> Iterator[str]:
        kept = self.record.keys() if self.record is not None else ()
        return iter(list(dict.fromkeys([*kept, *sorted(self.dirty)])))

    def __len__(self) -> int:
        return len(set(self.record.keys() if self.record is not None else ()) | self.dirty)

    def __contains__(self, key: object) -> bool:
        return key in self.dirty or (self.record is not None and key in self.record)

    def flush(self) -> None:
        """Write what was set since the last flush (the end of a request's writes); a typed
        state's first write also marks it kept (its empty ``CONFIG`` record)."""
        if not self.dirty:
            return
        if self.record is None:
            self.record = self.state[self.name] = ArrayRecord()
        for key in sorted(self.dirty):
            self.record[key] = state_array(self.cache[key])
        self.dirty.clear()
        if self.cls is not None and self.cls.CONFIG not in self.state:
            self.state[self.cls.CONFIG] = ConfigRecord()

    def replace(self, arrays: dict[str, np.ndarray]) -> None:
        for key in list(self):
            del self[key]
        for key, value in arrays.items():
            self[key] = value


#: The one byte every :func:`_shaped` array views.
_ONE_BYTE = np.zeros(1, np.int8)


def _shaped(shape: Any) -> np.ndarray:
    """An array of ``shape`` that reads no data (one byte, every stride 0): what a shape
    check of a declaration looks at, for an array not read yet."""
    shape = tuple(int(n) for n in shape)
    if any(n < 0 for n in shape):  # numpy would read -1 as "the size the buffer has"
        raise ValueError("a negative size")
    return np.ndarray(shape, np.int8, buffer=_ONE_BYTE, strides=(0,) * len(shape))


def _setup(node: NodeContext) -> StateArrays:
    """This node's :class:`LPGCNSetup`, checked against its catalogue once per request (the
    cover check and the handler share it: one object, so a write by either is the other's)."""
    if "lpgcn.setup" not in node.memo:
        node.memo["lpgcn.setup"] = StateArrays(node, LPGCNSetup,
                                               {"items": _data(node).train.shape[1]})
    return node.memo["lpgcn.setup"]


def _params(node: NodeContext, dim: int) -> StateArrays:
    """This node's :class:`LPGCNParams`, checked against its users and ``lpgcn-dim``."""
    return StateArrays(node, LPGCNParams, {"users": len(_data(node).user_ids), "dim": dim})


#: Arrays of (layers + 1) x (users + items) x dim a node keeps at once in a round (user and
#: item rows, gradient sums, partials, mailed shares): the memory a request's sizes imply.
_ROW_COPIES = 6


def _data(node: NodeContext) -> Any:
    """This node's rows, kept per (run, node, data config, node config): ``NodeContext.data()``
    rescans the node state on every call, and every LP-GCN request needs them. The node
    config (partition) is part of the key: one process may host federations of other sizes
    under the same run and node ids (the in-process grids of tests and benchmarks)."""
    key = _data_key(node)
    if key not in _DATA:
        if len(_DATA) > 256:
            _DATA.clear()
        _DATA[key] = node.data()
    return _DATA[key]


def _data_key(node: NodeContext) -> tuple[int, int, str, str]:
    """What this node's rows are a function of (see :func:`_data`)."""
    return (node.context.run_id, node.context.node_id,
            repr(sorted(node.data_config().items())),
            repr(sorted(node.context.node_config.items())))


def _request(node: NodeContext, cls: type[H]) -> H:
    """The request as ``cls`` (every field checked, the run-fixed ones pinned), each
    server-chosen value that weakens the cover or sizes an allocation checked against this
    node's policy before anything else."""
    req = node.read(cls)
    _check_cover(node, req)
    _check_sizes(node, req)
    _device(node)
    return req


#: Node config key (the operator's, never the server's): where this node computes its math,
#: ``numpy`` (default) or a torch device (``cpu``, ``cuda``, ``cuda:N``). It is the node's
#: hardware, which the server neither knows nor may choose, and it changes no number the node
#: sends beyond rounding (float64: ``tests/test_lightgcn_device.py``).
DEVICE_KEY = "lpgcn-device"


def _device(node: NodeContext) -> str:
    """This node's compute device, checked on every request, so a device the machine lacks
    stops the run at its first request, naming the key."""
    name = str(node.context.node_config.get(DEVICE_KEY, NUMPY) or NUMPY)
    try:
        return check_device(name, key=f"node config '{DEVICE_KEY}'")
    except DeviceError as exc:
        raise LosslessnessError(f"{node.who}: {exc}") from None


def _check_cover(node: NodeContext, hp: Hyper) -> None:
    """Refuse a virtual-item rate or cover scale below this node's policy, sampled holdings
    without its ``allow-sampled-holdings``, and any change of them after the node drew its
    virtual items (they are pinned at ``lpgcn_holdings``).

    ``lpgcn-alpha`` near 0 leaves (almost) no virtual items and ``lpgcn-mask-scale`` near 0
    makes a virtual holding's gradient rows (almost) exact zeros: either shows the server
    which pseudonymous items this node really holds. A cover not far above the gradient
    partials shows it too, by the rows' magnitudes over the steps (docs/protocols/lpgcn.md,
    "Magnitudes"): hence the default minimum 0.1 against partials ~1e-6 to 1e-4. alpha = 0 is the plain mode
    (``allow-plain``), or allowed by an operator's ``lpgcn-min-alpha = 0``.
    """
    pol = node.policy
    alpha, scale, mode = hp.alpha, hp.mask_scale, hp.holdings  # finite, >= 0 (Hyper)
    if alpha == 0 and pol.lpgcn_min_alpha > 0:
        pol.require("allow-plain", "LP-GCN without virtual items (lpgcn-alpha = 0: the server "
                    "sees exactly which pseudonymous items this node holds)", node.who)
    elif alpha < pol.lpgcn_min_alpha:
        raise PolicyError(
            f"{node.who} refuses LP-GCN with lpgcn-alpha = {alpha:g}: its node policy "
            f"lpgcn-min-alpha = {pol.lpgcn_min_alpha:g} (fewer virtual items show the server "
            "which items this node holds). Only the node's operator can lower it (node config "
            "'lpgcn-min-alpha=<rate>')")
    if alpha > 0 and scale < pol.lpgcn_min_mask_scale:
        raise PolicyError(
            f"{node.who} refuses LP-GCN with lpgcn-mask-scale = {scale:g}: its node policy "
            f"lpgcn-min-mask-scale = {pol.lpgcn_min_mask_scale:g} (smaller cover values let the "
            "server tell virtual holdings from real ones). Only the node's operator can lower "
            "it (node config 'lpgcn-min-mask-scale=<std>')")
    if mode == "sampled" and alpha > 0:
        pol.require("allow-sampled-holdings", "LP-GCN with sampled virtual items "
                    "(lpgcn-holdings = sampled: an item held by one node is that node's real "
                    "item, so the server's holder counts name real holdings)", node.who)
    pinned = _setup(node)
    if _COVER in pinned:
        was = pinned[_COVER]
        if (alpha, scale, float(HOLDINGS.index(mode))) != tuple(float(x) for x in was):
            raise PolicyError(
                f"{node.who} refuses an LP-GCN request with lpgcn-alpha = {alpha:g}, "
                f"lpgcn-mask-scale = {scale:g}, lpgcn-holdings = {mode}: its virtual items "
                f"were drawn for {float(was[0]):g}, {float(was[1]):g}, "
                f"{HOLDINGS[int(was[2])]}, which hold for the whole run")


def _check_sizes(node: NodeContext, hp: Hyper) -> None:
    """Refuse, before allocating, server-chosen layers, dimension or precision that would
    need more than this node's ``memory-budget-mb``."""
    # the layer count is a loop count too (a round and a pass per layer, every step)
    node.check_iterations(hp.layers, "layers")
    users, items = _data(node).train.shape
    node.reserve(float(_ROW_COPIES) * (hp.layers + 1) * (users + items) * hp.dim
                 * np.dtype(hp.dtype).itemsize,
                 f"LP-GCN rows of {hp.layers} layers x dimension {hp.dim}")


def _real_rows(node: NodeContext) -> sp.csr_matrix:
    """This node's training rows; refuses a node none of whose users has an item."""
    train = _data(node).train
    if train.nnz == 0:
        raise LosslessnessError(
            f"{node.who}: none of its {train.shape[0]} user(s) has a training interaction; "
            "LP-GCN needs every node to hold at least one real item (it would take part "
            "with virtual items only, and its users have nothing to learn from)")
    return train


@handler(Action.COUNT, sums=True)
def count(content: RecordDict, node: NodeContext) -> RecordDict:
    """This node's number of training interactions, as a share of a sum (batches per epoch).
    Its hyperparameters are read (checked and pinned), not yet held to the policy: nothing
    of the cover leaves the node here."""
    node.read(CountRequest)
    return sum_reply(node, CountSum(n=np.array([float(_real_rows(node).nnz)])))


@handler(Action.HOLDINGS)
def holdings(content: RecordDict, node: NodeContext) -> RecordDict:
    """Pseudonyms (under S) of the items this node's users hold, plus virtual items; and
    this node's signature on the run's node set, which it commits to here.

    By default (``lpgcn-holdings = catalogue``) every other item is virtual: the node holds
    the whole catalogue, so its held set is the same in every run whatever its data, and
    every holder list of the assignment must name the whole committed set
    (:func:`_check_whole_set`). ``sampled`` (the node's ``allow-sampled-holdings``) is the
    paper's draw: a number uniform in [0, 2 alpha n] (n: this node's users with items) of
    items drawn privately (OS CSPRNG); ``fedrec.secure.pseudonyms.virtual_items``.
    """
    hp = _request(node, HoldingsRequest)
    train = _real_rows(node)
    if HELD in _setup(node):
        raise PolicyError(f"{node.who} refuses a second lpgcn_holdings in this run: its "
                          "virtual items are drawn once (two draws would differ in the "
                          "virtual items only, showing the server the real ones)")
    secret = get_shared_secret(node.state, wire.SECRET_PURPOSE)
    what = "the LP-GCN run's node set"
    members = commit_node_set(node, read_bounded(node, NodeSetRequest, what).members, what)
    m = train.shape[1]
    pseudo_all = item_pseudonyms(secret, m)
    real = np.unique(train.indices).astype(np.int64)
    n_active = int((train.getnnz(axis=1) > 0).sum())
    virtual = virtual_items(real, m, hp.holdings, hp.alpha, n_active, csprng_uniform)
    held_real = np.concatenate([real, virtual])
    order = np.argsort(pseudo_all[held_real])
    held_real = held_real[order]
    setup = _setup(node)
    setup.replace({_PSEUDO_ALL: pseudo_all, _HELD_REAL: held_real,
                   HELD: pseudo_all[held_real], _ISREAL: np.isin(held_real, real),
                   _COVER: np.array([hp.alpha, hp.mask_scale,
                                     float(HOLDINGS.index(hp.holdings))])})
    setup.flush()
    reply = Holdings(held=pseudo_all[held_real]).to_records()
    signed = NodeSetSignature(signed=sign_node_set(node, members))
    for name, record in signed.to_records().items():
        reply[name] = record
    return reply


@handler(Action.ASSIGN)
def assign(content: RecordDict, node: NodeContext) -> RecordDict:
    """Learn each held item's convolution node and, as a convolution node, each of its items'
    holders; mail every other holder, sealed, the pseudonyms of the items it convolves for
    it (the confirmation). Nothing about real or virtual holdings leaves before
    ``lpgcn_verify`` checked the confirmations against the server's assignment."""
    setup = _setup(node)
    if HELD not in setup:
        raise LosslessnessError(f"{node.who}: lpgcn_assign before lpgcn_holdings")
    if CONV_OF in setup:
        raise PolicyError(f"{node.who} refuses a second lpgcn_assign in this run: its "
                          "convolution assignment is fixed once (a new one would send its "
                          "verification to other nodes)")
    req = _request(node, AssignRequest)
    me = node.context.node_id
    conv_of = req.conv_of.astype(np.uint64)  # Flower node ids are unsigned 64-bit
    if len(conv_of) != len(setup[HELD]):
        raise LosslessnessError(f"{node.who}: the server assigned {len(conv_of)} items, this "
                                f"node holds {len(setup[HELD])}")
    conv_hpos = np.flatnonzero(conv_of == me)
    ptr = np.asarray(req.hold_ptr if req.hold_ptr is not None else np.zeros(1), np.int64)
    holders = np.asarray(req.hold_nodes if req.hold_nodes is not None else np.zeros(0),
                         np.uint64)
    _check_holder_lists(node, ptr, holders, len(conv_hpos))
    if _catalogue_cover(setup):
        _check_whole_set(node, ptr, holders)
    signed_set_digest(node, node.request, "the LP-GCN convolution assignment")
    for c, (ks, _) in _sender_lists(ptr, holders, me).items():
        node.mailbox.send(c, _CONFIRM, pack({_MAIL_ITEMS: setup[HELD][conv_hpos[ks]]}))
    setup.update({CONV_OF: conv_of, _CONV_HPOS: conv_hpos, HOLD_PTR: ptr,
                  HOLD_NODES: holders})
    setup.flush()
    return RecordDict()


def _check_holder_lists(node: NodeContext, ptr: np.ndarray, holders: np.ndarray,
                        n_conv: int) -> None:
    """The holder lists of this node's convolution items: one list per item, each naming
    this node once and no node twice (a list is what this node confirms to, and later
    takes verification mail from)."""
    me = np.uint64(node.context.node_id)
    if (len(ptr) != n_conv + 1 or ptr[0] != 0 or np.any(np.diff(ptr) < 1)
            or ptr[-1] != len(holders)):
        raise LosslessnessError(f"{node.who}: the server's holder lists ('hold_ptr') do not "
                                f"give one non-empty list for each of its {n_conv} "
                                "convolution items")
    item = np.repeat(np.arange(n_conv), np.diff(ptr))
    pairs = np.unique(np.stack([item.astype(np.uint64), holders]), axis=1)
    if pairs.shape[1] != len(holders) or np.count_nonzero(holders == me) != n_conv or not (
            np.all(np.bincount(item[holders == me], minlength=n_conv) == 1)):
        raise LosslessnessError(f"{node.who}: the server's holder lists must name this node "
                                "once in every list of its convolution items and no node twice "
                                "in one list")


def _catalogue_cover(setup: StateArrays) -> bool:
    """Whether this node drew the catalogue as its virtual items (``catalogue`` holdings
    with alpha > 0): then every node of the run holds every item."""
    alpha, _, mode = (float(x) for x in setup[_COVER])
    return alpha > 0 and HOLDINGS[int(mode)] == "catalogue"


def _check_whole_set(node: NodeContext, ptr: np.ndarray, holders: np.ndarray) -> None:
    """Under catalogue holdings, each holder list of this node's convolution items must name
    exactly the run's committed node set (every node holds every item).

    Why: a list that leaves nodes out ties the item's degree and its rows to the listed
    nodes' data alone; made the sole holder of a probe item, a node answered (its degree
    0 or not) whether its users hold it. A list of the whole set depends on the request
    only, so this refusal tells the server nothing about this node's data."""
    members = np.sort(np.asarray(committed_members(node), np.uint64))
    n = len(ptr) - 1
    whole = bool(np.all(np.diff(ptr) == len(members)))
    if whole and n:
        lists = np.sort(holders.reshape(n, len(members)), axis=1)
        whole = bool(np.all(lists == members[None, :]))
    if not whole:
        raise PolicyError(f"{node.who} refuses the convolution assignment: under catalogue "
                          "holdings every node holds every item, so each holder list of the "
                          f"items it convolves must name exactly the run's {len(members)} "
                          "committed nodes (a list leaving nodes out would tie the item's "
                          "degree and rows to fewer nodes' data)")


@handler(Action.VERIFY)
def verify(content: RecordDict, node: NodeContext) -> RecordDict:
    """The verification, in two requests: first every node checks the confirmations and
    mails its counts; then every convolution node forms its items' degrees."""
    setup = _setup(node)
    if CONV_OF not in setup:
        raise LosslessnessError(f"{node.who}: lpgcn_verify before lpgcn_assign")
    hp = _request(node, VerifyRequest)
    if _COUNTS_SENT not in setup:
        _mail_counts(node, setup)
    elif _CONV_DEGREE not in setup:
        _degrees(node, setup, hp)
    else:
        raise PolicyError(f"{node.who} refuses a third lpgcn_verify in this run: its "
                          "verification is done")
    setup.flush()
    return RecordDict()


def _mail_counts(node: NodeContext, setup: StateArrays) -> None:
    """Mail each convolution node, sealed, how many of this node's users really hold each
    item they share (0: virtual), once that node confirmed convolving exactly the items the
    server assigned to it: the server alone cannot route these counts to a node that does
    not hold and convolve the items (it holds them itself, or lists this node as a holder
    of items it does not convolve)."""
    me = node.context.node_id
    conv_of, held = setup[CONV_OF], setup[HELD]
    confirmed = {s: unpack(b)[_MAIL_ITEMS] for s, b in node.mailbox.receive(_CONFIRM).items()}
    assigned = {int(c): held[conv_of == c] for c in np.unique(conv_of) if int(c) != me}
    for c in sorted(set(assigned) | set(confirmed)):
        if c not in confirmed or c not in assigned or not np.array_equal(
                np.sort(confirmed[c]), assigned[c]):
            raise PolicyError(
                f"{node.who} refuses the convolution assignment: node {c} does not confirm "
                "convolving exactly the items the server assigned to it for this node, so "
                "this node sends it nothing about which of them it really holds")
    R = _real_rows(node)[:, setup[_HELD_REAL]].tocsc()
    counts = np.diff(R.indptr).astype(np.int64)  # users of this node really holding each item
    for c in assigned:
        node.mailbox.send(c, _VERIFY, pack({_MAIL_COUNT: counts[conv_of == c]}))
    setup.update({_OWN_COUNT: counts[setup[_CONV_HPOS]], _COUNTS_SENT: np.ones(1)})


def _degrees(node: NodeContext, setup: StateArrays, hp: VerifyRequest) -> None:
    """Convolution node: true degrees of its items from the verification mail; mail each
    holder the degrees of the items it shares; initialise this node's layer-0 rows (its
    users' U rows, its convolution items' V and W rows).

    An item of degree 0 (no real holder) is no refusal: such a refusal would answer whether
    the listed holders' users hold the item. It trains as in centralized LightGCN: no
    neighbour, so zero rows at layers >= 1 (``inv_sqrt(0) = 0``), and its layer-0 rows move
    by negative-sampling gradients only."""
    me = node.context.node_id
    conv_hpos = setup[_CONV_HPOS]
    ptr, holders = setup[HOLD_PTR], setup[HOLD_NODES]
    mail = {s: unpack(b)[_MAIL_COUNT] for s, b in node.mailbox.receive(_VERIFY).items()}
    per_sender = _sender_lists(ptr, holders, me)
    missing = sorted(set(per_sender) - set(mail))
    if missing:
        raise LosslessnessError(f"{node.who}: no verification mail from node(s) {missing}, "
                                "which hold items this node convolves")
    extra = sorted(set(mail) - set(per_sender))
    if extra:
        raise LosslessnessError(f"{node.who}: verification mail from node(s) {extra}, which "
                                "the server did not list as holders of its items")
    degree = setup[_OWN_COUNT].astype(np.float64).copy()
    hold_cnt = np.zeros(len(holders), dtype=np.int64)
    for s, (ks, slots) in per_sender.items():
        if len(mail[s]) != len(ks):
            raise LosslessnessError(f"{node.who}: node {s}'s verification mail lists "
                                    f"{len(mail[s])} items, it shares {len(ks)}")
        degree[ks] += mail[s]
        hold_cnt[slots] = mail[s]
    for s, (ks, _) in per_sender.items():
        node.mailbox.send(int(s), _DEGREE_MAIL, pack({_MAIL_DEGREE: degree[ks]}))
    conv_real = setup[_HELD_REAL][conv_hpos]
    params = _initial_params(node, hp, conv_real)
    held_degree = np.zeros(len(setup[HELD]))
    held_degree[conv_hpos] = degree
    setup.update({_HOLD_CNT: hold_cnt, _CONV_DEGREE: degree, _DEGREE: held_degree})
    stored = _params(node, hp.dim)
    stored.replace(params)
    stored.flush()
    node.save_state(LPGCNFlags(step=hp.start_step - 1))


#: Node config key (the operator's, never the server's): a checkpoint of the model at the run's
#: ``lpgcn-start-step`` (``LightGCN.state_arrays`` as .npz: every layer-0 table with its Adam
#: moments and the step count), from which this node takes the rows it holds.
INIT_KEY = "lpgcn-init"


def _initial_params(node: NodeContext, hp: Hyper,
                    conv_real: np.ndarray) -> dict[str, np.ndarray]:
    """This node's layer-0 rows (its convolution items' V and W, its users' U) and their Adam
    state: drawn from the public seed streams at step 0, or taken from the operator's
    checkpoint when the run continues at ``start-step`` > 0."""
    dtype = np.dtype(hp.dtype)
    dim, seed, std = hp.dim, hp.seed, hp.init_std
    plus = hp.backbone == _PLUS
    ids = np.asarray(_data(node).user_ids, np.int64)
    rows = {_V: conv_real, _W: conv_real} if plus else {_V: conv_real, _U: ids}
    params: dict[str, np.ndarray] = {_CONV_REAL: conv_real}
    if not plus:
        params[_USER_IDS] = ids
    start = hp.start_step
    path = str(node.context.node_config.get(INIT_KEY, "") or "")
    if not path:
        if start:
            raise LosslessnessError(
                f"{node.who}: the run starts at step {start}, but this node's operator named "
                f"no checkpoint to start from (node config '{INIT_KEY}')")
        for table, which in rows.items():
            params[table] = init_rows(which, dim, seed, table, std, dtype)
        return params
    try:
        with np.load(path) as z:
            ck = {k: z[k] for k in z.files if k.split(".")[0] in rows or k == "step_count"}
    except (OSError, ValueError) as exc:
        raise LosslessnessError(f"{node.who}: cannot read its {INIT_KEY} checkpoint {path}: "
                                f"{exc}") from None
    at = int(ck["step_count"][0]) if "step_count" in ck else -1
    if at != start:
        raise LosslessnessError(f"{node.who}: its {INIT_KEY} checkpoint {path} is at step {at}, "
                                f"the run starts at step {start}")
    for table, which in rows.items():
        missing = [k for k in (table, f"{table}.m", f"{table}.v", f"{table}.t") if k not in ck]
        if missing or ck[table].shape[1] != dim or (len(which) and which.max() >= len(ck[table])):
            raise LosslessnessError(
                f"{node.who}: its {INIT_KEY} checkpoint {path} does not fit this run's "
                f"{hp.backbone} model (table {table}: missing {missing} or another size)")
        params[table] = ck[table][which].astype(dtype)
        params[f"{table}.m"] = ck[f"{table}.m"][which].astype(dtype)
        params[f"{table}.v"] = ck[f"{table}.v"][which].astype(dtype)
        params[f"{table}.t"] = np.asarray(ck[f"{table}.t"], np.int64)
    return params


def _sender_lists(ptr: np.ndarray, holders: np.ndarray,
                  me: int) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Per other holder of this node's convolution items: (the items it holds, ascending
    convolution-local index; their positions in ``holders``)."""
    ptr = np.asarray(ptr, np.int64)
    slots = np.arange(ptr[0], ptr[-1], dtype=np.int64)
    ks = np.repeat(np.arange(len(ptr) - 1, dtype=np.int64), np.diff(ptr))
    who = np.asarray(holders, dtype=np.uint64)[slots]  # Flower node ids: unsigned 64-bit
    other = who != np.uint64(me)
    slots, ks, who = slots[other], ks[other], who[other]
    return {int(s): (ks[who == s], slots[who == s]) for s in np.unique(who)}


@dataclass(frozen=True)
class _Graph:
    """What a node's rounds derive from its rows and its setup, the same in every round:
    its users x held items matrix R (and transposed, per convolution node's shared items),
    ``1/sqrt(d_u)``, and who shares which items with it."""

    R: sp.csr_matrix
    RT: sp.csr_matrix
    inv_du: np.ndarray
    #: other convolution node -> positions (in held order) of the items it convolves
    shared: dict[int, np.ndarray]
    RT_shared: dict[int, sp.csr_matrix]
    RT_conv: sp.csr_matrix  # rows of this node's own convolution items
    senders: dict[int, tuple[np.ndarray, np.ndarray]]


#: Per process, each node's :class:`_Graph` under the key of its rows and a digest of the
#: setup arrays it derives from: rebuilding it every request cost more than the round's math.
_GRAPHS: dict[tuple[Any, ...], tuple[Any, _Graph]] = {}
_GRAPH_FROM = (_HELD_REAL, CONV_OF, _CONV_HPOS, HOLD_PTR, HOLD_NODES)


def _graph(node: NodeContext, setup: StateArrays, dtype: np.dtype) -> _Graph:
    """This node's :class:`_Graph` (built once per process and setup)."""
    digest = hashlib.blake2b(digest_size=16)
    for name in _GRAPH_FROM:
        digest.update(np.ascontiguousarray(setup[name]).tobytes())
    key = (_data_key(node), str(dtype), digest.digest())
    data = _data(node)
    if key not in _GRAPHS or _GRAPHS[key][0] is not data:
        if len(_GRAPHS) > 256:
            _GRAPHS.clear()
        me = node.context.node_id
        train = data.train
        R = sp.csr_matrix(train[:, setup[_HELD_REAL]], dtype=dtype)
        R.data[:] = 1
        RT = R.T.tocsr()
        conv_of = setup[CONV_OF]
        shared = {int(c): np.flatnonzero(conv_of == c) for c in np.unique(conv_of)
                  if int(c) != me}
        _GRAPHS[key] = data, _Graph(
            R, RT, inv_sqrt(train.getnnz(axis=1), dtype), shared,
            {c: RT[rows] for c, rows in shared.items()}, RT[setup[_CONV_HPOS]],
            _sender_lists(setup[HOLD_PTR], setup[HOLD_NODES], me))
    return _GRAPHS[key][1]


class Session:
    """One node's LP-GCN state for one request (``hp``): loaded from and saved to
    ``node.state``."""

    def __init__(self, node: NodeContext, hp: RoundRequest) -> None:
        self.node = node
        self.hp = hp
        self.me = node.context.node_id
        self.setup = _setup(node)
        self.params = _params(node, hp.dim)
        flags = node.load_state(LPGCNFlags)
        if _V not in self.params or flags is None:
            raise LosslessnessError(f"{node.who}: lpgcn_round before the LP-GCN setup")
        self.cur = StateArrays(node, _STEP)
        self.losses = StateArrays(node, LPGCNLosses)
        self.flags: dict[str, Any] = flags.as_dict()
        self.L = hp.layers
        self.plus = hp.backbone == _PLUS
        self.dtype = np.dtype(hp.dtype)
        self.data = _data(node)
        self.graph = _graph(node, self.setup, self.dtype)
        self.R, self.RT, self.inv_du = self.graph.R, self.graph.RT, self.graph.inv_du
        self.conv_of = self.setup[CONV_OF]
        self.conv_hpos = self.setup[_CONV_HPOS]
        self.senders = self.graph.senders
        self.out: dict[str, np.ndarray] = {}
        self.device = _device(node)

    def x(self, a: np.ndarray) -> Any:
        """``a`` on this node's device (the state keeps numpy between rounds; its read-only
        views are copied for torch, whose CPU tensors would share and may write them)."""
        if self.device != NUMPY and isinstance(a, np.ndarray) and not a.flags.writeable:
            a = a.copy()
        return to_device(a, self.device)

    # -- bookkeeping -------------------------------------------------------------------------
    def save(self) -> None:
        for arrays in (self.cur, self.params, self.setup, self.losses):
            arrays.flush()
        self.node.save_state(LPGCNFlags.of(self.flags))

    def done(self, name: str) -> bool:
        return bool(self.flags.get(name, False))

    def mark(self, name: str) -> None:
        self.flags[name] = True

    @property
    def inv_di(self) -> np.ndarray:
        return inv_sqrt(self.setup[_DEGREE], self.dtype)

    def step_param(self, table: str, grad: np.ndarray) -> None:
        moments = {k: self.x(self.params[k]) for k in (f"{table}.m", f"{table}.v")
                   if k in self.params}
        if moments:
            moments[f"{table}.t"] = self.params[f"{table}.t"]
        opt = Adam.from_arrays(self.hp.lr, moments, table)
        grad = self.x(to_numpy(grad).astype(self.dtype, copy=False))
        self.params[table] = opt.step(self.x(self.params[table]), grad)
        self.params.update(opt.to_arrays(table))

    @property
    def secret(self) -> bytes:
        return get_shared_secret(self.node.state, wire.SECRET_PURPOSE)

    def conv_nodes(self) -> list[int]:
        """Other nodes that convolve items this node holds (real or virtual), ascending."""
        return list(self.graph.shared)

    # -- mail --------------------------------------------------------------------------------
    def absorb_degrees(self) -> None:
        """The degrees each convolution node mailed for the items it convolves for this
        node, every letter checked before any is kept."""
        got = {s: unpack(blob)[_MAIL_DEGREE]
               for s, blob in self.node.mailbox.receive(_DEGREE_MAIL).items()}
        degree = self.setup[_DEGREE].copy()
        for s, values in got.items():
            pos = np.flatnonzero(self.conv_of == s)
            if s == self.me or not len(pos) or np.shape(values) != (len(pos),):
                raise LosslessnessError(f"{self.node.who}: node {s} mailed degrees of "
                                        f"{np.size(values)} items, it convolves {len(pos)} "
                                        "that this node holds")
            degree[pos] = values
        for s in got:
            self.flags[f"deg.{s}"] = True
        if got:
            self.setup[_DEGREE] = degree
        if not self.done(_DEGREES) and all(self.done(f"deg.{c}") for c in self.conv_nodes()):
            self.mark(_DEGREES)

    def mail_items(self, purpose: str, X_users: np.ndarray) -> np.ndarray:
        """Mail each convolution node this node's share of ``X`` for the items they share
        (rows in ascending pseudonym order; zero rows for virtual items, which the
        convolution node knows to ignore); return this node's share of its own items."""
        for c in self.conv_nodes():
            part = item_partial(self.graph.RT_shared[c], self.x(self.inv_du), self.x(X_users))
            self.node.mailbox.send(c, purpose, pack({_MAIL_ROWS: part}))
        return to_numpy(item_partial(self.graph.RT_conv, self.x(self.inv_du), self.x(X_users)))

    def gather(self, purpose: str, own: np.ndarray) -> np.ndarray | None:
        """``own`` plus every holder's mailed share of this node's items, once all arrived."""
        for s, blob in self.node.mailbox.receive(purpose).items():
            if s not in self.senders:
                raise LosslessnessError(f"{self.node.who}: unexpected '{purpose}' mail from "
                                        f"node {s}")
            self.cur[f"{purpose}.{s}"] = unpack(blob)[_MAIL_ROWS]
        if not all(f"{purpose}.{s}" in self.cur for s in self.senders):
            return None
        real = self.setup[_HOLD_CNT] > 0
        acc = own.copy()
        for s, (ks, slots) in self.senders.items():
            x = self.cur.pop(f"{purpose}.{s}")
            if len(x) != len(ks):
                raise LosslessnessError(f"{self.node.who}: node {s} mailed {len(x)} rows for "
                                        f"'{purpose}', it shares {len(ks)} items")
            keep = real[slots]
            acc[ks[keep]] += x[keep]
        return acc

    # -- steps -------------------------------------------------------------------------------
    def begin(self, step: int, train: bool) -> None:
        """Start ``step``: fresh per-step storage; its triples and negatives when training."""
        for key in [k for k in self.cur if not k.startswith("lpgcn-wg")]:
            del self.cur[key]
        keep = {k: v for k, v in self.flags.items()
                if k in (_DEGREES, _W_PENDING) or k.startswith("deg.")}
        self.flags = {**keep, _AT: step, _TRAIN: train}
        if not train:
            return
        rows, pos, neg = self.triples(step)
        held_real, pseudo_all = self.setup[_HELD_REAL], self.setup[_PSEUDO_ALL]
        where = np.full(len(pseudo_all), -1, dtype=np.int64)
        where[held_real] = np.arange(len(held_real))
        outside = np.unique(neg[where[neg] < 0])
        outside = outside[np.argsort(pseudo_all[outside])]
        self.cur.update({"t.rows": rows, "t.pos": where[pos], "t.neg": where[neg],
                         "t.out": np.searchsorted(pseudo_all[outside], pseudo_all[neg]),
                         "negreal": outside})
        self.out[wire.name(Part.NEG_REQUEST)] = pseudo_all[outside]

    def triples(self, step: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """This node's triples of ``step`` (its epoch's, drawn once per process: _TRIPLES)."""
        nb, seed = self.hp.nbatches, self.hp.seed
        epoch, b = divmod(step, nb)
        key = _data_key(self.node)
        cached = _TRIPLES.get(key)
        if cached is None or cached[0] is not self.data or cached[1] != (seed, epoch, nb):
            if len(_TRIPLES) > 256:
                _TRIPLES.clear()
            cached = _TRIPLES[key] = self.data, (seed, epoch, nb), epoch_triples(
                self.data.train, self.data.user_ids, seed, epoch, nb)
        rows, pos, neg, batch = cached[2]
        keep = batch == b
        return rows[keep], pos[keep], neg[keep]

    def absorb(self, got: dict[str, np.ndarray]) -> None:
        """Deliveries of this round: item rows ``e<l>``, negatives ``neg``, W rows ``w``,
        gradient sums ``g<l>`` (held items) and ``g0`` (this node's convolution items);
        every one checked before any is kept."""
        for key, value in self.checked_deliveries(got).items():
            self.cur[key] = value
            self.mark(f"got.{key}")  # the array may be dropped once used, the mark stays

    def checked_deliveries(self, got: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """``got`` by state key, once every array is a part delivered to a node, new in this
        step and of the shape it must have."""
        out: dict[str, np.ndarray] = {}
        for name, value in got.items():
            try:
                part, layer = wire.parse(name)
            except wire.WireError as exc:
                raise LosslessnessError(f"{self.node.who}: {exc}") from None
            key = _DELIVERED.get(part)
            if key is None:
                raise LosslessnessError(f"{self.node.who}: LP-GCN array '{name}' is not "
                                        "delivered to a node")
            if layer is not None:
                key = f"{key}{layer}"
            if key in self.cur or key in out or self.done(f"got.{key}"):
                raise LosslessnessError(f"{self.node.who}: '{name}' delivered twice in step "
                                        f"{self.flags[_AT]}")
            expected = self.delivered_shape(_DELIVERED[part], layer)
            if np.shape(value) != expected:
                raise LosslessnessError(f"{self.node.who}: LP-GCN array '{name}' has shape "
                                        f"{np.shape(value)}, expected {expected}")
            out[key] = value
        return out

    def delivered_shape(self, key: str, layer: int | None) -> tuple[int, ...]:
        """The shape a delivery must have (checked before any math uses it): every held
        item's rows (``ei<l>``, ``w_held``, ``gsum<l>``, layers 0..L), this node's
        convolution items' gradient sum (``gsum0``), the requested negatives' rows of every
        layer (``neg``)."""
        d = self.hp.dim
        if layer is not None and layer > self.L:
            return (-1,)  # no such layer: never matches
        if key == _NEG:
            return (len(self.cur.get("negreal", ())), self.L + 1, d)
        if key == "gsum" and layer == 0:
            return (len(self.conv_hpos), d)
        return (len(self.setup[HELD]), d)

    def advance(self) -> None:
        """Apply every rule that has become applicable, until none is."""
        rules = (self.rule_users, self.rule_item_sum, self.rule_mail, self.rule_conv,
                 self.rule_w, self.rule_loss, self.rule_backward)
        while any([rule() for rule in rules]):
            pass

    def rule_users(self) -> bool:
        """User rows of layer 0 (U, or from delivered W rows) and of layer l from item rows
        of layer l-1."""
        progress = False
        if "eu0" not in self.cur:
            if not self.plus:
                self.cur["eu0"] = self.params[_U]
                progress = True
            elif "w_held" in self.cur:
                ones = np.ones(self.R.shape[1], self.dtype)
                self.cur["eu0"] = to_users(self.R, self.x(self.inv_du), self.x(ones),
                                           self.x(self.cur["w_held"]))
                progress = True
        for layer in range(1, self.L + 1):
            if f"eu{layer}" not in self.cur and f"ei{layer - 1}" in self.cur:
                self.require_degrees()
                self.cur[f"eu{layer}"] = to_users(self.R, self.x(self.inv_du),
                                                  self.x(self.inv_di),
                                                  self.x(self.cur[f"ei{layer - 1}"]))
                progress = True
        return progress

    def rule_item_sum(self) -> bool:
        """Add each delivered layer of item rows, in layer order, to their running sum (the
        loss reads only their mean and layer 0: ``layer_mean`` adds in the same order, so
        the sum is the same to the bit), and drop a layer >= 1 once added and propagated
        to the users: the step's state keeps two item tables instead of L + 1."""
        progress = False
        for layer in range(self.L + 1):
            key = f"ei{layer}"
            if self.done(f"sum.{key}"):
                continue
            if key not in self.cur:
                break
            self.cur["eisum"] = (self.cur[key] if layer == 0
                                 else self.cur["eisum"] + self.cur[key])
            self.mark(f"sum.{key}")
            progress = True
        for layer in range(1, self.L + 1):
            key = f"ei{layer}"
            if (key in self.cur and self.done(f"sum.{key}")
                    and (layer == self.L or f"eu{layer + 1}" in self.cur)):
                del self.cur[key]
        return progress

    def rule_mail(self) -> bool:
        """Mail user rows of layers 0..L-1 (each item's share) to the convolution nodes."""
        progress = False
        for layer in range(self.L):
            if f"eu{layer}" in self.cur and not self.done(f"mailed{layer}"):
                purpose = f"lpgcn-e{layer}-s{self.flags[_AT]}"
                own = self.mail_items(purpose, self.cur[f"eu{layer}"])
                if len(self.conv_hpos):  # its own share, until the holders' shares arrive
                    self.cur[f"own{layer}"] = own
                self.mark(f"mailed{layer}")
                progress = True
        return progress

    def rule_conv(self) -> bool:
        """Convolution node: its items' layer-0 rows once, layer l+1 from the users' shares."""
        if not len(self.conv_hpos):
            return False
        progress = False
        if not self.done("up.e0"):
            self.out[wire.name(Part.ITEM_ROWS, 0)] = self.params[_V]
            self.mark("up.e0")
            progress = True
        inv = inv_sqrt(self.setup[_CONV_DEGREE], self.dtype)
        for layer in range(self.L):
            if self.done(f"conv{layer + 1}") or f"own{layer}" not in self.cur:
                continue
            acc = self.gather(f"lpgcn-e{layer}-s{self.flags[_AT]}", self.cur[f"own{layer}"])
            if acc is not None:
                self.out[wire.name(Part.ITEM_ROWS, layer + 1)] = inv[:, None] * acc
                self.mark(f"conv{layer + 1}")
                del self.cur[f"own{layer}"]
                progress = True
        return progress

    def rule_w(self) -> bool:
        """LightGCN+ convolution node: W after the previous step's gradient, then uploaded."""
        if not self.plus or not len(self.conv_hpos) or self.done("up.w"):
            return False
        pending = self.flags.get(_W_PENDING, -1)
        if pending >= 0:
            own = self.cur.get(f"lpgcn-wg{pending}.own")
            grad = self.gather(f"lpgcn-wg{pending}", own)
            if grad is None:
                return False
            self.cur.pop(f"lpgcn-wg{pending}.own")
            self.step_param("W", grad)
            self.flags[_W_PENDING] = -1
        self.out[wire.name(Part.W)] = self.params[_W]
        self.mark("up.w")
        return True

    def forward_done(self) -> bool:
        return all(f"eu{layer}" in self.cur for layer in range(self.L + 1))

    def rule_loss(self) -> bool:
        """Loss share and direct gradients of this node's triples (all layers delivered)."""
        L = self.L
        if (not self.flags[_TRAIN] or self.done("loss") or not self.forward_done()
                or _NEG not in self.cur or not self.done(f"sum.ei{L}")):
            return False
        c = self.cur
        item0, hf = self.x(c["ei0"]), self.x(c["eisum"]) / (L + 1)  # = layer_mean, bitwise
        users = [self.x(c[f"eu{layer}"]) for layer in range(L + 1)]
        neg = self.x(c[_NEG])  # (outside negatives, L+1, d)
        uf = layer_mean(users)
        nf = layer_mean([neg[:, layer] for layer in range(L + 1)])
        # writable copies: a torch device takes numpy index arrays, and state views are not
        rows, pos, jn, out_pos = (np.array(c[k]) for k in ("t.rows", "t.pos", "t.neg", "t.out"))
        held_neg = jn >= 0
        n_fin, n_0 = zeros_like(uf[rows]), zeros_like(uf[rows])
        n_fin[held_neg], n_0[held_neg] = hf[jn[held_neg]], item0[jn[held_neg]]
        n_fin[~held_neg], n_0[~held_neg] = nf[out_pos[~held_neg]], neg[out_pos[~held_neg], 0]
        t = bpr_terms(uf[rows], hf[pos], n_fin, users[0][rows], item0[pos], n_0,
                      self.hp.reg, self.hp.batch_size)
        h, nu, no = len(hf), len(uf), len(nf)
        hidx = np.concatenate([pos, jn[held_neg]])
        c["dUf"], c["dUr"] = scatter_rows(rows, t.d_user, nu), scatter_rows(rows, t.r_user, nu)
        # the held items' direct terms are zero outside this node's triples: kept as those
        # rows only (held_direct rebuilds the table, the same values)
        touched = np.unique(hidx)
        c["dH.idx"] = touched
        for key, pos_terms, neg_terms in (("dHf.rows", t.d_pos, t.d_neg),
                                          ("dHr.rows", t.r_pos, t.r_neg)):
            table = scatter_rows(hidx, concat([pos_terms, neg_terms[held_neg]]), h)
            c[key] = to_numpy(table)[touched]
        c["dNf"] = scatter_rows(out_pos[~held_neg], t.d_neg[~held_neg], no)
        c["dNr"] = scatter_rows(out_pos[~held_neg], t.r_neg[~held_neg], no)
        c[f"Gu{L}"] = direct_terms(L, L, self.x(c["dUf"]), self.x(c["dUr"]))
        # appended once per step, in an array record of its own (the flags, rewritten every
        # round, would grow with the run)
        kept = self.losses
        had = _LOSS in kept
        kept[_LOSS_STEPS] = np.append(kept[_LOSS_STEPS] if had else np.zeros(0, np.int64),
                                      int(self.flags[_AT]))
        kept[_LOSS] = np.append(kept[_LOSS] if had else np.zeros(0), float(t.loss))
        self.mark("loss")
        return True

    def rule_backward(self) -> bool:
        """User gradients from delivered item sums; item-gradient partials of each layer."""
        if not self.done("loss"):
            return False
        c, L, x = self.cur, self.L, self.x
        progress = False
        for layer in range(L - 1, -1, -1):
            if f"Gu{layer}" not in c and f"gsum{layer + 1}" in c:
                c[f"Gu{layer}"] = direct_terms(layer, L, x(c["dUf"]), x(c["dUr"])) + to_users(
                    self.R, x(self.inv_du), x(self.inv_di), x(c[f"gsum{layer + 1}"]))
                del c[f"gsum{layer + 1}"]  # used once
                progress = True
        dHf = dHr = None
        for layer in range(L, -1, -1):
            if self.done(f"up.g{layer}") or f"Gu{layer + 1}" not in c and layer < L:
                continue
            if dHf is None:
                dHf, dHr = (x(table) for table in self.held_direct())
            part = direct_terms(layer, L, dHf, dHr)
            if layer < L:
                part = part + x(self.inv_di)[:, None] * item_partial(self.RT, x(self.inv_du),
                                                                     x(c[f"Gu{layer + 1}"]))
            self.out[wire.name(Part.ITEM_GRAD, layer)] = self.masked(part, layer)
            if len(c["negreal"]):
                self.out[wire.name(Part.NEG_GRAD, layer)] = direct_terms(layer, L, c["dNf"], c["dNr"])
            self.mark(f"up.g{layer}")
            progress = True
        return progress

    def held_direct(self) -> tuple[np.ndarray, np.ndarray]:
        """The held items' direct terms (final-embedding and regulariser parts) as tables,
        from the rows of this node's triples that ``rule_loss`` kept."""
        idx, tables = self.cur["dH.idx"], []
        for key in ("dHf.rows", "dHr.rows"):
            rows = self.cur[key]
            table = np.zeros((len(self.setup[HELD]), rows.shape[1]), rows.dtype)
            table[idx] = rows
            tables.append(table)
        return tables[0], tables[1]

    def masked(self, part: np.ndarray, layer: int) -> np.ndarray:
        """The partial with a cover row on every item another node convolves, real or virtual,
        and (convolution node) the covers of its items' other holders taken off, so the
        server's sum is the true gradient.

        Covering real holdings too is what hides the virtual ones: a convolution node's row
        of an item it holds only virtually would otherwise be its direct terms alone (zero,
        or the same row at every layer >= 1), and a virtual holder's row would be a pure
        cover beside real holders' bare partials. Every other holder of an item is real or
        virtual, so a convolution node with another holder always subtracts a cover.
        """
        part = np.array(to_numpy(part), dtype=self.dtype)
        scale = float(self.setup[_COVER][1])
        step = int(self.flags[_AT])
        for c, rows in self.graph.shared.items():
            part[rows] += self.cover(step, layer, self.me, c, len(rows), part.shape[1], scale)
        for s, (ks, _) in self.senders.items():
            part[self.conv_hpos[ks]] -= self.cover(step, layer, s, self.me, len(ks),
                                                   part.shape[1], scale)
        return part

    def cover(self, step: int, layer: int, holder: int, conv: int, n: int, d: int,
              scale: float) -> np.ndarray:
        """The cover rows ``holder`` adds for the ``n`` items ``conv`` convolves (ascending
        pseudonym), regenerated by ``conv`` from S to take them off."""
        return scale * keyed_normal(self.secret, f"{step}|{layer}|{holder}|{conv}", (n, d))

    def require_degrees(self) -> None:
        if not self.done(_DEGREES):
            missing = [c for c in self.conv_nodes() if not self.done(f"deg.{c}")]
            raise LosslessnessError(f"{self.node.who}: no item degrees yet from node(s) "
                                    f"{missing}")

    def finish(self) -> None:
        """Close a training step: every gradient is in; one Adam step on this node's rows."""
        c = self.cur
        if "Gu0" not in c or (len(self.conv_hpos) and "gsum0" not in c):
            raise LosslessnessError(f"{self.node.who}: step {self.flags[_AT]} ends before "
                                    "its layer-0 gradients arrived")
        if len(self.conv_hpos):
            self.step_param("V", c["gsum0"])
        if self.plus:
            step = int(self.flags[_AT])
            own = self.mail_items(f"lpgcn-wg{step}", c["Gu0"])
            if len(self.conv_hpos):
                self.cur[f"lpgcn-wg{step}.own"] = own
                self.flags[_W_PENDING] = step
        else:
            self.step_param("U", c["Gu0"])


@handler(Action.ROUND)
def lpgcn_round(content: RecordDict, node: NodeContext) -> RecordDict:
    """One round: take deliveries and mail, compute what became computable, reply uploads."""
    req = _request(node, RoundRequest)  # reserves the deliveries too
    s = Session(node, req)
    step, train = req.step, req.train
    got = _deliveries(node)
    current = int(s.flags[_AT])
    # the request's own checks before the node keeps anything of it
    if step not in (current, current + 1):
        raise LosslessnessError(f"{node.who}: request for step {step}, this node is at step "
                                f"{current} (a step can neither repeat nor be skipped)")
    if step == current + 1 and current >= 0 and not s.flags.get(_TRAIN) and got:
        raise LosslessnessError(f"{node.who}: deliveries at the start of step {step}")
    s.absorb_degrees()
    if step == current + 1:
        if current >= 0:
            if s.flags.get(_TRAIN):
                s.absorb(got)
                s.advance()
                s.finish()
            got = {}
        s.begin(step, train)
    s.absorb(got)
    s.advance()
    s.save()
    reply = RoundStatus(step=step, forward_done=s.forward_done()).to_records()
    if s.out:
        reply[request_wire.ARRAYS] = reply_arrays(s.out)
    return reply


def _deliveries(node: NodeContext) -> dict[str, np.ndarray]:
    """The round's deliveries, named by part and layer (``wire.parse``), beside the typed
    request in its arrays record, reserved before they are copied."""
    return node.undeclared_arrays(RoundRequest.ARRAYS)


@handler(Action.EVALUATE, sums=True)
def lpgcn_evaluate(content: RecordDict, node: NodeContext) -> RecordDict:
    """Recall/NDCG sums of this node's users against the final item table (sum share).

    ``V``: every item's final embedding, in the server's order (ascending pseudonym); this
    node maps it to item ids with its pseudonym table.
    """
    req = _request(node, EvaluateRequest)
    cur, setup = StateArrays(node, _STEP), _setup(node)
    layers = req.layers
    if _PSEUDO_ALL not in setup or not all(f"eu{layer}" in cur for layer in range(layers + 1)):
        raise LosslessnessError(f"{node.who}: evaluation before a finished forward pass")
    table = req.V
    pseudo = setup[_PSEUDO_ALL]
    if table.shape != (len(pseudo), req.dim):
        raise LosslessnessError(f"{node.who}: the item table V has shape {table.shape}, "
                                f"expected ({len(pseudo)}, lpgcn-dim)")
    k = req.top_k
    node.reserve(ranking_bytes(len(pseudo), 1024, k) + 8.0 * table.size,
                 f"LP-GCN evaluation (top-k={k})")
    V = table[np.searchsorted(np.sort(pseudo), pseudo)]
    U = layer_mean([cur[f"eu{layer}"] for layer in range(layers + 1)])
    data = _data(node)
    sums = evaluate_ranking(lambda rows: U[rows] @ V.T, data.train, data.test, k=k)
    return sum_reply(node, RankingSum(ranking=sums.to_vector()))


@handler(Action.LOSSES, sums=True)
def lpgcn_losses(content: RecordDict, node: NodeContext) -> RecordDict:
    """This node's loss share of every training step so far, as a share of a sum."""
    steps = _request(node, LossesRequest).steps
    node.reserve(8.0 * steps, f"LP-GCN losses of {steps} steps")
    kept = StateArrays(node, LPGCNLosses)
    out = np.zeros(steps)
    for s, value in zip(*((kept[_LOSS_STEPS], kept[_LOSS]) if _LOSS in kept else ((), ()))):
        if 0 <= int(s) < steps:
            out[int(s)] += float(value)
    return sum_reply(node, LossSum(loss=out))


def stored_params(state: RecordDict) -> dict[str, np.ndarray]:
    """This node's layer-0 rows as kept in its state (``U`` with ``user_ids``; ``V``, ``W``
    with ``conv_real``), checked: for tests that compare a run with the centralized
    reference."""
    kept = load_state(state, LPGCNParams, "the node")
    if kept is None:
        raise KeyError(_PARAMS)
    return kept.to_arrays()
