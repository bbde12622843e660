"""The leaderboard's report: its Markdown (one table per dataset, how each centralized
column was obtained) and its plot, from the stored board. Both runners that write the board
(``benchmarks/leaderboard.py``, ``benchmarks/lpgcn_converged.py``) regenerate it from here."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks._board import LABEL, ORDER, REPO, label
from benchmarks._board_dp import lines as dp_curve_lines
from benchmarks._report import stored_result


def _metric_keys(metrics: dict[str, Any]) -> list[str]:
    """Model prefixes ("" or "gf-cf/") of the NDCG@20 entries a run reports."""
    return sorted(k[: -len("ndcg@20")] for k in metrics if k.endswith("ndcg@20"))


def _f(x: Any, fmt: str = "{:.4f}") -> str:
    return fmt.format(x) if isinstance(x, (int, float)) and math.isfinite(x) else "-"


#: Protocols whose metric is their own (MVMF: the paper's candidate set, ratings >= 4
#: relevant): listed after the comparable rows and never "best".
OWN_METRIC = ("fedmvmf", "privmvmf")


def rows(result: dict[str, Any], dataset: str) -> list[dict[str, Any]]:
    """One row per (protocol, model) of ``dataset``: the comparable rows by NDCG@20, best
    first, then the rows with their own metric."""
    out = []
    for cell in result["cells"].values():
        if cell["dataset"] != dataset:
            continue
        fed, cen = cell["federated"], cell["centralized"]
        for prefix in _metric_keys(fed):
            name = cell["protocol"] + (f" ({prefix.rstrip('/')})" if prefix else "")
            if cell["protocol"] in OWN_METRIC:
                name += " *"
            out.append({"name": name, "ndcg": fed[f"{prefix}ndcg@20"],
                        "recall": fed.get(f"{prefix}recall@20"),
                        "cen_ndcg": cen.get(f"{prefix}ndcg@20"), "cell": cell})
    return sorted(out, key=lambda r: (r["cell"]["protocol"] in OWN_METRIC, -r["ndcg"]))


#: How each protocol's centralized reference is obtained, against the rule that a ceiling is
#: the same model trained centrally to convergence (early stopping on a validation split of
#: train, the federated run's hyperparameters).
CEILING = {
    "fedmf": "BPR-MF trained centrally to convergence: rounds chosen by early stopping on a "
             "10% validation split carved from train (patience 5, at most 10x the run's "
             "rounds); one Adam step size for user and item factors at 1, 1/3, 1/10, 1/30 "
             "of the run's with the L2 weight at 1 and 3 times the run's (8 candidates), then "
             "at the best L2 weight the item step at 1/3 or 1/10 of the user step (7 more: a "
             "federated round averages the nodes' item deltas, so its item factors move "
             "slower than its user factors), then one step past any edge of what was tried "
             "that the best sits on (2 passes at most), all on the same validation split. "
             "A cell records the search it used (`tuned-halving` 1; 0 or absent: full): "
             "`halving` (the default) "
             "trains every candidate a few rounds and continues the best third from its "
             "state within a budget of selection rounds, `full` trains each to its early "
             "stop; the best is retrained on all of train (`fedrec.recsys.mf_ceiling`; the "
             "two searches against each other and the federated run: "
             "`results/fedmf/ceiling_budget.md`)",
    "privirec": "the same filters computed exactly in one process (exact P~ and exact top-r "
                "eigenvectors, published hyperparameters): nothing is trained, this is the "
                "target the power method approximates (a different basis can score higher, "
                "e.g. Gowalla GF-CF)",
    "lpgcn": "centralized LightGCN at the run's hyperparameters for the epochs paper 001's "
             "stopping rule picks on a 10% validation split carved from train (NDCG@20 every 5 "
             "epochs, stop after 50 without a better one, at most 1000; the test split is never "
             "read), retrained on all of train; nothing else is tuned, on either side. The "
             "federated cell is the same model: LP-GCN computes this arithmetic exactly, shown "
             "by a Flower simulation of whole epochs of the same config (8 nodes) that matched "
             "the centralized model at those epochs (`results/lpgcn/converged.md`; parameters "
             "to 2e-13 in `results/lpgcn/ml-100k_simulation.md`), so the chosen epochs were "
             "run centrally (`benchmarks/lpgcn_converged.py`); the cell's rounds and bytes are "
             "that simulation's setup plus the chosen epochs x its per-epoch rounds and bytes",
    "fedpower": "the exact truncated SVD (top-k eigenspace of M'), the power method's target; "
                "nothing is trained",
    "dp-prototypes": "the paper's Full baseline (the same NMF on every training row, no DP) "
                     "trained centrally to convergence: HALS sweeps chosen by early stopping "
                     "on a 10% validation split carved from train (NDCG@20 every 10 sweeps, "
                     "patience 5 checks, at most 10x the run's `dpp-nmf-iters`, or HALS's own "
                     "1e-6 stop), the L2 weight at 0.1, 1, 10, 100 and 1000 times the run's, "
                     "then 1/3 and 3 times the best (7 candidates, the run's own weight among "
                     "them), the rank the run's; the best retrained on all of train and scored "
                     "as the silos score (`fedrec/recsys/nmf_ceiling.py`; the untuned Full "
                     "beside it on validation and test: `results/dp_prototypes/ceiling.md`)",
    "fedmvmf": "the same MVMF (dim, weighting, sampling, solver) trained centrally to "
               "convergence: epochs by early stopping on a 10% validation split carved from "
               "train (NDCG@20 of each user's held-out ratings, MVMF's own metric; a check "
               "every 5 epochs, patience 5 checks, at most 4x the run's epochs), lr x {1, 3} "
               "and lambda2 x {1/3, 1, 3} at 3x lr, then lambda1 x {1/3, 3} at the best and a "
               "step past any lr or lambda2 edge the best sits on (2 passes), the run's own "
               "setting among the candidates; the winner retrained on all of train, the test "
               "split never read. The federation's sums equal the centralized arithmetic "
               "(`tests/test_mvmf.py`), so fed / cen is the cost of the run's untuned epochs "
               "and hyperparameters (`results/mvmf/ceiling.md`); privmvmf's cell copies "
               "fedmvmf's reference (the same model, data and keys)",
}
for _p, _q in (("privirec-k", "privirec"), ("fedsvd-utility", "fedpower"),
               ("fedsvd-privacy", "fedpower"), ("privmvmf", "fedmvmf")):
    CEILING[_p] = CEILING[_q]


#: What a tuned reference's ``tuned-rounds`` counts, where it is not rounds.
UNITS = {"lpgcn": "epochs", "dp-prototypes": "sweeps", "fedmvmf": "epochs",
         "privmvmf": "epochs"}
#: Protocols whose reference tunes itself: a stored cell without ``tuned-rounds`` predates
#: that and is flagged until rerun.
TUNED = ("fedmf", "dp-prototypes", "fedmvmf", "privmvmf")


def ceiling_lines(result: dict[str, Any]) -> list[str]:
    """One line per protocol on the board: how its centralized column was obtained, with the
    rounds early stopping chose per dataset where the reference records them."""
    lines = ["## How each centralized column was obtained", ""]
    present = {c["protocol"] for c in result["cells"].values()}
    for proto in [p for p in ORDER if p in present]:
        unit = UNITS.get(proto, "rounds")
        tuned = [f"{label(c['dataset'])} {_tuned(c['centralized'], unit)}"
                 for c in result["cells"].values()
                 if c["protocol"] == proto and "tuned-rounds" in c["centralized"]]
        untuned = [label(c["dataset"]) for c in result["cells"].values()
                   if c["protocol"] == proto and proto in TUNED
                   and "tuned-rounds" not in c["centralized"]]
        extra = (f" (chosen: {'; '.join(tuned)})" if tuned else "") + (
            f"; {', '.join(untuned)}: still the fixed budget of the run (not regenerated)"
            if untuned else "")
        lines.append(f"- {proto}: {CEILING.get(proto, '-')}{extra}."
                     + (_privirec_gap(result) + _privirec_spread(result)
                        if proto == "privirec" else "")
                     + (_mvmf_cap(result, proto) if proto in ("fedmvmf", "privmvmf") else ""))
    return lines + [""]


def _tuned(cen: dict[str, Any], unit: str = "rounds") -> str:
    """The reference's chosen rounds (LP-GCN: epochs) and step sizes, as its cell records
    them."""
    out = f"{int(cen['tuned-rounds'])} {unit}"
    if "tuned-item-lr" in cen:
        out += (f" at lr {cen['tuned-lr']:.3g}, item lr {cen['tuned-item-lr']:.3g}, reg "
                f"{cen['tuned-reg']:g}, validation NDCG@20 {cen['tuned-valid']:.4f}"
                + (", at a grid edge" if cen.get("tuned-at-edge") else ""))
    elif "tuned-lam1" in cen:
        out += (f" at lr {cen['tuned-lr']:g}, lambda1 {cen['tuned-lam1']:g}, lambda2 "
                f"{cen['tuned-lam2']:.3g}, validation NDCG@20 {cen['tuned-valid']:.4f}"
                + (", at a grid edge" if cen.get("tuned-at-edge") else ""))
    elif "tuned-reg" in cen and "tuned-valid" in cen:
        out += (f" at reg {cen['tuned-reg']:g}, validation NDCG@20 {cen['tuned-valid']:.4f}"
                + (", at a grid edge" if cen.get("tuned-at-edge") else ""))
    elif "tuned-lr" in cen:
        out += f" at lr {cen['tuned-lr']:g}, reg {cen['tuned-reg']:g}"
    return out


#: Where PriviRec's eigengap at the filters' rank is measured per dataset.
RANK_GAP = REPO / "results" / "privirec" / "rank_gap.json"


def _privirec_cells(result: dict[str, Any], path: Path
                    ) -> Iterator[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(dataset, its rank-gap measurements, its PriviRec cell) for every dataset of
    ``path`` (results/privirec/rank_gap.json) with a PriviRec cell on the board."""
    for ds, g in (stored_result(path) or {}).get("datasets", {}).items():
        cell = result["cells"].get(f"{ds}/privirec")
        if cell is not None:
            yield ds, g, cell


