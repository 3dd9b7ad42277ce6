"""Every spool file operation, in one seam (SPEC S0.3, issue 2 durability rules).

Owns: atomic file writes (temp file in the same directory, fsync, rename,
fsync of the directory), directory fsyncs, publishing renames that refuse to
clobber (renameat2 RENAME_NOREPLACE), hard links with a copy fallback across
filesystems, removals, and the create journal's appends and syncfs.  `store`,
`events`, `mgr` and `install` call these instead of `os` directly, so a test can
swap in a double of rq.fsseams (chosen from the `RQ_FS_FAULTS` or `RQ_FS_RECORD`
environment variable in a daemon's `main()`) to fail any one operation with EIO
or ENOSPC and check that no "ok" is ever sent for data that is not durable, or
to record every operation for the power-loss model.

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
from collections.abc import Mapping
from typing import Any

from rq import fsrecord

_libc = ctypes.CDLL(None, use_errno=True)
_renameat2 = getattr(_libc, "renameat2", None)
_syncfs = _libc.syncfs
_AT_FDCWD = -100
_RENAME_NOREPLACE = 1
_RENAME_EXCHANGE = 2


class FsOps:
    """The real filesystem.  Method names double as the fault-plan op names."""

    # Whether the queue process may keep spare message directories (rq.spares):
    # a background thread making them would make injected-fault sequences
    # nondeterministic, so FaultyFsOps turns them off unless a plan asks.
    spares = True
    # Seconds a create journal (rq.queue.journal) waits before it settles on its own;
    # None: only when asked (a delete, a stop), so that a fault plan's operation
    # numbers do not depend on timing.
    settle_delay: float | None = 1.0

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
        small file here; the overwrite keeps the block.  The cut is skipped when
        the file is no longer than the data (a fresh spare: an fstat costs ~1 us,
        an ftruncate ~3.5, four times per job; issue 15)."""
        self.op("write")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            _write_all(fd, data)
            if os.fstat(fd).st_size > len(data):
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

    # -- the create journal (rq.queue.journal)
    def create_log(self, path: str) -> int:
        """A new, empty file for records; its descriptor (close-on-exec)."""
        self.op("write")
        return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)

    def append_log(self, fd: int, data: bytes, offset: int) -> None:
        """Write `data` at `offset`, the end of the records so far of a file of
        create_log (not yet durable: sync_log)."""
        self.op("write")
        view = memoryview(data)
        while view:
            n = os.pwrite(fd, view, offset)
            view, offset = view[n:], offset + n

    def preallocate_log(self, fd: int, size: int) -> None:
        """Allocate a file of create_log up to `size` bytes, zeros to a reader (the end
        of its records): a record written inside them leaves the file's size as it was,
        so its fdatasync need not write the inode too (issue 15: on ext4 ~40 us and ~20
        us of CPU less per record).  Best effort: a file system that cannot allocate
        ahead, or a full one, gets a file that grows with its records.  Not a seam
        operation: nothing depends on it but the time of the next syncs."""
        try:
            os.posix_fallocate(fd, 0, size)
        except OSError:
            pass

    def sync_log(self, fd: int) -> None:
        """fdatasync: the appends so far are on stable storage."""
        self.op("fsync")
        os.fdatasync(fd)

    def syncfs(self, path: str) -> None:
        """Everything written to the filesystem holding `path` is on stable storage
        (syncfs(2)): the names and contents of every file, fsynced or not."""
        self.op("syncfs")
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            if _syncfs(fd) != 0:
                err = ctypes.get_errno()
                raise OSError(err, os.strerror(err), path)
        finally:
            os.close(fd)

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


def from_environment(env: Mapping[str, str]) -> FsOps:
    """The FsOps a daemon's main() uses: faulty only when RQ_FS_FAULTS is set,
    recording (the power-loss test) only when RQ_FS_RECORD names a log; their
    module (rq.fsseams) is imported only then."""
    if env.get("RQ_FS_FAULTS") or env.get(fsrecord.ENV):
        from rq import fsseams
        return fsseams.from_environment(env)
    return FsOps()


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
