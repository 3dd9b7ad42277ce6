"""The queue process's life (SPEC S2.5 graceful stop, S2.7 recovery, the queue lock) and
the event log of those transitions (S13), on real queue processes and real jobs.

A queue process is crashed with SIGKILL of its process group: its jobs run in their own
sessions and survive, as they would after a real crash.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest

from rq.store import Store
from rqtest import (
    REPO, LifelineQueueProc, QueueProc, create_msg, decode_reply_frame, make_queue, msg_events,
    process_gone, raw_exchange, settled_threads, short_id, start_header_pids, wait_file,
    wait_for,
)
from rqtest import job as ops

pytestmark = pytest.mark.timeout(60)
Launch = Callable[..., QueueProc]
SHUTDOWN = "QUEUE SHUTDOWN - MOVING TO QUE"
RESTARTED = "QUEUE RESTARTED - MOVING TO QUE"




def on_disk(root: Path, name: str, full: str) -> dict[str, Any]:
    """A message as read (S4.5) straight from the queue directory."""
    store = Store(str(root), name)
    found = store.locate(short_id(full))
    assert found is not None, full
    return store.message_as_read(*found)


def job_pid(root: Path, name: str, full: str) -> int:
    path = root / "queue" / name / "run" / short_id(full) / "pid"
    return int(wait_for(lambda: path.exists() and path.read_text(), 5, what="run/ID/pid"))


def stop_signal(q: QueueProc, sig: int = signal.SIGTERM) -> None:
    q.popen.send_signal(sig)


# ================================================================ S2.5 graceful stop

def test_s2_5_graceful_stop_requeues_unfinished_jobs_and_honours_completions(
        root: Path, tmp_path: Path, launch: Launch, driver: Path) -> None:
    make_queue(root, "q", driver, num_workers=3, kill_grace=20)
    q = launch("q")
    never = str(tmp_path / "never")
    a = create_msg(q, count=3, param1=ops(["w", "run working\n"], ["wait", never]))
    b = create_msg(q, param1=ops(["w", "done early\n"], ["wait", never]))
    c = create_msg(q, param1=ops(["wait", never]))
    later = create_msg(q, due=time.time() + 1000)
    wait_for(lambda: q.message(b)["status"] == "run - early", 5, what="b's done line")
    wait_for(lambda: q.message(a)["status"] == "run - working", 5, what="a's run line")
    pids = {m: job_pid(root, "q", m) for m in (a, b, c)}

    t0 = time.time()
    stop_signal(q)
    assert q.popen.wait(15) == 0
    elapsed = time.time() - t0
    assert elapsed < 10                      # the jobs died at once: no waiting for grace
    qdir = root / "queue" / "q"
    assert not (qdir / "queue.sock").exists()
    assert not (qdir / "queue.pid").exists()
    for pid in pids.values():
        assert process_gone(pid)

    for m, count in ((a, 3), (c, 0)):
        msg = on_disk(root, "q", m)
        assert msg["state"] == "que"
        assert msg["status"] == f"que - {SHUTDOWN}"
        assert msg["count"] == count                               # unchanged
        assert t0 - 1 <= msg["due"] <= time.time() + 1              # due = now
        assert not (qdir / "que" / short_id(m) / "pid").exists()
        assert not (qdir / "que" / short_id(m) / "proc.json").exists()
        ev = msg_events(root, "q", m)[-1]
        assert (ev["from"], ev["to"], ev["status"], ev["count"], ev["pid"]) == (
            "run", "que", SHUTDOWN, count, pids[m])
        assert ev["exit_code"] == -signal.SIGTERM
    done = on_disk(root, "q", b)
    assert (done["state"], done["status"]) == ("done", "done - early")
    assert msg_events(root, "q", b)[-1]["to"] == "done"
    assert on_disk(root, "q", later)["state"] == "que"


def test_s2_5_kill_grace_then_sigkill(root: Path, tmp_path: Path, launch: Launch,
                                      driver: Path) -> None:
    make_queue(root, "q", driver, kill_grace=1)
    q = launch("q")
    noted = tmp_path / "noted"
    full = create_msg(q, param1=ops(["note", "SIGTERM", str(noted)], ["w", "run stubborn\n"],
                                    ["wait", str(tmp_path / "never")]))
    wait_for(lambda: q.message(full)["status"] == "run - stubborn", 5)
    pid = job_pid(root, "q", full)
    t0 = time.monotonic()
    stop_signal(q)
    assert wait_file(noted) == "SIGTERM\n"          # asked first ...
    assert q.popen.wait(10) == 0
    assert time.monotonic() - t0 >= 0.9              # ... killed after kill_grace
    assert process_gone(pid)
    msg = on_disk(root, "q", full)
    assert (msg["state"], msg["status"]) == ("que", f"que - {SHUTDOWN}")
    ev = msg_events(root, "q", full)[-1]
    assert (ev["to"], ev["exit_code"]) == ("que", -signal.SIGKILL)


def test_s2_5_second_sigterm_escalates_and_requests_are_served_meanwhile(
        root: Path, tmp_path: Path, launch: Launch, driver: Path) -> None:
    make_queue(root, "q", driver, kill_grace=30)
    q = launch("q")
    noted = tmp_path / "noted"
    full = create_msg(q, param1=ops(["note", "SIGTERM", str(noted)], ["w", "run stubborn\n"],
                                    ["wait", str(tmp_path / "never")]))
    wait_for(lambda: q.message(full)["status"] == "run - stubborn", 5)
    stop_signal(q)
    wait_file(noted)
    # still stopping: requests are answered, new messages are stored but not started
    assert q.call("ping") == ["pong"]
    new = create_msg(q, param1=ops(["w", "done ok\n"]))
    assert q.state(new) == "que"
    assert q.state(full) == "run"
    t0 = time.monotonic()
    stop_signal(q, signal.SIGINT)                   # the second signal skips the grace
    assert q.popen.wait(10) == 0
    assert time.monotonic() - t0 < 5
    assert on_disk(root, "q", full)["status"] == f"que - {SHUTDOWN}"
    assert on_disk(root, "q", new)["state"] == "que"


def test_s2_5_shutdown_command_stops_gracefully(root: Path, tmp_path: Path, launch: Launch,
                                                driver: Path) -> None:
    make_queue(root, "q", driver)
    q = launch("q")
    full = create_msg(q, param1=ops(["wait", str(tmp_path / "never")]))
    assert q.call("shutdown") == ["ok"]
    assert q.popen.wait(10) == 0
    assert on_disk(root, "q", full)["status"] == f"que - {SHUTDOWN}"


def test_s2_1_manager_death_means_a_graceful_stop(root: Path, tmp_path: Path,
                                                  driver: Path) -> None:
    make_queue(root, "q", driver, kill_grace=5)
    q = LifelineQueueProc(root, "q")
    try:
        full = create_msg(q, param1=ops(["w", "run working\n"],
                                        ["wait", str(tmp_path / "never")]))
        wait_for(lambda: q.message(full)["status"] == "run - working", 5)
        q.close_lifeline()                        # EOF on the lifeline: the manager is gone
        assert q.popen.wait(10) == 0
    finally:
        q.stop()
    assert on_disk(root, "q", full)["status"] == f"que - {SHUTDOWN}"
    assert not (root / "queue" / "q" / "queue.pid").exists()


# ================================================================ S2.7 recovery

def test_s2_7_a_survivor_without_proc_json_is_found_and_stopped(
        root: Path, tmp_path: Path, launch: Launch, driver: Path) -> None:
    """A queue process killed between a job's spawn and its pid/proc.json writes: recovery
    finds the job by its session and RQ_MSG_DIR and stops it before the message goes back to
    que (else it would run twice)."""
    make_queue(root, "q", driver, kill_grace=1)
    q = launch("q")
    noted, release = tmp_path / "noted", tmp_path / "release"
    full = create_msg(q, param1=ops(["note", "SIGTERM", str(noted)], ["w", "run working\n"],
                                    ["wait", str(release)]))
    wait_for(lambda: q.message(full)["status"] == "run - working", 5)
    old_pid = job_pid(root, "q", full)
    q.kill()
    run_dir = root / "queue" / "q" / "run" / short_id(full)
    for name in ("pid", "proc.json"):  # the state of a kill right after the spawn
        (run_dir / name).unlink()
    assert not process_gone(old_pid)
    (root / "config" / "q.pause").touch()
    q2 = launch("q")
    assert noted.read_text() == "SIGTERM\n"
    assert process_gone(old_pid)
    assert q2.message(full)["state"] == "que"


def test_s2_7_restart_kills_the_survivor_and_runs_the_message_again(
        root: Path, tmp_path: Path, launch: Launch, driver: Path) -> None:
    make_queue(root, "q", driver, kill_grace=1)
    q = launch("q")
    noted, release = tmp_path / "noted", tmp_path / "release"
    full = create_msg(q, count=2, param1=ops(
        ["note", "SIGTERM", str(noted)], ["w", "run working\n"], ["wait", str(release)],
        ["w", "done second run\n"]))
    wait_for(lambda: q.message(full)["status"] == "run - working", 5)
    old_pid = job_pid(root, "q", full)
    q.kill()                                   # crash: the job survives in its own session
    assert not process_gone(old_pid)
    run_dir = root / "queue" / "q" / "run" / short_id(full)
    assert (run_dir / "proc.json").exists()
    (root / "config" / "q.pause").touch()      # keep the recovered message in que to look

    q2 = launch("q")                           # answers ping only after recovery (S2.2)
    assert noted.read_text() == "SIGTERM\n"    # SIGTERM first, SIGKILL after kill_grace
    assert process_gone(old_pid)
    msg = q2.message(full)
    assert msg["state"] == "que"
    assert msg["status"] == f"que - {RESTARTED}"
    assert msg["count"] == 2
    que_dir = root / "queue" / "q" / "que" / short_id(full)
    assert not (que_dir / "pid").exists() and not (que_dir / "proc.json").exists()
    ev = msg_events(root, "q", full)[-1]
    assert (ev["from"], ev["to"], ev["status"], ev["count"]) == ("run", "que", RESTARTED, 2)
    assert ev["pid"] == old_pid                       # S13.3: pid of a transition out of run
    assert isinstance(ev["duration"], (int, float)) and ev["duration"] >= 0

    (root / "config" / "q.pause").unlink()
    assert q2.call("ping") == ["pong"]
    q2.wait_state(full, "run", timeout=5)
    release.touch()
    q2.wait_state(full, "done")
    msg = q2.message(full)
    assert msg["status"] == "done - second run"
    pids = start_header_pids(root, msg)
    assert len(pids) == 2 and pids[0] == old_pid and pids[1] != old_pid


def write_msg_dir(root: Path, state: str, msg_id: str, fields: dict[str, Any] | None,
                  raw: str | None = None) -> Path:
    path = root / "queue" / "q" / state / msg_id
    path.mkdir(parents=True)
    (path / "msg").write_text(raw if raw is not None else json.dumps(
        {"msg_id": msg_id, "dest": "q", **(fields or {})}))
    return path


def test_s2_7_recovery_rules_on_a_prepared_directory(root: Path, tmp_path: Path,
                                                     launch: Launch, driver: Path) -> None:
    make_queue(root, "q", driver, kill_grace=1)
    done = ops(["w", "done recovered\n"])
    ids = {k: f"20200101.0000.00.00{i}.{i + 1}" for i, k in enumerate(
        ("prep", "nodue", "broken", "mismatch", "dead"))}
    write_msg_dir(root, "prep", ids["prep"], {"due": 1, "count": 0})
    write_msg_dir(root, "que", ids["nodue"], {"count": 1, "max_count": 15, "param1": done})
    broken = write_msg_dir(root, "que", ids["broken"], None, raw="{not json")

    # a live process whose start time does not match the one recorded: never signalled
    victim = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                              stdin=subprocess.PIPE, start_new_session=True)
    try:
        start = psutil.Process(victim.pid).create_time()
        mismatch = write_msg_dir(root, "run", ids["mismatch"],
                                 {"due": 5, "count": 4, "param1": done})
        (mismatch / "pid").write_text(f"{victim.pid}\n")
        (mismatch / "proc.json").write_text(json.dumps(
            {"pid": victim.pid, "pgid": victim.pid, "start_time": start - 1000, "started": 1}))
        dead = write_msg_dir(root, "run", ids["dead"], {"due": 6, "count": 0, "param1": done})
        (dead / "proc.json").write_text(json.dumps(
            {"pid": 999999999, "pgid": 999999999, "start_time": 1.0, "started": 1}))
        (dead / "pid").write_text("999999999\n")
        (root / "config" / "q.pause").touch()

        t0 = int(time.time())
        q = launch("q")
        t1 = time.time()
        assert victim.poll() is None                       # not signalled
        assert q.state(ids["prep"]) == "prep"              # prep stays prep
        nodue = json.loads((root / "queue/q/que" / ids["nodue"] / "msg").read_text())
        assert isinstance(nodue["due"], (int, float)) and t0 <= nodue["due"] <= t1
        assert (broken / "msg").read_text() == "{not json"  # skipped, left on disk
        assert f"que/{ids['broken']}" in (root / "log" / "queuemgr.log").read_text()
        for key in ("mismatch", "dead"):
            msg = q.message(ids[key])
            assert (msg["state"], msg["status"]) == ("que", f"que - {RESTARTED}")
            qd = root / "queue" / "q" / "que" / ids[key]
            assert not (qd / "pid").exists() and not (qd / "proc.json").exists()
        assert q.message(ids["mismatch"])["count"] == 4
        assert q.counts() == {"prep": 1, "que": 3, "run": 0, "done": 0, "relayed": 0, "err": 0}

        (root / "config" / "q.pause").unlink()
        assert q.call("ping") == ["pong"]
        for key in ("nodue", "mismatch", "dead"):
            q.wait_state(ids[key], "done")
            assert q.message(ids[key])["status"] == "done - recovered"
        assert broken.is_dir()
        assert victim.poll() is None
    finally:
        victim.kill()
        victim.communicate()


# ================================================================ the queue lock

def test_a_second_queue_process_for_the_same_queue_refuses_to_start(
        root: Path, launch: Launch, driver: Path) -> None:
    make_queue(root, "q", driver)
    q = launch("q")
    pid_file = root / "queue" / "q" / "queue.pid"
    before = pid_file.read_text()
    second = subprocess.run(
        [sys.executable, "-m", "rq.queue", "--root", str(root), "--name", "q"],
        cwd=str(root), env=dict(os.environ, PYTHONPATH=str(REPO)), capture_output=True,
        text=True, timeout=30)
    assert second.returncode != 0
    assert "already running" in second.stderr
    assert "Traceback" not in second.stderr
    assert pid_file.read_text() == before == f"{q.popen.pid}\n"
    assert q.call("ping") == ["pong"]
    full = create_msg(q, param1=ops(["w", "done still serving\n"]))
    q.wait_state(full, "done")


def test_one_job_at_a_time_the_loop_serves_the_socket_else_an_io_thread_does(
        root: Path, launch: Launch, driver: Path) -> None:
    """Issue 15: a queue that runs one job at a time serves its socket from its own loop (no
    I/O thread: the two handed the GIL to each other at every system call); with more
    workers an I/O thread serves it, its creates overlapping the loop's waits.  Either way
    creates are answered and run, other requests too, and a bad frame is refused."""
    for name, workers in (("one", 1), ("three", 3)):
        make_queue(root, name, driver, num_workers=workers)
    qs = {name: launch(name) for name in ("one", "three")}  # each pinged alike when ready
    one, three = settled_threads(*(q.popen.pid for q in qs.values()))
    assert three == one + 1  # the same loop and kept socket workers, and an I/O thread
    for name, q in qs.items():
        fulls = [create_msg(q, param1=ops(["w", f"done {i}\n"])) for i in range(6)]
        assert q.call("ping") == ["pong"]
        assert decode_reply_frame(raw_exchange(str(root / "queue" / name / "queue.sock"),
                                               b"rq1 0000000x ")) == ["fail", "bad request"]
        for i, full in enumerate(fulls):
            q.wait_state(full, "done")
            assert q.message(full)["status"] == f"done - {i}"


# ================================================================ S13 events

def test_s13_events_of_a_job(root: Path, launch: Launch, driver: Path) -> None:
    make_queue(root, "q", driver)
    q = launch("q")
    ok = create_msg(q, param1=ops(["w", "done fine\n"]))
    killed = create_msg(q, count=1, param1=ops(["w", "run about to die\n"], ["kill", "SIGKILL"]))
    q.wait_state(ok, "done")
    q.wait_state(killed, "err")
    fields = {"ts", "host", "queue", "msg_id", "from", "to", "status", "count", "pid",
              "exit_code", "duration"}
    ev = msg_events(root, "q", ok, "done")
    assert all(set(e) == fields for e in ev)
    assert [(e["from"], e["to"]) for e in ev] == [
        (None, "prep"), ("prep", "que"), ("que", "run"), ("run", "done")]
    assert all((e["host"], e["queue"], e["msg_id"]) == ("127.0.0.1", "q", short_id(ok))
               for e in ev)
    assert ev[0]["pid"] is None and ev[0]["duration"] is None
    pid = start_header_pids(root, q.message(ok))[0]
    assert ev[2]["pid"] == ev[3]["pid"] == pid
    assert (ev[3]["status"], ev[3]["exit_code"], ev[3]["count"]) == ("fine", 0, 0)
    assert isinstance(ev[3]["duration"], (int, float)) and 0 <= ev[3]["duration"] < 10
    assert ev[0]["ts"] <= ev[1]["ts"] <= ev[2]["ts"] <= ev[3]["ts"]

    last = msg_events(root, "q", killed, "err")[-1]
    assert (last["from"], last["exit_code"], last["count"]) == ("run", -9, 1)
    assert last["status"].startswith("PROCESS EXITED IMPROPERLY - MOVING TO ERR")

    assert q.call("delete_message", {"msg_id": killed}) == ["ok", "msg deleted"]
    gone = msg_events(root, "q", killed, "deleted")[-1]
    assert (gone["from"], gone["to"]) == ("err", "deleted")


def test_s2_5_stop_kills_what_remains_of_a_job_group_after_the_grace(
        root: Path, tmp_path: Path, launch: Launch, driver: Path) -> None:
    """The leader dies of the stop's SIGTERM but a member ignoring it remains: step 4
    SIGKILLs the remaining job process groups, so no part of the job outlives the stop
    (S24.4: a queue stop never leaves a second copy of a job running)."""
    make_queue(root, "q", driver, kill_grace=1)
    q = launch("q")
    pidfile, never = tmp_path / "child.pid", tmp_path / "never"
    full = create_msg(q, param1=ops(["child", str(pidfile), str(never), {"ignore_term": True}],
                                    ["w", "run working\n"], ["wait", str(never)]))
    child = int(wait_file(pidfile))
    stop_signal(q)
    assert q.popen.wait(10) == 0
    assert on_disk(root, "q", full)["status"] == f"que - {SHUTDOWN}"
    wait_for(lambda: process_gone(child), 3, what="the job's remaining member to be killed")


def test_a_name_too_long_for_the_roots_socket_path_is_a_fatal_start(root: Path) -> None:
    """Issue 13, D7: run by hand (or by an older manager), the queue process says why it
    cannot bind queue/NAME/queue.sock and exits 2 (FATAL, S2.3) instead of crashing with
    `AF_UNIX path too long` into a restart loop."""
    room = 107 - (len(os.fsencode(str(root / "queue" / "x" / "queue.sock"))) - 1)
    name = "q" * (room + 1)
    make_queue(root, name, "/bin/true")
    res = subprocess.run([sys.executable, "-m", "rq.queue", "--root", str(root), "--name", name],
                         cwd=str(root), env=dict(os.environ, PYTHONPATH=str(REPO)),
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2, res
    assert "ERROR cannot start: queue name too long for this RQ root: its socket " in res.stderr
    assert "rq.queue: queue name too long for this RQ root" in res.stderr
    assert "Traceback" not in res.stderr


# ================================================================ S2.6 an idle queue sleeps


def main_thread_runs(pid: int) -> int:
    """How many times the kernel has run the process's main thread (schedstat's third field)."""
    with open(f"/proc/{pid}/task/{pid}/schedstat") as fh:
        return int(fh.read().split()[2])


def test_s2_6_an_idle_queue_sleeps_and_any_request_ends_the_sleep(root: Path, tmp_path: Path,
                                                                  launch: Launch) -> None:
    """Issue 17: a queue with nothing queued, running or leased skips the 5 s pass (a thousand
    idle queues spent most of their CPU on it); a create wakes it, so a queued message on a
    paused queue still starts within a second or two of `rm NAME.pause` (S5.1), not after
    the idle sleep."""
    script = tmp_path / "ok.sh"
    script.write_text("#!/bin/sh\necho 'done ok' >&3\n")
    script.chmod(0o755)
    make_queue(root, "q", script)
    q = launch("q")
    pid = q.popen.pid
    settled: list[int] = []

    def asleep() -> bool:  # the passes after start-up and the ping are over
        settled.append(main_thread_runs(pid))
        return len(settled) > 1 and settled[-1] == settled[-2]
    wait_for(asleep, 10, interval=0.3, what="the queue's loop to go to sleep")
    before, t0 = main_thread_runs(pid), time.monotonic()
    wait_for(lambda: time.monotonic() - t0 > 6.5, 10, interval=0.5,
             what="a window longer than the 5 s pass")
    assert main_thread_runs(pid) == before  # no pass in 6.5 s: the idle sleep

    # Only the disk is watched from here: any other request would wake the loop itself.
    store = Store(str(root), "q")
    (root / "config" / "q.pause").touch()
    msg_id = short_id(create_msg(q))
    assert (store.locate(msg_id) or ("",))[0] == "que"
    (root / "config" / "q.pause").unlink()
    t1 = time.monotonic()
    wait_for(lambda: (store.locate(msg_id) or ("",))[0] == "done", 10,
             what="the message to run once the pause is lifted")
    assert time.monotonic() - t1 < 4  # noticed by the 1 s re-check of due work, not at 60 s
