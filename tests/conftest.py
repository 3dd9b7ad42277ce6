"""pytest fixtures shared by every test module: see tests/rqtest.py."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from rqtest import QueueProc, make_root, write_driver  # noqa: E402

Launch = Callable[..., QueueProc]


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


@pytest.fixture
def procs() -> Iterator[list[QueueProc]]:
    """Queue processes a test starts; stopped gracefully (S2.5) afterwards, so no job of
    theirs outlives the test."""
    started: list[QueueProc] = []
    yield started
    for qp in started:
        qp.stop(20)


@pytest.fixture
def launch(root: Path) -> Iterator[Launch]:
    """Start queue processes of `root`; stopped gracefully (jobs included) afterwards."""
    started: list[QueueProc] = []

    def _launch(name: str, env: dict[str, str] | None = None) -> QueueProc:
        q = QueueProc(root, name, env)
        started.append(q)
        return q
    yield _launch
    for q in started:
        q.stop(20)


@pytest.fixture
def driver(tmp_path: Path) -> Path:
    return write_driver(tmp_path / "driver.py")


@pytest.fixture(scope="module")
def mgr_root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A real rq-mgr (queue `test`, allow_new_queue on) shared by a module's tests."""
    from webtest import Mgr, build_root
    root = build_root(tmp_path_factory.mktemp("web"))
    mgr = Mgr(root)
    yield root
    mgr.stop()


@pytest.fixture
def app(mgr_root: Path):  # noqa: ANN201 - a flask.Flask
    from rq.web import create_app
    return create_app(str(mgr_root))


@pytest.fixture
def client(app):  # noqa: ANN001, ANN201
    return app.test_client()
