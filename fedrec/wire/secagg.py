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

from fedrec.wire.message import Message, derived, message, per_round, reply
from fedrec.wire.sums import SUM_KEY, RangedSum


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


# -- the records as typed messages (fedrec/wire/message.py) ---------------------------------
# Nothing is pinned for the run: a node's own records (its committed node set, spent sum
# ids, the mask keys it verified) refuse a changed key setup or sum, naming what changed.
@message(Action.ADVERTISE)
class AdvertiseRequest(Message):
    """Key setup round 1 (record ``secagg``): the node set as its Merkle root and size with
    this node's leaf and path, the graph's degree and seed; ``members`` only for a node
    that checks the whole set (``clients/nodeset.py`` ``needs_whole_set``)."""

    CONFIG = SUM_KEY

    run_tag: bytes = per_round(doc="binds the run's keys (the server's SHA-256 digest)")
    members_root: bytes = per_round(doc="Merkle root of the sorted node set")
    members_count: int = per_round(doc="the node set's size")
    member_index: int = per_round(doc="this node's leaf in the sorted set")
    member_path: bytes = per_round(doc="this node's Merkle audit path")
    degree: int = per_round(doc="the neighbour graph's degree (COMPLETE_GRAPH: complete)")
    graph_seed: int = per_round(doc="the (public) neighbour graph's seed")
    members: list[int] | None = per_round(None, doc="every member's id (roster nodes)")


@message()
class MaskKey(Message):
    """The reply to ``secagg_advertise`` (record :data:`KEYS`)."""

    CONFIG = KEYS

    s_pk: bytes = reply(doc="the node's mask key, signed with its identity")
    whole_set: bool = reply(True, doc="whether the node checks every member's id")


@message(Action.SHARE)
class ShareRequest(Message):
    """Key setup round 2 (record ``secagg``): this node's neighbours with their Merkle paths
    and signed mask keys, and the sums [first-sum, first-sum + batch) to draw seeds for."""

    CONFIG = SUM_KEY

    threshold: int = per_round(doc="shares to unmask (the node never takes less than its own)")
    neighbours: list[int] = derived(doc="checked against the committed set's graph")
    neighbour_paths: list[bytes] | None = per_round(None, doc="their Merkle paths")
    s_pks: list[bytes] = per_round(doc="the neighbours' signed mask keys, in their order")
    first_sum: int = per_round()
    batch: int = per_round()


@message()
class MaskedSum(RangedSum):
    """A SecAgg+ sum's ``secagg`` record: the node derives the fractional bits and its live
    neighbours itself and refuses others (``clients/secagg_node.py`` ``begin_masked_sum``).
    ``alive`` differs per node by design (``PER_NODE_SUM_FIELDS``)."""

    mode: str = per_round("secagg+", choices=("secagg+",))
    sum_id: int = per_round(doc="increasing over the run; each id is answered once")
    frac_bits: int = derived(doc="the fixed-point codec's fractional bits")
    alive: list[int] = derived(doc="this node's live neighbours")


@message()
class MaskBound(Message):
    """Record :data:`BOUND_KEY` of a masked reply: the digest of the request answered."""

    CONFIG = BOUND_KEY

    digest: bytes = reply()


@message(Action.CONFIRM)
class ConfirmRequest(Message):
    """A sum with dropouts: the split every survivor signs (record ``secagg``)."""

    CONFIG = SUM_KEY

    sum_id: int = per_round()
    dropped: list[int] = per_round(doc="the nodes dropped in this sum")


@message()
class Confirmation(Message):
    """The reply to ``secagg_confirm`` (record :data:`CONFIRMATION`)."""

    CONFIG = CONFIRMATION

    signed: bytes = reply(doc="the node's signature on the split")


@message(Action.UNMASK)
class UnmaskRequest(ConfirmRequest):
    """The unmasking (record ``secagg``): with dropouts, the survivors' signatures on the
    split that the node checks (every survivor, or its surviving neighbourhood)."""

    confirmations: list[bytes] | None = per_round(None)
