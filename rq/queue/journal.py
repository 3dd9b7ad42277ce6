"""The create journal of one queue (issue 15; S0.3 as amended in the README).

Owns the segments `queue/NAME/journal-<ns>.jnl`.  A create is acknowledged once one
record of it (its id and, for a message allocated here, its msg) is appended to the
open segment and that segment is fdatasynced: one flush for a whole group commit (from its
second append a segment is allocated ahead of its records, ROOM bytes at a time, so that the
flush writes the record and not also the inode for a new size; the zeros after the records
read as their end).  The
directories the create made (the msg in its spare, the renames to prep/ID and que/ID)
are not fsynced on that path.  They are made durable together, later, when the journal
*settles*: the segment is closed, one syncfs(2) makes every earlier write of the
filesystem durable, and the segment is removed.  Before the journal a create cost three
flushes (the msg, que/, its spare's directory); now it costs one plus its share of a
settle.

Until its segment has settled, a message is its record as much as its directory:
* a power loss may take the directory, the msg inside it or its last rename, never the
  record: `replay` (start-up recovery, S2.7, before anything reads the spool) puts the
  message back in que/ from its record, or moves it from prep/ to que/, or writes its
  msg again;
* nothing may remove an unsettled message: `settle_for` (Store.hide, every deletion of
  the queue process) settles first, and the cleaner (another process) leaves alone
  what is younger than the oldest segment (its `journal_since`);
* a message that ran and finished meanwhile keeps its record until the settle; replay
  finds its directory where the crash left it (done/, err/, …) and only mends an
  unreadable msg.

Verbs: `append` (records, durable on return), `settle` (on the settler thread
`FsOps.settle_delay` after the first record of a segment, on a stop, on demand),
`settle_for` (before a deletion), `close`.  `read_records` and `plan` read only; they
serve `replay` and `rq fsck`, which counts a journaled message where replay will put it.
"""

from __future__ import annotations

import logging
import os
import struct
import threading
import time
import zlib
from collections.abc import Iterator

from rq.fsops import FsOps, unlink_quiet
from rq.store import Store

log = logging.getLogger(__name__)
PREFIX, SUFFIX = "journal-", ".jnl"  # the stem between them: the opening time in ns
MAGIC = b"RQJ1"
HEAD = struct.Struct(">4sII")  # magic, payload length, crc32 of the payload
SETTLE_AFTER = 4096            # records in the open segment that ask for a settle now
ROOM = 256 * 1024              # bytes a segment is allocated ahead of its records, at a time


# ---------------------------------------------------------------- records (pure)
def frame(msg_id: str, data: bytes) -> bytes:
    """One record: `msg_id` and the msg bytes it was created with (b"" when the msg
    was durable before the commit: a prep_message's)."""
    payload = msg_id.encode() + b"\n" + data
    return HEAD.pack(MAGIC, len(payload), zlib.crc32(payload)) + payload


def parse(buf: bytes) -> Iterator[tuple[str, bytes]]:
    """The records of one segment, up to the first incomplete or damaged one (a torn
    tail: the append whose fdatasync never returned, so nothing acknowledged)."""
    pos = 0
    while pos + HEAD.size <= len(buf):
        magic, size, crc = HEAD.unpack_from(buf, pos)
        payload = buf[pos + HEAD.size:pos + HEAD.size + size]
        if magic != MAGIC or len(payload) != size or zlib.crc32(payload) != crc:
            return
        msg_id, _, data = payload.partition(b"\n")
        yield msg_id.decode("ascii", "replace"), data
        pos += HEAD.size + size


def segments(qdir: str) -> list[str]:
    """The segment paths of the queue at `qdir`, oldest first."""
    try:
        names = os.listdir(qdir)
    except FileNotFoundError:
        return []
    return [os.path.join(qdir, n) for n in sorted(names)
            if n.startswith(PREFIX) and n.endswith(SUFFIX)]


def read_records(qdir: str) -> list[tuple[str, bytes]]:
    """Every record of every segment of the queue at `qdir`, in append order; for one
    id the last record with msg bytes wins in `plan`."""
    out: list[tuple[str, bytes]] = []
    for path in segments(qdir):
        try:
            with open(path, "rb") as fh:
                out.extend(parse(fh.read()))
        except OSError as exc:
            log.warning("cannot read the journal segment %s: %s", path, exc)
    return out


