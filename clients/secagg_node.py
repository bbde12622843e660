"""Client side of secure aggregation: key setup, masking, and guarded share revelation.

See ``fedrec/secure/secagg.py`` for the protocol and why the refusal rules below keep every
input hidden across the many sums of a run. All secrets (private keys, self-mask seed, the
shares received from neighbours) live only in this node's ``context.state``.
"""

from __future__ import annotations

import dataclasses
import secrets
from typing import TypeVar

import numpy as np
from flwr.app import ConfigRecord, RecordDict

from clients.handlers import handler
from clients.identity_node import signers_of
from clients.node import NodeContext
from clients.nodeset import (
    COUNT,
    DIGEST,
    INDEX,
    MEMBERS,
    ROOT,
    commit_root,
    committed,
    confirm_by_neighbours,
    listed_nodes,
    needs_whole_set,
    read_bounded,
    signed_set_digest,
)
from clients.nodeset import commit as commit_node_set
from clients.nodeset import sign as sign_node_set
from clients.sealed_node import new_mail_key
from fedrec.records import config_record
from fedrec.secure.fixedpoint import FixedPoint
from fedrec.secure.keys import NodeKeys, split_secrets
from fedrec.secure.masks import expand_mask
from fedrec.secure.merkle import HASH_BYTES, verify_path
from fedrec.secure.secagg import (
    SHARES_PURPOSE,
    SURVIVORS_PURPOSE,
    SecAggError,
    agreement_context,
    commitment,
    graph_degree,
    mask_key_purpose,
    masking_minimum,
    neighbour_indices,
    pairwise_sum_key,
    self_mask,
    survivors_digest,
    threshold_for,
)
from fedrec.wire import secagg as secagg_wire
from fedrec.wire.mail import MAIL_KEYGEN, MailKey
from fedrec.wire.message import Message, message, reply
from fedrec.wire.secagg import (
    Action,
    AdvertiseRequest,
    Confirmation,
    ConfirmRequest,
    MaskedSum,
    MaskKey,
    ShareRequest,
    UnmaskRequest,
)
from fedrec.wire.sums import SUM_KEY, NodeSetSignature

M = TypeVar("M", bound=Message)

_RECEIVED = "secagg.received"  # ConfigRecord: "<sum>:<owner>" -> my share of owner's seed
_SEEDS = "secagg.seeds"  # ConfigRecord: "<sum>" -> my own self-mask seed for that sum
_REVEALED = "secagg.revealed"  # ConfigRecord: sums this node has already unmasked
_MASK_KEYS = "secagg.mask-keys"  # ConfigRecord: neighbour -> its signed mask key, as verified
_CONFIRMED = "secagg.confirmed"  # ConfigRecord: sums whose survivor set this node signed
_BOUNDS = "secagg.bounds"  # ConfigRecord: sum -> digest of the request it masked for


# Node-local state (``NodeContext.load_state`` / ``save_state``): declared here, beside the
# handlers that own it, not in ``fedrec/wire``, because it never travels; each is checked
# field by field when it is reloaded, so a corrupted or stale record is refused naming it.
@message()
class SecAggState(Message):
    """This node's secrets and bookkeeping for the run's current key setup (node-state
    record ``secagg.state``; wire names as the record has always spelled them)."""

    CONFIG = "secagg.state"
    ARRAYS = "secagg.state.arrays"  # none yet: a node state names its own records

    run_tag: bytes = reply(name="run_tag", doc="the run tag the key setup was made for")
    s_sk: bytes = reply(doc="the mask agreement key's private half")
    last_sum: int = reply(min=0, doc="the last sum id answered (ids only increase)")
    commit: str = reply(doc="the commitment its mask key is signed under")
    degree: int = reply(doc="the neighbour graph's degree (COMPLETE_GRAPH: complete)")
    graph_seed: int = reply(name="graph_seed", doc="the neighbour graph's seed")
    # from the share round on (None until then)
    neighbours: list[int] | None = reply(None, doc="its neighbours in the graph")
    s_pks: list[bytes] | None = reply(None, name="s_pks",
                                      doc="their mask keys, as verified, in that order")
    threshold: int | None = reply(None, min=1, doc="shares to rebuild its self-mask seed")
    batch: int | None = reply(None, min=1, doc="sums each share round draws seeds for")

    def __repr__(self) -> str:  # a traceback or log line never shows the private key
        return (f"SecAggState(last_sum={self.last_sum}, degree={self.degree}, "
                f"neighbours={self.neighbours}, threshold={self.threshold}, "
                f"batch={self.batch})")


