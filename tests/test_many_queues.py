"""Many queues on one host (issue 17): queue processes forked from the fork server under
the manager's supervision (S2), and host limits refused at start-up with one clear line."""

from __future__ import annotations

import gc
import logging
import os
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import threading
import types
import warnings
from pathlib import Path

import psutil
import pytest
import setproctitle
from rqtest import REPO, free_port, wait_for, write_root, write_script
from test_mgr_support import MAIN_CONFIG, env_with_repo, make_queue, pid_alive

from rq.client import call_mgr, call_queue
from rq.errors import ConnectError
from rq.mgr import limits, pidfile
from rq.queue import __main__ as queue_main
from rq.queue import forkserver

MAIN = "import sys; from rq.mgr.cli import main; sys.exit(main())"
N = 50
DONE = '#!/bin/sh\necho "done ok" >&3\n'
SLEEPER = '#!/bin/sh\necho $$ > "$MANY_TEST_MARK"\nexec sleep 300\n'


def rq_mgr(root: str, cmd: str, *wrap: str) -> subprocess.CompletedProcess[str]:
    """`rq-mgr --root ROOT CMD`, run through `wrap` (e.g. prlimit) when given."""
    return subprocess.run([*wrap, sys.executable, "-c", MAIN, "--root", root, cmd],
                          env=env_with_repo(), capture_output=True, text=True, timeout=120,
                          cwd="/")


@pytest.fixture
def root(tmp_path) -> str:  # type: ignore[no-untyped-def]
    path = write_root(str(tmp_path / "root"), {**MAIN_CONFIG, "port": free_port()}, "queue")
    yield path
    pid = pidfile.running_pid(path)
    if pid is not None:  # a failed test: stop its manager and whatever it still runs
        rq_mgr(path, "stop")


def queues(root: str, script: str, n: int = N) -> list[str]:
    names = [f"q{i:02d}" for i in range(n)]
    for name in names:
        make_queue(root, name, script=script, exec_prefix="")
    return names


def status(root: str) -> dict:
    return call_mgr(root, "status")[1]


def all_running(root: str, names: list[str]) -> dict | None:
    qs = status(root)["queues"]
    return qs if all(qs[n]["state"] == "RUNNING" for n in names) else None


def done_one(root: str, name: str) -> bool:
    return call_queue(root, name, "num_messages")["done"] >= 1


def test_fifty_queues_forked_serve_and_each_runs_a_message(root: str, tmp_path) -> None:
    """Every queue process runs, answers and finishes a message; each is the manager's own
    child (forked by the fork server, adopted as its subreaper) and costs little memory."""
    names = queues(root, str(write_script(tmp_path / "done.sh", DONE)))
    assert rq_mgr(root, "start").returncode == 0
    try:
        qs = wait_for(lambda: all_running(root, names), 60, 0.05, "every queue RUNNING")
        mgr = psutil.Process(pidfile.running_pid(root))
        children = {p.pid: p for p in mgr.children()}
        pids = [qs[n]["pid"] for n in names]
        assert len(set(pids)) == N and set(pids) <= set(children)
        assert any(p.cmdline()[0].startswith("[rq-que-fork]") for p in children.values())
        # before any request: the loop, which serves the socket too (one worker: no I/O
        # thread, issue 15) and, until the spares are made, their filler; no idle socket
        # workers (each thread is private memory of an idle queue, issue 17)
        assert max(children[p].num_threads() for p in pids) <= 2
        wait_for(lambda: all(children[p].num_threads() == 1 for p in pids), 60, 0.05,
                 "every idle queue down to its loop")
        for name in names:
            assert call_queue(root, name, "ping") == ["pong"]
            assert os.getpgid(qs[name]["pid"]) == qs[name]["pid"]  # its own group (S2.1)
            assert call_queue(root, name, "create_message", {"dest": name})[0] == "ok"
        wait_for(lambda: all(done_one(root, n) for n in names), 60, 0.05, "one done each")
        uss = statistics.median(children[p].memory_full_info().uss for p in pids)
        assert uss < 8 * 2**20, uss  # a fresh interpreter per queue: ~14.5 MiB (issue 17)
    finally:
        assert rq_mgr(root, "stop").returncode == 0
    assert not any(pid_alive(p) for p in pids)
    # a forked queue leaves without the interpreter's teardown, its log written all the same
    log = (Path(root) / "log" / "queuemgr.log").read_text()
    assert all(f"queue {name} stopped" in log for name in names)


