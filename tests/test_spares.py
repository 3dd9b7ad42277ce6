"""Spare message directories (rq/spares.py): made ahead by a background thread,
claimed by Store.allocate with one no-clobber rename (S4.1, S0.3.1).

Covered: a create goes through a spare and leaves a clean message directory; a
claim never clobbers an existing directory; leftovers of an earlier run are
cleared at start; a queue that cannot make spares still enqueues (mkdir); and
with spares on, failing each spool operation of a create in turn never gives
an ok for a message that is not durable (crash test (2) of issue 2, spare path).
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

import pytest

from rq import spares
from rq.fsck import check_root
from rq.spares import Spares
from rq.store import Store
from rqtest import QueueProc, learn_ops, make_buckets_ahead, make_queue, wait_for

ERRNOS = ("EIO", "ENOSPC")


def spare_count(qdir: Path, kind: str = "msg") -> int:
    base = qdir / spares.DIRNAME
    return sum(n.startswith(kind + "-") for n in os.listdir(base)) if base.is_dir() else 0


@pytest.fixture
def store(tmp_path: Path):
    root = tmp_path / "root"
    for state in ("prep", "que", "run", "err", "done", "relayed"):
        (root / "queue" / "s" / state).mkdir(parents=True)
    st = Store(str(root), "s")
    st.spares = Spares(st.qdir)
    st.spares.reset()
    wait_for(lambda: all(st.spares.ready(k) >= spares.HIGH for k in spares.KINDS), 10,
             what="spares made")
    yield st
    st.spares.close()


def test_allocate_claims_a_spare_and_leaves_only_msg(store: Store) -> None:
    spare_inodes = {os.stat(os.path.join(store.spares.base, n)).st_ino
                    for n in os.listdir(store.spares.base) if n.startswith("msg-")}
    fields = {"dest": "s", "param1": "p"}
    msg_id, path = store.allocate(fields, 1_700_000_000.0, "http://h:1/")
    assert os.stat(path).st_ino in spare_inodes  # the directory is a former spare
    assert sorted(os.listdir(path)) == ["msg"]   # the spare's msg holds the message
    assert Store.read_msg(path)["param1"] == "p"
    assert store.spares.ready() == spares.HIGH - 1
    assert spare_count(Path(store.qdir)) == spares.HIGH - 1


def test_claim_never_clobbers_an_existing_directory(store: Store) -> None:
    taken = Path(store.state_dir("prep")) / "20260101.0000.00.000.1"
    taken.mkdir()
    (taken / "keep").write_text("mine")
    assert store.claim_spare("msg", str(taken)) is False
    assert (taken / "keep").read_text() == "mine"
    assert sorted(os.listdir(taken)) == ["keep"]
    assert spare_count(Path(store.qdir)) == spares.HIGH - 1  # the spare was dropped


def test_refill_below_low_water(store: Store) -> None:
    for i in range(spares.HIGH - spares.LOW + 1):
        store.allocate({"dest": "s", "param1": str(i)}, 1_700_000_000.0, "http://h:1/")
    wait_for(lambda: store.spares.ready() >= spares.HIGH, 10, what="refill")
    assert len(os.listdir(store.state_dir("prep"))) == spares.HIGH - spares.LOW + 1


def fillers() -> int:
    return sum(t.name == "rq-spares" for t in threading.enumerate())


def test_the_filler_runs_only_while_a_kind_is_refilled(store: Store) -> None:
    """Issue 17: full pools leave no thread behind; a take below LOW starts one, which
    refills to HIGH and leaves again."""
    wait_for(lambda: fillers() == 0, 10, what="the filler gone once the spares are made")
    for _ in range(spares.HIGH - spares.LOW + 1):
        assert store.spares.take("job") is not None
    wait_for(lambda: store.spares.ready("job") >= spares.HIGH, 10, what="refill")
    wait_for(lambda: fillers() == 0, 10, what="the filler gone after the refill")
    store.spares.close()
    for _ in range(spares.HIGH):
        store.spares.take("job")
    assert fillers() == 0  # closed: no new filler


def test_recycle_keeps_a_file_as_a_spare_until_the_pool_is_full(store: Store) -> None:
    base = Path(store.spares.base)
    ready = store.spares.ready("file")
    run = Path(store.state_dir("run")) / "20260101.0000.00.000.1"
    run.mkdir()
    pid = run / "pid"
    pid.write_text("123\n")
    ino = pid.stat().st_ino
    store.discard_file(str(pid))
    assert not pid.exists()
    assert store.spares.ready("file") == ready + 1
    assert ino in {(base / n).stat().st_ino for n in os.listdir(base)}
    store.discard_file(str(run / "gone"))  # already gone: quiet, nothing kept
    assert store.spares.ready("file") == ready + 1
    while store.spares.ready("file") < spares.KEEP:
        extra = run / "x"
        extra.write_text("x")
        store.discard_file(str(extra))
    extra = run / "x"
    extra.write_text("x")
    store.discard_file(str(extra))  # the pool is full: deleted
    assert not extra.exists()
    assert store.spares.ready("file") == spares.KEEP


def test_write_file_recycles_the_replaced_file(store: Store) -> None:
    """A status rewrite exchanges the new file with the old one (S0.3.1: readers
    see one or the other) and keeps the old inode as a spare."""
    run = Path(store.state_dir("run")) / "20260101.0000.00.000.1"
    run.mkdir()
    store.write_status(str(run), "first")
    first = (run / "status").stat().st_ino
    ready = store.spares.ready("file")
    store.write_status(str(run), "second")
    assert Store.read_status_text(str(run)) == "second"
    assert (run / "status").stat().st_ino != first
    assert store.spares.ready("file") == ready  # one taken, the old one given back
    base = Path(store.spares.base)
    assert first in {(base / n).stat().st_ino for n in os.listdir(base)}
    assert sorted(os.listdir(run)) == ["status"]


def test_reset_clears_leftovers(tmp_path: Path) -> None:
    qdir = tmp_path / "q"
    (qdir / spares.DIRNAME / "msg-7").mkdir(parents=True)
    (qdir / spares.DIRNAME / "msg-7" / "msg").write_text("half")
    sp = Spares(str(qdir))
    sp.reset()
    try:
        wait_for(lambda: all(sp.ready(k) >= spares.HIGH for k in spares.KINDS),
                 10, what="spares made")
        names = os.listdir(qdir / spares.DIRNAME)
        assert len(names) == len(spares.KINDS) * spares.HIGH
        for name in names:
            kind = name.split("-")[0]
            path = qdir / spares.DIRNAME / name
            if spares.KINDS[kind]:
                assert os.listdir(path) == [spares.KINDS[kind]]
                path = path / spares.KINDS[kind]
            assert path.is_file() and path.stat().st_size == 0
    finally:
        sp.close()


def test_spares_are_never_fsynced_and_a_durable_allocate_syncs_its_own(
        store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 15: a journaled create needs nothing of its spare's durability, so no
    spare is fsynced when it is made; an allocation that must be durable by itself
    (prep_message: no journal record stands for it) fsyncs the msg and then the
    spare's directory, both before the rename that publishes it as prep/ID."""
    calls: list[tuple[str, str]] = []
    for name in ("fsync_dir", "write_file_private", "rename_noreplace"):
        real = getattr(store.fs, name)

        def spy(*args: Any, _real: Any = real, _name: str = name, **kwargs: Any) -> Any:
            calls.append((_name, str(args[0])))
            return _real(*args, **kwargs)
        monkeypatch.setattr(store.fs, name, spy)
    spares_before = set(os.listdir(store.spares.base))
    journaled: list[bytes] = []
    store.allocate({"dest": "s"}, 1_700_000_000.0, "http://h:1/", sync_prep=False,
                   journaled=journaled)
    assert [c[0] for c in calls] == ["write_file_private", "rename_noreplace"], calls
    assert journaled and json.loads(journaled[0])["dest"] == "s"
    calls.clear()
    _, path = store.allocate({"dest": "s"}, 1_700_000_000.0, "http://h:1/")
    spare = calls[0][1].rsplit("/", 1)[0]
    assert os.path.basename(spare) in spares_before
    assert [c[0] for c in calls] == ["write_file_private", "fsync_dir", "rename_noreplace",
                                     "fsync_dir"], calls
    assert calls[1][1] == spare and calls[3][1] == os.path.dirname(path)


