"""Kept connections (rq/sockread.py, issue 15, an extension of S7.1): after `keep`, one
connection carries request after request, each answered in turn, on both kinds of rq1
server (I/O thread and pumped); and the client's side, rq.client.Connection, and the
producer API's use of it against a real queue process."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from rqtest import decode_reply_frame, raw_exchange, wait_for
from test_sockserve import MODES, Served, answer, frame

from rq import client, protocol, sockserve
from rq.sockserve import KEEP_OPEN

BAD_REQUEST = ["fail", "bad request"]


@pytest.fixture(params=MODES)
def served(request: pytest.FixtureRequest, tmp_path: Path
           ) -> Iterator[tuple[str, list[socket.socket]]]:
    """A server whose batch command is `put` and whose worker commands echo; `big` is a
    4 MB reply (more than the socket takes at once); `take` keeps the connection and
    answers each later frame itself.  Yields its path and the connections its
    handler saw, in order."""
    seen: list[socket.socket] = []

    def handler(cmd: str, arg: Any, conn: socket.socket) -> Any:
        seen.append(conn)
        if cmd == "big":
            return ["ok", "x" * 4_000_000]
        if cmd == "take":
            conn.sendall(protocol.encode_reply(["ok", "taken"]))
            conn.sendall(protocol.encode_reply(["ok", "still mine"]))
            conn.close()
            return KEEP_OPEN
        return ["ok", cmd, arg]

    def batch(requests: list[tuple[str, str | None]]) -> list[Any]:
        return [["ok", "batched", arg] for _, arg in requests]

    path = str(tmp_path / "s.sock")
    server = Served(path, handler, request.param, batch_cmds={"put"}, batch_handler=batch)
    try:
        yield path, seen
    finally:
        server.close()


def test_after_keep_one_connection_carries_every_kind_of_request(
        served: tuple[str, list[socket.socket]], connect: Callable[[str], socket.socket]
) -> None:
    path, seen = served
    s = connect(path)
    s.sendall(frame("keep"))
    assert answer(s) == ["ok"]
    for i in range(3):
        s.sendall(frame("put", str(i)))          # answered by the I/O thread's batch
        assert answer(s) == ["ok", "batched", str(i)]
        s.sendall(frame("echo", str(i)))         # answered by a worker
        assert answer(s) == ["ok", "echo", str(i)]
    s.sendall(frame("big"))                      # written as the client reads
    assert answer(s) == ["ok", "x" * 4_000_000]
    s.sendall(frame("put", "after"))
    assert answer(s) == ["ok", "batched", "after"]
    assert len(seen) == 4 and all(c is seen[0] for c in seen)  # one accepted connection


def test_pipelined_requests_are_answered_in_order_one_at_a_time(
        served: tuple[str, list[socket.socket]], connect: Callable[[str], socket.socket]
) -> None:
    """Sent at once, batch and worker requests mixed: the next frame is read only once
    the last reply is written, so the replies come in request order."""
    path, _ = served
    s = connect(path)
    s.sendall(frame("keep") + frame("put", "a") + frame("echo", "b") + frame("put", "c")
              + frame("big") + frame("echo", "d"))
    assert [answer(s) for _ in range(6)] == [
        ["ok"], ["ok", "batched", "a"], ["ok", "echo", "b"], ["ok", "batched", "c"],
        ["ok", "x" * 4_000_000], ["ok", "echo", "d"]]


def test_a_client_that_closes_between_requests_gets_no_refusal(
        served: tuple[str, list[socket.socket]]) -> None:
    """Without `keep` an empty request is refused (S7.1); after a reply on a kept
    connection, the client's close is a clean end: no frame follows the last reply."""
    path, _ = served
    raw = raw_exchange(path, frame("keep") + frame("echo", "x"))
    first = protocol.HEADER_LEN + protocol.parse_header(raw[:protocol.HEADER_LEN])
    assert decode_reply_frame(raw[:first]) == ["ok"]
    assert decode_reply_frame(raw[first:]) == ["ok", "echo", "x"]
    assert decode_reply_frame(raw_exchange(path, b"")) == BAD_REQUEST
    assert client.call(path, "ping") == ["ok", "ping", None]


def test_a_bad_frame_on_a_kept_connection_is_refused_and_ends_it(
        served: tuple[str, list[socket.socket]], connect: Callable[[str], socket.socket]
) -> None:
    path, _ = served
    s = connect(path)
    s.sendall(frame("keep"))
    assert answer(s) == ["ok"]
    s.sendall(b"rq2 00000004 ping")
    assert answer(s) == BAD_REQUEST
    assert s.recv(1) == b""
    assert client.call(path, "ping") == ["ok", "ping", None]


