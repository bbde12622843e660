"""The user-level DP protocols' charged epsilon against Flower's own accountant
(``flwr.serverapp``'s ``RdpAccountant``, Google's ``dp-accounting`` underneath), at every
point of the dp-fedmf curves in ``results/dp_fedmf/`` and the dp-svd curves in
``results/dp_svd/`` (those present).

Why two environments: Flower's accountant needs ``dp-accounting`` (``flwr[dp]``), which the
project does not install (it would downgrade ``attrs``, which the project's other
dependencies need newer). So the check runs in two steps, joined by one JSON file:

    python benchmarks/dp_accountant_check.py ours                # the project's environment
    python -m venv /tmp/dpv && /tmp/dpv/bin/pip install flwr==1.42.0 dp-accounting
    /tmp/dpv/bin/python benchmarks/dp_accountant_check.py flower  # Flower's accountant
    python benchmarks/dp_accountant_check.py report              # JSON + Markdown + PNG

``ours`` writes every point's plan (noise multiplier z, Poisson rate q, noisy sums, users,
delta; dp-svd's rate is 1 and its sums are its iterations + 1) with the epsilon a node charges (``fedrec.secure.distributed_noise.composed_epsilon``:
Opacus's subsampled-Gaussian RDP plus the discrete correction) and Opacus's RDP alone.
``flower`` adds Flower's epsilon for the same releases (add-or-remove-one neighbours,
Poisson sampling; Flower's event takes the rate as sample size over population, so the rate
is rounded to a whole expected sample, and ``ours`` accounts that same rate). ``report``
writes ``results/dp_accounting/flower_check.{json,md,png}`` with the verdict.

The rule (chosen here): the accountants agree at a point when their epsilons differ by at
most 1% of ours. Both compute the same Renyi bound of the subsampled Gaussian (Mironov,
Talwar & Zhang 2019) and convert it at delta, but over different sets of orders (Opacus's
1.1-10.9 and 12-63; dp-accounting's own list), so small differences are expected; 1% is far
below what a 10% change of z does (the control, computed beside every point).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "results" / "dp_accounting" / "flower_check.json"
PLANS = OUT.with_name("plans.json")
#: (protocol, dataset, curve file) of every curve checked (those that exist).
CURVES = (("dp-fedmf", "ml-100k", REPO / "results" / "dp_fedmf" / "curve.json"),
          ("dp-fedmf", "ml-1m", REPO / "results" / "dp_fedmf" / "curve-ml-1m.json"),
          *(("dp-svd", d, REPO / "results" / "dp_svd" / f"curve-{d}.json")
            for d in ("ml-1m", "gowalla", "yelp2018")))
#: Largest relative difference of the two epsilons that counts as agreement.
TOLERANCE = 0.01
#: The control: the same point with z this much larger must NOT agree.
CONTROL_FACTOR = 1.1


def ours() -> None:
    """The plans and the project's epsilons (the project's environment)."""
    sys.path.insert(0, str(REPO))
    from fedrec.secure.distributed_noise import (
        composed_epsilon,
        gaussian_epsilon,
        multiplier_plan,
    )

    points = []
    for protocol, dataset, path in CURVES:
        if not path.exists():
            continue
        curve = json.loads(path.read_text())
        users, delta = curve["users"], curve["config"]["delta"]
        for row in curve["curve"]:
            chosen = row["chosen"]
            rounds = (curve["config"]["rounds"] if protocol == "dp-fedmf"
                      else int(chosen["iterations"]) + 1)
            sample = max(1, round(chosen.get("rate", 1.0) * users))
            rate = sample / users
            for label, z in (("point", row["z"]), ("control", row["z"] * CONTROL_FACTOR)):
                plan = [(multiplier_plan(z, rate, users), rounds)]
                points.append({"protocol": protocol, "dataset": dataset,
                               "target": row["epsilon"], "kind": label,
                               "z": z, "rate": rate, "sample": sample, "users": users,
                               "rounds": rounds, "delta": delta,
                               "charged": composed_epsilon(plan, delta),
                               "opacus": gaussian_epsilon(plan, delta),
                               "opacus_fractional": _opacus_default_orders(z, rate, rounds,
                                                                           delta)})
    PLANS.parent.mkdir(parents=True, exist_ok=True)
    PLANS.write_text(json.dumps({"points": points}, indent=1) + "\n")
    print(f"wrote {PLANS} ({len(points)} points)")


def flower() -> None:
    """Flower's epsilon for each plan (an environment with ``flwr[dp]``)."""
    import flwr
    from flwr.supercore.privacy_accounting import (
        GaussianPrivacyEvent,
        NeighboringRelation,
        PrivacyConfig,
        SamplingMethod,
    )
    from flwr.supercore.privacy_accounting.rdp_accountant import RdpAccountant

    data = json.loads(PLANS.read_text())
    for p in data["points"]:
        acc = RdpAccountant(PrivacyConfig(p["delta"], p["users"],
                                          NeighboringRelation.ADD_OR_REMOVE_ONE,
                                          SamplingMethod.POISSON))
        acc.compose(GaussianPrivacyEvent(p["z"], p["sample"], p["users"]), p["rounds"])
        p["flower"] = acc.get_epsilon(p["delta"])
    data["flower_version"] = flwr.__version__
    from importlib.metadata import version

    data["dp_accounting_version"] = version("dp-accounting")
    PLANS.write_text(json.dumps(data, indent=1) + "\n")
    print(f"added Flower's epsilon to {PLANS}")


