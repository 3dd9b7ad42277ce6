"""rq/builtin/jobhttp.py, the builtin jobs' HTTP client (SPEC S12), against a real local server:
a kept-alive connection is reused, and one the server closed while idle is replaced before a
request is sent on it (the relay would otherwise count a spurious failure and resend)."""

from __future__ import annotations

import socket
import threading

import pytest

from rq.builtin import jobhttp


class Server:
    """HTTP/1.1 on a loopback port: answers `ok` to each request; with `close_after_one`
    it closes each connection after its first reply without saying so (no Connection:
    close), as a server whose keep-alive timeout ran out does."""

    def __init__(self, close_after_one: bool) -> None:
        self.close_after_one = close_after_one
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.accepts = 0
        self.closed = threading.Event()
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepts += 1
            with conn:
                buf = b""
                while True:
                    while b"\r\n\r\n" not in buf:
                        chunk = conn.recv(65536)
                        if not chunk:
                            break
                        buf += chunk
                    if b"\r\n\r\n" not in buf:
                        break
                    _, _, buf = buf.partition(b"\r\n\r\n")
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                    if self.close_after_one:
                        break
            self.closed.set()

    def stop(self) -> None:
        self.sock.close()


@pytest.fixture
def client():
    c = jobhttp.Client(None, 5.0, 5.0)
    yield c
    c.close()


@pytest.mark.parametrize("close_after_one, accepts", [(False, 1), (True, 2)],
                         ids=["kept-alive", "closed-while-idle"])
def test_a_second_request_reuses_or_replaces_the_connection(client, close_after_one: bool,
                                                            accepts: int) -> None:
    """A kept-alive connection carries the next request; one the server closed while idle is
    replaced (without the idle check, the request goes out on the closed connection and fails
    with RemoteDisconnected)."""
    server = Server(close_after_one)
    try:
        url = f"http://127.0.0.1:{server.port}/ping"
        assert client.get(url) == (200, b"ok")
        if close_after_one:
            assert server.closed.wait(10), "the server did not close the connection"
        assert client.get(url) == (200, b"ok")
        assert server.accepts == accepts
    finally:
        server.stop()
