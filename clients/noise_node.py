"""Node side of distributed noise in a SecAgg+ sum (``fedrec/secure/distributed_noise.py``).

A protocol opts a sum into noise with a record
:data:`fedrec.secure.distributed_noise.NOISE_KEY` in its request (fields
:data:`~fedrec.secure.distributed_noise.NOISE_FIELDS`); it is shared by the sum's nodes and
bound into the request digest their masks are keyed to, so a server that gives one node
another sigma gets masks that do not cancel. What the node
derives or checks itself, never taking the server's word:

- its share: variance sigma_total^2 / m, m the sum's committed node set less the dropouts
  its survivors signed (``clients/secagg_node.py``), the same m that sizes the codec;
- the fewest shares the unmasked sum can hold: m when its policy refuses dropouts (every
  sum then covers the whole set), else its ``min-survivors``; the noise multiplier it
  accounts is sqrt(that) times its share over the clip norm, and it refuses a request
  whose multiplier is below its policy's ``dp-min-noise``;
- its contribution: every protocol array (not the sum layer's clip flag) scaled to L2 norm
  at most ``l2``, then truncated toward zero on the noise grid, so the sensitivity is
  exact whatever its handler computed; ``l2`` must lie within the declared range, and the
  sum layer's clip flag is sent as 0 (it would count, without noise, the nodes whose raw
  values left the range);
- its participation: ``rate`` below 1 is accounted as Poisson sampling, so the
  handler must have drawn it here (:func:`participates`, the node's own CSPRNG) or the
  sum layer refuses to answer;
- delta: the smaller of the request's ``delta`` and its policy's ``dp-max-delta``;
- its budget: before its first noisy sum of the run, the epsilon of all ``releases``
  planned sums (on top of what its ledger already holds) against ``dp-budget``, refused
  with one line naming the node and the key; then, before each sum is masked, the
  increase of the run's composed epsilon is charged to its ledger
  (``clients/dp_ledger.py``), so the charges of a run add up to the run's epsilon.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import numpy as np
from flwr.app import ConfigRecord

from clients.node import NodeContext
from fedrec.dp import PrivacyLedger
from fedrec.dp_sampling import RandomBits, discrete_gaussian
from fedrec.records import config_record
from fedrec.secure.distributed_noise import (
    NOISE_KEY,
    TAIL_SIGMAS,
    NoisePlan,
    composed_epsilon,
    noise_bits,
    truncate_l2,
)
from fedrec.secure.fixedpoint import FixedPoint
from fedrec.wire.message import Message, WireError, message, reply
from fedrec.wire.secagg import MaskedSum
from fedrec.wire.sums import CLIPPED_KEY, AggregationError, NoiseRequest, SumRequest

#: Node state: this run's noisy sums as accounted (plan fields per sum) and their epsilon.
_HISTORY = "noise.history"
#: The history record's lists, one per :class:`NoisePlan` field, and its run totals.
_PLAN_FIELDS = tuple(f.name for f in dataclasses.fields(NoisePlan))
_RUN_DELTA, _RUN_EPSILON = "delta", "epsilon"
#: The one mechanism this module implements.
MECHANISM = "ddg"


# Typed so a corrupted or stale record is refused on reload naming the field, never used:
# a history cut short would under-account the run's epsilon.
@message()
class NoiseHistory(Message):
    """This run's noisy sums as this node accounted them (node-state record
    :data:`_HISTORY`): one list per :class:`NoisePlan` field, one entry per sum, and the
    run's ``delta`` and composed ``epsilon`` so far (names as the record always had them)."""

    CONFIG = _HISTORY
    ARRAYS = f"{_HISTORY}.arrays"  # none: a node state names its own records

    sigma: list[float] = reply(min=0.0, doc="per-node noise scale, grid units")
    shares: list[int] = reply(min=1, doc="fewest shares the unmasked sum can hold")
    l2: list[float] = reply(min=0.0, doc="L2 bound, grid units")
    dim: list[int] = reply(min=0, doc="the contribution's dimension")
    rate: list[float] = reply(min=0.0, doc="Poisson sampling rate")
    delta: float = reply(min=0.0, name=_RUN_DELTA, doc="the run's delta")
    epsilon: float = reply(min=0.0, name=_RUN_EPSILON, doc="the run's epsilon so far")

    def __post_init__(self) -> None:
        lengths = {f: len(getattr(self, f)) for f in _PLAN_FIELDS}
        if len(set(lengths.values())) > 1:
            raise WireError(f"NoiseHistory fields {', '.join(map(repr, _PLAN_FIELDS))} "
                            "must list one entry per sum each")

    @property
    def plans(self) -> list[NoisePlan]:
        return [NoisePlan(*p) for p in zip(*(getattr(self, f) for f in _PLAN_FIELDS),
                                           strict=True)]


class NoiseRefused(AggregationError):
    """A node refuses a noisy sum (a request-only or budget reason, never its values)."""


