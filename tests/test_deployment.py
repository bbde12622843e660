"""Deployment: a real SuperLink and real SuperNodes (processes on 127.0.0.1, TLS on).

Every registered protocol runs on tiny data against a local deployment and must give the
metrics of the same run in one process (``tests.simutil.run_in_process``: the same ServerApp
and ClientApp code). A new protocol is tested deployed by adding one line to
:data:`PROTOCOLS` (or, if it needs an item server, :data:`ITEM_SERVER_PROTOCOLS`).

The runs go side by side, three at a time (``LocalDeployment.run_many``), as several
analysts' runs would on one federation: the SuperLink runs a ServerApp per run and each
SuperNode serves the runs' messages one at a time, so a node that would sleep 3 s after an
empty pull finds another run's message instead. Each protocol is still its own test, which
compares its run's record with the in-process run. The protocols with an item server
(FedMVMF, PrivMVMF) run on the deployment of ``tests/test_deployment_failure.py``, which has
one more SuperNode with node config ``role="item-server"`` (a protocol without item servers
refuses a federation with one, so they cannot share this file's SuperNodes), before its
killed-SuperNode test: that file mostly waits for the server's timeout, which another test
worker overlaps with this file's runs.

Slow: flwr 1.42.0 starts a fresh ``flwr-clientapp`` process (~2 CPU-s of Flower imports) for
every message on every SuperNode (docs/deployment.md, section 8), so the matrix is bound by
the CPU those processes take. The configs keep the number of rounds small, and the default
test command deploys one line per deployed mechanism (:data:`DEFAULT_LINES`); the whole
matrix runs with ``FEDREC_FULL_DEPLOYMENT=1``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from deploy.local_deployment import (  # noqa: E402
    DeploymentError,
    LocalDeployment,
    message_round_seconds,
)

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None,
                                reason="openssl not found (needed to make TLS certificates)")

TINY = {"dataset": "synthetic", "synthetic-users": 60, "synthetic-items": 80, "seed": 2}
#: The data every SuperNode's operator describes in its node config: a node offers only its
#: operator's data and refuses a run asking for other, so every line of one deployment runs
#: on it (dense items: every item has a training interaction, which LP-GCN's line wants).
DEPLOYED_DATA = {**TINY, "synthetic-density": 0.3, "synthetic-popularity-skew": 0.0}
#: The nodes' policy opts in to what the tiny runs ask (plain and CKKS sums, sparse transport,
#: seeded Omega, FedSVD's noise removal, dp-prototypes' epsilon); min-survivors stays at its
#: default 3, which the 3 user SuperNodes meet. The deployed SuperNodes get it as
#: --node-config, the reference run as node_policy.
NODE_POLICY = {"allow-plain": True, "allow-sparse-transport": True, "allow-seeded-omega": True,
               "allow-ckks": True, "allow-noise-removal": True, "dp-budget": 1.0}
#: User SuperNodes (partitions 0..2) of each deployment; tests/test_deployment_failure.py
#: adds one item-server SuperNode (partition -1) to its own.
NUM_NODES = 3
#: FedMVMF/PrivMVMF on tiny data: one epoch, explicit ratings; the item server is a real
#: SuperNode (node config ``role="item-server"``), not the simulation's ``item-servers`` key.
_MVMF = {"implicit": False, "rounds": 1, "synthetic-clusters": 4}
#: PriviRec on tiny data: seeded Omega (deterministic), no SecAgg, one power round.
_PRIVIREC = {"aggregator": "plain", "privirec-omega": "seeded", "privirec-filter-rank": 4,
             "privirec-filters": "gf-cf", "privirec-L": 1}

#: Federated SVD on tiny data: no noise, one synchronization, plain sums where allowed.
_FEDSVD = {"aggregator": "plain", "fedsvd-k": 2, "fedsvd-rank": 2, "fedsvd-iterations": 1,
           "fedsvd-sync-every": 1, "fedsvd-sigma": 0.0, "fedsvd-sigma-server": 0.0}

#: One line per registered protocol: (protocol, tiny run config, metric tolerance).
#: Deployed and simulated runs do the same arithmetic on the same rows in the same order
#: (records carry float64 arrays bit for bit), so the metrics agree to rounding noise.
PROTOCOLS: list[tuple[str, dict[str, Any], float]] = [
    ("fedmf", {"rounds": 1, "mf-dim": 4, "aggregator": "plain"}, 1e-9),
    ("privirec", {**_PRIVIREC, "privirec-rank": 8}, 1e-9),
    ("privirec-k", {**_PRIVIREC, "privirec-k": 12}, 1e-9),
    # one step at L=1 (3 rounds; 15 in all with setup, final forward, evaluation and the
    # loss sum); dense items so every item has a training interaction
    ("lpgcn", {"aggregator": "plain", "lpgcn-layers": 1, "lpgcn-dim": 4, "lpgcn-steps": 1},
     1e-9),
    # no noise (deterministic), T = p: one synchronization round (two for the HE step)
    ("fedpower", _FEDSVD, 1e-9),
    ("fedsvd-privacy", _FEDSVD, 1e-9),
    # CKKS decryption differs by ~1e-9 from run to run, and on this tiny binary data items
    # with identical training columns have exactly tied scores, which that noise orders
    # differently (recall@20 0.455 vs 0.438 seen): the line checks rounds and metric keys;
    # tests/test_fedsvd.py checks the subspace itself
    ("fedsvd-utility", {**_FEDSVD, "aggregator": "secagg+"}, 1.0),
    # DP noise is unseeded by design (OpenDP's CSPRNG), so a deployed and a simulated run
    # release different prototypes: the line checks the rounds and metric keys, not values.
    ("dp-prototypes", {"aggregator": "plain", "dpp-k": 3, "dpp-value-max": 1.0,
                       "dpp-sparsity": 10, "dpp-rank": 4}, 1.0),
    # SecAgg+ with distributed noise, unseeded: the line checks the rounds and metric keys;
    # its epsilon within the nodes' dp-budget of 1
    ("dp-fedmf", {"rounds": 1, "dpmf-dim": 4, "dpmf-rate": 0.5, "dpmf-epsilon": 0.9}, 1.0),
    ("dp-svd", {"dpsvd-rank": 2, "dpsvd-items": 12, "dpsvd-iterations": 1,
                "dpsvd-epsilon": 0.9}, 1.0),
]
#: The protocols with an item server, run deployed by tests/test_deployment_failure.py on
#: NUM_NODES user SuperNodes and one SuperNode with node config ``role="item-server"``.
ITEM_SERVER_PROTOCOLS: list[tuple[str, dict[str, Any], float]] = [
    ("fedmvmf", {**_MVMF, "aggregator": "plain"}, 1e-9),
    # CKKS: the deployed and simulated encryptions differ (fresh randomness), ~1e-7 absolute
    ("privmvmf", _MVMF, 1e-5),
]

#: The lines the default test command deploys, one per deployed mechanism: PriviRec's secure
#: sums and power rounds (privirec-k, the main job's family); the node's on-disk DP ledger
#: across runs (dp-prototypes); CKKS with a decrypter and the item-server role (privmvmf, in
#: tests/test_deployment_failure.py, beside a FedMVMF run under SecAgg+ whose first epoch
#: completes before a SuperNode is killed). Every deployed message round costs ~18 CPU-s on
#: this machine (a ClientApp process per node, docs/deployment.md section 8), so the full
#: matrix (45 + 2 x 7 message rounds, ~15 min of 2 cores) runs with
#: ``FEDREC_FULL_DEPLOYMENT=1``. The other lines send what a default line sends: privirec ~
#: privirec-k; fedpower, fedsvd-privacy and fedsvd-utility (8 rounds) plain, SecAgg+ and CKKS
#: sums, the noise removal being the server's arithmetic on them; fedmvmf ~ privmvmf; lpgcn
#: (16 rounds, the longest) relays sealed bytes in ordinary messages. Each runs with the same
#: ServerApp and ClientApp code and Flower messages on the in-process grid in its own test
#: file (lpgcn and the MVMF pair also through Flower's Ray simulation).
DEFAULT_LINES = frozenset({"privirec-k", "dp-prototypes", "privmvmf"})
FULL_DEPLOYMENT = os.environ.get("FEDREC_FULL_DEPLOYMENT", "") == "1"


def deployed_lines(lines: list[tuple[str, dict[str, Any], float]]
                   ) -> list[tuple[str, dict[str, Any], float]]:
    """The lines this test session deploys (all of them with FEDREC_FULL_DEPLOYMENT=1)."""
    return [line for line in lines if FULL_DEPLOYMENT or line[0] in DEFAULT_LINES]


def line_params(lines: list[tuple[str, dict[str, Any], float]]) -> list[Any]:
    """``lines`` as test parameters; those outside this session's deployment skip, saying
    how to run them."""
    skip = pytest.mark.skip(reason="full deployment matrix only: FEDREC_FULL_DEPLOYMENT=1")
    return [pytest.param(*line, id=line[0],
                         marks=() if line in deployed_lines(lines) else (skip,))
            for line in lines]


#: A node's reply timeout (run config ``timeout``) in the matrix's runs: a SuperNode answers
#: the runs' messages one at a time, oldest first, so a request can queue behind the other
#: runs' (each a ClientApp process of ~2 CPU-s, three nodes on two cores); the default 120 s
#: would leave little margin on a loaded machine.
REPLY_TIMEOUT_S = 300.0


def assert_deployed_like_in_process(record: dict[str, Any], sim: dict[str, Any],
                                    num_nodes: int, tol: float) -> None:
    """A deployed run completed over ``num_nodes`` SuperNodes with SuperNode authentication
    and roster identities, in the in-process run's message rounds and metrics (to ``tol``)."""
    assert record["deployment"]["status"] == "finished:completed"
    assert record["deployment"]["supernode_auth"] is True
    assert record["num_nodes"] == num_nodes
    # every node signed its keys with its roster identity, none with a simulated one
    assert set(record["privacy"]["identities"]) == {"roster"}
    assert record["communication"]["total_rounds"] == sim["communication"]["total_rounds"]
    assert set(record["metrics"]) == set(sim["metrics"])
    for key, value in sim["metrics"].items():
        assert record["metrics"][key] == pytest.approx(value, abs=tol, rel=0), key


