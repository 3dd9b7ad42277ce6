"""The rq1 server (rq/sockserve.py, S7.1): close() lets replies being written
reach their clients (the "ok" of `shutdown` arrives before the process exits);
one I/O thread reads every request, a slow or broken client holds up no one,
and the requests of a batch command read in one pass are answered together.
A pumped server (a queue process with one job at a time, issue 15) has no I/O
thread: its owner's loop pumps it; the tests of both kinds run on each.

Bad frames (bad magic, bad size, short reads, garbage) are tested here once: the
manager, queue and timers processes all serve their socket with this server, and
their own tests keep one smoke test each that a bad frame reaches it."""

from __future__ import annotations

import json
import math
import os
import select
import selectors
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rqtest import decode_reply_frame, raw_exchange, wait_for

from rq import client, protocol, sockserve
from rq.errors import Fail, NoReply, ProtocolError
from rq.client import read_frame
from rq.sockserve import Rq1Server


MODES = ["thread", "pumped"]


class Served:
    """A started server of either kind.  Pumped, a thread stands for the owner's loop
    (rq.queue.process): it waits on the server's fd and its timeout(), then pumps and
    ticks; close() closes the server on that thread, as the loop does at its end."""

    def __init__(self, path: str, handler: Any, mode: str, **kwargs: Any) -> None:
        self.server = Rq1Server(path, handler, pumped=mode == "pumped", **kwargs)
        self.server.start()
        self.pumping: threading.Thread | None = None
        if mode == "pumped":
            self._grace = sockserve.REPLY_GRACE
            self._stop = threading.Event()
            self._wake_r, self._wake_w = os.pipe()
            self.pumping = threading.Thread(target=self._pump, name="test-pump", daemon=True)
            self.pumping.start()

    def _pump(self) -> None:
        sel = selectors.DefaultSelector()
        sel.register(self.server.fileno(), selectors.EVENT_READ)
        sel.register(self._wake_r, selectors.EVENT_READ)
        while not self._stop.is_set():
            due = self.server.timeout()
            sel.select(None if due == math.inf else due)
            self.server.pump()
            self.server.tick()
        self.server.close(self._grace)
        sel.close()

    def close(self, reply_grace: float = sockserve.REPLY_GRACE) -> None:
        if self.pumping is None:
            self.server.close(reply_grace)
            return
        self._grace = reply_grace
        self._stop.set()
        os.write(self._wake_w, b"x")
        self.pumping.join(30)
        assert not self.pumping.is_alive()
        os.close(self._wake_r)
        os.close(self._wake_w)


def blocking_server(tmp_path: Path, reply: Any, mode: str = "thread"
                    ) -> tuple[Served, str, threading.Event, threading.Event]:
    """A started server whose handler signals `started`, then waits for `release` (10 s at
    most) before answering `reply` (None: ["ok", cmd])."""
    started = threading.Event()
    release = threading.Event()

    def handler(cmd: str, arg: Any, conn: Any) -> Any:
        started.set()
        release.wait(10)
        return ["ok", cmd] if reply is None else reply

    path = str(tmp_path / "s.sock")
    return Served(path, handler, mode), path, started, release


@pytest.mark.parametrize("mode", MODES)
def test_close_waits_for_a_reply_in_flight(tmp_path: Path, mode: str) -> None:
    server, path, started, release = blocking_server(tmp_path, None, mode)
    got: list[Any] = []
    caller = threading.Thread(target=lambda: got.append(client.call(path, "shutdown")))
    caller.start()
    assert started.wait(5)
    threading.Timer(0.2, release.set).start()
    server.close()                 # returns only once the reply has been written
    assert release.is_set()        # it waited for the handler and its reply
    caller.join(5)
    assert got == [["ok", "shutdown"]]
    assert not Path(path).exists()


@pytest.mark.parametrize("mode", MODES)
def test_close_gives_up_after_the_grace(tmp_path: Path, mode: str) -> None:
    server, path, started, release = blocking_server(tmp_path, ["ok"], mode)
    caller = threading.Thread(target=lambda: client.call(path, "slow"), daemon=True)
    caller.start()
    assert started.wait(5)
    server.close(reply_grace=0.3)  # a stuck handler does not hold the stop forever
    assert caller.is_alive()
    release.set()
    caller.join(5)


