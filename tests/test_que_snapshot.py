"""The que/ index a clean stop leaves for the next start (rq.queue.snapshot; S2.5, S2.7,
issue 15: a restart with a million queued messages).  The file is used only while que/ is
the directory it describes and the file is whole; otherwise every msg is read, as before."""

from __future__ import annotations

import json
import os
import random
import time
from pathlib import Path
from typing import Any

from rqtest import QueueProc, make_queue, wait_for

from rq.queue import recovery, snapshot
from rq.store import Store

N = snapshot.MIN_ENTRIES + 200


def msg_id(i: int) -> str:
    return f"20240101.0000.{i // 1000 % 60:02d}.{i % 1000:03d}.{1000000 + i}"


def write_que(qdir: Path, n: int, seed: int = 1) -> list[str]:
    """n que/ID/msg files with the variety the index holds: float and integer dues, other
    dests, params with JSON's hard characters, tries; written as RQ writes them (compact)."""
    rng = random.Random(seed)
    odd = ["", "a\tb", "line\nbreak", 'q"uote\\', "ünï €", "\u2028", "x" * 300]
    ids = []
    for i in range(n):
        mid = msg_id(i)
        fields: dict[str, Any] = {"msg_id": mid, "dest": rng.choice(["q", "http://h:1/q/x"]),
                                  "due": rng.choice([1700000000 + i, 1700000000.25 + i]),
                                  "count": rng.choice([0, 0, 3, 14]), "max_count": 15}
        if i % 3:
            for k in range(1, 5):
                if rng.random() < 0.6:
                    fields[f"param{k}"] = rng.choice(odd)
        d = qdir / "que" / mid
        d.mkdir(parents=True)
        (d / "msg").write_text(json.dumps(fields, separators=(",", ":"), ensure_ascii=False))
        ids.append(mid)
    return ids


def scanned(store: Store) -> list[Any]:
    return sorted(recovery.que_items(store, time.time()))


def saved_store(root: Path, n: int = N) -> tuple[Store, Path]:
    qdir = make_queue(root, "q", "/bin/true")
    write_que(qdir, n)
    store = Store(str(root), "q")
    assert snapshot.save(store, scanned(store), n)
    return store, qdir / snapshot.NAME


# ---------------------------------------------------------------- the file on its own
def test_the_saved_index_equals_a_full_read_and_serves_one_start(root: Path) -> None:
    store, path = saved_store(root)
    assert path.is_file()
    loaded = snapshot.load(store)
    assert loaded is not None and loaded == scanned(store)  # every field of every entry
    assert {item.seq for item in loaded} == {0}  # found at start (S5.6), as a full read
    assert not path.exists()
    assert snapshot.load(store) is None  # one stop, one start


def test_any_change_of_que_after_the_stop_refuses_the_index(root: Path) -> None:
    store, path = saved_store(root)
    que = root / "queue" / "q" / "que"
    changes = [
        lambda: (que / msg_id(N + 1)).mkdir(),                           # a message added
        lambda: os.rename(que / msg_id(3), root / "queue" / "q" / "err" / msg_id(3)),
        lambda: os.rename(que / msg_id(4), que / msg_id(N + 2)),          # renamed
        lambda: os.utime(que),                                           # touched
    ]
    for change in changes:
        assert snapshot.save(store, scanned(store), len(scanned(store)))
        change()
        assert snapshot.load(store) is None
        assert not path.exists()


def damages(good: bytes, magic: bytes) -> dict[str, bytes]:
    """A good file of N entries (an index or a checkpoint) damaged in the ways a crash, a disk
    or a user can damage it."""
    end = len(good) - snapshot.BLOCK.size
    mid = len(good) // 2
    return {
        "torn": good[:mid],
        "no end mark": good[:end],
        "flipped byte": good[:mid] + bytes([good[mid] ^ 1]) + good[mid + 1:],
        "count changed": good[:end] + snapshot.BLOCK.pack(0, N - 1),
        "after the end": good + good[-20:],
        "other format": good.replace(magic, magic[:-1] + b"9", 1),
        "empty": b"",
    }