def msg_readable(path: str, msg_id: str) -> bool:
    try:
        return Store.read_msg(path).get("msg_id") == msg_id
    except (OSError, ValueError):
        return False


class Step:
    """What replay does for one journaled message: `state`/`path` where it was found
    (None: nowhere), `commit` (prep → que), `mend` (rewrite an unreadable msg),
    `data` the msg bytes of its record."""

    __slots__ = ("msg_id", "state", "path", "data", "commit", "mend")

    def __init__(self, msg_id: str, state: str | None, path: str | None, data: bytes,
                 mend: bool) -> None:
        self.msg_id, self.state, self.path, self.data = msg_id, state, path, data
        self.commit = state in (None, "prep")
        self.mend = mend

    @property
    def final_state(self) -> str | None:
        if self.state is None and not self.data:
            return None  # nothing to recreate it from (never expected: see plan)
        return "que" if self.commit else self.state


def plan(store: Store, records: list[tuple[str, bytes]]) -> list[Step]:
    """The replay of `records` over the queue as it is on disk (reads only)."""
    data: dict[str, bytes] = {}
    for msg_id, blob in records:
        if blob or msg_id not in data:
            data[msg_id] = blob
    steps = []
    for msg_id, blob in data.items():
        found = store.locate(msg_id)
        if found is None:
            steps.append(Step(msg_id, None, None, blob, mend=False))
            continue
        state, path = found
        steps.append(Step(msg_id, state, path, blob,
                          mend=bool(blob) and not msg_readable(path, msg_id)))
    return steps


# ---------------------------------------------------------------- start-up
def replay(store: Store, fs: FsOps) -> int:
    """Apply the journal left by the last run (S2.7, before the spool is read), each step
    made durable by its own fsyncs, then remove the segments; the messages put back."""
    paths = segments(store.qdir)
    if not paths:
        return 0
    records = read_records(store.qdir)
    if not records:  # segments with no record (a create that failed): nothing to keep
        for path in paths:
            unlink_quiet(path)
        return 0
    restored = 0
    for step in plan(store, records):
        try:
            restored += apply(store, fs, step)
        except OSError as exc:  # the segments stay: the next start tries again
            raise OSError(exc.errno, f"journal replay of {step.msg_id}: {exc.strerror}") from exc
    for path in paths:
        fs.unlink(path)
    fs.fsync_dir(store.qdir)
    return restored


def apply(store: Store, fs: FsOps, step: Step) -> int:
    if step.state is None:
        if not step.data:
            log.error("journal: %s is gone and its record has no msg to restore it from",
                      step.msg_id)
            return 0
        path = store.msg_path("prep", step.msg_id)
        fs.mkdir(path)
        fs.write_file_private(os.path.join(path, "msg"), step.data)
        fs.fsync_dir(path)
        log.warning("journal: restored %s from its record", step.msg_id)
    else:
        assert step.path is not None
        path = step.path
        if step.mend:
            fs.write_file_atomic(os.path.join(path, "msg"), step.data, sync=True)
            log.warning("journal: restored the msg of %s/%s", step.state, step.msg_id)
    if step.commit:
        store.move(step.msg_id, "prep", "que")
        return 1
    return int(step.mend)


