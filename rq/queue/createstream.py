"""The bulk create stream on a queue socket (issue 15 item 3, an extension of S7.3).

`create_messages [MSG, ...]` creates the messages of its JSON array in order:
each is checked as `create_message` checks it (S4.4, D10) up to the first
refusal, and the ones before it are created together, sharing their commits
(rq.queue.enqueue).  Reply: `["ok", [FULL_ID, ...]]`, or
`["fail", REASON, [FULL_ID, ...]]` with the ids created before the refused
message, whose index in the array is therefore the length of that list.

Unlike every other rq1 request (one per connection, S7.1), the connection
stays open after the reply: the client may send further `create_messages`
frames on it, pipelined (`rq sendmesg --stdin` keeps two in flight), and gets
one reply per frame, in order, until it closes its side.  After a refusal no
later frame is acted on: each is answered `["fail", STOPPED, []]`, so nothing
sent after a refused message is ever queued.

Owns only the connection (reading frames, writing replies); the checks and the
creating are the command table's (`create` below is Commands.create_many).
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import Any

from rq import protocol
from rq.client import recv_exact
from rq.errors import ProtocolError
from rq.sockserve import KEEP_OPEN, READ_TIMEOUT, reply_for

CMD = "create_messages"
STOPPED = "not created: an earlier message of this stream was refused"


def serve_stream(conn: socket.socket, first_arg: str | None,
                 create: Callable[[str | None], Any]) -> Any:
    """Answer the first frame, then every later one until the client closes;
    the connection is ours (KEEP_OPEN) and closed here."""
    arg: str | None = first_arg
    stopped = False
    try:
        while True:
            if stopped:
                reply: Any = ["fail", STOPPED, []]
            else:
                try:
                    reply = create(arg)
                except Exception as exc:  # noqa: BLE001 -- its reply, as sockserve makes it
                    reply = reply_for(exc, CMD)
                stopped = not (isinstance(reply, list) and reply and reply[0] == "ok")
            conn.settimeout(READ_TIMEOUT)
            conn.sendall(protocol.encode_reply(reply))
            request = read_next(conn)
            if request is None:
                return KEEP_OPEN
            cmd, arg = request
            if cmd != CMD:
                conn.sendall(protocol.encode_reply(["fail", "bad request"]))
                return KEEP_OPEN
    except (OSError, ProtocolError):
        return KEEP_OPEN  # the client went away or sent a bad frame: nothing more to answer
    finally:
        conn.close()


def read_next(conn: socket.socket) -> tuple[str, str | None] | None:
    """The next request frame, or None at a clean end of the stream.  The
    wait for a frame to begin has no deadline (a producer may be idle, e.g.
    `tail -f | rq sendmesg --stdin`); a frame once begun must arrive within
    READ_TIMEOUT."""
    conn.settimeout(None)
    first = conn.recv(protocol.HEADER_LEN)
    if not first:
        return None
    conn.settimeout(READ_TIMEOUT)
    header = first + recv_exact(conn, protocol.HEADER_LEN - len(first))
    size = protocol.parse_header(header)
    return protocol.split_request(recv_exact(conn, size))