def test_a_damaged_index_is_refused_as_a_whole(root: Path) -> None:
    store, path = saved_store(root)
    good = path.read_bytes()
    for what, data in damages(good, snapshot.MAGIC).items():
        assert data != good
        path.write_bytes(data)
        os.utime(path)  # not que/: the header still matches for all but "empty"
        assert snapshot.load(store) is None, what
    path.write_bytes(good)
    assert snapshot.load(store) == scanned(store)


def test_a_small_queue_writes_no_index(root: Path) -> None:
    qdir = make_queue(root, "q", "/bin/true")
    write_que(qdir, snapshot.MIN_ENTRIES - 1)
    store = Store(str(root), "q")
    (qdir / snapshot.NAME).write_text("left by an earlier stop")
    assert not snapshot.save(store, scanned(store), snapshot.MIN_ENTRIES - 1)
    assert not (qdir / snapshot.NAME).exists()


# ---------------------------------------------------------------- the queue process
def listing(q: QueueProc) -> list[dict[str, Any]]:
    return q.call("messages", {"state": "que", "limit": 10 * N})


def used_index(root: Path, count: int) -> int:
    """How many starts so far logged reading `count` entries from the last stop's index."""
    text = (root / "log" / "queuemgr.log").read_text()
    return text.count(f"read {count} queued messages from the index of the last stop")


def test_a_restart_after_a_clean_stop_reads_the_index_and_after_a_crash_every_msg(
        root: Path) -> None:
    qdir = make_queue(root, "q", "/bin/true")
    write_que(qdir, N)
    (root / "config" / "q.pause").touch()  # nothing starts: que/ stays as written
    q = QueueProc(root, "q")
    full = listing(q)
    assert len(full) == N and used_index(root, N) == 0
    assert q.stop() == 0
    assert (qdir / snapshot.NAME).is_file()

    q = QueueProc(root, "q")  # after the clean stop
    try:
        assert used_index(root, N) == 1 and not (qdir / snapshot.NAME).exists()
        assert listing(q) == full and q.counts()["que"] == N
        # the index is read at start only: a crash now leaves none behind
    finally:
        q.kill()
    assert not (qdir / snapshot.NAME).exists()
    q = QueueProc(root, "q")  # after the crash: every msg read
    try:
        assert used_index(root, N) == 1 and listing(q) == full
    finally:
        assert q.stop() == 0

    # A message a user moves into que/ while the queue is stopped refuses the index, even
    # right after the stop (the stop outlasts the clock's step of que/'s ctime).
    extra = root / "queue" / "q" / "prep" / msg_id(N + 5)
    extra.mkdir()
    (extra / "msg").write_text(json.dumps({"msg_id": msg_id(N + 5), "dest": "q",
                                           "due": 1, "count": 0, "max_count": 15}))
    os.rename(extra, qdir / "que" / msg_id(N + 5))
    q = QueueProc(root, "q")
    try:
        wait_for(lambda: q.counts()["que"] == N + 1, 10, what="the added message counted")
        assert used_index(root, N) == 1 and used_index(root, N + 1) == 0
        assert listing(q)[0]["msg_id"] == msg_id(N + 5)  # due 1: first
    finally:
        assert q.stop() == 0
    assert (qdir / snapshot.NAME).is_file()  # this stop wrote a fresh one


def test_no_index_when_que_changed_after_the_clock(root: Path) -> None:
    """A que/ whose last change is dated after now (the clock was set back since) could be
    changed again with the same ctime: no index is left, and the stop does not wait."""
    qdir = make_queue(root, "q", "/bin/true")
    write_que(qdir, N)
    store = Store(str(root), "q")
    items = scanned(store)
    clock = time.time
    try:
        time.time = lambda: clock() - 3600  # type: ignore[assignment]  # the OS seam: the clock
        t0 = clock()
        assert not snapshot.save(store, items, N)
        assert clock() - t0 < 5
    finally:
        time.time = clock  # type: ignore[assignment]
    assert not (qdir / snapshot.NAME).exists()
    assert snapshot.save(store, items, N) and (qdir / snapshot.NAME).exists()


# ---------------------------------------------------------------- the running queue's checkpoint
def entry(items: list[Any], mid: str) -> Any:
    return next(item for item in items if item.msg_id == mid)


