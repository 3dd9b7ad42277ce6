"""The rq1 Unix-socket server shared by the manager and queue processes (S7.1).

Owns: binding the socket (stale file unlinked, mode 0660), accepting
connections, one thread per connection so a slow client or a waiting request
never blocks another, frame reading with a deadline, and turning every framing
error into ["fail","bad request"].  It knows nothing about commands: a handler
callable maps (cmd, raw_arg) to a JSON-able reply.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from rq import protocol
from rq.errors import Fail, ProtocolError

log = logging.getLogger(__name__)

READ_TIMEOUT = 30.0
SPARE_WORKERS = 4
REPLY_GRACE = 2.0  # close() waits this long at most for replies being written


BAD_REQUEST = ["fail", "bad request"]


def _drain(conn: socket.socket, limit: float = 1.0) -> None:
    """After refusing a frame, read off what the client still sends before
    closing: closing a socket with unread input resets the connection on
    Linux, and the client would lose the reply (S7.1)."""
    try:
        conn.shutdown(socket.SHUT_WR)
        conn.settimeout(limit)
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline and conn.recv(65536):
            pass
    except OSError:
        pass


class KeepOpen:
    """Returned by a handler that took over the connection (e.g. subscribe)."""


KEEP_OPEN = KeepOpen()
Handler = Callable[[str, "str | None", socket.socket], Any]


def recv_exact(conn: socket.socket, size: int) -> bytes:
    chunks = []
    while size:
        chunk = conn.recv(min(size, 1 << 20))
        if not chunk:
            raise ProtocolError("bad request")
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def read_frame(conn: socket.socket) -> bytes:
    size = protocol.parse_header(recv_exact(conn, protocol.HEADER_LEN))
    return recv_exact(conn, size)


class Rq1Server:
    """Serve `handler` on a Unix socket at `path` from background threads."""

    def __init__(self, path: str, handler: Handler) -> None:
        self.path = path
        self.handler = handler
        self._sock: socket.socket | None = None

    def start(self) -> None:
        if os.path.lexists(self.path):
            os.unlink(self.path)  # stale socket from a crashed owner (S2.2)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o117)  # created 0660 (S7.1)
        try:
            sock.bind(self.path)
        finally:
            os.umask(old)
        sock.listen(512)
        self._sock = sock
        self._spare_lock = threading.Lock()
        self._idle = 0
        self._busy = 0                       # connections being answered
        self._busy_cond = threading.Condition()
        for _ in range(SPARE_WORKERS):
            self._add_worker()

    def close(self, reply_grace: float = REPLY_GRACE) -> None:
        """Stop accepting, then wait (at most `reply_grace` s) for the replies
        being written, so e.g. the "ok" of `shutdown` reaches its client
        before the process exits."""
        sock, self._sock = self._sock, None
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass
            deadline = time.monotonic() + reply_grace
            with self._busy_cond:
                while self._busy and time.monotonic() < deadline:
                    self._busy_cond.wait(max(0.0, deadline - time.monotonic()))

    def _add_worker(self) -> None:
        with self._spare_lock:
            self._idle += 1
        threading.Thread(target=self._worker, name="rq1-worker", daemon=True).start()

    def _worker(self) -> None:
        """Accept and serve connections.  Workers call accept() themselves (no
        hand-off between threads); when the last idle worker takes a
        connection it starts another, so a slow client or a long request
        never blocks the others, and surplus workers retire."""
        while self._sock is not None:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                if self._sock is None:
                    break
                continue
            with self._spare_lock:
                self._idle -= 1
                need_more = self._idle == 0
            if need_more:
                self._add_worker()
            self._serve(conn)
            with self._spare_lock:
                if self._idle >= SPARE_WORKERS:
                    return  # enough spare workers: retire
                self._idle += 1
        with self._spare_lock:
            self._idle -= 1

    def _serve(self, conn: socket.socket) -> None:
        keep = False
        with self._busy_cond:
            self._busy += 1
        try:
            conn.settimeout(READ_TIMEOUT)
            reply = self._dispatch(conn)
            if reply is KEEP_OPEN:
                keep = True
                return
            conn.sendall(protocol.encode_reply(reply))
            if reply == BAD_REQUEST:
                _drain(conn)
        except OSError:
            pass  # client went away; nothing to answer
        finally:
            if not keep:
                conn.close()
            with self._busy_cond:
                self._busy -= 1
                self._busy_cond.notify_all()

    def _dispatch(self, conn: socket.socket) -> Any:
        try:
            cmd, arg = protocol.split_request(read_frame(conn))
        except (ProtocolError, socket.timeout):
            return BAD_REQUEST
        try:
            return self.handler(cmd, arg, conn)
        except ProtocolError:
            return ["fail", "bad request"]
        except Fail as exc:
            return ["fail", str(exc)]
        except Exception:  # a bug must not take the daemon down (S2.6)
            log.exception("request %s failed", cmd)
            return ["fail", "internal error"]