@dataclasses.dataclass(frozen=True)
class _Noise:
    """A noisy sum's parameters as this node checked and derived them: the request's total
    ``sigma``, ``l2``, ``rate``, ``releases`` and ``delta`` (capped by its policy), the sum's
    node count ``m``, its ``share`` of the noise and the fewest ``shares`` it accounts."""

    sigma: float
    l2: float
    rate: float
    delta: float
    releases: int
    m: int
    share: float
    shares: int


def requested(node: NodeContext) -> ConfigRecord | None:
    """The request's noise record, if the sum opts into distributed noise (read it with
    :func:`noise_request`)."""
    return config_record(node.request, NOISE_KEY)


def noise_request(node: NodeContext) -> NoiseRequest | None:
    """The request's noise record as its message, if the sum opts into distributed noise
    (every field present and typed, else a refusal naming it)."""
    return node.read(NoiseRequest) if requested(node) is not None else None


def _number(node: NodeContext, name: str, value: float, lo: float, hi: float) -> float:
    """``value`` of field ``name`` (record.field) if in (lo, hi], else a refusal naming
    the field."""
    if not (math.isfinite(value) and lo < value <= hi):
        raise NoiseRefused(f"{node.who} refuses the noisy sum: field '{name}' must "
                           f"be a number in ({lo:g}, {hi:g}], got {value!r}")
    return value


def _sum_nodes(node: NodeContext) -> int:
    from clients.secagg_node import _committed

    count, dropped = _committed(node)
    return count - len(dropped)


def _params(node: NodeContext, sums: SumRequest) -> _Noise:
    """The request's noise fields, checked (request and policy only) against its sum
    record ``sums``."""
    req = noise_request(node)
    assert req is not None
    if req.mechanism != MECHANISM:
        raise NoiseRefused(f"{node.who} refuses the noisy sum: field '{NOISE_KEY}.mechanism' "
                           f"= {req.mechanism!r}; it adds '{MECHANISM}' noise only")
    if not isinstance(sums, MaskedSum):
        raise NoiseRefused(f"{node.who} refuses the noisy sum: distributed noise needs a "
                           "SecAgg+ sum (the others would show its share, or its value)")
    if req.releases < 1:
        raise NoiseRefused(f"{node.who} refuses the noisy sum: field '{NOISE_KEY}.releases' "
                           f"must be an integer >= 1, got {req.releases!r}")
    policy = node.policy
    max_abs = sums.max_abs
    sigma = _number(node, f"{NOISE_KEY}.sigma", req.sigma, 0.0, 1e300)
    l2 = _number(node, f"{NOISE_KEY}.l2", req.l2, 0.0, max_abs)
    rate = _number(node, f"{NOISE_KEY}.rate", req.rate, 0.0, 1.0)
    delta = min(_number(node, f"{NOISE_KEY}.delta", req.delta, 0.0, 0.5), policy.dp_max_delta)
    m = _sum_nodes(node)
    p = _Noise(sigma, l2, rate, delta, req.releases, m, sigma / math.sqrt(m),
               m if not policy.allow_dropouts else min(m, policy.min_survivors))
    multiplier = math.sqrt(p.shares) * p.share / p.l2
    if multiplier < policy.dp_min_noise:
        raise NoiseRefused(
            f"{node.who} refuses the noisy sum: its share sigma {p.share:g} over "
            f"{p.shares} share(s) the sum can hold gives noise multiplier {multiplier:g} "
            f"for L2 bound {p.l2:g}, below its node policy dp-min-noise="
            f"{policy.dp_min_noise:g}. Only the node's operator can lower it (node config "
            "'dp-min-noise=<multiplier>')")
    codec = FixedPoint.for_sum(max_abs, max(p.m, 1))
    if TAIL_SIGMAS * p.sigma * codec.scale > 2.0 ** 62:
        raise NoiseRefused(f"{node.who} refuses the noisy sum: noise of total sigma "
                           f"{p.sigma:g} does not fit the ring beside max-abs {max_abs:g} "
                           f"over {p.m} node(s) (declare a larger max-abs)")
    return p


def check_noise_request(node: NodeContext, sums: SumRequest) -> None:
    """The request-only checks, before the handler computes anything
    (``clients/sums_node.py`` ``check_sum_request``, with the sum record it read)."""
    _params(node, sums)
    node._noise_draw = None  # type: ignore[attr-defined]  # set by participates()


def participates(node: NodeContext) -> bool:
    """This node's Poisson draw for the request's noisy sum: True with probability at most
    ``rate`` (a uniform 53-bit integer below floor(rate 2^53), from a ChaCha20 stream
    keyed by ``os.urandom``; the accounted rate is never below the real one). Drawn once
    per request; the server never sees it, since every node answers either way."""
    req = noise_request(node)
    if node.sum_record is None or req is None:
        raise NoiseRefused(f"{node.who}: a participation draw needs a checked noisy sum "
                           "request (a handler declared with sums=True)")
    drawn = getattr(node, "_noise_draw", None)
    if drawn is None:
        rate = req.rate
        word = int(RandomBits().words(1)[0]) >> 11
        drawn = word < math.floor(rate * 2.0 ** 53) or rate >= 1.0
        node._noise_draw = drawn  # type: ignore[attr-defined]
    return bool(drawn)


