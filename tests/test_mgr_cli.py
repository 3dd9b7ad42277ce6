"""The `rq-mgr` command (SPEC S21, S1.2, S2.2), run as real processes."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import subprocess
import sys

import pytest
from rqtest import free_port, wait_for, write_root
from test_mgr_support import (
    MAIN_CONFIG,
    env_with_repo,
    make_queue,
    pid_alive,
)

from rq.client import call_mgr, call_queue
from rq.config import load_main_config
from rq.errors import ConfigError, ConnectError
from rq.mgr import cli, pidfile, queuedirs

USAGE = "usage: rq-mgr [--root PATH] start|stop|restart|reload|run|status\n"
ALREADY = "ERROR: there is already one or more instance(s) of the program running\n"
MAIN = "import sys; from rq.mgr.cli import main; sys.exit(main())"


def rq_mgr(*args: str, cwd: str | None = None, env: dict[str, str] | None = None,
           timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", MAIN, *args], check=False, cwd=cwd or "/",
                          env=env or env_with_repo(), capture_output=True, text=True,
                          timeout=timeout)


def mgr_popen(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", MAIN, *args], env=env_with_repo(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def answers(root: str) -> bool:
    try:
        return call_mgr(root, "ping", timeout=5) == ["pong"]
    except ConnectError:
        return False


def read_log(root: str) -> str:
    with open(os.path.join(root, "log", "queuemgr.log")) as f:
        return f.read()


@pytest.fixture
def root(tmp_path) -> str:  # type: ignore[no-untyped-def]
    """A fresh root; any manager left running by a failed test is stopped."""
    path = write_root(str(tmp_path / "root"), {**MAIN_CONFIG, "port": free_port()},
                      "queue")
    yield path
    pid = pidfile.running_pid(path)
    if pid is not None:
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: not pid_alive(pid), what="leftover manager gone")


def test_start_and_stop_do_not_import_the_daemon(root: str) -> None:
    """Issue 14 section 4: `rq-mgr start` spawns `python -m rq.mgr` and `stop` signals it;
    neither pays for the supervisor's imports itself (the suite starts and stops hundreds
    of roots).  Only `run` (the daemon in this process) imports them."""
    probe = ("import atexit, sys\n"
             "atexit.register(lambda: print(' '.join(sorted(sys.modules)), file=sys.stderr))\n"
             "from rq.mgr.cli import main\nsys.exit(main())\n")
    daemon_side = {"rq.mgr.daemon", "rq.mgr.supervisor", "rq.mgr.commands", "rq.fsops",
                   "rq.sockserve", "rq.events"}
    for command in ("start", "stop"):
        res = subprocess.run([sys.executable, "-c", probe, "--root", root, command], cwd="/",
                             env=env_with_repo(), capture_output=True, text=True, timeout=60)
        assert res.returncode == 0, res.stderr
        loaded = set(res.stderr.splitlines()[-1].split())
        assert "rq.mgr.cli" in loaded and not daemon_side & loaded, (command, loaded)
        if command == "start":
            assert answers(root)
    assert pidfile.running_pid(root) is None


# ---------------------------------------------------------------- usage and root (S21, S1.2)


@pytest.mark.parametrize("args", [[], ["bogus"], ["start", "stop"], ["-t"], ["--root"]])
def test_usage(root: str, args: list[str]) -> None:
    res = rq_mgr(*args)
    assert (res.returncode, res.stdout, res.stderr) == (1, "", USAGE)


def test_no_root_found(tmp_path) -> None:
    res = rq_mgr("status", cwd=str(tmp_path))
    assert res.returncode == 1
    assert res.stderr == ("rq-mgr: no RQ root found (use --root, set RQ_ROOT, "
                          "or run inside an RQ root)\n")


def test_not_an_rq_root(tmp_path) -> None:
    res = rq_mgr("status", "--root", str(tmp_path))
    assert res.returncode == 1
    assert res.stderr == f"rq-mgr: not an RQ root: {tmp_path} (missing config/config.json)\n"


def test_root_from_option_env_or_cwd(root: str) -> None:
    sub = os.path.join(root, "queue")
    for kw in ({"args": ("status", f"--root={root}")},
               {"args": ("status",), "env": env_with_repo({"RQ_ROOT": root})},
               {"args": ("status",), "cwd": sub}):
        args = kw.pop("args")
        res = rq_mgr(*args, **kw)  # type: ignore[arg-type]
        assert (res.returncode, res.stdout) == (3, "queuemgr: not running\n")


# ---------------------------------------------------------------- when not running


def test_commands_when_not_running(root: str) -> None:
    res = rq_mgr("--root", root, "status")
    assert (res.returncode, res.stdout, res.stderr) == (3, "queuemgr: not running\n", "")
    res = rq_mgr("stop", "--root", root)
    assert (res.returncode, res.stdout, res.stderr) == (0, "queuemgr: not running\n", "")
    res = rq_mgr("reload", "--root", root)
    assert (res.returncode, res.stdout, res.stderr) == (1, "", "queuemgr: not running\n")


def _bad_config_cases() -> list[tuple[str, str]]:
    return [
        ("{not json", "invalid JSON"),
        (json.dumps({"env": "x", "host": "h", "addr": "a"}), 'missing required key "port"'),
        (json.dumps({"env": "x", "host": "h", "port": 70000, "addr": "a"}), "port"),
        (json.dumps({"env": "x", "host": "h", "port": 1, "addr": "a",
                     "relative_root": "rq"}), "relative_root"),
        (json.dumps({"env": "x", "host": "h", "port": 1, "addr": "a",
                     "tmpdir": "/nonexistent/dir"}), "tmpdir"),
        (json.dumps([1, 2]), "not a JSON object"),
    ]


@pytest.mark.parametrize("text, hint", _bad_config_cases())
@pytest.mark.parametrize("command", [["start"], ["run"], ["-t", "start"]])
def test_bad_config(root: str, text: str, hint: str, command: list[str]) -> None:
    with open(os.path.join(root, "config", "config.json"), "w") as f:
        f.write(text)
    with pytest.raises(ConfigError) as exc:
        load_main_config(root)
    assert hint in str(exc.value)
    res = rq_mgr("--root", root, *command)
    assert res.returncode == 1
    assert res.stdout == ""
    assert res.stderr == f"ERROR: bad config file config/config.json: {exc.value}\n"
    assert not os.path.exists(os.path.join(root, "config", "queuemgr.pid"))


# ---------------------------------------------------------------- the lifecycle


def test_start_status_reload_stop(root: str) -> None:
    res = rq_mgr("--root", root, "start")
    assert (res.returncode, res.stdout, res.stderr) == (0, "", "")
    assert answers(root)  # ready when start returns
    pid = pidfile.read_pid(root)
    assert pid is not None and pidfile.running_pid(root) == pid
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        assert f.read().split(b"\0")[0] == f"[rq-mgr] {root}".encode()
    assert os.getsid(pid) == pid                        # its own session
    for fd in (0, 1, 2):
        assert os.readlink(f"/proc/{pid}/fd/{fd}") == "/dev/null"
    assert os.readlink(f"/proc/{pid}/cwd") == root

    res = rq_mgr("--root", root, "status")
    assert (res.returncode, res.stdout) == (0, f"queuemgr: running [pid {pid}]\n")
    res = rq_mgr("--root", root, "start")
    assert (res.returncode, res.stdout, res.stderr) == (1, "", ALREADY)
    res = rq_mgr("--root", root, "run")
    assert (res.returncode, res.stderr) == (1, ALREADY)
    res = rq_mgr("--root", root, "reload")
    assert (res.returncode, res.stdout) == (0, f"queuemgr: reloading process with pid {pid}\n")
    wait_for(lambda: "reload:" in read_log(root), what="reload logged")

    res = rq_mgr("--root", root, "stop")
    assert (res.returncode, res.stderr) == (0, "")
    assert res.stdout == f"queuemgr: trying to stop process with pid {pid}...\n"
    assert not pid_alive(pid)
    assert not os.path.exists(os.path.join(root, "config", "queuemgr.pid"))
    assert not os.path.exists(os.path.join(root, "config", "queuemgr.sock"))
    res = rq_mgr("--root", root, "status")
    assert res.returncode == 3


def test_log_lines(root: str) -> None:
    assert rq_mgr("--root", root, "start").returncode == 0
    assert rq_mgr("--root", root, "stop").returncode == 0
    lines = read_log(root).splitlines()
    assert any(" rq-mgr[" in line and " INFO rq-mgr started" in line for line in lines)
    assert lines[-1].endswith("INFO rq-mgr stopped")


def test_restart(root: str) -> None:
    res = rq_mgr("--root", root, "restart")      # not running: just starts
    assert (res.returncode, res.stdout, res.stderr) == (0, "", "")
    old = pidfile.running_pid(root)
    res = rq_mgr("--root", root, "restart")
    assert res.returncode == 0
    assert res.stdout == f"queuemgr: trying to stop process with pid {old}...\n"
    new = pidfile.running_pid(root)
    assert new is not None and new != old and not pid_alive(old)  # type: ignore[arg-type]
    assert rq_mgr("--root", root, "stop").returncode == 0


def test_stale_pid_file_is_replaced(root: str) -> None:
    with open(os.path.join(root, "config", "queuemgr.pid"), "w") as f:
        f.write(f"{os.getpid()}\n")               # alive, but not an rq-mgr of this root
    res = rq_mgr("--root", root, "status")
    assert res.returncode == 3
    assert rq_mgr("--root", root, "start").returncode == 0
    assert pidfile.read_pid(root) not in (None, os.getpid())
    assert rq_mgr("--root", root, "stop").returncode == 0


def test_manager_of_another_root_does_not_count(root: str, tmp_path) -> None:
    other = write_root(str(tmp_path / "other"), {**MAIN_CONFIG, "port": free_port()},
                      "queue")
    assert rq_mgr("--root", other, "start").returncode == 0
    try:
        with open(os.path.join(root, "config", "queuemgr.pid"), "w") as f:
            f.write(f"{pidfile.read_pid(other)}\n")
        assert rq_mgr("--root", root, "status").returncode == 3
    finally:
        assert rq_mgr("--root", other, "stop").returncode == 0


def test_startup_failure_is_reported(root: str) -> None:
    os.makedirs(os.path.join(root, "config", "queuemgr.sock", "blocker"))
    res = rq_mgr("--root", root, "start")
    assert res.returncode == 1
    assert res.stderr.startswith("ERROR: cannot bind config/queuemgr.sock: ")
    assert res.stderr.count("\n") == 1
    assert not os.path.exists(os.path.join(root, "config", "queuemgr.pid"))


@pytest.mark.parametrize("args, sig", [(["run"], signal.SIGINT), (["start", "--ontop"],
                                                                   signal.SIGTERM)])
def test_run_in_foreground(root: str, args: list[str], sig: int) -> None:
    proc = mgr_popen("--root", root, *args)
    try:
        wait_for(lambda: answers(root) or proc.poll() is not None, what="run serves")
        assert proc.poll() is None
        assert pidfile.running_pid(root) == proc.pid  # the foreground process is the manager
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0 and out == ""
    assert f"rq-mgr[{proc.pid}] INFO rq-mgr started" in err  # the log, copied to stderr
    assert "rq-mgr stopped" in err
    assert not os.path.exists(os.path.join(root, "config", "queuemgr.pid"))
    assert not os.path.exists(os.path.join(root, "config", "queuemgr.sock"))


@pytest.mark.skipif(importlib.util.find_spec("rq.queue") is None, reason="rq.queue not yet")
def test_run_copies_the_childrens_log_lines_to_stderr(root: str) -> None:
    """S1.5, issue 16 item 8: `rq-mgr run` shows its children's log lines too (they have a
    ready pipe under a manager, so they no longer decide stderr logging by its absence)."""
    make_queue(root, "real")
    proc = mgr_popen("--root", root, "run")
    try:
        wait_for(lambda: proc.poll() is not None or (answers(root) and call_mgr(
            root, "status")[1]["queues"]["real"]["state"] == "RUNNING"), what="queue RUNNING")
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0
    logged = read_log(root)
    for line in ("INFO queue real serving", "INFO queue real stopped"):
        assert line in logged
        assert re.search(rf"rq-que real\[\d+\] {line}", err), err
    assert re.search(r"rq-web\[\d+\] ", err), err
    assert err.count("\n") == logged.count("\n")  # the file's lines, each once


def test_start_with_a_broken_queue_is_still_ready(root: str) -> None:
    make_queue(root, "broken")
    with open(os.path.join(root, "queue", "broken", "config.json"), "w") as f:
        json.dump({"name": "broken", "num_workers": 0, "script": "x"}, f)
    assert rq_mgr("--root", root, "start").returncode == 0
    try:
        reply = call_mgr(root, "status")
        assert reply[1]["queues"]["broken"]["state"] == "FATAL"
        assert reply[1]["queues"]["broken"]["error"] == \
            "json config has invalid num_workers field (out of range 1..128)"
    finally:
        assert rq_mgr("--root", root, "stop").returncode == 0


@pytest.mark.skipif(importlib.util.find_spec("rq.queue") is None, reason="rq.queue not yet")
def test_start_runs_real_queue_processes(root: str) -> None:
    make_queue(root, "real")
    assert rq_mgr("--root", root, "start").returncode == 0
    try:
        child = wait_for(lambda: (c := call_mgr(root, "status")[1]["queues"]["real"])["state"]
                         == "RUNNING" and c, what="queue RUNNING")
        assert call_mgr(root, "ping") == ["pong"]
        assert pid_alive(child["pid"])
    finally:
        assert rq_mgr("--root", root, "stop").returncode == 0
    assert not pid_alive(child["pid"])
    assert not os.path.exists(os.path.join(root, "queue", "real", "queue.pid"))


JOB = """#!/bin/sh
trap 'sleep 0.5; echo graceful > {mark}; exit 0' TERM
echo running > {mark}.started
while :; do sleep 0.05; done
"""


@pytest.mark.skipif(importlib.util.find_spec("rq.queue") is None, reason="rq.queue not yet")
def test_stop_gives_running_jobs_their_grace(root: str, tmp_path) -> None:
    """S2.5: the manager's stop reaches a job as one SIGTERM and the job gets
    its kill_grace; the stop must not escalate by itself."""
    mark = str(tmp_path / "mark")
    script = tmp_path / "job.sh"
    script.write_text(JOB.format(mark=mark))
    script.chmod(0o755)
    make_queue(root, "work", script=str(script), exec_prefix="", kill_grace=10)
    assert rq_mgr("--root", root, "start").returncode == 0
    try:
        wait_for(lambda: call_mgr(root, "status")[1]["queues"]["work"]["state"] == "RUNNING",
                 what="queue RUNNING")
        reply = call_queue(root, "work", "create_message", {"dest": "work"})
        assert reply[0] == "ok", reply
        wait_for(lambda: os.path.exists(mark + ".started"), what="job running")
    finally:
        res = rq_mgr("--root", root, "stop")
    assert res.returncode == 0
    with open(mark) as f:
        assert f.read() == "graceful\n"


# ---------------------------------------------------------------- forceful stop (S21)

STUBBORN = """
import signal, sys, time, setproctitle
setproctitle.setproctitle("[rq-mgr] " + sys.argv[1])
signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("ready", flush=True)
while True:
    time.sleep(60)