QUEUE_ARGV = ["--root", "/r", "--name", "q", "--lifeline-fd", "5", "--ready-fd", "6"]


@pytest.mark.parametrize("argv", [
    QUEUE_ARGV,
    [*QUEUE_ARGV, "--log-stderr"],
    ["--name", "q", "--ready-fd", "6", "--root", "/r r", "--lifeline-fd", "05"],
])
def test_fork_server_parses_what_rq_mgr_sends_as_argparse_does(argv: list[str]) -> None:
    """A forked queue process gets its command line parsed without argparse (which cost
    each one private memory, issue 17): the same Namespace as SPEC.parse."""
    assert forkserver.quick_parse(argv) == queue_main.SPEC.parse(argv)


@pytest.mark.parametrize("argv", [
    [*QUEUE_ARGV, "--root", "/x"],                     # a flag twice
    QUEUE_ARGV[:-2],                                   # one missing
    [*QUEUE_ARGV[:-1], "x"],                           # not a number
    ["--root=/r", *QUEUE_ARGV[2:]],                    # another spelling
    [*QUEUE_ARGV[:3], "-q", *QUEUE_ARGV[4:]],          # a value like an option
    [*QUEUE_ARGV, "--log-stderr", "--log-stderr"],
    [*QUEUE_ARGV, "--help"],
])
def test_fork_server_leaves_any_other_command_line_to_argparse(argv: list[str]) -> None:
    """Anything else is None: argparse parses it in the queue process, which then fails
    (or not) exactly as when run by hand."""
    assert forkserver.quick_parse(argv) is None


def test_fork_server_warm_up_runs_whole_queues_and_leaves_the_process_as_it_was(
        monkeypatch) -> None:
    """warm_up runs each throw-away queue through the whole program (its command line
    parsed, logging, config, serve, stop: all that a forked queue process would otherwise
    quicken and copy for itself, issue 17), then leaves no descriptor, thread, logging
    handler, signal handler or working directory of theirs behind."""
    codes: list[int] = []
    real = queue_main.run_daemon
    monkeypatch.setattr(queue_main, "run_daemon",
                        lambda *a: codes.append(real(*a)) or codes[-1])
    with warnings.catch_warnings():  # what earlier tests of this worker left in cycles (a
        warnings.simplefilter("ignore", ResourceWarning)  # Popen, its pipes) is theirs: it
        gc.collect()  # would close in warm_up's collection and look like descriptors it took
    fds, cwd, threads = sorted(os.listdir("/proc/self/fd")), os.getcwd(), threading.active_count()
    handlers, level = list(logging.root.handlers), logging.root.level
    signals = {sig: signal.getsignal(sig) for sig in queue_main.WARM_SIGNALS}
    queue_main.warm_up(setproctitle.getproctitle(), runs=3)
    assert codes == [0, 0, 0]  # each started, served, saw its manager gone and stopped
    assert sorted(os.listdir("/proc/self/fd")) == fds and os.getcwd() == cwd
    assert threading.active_count() == threads
    assert logging.root.handlers == handlers and logging.root.level == level
    assert {sig: signal.getsignal(sig) for sig in queue_main.WARM_SIGNALS} == signals


