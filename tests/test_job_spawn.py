"""S6.3 process set-up, checked from inside real jobs, for both ways rq.proc
starts a job: the C helper rq._spawn (one exec) and the /bin/sh wrapper
(RQ_JOB_SPAWN=sh).  Each job reports what it sees: cwd, fd 0-4 and no other
descriptor, session and group, nice, signal masks, and the RQ START header
naming its own pid; bare command names are found on the job's PATH, a script
without `#!` runs under /bin/sh, and a command that cannot run says so."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from rq import proc
from rqtest import QueueProc, make_queue, process_gone, wait_for, write_script

PROBE = f"""#!{sys.executable}
import json, os
stat = open("/proc/self/stat").read().rsplit(")", 1)[1].split()
status = dict(line.split(":", 1) for line in open("/proc/self/status").read().splitlines())
names = os.listdir("/proc/self/fd")
fds = sorted(int(n) for n in names if os.path.lexists("/proc/self/fd/" + n))  # not listdir's
info = {{"pid": os.getpid(), "pgrp": int(stat[2]), "sid": int(stat[3]), "nice": int(stat[16]),
        "cwd": os.getcwd(), "fds": fds, "sigblk": status["SigBlk"].strip(),
        "links": {{n: os.readlink("/proc/self/fd/%d" % n) for n in range(5)}}}}
with open("probe.json", "w") as fh:
    json.dump(info, fh)
os.write(3, b"done probed\\n")
"""
HEADER = re.compile(r"^\n(\d+) - \d{4}-\d\d-\d\d \d\d:\d\d:\d\d [+-]\d{4} - RQ START - (.+)\n")


@pytest.fixture(params=["helper", "sh"])
def spawn_env(request: pytest.FixtureRequest) -> dict[str, str]:
    if request.param == "helper" and not proc.SPAWN_HELPER:
        pytest.skip("rq._spawn was not built (no C compiler at install)")
    return {"RQ_JOB_SPAWN": "sh" if request.param == "sh" else ""}


def run_one(root: Path, queues: list[QueueProc], env: dict[str, str], name: str,
            state: str = "done", **cfg: object) -> tuple[dict, Path]:
    make_queue(root, name, **cfg)
    q = QueueProc(root, name, env=env)
    queues.append(q)
    full = q.call("create_message", {"dest": name})[1]
    q.wait_state(full, state)
    msg = q.message(full)
    return msg, root / msg["path"]


def test_s6_3_job_process_set_up(root: Path, tmp_path: Path, queues: list[QueueProc],
                                 spawn_env: dict[str, str]) -> None:
    script = write_script(tmp_path / "probe.py", PROBE)
    msg, path = run_one(root, queues, spawn_env, "p", script=script)
    info = json.loads((path / "job" / "probe.json").read_text())
    job_dir = str(root / "queue" / "p" / "run" / msg["msg_id"] / "job")
    assert info["cwd"] == job_dir
    assert info["pid"] == info["pgrp"] == info["sid"]      # own session and group
    assert info["nice"] == 19
    assert int(info["sigblk"], 16) == 0                     # nothing blocked
    assert info["fds"] == [0, 1, 2, 3, 4]                   # no other descriptor
    links = info["links"]
    assert links["0"] == "/dev/null"
    assert links["1"] == links["2"] == job_dir + "/stdio.log"
    assert links["3"].startswith("pipe:") and links["4"].startswith("pipe:")
    assert links["3"] != links["4"]
    log = (path / "job" / "stdio.log").read_text()
    header = HEADER.match(log)
    assert header, log
    assert int(header.group(1)) == info["pid"]              # the header names the job
    assert header.group(2) == str(Path(script).resolve())


def test_s6_3_bare_interpreter_found_on_path(root: Path, tmp_path: Path,
                                             queues: list[QueueProc],
                                             spawn_env: dict[str, str]) -> None:
    """exec_prefix `sh`: a bare name, looked up on the job's PATH."""
    script = tmp_path / "plain.sh"
    script.write_text('echo "done via $0" >&3\n')
    script.chmod(0o644)  # not executable: the interpreter runs it
    msg, _ = run_one(root, queues, spawn_env, "b", script=script, exec_prefix="sh")
    assert msg["status"] == f"done - via {script}"


