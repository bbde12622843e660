"""LightGCN and LightGCN+ (paper 001's backbones): the math LP-GCN's nodes and its centralized
reference share, and the centralized reference itself (:class:`LightGCN`).

Model (paper 001, Eqs. 1-6; ``docs/protocols/lpgcn.md`` has every decision):

- Symmetric normalisation with training degrees, no self-loop: ``c_ui = 1/sqrt(d_u d_i)``;
  ``e_u^(l+1) = sum_i c_ui e_i^(l)``, ``e_i^(l+1) = sum_u c_ui e_u^(l)``. A node of degree 0
  has zero embeddings at every layer >= 1.
- Final embedding: the mean over the L+1 layers; score: the dot product.
- LightGCN: a free layer-0 user table U. LightGCN+: ``e_u^(0) = d_u^(-1/2) sum_{i in I_u} W_i``
  with a second item table W (Eq. 6). Both have the layer-0 item table V.
- Loss of one mini-batch of triples (u, i, j): ``sum_t [softplus(s_uj - s_ui) +
  reg/2 (|e_u^0|^2 + |e_i^0|^2 + |e_j^0|^2)] / B`` with B the *nominal* batch size. The
  regulariser is on the layer-0 rows the triple uses; for LightGCN+ that is the derived
  ``e_u^(0)`` (Eq. 5 as printed; the authors' code indexes W by user id, a bug not copied).
- Triples (:func:`epoch_triples`): each epoch every training interaction is a positive once,
  with one negative drawn uniformly from the items its user has not interacted with; each
  triple goes to one of ``n_batches = ceil(N / B)`` mini-batches by a public per-user draw.
  Every draw is seeded by ``(seed, epoch, user id)``, so any partition of the users draws
  the same triples: a node samples its own users' triples and the union is the centralized
  batch, with no party learning another's positives.
- Adam (``fedrec.recsys.mf.Adam``, elementwise) on every layer-0 row at every step, rows
  with a zero gradient included (dense ``torch.optim.Adam`` semantics), so a node stepping
  its own rows equals the centralized step on the whole table.

Gradients are formed by hand (the recursion of paper 001's Appendix A,
``G_u^(l) = D_u^(l) + sum_i c_ui G_i^(l+1)`` and symmetrically for items), because the
federated protocol computes exactly these partial sums on different nodes. ``dtype``
float64 serves the equivalence tests, float32 speed.

The math below takes numpy arrays or torch tensors alike (``fedrec.recsys.arrays``), so one
copy of it runs on numpy (the reference, ``device="numpy"``) or on a torch device
(``"cpu"``, ``"cuda"``): :class:`LightGCN` and the LP-GCN nodes take a ``device``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp

from fedrec.recsys.arrays import (
    NUMPY,
    check_device,
    concat,
    rowdot,
    softplus_sum,
    sparse_on,
    spmm,
    tanh,
    to_device,
    to_numpy,
)
from fedrec.recsys.arrays import scatter_rows as scatter_rows
from fedrec.recsys.mf import Adam, sample_bpr_triples
from fedrec.recsys.spmm import RowParallelCSR, usable_cores

BACKBONES = ("lightgcn", "lightgcn+")
#: Stream tags, so user init, item tables and batch assignment never share draws.
_USER_INIT, _ITEM_INIT, _W_INIT, _BATCH = 31, 37, 41, 43


def init_rows(ids: np.ndarray, dim: int, seed: int, table: str, std: float = 0.1,
              dtype: np.dtype | type = np.float64) -> np.ndarray:
    """Initial rows of ``table`` (``"U"``, ``"V"`` or ``"W"``) for global ``ids``.

    Each row comes from its own stream ``(seed, table tag, id)``, so whichever node holds a
    row draws the value the centralized reference draws.
    """
    tag = {"U": _USER_INIT, "V": _ITEM_INIT, "W": _W_INIT}[table]
    out = np.empty((len(ids), dim), dtype=dtype)
    for row, i in enumerate(np.asarray(ids, dtype=np.int64)):
        out[row] = np.random.default_rng([seed, tag, int(i)]).normal(0.0, std, dim)
    return out


def inv_sqrt(degrees: np.ndarray, dtype: np.dtype | type = np.float64) -> np.ndarray:
    """``1/sqrt(d)``, 0 where d = 0 (an isolated node propagates nothing)."""
    d = np.asarray(degrees, dtype=np.float64)
    out = np.zeros_like(d)
    np.divide(1.0, np.sqrt(d), out=out, where=d > 0)
    return out.astype(dtype, copy=False)


def n_batches(n_interactions: int, batch_size: int) -> int:
    """Mini-batches per epoch: ``ceil(N / B)`` (at least one)."""
    return max(1, math.ceil(int(n_interactions) / int(batch_size)))


def epoch_triples(train: sp.csr_matrix, user_ids: np.ndarray, seed: int, epoch: int,
                  nbatches: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(row, positive, negative, batch) of every triple of ``epoch`` for these users.

    Negatives come from :func:`fedrec.recsys.mf.sample_bpr_triples` (uniform over the user's
    non-interacted items, stream ``(seed, negatives, epoch, user id)``); the batch of each of
    a user's triples from the stream ``(seed, batch, epoch, user id)``.
    """
    train = sp.csr_matrix(train)
    rows, pos, neg = sample_bpr_triples(train, user_ids, seed, epoch, 1)
    batch = np.empty(len(rows), dtype=np.int64)
    if len(rows):
        starts = np.flatnonzero(np.r_[True, rows[1:] != rows[:-1]])
        ends = np.r_[starts[1:], len(rows)]
        for a, b in zip(starts, ends):
            uid = int(user_ids[rows[a]])
            batch[a:b] = np.random.default_rng([seed, _BATCH, epoch, uid]).integers(
                0, nbatches, b - a)
    return rows, pos, neg, batch


