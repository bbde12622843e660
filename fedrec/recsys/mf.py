"""Matrix factorization with the BPR loss: the math FedMF's nodes, its server and its
centralized reference share (one implementation, called by all three).

Objective (implicit feedback). For user u with training items T_u, negatives j are drawn
uniformly from the items u has not interacted with, ``negatives`` per positive i, seeded by
``(seed, round, user id)`` so a node and the centralized reference draw the same triples:

    l_u(U_u, V) = mean over (i, j) of -log sigmoid(U_u . (V_i - V_j)) + reg * |U_u|^2
    L(U, V)     = (1 / N) * sum_u l_u + reg * |V|^2          (N = users with training items)

Two ways to train it, both used federated and centralized:

- **exact** (:func:`bpr_step`): one full-batch gradient step per round, simultaneous in U and
  V. A node holding users S computes ``sum_{u in S} grad_V l_u`` (:attr:`BPRStep.item_grad_sum`);
  the sum over nodes, divided by N, plus ``2 reg V`` (:func:`item_gradient`) is exactly
  ``grad_V L``. So federated and centralized gradient descent agree up to the order of
  float64 additions.
- **local** (:func:`bpr_train_local`): ``epochs`` passes of mini-batch BPR with Adam on the
  given users' factors and a local copy of V; per triple the loss is
  ``-log sigmoid(x) + reg (|U_u|^2 + |V_i|^2 + |V_j|^2)``, averaged over the batch (the usual
  BPR-MF recipe). Adam because BPR gradients are tiny for the many rarely seen items and
  plain SGD needs a per-dataset learning rate to move them; Adam's per-coordinate scale
  makes one ``lr`` work on ML-100K and the synthetic data. A FedMF node calls it on its
  users; the centralized reference (:class:`BPRMF`, ``mode="local"``) calls it on all users,
  which is FedMF with a single node.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import scipy.sparse as sp

from fedrec.recsys.arrays import sqrt, zeros_like

if TYPE_CHECKING:  # torch is imported on first use (~2 s; a deployed message starts a
    import torch  # fresh ClientApp process)

#: Stream tags, so item init, user init, negative sampling and batch order never share draws.
_ITEM_INIT, _USER_INIT, _NEGATIVES, _SHUFFLE = 11, 13, 17, 19


def init_item_factors(n_items: int, dim: int, seed: int, scale: float = 0.1) -> np.ndarray:
    """Item factors V0 (the server's initial model)."""
    return np.random.default_rng([seed, _ITEM_INIT]).normal(0.0, scale, (n_items, dim))


def init_user_factors(user_ids: np.ndarray, dim: int, seed: int,
                      scale: float = 0.1) -> np.ndarray:
    """User factors, each drawn from its own stream so any partition draws the same values."""
    out = np.empty((len(user_ids), dim))
    for row, uid in enumerate(user_ids):
        out[row] = np.random.default_rng([seed, _USER_INIT, int(uid)]).normal(0.0, scale, dim)
    return out


def sample_bpr_triples(train: sp.csr_matrix, user_ids: np.ndarray, seed: int, round_: int,
                       negatives: int = 1) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(row, positive, negative) triples: every positive with ``negatives`` uniform negatives.

    Negatives are drawn uniformly from the items the user has not interacted with, exactly
    (no rejection loop): draw r in [0, n_items - |T_u|) and map it to the r-th non-positive
    item with one ``searchsorted`` on the sorted positives.
    """
    train = sp.csr_matrix(train)
    n_items = train.shape[1]
    rows, pos, neg = [], [], []
    for r in range(train.shape[0]):
        items = np.sort(train.indices[train.indptr[r]:train.indptr[r + 1]])
        if len(items) == 0 or len(items) >= n_items:
            continue
        rng = np.random.default_rng([seed, _NEGATIVES, round_, int(user_ids[r])])
        draws = rng.integers(0, n_items - len(items), size=len(items) * negatives)
        neg_items = draws + np.searchsorted(items - np.arange(len(items)), draws, side="right")
        rows.append(np.full(len(draws), r))
        pos.append(np.repeat(items, negatives))
        neg.append(neg_items)
    if not rows:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, empty
    return np.concatenate(rows), np.concatenate(pos), np.concatenate(neg)


# -- exact mode: full-batch gradient descent ------------------------------------------------
@dataclass
class BPRStep:
    """One full-batch round for a set of users: their new factors and their V-gradient sum."""

    user_factors: np.ndarray  # updated U for the rows given
    item_grad_sum: np.ndarray  # sum over these users of grad_V l_u (no reg, not normalized)
    loss_sum: float  # sum over these users of l_u
    n_users: int  # users with at least one training item

    @property
    def loss(self) -> float:
        """Mean over these users of l_u."""
        return self.loss_sum / self.n_users if self.n_users else 0.0


def item_gradient(item_factors: np.ndarray, item_grad_sum: np.ndarray, n_users: int,
                  reg: float) -> np.ndarray:
    """grad_V L from the V-gradient sum over all N users (any grouping into nodes)."""
    return item_grad_sum / max(n_users, 1) + 2.0 * reg * item_factors


def bpr_step(user_factors: np.ndarray, item_factors: np.ndarray, train: sp.csr_matrix,
             user_ids: np.ndarray, *, seed: int, round_: int, lr: float, reg: float,
             negatives: int = 1) -> BPRStep:
    """One full-batch BPR gradient step for the given users (see the module docstring)."""
    U, V = user_factors, item_factors
    rows, pos, neg = sample_bpr_triples(train, user_ids, seed, round_, negatives)
    counts = np.bincount(rows, minlength=U.shape[0]).astype(float)
    active = counts > 0
    n_users = int(active.sum())
    if n_users == 0:
        return BPRStep(U.copy(), np.zeros_like(V), 0.0, 0)
    diff = V[pos] - V[neg]
    x = np.einsum("td,td->t", U[rows], diff)
    weight = 1.0 / counts[rows]  # mean over the user's triples
    loss_u = np.bincount(rows, weights=np.logaddexp(0.0, -x) * weight, minlength=U.shape[0])
    coef = -weight / (1.0 + np.exp(x))  # d l / d x, per triple
    grad_U = np.zeros_like(U)
    np.add.at(grad_U, rows, coef[:, None] * diff)
    grad_U[active] += 2.0 * reg * U[active]
    loss_u[active] += reg * np.einsum("ud,ud->u", U[active], U[active])
    g_items = np.zeros_like(V)
    np.add.at(g_items, pos, coef[:, None] * U[rows])
    np.add.at(g_items, neg, -coef[:, None] * U[rows])
    return BPRStep(U - lr * grad_U, g_items, float(loss_u[active].sum()), n_users)


# -- local mode: mini-batch BPR with Adam -----------------------------------------------------
@dataclass
class Adam:
    """Adam (Kingma & Ba 2015) on one dense parameter array; the state travels nowhere.

    Used for the nodes' local steps (on U and the local copy of V) and, with
    ``mf-optimizer = adam``, for the server's step on the averaged item update (FedAdam,
    Reddi et al. 2021). Parameters may be numpy arrays or torch tensors (LightGCN on a
    device): the moments are of the parameter's kind.
    """

    lr: float
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    m: np.ndarray | None = None
    v: np.ndarray | None = None
    t: int = 0

    def step(self, param: np.ndarray, grad: np.ndarray) -> np.ndarray:
        """``param`` after one Adam step along ``-grad`` (a new array)."""
        if self.m is None or self.v is None or self.m.shape != param.shape:
            self.m, self.v, self.t = zeros_like(param), zeros_like(param), 0
        self.t += 1
        self.m = self.beta1 * self.m + (1.0 - self.beta1) * grad
        self.v = self.beta2 * self.v + (1.0 - self.beta2) * grad * grad
        m_hat = self.m / (1.0 - self.beta1 ** self.t)
        v_hat = self.v / (1.0 - self.beta2 ** self.t)
        return param - self.lr * m_hat / (sqrt(v_hat) + self.eps)

    def to_arrays(self, prefix: str) -> dict[str, np.ndarray]:
        """The state as named arrays (a node keeps it in its Flower state between rounds)."""
        if self.m is None or self.v is None:
            return {}
        return {f"{prefix}.m": self.m, f"{prefix}.v": self.v,
                f"{prefix}.t": np.array([self.t], dtype=np.int64)}

    @classmethod
    def from_arrays(cls, lr: float, arrays: dict[str, np.ndarray] | None, prefix: str) -> Adam:
        opt = cls(lr)
        if arrays and f"{prefix}.m" in arrays:
            opt.m, opt.v = arrays[f"{prefix}.m"], arrays[f"{prefix}.v"]
            opt.t = int(arrays[f"{prefix}.t"][0])
        return opt


@dataclass
class LocalTraining:
    """What :func:`bpr_train_local` returns for the users it trained."""

    user_factors: np.ndarray
    item_factors: np.ndarray  # the local copy of V after training
    loss: float  # mean batch loss over the last epoch
    n_users: int  # users with at least one training item
    steps: int  # Adam steps taken


def _adam_state(opt: Adam, param: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor,
                                                         torch.Tensor]:
    """``opt``'s moments and step count as tensors for torch's fused Adam (fresh zeros when
    ``opt`` has none or they do not fit ``param``, as :meth:`Adam.step` would start)."""
    import torch

    if opt.m is None or opt.v is None or opt.m.shape != tuple(param.shape):
        return (torch.zeros_like(param), torch.zeros_like(param),
                torch.tensor(0.0, dtype=torch.float32))
    return (torch.tensor(opt.m, dtype=param.dtype), torch.tensor(opt.v, dtype=param.dtype),
            torch.tensor(float(opt.t), dtype=torch.float32))


def bpr_train_local(user_factors: np.ndarray, item_factors: np.ndarray, train: sp.csr_matrix,
                    user_ids: np.ndarray, *, seed: int, round_: int, epochs: int,
                    batch_size: int, reg: float, negatives: int, user_opt: Adam,
                    item_opt: Adam) -> LocalTraining:
    """``epochs`` passes of mini-batch BPR with Adam over these users (module docstring).

    Epoch e of round r samples triples with stream ``(round - 1) * epochs + e`` (the same
    triples for a user whichever node or process holds it) and visits them in an order
    drawn from ``(seed, round, epoch, first user id)``. ``user_opt`` / ``item_opt`` carry the
    Adam state across calls (the caller keeps them; their ``lr`` and betas apply).

    The arithmetic runs in float64 torch tensors on the CPU: every Adam step moves the whole
    U and V (the moments of rows outside the batch still move them), and torch's fused Adam
    does that in one pass, where numpy's expression makes ~15 temporary arrays. Its update is
    :meth:`Adam.step`'s formula with the bias corrections folded into the step size and the
    denominator (equal to ~1e-16 relative per step; ``tests/test_fedmf.py``).
    """
    import torch

    threads = torch.get_num_threads()
    # one thread: the tensors are small (a batch, and U and V of a few MB), and torch's
    # worker threads contend with the other nodes' processes on a shared machine
    torch.set_num_threads(1)
    try:
        return _train_local_torch(user_factors, item_factors, train, user_ids, seed=seed,
                                  round_=round_, epochs=epochs, batch_size=batch_size, reg=reg,
                                  negatives=negatives, user_opt=user_opt, item_opt=item_opt)
    finally:
        torch.set_num_threads(threads)


def _train_local_torch(user_factors: np.ndarray, item_factors: np.ndarray,
                       train: sp.csr_matrix, user_ids: np.ndarray, *, seed: int, round_: int,
                       epochs: int, batch_size: int, reg: float, negatives: int,
                       user_opt: Adam, item_opt: Adam) -> LocalTraining:
    """:func:`bpr_train_local`'s loop (its docstring)."""
    import torch
    from torch.optim.adam import adam

    U = torch.tensor(user_factors, dtype=torch.float64)
    V = torch.tensor(item_factors, dtype=torch.float64)
    grad_U, grad_V = torch.zeros_like(U), torch.zeros_like(V)
    states = [_adam_state(user_opt, U), _adam_state(item_opt, V)]
    first = int(user_ids[0]) if len(user_ids) else 0
    loss, steps, n_users = 0.0, 0, 0

    def step(opt: Adam, param: torch.Tensor, grad: torch.Tensor,
             state: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> None:
        adam([param], [grad], [state[0]], [state[1]], [], [state[2]], fused=True,
             amsgrad=False, beta1=opt.beta1, beta2=opt.beta2, lr=opt.lr, weight_decay=0.0,
             eps=opt.eps, maximize=False)

    for e in range(epochs):
        rows, pos, neg = sample_bpr_triples(train, user_ids, seed, (round_ - 1) * epochs + e + 1,
                                            negatives)
        n_users = len(np.unique(rows))
        if len(rows) == 0:
            break
        order = np.random.default_rng([seed, _SHUFFLE, round_, e, first]).permutation(len(rows))
        R, I, J = (torch.from_numpy(a[order]) for a in (rows, pos, neg))
        total = torch.zeros((), dtype=torch.float64)
        for start in range(0, len(order), batch_size):
            batch = slice(start, start + batch_size)
            r, i, j = R[batch], I[batch], J[batch]
            n = len(r)
            u, vi, vj = U[r], V[i], V[j]
            d = vi - vj
            x = (u * d).sum(dim=1)
            total += torch.logaddexp(torch.zeros_like(x), -x).sum()
            coef = (-torch.sigmoid(-x) / n)[:, None]  # d mean(-log sig x) / d x
            scale = 2.0 * reg / n
            grad_U.zero_().index_add_(0, r, coef * d + scale * u)
            grad_V.zero_().index_add_(0, i, coef * u + scale * vi)
            grad_V.index_add_(0, j, -coef * u + scale * vj)
            step(user_opt, U, grad_U, states[0])
            step(item_opt, V, grad_V, states[1])
            steps += 1
        loss = float(total) / len(rows)
    for opt, (m, v, t) in zip((user_opt, item_opt), states):
        opt.m, opt.v, opt.t = m.numpy(), v.numpy(), int(t)
    return LocalTraining(U.numpy(), V.numpy(), loss, n_users, steps)


@dataclass
class BPRMF:
    """Centralized BPR matrix factorization, trained by the same functions FedMF's nodes call.

    ``mode="exact"``: ``rounds`` full-batch steps of :func:`bpr_step` (FedMF exact mode equals
    it). ``mode="local"``: ``rounds`` calls of :func:`bpr_train_local` with ``epochs`` epochs
    each over all users, Adam state kept across rounds, as a single FedMF node holding every
    user would run: the same budget in epochs as a federated run with the same keys.
    ``score`` returns dense scores for a batch of users.
    """

    dim: int = 16
    lr: float = 0.05
    reg: float = 1e-4
    negatives: int = 1
    seed: int = 0
    mode: str = "exact"
    epochs: int = 1
    batch_size: int = 256
    #: local mode: the item factors' Adam step (None: ``lr``). A FedMF round averages the
    #: nodes' item deltas, each made from a node's share of the batches, so the federated
    #: item factors move slower than the users'; the ceiling's tuning gets this knob too.
    item_lr: float | None = None
    user_factors: np.ndarray | None = field(default=None, repr=False)
    item_factors: np.ndarray | None = field(default=None, repr=False)
    losses: list[float] = field(default_factory=list, repr=False)
    #: Rounds behind the factors, and the two Adam states (user, item) they end with: what
    #: :meth:`resume` continues from.
    rounds_done: int = field(default=0, repr=False)
    _opts: tuple[Adam, Adam] | None = field(default=None, repr=False)

    def fit(self, train: sp.csr_matrix, rounds: int,
            on_round: Callable[[int, int, float], bool | None] | None = None) -> BPRMF:
        """Train for ``rounds`` rounds (local mode: ``epochs`` epochs each) from the initial
        factors; ``on_round(r, rounds, loss)`` is called after each (the factors are then the
        model's), e.g. to show progress or to score a validation split; a true return stops
        training."""
        if self.mode not in ("exact", "local"):
            raise ValueError(f"BPRMF mode must be 'exact' or 'local', got {self.mode!r}")
        n_users, n_items = train.shape
        self.user_factors = init_user_factors(np.arange(n_users), self.dim, self.seed)
        self.item_factors = init_item_factors(n_items, self.dim, self.seed)
        self._opts = (Adam(self.lr), Adam(self.lr if self.item_lr is None else self.item_lr))
        self.rounds_done = 0
        return self.resume(train, rounds, on_round)

    def resume(self, train: sp.csr_matrix, rounds: int,
               on_round: Callable[[int, int, float], bool | None] | None = None) -> BPRMF:
        """``rounds`` more rounds on the same ``train`` from where the last :meth:`fit` or
        :meth:`resume` stopped: round numbers (hence the triples drawn) and both Adam states
        continue, so fit(n) then resume(m) equals fit(n + m). A tuner that trains candidates
        in stages (``fedrec.recsys.halving``) never retrains one from scratch.
        ``on_round(r, total, loss)`` gets the round number since the start."""
        if self._opts is None or self.user_factors is None or self.item_factors is None:
            return self.fit(train, rounds, on_round)
        U, V = self.user_factors, self.item_factors
        user_opt, item_opt = self._opts
        user_ids = np.arange(train.shape[0])
        start, total = self.rounds_done + 1, self.rounds_done + rounds
        for r in range(start, total + 1):
            if self.mode == "exact":
                step = bpr_step(U, V, train, user_ids, seed=self.seed, round_=r, lr=self.lr,
                                reg=self.reg, negatives=self.negatives)
                U = step.user_factors
                V = V - self.lr * item_gradient(V, step.item_grad_sum, step.n_users, self.reg)
                self.losses.append(step.loss)
            else:
                out = bpr_train_local(U, V, train, user_ids, seed=self.seed, round_=r,
                                      epochs=self.epochs, batch_size=self.batch_size,
                                      reg=self.reg, negatives=self.negatives,
                                      user_opt=user_opt, item_opt=item_opt)
                U, V = out.user_factors, out.item_factors
                self.losses.append(out.loss)
            self.user_factors, self.item_factors = U, V  # so on_round can score the model
            self.rounds_done = r
            if on_round is not None and on_round(r, total, self.losses[-1]):
                break  # the callback asked to stop (early stopping)
        return self

    def score(self, users: np.ndarray) -> np.ndarray:
        if self.user_factors is None or self.item_factors is None:
            raise RuntimeError("BPRMF.score called before fit")
        return self.user_factors[users] @ self.item_factors.T


# ----------------------------------------------------------------------------- a ceiling
#: Early stopping of the centralized reference: validation share carved from each user's
#: training interactions, rounds without a better validation NDCG@20 before stopping, and the
#: cap (a multiple of the federated run's rounds, so "to convergence" has a bound).
VALID_FRACTION, PATIENCE, MAX_ROUND_FACTOR = 0.1, 5, 10


def validation_split(train: sp.csr_matrix, fraction: float = VALID_FRACTION,
                     seed: int = 0) -> tuple[sp.csr_matrix, sp.csr_matrix]:
    """(fit, valid): of every user with >= 2 training items, round(fraction x n_u) (at least
    1) items drawn at random go to ``valid``, the rest stay in ``fit``; users with one item
    keep it. Disjoint, and their sum is ``train``: the test split is never touched."""
    train = sp.csr_matrix(train)
    rng = np.random.default_rng([seed, 23])
    keep = np.ones(train.nnz, dtype=bool)
    for u in range(train.shape[0]):
        lo, hi = train.indptr[u], train.indptr[u + 1]
        n = hi - lo
        if n >= 2:
            out = rng.choice(n, size=max(1, int(round(fraction * n))), replace=False)
            keep[lo + out] = False
    rows = np.repeat(np.arange(train.shape[0]), np.diff(train.indptr))

    def part(mask: np.ndarray) -> sp.csr_matrix:
        return sp.csr_matrix((train.data[mask], (rows[mask], train.indices[mask])),
                             shape=train.shape)

    return part(keep), part(~keep)


class Trainable(Protocol):
    """What early stopping needs of a model: ``fit(train, rounds, on_round)`` calling
    ``on_round(r, rounds, loss)`` after each round (its factors are the model's then; a true
    return stops training), and whatever the validation ``metric`` reads (the default,
    :func:`ndcg_metric`, calls ``score`` on a batch of users). :class:`BPRMF` is one;
    ``fedrec.recsys.nmf_ceiling.NMFModel`` and ``fedrec.recsys.multiview.RatingMVMF`` adapt
    to it."""

    def fit(self, train: sp.csr_matrix, rounds: int,
            on_round: Callable[[int, int, float], bool | None] | None = None) -> Any: ...


#: A validation score of a model being trained on ``fit``, from the held-out ``valid`` rows
#: (higher is better): ``metric(model, fit, valid)``.
Metric = Callable[[Any, sp.csr_matrix, sp.csr_matrix], float]


def ndcg_metric(top_k: int = 20) -> Metric:
    """NDCG@top_k of ``model.score`` on the held-out items, training items excluded (the
    implicit-feedback metric of the ranking protocols; the default of early stopping)."""
    def metric(model: Any, fit: sp.csr_matrix, valid: sp.csr_matrix) -> float:
        from fedrec.recsys.metrics import evaluate_ranking

        return float(evaluate_ranking(model.score, fit, valid, k=top_k)
                     .means()[f"ndcg@{top_k}"])

    return metric


def steps_past_edges(best: Sequence[float], tried: Iterable[Sequence[float]],
                     dims: Sequence[int], factor: float = 3.0) -> list[tuple[float, ...]]:
    """One step (x ``factor`` or / ``factor``) past each edge of ``tried`` that ``best``
    sits on, per coordinate in ``dims`` (the other coordinates as ``best``'s): the next
    candidates of a grid walk, so a ceiling is not chosen where the grid cut it off. A
    coordinate tried at one value only has no edge."""
    tried = [tuple(t) for t in tried]
    out = []
    for i in dims:
        values = [t[i] for t in tried]
        if not values or math.isclose(min(values), max(values), rel_tol=1e-9):
            continue
        for edge, step in ((max(values), factor), (min(values), 1 / factor)):
            if math.isclose(best[i], edge, rel_tol=1e-9):
                out.append(tuple(best[j] * (step if j == i else 1.0) for j in range(len(best))))
    return out


@dataclass
class EarlyStopped:
    """The tuned ceiling: the model retrained on all of train for the chosen rounds (None
    when the caller asked for the selection only), the validation score (default NDCG@20)
    after every round of the selection run, and the rounds chosen."""

    model: Trainable | None
    rounds: int
    curve: list[float]
    label: str = ""
    tried: dict[str, float] = field(default_factory=dict)  # label -> best validation score
    trained: dict[str, int] = field(default_factory=dict)  # label -> selection rounds
    #: A budgeted tuner (``fedrec.recsys.halving``) stopped a candidate short for its budget.
    exhausted: bool = False


def fit_early_stopped(make: Callable[[], Trainable], train: sp.csr_matrix, max_rounds: int,
                      *, patience: int = PATIENCE, fraction: float = VALID_FRACTION,
                      seed: int = 0, top_k: int = 20, retrain: bool = True,
                      metric: Metric | None = None) -> EarlyStopped:
    """A centralized reference trained to convergence without looking at the test split.

    ``make()`` builds an untrained model (fixed hyperparameters, as the federated run's). It
    trains on ``fit`` (``validation_split``), scores ``metric`` (default NDCG@top_k of
    ``model.score``, :func:`ndcg_metric`) on ``valid`` after every round, stops after
    ``patience`` rounds without a better score or at ``max_rounds``, then (``retrain``)
    retrains ``make()`` on all of ``train`` for the best round count (same seeds, so the
    same draws as the selection run up to the held-out items)."""
    fit, valid = validation_split(train, fraction, seed)
    model, curve = make(), []
    score = ndcg_metric(top_k) if metric is None else metric

    def on_round(r: int, rounds: int, loss: float) -> bool:
        curve.append(float(score(model, fit, valid)))
        return r - (int(np.argmax(curve)) + 1) >= patience

    model.fit(fit, max_rounds, on_round=on_round)
    best = int(np.argmax(curve)) + 1
    return EarlyStopped(make().fit(train, best) if retrain else None, best, curve)


def tune_early_stopped(makers: dict[str, Callable[[], Trainable]], train: sp.csr_matrix,
                       max_rounds: int, *,
                       refine: Callable[[str], dict[str, Callable[[], Trainable]]] | None = None,
                       on_candidate: Callable[[int, int, str, EarlyStopped], None] | None = None,
                       refine_passes: int = 1, **kw: Any) -> EarlyStopped:
    """:func:`fit_early_stopped` for every candidate (label -> untrained model), keeping the
    one with the best validation score (the test split is never read) and retraining only
    that one on all of train. ``refine(best label)`` (optional) names further candidates
    around the first pass's best (a coordinate step, e.g. the L2 weight at the best step
    sizes), tried the same way, up to ``refine_passes`` times around the best so far (a pass
    that names nothing new ends it: a walk that steps past a grid edge the best sits on).
    ``on_candidate(k, n, label, result)`` is called after each selection run (n: the
    candidates known so far), e.g. to show progress."""
    best: EarlyStopped | None = None
    tried: dict[str, float] = {}
    trained: dict[str, int] = {}
    pending = dict(makers)
    every = dict(makers)

    def run(todo: dict[str, Callable[[], Trainable]]) -> None:
        nonlocal best
        for label, make in todo.items():
            if label in tried:
                continue
            out = fit_early_stopped(make, train, max_rounds, retrain=False, **kw)
            tried[label] = max(out.curve)
            trained[label] = len(out.curve)
            if on_candidate is not None:
                on_candidate(len(tried), len(every), label, out)
            if best is None or tried[label] > max(best.curve):
                best, best.label = out, label

    run(pending)
    for _ in range(refine_passes if refine is not None else 0):
        if best is None:
            break
        more = {k: v for k, v in refine(best.label).items() if k not in every}
        if not more:
            break
        every.update(more)
        run(more)
    if best is None:
        raise ValueError("tune_early_stopped needs at least one candidate")
    best.model = every[best.label]().fit(train, best.rounds)
    best.tried, best.trained = tried, trained
    return best