def test_queue_without_spares_still_enqueues(root: Path) -> None:
    """`.spare` cannot be made (a file is in the way): enqueue falls back to mkdir."""
    make_queue(root, "f", script="/bin/true")
    (root / "config" / "f.pause").touch()
    (root / "queue" / "f" / spares.DIRNAME).write_text("in the way")
    q = QueueProc(root, "f")
    try:
        for _ in range(3):
            assert q.call("create_message", {"dest": "f"})[0] == "ok"
        assert q.call("num_messages")["que"] == 3
    finally:
        q.stop()
    assert check_root(str(root)).problems == []


def test_running_queue_keeps_spares_and_fsck_is_clean(root: Path) -> None:
    make_queue(root, "f", script="/bin/true")
    (root / "config" / "f.pause").touch()
    qdir = root / "queue" / "f"
    q = QueueProc(root, "f")
    try:
        wait_for(lambda: spare_count(qdir) >= spares.HIGH, 10, what="spares made")
        ids = [q.call("create_message", {"dest": "f", "param1": str(i)})[1] for i in range(50)]
        wait_for(lambda: spare_count(qdir) >= spares.LOW, 10, what="refill")
    finally:
        q.stop()
    report = check_root(str(root))
    assert report.problems == []
    assert sorted(report.states["f"]) == sorted(i.rsplit("/", 1)[-1] for i in ids)
    assert set(report.states["f"].values()) == {"que"}


def file_spare_inodes(qdir: Path) -> set[int]:
    base = qdir / spares.DIRNAME
    return {os.stat(base / n).st_ino for n in os.listdir(base) if n.startswith("file-")}


