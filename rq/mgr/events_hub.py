"""The manager's event hub: live event subscriptions (SPEC S8.8) fed from the
event log files (S13).

Owns: following `log/events/YYYYMMDD/QUEUE.jsonl` (written only by the queue
processes) from a tailer thread, validating each line (S13.4, through
`rq.events.decode_line`; bad lines are skipped and counted), adding the
queue's `"topic"` (S8.1, from its config), and fanning the events out to
subscribers, each through its own bounded buffer, with replay `since` a
time and the `overflow` record.  The `subscribe` stream on the manager
socket is rq.mgr.substream's.

Why it is built this way:
* The tailer polls (every POLL_SECONDS while anyone subscribes) instead of
  taking one inotify event per appended line: its cost per pass is a stat per
  file, whatever the event rate, so busy queues never make the manager busy.
* No gap, no repeat: `offsets` is how far each file has been dispatched.  A
  new subscriber is registered and the offsets copied under the same lock as
  a dispatch pass, so its replay reads each file up to the copy and the
  tailer delivers everything after it.
* A slow subscriber never slows anyone: dispatching only appends an encoded
  frame to the subscriber's deque (encoded once per event, shared by all);
  the subscriber's own thread does the blocking send.  Past BUFFER_LIMIT
  queued events new ones are dropped and counted, and one
  `{"event":"overflow","dropped":N}` record takes their place once it has
  caught up.
"""

from __future__ import annotations

import heapq
import logging
import os
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from rq import protocol, topics
from rq.config import load_queue_config
from rq.errors import ConfigError, Fail
from rq.events import decode_line
from rq.fsops import FsOps
from rq.mgr.cursors import CursorBook

log = logging.getLogger(__name__)

BUFFER_LIMIT = 10_000    # S8.8: more than this many events behind -> overflow
POLL_SECONDS = 0.05      # tailer pass interval while someone subscribes
IDLE_SECONDS = 1.0       # ... and while nobody does (nothing is read then)
FOLLOW_DAYS = 2          # day directories older than this many days are history
TOPIC_TTL = 2.0          # a queue's config is re-checked at most this often
MAX_PATTERNS = 1024      # per subscription, after merging
SEND_BATCH = 512         # frames per sendall
READ_CHUNK = 1 << 20
DAY = 86400

Frame = bytes


def day_name(epoch: float) -> str:
    return time.strftime("%Y%m%d", time.gmtime(epoch))


def overflow_frame(dropped: int) -> Frame:
    return protocol.encode_reply({"event": "overflow", "dropped": dropped})


def complete_size(fd: int, size: int) -> int:
    """Bytes of the file up to and including its last newline: a record is
    one write(), but a reader may catch one half-written or a torn tail."""
    pos = size
    while pos > 0:
        start = max(0, pos - 4096)
        chunk = os.pread(fd, pos - start, start)
        nl = chunk.rfind(b"\n")
        if nl >= 0:
            return start + nl + 1
        pos = start
    return 0


def parse_records(data: bytes, start: int = 0) -> tuple[list[tuple[dict[str, Any], int]], int]:
    """The valid payloads of complete lines in `data` (read at file offset
    `start`), each with the file offset just after it, and how many were bad (S13.4)."""
    events: list[tuple[dict[str, Any], int]] = []
    bad = 0
    end = start
    for line in data.splitlines(keepends=True):
        end += len(line)
        payload = decode_line(line)
        if payload is None or not isinstance(payload.get("ts"), (int, float)):
            bad += 1
        else:
            events.append((payload, end))
    return events, bad


def parse_lines(data: bytes) -> tuple[list[dict[str, Any]], int]:
    """The valid payloads of complete lines in `data`, and how many were bad (S13.4)."""
    records, bad = parse_records(data)
    return [payload for payload, _ in records], bad


def parse_since(value: object) -> float | None:
    """S8.8 `since`: an epoch (number, or a numeric string as from a URL);
    None when absent.  Raises Fail for anything else."""
    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            raise Fail("invalid since") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not value >= 0 or value == float("inf"):
        raise Fail("invalid since")
    return float(value)


class TopicMap:
    """Queue name -> topic (S8.1: default the name), from the queue configs,
    re-checked at most every TOPIC_TTL seconds.  Only the tailer uses it."""

    def __init__(self, root: str) -> None:
        self.root = root
        self._cache: dict[str, tuple[str, float, float]] = {}  # name -> topic, mtime, checked

    def topic(self, name: str) -> str:
        now = time.monotonic()
        cached = self._cache.get(name)
        if cached is not None and now - cached[2] < TOPIC_TTL:
            return cached[0]
        path = os.path.join(self.root, "queue", name, "config.json")
        try:
            mtime = os.stat(path).st_mtime
        except OSError:
            mtime = -1.0  # deleted queue: keep what we knew
        if cached is not None and cached[1] == mtime:
            self._cache[name] = (cached[0], mtime, now)
            return cached[0]
        topic = cached[0] if cached is not None else name
        if mtime >= 0:
            try:
                topic = load_queue_config(self.root, name)[0].topic
            except (ConfigError, OSError):
                pass
        self._cache[name] = (topic, mtime, now)
        return topic


class Subscriber:
    """One subscription: its patterns and its bounded buffer of frames.

    `push` (tailer thread) never blocks; `take` (the subscriber's own thread)
    waits for frames.  Control replies (`["ok", patterns]`) are never dropped."""

    def __init__(self, patterns: Iterable[str], since: float | None = None) -> None:
        self.patterns: list[str] = list(dict.fromkeys(patterns))
        self.since = since     # live events before it are left out too
        self.buffer: deque[tuple[Any, bool]] = deque()  # (frame or record, is an event)
        self.queued = 0        # events in buffer (control frames do not count)
        self.dropped = 0
        self.closed = False
        self.ending = False    # send what is queued, then end the stream
        self.conn: socket.socket | None = None
        self.cond = threading.Condition()
        self.cursor: Any = None  # a named cursor's stream: rq.mgr.cursorstream

    def push_record(self, event: dict[str, Any], topic: str, rel: str, end: int) -> None:
        """A named cursor's stream takes raw records (rq.mgr.cursorstream)."""
        raise NotImplementedError

    def render(self, item: Any) -> Frame:
        """A buffered item as the frame to send (a cursor stream stamps it here,
        in send order, outside `cond`)."""
        return item  # type: ignore[no-any-return]

    def wants(self, topic: str) -> bool:
        return topics.matches_any(self.patterns, topic)

    def push(self, frame: Frame) -> None:
        with self.cond:
            if self.dropped and self.queued < BUFFER_LIMIT:
                self.buffer.append((overflow_frame(self.dropped), False))
                self.dropped = 0
            if self.dropped or self.queued >= BUFFER_LIMIT:
                self.dropped += 1
                return
            self.buffer.append((frame, True))
            self.queued += 1
            self.cond.notify()

    def control(self, frame: Frame) -> None:
        with self.cond:
            self.buffer.append((frame, False))
            self.cond.notify()

    def take(self, timeout: float | None = None) -> list[Frame] | None:
        """Up to SEND_BATCH frames; [] on timeout; None once closed."""
        with self.cond:
            if not self.buffer and not self.dropped and not self.closed and not self.ending:
                self.cond.wait(timeout)
            if self.closed or (self.ending and not self.buffer):
                return None
            if not self.buffer and self.dropped:
                self.buffer.append((overflow_frame(self.dropped), False))
                self.dropped = 0
            out: list[Any] = []
            while self.buffer and len(out) < SEND_BATCH:
                frame, is_event = self.buffer.popleft()
                out.append(frame)
                self.queued -= is_event
        return [self.render(item) for item in out]

    def close(self) -> None:
        with self.cond:
            self.closed = True
            self.cond.notify_all()

    def finish(self, frame: Frame) -> None:
        """Queue a last control frame; the stream ends once it is sent."""
        with self.cond:
            self.buffer.append((frame, False))
            self.ending = True
            self.cond.notify_all()

    def add(self, patterns: Iterable[str]) -> list[str]:
        with self.cond:
            merged = list(dict.fromkeys([*self.patterns, *patterns]))
            if len(merged) > MAX_PATTERNS:
                raise Fail("too many patterns")
            self.patterns = merged
            return list(merged)

    def remove(self, patterns: list[str]) -> list[str]:
        """S8.8: `#` or an empty list removes every pattern (delivery stops)."""
        with self.cond:
            if not patterns or "#" in patterns:
                self.patterns = []
            else:
                self.patterns = [p for p in self.patterns if p not in patterns]
            return list(self.patterns)


