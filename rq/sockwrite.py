"""Replies the rq1 server's clients have not read yet, and the cap on their bytes.

Owns: the replies that a socket did not take at once (rq/sockserve.py hands them
over), writing them as their clients read, their deadline, and the cap on the bytes
they hold (issue 13 part 5, S7.1).  Used by the server's I/O thread only (pumped: the
thread that pumps it); it must not read requests or call handlers.

Over the cap the connections that do not read are dropped: first those whose client
has read nothing (none of what the worker's first send wrote, by the kernel's count of
unread bytes, and no later send took bytes), oldest hand-over first, then those that
read once but took nothing for STALLED seconds, longest without progress first.  Each is
offered its next chunk, and one whose socket takes nothing (its buffer full, its
client not reading) is closed.  The reply just added is spared until the next one
comes, so a single reply above the cap still reaches a client that reads it.  A
reply that moves is never dropped: a client that reads never gets a cut reply, even
when the scheduler stops it for a moment while a flood of deaf clients comes in
(ordering by the last progress alone dropped such a reader on a loaded CI host).  A
dropped client sees its frame end short, which every rq1 client reports as an error
(the frame carries its length).  The bound on memory held is therefore the cap, plus
the replies read within STALLED seconds, plus the newest reply; a reply still ends at
its deadline however slowly it is read.  One log line when dropping starts, one when
the total is back under half the cap.

Also `drain_input`, for a worker that refused a frame: what its client still sends is
read off before the close, so that the refusal is not lost to a reset.
"""

from __future__ import annotations

import fcntl
import logging
import selectors
import socket
import struct
import sys
import termios
import time
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger("rq.sockserve")

MAX_UNSENT = 32 << 20  # bytes of replies not yet taken by their clients, all connections
SEND_CHUNK = 1 << 18
STALLED = 5.0  # seconds without progress after which a reply that moved may be dropped


@dataclass
class Writing:
    """A reply written as its client reads; `size` bytes held until it ends."""
    conn: socket.socket
    data: memoryview
    deadline: float
    progress: float            # when a send last took bytes (or the hand-over)
    size: int
    moved: bool = False        # the client read some of it: it is a reader
    kept: bool = False         # once written, the connection waits for a next request


def unread(conn: socket.socket) -> int:
    """The bytes written to Unix socket `conn` that its peer has not read (SIOCOUTQ);
    the kernel counts each buffer's overhead too, so it never counts short."""
    try:
        got = fcntl.ioctl(conn.fileno(), termios.TIOCOUTQ, b"\0" * 4)
    except OSError:
        return sys.maxsize  # unknown: the client counts as not reading
    return struct.unpack("i", got)[0]


class UnsentReplies:
    """The replies being written by the I/O thread that owns `sel`; `done()` is called once
    per reply ended (sent, dropped, expired or the client gone)."""

    def __init__(self, sel: selectors.BaseSelector, done: Callable[[], None],
                 max_unsent: int = MAX_UNSENT, timeout: float = 30.0,
                 stalled: float = STALLED,
                 rearm: Callable[[socket.socket], None] | None = None) -> None:
        self.sel, self.done, self.rearm = sel, done, rearm
        self.max_unsent, self.timeout, self.stalled = max_unsent, timeout, stalled
        self.writing: dict[int, Writing] = {}
        self.unsent = 0
        self.shedding, self.dropped = False, 0

    def add(self, conn: socket.socket, data: bytes, sent: int, kept: bool = False) -> None:
        """Write the rest of `data` (`sent` bytes went already) as `conn` reads; then
        close `conn`, or, `kept`, hand it to `rearm` for its next request."""
        now = time.monotonic()
        w = Writing(conn, memoryview(data)[sent:], now + self.timeout, now, len(data),
                    moved=sent > unread(conn),  # a client reading while the worker wrote
                    kept=kept)
        self.writing[conn.fileno()] = w
        self.unsent += w.size
        self.sel.register(conn, selectors.EVENT_WRITE, w)
        self.enforce_cap(w)

    def write(self, w: Writing) -> None:
        """`w`'s socket is writable: send the next chunk."""
        try:
            n = w.conn.send(w.data[:SEND_CHUNK])
        except (BlockingIOError, InterruptedError):
            return
        except OSError:  # the client went away
            self.end(w)
            return
        w.data, w.progress = w.data[n:], time.monotonic()
        w.moved = w.moved or n > 0
        if not w.data:
            self.end(w, written=True)

    def end(self, w: Writing, written: bool = False) -> None:
        self.sel.unregister(w.conn)
        del self.writing[w.conn.fileno()]
        self.unsent -= w.size
        self.done()
        if written and w.kept and self.rearm is not None:
            self.rearm(w.conn)
        else:
            w.conn.close()
        if self.shedding and self.unsent <= self.max_unsent // 2:
            self.shedding = False
            log.warning("unsent replies back under %d MiB: %d connection(s) that did not "
                        "read their reply were dropped", self.max_unsent >> 20, self.dropped)
            self.dropped = 0

    def expire(self, now: float) -> None:
        """End the replies not written within `timeout` (as a blocking send's timeout did)."""
        for w in [w for w in self.writing.values() if w.deadline <= now]:
            self.end(w)

    def deadlines(self) -> list[float]:
        return [w.deadline for w in self.writing.values()]

    def end_all(self) -> None:
        for w in list(self.writing.values()):
            self.end(w)

    def enforce_cap(self, newest: Writing) -> None:
        """Over the cap, drop the replies whose client takes nothing: those it has read
        none of first, oldest hand-over first, then those stalled for STALLED seconds,
        longest without progress first; `newest`, just added, gets its chance first."""
        if self.unsent <= self.max_unsent:
            return
        if not self.shedding:
            self.shedding = True
            log.warning("unsent replies over %d MiB (%d connections): dropping the "
                        "connections that do not read their reply", self.max_unsent >> 20,
                        len(self.writing))
        stalled = time.monotonic() - self.stalled
        for w in sorted(self.writing.values(), key=lambda w: (w.moved, w.progress)):
            if self.unsent <= self.max_unsent or (w.moved and w.progress > stalled):
                break
            fd, left = w.conn.fileno(), len(w.data)
            if w is newest:
                continue
            self.write(w)  # a client that reads takes bytes at once: it stays
            if self.writing.get(fd) is w and len(w.data) == left:
                self.dropped += 1
                self.end(w)


def drain_input(conn: socket.socket, limit: float = 1.0) -> None:
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
