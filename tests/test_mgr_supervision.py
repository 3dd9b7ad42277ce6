"""rq-mgr supervision (SPEC S2.1-S2.5, S3.5, S3.7, S7.2).

The state machine is tested with plain numbers for `now`; everything else
runs the real manager as a process with stand-in queue processes
(tests/test_mgr_support.py) and a fast restart policy.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess

import pytest
from rqtest import wait_for, write_root
from test_mgr_support import (
    MAIN_CONFIG,
    FakeManager,
    events,
    make_queue,
    pid_alive,
    raw_request,
    trace,
    write_queue_config,
)

from rq import protocol
from rq.config import load_queue_config
from rq.mgr.children import Child, Policy, State, TransitionError

# ---------------------------------------------------------------- the state machine (S2.3)


@pytest.mark.parametrize("n, delay", [(1, 1), (2, 2), (3, 4), (4, 8), (5, 16), (6, 30),
                                      (7, 30), (9, 30)])
def test_backoff_delay_doubles_up_to_30s(n: int, delay: float) -> None:
    assert Policy().delay(n) == delay


class FakePopen:
    pid = 4242


class FakeDaemon:
    pid = 4242
    popen = FakePopen()
    lifeline_w = -1
    ready_r = -1


def started(child: Child, now: float) -> None:
    child.spawned(FakeDaemon(), now)  # type: ignore[arg-type]


def test_ten_quick_failures_end_in_fatal(caplog: pytest.LogCaptureFixture) -> None:
    policy, child, now = Policy(), Child("queue", "q1", ["x"]), 0.0
    delays = []
    for _ in range(9):
        started(child, now)
        child.exited(3, now + 0.5, policy)
        assert child.state is State.BACKOFF
        assert child.error == "exit status 3"
        delays.append(child.due - (now + 0.5))
        now = child.due
    assert delays == [1, 2, 4, 8, 16, 30, 30, 30, 30]
    started(child, now)
    with caplog.at_level(logging.INFO):
        child.exited(-9, now + 0.5, policy)
    assert child.state is State.FATAL
    assert child.error == "killed by SIGKILL"
    assert "q1 entered FATAL after 10 failed starts" in caplog.text
    assert child.restarts == 9


def test_sixty_seconds_of_running_resets_the_count() -> None:
    policy, child = Policy(), Child("queue", "q1", ["x"])
    for i in range(5):
        started(child, i * 100.0)
        child.exited(1, i * 100.0 + 1, policy)
    assert child.failures == 5
    started(child, 1000.0)
    child.ready_line("ready", 1000.1)
    child.exited(1, 1060.5, policy)  # ran 60 s: n reset to 0, then this failure
    assert child.failures == 1 and child.state is State.BACKOFF
    assert child.due == 1060.5 + 1


def test_short_running_does_not_reset() -> None:
    policy, child = Policy(), Child("queue", "q1", ["x"])
    started(child, 0.0)
    child.exited(1, 1.0, policy)
    started(child, 2.0)
    child.ready_line("ready", 2.1)
    child.exited(1, 61.0, policy)  # 58.9 s of running is not enough
    assert child.failures == 2


def test_ready_pipe_lines() -> None:
    child = Child("queue", "q1", ["x"])
    started(child, 0.0)
    assert child.feed_ready(b"rea") == []
    assert child.feed_ready(b"dy\n") == ["ready"]
    child.ready_line("ready", 0.1)
    assert child.state is State.RUNNING and child.error is None
    other = Child("queue", "q2", ["x"])
    started(other, 0.0)
    other.ready_line("fatal json config is missing script field", 0.1)
    assert other.state is State.FATAL
    assert other.error == "json config is missing script field"
    other.exited(2, 0.2, Policy())  # the exit that follows keeps it FATAL, no restart
    assert other.state is State.FATAL and other.failures == 0


def test_illegal_transition_is_refused() -> None:
    child = Child("queue", "q1", ["x"])
    with pytest.raises(TransitionError):
        child.transition(State.RUNNING, 0.0)


def test_describe_is_the_status_child_shape() -> None:
    child = Child("queue", "q1", ["x"])
    started(child, 0.0)
    assert set(child.describe()) == {"state", "pid", "restarts", "since", "error"}
    assert child.describe()["state"] == "STARTING"
    assert child.describe()["pid"] == 4242


# ---------------------------------------------------------------- real processes


@pytest.fixture
def root(tmp_path: os.PathLike[str]) -> str:
    return write_root(str(tmp_path), MAIN_CONFIG, "queue")


@pytest.fixture
def manager_for(root: str):  # type: ignore[no-untyped-def]
    started_managers: list[FakeManager] = []

    def start(policy: dict | None = None) -> FakeManager:
        mgr = FakeManager(root, policy)
        started_managers.append(mgr)
        return mgr

    yield start
    for mgr in started_managers:
        mgr.kill()


def test_start_runs_one_process_per_valid_queue(root: str, manager_for) -> None:
    make_queue(root, "alpha")
    make_queue(root, "beta")
    os.makedirs(os.path.join(root, "queue", "noconfig", "que"))
    make_queue(root, "gone.deleted.12")                     # trash: invalid name (S3.7)
    make_queue(root, "badconf")
    write_queue_config(root, "badconf", {"name": "badconf"})  # no script (S3.4)
    mgr = manager_for()
    for name in ("alpha", "beta"):
        child = mgr.wait_state(name, "RUNNING")
        assert pid_alive(child["pid"]) and child["restarts"] == 0 and child["error"] is None
    bad = mgr.wait_state("badconf", "FATAL")
    assert bad["error"] == "json config is missing script field" and bad["pid"] is None
    assert events(root, "badconf", "start") == []            # never spawned
    assert mgr.call("queues") == ["alpha", "badconf", "beta"]
    status = mgr.status()
    assert set(status) == {"queues", "web", "scandir", "timers"}
    assert isinstance(status["queues"]["alpha"]["since"], (int, float))


def test_children_get_root_cwd_and_environment(tmp_path) -> None:
    tmpdir = tmp_path / "tmpdir"
    tmpdir.mkdir()
    root = write_root(str(tmp_path / "root"), {"env": "staging", "host": "h", "port": "3334",
                                              "addr": "0.0.0.0", "tmpdir": str(tmpdir)},
                      "queue")
    make_queue(root, "alpha")
    mgr = FakeManager(root)
    try:
        mgr.wait_state("alpha", "RUNNING")
        with open(os.path.join(root, "queue", "alpha", "env.json")) as f:
            seen = json.load(f)
        assert seen["cwd"] == root
        assert seen["env"]["RQ_ENV"] == "staging"
        assert seen["env"]["RQ_ROOT"] == root
        assert seen["env"]["TMPDIR"] == str(tmpdir)
        assert mgr.call("environment") == ["staging"]
    finally:
        mgr.kill()


def test_crashing_queue_backs_off_then_goes_fatal(root: str, manager_for) -> None:
    make_queue(root, "crashy", test_behaviour="crash")
    make_queue(root, "fine")
    mgr = manager_for()
    child = mgr.wait_state("crashy", "FATAL", timeout=30)
    assert child["error"] == "exit status 3"
    assert child["restarts"] == 9
    assert len(events(root, "crashy", "start")) == 10
    assert "crashy entered FATAL after 10 failed starts" in mgr.log_text()
    assert mgr.queue("fine")["state"] == "RUNNING"       # others are not held up
    assert mgr.call("ping") == ["pong"]


def test_fatal_line_on_ready_pipe_is_fatal_at_once(root: str, manager_for) -> None:
    make_queue(root, "nope", test_behaviour="fatal")
    mgr = manager_for()
    child = mgr.wait_state("nope", "FATAL")
    assert child["error"] == "test says no"
    wait_for(lambda: mgr.queue("nope")["pid"] is None, what="fatal child reaped")
    assert len(events(root, "nope", "start")) == 1


def test_restart_queue_clears_fatal(root: str, manager_for) -> None:
    make_queue(root, "nope", test_behaviour="fatal")
    mgr = manager_for()
    mgr.wait_state("nope", "FATAL")
    make_queue(root, "nope")  # fixed
    assert mgr.call("restart_queue", "nope", raw=True) == ["ok", "nope"]
    child = mgr.wait_state("nope", "RUNNING")
    assert child["error"] is None


def test_restart_never_overlaps(root: str, manager_for) -> None:
    make_queue(root, "slow", test_stop_delay=0.3)
    mgr = manager_for()
    old = mgr.wait_state("slow", "RUNNING")["pid"]
    assert mgr.call("restart_queue", "slow", raw=True) == ["ok", "slow"]
    new = wait_for(lambda: (c := mgr.queue("slow"))["state"] == "RUNNING" and c["pid"] != old
                   and c["pid"], what="new process")
    seq = [(ev, int(pid)) for ev, pid in trace(root, "slow")]
    assert seq.index(("exit", old)) < seq.index(("start", new))
    assert mgr.queue("slow")["restarts"] == 1


def test_restart_unknown_or_invalid_queue(root: str, manager_for) -> None:
    mgr = manager_for()
    assert mgr.call("restart_queue", "nosuch", raw=True) == ["fail", "invalid queue name"]
    assert mgr.call("restart_queue", "bad/name", raw=True) == ["fail", "invalid queue name"]
    assert mgr.call("restart_queue") == ["fail", "invalid queue name"]
    assert mgr.call("ping") == ["pong"]


def test_reload(root: str, manager_for) -> None:
    make_queue(root, "keep")
    make_queue(root, "drop")
    make_queue(root, "broken", test_behaviour="fatal")
    mgr = manager_for()
    keep = mgr.wait_state("keep", "RUNNING")["pid"]
    drop = mgr.wait_state("drop", "RUNNING")["pid"]
    mgr.wait_state("broken", "FATAL")
    os.unlink(os.path.join(root, "queue", "drop", "config.json"))
    make_queue(root, "broken")
    make_queue(root, "fresh")
    with open(os.path.join(root, "config", "config.json"), "w") as f:
        json.dump({"env": "changed", "host": "h", "port": 1, "addr": "x"}, f)
    assert mgr.call("reload") == ["ok"]
    wait_for(lambda: events(root, "keep", "hup") == [keep], what="SIGHUP to keep")
    wait_for(lambda: "drop" not in mgr.call("queues"), what="drop forgotten")
    assert events(root, "drop", "exit") == [drop]
    mgr.wait_state("broken", "RUNNING")
    mgr.wait_state("fresh", "RUNNING")
    assert mgr.queue("keep")["pid"] == keep                # not restarted
    assert mgr.call("environment") == ["mgrtest"]          # main config not re-read
    os.kill(mgr.popen.pid, signal.SIGHUP)                  # SIGHUP = the same reload
    wait_for(lambda: len(events(root, "keep", "hup")) == 2, what="second SIGHUP")


def test_reload_with_no_queue_left_keeps_running(root: str, manager_for) -> None:
    make_queue(root, "only")
    mgr = manager_for()
    mgr.wait_state("only", "RUNNING")
    os.rename(os.path.join(root, "queue", "only"), os.path.join(root, "elsewhere"))
    assert mgr.call("reload") == ["ok"]
    wait_for(lambda: mgr.call("queues") == [], what="queue forgotten")
    assert mgr.call("ping") == ["pong"] and mgr.popen.poll() is None


def test_delete_queue_moves_it_to_trash(root: str, manager_for) -> None:
    qdir = make_queue(root, "doomed")
    open(os.path.join(root, "config", "doomed.pause"), "w").close()
    inode = os.stat(qdir).st_ino
    mgr = manager_for()
    pid = mgr.wait_state("doomed", "RUNNING")["pid"]
    assert mgr.call("delete_queue", "doomed", raw=True) == ["ok", "started deleting queue"]
    trash = os.path.join(root, "queue", f"doomed.deleted.{inode}")
    wait_for(lambda: os.path.isdir(trash) and not os.path.exists(qdir), what="trash")
    assert events(root, f"doomed.deleted.{inode}", "exit") == [pid]  # stopped first
    assert "doomed" not in mgr.call("queues")
    assert os.path.exists(os.path.join(root, "config", "doomed.pause"))  # flags stay
    assert mgr.call("delete_queue", "doomed", raw=True) == ["fail", "no such queue"]
    assert mgr.call("delete_queue", "a b", raw=True) == ["fail", "no such queue"]
    assert mgr.call("reload") == ["ok"]
    assert mgr.call("queues") == []                        # trash is never loaded


def test_delete_fatal_queue(root: str, manager_for) -> None:
    qdir = make_queue(root, "nope", test_behaviour="fatal")
    mgr = manager_for()
    mgr.wait_state("nope", "FATAL")
    wait_for(lambda: mgr.queue("nope")["pid"] is None, what="reaped")
    assert mgr.call("delete_queue", "nope", raw=True) == ["ok", "started deleting queue"]
    wait_for(lambda: not os.path.exists(qdir), what="trash")
    assert mgr.call("queues") == []


def test_create_queue(root: str, manager_for) -> None:
    mgr = manager_for()
    opts = {"name": "made", "script": "/bin/true", "num_workers": "3", "kill_grace": "5",
            "coalesce_params": ["2", 1, "2"]}
    assert mgr.call("create_queue", opts) == ["success", "queue created - awesome"]
    qdir = os.path.join(root, "queue", "made")
    for state in ("prep", "que", "run", "done", "relayed", "err"):
        assert os.path.isdir(os.path.join(qdir, state))
    with open(os.path.join(qdir, "config.json")) as f:
        written = json.load(f)
    assert written == load_queue_config(root, "made")[0].normalised()
    assert written["num_workers"] == 3 and written["coalesce_params"] == [1, 2]
    mgr.wait_state("made", "RUNNING")
    assert mgr.call("create_queue", opts) == ["fail", "already created"]
    assert [n for n in os.listdir(os.path.join(root, "queue")) if n.startswith(".")] == []


@pytest.mark.parametrize("opts, reply", [
    ({"name": "a b", "script": "x"}, ["fail", "queue name has invalid characters"]),
    ({"name": "x.y", "script": "x"}, ["fail", "queue name has invalid characters"]),
    ({"name": "ok"}, ["fail", "json config is missing script field"]),
    ({"script": "x"}, ["fail", "json config is missing name field"]),
    ({"name": "ok", "script": "x", "num_workers": "0"},
     ["fail", "json config has invalid num_workers field (out of range 1..128)"]),
    (["not", "an", "object"], ["fail", "json config is missing name field"]),
])
def test_create_queue_refusals(root: str, manager_for, opts, reply) -> None:
    mgr = manager_for()
    assert mgr.call("create_queue", opts) == reply
    assert os.listdir(os.path.join(root, "queue")) == []


def longest_name(root: str) -> int:
    """The longest queue name whose socket ROOT/queue/NAME/queue.sock fits in sun_path (107)."""
    return 107 - (len(os.fsencode(os.path.join(root, "queue", "x", "queue.sock"))) - 1)


def test_create_queue_refuses_a_name_too_long_for_the_root(root: str, manager_for) -> None:
    """Issue 13, D7: a valid name (S3.1: up to 128 bytes) whose socket path cannot fit in
    sun_path is refused with the reason; it used to be created, then crash-loop to FATAL."""
    n = longest_name(root)
    assert 1 <= n < 128
    mgr = manager_for()
    too_long = "q" * (n + 1)
    reply = mgr.call("create_queue", {"name": too_long, "script": "/bin/true"})
    path = os.path.join(root, "queue", too_long, "queue.sock")
    assert reply == ["fail", f"queue name too long for this RQ root: its socket {path} would "
                             f"be {len(path)} bytes, a Unix socket path "
                             "holds at most 107"]
    assert os.listdir(os.path.join(root, "queue")) == []
    fits = "q" * n
    assert mgr.call("create_queue", {"name": fits, "script": "/bin/true"}) == [
        "success", "queue created - awesome"]
    mgr.wait_state(fits, "RUNNING")


def test_existing_queue_with_a_name_too_long_for_the_root_is_fatal_at_once(
        root: str, manager_for) -> None:
    """Issue 13, D7: the manager says which queue cannot start and why (status error text and
    the log), once, instead of spawning it ten times into FATAL."""
    name = "q" * (longest_name(root) + 1)
    make_queue(root, name)
    make_queue(root, "fine")
    mgr = manager_for()
    child = mgr.wait_state(name, "FATAL")
    assert child["error"].startswith("queue name too long for this RQ root: its socket ")
    assert child["restarts"] == 0 and child["pid"] is None
    assert not os.path.exists(os.path.join(root, "queue", name, "trace"))  # never spawned
    assert f"queue {name} cannot start: queue name too long" in mgr.log_text()
    mgr.wait_state("fine", "RUNNING")


def test_create_queue_bad_json(root: str, manager_for) -> None:
    mgr = manager_for()
    assert mgr.call("create_queue", "{not json", raw=True) == ["fail", "bad request"]
    assert mgr.call("create_queue") == ["fail", "bad request"]
    assert mgr.call("ping") == ["pong"]


@pytest.mark.parametrize("cmd", ["create_queue", "reserve", "report", "renew", "subscribe"])
def test_json_bomb_is_a_bad_request_without_a_traceback(root: str, manager_for, cmd) -> None:
    """Issue 13, D9: JSON nested 100,000 deep is a bad request (S7.1), not an internal error
    with a traceback in the log."""
    mgr = manager_for()
    assert mgr.call(cmd, "[" * 100_000, raw=True) == ["fail", "bad request"]
    assert mgr.call(cmd, '{"name":' * 100_000, raw=True) == ["fail", "bad request"]
    assert mgr.call("ping") == ["pong"]
    assert "Traceback" not in mgr.log_text() + mgr.stderr()


def test_create_queue_link(root: str, manager_for, tmp_path) -> None:
    confdir = tmp_path / "confs"
    confdir.mkdir()
    (confdir / "linked.json").write_text(json.dumps({"name": "linked", "script": "/bin/true"}))
    os.symlink(confdir / "linked.json", confdir / "alias.json")
    make_queue(root, "running")
    (confdir / "running.json").write_text(json.dumps({"name": "running", "script": "x"}))
    mgr = manager_for()
    mgr.wait_state("running", "RUNNING")
    assert mgr.call("create_queue_link", str(confdir / "alias.json"), raw=True) == \
        ["success", "queue created - awesome"]
    link = os.path.join(root, "queue", "linked", "config.json")
    assert os.readlink(link) == str(confdir / "linked.json")  # the real path
    mgr.wait_state("linked", "RUNNING")
    assert mgr.call("create_queue_link", str(confdir / "linked.json"), raw=True) == \
        ["fail", "queue is already running"]
    assert mgr.call("create_queue_link", str(confdir / "running.json"), raw=True) == \
        ["fail", "queue is already running"]
    os.makedirs(os.path.join(root, "queue", "idle"))  # a directory, but no queue process
    (confdir / "idle.json").write_text(json.dumps({"name": "idle", "script": "x"}))
    assert mgr.call("create_queue_link", str(confdir / "idle.json"), raw=True) == \
        ["fail", "already created"]
    missing = mgr.call("create_queue_link", "confs/none.json", raw=True)
    assert missing == ["fail", ("could not read queue config [ confs/none.json ]: "
                                "No such file or directory")]
    (confdir / "bad.json").write_text(json.dumps({"name": "bad"}))
    rel = os.path.relpath(confdir / "bad.json", root)
    assert mgr.call("create_queue_link", rel, raw=True) == \
        ["fail", "json config is missing script field"]


@pytest.mark.parametrize("cmd, flag, exists", [
    ("down_queue", "down", True), ("up_queue", "down", False),
    ("pause_queue", "pause", True), ("resume_queue", "pause", False),
])
def test_flag_commands(root: str, manager_for, cmd, flag, exists) -> None:
    make_queue(root, "flagged")
    path = os.path.join(root, "config", f"flagged.{flag}")
    if not exists:
        open(path, "w").close()
    mgr = manager_for()
    assert mgr.call(cmd, "flagged", raw=True) == ["ok", "flagged"]
    assert os.path.exists(path) is exists
    assert mgr.call(cmd, "flagged", raw=True) == ["ok", "flagged"]  # idempotent
    assert mgr.call(cmd, "nosuch", raw=True) == ["fail", "invalid queue name"]
    assert mgr.call(cmd, "in/valid", raw=True) == ["fail", "invalid queue name"]
    assert mgr.call(cmd) == ["fail", "invalid queue name"]


def test_up_and_down_flags_are_independent(root: str, manager_for) -> None:
    make_queue(root, "q")
    mgr = manager_for()
    mgr.call("pause_queue", "q", raw=True)
    mgr.call("down_queue", "q", raw=True)
    mgr.call("up_queue", "q", raw=True)
    assert os.path.exists(os.path.join(root, "config", "q.pause"))   # up keeps the pause
    mgr.call("down_queue", "q", raw=True)
    mgr.call("resume_queue", "q", raw=True)
    assert os.path.exists(os.path.join(root, "config", "q.down"))    # resume keeps the down


@pytest.mark.parametrize("cmd, verb", [("up_queue", "up"), ("down_queue", "down")])
def test_flag_that_cannot_change(root: str, manager_for, cmd, verb) -> None:
    make_queue(root, "stuck")
    blocker = os.path.join(root, "config", "stuck.down")
    os.makedirs(os.path.join(blocker, "inside"))  # a non-empty directory: cannot unlink or replace
    mgr = manager_for()
    assert mgr.call(cmd, "stuck", raw=True) == ["fail", f"not allowed to {verb}"]


def test_malformed_frames(root: str, manager_for) -> None:
    """Bad frames are tested on the rq1 server itself (tests/test_sockserve.py); this is the
    proof that the manager answers through it."""
    mgr = manager_for()
    reply = raw_request(os.path.join(root, "config", "queuemgr.sock"), b"rq2 00000004 ping")
    assert reply in (protocol.encode_reply(["fail", "bad request"]), b"")
    assert mgr.call("ping") == ["pong"]


@pytest.mark.parametrize("cmd", ["nosuch", "PING", "Reserve", "timer"])
def test_unknown_commands_answer_error(root: str, manager_for, cmd: str) -> None:
    mgr = manager_for()
    assert mgr.call(cmd) == ["error"]


def test_simple_commands(root: str, manager_for) -> None:
    import rq
    mgr = manager_for()
    assert mgr.call("ping") == ["pong"]
    assert mgr.call("version") == [rq.__version__]
    uptime = mgr.call("uptime")
    assert isinstance(uptime[0], int) and uptime[0] >= 0
    assert mgr.call("queues") == []


def test_graceful_stop(root: str, manager_for) -> None:
    make_queue(root, "a", test_stop_delay=0.2)
    make_queue(root, "b", test_stop_delay=0.2)
    mgr = manager_for()
    pids = [mgr.wait_state(n, "RUNNING")["pid"] for n in ("a", "b")]
    assert mgr.stop() == 0
    assert events(root, "a", "exit") == [pids[0]] and events(root, "b", "exit") == [pids[1]]
    assert not os.path.exists(os.path.join(root, "config", "queuemgr.pid"))
    assert not os.path.exists(os.path.join(root, "config", "queuemgr.sock"))
    assert "rq-mgr stopped" in mgr.log_text()


def test_second_signal_is_passed_on(root: str, manager_for) -> None:
    make_queue(root, "slow", test_behaviour="slowstop", kill_grace=3600)
    mgr = manager_for()
    pid = mgr.wait_state("slow", "RUNNING")["pid"]
    mgr.popen.send_signal(signal.SIGTERM)
    wait_for(lambda: events(root, "slow", "term") == [pid], what="first SIGTERM")
    mgr.wait_state("slow", "STOPPING")
    assert mgr.popen.poll() is None
    mgr.popen.send_signal(signal.SIGINT)
    assert mgr.popen.wait(15) == 0
    assert events(root, "slow", "term") == [pid, pid]
    assert events(root, "slow", "exit") == [pid]


def test_stubborn_queue_and_its_jobs_are_killed(root: str, manager_for) -> None:
    qdir = make_queue(root, "stubborn", test_behaviour="stubborn", kill_grace=0)
    job = subprocess.Popen(["sleep", "300"], start_new_session=True)  # a job in run/
    try:
        os.makedirs(os.path.join(qdir, "run", "20240101.0000.00.000.1"))
        with open(os.path.join(qdir, "run", "20240101.0000.00.000.1", "pid"), "w") as f:
            f.write(f"{job.pid}\n")
        mgr = manager_for({"first_delay": 0.05, "max_delay": 0.2, "stop_margin": 0.5})
        pid = mgr.wait_state("stubborn", "RUNNING")["pid"]
        assert mgr.stop() == 0
        assert job.wait(10) == -signal.SIGKILL
        assert not pid_alive(pid)
        assert "stubborn: did not stop in time, sending SIGKILL" in mgr.log_text()
    finally:
        job.kill()
        job.wait()


def test_job_with_mismatched_start_time_is_not_killed(root: str, manager_for) -> None:
    qdir = make_queue(root, "stubborn", test_behaviour="stubborn", kill_grace=0)
    bystander = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        run = os.path.join(qdir, "run", "20240101.0000.00.000.1")
        os.makedirs(run)
        with open(os.path.join(run, "pid"), "w") as f:
            f.write(f"{bystander.pid}\n")
        with open(os.path.join(run, "proc.json"), "w") as f:  # pid reused by someone else
            json.dump({"pid": bystander.pid, "pgid": bystander.pid, "start_time": 1.0,
                       "started": 1.0}, f)
        mgr = manager_for({"first_delay": 0.05, "max_delay": 0.2, "stop_margin": 0.3})
        mgr.wait_state("stubborn", "RUNNING")
        assert mgr.stop() == 0
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()


def test_children_notice_the_managers_death(root: str, manager_for) -> None:
    make_queue(root, "orphan")
    mgr = manager_for()
    pid = mgr.wait_state("orphan", "RUNNING")["pid"]
    mgr.kill()
    wait_for(lambda: events(root, "orphan", "eof") == [pid], what="lifeline EOF")
    wait_for(lambda: not pid_alive(pid), what="child exit")


def test_a_child_that_never_gets_ready_is_starting(root: str, manager_for) -> None:
    make_queue(root, "mute", test_behaviour="noready")
    make_queue(root, "loud")
    mgr = manager_for()
    mgr.wait_state("loud", "RUNNING")
    assert mgr.queue("mute")["state"] == "STARTING"
    assert mgr.call("reload") == ["ok"]                  # SIGHUP is held back while STARTING
    assert mgr.stop() == 0
    assert events(root, "mute", "hup") == []