def test_fork_server_warms_up_once_past_a_few_queue_processes(monkeypatch) -> None:
    """The warm-up's throw-away queues pay off for a root of many queues only: it runs once,
    before forking the batch that takes the queue processes asked for past WARM_AFTER, and
    the timers and scandir daemons it also forks do not count.  (No fork here: the seam
    rq.proc.fork_adopted answers as if the fork had failed.)"""
    warmed: list[int] = []
    monkeypatch.setattr(forkserver.proc, "fork_adopted", lambda keeps: None)
    monkeypatch.setattr(forkserver.gc, "freeze", lambda: None)  # not this test process's
    sock, peer = socket.socketpair()
    with sock, peer:
        other = types.ModuleType("rq.timers.__main__")
        server = forkserver.Server(sock, {**forkserver.QUEUE_ONLY, "rq.timers": other},
                                   warm=lambda: warmed.append(server.queues))

        def batch(program: types.ModuleType, n: int) -> list:
            return [(i, program, [], [os.open(os.devnull, os.O_RDONLY) for _ in range(2)])
                    for i in range(n)]
        server.start(batch(other, 5))
        server.start(batch(queue_main, forkserver.WARM_AFTER - 1))
        server.start(batch(queue_main, 1))
        assert warmed == []
        server.start(batch(queue_main, 2))
        assert warmed == [forkserver.WARM_AFTER + 2]  # counted with the batch it came before
        server.start(batch(queue_main, 50))
        assert warmed == [forkserver.WARM_AFTER + 2]  # counted with the batch it came before


def test_forked_queue_killed_is_reaped_restarted_and_its_orphan_job_reaped(
        root: str, tmp_path) -> None:
    """S2.3 as before: SIGKILL of a forked queue process is seen with its real exit status
    and backs off; its job, orphaned to the manager (the subreaper), is reaped, no zombie."""
    mark = tmp_path / "job.pid"
    make_queue(root, "w", script=str(write_script(tmp_path / "sleep.sh", SLEEPER)),
               exec_prefix="", kill_grace=1, env_vars={"MANY_TEST_MARK": str(mark)})
    assert rq_mgr(root, "start").returncode == 0
    try:
        first = wait_for(lambda: all_running(root, ["w"]), 30, 0.05, "RUNNING")["w"]["pid"]
        assert call_queue(root, "w", "create_message", {"dest": "w"})[0] == "ok"
        job = int(wait_for(lambda: mark.exists() and mark.read_text().strip(), 30, 0.05,
                           "the job's pid"))
        # The queue process records its job (run/ID/proc.json, S2.7) just after the spawn;
        # the job can write its mark first: kill the queue only once it knows its job.
        run = tmp_path / "root" / "queue" / "w" / "run"
        wait_for(lambda: any(run.glob("*/proc.json")), 30, 0.01, "the job recorded")
        os.kill(first, signal.SIGKILL)
        child = wait_for(lambda: (c := status(root)["queues"]["w"])["restarts"] == 1 and c,
                         30, 0.05, "the queue restarted")
        assert child["pid"] != first
        log = (tmp_path / "root" / "log" / "queuemgr.log").read_text()
        assert f"queue w: pid {first} exited: killed by SIGKILL" in log
        # The new queue process stops the survivor (S2.7); the job was the manager's
        # orphan by then: it must be reaped, not left a zombie.
        wait_for(lambda: not psutil.pid_exists(job), 30, 0.05, "the orphan job reaped")
        mgr = psutil.Process(pidfile.running_pid(root))
        assert [c.pid for c in mgr.children() if c.status() == psutil.STATUS_ZOMBIE] == []
    finally:
        assert rq_mgr(root, "stop").returncode == 0


