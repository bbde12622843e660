"""Privacy-utility curves of the DP protocols on ML-1M (users 1-2999): NDCG@20 against
epsilon, mean and spread over seeds, with item popularity, each protocol's non-private
reference and a DP popularity baseline on the same splits, so a user sees from which
epsilon a DP protocol is worth its privacy on this data, if at all.

Protocols, each in its leaderboard setting (``benchmarks/leaderboard.py``: same config, node
count and partition):

- ``dp-prototypes``: 10 zip silos, ratings, k = 50; ``dpp-epsilon`` = epsilon (pure DP per
  silo, user level). Reference: the paper's Full NMF on every training row, tuned on a
  validation split of train (``DPPrototypes.reference``).
- ``fedsvd-privacy``: 4 contiguous shards, 0/1 data, T = 92; epsilon is Theorem 2 composed
  over T iterations (what a node charges, (epsilon, T delta)-DP), and the node noise
  ``fedsvd-sigma`` that gives it is found by inverting the project's accountant
  (``power_svd.release_epsilon``). Reference: the exact truncated SVD.
- ``dp-popularity``: the DP baseline (``fedrec/recsys/dp_popularity.py``): the dp-prototypes
  silos each release Laplace-noised item counts, every user's row clipped to L1 norm
  ``POP_CLIP``; same guarantee as dp-prototypes (pure epsilon-DP per silo, user level).

A seed is the run config's ``seed``: it draws the split (80/20 per user), the protocol's
public randomness and the noise, as ``run_simulation.py --set seed=S`` does; popularity and
the references are computed on each seed's split.

Each point is the protocol's arithmetic in one process, not a Flower simulation: the same
functions the nodes and the server call, in their order (``tests/test_dp_curves.py`` shows
the point equals the Flower run's metrics for a small setting with the same noise).
dp-prototypes draws its noise from the project's OpenDP sampler, as a silo does.
fedsvd-privacy's Gaussian noise comes from numpy's seeded generator (the same N(0, sigma^2)
distribution): the nodes' OpenDP sampler draws ~2e4 values/s here, ~10 min of noise per
ML-1M point (4 nodes x 92 iterations x 3,883 x 10 values) against 0.5 s for the whole point.

Every finished (protocol, epsilon, seed) unit and every reference is stored in
``results/dp_curves/ml-1m.json`` at once; ``--resume`` continues an interrupted run.

``--dataset gowalla`` / ``yelp2018`` (:class:`Setting`, :func:`_large`): the same protocols
on each dataset's own split at epsilon 0.5-20, with the distributed variant ``fedsvd-ddp``
(each node's noise sigma / sqrt(n) inside the sum, a sync every iteration) and random ranking
beside them; dp-prototypes' silos are random user groups (no zip codes), its Full NMF
reference runs at the protocol's own settings (``full_nmf_untuned``), and the report says
what each epsilon protects (fedsvd's is one Gram entry, not a user).

    python benchmarks/dp_curves.py --resume
    python benchmarks/dp_curves.py --dataset gowalla --resume
    python benchmarks/dp_curves.py --markdown-only
    python benchmarks/dp_curves.py --refresh-full-nmf   # the Full NMF references alone
"""

from __future__ import annotations

import os

# One BLAS thread: the 2 cores are shared (as benchmarks/dp_prototypes.py).
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import math  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
import zlib  # noqa: E402
from collections.abc import Mapping, Sequence  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # first: Opacus installs a top-level package named benchmarks

from benchmarks._board import LABEL, cells  # noqa: E402
from benchmarks._report import (  # noqa: E402
    Units,
    log,
    machine_info,
    rewrite_markdown,
    stored_result,
    write_report,
)

OUT = REPO / "results" / "dp_curves" / "ml-1m.json"
DATASET = "ml-1m"
#: Gowalla's and Yelp2018's grid: the user-level range a privacy review signs.
USER_LEVEL_EPSILONS = [0.5, 1.0, 2.0, 5.0, 10.0, 20.0]
#: fedsvd-privacy's delta per iteration there: T delta = 9.2e-6 over its 92 iterations,
#: below 1 / n_users (3.3e-5 on Gowalla, 3.2e-5 on Yelp2018).
LARGE_FEDSVD_DELTA = 1e-7
EPSILONS = [0.1, 1.0, 10.0, 100.0, 1e3, 1e4, 1e5, 1e6]
#: Half-decades for the methods whose points take seconds (dp-prototypes: minutes).
FINE_EPSILONS = [0.3, 3.0, 30.0, 300.0, 3e3, 3e4, 3e5]
#: The methods whose points take seconds: half-decades and 5 seeds (dp-prototypes: 3).
CHEAP = ["dp-popularity", "fedsvd-privacy"]
#: dp-prototypes' half-decades around where it turns (minutes per point at 3e3).
PROTOTYPES_FINE = [300.0, 3e3]
COMMAND = "python benchmarks/dp_curves.py --resume"
FINE_COMMAND = ("python benchmarks/dp_curves.py --resume --seeds 5 --protocols "
                + " ".join(CHEAP) + " --epsilons "
                + " ".join(f"{e:g}" for e in EPSILONS + FINE_EPSILONS))
PROTOTYPES_COMMAND = ("python benchmarks/dp_curves.py --resume --protocols dp-prototypes "
                      "--epsilons " + " ".join(f"{e:g}" for e in PROTOTYPES_FINE))
