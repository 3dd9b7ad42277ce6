"""pytest fixtures shared by every test module (see tests/rqtest.py), and how the test files
are spread over pytest-xdist workers."""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from rqtest import QueueProc, make_root, write_driver  # noqa: E402

Launch = Callable[..., QueueProc]

# A shell without job control starts a background command (`scripts/test &` in a script, a
# nohup from cron) with SIGINT ignored, and an ignored signal stays ignored across exec: every
# `rq watch` the tests start would then ignore the SIGINT that stands for a user's Ctrl-C (as
# it should: that is nohup's contract), and those tests hang until their deadline.  The
# tests' processes get Python's own handler back, so their children start with the default.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# ---------------------------------------------------------------- xdist: one worker per file
# scripts/test runs `-n N --dist loadfile`: every test of a file runs on one worker, so a
# module-scoped fixture (a shared rq-mgr, a browser) starts once.  On top of that, the files
# whose tests run Spark sessions in the worker's own process share one worker (one driver JVM
# serves them all), the files whose Spark JVMs are child processes (the CLI, a standalone
# cluster, the class-data-sharing runs) another, and those that drive Chromium a third (two
# browsers at once on a two-core machine only slow each other down into their timeouts).
# The longest units are handed out first, so that no worker starts one of them while the
# others are about to finish (all the Spark files in one unit would be the run's last minutes
# on one worker, the other workers idle).
SHARED_WORKER = {
    **{name: "spark" for name in (
        "test_analytics_incremental.py", "test_analytics_transform.py")},
    **{name: "spark-cli" for name in (
        "test_analytics_cds.py", "test_analytics_cluster.py", "test_analytics_e2e.py")},
    **{name: "chromium" for name in (
        "test_browser.py", "test_browser_stats.py", "test_web_xss.py")}}
START_FIRST = ("spark", "spark-cli", "chromium", "test_web_security.py", "test_relay_faults.py",
               "test_crash.py", "test_power_loss_fs.py", "test_cli_e2e.py",
               "test_pull_consumers.py", "test_check_rq.py", "test_cron_queue.py",
               "test_faults.py", "test_timers.py")
# Within its unit, a file that goes first: the e2e file's one short `rq analytics` run writes
# the class-data archive of a new .venv (session.cds_options: one claim, written when its JVM
# exits) early, so the cluster test's four JVMs and the later CLI runs map it (the cluster test
# alone: 27 CPU-s with the archive, 37 without).
FIRST_IN_UNIT = ("test_analytics_e2e.py",)


def file_name(nodeid: str) -> str:
    return nodeid.split("::", 1)[0].rsplit("/", 1)[-1]


def worker_group(nodeid: str) -> str:
    """The unit of work a test belongs to: its file's name, or the group sharing a worker."""
    name = file_name(nodeid)
    return SHARED_WORKER.get(name, name)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not hasattr(config, "workerinput"):
        return  # not an xdist worker: collection order

    def rank(item: pytest.Item) -> tuple[int, int]:
        group = worker_group(item.nodeid)
        return (START_FIRST.index(group) if group in START_FIRST else len(START_FIRST),
                0 if file_name(item.nodeid) in FIRST_IN_UNIT else 1)
    items.sort(key=rank)  # stable: a file's tests keep their order


@pytest.hookimpl(optionalhook=True)  # an xdist hook: no error where xdist is not installed
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    """--dist loadfile, with the work units of worker_group (xdist's own loadfile scheduler
    is this one with the file as the unit)."""
    if config.getvalue("dist") != "loadfile":
        return None  # xdist's own choice
    from xdist.scheduler import LoadScopeScheduling

    class FileGroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return worker_group(nodeid)
    config.option.loadscopereorder = False  # keep the order made above
    return FileGroupScheduling(config, log)


@pytest.fixture
def connect() -> Iterator[Callable[[str], Any]]:
    """connect(path): a client socket to the Unix socket at path (10 s timeout), closed
    at the end of the test."""
    import socket
    opened: list[socket.socket] = []

    def connect_to(path: str) -> socket.socket:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        opened.append(s)
        s.settimeout(10)
        s.connect(path)
        return s

    yield connect_to
    for s in opened:
        s.close()


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


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One local Spark session for the in-process analytics tests (the "spark" unit above),
    with a small local run's settings (session.default_conf for a tiny input): the warm-up
    JVM options, the tiny-input settings (interpreted, no adaptive plans) and one shuffle
    partition."""
    from rq.analytics import session
    log = tmp_path_factory.mktemp("spark") / "spark.log"
    conf = {"spark.sql.shuffle.partitions": "1", **session.TINY_CONF,
            "spark.driver.extraJavaOptions": session.WARMUP_OPTIONS}
    # It maps the class-data archive when there is one, but never writes it: a session that
    # lives until the run ends would write it then, and hold the claim (so every other Spark
    # JVM of the run would go without) all along.
    with session.spark_session("local[1]", conf, log_path=str(log), cds_write=False) as s:
        yield s


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    """Headless Chromium shared by a module's browser tests (tests/browser.py)."""
    from browser import TIMEOUT_MS, chromium
    with chromium(TIMEOUT_MS) as b:
        yield b


@pytest.fixture
def page(browser: object) -> Iterator[object]:
    """A fresh page that answers confirm() with OK (data-confirm buttons); the test fails
    if JavaScript raised on it."""
    from browser import TIMEOUT_MS, checked_page
    with checked_page(browser, TIMEOUT_MS, accept_dialogs=True) as pg:
        yield pg


@pytest.fixture
def app(mgr_root: Path):  # noqa: ANN201 - a flask.Flask
    from rq.web import create_app
    return create_app(str(mgr_root))


@pytest.fixture
def client(app):  # noqa: ANN001, ANN201
    return app.test_client()