def _opacus_default_orders(z: float, rate: float, rounds: int, delta: float) -> float:
    """Opacus's RDP accountant at its own default orders, fractional ones included (the
    node charges at integer orders only, which the discrete sum's subsampling correction
    needs): the explanation checked when the charged epsilon and Flower's differ."""
    from opacus.accountants import RDPAccountant

    acc = RDPAccountant()
    acc.history = [(z, rate, rounds)]
    return float(acc.get_epsilon(delta=delta))


def _point(p: dict[str, Any]) -> tuple:
    """A curve point's identity (its control shares it)."""
    return p.get("protocol", "dp-fedmf"), p["dataset"], p["target"]


def verdict(points: list[dict[str, Any]]) -> dict[str, Any]:
    """Agreement at every point, and the control (z x 1.1) off at every point."""
    def off(p: dict[str, Any]) -> float:
        return abs(p["flower"] - p["charged"]) / p["charged"]

    real = [p for p in points if p["kind"] == "point"]
    ctl = {_point(p): p for p in points if p["kind"] == "control"}
    worst = max(off(p) for p in real)
    control_off = [abs(ctl[_point(p)]["charged"] - p["flower"]) / p["flower"] for p in real]
    fractional = [abs(p["flower"] - p["opacus_fractional"]) / p["flower"] for p in real
                  if "opacus_fractional" in p]
    return {"agree": worst <= TOLERANCE, "worst_relative": worst,
            "control_separates": min(control_off) > TOLERANCE,
            "control_min_relative": min(control_off),
            # where they differ: the charged epsilon the larger (the node over-charges)?
            "disagreements_conservative": all(p["charged"] >= p["flower"] for p in real
                                              if off(p) > TOLERANCE),
            # and Opacus at the same kind of orders as Flower's agreeing with it?
            "fractional_worst_relative": max(fractional) if fractional else None,
            "fractional_agree": bool(fractional) and max(fractional) <= TOLERANCE}


def report() -> None:
    sys.path.insert(0, str(REPO))
    from benchmarks._report import machine_info, write_report

    data = json.loads(PLANS.read_text())
    if not all("flower" in p for p in data["points"]):
        raise SystemExit(f"{PLANS} has no Flower epsilons yet: run the 'flower' step")
    result = {**data, "tolerance": TOLERANCE, "control_factor": CONTROL_FACTOR,
              "verdict": verdict(data["points"]), "machine": machine_info(),
              "command": "\n".join(line.strip() for line in
                                    __doc__.split("\n\n")[2].strip().splitlines())}
    write_report(OUT, result, markdown(result))
    plot(result, OUT.with_suffix(".png"))