REFRESH_COMMAND = "python benchmarks/dp_curves.py --refresh-full-nmf"
#: 5 seeds where dp-prototypes crosses popularity (the verdict's epsilons).
PROTOTYPES_SEEDS_COMMAND = ("python benchmarks/dp_curves.py --resume --seeds 5 --protocols "
                            "dp-prototypes --epsilons 1000 3000 10000")
PROTOCOLS = ["dp-popularity", "fedsvd-privacy", "fedsvd-ddp", "dp-prototypes"]
#: L1 bound of a user's contribution to DP popularity: dp-prototypes' per-user sparsity
#: (``dpp-sparsity`` = 50 entries), so the baseline bounds a user as the protocol does.
POP_CLIP = 50.0
#: Which reference each protocol is drawn against (the leaderboard's centralized column).
REFERENCE = {"dp-prototypes": "full-nmf", "fedsvd-privacy": "exact-svd",
             "fedsvd-ddp": "exact-svd"}
REFERENCE_LABEL = {"full-nmf": "Full NMF, tuned (dp-prototypes' non-private ceiling: sweeps "
                               "and L2 weight chosen on a validation split of train)",
                   "exact-svd": "exact truncated SVD (fedsvd-privacy's non-private reference)",
                   "full-nmf-untuned": "Full NMF at the run's own settings (dp-prototypes' "
                                       "non-private reference: its L2 weight and HALS "
                                       "sweeps, not tuned here, as the federated run is not; "
                                       "no ceiling)",
                   "random": "random ranking (uniform scores)"}


# -- the settings --------------------------------------------------------------------------
@dataclass(frozen=True)
class Setting:
    """What one dataset's curves run beyond the protocols' leaderboard cells: the grid, the
    seeds, the protocols, and what replaces a cell's config where the dataset lacks what
    the cell needs (Gowalla and Yelp2018 have no zip codes and no ratings)."""

    dataset: str
    epsilons: tuple[float, ...]
    protocols: tuple[str, ...]
    #: Run-config keys over dp-prototypes' (and dp-popularity's) cell, and its silo count
    #: (0: the cell's own).
    silos: dict[str, Any] = field(default_factory=dict)
    silo_nodes: int = 0
    #: Run-config keys over fedsvd-privacy's cell, and its node count (0: the cell's own).
    fedsvd: dict[str, Any] = field(default_factory=dict)
    fedsvd_nodes: int = 0
    #: Whether the dataset comes with its train/test split (the seed then draws only the
    #: partition, the public randomness and the noise; the references are computed once).
    fixed_split: bool = False

    @property
    def out(self) -> Path:
        return OUT.with_name(f"{self.dataset}.json")


def _large(dataset: str) -> Setting:
    """Gowalla's and Yelp2018's setting: 10 random silos of ~3,000 users for dp-prototypes
    (no zip codes), the 0/1 data's own value bound 1, ML-1M's k = 50; fedsvd on ML-1M's 4
    contiguous shards at a delta below 1 / n_users; the user-level grid."""
    return Setting(dataset, tuple(USER_LEVEL_EPSILONS),
                   ("dp-popularity", "fedsvd-privacy", "fedsvd-ddp", "dp-prototypes"),
                   silos={"partition": "shards-random", "implicit": True, "dpp-k": 50,
                          "dpp-value-max": 1.0}, silo_nodes=10,
                   fedsvd={"fedsvd-delta": LARGE_FEDSVD_DELTA}, fedsvd_nodes=4,
                   fixed_split=True)


SETTINGS = {"ml-1m": Setting("ml-1m", tuple(EPSILONS),
                             ("dp-popularity", "fedsvd-privacy", "dp-prototypes")),
            "gowalla": _large("gowalla"), "yelp2018": _large("yelp2018")}


def run_config(protocol: str, seed: int, epsilon: float | None = None,
               dataset: str = DATASET) -> tuple[dict, int]:
    """The resolved run config and node count of ``protocol``'s leaderboard cell on
    ``dataset`` at ``seed`` (dp-popularity: dp-prototypes' silos; fedsvd-ddp:
    fedsvd-privacy's cell with ``fedsvd-ddp`` on and a sync every iteration), with the
    dataset's :class:`Setting` over it and ``epsilon`` set through the protocol's own key."""
    from fl_app.registry import resolve_config

    setting = SETTINGS[dataset]
    base = {"dp-popularity": "dp-prototypes", "fedsvd-ddp": "fedsvd-privacy"}.get(protocol,
                                                                              protocol)
    cell = cells([dataset], [base])[0]
    over = {k: v for k, v in cell.config.items() if k != "timeout"}
    nodes = cell.nodes
    if base == "dp-prototypes":
        over.update(setting.silos)
        nodes = setting.silo_nodes or nodes
    else:
        over.update(setting.fedsvd)
        nodes = setting.fedsvd_nodes or nodes
    over["seed"] = seed
    if protocol == "dp-popularity":
        over["implicit"] = True
    if protocol == "fedsvd-ddp":
        # the paper's distributed variant (Sec. 5) where the sum is what is released: every
        # iteration synchronizes, so no node-local iterate escapes the sum's noise
        over.update({"fedsvd-ddp": True, "fedsvd-sync-every": 1})
    if epsilon is not None and protocol == "dp-prototypes":
        over["dpp-epsilon"] = float(epsilon)
    cfg = resolve_config(over)
    if epsilon is not None and base == "fedsvd-privacy":
        target = epsilon / ddp_factor(cfg, nodes) if protocol == "fedsvd-ddp" else epsilon
        cfg = {**cfg, "fedsvd-sigma": fedsvd_sigma(cfg, target)}
    return cfg, nodes


