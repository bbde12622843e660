"""Client side of secure aggregation: key setup, masking, and guarded share revelation.

See ``fl_app/secure/secagg.py`` for the protocol and why the refusal rules below keep every
input hidden across the many sums of a run. All secrets (private keys, self-mask seed, the
shares received from neighbours) live only in this node's ``context.state``.
"""

from __future__ import annotations

import secrets

import numpy as np
from flwr.app import ConfigRecord, RecordDict

from clients.node import NodeContext
from clients.registry import handler
from clients.sealed import new_mail_key
from fl_app.records import config_record
from fl_app.secure.aggregate import SUM_KEY
from fl_app.secure.fixedpoint import FixedPoint
from fl_app.secure.keys import NodeKeys, split_secrets
from fl_app.secure.masks import expand_mask
from fl_app.secure.sealed import MAIL_KEY_REPLY, MAIL_KEYGEN
from fl_app.secure.secagg import (
    MASK_KEY_PURPOSE,
    SHARES_PURPOSE,
    SecAggError,
    agreement_context,
    masking_minimum,
    pairwise_sum_key,
    self_mask,
    threshold_for,
)

_STATE = "secagg.state"  # ConfigRecord with this node's secrets and bookkeeping
_RECEIVED = "secagg.received"  # ConfigRecord: "<sum>:<owner>" -> my share of owner's seed
_SEEDS = "secagg.seeds"  # ConfigRecord: "<sum>" -> my own self-mask seed for that sum
_REVEALED = "secagg.revealed"  # ConfigRecord: sums this node has already unmasked
_MASK_KEYS = "secagg.mask-keys"  # ConfigRecord: neighbour -> its signed mask key, as verified


def _fields(content: RecordDict, keys: tuple[str, ...], node: NodeContext,
            what: str) -> ConfigRecord:
    """The request's ``secagg`` record, checked to have ``keys``: a missing field is an error
    naming this node and the field, never a bare KeyError."""
    cfg = config_record(content, SUM_KEY)
    if cfg is None:
        raise SecAggError(f"{node.who}: {what} request has no '{SUM_KEY}' record")
    missing = [k for k in keys if k not in cfg]
    if missing:
        raise SecAggError(f"{node.who}: {what} request lacks field(s) "
                          f"{', '.join(f'{SUM_KEY}.{k}' for k in missing)}")
    return cfg


def _state(state: RecordDict) -> ConfigRecord:
    st = config_record(state, _STATE)
    if st is None:
        raise SecAggError("secure aggregation used before key setup (secagg_advertise)")
    return st


def _record(state: RecordDict, key: str) -> ConfigRecord:
    """One of this module's node-state records (made by ``secagg_advertise``)."""
    record = config_record(state, key)
    if record is None:
        raise SecAggError("secure aggregation used before key setup (secagg_advertise)")
    return record


@handler("secagg_advertise")
def advertise(content: RecordDict, node: NodeContext) -> RecordDict:
    """Round 1: make the s (pairwise mask agreement) key pair; publish its public key, signed
    with this node's identity so that the server cannot substitute it.

    If the request asks (:data:`MAIL_KEYGEN`, the run has no sealed relay yet), the node
    makes its mail key in the same round (``clients/sealed.py``): one round less of key
    setup, the same fresh signed key as ``relay_keys``."""
    s_keys = NodeKeys()
    state = node.state
    state[_STATE] = ConfigRecord({
        "run-tag": bytes(_fields(content, ("run-tag",), node, "secagg_advertise")["run-tag"]),
        "s-sk": s_keys.private_bytes(),
        "last-sum": 0,
    })
    state[_RECEIVED] = ConfigRecord()
    state[_SEEDS] = ConfigRecord()
    state[_REVEALED] = ConfigRecord()
    state[_MASK_KEYS] = ConfigRecord()
    signed = node.identity.sign(MASK_KEY_PURPOSE, node.context.run_id, node.context.node_id,
                                s_keys.public_bytes())
    reply = RecordDict({"keys": ConfigRecord({"s-pk": signed})})
    if config_record(content, MAIL_KEYGEN) is not None:
        reply[MAIL_KEY_REPLY] = ConfigRecord({"pk": new_mail_key(
            node.state, node.identity, node.context.run_id, node.context.node_id)})
    return reply


@handler("secagg_share")
def share_seeds(content: RecordDict, node: NodeContext) -> RecordDict:
    """Round 2: draw one self-mask seed per upcoming sum, Shamir-share each, mail each holder
    its shares through the sealed relay."""
    st = _state(node.state)
    cfg = _fields(content, ("neighbours", "threshold", "first-sum", "batch", "s-pks"), node,
                  "secagg_share")
    me = node.context.node_id
    neighbours = sorted({int(v) for v in cfg["neighbours"]} - {me})
    first, batch = int(cfg["first-sum"]), int(cfg["batch"])
    holders = [me, *neighbours]
    minimum = node.policy.min_survivors
    if len(holders) < minimum:
        raise SecAggError(f"{node.who} refuses to share mask seeds: its neighbourhood has "
                          f"{len(holders)} node(s) with itself, its node policy's min-survivors "
                          f"is {minimum}")
    # The threshold is the node's own (a strict majority of its neighbourhood), never lower
    # than that whatever the server's message says: a lower one would let fewer colluding
    # holders rebuild this node's self-mask seed.
    threshold = max(threshold_for(len(holders)), int(cfg["threshold"]))
    listed = [int(v) for v in cfg["neighbours"]]
    if len(cfg["s-pks"]) != len(listed):
        raise SecAggError(f"{node.who}: secagg_share lists {len(listed)} neighbours and "
                          f"{len(cfg['s-pks'])} mask keys")
    signed = {v: bytes(pk) for v, pk in zip(listed, cfg["s-pks"])}
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
    s_pks = [node.identity.check_once(node.state, MASK_KEY_PURPOSE, node.context.run_id, v,
                                      signed[v])[1] for v in neighbours]
    for v in neighbours:
        kept[str(v)] = signed[v]
    seeds = {first + i: secrets.token_bytes(32) for i in range(batch)}  # 256-bit HKDF keys
    shares = dict(zip(seeds, split_secrets(list(seeds.values()), threshold, len(holders))))
    own_seeds = _record(node.state, _SEEDS)
    for t, seed in seeds.items():
        own_seeds[str(t)] = seed
    st["neighbours"] = neighbours
    st["s-pks"] = s_pks
    st["threshold"] = threshold
    st["batch"] = batch
    for idx, holder in enumerate(holders):
        bundle = b"".join(shares[t][idx] for t in sorted(seeds))
        if holder == me:
            _store_bundle(node.state, me, first, batch, bundle)
        else:
            node.mailbox.send(holder, f"{SHARES_PURPOSE}:{first}", bundle)
    return RecordDict()


def _store_bundle(state: RecordDict, sender: int, first: int, batch: int, bundle: bytes) -> None:
    """Keep the shares of ``sender``'s seeds for sums first..first+batch-1, one per sum."""
    if len(bundle) % batch:
        raise SecAggError(f"share bundle from node {sender} has a bad length {len(bundle)}")
    size = len(bundle) // batch
    received = _record(state, _RECEIVED)
    for i in range(batch):
        received[f"{first + i}:{sender}"] = bundle[i * size:(i + 1) * size]


def _receive_shares(node: NodeContext) -> None:
    """Open the shares neighbours mailed (the relay names the sender of a tampered one)."""
    st = _state(node.state)
    neighbours = {int(v) for v in st.get("neighbours", [])}
    sum_id = int(_fields(node.request, ("sum-id",), node, "masked sum")["sum-id"])
    first = sum_id - (sum_id - 1) % int(st["batch"])
    for sender, bundle in node.mailbox.receive(f"{SHARES_PURPOSE}:{first}").items():
        if sender not in neighbours:
            raise SecAggError(f"received a share from node {sender}, which is not a neighbour")
        _store_bundle(node.state, sender, first, int(st["batch"]), bundle)


def _pairwise_keys(st: ConfigRecord, me: int, sum_id: int) -> dict[int, bytes]:
    """k_uv^(t) with every neighbour v."""
    s_keys = NodeKeys.from_private_bytes(bytes(st["s-sk"]))
    context = agreement_context(bytes(st["run-tag"]), b"mask")
    return {
        v: pairwise_sum_key(s_keys.shared_key(bytes(pk), context), sum_id)
        for v, pk in zip((int(x) for x in st["neighbours"]), st["s-pks"])
    }


