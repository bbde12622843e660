"""SecAgg+'s wire, declared once for the server (``fedrec/transport/secagg_server.py``) and
the node (``clients/secagg_node.py``, ``clients/sums_node.py``).

The server sends the key setup (``secagg_advertise``: every node signs and publishes its mask
key, record :data:`KEYS`; ``secagg_share``: self-mask seeds, Shamir-shared to neighbours
through the sealed relay), then per sum the masked request (the sum record of
``fedrec/wire/sums.py``). A masked reply carries :data:`BOUND_KEY`, the digest of the request
answered. A sum with dropouts adds ``secagg_confirm`` (each survivor signs the split: the dropped list
and the nodes left, record :data:`CONFIRMATION`); ``secagg_unmask`` asks each survivor for the
shares and keys that remove the masks (record :data:`REVEALED`). Request fields travel in the
sum record (``SUM_KEY``).
"""

from __future__ import annotations

from enum import StrEnum


class Action(StrEnum):
    """The node actions of SecAgg+ (``message_type = "query.<action>"``)."""

    ADVERTISE = "secagg_advertise"  # key setup round 1: signed mask keys
    SHARE = "secagg_share"  # key setup round 2: self-mask seed shares, sealed to neighbours
    CONFIRM = "secagg_confirm"  # a sum with dropouts: sign the split (the dropped list)
    UNMASK = "secagg_unmask"  # reveal seed shares and dropped neighbours' pairwise keys


#: ConfigRecord in the reply to ``secagg_advertise``: ``s-pk``, the node's signed mask key,
#: and ``whole-set``, whether the node holds every member's id (a roster identity) or the
#: set's Merkle root only (so the server sends what each node checks).
KEYS = "keys"
#: ConfigRecord in the reply to ``secagg_confirm``: ``signed``, the signed split.
CONFIRMATION = "confirm"
#: ConfigRecord in the reply to ``secagg_unmask``: ``b:<owner>`` seed shares, ``k:<owner>``
#: pairwise keys of dropped neighbours.
REVEALED = "revealed"
#: Record in a masked reply: the digest of the request the node answered (public: the server
#: sent it), so the server sees at once when nodes were sent different requests.
BOUND_KEY = "secagg.bound"
