"""Secure aggregation of exact sums over the Flower Message API (Bonawitz et al. 2017 with the
sparse neighbour graph of Bell et al. 2020, "SecAgg+"): the protocol, and the parts both
sides share (this module). The server side, :class:`SecureAggregator`, is
``fedrec/transport/secagg_server.py``; the node side (``clients/sums_node.py`` and the
``secagg_*`` handlers) is ``clients/secagg_node.py``.

Key setup, once per run (two synchronous rounds):

1. ``secagg_advertise``: the request names the run's node set by the Merkle root of its
   sorted ids and its size, with the node's path to its own leaf (``merkle.py``; a roster
   node also gets every id: ``clients/nodeset.py``), so no request grows linearly with the
   federation; every node makes an X25519 key pair ``s`` (pairwise mask
   agreement) and publishes the public key signed with its long-term identity
   (``fedrec/secure/identity.py``); the same round opens the sealed relay
   (``fedrec/secure/sealed.py``) if the run has none yet: a node without a mail key makes
   one and publishes it, signed too, in the same reply (no ``relay_keys`` round).
2. ``secagg_share``: the server sends each node its neighbours (each with its Merkle path to
   the index the graph gives it, :func:`neighbour_indices`) and their signed ``s`` keys; the node
   refuses any key its publisher's roster entry did not sign (a key-substituting server), and
   in a later share round any key that differs from the one it was given before. Each
   signature is verified once per run (``clients/identity_node.py``). The node
   draws a batch of independent self-mask seeds ``b_u^(t)``, one per upcoming sum t,
   Shamir-splits each among its neighbourhood (itself included) with threshold ``t_u``, and
   mails each holder its shares through the sealed relay, which delivers them with the
   holder's next request; a share that fails authentication is reported by the receiving
   node, naming the sender. When a batch runs out, the server runs this round again
   (``seed_batch`` sums per batch).

Per sum t (two rounds):

3. masked input: node u sends ``y_u = enc(x_u) + PRG(b_u^(t)) + sum_v +-PRG(k_uv^(t))`` in
   Z_2^64, where ``enc`` is fixed point with a declared range (values outside it are refused,
   never wrapped), ``k_uv^(t) = HKDF(ECDH(s_u, s_v), t)`` (+ if u < v, - otherwise): one key
   agreement per run, fresh masks for every sum (``masks.derive_sum_key``). The server adds
   masked inputs as they arrive (it never holds all of them).
4. unmasking: survivors reveal their shares of each survivor's ``b^(t)``; for a neighbour u
   that dropped, a survivor v reveals the per-sum pairwise key ``k_uv^(t)`` itself, which
   cancels exactly the dangling mask and says nothing about any other sum.

Why every input stays hidden, even from a server that shows different nodes different
survivor lists: a node answers one unmasking per sum, so it never reveals, for the same sum,
both a share of ``b_u^(t)`` and ``k_uv^(t)`` for the same peer u; it refuses sum ids that do
not increase; it reveals nothing if fewer than the threshold of its neighbourhood survive;
and it masks only with enough neighbours (:func:`masking_minimum`) that the holders asked for
its pairwise keys and those asked for its seed shares cannot both be found. The threshold and
the minimum node count are the node's own (``clients/policy.py``). A survivor's input
keeps its pairwise masks with other survivors; a node declared dropped (even if its input
arrives late) keeps its self mask. Revealed material is per sum, so no earlier or later sum
is exposed. The unmasking round itself tolerates silent nodes (see ``_unmask``). This costs
one share round per batch of sums and an unmasking round per sum, the price of tolerating
dropouts; the paper-000 setting (no dropouts) pays the same rounds.

Plain and CKKS sums have the same interface (``fedrec/wire/sums.py``); a test proves
SecAgg+ and plain sums agree.
"""

from __future__ import annotations

import hashlib
import math
import random

import numpy as np

from fedrec.secure.masks import derive_sum_key, expand_mask
from fedrec.wire.secagg import BOUND_KEY  # declared with SecAgg+'s wire
from fedrec.wire.sums import AggregationError

#: Sealed-relay purpose of a batch of self-mask seed shares (``<purpose>:<first sum>``).
SHARES_PURPOSE = "secagg-share"
#: Purpose under which nodes sign their mask-agreement keys (``fedrec/secure/identity.py``).
MASK_KEY_PURPOSE = "secagg-mask"


class SecAggError(AggregationError):
    """A secure sum cannot complete (too many dropouts, inconsistent inputs, refusal)."""


def neighbour_graph(nodes: list[int], degree: int | None, seed: int) -> dict[int, list[int]]:
    """Each node's neighbours (excluding itself): complete graph, or a random Harary graph.

    ``degree=None`` or ``degree >= n - 1`` gives the complete graph (Bonawitz et al.).
    Otherwise the sorted nodes are placed on a ring in a seeded random order
    (:func:`ring_order`) and each is joined to the ``degree // 2`` nearest on each side (Bell
    et al.'s construction; choose degree = O(log n)). The graph is public: every node learns
    its own neighbours, from its index in the sorted set alone (:func:`neighbour_indices`).
    """
    members = sorted(int(v) for v in nodes)
    return {u: [members[j] for j in neighbour_indices(len(members), i, degree, seed)]
            for i, u in enumerate(members)}


