"""The stream of a named cursor (issue 18 item 3, SPEC S8.8): a subscriber
whose events carry `"pos"` tokens, that starts with the events the cursor has
not acknowledged (read from the event-log files, after one `gap` record when
retention removed some) and goes on with live events without a gap or a
repeat.

Owns `CursorSubscriber` and `subscribe_cursor`; the cursor's state is
rq.mgr.cursors', the tailing rq.mgr.events_hub's, the connection
rq.mgr.substream's.  A cursor is streamed by one subscriber at a time: a new
subscription of the same cursor (a client reconnecting before its old
connection was noticed gone) takes it over and the old stream ends.
"""

from __future__ import annotations

import heapq
import os
from collections.abc import Iterator
from typing import Any

from rq import protocol
from rq.mgr.cursors import DAY_RE, Cursor, CursorBook
from rq.mgr.events_hub import BUFFER_LIMIT, EventHub, Frame, Subscriber, file_records


MAX_UNACKED = 100_000  # tokens a stream may hand out without an ack (each is remembered)


def gap_record(lost: int) -> dict[str, Any]:
    return {"event": "gap", "lost": lost}


class CursorSubscriber(Subscriber):
    """Buffers raw records, stamps them with tokens when they are sent.  A
    cursor stream never drops events: one that falls BUFFER_LIMIT behind is
    ended (its client subscribes again and resumes from the files)."""

    def __init__(self, cursor: Cursor, book: CursorBook) -> None:
        super().__init__(cursor.patterns)
        self.cursor = cursor
        self.book = book
        self.floor = dict(cursor.offsets)   # live events up to these offsets are replayed

    def push_record(self, event: dict[str, Any], topic: str, rel: str, end: int) -> None:
        if end <= self.floor.get(rel, 0) or rel[:8] < self.cursor.from_day:
            return
        with self.cond:
            if self.ending:
                return
            if self.queued >= BUFFER_LIMIT:
                self.end_with(f"cursor {self.cursor.name} fell more than {BUFFER_LIMIT} events "
                              "behind; subscribe again to resume")
            elif len(self.cursor.inflight) + self.queued >= MAX_UNACKED:
                self.end_with(unacked_text(self.cursor.name))
            else:
                self.buffer.append((({**event, "topic": topic}, rel, end), True))
                self.queued += 1
            self.cond.notify()

    def end_with(self, reason: str) -> None:
        """(Under `cond`) a last `fail` frame after what is queued; the stream ends."""
        self.buffer.append((protocol.encode_reply(["fail", reason]), False))
        self.ending = True

    def push_gap(self, lost: int) -> None:
        with self.cond:
            self.buffer.append(((gap_record(lost), None, lost), False))
            self.cond.notify()

    def render(self, item: Any) -> Frame:
        if isinstance(item, bytes):
            return item
        record, rel, n = item
        with self.book.lock:
            if self.cursor.owner is not self:
                return b""  # taken over: the new stream sends it
            if rel is None:
                token = self.cursor.stamp(None, 0, gap=n)
            else:
                token = self.cursor.stamp(rel, n)
        return protocol.encode_reply({**record, "pos": token})

    def close(self) -> None:
        super().close()
        with self.book.lock:
            if self.cursor.owner is self:
                self.cursor.owner = None


def subscribe_cursor(hub: EventHub, name: str, patterns: list[str] | None,
                     last_id: object) -> tuple[CursorSubscriber, Iterator[Frame]]:
    """Open (or create) cursor `name` and register its stream; returns the
    subscriber and its replay (a pending gap, then the unacknowledged events
    up to where live delivery starts).  Raises Fail (bad name, damaged
    state, patterns that differ)."""
    book = hub.cursors
    made: list[CursorSubscriber] = []
    old: list[Subscriber] = []

    def make(snapshot: dict[str, int], follow_from: str) -> Subscriber:
        start = {path[len(hub.base) + 1:]: off for path, off in snapshot.items()}
        cursor = book.open(name, patterns, start, follow_from)
        if cursor.owner is not None:
            old.append(cursor.owner)
            cursor.owner.close()
        book.resume(cursor, last_id)
        sub = CursorSubscriber(cursor, book)
        cursor.owner = sub
        made.append(sub)
        return sub

    snapshot, follow_from = hub.register(make)
    for stale in old:
        hub.unsubscribe(stale)
    sub = made[0]
    return sub, replay(hub, sub, snapshot, follow_from)


def replay(hub: EventHub, sub: CursorSubscriber, snapshot: dict[str, int],
           follow_from: str) -> Iterator[Frame]:
    """The pending gap, then the events of every covered file from the
    cursor's offset (up to the snapshot in followed days, else to the end),
    merged by time with each file in its own order."""
    cursor = sub.cursor
    if cursor.gap:
        yield sub.render((gap_record(cursor.gap), None, cursor.gap))
    streams = []
    for rel, full in hub.cursors.files(cursor):
        day = rel[:8]
        if not DAY_RE.match(day):
            continue
        limit = snapshot.get(full, 0) if day >= follow_from else None
        streams.append(_tagged(full, rel, cursor.offsets.get(rel, 0), limit))
    topic_of = hub.cursors.topic_of
    for event, rel, end in heapq.merge(*streams, key=lambda rec: rec[0]["ts"]):
        if sub.closed:
            return
        if len(cursor.inflight) >= MAX_UNACKED:
            with sub.cond:
                sub.buffer.clear()  # live events after the replay's end: sent again next time
                sub.queued = 0
                sub.end_with(unacked_text(cursor.name))
            return
        yield sub.render(({**event, "topic": topic_of(str(event.get("queue")))}, rel, end))


def unacked_text(name: str) -> str:
    return (f"cursor {name}: {MAX_UNACKED} events sent without an ack; ack them, or subscribe "
            "again (with Last-Event-ID over HTTP) to go on")


def _tagged(full: str, rel: str, start: int,
            limit: int | None) -> Iterator[tuple[dict[str, Any], str, int]]:
    if limit is not None and limit <= start:
        return
    if not os.path.exists(full):
        return
    for event, end in file_records(full, start, limit):
        yield event, rel, end