# ---------------------------------------------------------------- the running queue
class Journal:
    def __init__(self, store: Store, fs: FsOps) -> None:
        self.fs = fs
        self.qdir = store.qdir
        self._lock = threading.Lock()          # the open segment and `_pending`
        self._settling = threading.Lock()      # one settle at a time
        self._wake = threading.Condition(self._lock)
        # the open segment: descriptor, path, bytes and records in it, bytes allocated (ROOM)
        self._fd, self._path, self._size, self._count, self._room = -1, "", 0, 0, 0
        self._pending: dict[str, set[str]] = {}  # segment -> ids, until settled
        self._closed = False
        self._thread: threading.Thread | None = None  # only while records are pending

    # ------------------------------------------------------------ appending
    def append(self, entries: list[tuple[str, bytes]]) -> None:
        """The records of `entries` (id, msg bytes) on stable storage on return; an
        OSError leaves none of them to replay (the segment is cut back and closed)."""
        blob = b"".join(frame(msg_id, data) for msg_id, data in entries)
        with self._lock:
            if self._closed:
                raise OSError(5, "the journal is closed")
            if self._fd < 0:
                self._open_segment()
            end = self._size + len(blob)
            if self._size and end > self._room:  # a segment of one record stays small
                self._room = end + ROOM
                self.fs.preallocate_log(self._fd, self._room)
            try:
                self.fs.append_log(self._fd, blob, self._size)
                self.fs.sync_log(self._fd)
            except OSError:
                self._cut_back()
                raise
            self._size += len(blob)
            self._count += len(entries)
            self._pending.setdefault(self._path, set()).update(i for i, _ in entries)
            if self._thread is None and self.fs.settle_delay is not None:
                # a thread is private memory of each of a host's queue processes (issue
                # 17): the settler runs only while there is something to settle
                self._thread = threading.Thread(target=self._settler, name="rq-journal",
                                                args=(self.fs.settle_delay,), daemon=True)
                self._thread.start()
            elif self._count >= SETTLE_AFTER:
                self._wake.notify()

    def _open_segment(self) -> None:
        path = os.path.join(self.qdir, f"{PREFIX}{time.time_ns():020d}{SUFFIX}")
        fd = self.fs.create_log(path)
        try:
            self.fs.fsync_dir(self.qdir)  # the segment's name, before any record counts
        except OSError:
            os.close(fd)
            try:
                self.fs.unlink(path)
            except OSError:
                pass
            raise
        self._fd, self._path, self._size, self._count, self._room = fd, path, 0, 0, 0

    def _cut_back(self) -> None:
        """After a failed append: what it wrote may reach the disk, so it is cut off, and
        the segment is closed (the next append opens another)."""
        try:
            os.ftruncate(self._fd, self._size)
            os.fdatasync(self._fd)
        except OSError as exc:
            log.error("journal: cannot cut back %s after a failed append: %s", self._path, exc)
        if not self._size:
            self._pending.pop(self._path, None)
            try:
                self.fs.unlink(self._path)
            except OSError:
                pass
        self._close_segment()

    def _close_segment(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
        self._fd, self._path, self._size, self._count, self._room = -1, "", 0, 0, 0

    # ------------------------------------------------------------ settling
    def settle(self) -> None:
        """Every message journaled so far durable as its directory; then its records go.
        Raises OSError (the records stay, for the next settle or the next start)."""
        with self._settling:
            with self._lock:
                done = list(self._pending)
                if self._path in self._pending:
                    self._close_segment()
            if not done:
                return
            self.fs.syncfs(self.qdir)
            for path in done:
                try:
                    self.fs.unlink(path)
                except FileNotFoundError:
                    pass  # by an earlier settle that failed after it
            self.fs.fsync_dir(self.qdir)
            with self._lock:
                for path in done:
                    self._pending.pop(path, None)

    def settle_for(self, *msg_ids: str) -> None:
        """Before any of `msg_ids` is removed: settle when a record of one is still
        pending (else a replay after a power loss would bring it back).  A caller that
        holds the queue lock for the removal calls this first, outside it, so that the
        syncfs does not stall the loop; Store.hide calls it again, a cheap check then."""
        with self._lock:
            pending = any(not ids.isdisjoint(msg_ids) for ids in self._pending.values())
        if pending:
            self.settle()

    def _settler(self, delay: float) -> None:
        """Settle `delay` after the first pending record (sooner when a segment holds
        SETTLE_AFTER), again while records come; leave when nothing is pending."""
        wait = delay
        while True:
            with self._lock:
                if self._closed or not self._pending:
                    self._thread = None
                    return
                if self._count < SETTLE_AFTER:
                    self._wake.wait(wait)
                if self._closed:
                    self._thread = None
                    return
            try:
                self.settle()
                wait = delay
            except OSError as exc:
                wait = delay * 5
                log.error("journal: cannot settle (tried again in %.0f s): %s", wait, exc)

    def close(self) -> None:
        """The end of a graceful stop: settle (a failure is logged: the next start
        replays), stop the settler, close the segment."""
        try:
            self.settle()
        except OSError as exc:
            log.error("journal: cannot settle at stop, the next start replays it: %s", exc)
        with self._lock:
            self._closed = True
            self._close_segment()
            self._wake.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join(5)
