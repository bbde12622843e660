"""Paper 003's synthetic Poisson data (Sec. 4.1, as the authors' code builds it).

U ~ N(0, 1)^{m x l}, V ~ N(0, 1)^{n x l}, each row L2-normalized (the code does; without
it exp(U V^T) spans exp(+-30) at l = 100), X ~ Poisson(exp(U V^T)), and the users spread
over silos in contiguous equal blocks. The paper prints n = 100,000 and m = 500 with n as
items; its code (and this function) has 100,000 users and 500 items. "The synthetic data
does not contain any clusters": the worst case for prototypes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["PoissonSilos", "poisson_silos"]


@dataclass
class PoissonSilos:
    """Counts X (users x items, dense), the true rates exp(U V^T) and each silo's rows."""

    X: np.ndarray
    rates: np.ndarray
    silos: list[np.ndarray]


def _unit_rows(A: np.ndarray) -> np.ndarray:
    return A / np.maximum(np.linalg.norm(A, axis=1, keepdims=True), 1e-300)


def poisson_silos(n_users: int = 100_000, n_items: int = 500, rank: int = 100,
                  silos: int = 10, seed: int = 0) -> PoissonSilos:
    """The paper's generator with its defaults (rank-100 truth, 10 silos); seeded."""
    if min(n_users, n_items, rank, silos) < 1 or silos > n_users:
        raise ValueError(f"need n_users >= silos >= 1 and n_items, rank >= 1; got "
                         f"{n_users}, {n_items}, {rank}, {silos}")
    rng = np.random.default_rng([seed, 31])
    U = _unit_rows(rng.standard_normal((n_users, rank)))
    V = _unit_rows(rng.standard_normal((n_items, rank)))
    rates = np.exp(U @ V.T)
    X = rng.poisson(rates).astype(np.float64)
    return PoissonSilos(X, rates, np.array_split(np.arange(n_users), silos))