def test_timers_and_scandir_are_forked_supervised_as_before(root: str) -> None:
    """Issue 14 section 4: the timers and scandir daemons come from the fork server too (no
    fresh interpreter each: their private memory shows it), as the manager's own children in
    their own sessions; a SIGKILL is seen with its real exit status and backs off (S2.3);
    `rq-mgr stop` stops them and their last log lines are written."""
    for sub in ("timers", "scandir"):
        os.makedirs(os.path.join(root, sub), exist_ok=True)
    assert rq_mgr(root, "start").returncode == 0
    try:
        def both_running() -> dict | None:
            st = status(root)
            ok = all(st[k] and st[k]["state"] == "RUNNING" for k in ("timers", "scandir"))
            return st if ok else None
        st = wait_for(both_running, 30, 0.05, "timers and scandir RUNNING")
        mgr = psutil.Process(pidfile.running_pid(root))
        children = {p.pid: p for p in mgr.children()}
        pids = {k: st[k]["pid"] for k in ("timers", "scandir")}
        for kind, pid in pids.items():
            assert pid in children, kind
            assert children[pid].cmdline()[0] == f"[rq-{kind}]"
            assert os.getsid(pid) == pid  # its own session and group, as a spawn gives
            # a fresh interpreter of either: ~13 MiB of its own; forked: under 5
            assert children[pid].memory_full_info().uss < 8 * 2**20, kind
        os.kill(pids["timers"], signal.SIGKILL)
        again = wait_for(lambda: (t := status(root)["timers"])["restarts"] == 1
                         and t["state"] == "RUNNING" and t, 30, 0.05, "timers restarted")
        assert again["pid"] != pids["timers"]
        log = (Path(root) / "log" / "queuemgr.log").read_text()
        assert f"timers: pid {pids['timers']} exited: killed by SIGKILL" in log
    finally:
        assert rq_mgr(root, "stop").returncode == 0
    assert not any(pid_alive(p) for p in (*pids.values(), again["pid"]))
    log = (Path(root) / "log" / "queuemgr.log").read_text()
    assert "rq-timers stopped" in log and "rq-scandir stopped" in log


def leftovers(root: str) -> list[str]:
    found = []
    for p in psutil.process_iter():
        try:
            if root in " ".join(p.cmdline()):
                found.append(p.name())
        except psutil.Error:
            continue  # gone, or a zombie
    return found


def test_too_few_open_files_refused_with_the_limit_named(root: str, tmp_path) -> None:
    """rq-mgr start with RLIMIT_NOFILE below what N queues need: one ERROR line naming the
    limit, its value and how to raise it; exit 1; nothing started, no pid file."""
    queues(root, str(write_script(tmp_path / "done.sh", DONE)))
    res = rq_mgr(root, "start", "prlimit", "--nofile=120:120", "--")
    assert res.returncode == 1
    line = res.stderr.strip()
    assert "\n" not in line and "Traceback" not in res.stderr
    assert line.startswith("ERROR: cannot start: 50 queues need about 164 open files in "
                           "rq-mgr, but its limit RLIMIT_NOFILE is 120: raise it"), line
    assert "ulimit -n 1024" in line and "LimitNOFILE=1024" in line
    assert pidfile.running_pid(root) is None
    with pytest.raises(ConnectError):
        call_mgr(root, "ping")
    assert leftovers(root) == []
    res = rq_mgr(root, "start", "prlimit", "--nofile=200:200", "--")  # 164 fit
    assert res.returncode == 0, res.stderr
    assert rq_mgr(root, "stop").returncode == 0


@pytest.mark.skipif(shutil.which("setpriv") is None, reason="needs setpriv (util-linux)")
def test_too_few_tasks_refused_with_the_limit_named(root: str, tmp_path) -> None:
    """RLIMIT_NPROC (applied only without CAP_SYS_RESOURCE/ADMIN: setpriv drops them)."""
    queues(root, str(write_script(tmp_path / "done.sh", DONE)))
    used = limits.user_usage(os.getuid(), count_inotify=False)[0]
    cap = used + 300  # room for rq-mgr start itself; 50 queues need 600
    wrap = ("setpriv", "--bounding-set=-sys_admin,-sys_resource",
            "prlimit", f"--nproc={cap}:{cap}", "--")
    res = rq_mgr(root, "start", *wrap)
    assert res.returncode == 1, res.stderr
    assert "Traceback" not in res.stderr and res.stderr.count("\n") == 1
    assert "50 queues need about 600 tasks" in res.stderr
    assert f"RLIMIT_NPROC (tasks of this user) is {cap}: raise it with `ulimit -u" \
        in res.stderr
    assert pidfile.running_pid(root) is None


