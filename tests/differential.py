"""A differential-data harness: does any reply a node sends in clear depend on its data?

Why: a node's privacy is broken by any value computed from its rows that leaves in clear,
whatever the protocol meant it for (FedPower's ``z-max`` with a server-chosen basis named
which items a node's users hold). Reviewing fields one by one misses the next one; this
harness asks the question of every reply of every registered handler instead.

How: :class:`TwinGrid` is a :class:`tests.malicious.MaliciousGrid` whose victim node has a
twin: the same node id, policy and Flower state history, but rows that differ from the
victim's by one user's rows (replaced or removed) or by one interaction (:func:`neighbour`).
Every request the honest strategy sends the victim is delivered to both, and so is each
server-chosen variant of it (:func:`variants`: unit-vector and extreme arrays, one-item
lists, sizes of 1 and 4x), on copies of both states so the honest run goes on undisturbed.
Every random draw a node makes (keys, nonces, Shamir coefficients, masks, DP noise) comes
from one seed per request while the victim or its twin answers (:func:`deterministic`), so
the two replies can only differ through the data. :func:`differences` lists a refusal or an
error text that differs, a reply size that differs, and any differing field outside the
records that travel masked, encrypted or sealed (:data:`PROTECTED`); the grid keeps, as a
:class:`Finding`, each one the threat model's "learns by design" table
(:func:`learns_by_design`) does not list for the protocol under an opt-in the node's policy
has on (or ``always``).
"""

from __future__ import annotations

import contextlib
import copy
import fnmatch
import hashlib
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict

from fedrec.secure.sealed import MAIL_OUT
from fedrec.wire.sums import CIPHER_KEY, SUM_KEY, VALUES_KEY
from tests.malicious import MaliciousGrid

DOC = Path(__file__).resolve().parents[1] / "docs" / "threat-model.md"
_TABLE_START = "<!-- learns-by-design:start -->"
_TABLE_END = "<!-- learns-by-design:end -->"

#: Reply records whose values may differ between the two data sets because they travel
#: protected: ``secagg.values`` only when the request's sum mode is ``secagg+`` (in a plain
#: sum the same record is clear), CKKS chunks, the encrypted noise products of
#: fedsvd-utility, and sealed node-to-node mail. Their sizes must still be equal.
PROTECTED = {VALUES_KEY: "masked (SecAgg+)", CIPHER_KEY: "encrypted (CKKS)",
             "fedsvd-he": "encrypted (CKKS noise product)", MAIL_OUT: "sealed"}
#: Reply records of fresh key material whose bytes vary with TenSEAL's own randomness (no
#: seed reaches it): allowed to differ, sizes included, only in a call that read no rows.
KEY_MATERIAL = ("relay-created", MAIL_OUT)


# -- the two data sets ---------------------------------------------------------------------
@dataclass(frozen=True)
class Neighbour:
    """How the twin's rows differ from the victim's, and the item the difference touches
    (a server that suspects an item sends exactly that unit vector)."""

    kind: str
    item: int


