"""Figures read from disk for the web server, and their Prometheus exposition (SPEC S18).

Owns the text format (`# HELP`/`# TYPE` for every family, label values escaped
as the format says, `+Inf` histogram buckets); `DiskCounts`, the counts and
oldest due time of a queue whose process is not RUNNING (S15.1); and
`EventTally`, which keeps `rq_jobs_finished_total` and
`rq_job_duration_seconds`.  The live figures of running queues (status,
counts, workers, restarts, oldest due) are gathered by `web.api` and handed to
`render` as `QueueFigures`.

Why the event log: the finished-job counter and the run-duration histogram
need every transition out of `run`, and the queue processes keep no such
totals.  The event log (S13) has them, one line per transition with its
`duration`.  `EventTally` reads `log/events/*/QUEUE.jsonl` incrementally: it
remembers a byte offset per file (always just after a complete line, so a line
being appended is read whole at the next scrape) and on each scrape reads only
the bytes added since, decoding them with `rq.events.decode_line` (torn or
corrupt lines are skipped and counted, S13.4).  When the tally is created
(with the app) every existing file is skipped to its end: the counters count
transitions since this web server started, which S18 allows ("counters MAY
restart from 0"), and a start never has to read 30 days of history.  Files
that appear later (a new day, a new queue) are read from their start.  Files
removed by the cleaner are forgotten; their counts stay.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from rq import protocol
from rq.events import decode_line
from rq.store import HASHED, Store

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
STATUSES = ("UP", "DOWN", "PAUSE", "SCRIPTERROR", "STARTING", "BACKOFF", "STOPPING", "FATAL")
STATES = ("prep", "que", "run", "done", "relayed", "err")
COUNT_ORDER = ("prep", "que", "run", "err", "done", "relayed")  # S15.1
FINISHED_TO = ("done", "err", "relayed", "que")
BUCKETS = (0.1, 0.5, 1, 5, 10, 30, 60, 300, 900, 3600)
READ_CHUNK = 1 << 20
SETTLE_NS = 2_000_000_000  # a directory changed this recently may change again unseen


class DiskCounts:
    """Counts of a queue whose process is not RUNNING, from disk (S15.1).

    Flat states are one listing each.  A done/relayed minute bucket is listed
    once and then remembered by its mtime, so repeated polls of a stopped queue
    with 100,000 finished messages stat a few hundred directories instead of
    listing every id.  Buckets changed in the last 2 s are not remembered: a
    change within the same mtime tick would go unseen."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.buckets: dict[str, tuple[int, int]] = {}
        self.oldest: dict[str, tuple[int, float | None]] = {}

    def counts(self, store: Store) -> dict[str, int]:
        found = {s: self.count_hashed(store.state_dir(s)) if s in HASHED
                 else len(store.list_flat(s)) for s in COUNT_ORDER}
        return found

    def count_hashed(self, base: str) -> int:
        minutes = [m for day in _subdirs(base) for hour in _subdirs(day) for m in _subdirs(hour)]
        total = sum(self.count_bucket(minute) for minute in minutes)
        with self.lock:  # forget buckets removed since (the cleaner, an operator)
            seen = set(minutes)
            for gone in [p for p in self.buckets if p.startswith(base + os.sep) and p not in seen]:
                del self.buckets[gone]
        return total

    def count_bucket(self, path: str) -> int:
        try:
            mtime = os.stat(path).st_mtime_ns
        except OSError:
            return 0
        with self.lock:
            cached = self.buckets.get(path)
        if cached is not None and cached[0] == mtime:
            return cached[1]
        count = sum(1 for n in _listdir(path) if protocol.valid_msg_id(n))
        if time.time_ns() - mtime > SETTLE_NS:
            with self.lock:
                self.buckets[path] = (mtime, count)
        return count

    def oldest_due(self, store: Store) -> float | None:
        """The smallest `due` in que/ (remembered by the directory's mtime)."""
        path = store.state_dir("que")
        try:
            mtime = os.stat(path).st_mtime_ns
        except OSError:
            return None
        with self.lock:
            cached = self.oldest.get(path)
        if cached is not None and cached[0] == mtime:
            return cached[1]
        dues = [due for _, due in disk_que(store)]
        oldest = min(dues) if dues else None
        if time.time_ns() - mtime > SETTLE_NS:
            with self.lock:
                self.oldest[path] = (mtime, oldest)
        return oldest