def _config(protocol: str, extra: Mapping[str, Any], run_name: str) -> dict[str, Any]:
    return {**DEPLOYED_DATA, "protocol": protocol, **extra, "run-name": run_name}


def test_every_registered_protocol_has_a_deployment_line() -> None:
    from fl_app.registry import protocols

    lines = [p for p, _, _ in PROTOCOLS + ITEM_SERVER_PROTOCOLS]
    assert sorted(lines) == sorted(protocols()), (
        "add a line to PROTOCOLS (or ITEM_SERVER_PROTOCOLS) for every protocol in "
        "fl_app/registry.py")


def test_clientapp_import_is_cheap() -> None:
    """Every deployed message imports the ClientApp in a new process: no torch, no scipy.stats."""
    code = ("import sys, time; t = time.perf_counter(); import fl_app.client_app; "
            "print(time.perf_counter() - t); "
            "print(sorted(m for m in ('torch', 'scipy.stats', 'tenseal', 'opacus', "
            "'scipy.sparse.linalg', 'scipy.optimize') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=str(REPO),
                         env={**os.environ, "PYTHONPATH": str(REPO)}).stdout.splitlines()
    print(f"\nimport fl_app.client_app: {float(out[0]):.2f} s (with flwr)")
    assert out[1] == "[]", f"heavy modules imported by fl_app.client_app: {out[1]}"


