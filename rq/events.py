"""The append-only event log of one queue (SPEC S13).

Owns `log/events/YYYYMMDD/QUEUE.jsonl` for its queue: one line per message
state transition, `{"crc32":"XXXXXXXX","event":PAYLOAD}\\n`, each written by a
single write() on an O_APPEND descriptor after the transition is on disk.
Torn-tail recovery (S13.4, issue 18 item 4, seed 001's write-position
recovery): a writer that opens a file whose last record is torn or fails its
CRC finds the end of the last good record, moves the bytes after it into a
sidecar `QUEUE.jsonl.torn-OFFSET` next to the file (fsynced, never silently
discarded; readers ignore it: it does not end in `.jsonl`), truncates the file
there and appends from it.  `torn_tails` lists such files and sidecars for
`rq fsck`.  Also the pure `encode_event`/`decode_line` pair that readers
(analytics, subscriptions) use.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import zlib
from typing import Any

from rq import protocol
from rq.fsops import FsOps

log = logging.getLogger(__name__)

SIDECAR = ".torn-"      # QUEUE.jsonl.torn-OFFSET[.N]: the bad bytes found at OFFSET
SCAN_CHUNK = 64 * 1024  # bytes read from the end per step of the backward scan
DAY = 86400  # seconds in a UTC day of the file names

FIELDS = ("ts", "host", "queue", "msg_id", "from", "to", "status", "count", "pid",
          "exit_code", "duration")


def encode_event(payload: dict[str, Any]) -> bytes:
    body = protocol.dumps(payload).encode()
    return b'{"crc32":"%08x","event":' % (zlib.crc32(body) & 0xFFFFFFFF) + body + b"}\n"


def decode_line(line: bytes) -> dict[str, Any] | None:
    """The payload of one line, or None when it fails a S13.4 check."""
    if not line.endswith(b"\n") or not line.startswith(b'{"crc32":"') \
            or line[18:28] != b'","event":':
        return None
    body = line[28:-2]
    if line[-2:-1] != b"}":
        return None
    try:
        if int(line[10:18], 16) != zlib.crc32(body) or line[10:18] != line[10:18].lower():
            return None
        payload = json.loads(body)
    except ValueError:
        return None
    return payload if isinstance(payload, dict) else None


class EventLog:
    def __init__(self, root: str, host: str, queue: str, fs: FsOps | None = None) -> None:
        self.base = os.path.join(root, "log", "events")
        self.host = host
        self.queue = queue
        self.fs = fs or FsOps()
        self._lock = threading.Lock()
        self._day = ""
        self._fd = -1
        self._day_end = 0.0  # the open file's day ends here (UTC days are whole 86,400 s)

    def log(self, msg_id: str, frm: str | None, to: str, *, status: str | None = None,
            count: int | None = None, pid: int | None = None, exit_code: int | None = None,
            duration: float | None = None, ts: float | None = None,
            extra: dict[str, Any] | None = None) -> dict[str, Any]:
        """Append one transition; never raises (a full disk must not stop the queue)."""
        now = time.time() if ts is None else ts
        payload: dict[str, Any] = {
            "ts": round(now, 3), "host": self.host, "queue": self.queue, "msg_id": msg_id,
            "from": frm, "to": to, "status": status, "count": count, "pid": pid,
            "exit_code": exit_code,
            "duration": None if duration is None else round(duration, 3),
        }
        if extra:
            payload.update(extra)
        line = encode_event(payload)
        with self._lock:
            try:
                self.fs.append(self._fd_for(now), line)
            except OSError:
                self._close()
        return payload

    def _fd_for(self, now: float) -> int:
        if self._fd >= 0 and self._day_end - DAY <= now < self._day_end:
            return self._fd  # no gmtime and strftime for each event (issue 15)
        day = time.strftime("%Y%m%d", time.gmtime(now))
        if day != self._day or self._fd < 0:
            self._close()
            directory = os.path.join(self.base, day)
            os.makedirs(directory, exist_ok=True)
            path = os.path.join(directory, self.queue + ".jsonl")
            fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                recover_tail(path, fd)
            except OSError:
                os.close(fd)  # nothing is appended after bad bytes: retried at the next event
                raise
            self._fd, self._day = fd, day
        self._day_end = now - now % DAY + DAY
        return self._fd

    def _close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
        self._fd, self._day = -1, ""

    def close(self) -> None:
        with self._lock:
            self._close()


# ---------------------------------------------------------------- torn tails (issue 18)


def good_end(data: bytes, *, whole: bool) -> int | None:
    """The offset in `data` just after its last line that passes the S13.4
    checks; 0 when `whole` (data starts the file) and there is none; None when
    the answer needs bytes before `data`."""
    nl = data.rfind(b"\n")
    while nl >= 0:
        prev = data.rfind(b"\n", 0, nl)
        if prev < 0 and not whole:
            return None  # this line may start before the chunk
        if decode_line(data[prev + 1:nl + 1]) is not None:
            return nl + 1
        nl = prev
    return 0 if whole else None


def last_good_end(fd: int, size: int) -> int:
    """The file offset just after its last good record, read backwards from
    `size` in growing chunks (usually one read of the last 64 KiB)."""
    chunk = SCAN_CHUNK
    while True:
        start = max(0, size - chunk)
        end = good_end(os.pread(fd, size - start, start), whole=start == 0)
        if end is not None:
            return start + end
        chunk *= 4


def recover_tail(path: str, fd: int) -> str | None:
    """Move whatever follows the last good record of the open file `path` into
    a new sidecar and truncate the file there; the sidecar's path, or None
    when the tail is good.  The sidecar is durable before the truncation, so a
    crash in between only repeats the recovery (a second sidecar, same bytes)."""
    size = os.fstat(fd).st_size
    good = last_good_end(fd, size) if size else 0
    if good == size:
        return None
    sidecar = write_sidecar(path, good, os.pread(fd, size - good, good))
    os.ftruncate(fd, good)
    os.fsync(fd)
    log.warning("event log %s: %d bad byte(s) after offset %d moved to %s (S13.4)",
                path, size - good, good, os.path.basename(sidecar))
    return sidecar


def write_sidecar(path: str, offset: int, data: bytes) -> str:
    """`PATH.torn-OFFSET` (or `.1`, `.2` … when taken: an earlier sidecar is
    never replaced), written and fsynced with its directory."""
    base = f"{path}{SIDECAR}{offset}"
    for n in range(1000):
        name = base if n == 0 else f"{base}.{n}"
        try:
            fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        except FileExistsError:
            continue
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        dfd = os.open(os.path.dirname(path), os.O_RDONLY | os.O_CLOEXEC)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
        return name
    raise FileExistsError(f"{base}: too many sidecars")


def torn_tails(root: str) -> list[str]:
    """For `rq fsck`: one line per event-log file whose tail is bad now (it is
    moved aside when its queue next opens the file) and per sidecar kept."""
    base = os.path.join(root, "log", "events")
    out: list[str] = []
    for day in sorted(_listdir(base)):
        for name in sorted(_listdir(os.path.join(base, day))):
            rel = f"log/events/{day}/{name}"
            full = os.path.join(base, day, name)
            if SIDECAR in name:
                out.append(f"{rel}: {os.path.getsize(full)} bad byte(s) moved aside "
                           "from a torn event-log tail, kept for inspection")
            elif name.endswith(".jsonl"):
                out.extend(_tail_note(rel, full))
    return out


def _tail_note(rel: str, full: str) -> list[str]:
    try:
        fd = os.open(full, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return []
    try:
        size = os.fstat(fd).st_size
        good = last_good_end(fd, size) if size else 0
    finally:
        os.close(fd)
    if good == size:
        return []
    return [f"{rel}: torn tail, {size - good} bad byte(s) after offset {good} "
            "(moved aside when its queue next writes this file)"]


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []
