"""LP-GCN (paper 001): lossless federated LightGCN / LightGCN+ over the sealed relay.

Node side ``clients/lpgcn.py``, math ``fedrec/recsys/lightgcn.py`` (shared with the
centralized reference :class:`fedrec.recsys.lightgcn.LightGCN`), decisions and costs
``docs/protocols/lpgcn.md``.

Setup: handshake and the run's aggregator; the shared key S made by a random node and relayed
sealed (``fedrec.secure.relay``: the server never holds S); the number of training
interactions as a sum (batches per epoch); every node's held item set as pseudonyms under S
(real and virtual items mixed), with its signature on the run's node set; a greedy set cover
of the items by nodes and one random convolution node per item from the cover, confirmed by
each convolution node to its items' holders by sealed mail (under catalogue holdings each
holder list is the whole signed node set); the verification by sealed mail (true degrees,
real holders only; an item held only virtually trains as in centralized LightGCN, with
degree 0).

Each training step is a sequence of synchronous rounds in which every node does what has
become computable (``lpgcn_round``): convolution nodes upload their items' rows layer by
layer and the server forwards each layer to the items' holders once all of it arrived; user
rows travel only sealed, as each node's per-item shares, to the convolution nodes; after the
loss, each node uploads its item-gradient partials per layer (virtual holders' cover values
cancelled by the convolution node's) and the server sums them and sends each sum to the
item's holders, who form their users' gradients locally. The last sums ride on the next
step's first round. LightGCN takes ``L + 1 + ceil((L+1)/2)`` rounds per step, LightGCN+ two
more (its W update and broadcast), both within ``2L + 2`` for ``L >= 3``.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from typing import Any

import numpy as np
import scipy.sparse as sp
from flwr.app import ConfigRecord, RecordDict

from fedrec.config import Key
from fedrec.records import from_array_record, to_array_record
from fedrec.recsys.cover import assign_items, greedy_cover
from fedrec.recsys.lightgcn import BACKBONES, LightGCN, layer_mean, n_batches
from fedrec.recsys.metrics import evaluate_ranking
from fedrec.secure.pseudonyms import HOLDINGS, is_pseudonym
from fedrec.transport.messenger import NodeTimeoutError
from fedrec.transport.relay_server import relay_secret
from fedrec.wire import lpgcn as wire
from fedrec.wire import request as request_wire
from fedrec.wire.lpgcn import (
    Action,
    AssignRequest,
    CountRequest,
    CountSum,
    EvaluateRequest,
    Holdings,
    HoldingsRequest,
    Hyper,
    LossesRequest,
    LossSum,
    Part,
    RoundRequest,
    RoundStatus,
    VerifyRequest,
)
from fedrec.wire.message import Message
from fedrec.wire.sums import NODESET_SIGNED_KEY, NodeSetRequest, node_set_signature
from strategies.base import Federation, ProtocolStrategy, RunOutcome
from strategies.policy_needs import PolicyNeed

log = logging.getLogger("fedrec")
#: A node's loss share is at most the batch loss; BPR starts at ln 2 = 0.69 per triple.
LOSS_BOUND = 1e3
#: The step of a history row (a result key, not a wire field).
_STEP = "step"

LPGCN_KEYS: tuple[Key, ...] = (
    Key("lpgcn-backbone", "lightgcn", "LP-GCN backbone: `lightgcn` (free user table) or "
        "`lightgcn+` (user layer 0 from a second item table W, paper 001 Eq. 6)",
        choices=BACKBONES, used_by="lpgcn"),
    Key("lpgcn-layers", 3, "graph convolution layers L", min=1, used_by="lpgcn"),
    Key("lpgcn-dim", 64, "embedding dimension", min=1, used_by="lpgcn"),
    Key("lpgcn-lr", 0.001, "Adam learning rate (every layer-0 row, every step)", min=0.0,
        used_by="lpgcn"),
    Key("lpgcn-reg", 1e-4, "L2 weight on the layer-0 rows of each triple (divided by the "
        "batch size)", min=0.0, used_by="lpgcn"),
    Key("lpgcn-batch-size", 2048, "nominal BPR triples per step (the loss divides by it)",
        min=1, used_by="lpgcn"),
    Key("lpgcn-epochs", 1, "training epochs (one positive each per epoch)", min=0,
        used_by="lpgcn"),
    Key("lpgcn-steps", 0, "training steps; 0 = `lpgcn-epochs` x batches per epoch", min=0,
        used_by="lpgcn"),
    Key("lpgcn-alpha", 1.0, "virtual items per user with items under lpgcn-holdings = "
        "sampled (mean; each node draws its count privately in [0, 2 alpha n]); 0: no virtual "
        "items at all, needs the nodes' allow-plain", min=0.0, used_by="lpgcn"),
    Key("lpgcn-holdings", "catalogue", "which virtual items a node holds: `catalogue` (every "
        "item its users do not hold, so every node holds the whole catalogue and the held sets "
        "show nothing of the real ones) or `sampled` (the paper's: about lpgcn-alpha per user, "
        "drawn afresh each run; needs the nodes' allow-sampled-holdings, since an item one "
        "node holds is then that node's real item)", choices=HOLDINGS, used_by="lpgcn"),
    Key("lpgcn-mask-scale", 1.0, "std of the cover values every holder adds to its "
        "item-gradient partials of items another node convolves (cancelled by that node); "
        "far above the partials so real and virtual holdings look alike; nodes refuse less "
        "than their lpgcn-min-mask-scale (default 0.1); float32 runs need a smaller one",
        min=0.0, used_by="lpgcn"),
    Key("lpgcn-init-std", 0.1, "std of the normal initial layer-0 rows", min=0.0,
        used_by="lpgcn"),
    Key("lpgcn-dtype", "float64", "arithmetic precision (float64: equals the centralized "
        "reference to rounding)", choices=wire.DTYPES, used_by="lpgcn"),
    Key("lpgcn-eval-every", 0, "evaluate every this many epochs during training (0: only at "
        "the end)", min=0, used_by="lpgcn"),
    Key("lpgcn-top-k", 20, "K of Recall@K / NDCG@K", min=1, used_by="lpgcn"),
    Key("lpgcn-start-step", 0, "first training step: > 0 continues a training run; every "
        "node then starts from the checkpoint its operator names in its node config "
        "(`lpgcn-init`, taken at this step), never from anything the server sends", min=0,
        used_by="lpgcn"),
)


class LosslessRunError(RuntimeError):
    """The run cannot stay equal to centralized training (a node dropped, bad uploads)."""


class LPGCN(ProtocolStrategy):
    """Lossless federated LightGCN / LightGCN+ (paper 001)."""

    config_keys = LPGCN_KEYS

    def __init__(self, cfg: Mapping[str, Any] | None = None) -> None:
        super().__init__(cfg)
        cfg = self.cfg
        self.backbone = cfg["lpgcn-backbone"]
        self.layers, self.dim = cfg["lpgcn-layers"], cfg["lpgcn-dim"]
        self.lr, self.reg = cfg["lpgcn-lr"], cfg["lpgcn-reg"]
        self.batch_size = cfg["lpgcn-batch-size"]
        self.epochs, self.steps = cfg["lpgcn-epochs"], cfg["lpgcn-steps"]
        self.alpha, self.mask_scale = cfg["lpgcn-alpha"], cfg["lpgcn-mask-scale"]
        self.holdings = cfg["lpgcn-holdings"]
        self.init_std, self.dtype = cfg["lpgcn-init-std"], cfg["lpgcn-dtype"]
        self.eval_every, self.top_k = cfg["lpgcn-eval-every"], cfg["lpgcn-top-k"]
        self.seed = cfg["seed"]
        #: The first training step (``lpgcn-start-step``; not ``start``, which is Flower's
        #: entry point :meth:`ProtocolStrategy.start`).
        self.start_step = cfg["lpgcn-start-step"]

    def policy_needs(self) -> tuple[PolicyNeed, ...]:
        """The aggregator's needs and the cover every node checks (clients/lpgcn.py
        ``_check_cover``): alpha at or above its ``lpgcn-min-alpha`` (alpha = 0, the plain
        mode: ``allow-plain`` or a minimum of 0), the mask scale at or above its
        ``lpgcn-min-mask-scale``."""
        alpha, scale = self.alpha, self.mask_scale
        needs = list(super().policy_needs())
        min_alpha = PolicyNeed("lpgcn-min-alpha", f"lpgcn-alpha = {alpha:g} (fewer virtual "
                               "items show the server which items a node holds)", alpha,
                               at_most=True)
        if alpha == 0:
            needs.append(PolicyNeed("allow-plain", "LP-GCN without virtual items (lpgcn-alpha "
                                    "= 0)", alternative=min_alpha))
        else:
            needs.append(min_alpha)
            needs.append(PolicyNeed("lpgcn-min-mask-scale", f"lpgcn-mask-scale = {scale:g} "
                                    "(smaller covers tell virtual holdings from real ones)",
                                    scale, at_most=True))
        return tuple(needs)

    # -- the centralized reference ------------------------------------------------------------
    def reference_model(self, train: Any) -> LightGCN:
        return LightGCN(train, dim=self.dim, layers=self.layers, lr=self.lr, reg=self.reg,
                        batch_size=self.batch_size, seed=self.seed, backbone=self.backbone,
                        init_std=self.init_std, dtype=np.dtype(self.dtype).type)

    def total_steps(self, nbatches: int) -> int:
        return self.steps or self.epochs * nbatches

    def reference(self, data: Any) -> dict[str, float]:
        """Centralized LightGCN(+) with this run's budget, evaluated like the nodes do."""
        model = self.reference_model(data.train)
        model.fit(self.total_steps(model.nbatches))
        uf, vf = model.final_embeddings()
        sums = evaluate_ranking(lambda rows: uf[rows] @ vf.T, data.train, data.test,
                                k=self.top_k)
        return {"train-loss": model.losses[-1] if model.losses else float("nan"),
                **sums.means()}

    # -- the protocol -------------------------------------------------------------------------
    def hyper(self) -> Hyper:
        """Public hyperparameters every LP-GCN request carries."""
        return Hyper(backbone=self.backbone, layers=self.layers, dim=self.dim, lr=self.lr,
                     reg=self.reg, batch_size=self.batch_size, seed=self.seed,
                     alpha=self.alpha, holdings=self.holdings, mask_scale=self.mask_scale,
                     init_std=self.init_std, dtype=self.dtype, start_step=self.start_step)

    def run(self, fed: Federation) -> RunOutcome:
        run = _Run(self, fed)
        run.setup()
        return run.train()


class _Run:
    """One LP-GCN run on the server: the pseudonymous graph, the routing, the rounds."""

    def __init__(self, strategy: LPGCN, fed: Federation) -> None:
        self.s, self.fed, self.messenger = strategy, fed, fed.messenger
        self.nodes = fed.nodes
        #: The hyperparameters as keyword arguments of a request (with ``nbatches`` once the
        #: interaction count is known).
        self.hp: dict[str, Any] = dataclasses.asdict(strategy.hyper())
        self.L, self.d = strategy.layers, strategy.dim
        self.dtype = np.dtype(strategy.dtype)
        self.history = strategy.new_history()  # evaluation rows, kept if the run fails

    # -- helpers ------------------------------------------------------------------------------
    def send(self, action: str, contents: Mapping[int, RecordDict],
             phase: str) -> dict[int, RecordDict]:
        try:
            return self.messenger.send(action, contents, phase=phase)
        except NodeTimeoutError as exc:
            raise LosslessRunError(
                f"{exc}; LP-GCN stops: every node computes its own users and its convolution "
                "items in every round, nobody else can, so without it the run would no longer "
                "equal centralized training") from None

    @staticmethod
    def content(*messages: Message, parts: Mapping[str, np.ndarray] | None = None,
                records: Mapping[str, ConfigRecord] | None = None) -> RecordDict:
        """One request: a round's ``parts`` (named by ``wire.name``), ``messages`` (each in
        its records) and further ``records`` (the node-set layer's)."""
        content = RecordDict()
        if parts:
            content[request_wire.ARRAYS] = to_array_record(parts)
        for message in messages:
            for name, record in message.to_records().items():
                content[name] = record
        for name, record in (records or {}).items():
            content[name] = record
        return content

    # -- setup --------------------------------------------------------------------------------
    def setup(self) -> None:
        fed, label = self.fed, self.messenger.label
        relay_secret(self.messenger, self.nodes, purpose=wire.SECRET_PURPOSE, seed=self.s.seed)
        total = fed.sum_of(CountRequest(**self.hp), CountSum, phase="lpgcn-setup",
                           max_abs=float(fed.max_users) * fed.n_items + 1.0)
        self.n_interactions = int(round(float(total.n[0])))
        self.nbatches = n_batches(self.n_interactions, self.s.batch_size)
        self.hp = dict(self.hp, nbatches=self.nbatches)
        # each node commits to the run's node set with its holdings and signs it; the
        # assignment carries every signature (holder lists are checked against that set)
        request = HoldingsRequest(**self.hp)
        members = NodeSetRequest(members=sorted(self.nodes))
        replies = self.send(Action.HOLDINGS, {n: self.content(request, members)
                                              for n in self.nodes}, "lpgcn-setup")
        self.node_set_signatures = ConfigRecord({
            str(n): node_set_signature(replies[n], label(n)) for n in self.nodes})
        held = {}
        for n in self.nodes:
            h = Holdings.from_records(replies[n], label(n)).held
            if h.dtype != np.int64 or not is_pseudonym(h) or np.any(np.diff(h) <= 0):
                raise LosslessRunError(f"{label(n)} sent an item set that is not a sorted "
                                       "list of distinct pseudonyms")
            held[n] = h
        self.catalogue = np.unique(np.concatenate(list(held.values())))
        m = fed.n_items
        if len(self.catalogue) != m:
            raise LosslessRunError(
                f"{m - len(self.catalogue)} of {m} catalogue items are held by no node, not "
                "even virtually; LP-GCN needs every item to have a training interaction "
                "(drop items without one from the catalogue)" if len(self.catalogue) < m else
                f"the nodes hold {len(self.catalogue)} distinct pseudonyms for {m} items "
                "(do they share one key S?)")
        self.held_idx = {n: np.searchsorted(self.catalogue, held[n]) for n in self.nodes}
        self.conv = self.assign_convolution()
        self.conv_nodes = [n for n in self.nodes if len(self.conv_idx[n])]
        self.verify()

    def assign_convolution(self) -> np.ndarray:
        """Greedy set cover of the items by nodes, then one random cover holder per item."""
        m = len(self.catalogue)
        rows = np.concatenate([np.full(len(self.held_idx[n]), k) for k, n in enumerate(self.nodes)])
        cols = np.concatenate([self.held_idx[n] for n in self.nodes])
        holds = sp.csr_matrix((np.ones(len(rows), dtype=bool), (rows, cols)),
                              shape=(len(self.nodes), m))
        cover = greedy_cover(holds)
        picks = assign_items(holds, cover, np.random.default_rng([self.s.seed, 53]))
        ids = np.asarray(self.nodes, dtype=np.uint64)  # Flower node ids are unsigned 64-bit
        conv = ids[picks]
        H = holds.tocsc()
        H.sort_indices()
        holders = [[self.nodes[k] for k in H.indices[H.indptr[i]:H.indptr[i + 1]]]
                   for i in range(m)]
        in_cover = {self.nodes[k] for k in cover}
        self.holders = holders
        self.cover = sorted(in_cover)
        self.conv_idx = {n: np.flatnonzero(conv == n) for n in self.nodes}
        return conv

    def verify(self) -> None:
        """Assignment round (convolution nodes mail their holders a confirmation), then the
        verification's two rounds (counts to confirmed convolution nodes; degrees back)."""
        contents = {}
        for n in self.nodes:
            mine = self.conv_idx[n]
            ptr = nodes = None
            if len(mine):
                lists = [self.holders[i] for i in mine]
                ptr = np.r_[0, np.cumsum([len(h) for h in lists])].astype(np.int64)
                nodes = np.asarray([x for h in lists for x in h], np.uint64)
            request = AssignRequest(**self.hp, conv_of=self.conv[self.held_idx[n]],
                                    hold_ptr=ptr, hold_nodes=nodes)
            contents[n] = self.content(
                request, records={NODESET_SIGNED_KEY: self.node_set_signatures})
        self.send(Action.ASSIGN, contents, "lpgcn-setup")
        verify = VerifyRequest(**self.hp)
        for _ in range(2):  # counts once confirmed, then degrees
            self.send(Action.VERIFY, {n: self.content(verify) for n in self.nodes},
                      "lpgcn-setup")

    # -- training -----------------------------------------------------------------------------
    def train(self) -> RunOutcome:
        total = self.s.total_steps(self.nbatches)
        per_eval = self.s.eval_every * self.nbatches
        pending: dict[int, dict[str, np.ndarray]] = {n: {} for n in self.nodes}
        rounds: list[int] = []
        log.info("LP-GCN (%s, L=%d): %d nodes, %d convolution nodes, %d steps of %d batches "
                 "per epoch", self.s.backbone, self.L, len(self.nodes), len(self.conv_nodes),
                 total, self.nbatches)
        start = self.s.start_step
        end = start + total
        for step in range(start, end):
            evaluate = per_eval > 0 and step > start and step % per_eval == 0
            pending, n_rounds = self.step(step, True, pending, evaluate)
            rounds.append(n_rounds)
        _, n_final = self.step(end, False, pending, True)
        losses = np.zeros(0)
        if total:
            losses = self.fed.sum_of(LossesRequest(**self.hp, steps=end), LossSum,
                                     max_abs=LOSS_BOUND, phase="lpgcn-losses").loss[start:]
        by_step = {row[_STEP]: row for row in self.history}
        history = [{_STEP: s, "epoch": s / self.nbatches, "rounds": r,
                    "train-loss": float(losses[s - start]), **by_step.get(s, {})}
                   for s, r in enumerate(rounds, start)]
        history += [row for s, row in sorted(by_step.items()) if s >= end]
        final = by_step[end]
        metrics = {k: v for k, v in final.items() if k not in (_STEP, "epoch")}
        if total:
            metrics["train-loss"] = float(losses[-1])
        return RunOutcome(
            metrics=metrics, history=history,
            extra={"losses": losses, "rounds_per_step": rounds,
                   "final_forward_rounds": n_final, "nbatches": self.nbatches,
                   "n_interactions": self.n_interactions,
                   "convolution_nodes": len(self.conv_nodes), "cover": len(self.cover)},
            privacy={"lpgcn": {
                "server_sees": "pseudonymous held item sets (real and virtual mixed; the "
                               "whole catalogue at every node with lpgcn-holdings = "
                               "catalogue), item rows and item-gradient partials per node in "
                               "clear, requested negatives' pseudonyms, sealed mail sizes; "
                               "never user rows, item ids or S (the initial item rows, from "
                               "public seed streams, map pseudonyms to ids)",
                "holdings": self.s.holdings,
                "convolution_nodes": len(self.conv_nodes)}})

    def step(self, step: int, train: bool, pending: dict[int, dict[str, np.ndarray]],
             evaluate: bool) -> tuple[dict[int, dict[str, np.ndarray]], int]:
        """The rounds of one step (or, ``train=False``, of one forward pass): route uploads
        to the nodes that need them until the step's last gradient sums are formed (they
        ride on the next step's first round: returned as its deliveries)."""
        L, m, d = self.L, len(self.catalogue), self.d
        E = np.zeros((L + 1, m, d), self.dtype)
        G = np.zeros((L + 1, m, d), self.dtype)
        W = np.zeros((m, d), self.dtype)
        e_got: list[set[int]] = [set() for _ in range(L + 1)]
        g_got: list[set[int]] = [set() for _ in range(L + 1)]
        w_got: set[int] = set()
        e_sent, g_sent = [False] * (L + 1), [False] * (L + 1)
        w_sent = neg_sent = evaluated = False
        neg_idx: dict[int, np.ndarray] = {}
        convs, everyone = set(self.conv_nodes), set(self.nodes)
        phase = "lpgcn-train" if train else "lpgcn-forward"
        label = self.messenger.label
        request = RoundRequest(**self.hp, step=step, train=train)
        for r in range(1, 4 * L + 12):
            contents = {n: self.content(request, parts=pending[n]) for n in self.nodes}
            replies = self.send(Action.ROUND, contents, phase)
            pending = {n: {} for n in self.nodes}
            forward_done = True
            for n in self.nodes:
                forward_done &= RoundStatus.from_records(replies[n], label(n)).forward_done
                if request_wire.ARRAYS not in replies[n].array_records:
                    continue
                for array_name, x in from_array_record(replies[n][request_wire.ARRAYS]).items():
                    try:
                        part, layer = wire.parse(array_name)
                    except wire.WireError as exc:
                        raise LosslessRunError(f"{label(n)} sent {exc}") from None
                    if part is Part.NEG_REQUEST:
                        if len(x) and not is_pseudonym(x):
                            raise LosslessRunError(f"{label(n)} asked for non-pseudonyms")
                        idx = np.searchsorted(self.catalogue, x)
                        if len(x) and (idx.max() >= m or np.any(self.catalogue[idx] != x)):
                            raise LosslessRunError(f"{label(n)} asked for unknown items")
                        neg_idx[n] = idx
                    elif part is Part.W:
                        W[self.conv_idx[n]] = x
                        w_got.add(n)
                    elif part is Part.ITEM_ROWS:
                        E[layer, self.conv_idx[n]] = x
                        e_got[layer].add(n)
                    elif part is Part.NEG_GRAD:
                        G[layer, neg_idx[n]] += x
                    elif part is Part.ITEM_GRAD:
                        if n in g_got[layer]:
                            raise LosslessRunError(f"{label(n)} sent layer {layer} twice")
                        G[layer, self.held_idx[n]] += x
                        g_got[layer].add(n)
                    else:
                        raise LosslessRunError(f"{label(n)} sent {part.value!r}, which only "
                                               "the server sends")
            for layer in range(L + 1):
                if not e_sent[layer] and e_got[layer] >= convs:
                    e_sent[layer] = True
                    for n in self.nodes:
                        pending[n][wire.name(Part.ITEM_ROWS, layer)] = E[layer, self.held_idx[n]]
            if train and all(e_sent) and not neg_sent:
                neg_sent = True
                for n in self.nodes:
                    idx = neg_idx.get(n, np.zeros(0, np.int64))
                    pending[n][wire.name(Part.NEG_ROWS)] = np.ascontiguousarray(E[:, idx].transpose(1, 0, 2))
            if self.s.backbone == "lightgcn+" and not w_sent and w_got >= convs:
                w_sent = True
                for n in self.nodes:
                    pending[n][wire.name(Part.W)] = W[self.held_idx[n]]
            for layer in range(L + 1):
                if train and not g_sent[layer] and g_got[layer] >= everyone:
                    g_sent[layer] = True
                    for n in self.nodes:
                        if layer:
                            pending[n][wire.name(Part.ITEM_GRAD, layer)] = G[layer, self.held_idx[n]]
                        elif len(self.conv_idx[n]):
                            pending[n][wire.name(Part.ITEM_GRAD, 0)] = G[0, self.conv_idx[n]]
            if evaluate and not evaluated and forward_done and all(e_sent):
                evaluated = True
                self.evaluate(step, layer_mean(list(E)))
            if train and g_sent[0]:
                return pending, r
            if not train and evaluated:
                return pending, r
        raise LosslessRunError(f"step {step} did not finish within {r} rounds (uploads "
                               "missing: a node out of step?)")

    def evaluate(self, step: int, table: np.ndarray) -> None:
        request = EvaluateRequest(**self.hp, top_k=self.s.top_k, V=table)
        metrics = self.fed.evaluate_ranking(request, phase="lpgcn-evaluate")
        log.info("LP-GCN step %d (epoch %.2f): %s", step, step / self.nbatches,
                 ", ".join(f"{k} {v:.4f}" for k, v in metrics.items()
                           if k.split("@")[0] in ("recall", "ndcg")))
        self.history.append({_STEP: step, "epoch": step / self.nbatches, **metrics})
