"""FedMF's centralized ceiling: BPR-MF trained centrally to convergence, its Adam steps, L2
weight and rounds chosen on a validation split carved from train, never the test split
(docs/protocols/fedmf.md, "The centralized ceiling").

The candidates are multiples of the run's ``mf-lr`` and ``mf-reg``: :data:`REFERENCE_GRID`
first, then :data:`REFERENCE_SPLIT_STEPS` at the first pass's best L2 weight, then up to
:data:`EDGE_PASSES` steps past an edge of what was tried that the best sits on. The run's own
setting is the grid's (1, 1, 1), always a candidate. Two ways to search them (``budget``):

- ``full``: every candidate trained to its own early stop (``tune_early_stopped``): the
  ceiling is the validation maximum over all of them, never below the run's setting;
- ``halving`` (default): successive halving, warm-started (``fedrec.recsys.halving``), within
  :func:`halving_budget` selection rounds: the same candidates and passes, most of them
  cut after a few rounds. The choice is the best of what was trained, so never below a
  candidate's score where it was cut (the run's own included), but a slow step that
  would overtake after its cut is missed.

Either way only the winner is retrained on all of train, for its chosen rounds.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

import scipy.sparse as sp

from fedrec.recsys.halving import FIRST_RUNG, tune_halving
from fedrec.recsys.mf import (
    BPRMF,
    MAX_ROUND_FACTOR,
    PATIENCE,
    VALID_FRACTION,
    EarlyStopped,
    steps_past_edges,
    tune_early_stopped,
)

log = logging.getLogger("fedrec")

__all__ = ["BUDGETS", "EDGE_PASSES", "REFERENCE_GRID",
           "REFERENCE_SPLIT_STEPS", "at_edge", "ceiling_keys", "halving_budget",
           "label_of", "parse_label", "tune_mf_ceiling"]

#: First pass: (user lr, item lr, reg) multiples of the run's ``mf-lr`` and ``mf-reg``, one
#: Adam step size for both factors at 1, 1/3, 1/10, 1/30 of the run's (one Adam on all users
#: takes ~nodes times the item steps a federated round averages), each at the run's L2 weight
#: and three times it.
REFERENCE_GRID = tuple((a, a, b) for b in (1.0, 3.0) for a in (1.0, 1 / 3, 0.1, 1 / 30))
#: Second pass, at the first pass's best L2 weight: the item step 1/3 or 1/10 of the user
#: step, for the same user steps. A FedMF round averages the nodes' item deltas, each made
#: from one node's share of the batches, so the federated item factors move slower than its
#: user factors, which one step size for both cannot do (ML-100K validation NDCG@20: one
#: step at best 0.2085, user 1e-3 / item 3.3e-4 0.2138, the federated run 0.2074;
#: results/fedmf/ceiling.md). Item steps below 1/100 of the run's are left out (1/30 x 1/10:
#: the slowest to converge, the farthest from the run).
REFERENCE_SPLIT_STEPS = tuple((a, a * c) for a in (1.0, 1 / 3, 0.1, 1 / 30)
                              for c in (1 / 3, 0.1) if a * c >= 0.01 - 1e-12)
#: After the split steps, passes of a walk one step past an edge of what was tried that the
#: best sits on (user step or item / user ratio, x 3 or / 3): a ceiling chosen where the grid
#: cut it off may not be one.
EDGE_PASSES = 2
#: ``full``: every candidate to its early stop; ``halving``: successive halving in a budget.
BUDGETS = ("halving", "full")


def halving_budget(rounds: int, candidates: int) -> int:
    """Selection rounds the halving search may spend (on the fit rows, all candidates and
    passes together): what the full tuner spends at least on the planned ``candidates``
    (each stopped at its first chance, ``FIRST_RUNG`` = patience + 1 rounds: the halving's
    first rung) plus one candidate trained to the round cap (MAX_ROUND_FACTOR x the
    federated run's ``rounds``). Fixed before anything trains and the same on any machine
    (the federated run's time is not known when a reference is tuned on its own); a round
    here is ``mf-local-epochs`` epochs over 90% of train, a federated round the same epochs
    over all of train split over the nodes. The halving's own plan stays under it on
    ML-100K and ML-1M (``results/fedmf/ceiling_budget.md``): the budget bounds a walk that
    keeps finding better candidates, it does not set the search."""
    return candidates * FIRST_RUNG + MAX_ROUND_FACTOR * int(rounds)


def label_of(lr: float, item_lr: float, reg: float) -> str:
    """A candidate's name: ``lr,item_lr,reg`` (what :func:`parse_label` reads)."""
    return f"{lr!r},{item_lr!r},{reg!r}"


def parse_label(label: str) -> tuple[float, float, float]:
    """(lr, item lr, reg) of a candidate's name."""
    lr, item_lr, reg = (float(x) for x in label.split(","))
    return lr, item_lr, reg


def _coords(label: str, lr: float, reg: float) -> tuple[float, float, float]:
    """A candidate as (user step, item / user step, L2 weight), multiples of the run's
    ``lr`` and ``reg``: the coordinates the edge walk steps in."""
    user, item, weight = parse_label(label)
    return (user / lr, item / user, weight / reg)


def at_edge(label: str, tried: Iterable[str], lr: float, reg: float) -> bool:
    """Whether the chosen candidate still sits on an edge of what was tried in the user step
    or the item / user ratio (the walk's passes ran out): the grid may have cut off a better
    value. The L2 weight has two values, so it is left out."""
    return bool(steps_past_edges(_coords(label, lr, reg),
                                 [_coords(t, lr, reg) for t in tried], dims=(0, 1)))


def ceiling_keys(tuned: EarlyStopped, lr: float, reg: float,
                 budget: str = "halving") -> dict[str, float]:
    """What the reference reports of its tuning, beside its ranking metrics: the chosen
    rounds, steps, L2 weight and validation score, the candidates tried and selection rounds
    spent, and three flags (1.0): still at an edge after the walk, the budget cut a
    candidate, the search was ``halving`` (0.0: ``full``)."""
    chosen_lr, item_lr, chosen_reg = parse_label(tuned.label)
    return {"tuned-rounds": float(tuned.rounds), "tuned-lr": chosen_lr,
            "tuned-item-lr": item_lr, "tuned-reg": chosen_reg,
            "tuned-valid": max(tuned.curve), "tuned-candidates": float(len(tuned.tried)),
            "tuned-selection-rounds": float(sum(tuned.trained.values())),
            "tuned-at-edge": float(at_edge(tuned.label, tuned.tried, lr, reg)),
            "tuned-budget-cut": float(tuned.exhausted),
            "tuned-halving": float(budget == "halving")}


#: Builds an untrained candidate: ``make(lr, reg, item_lr)``.
MakeModel = Callable[[float, float, float], BPRMF]


def tune_mf_ceiling(make: MakeModel, train: sp.csr_matrix, lr: float, reg: float,
                    rounds: int, *, budget: str = "halving", split_steps: bool = True,
                    grid: Iterable[tuple[float, float, float]] = REFERENCE_GRID,
                    seed: int = 0, top_k: int = 20) -> EarlyStopped:
    """The tuned ceiling (module docstring) around the run's ``lr`` / ``reg``, at most
    MAX_ROUND_FACTOR x its ``rounds`` per candidate; ``split_steps=False``: the first pass
    alone (``grid``, default REFERENCE_GRID; no split steps, no walk). Labels are
    ``lr,item_lr,reg``; the result's model is the winner retrained on ``train``."""
    if budget not in BUDGETS:
        raise ValueError(f"ceiling budget must be one of {' | '.join(BUDGETS)}, got {budget!r}")

    def candidates(grid: Iterable[tuple[float, float, float]]) -> dict[str, Any]:
        return {label_of(lr * a, lr * b, reg * c): _maker(make, lr * a, reg * c, lr * b)
                for a, b, c in grid}

    def coords(label: str) -> tuple[float, float, float]:
        return _coords(label, lr, reg)

    known: set[str] = set()

    def refine(label: str) -> dict[str, Any]:
        """First the split steps at the best L2 weight; once those are tried, one step
        past any edge of what was tried that the best sits on, in the user step or the
        item / user ratio (``steps_past_edges``; the L2 weight has two values)."""
        a, ratio, weight = coords(label)
        split = candidates([(x, y, weight) for x, y in REFERENCE_SPLIT_STEPS])
        if not set(split) <= known:
            known.update(split)
            return split
        steps = steps_past_edges((a, ratio, weight), map(coords, known), dims=(0, 1))
        more = candidates([(x, x * r, g) for x, r, g in steps])
        known.update(more)
        return more

    first = candidates(grid)
    known.update(first)
    max_rounds = MAX_ROUND_FACTOR * int(rounds)
    n = len(first) + (len(REFERENCE_SPLIT_STEPS) if split_steps else 0)
    spend = halving_budget(rounds, n)
    log.info("fedmf reference: centralized BPR-MF to convergence (early stopping on a "
             "%.0f%% validation split of train, patience %d, at most %d rounds; %d (user lr, "
             "item lr, reg) candidates, %s)", 100 * VALID_FRACTION, PATIENCE, max_rounds, n,
             f"successive halving within {spend} rounds" if budget == "halving" else
             "each to its early stop")
    common: dict[str, Any] = dict(refine=refine if split_steps else None,
                                  refine_passes=1 + EDGE_PASSES, seed=seed, top_k=top_k,
                                  on_candidate=_Shown(n, top_k))
    tuned = (tune_halving(first, train, max_rounds, budget=spend,
                          **common)
             if budget == "halving" else tune_early_stopped(first, train, max_rounds, **common))
    log.info("fedmf reference: lr, item lr, reg = %s, %d rounds chosen (validation NDCG@%d "
             "%.4f; %d selection rounds)", tuned.label, tuned.rounds, top_k, max(tuned.curve),
             sum(tuned.trained.values()))
    return tuned


def _maker(make: MakeModel, lr: float, reg: float, item_lr: float) -> Callable[[], BPRMF]:
    return lambda: make(lr, reg, item_lr)


class _Shown:
    """A line per candidate trained: ``candidate k of N (...) done, r rounds, validation``."""

    def __init__(self, planned: int, top_k: int) -> None:
        self.planned, self.top_k, self.done = planned, top_k, 0

    def __call__(self, k: int, known_now: int, label: str, out: EarlyStopped) -> None:
        # the walk past a grid edge can add candidates after the planned n: the count
        # shown is what is known so far, never fewer than the candidates done
        self.done += 1
        log.info("fedmf reference: candidate %d of %d (lr, item lr, reg = %s) done, %d "
                 "rounds, validation NDCG@%d %.4f", self.done,
                 max(self.planned, known_now, self.done), label, len(out.curve), self.top_k,
                 max(out.curve) if out.curve else float("nan"))