@pytest.mark.parametrize("mode", MODES)
def test_a_worker_whose_reply_outlives_the_server_ends_too(tmp_path: Path, mode: str) -> None:
    """A reply too big for the socket, made after close() gave up on it: the worker
    finds the I/O side ended, closes the connection and retires (it used to wait
    forever for the server's lock, which it held itself)."""
    before = set(threading.enumerate())
    server, path, started, release = blocking_server(tmp_path, ["ok", "x" * 4_000_000], mode)
    got: list[str] = []

    def call() -> None:
        try:
            client.call(path, "slow")
            got.append("reply")
        except NoReply:
            got.append("cut")  # its connection closed with the server

    caller = threading.Thread(target=call, daemon=True)
    caller.start()
    assert started.wait(5)
    server.close(reply_grace=0.1)
    release.set()
    wait_for(lambda: not workers_started_since(before), timeout=10,
             what="the server's workers to end")
    caller.join(5)
    assert got == ["cut"]

# ---------------------------------------------------------------- the I/O thread and batches

def frame(cmd: str, arg: str | None = None) -> bytes:
    return protocol.encode_request(cmd, arg, raw=True)


def answer(s: socket.socket) -> Any:
    return json.loads(read_frame(s))


def echo(cmd: str, arg: Any, conn: Any) -> Any:
    return ["ok", cmd, arg]


def workers_started_since(before: set[threading.Thread]) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "rq1-worker" and t not in before]


@pytest.mark.parametrize("prestart", [0, 2])
def test_workers_are_started_with_the_server_only_as_asked_then_on_demand_and_kept(
        tmp_path: Path, prestart: int) -> None:
    """`prestart_workers` (the queue process asks for none, issue 17): a request finding
    no free worker starts one, and a worker that answered is kept for the next request."""
    before = {t for t in threading.enumerate() if t.name == "rq1-worker"}
    path = str(tmp_path / "s.sock")
    server = Rq1Server(path, echo, prestart_workers=prestart)
    server.start()
    try:
        assert len(workers_started_since(before)) == prestart
        assert client.call(path, "ping", raw=True) == ["ok", "ping", None]
        started = workers_started_since(before)
        assert len(started) == max(1, prestart)
        wait_for(lambda: server._free == len(started), 5, 0.01, "the worker free again")
        assert client.call(path, "ping", raw=True) == ["ok", "ping", None]
        assert workers_started_since(before) == started  # no new thread: it was kept
    finally:
        server.close()


@pytest.mark.parametrize("mode", MODES)
def test_requests_read_in_one_pass_are_answered_as_one_batch(
        tmp_path: Path, connect: Callable[[str], socket.socket], mode: str) -> None:
    """While the batch handler is busy, the requests that arrive wait in the
    kernel; the next pass reads them all and hands them over together.  It runs on
    the I/O thread or, pumped, on the thread that pumps."""
    batches: list[list[str | None]] = []
    threads: set[str] = set()
    first_in = threading.Event()
    release = threading.Event()

    def batch(requests: list[tuple[str, str | None]]) -> list[Any]:
        threads.add(threading.current_thread().name)
        batches.append([arg for _, arg in requests])
        if len(batches) == 1:
            first_in.set()
            release.wait(10)
        return [["ok", arg] for _, arg in requests]

    path = str(tmp_path / "s.sock")
    server = Served(path, echo, mode, batch_cmds={"put"}, batch_handler=batch)
    try:
        first = connect(path)
        first.sendall(frame("put", "a"))
        assert first_in.wait(5)
        others = [connect(path) for _ in range(7)]
        for i, s in enumerate(others):
            s.sendall(frame("put", str(i)))  # queued in the kernel: the I/O thread is busy
        release.set()
        assert answer(first) == ["ok", "a"]
        assert [answer(s) for s in others] == [["ok", str(i)] for i in range(7)]
        assert batches == [["a"], [str(i) for i in range(7)]]
        assert threads == {"test-pump" if mode == "pumped" else "rq1-io"}
        assert client.call(path, "other", raw=True) == ["ok", "other", None]  # not batched
    finally:
        server.close()