#: Runs going at once on the shared deployment (``LocalDeployment.run_many``): each
#: ServerApp process must report to the SuperLink within 30 s of its launch, which ten at once
#: missed on the loaded 2-core machine; three keep every node busy (one node serves the runs'
#: messages one at a time) without that.
MAX_CONCURRENT_RUNS = 3
#: The longest lines (message rounds: 16, 8) go first, so the last runs to start are
#: short ones and the three lanes end close together.
LONGEST_FIRST = ("lpgcn", "fedsvd-utility")
#: Budget for the whole matrix: the eight lines here (45 message rounds) took 403 s alone on
#: the idle 2-core machine, both cores busy (824 CPU-s), and ~800 s beside the rest of the
#: suite; the default two have 7. A run not finished by then is stopped and its test fails.
MATRIX_TIMEOUT_S = 1500.0


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalDeployment]:
    """One SuperLink + NUM_NODES SuperNodes (TLS) shared by every run of this file."""
    with LocalDeployment(NUM_NODES, workdir=tmp_path_factory.mktemp("deploy"),
                         node_config=NODE_POLICY, data=DEPLOYED_DATA) as dep:
        yield dep


@pytest.fixture(scope="module")
def deployed_runs(deployment: LocalDeployment
                  ) -> dict[str, dict[str, Any] | DeploymentError]:
    """Every ``PROTOCOLS`` line run deployed, MAX_CONCURRENT_RUNS at a time; protocol -> its
    record or its error."""
    t0 = time.monotonic()
    rank = {protocol: i for i, protocol in enumerate(LONGEST_FIRST)}
    lines = sorted(deployed_lines(PROTOCOLS), key=lambda line: rank.get(line[0], len(rank)))
    runs = deployment.run_many(
        {protocol: _config(protocol, {**extra, "timeout": REPLY_TIMEOUT_S}, f"deployed-{protocol}")
         for protocol, extra, _ in lines}, timeout=MATRIX_TIMEOUT_S,
        max_concurrent=MAX_CONCURRENT_RUNS)
    rounds = sum(r["communication"]["total_rounds"] for r in runs.values()
                 if not isinstance(r, DeploymentError))
    print(f"\n{len(runs)} deployed runs, {MAX_CONCURRENT_RUNS} at a time: "
          f"{time.monotonic() - t0:.1f} s wall for {rounds} message rounds in all")
    return runs