def test_job_start_claims_job_and_file_spares(root: Path, tmp_path: Path) -> None:
    """S6.1: run/ID/job/ with its stdio.log comes from a `job` spare, pid,
    proc.json and each status from `file` spares; the log still starts with the
    RQ START header and holds the script's output, the files their content.
    No inode is freed or made for the small files: pid, proc.json and every
    replaced status come back as `file` spares (rq.spares.recycle)."""
    script = tmp_path / "hello.sh"
    script.write_text('#!/bin/sh\necho hello-from-job\necho "run one" >&3\n'
                      'echo "run two" >&3\necho "done ok" >&3\n')
    script.chmod(0o755)
    make_queue(root, "j", script=str(script))
    qdir = root / "queue" / "j"
    q = QueueProc(root, "j")
    try:
        wait_for(lambda: all(spare_count(qdir, k) >= spares.HIGH for k in spares.KINDS), 10,
                 what="spares of every kind")
        before = file_spare_inodes(qdir)
        full = q.call("create_message", {"dest": "j"})[1]
        q.wait_state(full, "done")
        assert spare_count(qdir, "job") == spares.HIGH - 1
        # pid, proc.json and three statuses took five `file` spares; four came
        # back (the final status stays with the message)
        after = file_spare_inodes(qdir)
        assert len(after) == spares.HIGH - 1
        assert after <= before  # no new inode: the same files went round
        log = q.call("get_message", {"msg_id": full})
        assert log[0] == "ok"
    finally:
        q.stop()
    done = next(root.glob("queue/j/done/*/*/*/*"))
    assert (done / "status").read_text() == '{"job_status":"ok"}'
    assert sorted(os.listdir(done)) == ["job", "msg", "status"]  # pid files go at the end (S4.6)
    stdio = (done / "job" / "stdio.log").read_text()
    assert stdio.startswith("\n") and "RQ START" in stdio.splitlines()[1], stdio  # S6.3
    assert "hello-from-job" in stdio


def test_fault_each_enqueue_op_with_spares(root: Path) -> None:
    """Spares on: each op of a create fails once in turn.  A spare whose
    publishing rename fails falls back to mkdir (the reply may then be ok); whatever the reply,
    an ok'd message is committed and survives a restart, a failed one is not
    in que, the daemon keeps serving and a retry succeeds."""
    make_queue(root, "f", script="/bin/true")
    (root / "config" / "f.pause").touch()
    make_buckets_ahead(root / "queue" / "f")

    def create(q: QueueProc) -> list:
        return q.call("create_message", {"dest": "f", "param1": "x"})

    ops = learn_ops(root, "f", create, plan="spares,",
                    ready=lambda q: spare_count(root / "queue" / "f") >= spares.HIGH)
    # The msg is written inside the spare, which a rename then publishes as prep/ID: no
    # mkdir on the request path.  Nothing of the directories is fsynced: the create
    # journal's record is (rq.queue.journal), in a segment the first create opens (the
    # segment's name made durable, then the record): two fsyncs, one from the next
    # create on.
    names = [op for op, _ in ops if op != "append"]  # the event log's lines (S13.1)
    assert names[:3] == ["write", "rename", "rename"] and "mkdir" not in names, ops
    assert names[3:] == ["write", "fsync", "write", "fsync"], ops
    claim = next(o for o in ops if o[0] == "rename")
    acked: set[str] = set(check_root(str(root)).states.get("f", {}))
    outcome: dict[tuple[str, int, str], str] = {}
    for op, nth in ops:
        for err in ERRNOS:
            env = {"RQ_FS_FAULTS": f"spares,{op}:{nth}:{err}"}
            q = QueueProc(root, "f", env=env)
            try:
                wait_for(lambda: spare_count(root / "queue" / "f") >= spares.HIGH, 10,
                         what="spares")
                reply = create(q)
                assert reply[0] in ("ok", "fail"), reply
                outcome[(op, nth, err)] = reply[0]
                if reply[0] == "ok":
                    acked.add(reply[1])
                assert q.call("ping") == ["pong"]
                retry = create(q)
                assert retry[0] == "ok", (op, nth, err, retry)
                acked.add(retry[1])
            finally:
                q.stop()
            report = check_root(str(root))
            assert report.problems == [], (op, nth, err, report.problems)
            states = report.states["f"]
            for full in acked:
                assert states.get(full.rsplit("/", 1)[-1]) == "que", (op, nth, err, full)
            assert {i for i, s in states.items() if s == "que"} == \
                {a.rsplit("/", 1)[-1] for a in acked}
    # the claim's own rename failing is survivable: that create was still ok'd
    assert outcome[(*claim, "EIO")] == "ok", outcome
    # a failed fsync of the journal (the segment's name, the record) is a failed create
    for fsync in (o for o in ops if o[0] == "fsync"):
        assert outcome[(*fsync, "EIO")] == "fail", outcome
