"""The `rq-mgr` command (SPEC S21): start|stop|restart|reload|run|status.

Owns: argument parsing (`--root` anywhere, S1.2; `-t`/`--ontop`), the exact
S21 texts and exit codes, starting the daemon detached and waiting for its
ready line, and the forceful stop when a manager will not exit.  The grammar
is six words, so it is parsed by hand rather than with click: click's own
usage errors and exit status 2 would break S21's texts.

Only `run` imports the daemon (rq.mgr.daemon: the supervisor and everything it serves):
`start` spawns `python -m rq.mgr`, and `stop` signals it, without paying for those imports
twice per start and stop of a root (issue 14 section 4).

`start` checks the config and the pid file itself first, so the common
failures are reported with their exact text without spawning anything; the
daemon repeats both checks (another `start` may race us) and reports what it
finds on its ready pipe: `ready`, or `fatal <ERROR line>`.
"""

from __future__ import annotations

import os
import select
import signal
import sys
import time

from rq.errors import ConfigError, RQError
from rq.mgr import pidfile, queuedirs
from rq.proc import alive, kill_process, signal_group, spawn_detached
from rq.root import find_root

USAGE = "usage: rq-mgr [--root PATH] start|stop|restart|reload|run|status"
COMMANDS = ("start", "stop", "restart", "reload", "run", "status")
START_TIMEOUT = 30.0
START_PER_QUEUE = 0.05  # issue 17: 1,000 queues on a loaded host may need more than 30 s
STOP_BASE = 20.0      # S21: 20 s plus the largest kill_grace before SIGKILL
POLL = 0.05
# Runs the daemon from the root (S1.2) without a fork of this process.
READY_FD = 3


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command, ontop = parse(argv)
    if command is None:
        print(USAGE, file=sys.stderr)
        return 1
    try:
        root, _ = find_root("rq-mgr", argv, os.environ)
        return RUNNERS[command](root, ontop)
    except RQError as exc:
        print(exc, file=sys.stderr)
        return exc.exit_code


def parse(argv: list[str]) -> tuple[str | None, bool]:
    """(command or None for a usage error, ontop); `--root` is find_root's."""
    words, ontop = [], False
    args = iter(argv)
    for arg in args:
        if arg in ("-t", "--ontop"):
            ontop = True
        elif arg == "--root":
            next(args, None)
        elif not arg.startswith("--root="):
            words.append(arg)
    if len(words) != 1 or words[0] not in COMMANDS:
        return None, ontop
    return words[0], ontop


# ---------------------------------------------------------------- commands


def cmd_status(root: str, ontop: bool) -> int:
    pid = pidfile.running_pid(root)
    if pid is None:
        print("queuemgr: not running")
        return 3
    print(f"queuemgr: running [pid {pid}]")
    return 0


def cmd_reload(root: str, ontop: bool) -> int:
    pid = pidfile.running_pid(root)
    if pid is None:
        print("queuemgr: not running", file=sys.stderr)
        return 1
    kill_process(pid, signal.SIGHUP)
    print(f"queuemgr: reloading process with pid {pid}")
    return 0


def cmd_stop(root: str, ontop: bool) -> int:
    pid = pidfile.running_pid(root)
    if pid is None:
        print("queuemgr: not running")
        return 0
    stop_manager(root, pid)
    return 0


def cmd_run(root: str, ontop: bool) -> int:
    from rq.mgr.daemon import run_daemon
    return run_daemon(root, stderr_log=True)


def cmd_start(root: str, ontop: bool) -> int:
    if ontop:
        return cmd_run(root, ontop)
    from rq.config import load_main_config
    try:
        load_main_config(root)
    except ConfigError as exc:
        print(f"ERROR: bad config file config/config.json: {exc}", file=sys.stderr)
        return 1
    if pidfile.running_pid(root) is not None:
        print(pidfile.ALREADY_RUNNING, file=sys.stderr)
        return 1
    return start_detached(root)