@pytest.mark.timeout(MATRIX_TIMEOUT_S + 180)
@pytest.mark.parametrize(("protocol", "extra", "tol"), line_params(PROTOCOLS))
def test_deployed_run_equals_in_process_run(
        deployed_runs: dict[str, dict[str, Any] | DeploymentError], protocol: str,
        extra: dict[str, Any], tol: float) -> None:
    """The deployed run of ``protocol``: the in-process run's rounds and metrics (to ``tol``)."""
    from tests.simutil import run_in_process

    record = deployed_runs[protocol]
    if isinstance(record, DeploymentError):
        raise record

    assert record["deployment"]["tls"] is True
    assert Path(record["deployment"]["results_path"]).is_file()
    logs = Path(record["deployment"]["log_dir"])
    assert {p.name for p in logs.glob("*.log")} >= {
        "superlink.log", "flwr-cli.log", *(f"supernode-{i}.log" for i in range(NUM_NODES))}

    # The reference: the same ServerApp and ClientApp code in one process (the Ray simulation
    # of each protocol is tested in its own test file; here it would add ~20 s per line)
    sim = run_in_process(_config(protocol, {**extra, "timeout": REPLY_TIMEOUT_S},
                                 f"simulated-{protocol}"),
                         num_nodes=NUM_NODES, node_policy=NODE_POLICY)
    assert_deployed_like_in_process(record, sim, NUM_NODES, tol)

    per_round = message_round_seconds(record)
    print(f"\n{protocol}: finished {record['deployment']['wall_seconds']:.1f} s after the "
          f"submission, {record['communication']['total_rounds']} message rounds; "
          f"{per_round:.2f} s per message round after the handshake, the other runs going "
          f"(a run alone: benchmarks/messaging.py)")
