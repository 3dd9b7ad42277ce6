"""Hostile load, every kind at once (issue 13, part 5; SPEC S14.1, S7.1, S8.2, S8.8).

The web half: one real rq-mgr whose rq-web holds 200 long-request slots (`--long-requests
200`, so every stream and long poll below really waits instead of getting its 503), then at
once, against that one rq-web:

* 500 keep-alive connections that each made one request and stay open;
* 200 slowloris connections from 127.0.0.2: 100 trickle a request's headers and 100 the JSON
  body of a `POST /q/test/new_message`, a byte per connection every TRICKLE seconds;
* 100 open `GET /events` streams and 100 `POST /consumer/reserve` waiting 60 s;
* a thread sending deep JSON, a body over max_body_bytes, an upload announcing more than
  max_upload_bytes and a malformed multipart upload.

Meanwhile a well-behaved client asks `/` and `/q.json` over fresh connections: every answer
is a 200 and the p99 stays under 1 s (the issue's bound); rq-web's peak RSS and USS are
sampled with psutil and reported.  Afterwards the trickled requests are completed and must
be answered (a trickled create is an `ok`), and no daemon has died.

The rq1 half: a real queue process, 1,000 idle connections, a 100 MB length header, and
clients that never read a 1 MB reply; `ping` and `create_message` keep answering and the
queue process's memory stays bounded: 250 such clients (225 MB of replies) leave its USS
under the cap on unsent replies (rq/sockwrite.py) plus a margin, the connections that do
not read dropped with one log line, and a client that reads still gets whole replies.

The test raises its soft RLIMIT_NOFILE (children inherit it) and skips, naming the limit,
when the hard limit is below NOFILE_NEEDED.
"""

from __future__ import annotations

import fcntl
import json
import multiprocessing
import os
import resource
import select
import selectors
import signal
import socket
import subprocess
import sys
import termios
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from rqtest import REPO, QueueProc, make_queue, make_root, wait_for
from webtest import build_root, http_head, rq_mgr

from rq import client, protocol, sockwrite

pytestmark = pytest.mark.timeout(300)

NOFILE_NEEDED = 4096   # 900 web connections + 1,000 rq1 ones + the daemons' own files
LONG = 200             # rq-web --long-requests: 100 streams + 100 reserves all held
KEEPALIVE, SLOW_HEADERS, SLOW_BODIES, STREAMS, RESERVES = 500, 100, 100, 100, 100
TRICKLE = 0.1          # seconds between two bytes of one slowloris connection
MEASURE = 8.0          # seconds the well-behaved client measures while everything is held
P99_BOUND = 1.0        # issue 13 part 5: /q.json within 1 s p99
WEB_RSS_BOUND = 200 * 2**20   # measured: 40 MiB idle, 53 MiB peak under all of it

# The manager, run in the foreground with rq-web given more long-request slots: the argv
# builder is the one seam rq.mgr.daemon.run_daemon offers for its children (as in
# tests/test_mgr_support.py).
MANAGER = """
import sys
from rq.mgr.daemon import run_daemon
from rq.mgr.programs import default_argv
root, long_slots = sys.argv[1], sys.argv[2]
def argv_for(kind, name):
    argv = default_argv(root, kind, name)
    return argv + ["--long-requests", long_slots] if kind == "web" else argv
sys.exit(run_daemon(root, argv_for=argv_for))
"""


@pytest.fixture(scope="module", autouse=True)
def enough_files() -> Iterator[None]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < NOFILE_NEEDED:
        pytest.skip(f"needs RLIMIT_NOFILE {NOFILE_NEEDED}, the hard limit is {hard}")
    if soft != resource.RLIM_INFINITY and soft < NOFILE_NEEDED:
        resource.setrlimit(resource.RLIMIT_NOFILE, (NOFILE_NEEDED, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


# ---------------------------------------------------------------- helpers


class PeakMemory:
    """A thread sampling a process's RSS and USS until stopped; the peaks, in bytes."""

    def __init__(self, pid: int, every: float = 0.1) -> None:
        self.proc = psutil.Process(pid)
        self.rss = self.uss = 0
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(every,), daemon=True)
        self._thread.start()

    def _run(self, every: float) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(every)

    def sample(self) -> None:
        info = self.proc.memory_full_info()
        self.rss, self.uss = max(self.rss, info.rss), max(self.uss, info.uss)
        self.samples += 1

    def stop(self) -> str:
        self._stop.set()
        self._thread.join(10)
        self.sample()
        return f"peak RSS {self.rss / 2**20:.0f} MiB, USS {self.uss / 2**20:.0f} MiB"


def connect(port: int, source: str = "127.0.0.1") -> socket.socket:
    sock = socket.socket()
    try:
        sock.bind((source, 0))
        sock.settimeout(10)
        sock.connect(("127.0.0.1", port))
    except OSError:
        sock.close()
        raise
    return sock


def http_response(sock: socket.socket) -> tuple[int, bytes]:
    """Status and body of one response with a Content-Length (blocking)."""
    data = http_head(sock)
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length:"))
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk, "connection closed mid-body"
        body += chunk
    return int(head.split(b" ", 2)[1]), body


def get(port: int, path: str) -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode()


def post(port: int, path: str, body: bytes, ctype: str = "application/json") -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: {ctype}\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body


def none_answer(socks: list[socket.socket], within: float) -> bool:
    """True when not one of `socks` gets a byte or is closed within `within` seconds."""
    sel = selectors.DefaultSelector()
    for sock in socks:
        sel.register(sock, selectors.EVENT_READ)
    try:
        return not sel.select(within)
    finally:
        sel.close()


class Trickler:
    """Sends each connection's bytes one at a time, a byte per connection every TRICKLE s,
    keeping the last `keep` bytes of each unsent until `finish()`."""

    def __init__(self, pending: list[tuple[socket.socket, bytes]], keep: int) -> None:
        self.pending = [[sock, data, 0] for sock, data in pending]
        self.keep = keep
        self.sent = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(TRICKLE):
            for item in self.pending:
                sock, data, pos = item
                if pos < len(data) - self.keep:
                    sock.send(data[pos:pos + 1])
                    item[2] = pos + 1
                    self.sent += 1

    def finish(self) -> None:
        """Stop trickling and send what is left of every request at once."""
        self._stop.set()
        self._thread.join(10)
        for sock, data, pos in self.pending:
            sock.sendall(data[pos:])


def hostile_bodies(port: int, stop: threading.Event, statuses: list[int]) -> None:
    """Deep JSON, a body over max_body_bytes (8 MiB), an upload announcing more than
    max_upload_bytes and a broken multipart upload, again and again: each one 4xx."""
    deep = b"[" * 100_000 + b"]" * 100_000
    large = b'{"dest": "x", "param1": "' + b"y" * (9 * 2**20) + b'"}'
    broken = b"--B\r\nContent-Disposition: form-data; name=\"filedata\"; filename=\"a\"\r\n\r\nxx"
    upload = post(port, "/q/test/nosuchmsg/attach/new", b"x" * 65536,
                  "multipart/form-data; boundary=B").replace(
        b"Content-Length: 65536", b"Content-Length: %d" % (40 * 2**20))  # over 32 MiB
    requests_ = [post(port, "/consumer/reserve", deep), post(port, "/q/test/new_message", large),
                 upload,
                 post(port, "/q/test/nosuchmsg/attach/new", broken,
                      "multipart/form-data; boundary=B")]
    while not stop.is_set():
        for raw in requests_:
            with connect(port, "127.0.0.2") as sock:
                try:
                    sock.sendall(raw)
                except OSError:  # refused before the whole body was read: read the answer
                    pass
                statuses.append(http_response(sock)[0])


def measure(port: int, seconds: float) -> list[tuple[str, int, float]]:
    """`/` and `/q.json` over fresh connections for `seconds`: (path, status, seconds)."""
    out = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for path in ("/q.json", "/", "/q.json"):
            start = time.monotonic()
            with connect(port) as sock:
                sock.sendall(get(port, path))
                status, _ = http_response(sock)
            out.append((path, status, time.monotonic() - start))
    return out


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


def close_all(socks: list[socket.socket]) -> None:
    for sock in socks:
        sock.close()


# ---------------------------------------------------------------- the web half


@pytest.fixture(scope="module")
def web(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    base = tmp_path_factory.mktemp("hostile-load")
    spool = base / "spool"
    spool.mkdir()
    root = build_root(base, tmpdir=str(spool), max_upload_bytes=32 * 2**20)
    make_queue(root, "pull", mode="pull", topic="pull.jobs")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    with open(base / "mgr.stderr", "wb") as err:
        mgr = subprocess.Popen([sys.executable, "-c", MANAGER, str(root), str(LONG)],
                               stdout=err, stderr=err, env=env, start_new_session=True)
    port = json.loads((root / "config" / "config.json").read_text())["port"]
    try:
        def up() -> bool:
            assert mgr.poll() is None, (base / "mgr.stderr").read_text()
            try:
                with connect(port) as sock:
                    sock.sendall(get(port, "/q.json"))
                    return http_response(sock)[0] == 200
            except OSError:
                return False
        wait_for(up, 60, interval=0.1, what="rq-web to answer")
        yield {"root": root, "port": port, "spool": spool}
    finally:
        rq_mgr(root, "stop")
        try:
            mgr.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(mgr.pid, signal.SIGKILL)
            mgr.wait(10)


def daemon_pids(root: Path) -> dict[str, int]:
    """The pids of rq-web and the queue processes, from the manager's S7.2 `status`."""
    reply = client.call_mgr(str(root), "status", timeout=10)
    pids = {"web": int(reply[1]["web"]["pid"])}
    for name, info in reply[1]["queues"].items():
        pids[f"queue {name}"] = int(info["pid"])
    return pids


def test_short_requests_answer_under_every_hostile_load_at_once(web: dict[str, Any]) -> None:
    """Issue 13 part 5 (S14.1): 500 keep-alive connections, 200 slowloris, 100 event
    streams, 100 waiting reserves and hostile bodies at once: `/` and `/q.json` answer
    200 with p99 < 1 s, rq-web's memory stays bounded, every trickled request is answered
    once complete, no daemon dies."""
    port, root = web["port"], web["root"]
    before = daemon_pids(root)
    memory = PeakMemory(before["web"])
    baseline = memory.proc.memory_full_info()
    held: list[socket.socket] = []
    stop = threading.Event()
    bad_statuses: list[int] = []
    try:
        keepalive = open_keepalive(port, KEEPALIVE)
        held += keepalive
        streams = [connect(port, "127.0.0.2") for _ in range(STREAMS)]
        held += streams
        for sock in streams:
            sock.sendall(get(port, "/events?pattern=%23").replace(
                b"\r\n\r\n", b"\r\nAccept: text/event-stream\r\n\r\n"))
        assert all(http_head(s).startswith(b"HTTP/1.1 200") for s in streams)
        reserve = json.dumps({"patterns": ["nothing.here"], "wait": 60}).encode()
        polls = [connect(port, "127.0.0.2") for _ in range(RESERVES)]
        held += polls
        for sock in polls:
            sock.sendall(post(port, "/consumer/reserve", reserve))
        slow = [connect(port, "127.0.0.2") for _ in range(SLOW_HEADERS + SLOW_BODIES)]
        held += slow
        body = b'{"dest": "trickled", "param1": "' + b"b" * 64 + b'"}'
        heads = [get(port, "/q.json").replace(b"\r\n\r\n", b"\r\nX-Slow: " + b"s" * 64
                                              + b"\r\n\r\n") for _ in range(SLOW_HEADERS)]
        creates = [post(port, "/q/test/new_message", body) for _ in range(SLOW_BODIES)]
        # the creates' headers go at once; then their bodies (and the GETs' heads) trickle
        for sock, raw in zip(slow[SLOW_HEADERS:], creates):
            sock.sendall(raw[:len(raw) - len(body)])
        trickler = Trickler([(s, r) for s, r in zip(slow[:SLOW_HEADERS], heads)]
                            + [(s, body) for s in slow[SLOW_HEADERS:]], keep=4)
        bodies = threading.Thread(target=hostile_bodies, args=(port, stop, bad_statuses),
                                  daemon=True)
        bodies.start()
        times = measure(port, MEASURE)
        stop.set()
        bodies.join(30)
        assert none_answer(polls, 0.1), "a reserve was answered while it should wait"
        print(f"\nhostile load: {KEEPALIVE} keep-alive, {len(slow)} slowloris "
              f"({trickler.sent} bytes trickled), {STREAMS} streams, {RESERVES} reserves held, "
              f"{len(bad_statuses)} hostile bodies; {len(times)} short requests: "
              f"p99 {p99([t for _, _, t in times]):.3f} s, max {max(t for _, _, t in times):.3f} s;"
              f" web baseline RSS {baseline.rss / 2**20:.0f} MiB, {memory.stop()}")
        assert {status for _, status, _ in times} == {200}
        assert p99([t for _, _, t in times]) < P99_BOUND
        assert bad_statuses and all(400 <= s < 500 for s in bad_statuses), set(bad_statuses)
        assert memory.rss < WEB_RSS_BOUND
        trickler.finish()
        answers = [http_response(sock) for sock in slow]
        assert all(status == 200 for status, _ in answers), {s for s, _ in answers}
        created = [json.loads(b) for _, b in answers[SLOW_HEADERS:]]
        assert all(reply[0] == "ok" for reply in created), created[:3]
    finally:
        stop.set()
        memory.stop()
        close_all(held)
    assert daemon_pids(root) == before, "a daemon died or was restarted"


def open_keepalive(port: int, count: int) -> list[socket.socket]:
    """`count` connections that each made one request (`GET /q.json`, answered) and stay
    open, idle, as a browser's keep-alive connections do."""
    socks = [connect(port) for _ in range(count)]
    for sock in socks:
        sock.sendall(get(port, "/q.json"))
    for sock in socks:
        assert http_response(sock)[0] == 200
    return socks


# ---------------------------------------------------------------- the rq1 half (S7.1)


@pytest.fixture(scope="module")
def sockq(tmp_path_factory: pytest.TempPathFactory) -> Iterator[QueueProc]:
    base = tmp_path_factory.mktemp("hostile-rq1")
    root = make_root(base)
    make_queue(root, "p", mode="pull", topic="p.jobs")
    proc = QueueProc(root, "p")
    try:
        yield proc
    finally:
        proc.stop()


def timed(call: Callable[[], Any]) -> tuple[Any, float]:
    start = time.monotonic()
    reply = call()
    return reply, time.monotonic() - start


def test_rq1_socket_serves_others_under_hostile_clients(sockq: QueueProc) -> None:
    """Issue 13 part 5 (S7.1): 1,000 idle connections, a 100 MB length header and 20
    clients that never read a 1 MB reply; `ping` and `create_message` from another client
    answer within 1 s throughout and the queue process's memory stays bounded."""
    path = str(Path(sockq.root, "queue", "p", "queue.sock"))
    big = sockq.call("create_message", {"dest": "x", "param1": "z" * 900_000})
    assert big[0] == "ok", big
    memory = PeakMemory(sockq.popen.pid)
    base_rss = memory.proc.memory_info().rss
    idle: list[socket.socket] = []
    deaf: list[socket.socket] = []
    try:
        for _ in range(1000):
            sock = socket.socket(socket.AF_UNIX)
            sock.connect(path)
            idle.append(sock)
        huge = socket.socket(socket.AF_UNIX)
        huge.connect(path)
        huge.sendall(b"rq1 99999999 " + b"{" * 2**20)  # announces ~100 MB, refused at once
        huge.shutdown(socket.SHUT_WR)
        raw = b""
        while chunk := huge.recv(65536):
            raw += chunk
        huge.close()
        assert json.loads(raw[protocol.HEADER_LEN:]) == ["fail", "bad request"]
        request = protocol.encode_request("get_message", {"msg_id": big[1]})
        for _ in range(20):
            sock = socket.socket(socket.AF_UNIX)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.connect(path)
            sock.sendall(request)  # and never reads the reply
            deaf.append(sock)
        times = []
        for i in range(100):
            pong, took = timed(lambda: sockq.call("ping", timeout=5))
            assert pong == ["pong"]
            made, took2 = timed(lambda: sockq.call("create_message", {"dest": f"m{i}"},
                                                   timeout=5))
            assert made[0] == "ok", made
            times += [took, took2]
        print(f"\nrq1 under 1,000 idle connections, a 100 MB header and 20 deaf clients: "
              f"ping/create p99 {p99(times) * 1000:.1f} ms, max {max(times) * 1000:.1f} ms; "
              f"queue RSS before {base_rss / 2**20:.0f} MiB, {memory.stop()}")
        assert max(times) < 1.0
        # A deaf client's reply is held (no thread) until it is sent, dropped over the
        # cap (the next test) or READ_TIMEOUT passes: 20 of them stay under the cap.
        assert memory.rss - base_rss < 128 * 2**20
    finally:
        memory.stop()
        close_all(idle + deaf)
    assert sockq.call("ping") == ["pong"]


DEAF = 250          # clients asking for a BIG reply and never reading it: 225 MB uncapped
BIG = 900_000
UNSENT_CAP = 32 * 2**20    # rq.sockwrite.MAX_UNSENT, the documented default
MEMORY_MARGIN = 48 * 2**20  # replies in the workers, readers' replies, glibc arenas


def ask_and_never_read(path: str, request: bytes) -> socket.socket:
    """Send `request`, wait until its reply starts to arrive (so the flood goes at the
    queue's pace: this is about memory, not CPU), then never read it."""
    sock = socket.socket(socket.AF_UNIX)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(path)
    sock.sendall(request)
    assert select.select([sock], [], [], 30)[0], "no reply started within 30 s"
    return sock


class DeafFlood:
    """A process asking `count` times for a message of `ids` over a fresh connection
    that never reads its reply; `stop()` ends the flood and closes every connection.
    A process, not a thread of the test's: a thread took the GIL from the test's own
    reader, whose reply then sat unread while newer deaf replies came, so that it
    looked deaf too and was dropped (CI, and 1 run in 6 with two CPU hogs)."""

    def __init__(self, path: str, ids: list[str], count: int = DEAF) -> None:
        ctx = multiprocessing.get_context("fork")
        self._conn, theirs = ctx.Pipe()
        self._proc = ctx.Process(target=deaf_flood, args=(path, ids, count, theirs),
                                 daemon=True)
        self._proc.start()
        theirs.close()
        self.sent: int | None = None  # connections opened, once the flood is over

    def _take(self, timeout: float) -> None:
        if self.sent is None and self._conn.poll(timeout):
            reply = self._conn.recv()
            assert isinstance(reply, int), reply  # the flood's own failure
            self.sent = reply

    def is_alive(self) -> bool:
        self._take(0)
        return self.sent is None

    def join(self, timeout: float) -> None:
        self._take(timeout)

    def whole(self, frame: int) -> int:
        """How many deaf connections got all `frame` bytes (read now, to their end)."""
        self._conn.send(("whole", frame))
        return int(self._conn.recv())

    def stop(self) -> None:
        """After a failed assertion too: no connection is left open for a later test."""
        try:
            self._conn.send(("stop", 0))
        except OSError:
            pass
        self._proc.join(60)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join()
        self._conn.close()


def deaf_flood(path: str, ids: list[str], count: int, conn: Any) -> None:
    """DeafFlood's process: the flood, then its connections' count, then commands."""
    socks: list[socket.socket] = []
    try:
        for i in range(count):
            if conn.poll():  # stopped while flooding
                break
            request = protocol.encode_request("get_message", {"msg_id": ids[i % len(ids)]})
            socks.append(ask_and_never_read(path, request))
        conn.send(len(socks))
        while (command := conn.recv())[0] == "whole":
            conn.send(sum(read_to_eof(sock) == command[1] for sock in socks))
    except BaseException as exc:  # noqa: BLE001 -- reported to the test, which fails
        conn.send(f"the deaf flood failed: {exc!r}")
    finally:
        close_all(socks)


PAUSE_AFTER = 400_000  # bytes a paused reader has read: more than a Unix socket's buffer
DEAF_AFTER = 120       # deaf replies while it pauses: over three times the ~36 that fill the cap


def read_until_refilled(sock: socket.socket, at_least: int) -> int:
    """Read `at_least` bytes, then on in small steps until the queue writes again (the
    bytes waiting grow): stop there, so the paused reader's socket is full and takes
    nothing more, like a deaf client's.  A reader paused with room left takes the queue's
    next chunk when the cap offers it one, and was never at risk."""
    got = 0
    waiting = 0
    while True:
        now = int.from_bytes(fcntl.ioctl(sock, termios.FIONREAD, b"\0" * 4), sys.byteorder)
        if got >= at_least and now > waiting:
            return got
        chunk = sock.recv(4096 if got >= at_least else at_least - got)
        assert chunk, "the reply ended before the reader paused"
        got += len(chunk)
        waiting = now - len(chunk)


def read_to_eof(sock: socket.socket) -> int:
    sock.settimeout(30)
    got = 0
    try:
        while chunk := sock.recv(1 << 20):
            got += len(chunk)
    except OSError:
        pass
    return got


def test_rq1_caps_the_memory_held_for_replies_never_read(sockq: QueueProc) -> None:
    """Issue 13 part 5 (S7.1): DEAF clients ask for a 0.9 MB `get_message` reply and never
    read it, 225 MB in all.  The queue holds at most UNSENT_CAP for them (USS
    under the cap plus a margin), drops the connections that do not read with one log
    line, and meanwhile answers `ping` and `create_message` within 1 s and gives a client
    that reads its whole 0.9 MB reply, never a cut one.  Without the cap the USS grows by
    the whole 225 MB (and, before issue 13, every deaf client also held a thread)."""
    assert sockwrite.MAX_UNSENT == UNSENT_CAP
    path = str(Path(sockq.root, "queue", "p", "queue.sock"))
    ids = [sockq.call("create_message", {"dest": "x", "param1": c * BIG})[1] for c in "abc"]
    log_path = Path(sockq.root, "log", "queuemgr.log")
    offset = log_path.stat().st_size
    memory = PeakMemory(sockq.popen.pid)
    base_uss = memory.proc.memory_full_info().uss
    flood = DeafFlood(path, ids)
    times: list[float] = []
    reads = 0
    try:
        while flood.is_alive() or reads < 5:
            pong, took = timed(lambda: sockq.call("ping", timeout=5))
            assert pong == ["pong"]
            made, took2 = timed(lambda: sockq.call("create_message", {"dest": "m"}, timeout=5))
            assert made[0] == "ok", made
            times += [took, took2]
            got = sockq.call("get_message", {"msg_id": ids[reads % 3]}, timeout=30)
            assert got[1]["param1"] == "abc"[reads % 3] * BIG  # whole, never cut
            reads += 1
        flood.join(60)
        peak = memory.stop()
        print(f"\nrq1 with {DEAF} clients never reading a 0.9 MB reply: ping/create p99 "
              f"{p99(times) * 1000:.1f} ms, max {max(times) * 1000:.1f} ms; {reads} whole "
              f"replies read meanwhile; queue USS before {base_uss / 2**20:.0f} MiB, {peak}")
        assert p99(times) < 1.0, times  # the bound of issue 13 part 5 (a loaded CI machine
        # can stall one round trip of ~60 past it: p99 as for the web half)
        assert memory.uss - base_uss < UNSENT_CAP + MEMORY_MARGIN
        frame = len(protocol.encode_reply(sockq.call("get_message", {"msg_id": ids[0]})))
        whole = flood.whole(frame)
        assert whole <= UNSENT_CAP // BIG + 2, f"{whole} of {DEAF} deaf clients " \
            "got their whole reply: none was dropped"
        logged = log_path.read_bytes()[offset:].decode(errors="replace")
        # once per state change: the flood's pace may let the total fall under half the cap
        # and rise again, a second episode; never a line per dropped connection
        assert 1 <= logged.count("dropping the connections that do not read") <= 3, logged
    finally:
        memory.stop()
        flood.stop()
    assert sockq.call("ping") == ["pong"]


def test_rq1_a_reader_paused_during_a_deaf_flood_gets_its_whole_reply(sockq: QueueProc) -> None:
    """Issue 13 part 5 (S7.1), the flake the project's CI met at 04ddabf: a client reads
    part of its 0.9 MB reply, then is not scheduled while deaf clients push the unsent
    replies over the cap.  It has read part of its reply (while the worker's first send
    wrote it, or from the I/O thread's later sends), so it is a reader: the queue drops
    deaf connections, never it, and it gets its whole reply.  When the cap dropped
    the longest without progress first, the paused reader was dropped once DEAF_AFTER
    newer deaf replies had come (its frame ended short)."""
    path = str(Path(sockq.root, "queue", "p", "queue.sock"))
    msg_id = sockq.call("create_message", {"dest": "x", "param1": "r" * BIG})[1]
    frame = len(protocol.encode_reply(sockq.call("get_message", {"msg_id": msg_id})))
    log_path = Path(sockq.root, "log", "queuemgr.log")
    offset = log_path.stat().st_size
    reader = socket.socket(socket.AF_UNIX)
    flood: DeafFlood | None = None
    try:
        reader.settimeout(30)
        reader.connect(path)
        reader.sendall(protocol.encode_request("get_message", {"msg_id": msg_id}))
        got = read_until_refilled(reader, PAUSE_AFTER)
        flood = DeafFlood(path, [msg_id], count=DEAF_AFTER)  # the reader pauses meanwhile
        flood.join(120)
        assert not flood.is_alive() and flood.sent == DEAF_AFTER
        logged = log_path.read_bytes()[offset:].decode(errors="replace")
        assert "dropping the connections that do not read" in logged, logged
        got += read_to_eof(reader)
        assert got == frame, f"the paused reader got {got} of {frame} bytes: it was dropped"
    finally:
        reader.close()
        if flood is not None:
            flood.stop()
    assert sockq.call("ping") == ["pong"]