@message()
class SecAggCommitted(Message):
    """The run's committed node set as this node holds it for the whole run (node-state
    record ``secagg.committed``): its size, the dropouts this node signed and the sum each
    dropped in."""

    CONFIG = "secagg.committed"
    ARRAYS = "secagg.committed.arrays"  # none: a node state names its own records

    count: int = reply(min=1)
    dropped: list[int] = reply()
    dropped_at: list[int] = reply()


def _read(node: NodeContext, cls: type[M], what: str) -> M:
    """The request's ``secagg`` record as ``cls``, its lists bounded by the roster first
    (``clients/nodeset.py`` ``read_bounded``); no record at all is refused naming it."""
    if config_record(node.request, SUM_KEY) is None:
        raise SecAggError(f"{node.who}: {what} request has no '{SUM_KEY}' record")
    return read_bounded(node, cls, what, SecAggError)


def _state(node: NodeContext) -> SecAggState:
    st = node.load_state(SecAggState)
    if st is None:
        raise SecAggError("secure aggregation used before key setup (secagg_advertise)")
    return st


def _shared(node: NodeContext, st: SecAggState, what: str) -> None:
    """Refuse ``what`` before a share round of this key setup set the neighbours."""
    if st.neighbours is None or st.s_pks is None or st.threshold is None or st.batch is None:
        raise SecAggError(f"{node.who} refuses to {what}: no share round of this key setup "
                          "gave it neighbours")


def _record(state: RecordDict, key: str) -> ConfigRecord:
    """One of this module's node-state records (made by ``secagg_advertise``)."""
    record = config_record(state, key)
    if record is None:
        raise SecAggError("secure aggregation used before key setup (secagg_advertise)")
    return record


@handler(Action.ADVERTISE)
def advertise(content: RecordDict, node: NodeContext) -> RecordDict:
    """Round 1: make the s (pairwise mask agreement) key pair; publish its public key, signed
    with this node's identity so that the server cannot substitute it.

    If the request asks (:data:`MAIL_KEYGEN`, the run has no sealed relay yet), the node
    makes its mail key in the same round (``clients/sealed_node.py``): one round less of key
    setup, the same fresh signed key as ``relay_keys``."""
    req = _read(node, AdvertiseRequest, Action.ADVERTISE)
    run_tag = _bytes_field(node, req.run_tag, f"{SUM_KEY}.run-tag", RUN_TAG_BYTES)
    _commit_members(node, req)
    digest = bytes(committed(node, "key setup")[DIGEST])
    commit = commitment(run_tag, digest, req.degree, req.graph_seed)
    s_keys = NodeKeys()
    state = node.state
    previous = node.load_state(SecAggState)
    node.save_state(SecAggState(
        run_tag=run_tag,
        s_sk=s_keys.private_bytes(),
        # sum ids keep increasing across key setups of a run: a refused or abandoned id is
        # never answered again, whichever setup asks
        last_sum=previous.last_sum if previous is not None else 0,
        commit=commit,
        degree=req.degree,
        graph_seed=req.graph_seed,
    ))
    state[_RECEIVED] = ConfigRecord()
    state[_SEEDS] = ConfigRecord()
    state[_MASK_KEYS] = ConfigRecord()
    for key in (_REVEALED, _CONFIRMED, _BOUNDS):
        if config_record(state, key) is None:
            state[key] = ConfigRecord()
    signed = node.identity.sign(mask_key_purpose(commit), node.context.run_id,
                                node.context.node_id, s_keys.public_bytes())
    whole = MEMBERS in committed(node, "key setup")
    reply = MaskKey(s_pk=signed, whole_set=whole).to_records()
    reply.update(NodeSetSignature(signed=sign_node_set(node)).to_records())
    if config_record(content, MAIL_KEYGEN) is not None:
        reply.update(MailKey(pk=new_mail_key(
            node.state, node.identity, node.context.run_id, node.context.node_id)).to_records())
    return reply


