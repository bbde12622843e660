"""One interface for "sum these named arrays over these nodes", three ways to do it.

Every protocol asks for sums through an :class:`Aggregator` and never learns how it was
formed; the run config's ``aggregator`` key picks the implementation
(``fedrec.transport.aggregators.make_aggregator``):

- ``secagg+`` (:class:`fedrec.secure.secagg.SecureAggregator`): masked fixed-point sums,
  exact, dropout-tolerant; the server learns only the total.
- ``plain`` (:class:`PlainAggregator`): labelled clear sums for full-scale accuracy runs. The
  server adds replies in the fixed node order it was given (partition order), whatever order
  they arrive in, so float64 results are bit-identical from run to run.
- ``ckks`` (:class:`CkksAggregator`): nodes encrypt under a CKKS context one node created and
  relayed sealed to the others; the server adds ciphertexts with the public context only and
  never holds the secret key; decryption is a separate step (:meth:`CkksAggregator.decrypt`)
  by one decrypter node, as in PrivMVMF (paper 004). Each node signs a hash of its
  ciphertexts (:func:`contribution_digest`); the decrypter receives every signed
  contribution, checks the signatures against its roster, requires at least its policy's
  ``min-survivors`` distinct nodes, adds them itself and decrypts only that sum, so it is not
  a decryption oracle for the server. Every node signs the run's node set at setup and
  checks every member's signature on it before it encrypts or decrypts
  (``clients/nodeset.py``), so no two nodes are shown different sets.

A sum request carries a ``secagg`` ConfigRecord (mode, sum id, declared range); a node
answers with ``clients.sums_node.sum_reply``. What each sum showed the server is recorded in
:attr:`Aggregator.view` for the results' ``privacy`` section.
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np
from flwr.app import ConfigRecord, RecordDict

from fedrec.transport.messenger import Messenger
from fedrec.wire.message import Message, WireError
from fedrec.wire.sums import (
    CIPHER_KEY,
    CKKS_PURPOSE,
    CLIPPED_KEY,
    CONTRIB_KEY,
    NODESET_SIGNED_KEY,
    SIGNED_KEY,
    VALUES_KEY,
    WIRE_DTYPES,
    AggregationError,
    CkksContribution,
    CkksSum,
    DecryptRequest,
    NodeSetRequest,
    PlainSum,
    SumRequest,
    layout_of,
    layout_size,
    node_set_signature,
    reply_values,
    unflatten,
)

T = TypeVar("T")
M = TypeVar("M", bound=Message)
Reply = Callable[[int, RecordDict], None]


def read_reply(cls: type[M], reply: RecordDict, label: str,
               error: type[Exception] = AggregationError) -> M:
    """A node's reply read as ``cls``, every field checked; a reply that does not match is
    ``error`` naming the node and the field (the caller's error type, as before typing)."""
    try:
        return cls.from_records(reply, label)
    except WireError as exc:
        raise error(str(exc)) from None


@dataclass
class SumRecord:
    """What the server received for one sum: for the results' ``privacy`` section."""

    phase: str
    action: str
    aggregator: str
    form: str  # "masked" | "plain" | "encrypted"
    arrays: dict[str, list[int]]
    nodes: int
    dropped: list[int] = field(default_factory=list)
    members: list[int] = field(default_factory=list)  # node ids whose inputs the sum holds


def in_node_order(replies: Iterable[tuple[int, T]], order: Sequence[int]) -> Iterator[tuple[int, T]]:
    """Yield ``(node, reply)`` in ``order`` whatever order they arrive in.

    Only replies that arrive ahead of their turn are held; when replies come in order, one
    is held at a time. Nodes missing from ``replies`` are skipped at the end (the caller
    decides whether that is an error).
    """
    position = {node: i for i, node in enumerate(order)}
    early: dict[int, T] = {}
    nxt = 0
    for node, reply in replies:
        early[position[node]] = (node, reply)  # type: ignore[assignment]
        while nxt in early:
            yield early.pop(nxt)  # type: ignore[misc]
            nxt += 1
    for i in sorted(early):
        yield early[i]  # type: ignore[misc]




class Aggregator(ABC):
    """Sums of named arrays over a fixed, ordered set of nodes.

    ``nodes`` is the order reductions run in (the strategies pass partition order).
    :meth:`setup` runs the one-off rounds the implementation needs (keys, contexts);
    :meth:`sum` sends ``action`` to every node and returns ``{name: total}``.
    """

    kind: str = ""
    form: str = ""  # what the server sees of one node's reply

    def __init__(self, messenger: Messenger, nodes: Sequence[int]) -> None:
        if not nodes:
            raise ValueError("an aggregator needs at least one node")
        self.messenger = messenger
        self.nodes = list(nodes)
        self.sum_id = 0
        self.view: list[SumRecord] = []
        #: A protocol whose paper forbids sums over different node sets (PriviRec) sets this:
        #: a dropout then abandons the sum before anything is unmasked or decrypted.
        self.fixed_set = False
        messenger.report.add_aggregator(self)  # the run's results list every sum it saw

    def setup(self) -> None:
        """One-off rounds before the first sum (none for plain sums)."""

    @abstractmethod
    def sum(self, action: str, content: RecordDict | Mapping[int, RecordDict], *,
            max_abs: float, phase: str | None = None, on_reply: Reply | None = None,
            wire_dtype: str = "float64") -> dict[str, np.ndarray]:
        """Send ``action`` to every node; return the element-wise sums of their arrays.

        ``content`` is one RecordDict for all nodes or one per node. Each node's handler
        answers through ``clients.sums_node.sum_reply``; ``max_abs`` declares the range of
        every value a node sends (nodes refuse values outside it where the encoding needs a
        range). ``on_reply`` sees each reply as it arrives (tests record the server's view).
        ``wire_dtype`` is the precision plain replies travel in.
        """

    def _requests(self, content: RecordDict | Mapping[int, RecordDict], nodes: Iterable[int],
                  cfg: Mapping[str, Any]) -> dict[int, RecordDict]:
        """Each node's request: the protocol's ``content`` with the sum record's fields
        ``cfg`` (a :class:`~fedrec.wire.sums.SumRequest`'s ``to_config()``, by wire name: a
        test's deviating server rewrites them here)."""
        out = {}
        for u in nodes:
            base = content if isinstance(content, RecordDict) else content[u]
            req = RecordDict(dict(base.items()))
            req[SumRequest.CONFIG] = ConfigRecord(dict(cfg))
            out[u] = req
        return out

    def _ordered_replies(self, action: str, requests: dict[int, RecordDict], phase: str,
                         on_reply: Reply | None) -> Iterator[tuple[int, RecordDict]]:
        """The replies in node order, each checked to declare the same array layout as the
        first (kept in :attr:`_layout`); raises if no node answered."""
        self._layout: list[tuple[str, tuple]] | None = None
        label = self.messenger.label
        replies = self.messenger.iter_replies(action, requests, phase=phase)
        for node, reply in in_node_order(replies, self.nodes):
            shapes = layout_of(reply, label(node))
            if self._layout is None:
                self._layout = shapes
            elif shapes != self._layout:
                raise AggregationError(f"{label(node)} sent arrays {shapes}, others "
                                       f"{self._layout}")
            yield node, reply
            if on_reply is not None:
                on_reply(node, reply)
        if self._layout is None:
            raise AggregationError(f"no node answered '{action}'")

    def _checked(self, sums: dict[str, np.ndarray], phase: str,
                 max_abs: float) -> dict[str, np.ndarray]:
        """``sums`` without :data:`CLIPPED_KEY`; an error if any node had to clip (the sum is
        then not the protocol's: its declared range is too small)."""
        flag = sums.pop(CLIPPED_KEY, None)
        clipped = 0 if flag is None else int(round(float(np.ravel(flag)[0]) / max_abs))
        if clipped > 0:
            raise AggregationError(
                f"'{phase}': {clipped} node(s) had values outside the declared range "
                f"max_abs={max_abs:g} and clipped them, so the sum is not exact; the protocol "
                "must declare a larger range (nodes report only whether they clipped, inside "
                "the sum)")
        return sums

    def record_sum(self, phase: str, action: str, layout: list[tuple[str, tuple]], nodes: int,
                   dropped: Iterable[int] = (), members: Iterable[int] | None = None,
                   form: str | None = None) -> None:
        """List one sum in the run report: what the server received for it. :meth:`sum`
        records its own; a protocol that reduces replies itself (a sparse plain sum) records
        its sum here, so the results still list it."""
        members = sorted(self.nodes if members is None else members)
        self.view.append(SumRecord(phase, action, self.kind, form or self.form,
                                   {n: list(s) for n, s in layout}, nodes, sorted(dropped),
                                   members))


class PlainAggregator(Aggregator):
    """Labelled plain sums in a fixed node order (bit-identical whatever the arrival order)."""

    kind = "plain"
    form = "plain"

    def sum(self, action: str, content: RecordDict | Mapping[int, RecordDict], *,
            max_abs: float, phase: str | None = None, on_reply: Reply | None = None,
            wire_dtype: str = "float64") -> dict[str, np.ndarray]:
        if wire_dtype not in WIRE_DTYPES:
            raise ValueError(f"wire_dtype must be one of {WIRE_DTYPES}, got {wire_dtype!r}")
        self.sum_id += 1
        phase = phase or action
        requests = self._requests(content, self.nodes,
                                  PlainSum(sum_id=self.sum_id, wire_dtype=wire_dtype).to_config())
        total: np.ndarray | None = None
        for node, reply in self._ordered_replies(action, requests, phase, on_reply):
            assert self._layout is not None
            values = reply_values(reply, self.messenger.label(node), self._layout,
                                  (wire_dtype,))
            if total is None:
                total = values.astype(np.float64)
            else:
                total += values
        assert total is not None and self._layout is not None
        self.record_sum(phase, action, self._layout, len(self.nodes))
        return unflatten(total, self._layout)


class CkksAggregator(Aggregator):
    """CKKS sums: the server adds ciphertexts; one decrypter node opens the total.

    :meth:`setup` has one node create a CKKS secret context and relay it sealed to the other
    nodes (``fedrec.secure.relay.relay_secret``); the server keeps only the public context.
    The decrypter is drawn from the nodes with ``seed``. Accuracy: CKKS scale 2^40 gives
    about 1e-7 absolute error on sums of values of order 1 (``fedrec/secure/he.py``).

    No decryption oracle: every reply carries the node's Ed25519 signature over
    :func:`contribution_digest` (sum id, ciphertexts; the signed statement binds run and node
    id too). The server keeps each node's ciphertexts of the latest sums and
    :meth:`decrypt` sends them all, with their signatures, to the decrypter, which verifies
    each against its roster, refuses fewer than its policy's ``min-survivors`` distinct
    partitions (so never a single node's ciphertext), adds them itself and opens that sum,
    once per sum id. Cost: the decrypter downloads every contribution (n x the ciphertext
    size per sum) and does n signature checks and n - 1 additions; the server holds the
    contributions of a sum until its decryption (docs/secure-aggregation.md).
    """

    kind = "ckks"
    form = "encrypted"

    def __init__(self, messenger: Messenger, nodes: Sequence[int], *, seed: int = 0) -> None:
        super().__init__(messenger, nodes)
        self.seed = seed
        self.public_context: bytes | None = None
        self.decrypter = random.Random(seed).choice(self.nodes)
        self.slots = 0  # CKKS slots per ciphertext (from the public context, at setup)
        self._max_abs = 1.0  # declared range of the latest sum (its clip flag's unit)
        #: sum id -> node -> (ciphertext chunks, signed digest) of the latest sum, kept
        #: until its decryption
        self.contributions: dict[int, dict[int, tuple[list[bytes], bytes]]] = {}
        #: node id -> its signature on the run's node set (made at :meth:`setup`)
        self.node_set_signatures: dict[str, bytes] = {}

    def setup(self) -> None:
        from fedrec.transport.relay_server import relay_secret

        result = relay_secret(self.messenger, self.nodes, purpose=CKKS_PURPOSE,
                              seed=self.seed, make="ckks-context")
        self.public_context = result.public_context
        if self.public_context is None:
            raise AggregationError("the CKKS context relay returned no public context")
        from fedrec.secure.he import load_context, slots_of

        self.slots = slots_of(load_context(self.public_context))
        # every node commits to the run's node set and signs it; each sum and decrypt request
        # carries all the signatures, which each node checks before it encrypts or decrypts
        # (clients/nodeset.py), so no two nodes are shown different sets
        request = NodeSetRequest(members=sorted(self.nodes))
        replies = self.messenger.broadcast(request.ACTION, request.to_records(), self.nodes,
                                           phase="ckks:node-set")
        self.node_set_signatures = {
            str(node): node_set_signature(reply, self.messenger.label(node))
            for node, reply in replies.items()}

    def sum_encrypted(self, action: str, content: RecordDict | Mapping[int, RecordDict], *,
                      max_abs: float, phase: str | None = None,
                      on_reply: Reply | None = None) -> tuple[list[bytes], list[tuple[str, tuple]]]:
        """The encrypted total (packed CKKS chunks) and its layout; nothing is decrypted."""
        from fedrec.secure.he import EncryptedSum

        if self.public_context is None:
            raise AggregationError("CkksAggregator.setup() must run before the first sum")
        self.sum_id += 1
        phase = phase or action
        requests = self._requests(content, self.nodes, CkksSum(
            sum_id=self.sum_id, max_abs=float(max_abs), purpose=CKKS_PURPOSE).to_config())
        for req in requests.values():
            req[NODESET_SIGNED_KEY] = ConfigRecord(dict(self.node_set_signatures))
        total = EncryptedSum(self.public_context, "ckks")
        self.contributions = {self.sum_id: {}}  # only the latest sum is ever decrypted
        self._max_abs = float(max_abs)
        for node, reply in self._ordered_replies(action, requests, phase, on_reply):
            label = self.messenger.label(node)
            if CIPHER_KEY not in reply.config_records:
                raise AggregationError(f"{label} answered a CKKS sum without record "
                                       f"'{CIPHER_KEY}'")
            contribution = read_reply(CkksContribution, reply, label)
            chunks, signed = contribution.chunks, contribution.signed_digest
            assert self._layout is not None
            want = -(-layout_size(self._layout) // self.slots)
            if len(chunks) != want:
                raise AggregationError(f"{label}: field '{CIPHER_KEY}.chunks' has {len(chunks)} "
                                       f"ciphertext(s); its declared arrays "
                                       f"{dict(self._layout)} need {want} of {self.slots} "
                                       "slots")
            self.contributions.setdefault(self.sum_id, {})[node] = (
                [bytes(b) for b in chunks], signed)
            try:
                total.add([bytes(b) for b in chunks])
            except Exception as exc:  # noqa: BLE001  (TenSEAL raises assorted types)
                raise AggregationError(f"{label}: field '{CIPHER_KEY}.chunks' holds no valid "
                                       f"CKKS ciphertexts of this context "
                                       f"({type(exc).__name__})") from None
        assert self._layout is not None
        self.record_sum(phase, action, self._layout, len(self.nodes))
        self.messenger.ledger.mark(phase, CIPHER_KEY, "encrypted")
        return total.result(), self._layout

    def decrypt(self, chunks: list[bytes], layout: list[tuple[str, tuple]], *,
                phase: str) -> dict[str, np.ndarray]:
        """The explicit decryption step: the decrypter node opens the latest sum.

        ``chunks`` (the server's encrypted total) does not travel: the decrypter recomputes
        the sum from the signed contributions it is sent (class docstring).
        """
        n = sum(int(np.prod(s)) if s else 1 for _, s in layout)
        contributions = self.contributions.pop(self.sum_id, {})
        request = DecryptRequest(sum_id=self.sum_id, n=n, purpose=CKKS_PURPOSE)
        req = request.to_records()
        req.update(RecordDict({  # keyed by node id: every contribution, signed
            CONTRIB_KEY: ConfigRecord({str(u): c for u, (c, _) in contributions.items()}),
            SIGNED_KEY: ConfigRecord({str(u): sig for u, (_, sig) in contributions.items()}),
            NODESET_SIGNED_KEY: ConfigRecord(dict(self.node_set_signatures))}))
        reply = self.messenger.send(request.ACTION, {self.decrypter: req},
                                    phase=f"{phase}:decrypt")[self.decrypter]
        self.messenger.ledger.mark(f"{phase}:decrypt", VALUES_KEY, "decrypted sum")
        values = reply_values(reply, self.messenger.label(self.decrypter), layout, ("float64",))
        return self._checked(unflatten(values, layout), phase, self._max_abs)

    def sum(self, action: str, content: RecordDict | Mapping[int, RecordDict], *,
            max_abs: float, phase: str | None = None, on_reply: Reply | None = None,
            wire_dtype: str = "float64") -> dict[str, np.ndarray]:
        phase = phase or action
        chunks, layout = self.sum_encrypted(action, content, max_abs=max_abs, phase=phase,
                                            on_reply=on_reply)
        return self.decrypt(chunks, layout, phase=phase)