def test_a_command_that_takes_a_kept_connection_owns_it(
        served: tuple[str, list[socket.socket]], connect: Callable[[str], socket.socket]
) -> None:
    path, _ = served
    s = connect(path)
    s.sendall(frame("keep") + frame("echo") + frame("take"))
    assert [answer(s) for _ in range(4)] == [
        ["ok"], ["ok", "echo", None], ["ok", "taken"], ["ok", "still mine"]]
    assert s.recv(1) == b""


@pytest.mark.parametrize("mode", MODES)
def test_an_idle_kept_connection_is_closed_quietly_a_begun_frame_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        connect: Callable[[str], socket.socket], mode: str) -> None:
    """READ_TIMEOUT after its last reply: closed without a reply when nothing of a next
    request came; refused, as any slow frame, when one had begun."""
    monkeypatch.setattr(sockserve, "READ_TIMEOUT", 0.3)
    path = str(tmp_path / "s.sock")
    server = Served(path, lambda cmd, arg, conn: ["ok", cmd], mode)
    try:
        idle, begun = connect(path), connect(path)
        for s in (idle, begun):
            s.sendall(frame("keep") + frame("echo"))
            assert [answer(s) for _ in range(2)] == [["ok"], ["ok", "echo"]]
        begun.sendall(frame("echo")[:5])
        t0 = time.monotonic()
        assert idle.recv(1) == b""
        assert answer(begun) == BAD_REQUEST
        assert time.monotonic() - t0 < 5
    finally:
        server.close()


@pytest.mark.parametrize("mode", MODES)
def test_a_stop_closes_the_kept_connections(
        tmp_path: Path, connect: Callable[[str], socket.socket], mode: str) -> None:
    path = str(tmp_path / "s.sock")
    server = Served(path, lambda cmd, arg, conn: ["ok", cmd], mode)
    s = connect(path)
    s.sendall(frame("keep"))
    assert answer(s) == ["ok"]
    server.close()
    assert s.recv(1) == b""


