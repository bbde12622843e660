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
from fl_app.secure.fixedpoint import FixedPoint
from fl_app.secure.keys import NodeKeys, open_sealed, seal, split_secret
from fl_app.secure.masks import expand_mask
from fl_app.secure.secagg import (
    SECAGG_KEY,
    SHARES_KEY,
    SecAggError,
    agreement_context,
    pairwise_sum_key,
    self_mask,
)

_STATE = "secagg.state"  # ConfigRecord with this node's secrets and bookkeeping
_RECEIVED = "secagg.received"  # ConfigRecord: "<sum>:<owner>" -> my share of owner's seed
_SEEDS = "secagg.seeds"  # ConfigRecord: "<sum>" -> my own self-mask seed for that sum
_REVEALED = "secagg.revealed"  # ConfigRecord: sums this node has already unmasked


def _state(state: RecordDict) -> ConfigRecord:
    if _STATE not in state.config_records:
        raise SecAggError("secure aggregation used before key setup (secagg_advertise)")
    return state.config_records[_STATE]


@handler("secagg_advertise")
def advertise(content: RecordDict, node: NodeContext) -> RecordDict:
    """Round 1: make the c (share sealing) and s (mask agreement) key pairs; publish them."""
    c_keys, s_keys = NodeKeys(), NodeKeys()
    node.state.config_records[_STATE] = ConfigRecord({
        "run-tag": bytes(content.config_records[SECAGG_KEY]["run-tag"]),
        "c-sk": c_keys.private_bytes(),
        "s-sk": s_keys.private_bytes(),
        "last-sum": 0,
    })
    node.state.config_records[_RECEIVED] = ConfigRecord()
    node.state.config_records[_SEEDS] = ConfigRecord()
    node.state.config_records[_REVEALED] = ConfigRecord()
    return RecordDict({"keys": ConfigRecord({"c-pk": c_keys.public_bytes(),
                                             "s-pk": s_keys.public_bytes()})})


def _share_aad(sender: int, receiver: int, first_sum: int, run_tag: bytes) -> bytes:
    return f"secagg-share|{sender}|{receiver}|{first_sum}|".encode() + run_tag


@handler("secagg_share")
def share_seeds(content: RecordDict, node: NodeContext) -> RecordDict:
    """Round 2: draw one self-mask seed per upcoming sum, Shamir-share each, seal per holder."""
    st = _state(node.state)
    cfg = content.config_records[SECAGG_KEY]
    me = node.context.node_id
    neighbours = [int(v) for v in cfg["neighbours"]]
    threshold = int(cfg["threshold"])
    first, batch = int(cfg["first-sum"]), int(cfg["batch"])
    holders = [me, *neighbours]
    # 31 bytes: Flower's Shamir pads secrets to 16-byte chunks, so 31 bytes need two chunks
    # (32 would need three) while staying a 248-bit key for HKDF.
    seeds = {first + i: secrets.token_bytes(31) for i in range(batch)}
    shares = {t: split_secret(seed, threshold, len(holders)) for t, seed in seeds.items()}
    for t, seed in seeds.items():
        node.state.config_records[_SEEDS][str(t)] = seed
    st["neighbours"] = neighbours
    st["c-pks"] = [bytes(b) for b in cfg["c-pks"]]
    st["s-pks"] = [bytes(b) for b in cfg["s-pks"]]
    st["threshold"] = threshold
    st["batch"] = batch
    c_keys = NodeKeys.from_private_bytes(bytes(st["c-sk"]))
    run_tag = bytes(st["run-tag"])
    sealed = {}
    for idx, holder in enumerate(holders):
        bundle = b"".join(shares[t][idx] for t in sorted(seeds))
        if holder == me:
            _store_bundle(node.state, me, first, batch, bundle)
            continue
        key = c_keys.shared_key(st["c-pks"][idx - 1], agreement_context(run_tag, b"share"))
        sealed[str(holder)] = seal(key, bundle, _share_aad(me, holder, first, run_tag))
    return RecordDict({"shares": ConfigRecord(sealed)})


def _store_bundle(state: RecordDict, sender: int, first: int, batch: int, bundle: bytes) -> None:
    """Keep the shares of ``sender``'s seeds for sums first..first+batch-1, one per sum."""
    if len(bundle) % batch:
        raise SecAggError(f"share bundle from node {sender} has a bad length {len(bundle)}")
    size = len(bundle) // batch
    received = state.config_records[_RECEIVED]
    for i in range(batch):
        received[f"{first + i}:{sender}"] = bundle[i * size:(i + 1) * size]


def _receive_shares(content: RecordDict, state: RecordDict, me: int) -> None:
    """Open the sealed shares the server relayed; a tampered one names its sender."""
    if SHARES_KEY not in content.config_records:
        return
    st = _state(state)
    c_keys = NodeKeys.from_private_bytes(bytes(st["c-sk"]))
    neighbours = [int(v) for v in st["neighbours"]]
    c_pks = dict(zip(neighbours, (bytes(b) for b in st["c-pks"])))
    run_tag = bytes(st["run-tag"])
    for tag, blob in content.config_records[SHARES_KEY].items():
        first_str, _, sender_str = tag.partition(":")
        sender, first = int(sender_str), int(first_str)
        if sender not in c_pks:
            raise SecAggError(f"received a share from node {sender}, which is not a neighbour")
        key = c_keys.shared_key(c_pks[sender], agreement_context(run_tag, b"share"))
        try:
            bundle = open_sealed(key, bytes(blob), _share_aad(sender, me, first, run_tag))
        except Exception as exc:  # AuthenticationError
            raise SecAggError(
                f"share relayed from node {sender} to node {me} failed authentication "
                f"(tampered or forged): {exc}"
            ) from None
        _store_bundle(state, sender, first, int(st["batch"]), bundle)


def _pairwise_keys(st: ConfigRecord, me: int, sum_id: int) -> dict[int, bytes]:
    """k_uv^(t) with every neighbour v."""
    s_keys = NodeKeys.from_private_bytes(bytes(st["s-sk"]))
    context = agreement_context(bytes(st["run-tag"]), b"mask")
    return {
        v: pairwise_sum_key(s_keys.shared_key(bytes(pk), context), sum_id)
        for v, pk in zip((int(x) for x in st["neighbours"]), st["s-pks"])
    }


def mask_values(content: RecordDict, state: RecordDict, me: int, vec: np.ndarray) -> np.ndarray:
    """Fixed-point encode ``vec`` and add the self mask and the pairwise masks for this sum."""
    _receive_shares(content, state, me)
    st = _state(state)
    cfg = content.config_records[SECAGG_KEY]
    sum_id = int(cfg["sum-id"])
    if sum_id <= int(st["last-sum"]):
        raise SecAggError(f"refusing sum id {sum_id}: ids must increase (last {st['last-sum']}); "
                          "reusing masks would reveal differences of inputs")
    seeds = state.config_records[_SEEDS]
    if str(sum_id) not in seeds:
        raise SecAggError(f"no self-mask seed shared for sum {sum_id}")
    codec = FixedPoint(max_abs=float(cfg["max-abs"]), frac_bits=int(cfg["frac-bits"]))
    try:
        out = codec.encode(vec)
    except OverflowError as exc:
        raise OverflowError(f"node {me}: {exc}") from None
    n = out.shape[0]
    out += self_mask(bytes(seeds[str(sum_id)]), sum_id, n)
    alive = {int(v) for v in cfg["alive"]}
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
    cfg = content.config_records[SECAGG_KEY]
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
    revealed = node.state.config_records[_REVEALED]
    if str(sum_id) in revealed:
        raise SecAggError(f"node {me} refuses to unmask sum {sum_id} twice")
    revealed[str(sum_id)] = True
    received = node.state.config_records[_RECEIVED]
    out: dict[str, bytes] = {}
    for owner in sorted(neighbourhood & survivors):
        out[f"b:{owner}"] = bytes(received.pop(f"{sum_id}:{owner}"))
    keys = _pairwise_keys(st, me, sum_id)
    for owner in sorted(neighbours & dropped):
        out[f"k:{owner}"] = keys[owner]
    return RecordDict({"revealed": ConfigRecord(out)})