@pytest.mark.parametrize("mode", MODES)
def test_a_batch_handler_failure_answers_every_request_and_serving_goes_on(
        tmp_path: Path, mode: str) -> None:
    calls: list[int] = []

    def batch(requests: list[tuple[str, str | None]]) -> list[Any]:
        calls.append(len(requests))
        if len(calls) == 1:
            raise RuntimeError("boom")
        outcomes = {"bad": ProtocolError("bad"), "full": Fail("no room"), "bug": KeyError("x")}
        return [outcomes.get(arg or "", ["ok", arg]) for _, arg in requests]

    path = str(tmp_path / "s.sock")
    server = Served(path, echo, mode, batch_cmds={"put"}, batch_handler=batch)
    try:
        assert client.call(path, "put", "a", raw=True) == ["fail", "internal error"]
        assert client.call(path, "put", "bad", raw=True) == ["fail", "bad request"]
        assert client.call(path, "put", "full", raw=True) == ["fail", "no room"]
        assert client.call(path, "put", "bug", raw=True) == ["fail", "internal error"]
        assert client.call(path, "put", "b", raw=True) == ["ok", "b"]
        assert client.call(path, "ping", raw=True) == ["ok", "ping", None]
    finally:
        server.close()


def test_a_pumped_server_has_no_io_thread_and_workers_hand_it_their_unsent_replies(
        tmp_path: Path) -> None:
    """Pumped, no rq1-io thread starts; a worker's reply that the socket does not take
    at once goes to the pumping thread (the hand-over wakes its fd), which writes it."""
    before = set(threading.enumerate())
    size = 4_000_000  # more than a Unix socket's buffer: the worker cannot send it all
    path = str(tmp_path / "s.sock")
    server = Served(path, lambda cmd, arg, conn: ["ok", "x" * size], "pumped")
    try:
        assert not [t for t in set(threading.enumerate()) - before if t.name == "rq1-io"]
        assert client.call(path, "big") == ["ok", "x" * size]
    finally:
        server.close()


@pytest.mark.parametrize("mode", MODES)
def test_a_slow_client_holds_up_no_one_and_a_frame_may_arrive_in_pieces(
        tmp_path: Path, connect: Callable[[str], socket.socket], mode: str) -> None:
    path = str(tmp_path / "s.sock")
    server = Served(path, echo, mode)
    try:
        slow = connect(path)
        data = frame("status", '{"a":1}')
        slow.sendall(data[:5])                  # half a header, then nothing for now
        assert client.call(path, "ping", raw=True) == ["ok", "ping", None]
        for i in range(5, len(data)):
            slow.sendall(data[i:i + 1])
        assert answer(slow) == ["ok", "status", '{"a":1}']
    finally:
        server.close()


@pytest.mark.parametrize("mode", MODES)
def test_an_incomplete_frame_is_refused_after_the_read_deadline(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        connect: Callable[[str], socket.socket], mode: str) -> None:
    """Pumped, the owner's loop waits no longer than timeout() says: the deadline."""
    monkeypatch.setattr(sockserve, "READ_TIMEOUT", 0.3)
    path = str(tmp_path / "s.sock")
    server = Served(path, echo, mode)
    try:
        stalled = connect(path)
        stalled.sendall(b"rq1 0000")
        t0 = time.monotonic()
        assert answer(stalled) == ["fail", "bad request"]
        assert time.monotonic() - t0 < 5
        half = connect(path)                    # a client that gives up mid-frame
        half.sendall(frame("ping")[:-2])
        half.shutdown(socket.SHUT_WR)
        assert answer(half) == ["fail", "bad request"]
        garbage = connect(path)
        garbage.sendall(b"GET / HTTP/1.0\r\n\r\n")
        assert answer(garbage) == ["fail", "bad request"]
        assert client.call(path, "ping", raw=True) == ["ok", "ping", None]
    finally:
        server.close()


@pytest.mark.parametrize("mode", MODES)
def test_a_handler_that_keeps_the_connection_reads_the_frames_sent_after_the_first(
        tmp_path: Path, connect: Callable[[str], socket.socket], mode: str) -> None:
    """The I/O thread reads no byte past the request's frame: a subscription
    reads the client's later frames itself (S8.8)."""
    def handler(cmd: str, arg: Any, conn: socket.socket) -> Any:
        second = read_frame(conn)
        conn.sendall(protocol.encode_reply(["ok", arg, second.decode()]))
        conn.close()
        return sockserve.KEEP_OPEN

    path = str(tmp_path / "s.sock")
    server = Served(path, handler, mode)
    try:
        s = connect(path)
        s.sendall(frame("subscribe", "x") + frame("send", "y"))  # one write, two frames
        assert answer(s) == ["ok", "x", "send y"]
    finally:
        server.close()