#: Longest run tag a node keeps (the server's is a SHA-256 digest).
RUN_TAG_BYTES = 64


def _bytes_field(node: NodeContext, value: bytes, name: str, most: int) -> bytes:
    """Field ``name`` (record.field), ``value``, as bytes of at most ``most``."""
    if len(value) > most:
        raise SecAggError(f"{node.who}: field '{name}' must be bytes, at most "
                          f"{most}")
    return bytes(value)


def _commit_members(node: NodeContext, req: AdvertiseRequest) -> None:
    """Commit to the run's node set, fixed at this node's first key setup of the run.

    Why: two sums of the same request over sets that differ by one node give that node's
    input as their difference. So the node commits to one set per run (bound into its signed
    mask key, which its neighbours check) and refuses a key setup with any other set; later
    it leaves the set only through dropouts its survivors signed (``allow-dropouts``).

    The set arrives as its Merkle root and size with this node's place in it
    (``clients/nodeset.py`` ``commit_root``: a request that does not grow with the
    federation). A node with a roster identity also needs every member's id
    (``secagg.members``), to hold the set across runs by its members' partitions."""
    root = _bytes_field(node, req.members_root, f"{SUM_KEY}.members-root", HASH_BYTES)
    path = _bytes_field(node, req.member_path, f"{SUM_KEY}.member-path", HASH_BYTES * 64)
    if needs_whole_set(node):
        if req.members is None:
            raise SecAggError(f"{node.who} refuses key setup: a node with a roster identity "
                              f"needs the whole node set (field '{SUM_KEY}.members'), to hold "
                              "it across runs by its members' partitions")
        commit_node_set(node, req.members, "key setup")
    # the same set's root (a whole-set node: the ids it was given must have this root)
    count = commit_root(node, root, req.members_count, req.member_index, path, "key setup")
    if node.load_state(SecAggCommitted) is None:  # the dropouts this node has signed
        node.save_state(SecAggCommitted(count=count, dropped=[], dropped_at=[]))


def _committed(node: NodeContext, before: int | None = None) -> tuple[int, set[int]]:
    """(the size of the run's committed node set, the nodes dropped from it by signed
    dropouts in sums before ``before``, or in any sum)."""
    record = node.load_state(SecAggCommitted)
    if record is None:
        raise SecAggError("secure aggregation used before key setup (secagg_advertise)")
    gone = {v for v, t in zip(record.dropped, record.dropped_at, strict=False)
            if before is None or t < before}
    return record.count, gone


def _neighbours(node: NodeContext, st: SecAggState, req: ShareRequest,
                content: RecordDict) -> list[int]:
    """The server's neighbour list, checked to be this node's neighbours in the committed
    set's graph: by every member's id and signature on the set when the node holds the
    whole set, else by each neighbour's Merkle path to the index the graph gives it."""
    refuse = f"{node.who} refuses the share round"
    record = committed(node, "the share round")
    count, index = int(record[COUNT]), int(record[INDEX])
    places = neighbour_indices(count, index, graph_degree(st.degree), st.graph_seed)
    listed = listed_nodes(node, req.neighbours, "the share round", SecAggError,
                          f"field '{SUM_KEY}.neighbours'")
    wrong = SecAggError(f"{refuse}: its neighbours are not the ones the committed node set, "
                        "degree and graph seed give (a server choosing neighbourhoods could "
                        "cut the graph)")
    if len(listed) != len(places) or listed != sorted(set(listed)):
        raise wrong
    if MEMBERS in record:
        members = [int(v) for v in record[MEMBERS]]
        if listed != [members[j] for j in places]:
            raise wrong
        # every member signed this node's set (no member was shown another), across runs too
        signed_set_digest(node, content, "the share round")
        return listed
    paths = req.neighbour_paths
    if paths is None or len(paths) != len(listed) or \
            not all(verify_path(bytes(record[ROOT]), count, j, v, p)
                    for j, v, p in zip(places, listed, paths)):
        raise wrong
    return listed


