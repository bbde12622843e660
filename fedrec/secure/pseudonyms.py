"""Keyed pseudonyms and keyed masks under a secret the nodes share and the server lacks
(LP-GCN's key S, relayed by ``fedrec/secure/relay.py``).

Item pseudonyms: paper 001 encrypts item ids deterministically under S so the server can join
the nodes' item sets without reading them. A PRF serves the same purpose and every holder of
S can invert it by tabulating the catalogue: ``HMAC-SHA256(S, "lpgcn-item|<id>")`` cut to 62
bits, with bit 62 set, so a pseudonym is a positive int64 >= 2^62 and can never be mistaken
for a real item id (a test checks every integer the server receives against that).

Masks: pseudo-random rows both ends of a pair can regenerate from S (AES-256-CTR keyed by an
HMAC of S and the context, ``fedrec.secure.randomness.csprng_normal``), so a virtual holder's
cover value can be removed by the item's convolution node and never by the server.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Callable

import numpy as np

from fedrec.secure.randomness import csprng_normal

_TOP = np.int64(1) << np.int64(62)

#: How a node picks its virtual items (``lpgcn-holdings``): ``catalogue`` holds every item,
#: ``sampled`` is the paper's draw of about alpha items per user.
HOLDINGS = ("catalogue", "sampled")


def virtual_items(real: np.ndarray, n_items: int, mode: str, alpha: float, n_users: int,
                  uniform: Callable[[int], np.ndarray]) -> np.ndarray:
    """The items a node holds virtually, besides its users' ``real`` items.

    ``catalogue``: every other item. Under a sampled draw an item held by one node is
    mostly that node's real item (an item no user holds trains as centralized LightGCN
    does, with zero rows past layer 0), and items held by few nodes are mostly real; holding the whole catalogue makes every
    node's held set the same, in every run, whatever its data (the server's holder counts
    and co-holding patterns carry nothing). ``sampled``: the paper's draw, uniform among
    the other items, their number uniform in ``[0, 2 alpha n_users]`` so the held count does
    not give away the real count. ``alpha = 0``: none (the plain mode). ``uniform(n)``
    gives n private uniforms in [0, 1).
    """
    others = np.setdiff1d(np.arange(n_items), real)
    if alpha == 0:
        return others[:0]
    if mode == "catalogue":
        return others
    if mode != "sampled":
        raise ValueError(f"lpgcn-holdings must be one of {HOLDINGS}, got {mode!r}")
    top = int(round(2 * alpha * n_users))
    k = min(int(uniform(1)[0] * (top + 1)), len(others))
    return others[np.argsort(uniform(len(others)))[:k]] if k else others[:0]


def item_pseudonyms(secret: bytes, n_items: int) -> np.ndarray:
    """Pseudonyms of item ids 0..n_items-1 (int64, each >= 2^62); raises on a collision."""
    out = np.empty(n_items, dtype=np.int64)
    for i in range(n_items):
        digest = hmac.new(secret, b"lpgcn-item|%d" % i, hashlib.sha256).digest()
        out[i] = (int.from_bytes(digest[:8], "big") & ((1 << 62) - 1)) | (1 << 62)
    if len(np.unique(out)) != n_items:  # probability ~ n^2 / 2^63: never in practice
        raise ValueError("two item pseudonyms collide: run again with a fresh key")
    return out


def is_pseudonym(values: np.ndarray) -> bool:
    """True if every value has the pseudonym form (>= 2^62)."""
    return bool(np.all(np.asarray(values, dtype=np.int64) >= _TOP))


def keyed_normal(secret: bytes, context: str, shape: tuple[int, ...]) -> np.ndarray:
    """Standard normal rows that only holders of ``secret`` can regenerate for ``context``."""
    key = hmac.new(secret, b"lpgcn-mask|" + context.encode(), hashlib.sha256).digest()
    return csprng_normal(shape, key)