def ddp_factor(cfg: Mapping[str, Any], nodes: int) -> float:
    """How much more than Theorem 2 at the total sigma the sum of fedsvd-ddp gives away
    about its most exposed node: the sum is sum_i w_i (Y_i + N(0, sigma^2 / n)), node i's
    sensitivity in it w_i Delta and its noise sigma ||w||_2 / sqrt(n), so node i's epsilon
    is Theorem 2's times w_i sqrt(n) / ||w||_2; the largest over nodes (1 for equal weights,
    w_i = s_i / s the public row counts)."""
    _, parts = node_rows(cfg, nodes)
    return weight_factor([len(u) for u in parts])


def weight_factor(sizes: Sequence[int]) -> float:
    """:func:`ddp_factor` of nodes holding ``sizes`` rows: max_i w_i sqrt(n) / ||w||_2."""
    w = np.asarray(sizes, dtype=np.float64)
    w /= w.sum()
    return float(w.max() * math.sqrt(len(w)) / np.linalg.norm(w))


def fedsvd_sigma(cfg: Mapping[str, Any], epsilon: float) -> float:
    """The node noise sigma at which fedsvd-privacy's accountant (Theorem 2 per iteration,
    composed over the T iterations a node runs: ``power_svd.release_epsilon``, what a node
    charges) gives ``epsilon``: a root of the accountant in log sigma, checked to 1e-9."""
    from scipy.optimize import brentq

    from fedrec.recsys import power_svd as svd

    params = svd.params_from_config(cfg)

    def spent(log_sigma: float) -> float:
        return math.log(svd.release_epsilon(params, math.exp(log_sigma), params.r, params.T))

    target = math.log(epsilon)
    sigma = math.exp(brentq(lambda x: spent(x) - target, math.log(1e-12), math.log(1e12),
                            xtol=1e-14, rtol=1e-14))
    got = svd.release_epsilon(params, sigma, params.r, params.T)
    if not math.isclose(got, epsilon, rel_tol=1e-9):
        raise RuntimeError(f"fedsvd-privacy: sigma {sigma:g} gives epsilon {got:g}, not "
                           f"{epsilon:g}")
    return sigma


def node_rows(cfg: Mapping[str, Any], nodes: int) -> tuple[Any, list[np.ndarray]]:
    """The split of ``cfg`` and each node's global user indices (the simulation's
    partition of the same config)."""
    from datasets import DatasetSpec, PartitionSpec, load_dataset, partition_users

    data = load_dataset(DatasetSpec.from_config(cfg))
    return data, partition_users(data, PartitionSpec.from_config(cfg, nodes))


# -- one point per protocol ------------------------------------------------------------------
def dp_prototypes_point(cfg: Mapping[str, Any], nodes: int) -> dict[str, float]:
    """What a dp-prototypes run computes: each silo's release (``private_prototypes`` with
    seed (run seed, partition id), as ``clients/dp_prototypes.py``), the server's NMF of the
    stacked prototypes, each silo's fit against V and its metric sums, summed."""
    from fedrec.recsys.nmf import fit_user_factors, nmf
    from fedrec.recsys.prototypes import metric_means, private_prototypes, silo_metric_sums
    from strategies.dp_prototypes import DPPrototypes

    strategy = DPPrototypes(cfg)
    data, parts = node_rows(cfg, nodes)
    seed = int(cfg["seed"])
    P = np.vstack([private_prototypes(data.train[u], strategy.params, seed=(seed, pid))[0]
                   for pid, u in enumerate(parts)])
    V = nmf(P, strategy.rank, strategy.reg, strategy.nmf_iters).V
    ranking = rating = 0.0
    for u in parts:
        train, test = data.train[u], data.test[u]
        U = fit_user_factors(train, V, strategy.reg, strategy.nmf_iters)
        sums = silo_metric_sums(U @ V.T, train, test, strategy.params.value_max,
                                strategy.top_k)
        ranking, rating = ranking + sums["ranking"], rating + sums["rating"]
    return metric_means(strategy.top_k, ranking, rating)


def fedsvd_point(cfg: Mapping[str, Any], nodes: int, noise: Any) -> dict[str, float]:
    """What a fedsvd-privacy run computes (``power_svd.run_in_process``: the nodes' and the
    server's steps in the Flower run's order), its leading basis scored by every user's
    r_u Z Z^T as the nodes' ``fedsvd_evaluate``; ``noise(shape, std)`` draws each node's
    noise."""
    from fedrec.recsys import power_svd as svd
    from fedrec.recsys.metrics import evaluate_ranking

    params = svd.params_from_config(cfg)
    data, parts = node_rows(cfg, nodes)
    run = svd.run_in_process("fedsvd-privacy", [data.train[u] for u in parts], params,
                             noise=noise)
    Z = svd.leading_basis(run.Z_bar, params.k)
    return evaluate_ranking(lambda rows: data.train[rows] @ Z @ Z.T, data.train, data.test,
                            k=20).means()


def dp_popularity_point(cfg: Mapping[str, Any], nodes: int, epsilon: float,
                        clip: float = POP_CLIP) -> dict[str, float]:
    """Every silo's epsilon-DP item counts summed; every user ranks the items it has not
    trained on by them (scored like ``popularity_sums``)."""
    from fedrec.recsys.dp_popularity import dp_item_counts
    from fedrec.recsys.metrics import evaluate_ranking

    data, parts = node_rows(cfg, nodes)
    counts = sum(dp_item_counts(data.train[u], epsilon, clip) for u in parts)
    return evaluate_ranking(lambda rows: np.tile(counts, (len(rows), 1)), data.train,
                            data.test, k=20).means()


