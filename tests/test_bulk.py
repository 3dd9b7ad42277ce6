"""Bulk retry and clean-up (issue 16 item 6): the queue commands `requeue_messages` and
`purge_messages` (rq/queue/bulkmove.py) against a real queue process, `rq requeue` and
`rq purge` as real subprocesses, and a queue process SIGKILLed half way through a bulk
requeue and a bulk purge: every message ends in exactly one state (S13 events for each
move that happened, S7.3 counts from disk after the restart)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from rqtest import REPO, QueueProc, make_queue, make_root, read_events, wait_for, write_script

from rq import message

DAY = 86400
DONE_SH = "#!/bin/sh\necho \"done ok $RQ_PARAM1\" >&3\n"


def old_id(epoch: float, n: int) -> str:
    t = time.gmtime(epoch)
    return time.strftime("%Y%m%d.%H%M.%S", t) + f".{int(epoch * 1000) % 1000:03d}.{n}"


def put(root: Path, queue: str, state: str, msg_id: str, status: str = "by hand",
        **fields: Any) -> Path:
    """A finished message written as a queue process would leave it (S4.6)."""
    where = f"{message.bucket(msg_id)}/{msg_id}" if state in ("done", "relayed") else msg_id
    path = root / "queue" / queue / state / where
    path.mkdir(parents=True)
    (path / "msg").write_text(json.dumps({"dest": queue, "count": 2, "max_count": 3,
                                          "due": 1, **fields}))
    (path / "status").write_text(json.dumps({"job_status": status}))
    return path


def ids_in(root: Path, queue: str, state: str) -> set[str]:
    base = root / "queue" / queue / state
    if state in ("done", "relayed"):
        return {p.name for p in base.glob("*/*/*/*")}
    return {p.name for p in base.iterdir()}


@pytest.fixture
def root(tmp_path: Path) -> Path:
    root = make_root(tmp_path)
    make_queue(root, "test", write_script(tmp_path / "done.sh", DONE_SH))
    return root


def rq(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    res = subprocess.run([str(REPO / "bin" / "rq"), "--root", str(root), *args],
                         capture_output=True, text=True, timeout=120)
    assert "Traceback" not in res.stderr, res.stderr
    return res


# ---------------------------------------------------------------- requeue


def test_requeue_moves_every_err_message_back_to_que_logged_and_counted(root: Path) -> None:
    now = time.time()
    ids = [old_id(now - 3600, n) for n in range(1, 4)]
    for msg_id in ids:
        put(root, "test", "err", msg_id, "HIT MAX RESEND COUNT - MOVING TO ERR")
    (root / "config" / "test.pause").touch()  # so they wait in que to be looked at
    qp = QueueProc(root, "test")
    try:
        assert qp.counts()["err"] == 3
        assert qp.call("requeue_messages", {"state": "err", "dry_run": True}) == ["ok", 3]
        assert ids_in(root, "test", "err") == set(ids)
        before = time.time()
        assert qp.call("requeue_messages", {"state": "err"}) == ["ok", 3]
        assert ids_in(root, "test", "err") == set() and ids_in(root, "test", "que") == set(ids)
        assert (qp.counts()["err"], qp.counts()["que"]) == (0, 3)
        msg = qp.message(f"http://127.0.0.1:3333/q/test/{ids[0]}")
        assert msg["count"] == 2 and before - 1 <= msg["due"] <= time.time()  # due now
        assert msg["status"] == "que - REQUEUED - MOVING TO QUE"
        events = [e for e in read_events(root, "test") if e["from"] == "err"]
        assert sorted(e["msg_id"] for e in events) == ids
        assert {(e["to"], e["status"], e["count"]) for e in events} == \
            {("que", "REQUEUED - MOVING TO QUE", 2)}
        os.unlink(root / "config" / "test.pause")
        wait_for(lambda: qp.counts()["done"] == 3, what="the requeued messages to run")
        assert qp.call("requeue_messages", {"state": "err"}) == ["ok", 0]
    finally:
        qp.stop()


def test_requeue_only_the_messages_matching_a_search(root: Path) -> None:
    now = time.time()
    put(root, "test", "err", old_id(now, 1), "err timeout talking to db", param1="a")
    put(root, "test", "err", old_id(now, 2), "err bad input", param1="b")
    put(root, "test", "done", old_id(now, 3), "done fine", param1="report-7")
    put(root, "test", "done", old_id(now, 4), "duplicate of another", param1="report",
        dup=f"http://127.0.0.1:3333/q/test/{old_id(now, 9)}")
    (root / "config" / "test.pause").touch()  # the requeued stay in que until resumed
    qp = QueueProc(root, "test")
    try:
        assert qp.call("requeue_messages", {"state": "err", "query": {"status": "timeout"}}) \
            == ["ok", 1]
        assert ids_in(root, "test", "err") == {old_id(now, 2)}
        reply = qp.call("requeue_messages", {"state": "done", "query": {"param1": "report"},
                                             "exact": True})
        assert reply == ["ok", 1]
        assert ids_in(root, "test", "done") == {old_id(now, 3)}
        assert ids_in(root, "test", "que") == {old_id(now, 1), old_id(now, 4)}
        requeued = qp.message(f"http://127.0.0.1:3333/q/test/{old_id(now, 4)}")
        assert "dup" not in requeued and requeued["count"] == 2  # S4.4: of the last run only
        os.unlink(root / "config" / "test.pause")
        wait_for(lambda: qp.counts()["done"] == 3, what="the requeued messages to run")
    finally:
        qp.stop()


@pytest.mark.parametrize("cmd, arg, reason", [
    ("requeue_messages", {"state": "que"}, "invalid state for requeue (que)"),
    ("requeue_messages", {"state": "err", "query": {"param1": 5}}, "invalid query"),
    ("purge_messages", {"states": ["run"], "older_than": 0}, 'invalid states for purge (["run"])'),
    ("purge_messages", {"states": ["done"]}, "invalid older_than"),
    ("purge_messages", {"older_than": -1}, "invalid older_than"),
])
def test_bad_requests_get_one_reason(root: Path, cmd: str, arg: Any, reason: str) -> None:
    qp = QueueProc(root, "test")
    try:
        assert qp.call(cmd, arg) == ["fail", reason]
    finally:
        qp.stop()


# ---------------------------------------------------------------- purge


def test_purge_deletes_finished_messages_older_than_the_age(root: Path) -> None:
    now = time.time()
    old = [put(root, "test", s, old_id(now - 10 * DAY, n)).name
           for n, s in enumerate(("done", "done", "err", "relayed"), 1)]
    young = [put(root, "test", s, old_id(now - 3600, n)).name
             for n, s in enumerate(("done", "err", "relayed"), 10)]
    qp = QueueProc(root, "test")
    try:
        arg = {"states": ["done", "err", "relayed"], "older_than": 7 * DAY}
        assert qp.call("purge_messages", {**arg, "dry_run": True}) == ["ok", 4]
        assert qp.call("purge_messages", {**arg, "states": ["done"]}) == ["ok", 2]
        assert qp.call("purge_messages", arg) == ["ok", 2]
        left = {i for s in ("done", "err", "relayed") for i in ids_in(root, "test", s)}
        assert left == set(young)
        assert qp.counts() == {"prep": 0, "que": 0, "run": 0, "done": 1, "relayed": 1, "err": 1}
        deleted = [e for e in read_events(root, "test") if e["to"] == "deleted"]
        assert sorted(e["msg_id"] for e in deleted) == sorted(old)
        assert all(e["status"] == "by hand" and e["count"] == 2 for e in deleted)
        assert not list((root / "queue" / "test").glob(".deleting.*"))
    finally:
        qp.stop()


# ---------------------------------------------------------------- the CLI


def test_cli_requeue_and_purge(root: Path) -> None:
    now = time.time()
    for n in range(1, 3):
        put(root, "test", "err", old_id(now - 9 * DAY, n), param1=f"job{n}")
    put(root, "test", "done", old_id(now - 9 * DAY, 3))
    put(root, "test", "done", old_id(now - 60, 4))
    qp = QueueProc(root, "test")
    try:
        res = rq(root, "requeue", "--queue", "test", "--search", "param1=job1", "--dry-run")
        assert (res.returncode, res.stdout, res.stderr) == \
            (0, "ok 1 message would be requeued\n", "")
        res = rq(root, "requeue", "--queue", "test", "--state", "err")
        assert (res.returncode, res.stdout) == (0, "ok 2 messages requeued\n")
        wait_for(lambda: qp.counts()["done"] == 4, what="the requeued messages to run")
        res = rq(root, "purge", "--queue", "test", "--state", "done", "--older-than", "7d")
        assert (res.returncode, res.stdout) == (0, "ok 3 messages purged\n")  # ids' age
        res = rq(root, "purge", "--queue", "test", "--older-than", "0")
        assert (res.returncode, res.stdout) == (0, "ok 1 message purged\n")
    finally:
        qp.stop()


@pytest.mark.parametrize("args, err", [
    (["purge", "--queue", "test"], "rq: missing required argument --older-than\n"),
    (["purge", "--queue", "test", "--older-than", "7 fortnights"],
     "rq: invalid --older-than 7 fortnights (a number with s, m, h, d or w, e.g. 7d)\n"),
    (["requeue", "--queue", "test", "--search", "nofield"],
     "rq: invalid --search nofield (FIELD=VALUE, e.g. param1=report)\n"),
    (["requeue", "--queue", "nosuch"], "rq: queue not found: nosuch\n"),
    (["requeue", "--queue", "test", "--state", "run"], None),
])
def test_cli_bad_input_is_one_line(root: Path, args: list[str], err: str | None) -> None:
    qp = QueueProc(root, "test") if err is None else None
    try:
        res = rq(root, *args)
    finally:
        if qp is not None:
            qp.stop()
    assert res.returncode == 1
    if err is None:  # the queue's refusal, as S19.3 prints it
        assert res.stdout == "fail invalid state for requeue (run)\n"
    else:
        assert (res.stdout, res.stderr) == ("", err)


# ---------------------------------------------------------------- SIGKILL half way


def make_many(root: Path, state: str, n: int) -> set[str]:
    start = time.time() - 30 * DAY
    return {put(root, "test", state, old_id(start + i * 0.001, 1)).name for i in range(n)}


def kill_half_way(qp: QueueProc, root: Path, cmd: str, arg: Any, to: str) -> int:
    """Start `cmd` and SIGKILL the queue process once some, not all, moves are logged;
    returns how many were logged."""
    threading.Thread(target=lambda: _quiet_call(qp, cmd, arg), daemon=True).start()
    wait_for(lambda: any(e["to"] == to for e in read_events(root, "test")), 60, interval=0.002,
             what="the first moves")
    os.killpg(qp.popen.pid, signal.SIGKILL)
    qp.popen.wait(10)
    qp.log.close()
    return sum(1 for e in read_events(root, "test") if e["to"] == to)


def _quiet_call(qp: QueueProc, cmd: str, arg: Any) -> None:
    try:
        qp.call(cmd, arg, timeout=120)
    except Exception:
        pass  # the process is killed under it


N = 3000


def test_requeue_killed_half_way_leaves_each_message_in_one_state(root: Path) -> None:
    ids = make_many(root, "err", N)
    (root / "config" / "test.pause").touch()
    qp = QueueProc(root, "test")
    logged = kill_half_way(qp, root, "requeue_messages", {"state": "err"}, "que")
    err, que = ids_in(root, "test", "err"), ids_in(root, "test", "que")
    assert err | que == ids and not err & que  # each exactly once
    assert 0 < len(que) < N, "the kill came too late to test anything"
    assert logged <= len(que)  # an event only after the move is on disk
    qp = QueueProc(root, "test")
    try:
        assert qp.counts()["err"] + qp.counts()["que"] == N
        assert qp.call("requeue_messages", {"state": "err"}) == ["ok", len(err)]
        assert qp.counts()["que"] == N
    finally:
        qp.stop()


def test_purge_killed_half_way_leaves_each_message_in_one_state(root: Path) -> None:
    ids = make_many(root, "done", N)
    qp = QueueProc(root, "test")
    logged = kill_half_way(qp, root, "purge_messages", {"older_than": DAY}, "deleted")
    left = ids_in(root, "test", "done")
    assert left < ids and 0 < len(left)
    assert logged <= N - len(left)
    qp = QueueProc(root, "test")  # recovery removes what the kill left hidden
    try:
        assert not list((root / "queue" / "test").glob(".deleting.*"))
        assert qp.counts()["done"] == len(left)
        assert qp.call("purge_messages", {"older_than": DAY}) == ["ok", len(left)]
    finally:
        qp.stop()
