"""Crash test (2) of issue 2: fail each spool operation of enqueue, commit and
complete in turn, with EIO and with ENOSPC, through the file-operation seam
(rq/fsops.py, chosen by RQ_FS_FAULTS in the queue process's main()).

For every injected failure: no "ok" reply for data that is not durable (an
ok'd message is in que/ after the fault and after a restart; a failed one is
nowhere but possibly an uncommitted prep/), the daemon keeps serving, a later
retry succeeds, and `rq fsck` finds the store consistent (crash test (3)).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from rq.fsck import check_root
from rqtest import QueueProc, learn_ops, make_queue, wait_for, write_script

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
    make_queue(root, "f", script="/bin/true")
    (root / "config" / "f.pause").touch()
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
    return len(learn_ops(root, "p", lambda q: q.call("create_message", {"dest": "p"})))