@pytest.mark.parametrize("mode", MODES)
def test_accept_failures_pause_accepting_instead_of_spinning(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, mode: str) -> None:
    """Out of file descriptors (EMFILE), a pending connection keeps the socket
    readable: the I/O thread stops watching it for ACCEPT_PAUSE between tries,
    and answers the client once descriptors are free again (pumped: the owner's
    loop wakes at the pause's end, timeout(), and tick() resumes accepting)."""
    import resource
    path = str(tmp_path / "s.sock")
    server = Served(path, echo, mode)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    opened: list[socket.socket] = []
    try:
        assert client.call(path, "ping", raw=True) == ["ok", "ping", None]
        probe = os.open("/dev/null", os.O_RDONLY)
        os.close(probe)
        caplog.set_level("WARNING", logger="rq.sockserve")
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)  # takes `probe`'s descriptor
        opened.append(s)
        s.settimeout(10)
        resource.setrlimit(resource.RLIMIT_NOFILE, (probe + 1, hard))  # none left
        s.connect(path)  # only now is there a connection to accept
        s.sendall(frame("ping"))
        t0 = time.monotonic()
        deadline = t0 + 10
        while sum("accept failed" in r.message for r in caplog.records) < 3:
            assert time.monotonic() < deadline, "accept was not retried"
            time.sleep(0.01)
        assert time.monotonic() - t0 >= 2 * sockserve.ACCEPT_PAUSE * 0.9  # paused between
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        assert answer(s) == ["ok", "ping", None]
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        for s in opened:
            s.close()
        server.close()


# ---------------------------------------------------------------- bad frames (S7.1)

BAD_REQUEST = ["fail", "bad request"]


def daemon_handler(cmd: str, arg: Any, conn: Any) -> Any:
    """Answers like a daemon: ping -> pong, status -> PAUSE, the rest echoed."""
    return {"ping": ["pong"], "status": ["PAUSE"]}.get(cmd, ["ok", cmd, arg])


@pytest.fixture(scope="module", params=MODES)
def served(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
           ) -> Iterator[str]:
    """One server of each kind shared by the bad-frame tests (none of them changes it):
    its socket."""
    path = str(tmp_path_factory.mktemp("frames") / "s.sock")
    server = Served(path, daemon_handler, request.param)
    yield path
    assert pings(path), "the server stopped answering during the bad-frame tests"
    server.close()


def pings(path: str) -> bool:
    return client.call(path, "ping") == ["pong"]


@pytest.mark.parametrize("header", [
    b"rq2 00000004 ", b"RQ1 00000004 ", b"rq100000004 p", b"GET / HTTP/1.", b"\x00" * 13,
])
def test_s7_1_bad_magic_is_a_bad_request(served: str, header: bytes) -> None:
    assert len(header) == protocol.HEADER_LEN
    assert decode_reply_frame(raw_exchange(served, header)) == BAD_REQUEST
    assert pings(served)


@pytest.mark.parametrize("header", [
    b"rq1 0000000x ", b"rq1 -0000004 ", b"rq1 +0000004 ", b"rq1  0000004 ", b"rq1 00000004x",
    b"rq1 0x000004 ", b"rq1 4 ping   ", b"rq1 \xd9\xa4000000 ", b"rq1 0000 004 ",
])
def test_s7_1_bad_size_field_is_a_bad_request(served: str, header: bytes) -> None:
    assert len(header) == protocol.HEADER_LEN
    assert decode_reply_frame(raw_exchange(served, header)) == BAD_REQUEST
    assert pings(served)


@pytest.mark.parametrize("frame", [b"rq2 00000004 ping", b"rq1 0000000x create_message {}",
                                   b"rq1 99999999 create_message {\"dest\":\"x\"}"])
def test_s7_1_bad_frame_followed_by_more_bytes_is_answered(served: str, frame: bytes) -> None:
    try:
        raw = raw_exchange(served, frame)
    finally:
        assert pings(served)
    assert decode_reply_frame(raw) == BAD_REQUEST


