"""dp-fedmf end to end on tiny synthetic data (in-process grid, one user per node): it runs,
the server's view of every node is masked, the reported epsilon is the accountant's and
what each node charged, and a node whose budget the run would pass refuses it."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from fedrec.secure.distributed_noise import RDP_ORDERS, composed_epsilon
from fedrec.transport.messenger import NodeError
from strategies.dp_fedmf import calibrate, plan_of
from tests.simutil import run_in_process

USERS = 6
RUN = {"protocol": "dp-fedmf", "dataset": "synthetic", "synthetic-users": USERS,
       "synthetic-items": 40, "synthetic-density": 0.2, "partition": "user", "rounds": 3,
       "dpmf-epsilon": 8.0, "dpmf-rate": 0.5, "dpmf-dim": 4, "seed": 2,
       "run-name": "test-dp-fedmf"}


@pytest.fixture(scope="module")
def ledger_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("dpfedmf")


@pytest.fixture(scope="module")
def record(ledger_dir: Path) -> dict:
    return run_in_process(RUN, num_nodes=USERS,
                          node_policy={"dp-budget": 10.0,
                                       "dp-ledger": str(ledger_dir / "ledger.json")})


def test_it_runs_end_to_end(record: dict) -> None:
    metrics = record["metrics"]
    assert 0.0 <= metrics["ndcg@20"] <= 1.0 and math.isfinite(metrics["ndcg@20"])
    assert len(record["history"]) == RUN["rounds"]
    assert all(set(row) == {"round"} for row in record["history"])


def test_the_server_sees_every_reply_masked(record: dict) -> None:
    sums = record["privacy"]["sums"]
    train = [s for s in sums if s["phase"] == "train"]
    assert len(train) == RUN["rounds"]
    assert {s["form"] for s in sums} == {"masked"}
    assert all(s["nodes"] == USERS for s in train)


def test_the_reported_epsilon_is_the_accountants(record: dict, ledger_dir: Path) -> None:
    from opacus.accountants import RDPAccountant

    dp = record["privacy"]["dp"]
    z, q, rounds = dp["noise-multiplier"], dp["sample-rate"], dp["rounds"]
    assert z == pytest.approx(calibrate(RUN["dpmf-epsilon"] * (1 - 1e-9), 1e-5, q, rounds,
                                        USERS))
    acc = RDPAccountant()
    acc.history = [(z, q, rounds)]
    opacus = acc.get_epsilon(delta=dp["delta"], alphas=list(RDP_ORDERS))
    assert dp["epsilon"] == pytest.approx(opacus, rel=1e-9)
    assert dp["epsilon"] == pytest.approx(
        composed_epsilon([(plan_of(z, q, USERS), rounds)], dp["delta"]), rel=1e-12)
    assert dp["epsilon"] <= RUN["dpmf-epsilon"]
    assert dp["epsilon-discrete-bound"] >= dp["epsilon"]
    # every node charged its ledger, round by round, the run's epsilon in total
    entries = json.loads((ledger_dir / "ledger.json").read_text())["entries"].values()
    charged = [sum(float(r["epsilon"]) for r in e["releases"]) for e in entries]
    assert len(charged) == USERS
    assert charged == pytest.approx([dp["epsilon"]] * USERS, rel=1e-9)
    assert all(len(e["releases"]) == rounds for e in entries)


def test_a_run_past_a_nodes_budget_is_refused_by_the_node(
        server_skips_policy_check: None, tmp_path: Path) -> None:
    with pytest.raises(NodeError) as err:
        run_in_process({**RUN, "run-name": "test-dp-fedmf-refused"}, num_nodes=USERS,
                       node_policy={"dp-budget": 2.0,
                                    "dp-ledger": str(tmp_path / "ledger.json")})
    text = str(err.value)
    assert "refuses the run's noisy sums" in text and "dp-budget=2" in text
    assert "partition" in text and "Traceback" not in text and "\n" not in text.strip()
    assert not (tmp_path / "ledger.json").exists() or not json.loads(
        (tmp_path / "ledger.json").read_text())["entries"]


def test_the_server_names_the_budget_a_run_needs() -> None:
    from strategies.policy_needs import PolicyRefusal

    with pytest.raises(PolicyRefusal, match="dp-budget"):
        run_in_process({**RUN, "run-name": "test-dp-fedmf-server"}, num_nodes=USERS,
                       node_policy={"dp-budget": 2.0})


def test_the_curve_verdicts_claim_nothing_a_seed_contradicts() -> None:
    """benchmarks/dp_fedmf.py's verdicts: "beats popularity from epsilon e" only when every
    seed is above it at e and every larger epsilon; one seed below (a tie within the seeds'
    spread) at the largest epsilon leaves no claim, and a curve below everywhere says so."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from benchmarks.dp_fedmf import verdicts

    def result(points: dict[float, list[float]]) -> dict:
        return {"popularity": 0.20, "random": [0.01, 0.02],
                "nonprivate": {"ndcg@20": [0.30, 0.31, 0.32]},
                "curve": [{"epsilon": e, "ndcg@20": v} for e, v in sorted(points.items())]}

    clear = verdicts(result({1: [0.10, 0.12, 0.11], 5: [0.25, 0.26, 0.27],
                             10: [0.28, 0.29, 0.30]}))
    assert any("item popularity (0.2000) at every epsilon >= 5" in line for line in clear)
    tie = verdicts(result({1: [0.10, 0.12, 0.11], 5: [0.25, 0.26, 0.27],
                           10: [0.19, 0.29, 0.30]}))
    assert any("item popularity (0.2000) at no epsilon" in line for line in tie), tie
    low = verdicts(result({1: [0.10, 0.12, 0.11], 5: [0.15, 0.16, 0.17]}))
    assert any("below item popularity at epsilon 1, 5" in line for line in low), low


def test_the_dp_popularity_verdict_needs_every_seed_above_every_baseline_seed() -> None:
    """Against DP popularity at the same epsilon: "beats" only where the curve's lowest seed
    is above the baseline's highest; overlapping seeds (a tie) claim nothing."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from benchmarks.dp_fedmf import verdicts

    curve = [{"epsilon": 1, "ndcg@20": [0.10, 0.11, 0.12], "dp-popularity": [0.15, 0.16, 0.17]},
             {"epsilon": 5, "ndcg@20": [0.20, 0.21, 0.22], "dp-popularity": [0.18, 0.21, 0.19]},
             {"epsilon": 10, "ndcg@20": [0.25, 0.26, 0.27], "dp-popularity": [0.19, 0.2, 0.2]}]
    lines = verdicts({"popularity": 0.21, "random": [0.01], "curve": curve,
                      "nonprivate": {"ndcg@20": [0.3, 0.3, 0.3]}})
    line = next(x for x in lines if x.startswith("dp-fedmf beats DP popularity"))
    assert "at epsilon 10; below it at 1." in line, line
