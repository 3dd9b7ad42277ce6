"""Durable named subscriber cursors (issue 18 item 3; SPEC S8.8, S13; seed
001's consumer state file).

Owns `log/cursors/NAME.cursor`: one cursor per file, written only by rq-mgr,
each a single line laid out as an S13.2 record,
`{"crc32":"XXXXXXXX","cursor":PAYLOAD}\\n`, replaced atomically (temp file,
fsync, rename, fsync of the directory) on every acknowledgement.  A cursor's
position is, per event-log file (`YYYYMMDD/QUEUE.jsonl`), the byte offset just
after the last event the subscriber acknowledged, plus `from_day` (files of
earlier days are not its business; files of later days absent from `offsets`
start at 0).  So the files are the cursor's buffer: after a reconnect or an
rq-mgr restart the stream resumes at the offsets, without a skip and without
repeating an acknowledged event.

Delivery tokens: every event sent on a cursor stream carries `"pos":
"EPOCH:SEQ"`; the cursor remembers, in send order, which file and offset each
token stands for until it is acknowledged (cumulatively: acking a token acks
everything sent before it).  EPOCH changes whenever the cursor is loaded, so a
token from before an rq-mgr restart is refused rather than misread.

Retention (S13, the cleaner) asks `retire_day` before removing a day: the
events of that day a cursor has not passed are counted into its `gap`, which
its stream reports as one `{"event":"gap","lost":N}` record.

Must not: read the event log for live delivery (rq.mgr.events_hub does that)
or touch the connection (rq.mgr.substream).
"""

from __future__ import annotations

import json
import logging
import os
import re
import secrets
import threading
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rq import protocol, topics
from rq.errors import Fail
from rq.fsops import FsOps, remove_stale_temps

log = logging.getLogger(__name__)

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
SUFFIX = ".cursor"
DAY_RE = re.compile(r"^\d{8}$")
COUNT_CHUNK = 1 << 20


def check_name(name: object) -> str:
    """A cursor name: 1-64 of letters, digits, `_`, `.`, `-`, not starting with a
    dot or dash (it names a file).  Raises Fail with one clear line."""
    if not isinstance(name, str) or not NAME_RE.match(name) or ".." in name:
        shown = name if isinstance(name, str) else protocol.dumps(name)
        raise Fail(f"invalid cursor name {shown[:80]!r}: use 1-64 letters, digits, "
                   "'_', '.' or '-', starting with a letter or digit")
    return name


# ---------------------------------------------------------------- the state file (pure)


def encode_state(payload: dict[str, Any]) -> bytes:
    body = protocol.dumps(payload).encode()
    return b'{"crc32":"%08x","cursor":' % (zlib.crc32(body) & 0xFFFFFFFF) + body + b"}\n"


def decode_state(data: bytes) -> dict[str, Any]:
    """The payload of a state file; raises ValueError(why) when it is damaged."""
    head = b'{"crc32":"'
    if not data.endswith(b"}\n") or not data.startswith(head) or data[18:29] != b'","cursor":':
        raise ValueError("not a cursor record (torn or overwritten)")
    body = data[29:-2]
    digits = data[10:18]
    if digits != digits.lower() or not all(c in b"0123456789abcdef" for c in digits):
        raise ValueError("bad crc field")
    if int(digits, 16) != zlib.crc32(body):
        raise ValueError("crc mismatch")
    payload = json.loads(body)
    offsets = payload.get("offsets") if isinstance(payload, dict) else None
    if not isinstance(offsets, dict) or not isinstance(payload.get("position"), int) \
            or not isinstance(payload.get("patterns"), list) \
            or not isinstance(payload.get("from_day"), str):
        raise ValueError("missing fields")
    return payload