def test_s6_3_script_without_shebang_runs_under_sh(root: Path, tmp_path: Path,
                                                   queues: list[QueueProc],
                                                   spawn_env: dict[str, str]) -> None:
    script = write_script(tmp_path / "noshebang", 'echo "done no-shebang" >&3\n')
    msg, _ = run_one(root, queues, spawn_env, "n", script=script)
    assert msg["status"] == "done - no-shebang"


def test_s6_1_5_missing_command_reports_exec_failed(root: Path, tmp_path: Path,
                                                     queues: list[QueueProc],
                                                     spawn_env: dict[str, str]) -> None:
    script = write_script(tmp_path / "x.sh", "#!/bin/sh\necho unreachable\n")
    msg, path = run_one(root, queues, spawn_env, "m", state="err", script=script,
                        exec_prefix="no-such-interpreter-rq")
    assert msg["status"].endswith(" exit 127")
    log = (path / "job" / "stdio.log").read_text()
    assert HEADER.match(log), log
    assert "RQ EXEC FAILED - no-such-interpreter-rq: not found or not executable\n" in log
    assert "unreachable" not in log


def test_spawn_job_tells_the_jobs_start_time(tmp_path: Path) -> None:
    """The start time spawn_job returns (worked out by the helper from the clock
    around the fork) is the one proc.start_time reads later (proc.json, S2.7).
    The helper says None when the clock passed a tick during the start: rare,
    so most of 40 starts must tell it."""
    told = []
    for _ in range(40):
        up_w, up_r, down_w, down_r = proc.job_pipes()
        pid, started = proc.spawn_job(["/bin/sh", "-c", "read x <&4"], cwd=str(tmp_path),
                                      env={"PATH": "/bin:/usr/bin"},
                                      stdio_log=str(tmp_path / "log"), header="h",
                                      write_fd=up_w, read_fd=down_r)
        try:
            assert proc.start_time(pid) is not None
            if started is not None:
                assert started == proc.start_time(pid)
                told.append(started)
        finally:
            os.close(up_w)
            os.close(down_r)
            os.close(down_w)  # EOF on its fd 4: the job ends
            os.waitpid(pid, 0)
            os.close(up_r)
    assert len(told) >= (30 if proc.SPAWN_HELPER else 0)


def test_helper_refuses_low_pipe_descriptors() -> None:
    """fd 3 and 4 are dup2 targets in the child: the pipe ends must not be there."""
    if not proc.SPAWN_HELPER:
        pytest.skip("rq._spawn was not built")
    from rq import _spawn
    with pytest.raises(ValueError, match=">= 10"):
        _spawn.spawn_job([b"/bin/true"], [], b"/", b"/dev/null", b"h", 3, 4, None)
    with pytest.raises(ValueError, match="null byte"):
        _spawn.spawn_job([b"/bin/tr\0ue"], [], b"/", b"/dev/null", b"h", 10, 11, None)


def test_start_time_is_psutils_create_time_and_none_for_the_gone() -> None:
    """proc.json's start_time (S4.6, S2.7) read from /proc directly: the same
    value psutil gives, None for a zombie or a pid that does not exist."""
    assert proc.start_time(os.getpid()) == psutil.Process(os.getpid()).create_time()
    assert proc.alive_with_start(os.getpid(), proc.start_time(os.getpid()))
    child = subprocess.Popen(["/bin/true"])
    wait_for(lambda: process_gone(child.pid), 10, 0.01, "the child to exit")
    assert proc.start_time(child.pid) is None  # exited, not yet reaped
    child.wait()
    assert proc.start_time(child.pid) is None
    assert not proc.alive_with_start(child.pid, 1.0)