def seeded_noise(key: str) -> Any:
    """N(0, std^2) from numpy's generator seeded by the unit's key (reproducible points)."""
    rng = np.random.default_rng([zlib.crc32(key.encode()), 7])

    def noise(shape: tuple[int, ...], std: float) -> np.ndarray:
        return rng.normal(0.0, std, shape) if std > 0 else np.zeros(shape)

    return noise


def point(protocol: str, epsilon: float, seed: int, dataset: str = DATASET
          ) -> dict[str, Any]:
    """One unit: the protocol at ``epsilon`` and ``seed``: its metrics, wall time and the
    noise it ran with (fedsvd-ddp: also each node's share and the epsilon its ledger
    charges for it, which cannot count on the other nodes' shares)."""
    t0 = time.perf_counter()
    cfg, nodes = run_config(protocol, seed, epsilon, dataset)
    out: dict[str, Any] = {}
    if protocol == "dp-prototypes":
        metrics = dp_prototypes_point(cfg, nodes)
    elif protocol in ("fedsvd-privacy", "fedsvd-ddp"):
        from fedrec.recsys import power_svd as svd

        metrics = fedsvd_point(cfg, nodes, seeded_noise(unit_key(protocol, epsilon, seed)))
        params = svd.params_from_config(cfg)
        if params.ddp:
            share = params.node_sigma("fedsvd-privacy", nodes)
            # run_config calibrated sigma to epsilon / factor (Theorem 2 is linear in 1/sigma)
            factor = epsilon / svd.release_epsilon(params, params.sigma, params.r, params.T)
            out.update(node_sigma=share, weight_factor=factor,
                       node_epsilon=svd.release_epsilon(params, share, params.r, params.T))
        ledger = svd.release_ledger(params, params.sigma, params.r, params.T)
        multiplier = params.sigma / svd.sensitivity(params)
        with warnings.catch_warnings():  # Opacus warns about its optimal order's range
            warnings.simplefilter("ignore")
            rdp = (ledger.gaussian_epsilon(params.delta, "rdp")  # Opacus: slow below 0.05
                   if multiplier >= svd.OPACUS_MIN_NOISE_MULTIPLIER["rdp"] else None)
        out.update(sigma=params.sigma, noise_multiplier=multiplier,
                   total_delta=ledger.basic_composition()[1], epsilon_rdp=rdp)
    else:
        metrics = dp_popularity_point(cfg, nodes, epsilon)
    return {**out, "ndcg@20": metrics["ndcg@20"], "recall@20": metrics["recall@20"],
            "nodes": nodes, "seconds": time.perf_counter() - t0}


def references(seed: int, dataset: str = DATASET) -> dict[str, Any]:
    """Item popularity (0/1 counts, as the leaderboard), Full NMF and the exact truncated SVD
    on the split of ``seed``."""
    from fedrec.recsys.metrics import popularity_sums
    from strategies.fedsvd import FedSvdPrivacy

    t0 = time.perf_counter()
    cfg, nodes = run_config("fedsvd-privacy", seed, dataset=dataset)
    data, _ = node_rows(cfg, nodes)
    out = {"popularity": popularity_sums(data.train, data.test).means()["ndcg@20"],
           "exact-svd": FedSvdPrivacy(cfg).reference(data)["ndcg@20"]}
    if SETTINGS[dataset].fixed_split:
        out["random"] = random_ranking(data, seed)
        return {**out, **full_nmf_untuned(seed, dataset), "seconds": time.perf_counter() - t0}
    return {**out, **full_nmf(seed, dataset), "seconds": time.perf_counter() - t0}


def random_ranking(data: Any, seed: int) -> float:
    """NDCG@20 of uniform random scores, drawn per seed (the verdict against it pairs each
    seed's point with that seed's draw, so the draw's own spread counts)."""
    from fedrec.recsys.metrics import evaluate_ranking

    rng = np.random.default_rng([seed, 77])
    return evaluate_ranking(lambda r: rng.random((len(r), data.train.shape[1])), data.train,
                            data.test, k=20).means()["ndcg@20"]


def full_nmf_untuned(seed: int, dataset: str) -> dict[str, float]:
    """Full NMF at dp-prototypes' own settings (``dpp-reg``, ``dpp-nmf-iters`` HALS sweeps
    or HALS's stop), scored as the silos score: the reference on Gowalla and Yelp2018,
    where tuning it as :func:`full_nmf` does would score 30,000 users x 40,000 items some
    hundred times (ML-1M's tuning took 50 s at 1/100 of that size)."""
    from fedrec.recsys.nmf_ceiling import NMFModel
    from strategies.dp_prototypes import DPPrototypes

    cfg, nodes = run_config("dp-prototypes", seed, dataset=dataset)
    data, _ = node_rows(cfg, nodes)
    strategy = DPPrototypes(cfg)
    model = NMFModel(strategy.rank, strategy.reg, strategy.nmf_iters,
                     sweeps_per_round=strategy.nmf_iters).fit(data.train, 1)
    return {"full-nmf-untuned": strategy.model_metrics(model, data)["ndcg@20"],
            "full-nmf-untuned/sweeps": float(model.sweeps)}


