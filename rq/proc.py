"""The only code that spawns, signals and reaps processes (STYLE habit 8).

Owns: starting supervised daemons (`spawn_daemon`: new session, a lifeline
pipe whose EOF tells the child its parent is gone, a ready pipe the child
writes one line to), starting jobs (`spawn_job`: posix_spawn of a tiny /bin/sh
wrapper that puts the job's pipes on fd 3/4, changes to its directory, appends
the `RQ START` header with its own pid and execs the command; S6.1, S6.3),
signalling process groups, and process identity by start time (S2.7).

Jobs are spawned with vfork + exec, never with a fork of the Python process,
so starting a job costs the same whatever the queue process's size (PERF.md):
through the C helper rq._spawn when it was built (one exec per job), else
through posix_spawn of the /bin/sh wrapper under nice(1) (three execs: about a
millisecond more CPU per job).  RQ_JOB_SPAWN=sh in the environment chooses the
wrapper (tests run both).
"""

from __future__ import annotations

import fcntl
import functools
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from types import ModuleType

from rq.errors import RQError

# The wrapper runs as `sh -c WRAPPER rq-job DIR HEADER CMD...`.  fd 3 and 4
# arrive already in place (posix_spawn dup2), every other descriptor is
# close-on-exec.  `$$` is the job's pid: exec keeps it, so the header names the
# process that runs the script, which also leads the job's process group.
JOB_WRAPPER = (
    'cd "$1" || exit 127; shift; '
    "printf '\\n%s - %s\\n' \"$$\" \"$1\"; shift; "
    'command -v "$1" >/dev/null 2>&1 || '
    "{ printf 'RQ EXEC FAILED - %s: not found or not executable\\n' \"$1\"; exit 127; }; "
    'exec "$@"'
)
_SH = "/bin/sh"
# coreutils' nice, which the /bin/sh path runs the wrapper under: the job is at nice 19 from
# its first instruction (a setpriority() after the spawn races with a job that looks at once).
_NICE = next((p for p in ("/usr/bin/nice", "/bin/nice") if os.access(p, os.X_OK)), None)

_spawn: ModuleType | None
try:
    import rq._spawn as _spawn  # built from rq/_spawn.c when a compiler was at hand
except ImportError:  # pragma: no cover - depends on the install
    _spawn = None
if os.environ.get("RQ_JOB_SPAWN") == "sh":
    _spawn = None
SPAWN_HELPER = _spawn is not None
_FS_ENCODING, _FS_ERRORS = sys.getfilesystemencoding(), sys.getfilesystemencodeerrors()


class ForkedProcess:
    """A child of ours we did not start with Popen (the queue fork server's, handed to us
    as their subreaper, rq.queue.forkserver): Popen's `poll`/`wait` over waitpid."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # not ours after all: never wait on it for ever
                self.returncode = 255
                return self.returncode
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(str(self.pid), timeout or 0.0)
            time.sleep(0.01)  # only at a failed start-up (the web's, never forked)
        return code


@dataclass
class Daemon:
    """A supervised child: close `lifeline_w` to tell it to stop."""

    pid: int
    popen: subprocess.Popen[bytes] | ForkedProcess
    lifeline_w: int
    ready_r: int


def hold_lock(path: str, busy: str) -> int:
    """An exclusive flock on `path` (created if missing), held until the process
    exits; its descriptor.  RQError(`busy`) when another process holds it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        raise RQError(busy) from exc
    return fd


def spawn_daemon(argv: list[str], *, cwd: str, env: dict[str, str]) -> Daemon:
    """Start a daemon in its own session with a lifeline and a ready pipe.

    The child gets `--lifeline-fd N --ready-fd M` appended to `argv`.
    """
    life_r, life_w = os.pipe()
    ready_r, ready_w = os.pipe()
    try:
        popen = subprocess.Popen(
            [*argv, "--lifeline-fd", str(life_r), "--ready-fd", str(ready_w)],
            cwd=cwd, env=env, stdin=subprocess.DEVNULL, start_new_session=True,
            pass_fds=(life_r, ready_w), close_fds=True,
        )
    except BaseException:
        for fd in (life_r, life_w, ready_r, ready_w):
            os.close(fd)
        raise
    os.close(life_r)
    os.close(ready_w)
    return Daemon(popen.pid, popen, life_w, ready_r)


