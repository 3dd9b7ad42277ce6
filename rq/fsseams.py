"""The test seams of `rq.fsops` (issue 2's fault injection, issue 13's power-loss record).

Owns `FaultyFsOps` (fails or delays chosen operations: `RQ_FS_FAULTS`), `RecordingFsOps`
(appends every primitive to an operation log: `RQ_FS_RECORD`, rq.fsrecord) and the parsing of
a fault plan.  Daemons reach it only through `fsops.from_environment`, and only when one of
those variables is set: a production daemon never imports it.
"""

from __future__ import annotations

import errno
import os
import threading
import time
from collections.abc import Mapping

from rq import fsrecord
from rq.fsops import FsOps


class FaultyFsOps(FsOps):
    """Fails chosen operations: `plan` maps op name to {call number: errno}, or
    delays them: {call number: seconds} (a float).

    Call numbers count from 1 per op name; `0` as the call number fails every
    call.  Example plan text (RQ_FS_FAULTS): `fsync:3:EIO,rename:2:ENOSPC`.
    """

    def __init__(self, plan: Mapping[str, Mapping[int, int | float]], record: str | None = None,
                 *, spares: bool = False) -> None:
        super().__init__()
        self.spares = spares
        self.settle_delay = None
        self.plan = {k: dict(v) for k, v in plan.items()}
        self.counts: dict[str, int] = {}
        self._lock = threading.Lock()
        self._record = open(record, "a", buffering=1) if record else None

    def close(self) -> None:
        if self._record is not None:
            self._record.close()
            self._record = None

    def op(self, name: str) -> None:
        with self._lock:
            n = self.counts.get(name, 0) + 1
            self.counts[name] = n
            if self._record is not None:
                self._record.write(f"{name} {n}\n")
        faults = self.plan.get(name)
        if not faults:
            return
        err = faults.get(n, faults.get(0))
        if isinstance(err, float):
            time.sleep(err)
        elif err:
            raise OSError(err, f"injected {os.strerror(err)} on {name} #{n}")


class RecordingFsOps(FsOps):
    """The real filesystem, with every operation also appended, as the
    primitive effects it had, to an operation log (rq.fsrecord: the
    power-loss test replays it).  One lock is held across each operation and
    its log line, so the log order is the order the operations took effect in
    this process; it serialises the fsyncs of concurrent threads, a cost only
    tests pay.  No spares: their thread works outside the seam."""

    spares = False

    def __init__(self, path: str) -> None:
        super().__init__()
        self.log = fsrecord.OpLog(path)
        self._rec = threading.RLock()
        self._logs: dict[int, tuple[str, bytes]] = {}  # create_log fd -> (path, content)

    def replace(self, tmp: str, path: str, *, keep_old: bool = False) -> bool:
        with self._rec:  # keep_old needs a spare: never asked here, so a plain rename
            super().replace(tmp, path)
            self.log.add("rename", src=tmp, dst=path)
        return False

    def write_file_private(self, path: str, data: bytes, *, sync: bool = True) -> None:
        with self._rec:
            super().write_file_private(path, data, sync=False)
            self.log.add("write", path=path, data=data)
        if sync:
            self.fsync_file(path)

    def fsync_file(self, path: str) -> None:
        with self._rec:
            self.op("fsync")
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            try:
                os.fsync(fd)  # flushes the inode's data whichever descriptor asks
            finally:
                os.close(fd)
            self.log.add("fsync", path=path)

    def fsync_dir(self, path: str) -> None:
        with self._rec:
            super().fsync_dir(path)
            self.log.add("fsyncdir", path=path)

    def create_log(self, path: str) -> int:
        with self._rec:
            fd = super().create_log(path)
            self._logs[fd] = (path, b"")
            self.log.add("write", path=path, data=b"")
        return fd

    def append_log(self, fd: int, data: bytes, offset: int) -> None:
        """Logged as a write of the whole content: the model keeps a file's last
        fsynced content or any later one, which for appends is a longer prefix (the
        zeros of preallocate_log after it read as the end of the records: no content)."""
        with self._rec:
            super().append_log(fd, data, offset)
            path, old = self._logs[fd]
            self._logs[fd] = (path, old + data)
            self.log.add("write", path=path, data=old + data)

    def sync_log(self, fd: int) -> None:
        with self._rec:
            super().sync_log(fd)
            self.log.add("fsync", path=self._logs[fd][0])

    def syncfs(self, path: str) -> None:
        with self._rec:
            super().syncfs(path)
            self.log.add("syncfs", path=path)

    def append(self, fd: int, data: bytes) -> None:
        with self._rec:
            super().append(fd, data)
            self.log.add("append", path=os.readlink(f"/proc/self/fd/{fd}"), data=data)

    def mkdir(self, path: str, mode: int = 0o755) -> None:
        with self._rec:
            super().mkdir(path, mode)
            self.log.add("mkdir", path=path)

    def rename_noreplace(self, src: str, dst: str) -> None:
        with self._rec:
            super().rename_noreplace(src, dst)
            self.log.add("rename", src=src, dst=dst)

    def rename(self, src: str, dst: str) -> None:
        with self._rec:
            super().rename(src, dst)
            self.log.add("rename", src=src, dst=dst)

    def link_or_copy(self, src: str, dst: str, *, allow_copy: bool = True) -> bool:
        with self._rec:
            copied = super().link_or_copy(src, dst, allow_copy=allow_copy)
            if copied:
                with open(dst, "rb") as fh:
                    self.log.add("write", path=dst, data=fh.read())
                self.log.add("fsync", path=dst)
            else:
                self.log.add("link", src=src, dst=dst)
        return copied

    def unlink(self, path: str) -> None:
        with self._rec:
            super().unlink(path)
            self.log.add("unlink", path=path)

    def rmtree(self, path: str) -> None:
        with self._rec:
            super().rmtree(path)
            self.log.add("rmtree", path=path)


def parse_fault_plan(text: str) -> tuple[dict[str, dict[int, int | float]], str | None]:
    """`OP:NTH:ERRNO,...` plus an optional `record=PATH` item that appends
    `OP N` for every operation to PATH (so a test can learn the sequence).  `SLOWms`
    instead of an errno delays the operation by ms milliseconds (a slow disk), then does it."""
    plan: dict[str, dict[int, int | float]] = {}
    record = None
    for item in filter(None, (t.strip() for t in text.split(","))):
        if item.startswith("record="):
            record = item[len("record="):]
            continue
        if item == "spares":  # keep rq.spares on (see FsOps.spares)
            plan.setdefault("spares", {})
            continue
        name, nth, err = item.split(":")
        plan.setdefault(name, {})[int(nth)] = (int(err[4:]) / 1000 if err.startswith("SLOW")
                                               else getattr(errno, err))
    return plan, record


def from_environment(env: Mapping[str, str]) -> FsOps:
    """FaultyFsOps when RQ_FS_FAULTS is set, else RecordingFsOps (RQ_FS_RECORD)."""
    text = env.get("RQ_FS_FAULTS", "")
    if not text:
        return RecordingFsOps(env[fsrecord.ENV])
    plan, record = parse_fault_plan(text)
    return FaultyFsOps(plan, record, spares=plan.pop("spares", None) is not None)
