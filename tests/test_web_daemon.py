"""The `rq-web` daemon under a real rq-mgr (SPEC S2.1-S2.3, S2.2 step 4, S14.1, S1.5, S21).

Every test talks to a real web server on a free port, started by a real `rq-mgr start`.
The lifecycle tests (kill, listen failure, manager death) get a root of their own; the
HTTP tests share one module-wide root with a queue `slow` whose jobs wait for a file.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psutil
import pytest
import requests
from rqtest import REPO, make_queue, process_gone, short_id, wait_for, write_script
from webtest import Mgr, build_root, rq_mgr

from rq.client import call_mgr, call_queue
from rq.mgr.children import Child, Policy, State

# A job that says it runs, prints a line, then waits for the file named by param1.
SLOW_SCRIPT = """#!/bin/sh
echo "run waiting" >&3
echo "slow job started"
while [ ! -e "$RQ_PARAM1" ]; do sleep 0.05; done
echo "released"
echo "done released" >&3
"""
CLF = re.compile(r' rq-web\[\d+\] INFO 127\.0\.0\.1 - - '
                 r'\[\d\d/[A-Z][a-z]{2}/\d{4}:\d\d:\d\d:\d\d [+-]\d{4}\] '
                 r'"(?P<request>[^"]*)" (?P<status>\d{3}) (?P<size>\d+|-)$')


# ---------------------------------------------------------------- helpers


def port_of(root: Path) -> int:
    return int(json.loads((root / "config" / "config.json").read_text())["port"])


def url(root: Path, path: str) -> str:
    return f"http://127.0.0.1:{port_of(root)}{path}"


def web_child(root: Path) -> dict[str, Any]:
    reply = call_mgr(str(root), "status", timeout=10)
    assert reply[0] == "ok", reply
    return reply[1]["web"]


def web_state(root: Path, state: str) -> dict[str, Any] | None:
    child = web_child(root)
    return child if child is not None and child["state"] == state else None


def get(root: Path, path: str, method: str = "GET",
        headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port_of(root), timeout=10)
    try:
        conn.request(method, path, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def answers(root: Path) -> bool:
    try:
        return get(root, "/q.txt")[0] == 200
    except OSError:
        return False


def raw_connect(root: Path) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port_of(root)), timeout=10)
    return sock


def read_until(sock: socket.socket, marker: bytes, buf: bytes = b"") -> bytes:
    """Read until `marker` is in the bytes read (or the peer closes)."""
    while marker not in buf:
        chunk = sock.recv(65536)
        if not chunk:
            break
        buf += chunk
    return buf


def read_response(sock: socket.socket, buf: bytes = b"") -> tuple[str, bytes]:
    """(status line, body) of one response with a Content-Length."""
    buf = read_until(sock, b"\r\n\r\n", buf)
    head, _, body = buf.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    length = next(int(v) for k, _, v in (line.partition(":") for line in lines[1:])
                  if k.strip().lower() == "content-length")
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk, "connection closed mid-body"
        body += chunk
    return lines[0], body[:length]


def log_lines(root: Path) -> list[str]:
    try:
        return (root / "log" / "queuemgr.log").read_text(errors="replace").splitlines()
    except FileNotFoundError:
        return []


def spawned_web_pids(root: Path) -> list[int]:
    return [int(m.group(1)) for line in log_lines(root)
            if (m := re.search(r"rq-mgr\[\d+\] INFO web: spawned pid (\d+)$", line))]


def stop_everything(root: Path) -> None:
    """Stop the root's manager if it runs; SIGKILL any web server it left behind."""
    rq_mgr(root, "stop")
    for pid in spawned_web_pids(root):
        if not process_gone(pid):
            os.kill(pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def web_root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A real rq-mgr and web server over a root with queues `test` and `slow`."""
    base = tmp_path_factory.mktemp("webd")
    root = build_root(base)
    make_queue(root, "slow", script=write_script(base / "slow.sh", SLOW_SCRIPT),
               num_workers=4)
    Mgr(root)
    wait_for(lambda: web_state(root, "RUNNING"), 20, what="web RUNNING")
    yield root
    stop_everything(root)


@pytest.fixture
def own_root(tmp_path: Path) -> Iterator[Path]:
    """A fresh root (queue `test`, free port) for one lifecycle test; cleaned up after."""
    root = build_root(tmp_path)
    yield root
    stop_everything(root)


def start_slow_job(root: Path, release: Path) -> str:
    """A message of queue `slow` whose job runs until `release` exists; its short id."""
    wait_for(lambda: call_mgr(str(root), "status")[1]["queues"]["slow"]["state"] == "RUNNING",
             20, what="queue slow RUNNING")
    reply = call_queue(str(root), "slow", "create_message",
                       {"dest": "slow", "param1": str(release)})
    assert reply[0] == "ok", reply
    full = reply[1]
    wait_for(lambda: call_queue(str(root), "slow", "get_message_state",
                                {"msg_id": full}) == ["ok", "run"], 20, what="job running")
    return short_id(full)


def twenty_requests(root: Path) -> list[int]:
    """20 concurrent GETs, each on its own connection; their status codes."""
    def one(i: int) -> int:
        path = "/q.txt" if i % 2 else "/q/test.txt"
        return requests.get(url(root, path), timeout=10).status_code
    with ThreadPoolExecutor(20) as pool:
        return list(pool.map(one, range(20)))


# ---------------------------------------------------------------- the supervised child (S2.1)


def test_web_is_a_running_child_with_its_title(web_root: Path) -> None:
    child = web_child(web_root)
    assert child["state"] == "RUNNING" and child["error"] is None
    proc = psutil.Process(child["pid"])
    assert proc.cmdline()[0] == "[rq-web]"
    assert proc.cwd() == str(web_root)
    assert proc.ppid() == int((web_root / "config" / "queuemgr.pid").read_text())
    assert os.getsid(child["pid"]) == child["pid"]               # a session of its own


# ---------------------------------------------------------------- serving (S14.1, S16.1)


def test_dashboard(web_root: Path) -> None:
    status, headers, body = get(web_root, "/")
    assert status == 200, body[:500]
    assert headers["content-type"] == "text/html; charset=utf-8"
    assert re.search(r"QUEUEMGR:.*OPERATIONAL", body.decode())  # one line (S16.1)


def test_queue_list_text(web_root: Path) -> None:
    status, headers, body = get(web_root, "/q.txt")
    assert status == 200
    assert headers["content-type"] == "text/plain; charset=utf-8"
    assert body == b"/q/slow.txt\n/q/test.txt\n"
    assert headers["server"] == "rq-web"


@pytest.mark.parametrize("path", ["/", "/q.txt", "/q/test.txt"])
def test_head(web_root: Path, path: str) -> None:
    g_status, g_headers, g_body = get(web_root, path)
    status, headers, body = get(web_root, path, method="HEAD")
    assert (status, body) == (g_status, b"")
    assert status == 200
    assert headers["content-type"] == g_headers["content-type"]


def test_unknown_path_is_a_404_page(web_root: Path) -> None:
    status, _, body = get(web_root, "/no/such/page")
    assert status == 404
    assert b"<h2>Not Found</h2>" in body


def test_expect_100_continue_before_the_body(web_root: Path) -> None:
    """S14.1: the interim response comes before we send a single byte of the body."""
    body = json.dumps({"dest": "test", "param1": "via 100-continue"}).encode()
    with raw_connect(web_root) as sock:
        sock.sendall(b"POST /q/test/new_message HTTP/1.1\r\nHost: localhost\r\n"
                     b"Content-Type: application/json\r\n"
                     b"Expect: 100-continue\r\n"
                     b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n")
        interim = read_until(sock, b"\r\n\r\n")
        assert interim.startswith(b"HTTP/1.1 100 Continue\r\n\r\n"), interim
        rest = interim[len(b"HTTP/1.1 100 Continue\r\n\r\n"):]
        sock.sendall(body)
        status, reply = read_response(sock, rest)
    assert status == "HTTP/1.1 200 OK", (status, reply)
    result = json.loads(reply)
    assert result[0] == "ok" and "/q/test/" in result[1], result


def test_other_expect_is_417(web_root: Path) -> None:
    with raw_connect(web_root) as sock:
        sock.sendall(b"POST /q/test/new_message HTTP/1.1\r\nHost: localhost\r\n"
                     b"Content-Type: application/json\r\nExpect: foo\r\n"
                     b"Content-Length: 2\r\n\r\n{}")
        status, _ = read_response(sock)
    assert status.startswith("HTTP/1.1 417 ")
    assert get(web_root, "/q.txt", headers={"Expect": "something-else"})[0] == 417


def test_slow_clients_do_not_block_others(web_root: Path) -> None:
    """Clients that sent half a request line, half the headers, or half a body hold
    their connections open while 20 other requests are answered (S14.1)."""
    halves = [b"GET /q.t", b"GET /q.txt HTTP/1.1\r\nHost: loc",
              b"POST /q/test/new_message HTTP/1.1\r\nHost: localhost\r\n"
              b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"dest\""]
    socks = [raw_connect(web_root) for _ in halves]
    try:
        for sock, half in zip(socks, halves):
            sock.sendall(half)
        started = time.monotonic()
        assert twenty_requests(web_root) == [200] * 20
        assert time.monotonic() - started < 10
    finally:
        for sock in socks:
            sock.close()


def test_log_streams_do_not_block_others(web_root: Path, tmp_path: Path) -> None:
    """Eight open log streams (S17.2) each hold a server thread; 20 other requests
    are still answered, and the streams end when the job does."""
    release = tmp_path / "release"
    msg = start_slow_job(web_root, release)
    stream_url = url(web_root, f"/q/slow/{msg}/logstream/stdio.log")
    streams = [requests.get(stream_url, stream=True, timeout=15) for _ in range(8)]
    try:
        chunks = [s.iter_content(chunk_size=None) for s in streams]
        for s, it in zip(streams, chunks):
            assert s.status_code == 200
            assert s.headers["content-type"].startswith("text/event-stream")
            seen = b""
            while b"slow job started" not in seen:  # the first event, flushed at once
                seen += next(it)
        started = time.monotonic()
        assert twenty_requests(web_root) == [200] * 20
        assert time.monotonic() - started < 10
        release.touch()
        for it in chunks:
            rest = b"".join(it)  # the server closes each stream after `event: end`
            assert b"event: end\ndata: done\n" in rest
    finally:
        release.touch()
        for s in streams:
            s.close()


def test_access_log_in_common_log_format(web_root: Path) -> None:
    """S1.5: one CLF line per request in log/queuemgr.log, role rq-web."""
    get(web_root, "/q.txt?probe=access-log")
    get(web_root, "/no/such/page?probe=access-log")

    def lines() -> list[re.Match[str]]:
        found = [CLF.search(line) for line in log_lines(web_root) if "probe=access-log" in line]
        return [m for m in found if m]
    matched = wait_for(lambda: len(lines()) >= 2 and lines(), what="access log lines")
    by_request = {m["request"]: m for m in matched}
    ok = by_request["GET /q.txt?probe=access-log HTTP/1.1"]
    assert ok["status"] == "200" and ok["size"] == str(len(b"/q/slow.txt\n/q/test.txt\n"))
    assert by_request["GET /no/such/page?probe=access-log HTTP/1.1"]["status"] == "404"


# ---------------------------------------------------------------- supervision (S2.2, S2.3, S21)


def test_app_is_built_at_the_first_request(own_root: Path) -> None:
    """Issue 14 section 4: rq-web binds its port and is ready without Flask; the first
    request builds the application (~0.3 s CPU a root whose dashboard nobody opens never
    pays), once, and is answered by it like any other."""
    Mgr(own_root)
    wait_for(lambda: web_state(own_root, "RUNNING"), 20, what="web RUNNING")
    built = "rq-web: application built at the first request"
    assert any("rq-web serving on" in line for line in log_lines(own_root))
    assert not any(built in line for line in log_lines(own_root))
    with ThreadPoolExecutor(4) as pool:  # first requests together: one build, all answered
        assert list(pool.map(lambda _: get(own_root, "/q.txt")[0], range(4))) == [200] * 4
    status, _, body = get(own_root, "/")
    assert status == 200 and b"test" in body
    assert sum(built in line for line in log_lines(own_root)) == 1


def test_an_app_that_cannot_be_built_is_a_crash_of_the_web() -> None:
    """As when it was built at start: the request gets a 500, the failure goes to the log
    and the daemon is told to exit 1 (BACKOFF at the manager, S2.3)."""
    from rq.web.__main__ import LazyApp

    def broken() -> Any:
        raise RuntimeError("no templates")
    crashes: list[int] = []
    app = LazyApp(broken)
    app.on_broken = lambda: crashes.append(1)
    started: list[str] = []
    body = app({}, lambda status, headers: started.append(status))
    assert started == ["500 Internal Server Error"] and crashes == [1]
    assert b"cannot build the application" in b"".join(body)

    def hello(environ: dict, start_response: Any) -> list[bytes]:
        start_response("200 OK", [])
        return [b"hello"]
    builds: list[int] = []
    app = LazyApp(lambda: builds.append(1) or hello)
    for _ in range(3):
        assert app({}, lambda status, headers: started.append(status)) == [b"hello"]
    assert builds == [1] and started[1:] == ["200 OK"] * 3


def test_listen_failure_fails_start(own_root: Path) -> None:
    """S2.2 step 4, S21: port taken -> `rq-mgr start` exits 1 with the exact line, and
    the manager leaves neither its pid file nor its socket behind."""
    port = port_of(own_root)
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", port))
        holder.listen()
        res = rq_mgr(own_root, "start")
        assert (res.returncode, res.stdout) == (1, "")
        assert res.stderr == f"ERROR: cannot listen on 127.0.0.1:{port}: Address already in use\n"
        res = rq_mgr(own_root, "run")                # the same failure in the foreground
        assert res.returncode == 1
        assert res.stderr.splitlines()[-1] == \
            f"ERROR: cannot listen on 127.0.0.1:{port}: Address already in use"
    assert not (own_root / "config" / "queuemgr.pid").exists()
    assert not (own_root / "config" / "queuemgr.sock").exists()
    pids = spawned_web_pids(own_root)
    assert len(pids) == 2                            # one per attempt, and no queue started
    assert all(process_gone(pid) for pid in pids)
    assert not (own_root / "queue" / "test" / "queue.pid").exists()


def test_killed_web_is_restarted(own_root: Path) -> None:
    """S2.3: BACKOFF, then RUNNING again with a new pid; the manager and the queues
    are not disturbed."""
    Mgr(own_root)
    old = wait_for(lambda: web_state(own_root, "RUNNING"), 20, what="web RUNNING")["pid"]
    queue_pid = wait_for(lambda: (q := call_mgr(str(own_root), "status")[1]["queues"]["test"])
                         ["state"] == "RUNNING" and q["pid"], 20, what="queue RUNNING")
    os.kill(old, signal.SIGKILL)
    new = wait_for(lambda: (c := web_state(own_root, "RUNNING")) and c["pid"] != old and c,
                   20, what="web RUNNING again")
    assert new["restarts"] == 1 and new["error"] is None
    assert wait_for(lambda: answers(own_root), 10, what="web answers again")
    moves = [line.split(" INFO web: ", 1)[1] for line in log_lines(own_root)
             if " INFO web: " in line and " -> " in line]
    assert moves[-3:] == ["RUNNING -> BACKOFF (killed by SIGKILL)", "BACKOFF -> STARTING",
                          "STARTING -> RUNNING"]
    status = call_mgr(str(own_root), "status")[1]       # the manager and the queue never noticed
    assert status["queues"]["test"]["pid"] == queue_pid


def test_web_that_cannot_listen_after_start_backs_off(own_root: Path) -> None:
    """Once rq-mgr is up, a web server whose port was taken while it was down is a
    failed start with backoff (S2.3), not FATAL and not the manager's end."""
    Mgr(own_root)
    old = wait_for(lambda: web_state(own_root, "RUNNING"), 20, what="web RUNNING")["pid"]
    mgr_pid = int((own_root / "config" / "queuemgr.pid").read_text())
    port = port_of(own_root)
    holder = socket.socket()
    try:
        os.kill(mgr_pid, signal.SIGSTOP)  # no restart can race us for the port
        try:
            os.kill(old, signal.SIGKILL)
            wait_for(lambda: process_gone(old), 10, what="web gone")
            holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            wait_for(lambda: _try_bind(holder, port), 10, what="port free")
            holder.listen()
        finally:
            os.kill(mgr_pid, signal.SIGCONT)
        reason = f"ERROR: cannot listen on 127.0.0.1:{port}: Address already in use"
        failed = wait_for(lambda: (c := web_child(own_root))["error"] == reason and c, 20,
                          what="a failed restart")
        assert failed["state"] in ("BACKOFF", "STARTING")
    finally:
        holder.close()
    new = wait_for(lambda: web_state(own_root, "RUNNING"), 30, what="web RUNNING again")
    assert new["restarts"] >= 2
    assert answers(own_root)


def _try_bind(sock: socket.socket, port: int) -> bool:
    try:
        sock.bind(("127.0.0.1", port))
        return True
    except OSError:
        return False


def test_web_exits_when_the_manager_dies(own_root: Path) -> None:
    """S2.1 (fix): SIGKILL of rq-mgr -> the web server sees lifeline EOF and exits."""
    Mgr(own_root)
    web = wait_for(lambda: web_state(own_root, "RUNNING"), 20, what="web RUNNING")["pid"]
    mgr_pid = int((own_root / "config" / "queuemgr.pid").read_text())
    os.kill(mgr_pid, signal.SIGKILL)
    wait_for(lambda: process_gone(web), 15, what="web server exit")
    assert any(f"rq-web[{web}] INFO rq-web: manager gone, stopping" in line
               for line in log_lines(own_root))
    with pytest.raises(OSError):
        get(own_root, "/q.txt")


def test_manager_stop_stops_the_web_after_the_queues(own_root: Path) -> None:
    Mgr(own_root)
    web = wait_for(lambda: web_state(own_root, "RUNNING"), 20, what="web RUNNING")["pid"]
    wait_for(lambda: call_mgr(str(own_root), "status")[1]["queues"]["test"]["state"]
             == "RUNNING", 20, what="queue RUNNING")
    res = rq_mgr(own_root, "stop")
    assert res.returncode == 0
    assert process_gone(web)
    lines = log_lines(own_root)
    queue_exit = max(i for i, line in enumerate(lines) if "queue test: pid" in line
                     and "exited" in line)
    web_exit = max(i for i, line in enumerate(lines) if f"web: pid {web} exited" in line)
    assert queue_exit < web_exit
    assert lines[web_exit].endswith("exit status 0")


def test_open_stream_does_not_hold_up_the_stop(own_root: Path, tmp_path: Path) -> None:
    """A browser tab streaming a log must not keep the web server (and so `rq-mgr stop`)
    waiting: after a short grace its connection is closed and the web exits 0."""
    make_queue(own_root, "slow", script=write_script(tmp_path / "slow.sh", SLOW_SCRIPT))
    Mgr(own_root)
    web = wait_for(lambda: web_state(own_root, "RUNNING"), 20, what="web RUNNING")["pid"]
    msg = start_slow_job(own_root, tmp_path / "never")
    stream = requests.get(url(own_root, f"/q/slow/{msg}/logstream/stdio.log"), stream=True,
                          timeout=30)
    try:
        chunks = stream.iter_content(chunk_size=None)
        seen = b""
        while b"slow job started" not in seen:
            seen += next(chunks)
        started = time.monotonic()
        assert rq_mgr(own_root, "stop").returncode == 0
        assert time.monotonic() - started < 15
        assert process_gone(web)
        with pytest.raises((StopIteration, requests.exceptions.RequestException)):
            while True:  # the server closed the stream; whatever was in flight is read
                next(chunks)
    finally:
        stream.close()
    assert any(f"web: pid {web} exited: exit status 0" in line for line in log_lines(own_root))


def test_web_runs_by_hand_and_stops_on_sigterm(own_root: Path) -> None:
    """A program you can run by hand (STYLE habit 8): no pipes, log copied to stderr."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen([sys.executable, "-m", "rq.web", "--root", str(own_root)],
                            cwd=str(own_root), env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: proc.poll() is not None or _status_of(own_root, "/q.txt") == 503,
                 20, what="web answering")
        assert proc.poll() is None
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=15)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0
    assert "INFO rq-web stopped" in err


def _status_of(root: Path, path: str) -> int | None:
    try:
        return get(root, path)[0]
    except OSError:
        return None


# ---------------------------------------------------------------- the retry rule itself


def test_fatal_line_is_a_failed_start_once_retry_fatal_is_set() -> None:
    child = Child("web", "web", ["web"])
    child.retry_fatal = True
    child.transition(State.STARTING, 0.0)
    child.ready_line("fatal ERROR: cannot listen on x:1: Address already in use", 0.0)
    assert child.state is State.STARTING
    child.exited(2, 0.5, Policy())
    assert child.state is State.BACKOFF and child.failures == 1
    assert child.error == "ERROR: cannot listen on x:1: Address already in use"
