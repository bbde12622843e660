"""Successive halving over early-stopped candidates, warm-started, within a budget of rounds.

The full tuner (``fedrec.recsys.mf.tune_early_stopped``) trains every candidate to its own
early stop, so its cost is the candidates times the rounds each needs. Successive halving
(Jamieson & Talwalkar 2016; Hyperband's inner loop, Li et al. 2018) trains every candidate a
few rounds, keeps the best ``1 / eta`` by validation score, trains those ``eta`` times as
far, and so on until one is left, which trains to its early stop. A candidate is continued
from its state (``resume``: same round numbers, same Adam state), never retrained from
scratch, so a survivor's curve is the one the full tuner would record for it. Candidates are
ranked at a rung by their best validation score within the rung's rounds, so an incumbent
already trained further is compared at the same round count as a newcomer.

The selection never reads the test split (it gets ``train`` and carves ``fit`` / ``valid``
from it, ``validation_split``), and spends at most ``budget`` rounds on ``fit``; the winner is
then retrained on all of train for its chosen rounds (as the full tuner does, outside the
budget: its cost is the chosen round count, known only once chosen).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import scipy.sparse as sp

from fedrec.recsys.mf import (
    PATIENCE,
    VALID_FRACTION,
    EarlyStopped,
    Metric,
    Trainable,
    ndcg_metric,
    validation_split,
)

__all__ = ["ETA", "FIRST_RUNG", "Resumable", "tune_halving"]

#: Survivors per rung: the best ``1 / ETA`` go on, trained ``ETA`` times as far.
ETA = 3
#: Rounds of the first rung (every candidate trains this far), past the early stopping's
#: patience: no candidate is cut before the full tuner could have stopped it. Validation
#: curves can dip first: on the 80-user synthetic split of tests/test_fedmf.py the
#: candidates that learn score below the ones that barely move for up to 6 rounds, and a
#: first rung of 2 kept the latter, a ceiling below the federated run on validation
#: (``test_tuned_ceiling_is_not_beaten_on_validation``).
FIRST_RUNG = PATIENCE + 1


class Resumable(Trainable, Protocol):
    """A :class:`~fedrec.recsys.mf.Trainable` that continues from its state: ``resume(train,
    rounds, on_round)`` trains ``rounds`` more rounds, ``on_round(r, total, loss)`` getting
    the round number since the start (``fedrec.recsys.mf.BPRMF`` is one)."""

    def resume(self, train: sp.csr_matrix, rounds: int,
               on_round: Callable[[int, int, float], bool | None] | None = None) -> Any: ...


@dataclass
class _Run:
    """One candidate's selection run: its model on ``fit`` and its validation curve."""

    label: str
    model: Resumable
    curve: list[float] = field(default_factory=list)
    stopped: bool = False  # its early stop (patience) or the round cap was reached

    def score(self, rounds: int | None = None) -> float:
        """Best validation score within the first ``rounds`` rounds (all: None)."""
        seen = self.curve[:rounds]
        return max(seen) if seen else -math.inf


@dataclass
class _Selection:
    """The rounds spent on ``fit`` and how each candidate is trained and scored."""

    fit: sp.csr_matrix
    valid: sp.csr_matrix
    metric: Metric
    max_rounds: int
    patience: int
    budget: int
    spent: int = 0
    cut: bool = False  # a candidate stopped short for the budget

    def advance(self, run: _Run, to: int) -> None:
        """Train ``run`` until it has ``to`` rounds, stops early, or the budget is spent."""
        to = min(to, self.max_rounds)
        n = min(to - len(run.curve), self.budget - self.spent)
        if not run.stopped and n > 0:
            self._train(run, n)
        self.cut |= not run.stopped and len(run.curve) < to

    def _train(self, run: _Run, n: int) -> None:
        """``n`` more rounds of ``run`` (fewer if it stops early), scored after each."""

        def on_round(r: int, total: int, loss: float) -> bool:
            self.spent += 1
            run.curve.append(float(self.metric(run.model, self.fit, self.valid)))
            run.stopped = (r - (int(np.argmax(run.curve)) + 1) >= self.patience
                           or r >= self.max_rounds)
            return run.stopped

        if run.curve:
            run.model.resume(self.fit, n, on_round=on_round)
        else:
            run.model.fit(self.fit, n, on_round=on_round)

    def halve(self, runs: Sequence[_Run], eta: int, first_rung: int) -> None:
        """Successive halving over ``runs``, ranked at each rung by their best score within
        the rung's rounds (ties keep their order, so an incumbent listed first stays; one
        already at its early stop competes with its score and costs nothing more). The last
        one left trains to its early stop."""
        alive, rung = list(runs), first_rung
        while len(alive) > 1:
            for run in alive:
                self.advance(run, rung)
            alive.sort(key=lambda run: run.score(rung), reverse=True)
            alive = alive[:math.ceil(len(alive) / eta)]
            rung *= eta
        self.advance(alive[0], self.max_rounds)


def tune_halving(makers: dict[str, Callable[[], Resumable]], train: sp.csr_matrix,
                 max_rounds: int, *, budget: int, eta: int = ETA, first_rung: int = FIRST_RUNG,
                 refine: Callable[[str], dict[str, Callable[[], Resumable]]] | None = None,
                 refine_passes: int = 1, patience: int = PATIENCE,
                 fraction: float = VALID_FRACTION, seed: int = 0, top_k: int = 20,
                 metric: Metric | None = None,
                 on_candidate: Callable[[int, int, str, EarlyStopped], None] | None = None,
                 ) -> EarlyStopped:
    """The ceiling by successive halving (module docstring), with ``tune_early_stopped``'s
    interface and result: ``refine(best label)`` names further candidates, halved together
    with the best so far (already trained: it costs nothing more), up to ``refine_passes``
    times. ``budget``: selection rounds on ``fit``, all candidates together; once spent no
    candidate trains further and the best so far wins (``EarlyStopped.exhausted``).
    ``on_candidate(k, n, label, result)`` after each pass, for each candidate it added (n:
    the candidates known so far; ``result.curve``: its selection run so far)."""
    if not makers:
        raise ValueError("tune_halving needs at least one candidate")
    fit, valid = validation_split(train, fraction, seed)
    sel = _Selection(fit, valid, ndcg_metric(top_k) if metric is None else metric,
                     max_rounds, patience, budget)
    every = dict(makers)
    runs = {label: _Run(label, make()) for label, make in makers.items()}

    def halve(labels: list[str], new: list[str]) -> _Run:
        sel.halve([runs[label] for label in labels], eta, first_rung)
        for label in new:
            if on_candidate is not None:
                run = runs[label]
                on_candidate(list(runs).index(label) + 1, len(runs), label, EarlyStopped(
                    None, int(np.argmax(run.curve)) + 1 if run.curve else 0, run.curve, label))
        return max(runs.values(), key=lambda run: run.score())

    best = halve(list(makers), list(makers))
    for _ in range(refine_passes if refine is not None else 0):
        more = {k: v for k, v in refine(best.label).items() if k not in every}
        if not more:
            break
        every.update(more)
        runs.update({label: _Run(label, make()) for label, make in more.items()})
        best = halve([best.label, *more], list(more))
    if not best.curve:
        raise ValueError(f"tune_halving: a budget of {budget} rounds trained no candidate")
    rounds = int(np.argmax(best.curve)) + 1
    return EarlyStopped(every[best.label]().fit(train, rounds), rounds, best.curve, best.label,
                        tried={k: r.score() for k, r in runs.items() if r.curve},
                        trained={k: len(r.curve) for k, r in runs.items()},
                        exhausted=sel.cut)
