"""Deployment, second half of the matrix: LP-GCN and federated SVD on a SuperLink and
SuperNodes of their own (TLS on), each run equal to the same run in one process. The lines,
node policy and checks are those of tests/test_deployment.py; see its docstring."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from typing import Any

import pytest

from tests.test_deployment import (
    HERE,
    TEST_TIMEOUT_S,
    check_deployed_run,
    lines,
    shared_deployment,
)

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None,
                                reason="openssl not found (needed to make TLS certificates)")


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    yield from shared_deployment(tmp_path_factory)


@pytest.mark.timeout(TEST_TIMEOUT_S)
@pytest.mark.parametrize(("protocol", "extra", "tol"), lines(exclude=HERE))
def test_deployed_run_equals_in_process_run(deployment: Any, protocol: str,
                                            extra: dict[str, Any], tol: float) -> None:
    check_deployed_run(deployment, protocol, extra, tol)