def full_nmf(seed: int, dataset: str = DATASET) -> dict[str, float]:
    """dp-prototypes' centralized ceiling on the split of ``seed`` (``DPPrototypes.reference``:
    Full NMF tuned on a validation split of train): its NDCG@20 and what tuning chose."""
    from strategies.dp_prototypes import DPPrototypes

    cfg, nodes = run_config("dp-prototypes", seed, dataset=dataset)
    data, _ = node_rows(cfg, nodes)
    ref = DPPrototypes(cfg).reference(data)
    return {"full-nmf": ref["ndcg@20"],
            **{f"full-nmf/{k}": v for k, v in ref.items() if k.startswith("tuned-")}}


def reference_unit(done: Mapping[str, Any], seed: int, setting: Setting) -> dict[str, Any]:
    """The references of ``seed``: computed, or on a dataset with its own split (the same
    for every seed) seed 0's, marked as such, with this seed's own random ranking draw."""
    first = done.get("reference/0")
    if setting.fixed_split and seed > 0 and first is not None:
        cfg, nodes = run_config("fedsvd-privacy", seed, dataset=setting.dataset)
        data, _ = node_rows(cfg, nodes)
        return {**first, "random": random_ranking(data, seed), "same_split_as": 0}
    return references(seed, setting.dataset)


def refresh_full_nmf(path: Path) -> dict[str, Any]:
    """The stored references' Full NMF recomputed as the tuned ceiling, seed by seed (the
    file rewritten after each; a seed already tuned is kept), every other unit untouched:
    the DP points do not depend on the reference."""
    result = stored_result(path)
    if result is None:
        raise SystemExit(f"error: {path} does not exist: run the benchmark first")
    for key, unit in sorted(result["units"].items()):
        if key.startswith("reference/") and "full-nmf/tuned-reg" not in unit:
            t0 = time.perf_counter()
            unit.update(full_nmf(int(key.split("/")[1]), result["config"]["dataset"]))
            unit["full-nmf/seconds"] = time.perf_counter() - t0
            log(f"{key}: tuned Full NMF {unit['full-nmf']:.4f} (reg "
                f"{unit['full-nmf/tuned-reg']:g}, {unit['full-nmf/tuned-rounds']:.0f} sweeps, "
                f"{unit['full-nmf/seconds']:.0f} s)")
            write_report(path, result, markdown(result))
    return result


def unit_key(protocol: str, epsilon: float, seed: int) -> str:
    return f"{protocol}/{epsilon:g}/{seed}"


# -- reading the numbers ---------------------------------------------------------------------
def mean_spread(values: Sequence[float]) -> tuple[float, float]:
    """Mean and spread over seeds: the sample standard deviation (ddof 1; nan for 1 seed,
    where the spread is unknown)."""
    a = np.asarray(values, dtype=np.float64)
    return float(a.mean()), float(a.std(ddof=1)) if a.size > 1 else float("nan")


def useful(gains: Sequence[float]) -> bool:
    """Whether a protocol beats popularity at one epsilon: its gain over popularity on the
    same split (NDCG@20, per seed) has mean minus spread above 0. Paired per seed because
    popularity moves with the split; needs >= 2 seeds (1 seed has no spread)."""
    mean, spread = mean_spread(gains)
    return len(gains) >= 2 and mean - spread > 0


def first_useful(curve: Mapping[float, Sequence[float]]) -> float | None:
    """The smallest epsilon at which :func:`useful` holds (None: never on the grid)."""
    return next((eps for eps in sorted(curve) if useful(curve[eps])), None)


def curves(result: Mapping[str, Any], baseline: str = "popularity"
           ) -> dict[str, dict[float, dict[str, list[float]]]]:
    """protocol -> epsilon -> {"ndcg": per seed, "gain": per seed (minus ``baseline``, a
    reference, on the same split), "seeds"}, from the stored units."""
    units = result["units"]
    out: dict[str, dict[float, dict[str, list[float]]]] = {}
    for key, unit in units.items():
        if key.startswith("reference/"):
            continue
        protocol, eps, seed = key.split("/")
        ref = units.get(f"reference/{seed}")
        if ref is None or baseline not in ref:
            continue
        row = out.setdefault(protocol, {}).setdefault(float(eps), {"ndcg": [], "gain": [],
                                                                  "seeds": []})
        row["ndcg"].append(unit["ndcg@20"])
        row["gain"].append(unit["ndcg@20"] - ref[baseline])
        row["seeds"].append(int(seed))
    return out


def reference_lines(result: Mapping[str, Any]) -> dict[str, tuple[float, float]]:
    """Mean and spread over seeds of popularity and of each non-private reference."""
    refs = [u for k, u in result["units"].items() if k.startswith("reference/")]
    return {name: mean_spread([r[name] for r in refs])
            for name in ("popularity", *REFERENCE_LABEL) if all(name in r for r in refs)}


def gains_over(result: Mapping[str, Any], protocol: str, baseline: str
               ) -> dict[float, list[float]]:
    """epsilon -> per seed, ``protocol``'s NDCG@20 minus ``baseline``'s at the same epsilon
    and seed (the same split and budget), where both ran."""
    units = result["units"]
    out: dict[float, list[float]] = {}
    for key, unit in units.items():
        name, eps, seed = key.split("/") if key.count("/") == 2 else ("", "", "")
        other = units.get(f"{baseline}/{eps}/{seed}")
        if name == protocol and other is not None:
            out.setdefault(float(eps), []).append(unit["ndcg@20"] - other["ndcg@20"])
    return out