"""


def test_stop_kills_a_manager_that_will_not_stop(root: str, monkeypatch, capsys) -> None:
    qdir = make_queue(root, "q")
    fake = subprocess.Popen([sys.executable, "-c", STUBBORN, root], env=env_with_repo(),
                            stdout=subprocess.PIPE, text=True, start_new_session=True)
    job = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        assert fake.stdout is not None and fake.stdout.readline() == "ready\n"
        with open(os.path.join(root, "config", "queuemgr.pid"), "w") as f:
            f.write(f"{fake.pid}\n")
        open(os.path.join(root, "config", "queuemgr.sock"), "w").close()
        os.makedirs(os.path.join(qdir, "run", "20240101.0000.00.000.1"))
        with open(os.path.join(qdir, "run", "20240101.0000.00.000.1", "pid"), "w") as f:
            f.write(f"{job.pid}\n")
        monkeypatch.setattr(cli, "STOP_BASE", 0.3)
        monkeypatch.setattr(queuedirs, "max_kill_grace", lambda root: 0.0)
        assert cli.main(["--root", root, "stop"]) == 0
        out = capsys.readouterr().out
        assert out == (f"queuemgr: trying to stop process with pid {fake.pid}...\n"
                       f"queuemgr: process with pid {fake.pid} won't stop, "
                       "we forcefully kill it...\n")
        assert fake.wait(10) == -signal.SIGKILL
        assert job.wait(10) == -signal.SIGKILL
        assert not os.path.exists(os.path.join(root, "config", "queuemgr.pid"))
        assert not os.path.exists(os.path.join(root, "config", "queuemgr.sock"))
    finally:
        for p in (fake, job):
            if p.poll() is None:
                p.kill()
            p.wait()
        if fake.stdout is not None:
            fake.stdout.close()


def test_max_kill_grace(root: str) -> None:
    make_queue(root, "a", kill_grace=7)
    make_queue(root, "b", kill_grace="30")
    make_queue(root, "c")
    with open(os.path.join(root, "queue", "c", "config.json"), "w") as f:
        f.write("broken")
    assert queuedirs.max_kill_grace(root) == 30
