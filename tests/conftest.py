"""pytest fixtures shared by every test module: see tests/rqtest.py."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from rqtest import QueueProc, make_root  # noqa: E402


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return make_root(tmp_path)


@pytest.fixture
def queues() -> Iterator[list[QueueProc]]:
    """Collects QueueProc objects a test starts and stops them afterwards."""
    started: list[QueueProc] = []
    yield started
    for q in started:
        q.kill()