@handler(Action.SHARE)
def share_seeds(content: RecordDict, node: NodeContext) -> RecordDict:
    """Round 2: draw one self-mask seed per upcoming sum, Shamir-share each, mail each holder
    its shares through the sealed relay."""
    st = _state(node)
    req = _read(node, ShareRequest, Action.SHARE)
    me = node.context.node_id
    count, _ = _committed(node)
    neighbours = _neighbours(node, st, req, content)
    if len(neighbours) < min(node.policy.min_neighbours, count - 1):
        raise SecAggError(f"{node.who} refuses the share round: {len(neighbours)} neighbour(s), "
                          f"its node policy's min-neighbours is {node.policy.min_neighbours}")
    first, batch = req.first_sum, req.batch
    if not (first > st.last_sum and 1 <= batch <= 4096):
        raise SecAggError(f"{node.who} refuses the share round: seeds must be for sums after "
                          f"its last ({st.last_sum}) in a batch of 1..4096, got first-sum "
                          f"{first}, batch {batch}")
    holders = [me, *neighbours]
    minimum = node.policy.min_survivors
    if len(holders) < minimum:
        raise SecAggError(f"{node.who} refuses to share mask seeds: its neighbourhood has "
                          f"{len(holders)} node(s) with itself, its node policy's min-survivors "
                          f"is {minimum}")
    # The threshold is the node's own (a strict majority of its neighbourhood), never lower
    # than that whatever the server's message says: a lower one would let fewer colluding
    # holders rebuild this node's self-mask seed.
    threshold = max(threshold_for(len(holders)), req.threshold)
    if len(req.s_pks) != len(neighbours):
        raise SecAggError(f"{node.who}: secagg_share lists {len(neighbours)} neighbours and "
                          f"{len(req.s_pks)} mask keys")
    signed = {v: bytes(pk) for v, pk in zip(neighbours, req.s_pks)}
    # A later share round (the next batch of seeds) must hand over the same mask keys: a
    # different key for a neighbour, even one its publisher signed (e.g. from an earlier
    # setup of this run), would silently replace the key the masks so far were made with.
    kept = _record(node.state, _MASK_KEYS)
    changed = [v for v in neighbours if str(v) in kept and bytes(kept[str(v)]) != signed[v]]
    if changed:
        raise SecAggError(f"{node.who} refuses the share round: the mask key of node "
                          f"{changed[0]} differs from the one it was given earlier in this "
                          "key setup (a key substitution by the server?)")
    # every neighbour's mask key must carry its signature: a key the server put in its
    # place would give the server the pairwise masks (each key is verified once per run)
    # ... and bind the same commitment (node set and graph): a neighbour shown another set
    # would have signed another purpose
    s_pks = [_checked_mask_key(node, st.commit, v, signed[v]) for v in neighbours]
    if MEMBERS not in committed(node, "the share round"):
        confirm_by_neighbours(node)  # each neighbour signed a key bound to this set
    for v in neighbours:
        kept[str(v)] = signed[v]
    seeds = {first + i: secrets.token_bytes(32) for i in range(batch)}  # 256-bit HKDF keys
    shares = dict(zip(seeds, split_secrets(list(seeds.values()), threshold, len(holders))))
    own_seeds = _record(node.state, _SEEDS)
    for t, seed in seeds.items():
        own_seeds[str(t)] = seed
    node.save_state(dataclasses.replace(st, neighbours=neighbours, s_pks=s_pks,
                                        threshold=threshold, batch=batch))
    for idx, holder in enumerate(holders):
        bundle = b"".join(shares[t][idx] for t in sorted(seeds))
        if holder == me:
            _store_bundle(node.state, me, first, batch, bundle)
        else:
            node.mailbox.send(holder, f"{SHARES_PURPOSE}:{first}", bundle)
    return RecordDict()


