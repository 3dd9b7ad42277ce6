"""The `subscribe` stream on the manager socket (SPEC S8.8): the first frame's
reply, then the events of an EventHub subscriber (replay first) on the same
connection, while in-stream `subscribe`/`unsubscribe` frames from the client
change its patterns.

Owns the connection of one subscription; the events and their buffers are
rq.mgr.events_hub's.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Iterator
from typing import Any

from rq import protocol, topics
from rq.errors import Fail, ProtocolError
from rq.mgr.events_hub import SEND_BATCH, EventHub, Frame, Subscriber, parse_since

log = logging.getLogger(__name__)

def parse_patterns(data: object, *, allow_empty: bool = False) -> list[str]:
    if not isinstance(data, dict):
        raise ProtocolError("bad request")
    patterns = data.get("patterns")
    if patterns is None:
        raise Fail("missing patterns")
    if allow_empty and patterns == []:
        return []
    if isinstance(patterns, str):
        patterns = [patterns]
    return list(topics.check_patterns(patterns))


def serve_subscription(hub: EventHub, cmd: str, arg: str | None,
                       conn: socket.socket) -> Any:
    """The `subscribe` (or a first `unsubscribe`) command: answer, then keep
    the connection for the stream.  Returns a reply for a refused request,
    else sockserve.KEEP_OPEN once the stream has ended."""
    from rq.sockserve import KEEP_OPEN

    data = protocol.parse_json_arg(arg)
    sub: Subscriber
    if cmd == "subscribe" and isinstance(data, dict) and "cursor" in data:
        sub, replay = open_cursor(hub, data)  # issue 18 item 3
        first: Any = ["ok", "subscribed"]
    else:
        if cmd == "subscribe":
            patterns = parse_patterns(data)
            since = parse_since(data.get("since"))
            first = ["ok", "subscribed"]
        else:  # a stream opened by `unsubscribe` starts with no patterns
            parse_patterns(data, allow_empty=True)
            patterns, since, first = [], None, ["ok", []]
        sub, replay = hub.subscribe(patterns, since, conn)
    sub.conn = conn
    conn.settimeout(None)  # a stalled reader only ever blocks its own thread
    try:
        conn.sendall(protocol.encode_reply(first))
        reader = threading.Thread(target=read_stream_requests, args=(hub, sub, conn),
                                  name="rq-subscriber-in", daemon=True)
        reader.start()
        send_stream(sub, replay, conn)
    except OSError:
        pass  # the subscriber went away
    finally:
        hub.unsubscribe(sub)
        try:
            conn.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        conn.close()
    return KEEP_OPEN


def open_cursor(hub: EventHub, data: dict[str, Any]) -> tuple[Subscriber, Iterator[Frame]]:
    """`subscribe {"cursor": NAME, "patterns"?: [...], "last_id"?: TOKEN}`:
    patterns are needed only to create the cursor; `since` does not combine."""
    from rq.mgr.cursorstream import subscribe_cursor

    if data.get("since") is not None:
        raise Fail("since and cursor cannot be combined (a cursor resumes where it was acked)")
    patterns = parse_patterns(data) if data.get("patterns") else None
    return subscribe_cursor(hub, data["cursor"], patterns, data.get("last_id"))


def send_stream(sub: Subscriber, replay: Iterator[Frame], conn: socket.socket) -> None:
    batch: list[Frame] = []
    for frame in replay:
        if sub.closed:
            return
        batch.append(frame)
        if len(batch) >= SEND_BATCH:
            conn.sendall(b"".join(batch))
            batch = []
    if batch:
        conn.sendall(b"".join(batch))
    while True:
        frames = sub.take(1.0)
        if frames is None:
            return
        if frames:
            conn.sendall(b"".join(frames))


def stream_request_reply(sub: Subscriber, payload: bytes) -> Any:
    """The in-stream reply to one frame (S8.8): `["ok", <current patterns>]`."""
    try:
        cmd, arg = protocol.split_request(payload)
        if cmd not in ("subscribe", "unsubscribe", "ack"):
            return ["error"]  # as S7.2 answers unknown commands
        data = protocol.parse_json_arg(arg)
        if cmd == "ack" or sub.cursor is not None:
            return cursor_request_reply(sub, cmd, data)
        if cmd == "subscribe":
            return ["ok", sub.add(parse_patterns(data))]
        return ["ok", sub.remove(parse_patterns(data, allow_empty=True))]
    except ProtocolError:
        return ["fail", "bad request"]
    except Fail as exc:
        return ["fail", str(exc)]


def cursor_request_reply(sub: Subscriber, cmd: str, data: Any) -> Any:
    """In-stream `ack {"pos": TOKEN}` (issue 18 item 3): durable, then
    `["ok","acked",<position>]`; a cursor's patterns are fixed."""
    from rq.mgr.cursorstream import CursorSubscriber

    if not isinstance(sub, CursorSubscriber):
        raise Fail("ack needs a cursor stream (subscribe with \"cursor\")")
    if cmd != "ack":
        raise Fail("a cursor's patterns are fixed: delete the cursor to change them")
    if not isinstance(data, dict) or not isinstance(data.get("pos"), str):
        raise Fail("missing pos")
    return ["ok", "acked", sub.book.ack(sub.cursor.name, data["pos"])]


def read_stream_requests(hub: EventHub, sub: Subscriber, conn: socket.socket) -> None:
    """Read in-stream frames.  The client closing its side ends the
    subscription; a broken frame gets `bad request` and ends the stream
    after it (the framing is lost).  Never raises."""
    from rq.client import recv_exact

    try:
        while not sub.closed:
            first = conn.recv(1)
            if not first:
                break
            try:
                magic = first + recv_exact(conn, len(protocol.MAGIC) - 1)
                if magic != protocol.MAGIC:  # refuse at once, do not wait for more
                    raise ProtocolError("bad request")
                header = magic + recv_exact(conn, protocol.HEADER_LEN - len(magic))
                payload = recv_exact(conn, protocol.parse_header(header))
            except ProtocolError:
                sub.finish(protocol.encode_reply(["fail", "bad request"]))
                return
            sub.control(protocol.encode_reply(stream_request_reply(sub, payload)))
    except OSError:
        pass
    except Exception:  # never take the manager down
        log.exception("subscription reader failed")
    hub.unsubscribe(sub)