def ring_order(n: int, seed: int) -> list[int]:
    """The ring of the Harary graph: indices 0..n-1 of the sorted node set, seeded order."""
    order = list(range(n))
    random.Random(seed).shuffle(order)
    return order


def neighbour_indices(n: int, index: int, degree: int | None, seed: int,
                      order: list[int] | None = None) -> list[int]:
    """The indices (in the sorted node set of ``n``) of node ``index``'s neighbours in
    :func:`neighbour_graph`, sorted: what a node that holds only the set's Merkle root and
    its own index computes for itself (``order``: :func:`ring_order`, if already made)."""
    if degree is None or degree >= n - 1:
        return [j for j in range(n) if j != index]
    order = ring_order(n, seed) if order is None else order
    pos = order.index(index)
    half = max(1, degree // 2)
    near = {order[(pos + step) % n] for step in range(1, half + 1)} | \
        {order[(pos - step) % n] for step in range(1, half + 1)}
    return sorted(near - {index})


def threshold_for(neighbourhood_size: int, fraction: float = 0.5) -> int:
    """Shamir threshold for a neighbourhood of the given size (node included).

    Default: a strict majority, so no minority of colluding neighbours can reconstruct.
    """
    return max(1, min(neighbourhood_size, math.floor(fraction * neighbourhood_size) + 1))


def masking_minimum(neighbours: int, threshold: int) -> int:
    """The fewest neighbours a node adds pairwise masks with in one sum.

    Why: to unmask node u's input the server needs ``k_uv`` from every neighbour v u masked
    with (set M, asking them as if u dropped) and ``threshold`` shares of u's self-mask seed
    from other holders (asking them as if u survived). Each node answers one unmasking per
    sum, so the two groups are disjoint inside u's neighbourhood of ``neighbours + 1``
    holders; requiring ``|M| + threshold > neighbours + 1`` makes them impossible together,
    whatever survivor lists the server shows to whom. No extra consistency round is needed
    for this guarantee (Bonawitz et al.'s round 3 serves the same purpose when the dropped
    node's secret key, not per-sum pairwise keys, is reconstructed).
    """
    return max(0, neighbours + 2 - threshold)


def pairwise_sum_key(shared_key: bytes, sum_id: int, bound: bytes = b"") -> bytes:
    """k_uv^(t): the per-sum pairwise key (what a survivor reveals for a dropped peer).

    ``bound`` is the digest of the request the node answered (``fedrec.records.
    content_digest``): two neighbours sent different requests for sum t derive different
    keys, so their masks do not cancel and the sum is noise (model inconsistency, e.g. a
    server giving one node a model of its choice, gains nothing)."""
    return derive_sum_key(shared_key, sum_id, b"pairwise" + bytes(bound))


def self_mask(seed: bytes, sum_id: int, n: int) -> np.ndarray:
    """PRG(b_u^(t)): the self mask of one sum (the seed is used for that sum only)."""
    return expand_mask(derive_sum_key(seed, sum_id, b"self"), sum_id, n)


def agreement_context(run_tag: bytes, purpose: bytes) -> bytes:
    """HKDF context binding pairwise keys to this run and use."""
    return b"fedrec-secagg|" + run_tag + b"|" + purpose


#: Purpose under which a survivor signs the survivor set of a sum with dropouts.
SURVIVORS_PURPOSE = "secagg-survivors"
#: Wire value of ``degree`` for the complete graph.
COMPLETE_GRAPH = -1


def commitment(run_tag: bytes, set_digest: bytes, degree: int, graph_seed: int) -> str:
    """Digest of what a node commits to at key setup: the run's node set (its
    ``node_set_commitment``: Merkle root and size) and the public neighbour graph over it.
    Every node binds its signed mask key to it (:func:`mask_key_purpose`), so a neighbour
    told another set or graph refuses the key."""
    text = f"{bytes(run_tag).hex()}|{bytes(set_digest).hex()}|{int(degree)}|{int(graph_seed)}"
    return hashlib.sha256(b"fedrec-secagg-commit|v2|" + text.encode()).hexdigest()


def mask_key_purpose(commit: str) -> str:
    """The signature purpose of a mask key: bound to the signer's commitment."""
    return f"{MASK_KEY_PURPOSE}|{commit}"


def graph_degree(degree: int) -> int | None:
    """The :func:`neighbour_graph` degree of a wire value (:data:`COMPLETE_GRAPH`: None)."""
    return None if int(degree) == COMPLETE_GRAPH else int(degree)


def survivors_digest(sum_id: int, set_digest: bytes, dropped: list[int], left: int) -> bytes:
    """What a survivor of a sum with dropouts signs (32 bytes): the sum id, the run's node
    set, the nodes dropped in this sum and how many nodes the set keeps after it. With the
    committed set and the earlier signed dropouts, that fixes the survivors, so one signature
    never vouches for another split."""
    text = f"{int(sum_id)}|{bytes(set_digest).hex()}|{sorted(map(int, dropped))}|{int(left)}"
    return hashlib.sha256(b"fedrec-secagg-survivors|v2|" + text.encode()).digest()


# ----------------------------------------------------------------------------- server side


__all__ = ["BOUND_KEY", "COMPLETE_GRAPH", "MASK_KEY_PURPOSE", "SHARES_PURPOSE",
           "SURVIVORS_PURPOSE", "SecAggError", "commitment", "masking_minimum",
           "neighbour_graph", "neighbour_indices", "ring_order", "threshold_for"]
