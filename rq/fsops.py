"""Every spool file operation, in one seam (SPEC S0.3, issue 2 durability rules).

Owns: atomic file writes (temp file in the same directory, fsync, rename,
fsync of the directory), directory fsyncs, publishing renames that refuse to
clobber (renameat2 RENAME_NOREPLACE), hard links with a copy fallback across
filesystems, and removals.  `store`, `events`, `mgr` and `install` call these
instead of `os` directly, so a test can swap in `FaultyFsOps` (chosen from the
`RQ_FS_FAULTS` environment variable in a daemon's `main()`) to fail any one
operation with EIO or ENOSPC and check that no "ok" is ever sent for data that
is not durable.

It knows nothing about messages or queues.
"""

from __future__ import annotations

import ctypes
import errno
import hashlib
import json
import os
import shutil
import stat
import threading
import time
from collections.abc import Mapping
from typing import Any

from rq import fsrecord

_libc = ctypes.CDLL(None, use_errno=True)
_renameat2 = getattr(_libc, "renameat2", None)
_AT_FDCWD = -100
_RENAME_NOREPLACE = 1
_RENAME_EXCHANGE = 2


class FsOps:
    """The real filesystem.  Method names double as the fault-plan op names."""

    # Whether the queue process may keep spare message directories (rq.spares):
    # a background thread making them would make injected-fault sequences
    # nondeterministic, so FaultyFsOps turns them off unless a plan asks.
    spares = True

    def __init__(self) -> None:
        self._group_cond = threading.Condition()
        self._groups: dict[str, list[int]] = {}  # path -> [last ticket, synced up to, busy]

    def op(self, name: str) -> None:
        """Hook called before each operation; FaultyFsOps raises from here."""

    # -- files
    def write_file_atomic(self, path: str, data: bytes, *, sync: bool = True,
                          sync_data: bool = False, tmp: str | None = None,
                          keep_old: bool = False) -> bool:
        """Write `data` to `path` so readers see the old or the new content,
        never a partial file (S0.3.1).  With `sync`, the data and the name are
        on stable storage when this returns.  With `sync_data` alone, the data
        is before the rename (no fsync of the directory): a power loss may
        keep the old file but never leaves `path` naming a file whose data was
        lost (the empty file of delayed allocation).  `tmp` names the temporary file
        (beside `path` by default; any path on the same filesystem works, and
        it may already exist, e.g. a spare of rq.spares).

        With `keep_old`, the new file replaces an existing one by exchanging
        the two names (renameat2 RENAME_EXCHANGE, as atomic as the rename), so
        the old file is left at `tmp` instead of being deleted, for the caller
        to reuse (rq.spares: a freed inode makes later inode allocations on a
        journal-less ext4 skip it for minutes).  Returns True when it was."""
        directory, base = os.path.split(path)
        if tmp is None:
            tmp = os.path.join(directory, f".{base}.tmp{os.getpid()}.{threading.get_ident()}")
        try:
            self.write_file_private(tmp, data, sync=sync or sync_data)
        except BaseException:
            unlink_quiet(tmp)
            raise
        try:
            kept = self.replace(tmp, path, keep_old=keep_old)
        except BaseException:
            unlink_quiet(tmp)
            raise
        if sync:
            self.fsync_dir(directory)
        return kept

    def replace(self, tmp: str, path: str, *, keep_old: bool = False) -> bool:
        """The rename of write_file_atomic: `tmp` becomes `path`, replacing it
        (with `keep_old`, exchanged with it when it exists: True then)."""
        self.op("rename")
        kept = keep_old and _exchange(tmp, path)
        if not kept:
            os.rename(tmp, path)
        return kept

    def write_file_private(self, path: str, data: bytes, *, sync: bool = True) -> None:
        """Write `data` into the file `path` in place.  Only for a file no reader
        can see yet (a temporary file, or one inside a spare of rq.spares that a
        rename of its directory publishes afterwards): no temporary file, no
        rename.  With `sync`, the data is on stable storage when this returns.

        An existing file (a recycled spare) is overwritten from the start and
        then cut to the new length, not truncated to zero first: on ext4 an
        O_TRUNC of a file with data frees its blocks (a discard with this
        mount) and makes the close start writeback (auto_da_alloc), ~50 us per
        small file here; the overwrite keeps the block."""
        self.op("write")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            _write_all(fd, data)
            os.ftruncate(fd, len(data))
            if sync:
                self.op("fsync")
                os.fsync(fd)
        finally:
            os.close(fd)

    def fsync_dir(self, path: str) -> None:
        self.op("fsync")
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def fsync_dir_shared(self, path: str) -> None:
        """fsync a directory, sharing one fsync among concurrent callers (group
        commit): every caller's change happened before it took its ticket, so an
        fsync that starts after that ticket makes the change durable.  While one
        fsync runs, later callers wait for the next one instead of queueing
        their own."""
        cond = self._group_cond
        with cond:
            state = self._groups.setdefault(path, [0, 0, 0])
            state[0] += 1
            ticket = state[0]
            while state[1] < ticket and state[2]:
                cond.wait()
            if state[1] >= ticket:
                return
            state[2], target = 1, state[0]
        try:
            self.fsync_dir(path)
        except BaseException:
            with cond:
                state[2] = 0
                cond.notify_all()
            raise
        with cond:
            state[1], state[2] = max(state[1], target), 0
            cond.notify_all()

    def append(self, fd: int, data: bytes) -> None:
        """One write() on an O_APPEND descriptor (S13.1)."""
        self.op("append")
        os.write(fd, data)

    # -- directories
    def mkdir(self, path: str, mode: int = 0o755) -> None:
        self.op("mkdir")
        os.mkdir(path, mode)

    def makedirs(self, path: str) -> list[str]:
        """Create `path` and missing parents; return the directories whose
        entries changed (to be fsynced by the caller)."""
        changed: list[str] = []
        missing = []
        cur = path
        while not os.path.isdir(cur):
            missing.append(cur)
            cur = os.path.dirname(cur)
        for d in reversed(missing):
            try:
                self.mkdir(d)
            except FileExistsError:
                continue
            changed.append(os.path.dirname(d))
        return changed

    def rename_noreplace(self, src: str, dst: str) -> None:
        """Publish `src` as `dst`; FileExistsError if `dst` exists (never clobbers)."""
        self.op("rename")
        if _renameat2 is not None:
            res = _renameat2(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst),
                             _RENAME_NOREPLACE)
            if res == 0:
                return
            err = ctypes.get_errno()
            if err not in (errno.ENOSYS, errno.EINVAL):
                raise OSError(err, os.strerror(err), dst)
        if os.path.lexists(dst):  # fallback for filesystems without renameat2
            raise FileExistsError(errno.EEXIST, "File exists", dst)
        os.rename(src, dst)

    def rename(self, src: str, dst: str) -> None:
        self.op("rename")
        os.rename(src, dst)

    # -- links, copies, removal
    def link_or_copy(self, src: str, dst: str, *, allow_copy: bool = True) -> bool:
        """Hard-link `src` to `dst`; copy when they are on different
        filesystems (S4.8).  Returns True if it copied.  OSError(EXDEV) when
        copying is not allowed."""
        self.op("link")
        try:
            os.link(src, dst)
            return False
        except OSError as exc:
            if exc.errno != errno.EXDEV or not allow_copy:
                raise
        self.op("write")
        shutil.copyfile(src, dst)
        fd = os.open(dst, os.O_RDONLY | os.O_CLOEXEC)
        try:
            self.op("fsync")
            os.fsync(fd)
        finally:
            os.close(fd)
        return True

    def unlink(self, path: str) -> None:
        self.op("unlink")
        os.unlink(path)

    def rmtree(self, path: str) -> None:
        self.op("unlink")
        shutil.rmtree(path)


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
    """The FsOps a daemon's main() uses: faulty only when RQ_FS_FAULTS is set,
    recording (the power-loss test) only when RQ_FS_RECORD names a log."""
    text = env.get("RQ_FS_FAULTS", "")
    if not text:
        log = env.get(fsrecord.ENV, "")
        return RecordingFsOps(log) if log else FsOps()
    plan, record = parse_fault_plan(text)
    return FaultyFsOps(plan, record, spares=plan.pop("spares", None) is not None)


