"""Talks to the daemons' rq1 sockets: one request, one reply (S7.1).

Owns the client side of the framing and the socket paths of a root, and
`Connection`, several requests over one kept connection (rq.sockread).  Raises
ConnectError when nothing answers, so callers can print S19.3's texts.
"""

from __future__ import annotations

import _thread
import os
import time

import _socket  # socket.py's wrapper classes and enums cost a shell loop ~5 ms (issue 15)

from rq import protocol
from rq.errors import ConnectError, NoReply, ProtocolError

TYPE_CHECKING = False  # typing is not imported at run time (issue 15)
if TYPE_CHECKING:
    import socket
    from typing import Any



def recv_exact(conn: _socket.socket, size: int) -> bytes:
    chunks = []
    while size:
        chunk = conn.recv(min(size, 1 << 20))
        if not chunk:
            raise ProtocolError("bad request")
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def read_frame(conn: _socket.socket) -> bytes:
    size = protocol.parse_header(recv_exact(conn, protocol.HEADER_LEN))
    return recv_exact(conn, size)

def mgr_socket(root: str) -> str:
    return os.path.join(root, "config", "queuemgr.sock")


def queue_socket(root: str, name: str) -> str:
    return os.path.join(root, "queue", name, "queue.sock")


SUN_PATH_MAX = 107  # Linux sockaddr_un.sun_path holds 108 bytes with the NUL


def queue_socket_problem(root: str, name: str) -> str | None:
    """Why queue `name` of `root` could never bind its socket, or None: the
    path must fit in sun_path, so how long a name may be depends on the root
    (issue 13, D7: such a queue used to be created, then crash-loop)."""
    path = queue_socket(root, name)
    size = len(os.fsencode(path))
    if size <= SUN_PATH_MAX:
        return None
    return (f"queue name too long for this RQ root: its socket {path} would be {size} bytes, "
            f"a Unix socket path holds at most {SUN_PATH_MAX}")


def call(path: str, cmd: str, arg: Any = None, *, raw: bool = False,
         timeout: float | None = 60.0) -> Any:
    """Send one request to the socket at `path` and return the decoded reply."""
    frame = protocol.encode_request(cmd, arg, raw=raw)
    # the C socket type: the same methods and errors, without importing socket.py
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        try:
            sock.connect(path)
        except OSError as exc:
            raise ConnectError(f"cannot connect to {path}: {exc.strerror or exc}") from exc
        try:
            sock.sendall(frame)
            payload = read_frame(sock)
        except (OSError, ProtocolError) as exc:
            raise NoReply(f"no reply from {path}: {exc}") from exc
    finally:
        sock.close()
    try:
        return protocol.loads(payload)
    except ValueError as exc:
        raise ConnectError(f"bad reply from {path}") from exc


KEEP_IDLE = 10.0  # s a kept connection is reused after its last reply (the server keeps it 30)
TAKES_CONNECTION = frozenset({"subscribe", "create_messages"})  # the reply is not the end


class Connection:
    """Requests to the socket at `path`, one at a time over one kept connection
    (`keep`, rq.sockread), which saves each request the connect, accept and close of
    a connection of its own (issue 15).  Opened at the first call, and again after an
    error, KEEP_IDLE s unused, or a fork.  A call made while another thread's is in
    progress, and every call to a server that does not keep connections, goes on a
    connection of its own (call()).  A send that fails on a connection used before is
    sent once more on a new one: the server closed the old one before reading it (a
    restart).  Commands that take the connection over are not sent here."""

    def __init__(self, path: str, timeout: float | None = 60.0) -> None:
        self.path, self.timeout = path, timeout
        self.sock: _socket.socket | None = None
        self.pid = 0
        self.last = 0.0       # monotonic time of the last reply
        self.keeps = True     # False once the server answered `keep` with anything but ok
        self.lock = _thread.allocate_lock()

    def call(self, cmd: str, arg: Any = None, *, raw: bool = False) -> Any:
        if cmd in TAKES_CONNECTION:
            raise ValueError(f"{cmd} takes its connection over: not for a kept connection")
        if not self.keeps or not self.lock.acquire(blocking=False):
            return call(self.path, cmd, arg, raw=raw, timeout=self.timeout)
        try:
            frame = protocol.encode_request(cmd, arg, raw=raw)
            sock, reused = self._socket()
            if sock is None:
                return call(self.path, cmd, arg, raw=raw, timeout=self.timeout)
            try:
                sock.sendall(frame)
            except OSError:
                self.close()
                if not reused:
                    raise
                sock, _ = self._socket()
                if sock is None:
                    return call(self.path, cmd, arg, raw=raw, timeout=self.timeout)
                sock.sendall(frame)
            payload = read_frame(sock)
            self.last = time.monotonic()
        except (OSError, ProtocolError) as exc:
            self.close()
            raise NoReply(f"no reply from {self.path}: {exc}") from exc
        finally:
            self.lock.release()
        try:
            return protocol.loads(payload)
        except ValueError as exc:
            self.close()
            raise ConnectError(f"bad reply from {self.path}") from exc

    def _socket(self) -> tuple[_socket.socket | None, bool]:
        """The kept connection and whether it served before; opened (and `keep` sent)
        when there is none fit for use; None when the server does not keep it."""
        if self.sock is not None and (self.pid != os.getpid()
                                      or time.monotonic() - self.last > KEEP_IDLE):
            self.close()
        if self.sock is not None:
            return self.sock, True
        sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self.path)
        except OSError as exc:
            sock.close()
            raise ConnectError(f"cannot connect to {self.path}: {exc.strerror or exc}") from exc
        try:
            sock.sendall(protocol.encode_request(protocol.KEEP_CMD))
            kept = protocol.loads(read_frame(sock)) == protocol.KEPT
        except (OSError, ProtocolError, ValueError) as exc:  # nothing of the request was sent
            sock.close()
            raise ConnectError(f"no answer to keep from {self.path}: {exc}") from exc
        if not kept:  # an older server: one request per connection (S7.1)
            sock.close()
            self.keeps = False
            return None, False
        self.sock, self.pid = sock, os.getpid()
        return sock, False

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None

    def __del__(self) -> None:  # opened behind the caller's back: closed without a warning
        self.close()