def _checked_mask_key(node: NodeContext, commit: str, v: int, blob: bytes) -> bytes:
    """Neighbour ``v``'s mask key, if its roster signature covers this node's commitment."""
    try:
        return node.identity.check_once(node.state, mask_key_purpose(commit),
                                        node.context.run_id, v, blob)[1]
    except PermissionError:
        partition = int.from_bytes(bytes(blob)[:4], "big", signed=True)
        raise SecAggError(
            f"{node.who} refuses the share round: the secagg-mask key published for node {v} "
            f"(partition {partition}) does not carry that partition's signature over this "
            "node's committed node set and graph: substituted or forged on the way, or that "
            "node was shown another node set; refusing it") from None


def _store_bundle(state: RecordDict, sender: int, first: int, batch: int, bundle: bytes) -> None:
    """Keep the shares of ``sender``'s seeds for sums first..first+batch-1, one per sum."""
    if len(bundle) % batch:
        raise SecAggError(f"share bundle from node {sender} has a bad length {len(bundle)}")
    size = len(bundle) // batch
    received = _record(state, _RECEIVED)
    for i in range(batch):
        received[f"{first + i}:{sender}"] = bundle[i * size:(i + 1) * size]


def _receive_shares(node: NodeContext, sum_id: int) -> None:
    """Open the shares neighbours mailed for sum ``sum_id``'s batch (the relay names the
    sender of a tampered one)."""
    st = _state(node)
    if st.batch is None:  # no share round yet: no shares to open (nor a seed for the sum)
        return
    neighbours = set(st.neighbours or [])
    first = sum_id - (sum_id - 1) % st.batch
    for sender, bundle in node.mailbox.receive(f"{SHARES_PURPOSE}:{first}").items():
        if sender not in neighbours:
            raise SecAggError(f"received a share from node {sender}, which is not a neighbour")
        _store_bundle(node.state, sender, first, st.batch, bundle)


def _pairwise_keys(st: SecAggState, me: int, sum_id: int, bound: bytes) -> dict[int, bytes]:
    """k_uv^(t) with every neighbour v, bound to the request answered in sum t (after the
    share round: :func:`_shared`)."""
    s_keys = NodeKeys.from_private_bytes(st.s_sk)
    context = agreement_context(st.run_tag, b"mask")
    return {
        v: pairwise_sum_key(s_keys.shared_key(pk, context), sum_id, bound)
        for v, pk in zip(st.neighbours or [], st.s_pks or [], strict=True)
    }


def _codec(node: NodeContext, req: MaskedSum) -> FixedPoint:
    """The fixed-point codec of masked sum ``sum_id``, derived by this node: ``max-abs`` and
    the run's committed node set less its signed dropouts give the fractional bits
    (``FixedPoint.for_sum``, as the server computes them); a request declaring others is
    refused.

    Why: fractional bits chosen per node (one more for one node only) would let two sums
    of one request decode to that node's input; the sum digest binds them too
    (``clients/sums_node.py`` ``request_digest``), and deriving them leaves the server
    nothing to choose."""
    sum_id = req.sum_id
    count, dropped = _committed(node)
    n = count - len(dropped)
    try:
        codec = FixedPoint.for_sum(req.max_abs, max(n, 1))
    except (OverflowError, ValueError):  # the server's own number, echoed
        raise SecAggError(f"{node.who} refuses sum {sum_id}: field '{SUM_KEY}.max-abs' = "
                          f"{req.max_abs!r} gives no fixed-point encoding of a sum over "
                          f"{n} nodes in its 64-bit ring") from None
    declared = req.frac_bits
    if declared != codec.frac_bits:
        raise SecAggError(f"{node.who} refuses sum {sum_id}: field '{SUM_KEY}.frac-bits' = "
                          f"{declared!r}, but max-abs = {req.max_abs!r} over the run's {n} "
                          f"committed node(s) gives {codec.frac_bits} (every node derives "
                          "it; the server chooses none)")
    return codec


def read_masked_sum(node: NodeContext) -> MaskedSum:
    """The request's masked-sum record (its ``alive`` list bounded by the roster first)."""
    return _read(node, MaskedSum, "masked sum")