def _remember(node: NodeContext, plan: NoisePlan, delta: float, epsilon: float) -> None:
    kept = node.load_state(NoiseHistory)
    lists = {f: [*(getattr(kept, f) if kept is not None else []), getattr(plan, f)]
             for f in _PLAN_FIELDS}
    node.save_state(NoiseHistory(**lists, delta=float(delta), epsilon=float(epsilon)))


def run_epsilon(node: NodeContext) -> tuple[float, float]:
    """(epsilon, delta) this node has charged for the run's noisy sums so far."""
    kept = node.load_state(NoiseHistory)
    if kept is None:
        return 0.0, 0.0
    return kept.epsilon, kept.delta


def _charge(node: NodeContext, p: _Noise, plan: NoisePlan, sum_id: int) -> None:
    """The whole-run check before the first noisy sum, then this sum's charge."""
    from clients.dp_ledger import Ledger, ledger_path
    from clients.policy import PolicyError

    kept = node.load_state(NoiseHistory)
    history = [(q, 1) for q in kept.plans] if kept is not None else []
    if kept is not None and kept.delta != p.delta:
        raise NoiseRefused(f"{node.who} refuses the noisy sum: its delta {p.delta:g} is "
                           f"not the run's {kept.delta:g}")
    policy = node.policy
    if not history:
        planned = composed_epsilon([(plan, p.releases)], p.delta)
        spent = Ledger(ledger_path(policy.dp_ledger)).spent(node.ledger_key())
        if spent + planned > policy.dp_budget + 1e-12:
            raise PolicyError(
                f"{node.who} refuses the run's noisy sums: their whole-run epsilon "
                f"{planned:g} (delta {p.delta:g}, {p.releases} sums) on top of "
                f"{spent:g} spent exceeds its node policy dp-budget={policy.dp_budget:g}. "
                "Only the node's operator can raise it (node config 'dp-budget=<epsilon>')")
    before = composed_epsilon(history, p.delta) if history else 0.0
    after = composed_epsilon([*history, (plan, 1)], p.delta)
    release = PrivacyLedger()
    release.record(f"distributed discrete Gaussian sum {sum_id}", "gaussian",
                   epsilon=max(after - before, 1e-12),
                   delta=0.0 if history else p.delta,
                   sigma=plan.noise_multiplier * plan.l2, sensitivity=plan.l2,
                   sample_rate=plan.rate, steps=1)
    node.charge_dp(release, f"noisy sum {sum_id} (distributed discrete Gaussian, the run's "
                   f"epsilon {before:g} -> {after:g} at delta {p.delta:g})")
    _remember(node, plan, p.delta, after)


def noisy_encoder(node: NodeContext, sums: MaskedSum, layout: list[tuple[str, tuple]]
                  ) -> Callable[[FixedPoint, np.ndarray], np.ndarray]:
    """The encoder ``clients/secagg_node.py`` ``mask_values`` uses instead of the codec's:
    the protocol's values clipped to L2 ``l2``, truncated onto the noise grid, plus
    this node's discrete Gaussian share on that grid; the clip flag as 0.
    ``sums``: the request's checked sum record. Charged (and the whole run checked) before
    any noise is drawn."""
    p = _params(node, sums)
    assert isinstance(sums, MaskedSum)  # _params refused every other sum
    sum_id = sums.sum_id
    if p.rate < 1.0 and getattr(node, "_noise_draw", None) is None:
        raise NoiseRefused(f"{node.who} refuses the noisy sum: its rate {p.rate:g} is "
                           "accounted as Poisson sampling, "
                           "but its handler never drew its participation (participates())")
    flag = np.zeros(sum(int(np.prod(s)) if s else 1 for _, s in layout), dtype=bool)
    offset = 0
    for name, shape in layout:
        size = int(np.prod(shape)) if shape else 1
        if name == CLIPPED_KEY:
            flag[offset:offset + size] = True
        offset += size

    def encode(codec: FixedPoint, vec: np.ndarray) -> np.ndarray:
        bits = noise_bits(p.share, codec.frac_bits)
        dim = int((~flag).sum())
        plan = NoisePlan(p.share * 2.0 ** bits, p.shares, p.l2 * 2.0 ** bits, dim, p.rate)
        _charge(node, p, plan, sum_id)
        # the clip flag travels as 0: the L2 clip below bounds every coordinate within the
        # range, and a flag from the values would be a count released without noise
        out = np.zeros(vec.shape, dtype=np.uint64)
        ints = truncate_l2(vec[~flag], p.l2, bits)
        ints += discrete_gaussian(dim, p.share * 2.0 ** bits)
        shift = np.uint64(codec.frac_bits - bits)
        out[~flag] += ints.view(np.uint64) << shift  # wraps mod 2^64: ring addition
        return out

    return encode
