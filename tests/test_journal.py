"""The create journal (issue 15; rq/queue/journal.py; S0.3 and S2.7 as the README amends them).

A create is acknowledged once its record is fdatasynced in `queue/NAME/journal-<ns>.jnl`; the
directories become durable when the journal settles (one syncfs).  These tests start real queue
processes.  Under `RQ_FS_FAULTS` the queue settles only when it must (a delete, a stop), so a
segment is still there when the test kills the process; what a power loss could leave of the
unsettled directories is then made by hand in the killed queue's spool (the disk is the seam),
and a real restart must put every acknowledged message back.  tests/test_power_loss.py checks
the same replay over the full crash-state model.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from rqtest import QueueProc, make_queue, settled_threads, thread_count, wait_for

from rq.builtin import cleaner
from rq.fsck import check_root
from rq.queue import journal
from rq.store import Store

NO_TIMED_SETTLE = {"RQ_FS_FAULTS": "spares"}  # FaultyFsOps: settle only on demand


def short(full: str) -> str:
    return full.rsplit("/", 1)[1]


def segments(root: Path, name: str) -> list[str]:
    return journal.segments(str(root / "queue" / name))


def paused(root: Path, name: str = "j") -> None:
    make_queue(root, name, script="/bin/true")
    (root / "config" / f"{name}.pause").touch()


def test_a_killed_queue_puts_back_what_a_power_loss_took(root: Path) -> None:
    """Three acknowledged creates, the queue SIGKILLed before its journal settled; then the
    spool as a power loss may leave it: one message gone, one with an empty msg, one still in
    prep/.  fsck counts all three (notes, no problem); a restart replays the journal: all
    three in que/ with their msg, the segment removed, fsck clean without notes."""
    paused(root)
    q = QueueProc(root, "j", env=NO_TIMED_SETTLE)
    try:
        fulls = [q.call("create_message", {"dest": "j", "param1": f"p{i}"})[1] for i in range(3)]
    finally:
        q.kill()
    assert len(segments(root, "j")) == 1
    store = Store(str(root), "j")
    gone, emptied, uncommitted = (short(f) for f in fulls)
    os.rename(store.msg_path("que", gone), root / "lost")  # out of the queue: "never written"
    (Path(store.msg_path("que", emptied)) / "msg").write_bytes(b"")
    os.rename(store.msg_path("que", uncommitted), store.msg_path("prep", uncommitted))
    report = check_root(str(root))
    assert report.problems == [], report.problems
    assert report.states["j"] == {gone: "que", emptied: "que", uncommitted: "que"}
    assert any("create journal" in n for n in report.notes), report.notes

    q = QueueProc(root, "j")
    try:
        for i, full in enumerate(fulls):
            assert q.message(full)["param1"] == f"p{i}"
            assert q.state(full) == "que"
    finally:
        q.stop()
    assert segments(root, "j") == []
    report = check_root(str(root))
    assert report.problems == [] and report.notes == [], report
    assert set(report.states["j"].values()) == {"que"}


def test_an_unacknowledged_create_cut_by_a_power_loss_is_a_note(root: Path) -> None:
    """A que/ message whose msg never reached the disk (empty, NUL bytes, or gone) and that
    has no record was never acknowledged: its record would have been fdatasynced first.
    fsck notes it as that, not as a problem; any other unreadable msg stays a problem.
    The start skips it and leaves it on disk (S2.7.4)."""
    paused(root)
    q = QueueProc(root, "j")
    try:
        cut, damaged = (q.call("create_message", {"dest": "j"})[1] for _ in range(2))
    finally:
        q.stop()  # settled: no record is left
    assert segments(root, "j") == []
    store = Store(str(root), "j")
    (Path(store.msg_path("que", short(cut))) / "msg").write_bytes(b"\0" * 40)
    report = check_root(str(root))
    assert report.problems == [], report.problems
    assert any("unacknowledged create" in n for n in report.notes), report.notes
    (Path(store.msg_path("que", short(damaged))) / "msg").write_bytes(b"{not json")
    assert check_root(str(root)).problems == [
        f"j/que/{short(damaged)}: msg unreadable (JSONDecodeError)"]
    q = QueueProc(root, "j")
    try:
        assert q.counts()["que"] == 0
    finally:
        q.stop()
    assert (Path(store.msg_path("que", short(cut))) / "msg").read_bytes() == b"\0" * 40


def test_a_delete_settles_the_journal_first(root: Path) -> None:
    """A message deleted before its record settled must not come back from a replay: the
    delete settles first (one syncfs), so the segment holding it is gone when `ok` comes."""
    paused(root)
    q = QueueProc(root, "j", env=NO_TIMED_SETTLE)
    try:
        keep, drop = (q.call("create_message", {"dest": "j"})[1] for _ in range(2))
        assert len(segments(root, "j")) == 1
        assert q.call("delete_message", {"msg_id": drop}) == ["ok", "msg deleted"]
        assert segments(root, "j") == []
        later = q.call("create_message", {"dest": "j"})[1]
        assert len(segments(root, "j")) == 1  # a new segment for what came after
    finally:
        q.kill()
    q = QueueProc(root, "j")
    try:
        assert q.state(keep) == "que" and q.state(later) == "que"
        assert q.state(drop) is None
        assert q.counts()["que"] == 2
    finally:
        q.stop()


def test_a_purge_settles_the_journal_first(root: Path) -> None:
    """The same for a purge (issue 16's bulk delete): two messages run at once and end in
    err/ while their records are pending; `purge_messages` settles before it removes them,
    and they stay gone after a kill and a restart."""
    make_queue(root, "j", script="/bin/false")
    q = QueueProc(root, "j", env=NO_TIMED_SETTLE)
    try:
        fulls = [q.call("create_message", {"dest": "j"})[1] for _ in range(2)]
        for full in fulls:
            q.wait_state(full, "err")
        assert len(segments(root, "j")) == 1
        assert q.call("purge_messages", {"states": ["err"], "older_than": 0}) == ["ok", 2]
        assert segments(root, "j") == []
    finally:
        q.kill()
    q = QueueProc(root, "j")
    try:
        assert q.counts()["err"] == 0
        assert all(q.state(full) is None for full in fulls)
    finally:
        q.stop()


def test_the_journal_settles_on_its_own_and_at_a_stop(root: Path) -> None:
    """With the real file system the settler thread removes a segment about a second after
    its first record, then leaves (an idle queue keeps no thread for it: issue 17); with no
    timed settle, a stop settles what is left, so a clean start has nothing to replay."""
    paused(root)
    q = QueueProc(root, "j")
    try:
        [idle] = settled_threads(q.popen.pid)
        q.call("create_message", {"dest": "j"})
        assert thread_count(q.popen.pid) > idle  # the settler, until
        wait_for(lambda: segments(root, "j") == [], 10, what="the journal to settle")
        wait_for(lambda: thread_count(q.popen.pid) == idle, 10,
                 what="the settler thread to leave")
    finally:
        q.stop()
    q = QueueProc(root, "j", env=NO_TIMED_SETTLE)
    try:
        q.call("create_message", {"dest": "j"})
        assert len(segments(root, "j")) == 1
    finally:
        assert q.stop() == 0
    assert segments(root, "j") == []


def test_the_cleaner_keeps_what_is_younger_than_the_oldest_segment(tmp_path: Path) -> None:
    """The cleaner is another process and cannot ask the queue to settle: with `days` 0 it
    removes only what finished before the oldest segment of the queue's journal opened."""
    qdir = tmp_path / "queue" / "c"
    now = time.time()
    for state in ("prep", "que", "run", "done", "relayed", "err"):
        (qdir / state).mkdir(parents=True)
    old_bucket = time.strftime("%Y%m%d/%H/%M", time.gmtime(now - 600))
    new_bucket = time.strftime("%Y%m%d/%H/%M", time.gmtime(now - 120))
    for bucket in (old_bucket, new_bucket):
        (qdir / "done" / bucket / "x").mkdir(parents=True)
    assert cleaner.journal_since(str(qdir)) is None
    seg = qdir / f"{journal.PREFIX}{int((now - 300) * 1e9):020d}{journal.SUFFIX}"
    seg.write_bytes(journal.frame("x", b""))
    assert abs((cleaner.journal_since(str(qdir)) or 0) - (now - 300)) < 1
    cleaner.clean_queue(str(tmp_path), "c", now, 0)
    assert not (qdir / "done" / old_bucket).exists()
    assert (qdir / "done" / new_bucket / "x").is_dir()
    seg.unlink()
    cleaner.clean_queue(str(tmp_path), "c", now, 0)
    assert not (qdir / "done" / new_bucket).exists()


def test_records_end_at_a_torn_or_damaged_tail() -> None:
    """A segment's replay stops at the first record that is cut short or fails its CRC: the
    append whose fdatasync never returned, which no client was told of."""
    good = journal.frame("20261129.1200.00.000.1", b'{"msg_id":"20261129.1200.00.000.1"}')
    second = journal.frame("20261129.1200.00.000.2", b"{}")
    assert [i for i, _ in journal.parse(good + second)] == ["20261129.1200.00.000.1",
                                                             "20261129.1200.00.000.2"]
    assert [i for i, _ in journal.parse(good + second[:-1])] == ["20261129.1200.00.000.1"]
    damaged = second[:-2] + bytes([second[-2] ^ 1]) + second[-1:]
    assert [i for i, _ in journal.parse(good + damaged + good)] == ["20261129.1200.00.000.1"]


def test_a_segment_is_allocated_ahead_from_its_second_append(tmp_path: Path) -> None:
    """A segment of one record stays that size; from its second append it is allocated
    ahead (ROOM bytes at a time), so a record's fdatasync does not also write the inode for
    a new size, and the zeros after the records read as their end: replay finds them all."""
    from rq.fsops import FsOps

    class _Store:  # what the journal reads of a Store
        qdir = str(tmp_path)

    fs = FsOps()
    fs.settle_delay = None  # no settler thread: the test settles nothing
    j = journal.Journal(_Store(), fs)  # type: ignore[arg-type]
    one = [("20261129.1200.00.000.1", b'{"msg_id":"20261129.1200.00.000.1"}')]
    j.append(one)
    [seg] = journal.segments(str(tmp_path))
    assert os.path.getsize(seg) == len(journal.frame(*one[0]))
    batch = [(f"20261129.1200.00.000.{i}", b"{}") for i in range(2, 40)]
    j.append(batch[:1])
    assert os.path.getsize(seg) >= journal.ROOM
    big = [(f"20261129.1200.00.001.{i}", b"x" * 9000) for i in range(40)]  # past ROOM
    j.append(batch[1:])
    j.append(big)
    assert os.path.getsize(seg) >= sum(len(journal.frame(*e)) for e in one + batch + big)
    assert [i for i, _ in journal.read_records(str(tmp_path))] == [
        i for i, _ in one + batch + big]
    j.close()
    assert journal.segments(str(tmp_path)) == []