def layer_mean(layers: Sequence[np.ndarray]) -> np.ndarray:
    """Final embedding: the mean over the L+1 layers (paper's alpha_l = 1/(L+1))."""
    total = layers[0] + layers[1] if len(layers) > 1 else layers[0] + 0
    for x in layers[2:]:
        total += x
    return total / len(layers)


def to_users(R: sp.csr_matrix, inv_du: np.ndarray, inv_di: np.ndarray,
             X_items: np.ndarray) -> np.ndarray:
    """``sum_i c_ui X_i`` for every row u of R (users x items)."""
    return inv_du[:, None] * spmm(R, inv_di[:, None] * X_items)


def item_partial(RT: sp.csr_matrix, inv_du: np.ndarray, X_users: np.ndarray) -> np.ndarray:
    """``sum_u R_ui X_u / sqrt(d_u)`` per item (RT = R transposed, items x users): an item's
    share from these users, before its own ``1/sqrt(d_i)``."""
    return spmm(RT, inv_du[:, None] * X_users)


@dataclass
class BPRTerms:
    """One set of triples' loss share and its gradients, per triple."""

    loss: float  # sum over these triples of (softplus + reg/2 * |rows|^2) / B
    d_user: np.ndarray  # d loss / d final user embedding
    d_pos: np.ndarray
    d_neg: np.ndarray
    r_user: np.ndarray  # d loss / d layer-0 rows (the regulariser)
    r_pos: np.ndarray
    r_neg: np.ndarray


def bpr_terms(u_fin: np.ndarray, p_fin: np.ndarray, n_fin: np.ndarray, u0: np.ndarray,
              p0: np.ndarray, n0: np.ndarray, reg: float, batch_size: int) -> BPRTerms:
    """BPR with L2 on the layer-0 rows, divided by the nominal batch size B.

    Sums over any split of a batch's triples add up to the batch's loss and gradients, which
    is why each LP-GCN node can compute its own triples' share.
    """
    B = float(batch_size)
    diff = n_fin - p_fin
    x = rowdot(u_fin, diff)  # s_uj - s_ui
    w = 0.5 * (1.0 + tanh(0.5 * x)) / B  # sigmoid(x) / B, in the rows' dtype
    sq = rowdot(u0, u0) + rowdot(p0, p0) + rowdot(n0, n0)
    loss = (softplus_sum(x) + 0.5 * reg * float(sq.sum())) / B
    k = reg / B
    return BPRTerms(loss, w[:, None] * diff, -w[:, None] * u_fin, w[:, None] * u_fin,
                    k * u0, k * p0, k * n0)


def direct_terms(layer: int, layers: int, d_fin: np.ndarray, d_reg: np.ndarray) -> np.ndarray:
    """``D^(l)``: a row's direct loss gradient at layer l (final = layer mean; reg at l=0)."""
    out = d_fin / (layers + 1)
    return out + d_reg if layer == 0 else out