HOST = limits.Host(nofile=1024, nofile_hard=4096, pid_max=32768, threads_max=100000,
                   tasks=1000, nproc=limits.UNLIMITED, user_tasks=500,
                   pids_max=limits.UNLIMITED, cgroup_tasks=0, inotify_instances=128,
                   inotify_in_use=10)


@pytest.mark.parametrize("change, queues, words", [
    ({}, 480, None),                                             # 1,024 fds: 480 fit
    ({}, 481, "RLIMIT_NOFILE is 1024: raise it with `ulimit -n 2048`"),
    ({}, 2100, "(and its hard limit 4096)"),
    ({"nofile": 99999, "pid_max": 5000}, 500, "kernel.pid_max is 5000: raise it with "
                                              "sysctl -w kernel.pid_max=6144"),
    ({"nofile": 99999, "threads_max": 2000}, 150, "kernel.threads-max is 2000"),
    ({"nofile": 99999, "nproc": 1000}, 60, "RLIMIT_NPROC (tasks of this user) is 1000"),
    ({"nofile": 99999, "pids_max": 2000, "cgroup_tasks": 1500}, 50,
     "the cgroup's pids.max is 2000: raise it with TasksMax=3072"),
    ({"nofile": 99999}, 1000, None),
])
def test_limit_rules(change: dict, queues: int, words: str | None) -> None:
    found = limits.problems(limits.Host(**{**HOST.__dict__, **change}), queues)
    if words is None:
        assert found == []
    else:
        assert len(found) == 1 and words in found[0], found


def test_inotify_shortfall_is_a_warning_not_a_refusal() -> None:
    """Queue processes hold no inotify instance: only scandir and timers need them."""
    short = limits.Host(**{**HOST.__dict__, "inotify_in_use": 127})
    assert limits.problems(short, 10) == []
    assert limits.warnings(short) == [
        "scandir and timers need 2 inotify instances, 127 of this user's are in use, and "
        "fs.inotify.max_user_instances is 128: raise it with "
        "sysctl -w fs.inotify.max_user_instances=1024"]
    assert limits.warnings(HOST) == []


def test_read_host_reads_this_host() -> None:
    host = limits.read_host()
    assert host.nofile == resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    assert host.tasks > 0 and host.user_tasks > 0 and host.pid_max > 0


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                    reason="needs root and setpriv to probe as another user")
def test_inotify_probe_says_no_only_past_the_user_limit() -> None:
    """read_host counts a user's inotify instances (a readlink of each of their descriptors)
    only when the probe cannot make scandir's and timers' two now.  The probe makes real
    instances, and past fs.inotify.max_user_instances the kernel refuses them: shown as user
    nobody, whose limit this test may exhaust without starving the other tests' daemons."""
    probe = ("import ctypes, os\nfrom rq.mgr import limits\n"
             "n = int(open('/proc/sys/fs/inotify/max_user_instances').read())\n"
             "held = [ctypes.CDLL(None).inotify_init1(os.O_CLOEXEC) for _ in range(3)]\n"
             "used = limits.user_usage(65534, count_inotify=True)[1]\n"
             "print(used >= 3, limits.inotify_available(2),\n"
             "      limits.inotify_available(n - used + 1),\n"
             "      limits.inotify_available(2), limits.read_host().inotify_in_use)")
    done = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                           sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=60, cwd="/", env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr
    # three held; two more made; one past the limit refused; closed again; and read_host,
    # whose probe passed, counted none of the three
    assert done.stdout.split() == ["True", "True", "False", "True", "0"], done.stdout