def md5_file(path: str) -> tuple[str, int]:
    """(lowercase hex MD5, size) of a file's content."""
    digest = hashlib.md5()
    size = 0
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            digest.update(chunk)
            size += len(chunk)
    return digest.hexdigest(), size


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _exchange(src: str, dst: str) -> bool:
    """Swap the names `src` and `dst` in one step; False, with nothing
    changed, when `dst` does not exist or the filesystem cannot exchange."""
    if _renameat2 is None:
        return False
    if _renameat2(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOENT, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), dst)


# ---------------------------------------------------------------- small helpers every owner shares
# (outside the FsOps seam: reads, and clean-ups whose failure changes nothing)


def remove_stale_temps(directory: str) -> None:
    """Remove the temporary files of FsOps.write_file_atomic (`.BASE.tmpPID.TID`) that
    another process left in `directory`, a crash mid-write; this process's own may be
    being written right now and stay."""
    try:
        names = os.listdir(directory)
    except OSError:
        return
    mine = f".tmp{os.getpid()}."
    for name in names:
        if name.startswith(".") and ".tmp" in name and mine not in name:
            unlink_quiet(os.path.join(directory, name))


def unlink_quiet(path: str) -> None:
    """Remove a file if it can be removed; a failure (already gone, EIO) is
    ignored: every caller is cleaning up something it can live with."""
    try:
        os.unlink(path)
    except OSError:
        pass


def read_small(path: str, dir_fd: int | None = None, *, regular: bool = False) -> bytes:
    """The whole content of the (small) file `path` (relative to the directory `dir_fd`
    when given): open, read to EOF, close, without the buffered file object's fstat,
    isatty ioctl and seeks (issue 15: 4 system calls instead of 9 for a msg or status
    file).  `regular`: the caller knows `path` is a regular file, where a short read is
    the end (one read fewer; not so for /proc files or pipes).  Raises OSError."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        chunks = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
            if regular and len(chunk) < 65536:
                break
    finally:
        os.close(fd)
    return b"".join(chunks)


def read_json(path: str) -> Any:
    """The JSON document in `path`, or None when it cannot be read or parsed."""
    try:
        return json.loads(read_small(path))
    except (OSError, ValueError):
        return None


def is_regular(path: str) -> bool:
    """A regular file, not a symlink to one (lstat): what a job may have planted."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False
