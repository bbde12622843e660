"""The centralized ceiling of DP prototypes: paper 003's "Full" baseline (the same NMF on
every training row, no federation, no DP) trained to convergence and tuned on a validation
split carved from train, never the test split.

The model is the protocol's: the regularized NMF of ``fedrec.recsys.nmf`` at the run's rank,
user factors fitted against the item factors as a silo fits them (:func:`fit_user_factors`),
and the same L2 weight on both sides. What is chosen on validation
(``fedrec.recsys.mf.validation_split``, ``tune_early_stopped``):

- the HALS sweeps: validation NDCG@top_k every :data:`SWEEPS_PER_CHECK` sweeps, stop after
  ``PATIENCE`` checks without a better one, at the HALS stop (a sweep lowering the objective
  by less than 1e-6 relative: nothing more to train), or at ``MAX_ROUND_FACTOR`` x the
  run's ``dpp-nmf-iters`` sweeps;
- the L2 weight: decades :data:`REG_FACTORS` x the run's, then 1/3 and 3 x the best of
  those (:data:`REG_REFINE`). The run's own weight is always a candidate, so the ceiling is
  never below the untuned setting on validation. Why decades: the weight enters each HALS
  column update as ``||v_r||^2 + reg``, and on rating data those squared norms are large,
  so the default 0.1 and its near neighbours fit alike (validation NDCG flat from 0.01 to
  10 on ML-100K and ML-1M, ``results/dp_prototypes/ceiling.md``).

The winner is retrained on all of train for the chosen number of checks and scored on test
as the old reference was.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

import numpy as np
import scipy.sparse as sp

from fedrec.recsys.mf import MAX_ROUND_FACTOR, PATIENCE, EarlyStopped, tune_early_stopped
from fedrec.recsys.nmf import NMFResult, fit_user_factors, nmf

__all__ = ["NMFModel", "REG_FACTORS", "REG_REFINE", "SWEEPS_PER_CHECK", "reg_at_edge",
           "reg_candidates", "tune_nmf_ceiling"]

#: HALS sweeps between two validation scores (one early-stopping "round").
SWEEPS_PER_CHECK = 10
#: First pass: the L2 weight at these multiples of the run's.
REG_FACTORS = (0.1, 1.0, 10.0, 100.0, 1000.0)
#: Second pass: these multiples of the first pass's best weight.
REG_REFINE = (1 / 3, 3.0)
#: The grid's base when the run's L2 weight is 0 (the ``dpp-reg`` default); 0 stays a
#: candidate, as the run's own value.
ZERO_REG_BASE = 0.1


@dataclass
class NMFModel:
    """The protocol's NMF as an early-stoppable model (``fedrec.recsys.mf.Trainable``): a
    round is ``sweeps_per_round`` HALS sweeps (the last round may be shorter when HALS stops
    at ``tol``); ``score`` predicts ``U V^T`` with U fitted on the rows the model was trained
    on, as a silo fits its users (``user_iters``: the run's ``dpp-nmf-iters``)."""

    rank: int
    reg: float
    user_iters: int = 200
    sweeps_per_round: int = SWEEPS_PER_CHECK
    tol: float = 1e-6
    item_factors: np.ndarray | None = field(default=None, repr=False)
    sweeps: int = 0  # HALS sweeps behind ``item_factors``
    _train: sp.csr_matrix | None = field(default=None, repr=False)
    _users: np.ndarray | None = field(default=None, repr=False)

    def fit(self, train: sp.csr_matrix, rounds: int,
            on_round: Callable[[int, int, float], bool | None] | None = None) -> NMFModel:
        """At most ``rounds`` x ``sweeps_per_round`` sweeps; ``on_round(r, rounds,
        objective)`` after each round (the model then holds its factors); a true return
        stops."""
        self._train, per = sp.csr_matrix(train), self.sweeps_per_round

        def on_sweep(s: int, out: NMFResult, last: bool) -> bool:
            if s % per and not last:
                return False
            self._keep(out, s)
            return bool(on_round(-(-s // per), rounds, out.objective[-1])) \
                if on_round is not None else False

        out = nmf(self._train, self.rank, self.reg, rounds * per, self.tol, on_sweep)
        self._keep(out, len(out.objective) - 1)
        return self

    def _keep(self, out: NMFResult, sweeps: int) -> None:
        self.item_factors, self.sweeps, self._users = out.V.copy(), sweeps, None

    @property
    def user_factors(self) -> np.ndarray:
        """U >= 0 against the current item factors (fitted on first use)."""
        if self._train is None or self.item_factors is None:
            raise RuntimeError("NMFModel used before fit")
        if self._users is None:
            self._users = fit_user_factors(self._train, self.item_factors, self.reg,
                                           self.user_iters)
        return self._users

    def score(self, users: np.ndarray) -> np.ndarray:
        assert self.item_factors is not None
        return self.user_factors[users] @ self.item_factors.T


def _clean(x: float) -> float:
    """``x`` to 12 significant digits: 0.1 x 0.1 is named 0.01, not 0.010000000000000002."""
    return float(f"{x:.12g}")


def reg_candidates(reg: float, factors: tuple[float, ...] = REG_FACTORS) -> list[float]:
    """The first pass: ``factors`` x the run's weight (x :data:`ZERO_REG_BASE` when it is
    0), plus the run's own weight."""
    base = reg if reg > 0 else ZERO_REG_BASE
    return sorted({float(reg), *(_clean(base * f) for f in factors)})


def reg_at_edge(chosen: float, tried: list[float]) -> bool:
    """Whether the chosen weight is the largest tried, or the smallest and above 0: a
    better one may lie outside the grid (reported, not extended)."""
    return math.isclose(chosen, max(tried), rel_tol=1e-9) or (
        chosen > 0 and math.isclose(chosen, min(tried), rel_tol=1e-9))


def tune_nmf_ceiling(train: sp.csr_matrix, rank: int, reg: float, iters: int, *,
                     seed: int = 0, top_k: int = 20, patience: int = PATIENCE,
                     factors: tuple[float, ...] = REG_FACTORS,
                     refine: tuple[float, ...] = REG_REFINE,
                     on_candidate: Callable[[int, int, str, EarlyStopped], None] | None = None,
                     ) -> EarlyStopped:
    """The tuned ceiling (module docstring): labels are ``repr(reg)``; the result's model is
    the winner retrained on ``train``. ``factors`` / ``refine``: the grid (tests narrow it)."""
    def makers(regs: list[float]) -> dict[str, Callable[[], NMFModel]]:
        return {repr(r): partial(NMFModel, rank, r, iters) for r in regs}

    def around(best: str) -> dict[str, Callable[[], NMFModel]]:
        return makers([_clean(float(best) * f) for f in refine]) if float(best) > 0 else {}

    max_rounds = max(1, -(-MAX_ROUND_FACTOR * int(iters) // SWEEPS_PER_CHECK))
    return tune_early_stopped(makers(reg_candidates(reg, factors)), train, max_rounds,
                              refine=around if refine else None, patience=patience,
                              seed=seed, top_k=top_k, on_candidate=on_candidate)