def test_identity_from_proc_agrees_with_psutil() -> None:
    """alive, command_line and group_alive read /proc themselves (no psutil import in the
    daemons or in `rq-mgr` calls): the same answers psutil gives, for a live process with
    arguments, one whose title setproctitle replaced, a zombie and a pid that is gone."""
    me = psutil.Process(os.getpid())
    assert proc.alive(os.getpid()) and proc.command_line(os.getpid()) == " ".join(me.cmdline())
    with subprocess.Popen(
            [sys.executable, "-c", "import setproctitle, sys, time\n"
             "setproctitle.setproctitle('[rq-mgr] /some root/with spaces')\n"
             "print('ok', flush=True); sys.stdin.read()"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            start_new_session=True) as titled:
        try:
            assert titled.stdout is not None and titled.stdout.readline() == "ok\n"
            text = proc.command_line(titled.pid)
            assert text == "[rq-mgr] /some root/with spaces"
            assert text == " ".join(p for p in psutil.Process(titled.pid).cmdline() if p)
            assert proc.group_alive(titled.pid)  # its own group, led by a live process
        finally:
            titled.kill()
        wait_for(lambda: process_gone(titled.pid), 10, 0.01, "the child to die")
        # a zombie: gone for all three, though kill(pid, 0) still reaches it
        assert not proc.alive(titled.pid) and proc.command_line(titled.pid) is None
        assert not proc.group_alive(titled.pid)
    assert not proc.alive(titled.pid) and proc.command_line(titled.pid) is None
    assert not proc.group_alive(titled.pid) and not proc.alive(0)


def test_a_nul_in_the_environment_sends_the_message_to_err(root: Path, tmp_path: Path,
                                                           queues: list[QueueProc],
                                                           spawn_env: dict[str, str]) -> None:
    """A param holding NUL (valid JSON, fine for pull consumers) cannot go into
    a job's environment: that message goes to err with the reason, once, and
    the queue keeps running the others (it used to crash the queue process).
    A script-mode queue refuses such a message at create (issue 13, D10), so
    it gets there from pull mode: the queue is switched to script mode."""
    script = write_script(tmp_path / "ok.sh", '#!/bin/sh\necho "done $RQ_PARAM1" >&3\n')
    make_queue(root, "z", script=script, mode="pull")
    pulled = QueueProc(root, "z", env=spawn_env)
    bad = pulled.call("create_message", {"dest": "z", "param1": "a\u0000b"})[1]
    pulled.stop()
    make_queue(root, "z", script=script)
    q = QueueProc(root, "z", env=spawn_env)
    queues.append(q)
    q.wait_state(bad, "err")
    assert q.message(bad)["status"] == (
        "err - JOB CANNOT START - MOVING TO ERR - embedded null byte"
        + (" in envp" if spawn_env["RQ_JOB_SPAWN"] != "sh" else ""))
    good = q.call("create_message", {"dest": "z", "param1": "fine"})[1]
    q.wait_state(good, "done")
    assert q.message(good)["status"] == "done - fine"
    assert q.popen.poll() is None


def test_params_over_arg_max_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 13, D10: every param fits MAX_ARG_STRLEN, but all of them with the rest of the
    environment exceed ARG_MAX (faked small at the OS seam, as a small stack limit makes it)."""
    from rq.config import load_main_config, load_queue_config
    from rq.queue import jobs
    from rqtest import make_root
    root = make_root(tmp_path)
    make_queue(root, "z", script="/bin/true")
    main, cfg = load_main_config(str(root)), load_queue_config(str(root), "z")[0]
    base = jobs.base_env(main)
    fields = {"dest": "z", **{f"param{i}": "x" * 100_000 for i in range(1, 5)}}
    qdir = str(root / "queue" / "z")
    assert jobs.env_problem(base, main, cfg, qdir, fields) is None
    monkeypatch.setattr(os, "sysconf", lambda name: 256 * 1024)
    problem = jobs.env_problem(base, main, cfg, qdir, fields)
    assert problem is not None and re.fullmatch(
        r"params too large for a job's environment \(\d+ bytes with the rest of it, "
        r"at most 262144\)", problem), problem
