"""Shared test setup: private cache and results folders, and the shared real-data folder."""

from __future__ import annotations

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


@pytest.fixture
def shared_data() -> Path:
    """``../shared/data`` beside the repo; skips the test when it is absent."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"real data not found at {SHARED_DATA}")
    return SHARED_DATA
