"""The file-operation seam (rq/fsops.py): atomic writes, no-clobber renames,
group-committed directory fsyncs, and the fault plan."""

from __future__ import annotations

import errno
import os
import threading
from pathlib import Path

import pytest

from rq.fsops import FsOps
from rq.fsseams import FaultyFsOps, parse_fault_plan


class CountingFsOps(FsOps):
    """Counts real directory fsyncs and holds each one until released."""

    def __init__(self) -> None:
        super().__init__()
        self.fsyncs = 0
        self.gate = threading.Event()
        self.entered = threading.Event()

    def fsync_dir(self, path: str) -> None:
        self.fsyncs += 1
        self.entered.set()
        assert self.gate.wait(10)
        super().fsync_dir(path)


def test_concurrent_dir_fsyncs_are_shared(tmp_path: Path) -> None:
    """Callers arriving while an fsync runs share the next one: 1 + 1 fsyncs
    for 9 callers, and every caller returns only after an fsync that started
    after it arrived."""
    fs = CountingFsOps()
    done: list[int] = []
    first = threading.Thread(target=lambda: (fs.fsync_dir_shared(str(tmp_path)), done.append(0)))
    first.start()
    assert fs.entered.wait(10)
    others = [threading.Thread(target=lambda i=i: (fs.fsync_dir_shared(str(tmp_path)),
                                                   done.append(i))) for i in range(1, 9)]
    for t in others:
        t.start()
    assert done == []          # nobody returns while the only fsync is held
    fs.gate.set()
    for t in [first, *others]:
        t.join(10)
    assert sorted(done) == list(range(9))
    assert fs.fsyncs == 2


def test_shared_fsync_failure_is_reported_and_retried(tmp_path: Path) -> None:
    fs = FaultyFsOps({"fsync": {1: errno.EIO}})
    with pytest.raises(OSError) as exc:
        fs.fsync_dir_shared(str(tmp_path))
    assert exc.value.errno == errno.EIO
    fs.fsync_dir_shared(str(tmp_path))  # the next caller does its own fsync
    assert fs.counts["fsync"] == 2


def test_rename_noreplace_never_clobbers(tmp_path: Path) -> None:
    fs = FsOps()
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()       # an empty directory: plain rename(2) would replace it
    with pytest.raises(FileExistsError):
        fs.rename_noreplace(str(tmp_path / "a"), str(tmp_path / "b"))
    assert (tmp_path / "a").is_dir()
    fs.rename_noreplace(str(tmp_path / "a"), str(tmp_path / "c"))
    assert (tmp_path / "c").is_dir() and not (tmp_path / "a").exists()


def test_atomic_write_failure_leaves_old_content_and_no_temp(tmp_path: Path) -> None:
    target = tmp_path / "msg"
    FsOps().write_file_atomic(str(target), b"old")
    fs = FaultyFsOps({"fsync": {1: errno.ENOSPC}})
    with pytest.raises(OSError):
        fs.write_file_atomic(str(target), b"new")
    assert target.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["msg"]


def test_fault_plan_parsing(tmp_path: Path) -> None:
    plan, record = parse_fault_plan(f"fsync:3:EIO, rename:0:ENOSPC,record={tmp_path}/r")
    assert plan == {"fsync": {3: errno.EIO}, "rename": {0: errno.ENOSPC}}
    assert record == f"{tmp_path}/r"
    fs = FaultyFsOps(plan, record)
    with pytest.raises(OSError):
        fs.rename(str(tmp_path / "x"), str(tmp_path / "y"))  # nth 0: every call fails
    fs.close()
    assert (tmp_path / "r").read_text() == "rename 1\n"


def test_link_or_copy_across_filesystems(tmp_path: Path) -> None:
    """S4.8: a hard link when possible, a copy from another filesystem (tmpfs)."""
    shm = Path("/dev/shm")
    if not shm.is_dir():
        pytest.skip("no /dev/shm")
    src = shm / f"rq-fsops-{os.getpid()}"
    src.write_bytes(b"payload")
    try:
        assert FsOps().link_or_copy(str(src), str(tmp_path / "copy")) is True
        assert (tmp_path / "copy").read_bytes() == b"payload"
        with pytest.raises(OSError) as exc:
            FsOps().link_or_copy(str(src), str(tmp_path / "nocopy"), allow_copy=False)
        assert exc.value.errno == errno.EXDEV
    finally:
        src.unlink()
    local = tmp_path / "local"
    local.write_bytes(b"x")
    assert FsOps().link_or_copy(str(local), str(tmp_path / "linked")) is False
    assert os.stat(local).st_ino == os.stat(tmp_path / "linked").st_ino


def test_write_file_atomic_keep_old_leaves_the_old_file_at_tmp(tmp_path) -> None:
    """keep_old: the new content replaces the old in one exchange and the old
    file is left at `tmp` (rq.spares reuses its inode); without an old file it
    is a plain rename."""
    fs = FsOps()
    target, tmp = tmp_path / "status", tmp_path / "spare"
    tmp.write_text("")
    kept = fs.write_file_atomic(str(target), b"one", sync=False, tmp=str(tmp), keep_old=True)
    assert kept is False
    assert target.read_bytes() == b"one" and not tmp.exists()
    tmp.write_text("")
    assert fs.write_file_atomic(str(target), b"two", sync=True, tmp=str(tmp), keep_old=True) is True
    assert target.read_bytes() == b"two" and tmp.read_bytes() == b"one"


def test_write_file_private_over_a_longer_file_leaves_only_the_new_bytes(tmp_path) -> None:
    """A recycled spare is overwritten in place and cut to the new length."""
    path = tmp_path / "spare"
    path.write_bytes(b"x" * 5000)
    FsOps().write_file_private(str(path), b"short")
    assert path.read_bytes() == b"short"
    FsOps().write_file_private(str(path), b"")
    assert path.read_bytes() == b""


def test_remove_stale_temps_removes_other_processes_temp_files_only(tmp_path: Path) -> None:
    """S0.3.1: a crash mid-write leaves write_file_atomic's `.BASE.tmpPID.TID`; the next
    owner of the directory removes those of other processes, never its own (being
    written right now) nor the files themselves (rq-mgr's fan-out journals and cursors)."""
    from rq.fsops import remove_stale_temps
    fs = FsOps()
    fs.write_file_atomic(str(tmp_path / "c.cursor"), b"kept\n", sync=True)
    stale = tmp_path / ".c.cursor.tmp1.2"
    stale.write_bytes(b"half")
    own = tmp_path / f".d.cursor.tmp{os.getpid()}.{threading.get_ident()}"
    own.write_bytes(b"in flight")
    remove_stale_temps(str(tmp_path))
    assert sorted(os.listdir(tmp_path)) == sorted([own.name, "c.cursor"])
    remove_stale_temps(str(tmp_path / "missing"))  # no directory yet: nothing to do
