"""A finish that hits IO errors (issue 13, D8), with faults injected at the fsops seam
(RQ_FS_FAULTS, rq/fsops.py) into real queue processes: the retry backs off and the log
says so once (not once per loop pass), the queue's `status` says finishing is stuck, and
done/ buckets are made ahead of need, so a disk without free inodes does not stop
messages from finishing (S3.2, S6.6)."""

from __future__ import annotations

from pathlib import Path

from rq.message import bucket
from rqtest import QueueProc, create_msg, make_queue, short_id, wait_for, write_script

DONE = "#!/bin/sh\necho 'done ok' >&3\n"


def queued(root: Path, n: int = 2, *, buckets: bool = False) -> list[str]:
    """A paused queue `s` with `n` messages in que/ (made without faults), its process
    stopped again, the pause lifted: the next process starts them at once.  With
    `buckets`, first wait for the process to make their done/ buckets ahead."""
    make_queue(root, "s", write_script(root.parent / "s.sh", DONE), num_workers=n)
    (root / "config" / "s.pause").touch()
    q = QueueProc(root, "s")
    try:
        ids = [create_msg(q) for _ in range(n)]
        for full in ids if buckets else []:  # made by the loop, within a pass (every 5 s)
            wait_for((root / "queue" / "s" / "done" / bucket(short_id(full))).is_dir, 15,
                     what="the done/ bucket of a queued message")
    finally:
        q.stop()
    (root / "config" / "s.pause").unlink()
    return ids


def log_lines(root: Path, text: str) -> list[str]:
    return [line for line in (root / "log" / "queuemgr.log").read_text().splitlines()
            if text in line]


def test_a_stuck_finish_backs_off_logs_once_and_shows_in_status(root: Path) -> None:
    """Every fsync fails: no message can finish.  It used to be retried (and logged) on
    every loop pass, i.e. after every socket request: thousands of lines a minute."""
    queued(root)
    q = QueueProc(root, "s", env={"RQ_FS_FAULTS": "fsync:0:EIO"})
    try:
        wait_for(lambda: log_lines(root, "cannot finish"), what="the first failed finish")
        for _ in range(300):  # each request wakes the loop for a pass (S2.6)
            assert q.call("ping") == ["pong"]
        assert len(log_lines(root, "cannot finish")) == 1
        assert q.counts()["run"] == 2  # counted in run until durable in done (S6.6)
        status = wait_for(lambda: (s := q.call("status")) and len(s) == 2 and "2 message" in s[1]
                          and s, what="status to say so")
        assert status[0] == "UP"
        assert status[1].startswith("finishing stuck since ")
        assert "2 message(s) wait in run/" in status[1] and "injected" in status[1]
    finally:
        q.kill()


def test_finishing_that_works_again_says_so_once(root: Path) -> None:
    """The first six fsyncs fail, then the disk is fine: both messages end in done, with
    one line when finishing got stuck and one when it worked again (it used to be a line
    per attempt)."""
    ids = queued(root)
    plan = ",".join(f"fsync:{n}:EIO" for n in range(1, 7))
    q = QueueProc(root, "s", env={"RQ_FS_FAULTS": plan})
    try:
        for _ in range(100):
            q.call("ping")
        wait_for(lambda: log_lines(root, "finishing works again"), 30, what="the finishes")
        assert [q.state(full) for full in ids] == ["done", "done"]
        assert q.counts()["run"] == 0 and q.counts()["done"] == 2
        assert len(log_lines(root, "cannot finish")) == 1
        assert len(log_lines(root, "finishing works again")) == 1
        assert q.call("status") == ["UP"]
    finally:
        q.stop()


def test_a_disk_without_inodes_does_not_stop_finishing(root: Path) -> None:
    """Every mkdir at the seam fails with ENOSPC (no inode left); jobs still start (their
    directories come from spares, made beforehand) and finish: the done/ bucket of their
    minute was made ahead of need, so the finish is a rename and nothing else."""
    ids = queued(root, buckets=True)
    q = QueueProc(root, "s", env={"RQ_FS_FAULTS": "spares,mkdir:0:ENOSPC"})
    try:
        for full in ids:
            q.wait_state(full, "done", timeout=20)
        assert log_lines(root, "cannot finish") == []
    finally:
        q.stop()