def past_file_clock(path: Path) -> None:
    """Wait until the clock is more than TICK past `path`'s ctime (a condition, not a sleep:
    a checkpoint taken now is then later than every change made so far)."""
    ctime = path.stat().st_ctime_ns
    wait_for(lambda: time.time_ns() > ctime + 2 * snapshot.TICK * 1e9, 5, interval=0.005,
             what="the clock to pass the last change")


def test_a_checkpoint_keeps_unchanged_entries_and_every_changed_message_is_read(
        root: Path) -> None:
    qdir = make_queue(root, "q", "/bin/true")
    ids = write_que(qdir, N)
    store = Store(str(root), "q")
    que = qdir / "que"
    past_file_clock(que / ids[-1] / "msg")
    items = scanned(store)
    # One entry differs from its file, as no full read could give it: proof that unchanged
    # messages keep the checkpoint's entry instead of being read.
    marked = entry(items, ids[9])._replace(tries=99)
    taken = time.time_ns()
    assert snapshot.save_checkpoint(store, [marked if i.msg_id == ids[9] else i for i in items],
                                    taken)
    checkpoint = snapshot.load_checkpoint(store)
    assert checkpoint is not None and checkpoint[0] == taken and len(checkpoint[1]) == N
    assert entry(recovery.que_items(store, time.time(), checkpoint), ids[9]).tries == 99

    def rewrite(mid: str, **change: Any) -> None:
        fields = json.loads((que / mid / "msg").read_text())
        (que / mid / "msg.new").write_text(json.dumps({**fields, **change}))
        os.rename(que / mid / "msg.new", que / mid / "msg")
    rewrite(ids[5], due=5)                                     # replaced by rename, as RQ does
    with open(que / ids[6] / "msg", "r+") as f:                # rewritten in place
        text = f.read().replace('"count":', '"count":1', 1)  # 0 -> 10, 3 -> 13, 14 -> 114
        f.seek(0)
        f.write(text)
    os.rename(que / ids[7], qdir / "err" / ids[7])             # gone
    (que / ids[8] / "msg").rename(que / ids[8] / "other")     # a symlink in its place: read
    (que / ids[8] / "msg").symlink_to("other")
    new = msg_id(N + 7)                                        # added
    (que / new).mkdir()
    (que / new / "msg").write_text(json.dumps({"msg_id": new, "dest": "q", "due": 2}))
    os.chmod(que / ids[9] / "msg", 0o600)                      # its ctime changes: read again

    got = sorted(recovery.que_items(store, time.time(), snapshot.load_checkpoint(store)))
    assert got == scanned(store)  # every field of every entry, as a full read now
    assert entry(got, ids[5]).due == 5 and entry(got, ids[6]).tries != entry(items, ids[6]).tries
    assert ids[7] not in {i.msg_id for i in got}
    assert entry(got, ids[9]).tries == entry(items, ids[9]).tries and got[0].msg_id == new
    assert (qdir / snapshot.CHECKPOINT).is_file()  # it stays: every use checks it again


def test_a_damaged_or_foreign_checkpoint_is_not_used(root: Path) -> None:
    qdir = make_queue(root, "q", "/bin/true")
    write_que(qdir, N)
    store = Store(str(root), "q")
    path = qdir / snapshot.CHECKPOINT
    items = scanned(store)
    taken = time.time_ns()
    assert snapshot.save_checkpoint(store, items, taken)
    good = path.read_bytes()
    assert snapshot.save_checkpoint(store, items, taken - 1)  # another one, one ns earlier
    other = path.read_bytes()
    damaged = {
        **damages(good, snapshot.CHECKPOINT_MAGIC),
        "blocks of another checkpoint": good[:good.index(b"\n") + 1]
        + other[other.index(b"\n") + 1:],
        "from the future": good.replace(b"%d\n" % taken, b"%d\n" % (taken + 10**12), 1),
        "no time": good.replace(b"%d\n" % taken, b"x\n", 1),
    }
    for what, data in damaged.items():
        assert data != good, what
        path.write_bytes(data)
        assert snapshot.load_checkpoint(store) is None, what
    path.write_bytes(good)
    assert snapshot.load_checkpoint(store) == (taken, {i.msg_id: i for i in items})