def cmd_restart(root: str, ontop: bool) -> int:
    pid = pidfile.running_pid(root)
    if pid is not None:
        stop_manager(root, pid)
    return cmd_start(root, ontop)


RUNNERS = {"status": cmd_status, "reload": cmd_reload, "stop": cmd_stop, "run": cmd_run,
           "start": cmd_start, "restart": cmd_restart}


# ---------------------------------------------------------------- start


def start_detached(root: str) -> int:
    """Spawn `python -m rq.mgr` in its own session with stdio on /dev/null and
    wait up to 30 s (and 50 ms more per queue) for its ready line."""
    timeout = START_TIMEOUT + START_PER_QUEUE * len(queuedirs.scan(root))
    read_fd, write_fd = os.pipe()
    argv = [sys.executable, "-m", "rq.mgr", "--root", root, "--ready-fd", str(READY_FD)]
    try:
        pid = spawn_detached(argv, cwd=root, env=dict(os.environ), ready_w=write_fd,
                             ready_fd=READY_FD)
    finally:
        os.close(write_fd)
    try:
        line = read_ready_line(read_fd, time.monotonic() + timeout)
    finally:
        os.close(read_fd)
    if line == "ready":
        return 0
    if line is None:
        print(f"ERROR: rq-mgr did not become ready within {timeout:.0f} seconds, see "
              "log/queuemgr.log", file=sys.stderr)
        return 1
    reap_soon(pid)
    if line.startswith("fatal "):
        print(line[len("fatal "):], file=sys.stderr)
    else:
        print("ERROR: rq-mgr exited during start-up, see log/queuemgr.log", file=sys.stderr)
    return 1


def read_ready_line(fd: int, deadline: float) -> str | None:
    """The first line on `fd`; "" at EOF without one; None at the deadline."""
    buf = b""
    while b"\n" not in buf:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return None
        readable, _, _ = select.select([fd], [], [], remaining)
        if not readable:
            continue
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        buf += chunk
    return buf.split(b"\n", 1)[0].decode("utf-8", "replace")


def reap_soon(pid: int, timeout: float = 2.0) -> None:
    """Collect a daemon that failed to start, so no zombie is left behind."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return
        if done:
            return
        time.sleep(POLL)


# ---------------------------------------------------------------- stop


def stop_manager(root: str, pid: int) -> None:
    """S21 stop: SIGTERM and wait; after 20 s + the largest kill_grace,
    SIGKILL everything the manager ran and remove its files."""
    print(f"queuemgr: trying to stop process with pid {pid}...", flush=True)
    kill_process(pid, signal.SIGTERM)
    if wait_gone(pid, STOP_BASE + queuedirs.max_kill_grace(root)):
        return
    print(f"queuemgr: process with pid {pid} won't stop, we forcefully kill it...", flush=True)
    force_kill(root, pid)


def wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while alive(pid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(POLL)
    return True


def force_kill(root: str, pid: int) -> None:
    """SIGKILL the manager, its daemons and every recorded job process group."""
    import psutil

    from rq.client import mgr_socket
    try:
        daemons = [p.pid for p in psutil.Process(pid).children()]
    except psutil.Error:
        daemons = []
    kill_process(pid, signal.SIGKILL)
    qdirs = [os.path.join(root, "queue", name) for name in queuedirs.names(root)]
    daemons += [p for p in map(queuedirs.queue_process, qdirs) if p is not None]
    for child in set(daemons):  # first, so no queue starts another job
        kill_process(child, signal.SIGKILL)
    for qdir in qdirs:
        for pgid in queuedirs.job_groups(qdir):
            signal_group(pgid, signal.SIGKILL)
    wait_gone(pid, 5.0)
    pidfile.remove_pid(root)
    try:
        os.unlink(mgr_socket(root))
    except FileNotFoundError:
        pass
