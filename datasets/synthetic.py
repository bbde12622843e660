"""Seeded synthetic ratings with taste clusters, a popularity long tail and side features.

The no-download default dataset. It is built so that the things a recommender is supposed
to exploit are really there, at known strength (docs/datasets.md has the measured
baselines):

* **Taste clusters, low rank.** ``clusters`` centres ``mu_c ~ N(0, I_rank)``. Every user
  and every item belongs to one cluster (cluster shares drawn from a Dirichlet, so clusters
  have unequal sizes, as markets and genres do) and gets the latent factor
  ``mu_c + SPREAD * N(0, I_rank)``: half of a factor's variance is the cluster's shared
  taste, half the individual's own, and both are low rank (``rank`` dimensions), so a
  model that finds the clusters gets far and one that finds the factors gets further.
* **Popularity long tail.** Item ``i`` at popularity rank ``r_i`` (a random permutation,
  independent of the clusters) has propensity ``r_i^(-popularity_skew)`` (Zipf), so a few
  items are in most histories and most items are rare, as in Gowalla or MovieLens.
* **Interactions.** User ``u`` has the affinity logit
  ``l_ui = STRENGTH * <x_u, y_i> / sqrt(rank) - popularity_skew * log r_i`` and picks
  ``n_u`` distinct items with probability proportional to ``exp(l_ui)`` (sampling without
  replacement, done exactly by the Gumbel top-k trick). ``n_u`` is
  ``density * n_items`` times a log-normal activity with mean 1 (a long tail of heavy
  users), so the density is hit directly, with no calibration loop.
* **Ratings** 1..5 are the affinity ``<x_u, y_i>`` of the picked pair, standardized,
  plus noise, rounded: a picked item can still be disliked, and ``min-rating`` keeps the
  better-liked ones.
* **Side features** are noisy linear maps of the same latent factors
  (``x_u A + feature_noise * N(0, 1)``, ``A`` Gaussian with variance ``1 / rank`` so a
  noise-free feature has the factor coordinates' variance ``1 + SPREAD^2``), so
  multi-view models and cold start have signal; ``feature_noise`` sets how much (0 =
  features are an exact linear image of the factors, of rank 8 for users and 6 for items).
* **Attributes.** ``cluster`` is the user's taste cluster; ``zip`` is a fake 5-digit code
  whose first digit is ``cluster % 10``, so ``partition=silo-zip`` makes silos of like
  users (cross-silo non-IID, as regions are).

Every user has at least one interaction and every item at least one (an item no one
picked goes to the user with the highest logit for it). All draws come from
``numpy.random.default_rng([seed, 1, stream])`` with one stream per purpose, so the same
arguments give identical arrays and :func:`latent_model` reproduces the factors behind
:func:`generate` without drawing the interactions.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from .containers import RawData

USER_FEATURE_DIM = 8
ITEM_FEATURE_DIM = 6
_CHUNK_ENTRIES = 4_000_000  # dense (user x item) entries materialized at once

# Fixed shape constants. They are not run-config keys because the four keys (clusters,
# popularity skew, density, feature noise) already span easy to hard; these set the scale.
SPREAD = 1.0  # within-cluster std of a factor coordinate (centres: std 1): taste is half cluster, half own
STRENGTH = 1.0  # preference logit per unit of normalized affinity <x, y> / sqrt(rank)
ACTIVITY_SIGMA = 0.5  # log-normal sigma of user activity: max/median users ~ 4-5x
CLUSTER_CONCENTRATION = 4.0  # Dirichlet alpha of cluster shares: sizes vary ~ +-50 %
RATING_NOISE = 0.5  # std of rating noise, in units of the affinity's std

# Streams of default_rng([seed, 1, stream]); separate so e.g. latent_model skips the rest.
_STREAM_LATENT, _STREAM_PICKS, _STREAM_FEATURES = 0, 1, 2


@dataclass(frozen=True)
class LatentModel:
    """The hidden structure behind one synthetic dataset (for benchmarks and tests)."""

    user_factors: np.ndarray  # (n_users, rank)
    item_factors: np.ndarray  # (n_items, rank)
    user_clusters: np.ndarray  # (n_users,) int64 in [0, clusters)
    item_clusters: np.ndarray  # (n_items,) int64 in [0, clusters)
    item_log_propensity: np.ndarray  # (n_items,) -popularity_skew * log(popularity rank)


def latent_model(
    n_users: int,
    n_items: int,
    rank: int,
    seed: int,
    clusters: int = 10,
    popularity_skew: float = 0.7,
) -> LatentModel:
    """Cluster centres, user/item factors and item propensities, from stream 0 only."""
    rng = np.random.default_rng([seed, 1, _STREAM_LATENT])
    centres = rng.normal(size=(clusters, rank))
    shares = rng.dirichlet(np.full(clusters, CLUSTER_CONCENTRATION))
    user_clusters = rng.choice(clusters, size=n_users, p=shares).astype(np.int64)
    item_clusters = rng.choice(clusters, size=n_items, p=shares).astype(np.int64)
    user_factors = centres[user_clusters] + SPREAD * rng.normal(size=(n_users, rank))
    item_factors = centres[item_clusters] + SPREAD * rng.normal(size=(n_items, rank))
    pop_rank = rng.permutation(n_items) + 1.0
    return LatentModel(
        user_factors=user_factors,
        item_factors=item_factors,
        user_clusters=user_clusters,
        item_clusters=item_clusters,
        item_log_propensity=-popularity_skew * np.log(pop_rank),
    )


def preference_logits(model: LatentModel, users: slice | np.ndarray = slice(None),
                      items: slice | np.ndarray = slice(None)) -> np.ndarray:
    """Logits l_ui for a block of users x items (module docstring): what the picks follow.

    Public so benchmarks can score with the generator's own preferences (an oracle ceiling).
    """
    x = model.user_factors[users]
    y = model.item_factors[items]
    scale = STRENGTH / np.sqrt(x.shape[1])
    return scale * (x @ y.T) + model.item_log_propensity[items]


def _picks(model: LatentModel, density: float, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(rows, cols) of the picked pairs: n_u items per user, without replacement ~ exp(l_ui).

    Gumbel top-k: the n largest of l_ui + Gumbel noise are an exact sample without
    replacement with probabilities proportional to exp(l_ui) (successive sampling).
    """
    n_users, n_items = model.user_factors.shape[0], model.item_factors.shape[0]
    activity = rng.lognormal(-0.5 * ACTIVITY_SIGMA**2, ACTIVITY_SIGMA, size=n_users)  # mean 1
    n_u = np.clip(np.rint(density * n_items * activity), 1, n_items).astype(np.int64)
    rows_per_chunk = max(1, _CHUNK_ENTRIES // n_items)
    r_idx, c_idx = [], []
    for start in range(0, n_users, rows_per_chunk):
        stop = min(n_users, start + rows_per_chunk)
        keys = preference_logits(model, slice(start, stop)) + rng.gumbel(
            size=(stop - start, n_items))
        order = np.argsort(-keys, axis=1)
        counts = n_u[start:stop]
        take = np.arange(n_items)[None, :] < counts[:, None]
        r_idx.append(np.repeat(np.arange(start, stop), counts))
        c_idx.append(order[take])  # row-major, so aligned with the repeated row ids
    return np.concatenate(r_idx), np.concatenate(c_idx)


def footprint_bytes(n_users: int, n_items: int, rank: int, density: float,
                    clusters: int = 10) -> float:
    """About how many bytes :func:`generate` holds at its peak for these sizes (float, so a
    size like 10**12 never overflows): factors and features per user and item, one chunk of
    dense logits (keys, Gumbel noise, argsort, mask), and about 64 bytes per picked pair.
    Callers check it against a memory budget before generating (the sizes may come from a
    server)."""
    users, items = float(n_users), float(n_items)
    per_row = 8.0 * (2 * rank + 2 * max(USER_FEATURE_DIM, ITEM_FEATURE_DIM) + 4) + 80.0
    chunk = 32.0 * min(users * items, max(float(_CHUNK_ENTRIES), items))
    pairs = 64.0 * max(density * users * items, users, items)
    return (users + items) * per_row + chunk + pairs + 8.0 * clusters * rank


def generate(
    n_users: int,
    n_items: int,
    rank: int,
    density: float,
    seed: int,
    clusters: int = 10,
    popularity_skew: float = 0.7,
    feature_noise: float = 1.0,
) -> RawData:
    """Explicit ratings 1..5 with every user and item nonempty, side features, zip/cluster.

    Same arguments, same arrays (all randomness is seeded by ``seed``).
    """
    model = latent_model(n_users, n_items, rank, seed, clusters, popularity_skew)
    rng = np.random.default_rng([seed, 1, _STREAM_PICKS])
    rows, cols = _picks(model, density, rng)

    empty_items = np.setdiff1d(np.arange(n_items), cols)
    if len(empty_items):  # every item is rated by the user who likes it most
        best = preference_logits(model, slice(None), empty_items).argmax(axis=0)
        rows = np.concatenate([rows, best])
        cols = np.concatenate([cols, empty_items])

    affinity = np.einsum("ij,ij->i", model.user_factors[rows], model.item_factors[cols])
    z = (affinity - affinity.mean()) / max(float(affinity.std()), 1e-12)
    stars = np.clip(np.rint(3.0 + z + RATING_NOISE * rng.normal(size=len(z))), 1, 5)
    ratings = sp.csr_matrix((stars, (rows, cols)), shape=(n_users, n_items))
    ratings.sort_indices()

    frng = np.random.default_rng([seed, 1, _STREAM_FEATURES])
    a = frng.normal(size=(rank, USER_FEATURE_DIM)) / np.sqrt(rank)
    b = frng.normal(size=(rank, ITEM_FEATURE_DIM)) / np.sqrt(rank)
    user_features = model.user_factors @ a + feature_noise * frng.normal(
        size=(n_users, USER_FEATURE_DIM))
    item_features = model.item_factors @ b + feature_noise * frng.normal(
        size=(n_items, ITEM_FEATURE_DIM))

    tail = frng.integers(0, 10_000, size=n_users)
    zips = np.array([f"{c % 10}{t:04d}" for c, t in zip(model.user_clusters, tail)])
    return RawData(
        ratings=ratings,
        user_features=user_features,
        item_features=item_features,
        user_attributes={"zip": zips, "cluster": model.user_clusters.copy()},
        has_ratings=True,
    )
