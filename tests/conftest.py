"""Shared test setup: private cache and results folders, and the shared real-data folder."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"


@pytest.fixture(scope="session", autouse=True)
def _isolated_dirs(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Keep test runs from writing into the user's cache or the repo's results/."""
    os.environ.setdefault("FEDREC_CACHE", str(tmp_path_factory.mktemp("cache")))
    os.environ["FEDREC_RESULTS"] = str(tmp_path_factory.mktemp("results"))
    os.environ["FEDREC_DP_LEDGER"] = str(tmp_path_factory.mktemp("dp") / "session.json")


@pytest.fixture(autouse=True)
def _own_dp_ledger(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """One DP ledger file per test (``clients/dp_ledger.py``): nodes keep their spending
    across runs, so tests that rerun a DP protocol on the same simulated nodes and data would
    otherwise spend each other's budgets. A test's own runs share its file."""
    name = hashlib.sha256(request.node.nodeid.encode()).hexdigest()[:20]
    folder = Path(os.environ["FEDREC_DP_LEDGER"]).parent
    monkeypatch.setenv("FEDREC_DP_LEDGER", str(folder / f"{name}.json"))


@pytest.fixture
def shared_data() -> Path:
    """``../shared/data`` beside the repo; skips the test when it is absent."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"real data not found at {SHARED_DATA}")
    return SHARED_DATA


#: Files started first, in this order: with ``--dist loadfile --no-loadscope-reorder``
#: (pyproject.toml) xdist hands the first file to worker 0 and the second to worker 1. The
#: deployment matrix is the longest file (the suite's wall time is at least its time), and
#: the killed-node file mostly waits, so it overlaps the matrix on the other worker.
LONGEST_FIRST = ("test_deployment.py", "test_deployment_failure.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


@pytest.fixture
def server_skips_policy_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """A server that does not check the nodes' reported policies at the handshake
    (``strategies/policy_needs.py``) and asks for the weaker mode anyway, as a deviating
    server may: the tests using it show that each node still refuses by itself."""
    import strategies.base

    monkeypatch.setattr(strategies.base, "check_node_policies", lambda *a, **k: None)
