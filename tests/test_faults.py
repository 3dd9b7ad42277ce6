"""Crash test (2) of issue 2: fail each spool operation of enqueue, commit and
complete in turn, with EIO and with ENOSPC, through the file-operation seam
(rq/fsops.py, chosen by RQ_FS_FAULTS in the queue process's main()).

For every injected failure: no "ok" reply for data that is not durable (an
ok'd message is in que/ after the fault and after a restart; a failed one is
nowhere but possibly an uncommitted prep/), the daemon keeps serving, a later
retry succeeds, and `rq fsck` finds the store consistent (crash test (3)).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from rq.fsck import check_root
from rq.store import Store
from rqtest import (QueueProc, learn_ops, make_buckets_ahead, make_queue, make_root,
                    read_events, wait_for, write_script)

ERRNOS = ("EIO", "ENOSPC")
# Operations whose failure must turn the reply into "fail".  A failed event-log
# append is not a durability failure: the message itself is safe (S13.1).
DURABILITY_OPS = {"mkdir", "write", "fsync", "rename", "link", "unlink"}


def committed(root: Path, name: str) -> dict[str, str]:
    report = check_root(str(root))
    assert report.problems == [], report.problems
    return report.states.get(name, {})


def short(full_id: str) -> str:
    return full_id.rsplit("/", 1)[1]


@pytest.fixture
def paused(root: Path) -> Path:
    """A paused queue whose done/ buckets of the next 20 minutes exist (make_buckets_ahead)."""
    make_queue(root, "f", script="/bin/true")
    (root / "config" / "f.pause").touch()
    make_buckets_ahead(root / "queue" / "f")
    return root


def create(q: QueueProc) -> list:
    return q.call("create_message", {"dest": "f", "param1": "x"})


def test_fault_each_enqueue_op(paused: Path) -> None:
    """create_message: every op fails once → fail reply, retry ok, nothing lost."""
    root = paused
    ops = learn_ops(root, "f", create)
    assert {op for op, _ in ops} >= {"mkdir", "write", "fsync", "rename"}
    acked: set[str] = set(committed(root, "f"))
    for op, nth in ops:
        for err in ERRNOS:
            q = QueueProc(root, "f", env={"RQ_FS_FAULTS": f"{op}:{nth}:{err}"})
            try:
                reply = create(q)
                if op in DURABILITY_OPS:
                    assert reply[0] == "fail", (op, nth, err, reply)
                    assert reply[1]
                if reply[0] == "ok":
                    acked.add(short(reply[1]))
                assert q.call("ping") == ["pong"]
                retry = create(q)
                assert retry[0] == "ok", (op, nth, err, retry)
                acked.add(short(retry[1]))
            finally:
                q.stop()
            states = committed(root, "f")
            for msg_id in acked:
                assert states.get(msg_id) == "que", (op, nth, err, msg_id)
            assert {i for i, s in states.items() if s != "prep"} == acked


def test_fault_each_prep_and_commit_op(paused: Path) -> None:
    """prep_message + commit_message: a failed commit leaves the message in
    prep (never a false ok), and committing again succeeds."""
    root = paused

    def prep_commit(q: QueueProc) -> None:
        full = q.call("prep_message", {"dest": "f"})[1]
        q.call("commit_message", {"msg_id": full})

    ops = learn_ops(root, "f", prep_commit)
    for op, nth in ops:
        if op not in DURABILITY_OPS:
            continue
        for err in ERRNOS:
            q = QueueProc(root, "f", env={"RQ_FS_FAULTS": f"{op}:{nth}:{err}"})
            try:
                prep = q.call("prep_message", {"dest": "f"})
                if prep[0] != "ok":
                    prep = q.call("prep_message", {"dest": "f"})
                    assert prep[0] == "ok", prep
                full = prep[1]
                assert q.state(full) == "prep"
                reply = q.call("commit_message", {"msg_id": full})
                if reply[0] != "ok":
                    assert q.state(full) == "prep", (op, nth, err)
                    reply = q.call("commit_message", {"msg_id": full})
                assert reply == ["ok", "msg commited"], (op, nth, err, reply)
                assert q.state(full) == "que"
            finally:
                q.stop()
            assert committed(root, "f")[short(full)] == "que"


def test_fault_each_complete_op(root: Path, tmp_path: Path) -> None:
    """Job start and completion: every op after the create reply fails once;
    the message still ends in done exactly once and the queue keeps serving."""
    script = write_script(tmp_path / "ok.sh", '#!/bin/sh\necho "done fine" >&3\n')
    make_queue(root, "c", script=script)
    done: set[str] = set()

    def one(q: QueueProc) -> None:
        full = q.call("create_message", {"dest": "c"})[1]
        q.wait_state(full, "done")
        done.add(short(full))

    ops = learn_ops(root, "c", one)
    create_ops = learn_create_prefix(root)
    later = ops[create_ops:]
    assert later, ops
    for op, nth in later:
        if op not in DURABILITY_OPS:
            continue
        for err in ERRNOS:
            q = QueueProc(root, "c", env={"RQ_FS_FAULTS": f"{op}:{nth}:{err}"})
            try:
                full = q.call("create_message", {"dest": "c"})[1]
                wait_for(lambda: q.state(full) == "done", 15,
                         what=f"done after {op}:{nth}:{err}")
                done.add(short(full))
                assert q.call("ping") == ["pong"]
            finally:
                q.stop()
            states = committed(root, "c")
            assert all(states[i] == "done" for i in done)
    # every run completed exactly once: one run->done event per message
    from rqtest import read_events
    finals = [e["msg_id"] for e in read_events(root, "c") if e["to"] == "done"]
    assert sorted(finals) == sorted(done)


def learn_create_prefix(root: Path) -> int:
    """How many ops a create_message costs on a paused queue (its reply comes
    after these; what follows belongs to start and completion)."""
    make_queue(root, "p", script="/bin/true")
    (root / "config" / "p.pause").touch()
    make_buckets_ahead(root / "queue" / "p")
    return len(learn_ops(root, "p", lambda q: q.call("create_message", {"dest": "p"})))




# ======================================================= group commit of completions (issue 15)
GATED = '#!/bin/sh\nwhile [ ! -e "$RQ_PARAM1" ]; do sleep 0.01; done\necho "done ok" >&3\n'


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return False


def _end_together(root: Path, fault: str = "") -> tuple[QueueProc, list[str], int]:
    """A 2-worker queue recording its file operations, whose two running jobs
    exit while the queue process is stopped (SIGSTOP), so that one pass reaps
    both.  Returns the queue (running again), the two full ids and how many
    operations were recorded before it went on."""
    make_queue(root, "g", write_script(root / "gated.sh", GATED), num_workers=2)
    gate, record = root / "gate", root / "ops-g.txt"
    q = QueueProc(root, "g", env={"RQ_FS_FAULTS": f"{fault}record={record}"})
    # no done/ bucket made ahead for a new minute while the operations are counted
    wait_for(lambda: time.time() % 60 < 45, 20, what="a minute with 15 s left")
    fulls = [q.call("create_message", {"dest": "g", "param1": str(gate)})[1] for _ in range(2)]
    pid_files = [root / "queue" / "g" / "run" / short(f) / "pid" for f in fulls]
    wait_for(lambda: all(p.exists() for p in pid_files), 10, what="both jobs spawned")
    pids = [int(p.read_text()) for p in pid_files]
    os.kill(q.popen.pid, signal.SIGSTOP)
    try:
        gate.touch()
        wait_for(lambda: all(_zombie(p) for p in pids), 10, what="both jobs to exit")
        before = len(record.read_text().splitlines())
    finally:
        os.kill(q.popen.pid, signal.SIGCONT)
    return q, fulls, before


def _ops(root: Path) -> list[str]:
    return [line.split()[0] for line in (root / "ops-g.txt").read_text().splitlines()]


def _done_events(root: Path) -> list[str]:
    return sorted(e["msg_id"] for e in read_events(root, "g") if e["to"] == "done")


def test_jobs_ending_together_share_one_fsync_of_their_bucket(root: Path) -> None:
    """Issue 15, group commit of completions: two jobs reaped in one pass are
    made durable in done/ by one fsync of their bucket (before: one each)."""
    q, fulls, before = _end_together(root)
    try:
        wait_for(lambda: q.counts()["done"] == 2, 10, what="both done")
        after = _ops(root)[before:]  # before the stop, which settles the create journal
    finally:
        q.stop()
    assert after.count("fsync") == 1, after
    assert after.index("fsync") > after.index("rename")  # the moves first, then their fsync
    assert _done_events(root) == sorted(short(f) for f in fulls)


def test_a_command_sent_on_seeing_a_message_done_on_disk_finds_it_done(root: Path) -> None:
    """Issue 15's group commit: a job's end is renamed into done/ and counted only after the
    fsync that the ends of a pass share.  A reader of the disk (the web's message view,
    Client.wait over HTTP) already shows it done; a command sent on seeing that (clone,
    state) waits for the commit instead of answering `run` (seen in CI: wait() returned
    done, the clone right after was refused "cannot clone message in run state").  Every
    fsync here takes 400 ms (a slow disk), so the window is wide open."""
    make_queue(root, "s", write_script(root / "ok.sh", '#!/bin/sh\necho "done ok" >&3\n'))
    q = QueueProc(root, "s", env={"RQ_FS_FAULTS": "fsync:0:SLOW400"})
    try:
        full = q.call("create_message", {"dest": "s"})[1]
        store = Store(str(root), "s")
        wait_for(lambda: (store.locate(short(full)) or ("",))[0] == "done", 30,
                 interval=0.002, what="the message renamed into done/")
        assert q.call("get_message_state", {"msg_id": full}) == ["ok", "done"]
        copy = q.call("clone_message", {"msg_id": full})
        assert copy[0] == "ok", copy
    finally:
        q.kill()


def test_a_failed_shared_fsync_retries_every_job_of_it(root: Path, tmp_path: Path) -> None:
    """Issue 15: the fsync two jobs' moves share fails (EIO): neither is
    counted done or logged before a retry makes it durable; both end done once."""
    learn = make_root(tmp_path / "learn")
    q, _, before = _end_together(learn)
    try:
        wait_for(lambda: q.counts()["done"] == 2, 10, what="both done")
    finally:
        q.stop()
    shared = _ops(learn)[:before].count("fsync") + 1   # the nth fsync of the process
    q, fulls, _ = _end_together(root, fault=f"fsync:{shared}:EIO,")
    try:
        wait_for(lambda: q.counts()["done"] == 2, 20, what="both done after the retry")
        assert q.counts()["run"] == 0
    finally:
        q.stop()
    assert _done_events(root) == sorted(short(f) for f in fulls)
