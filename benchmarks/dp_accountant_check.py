"""dp-fedmf's charged epsilon against Flower's own accountant (``flwr.serverapp``'s
``RdpAccountant``, Google's ``dp-accounting`` underneath), at every point of the dp-fedmf
curves in ``results/dp_fedmf/``.

Why two environments: Flower's accountant needs ``dp-accounting`` (``flwr[dp]``), which the
project does not install (it would downgrade ``attrs``, which the project's other
dependencies need newer). So the check runs in two steps, joined by one JSON file:

    python benchmarks/dp_accountant_check.py ours                # the project's environment
    python -m venv /tmp/dpv && /tmp/dpv/bin/pip install flwr==1.42.0 dp-accounting
    /tmp/dpv/bin/python benchmarks/dp_accountant_check.py flower  # Flower's accountant
    python benchmarks/dp_accountant_check.py report              # JSON + Markdown + PNG

``ours`` writes every point's plan (noise multiplier z, Poisson rate q, rounds, users,
delta) with the epsilon a node charges (``fedrec.secure.distributed_noise.composed_epsilon``:
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
CURVES = (("ml-100k", REPO / "results" / "dp_fedmf" / "curve.json"),
          ("ml-1m", REPO / "results" / "dp_fedmf" / "curve-ml-1m.json"))
#: Largest relative difference of the two epsilons that counts as agreement.
TOLERANCE = 0.01
#: The control: the same point with z this much larger must NOT agree.
CONTROL_FACTOR = 1.1


def ours() -> None:
    """The plans and the project's epsilons (the project's environment)."""
    sys.path.insert(0, str(REPO))
    from fedrec.secure.distributed_noise import composed_epsilon, gaussian_epsilon
    from strategies.dp_fedmf import plan_of

    points = []
    for dataset, path in CURVES:
        curve = json.loads(path.read_text())
        users, rounds, delta = curve["users"], curve["config"]["rounds"], curve["config"]["delta"]
        for row in curve["curve"]:
            sample = max(1, round(row["chosen"]["rate"] * users))
            rate = sample / users
            for label, z in (("point", row["z"]), ("control", row["z"] * CONTROL_FACTOR)):
                plan = [(plan_of(z, rate, users), rounds)]
                points.append({"dataset": dataset, "target": row["epsilon"], "kind": label,
                               "z": z, "rate": rate, "sample": sample, "users": users,
                               "rounds": rounds, "delta": delta,
                               "charged": composed_epsilon(plan, delta),
                               "opacus": gaussian_epsilon(plan, delta)})
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


def verdict(points: list[dict[str, Any]]) -> dict[str, Any]:
    """Agreement at every point, and the control (z x 1.1) off at every point."""
    def off(p: dict[str, Any]) -> float:
        return abs(p["flower"] - p["charged"]) / p["charged"]

    real = [p for p in points if p["kind"] == "point"]
    ctl = {(p["dataset"], p["target"]): p for p in points if p["kind"] == "control"}
    worst = max(off(p) for p in real)
    control_off = [abs(ctl[(p["dataset"], p["target"])]["charged"] - p["flower"])
                   / p["flower"] for p in real]
    return {"agree": worst <= TOLERANCE, "worst_relative": worst,
            "control_separates": min(control_off) > TOLERANCE,
            "control_min_relative": min(control_off)}


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
    out = ["# dp-fedmf's charged epsilon against Flower's RdpAccountant", "",
           "Every point of the dp-fedmf curves (`results/dp_fedmf/curve.md`, "
           "`results/dp_fedmf/curve-ml-1m.md`): the epsilon a node charges (Opacus RDP + "
           "the discrete correction), Opacus's RDP alone, and Flower's `RdpAccountant` "
           f"(flwr {result['flower_version']}, dp-accounting "
           f"{result['dp_accounting_version']}) for the same {result['points'][0]['rounds']} "
           "Poisson-subsampled Gaussian releases, add-or-remove-one neighbours. The rate is "
           "Flower's sample size over the population (rounded to a whole sample).", "",
           "| dataset | target epsilon | z | q | charged | Opacus RDP | Flower RDP | "
           "Flower / charged | control (z x 1.1) charged |",
           "|---|---|---|---|---|---|---|---|---|"]
    ctl = {(p["dataset"], p["target"]): p for p in result["points"] if p["kind"] == "control"}
    for p in result["points"]:
        if p["kind"] != "point":
            continue
        c = ctl[(p["dataset"], p["target"])]
        out.append(f"| {p['dataset']} | {p['target']:g} | {p['z']:.4f} | {p['rate']:.4f} | "
                   f"{p['charged']:.4f} | {p['opacus']:.4f} | {p['flower']:.4f} | "
                   f"{p['flower'] / p['charged']:.4f} | {c['charged']:.4f} |")
    out += ["", "## Verdict (computed)", "",
            f"- Rule: agree when |Flower - charged| <= {result['tolerance']:.0%} of charged "
            "(the accountants sum the same Renyi bound over different orders).",
            f"- Largest difference: {v['worst_relative']:.2%} of the charged epsilon: "
            + ("the accountants agree at every point." if v["agree"]
               else "they do NOT agree at every point."),
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


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.6, 4.2))
    for dataset, marker in (("ml-100k", "o"), ("ml-1m", "s")):
        pts = [p for p in result["points"] if p["dataset"] == dataset and p["kind"] == "point"]
        ax.plot([p["charged"] for p in pts], [p["flower"] for p in pts], marker, ls="",
                label=f"{dataset}")
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