class ReadyPipe:
    """Child side of the ready pipe: one line (`ready` or `fatal <reason>`),
    then closed.  A parent that stopped waiting is not an error."""

    def __init__(self, fd: int | None) -> None:
        self.fd = fd

    def send(self, line: str) -> None:
        if self.fd is None:
            return
        fd, self.fd = self.fd, None
        try:
            os.write(fd, line.encode("utf-8", "replace") + b"\n")
        except OSError:
            pass  # the parent gave up waiting or is gone; the lifeline tells us too
        finally:
            os.close(fd)


def lifeline_closed(fd: int) -> bool:
    """Read the lifeline after the loop saw it readable: True at EOF (the
    supervisor is gone, S2.1).  The caller unregisters and closes it."""
    try:
        return not os.read(fd, 64)
    except OSError:
        return True


def python_argv(module: str) -> list[str]:
    """argv that runs `python -m module` under the current interpreter."""
    return [sys.executable, "-m", module]


def _high_fd(fd: int) -> int:
    """Move `fd` to a number >= 10 (close-on-exec) so dup2 onto 3/4 never clashes."""
    if fd >= 10:
        return fd
    new = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10)
    os.close(fd)
    return new


def job_pipes() -> tuple[int, int, int, int]:
    """(job_write, queue_read, queue_write, job_read): fd 3 and fd 4 pipes."""
    up_r, up_w = os.pipe()      # job -> queue (fd 3 in the job)
    down_r, down_w = os.pipe()  # queue -> job (fd 4 in the job)
    return _high_fd(up_w), _high_fd(up_r), _high_fd(down_w), _high_fd(down_r)


def spawn_job(cmd: list[str], *, cwd: str, env: dict[str, str], stdio_log: str,
              header: str, write_fd: int, read_fd: int) -> tuple[int, float | None]:
    """Spawn a job: new session, stdin /dev/null, stdout+stderr appended to
    `stdio_log`, fd 3 = `write_fd`, fd 4 = `read_fd`, cwd `cwd`, nice 19.

    `header` is the text after `<pid> - ` in the RQ START line.  Returns the pid
    (which is also the job's process group id) and its start_time() when the
    helper could tell it (from the clock just before the fork and at the child's
    first step, when both fall in one clock tick: all but a few starts in a
    thousand; reading /proc here after the spawn waits ~0.25 ms for the exec to
    finish), else None.
    """
    if _spawn is not None:
        path = env.get("PATH")
        pid, ticks = _spawn.spawn_job(
            [os.fsencode(a) for a in cmd],
            [f"{k}={v}".encode(_FS_ENCODING, _FS_ERRORS) for k, v in env.items()],  # = fsencode
            os.fsencode(cwd), os.fsencode(stdio_log), os.fsencode(header),
            write_fd, read_fd, None if path is None else os.fsencode(path))
        return pid, None if ticks is None else _start_from_ticks(ticks)
    actions = [
        (os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDONLY, 0),
        (os.POSIX_SPAWN_OPEN, 1, stdio_log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644),
        (os.POSIX_SPAWN_DUP2, 1, 2),
        (os.POSIX_SPAWN_DUP2, write_fd, 3),
        (os.POSIX_SPAWN_DUP2, read_fd, 4),
    ]
    argv = [_SH, "-c", JOB_WRAPPER, "rq-job", cwd, header, *cmd]
    if _NICE is not None:
        argv = [_NICE, "-n", "19", *argv]  # S6.3 nice 19 (clamped at 19); exec keeps it
    # Python ignores SIGPIPE and SIGXFSZ; a job gets the default dispositions back.
    pid = os.posix_spawn(argv[0], argv, env, file_actions=actions, setsid=True,
                         setsigdef=(signal.SIGPIPE, signal.SIGXFSZ))
    if _NICE is None:
        try:
            os.setpriority(os.PRIO_PROCESS, pid, 19)  # S6.3 nice 19; exec keeps it
        except OSError:
            pass
    return pid, None