def verdict(gains: Mapping[float, Sequence[float]], grid: Sequence[float]) -> str:
    """From which epsilon :func:`useful` holds for ``gains`` (per epsilon, per seed), or
    "never in <grid>"; epsilons above it where it does not hold are named."""
    eps = first_useful(gains)
    lo, hi = f"{min(grid):g}", f"{max(grid):g}"
    if eps is None:
        return f"never in {lo}-{hi}"
    later = [e for e in gains if e > eps and not useful(gains[e])]
    return f"from epsilon {eps:g}" + (
        f" (not at {', '.join(f'{e:g}' for e in sorted(later))})" if later else "")


def _f(x: float | None, fmt: str = "{:.4f}") -> str:
    return "-" if x is None or not math.isfinite(x) else fmt.format(x)


def _header(result: Mapping[str, Any], lines: Mapping[str, tuple[float, float]]
            ) -> list[str]:
    """The report's opening: what ran, how to reproduce it, the references, the guarantees."""
    cfg = result["config"]
    pop = lines.get("popularity", (float("nan"),) * 2)
    refs = [f"- Item popularity: NDCG@20 {_f(pop[0])} +- {_f(pop[1])}.",
            *(f"- {REFERENCE_LABEL[name]}: {_f(lines[name][0])} +- {_f(lines[name][1])}."
              for name in REFERENCE_LABEL if name in lines)]
    if cfg["dataset"] != "ml-1m":
        return _large_header(result, refs)
    return [
        "# DP protocols on ML-1M (users 1-2999): NDCG@20 against epsilon", "",
        "Each protocol in its leaderboard setting; epsilon set through its own keys; "
        "seeds as listed per point (a seed draws the 80/20 split, the public randomness and the "
        "noise, as `run_simulation.py --set seed=S`). Popularity and the references are "
        "computed on each seed's split. Points are the protocols' arithmetic in one process "
        "(the nodes' and server's functions in their order; `tests/test_dp_curves.py` shows a "
        "point equals the Flower run's metrics with the same noise). dp-prototypes draws its "
        "noise with the project's OpenDP sampler; fedsvd-privacy's Gaussian noise comes from "
        "numpy's seeded generator (same distribution; OpenDP's sampler would take ~10 min of "
        "noise per point here). "
        f"Command: `{COMMAND}` (the decade grid, 3 seeds), then `{FINE_COMMAND}` (half-decades "
        f"and 5 seeds for the two cheap methods), `{PROTOTYPES_COMMAND}` and "
        f"`{PROTOTYPES_SEEDS_COMMAND}` (5 seeds where dp-prototypes crosses popularity); "
        "dp-prototypes' "
        f"Full NMF reference recomputed alone as the tuned ceiling by `{REFRESH_COMMAND}`. flwr "
        f"{cfg['machine']['flwr_version']}, machine {cfg['machine']}.", "",
        *refs,
        "- Guarantees: dp-prototypes and dp-popularity are pure epsilon-DP per silo at user "
        "level (10 zip silos, parallel composition); fedsvd-privacy is (epsilon, T delta)-DP "
        f"per node, epsilon by basic composition of Theorem 2 over T = 92 iterations (delta = "
        f"{cfg['fedsvd_delta']:g} per iteration), the number a node charges; its Opacus RDP "
        "epsilon at the same sigma is in its table where Opacus runs (noise multiplier >= "
        "0.05).",
        f"- dp-popularity: the DP baseline: every silo releases its item counts plus "
        f"Laplace(clip / epsilon) noise, each user's row scaled to L1 norm <= {cfg['pop_clip']:g} "
        "(dp-prototypes' per-user sparsity), `fedrec/recsys/dp_popularity.py`.", ""]


def _large_header(result: Mapping[str, Any], refs: list[str]) -> list[str]:
    """:func:`_header` for a dataset of :func:`_large`: the user-level grid, and what each
    protocol's epsilon is a guarantee of (fedsvd's is not user level)."""
    cfg = result["config"]
    setting = SETTINGS[cfg["dataset"]]
    label = LABEL[cfg["dataset"]]
    delta = cfg["fedsvd_delta"]
    command = f"python benchmarks/dp_curves.py --dataset {cfg['dataset']} --resume"
    return [
        f"# The papers' DP protocols on {label}: NDCG@20 against epsilon", "",
        f"{label}'s own train/test split; epsilon {', '.join(f'{e:g}' for e in setting.epsilons)}"
        "; 3 seeds (a seed draws the silos, the public randomness and the noise). Points are "
        "the protocols' arithmetic in one process (the nodes' and server's functions in "
        "their order, as on ML-1M: `tests/test_dp_curves.py` shows a point equals the Flower "
        "run's metrics with the same noise); dp-prototypes draws its noise with the project's "
        "exact sampler, fedsvd's Gaussian noise comes from numpy's seeded generator (same "
        f"distribution). Command: `{command}`. flwr {cfg['machine']['flwr_version']}, "
        f"machine {cfg['machine']}.", "",
        *refs,
        "- Settings: dp-prototypes and dp-popularity on 10 silos of users drawn at random "
        f"(`partition = shards-random`: {label} has no zip codes), the 0/1 data's own value "
        "bound (`dpp-value-max = 1`), k = 50 as on ML-1M; fedsvd-privacy on ML-1M's 4 "
        f"contiguous shards, T = 92, delta {delta:g} per iteration (T delta = {92 * delta:.2g}, "
        "below 1 / users).",
        "- Guarantees: dp-prototypes and dp-popularity are pure epsilon-DP per silo at user "
        "level (a user's row added or removed; parallel composition over silos). "
        "fedsvd-privacy's epsilon is the paper's (Theorem 2 over T iterations, basic "
        "composition): its neighbouring relation is one entry of a node's Gram matrix "
        "M'_i = M_i^T M_i / s_i changed within m_hat, NOT a user: one user's row moves up to "
        "degree^2 entries and the paper bounds no row, so at the same epsilon its guarantee "
        "is weaker than the others'. The method's user-level form, with every user's row "
        "bounded and the noise shared inside the sum, is `dp-svd` (`results/dp_svd/`).",
        "- fedsvd-ddp: the paper's distributed variant (`fedsvd-ddp = true`, Sec. 5) with a "
        "sync every iteration (`fedsvd-sync-every = 1`, so no node-local iterate escapes the "
        "sum): each of the 4 nodes adds N(0, sigma^2 / 4) inside the SecAgg+ sum; its "
        "epsilon is the sum's for its most exposed node (Theorem 2 at the total sigma, the "
        "paper's claim for the variant, times max_i w_i sqrt(n) / ||w||_2 for the nodes' "
        "weights w_i = s_i / s; all 4 shares in the sum); each node's ledger charges what "
        "its own share gives (column 'node charges': it cannot count on the other nodes' "
        "noise).",
        f"- dp-popularity: the DP baseline: every silo releases its item counts plus "
        f"Laplace(clip / epsilon) noise, each user's row scaled to L1 norm <= "
        f"{cfg['pop_clip']:g} (dp-prototypes' per-user sparsity), "
        "`fedrec/recsys/dp_popularity.py`.", ""]