def begin_masked_sum(node: NodeContext, req: MaskedSum) -> None:
    """Check a masked sum's request ``req`` (:func:`read_masked_sum`) before the handler
    computes anything (the ClientApp runs it first, through ``clients/sums_node.py``
    ``check_sum_request``): the sum id is spent here, refused or not, then the alive list,
    the set size and the codec are checked. Every check depends on the request and this
    node's own record only."""
    state = node.state
    sum_id = req.sum_id
    _receive_shares(node, sum_id)
    st = _state(node)
    if sum_id <= st.last_sum:
        raise SecAggError(f"refusing sum id {sum_id}: ids must increase (last {st.last_sum}); "
                          "reusing masks would reveal differences of inputs")
    # the id is spent before any other check: a refused request is never answered later
    st = dataclasses.replace(st, last_sum=sum_id)
    node.save_state(st)
    seeds = _record(state, _SEEDS)
    if str(sum_id) not in seeds:
        raise SecAggError(f"no self-mask seed shared for sum {sum_id}")
    alive = set(listed_nodes(node, req.alive, f"sum {sum_id}", SecAggError,
                             f"field '{SUM_KEY}.alive'"))
    _shared(node, st, f"sum {sum_id}")
    count, dropped = _committed(node)
    expected = set(st.neighbours or []) - dropped
    if alive != expected:
        raise SecAggError(f"{node.who} refuses sum {sum_id}: the server's alive list is not its "
                          "neighbours in the run's committed node set (less the dropouts its "
                          "survivors signed); a sum over another set could be differenced")
    if count - len(dropped) < node.policy.min_survivors:
        raise SecAggError(f"{node.who} refuses sum {sum_id}: the run's node set has "
                          f"{count - len(dropped)} node(s) left, its node policy's "
                          f"min-survivors is {node.policy.min_survivors}")
    _codec(node, req)
    neighbours = st.neighbours or []
    needed = masking_minimum(len(neighbours), st.threshold or 0)
    if len(alive) < needed:
        raise SecAggError(
            f"{node.who} refuses sum {sum_id}: the server's alive list leaves "
            f"{len(alive)} of its {len(neighbours)} neighbours to mask with; it "
            f"needs {needed} (with fewer, the neighbours asked for pairwise keys and those "
            "asked for self-mask shares could be disjoint and together unmask its input)")


def mask_values(node: NodeContext, req: MaskedSum, vec: np.ndarray, bound: bytes = b"",
                encode=None) -> np.ndarray:
    """Fixed-point encode ``vec`` and add the self mask and the pairwise masks for sum
    ``req``, the pairwise ones bound to ``bound`` (the digest of the request answered). The
    request was checked, and its sum id spent, by :func:`begin_masked_sum`; each seed masks
    once. ``encode(codec, vec)``, if given, replaces ``codec.encode`` (a noisy sum's
    encoder, ``clients/noise_node.py``)."""
    state, me = node.state, node.context.node_id
    st = _state(node)
    sum_id = req.sum_id
    seeds = _record(state, _SEEDS)
    if sum_id != st.last_sum or str(sum_id) not in seeds:
        raise SecAggError(f"{node.who} refuses to mask sum {sum_id}: it is not the sum its "
                          "request check began, or it was masked already")
    _shared(node, st, f"mask sum {sum_id}")
    codec = _codec(node, req)
    try:
        # sum_reply clipped vec into the range first
        out = codec.encode(vec) if encode is None else encode(codec, vec)
    except (OverflowError, ValueError) as exc:  # names the range, never values or counts
        raise OverflowError(f"{node.who}: {exc}") from None
    n = out.shape[0]
    out += self_mask(bytes(seeds[str(sum_id)]), sum_id, n)
    alive = {int(v) for v in req.alive}
    _record(state, _BOUNDS)[str(sum_id)] = bytes(bound)  # for a dropped peer's key later
    for v, key in _pairwise_keys(st, me, sum_id, bound).items():
        if v in alive:  # the lower id adds the pairwise mask, the higher subtracts it
            if me < v:
                out += expand_mask(key, sum_id, n)
            else:
                out -= expand_mask(key, sum_id, n)
    del seeds[str(sum_id)]  # each seed serves one sum
    return out