def call_queue(root: str, name: str, cmd: str, arg: Any = None, **kw: Any) -> Any:
    return call(queue_socket(root, name), cmd, arg, **kw)


def call_mgr(root: str, cmd: str, arg: Any = None, **kw: Any) -> Any:
    return call(mgr_socket(root), cmd, arg, **kw)


class Subscription:
    """An S8.8 event stream on the manager socket: `next()` gives each frame's
    decoded payload (events with `topic`, `overflow` records, and the
    `["ok", patterns]` answers to `send`), None when `timeout` passes first."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._buf = b""

    def _frame(self) -> bytes | None:
        if len(self._buf) < protocol.HEADER_LEN:
            return None
        size = protocol.parse_header(self._buf[:protocol.HEADER_LEN])
        end = protocol.HEADER_LEN + size
        if len(self._buf) < end:
            return None
        payload, self._buf = self._buf[protocol.HEADER_LEN:end], self._buf[end:]
        return payload

    def next(self, timeout: float | None = None, wake: int | None = None) -> Any:
        """The next payload; None on timeout, or when the pipe `wake` became readable (a
        signal.set_wakeup_fd pipe: a signal that came just before the wait would otherwise
        leave it blocked); ConnectError when the stream ends."""
        self.sock.settimeout(timeout)
        while True:
            try:
                payload = self._frame()
            except ProtocolError as exc:
                raise ConnectError("bad frame from rq-mgr") from exc
            if payload is not None:
                try:
                    return protocol.loads(payload)
                except ValueError as exc:
                    raise ConnectError("bad frame from rq-mgr") from exc
            if wake is not None:
                import select
                ready = select.select([self.sock.fileno(), wake], [], [], timeout)[0]
                if wake in ready:
                    try:
                        os.read(wake, 512)
                    except BlockingIOError:
                        pass
                    return None
                if not ready:
                    return None
            try:
                data = self.sock.recv(1 << 16)
            except TimeoutError:
                return None
            except OSError as exc:
                raise ConnectError(f"event stream ended: {exc.strerror or exc}") from exc
            if not data:
                raise ConnectError("event stream ended")
            self._buf += data

    def send(self, cmd: str, arg: Any) -> None:
        """An in-stream `subscribe` or `unsubscribe` (its answer comes via next())."""
        self.sock.sendall(protocol.encode_request(cmd, arg))

    def ack(self, pos: str) -> None:
        """Acknowledge a cursor stream's event (issue 18); answered in-stream
        by `["ok","acked",<position>]`."""
        self.send("ack", {"pos": pos})

    def buffered(self) -> bool:
        """Whether a whole frame is already here (next() would not wait)."""
        return len(self._buf) >= protocol.HEADER_LEN and \
            len(self._buf) >= protocol.HEADER_LEN + protocol.parse_header(
                self._buf[:protocol.HEADER_LEN])

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def subscribe(root: str, patterns: list[str], since: float | None = None, *,
              timeout: float = 30.0, cursor: str | None = None,
              last_id: str | None = None) -> Subscription:
    """Open a subscription (S8.8), of the named `cursor` when given (issue 18:
    `patterns` may then be empty for an existing cursor; `last_id` acks the
    event of that token first).  Raises ConnectError when rq-mgr does not
    answer, Fail(reason) when it refuses."""
    from rq.errors import Fail
    arg: dict[str, Any] = {"patterns": patterns}
    if since is not None:
        arg["since"] = since
    if cursor is not None:
        arg["cursor"] = cursor
        if last_id:
            arg["last_id"] = last_id
    import socket
    path = mgr_socket(root)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        sock.connect(path)
    except OSError as exc:
        sock.close()
        raise ConnectError(f"cannot connect to {path}: {exc.strerror or exc}") from exc
    sub = Subscription(sock)
    try:
        sub.send("subscribe", arg)
        reply = sub.next(timeout)
    except (OSError, ConnectError) as exc:
        sub.close()
        raise ConnectError(f"no reply from {path}: {exc}") from exc
    if reply != ["ok", "subscribed"]:
        sub.close()
        if isinstance(reply, list) and len(reply) >= 2 and reply[0] == "fail":
            raise Fail(str(reply[1]))
        raise ConnectError(f"no reply from {path}" if reply is None else
                           f"unexpected reply from {path}: {protocol.dumps(reply)}")
    return sub