def mask_values(node: NodeContext, vec: np.ndarray) -> np.ndarray:
    """Fixed-point encode ``vec`` and add the self mask and the pairwise masks for this sum."""
    state, me = node.state, node.context.node_id
    cfg = _fields(node.request, ("sum-id", "max-abs", "frac-bits", "alive"), node, "masked sum")
    _receive_shares(node)
    st = _state(state)
    sum_id = int(cfg["sum-id"])
    if sum_id <= int(st["last-sum"]):
        raise SecAggError(f"refusing sum id {sum_id}: ids must increase (last {st['last-sum']}); "
                          "reusing masks would reveal differences of inputs")
    seeds = _record(state, _SEEDS)
    if str(sum_id) not in seeds:
        raise SecAggError(f"no self-mask seed shared for sum {sum_id}")
    codec = FixedPoint(max_abs=float(cfg["max-abs"]), frac_bits=int(cfg["frac-bits"]))
    try:
        out = codec.encode(vec)
    except OverflowError as exc:  # the message names the range and a count, never values
        raise OverflowError(f"{node.who}: {exc}") from None
    n = out.shape[0]
    out += self_mask(bytes(seeds[str(sum_id)]), sum_id, n)
    alive = {int(v) for v in cfg["alive"]}
    members = (alive & {int(v) for v in st["neighbours"]}) | {me}
    if len(members) < node.policy.min_survivors:
        raise SecAggError(f"{node.who} refuses sum {sum_id}: only {len(members)} node(s) with "
                          f"itself would mask it together (the server's alive list), its node "
                          f"policy's min-survivors is {node.policy.min_survivors}")
    masked_with = alive & {int(v) for v in st["neighbours"]}
    needed = masking_minimum(len(st["neighbours"]), int(st["threshold"]))
    if len(masked_with) < needed:
        raise SecAggError(
            f"{node.who} refuses sum {sum_id}: the server's alive list leaves "
            f"{len(masked_with)} of its {len(st['neighbours'])} neighbours to mask with; it "
            f"needs {needed} (with fewer, the neighbours asked for pairwise keys and those "
            "asked for self-mask shares could be disjoint and together unmask its input)")
    for v, key in _pairwise_keys(st, me, sum_id).items():
        if v in alive:  # the lower id adds the pairwise mask, the higher subtracts it
            if me < v:
                out += expand_mask(key, sum_id, n)
            else:
                out -= expand_mask(key, sum_id, n)
    st["last-sum"] = sum_id
    del seeds[str(sum_id)]  # each seed serves one sum
    return out


@handler("secagg_unmask")
def unmask(content: RecordDict, node: NodeContext) -> RecordDict:
    """Reveal what the server needs to finish sum t, under the refusal rules.

    For each surviving member of this node's neighbourhood: its share of that member's
    ``b^(t)``. For each dropped neighbour: the per-sum pairwise key. Never both for one peer
    in one sum, and nothing if fewer than the threshold of the neighbourhood survive.
    """
    me = node.context.node_id
    st = _state(node.state)
    cfg = _fields(content, ("sum-id", "survivors", "dropped"), node, "secagg_unmask")
    sum_id = int(cfg["sum-id"])
    if sum_id != int(st["last-sum"]):
        raise SecAggError(f"node {me} refuses to unmask sum {sum_id}: its last sum is "
                          f"{st['last-sum']}")
    survivors = {int(v) for v in cfg["survivors"]}
    dropped = {int(v) for v in cfg["dropped"]}
    if survivors & dropped or me not in survivors:
        raise SecAggError(f"node {me} refuses to unmask: inconsistent survivor/dropped lists")
    neighbours = {int(v) for v in st["neighbours"]}
    neighbourhood = neighbours | {me}
    if len(neighbourhood & survivors) < int(st["threshold"]):
        raise SecAggError(f"node {me} refuses to unmask: only {len(neighbourhood & survivors)} "
                          f"of its {len(neighbourhood)} neighbourhood survive, threshold is "
                          f"{st['threshold']}")
    if len(survivors) < node.policy.min_survivors:
        raise SecAggError(f"node {me} refuses to unmask: the sum would cover {len(survivors)} "
                          f"node(s), its node policy's min-survivors is "
                          f"{node.policy.min_survivors}")
    revealed = _record(node.state, _REVEALED)
    if str(sum_id) in revealed:
        raise SecAggError(f"node {me} refuses to unmask sum {sum_id} twice")
    revealed[str(sum_id)] = True
    received = _record(node.state, _RECEIVED)
    out: dict[str, bytes] = {}
    for owner in sorted(neighbourhood & survivors):
        out[f"b:{owner}"] = bytes(received.pop(f"{sum_id}:{owner}"))
    keys = _pairwise_keys(st, me, sum_id)
    for owner in sorted(neighbours & dropped):
        out[f"k:{owner}"] = keys[owner]
    return RecordDict({"revealed": ConfigRecord(out)})