def _privirec_gap(result: dict[str, Any], path: Path = RANK_GAP) -> str:
    """Per dataset whose PriviRec filters stay below 0.99 of centralized, the measured
    cause (results/privirec/rank_gap.json: P~'s eigenvalue ratio at the iteration rank)."""
    out = []
    for ds, g, cell in _privirec_cells(result, path):
        fed, cen = cell["federated"], cell["centralized"]
        ratios = [fed[k] / cen[k] for k in fed if k.endswith("ndcg@20") and cen.get(k)
                  and k.split("/")[0] in g["exact"]]
        if not ratios or min(ratios) >= 0.99:
            continue
        ritz = [r for r in g["rows"] if r["ritz"] and r["p"] == 2 * g["r"]]
        fixed = [r["ndcg20"][f] / g["exact"][f] for r in ritz for f in g["exact"]]
        out.append(f" {label(ds)}: the filters that need the power method reach "
                   f"{min(ratios):.3f}-{max(ratios):.3f} of the exact ones because P~'s "
                   f"eigenvalue ratio at the default iteration rank p = r = {g['r']} is "
                   f"{g['gap']['1r']:.4f} (the power method barely contracts in L = 3 rounds)"
                   + (f"; p = 2r with Ritz (`--set privirec-rank={2 * g['r']}`) measured "
                      f"{min(fixed):.3f}-{max(fixed):.3f}" if fixed else "")
                   + " (`results/privirec/rank_gap.md`).")
    return "".join(out)


