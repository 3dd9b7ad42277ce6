"""The request frames the rq1 server's clients are sending, and kept connections.

Owns: one connection's request frame as it arrives (its buffer, its deadline, read
without blocking and never past the frame's end, S7.1), and what the end of that
reading means: a request, a refused frame, or a connection over without a request.
Used by the server's I/O thread only (pumped: the thread that pumps it); it must not
call handlers or write replies (rq/sockserve.py and rq/sockwrite.py do).

Kept connections (issue 15, an extension of S7.1).  S7.1 has one request and one
reply per connection.  A client that sends `keep` is answered `["ok"]`, and its
connection then stays open: each later request on it is answered in turn, one at a
time (the next frame is read only once the reply to the last one is written), until
the client closes its side, or sends nothing for READ_TIMEOUT after a reply (closed
without a reply: nothing of a request had arrived), or a frame is refused (the
refusal, then the close, as on any connection), or a command takes the connection
over (`subscribe`, `create_messages`: theirs from then on, as without `keep`).  A
client that never sends `keep` sees S7.1 unchanged.  A request that has begun to
arrive must be complete by the same deadline, else it is refused as any slow frame.
rq.client.Connection is the client's side.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass, field

from rq import protocol
from rq.errors import ProtocolError

REFUSED = ("", None)  # a frame that is not a request: answered ["fail","bad request"]

Request = tuple[str, "str | None"]


@dataclass
class Reading:
    """A connection whose request frame is still arriving; `kept`: it has had
    requests before (after `keep`), so an end before any byte of this one is a
    clean end, not a refusal."""
    conn: socket.socket
    deadline: float
    kept: bool = False
    buf: bytearray = field(default_factory=bytearray)
    need: int = protocol.HEADER_LEN   # bytes wanted in buf for the current part
    header_done: bool = False

    def between_requests(self) -> bool:
        return self.kept and not self.buf and not self.header_done


class Pending:
    """advance(): the frame is not complete yet; wait for the socket."""


PENDING = Pending()


def advance(r: Reading) -> Request | Pending | None:
    """Read what has arrived of `r`'s frame (never past its end: a subscription or
    a kept connection sends more frames later).  PENDING until the frame is complete;
    then the request (cmd, raw arg), REFUSED for a bad or cut frame, or None when
    the connection is over without a request (the client went away, or a kept
    connection closed between requests)."""
    try:
        while True:
            chunk = r.conn.recv(min(r.need - len(r.buf), 1 << 20))
            if not chunk:  # closed mid-frame: refused, as a client that half-closes expects
                return None if r.between_requests() else REFUSED
            r.buf += chunk
            if len(r.buf) < r.need:
                continue
            if r.header_done:
                return protocol.split_request(bytes(r.buf))
            r.need = protocol.parse_header(bytes(r.buf))
            r.buf.clear()
            r.header_done = True
            if r.need == 0:
                return REFUSED
    except (BlockingIOError, InterruptedError):
        return PENDING
    except ProtocolError:
        return REFUSED
    except OSError:  # the client went away
        return None


def expired(r: Reading) -> Request | None:
    """What a reading past its deadline ends as: a kept connection with nothing of a
    next request is closed quietly; a frame begun and not complete is refused."""
    return None if r.between_requests() else REFUSED
