"""Shared helpers of the benchmarks (not tests): temp roots, a queue process
started by hand and always stopped, polling with deadlines, medians.

Every benchmark builds its roots under one temporary directory that
`temp_base()` removes afterwards, and starts queue processes through
`QueueProc`, whose `stop()` runs from a `finally` even when a run fails.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
for _p in (str(REPO), str(REPO / "tests")):
    if _p not in sys.path:
        sys.path.insert(0, _p)

from rq import client  # noqa: E402
from rq.errors import ConnectError  # noqa: E402
from rqtest import make_queue, make_root, write_script  # noqa: E402,F401

# bench/peerlib.py also runs in the peers' virtualenvs (bench/peers.py): one copy of these.
sys.path.insert(0, str(REPO / "bench"))
from peerlib import BenchError, wait_for  # noqa: E402,F401

QUEUE = "bench"
# A trivial queue script: /bin/sh, so no interpreter start per job (PERF.md).
TRIVIAL_SCRIPT = '#!/bin/sh\necho "done ok" >&3\n'

# PERF.md peers: trivial /bin/sh jobs, N = 2000, medians of 3, 2 cores, ext4.
PEERS = (
    ("bare spawn loop in Python (no queue, not durable)", "~1,000", "~2,000"),
    ("task-spooler tsp (in-memory, not durable)", "~320", "~490"),
    ("python-rq SimpleWorker, Redis AOF always", "~90", "~130"),
    ("python-rq forking Worker, Redis AOF always", "~35", "~52"),
    ("nq (serial, no fsync)", "~75", "-"),
)


DEFAULT_TMPDIR = "/var/tmp"
SLOW_MKDIR = 0.0001  # s: a healthy ext4 mkdir here takes 0.02-0.07 ms, a churned one 0.5-0.8;
# 0.14 ms was seen with 17 % of the machine's CPU lost to the inode search (2026-11-29)


def add_common_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--tmpdir", default=os.environ.get("RQ_BENCH_TMPDIR", DEFAULT_TMPDIR),
                    help="parent of the temporary directory (default $RQ_BENCH_TMPDIR or "
                         f"{DEFAULT_TMPDIR}; see README: /tmp can be much slower)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")


@contextlib.contextmanager
def temp_base(parent: str | None = None, keep: bool = False) -> Iterator[Path]:
    """A temporary directory under `parent` (must be a real disk filesystem:
    fsyncs must be real), removed afterwards.  A missing `parent` is made (a fresh
    top-level directory is what bench/README.md asks for)."""
    if parent:
        try:
            os.makedirs(parent, exist_ok=True)
        except OSError as exc:
            raise BenchError(f"--tmpdir {parent}: {exc.strerror or exc}") from None
    base = Path(tempfile.mkdtemp(prefix="rqbench-", dir=parent))
    try:
        yield base
    finally:
        if keep:
            print(f"(kept {base})")
        else:
            shutil.rmtree(base, ignore_errors=True)


def new_root(base: Path, label: str) -> Path:
    """A fresh RQ root under `base` (one per run, so runs do not share state)."""
    sub = base / label
    sub.mkdir()
    return make_root(sub)


def bench_queue(root: Path, *, num_workers: int, script_body: str = TRIVIAL_SCRIPT,
                paused: bool = False) -> Path:
    script = write_script(root / "bench.sh", script_body)
    qdir = make_queue(root, QUEUE, script, num_workers=num_workers)
    if paused:
        (root / "config" / f"{QUEUE}.pause").touch()
    return qdir


class QueueProc:
    """`python -m rq.queue --root ROOT --name NAME`, in its own session."""

    def __init__(self, root: Path, name: str = QUEUE, *, wait: bool = True,
                 ready_timeout: float = 60.0, src: str | None = None) -> None:
        """`src`: the checkout whose rq runs (default: this one)."""
        self.root, self.name = root, name
        env = dict(os.environ)
        env["PYTHONPATH"] = (src or str(REPO)) + (os.pathsep + env["PYTHONPATH"]
                                         if env.get("PYTHONPATH") else "")
        self.log_path = root / "log" / f"{name}.stderr"
        self.log = open(self.log_path, "ab")
        self.spawned = time.monotonic()
        self.popen = subprocess.Popen(
            [sys.executable, "-m", "rq.queue", "--root", str(root), "--name", name],
            cwd=str(root), env=env, stdin=subprocess.DEVNULL, stdout=self.log,
            stderr=self.log, start_new_session=True)
        if wait:
            try:
                wait_for(self.ping, ready_timeout, f"queue {name} to answer ping")
            except BaseException:
                self.stop()
                raise

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> None:
        if self.popen.poll() is not None:
            raise BenchError(f"queue process exited with {self.popen.returncode}; "
                             f"see {self.log_path}:\n{self.tail()}")

    def tail(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-2000:]
        except OSError:
            return ""

    def try_call(self, cmd: str, arg: Any = None) -> Any:
        """The reply, or None while nothing answers (the process must live)."""
        self.alive()
        try:
            return self.call(cmd, arg)
        except ConnectError:
            return None

    def ping(self) -> bool:
        return self.try_call("ping") == ["pong"]

    def call(self, cmd: str, arg: Any = None) -> Any:
        return client.call_queue(str(self.root), self.name, cmd, arg)

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM (graceful), then SIGKILL of its group after `timeout`."""
        try:
            if self.popen.poll() is None:
                self.popen.send_signal(signal.SIGTERM)
                try:
                    self.popen.wait(timeout)
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(self.popen.pid, signal.SIGKILL)
                    self.popen.wait(10)
        finally:
            self.log.close()

    def kill(self) -> None:
        """SIGKILL of its group: a crash."""
        try:
            if self.popen.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait(10)
        finally:
            self.log.close()

    def __enter__(self) -> QueueProc:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def check_ok(reply: Any) -> str:
    if not (isinstance(reply, list) and len(reply) == 2 and reply[0] == "ok"):
        raise BenchError(f"unexpected reply {reply!r}")
    return reply[1]