def neighbour(data: Any, kind: str) -> tuple[Any, Neighbour]:
    """The victim's rows with one change to its first user who holds some items and misses
    most: ``user`` replaces that user's training rows by as many other items (the node still
    holds as many users and interactions), ``interaction`` adds one item the user did not
    have, ``user-removed`` leaves that user out (rows, features and attributes)."""
    train = sp.lil_matrix(data.train, dtype=np.float64)
    rows, test = sp.csr_matrix(data.train), sp.csr_matrix(data.test)
    users = [u for u in range(rows.shape[0]) if 0 < rows[u].nnz < data.n_items // 2]
    if not users:
        raise ValueError("the victim needs a user who holds some items and misses most")
    u = users[0]
    held = set(rows[u].indices) | set(test[u].indices)
    node_held = set(rows.indices) | set(test.indices)
    # items no user of the node holds first: the change then shows in what the node holds
    free = sorted((j for j in range(data.n_items) if j not in held),
                  key=lambda j: (j in node_held, j))
    if kind == "interaction":
        item = free[0]
        train[u, item] = 1.0
    elif kind == "user-removed":
        keep = np.arange(rows.shape[0]) != u
        return replace(data, train=rows[keep], test=test[keep], user_ids=data.user_ids[keep],
                       user_features=None if data.user_features is None
                       else data.user_features[keep],
                       user_attributes={k: v[keep] for k, v in data.user_attributes.items()}), \
            Neighbour(kind, int(rows[u].indices[0]))
    elif kind == "user":
        row = sorted(rows[u].indices)
        moved = free[:len(row)]
        for j in row:
            train[u, j] = 0.0
        for j in moved:
            train[u, j] = 1.0
        item = moved[0]
    else:
        raise ValueError(f"unknown neighbour kind {kind!r}")
    return replace(data, train=sp.csr_matrix(train)), Neighbour(kind, item)


# -- one seed per request --------------------------------------------------------------------
class _Stream:
    def __init__(self, seed: bytes) -> None:
        self.rng = np.random.default_rng(np.frombuffer(hashlib.sha256(seed).digest(), "<u4"))

    def bytes(self, n: int = 32) -> bytes:
        return self.rng.bytes(int(n))

    def randbits(self, k: int) -> int:
        return int.from_bytes(self.bytes((k + 7) // 8), "big") >> (8 * ((k + 7) // 8) - k)


class _FakeOpenDp:
    """OpenDP's measurement constructors, drawing from the request's seed instead."""

    def __init__(self, stream: _Stream) -> None:
        self.m = self
        self._s = stream

    def __getattr__(self, name: str) -> Any:  # domains, metrics, measures: unused here
        return lambda *a, **k: None

    def make_gaussian(self, *_: Any, scale: float) -> Callable[[list], list]:
        return lambda v: list(np.asarray(v) + self._s.rng.normal(0, scale, len(v)))

    def make_laplace(self, *_: Any, scale: float) -> Callable[[list], list]:
        return lambda v: list(np.asarray(v) + self._s.rng.laplace(0, scale, len(v)))


@contextlib.contextmanager
def deterministic(seed: bytes) -> Iterator[None]:
    """Every random draw of a node handler from ``seed``: the OS CSPRNG (``os.urandom``,
    ``secrets``), X25519 key generation, and OpenDP's samplers."""
    import os
    import secrets

    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

    import fedrec.dp as dp
    import fedrec.secure.keys as keys

    stream = _Stream(seed)

    class _Keys:
        from_private_bytes = staticmethod(X25519PrivateKey.from_private_bytes)

        @staticmethod
        def generate() -> X25519PrivateKey:
            return X25519PrivateKey.from_private_bytes(stream.bytes(32))

    def top_k(scale: float, k: int) -> Callable[[list], list]:
        return lambda v: list(np.argsort(-(np.asarray(v) + stream.rng.gumbel(0, scale,
                                                                               len(v))))[:k])

    patches = [(os, "urandom", stream.bytes), (secrets, "token_bytes", stream.bytes),
               (secrets, "randbits", stream.randbits),
               (secrets, "randbelow", lambda n: int(stream.rng.integers(n))),
               (keys, "X25519PrivateKey", _Keys), (dp, "_opendp", lambda: _FakeOpenDp(stream)),
               (dp, "_gumbel_top_k", top_k)]
    saved = [(obj, name, getattr(obj, name)) for obj, name, _ in patches]
    try:
        for obj, name, value in patches:
            setattr(obj, name, value)
        yield
    finally:
        for obj, name, value in saved:
            setattr(obj, name, value)


# -- server-chosen variants of a request ------------------------------------------------------
def _unit(a: np.ndarray, item: int, n_items: int) -> np.ndarray:
    """Zeros with a single 1 at the suspected item (on the first axis of length n_items)."""
    out = np.zeros_like(a)
    if out.size == 0:
        return out
    index = [0] * a.ndim
    axes = [i for i, s in enumerate(a.shape) if s == n_items]
    if axes:
        index[axes[0]] = item
    out[tuple(index)] = 1
    return out


#: Records :func:`variants` does not change as models: the data description and the sum
#: record get per-node variants of their own (:func:`split_variants`); relayed mail is the
#: sealed relay's (tests/test_malicious_server.py).
_NOT_MODELS = ("data", SUM_KEY, "relay.in", "relay.directory", "relay.round")


def _dataset_keys() -> frozenset[str]:
    """Run-config keys of the dataset and its partition (a stock round carries them in its
    ``config`` record): another dataset is not a model or a size the node answers about."""
    from datasets.spec import DATASET_KEYS

    return frozenset(k.name for k in DATASET_KEYS) | {"partition", "num-partitions",
                                                      "item-servers"}


def variants(content: RecordDict, item: int, n_items: int) -> Iterator[tuple[str, RecordDict]]:
    """Server-chosen versions of an honest request: each float array as a unit vector at
    ``item`` and as a large constant, each integer list cut to one element (the suspected
    item where the list holds it), each integer size above 1 set to 1 and to 4 times its
    value (the node's memory budget still applies: a refusal must then not differ)."""
    for key, record in content.items():
        if key in _NOT_MODELS:
            continue
        if isinstance(record, ArrayRecord):
            for label, fn in (("unit", lambda a: _unit(a, item, n_items)),
                              ("extreme", lambda a: np.full_like(a, 1e6))):
                arrays = {name: arr.numpy() for name, arr in record.items()}
                if not any(np.issubdtype(a.dtype, np.floating) for a in arrays.values()):
                    continue
                changed = {n: fn(a) if np.issubdtype(a.dtype, np.floating) else a
                           for n, a in arrays.items()}
                yield f"{key}:{label}", _with(content, key, _array_record(changed))
        elif isinstance(record, ConfigRecord):
            for field, value in record.items():
                if field in _dataset_keys():
                    continue
                if isinstance(value, list) and len(value) > 1 and \
                        all(isinstance(v, int) and not isinstance(v, bool) for v in value):
                    one = [item] if item in value else value[:1]
                    yield f"{key}.{field}:one-item", _with_field(content, key, field, one)
                elif isinstance(value, int) and not isinstance(value, bool) and value > 1:
                    yield f"{key}.{field}:size-1", _with_field(content, key, field, 1)
                    yield f"{key}.{field}:size-x4", _with_field(content, key, field, 4 * value)


def _other(value: Any) -> list[tuple[str, Any]]:
    """Other values a server could give one node for a field: numbers halved, doubled and
    moved by one, a flag flipped, a list without its first member, a string changed."""
    if isinstance(value, bool):
        return [("flipped", not value)]
    if isinstance(value, int):
        return [("plus-1", value + 1), ("minus-1", value - 1), ("x2", 2 * value)]
    if isinstance(value, float):
        return [("half", value / 2), ("x2", value * 2), ("plus-1", value + 1.0)]
    if isinstance(value, list):
        return [("less-one", value[1:])] if value else []
    if isinstance(value, str):
        return [("other", value + "-other")]
    return []


def split_variants(content: RecordDict) -> Iterator[tuple[str, RecordDict]]:
    """What a server could show one node only, beside the honest request every other node
    gets: each field of the sum record and of the data description changed
    (:func:`_other`), every key of the description and every field of the sum record."""
    from datasets import data_keys, describe

    if SUM_KEY in content.config_records:
        for field, value in content.config_records[SUM_KEY].items():
            for label, other in _other(value):
                yield f"{SUM_KEY}.{field}:{label}", _with_field(content, SUM_KEY, field, other)
    if "data" in content.config_records:
        named = describe(dict(content.config_records["data"]))
        for key in data_keys():
            if key == "data-dir":
                continue
            for label, other in _other(named[key])[:1]:
                out = copy_records(content)
                out["data"][key] = other
                yield f"data.{key}:{label}", out


def split_view_leak(request: RecordDict, honest: Message, variant_request: RecordDict,
                    variant: Message) -> bool:
    """Whether a node's masked answer to a per-node variant could be summed with its
    neighbours' answers to the honest request: it carries the same bound digest under the
    same sum id (the two inputs of its pairwise masks, the answers drawn from one seed) but
    other masked values. The server would then read the change of this node's encoding as
    the difference of two legal sums (a refused or an ineffective variant gives it
    nothing)."""
    from fedrec.wire.secagg import BOUND_KEY

    if honest.has_error() or variant.has_error():
        return False
    a, b = honest.content, variant.content
    if BOUND_KEY not in a or BOUND_KEY not in b or VALUES_KEY not in a or VALUES_KEY not in b:
        return False
    ids = [r.config_records[SUM_KEY].get("sum-id") if SUM_KEY in r.config_records else None
           for r in (request, variant_request)]
    same_masks = a[BOUND_KEY]["digest"] == b[BOUND_KEY]["digest"] and ids[0] == ids[1]
    va, vb = a[VALUES_KEY]["v"].numpy(), b[VALUES_KEY]["v"].numpy()
    return same_masks and not _equal(va, vb)


def _array_record(arrays: Mapping[str, np.ndarray]) -> ArrayRecord:
    from fedrec.records import to_array_record

    return to_array_record(arrays)


def copy_records(content: RecordDict) -> RecordDict:
    """A deep copy of a RecordDict (Flower's arrays hold memoryviews ``deepcopy`` refuses)."""
    out = RecordDict()
    for key, record in content.items():
        if isinstance(record, ArrayRecord):
            out[key] = _array_record({n: a.numpy().copy() for n, a in record.items()})
        else:
            out[key] = type(record)(copy.deepcopy(dict(record.items())))
    return out


def _with(content: RecordDict, key: str, record: Any) -> RecordDict:
    out = copy_records(content)
    out[key] = record
    return out


def _with_field(content: RecordDict, key: str, field: str, value: Any) -> RecordDict:
    out = copy_records(content)
    out[key][field] = value
    return out


# -- comparing two replies ------------------------------------------------------------------
@dataclass(frozen=True)
class Finding:
    """A difference between the victim's and its twin's answers that nothing allows."""

    protocol: str
    action: str
    request: str  # "honest" or the variant's label
    what: str  # "refusal", "error text", "size of ...", or the clear field "record.field"

    def __str__(self) -> str:
        return f"{self.protocol}: {self.action} ({self.request}): {self.what} differs"


def _size(value: Any) -> int:
    if isinstance(value, (bytes, str)):
        return len(value)
    if isinstance(value, list):
        return sum(_size(v) for v in value) + len(value)
    return 8


def _record_items(record: Any) -> dict[str, Any]:
    if isinstance(record, ArrayRecord):
        return {name: arr.numpy() for name, arr in record.items()}
    return dict(record.items())


def _equal(a: Any, b: Any) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        a, b = np.asarray(a), np.asarray(b)
        return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()
    return a == b


def differences(request: RecordDict, a: Message, b: Message, *,
                read_rows: bool = True) -> list[str]:
    """What differs between two replies to ``request``: a refusal, an error text, a
    record's size, a clear field's value (``record.field``). ``read_rows=False``: neither
    call read the node's rows, so :data:`KEY_MATERIAL` may differ."""
    if a.has_error() or b.has_error():
        if a.has_error() != b.has_error():
            return ["refusal"]
        return [] if a.error.reason == b.error.reason else ["error text"]
    ra, rb = a.content, b.content
    if sorted(ra.keys()) != sorted(rb.keys()):
        return ["the records replied"]
    mode = str(request[SUM_KEY].get("mode", "")) if SUM_KEY in request else ""
    out = []
    for key in sorted(ra.keys()):
        fa, fb = _record_items(ra[key]), _record_items(rb[key])
        if sorted(fa) != sorted(fb):
            out.append(f"fields of {key}")
            continue
        protected = key in PROTECTED and (key != VALUES_KEY or mode == "secagg+")
        if not read_rows and key in KEY_MATERIAL:
            continue
        for field in sorted(fa):
            va, vb = fa[field], fb[field]
            if isinstance(va, np.ndarray):
                same_size = va.shape == vb.shape and va.dtype == vb.dtype
            elif key == CIPHER_KEY or key == "fedsvd-he":
                # a CKKS ciphertext's bytes vary with its randomness: the count must match
                same_size = isinstance(va, list) == isinstance(vb, list) and \
                    (not isinstance(va, list) or len(va) == len(vb))
            else:
                same_size = _size(va) == _size(vb)
            if not same_size:
                out.append(f"size of {key}.{field}")
            elif not protected and not _equal(va, vb):
                out.append(f"{key}.{field}")
    return out


# -- the threat model's table ----------------------------------------------------------------
@dataclass(frozen=True)
class Disclosure:
    """One row of docs/threat-model.md's "learns by design" table."""

    protocols: tuple[str, ...]  # ("every",) for all protocols
    action: str
    field: str  # record.field as :func:`differences` names it (``*`` matches any text)
    opt_in: str  # a node policy key, or "always"

    def allows(self, protocol: str, action: str, what: str, policy: Mapping[str, Any]) -> bool:
        return (protocol in self.protocols or "every" in self.protocols) and \
            self.action == action and fnmatch.fnmatchcase(what, self.field) and \
            (self.opt_in == "always" or bool(policy.get(self.opt_in)))


def learns_by_design(doc: Path = DOC) -> list[Disclosure]:
    """The rows of the table between the ``learns-by-design`` markers of the threat model."""
    text = doc.read_text(encoding="utf-8")
    if _TABLE_START not in text or _TABLE_END not in text:
        raise ValueError(f"{doc.name} has no table between {_TABLE_START} and {_TABLE_END}")
    body = text.split(_TABLE_START, 1)[1].split(_TABLE_END, 1)[0]
    rows = []
    for line in body.splitlines():
        cells = [c.strip().strip("`") for c in line.strip().strip("|").split("|")]
        if len(cells) < 5 or cells[0] in ("Protocol", "") or set(cells[0]) <= set("-: "):
            continue
        protocols = tuple(p.strip().strip("`") for p in re.split(r",\s*", cells[0]))
        rows.append(Disclosure(protocols, cells[1], cells[2], cells[3]))
    return rows


# -- the grid ---------------------------------------------------------------------------------
class TwinGrid(MaliciousGrid):
    """A grid whose victim node (the data hook's partition) answers every request twice,
    with its rows and with its twin's (:func:`neighbour`), and answers each server-chosen
    variant too."""

    def __init__(self, app: Any, num_nodes: int, *, protocol: str, kind: str,
                 policy: Mapping[str, Any], data_hook: Any, n_items: int,
                 drop: tuple[int, int] | None = None, **kwargs: Any) -> None:
        super().__init__(app, num_nodes, drop=drop, **kwargs)
        self.protocol, self.policy, self.hook, self.n_items = protocol, policy, data_hook, n_items
        self.victim = self.ids[data_hook.partition]
        ctx = self.contexts[self.victim]
        self.twin = Context(run_id=ctx.run_id, node_id=ctx.node_id,
                            node_config=dict(ctx.node_config), state=RecordDict(),
                            run_config={})
        self.kind = kind
        self.allowed = learns_by_design()
        #: Actions whose first request got the per-node variants (once per action per run:
        #: every sum and handshake of the protocol, at a bounded cost)
        self.split_actions: set[str] = set()
        self.split_compared = 0
        self.findings: list[Finding] = []
        self.actions: set[str] = set()
        self.compared = 0
        self.protected_replies = 0

    def adopt_data(self, offered: Mapping[str, Any]) -> None:
        """The twin's operator describes the same data as the victim's."""
        super().adopt_data(offered)
        for key, value in offered.items():
            self.twin.node_config.setdefault(key, value)

    def _answer(self, context: Context, msg: Message, world: str, seed: bytes) -> Message:
        msg = self._with_content(msg, copy_records(msg.content))  # handlers may pop records
        self.hook.world = world
        try:
            with deterministic(seed), _process_caches(world):
                saved = self.contexts[self.victim]
                self.contexts[self.victim] = context
                try:
                    return super(MaliciousGrid, self)._process(msg)
                finally:
                    self.contexts[self.victim] = saved
        finally:
            self.hook.world = "victim"

    def _check(self, action: str, label: str, request: RecordDict, a: Message,
               b: Message, read_rows: bool) -> None:
        self.compared += 1
        diffs = differences(request, a, b, read_rows=read_rows)
        if not a.has_error() and not b.has_error() and any(
                k in PROTECTED for k in a.content.keys()) and read_rows:
            self.protected_replies += 1
        for what in diffs:
            if not any(d.allows(self.protocol, action, what, self.policy) for d in self.allowed):
                self.findings.append(Finding(self.protocol, action, label, what))

    def deliver(self, msg: Message) -> RecordDict:
        """A request the server makes up, answered by the victim and its twin alike."""
        from tests.malicious import Refused

        msg.metadata.__dict__["_message_id"] = msg.metadata.message_id or "forged"
        reply = self._process(msg)
        if reply.has_error():
            raise Refused(reply.error.reason)
        return reply.content

    def _process(self, msg: Message) -> Message:
        if msg.metadata.dst_node_id != self.victim:
            return super()._process(msg)
        if self.rewrite is not None:
            content = self.rewrite(msg)
            if content is not None:
                msg = self._with_content(msg, content)
        action = msg.metadata.message_type.removeprefix("query.")
        self.actions.add(action)
        seed = msg.metadata.message_id.encode()
        item = self.hook.neighbour.item if self.hook.neighbour else 0
        for label, content in variants(msg.content, item, self.n_items):
            forged = self._with_content(msg, content)
            reads = self.hook.reads
            a = self._answer(_fork(self.contexts[self.victim]), forged, "victim", seed)
            b = self._answer(_fork(self.twin), forged, "twin", seed)
            self._check(action, label, content, a, b, self.hook.reads > reads)
        split: list[tuple[str, RecordDict, Message]] = []
        if action not in self.split_actions:
            self.split_actions.add(action)
            for label, content in split_variants(msg.content):
                forged = self._with_content(msg, content)
                reads = self.hook.reads
                a = self._answer(_fork(self.contexts[self.victim]), forged, "victim", seed)
                b = self._answer(_fork(self.twin), forged, "twin", seed)
                self._check(action, f"split {label}", content, a, b, self.hook.reads > reads)
                split.append((label, content, a))
        reads = self.hook.reads
        before = _digests(self.contexts[self.victim].state)
        a = self._answer(self.contexts[self.victim], msg, "victim", seed)
        b = self._answer(self.twin, msg, "twin", seed)
        read_rows = self.hook.reads > reads
        self._check(action, "honest", msg.content, a, b, read_rows)
        for label, content, variant in split:  # the sum the server forms with the others'
            self.split_compared += 1
            if split_view_leak(msg.content, a, content, variant):
                self.findings.append(Finding(self.protocol, action, f"split {label}",
                                             "the masked input under the honest masks"))
        if not read_rows:  # key material TenSEAL drew: the twin holds the victim's
            state = self.contexts[self.victim].state
            for key, digest in _digests(state).items():
                if before.get(key) != digest:
                    self.twin.state[key] = copy_records(RecordDict({key: state[key]}))[key]
        self.log.append((msg, a))
        return a


def _digests(state: RecordDict) -> dict[str, bytes]:
    from fedrec.records import content_digest

    return {key: content_digest(RecordDict({key: state[key]})) for key in state.keys()}


_CACHES: dict[tuple[str, str, str], dict] = {}


#: Per-process caches of the node modules: LP-GCN's rows per (run, node) and the loaded
#: TenSEAL contexts. A SuperNode runs one node per process; here the victim and its twin
#: share the node id in one process, so each world gets its own (LP-GCN's rows a fresh one
#: per call, so that every call that uses the rows loads them and is seen to).
NODE_CACHES = (("clients.lpgcn", "_DATA"), ("clients.relay_node", "_CONTEXT_CACHE"),
               ("clients.fedsvd", "_SELECTION_CONTEXTS"))


@contextlib.contextmanager
def _process_caches(world: str) -> Iterator[None]:
    import importlib

    swapped = []
    for name, attr in NODE_CACHES:
        module = importlib.import_module(name)
        swapped.append((module, attr, getattr(module, attr)))
        setattr(module, attr, {} if attr == "_DATA" else
                _CACHES.setdefault((world, name, attr), {}))
    try:
        yield
    finally:
        for module, attr, value in swapped:
            setattr(module, attr, value)


def _fork(context: Context) -> Context:
    return Context(run_id=context.run_id, node_id=context.node_id,
                   node_config=dict(context.node_config), state=copy_records(context.state),
                   run_config={})


class DataHook:
    """Stands in for ``clients.node._cached_node_data``: the victim's partition
    (:attr:`partition`) gets its rows or its twin's, by :attr:`world`."""

    def __init__(self, load: Callable[..., Any], kind: str, partition: int = 0) -> None:
        self.load, self.kind, self.world, self.partition = load, kind, "victim", partition
        self.neighbour: Neighbour | None = None
        self._twin: dict[Any, Any] = {}
        self.reads = 0  # loads of the victim's rows (either world)

    def __call__(self, spec: Any, part: Any, partition_id: int) -> Any:
        data = self.load(spec, part, partition_id)
        if partition_id != self.partition:
            return data
        self.reads += 1
        key = (spec, part)
        if key not in self._twin:  # fixed at the first load, so variants know the item
            self._twin[key], self.neighbour = neighbour(data, self.kind)
        return self._twin[key] if self.world == "twin" else data