def spawn_detached(argv: list[str], *, cwd: str, env: dict[str, str], ready_w: int,
                   ready_fd: int = 3) -> int:
    """Start a fully detached daemon (`rq-mgr start`): own session, stdio on
    /dev/null, cwd `cwd`, the pipe end `ready_w` as its fd `ready_fd`.

    posix_spawn cannot change directory, so a /bin/sh trampoline does the
    `cd` and execs the daemon; its pid stays the daemon's pid.
    """
    high = _high_fd(os.dup(ready_w))  # >= 10, so the dup2 onto ready_fd clears CLOEXEC
    actions = [
        (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
        (os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0),
        (os.POSIX_SPAWN_DUP2, 1, 2),
        (os.POSIX_SPAWN_DUP2, high, ready_fd),
    ]
    trampoline = [_SH, "-c", 'cd "$1" || exit 1; shift; exec "$@"', "rq-detached", cwd, *argv]
    try:
        return os.posix_spawn(_SH, trampoline, env, file_actions=actions, setsid=True)
    finally:
        os.close(high)


def signal_group(pgid: int, sig: int) -> bool:
    """Send `sig` to process group `pgid`; False when no member remains.
    A pgid of 0 or 1 would mean our own group or every process: refused."""
    if pgid <= 1:
        return False
    try:
        os.killpg(pgid, sig)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return False


def group_alive(pgid: int) -> bool:
    """True while process group `pgid` has a member that is not a zombie."""
    if pgid <= 1:
        return False
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    # kill() also "reaches" zombies: orphaned members that died are reparented to
    # an init that may never reap them (containers), so look for a live member.
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _stat(int(entry))
            if fields is not None and fields[2] == b"%d" % pgid:  # field 5, pgrp
                return True
    return False


# Process identity from /proc directly, not through psutil: importing psutil costs ~30 ms of
# CPU, paid by every daemon and every `rq-mgr` call that only wanted these few fields.
def _stat(pid: int) -> list[bytes] | None:
    """The fields of /proc/PID/stat after the command name (fields[0] is field 3, the
    state); None when the process is gone or a zombie (an orphaned zombie under a container
    init that never reaps must count as gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            fields = fh.read().rpartition(b")")[2].split()
    except OSError:
        return None
    if len(fields) < 20 or fields[0] in (b"Z", b"X"):
        return None
    return fields


def alive(pid: int) -> bool:
    """True while `pid` exists and is not a zombie."""
    return pid > 0 and _stat(pid) is not None


def command_line(pid: int) -> str | None:
    """The command line of a live process, its arguments joined by spaces (a title set with
    setproctitle reads as it was set); None when it is gone, a zombie or unreadable."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            raw = fh.read()
    except OSError:
        return None
    if not alive(pid):
        return None
    parts = [part for part in raw.split(b"\0") if part]
    return b" ".join(parts).decode("utf-8", "surrogateescape")


_CLK_TCK = os.sysconf("SC_CLK_TCK")


def start_time(pid: int) -> float | None:
    """The process's start time (opaque but stable), or None if it is gone.

    The value psutil's create_time() gives: boot time + the start ticks of
    /proc/PID/stat."""
    fields = _stat(pid)
    if fields is None:
        return None
    try:
        ticks = int(fields[19])  # field 22, starttime
    except ValueError:
        return None
    return _start_from_ticks(ticks)


def _start_from_ticks(ticks: int) -> float:
    return _boot_time() + ticks / _CLK_TCK


@functools.cache
def _boot_time() -> float:
    """The `btime` line of /proc/stat (seconds since the epoch), read once."""
    with open("/proc/stat", "rb") as fh:
        for line in fh:
            if line.startswith(b"btime "):
                return float(line.split()[1])
    raise OSError("no btime line in /proc/stat")


def find_job_leader(job_dir: str) -> int | None:
    """A job started in `job_dir` that still runs, found without its pid: a session leader
    (every job is one, S6.3) whose environment names `job_dir` as RQ_MSG_DIR (S6.2).  For a
    recovery that finds no proc.json: its queue process was killed between the job's spawn
    and that write (S2.7).  A job that replaced its environment is not found."""
    want = f"RQ_MSG_DIR={job_dir}".encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        try:
            if os.getsid(pid) != pid:
                continue
            with open(f"/proc/{pid}/environ", "rb") as fh:
                env = fh.read().split(b"\0")
        except OSError:
            continue
        if want in env and start_time(pid) is not None:
            return pid
    return None


def alive_with_start(pid: int, start: float | None) -> bool:
    """True only if `pid` runs and started at `start` (guards against pid reuse)."""
    if not isinstance(pid, int) or pid <= 1 or start is None:
        return False
    now = start_time(pid)
    return now is not None and abs(now - float(start)) < 0.05


def reap_any() -> list[tuple[int, int, bool]]:
    """Reap every exited child: [(pid, returncode, core_dumped)], returncode as
    subprocess's (negative = killed by that signal)."""
    done: list[tuple[int, int, bool]] = []
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return done
        if pid == 0:
            return done
        core = os.WIFSIGNALED(status) and os.WCOREDUMP(status)
        done.append((pid, os.waitstatus_to_exitcode(status), core))


def fork_adopted(keeps: list[list[int]]) -> tuple[int, int] | int:
    """Fork processes that our parent, a child subreaper, adopts (rq.queue.forkserver):
    one middle process forks one new process per entry of `keeps`, writing a line
    `INDEX PID` (or `INDEX -ERRNO`) for each to a pipe, then exits.  In new process i this
    returns i (its own session; fds 0-2 and keeps[i] only, as `close_fds=True`); here it
    returns (the middle's pid, the pipe's read end).  Wait for the middle before telling
    the parent any pid: its exit is what hands the new processes over.  The middles of
    several batches fork in parallel, each with its own share of the CPU."""
    pipe_r, pipe_w = os.pipe()
    try:
        middle = os.fork()
    except OSError:
        os.close(pipe_r)
        os.close(pipe_w)
        raise
    if middle:
        os.close(pipe_w)
        return middle, pipe_r
    os.close(pipe_r)  # the middle process: fork each, report, exit
    for i, keep in enumerate(keeps):
        try:
            pid = os.fork()
        except OSError as exc:
            pid = -(exc.errno or 1)
        if pid == 0:
            os.setsid()
            keep_only([0, 1, 2, *keep])
            return i
        os.write(pipe_w, f"{i} {pid}\n".encode())
    os._exit(0)


def keep_only(fds: list[int]) -> None:
    """Close every descriptor but `fds` (as `close_fds=True` of a spawn does)."""
    last = 0
    for fd in sorted(set(fds)):
        if fd > last:  # closerange(n, n) closes from n upwards on Python 3.11
            os.closerange(last, fd)
        last = fd + 1
    os.closerange(last, os.sysconf("SC_OPEN_MAX"))


PR_SET_CHILD_SUBREAPER = 36  # <linux/prctl.h>


def become_subreaper() -> bool:
    """Adopt our descendants' orphans (Linux prctl PR_SET_CHILD_SUBREAPER): the queue
    processes forked by the fork server become our children.  False where unsupported."""
    import ctypes  # only rq-mgr needs it

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def release_free_memory() -> None:
    """Give the C heap's free pages back to the kernel (glibc malloc_trim): after a start
    that built and dropped large tables (a million-entry que/ index), the freed memory would
    otherwise stay in the process's RSS.  Nothing where there is no malloc_trim."""
    import ctypes

    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass


def reap_orphans(known: set[int]) -> list[tuple[int, int]]:
    """As a subreaper we also inherit orphans that are none of our children (a job
    whose queue process was killed, S6.8): reap those that exited, [(pid, returncode)].
    waitid(WNOWAIT) looks without reaping, so a child in `known` is left to its poll()."""
    done: list[tuple[int, int]] = []
    while True:
        try:
            info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return done
        if info is None or info.si_pid in known:
            return done
        _, status = os.waitpid(info.si_pid, 0)
        done.append((info.si_pid, os.waitstatus_to_exitcode(status)))


def kill_process(pid: int, sig: int = signal.SIGKILL) -> bool:
    try:
        os.kill(pid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def spawn_filter(command: str, stdin_path: str, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """`rq pop --exec COMMAND` (issue 18): `/bin/sh -c COMMAND` reading the
    message body from `stdin_path`, writing to our stdout, its stderr a pipe
    the caller reads.  It stays in our process group, so a Ctrl-C or a killed
    pipeline reaches it as it would any command of the shell line."""
    with open(stdin_path, "rb") as body:
        return subprocess.Popen(["/bin/sh", "-c", command], stdin=body,
                                stderr=subprocess.PIPE, env=env, close_fds=True)