def markdown(result: dict[str, Any]) -> str:
    v = result["verdict"]
    out = ["# The user-level DP protocols' charged epsilon against Flower's RdpAccountant",
           "",
           "Every point of the dp-fedmf curves (`results/dp_fedmf/curve.md`, "
           "`results/dp_fedmf/curve-ml-1m.md`) and the dp-svd curves "
           "(`results/dp_svd/curve-<dataset>.md`): the epsilon a node charges (Opacus RDP + "
           "the discrete correction), Opacus's RDP alone, and Flower's `RdpAccountant` "
           f"(flwr {result['flower_version']}, dp-accounting "
           f"{result['dp_accounting_version']}) for the same Poisson-subsampled Gaussian "
           "releases (dp-svd: rate 1, no subsampling), add-or-remove-one neighbours. The "
           "rate is Flower's sample size over the population (rounded to a whole sample).",
           "",
           "| protocol | dataset | target epsilon | noisy sums | z | q | charged | Opacus RDP "
           "| Opacus RDP, its fractional orders | Flower RDP | Flower / charged | control "
           "(z x 1.1) charged |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    ctl = {_point(p): p for p in result["points"] if p["kind"] == "control"}
    for p in result["points"]:
        if p["kind"] != "point":
            continue
        c = ctl[_point(p)]
        out.append(f"| {_point(p)[0]} | {p['dataset']} | {p['target']:g} | {p['rounds']} | "
                   f"{p['z']:.4f} | {p['rate']:.4f} | "
                   f"{p['charged']:.4f} | {p['opacus']:.4f} | "
                   f"{p.get('opacus_fractional', float('nan')):.4f} | {p['flower']:.4f} | "
                   f"{p['flower'] / p['charged']:.4f} | {c['charged']:.4f} |")
    out += ["", "## Verdict (computed)", "",
            f"- Rule: agree when |Flower - charged| <= {result['tolerance']:.0%} of charged "
            "(the accountants sum the same Renyi bound over different orders).",
            f"- Largest difference: {v['worst_relative']:.2%} of the charged epsilon: "
            + ("the accountants agree at every point." if v["agree"]
               else "they do NOT agree at every point."),
            *_disagreement_lines(v, result["tolerance"]),
            f"- Control: z x {result['control_factor']:g} moves the charged epsilon "
            f"{v['control_min_relative']:.1%} or more from Flower's at every point, "
            + ("beyond the tolerance: the rule separates a different noise."
               if v["control_separates"] else "NOT beyond the tolerance: the rule cannot "
               "tell a different noise apart."), "",
            "- dp-accounting left out some fractional orders below 1.9 where its series "
            "did not converge (it logs each); the epsilons above come from the orders it "
            "kept.", "", "Reproduce:", "", "```bash", result["command"], "```", "",
            "![check](flower_check.png)", ""]
    return "\n".join(out)


def _disagreement_lines(v: dict[str, Any], tolerance: float) -> list[str]:
    """Where the charged epsilon and Flower's differ beyond the rule: which is larger, and
    whether Opacus at fractional orders (Flower's kind) agrees with Flower."""
    if v["agree"]:
        return []
    side = ("the charged epsilon is the larger at every such point: a node over-charges "
            "(conservative)." if v["disagreements_conservative"] else
            "at some such point the charged epsilon is the SMALLER: a node under-charges.")
    frac = v.get("fractional_worst_relative")
    cause = ("" if frac is None else
             f" Opacus's own accountant at its default orders, fractional ones included, is "
             f"within {frac:.2%} of Flower's at every point"
             + (f" (within the {tolerance:.0%} rule): the difference is the node's "
                "integer-only orders, which the discrete sum's subsampling correction "
                "needs." if v["fractional_agree"] else ", NOT within the rule."))
    return [f"- Where they differ: {side}{cause}"]


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.6, 4.2))
    groups = sorted({_point(p)[:2] for p in result["points"]})
    for (protocol, dataset), marker in zip(groups, "osD^vP"):
        pts = [p for p in result["points"]
               if _point(p)[:2] == (protocol, dataset) and p["kind"] == "point"]
        ax.plot([p["charged"] for p in pts], [p["flower"] for p in pts], marker, ls="",
                label=f"{protocol}, {dataset}")
    lim = [0.3, 30]
    ax.plot(lim, lim, color="gray", lw=0.8, label="equal")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("epsilon charged by a node (Opacus RDP + discrete correction)")
    ax.set_ylabel("Flower RdpAccountant epsilon")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("step", choices=("ours", "flower", "report"))
    args = ap.parse_args(argv)
    {"ours": ours, "flower": flower, "report": report}[args.step]()


if __name__ == "__main__":
    main()
