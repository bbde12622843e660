"""Secure aggregation of exact sums over the Flower Message API (Bonawitz et al. 2017 with the
sparse neighbour graph of Bell et al. 2020, "SecAgg+"). Shared by the server side
(:class:`SecureAggregator`) and the client side (:func:`masked_reply` and the ``secagg_*``
handlers in ``clients/secagg.py``).

Key setup, once per run (two synchronous rounds):

1. ``secagg_advertise``: every node makes two X25519 key pairs, ``c`` (to seal shares to a
   neighbour) and ``s`` (pairwise mask agreement), and publishes both public keys.
2. ``secagg_share``: the server sends each node its neighbours' public keys. The node draws a
   batch of independent self-mask seeds ``b_u^(t)``, one per upcoming sum t, Shamir-splits
   each among its neighbourhood (itself included) with threshold ``t_u``, and returns each
   holder's shares sealed (AES-GCM) under the ``c``-agreement key with that holder. The server
   relays them with the next request; a share that fails authentication is reported by the
   receiving node, naming the sender. When a batch runs out, the server runs this round
   again (``secagg-seed-batch`` sums per batch).

Per sum t (two rounds):

3. masked input: node u sends ``y_u = enc(x_u) + PRG(b_u^(t)) + sum_v +-PRG(k_uv^(t))`` in
   Z_2^64, where ``enc`` is fixed point with a declared range (values outside it are refused,
   never wrapped), ``k_uv^(t) = HKDF(ECDH(s_u, s_v), t)`` (+ if u < v, - otherwise): one key
   agreement per run, fresh masks for every sum (``masks.derive_sum_key``). The server adds
   masked inputs as they arrive (it never holds all of them).
4. unmasking: survivors reveal their shares of each survivor's ``b^(t)``; for a neighbour u
   that dropped, a survivor v reveals the per-sum pairwise key ``k_uv^(t)`` itself, which
   cancels exactly the dangling mask and says nothing about any other sum.

Why every input stays hidden: a node never reveals, for the same sum, both a share of
``b_u^(t)`` and ``k_uv^(t)`` for the same peer u, refuses sum ids that do not increase, and
reveals nothing if fewer than the threshold of its neighbourhood survive. A survivor's input
keeps its pairwise masks with other survivors; a node declared dropped (even if its input
arrives late) keeps its self mask. Revealed material is per sum, so no earlier or later sum
is exposed. This costs one share round per batch of sums and an unmasking round per sum,
the price of tolerating dropouts; the paper-000 setting (no dropouts) pays the same rounds.

``mode="none"`` is a labelled plain-sum mode with the same interface (nodes send float64
arrays in clear) for full-scale accuracy runs; a test proves both modes give the same sums.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np
from flwr.app import ConfigRecord, RecordDict

from fl_app.messaging import Messenger
from fl_app.records import to_array_record
from fl_app.secure.fixedpoint import FixedPoint
from fl_app.secure.keys import combine_secret
from fl_app.secure.masks import derive_sum_key, expand_mask

MODES = ("secagg+", "none")
#: Precisions plain-mode (``none``) replies may travel in.
WIRE_DTYPES = ("float64", "float32")
#: RecordDict keys used by the secure-sum layer inside protocol messages.
SECAGG_KEY = "secagg"  # ConfigRecord: mode, sum id, fixed-point parameters
SHARES_KEY = "secagg.shares"  # ConfigRecord: sealed shares relayed to this node (sender -> blob)
VALUES_KEY = "secagg.values"  # ArrayRecord in replies: masked (or plain) values
SHAPES_KEY = "secagg.shapes"  # ConfigRecord in replies: name -> shape, in order


class SecAggError(RuntimeError):
    """A secure sum cannot complete (too many dropouts, inconsistent inputs, refusal)."""


def neighbour_graph(nodes: list[int], degree: int | None, seed: int) -> dict[int, list[int]]:
    """Each node's neighbours (excluding itself): complete graph, or a random Harary graph.

    ``degree=None`` or ``degree >= n - 1`` gives the complete graph (Bonawitz et al.).
    Otherwise nodes are placed on a ring in a seeded random order and each is joined to the
    ``degree // 2`` nearest on each side (Bell et al.'s construction; choose
    degree = O(log n)). The graph is public: every node learns its own neighbours.
    """
    n = len(nodes)
    if degree is None or degree >= n - 1:
        return {u: [v for v in nodes if v != u] for u in nodes}
    half = max(1, degree // 2)
    order = list(nodes)
    random.Random(seed).shuffle(order)
    graph: dict[int, set[int]] = {u: set() for u in nodes}
    for pos, u in enumerate(order):
        for step in range(1, half + 1):
            v = order[(pos + step) % n]
            graph[u].add(v)
            graph[v].add(u)
    return {u: sorted(vs) for u, vs in graph.items()}


def threshold_for(neighbourhood_size: int, fraction: float = 0.5) -> int:
    """Shamir threshold for a neighbourhood of the given size (node included).

    Default: a strict majority, so no minority of colluding neighbours can reconstruct.
    """
    return max(1, min(neighbourhood_size, math.floor(fraction * neighbourhood_size) + 1))


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


def pairwise_sum_key(shared_key: bytes, sum_id: int) -> bytes:
    """k_uv^(t): the per-sum pairwise key (what a survivor reveals for a dropped peer)."""
    return derive_sum_key(shared_key, sum_id, b"pairwise")


def self_mask(seed: bytes, sum_id: int, n: int) -> np.ndarray:
    """PRG(b_u^(t)): the self mask of one sum (the seed is used for that sum only)."""
    return expand_mask(derive_sum_key(seed, sum_id, b"self"), sum_id, n)


def agreement_context(run_tag: bytes, purpose: bytes) -> bytes:
    """HKDF context binding pairwise keys to this run and use."""
    return b"fedrec-secagg|" + run_tag + b"|" + purpose


# ----------------------------------------------------------------------------- server side
@dataclass
class _PeerInfo:
    c_pk: bytes
    s_pk: bytes


@dataclass
class SecureAggregator:
    """Server side of secure sums for one run: key setup once, then any number of sums.

    Use :meth:`sum` in place of a plain request/reply whenever the replies must only be
    learned as a total. Parameters: ``mode`` (``"secagg+"`` or ``"none"``), ``degree`` of
    the neighbour graph (None = complete), ``threshold_fraction`` of each neighbourhood
    needed to unmask, ``seed`` for the (public) graph.

    ``drop`` and ``tamper`` simulate an adversarial or unlucky network for tests: ``drop``
    is a set of node ids whose masked inputs the server discards (as if they never arrived);
    ``tamper(sender, receiver, blob) -> blob`` can alter relayed shares.
    """

    messenger: Messenger
    nodes: list[int]
    mode: str = "secagg+"
    degree: int | None = None
    threshold_fraction: float = 0.5
    seed: int = 0
    seed_batch: int = 16
    drop: set[int] = field(default_factory=set)
    tamper: Callable[[int, int, bytes], bytes] | None = None
    # state
    graph: dict[int, list[int]] = field(default_factory=dict, init=False)
    thresholds: dict[int, int] = field(default_factory=dict, init=False)
    peers: dict[int, _PeerInfo] = field(default_factory=dict, init=False)
    alive: set[int] = field(default_factory=set, init=False)
    pending_shares: dict[int, dict[str, bytes]] = field(default_factory=dict, init=False)
    sum_id: int = field(default=0, init=False)
    seeds_until: int = field(default=0, init=False)
    run_tag: bytes = field(default=b"", init=False)

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"secagg mode must be one of {MODES}, got {self.mode!r}")
        self.nodes = sorted(self.nodes)
        self.alive = set(self.nodes)

    # -- setup ----------------------------------------------------------------------------
    def setup(self) -> None:
        """Key setup: advertise keys, then share the first batch of self-mask seeds."""
        if self.mode == "none":
            return
        self.run_tag = f"{self.seed}:{','.join(map(str, self.nodes))}".encode()
        self.graph = neighbour_graph(self.nodes, self.degree, self.seed)
        self.thresholds = {u: threshold_for(len(vs) + 1, self.threshold_fraction)
                           for u, vs in self.graph.items()}
        replies = self.messenger.broadcast(
            "secagg_advertise",
            RecordDict({SECAGG_KEY: ConfigRecord({"run-tag": self.run_tag})}),
            self.nodes, phase="secagg_setup",
        )
        for node, reply in replies.items():
            keys = reply.config_records["keys"]
            self.peers[node] = _PeerInfo(bytes(keys["c-pk"]), bytes(keys["s-pk"]))
        self._share_seeds(first_sum=1)

    def _share_seeds(self, first_sum: int) -> None:
        """One ``secagg_share`` round: seeds for sums [first_sum, first_sum + batch)."""
        requests = {}
        for u in sorted(self.alive):
            neighbours = self.graph[u]
            requests[u] = RecordDict({SECAGG_KEY: ConfigRecord({
                "threshold": self.thresholds[u],
                "neighbours": [int(v) for v in neighbours],
                "c-pks": [self.peers[v].c_pk for v in neighbours],
                "s-pks": [self.peers[v].s_pk for v in neighbours],
                "first-sum": first_sum,
                "batch": self.seed_batch,
            })})
        replies = self.messenger.send("secagg_share", requests, phase="secagg_setup")
        for u, reply in replies.items():
            for receiver, blob in reply.config_records["shares"].items():
                blob = bytes(blob)
                if self.tamper is not None:
                    blob = self.tamper(u, int(receiver), blob)
                self.pending_shares.setdefault(int(receiver), {})[f"{first_sum}:{u}"] = blob
        self.seeds_until = first_sum + self.seed_batch - 1

    # -- one sum --------------------------------------------------------------------------
    def sum(self, action: str, content: RecordDict | Mapping[int, RecordDict], *,
            max_abs: float, phase: str | None = None,
            on_reply: Callable[[int, RecordDict], None] | None = None,
            wire_dtype: str = "float64") -> dict[str, np.ndarray]:
        """Send ``action`` to every live node; return the element-wise sums of their replies.

        ``content`` is one RecordDict for all nodes or one per node. Each node's handler
        answers through :func:`masked_reply`; ``max_abs`` declares the range of every value
        a node sends (fixed-point encoding refuses values outside it). ``on_reply`` sees each
        reply as it arrives (tests use it to record the server's view). ``wire_dtype``
        ("float64" or "float32") is the precision plain-mode replies travel in (the server
        still sums in float64); masked replies are always 64-bit ring elements.
        """
        if wire_dtype not in WIRE_DTYPES:
            raise ValueError(f"wire_dtype must be one of {WIRE_DTYPES}, got {wire_dtype!r}")
        self.sum_id += 1
        if self.mode != "none" and self.sum_id > self.seeds_until:
            self._share_seeds(first_sum=self.sum_id)
        nodes = sorted(self.alive)
        if not nodes:
            raise SecAggError("no live nodes left to aggregate")
        codec = None
        cfg: dict = {"mode": self.mode, "sum-id": self.sum_id, "wire-dtype": wire_dtype}
        if self.mode != "none":
            codec = FixedPoint.for_sum(max_abs, len(nodes))
            cfg.update({"frac-bits": codec.frac_bits, "max-abs": float(max_abs)})
        requests = {}
        for u in nodes:
            base = content if isinstance(content, RecordDict) else content[u]
            req = RecordDict(dict(base.items()))
            node_cfg = dict(cfg)
            if self.mode != "none":
                node_cfg["alive"] = [int(v) for v in self.graph[u] if v in self.alive]
            req[SECAGG_KEY] = ConfigRecord(node_cfg)
            if self.pending_shares.get(u):
                req[SHARES_KEY] = ConfigRecord(self.pending_shares.pop(u))
            requests[u] = req
        total: np.ndarray | None = None
        layout: list | None = None
        arrived: list[int] = []
        for node, reply in self.messenger.iter_replies(action, requests, phase=phase or action,
                                                       allow_missing=self.mode != "none"):
            if node in self.drop:
                continue
            shapes = [(k, tuple(v)) for k, v in reply.config_records[SHAPES_KEY].items()]
            values = reply.array_records[VALUES_KEY]["v"].numpy()
            if layout is None:
                layout = shapes
            elif shapes != layout:
                raise SecAggError(f"{self.messenger.label(node)} sent arrays {shapes}, "
                                  f"others sent {layout}")
            if total is None:
                total = values.astype(np.float64 if self.mode == "none" else values.dtype)
            else:
                total += values  # in place: one running total, whatever the node count
            arrived.append(node)
            if on_reply is not None:
                on_reply(node, reply)
        if total is None or layout is None:
            raise SecAggError(f"no node answered '{action}'")
        if self.mode == "none":
            return unflatten(total, layout)
        dropped = set(nodes) - set(arrived)
        total = self._unmask(total, set(arrived), dropped, phase or action)
        return unflatten(codec.decode(total), layout)

    def _unmask(self, total: np.ndarray, survivors: set[int], dropped: set[int],
                phase: str) -> np.ndarray:
        """Remove survivors' self masks and the masks survivors shared with dropped nodes."""
        askers = sorted(survivors)
        req = RecordDict({SECAGG_KEY: ConfigRecord({
            "sum-id": self.sum_id, "survivors": askers, "dropped": sorted(dropped),
        })})
        replies = self.messenger.broadcast("secagg_unmask", req, askers,
                                           phase=f"{phase}:unmask")
        b_shares: dict[int, list[bytes]] = {u: [] for u in survivors}
        n = total.shape[0]
        for v, reply in replies.items():
            for key, value in reply.config_records["revealed"].items():
                kind, _, owner_str = key.partition(":")
                owner = int(owner_str)
                if kind == "b" and owner in b_shares:
                    b_shares[owner].append(bytes(value))
                elif kind == "k" and owner in dropped:
                    # v added PRG(k_vu) if v < owner, subtracted it otherwise; cancel that.
                    mask = expand_mask(bytes(value), self.sum_id, n)
                    if v < owner:
                        total -= mask
                    else:
                        total += mask
        for u, shares in b_shares.items():
            seed = self._combine(u, shares, "self-mask seed")
            total -= self_mask(seed, self.sum_id, n)
        self.alive -= dropped
        return total

    def _combine(self, owner: int, shares: list[bytes], what: str) -> bytes:
        t = self.thresholds[owner]
        if len(shares) < t:
            raise SecAggError(
                f"cannot unmask: {len(shares)} share(s) of the {what} of "
                f"{self.messenger.label(owner)} survived, threshold is {t}; the sum is "
                "abandoned and nothing about any input is revealed"
            )
        return combine_secret(shares[:t])


def make_aggregator(messenger: Messenger, nodes: Iterable[int], mode: str, *,
                    degree: int | None = None, seed: int = 0) -> SecureAggregator:
    """A ready SecureAggregator (setup done) for ``nodes``."""
    agg = SecureAggregator(messenger, sorted(nodes), mode=mode, degree=degree, seed=seed)
    agg.setup()
    return agg


# ----------------------------------------------------------------------------- client side
def masked_reply(request: RecordDict, state: RecordDict, my_id: int,
                 arrays: Mapping[str, np.ndarray],
                 extra: Mapping[str, ConfigRecord] | None = None) -> RecordDict:
    """A node's reply to a secure-sum request: its arrays, masked (or in clear in plain mode).

    ``extra`` records travel in clear beside the values (only for what the protocol already
    reveals, e.g. a public count).
    """
    from clients.secagg import mask_values  # client-side state handling lives there

    cfg = request.config_records[SECAGG_KEY]
    vec, layout = flatten(arrays)
    if cfg["mode"] == "none":
        values = vec.astype(str(cfg.get("wire-dtype", "float64")), copy=False)
    else:  # fixed-point encoding needs float64 precision
        values = mask_values(request, state, my_id, vec.astype(np.float64, copy=False))
    reply = RecordDict({
        VALUES_KEY: to_array_record({"v": values}),
        SHAPES_KEY: ConfigRecord({name: list(shape) for name, shape in layout}),
    })
    for key, record in (extra or {}).items():
        reply[key] = record
    return reply


__all__ = [
    "MODES", "SecAggError", "SecureAggregator", "make_aggregator", "masked_reply",
    "neighbour_graph", "threshold_for", "flatten", "unflatten",
]