#: A PriviRec cell above its exact filter is read against the run-to-run spread of the power
#: method (each node's Omega is private and unseeded, so every run is a fresh draw): the
#: default setting's draws in results/privirec/rank_gap.json. Rule (chosen): a ratio is a draw
#: of that spread while it is at most the draws' mean plus SPREAD_Z sample standard
#: deviations (about the top 2.5% of a normal spread), judged only with MIN_DRAWS draws or more.
SPREAD_Z, MIN_DRAWS = 2.0, 5


def within_spread(value: float, draws: Sequence[float], z: float = SPREAD_Z) -> bool | None:
    """Whether ``value`` is at most mean + z sd of ``draws`` (None: too few draws to say)."""
    if len(draws) < MIN_DRAWS:
        return None
    return value <= float(np.mean(draws)) + z * float(np.std(draws, ddof=1))


def _default_draws(g: dict[str, Any]) -> dict[str, list[float]]:
    """Per filter, the exact-filter ratios of the draws at a run's default setting (L = 3
    rounds, p = r, no Ritz: ``privirec-ritz = auto`` skips Ritz at p = r)."""
    rows = [r for r in g["rows"] if r["L"] == 3 and r["p"] == g["r"] and not r["ritz"]]
    return {f: [r["ndcg20"][f] / g["exact"][f] for r in rows] for f in g["exact"]}


