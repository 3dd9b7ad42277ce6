"""The append-only event log of one queue (SPEC S13).

Owns `log/events/YYYYMMDD/QUEUE.jsonl` for its queue: one line per message
state transition, `{"crc32":"XXXXXXXX","event":PAYLOAD}\\n`, each written by a
single write() on an O_APPEND descriptor after the transition is on disk.  A
file whose last byte is not a newline (a torn tail left by a crash) gets one
first, so the fragment becomes a single skipped line (S13.4).  Also the pure
`encode_event`/`decode_line` pair that readers (analytics, subscriptions) use.
"""

from __future__ import annotations

import json
import os
import threading
import time
import zlib
from typing import Any

from rq import protocol
from rq.fsops import FsOps

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
        day = time.strftime("%Y%m%d", time.gmtime(now))
        if day != self._day or self._fd < 0:
            self._close()
            directory = os.path.join(self.base, day)
            os.makedirs(directory, exist_ok=True)
            fd = os.open(os.path.join(directory, self.queue + ".jsonl"),
                         os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
            _mend_torn_tail(fd)
            self._fd, self._day = fd, day
        return self._fd

    def _close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
        self._fd, self._day = -1, ""

    def close(self) -> None:
        with self._lock:
            self._close()


def _mend_torn_tail(fd: int) -> None:
    size = os.fstat(fd).st_size
    if size and os.pread(fd, 1, size - 1) != b"\n":
        os.write(fd, b"\n")