class EventHub:
    """Follows the event log and serves subscriptions; `start`/`stop` with the manager."""

    def __init__(self, root: str, *, poll: float = POLL_SECONDS, fs: FsOps | None = None) -> None:
        self.root = root
        self.base = os.path.join(root, "log", "events")
        self.poll = poll
        self.topics = TopicMap(root)
        self.cursors = CursorBook(root, TopicMap(root).topic, fs)  # issue 18 item 3
        self.offsets: dict[str, int] = {}   # path -> bytes dispatched
        self.follow_from = day_name(time.time() - DAY)
        self.subscribers: set[Subscriber] = set()
        self.skipped = 0                     # bad lines seen (S13.4)
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopping = False
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------ lifecycle

    def start(self) -> None:
        with self._lock:
            self._catch_up()
        self._thread = threading.Thread(target=self._run, name="rq-events-hub", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 2.0) -> None:
        """Fast: wake the tailer, end every subscription (their threads close
        their own connections)."""
        self._stopping = True
        self._wake.set()
        with self._lock:
            subs = list(self.subscribers)
            self.subscribers.clear()
        for sub in subs:
            sub.close()
            if sub.conn is not None:  # unblocks a send to a stalled reader
                try:
                    sub.conn.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        while not self._stopping:
            self._wake.wait(self.poll if self.subscribers else IDLE_SECONDS)
            self._wake.clear()
            try:
                self.tail_once()
            except Exception:  # a bug must not end live events for good
                log.exception("event hub pass failed")
                time.sleep(self.poll)

    # ------------------------------------------------------------ following the files

    def followed_files(self) -> list[str]:
        """Every `QUEUE.jsonl` in the day directories still followed."""
        self.follow_from = max(self.follow_from, day_name(time.time() - FOLLOW_DAYS * DAY))
        try:
            days = sorted(d for d in os.listdir(self.base)
                          if d.isdigit() and len(d) == 8 and d >= self.follow_from)
        except OSError:
            return []
        out: list[str] = []
        for day in days:
            directory = os.path.join(self.base, day)
            try:
                names = sorted(os.listdir(directory))
            except OSError:
                continue
            out.extend(os.path.join(directory, n) for n in names if n.endswith(".jsonl"))
        return out

    def _catch_up(self) -> None:
        """With nobody listening nothing is read: jump every offset to the
        end (called under the lock before a first subscriber joins)."""
        offsets = {}
        for path in self.followed_files():
            try:
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                continue
            try:
                offsets[path] = complete_size(fd, os.fstat(fd).st_size)
            finally:
                os.close(fd)
        self.offsets = offsets

    def tail_once(self) -> int:
        """One pass: read what is new in every followed file, dispatch it in
        time order.  Returns the number of events dispatched."""
        with self._lock:
            if not self.subscribers:
                return 0
            files: list[list[tuple[dict[str, Any], str, int]]] = []
            known = {}
            for path in self.followed_files():
                known[path] = self.offsets.get(path, 0)
                files.append([(ev, path, end) for ev, end in self._read_new(path, known)])
            self.offsets = known
            # merged by time, each file kept in its own order (a cursor's offsets rely on it)
            n = 0
            for event, path, end in heapq.merge(*files, key=lambda rec: rec[0]["ts"]):
                self._dispatch(event, path, end)
                n += 1
            return n

    def _read_new(self, path: str, offsets: dict[str, int]) -> list[tuple[dict[str, Any], int]]:
        start = offsets[path]
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return []
        try:
            size = os.fstat(fd).st_size
            if size <= start:
                return []
            data = os.pread(fd, size - start, start)
        finally:
            os.close(fd)
        end = data.rfind(b"\n") + 1
        offsets[path] = start + end
        events, bad = parse_records(data[:end], start)
        if bad:
            self.skipped += bad
            log.info("event log %s: skipped %d bad line(s) (S13.4)", path, bad)
        return events

    def _dispatch(self, event: dict[str, Any], path: str, end: int) -> None:
        topic = self.topics.topic(str(event.get("queue")))
        frame: Frame | None = None
        for sub in self.subscribers:
            if sub.cursor is not None:
                if sub.wants(topic):
                    sub.push_record(event, topic, path[len(self.base) + 1:], end)
            elif sub.wants(topic) and (sub.since is None or event["ts"] >= sub.since):
                if frame is None:
                    frame = protocol.encode_reply({**event, "topic": topic})
                sub.push(frame)

    # ------------------------------------------------------------ subscribing

    def subscribe(self, patterns: Iterable[str], since: float | None = None,
                  conn: socket.socket | None = None) -> tuple[Subscriber, Iterator[Frame]]:
        """Register a subscriber; returns it and the replay frames (ts >=
        since, time order) to send before anything from its buffer."""
        sub = Subscriber(patterns, since)
        sub.conn = conn
        snapshot, follow_from = self.register(lambda snap, day: sub)
        if since is None:
            return sub, iter(())
        return sub, self._replay(sub, since, snapshot, follow_from)

    def register(self, make: Callable[[dict[str, int], str], Subscriber]
                 ) -> tuple[dict[str, int], str]:
        """Add the subscriber `make(snapshot, follow_from)` returns, under the
        dispatch lock; the snapshot of the offsets is where its replay ends and
        live delivery starts."""
        with self._lock:
            if self._stopping:
                raise Fail("rq-mgr is stopping")
            if not self.subscribers:
                self._catch_up()
            snapshot = dict(self.offsets)
            follow_from = self.follow_from
            self.subscribers.add(make(snapshot, follow_from))
        self._wake.set()
        return snapshot, follow_from

    def unsubscribe(self, sub: Subscriber) -> None:
        with self._lock:
            self.subscribers.discard(sub)
        sub.close()

    def _replay(self, sub: Subscriber, since: float, snapshot: dict[str, int],
                follow_from: str) -> Iterator[Frame]:
        """Events of the files up to `snapshot` (files of followed days not in
        it are all live; older days are all history), merged by time."""
        first_day = day_name(since - DAY)  # a late event may sit in the day before
        try:
            days = sorted(d for d in os.listdir(self.base)
                          if d.isdigit() and len(d) == 8 and d >= first_day)
        except OSError:
            return
        topic_of = TopicMap(self.root)
        for day in days:
            directory = os.path.join(self.base, day)
            try:
                names = sorted(n for n in os.listdir(directory) if n.endswith(".jsonl"))
            except OSError:
                continue
            streams = []
            for name in names:
                path = os.path.join(directory, name)
                limit = snapshot.get(path, 0) if day >= follow_from else None
                streams.append(self._file_events(path, limit, since))
            for event in heapq.merge(*streams, key=lambda ev: ev["ts"]):
                topic = topic_of.topic(str(event.get("queue")))
                if sub.wants(topic):
                    yield protocol.encode_reply({**event, "topic": topic})

    def _file_events(self, path: str, limit: int | None,
                     since: float) -> Iterator[dict[str, Any]]:
        """Valid events of one file with ts >= since, up to `limit` bytes
        (None: the whole of it up to its last newline)."""
        for event, _ in file_records(path, 0, limit):
            if event["ts"] >= since:
                yield event


def file_records(path: str, start: int, limit: int | None) -> Iterator[tuple[dict[str, Any], int]]:
    """(event, offset after it) of one file's valid records from byte `start`
    up to `limit` (None: up to its last newline)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        end = complete_size(fd, os.fstat(fd).st_size) if limit is None else limit
        pos, rest = start, b""
        while pos < end:
            chunk = os.pread(fd, min(READ_CHUNK, end - pos), pos)
            if not chunk:
                break
            data = rest + chunk
            cut = data.rfind(b"\n") + 1
            yield from parse_records(data[:cut], pos - len(rest))[0]
            pos += len(chunk)
            rest = data[cut:]
    finally:
        os.close(fd)