def _privirec_spread(result: dict[str, Any], path: Path = RANK_GAP) -> str:
    """Per dataset whose PriviRec cell scores above an exact filter, whether that is a draw of
    the power method's run-to-run spread (``within_spread``) or a beaten ceiling."""
    out = []
    for ds, g, cell in _privirec_cells(result, path):
        fed, cen, draws = cell["federated"], cell["centralized"], _default_draws(g)
        above = {f: fed[f"{f}/ndcg@20"] / cen[f"{f}/ndcg@20"] for f in draws
                 if cen.get(f"{f}/ndcg@20") and fed.get(f"{f}/ndcg@20", 0) > cen[f"{f}/ndcg@20"]}
        if not above:
            continue
        verdicts = {f: within_spread(v, draws[f]) for f, v in above.items()}
        n = min(len(d) for d in draws.values())
        if None in verdicts.values():
            out.append(f" {label(ds)}: {_ratios(above)} above the exact filter, with {n} "
                       f"draws of the run-to-run spread measured (fewer than {MIN_DRAWS}: not "
                       "judged).")
            continue
        spread = "; ".join(f"{f} {min(d):.3f}-{max(d):.3f} (mean {np.mean(d):.3f}, sd "
                           f"{np.std(d, ddof=1):.3f})" for f, d in draws.items())
        inside = [f for f, ok in verdicts.items() if ok]
        outside = [f for f, ok in verdicts.items() if not ok]
        out.append(f" {label(ds)}: {_ratios(above)} above the exact filter; {n} draws of a "
                   f"run at these settings (private Omega, L = 3, p = r) give {spread}"
                   + (f"; {', '.join(inside)} within mean + {SPREAD_Z:g} sd (rule chosen: "
                      "`_board_report.within_spread`), so a draw of the power method's spread, "
                      "not a beaten ceiling" if inside else "")
                   + (f"; {', '.join(outside)} beyond mean + {SPREAD_Z:g} sd: there the exact "
                      "filter is not a ceiling for this run" if outside else "")
                   + " (`results/privirec/rank_gap.md`).")
    return "".join(out)


#: Where MVMF's ceiling is trained past its epoch cap (``benchmarks/mvmf_ceiling.py``).
MVMF_CEILING = REPO / "results" / "mvmf" / "ceiling.json"


def _mvmf_cap(result: dict[str, Any], proto: str, path: Path = MVMF_CEILING) -> str:
    """Per dataset whose MVMF ceiling chose the epoch cap, what training on past it gives on
    validation (the chosen setting to twice the cap, measured in ``path``)."""
    stored = (stored_result(path) or {}).get("datasets", {})
    out = []
    for ds, r in stored.items():
        cell = result["cells"].get(f"{ds}/{proto}")
        past = r.get("beyond_cap")
        cap = r.get("tuning", {}).get("max_epochs")
        if cell is None or past is None or cell["centralized"].get("tuned-rounds") != cap:
            continue
        at_cap = past["valid"][past["epochs"].index(cap)] if cap in past["epochs"] else None
        gain = (f"; at the cap {at_cap:.4f}, so the cap costs {past['best_valid'] - at_cap:.4f}"
                if at_cap is not None else "")
        out.append(f" {label(ds)}: the chosen epochs are the cap ({cap}); the chosen setting "
                   f"trained on to {2 * cap} epochs peaks at validation NDCG@20 "
                   f"{past['best_valid']:.4f} at {past['best_epochs']} epochs{gain} "
                   "(`results/mvmf/ceiling.md`).")
    return "".join(out)


def _ratios(ratios: dict[str, float]) -> str:
    return ", ".join(f"{f} {v:.3f}" for f, v in ratios.items())


def _epsilon_cell(cell: dict[str, Any]) -> str:
    if cell.get("epsilon") is not None:
        return f"{cell['epsilon']:g}"
    claim = cell.get("epsilon_not_valid")
    return f"none (claims {claim:.3g}, not a guarantee)" if claim else "-"


#: The command a board without a recorded one (the shipped board's) is continued with.
COMMAND = "python benchmarks/leaderboard.py --resume"


def markdown(result: dict[str, Any], png: str = "leaderboard.png") -> str:
    """The board's Markdown; ``png``: its plot's path relative to the Markdown's folder (the
    plot is written beside it), so the link resolves wherever the board is written."""
    lines = ["# Leaderboard: every protocol on the same splits", "",
             "NDCG@20 and Recall@20 of the federated run, its centralized reference (how each "
             "is obtained: last section) and item popularity on the same split; bytes per node (down "
             "+ up, mean over nodes), synchronous rounds, what the server sees, and epsilon "
             "where DP applies. `*`: MVMF's own metric (the paper's candidate set, test "
             "ratings >= 4 relevant). LP-GCN runs on the split without the items it left "
             "without a training interaction (`drop-cold-items`; LP-GCN refuses them), its "
             f"reference on the same. Command: `{result.get('command', COMMAND)}`.",
             ""]
    for ds in _datasets(result):
        rs = rows(result, ds)
        if not rs:
            continue
        pop = next(iter(r["cell"]["popularity"] for r in rs))
        lines += [f"## {label(ds)}", "",
                  f"Item popularity: NDCG@20 {_f(pop.get('ndcg@20'))}, Recall@20 "
                  f"{_f(pop.get('recall@20'))}.", "",
                  "| protocol | NDCG@20 | centralized | fed / cen | Recall@20 | vs popularity "
                  "| MB per node | rounds | server sees | epsilon | nodes |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in rs:
            c = r["cell"]
            ratio = r["ndcg"] / r["cen_ndcg"] if r["cen_ndcg"] else None
            own_pop = c["popularity"].get("ndcg@20")  # popularity on this cell's own split
            lift = (r["ndcg"] / own_pop if own_pop and c["protocol"] not in OWN_METRIC
                    else None)
            lines.append(
                f"| {r['name']} | {_f(r['ndcg'])} | {_f(r['cen_ndcg'])} | "
                f"{_f(ratio, '{:.3f}')} | {_f(r['recall'])} | {_f(lift, '{:.2f}x')} | "
                f"{c['bytes_per_node'] / 1e6:.2f} | {c['rounds']} | {c['server_sees']} | "
                f"{_epsilon_cell(c)} | {c['nodes']} |")
        comparable = [r for r in rs if r["cell"]["protocol"] not in OWN_METRIC] or rs
        best = comparable[0]
        private = [r for r in comparable if r["cell"]["epsilon"] is not None]
        notes = {r["cell"]["protocol"]: r["cell"]["note"] for r in rs if r["cell"].get("note")}
        if notes:  # a cell run otherwise than its protocol's board setting, and why
            lines += ["", *(f"- {proto}: {note}." for proto, note in notes.items())]
        lines += ["", f"Best NDCG@20: {best['name']} ({_f(best['ndcg'])}, "
                  f"{_f(best['ndcg'] / pop['ndcg@20'], '{:.2f}')}x popularity)."
                  + (f" Best with a DP guarantee: {private[0]['name']} "
                     f"({_f(private[0]['ndcg'])} at epsilon {private[0]['cell']['epsilon']:g})."
                     if private else ""), ""]
    failed = result.get("failed", {})
    if failed:
        lines += ["## Cells that did not run", "",
                  "A protocol that refuses a split says why; the board shows it, not a number.",
                  ""] + [f"- `{key}`: {why}" for key, why in sorted(failed.items())] + [""]
    lines += dp_curve_lines(REPO)
    lines += ceiling_lines(result)
    lines += [f"![NDCG@20 per protocol, beside centralized and popularity]({png})", "",
              f"Machine: {result.get('machine', {})}.", ""]
    return "\n".join(lines)


def _datasets(result: dict[str, Any]) -> list[str]:
    """The built-in datasets in their order, then a user's splits by name."""
    seen = {cell["dataset"] for cell in result["cells"].values()}
    return [ds for ds in LABEL if ds in seen] + sorted(seen - set(LABEL))


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    datasets = [ds for ds in _datasets(result) if rows(result, ds)]
    if not datasets:
        return
    fig, axes = plt.subplots(1, len(datasets), figsize=(6 * len(datasets), 4.5), squeeze=False)
    for ax, ds in zip(axes[0], datasets):
        rs = rows(result, ds)[::-1]
        ax.barh([r["name"] for r in rs], [r["ndcg"] for r in rs], label="federated")
        ax.scatter([r["cen_ndcg"] or 0 for r in rs], range(len(rs)), color="black", marker="|",
                   s=200, label="centralized", zorder=3)
        ax.axvline(rs[0]["cell"]["popularity"]["ndcg@20"], color="grey", ls=":",
                   label="popularity")
        ax.set_title(f"{label(ds)}: NDCG@20")
        ax.tick_params(axis="y", labelsize=7)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
