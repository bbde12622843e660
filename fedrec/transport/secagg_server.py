"""SecAgg+'s server side: :class:`SecureAggregator` runs the key setup, the masked-input
round, the consistency round (when nodes dropped) and the unmasking round over the Flower
Message API, and adds masked inputs as they arrive. The protocol, why every input stays
hidden from a deviating server, and the parts both sides share are in
``fedrec/secure/secagg.py``; the node side is ``clients/secagg_node.py``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

import numpy as np
from flwr.app import ConfigRecord, RecordDict

from fedrec.secure.fixedpoint import FixedPoint
from fedrec.secure.identity import SIGNED_KEY_BYTES
from fedrec.secure.keys import combine_secret
from fedrec.secure.masks import expand_mask
from fedrec.secure.merkle import MerkleTree
from fedrec.secure.secagg import (
    COMPLETE_GRAPH,
    SecAggError,
    neighbour_graph,
    self_mask,
    threshold_for,
)
from fedrec.transport.aggregators import Aggregator, Reply, read_reply
from fedrec.transport.mailroom import prepare_mailroom, take_mail_keys
from fedrec.transport.messenger import Messenger
from fedrec.wire import secagg as secagg_wire
from fedrec.wire.mail import MailKeygen
from fedrec.wire.secagg import (
    BOUND_KEY,
    AdvertiseRequest,
    Confirmation,
    ConfirmRequest,
    MaskBound,
    MaskedSum,
    MaskKey,
    ShareRequest,
    UnmaskRequest,
)
from fedrec.wire.sums import (
    NODESET_SIGNED_KEY,
    VALUES_KEY,
    layout_of,
    node_set_signature,
    reply_values,
    unflatten,
)


class SecureAggregator(Aggregator):
    """Server side of SecAgg+ sums for one run: key setup once, then any number of sums.

    Parameters: ``degree`` of the neighbour graph (None = complete), ``threshold_fraction``
    of each neighbourhood needed to unmask, ``seed`` for the (public) graph, ``seed_batch``
    self-mask seeds shared per share round.

    ``drop`` simulates an unlucky network for tests: node ids whose masked inputs the server
    discards (as if they never arrived). To alter relayed shares, set the mailroom's
    ``tamper`` (``messenger.mailroom.tamper``).
    """

    kind = "secagg+"
    form = "masked"

    def __init__(self, messenger: Messenger, nodes: list[int], *, degree: int | None = None,
                 threshold_fraction: float = 0.5, seed: int = 0, seed_batch: int = 16,
                 drop: set[int] | None = None, allow_dropouts: bool | None = None) -> None:
        super().__init__(messenger, nodes)
        self._allow_dropouts = allow_dropouts
        self.degree, self.threshold_fraction = degree, threshold_fraction
        self.seed, self.seed_batch = seed, seed_batch
        self.drop = set(drop or ())
        self.graph: dict[int, list[int]] = {}
        self.tree: MerkleTree | None = None
        self.index: dict[int, int] = {}
        self.whole: dict[int, bool] = {}
        self.thresholds: dict[int, int] = {}
        self.s_pks: dict[int, bytes] = {}
        self.alive = set(self.nodes)
        self.seeds_until = 0
        self.run_tag = b""
        #: node id -> its signature on the run's node set (from the advertise round)
        self.node_set_signatures: dict[str, bytes] = {}

    # -- setup ----------------------------------------------------------------------------
    def setup(self) -> None:
        """Key setup in two rounds: mask keys (and the mail keys of nodes that have none:
        the sealed relay opens in the same round), then the first batch of self-mask seeds.

        The node set travels as its Merkle root with each node's path to its own leaf
        (``fedrec/secure/merkle.py``), and each node's neighbours with theirs: no request
        grows linearly with the federation, except for nodes with roster identities, which
        need every member's id and signature (``clients/nodeset.py`` ``needs_whole_set``)."""
        room, keyless = prepare_mailroom(self.messenger, self.nodes)
        members = sorted(int(u) for u in self.nodes)
        self.run_tag = hashlib.sha256(
            f"fedrec-secagg-run|{self.seed}:{','.join(map(str, members))}".encode()).digest()
        self.tree = MerkleTree(members)
        self.index = {u: i for i, u in enumerate(members)}
        self.graph = neighbour_graph(members, self.degree, self.seed)
        self.thresholds = {u: threshold_for(len(vs) + 1, self.threshold_fraction)
                           for u, vs in self.graph.items()}
        degree = COMPLETE_GRAPH if self.degree is None else int(self.degree)
        requests = {}
        for u in members:
            roster = self.messenger.report.identity_source(u) != "simulated"
            requests[u] = AdvertiseRequest(
                run_tag=self.run_tag, members_root=self.tree.root, members_count=len(members),
                member_index=self.index[u], member_path=self.tree.path(self.index[u]),
                degree=degree, graph_seed=int(self.seed),
                members=members if roster else None,  # a roster node asks for them
            ).to_records()
            if u in keyless:
                requests[u].update(MailKeygen().to_records())
        replies = self.messenger.send(AdvertiseRequest.ACTION, requests, phase="secagg_setup")
        take_mail_keys(self.messenger, room, keyless, replies)
        room.need(self.graph)  # a node is sent the mail keys of its neighbours only
        self.s_pks = {}
        self.node_set_signatures = {}
        for node, reply in replies.items():
            label = self.messenger.label(node)
            self.node_set_signatures[str(node)] = node_set_signature(reply, label)
            keys = read_reply(MaskKey, reply, label, SecAggError)
            if len(keys.s_pk) != SIGNED_KEY_BYTES:
                raise SecAggError(f"{label}: field '{secagg_wire.KEYS}.s-pk' is not a signed "
                                  f"public key ({SIGNED_KEY_BYTES} bytes)")
            self.s_pks[node] = keys.s_pk
            self.whole[node] = keys.whole_set
        self._share_seeds(first_sum=1)

    def _whole_set(self, node: int) -> bool:
        """Whether ``node`` checks the whole node set (as its advertise reply says: the node
        decides, ``clients/nodeset.py`` ``needs_whole_set``; this only sends what it will ask
        for)."""
        return self.whole.get(node, True)

    def _share_seeds(self, first_sum: int) -> None:
        """One ``secagg_share`` round: seeds for sums [first_sum, first_sum + batch)."""
        requests = {}
        for u in sorted(self.alive):
            neighbours = self.graph[u]
            requests[u] = ShareRequest(
                threshold=self.thresholds[u],
                neighbours=[int(v) for v in neighbours],
                neighbour_paths=[self.tree.path(self.index[v]) for v in neighbours],
                s_pks=[self.s_pks[v] for v in neighbours],
                first_sum=first_sum,
                batch=self.seed_batch,
            ).to_records()
            if self._whole_set(u):
                requests[u][NODESET_SIGNED_KEY] = ConfigRecord(dict(self.node_set_signatures))
        self.messenger.send(ShareRequest.ACTION, requests, phase="secagg_setup")
        self.seeds_until = first_sum + self.seed_batch - 1

    # -- one sum --------------------------------------------------------------------------
    def sum(self, action: str, content: RecordDict | Mapping[int, RecordDict], *,
            max_abs: float, phase: str | None = None, on_reply: Reply | None = None,
            wire_dtype: str = "float64") -> dict[str, np.ndarray]:
        """A masked sum (see :meth:`Aggregator.sum`); replies are 64-bit ring elements, so
        ``wire_dtype`` other than float64 is refused."""
        if wire_dtype != "float64":
            raise ValueError("a SecAgg+ sum travels as 64-bit fixed-point ring elements; "
                             f"wire_dtype {wire_dtype!r} needs aggregator = plain")
        self.sum_id += 1
        phase = phase or action
        if self.sum_id > self.seeds_until:
            self._share_seeds(first_sum=self.sum_id)
        nodes = sorted(self.alive)
        if not nodes:
            raise SecAggError("no live nodes left to aggregate")
        codec = FixedPoint.for_sum(max_abs, len(nodes))
        requests = {}
        for u in nodes:
            requests.update(self._requests(content, [u], MaskedSum(
                sum_id=self.sum_id, frac_bits=codec.frac_bits, max_abs=float(max_abs),
                alive=[int(v) for v in self.graph[u] if v in self.alive]).to_config()))
        total, layout, arrived = self._collect(action, requests, phase, on_reply)
        dropped = set(nodes) - set(arrived)
        discarded = dropped & self.drop
        self.messenger.record_dropout(phase, action, discarded,
                                      "reply discarded by the server (test knob 'drop')")
        if dropped and (self.fixed_set or not self.allow_dropouts):
            self._abandon(phase, action, layout, arrived, dropped)
        confirmations = self._confirm(sorted(arrived), sorted(dropped), phase) if dropped \
            else {}
        total = self._unmask(total, set(arrived), dropped, phase, confirmations)
        self.record_sum(phase, action, layout, len(arrived), dropped, members=arrived)
        self.messenger.ledger.mark(phase, VALUES_KEY, "masked")
        self.messenger.ledger.mark(f"{phase}:unmask", secagg_wire.REVEALED, "unmasking shares")
        return self._checked(unflatten(codec.decode(total), layout), phase, max_abs)

    def _collect(self, action: str, requests: Mapping[int, RecordDict], phase: str,
                 on_reply: Reply | None) -> tuple[np.ndarray, list, list[int]]:
        """The masked inputs' running total (ring addition is exact, so they are added as
        they arrive), their layout and the nodes whose inputs arrived. Every input must have
        one layout and answer the same request (its bound digest)."""
        total: np.ndarray | None = None
        layout: list | None = None
        arrived: list[int] = []
        first_bound: bytes | None = None
        label = self.messenger.label
        for node, reply in self.messenger.iter_replies(action, requests, phase=phase,
                                                       allow_missing=True):
            if node in self.drop:
                continue
            shapes = layout_of(reply, label(node))
            if layout is None:
                layout = shapes
            elif shapes != layout:
                raise SecAggError(f"{label(node)} sent arrays {shapes}, others sent {layout}")
            values = reply_values(reply, label(node), layout, ("uint64",))
            bound = self._bound_of(reply, label(node))
            if first_bound is None:
                first_bound = bound
            elif bound != first_bound:
                raise SecAggError(
                    f"{label(node)} answered another request than the nodes before it (its "
                    f"'{BOUND_KEY}' digest differs): nodes must all be sent the same request "
                    "for a sum, else their masks do not cancel")
            if total is None:
                total = values.copy()
            else:
                total += values
            arrived.append(node)
            if on_reply is not None:
                on_reply(node, reply)
        if total is None or layout is None:
            raise SecAggError(f"no node answered '{action}'")
        return total, layout, arrived

    def _abandon(self, phase: str, action: str, layout: list, arrived: list[int],
                 dropped: set[int]) -> None:
        """Abandon a sum whose node set changed where it must not (a fixed-set protocol, or
        a node that allows no dropouts): recorded, then an error naming each lost node."""
        self.record_sum(phase, action, layout, len(arrived), dropped, members=arrived)
        why = ("this protocol needs the same node set in every sum" if self.fixed_set else
               "not every node's policy allows dropouts (allow-dropouts), so every sum "
               "of the run must hold the node set committed at key setup")
        lost = "; ".join(f"{self.messenger.label(n)} did not answer ({self._why_missing(n)})"
                         for n in sorted(dropped))
        raise SecAggError(
            f"'{phase}': {lost}; {why} (sums over different sets could be differenced), "
            "so the sum is abandoned before unmasking and nothing about any input is "
            "revealed")

    def _why_missing(self, node: int) -> str:
        """Why ``node``'s masked input is missing: the server's test knob, or the reason the
        messenger saw (unavailable per the SuperLink, rejected, silent past the timeout)."""
        if node in self.drop:
            return "reply discarded by the server (test knob 'drop')"
        return self.messenger.missing_reason(node)

    @staticmethod
    def _bound_of(reply: RecordDict, label: str) -> bytes:
        if BOUND_KEY not in reply.config_records:
            raise SecAggError(f"{label} answered a masked sum without record '{BOUND_KEY}'")
        return read_reply(MaskBound, reply, label, SecAggError).digest

    @property
    def allow_dropouts(self) -> bool:
        """Whether sums may go on over fewer nodes: the constructor's choice, else true only
        if every node acknowledged ``allow-dropouts`` in the handshake (the nodes enforce it
        themselves; this only spares a round they would refuse)."""
        if self._allow_dropouts is not None:
            return self._allow_dropouts
        report = self.messenger.report
        return all(bool(report.policy(u).get("allow-dropouts", False)) for u in self.nodes)

    def _confirm(self, survivors: list[int], dropped: list[int], phase: str) -> dict[int, bytes]:
        """The consistency round of a sum with dropouts (Bonawitz et al. 2017, round 3): every
        survivor signs the split (the dropped list; the survivors follow from the committed
        set) once; each survivor later unmasks only if it holds the signatures on the split it
        is shown of every survivor (a node with the whole set) or of its surviving
        neighbourhood (Bell et al.), so no two of them can be shown different splits."""
        req = ConfirmRequest(sum_id=self.sum_id, dropped=dropped)
        replies = self.messenger.send(req.ACTION, dict.fromkeys(survivors, req.to_records()),
                                      phase=f"{phase}:confirm")
        out: dict[int, bytes] = {}
        for v in survivors:
            label = self.messenger.label(v)
            if secagg_wire.CONFIRMATION not in replies[v].config_records:
                raise SecAggError(f"{label} answered the consistency round without record "
                                  f"'{secagg_wire.CONFIRMATION}'")
            out[v] = read_reply(Confirmation, replies[v], label, SecAggError).signed
        return out

    def _unmask(self, total: np.ndarray, survivors: set[int], dropped: set[int],
                phase: str, confirmations: Mapping[int, bytes] | None = None) -> np.ndarray:
        """Remove survivors' self masks and the masks survivors shared with dropped nodes.

        Tolerates nodes that go silent during this round: a survivor's self-mask seed needs
        only ``threshold`` shares from its neighbourhood. What cannot be replaced is the
        pairwise key between a silent node and a neighbour that dropped before masking (only
        those two held it); then the sum is abandoned with an error naming both.
        """
        askers = sorted(survivors)
        requests = {}
        for v in askers:
            signed = None
            if confirmations:
                pool = askers if self._whole_set(v) else \
                    sorted(({v} | set(self.graph[v])) & survivors)
                signed = [confirmations[w] for w in pool]
            requests[v] = UnmaskRequest(sum_id=self.sum_id, dropped=sorted(dropped),
                                        confirmations=signed).to_records()
        action, round_phase = UnmaskRequest.ACTION, f"{phase}:unmask"
        replies = dict(self.messenger.iter_replies(
            action, requests, phase=round_phase, allow_missing=True))
        silent = set(askers) - set(replies)
        label = self.messenger.label
        for v in sorted(silent):
            lost = [u for u in sorted(dropped) if v in self.graph[u]]
            if lost:
                raise SecAggError(
                    f"cannot unmask: {label(v)} went silent in the unmasking and was the only "
                    f"survivor holding its pairwise key with dropped "
                    f"{', '.join(label(u) for u in lost)}; the sum is abandoned")
        b_shares: dict[int, list[bytes]] = {u: [] for u in survivors}
        n = total.shape[0]
        for v, reply in sorted(replies.items()):
            if secagg_wire.REVEALED not in reply.config_records:
                raise SecAggError(f"{label(v)} answered the unmasking without field "
                                  f"'{secagg_wire.REVEALED}'")
            for key, value in reply.config_records[secagg_wire.REVEALED].items():
                kind, _, owner_str = key.partition(":")
                if kind not in ("b", "k") or not owner_str.lstrip("-").isdigit() or \
                        not isinstance(value, bytes):
                    raise SecAggError(f"{label(v)}: field 'revealed.{key}' is not a share "
                                      "('b:<node>') or a key ('k:<node>') in bytes")
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
        # A node silent here is not dropped: its input is in this sum, and it stays in the
        # node set every later sum must hold (nodes refuse any other set unless they allow
        # dropouts, and then a later sum's consistency round drops it).
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


__all__ = ["SecureAggregator"]