def disk_que(store: Store) -> list[tuple[str, float]]:
    """(id, due) of que/ on disk in scheduling order (S5.1)."""
    out = []
    for msg_id in store.list_flat("que"):
        try:
            due = store.read_msg(store.msg_path("que", msg_id)).get("due")
        except (OSError, ValueError):
            continue
        usable = isinstance(due, (int, float)) and not isinstance(due, bool)
        out.append((msg_id, float(due or 0) if usable else 0.0))
    return sorted(out, key=lambda item: (item[1], item[0]))


def _subdirs(path: str) -> list[str]:
    return [os.path.join(path, n) for n in _listdir(path) if not n.startswith(".")]


@dataclass(frozen=True)
class QueueFigures:
    """What one queue contributes to the exposition."""

    name: str
    status: str                       # S3.5 status, or the supervision state
    counts: dict[str, int]
    workers: int | None               # None when the config cannot be read
    restarts: int
    oldest_due_age: float


@dataclass
class Histogram:
    buckets: list[int] = field(default_factory=lambda: [0] * len(BUCKETS))
    total: float = 0.0
    count: int = 0

    def observe(self, value: float) -> None:
        for i, bound in enumerate(BUCKETS):
            if value <= bound:
                self.buckets[i] += 1
        self.total += value
        self.count += 1


class EventTally:
    """Transitions out of `run` per queue, read incrementally from the event log."""

    def __init__(self, root: str) -> None:
        self.base = os.path.join(root, "log", "events")
        self.lock = threading.Lock()
        self.offsets: dict[str, int] = {}
        self.finished: dict[tuple[str, str], int] = {}
        self.durations: dict[str, Histogram] = {}
        self.skipped = 0
        for path in self._files():
            self.offsets[path] = _end_of_last_line(path)

    def _files(self) -> Iterator[str]:
        for day in _listdir(self.base):
            directory = os.path.join(self.base, day)
            for name in _listdir(directory):
                if name.endswith(".jsonl"):
                    yield os.path.join(directory, name)

    def update(self) -> None:
        """Read what was appended since the last call."""
        with self.lock:
            seen = set()
            for path in self._files():
                seen.add(path)
                self.offsets[path] = self._read_from(path, self.offsets.get(path, 0))
            for gone in set(self.offsets) - seen:
                del self.offsets[gone]

    def _read_from(self, path: str, offset: int) -> int:
        try:
            with open(path, "rb") as fh:
                if os.fstat(fh.fileno()).st_size < offset:  # replaced by a new file
                    offset = 0
                fh.seek(offset)
                data = fh.read(READ_CHUNK)
                while data:
                    end = data.rfind(b"\n") + 1
                    if end == 0:  # a partial line only: read it whole next time
                        break
                    self._count_lines(data[:end])
                    offset += end
                    fh.seek(offset)
                    data = fh.read(READ_CHUNK)
        except OSError:
            pass
        return offset

    def _count_lines(self, chunk: bytes) -> None:
        for line in chunk.splitlines(keepends=True):
            event = decode_line(line)
            if event is None:
                self.skipped += 1
            elif event.get("from") == "run" and event.get("to") in FINISHED_TO:
                self._count(event)

    def _count(self, event: dict) -> None:
        queue = str(event.get("queue"))
        key = (queue, str(event["to"]))
        self.finished[key] = self.finished.get(key, 0) + 1
        duration = event.get("duration")
        if isinstance(duration, (int, float)) and not isinstance(duration, bool) \
                and math.isfinite(duration):
            self.durations.setdefault(queue, Histogram()).observe(max(0.0, float(duration)))


def _listdir(path: str) -> list[str]:
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


def _end_of_last_line(path: str) -> int:
    """The offset just after the file's last newline (0 when it has none)."""
    try:
        with open(path, "rb") as fh:
            size = fh.seek(0, os.SEEK_END)
            pos = size
            while pos > 0:
                start = max(0, pos - 65536)
                fh.seek(start)
                block = fh.read(pos - start)
                cut = block.rfind(b"\n")
                if cut >= 0:
                    return start + cut + 1
                pos = start
    except OSError:
        pass
    return 0


# ---------------------------------------------------------------- the text format


def escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def number(value: float) -> str:
    if isinstance(value, bool):
        return str(int(value))
    if isinstance(value, int) or (isinstance(value, float) and value.is_integer()
                                  and abs(value) < 1e15):
        return str(int(value))
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(value)


Sample = tuple[str, dict[str, str], float]


class Exposition:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def family(self, name: str, kind: str, text: str, samples: Iterable[Sample]) -> None:
        self.lines.append(f"# HELP {name} {escape_help(text)}")
        self.lines.append(f"# TYPE {name} {kind}")
        for sample_name, labels, value in samples:
            label_text = ",".join(f'{k}="{escape_label(v)}"' for k, v in labels.items())
            self.lines.append(f"{sample_name}{{{label_text}}} {number(value)}" if label_text
                              else f"{sample_name} {number(value)}")

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


def render_down(version: str) -> str:
    out = Exposition()
    out.family("rq_up", "gauge", "1 when the RQ manager answers, else 0", [("rq_up", {}, 0)])
    _build_info(out, version)
    return out.text()


def render(version: str, mgr_uptime: int, queues: list[QueueFigures], tally: EventTally,
           timers: dict[str, int]) -> str:
    out = Exposition()
    out.family("rq_up", "gauge", "1 when the RQ manager answers, else 0", [("rq_up", {}, 1)])
    _build_info(out, version)
    out.family("rq_mgr_uptime_seconds", "gauge", "Seconds since rq-mgr started",
               [("rq_mgr_uptime_seconds", {}, mgr_uptime)])
    _queue_families(out, queues)
    _job_families(out, [q.name for q in queues], tally)
    out.family("rq_timer_fires_total", "counter", "Messages sent by timers",
               [("rq_timer_fires_total", {}, timers.get("sent", 0))])
    out.family("rq_timer_errors_total", "counter", "Timer fires that failed",
               [("rq_timer_errors_total", {}, timers.get("errors", 0))])
    return out.text()


def _build_info(out: Exposition, version: str) -> None:
    out.family("rq_build_info", "gauge", "RQ version of the web server",
               [("rq_build_info", {"version": version}, 1)])


def _queue_families(out: Exposition, queues: list[QueueFigures]) -> None:
    out.family("rq_queue_status", "gauge",
               "1 for the queue's current status or supervision state, 0 for the others",
               [("rq_queue_status", {"queue": q.name, "status": s}, int(q.status == s))
                for q in queues for s in STATUSES])
    out.family("rq_queue_messages", "gauge", "Messages per state",
               [("rq_queue_messages", {"queue": q.name, "state": s}, q.counts.get(s, 0))
                for q in queues for s in STATES])
    out.family("rq_queue_workers", "gauge", "num_workers of the queue config",
               [("rq_queue_workers", {"queue": q.name}, q.workers)
                for q in queues if q.workers is not None])
    out.family("rq_queue_restarts_total", "counter", "Unexpected restarts of the queue process",
               [("rq_queue_restarts_total", {"queue": q.name}, q.restarts) for q in queues])
    out.family("rq_queue_oldest_due_age_seconds", "gauge",
               "Seconds since the due time of the oldest due message in que (0 when none)",
               [("rq_queue_oldest_due_age_seconds", {"queue": q.name}, q.oldest_due_age)
                for q in queues])


def _job_families(out: Exposition, names: list[str], tally: EventTally) -> None:
    with tally.lock:
        finished = dict(tally.finished)
        durations = {n: tally.durations.get(n, Histogram()) for n in names}
    out.family("rq_jobs_finished_total", "counter",
               "Transitions out of run by target state, since the web server started",
               [("rq_jobs_finished_total", {"queue": n, "to": to}, finished.get((n, to), 0))
                for n in names for to in FINISHED_TO])
    samples: list[Sample] = []
    for name, hist in durations.items():
        for bound, count in zip(BUCKETS, hist.buckets):
            samples.append(("rq_job_duration_seconds_bucket",
                            {"queue": name, "le": number(bound)}, count))
        samples.append(("rq_job_duration_seconds_bucket", {"queue": name, "le": "+Inf"},
                        hist.count))
        samples.append(("rq_job_duration_seconds_sum", {"queue": name}, hist.total))
        samples.append(("rq_job_duration_seconds_count", {"queue": name}, hist.count))
    out.family("rq_job_duration_seconds", "histogram", "Seconds in run per finished run",
               samples)