@pytest.mark.parametrize("frame", [
    b"", b"rq1", b"rq1 0000", b"rq1 00000010 ping", b"rq1 00000020 create_message {\"de",
])
def test_s7_1_short_read_with_half_close_is_answered(served: str, frame: bytes) -> None:
    """S7.1: a short read is answered with bad request when a reply can still be sent (the
    client shut down only its write side)."""
    assert decode_reply_frame(raw_exchange(served, frame)) == BAD_REQUEST
    assert pings(served)


def test_s7_1_client_that_closes_early_does_not_hurt_the_daemon(served: str) -> None:
    for frame in (b"rq1 0000", b"rq1 00000100 create_message {", b"rq1 00000004 pi"):
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.connect(served)
            sock.sendall(frame)
        # a client that connects and closes without a byte
        socket.socket(socket.AF_UNIX, socket.SOCK_STREAM).close()
    assert client.call(served, "ping") == ["pong"]
    assert client.call(served, "status") == ["PAUSE"]


def test_s7_1_huge_size_is_refused_without_waiting_for_the_bytes(served: str) -> None:
    """A frame announcing ~100 MB is refused at once: the client keeps its socket open and
    still gets the reply (well before the server's read deadline)."""
    raw = raw_exchange(served, b"rq1 99999999 ", half_close=False, timeout=10)
    assert decode_reply_frame(raw) == BAD_REQUEST
    assert decode_reply_frame(raw_exchange(served, b"rq1 50000000 ")) == BAD_REQUEST
    assert pings(served)


def test_s7_1_one_request_one_reply_then_the_server_closes(served: str) -> None:
    """Without half-closing, the client still reads exactly one frame, then EOF."""
    raw = raw_exchange(served, protocol.encode_request("ping"), half_close=False)
    assert decode_reply_frame(raw) == ["pong"]


def test_s7_1_invalid_utf8_payload_is_a_bad_request(served: str) -> None:
    frame = protocol.encode_frame(b"create_message {\"dest\": \"\xff\xfe\"}")
    assert decode_reply_frame(raw_exchange(served, frame)) == BAD_REQUEST


@settings(max_examples=150, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=300).filter(lambda b: not b.startswith(b"rq1 ")))
def test_s7_1_random_garbage_is_a_bad_request(served: str, garbage: bytes) -> None:
    """Any garbage is answered with a bad request (the server drains what it did not read
    before closing, so no reply is lost to a reset) and never hurts the daemon."""
    assert decode_reply_frame(raw_exchange(served, garbage)) == BAD_REQUEST
    assert client.call(served, "ping") == ["pong"]


@pytest.mark.parametrize("mode", MODES)
def test_over_the_unsent_cap_deaf_clients_are_dropped_and_readers_get_whole_replies(
        tmp_path: Path, mode: str) -> None:
    """Issue 13 part 5: replies that clients do not read are capped (`max_unsent`, here
    1 MiB): over the cap the connections that take nothing are closed, their frames cut
    short; a client that reads gets its whole reply, even one larger than the cap."""
    sizes = {"small": 300_000, "huge": 3_000_000}
    path = str(tmp_path / "s.sock")
    server = Served(path, lambda cmd, arg, conn: ["ok", "x" * sizes[cmd]], mode,
                    max_unsent=1 << 20)
    deaf = []
    try:
        for _ in range(8):
            sock = socket.socket(socket.AF_UNIX)
            sock.connect(path)
            sock.sendall(protocol.encode_request("small"))
            assert select.select([sock], [], [], 10)[0]  # its reply started; never read
            deaf.append(sock)
            assert client.call(path, "huge") == ["ok", "x" * sizes["huge"]]
        frame = len(protocol.encode_reply(["ok", "x" * sizes["small"]]))
        got = []
        for sock in deaf:
            sock.settimeout(10)
            data = b""
            while chunk := sock.recv(1 << 20):
                data += chunk
            got.append(len(data))
    finally:
        for sock in deaf:
            sock.close()
        server.close()
    assert sum(n == frame for n in got) <= 4, got   # at most the cap's worth kept whole
    assert sum(n < frame for n in got) >= 4, got    # the others cut short, never padded
