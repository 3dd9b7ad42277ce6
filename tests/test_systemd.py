"""rq-mgr under systemd (issue 16 item 7): the unit `rq-install --systemd` prints passes
`systemd-analyze verify`, and `rq-mgr run` with $NOTIFY_SOCKET pointing at a datagram socket
of the test (as systemd's Type=notify gives it) sends READY=1 once every child is up and
STOPPING=1 when its graceful stop (S2.5) begins; its children never see the socket."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from rqtest import REPO, free_port, make_queue, make_root, write_script

from rq.client import call_mgr

DONE_SH = "#!/bin/sh\necho \"done ok\" >&3\n"


def install(*args: str) -> subprocess.CompletedProcess[str]:
    res = subprocess.run([str(REPO / "bin" / "rq-install"), *args], capture_output=True,
                         text=True, timeout=60)
    assert "Traceback" not in res.stderr, res.stderr
    return res


@pytest.fixture
def root(tmp_path: Path) -> Path:
    root = make_root(tmp_path, port=free_port())
    make_queue(root, "test", write_script(tmp_path / "done.sh", DONE_SH))
    return root


# ---------------------------------------------------------------- the unit


def test_the_shipped_unit_is_the_packaged_one() -> None:
    shipped = REPO / "config" / "rq-mgr.service"
    assert shipped.read_text() == (REPO / "rq" / "mgr" / "rq-mgr.service").read_text()


def test_the_unit_for_a_root_passes_systemd_analyze_verify(root: Path, tmp_path: Path) -> None:
    res = install("--root", str(root), "--systemd")
    assert res.returncode == 0 and res.stderr == "", res.stderr
    unit = res.stdout
    for line in ("Type=notify", "NotifyAccess=main", "ExecReload=/bin/kill -HUP $MAINPID",
                 "Restart=on-failure", "KillMode=mixed", "TimeoutStopSec=90",
                 "NoNewPrivileges=yes", "ProtectSystem=full",
                 f"ExecStart={REPO / '.venv' / 'bin' / 'rq-mgr'} --root {root} run"):
        assert f"\n{line}\n" in unit, line
    assert not (root / "queue" / "relay").exists()  # --systemd installs nothing
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is missing: apt-get install systemd")
    path = tmp_path / "rq-mgr.service"
    path.write_text(unit)
    check = subprocess.run(["systemd-analyze", "verify", str(path)], capture_output=True,
                           text=True, timeout=120)
    problems = [line for line in check.stderr.splitlines() if "rq-mgr.service" in line]
    assert check.returncode == 0 and problems == [], check.stderr


def test_systemd_refuses_a_root_it_cannot_name(tmp_path: Path) -> None:
    res = install("--root", str(tmp_path / "a b"), "--systemd")
    assert (res.returncode, res.stdout) == (1, "")
    assert res.stderr == f"rq-install: cannot write a systemd unit for the path {tmp_path}/a b\n"


# ---------------------------------------------------------------- sd_notify


@pytest.fixture(params=["path", "abstract"])
def notify_socket(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[
        tuple[socket.socket, str]]:
    """A datagram socket standing in for systemd's, and the NOTIFY_SOCKET naming it."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    if request.param == "path":
        sock.bind(str(tmp_path / "notify"))
        name = str(tmp_path / "notify")
    else:
        sock.bind(f"\0rq-test-notify-{os.getpid()}-{time.monotonic_ns()}")
        name = "@" + sock.getsockname()[1:].decode()
    try:
        yield sock, name
    finally:
        sock.close()


def receive(sock: socket.socket, timeout: float) -> str:
    sock.settimeout(timeout)
    return sock.recv(4096).decode()


def test_rq_mgr_run_notifies_ready_and_stopping(root: Path,
                                                 notify_socket: tuple[socket.socket, str]) -> None:
    sock, name = notify_socket
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["NOTIFY_SOCKET"] = name
    proc = subprocess.Popen([str(REPO / "bin" / "rq-mgr"), "--root", str(root), "run"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)
    try:
        ready = receive(sock, 60)
        assert ready.split("\n")[0] == "READY=1", ready
        status = call_mgr(str(root), "status")[1]  # every child was up when READY=1 came
        children = [status["web"], status["scandir"], status["timers"], status["queues"]["test"]]
        assert [c["state"] for c in children] == ["RUNNING"] * 4
        queue_pid = status["queues"]["test"]["pid"]
        with open(f"/proc/{queue_pid}/environ", "rb") as f:
            assert b"NOTIFY_SOCKET=" not in f.read()  # the socket is the manager's alone
        proc.send_signal(signal.SIGTERM)
        assert receive(sock, 30) == "STOPPING=1"
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        assert proc.stderr is not None
        proc.stderr.close()


def test_without_notify_socket_nothing_is_sent(root: Path) -> None:
    from rq.mgr.daemon import systemd_notifier

    notify = systemd_notifier({})
    notify("READY=1")  # a no-op: no socket, no error