def checkpoint_used(root: Path) -> list[str]:
    text = (root / "log" / "queuemgr.log").read_text()
    return [line for line in text.splitlines()
            if "from the running queue's last checkpoint" in line]


def test_a_start_after_a_crash_reads_the_running_queues_checkpoint(root: Path) -> None:
    """S2.7 after a SIGKILL: the checkpoint the running queue wrote (RQ_QUE_CHECKPOINT_SECONDS
    shortens its 60 s) stands in for the msg files that did not change since, and the start
    sees exactly what a full read sees: messages created, sent to the front and deleted after
    the checkpoint included."""
    qdir = make_queue(root, "q", "/bin/true")
    write_que(qdir, N)
    (root / "config" / "q.pause").touch()  # nothing starts: que/ changes only as told below
    path = qdir / snapshot.CHECKPOINT
    q = QueueProc(root, "q", {"RQ_QUE_CHECKPOINT_SECONDS": "0.2"})
    try:
        wait_for(path.is_file, 20, what="the running queue's checkpoint")
        first = path.stat().st_mtime_ns
        assert q.call("create_message", {"dest": "q", "param1": "late"})[0] == "ok"
        wait_for(lambda: path.stat().st_mtime_ns != first, 20, what="a second checkpoint")
        # after it: a msg rewritten (sent to the front of the queue) and a deletion
        assert q.call("run_message", {"msg_id": msg_id(11)})[0] == "ok"
        assert q.call("delete_message", {"msg_id": msg_id(12)})[0] == "ok"
        assert q.call("create_message", {"dest": "q", "param1": "later"})[0] == "ok"
        before = listing(q)
    finally:
        q.kill()
    assert not (qdir / snapshot.NAME).exists()  # no clean stop: no stop index
    q = QueueProc(root, "q")
    try:
        used = checkpoint_used(root)
        assert len(used) == 1 and f"of {N + 1} entries" in used[0], used
        assert listing(q) == before
    finally:
        q.kill()
    path.unlink()
    q = QueueProc(root, "q")  # every msg read: the same
    try:
        assert listing(q) == before and len(checkpoint_used(root)) == 1
    finally:
        assert q.stop() == 0


def test_checkpoints_are_written_for_large_queues_and_only_after_que_changed(root: Path) -> None:
    """Below MIN_ENTRIES none is written and an earlier one is removed."""
    qdir = make_queue(root, "q", "/bin/true")
    ids = write_que(qdir, N)
    store = Store(str(root), "q")
    path = qdir / snapshot.CHECKPOINT
    items = scanned(store)
    checkpoints = snapshot.Checkpoints(store, every=3600)
    assert checkpoints.next_at > time.monotonic() + 3000

    checkpoints.take(items[:snapshot.MIN_ENTRIES - 1], snapshot.MIN_ENTRIES - 1)  # too few
    assert not checkpoints.busy and not path.exists()
    checkpoints.take(items, N)
    wait_for(lambda: not checkpoints.busy, 10, what="the checkpoint's thread")
    assert snapshot.load_checkpoint(store) is not None and checkpoints.next_at > time.monotonic()
    written = path.stat().st_ino
    checkpoints.take(items, N)  # que/ unchanged since: nothing to write
    assert not checkpoints.busy and path.stat().st_ino == written

    os.rename(qdir / "que" / ids[0], qdir / "err" / ids[0])  # que/ changed
    checkpoints.take(items[1:], N - 1)
    wait_for(lambda: not checkpoints.busy, 10, what="the checkpoint's thread")
    assert path.stat().st_ino != written
    checkpoint = snapshot.load_checkpoint(store)
    assert checkpoint is not None and len(checkpoint[1]) == N - 1

    checkpoints.take(items[:10], 10)  # a few left: a stale file would cost a start more
    assert not path.exists() and not checkpoints.busy
    checkpoints.take(items, N)  # many again: written again, que/ unchanged or not
    wait_for(lambda: not checkpoints.busy, 10, what="the checkpoint's thread")
    assert path.exists()