def percentile(sorted_values: list[float], p: float) -> float:
    """Nearest-rank percentile (`p` in 0-100) of values already sorted."""
    k = max(0, min(len(sorted_values) - 1, int(round(p / 100 * len(sorted_values) + 0.5)) - 1))
    return sorted_values[k]


def median(values: list[float]) -> float:
    return statistics.median(values)


def fmt_runs(values: list[float], fmt: str = "{:.0f}") -> str:
    return "[" + ", ".join(fmt.format(v) for v in values) + "]"


def dumps(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


def machine_line() -> str:
    return (f"python {sys.version.split()[0]}, {os.cpu_count()} cpu(s), "
            f"load avg {', '.join(f'{x:.2f}' for x in os.getloadavg())}")


def disk_probe(parent: Path, count: int = 50) -> str:
    """The cost, right now and under `parent`, of PERF.md's reference operation
    (write + fsync + rename of a small file, here with the fsync of its
    directory too) and of a bare mkdir, so figures taken at a busy moment, or
    on a filesystem whose inode allocation is slow, can be told apart from a
    slow program."""
    with temp_base(str(parent)) as base:
        costs, mkdirs = [], []
        for i in range(count):
            t = time.perf_counter()
            tmp, final = base / f".f{i}.tmp", base / f"f{i}"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT, 0o644)
            try:
                os.write(fd, b"x" * 200)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.rename(tmp, final)
            dfd = os.open(base, os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
            costs.append(time.perf_counter() - t)
        for i in range(count * 4):
            t = time.perf_counter()
            os.mkdir(base / f"d{i}")
            mkdirs.append(time.perf_counter() - t)
    line = (f"disk now under {parent}: write+fsync+rename+fsync(dir) {median(costs) * 1e3:.2f} ms, "
            f"mkdir {median(mkdirs) * 1e3:.3f} ms (medians; PERF.md: write+fsync+rename "
            "~0.4-0.6 ms)")
    if median(mkdirs) > SLOW_MKDIR:
        line += ("\n  WARNING: inode allocation is slow under this directory (ext4 skipping "
                 "recently deleted inodes after mass deletions); figures will be low. "
                 "Wait, or pass --tmpdir on a directory that has not been churned")
    return line