# ---------------------------------------------------------------- rq.client.Connection
def test_a_connection_keeps_one_socket_and_opens_another_after_a_restart_or_idle(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = str(tmp_path / "s.sock")
    seen: list[socket.socket] = []

    def handler(cmd: str, arg: Any, conn: socket.socket) -> Any:
        seen.append(conn)
        return ["ok", cmd, arg]

    server = Served(path, handler, "thread")
    conn = client.Connection(path)
    try:
        replies = [conn.call("echo", i) for i in range(3)]
        assert replies == [["ok", "echo", str(i)] for i in range(3)]
        assert len(seen) == 3 and seen[1] is seen[0] and seen[2] is seen[0]
        server.close()                           # its restart: the kept socket is dead
        server = Served(path, handler, "pumped")
        assert conn.call("echo", "again", raw=True) == ["ok", "echo", "again"]  # sent on a new one
        assert seen[3] is not seen[0]
        monkeypatch.setattr(client, "KEEP_IDLE", 0.0)
        assert conn.call("echo", "idle", raw=True) == ["ok", "echo", "idle"]
        assert seen[4] is not seen[3]
        with pytest.raises(ValueError, match="takes its connection over"):
            conn.call("subscribe", [])
    finally:
        conn.close()
        server.close()


def test_a_call_while_another_threads_is_in_progress_goes_on_its_own_connection(
        tmp_path: Path) -> None:
    path = str(tmp_path / "s.sock")
    seen: list[socket.socket] = []
    release = threading.Event()

    def handler(cmd: str, arg: Any, conn: socket.socket) -> Any:
        seen.append(conn)
        if cmd == "slow":
            release.wait(10)
        return ["ok", cmd]

    server = Served(path, handler, "thread")
    conn = client.Connection(path)
    got: list[Any] = []
    slow = threading.Thread(target=lambda: got.append(conn.call("slow")))
    try:
        assert conn.call("first") == ["ok", "first"]
        slow.start()
        wait_for(lambda: len(seen) == 2, what="the slow request to arrive")
        assert conn.call("fast") == ["ok", "fast"]   # not queued behind "slow"
        assert not got
        release.set()
        slow.join(10)
        assert got == [["ok", "slow"]]
        assert seen[1] is seen[0] and seen[2] is not seen[0]
        assert conn.call("after") == ["ok", "after"] and seen[3] is seen[0]
    finally:
        release.set()
        conn.close()
        server.close()


def test_a_forked_child_opens_its_own_connection(tmp_path: Path) -> None:
    path = str(tmp_path / "s.sock")
    seen: list[socket.socket] = []
    server = Served(path, lambda cmd, arg, c: seen.append(c) or ["ok", os.getpid()], "thread")
    conn = client.Connection(path)
    try:
        assert conn.call("pid") == ["ok", os.getpid()]
        child = os.fork()
        if child == 0:  # pragma: no cover - the child process
            ok = conn.call("pid") == ["ok", os.getppid()] and conn.pid == os.getpid()
            os._exit(0 if ok else 1)
        _, status = os.waitpid(child, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert conn.call("pid") == ["ok", os.getpid()]
        assert len(seen) == 3 and seen[2] is seen[0] and seen[1] is not seen[0]
    finally:
        conn.close()
        server.close()


def test_a_server_without_keep_gets_one_request_per_connection(tmp_path: Path) -> None:
    """A server that answers `keep` with anything but ok (an RQ from before it, or
    another rq1 server) gets every request on a connection of its own (S7.1)."""
    path = str(tmp_path / "old.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(8)
    asked: list[str] = []

    def old_server() -> None:
        while True:
            try:
                s, _ = listener.accept()
            except OSError:
                return
            with s:
                cmd, _ = protocol.split_request(client.read_frame(s))
                asked.append(cmd)
                s.sendall(protocol.encode_reply(["error"] if cmd == "keep" else ["ok", cmd]))

    thread = threading.Thread(target=old_server, daemon=True)
    thread.start()
    conn = client.Connection(path)
    try:
        assert [conn.call("one"), conn.call("two")] == [["ok", "one"], ["ok", "two"]]
        assert asked == ["keep", "one", "two"] and not conn.keeps
    finally:
        listener.shutdown(socket.SHUT_RDWR)
        listener.close()
        thread.join(5)


# ---------------------------------------------------------------- the producer API
def test_a_client_keeps_its_connection_to_a_queue_across_sends_and_a_restart(
        tmp_path: Path) -> None:
    """rq.Client against a real rq-mgr: the first request to a queue goes on a connection
    of its own, the later ones on one kept connection, which a restart of the queue
    process ends; the next send goes on a new one."""
    from rqtest import make_queue
    from webtest import build_root, running

    from rq import Client
    root = build_root(tmp_path)
    make_queue(root, "held", script="/bin/true")
    (root / "config" / "held.pause").write_text("")
    with running(root), Client(str(root)) as rq:
        sock = client.queue_socket(str(root), "held")
        rq.send("held")
        assert rq.transport.conns == {sock: None}     # type: ignore[union-attr]
        rq.send("held")
        kept = rq.transport.conns[sock]               # type: ignore[union-attr]
        assert kept is not None and kept.sock is not None
        first = kept.sock
        rq.send("held")
        assert kept.sock is first
        pid = _queue_pid(root, "held")
        assert client.call_mgr(str(root), "restart_queue", "held", raw=True)[0] == "ok"
        wait_for(lambda: _queue_pid(root, "held") not in (None, pid), timeout=30)
        rq.send("held")
        assert kept.sock is not None and kept.sock is not first
        assert client.call_queue(str(root), "held", "num_messages")["que"] == 4
    assert kept.sock is None  # closed at the with's end


def _queue_pid(root: Path, name: str) -> Any:
    """The pid of queue `name`'s process once it is RUNNING (rq-mgr's `status`, S7.2)."""
    child = client.call_mgr(str(root), "status")[1]["queues"][name]
    return child["pid"] if child["state"] == "RUNNING" else None


def test_a_client_of_many_queues_keeps_at_most_keep_max_connections_open(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The least recently used kept connection is closed before another opens; a queue
    whose connection was closed gets a new one at its next request."""
    from rq import transports
    monkeypatch.setattr(transports, "KEEP_MAX", 2)
    root, servers = tmp_path / "root", []
    try:
        for name in ("q1", "q2", "q3"):
            (root / "queue" / name).mkdir(parents=True)
            (root / "queue" / name / "config.json").write_text("{}")
            servers.append(Served(client.queue_socket(str(root), name),
                                  lambda cmd, arg, c: ["ok", cmd], "thread"))
        local = transports.LocalTransport(str(root))

        def open_names() -> list[str]:
            return [Path(p).parent.name for p, c in local.conns.items()
                    if c is not None and c.sock is not None]

        for name in ("q1", "q1", "q2", "q2"):
            assert local.queue(name, "ping") == ["ok", "ping"]
        assert open_names() == ["q1", "q2"]
        local.queue("q1", "ping")                 # q1 now the most recently used
        for _ in range(2):
            local.queue("q3", "ping")
        assert open_names() == ["q1", "q3"]       # q2 closed, the least recently used
        local.queue("q2", "ping")
        assert open_names() == ["q3", "q2"]
        local.close()
        assert open_names() == []
    finally:
        for server in servers:
            server.close()