def count_lines(path: str, start: int) -> int:
    """Complete lines of `path` after byte `start` (0 when it is gone)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return 0
    try:
        n, pos = 0, start
        while chunk := os.pread(fd, COUNT_CHUNK, pos):
            n += chunk.count(b"\n")
            pos += len(chunk)
        return n
    finally:
        os.close(fd)


# ---------------------------------------------------------------- one cursor


@dataclass
class Cursor:
    name: str
    patterns: list[str]
    from_day: str
    offsets: dict[str, int]            # "YYYYMMDD/QUEUE.jsonl" -> bytes acknowledged
    position: int = 0                  # events acknowledged since creation
    created: float = 0.0
    acked_at: float | None = None
    gap: int = 0                       # events lost to retention, not yet reported+acked
    epoch: str = field(default_factory=lambda: secrets.token_hex(3))
    seq: int = 0                       # tokens handed out in this epoch
    acked_seq: int = 0                 # ... and acknowledged
    inflight: list[tuple[int, str | None, int, int]] = field(default_factory=list)
    owner: Any = None                  # the Subscriber streaming it now

    def payload(self) -> dict[str, Any]:
        return {"name": self.name, "patterns": self.patterns, "from_day": self.from_day,
                "offsets": self.offsets, "position": self.position, "created": self.created,
                "acked_at": self.acked_at, "gap": self.gap}

    def stamp(self, rel: str | None, end: int, gap: int = 0) -> str:
        """The token of the next record sent (an event of file `rel` ending at
        `end`, or a gap record of `gap` lost events); remembered until acked."""
        self.seq += 1
        self.inflight.append((self.seq, rel, end, gap))
        return f"{self.epoch}:{self.seq}"


class CursorBook:
    """Every cursor of a root, loaded on first use; one lock for all of them
    (they are few and each write is one small file)."""

    def __init__(self, root: str, topic_of: Any, fs: FsOps | None = None) -> None:
        self.root = root
        self.fs = fs or FsOps()            # the manager's file-operation seam
        self.dir = os.path.join(root, "log", "cursors")
        remove_stale_temps(self.dir)       # what a crash mid-save left
        self.events = os.path.join(root, "log", "events")
        self.topic_of = topic_of           # queue name -> topic (events_hub.TopicMap)
        self.lock = threading.RLock()
        self._cursors: dict[str, Cursor] = {}

    def path(self, name: str) -> str:
        return os.path.join(self.dir, name + SUFFIX)

    # ------------------------------------------------------------ load and save

    def load(self, name: str) -> Cursor | None:
        """The cursor, None when there is none; Fail when its file is damaged."""
        cursor = self._cursors.get(name)
        if cursor is not None:
            return cursor
        try:
            with open(self.path(name), "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise Fail(f"cursor {name}: cannot read its state: {exc.strerror}") from None
        try:
            p = decode_state(data)
            cursor = Cursor(name, [str(x) for x in p["patterns"]], p["from_day"],
                            {str(k): int(v) for k, v in p["offsets"].items()},
                            p["position"], float(p.get("created") or 0),
                            p.get("acked_at"), int(p.get("gap") or 0))
        except (ValueError, TypeError, AttributeError) as exc:
            raise Fail(f"cursor {name}: state file log/cursors/{name}{SUFFIX} is corrupt "
                       f"({exc}); delete the cursor to start it again") from None
        self._cursors[name] = cursor
        return cursor

    def save(self, cursor: Cursor) -> None:
        """Durably; offsets of day directories retention has removed are
        dropped, so the file stays as small as the log it points into."""
        days = set(_listdir(self.events))
        if days:  # (never on a failed listing: every offset would go)
            cursor.offsets = {rel: off for rel, off in cursor.offsets.items() if rel[:8] in days}
        os.makedirs(self.dir, exist_ok=True)
        self.fs.write_file_atomic(self.path(cursor.name), encode_state(cursor.payload()),
                                  sync=True)

    # ------------------------------------------------------------ the verbs

    def open(self, name: str, patterns: list[str] | None, start: dict[str, int],
             from_day: str) -> Cursor:
        """The cursor to stream (made, durably, when new: it starts at `start`,
        the hub's current offsets).  Fail for a bad name, a damaged file, or
        patterns that differ from the cursor's."""
        check_name(name)
        with self.lock:
            cursor = self.load(name)
            if cursor is None:
                if not patterns:
                    raise Fail(f"cursor {name} does not exist: give patterns to create it")
                cursor = Cursor(name, patterns, from_day, dict(start), created=time.time())
                try:
                    self.save(cursor)
                except OSError as exc:
                    raise Fail(f"cursor {name}: cannot save its state: {exc.strerror}") from None
                self._cursors[name] = cursor
            elif patterns and sorted(patterns) != sorted(cursor.patterns):
                raise Fail(f"cursor {name} follows {','.join(cursor.patterns)}: "
                           "delete it to change its patterns")
            return cursor

    def ack(self, name: str, token: object) -> int:
        """Acknowledge the record sent as `token` and everything sent before it
        on the cursor; durable before it returns the new position."""
        check_name(name)
        with self.lock:
            cursor = self.load(name)
            if cursor is None:
                raise Fail(f"no such cursor: {name}")
            self._apply(cursor, token)
            return cursor.position

    def _apply(self, cursor: Cursor, token: object) -> None:
        epoch, _, seq = str(token).partition(":")
        known = epoch == cursor.epoch and seq.isdigit() and len(seq) < 19
        if known and int(seq) <= cursor.acked_seq:
            return  # acknowledged already (an SSE ack, then the same Last-Event-ID)
        if not known or not any(s == int(seq) for s, *_ in cursor.inflight):
            raise Fail(f"unknown position {str(token)[:40]!r} for cursor {cursor.name}")
        before = (dict(cursor.offsets), cursor.position, cursor.gap, cursor.inflight,
                  cursor.acked_seq, cursor.acked_at)
        upto = cursor.acked_seq = int(seq)
        for s, rel, end, gap in cursor.inflight:
            if s > upto:
                break
            if rel is None:
                cursor.gap = max(0, cursor.gap - gap)
            elif end > cursor.offsets.get(rel, 0):
                cursor.offsets[rel] = end
                cursor.position += 1
        cursor.inflight = [entry for entry in cursor.inflight if entry[0] > upto]
        cursor.acked_at = time.time()
        try:
            self.save(cursor)
        except OSError as exc:  # refused, and undone: the client acks again later
            (cursor.offsets, cursor.position, cursor.gap, cursor.inflight,
             cursor.acked_seq, cursor.acked_at) = before
            raise Fail(f"cursor {cursor.name}: cannot save its state: {exc.strerror}") from None

    def resume(self, cursor: Cursor, last_id: object) -> None:
        """A new stream of the cursor: apply `last_id` (SSE Last-Event-ID) when
        it names a record sent before; forget every other unacknowledged one."""
        with self.lock:
            if last_id:
                try:
                    self._apply(cursor, last_id)
                except Fail as exc:
                    log.info("%s (resuming from the last acknowledged event)", exc)
            cursor.inflight = []

    def delete(self, name: str) -> None:
        """Remove a cursor (a damaged file too, moved aside as NAME.cursor.corrupt
        for inspection); its live stream, if any, ends."""
        check_name(name)
        with self.lock:
            try:
                try:
                    cursor = self.load(name)
                except Fail:
                    os.replace(self.path(name), self.path(name) + ".corrupt")
                    return
                if cursor is None:
                    raise Fail(f"no such cursor: {name}")
                os.unlink(self.path(name))
            except OSError as exc:
                raise Fail(f"cursor {name}: cannot delete: {exc.strerror}") from None
            self._cursors.pop(name, None)
        if cursor.owner is not None:
            cursor.owner.finish(protocol.encode_reply(["fail", f"cursor {name} deleted"]))

    def names(self) -> list[str]:
        try:
            return sorted(n[:-len(SUFFIX)] for n in os.listdir(self.dir) if n.endswith(SUFFIX)
                          and NAME_RE.match(n[:-len(SUFFIX)]) and ".." not in n)
        except OSError:
            return []

    def listing(self) -> list[dict[str, Any]]:
        """Every cursor: name, patterns, position, lag in events, last ack time,
        whether a stream follows it; a damaged one with its problem."""
        out = []
        for name in self.names():
            with self.lock:
                try:
                    cursor = self.load(name)
                except Fail as exc:
                    out.append({"name": name, "state": "corrupt", "problem": str(exc)})
                    continue
                if cursor is None:
                    continue
                entry = {**cursor.payload(), "state": "streaming" if cursor.owner else "idle"}
                entry.pop("offsets")
            entry["lag"] = self.lag(cursor)
            out.append(entry)
        return out

    # ------------------------------------------------------------ files a cursor covers

    def wants_file(self, cursor: Cursor, day: str, filename: str) -> bool:
        if day < cursor.from_day or not filename.endswith(".jsonl"):
            return False
        return topics.matches_any(cursor.patterns, self.topic_of(filename[:-6]))

    def files(self, cursor: Cursor) -> list[tuple[str, str]]:
        """(rel, full path) of every event-log file the cursor covers, by day."""
        out = []
        for day in sorted(_listdir(self.events)):
            if DAY_RE.match(day) and day >= cursor.from_day:
                for n in sorted(_listdir(os.path.join(self.events, day))):
                    if self.wants_file(cursor, day, n):
                        out.append((f"{day}/{n}", os.path.join(self.events, day, n)))
        return out

    def lag(self, cursor: Cursor) -> int:
        return sum(count_lines(full, cursor.offsets.get(rel, 0))
                   for rel, full in self.files(cursor))

    def retire_day(self, day: str) -> dict[str, int]:
        """Retention is about to remove `day`: count into each cursor's gap the
        events of that day it has not passed, mark the day passed (so a retried
        retirement counts nothing twice), durably.  Returns name -> lost."""
        if not isinstance(day, str) or not DAY_RE.match(day):
            raise Fail("invalid day (YYYYMMDD)")
        lost: dict[str, int] = {}
        directory = os.path.join(self.events, day)
        for name in self.names():
            with self.lock:
                try:
                    cursor = self.load(name)
                except Fail:
                    continue  # a damaged cursor is reported by its listing
                if cursor is None or day < cursor.from_day:
                    continue
                n = 0
                for filename in sorted(_listdir(directory)):
                    if self.wants_file(cursor, day, filename):
                        rel, full = f"{day}/{filename}", os.path.join(directory, filename)
                        n += count_lines(full, cursor.offsets.get(rel, 0))
                        cursor.offsets[rel] = os.path.getsize(full)
                if n:
                    cursor.gap += n
                    self.save(cursor)
                    if cursor.owner is not None:
                        cursor.owner.push_gap(n)
                lost[name] = n
        return lost


# ---------------------------------------------------------------- manager commands


def cursor_commands(book: CursorBook) -> dict[str, Callable[[str | None], list[Any]]]:
    """`cursors` (list), `delete_cursor NAME`, `ack_cursor {"cursor","pos"}` (HTTP's
    ack) and `retire_events {"day"}` (retention, the cleaner) on the manager socket."""

    def arg_dict(arg: str | None) -> dict[str, Any]:
        data = protocol.parse_json_arg(arg)
        if not isinstance(data, dict):
            raise Fail("bad request")
        return data

    def delete(arg: str | None) -> list[Any]:
        book.delete(str(arg or ""))
        return ["ok", "cursor deleted"]

    def ack(arg: str | None) -> list[Any]:
        data = arg_dict(arg)
        return ["ok", "acked", book.ack(data.get("cursor"), data.get("pos"))]  # type: ignore[arg-type]

    return {
        "cursors": lambda arg: ["ok", book.listing()],
        "delete_cursor": delete,
        "ack_cursor": ack,
        "retire_events": lambda arg: ["ok", book.retire_day(arg_dict(arg).get("day"))],  # type: ignore[arg-type]
    }


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []
