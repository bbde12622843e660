"""The synthetic generator has the structure docs/datasets.md promises, at the default size.

Thresholds come from benchmarks/synthetic_baselines.py over seeds 0-4 at the defaults
(1000 users x 500 items; results/synthetic_baselines.md):

* GF-CF / popularity NDCG@20: 2.12 .. 2.69 (mean 2.41); popularity / random: 5.3 .. 7.3
  (mean 6.2). The promise is 1.5x for both; the worst seed is 1.41x above it (GF-CF) and
  3.5x (popularity), so asserting exactly 1.5 on two seeds fails only if the structure is
  lost, not from seed noise.
* Held-out R^2 of features -> factors: users 0.35 .. 0.54, items 0.35 .. 0.53. Asserting
  > 0.25 leaves 0.1 below the worst seed (the spread comes from the random centres and
  feature maps) and is still far from the R^2 <= 0 of features without signal.
* Generation: ~0.05 s idle and ~0.25 s with load average 7 on this 2-core machine; the
  test asserts the 1 s budget on the best of 3 runs, which is 4x slack over the loaded
  measurement while still catching an accidental O(users x items x something) slowdown.

Whole file: ~8 s under load.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from scipy.stats import spearmanr

from benchmarks.synthetic_baselines import generation_seconds, measure
from datasets import DatasetSpec, load_dataset, synthetic


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FEDREC_CACHE", str(tmp_path / "cache"))


@pytest.mark.parametrize("seed", [0, 1])
def test_default_size_has_structure(seed: int) -> None:
    spec = DatasetSpec(seed=seed)
    assert (spec.synthetic_users, spec.synthetic_items) == (1000, 500)
    res = measure(spec)
    nd = {m: v["ndcg@20"] for m, v in res["metrics"].items()}
    assert nd["popularity"] >= 1.5 * nd["random"], nd
    assert nd["gf-cf"] >= 1.5 * nd["popularity"], nd
    assert nd["oracle"] > nd["gf-cf"], nd  # headroom: GF-CF does not saturate the data
    assert res["r2_user_features"] > 0.25 and res["r2_item_features"] > 0.25, res
    assert res["density"] == pytest.approx(0.05, rel=0.1)
    assert res["silos"] == 10  # silo-zip: one silo per taste cluster


def test_generation_under_one_second() -> None:
    assert generation_seconds(DatasetSpec()) < 1.0


def test_same_seed_same_arrays() -> None:
    args = (300, 200, 8, 0.05, 4)
    a, b = synthetic.generate(*args), synthetic.generate(*args)
    assert (a.ratings != b.ratings).nnz == 0 and np.array_equal(a.ratings.data, b.ratings.data)
    assert np.array_equal(a.user_features, b.user_features)
    assert np.array_equal(a.item_features, b.item_features)
    for key in ("zip", "cluster"):
        assert np.array_equal(a.user_attributes[key], b.user_attributes[key])
    c = synthetic.generate(300, 200, 8, 0.05, 5)
    assert (a.ratings != c.ratings).nnz > 0
    assert not np.allclose(a.item_features, c.item_features)


def test_attributes_follow_the_latent_clusters() -> None:
    raw = synthetic.generate(400, 100, 8, 0.05, 3, clusters=12)
    model = synthetic.latent_model(400, 100, 8, 3, clusters=12)
    cluster = raw.user_attributes["cluster"]
    assert np.array_equal(cluster, model.user_clusters)
    assert [int(z[0]) for z in raw.user_attributes["zip"]] == list(cluster % 10)
    assert set(np.unique(raw.ratings.data)) <= {1.0, 2.0, 3.0, 4.0, 5.0}
    assert raw.ratings.getnnz(axis=1).min() >= 1 and raw.ratings.getnnz(axis=0).min() >= 1


def test_generator_keys_reach_the_data() -> None:
    """synthetic-popularity-skew etc. go through DatasetSpec to the generator: with no skew
    the long tail flattens; with skew, degree follows the propensity rank."""
    base = {"dataset": "synthetic", "synthetic-users": 600, "synthetic-items": 300}

    def degree(extra: dict) -> np.ndarray:
        d = load_dataset(DatasetSpec.from_config({**base, **extra}))
        return np.asarray((d.train + d.test).getnnz(axis=0), dtype=float)

    skewed, flat = degree({}), degree({"synthetic-popularity-skew": 0.0})
    # The popularity ranks are drawn whatever the skew, so the same ranks apply to both.
    propensity = synthetic.latent_model(600, 300, 8, 0, popularity_skew=0.7).item_log_propensity
    rho_skewed = spearmanr(skewed, propensity).statistic
    rho_flat = spearmanr(flat, propensity).statistic
    # Seeds 0-3: rho_skewed 0.52 .. 0.62, |rho_flat| <= 0.05 (preference and cluster sizes
    # also move degrees, hence not ~1).
    assert rho_skewed > 0.35 and abs(rho_flat) < 0.2, (rho_skewed, rho_flat)
    noisy = load_dataset(DatasetSpec.from_config({**base, "synthetic-feature-noise": 5.0}))
    clean = load_dataset(DatasetSpec.from_config(base))
    assert not np.allclose(noisy.item_features, clean.item_features)
    assert load_dataset(DatasetSpec.from_config({**base, "synthetic-clusters": 3})) \
        .user_attributes["cluster"].max() <= 2
