"""The operation log of the power-loss test (issue 13): what hit the kernel, in order.

Owns the log format only.  `fsseams.RecordingFsOps` (chosen by `RQ_FS_RECORD=PATH`
in a daemon's main(), tests only) performs each spool file operation and then
appends the primitive effects it had, one JSON object per line:

    {"op": "write", "path": P, "data": BASE64}   create P if missing, content := data
    {"op": "fsync", "path": P}                   fsync of the file P
    {"op": "fsyncdir", "path": P}                fsync of the directory P
    {"op": "mkdir", "path": P}
    {"op": "rename", "src": S, "dst": D}         replaces D (no-clobber renames succeeded)
    {"op": "link", "src": S, "dst": D}
    {"op": "unlink", "path": P}    {"op": "rmtree", "path": P}
    {"op": "append", "path": P, "data": BASE64}  one write() on an O_APPEND file (S13)
    {"op": "ack", "queue": Q, "id": ID, ...}     a client got `ok` for message ID

Every line also carries "pid".  Every process of a run appends to the same
file with one write() per line on an O_APPEND descriptor, so lines never
interleave; within a process the recorder holds one lock across an operation
and its line, so the log order is the order the operations took effect.  A
test client appends the `ack` lines itself after it receives `ok`: they follow
the fsyncs that made the message durable.  The replay (tests/crashstates.py)
reads the log with `read_log`.  Nothing here touches the spool.
"""

from __future__ import annotations

import base64
import json
import os
from typing import Any

ENV = "RQ_FS_RECORD"


class OpLog:
    """An operation log opened for appending (shared by processes)."""

    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        self.pid = os.getpid()

    def add(self, op: str, **fields: Any) -> None:
        record: dict[str, Any] = {"op": op, "pid": self.pid}
        for key, value in fields.items():
            record[key] = base64.b64encode(value).decode() if isinstance(value, bytes) else value
        os.write(self.fd, json.dumps(record, separators=(",", ":")).encode() + b"\n")

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def read_log(path: str) -> list[dict[str, Any]]:
    """The records of a log, `data` decoded to bytes.  A torn last line (a
    recording process killed mid-write) is dropped."""
    out = []
    with open(path, "rb") as fh:
        for line in fh:
            if not line.endswith(b"\n"):
                break
            record = json.loads(line)
            if "data" in record:
                record["data"] = base64.b64decode(record["data"])
            out.append(record)
    return out