def planned(dataset: str) -> list[str]:
    """Every unit the dataset's commands run (the report lists those not yet run)."""
    if dataset != "ml-1m":
        setting = SETTINGS[dataset]
        return [unit_key(p, e, s) for s in range(3) for p in setting.protocols
                for e in setting.epsilons]
    keys = [unit_key(p, e, s) for p in SETTINGS["ml-1m"].protocols for e in EPSILONS
            for s in range(3)] + [
        unit_key(p, e, s) for p in CHEAP for e in EPSILONS + FINE_EPSILONS for s in range(5)] + [
        unit_key("dp-prototypes", e, s) for e in PROTOTYPES_FINE for s in range(3)]
    return list(dict.fromkeys(keys))


def markdown(result: Mapping[str, Any]) -> str:
    cfg = result["config"]
    cs, lines = curves(result), reference_lines(result)
    grid = sorted({e for curve in cs.values() for e in curve})
    rand = curves(result, "random") if "random" in lines else {}
    out = [
        *_header(result, lines),
        "## When each becomes useful", "",
        "Rule (chosen here, to say where privacy starts to cost less than it gives): a "
        "protocol is useful at an epsilon when its NDCG@20 gain over item "
        "popularity on the same split, mean minus spread (sample standard deviation over "
        "seeds), is above 0; at least 2 seeds. Below that the protocol's per-user model ranks "
        "worse than recommending everyone the most popular items. The same rule against the "
        "DP baseline (dp-popularity at the same epsilon and seed) says from which epsilon a "
        "protocol beats what a user gets from DP item counts alone.", "",
        "| protocol | beats popularity | beats dp-popularity (same epsilon) | best mean "
        "NDCG@20 (epsilon) |" + (" beats random ranking |" if rand else ""),
        "|---|---|---|---|" + ("---|" if rand else "")]
    for protocol in PROTOCOLS:
        if protocol not in cs:
            continue
        best = max(cs[protocol].items(), key=lambda kv: np.mean(kv[1]["ndcg"]))
        dp_base = ("-" if protocol == "dp-popularity" else
                   verdict(gains_over(result, protocol, "dp-popularity"), grid))
        over_pop = verdict({e: r["gain"] for e, r in cs[protocol].items()}, grid)
        over_rand = (" " + verdict({e: r["gain"] for e, r in rand[protocol].items()}, grid)
                     + " |" if rand else "")
        out.append(f"| {protocol} | {over_pop} | {dp_base} | "
                   f"{np.mean(best[1]['ndcg']):.4f} ({best[0]:g}) |" + over_rand)
    out += ["", "Best DP method at each epsilon (mean NDCG@20):", "",
            "| epsilon | " + " | ".join(p for p in PROTOCOLS if p in cs) + " | best |",
            "|---|" + "---|" * (sum(p in cs for p in PROTOCOLS) + 1)]
    for eps in grid:
        means = {p: float(np.mean(cs[p][eps]["ndcg"])) for p in PROTOCOLS
                 if p in cs and eps in cs[p]}
        if means:
            out.append(f"| {eps:g} | " + " | ".join(_f(means.get(p)) for p in PROTOCOLS
                                                   if p in cs)
                       + f" | {max(means, key=means.get)} |")
    for protocol in PROTOCOLS:
        if protocol not in cs:
            continue
        svd, ddp = protocol.startswith("fedsvd"), protocol == "fedsvd-ddp"
        sigma = "total sigma | node share | node charges" if ddp else "node sigma"
        out += ["", f"## {protocol}", "",
                "| epsilon | NDCG@20 | gain over popularity | useful | seeds | seconds per "
                "point |" + (f" {sigma} | Opacus RDP epsilon (delta "
                             f"{cfg['fedsvd_delta']:g}) |" if svd else ""),
                "|---|---|---|---|---|---|" + ("---|---|" + "---|---|" * ddp if svd else "")]
        for eps, row in sorted(cs[protocol].items()):
            units = [result["units"][unit_key(protocol, eps, s)] for s in row["seeds"]]
            n, sn = mean_spread(row["ndcg"])
            g, sg = mean_spread(row["gain"])
            share = (f" {units[0]['node_sigma']:.4g} | {units[0]['node_epsilon']:.4g} |"
                     if ddp else "")
            extra = (f" {units[0]['sigma']:.4g} |{share} "
                     f"{_f(units[0].get('epsilon_rdp'), '{:.4g}')} |" if svd else "")
            out.append(f"| {eps:g} | {n:.4f} +- {_f(sn)} | {g:+.4f} +- {_f(sg)} "
                       f"| {'yes' if useful(row['gain']) else 'no'} | {len(row['seeds'])} | "
                       f"{np.mean([u['seconds'] for u in units]):.1f} |" + extra)
    missing = [key for key in planned(cfg["dataset"]) if key not in result["units"]]
    if missing:
        out += ["", f"Not yet run ({len(missing)} units; `--resume` runs them): "
                + ", ".join(missing) + "."]
    out += ["", f"Plot: `{cfg['dataset']}.png`.", ""]
    return "\n".join(out)


