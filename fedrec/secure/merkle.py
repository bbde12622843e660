"""A Merkle tree over a sorted node set: a 32-byte commitment to the set, and a proof of
O(log n) hashes that a node id sits at a given index of it.

Why: secure aggregation commits every node to one node set per run. A node that receives
the whole set (8 bytes a member) and every member's signature on it (about 100 bytes a
member) pays a request that grows linearly with the federation, and the round's bytes grow
with its square (issue 44: 244 KB per node at 943 nodes). With the set's Merkle root a node
commits to the same set from 32 bytes, and checks its own membership and its neighbours'
places from a few paths of ``ceil(log2 n)`` hashes each (Bell et al. 2020's polylogarithmic
SecAgg+ needs nothing more of the set).

The tree is RFC 6962's (Certificate Transparency, section 2.1): leaf and inner hashes carry
distinct prefixes (no second-preimage between a leaf and a subtree), and a level with an odd
count promotes its last hash unpaired, so the shape, and with it every path, is fixed by
``n`` alone. Leaves are ids as 9-byte signed big-endian integers (every uint64 and int64
id, as the sealed relay packs them).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

#: Bytes of one hash (SHA-256).
HASH_BYTES = 32


def leaf_hash(node_id: int) -> bytes:
    """The hash of one leaf: the id as 9 signed bytes (OverflowError beyond them)."""
    return hashlib.sha256(b"\x00" + int(node_id).to_bytes(9, "big", signed=True)).digest()


def _inner(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(b"\x01" + left + right).digest()


class MerkleTree:
    """Every level of the tree over ``leaves`` (in the order given), for the server, which
    hands out one path per node (building once: O(n) hashes; each path: O(log n))."""

    def __init__(self, leaves: Sequence[int]) -> None:
        if not leaves:
            raise ValueError("a Merkle tree needs at least one leaf")
        level = [leaf_hash(v) for v in leaves]
        self.levels: list[list[bytes]] = [level]
        while len(level) > 1:
            level = [_inner(level[i], level[i + 1]) if i + 1 < len(level) else level[i]
                     for i in range(0, len(level), 2)]
            self.levels.append(level)

    @property
    def root(self) -> bytes:
        return self.levels[-1][0]

    @property
    def size(self) -> int:
        return len(self.levels[0])

    def path(self, index: int) -> bytes:
        """The audit path of leaf ``index``: the sibling hashes bottom-up, concatenated."""
        if not 0 <= index < self.size:
            raise IndexError(f"leaf {index} of {self.size}")
        out = []
        for level in self.levels[:-1]:
            sibling = index ^ 1
            if sibling < len(level):
                out.append(level[sibling])
            index //= 2
        return b"".join(out)


def merkle_root(leaves: Sequence[int]) -> bytes:
    """The root of the tree over ``leaves`` (in the order given)."""
    return MerkleTree(leaves).root


def verify_path(root: bytes, size: int, index: int, node_id: int, path: bytes) -> bool:
    """Whether ``node_id`` is leaf ``index`` of the ``size``-leaf tree with ``root``, by its
    audit ``path`` (:meth:`MerkleTree.path`). A path of the wrong length, an index outside
    the tree or a size below 1 is False, never an exception."""
    if size < 1 or not 0 <= index < size or len(path) % HASH_BYTES:
        return False
    try:
        digest = leaf_hash(node_id)
    except OverflowError:
        return False
    used = 0
    while size > 1:
        if index % 2 == 1 or index + 1 < size:  # this level pairs the hash with a sibling
            sibling = path[used:used + HASH_BYTES]
            if len(sibling) != HASH_BYTES:
                return False
            used += HASH_BYTES
            digest = _inner(sibling, digest) if index % 2 else _inner(digest, sibling)
        index //= 2
        size = (size + 1) // 2
    return used == len(path) and digest == bytes(root)


__all__ = ["HASH_BYTES", "MerkleTree", "leaf_hash", "merkle_root", "verify_path"]