def _split(node: NodeContext, req: ConfirmRequest, what: str) -> tuple[list[int], int]:
    """The server's dropped list of sum ``sum_id``, checked against this node's own record:
    nodes of the run's committed set not dropped before (every one, when the node holds the
    whole set), never this node, dropouts only if its policy allows them, and at least
    ``min-survivors`` nodes left. Returns the list and how many nodes the set keeps: with
    the committed set and the earlier signed dropouts, the survivors are fixed."""
    me, sum_id = node.context.node_id, req.sum_id
    dropped = sorted(set(listed_nodes(node, req.dropped, f"to {what} sum {sum_id}",
                                      SecAggError, f"field '{SUM_KEY}.dropped'")))
    count, gone = _committed(node, before=sum_id)
    record = committed(node, f"to {what} sum {sum_id}")
    refuse = f"{node.who} refuses to {what} sum {sum_id}"
    inside = MEMBERS not in record or \
        set(dropped) <= {int(v) for v in record[MEMBERS]}
    if me in dropped or set(dropped) & gone or not inside:
        raise SecAggError(f"{refuse}: the dropped list must name nodes of the run's committed "
                          "node set not dropped before, and not this node")
    left = count - len(gone) - len(dropped)
    if left < node.policy.min_survivors:
        raise SecAggError(f"{refuse}: the sum would cover {left} node(s), its node "
                          f"policy's min-survivors is {node.policy.min_survivors}")
    if dropped and not node.policy.allow_dropouts:
        raise SecAggError(f"{refuse} with dropouts: its node policy does not allow dropouts "
                          "(allow-dropouts=false), so every sum of the run must hold the whole "
                          "committed node set")
    return dropped, left


def confirmers(node: NodeContext, st: SecAggState, sum_id: int,
               dropped: list[int]) -> list[int]:
    """Whose signatures on a split of sum ``sum_id`` this node needs before it unmasks: every
    survivor when it holds the whole set, else its surviving neighbourhood (the nodes whose
    shares and keys it reveals; Bell et al.'s neighbour-local consistency check)."""
    _, gone = _committed(node, before=sum_id)
    record = committed(node, f"to unmask sum {sum_id}")
    pool = [int(v) for v in record[MEMBERS]] if MEMBERS in record else \
        [node.context.node_id, *(st.neighbours or [])]
    return sorted(set(pool) - gone - set(dropped))


def _spend(node: NodeContext, record: str, sum_id: int, what: str) -> None:
    """Mark ``sum_id`` used for ``what`` before any other check (refused or not, once)."""
    st = _state(node)
    if sum_id != st.last_sum:
        raise SecAggError(f"{node.who} refuses to {what} sum {sum_id}: its last sum is "
                          f"{st.last_sum}")
    done = _record(node.state, record)
    if str(sum_id) in done:
        raise SecAggError(f"{node.who} refuses to {what} sum {sum_id} twice")
    done[str(sum_id)] = True


@handler(Action.CONFIRM)
def confirm(content: RecordDict, node: NodeContext) -> RecordDict:
    """The consistency round of a sum with dropouts: sign the split (the dropped list and the
    nodes left), once per sum. The dropped nodes leave this node's committed set for the rest
    of the run (a dropped node never comes back, so the server cannot alternate sets)."""
    req = _read(node, ConfirmRequest, Action.CONFIRM)
    sum_id = req.sum_id
    _spend(node, _CONFIRMED, sum_id, "confirm")
    dropped, left = _split(node, req, "confirm")
    if not dropped:
        raise SecAggError(f"{node.who} refuses to confirm sum {sum_id}: it has no dropouts")
    record = node.load_state(SecAggCommitted)
    if record is None:
        raise SecAggError("secure aggregation used before key setup (secagg_advertise)")
    node.save_state(dataclasses.replace(
        record, dropped=[*record.dropped, *dropped],
        dropped_at=[*record.dropped_at, *[sum_id] * len(dropped)]))
    signed = node.identity.sign(SURVIVORS_PURPOSE, node.context.run_id, node.context.node_id,
                                _split_digest(node, sum_id, dropped, left))
    return Confirmation(signed=signed).to_records()


