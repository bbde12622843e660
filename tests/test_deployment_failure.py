"""A deployed SuperNode killed mid-run: the run fails, naming the node, within the timeout.

Its own small deployment (a real SuperLink and three SuperNodes, TLS on), so that another test
worker overlaps its wait for the server's timeout with the protocol matrix of
``tests/test_deployment.py``.
"""

from __future__ import annotations

import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from deploy.local_deployment import DeploymentError, LocalDeployment  # noqa: E402
from tests.test_deployment import NODE_POLICY, NUM_NODES, _config  # noqa: E402

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None,
                                reason="openssl not found (needed to make TLS certificates)")


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalDeployment]:
    with LocalDeployment(NUM_NODES, workdir=tmp_path_factory.mktemp("deploy-kill"),
                         node_config=NODE_POLICY) as dep:
        yield dep


def _count(path: Path, needle: str) -> int:
    return path.read_text(errors="replace").count(needle) if path.is_file() else 0


def _wait_for_new(path: Path, needle: str, seen: int, timeout: float) -> None:
    """Until ``needle`` occurs in ``path`` more often than the ``seen`` times before."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _count(path, needle) > seen:
            return
        time.sleep(0.5)
    raise AssertionError(f"no new {needle!r} in {path} within {timeout} s")


#: Server-side reply and startup timeout for the killed-node run (the node dies during the
#: handshake, which waits `startup-timeout`): long enough for the two healthy nodes' first
#: message (FAB download and unpacking, first imports: 10-20 s on a loaded 2-core machine,
#: where 15 s failed the handshake), short enough to keep the test quick.
KILL_TIMEOUT_S = 45.0


@pytest.mark.timeout(200)
def test_killed_supernode_fails_the_run_naming_it(deployment: LocalDeployment) -> None:
    """A one-round FedMF run; SuperNode 2 is killed once it has answered the handshake."""
    cfg = _config("fedmf", {"rounds": 1, "mf-dim": 4, "timeout": KILL_TIMEOUT_S,
                               "startup-timeout": KILL_TIMEOUT_S}, "killed-node")
    dep = deployment
    seen = _count(dep.nodes[2].log_path, "query.hello")
    run_id = dep.submit(cfg)
    _wait_for_new(dep.nodes[2].log_path, "query.hello", seen, 90)
    dep.kill_node(2)
    killed = time.monotonic()
    with pytest.raises(DeploymentError) as err:
        dep.wait(run_id, timeout=KILL_TIMEOUT_S + 60, results_path=dep.results_path(cfg))
    failed_after = time.monotonic() - killed
    text = str(err.value)
    assert "finished:failed" in text
    # The node is named by its label: "node <id> (partition 2)" once the handshake has
    # finished, "node <id>" if it died during the handshake itself.
    assert f"1 of {NUM_NODES} node(s) did not answer" in text
    assert failed_after < KILL_TIMEOUT_S + 30
