"""dp-svd's privacy-utility curve: NDCG@20 against user-level epsilon, beside its
non-private counterpart, item popularity, DP popularity and random ranking.

    nice python benchmarks/dp_svd.py --dataset ml-1m|gowalla|yelp2018 [--resume] [--markdown-only]

What runs: the dp-svd math (``fedrec/recsys/dp_svd.py`` ``simulate``: every user its own
node, each sum's noise drawn as one Gaussian of the total sigma) in one process; the
federated protocol (Flower messages, SecAgg+ with each node's discrete Gaussian share, each
node's ledger) computes the same sums (``tests/test_dp_svd.py``: with zero shares the
federated basis equals ``simulate``'s). For every epsilon the noise multiplier is
calibrated by the accountant every node runs (``calibrate``: the run's iterations + 1 sums
at rate 1), delta 1e-5 below 1 / users. The setting (items kept, rank, iterations) is
chosen per epsilon on a validation split carved from train
(``fedrec.recsys.mf.validation_split``, seed 0), never on test; the chosen one then runs on
the whole train split with 3 seeds (basis and noise), scored on test. The non-private
counterpart (no noise) is chosen the same way over the same grid plus two full-catalogue
settings of higher rank. Finished units are kept in ``results/dp_svd/units-<dataset>.json``
(``--resume``).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._report import Units, log, machine_info, write_report  # noqa: E402
from benchmarks.dp_fedmf import (  # noqa: E402
    DP_POPULARITY,
    _data,
    _dp_popularity,
    plot_curve,
    verdicts,
)

OUT = Path("results/dp_svd")
COMMAND = "nice python benchmarks/dp_svd.py --dataset {dataset}"
NAMES = {"ml-1m": "ML-1M (users 1-2999)", "gowalla": "Gowalla", "yelp2018": "Yelp2018"}
EPSILONS = {"ml-1m": (0.5, 1.0, 2.0, 5.0, 10.0, 20.0), "gowalla": (1.0, 5.0, 10.0),
            "yelp2018": (1.0, 5.0, 10.0)}
DELTA = 1e-5
SEEDS = (0, 1, 2)
#: (items kept, rank, iterations) tried on validation at every epsilon.
GRID = ((250, 4, 3), (500, 8, 3), (1000, 8, 3), (1000, 16, 4), (2000, 16, 4))
#: Weights of the noisy counts beside the low-rank score, tried for the chosen setting.
POP_WEIGHTS = (0.0, 0.1, 1.0)
#: The non-private counterpart's grid: the same, and the whole catalogue at higher rank.
NONPRIVATE_GRID = (*GRID, (0, 32, 8), (0, 64, 8))
K = 20


def _config(dataset: str) -> dict[str, Any]:
    return {"dataset": dataset, "epsilons": list(EPSILONS[dataset]), "delta": DELTA,
            "seeds": list(SEEDS), "grid": [list(g) for g in GRID],
            "nonprivate-grid": [list(g) for g in NONPRIVATE_GRID],
            "pop-weights": list(POP_WEIGHTS),
            "validation": "fedrec.recsys.mf.validation_split(train, seed=0) (10% of each "
                          "user's training items)", "top-k": K}


def _z(epsilon: float, iterations: int, users: int) -> float:
    from fedrec.secure.distributed_noise import calibrate

    return calibrate(epsilon * (1 - 1e-9), DELTA, 1.0, iterations + 1, users)


def _run(train, test, setting: tuple, z: float, seed: int,
         noise_seed: int | None = None) -> dict[str, float]:
    """``setting``: (items kept, rank, iterations[, pop weight]); ``seed`` draws the
    initial basis, ``noise_seed`` (default 1000 + seed) the noise."""
    from fedrec.recsys.dp_svd import DPSVDParams, scores, simulate
    from fedrec.recsys.metrics import evaluate_ranking

    items, rank, iterations = setting[:3]
    weight = setting[3] if len(setting) > 3 else 0.0
    t0 = time.process_time()
    model = simulate(train, DPSVDParams(rank=rank, iterations=iterations, items=items), z,
                     seed=seed, noise_seed=1000 + seed if noise_seed is None else noise_seed)
    n = train.shape[1]
    m = evaluate_ranking(lambda rows: scores(train[rows], model.items, model.X, n,
                                             model.counts, weight),
                         train, test, k=K).means()
    return {"ndcg@20": m[f"ndcg@{K}"], "recall@20": m[f"recall@{K}"],
            "cpu_s": time.process_time() - t0}


def _key(setting: tuple) -> str:
    return "|".join(str(v) for v in setting)


_FIELDS = ("items", "rank", "iterations", "pop_weight")


def _choose(units: Units, tag: str, grid, fit, valid, z_of) -> tuple[tuple, list[dict]]:
    """The best of ``grid`` on validation (pop weight 0), then the best pop weight of
    :data:`POP_WEIGHTS` for it: (items, rank, iterations, pop weight) and what was tried."""
    def score(s: tuple) -> dict[str, Any]:
        got = units.get(f"valid|{tag}|{_key(s)}",
                        lambda: (log(f"valid {tag} {s}"), _run(fit, valid, s, z_of(s), 0))[1])
        return {**dict(zip(_FIELDS, s)), "z": z_of(s), "valid_ndcg@20": got["ndcg@20"]}

    tried = [score((*s, 0.0)) for s in grid]
    best = max(tried, key=lambda t: t["valid_ndcg@20"])
    tried += [score((*(best[f] for f in _FIELDS[:3]), w)) for w in POP_WEIGHTS if w]
    best = max(tried, key=lambda t: t["valid_ndcg@20"])
    return tuple(best[f] for f in _FIELDS), tried


def measure(dataset: str, resume: bool) -> dict[str, Any]:
    from fedrec.recsys.metrics import evaluate_ranking, popularity_sums
    from fedrec.recsys.mf import validation_split
    from fedrec.secure.distributed_noise import (
        composed_epsilon,
        ddg_epsilon,
        multiplier_plan,
    )

    units = Units(OUT / f"units-{dataset}.json", _config(dataset), resume)
    data = _data(dataset)
    users = int(data.train.shape[0])
    fit, valid = validation_split(data.train, seed=0)
    rows = []
    for eps in EPSILONS[dataset]:
        def z_of(s: tuple, eps: float = eps) -> float:
            return units.get(f"z|{eps}|{s[2]}", lambda: _z(eps, int(s[2]), users))

        setting, tried = _choose(units, f"{eps}", GRID, fit, valid, z_of)
        z = z_of(setting)
        seeds = [units.get(f"test|{eps}|{seed}",
                           lambda: (log(f"test eps={eps} seed={seed}"),
                                    _run(data.train, data.test, setting, z, seed))[1])
                 for seed in SEEDS]
        plan = [(multiplier_plan(z, 1.0, users), int(setting[2]) + 1)]
        dp_pop = [units.get(f"dp-popularity|{eps}|{seed}",
                            lambda: _dp_popularity(data.train, data.test, eps, users, seed))
                  for seed in SEEDS]
        rows.append({"epsilon": eps, "delta": DELTA, "z": z,
                     "chosen": dict(zip(_FIELDS, setting)),
                     "epsilon-charged": composed_epsilon(plan, DELTA),
                     "epsilon-discrete-general-bound": ddg_epsilon(plan, DELTA),
                     "valid": tried, "test": seeds,
                     "ndcg@20": [r["ndcg@20"] for r in seeds],
                     "dp-popularity": [r["ndcg@20"] for r in dp_pop]})
    setting, tried = _choose(units, "nonprivate", NONPRIVATE_GRID, fit, valid, lambda s: 0.0)
    nonprivate = [units.get(f"test|nonprivate|{seed}",
                            lambda: (log(f"test non-private seed={seed}"),
                                     _run(data.train, data.test, setting, 0.0, seed))[1])
                  for seed in SEEDS]
    pop = popularity_sums(data.train, data.test, k=K).means()[f"ndcg@{K}"]
    rand = []
    for seed in SEEDS:
        rng = np.random.default_rng([seed, 77])
        rand.append(evaluate_ranking(lambda r: rng.random((len(r), data.train.shape[1])),
                                     data.train, data.test, k=K).means()[f"ndcg@{K}"])
    return {"config": _config(dataset), "machine": machine_info(),
            "command": COMMAND.format(dataset=dataset), "users": users,
            "items": int(data.train.shape[1]), "curve": rows,
            "nonprivate": {"chosen": dict(zip(_FIELDS, setting)),
                           "valid": tried, "test": nonprivate,
                           "ndcg@20": [r["ndcg@20"] for r in nonprivate]},
            "popularity": pop, "random": rand}


def _setting(c: dict[str, int]) -> str:
    return (f"{c['items'] or 'all'} items, rank {c['rank']}, {c['iterations']} iterations, "
            f"pop weight {c['pop_weight']:g}")


def markdown(result: dict[str, Any]) -> str:
    cfg, mach = result["config"], result["machine"]
    pop, rand, np_ = result["popularity"], result["random"], result["nonprivate"]
    name = NAMES[cfg["dataset"]]
    npm = float(np.mean(np_["ndcg@20"]))
    out = [f"# dp-svd on {name}: NDCG@20 against user-level epsilon", "",
           f"{name} ({result['users']} users, one per node, {result['items']} items), delta "
           f"= {cfg['delta']:g} (< 1 / {result['users']}), 3 seeds (basis and noise). "
           "Epsilon is user level: each user's row is scaled to L2 norm <= 1, so every sum "
           "(the item counts, then one per power iteration) moves by at most 1 per user; "
           "every node answers every sum (rate 1), and the accountant is Opacus's Gaussian "
           "RDP with the discrete correction (what every node charges); the last column is "
           "the discrete sum's general theorem (KLS Prop. 14) for the same noise.", "",
           "Settings (items kept by the noisy counts, rank, iterations) chosen per epsilon "
           f"on a validation split carved from train ({cfg['validation']}) among "
           f"{', '.join(str(tuple(g)) for g in cfg['grid'])}, then the weight of the noisy "
           f"counts beside the low-rank score among {cfg['pop-weights']} for the chosen one. "
           "Never tuned on test.", "",
           "| epsilon | items kept | rank | iterations | pop weight | noise multiplier | "
           "NDCG@20 (mean) | seeds (min - max) | DP popularity (mean) | popularity | "
           "non-private | epsilon, general bound |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["curve"]:
        c = r["chosen"]
        out.append(f"| {r['epsilon']:g} | {c['items'] or 'all'} | {c['rank']} | "
                   f"{c['iterations']} | {c['pop_weight']:g} | {r['z']:.3f} | {np.mean(r['ndcg@20']):.4f} | "
                   f"{min(r['ndcg@20']):.4f} - {max(r['ndcg@20']):.4f} | "
                   f"{np.mean(r['dp-popularity']):.4f} | {pop:.4f} | {npm:.4f} | "
                   f"{r['epsilon-discrete-general-bound']:.3g} |")
    out += ["",
            f"- Non-private counterpart (the same filter, no noise, chosen on validation "
            f"among the grid and the whole catalogue at rank 32 and 64): "
            f"{_setting(np_['chosen'])}, NDCG@20 {npm:.4f} ({min(np_['ndcg@20']):.4f} - "
            f"{max(np_['ndcg@20']):.4f}).",
            f"- DP popularity: {DP_POPULARITY}",
            f"- Item popularity: {pop:.4f}. Random ranking: {np.mean(rand):.4f} "
            f"({min(rand):.4f} - {max(rand):.4f}).", "", "## Verdicts (computed)", ""]
    out += [f"- {line}" for line in verdicts(result, "dp-svd")]
    out += ["", "## What the curve is", "",
            "Each point is the dp-svd math run in one process (`fedrec/recsys/dp_svd.py` "
            "`simulate`), each sum's noise one Gaussian of the total sigma (the federated "
            f"sum adds {result['users']} discrete Gaussian shares, whose sum the accounting "
            "treats as that Gaussian). The federated protocol over Flower messages and "
            "SecAgg+ computes the same sums (`tests/test_dp_svd.py`).", "",
            f"Reproduce: `{result['command']}`. flwr {mach['flwr_version']}, Python "
            f"{mach['python']}, numpy {mach['numpy']}, {mach['cpus']} CPUs "
            f"({mach['machine']}).", "", f"![curve](curve-{cfg['dataset']}.png)", ""]
    return "\n".join(out)


def plot(result: dict[str, Any], path: Path) -> None:
    plot_curve(result, path, "dp-svd", "same filter, non-private",
               f"dp-svd on {result['config']['dataset']}")


def main(argv: list[str] | None = None) -> None:
    import json

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dataset", choices=sorted(EPSILONS), default="ml-1m")
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--markdown-only", action="store_true")
    args = ap.parse_args(argv)
    out = OUT / f"curve-{args.dataset}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    result = (json.loads(out.read_text()) if args.markdown_only
              else measure(args.dataset, args.resume))
    write_report(out, result, markdown(result))
    plot(result, out.with_suffix(".png"))


if __name__ == "__main__":
    main()