@dataclass
class LightGCN:
    """Centralized LightGCN / LightGCN+ with hand-formed gradients and dense Adam.

    ``fit(steps)`` runs global steps: step s is mini-batch ``s % n_batches`` of epoch
    ``s // n_batches``. ``losses`` holds each step's loss.

    ``device``: ``"numpy"`` (the reference: scipy products on ``threads`` cores) or a torch
    device (``"cpu"``, ``"cuda"``, ``"cuda:N"``), checked when the model is built. The tables
    then live on that device; ``final_embeddings``, ``score`` and ``state_arrays`` return
    numpy either way, and the triples are drawn on the host (they are the federation's).
    """

    train: sp.csr_matrix
    dim: int = 64
    layers: int = 3
    lr: float = 1e-3
    reg: float = 1e-4
    batch_size: int = 2048
    seed: int = 0
    backbone: str = "lightgcn"
    init_std: float = 0.1
    dtype: type = np.float64
    #: numpy: sparse products on this many cores (0: every core this process has); torch CPU:
    #: > 0 sets torch's intra-op threads, process-wide (on a loaded machine one thread is
    #: far faster than OpenMP's spinning threads: results/lpgcn/table4.md, "Cost")
    threads: int = 0
    device: str = NUMPY
    losses: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.backbone not in BACKBONES:
            raise ValueError(f"backbone must be one of {BACKBONES}, got {self.backbone!r}")
        if self.layers < 1:
            raise ValueError(f"layers must be >= 1, got {self.layers}")
        self.device = check_device(self.device)
        R = sp.csr_matrix(self.train, dtype=self.dtype)
        R.data[:] = 1
        R.sort_indices()
        self.R = R
        n, m = R.shape
        self.inv_du = inv_sqrt(R.getnnz(axis=1), self.dtype)
        self.inv_di = inv_sqrt(R.getnnz(axis=0), self.dtype)
        # The propagation operators, normalised once (c_ui in the non-zeros) and cut into row
        # blocks for every core: a step multiplies them 4L times (Gowalla: 810k non-zeros).
        threads = self.threads or usable_cores()
        A = sp.diags(self.inv_du) @ R @ sp.diags(self.inv_di)
        self.A, self.AT = self._operator(A, threads), self._operator(A.T, threads)
        if self.plus:  # e_u^(0) = d_u^(-1/2) sum_i W_i, and its transpose for W's gradient
            Ru = sp.diags(self.inv_du) @ R
            self.Ru, self.RuT = self._operator(Ru, threads), self._operator(Ru.T, threads)
        self.nbatches = n_batches(R.nnz, self.batch_size)
        items = np.arange(m)
        self.V = self._on(init_rows(items, self.dim, self.seed, "V", self.init_std, self.dtype))
        self.opt = {"V": Adam(self.lr)}
        if self.plus:
            self.W = self._on(init_rows(items, self.dim, self.seed, "W", self.init_std,
                                        self.dtype))
            self.opt["W"] = Adam(self.lr)
        else:
            self.U = self._on(init_rows(np.arange(n), self.dim, self.seed, "U", self.init_std,
                                        self.dtype))
            self.opt["U"] = Adam(self.lr)
        self.step_count = 0
        self._epoch: tuple[int, tuple[np.ndarray, ...]] | None = None

    @property
    def plus(self) -> bool:
        return self.backbone == "lightgcn+"

    def _on(self, x: np.ndarray) -> np.ndarray:
        """``x`` on this model's device (the array itself for numpy)."""
        return to_device(np.asarray(x, dtype=self.dtype), self.device)

    def _operator(self, A: sp.spmatrix, threads: int) -> RowParallelCSR:
        """A fixed propagation operator: row blocks on every core (numpy), or a sparse CSR
        tensor on the device."""
        if self.device == NUMPY:
            return RowParallelCSR(A, threads)
        ref = self._on(np.zeros(1))
        if ref.device.type == "cpu" and self.threads:
            import torch

            torch.set_num_threads(int(self.threads))
        return sparse_on(sp.csr_matrix(A, dtype=self.dtype), ref)

    def user_layer0(self) -> np.ndarray:
        """Layer-0 user rows: U, or for LightGCN+ ``d_u^(-1/2) sum_{i in I_u} W_i``."""
        if self.plus:
            return self.Ru @ self.W
        return self.U

    def forward(self) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """User and item embeddings of every layer 0..L."""
        users, items = [self.user_layer0()], [self.V]
        for _ in range(self.layers):
            users_next = self.A @ items[-1]
            items.append(self.AT @ users[-1])
            users.append(users_next)
        return users, items

    def final_embeddings(self) -> tuple[np.ndarray, np.ndarray]:
        """Final user and item embeddings (numpy, whatever the device)."""
        users, items = self.forward()
        return to_numpy(layer_mean(users)), to_numpy(layer_mean(items))

    def batch(self, step: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(user, positive, negative) of global step ``step``."""
        epoch, b = divmod(step, self.nbatches)
        if self._epoch is None or self._epoch[0] != epoch:
            self._epoch = (epoch, epoch_triples(self.R, np.arange(self.R.shape[0]), self.seed,
                                                epoch, self.nbatches))
        rows, pos, neg, batch = self._epoch[1]
        keep = batch == b
        return rows[keep], pos[keep], neg[keep]

    def step(self) -> float:
        """One mini-batch step; returns its loss."""
        L = self.layers
        n, m = self.R.shape
        users, items = self.forward()
        u, i, j = (self._index(x) for x in self.batch(self.step_count))
        uf, vf = layer_mean(users), layer_mean(items)
        t = bpr_terms(uf[u], vf[i], vf[j], users[0][u], items[0][i], items[0][j], self.reg,
                      self.batch_size)
        idx = concat([i, j])
        dU = scatter_rows(u, t.d_user, n), scatter_rows(u, t.r_user, n)
        dV = (scatter_rows(idx, concat([t.d_pos, t.d_neg]), m),
              scatter_rows(idx, concat([t.r_pos, t.r_neg]), m))
        GU = direct_terms(L, L, *dU)
        GV = direct_terms(L, L, *dV)
        for layer in range(L - 1, -1, -1):
            GU, GV = (direct_terms(layer, L, *dU) + self.A @ GV,
                      direct_terms(layer, L, *dV) + self.AT @ GU)
        self.V = self.opt["V"].step(self.V, GV)
        if self.plus:
            self.W = self.opt["W"].step(self.W, self.RuT @ GU)
        else:
            self.U = self.opt["U"].step(self.U, GU)
        self.step_count += 1
        self.losses.append(t.loss)
        return t.loss

    def _index(self, rows: np.ndarray) -> np.ndarray:
        """Row indices as this device's index arrays."""
        if self.device == NUMPY:
            return rows
        import torch

        return torch.as_tensor(rows, dtype=torch.int64, device=self.V.device)

    def fit(self, steps: int, callback: Callable[[LightGCN], None] | None = None) -> LightGCN:
        """``steps`` more steps; ``callback(self)`` after each."""
        for _ in range(steps):
            self.step()
            if callback is not None:
                callback(self)
        return self

    def state_arrays(self) -> dict[str, np.ndarray]:
        """Everything a later step depends on: the layer-0 tables, Adam's moments and the step
        count (the triples are a function of (seed, epoch), so no sampler state exists)."""
        out: dict[str, np.ndarray] = {"step_count": np.array([self.step_count], np.int64),
                                      "losses": np.asarray(self.losses, np.float64)}
        for name, opt in self.opt.items():
            out[name] = to_numpy(getattr(self, name))
            out.update({k: to_numpy(v) for k, v in opt.to_arrays(name).items()})
        return out

    def load_state_arrays(self, arrays: dict[str, np.ndarray]) -> LightGCN:
        """Continue from :meth:`state_arrays`; a resumed run equals an uninterrupted one."""
        missing = [name for name in self.opt if name not in arrays]
        if missing:
            raise ValueError(f"checkpoint lacks table(s) {missing} of a {self.backbone} model")
        for name in self.opt:
            table = np.asarray(arrays[name], dtype=self.dtype)
            if table.shape != getattr(self, name).shape:
                raise ValueError(f"checkpoint table {name} has shape {table.shape}, this model "
                                 f"{getattr(self, name).shape}: another dataset or dimension")
            setattr(self, name, self._on(table))
            moments = {k: (self._on(v) if k in (f"{name}.m", f"{name}.v") else v)
                       for k, v in arrays.items() if k.startswith(f"{name}.")}
            self.opt[name] = Adam.from_arrays(self.lr, moments, name)
        self.step_count = int(arrays["step_count"][0])
        self.losses = [float(x) for x in arrays["losses"]]
        self._epoch = None
        return self

    def score(self, users: np.ndarray) -> np.ndarray:
        uf, vf = self.final_embeddings()
        return uf[np.asarray(users)] @ vf.T