def _split_digest(node: NodeContext, sum_id: int, dropped: list[int], left: int) -> bytes:
    digest = bytes(committed(node, f"sum {sum_id}")[DIGEST])
    return survivors_digest(sum_id, digest, dropped, left)


def _check_confirmations(node: NodeContext, st: SecAggState, req: UnmaskRequest,
                         dropped: list[int], left: int) -> None:
    """The signature on exactly this split (checked against the roster, each from its own
    partition) of every node in :func:`confirmers`, in their order: then none of them was
    shown another split of this sum."""
    sum_id = req.sum_id
    refuse = f"{node.who} refuses to unmask sum {sum_id}"
    needed = confirmers(node, st, sum_id, dropped)
    signatures = req.confirmations
    if signatures is None or len(signatures) != len(needed):
        raise SecAggError(f"{refuse}: a sum with dropouts needs the signature on the split "
                          f"of each of {len(needed)} survivor(s) it checks (field "
                          f"'{SUM_KEY}.confirmations')")
    digest = _split_digest(node, sum_id, dropped, left)
    signers_of(((v, bytes(blob)) for v, blob in zip(needed, signatures)), digest,
               lambda v, blob: node.identity.check(SURVIVORS_PURPOSE, node.context.run_id, v,
                                                   blob),
               refuse, "this split of the sum", SecAggError)


@handler(Action.UNMASK)
def unmask(content: RecordDict, node: NodeContext) -> RecordDict:
    """Reveal what the server needs to finish sum t, under the refusal rules.

    The dropped list must name nodes of the run's committed set (:func:`_split`); with
    dropouts, every node of :func:`confirmers` must have signed the split (:func:`confirm`):
    every survivor for a node holding the whole set, its surviving neighbourhood for a node
    holding the set by its root. Then for each
    surviving member of this node's neighbourhood: its share of that member's ``b^(t)``; for
    each dropped neighbour: the per-sum pairwise key. Never both for one peer in one sum, each
    sum once (refused or not), and nothing if fewer than the threshold of the neighbourhood
    survive.
    """
    me = node.context.node_id
    st = _state(node)
    req = _read(node, UnmaskRequest, Action.UNMASK)
    sum_id = req.sum_id
    _spend(node, _REVEALED, sum_id, "unmask")
    dropped, left = _split(node, req, "unmask")
    _shared(node, st, f"unmask sum {sum_id}")
    if dropped:
        _check_confirmations(node, st, req, dropped, left)
        confirmed = config_record(node.state, _CONFIRMED)
        if str(sum_id) not in confirmed:
            raise SecAggError(f"{node.who} refuses to unmask sum {sum_id}: it did not sign its "
                              "split itself")
    _, gone = _committed(node, before=sum_id)
    neighbours = set(st.neighbours or [])
    neighbourhood = neighbours | {me}
    alive = neighbourhood - gone - set(dropped)
    if len(alive) < (st.threshold or 0):
        raise SecAggError(f"{node.who} refuses to unmask: only {len(alive)} of its "
                          f"{len(neighbourhood)} neighbourhood survive, threshold is "
                          f"{st.threshold}")
    # its neighbours' keys carry roster signatures it checked: these contributors are genuine
    if len(alive) < node.policy.min_survivors:
        raise SecAggError(f"{node.who} refuses to unmask sum {sum_id}: {len(alive)} node(s) "
                          "with signed keys it checked itself are in it, its node policy's "
                          f"min-survivors is {node.policy.min_survivors}")
    received = _record(node.state, _RECEIVED)
    out: dict[str, bytes] = {}
    for owner in sorted(alive):
        out[f"b:{owner}"] = bytes(received.pop(f"{sum_id}:{owner}"))
    keys = _pairwise_keys(st, me, sum_id, bytes(_record(node.state, _BOUNDS)[str(sum_id)]))
    for owner in sorted(neighbours & set(dropped)):
        out[f"k:{owner}"] = keys[owner]
    return RecordDict({secagg_wire.REVEALED: ConfigRecord(out)})