def plot(result: Mapping[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cs, lines = curves(result), reference_lines(result)
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    colours = {"dp-prototypes": "tab:red", "fedsvd-privacy": "tab:blue",
               "fedsvd-ddp": "tab:purple", "dp-popularity": "tab:green"}
    dataset = result["config"]["dataset"]
    for protocol in PROTOCOLS:
        if protocol not in cs:
            continue
        eps = sorted(cs[protocol])
        stats = [mean_spread(cs[protocol][e]["ndcg"]) for e in eps]
        ax.errorbar(eps, [m for m, _ in stats], yerr=[0 if math.isnan(s) else s
                                                     for _, s in stats],
                    marker="o", capsize=3, color=colours[protocol],
                    label=protocol + (" (DP baseline)" if protocol == "dp-popularity" else ""))
    if "popularity" in lines:
        ax.axhline(lines["popularity"][0], color="grey", ls=":", label="popularity")
    if "random" in lines:
        ax.axhline(lines["random"][0], color="black", ls=":", lw=1, label="random ranking")
    for name, protocol in (("full-nmf", "dp-prototypes"), ("full-nmf-untuned", "dp-prototypes"),
                           ("exact-svd", "fedsvd-privacy")):
        if name in lines:
            ax.axhline(lines[name][0], color=colours[protocol], ls="--", lw=1,
                       label=REFERENCE_LABEL[name].split(" (")[0] + f" ({protocol} ref.)")
    ax.set_xscale("log")
    delta = 92 * result["config"]["fedsvd_delta"]
    ax.set_xlabel(f"epsilon (dp-*: pure, per silo, user level; fedsvd-*: basic composition, "
                  f"delta {delta:.2g}, one Gram entry)", fontsize=8)
    ax.set_ylabel("NDCG@20")
    seeds = ("dp-prototypes 3, others 5" if dataset == "ml-1m" else "3 seeds")
    ax.set_title(f"{LABEL[dataset]}: mean +- std over seeds ({seeds})", fontsize=10)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dataset", default=DATASET, choices=sorted(SETTINGS))
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--epsilons", type=float, nargs="+",
                    help="default: the dataset's grid (ML-1M: the decades 0.1-1e6)")
    ap.add_argument("--protocols", nargs="+", choices=PROTOCOLS,
                    help="default: the dataset's (fedsvd-ddp beside the others off ML-1M)")
    ap.add_argument("--resume", action="store_true", help="keep the units already stored")
    ap.add_argument("--out", type=Path, help="default: results/dp_curves/<dataset>.json")
    ap.add_argument("--markdown-only", action="store_true")
    ap.add_argument("--refresh-full-nmf", action="store_true",
                    help="recompute only the stored references' Full NMF (the tuned "
                         "ceiling), keep every other unit")
    args = ap.parse_args(argv)
    setting = SETTINGS[args.dataset]
    args.out = args.out or setting.out
    if args.refresh_full_nmf:
        result = refresh_full_nmf(args.out)
        write_report(args.out, result, markdown(result))
        plot(result, args.out.with_suffix(".png"))
        return 0
    if args.markdown_only:
        rewrite_markdown(args.out, markdown, plot)
        return 0
    from fedrec.recsys.power_svd import SvdParams

    seeds = list(range(args.seeds))
    # what gives a unit its meaning; the grid and the seeds are in the units' keys, so a
    # later --resume may add epsilons or seeds to the same file
    config = {"dataset": args.dataset, "pop_clip": POP_CLIP,
              "fedsvd_delta": setting.fedsvd.get("fedsvd-delta", SvdParams().delta),
              "machine": machine_info()}
    if args.dataset != "ml-1m":
        config.update(silos=setting.silos, silo_nodes=setting.silo_nodes,
                      fedsvd_nodes=setting.fedsvd_nodes)
    units = Units(args.out, config, args.resume)
    # seed by seed, cheap protocols first: a stopped run leaves whole curves of its seeds
    for seed in seeds:
        for protocol in args.protocols or setting.protocols:
            for eps in args.epsilons or setting.epsilons:
                key = unit_key(protocol, eps, seed)
                if key not in units.done:
                    log(f"{key}")
                unit = units.get(key, lambda: point(protocol, eps, seed, args.dataset))
                log(f"  {key}: NDCG@20 {unit['ndcg@20']:.4f} ({unit['seconds']:.1f} s)")
        # the references last (the tuned Full NMF takes longest): a stopped run keeps points
        log(f"reference/{seed}")
        units.get(f"reference/{seed}", lambda: reference_unit(units.done, seed, setting))
        result = {"config": config, "units": units.done}
        write_report(args.out, result, markdown(result))
        plot(result, args.out.with_suffix(".png"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
