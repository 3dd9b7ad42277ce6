"""Jobs of a queue process: how a job is described, started and judged.

Owns the `Job` record (one running execution of the queue script), the
script check (S6.1.1), the job command line (S6.1.3) and environment (S6.2),
`spawn`, which starts one through `rq.proc` with its pipes (S6.3), and
`decide`, the pure function that turns a finished job into its next state and
status text (S6.6, S6.7, S2.5, S5.4).  Moving the message is QueueState's
business; when to spawn and reap is the queue process's.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any

from rq import __version__, proc, protocol
from rq.config import MainConfig, QueueConfig
from rq.protocol import LineBuffer

SHELL_CHARS = set("*?{}[]<>()~&|\\$;'`\"#=%\n")


@dataclass
class Job:
    msg_id: str
    path: str                       # run/ID
    fields: dict[str, Any]          # the stored msg fields (count kept current)
    pid: int = 0
    up_r: int = -1                  # job -> queue pipe (our read end)
    down_w: int = -1                # queue -> job pipe (our write end)
    buffer: LineBuffer = field(default_factory=LineBuffer)
    status: str | None = None       # live status text
    status_on_disk: str | None = None  # what the status file holds (skip rewriting it)
    completion: str | None = None   # done, err, relayed, resend
    resend_secs: int = 0
    started_mono: float = 0.0
    started_wall: float = 0.0
    deadline: float | None = None   # monotonic time of the S6.7 timeout
    timeout_text: str = ""
    timed_out: bool = False
    kill_at: float | None = None    # monotonic time for SIGKILL of the group
    exited: tuple[int, bool] | None = None  # (returncode, core dumped)
    exit_wall: float = 0.0
    dups: list[str] = field(default_factory=list)
    real: str = ""                  # the script's real path, resolved at start
    argv: list[str] = field(default_factory=list)  # its command line (S6.1.3), idem
    kill_pending: bool = False      # destroy arrived before the spawn
    outcome: Outcome | None = None            # decided at exit (kept for retries)
    sync_dirs: list[str] | None = None        # set once the final rename is done
    retry_at: float = 0.0           # finishing failed: monotonic time of the next try
    retry_delay: float = 0.0        # and the wait before it (rq.queue.retry)

    def block_key(self, params: tuple[int, ...]) -> tuple[str, ...]:
        return param_key(self.fields, params)


def param_key(fields: dict[str, Any], params: tuple[int, ...]) -> tuple[str, ...]:
    """The tuple of params S5.2/S5.3 compare (absent = "")."""
    return tuple(str(fields.get(f"param{i}") or "") for i in params)


def check_script(root: str, script: str | None, exec_prefix: str) -> tuple[str, str | None]:
    """(real path, error reason or None) for the configured script (S6.1.1)."""
    if not script:
        return "", "script not found: "
    path = script if os.path.isabs(script) else os.path.join(root, script)
    real = os.path.realpath(path)
    if not os.path.exists(real):
        return real, f"script not found: {real}"
    if not os.path.isfile(real):
        return real, f"script is not a regular file: {real}"
    if not exec_prefix.strip() and not os.access(real, os.X_OK):
        return real, f"script not executable: {real}"
    return real, None


def _file_key(path: str) -> tuple[int, ...] | None:
    """What identifies the file `path` names and its permissions (stat and lstat)."""
    try:
        st, lst = os.stat(path), os.lstat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_mode, st.st_uid, st.st_gid, st.st_mtime_ns,
            st.st_ctime_ns, lst.st_ino, lst.st_ctime_ns)


class ScriptCheck:
    """check_script and job_command of a queue's script, done again only when
    the script's file (or its #! interpreter's) changed: same inode, mode,
    owner, mtime and ctime, for the path and for the link it may be (issue 15:
    realpath, the checks and reading the #! line were ~20 system calls per
    job; the revalidation is 2-4).  A script that fails a check is never
    remembered, so an error is looked at afresh at every start (S6.1.1)."""

    def __init__(self) -> None:
        self._key: tuple[Any, ...] | None = None
        self._result: tuple[str, list[str]] = ("", [])
        self._interp = ""

    def check(self, root: str, script: str | None,
              exec_prefix: str) -> tuple[str, str | None, list[str]]:
        """(real path, error reason or None, job argv) for the configured script."""
        path = (script if os.path.isabs(script) else os.path.join(root, script)) if script else ""
        key = (path, exec_prefix, _file_key(path) if path else None,
               _file_key(self._interp) if self._interp else None)
        if key == self._key:
            return self._result[0], None, self._result[1]
        self._key = None
        real, reason = check_script(root, script, exec_prefix)
        if reason:
            return real, reason, []
        argv = job_command(exec_prefix, real)
        self._interp = interpreter_path(real) if not exec_prefix.strip() else ""
        self._key = (path, exec_prefix, _file_key(path),
                     _file_key(self._interp) if self._interp else None)
        self._result = (real, argv)
        return real, None, argv


def interpreter_path(real: str) -> str:
    """The #! interpreter of the script `real` ("" when none)."""
    try:
        with open(real, "rb") as fh:
            head = fh.read(256)
    except OSError:
        return ""
    words = head[2:].split(b"\n", 1)[0].split() if head.startswith(b"#!") else []
    return os.fsdecode(words[0]) if words else ""


def job_command(exec_prefix: str, real: str) -> list[str]:
    """argv of the job (S6.1.3)."""
    prefix = exec_prefix.strip()
    if not prefix:
        problem = interpreter_problem(real)
        if problem:  # exec would fail: say so in stdio.log and exit 127 (S6.1.5)
            return ["/bin/sh", "-c", 'printf "RQ EXEC FAILED - %s\\n" "$1"; exit 127',
                    "rq-exec-failed", problem]
        return [real]
    line = f"{prefix} {real}"
    if any(c in SHELL_CHARS for c in line):
        return ["/bin/sh", "-c", line]
    return line.split()


def interpreter_problem(real: str) -> str | None:
    """Why exec of a `#!` script would fail (a missing or unusable
    interpreter), or None.  The shell's own message would not be S6.1.5's."""
    try:
        with open(real, "rb") as fh:
            head = fh.read(256)
    except OSError as exc:
        return f"{real}: {exc.strerror}"
    if not head.startswith(b"#!"):
        return None
    words = head[2:].split(b"\n", 1)[0].split()
    if not words:
        return f"{real}: empty #! line"
    interp = words[0].decode("utf-8", "replace")
    if not os.path.isfile(interp) or not os.access(interp, os.X_OK):
        return f"{real}: interpreter {interp} not found or not executable"
    return None


def base_env(main: MainConfig) -> dict[str, str]:
    """The part of the job environment that is the same for every job (S6.2)."""
    env = dict(os.environ)
    for key in [k for k in env if k.startswith("RQ_")]:
        del env[key]
    for key in ("RQ_FS_FAULTS",):
        env.pop(key, None)
    env.update({
        "RQ_VER": __version__, "RQ_ENV": main.env, "RQ_ROOT": main.root,
        "RQ_PORT": str(main.port), "RQ_HOST": main.base_url,
        "RQ_WRITE": "3", "RQ_READ": "4", "RQ_PIPE": "3",
    })
    if main.tmpdir:
        env["TMPDIR"] = main.tmpdir
    return env


def job_env(base: dict[str, str], main: MainConfig, cfg: QueueConfig, real: str,
            fields: dict[str, Any], msg_id: str, job_dir: str) -> dict[str, str]:
    env = dict(base)
    dest = str(fields.get("dest", ""))
    rq_dest, rq_dest_queue = protocol.resolve_dest(dest, main.host_port, main.relative_root)
    full = protocol.full_id(main.base_url, cfg.name, msg_id)
    env.update({
        "RQ_SCRIPT": cfg.script or "", "RQ_REALSCRIPT": real,
        "RQ_DEST": rq_dest, "RQ_DEST_QUEUE": rq_dest_queue,
        "RQ_MSG_ID": msg_id, "RQ_FULL_MSG_ID": full, "RQ_MSG_DIR": job_dir,
        "RQ_COUNT": str(fields.get("count", 0)),
        "RQ_ORIG_MSG_ID": str(fields.get("orig_msg_id") or full),
    })
    for i in range(1, 5):
        env[f"RQ_PARAM{i}"] = str(fields.get(f"param{i}") or "")
    if fields.get("force_remote"):
        env["RQ_FORCE_REMOTE"] = "1"
    for key, value in cfg.env_vars.items():
        if not key.startswith("RQ_"):  # env_vars never override RQ_* (S6.2)
            env[key] = str(value)
    return env


# Linux limits on what execve takes (issue 13, D10): one "NAME=value" string of
# the environment is at most MAX_ARG_STRLEN bytes with its NUL, and all of argv
# and the environment (strings, NULs and one pointer each) at most ARG_MAX.
MAX_ENV_STRING = 131072
ENV_FIELDS = {"RQ_PARAM1": "param1", "RQ_PARAM2": "param2", "RQ_PARAM3": "param3",
              "RQ_PARAM4": "param4", "RQ_DEST": "dest", "RQ_DEST_QUEUE": "dest",
              "RQ_ORIG_MSG_ID": "orig_msg_id"}
_SMALL = 4096  # fields this short (and NUL-free) always fit: no environment is built


def env_problem(base: dict[str, str], main: MainConfig, cfg: QueueConfig, qdir: str,
                fields: dict[str, Any]) -> str | None:
    """Why a message with `fields` could never start as a job of this queue (its
    S6.2 environment cannot hold them), or None.  Checked when it is created,
    in script mode only: a pull consumer gets the fields over a socket (S8.2)."""
    values = [str(fields.get(f) or "") for f in set(ENV_FIELDS.values())]
    if all(len(v) <= _SMALL and "\0" not in v for v in values):
        return None
    msg_id = "00000000.0000.00.000.0000000000"
    real = os.path.realpath(os.path.join(main.root, cfg.script or ""))
    job_dir = os.path.join(qdir, "run", msg_id, "job")
    env = job_env(base, main, cfg, real, fields, msg_id, job_dir)
    for name, field_name in ENV_FIELDS.items():
        value = env[name]
        size = len(name.encode()) + 1 + len(value.encode("utf-8", "surrogatepass")) + 1
        if "\0" in value:
            return f"{field_name} holds a NUL character, which a job's environment cannot carry"
        if size > MAX_ENV_STRING:
            room = MAX_ENV_STRING - len(name) - 2
            return (f"{field_name} too large for a job's environment "
                    f"({size - len(name) - 2} bytes, at most {room})")
    argv = [cfg.exec_prefix, real, real, "/bin/sh -c"]  # an upper bound of job_command
    total = sum(len(k.encode("utf-8", "surrogatepass")) + len(v.encode("utf-8", "surrogatepass"))
                + 2 + 8 for k, v in env.items()) + sum(len(a.encode()) + 1 + 8 for a in argv)
    limit = os.sysconf("SC_ARG_MAX")
    if total > limit:
        return (f"params too large for a job's environment ({total} bytes with the rest of "
                f"it, at most {limit})")
    return None


def spawn(job: Job, base: dict[str, str], main: MainConfig, cfg: QueueConfig) -> dict[str, Any]:
    """Start the queue script for `job` in its own session with the S6.3 pipes
    (fd 3 to us, fd 4 from us); fills in the job's pid, pipe ends, start
    times and deadline, and returns its `proc.json` record.  Raises OSError
    (could not start: retry) or ValueError (its environment cannot hold its
    params: it never can)."""
    job_dir = os.path.join(job.path, "job")
    env = job_env(base, main, cfg, job.real, job.fields, job.msg_id, job_dir)
    up_w, up_r, down_w, down_r = proc.job_pipes()
    try:
        job.pid, started = proc.spawn_job(
            job.argv or job_command(cfg.exec_prefix, job.real), cwd=job_dir, env=env,
            stdio_log=os.path.join(job_dir, "stdio.log"), header=header_text(job.real),
            write_fd=up_w, read_fd=down_r)
    except BaseException:
        for fd in (up_w, up_r, down_w, down_r):
            os.close(fd)
        raise
    os.close(up_w)
    os.close(down_r)
    os.set_blocking(up_r, False)
    job.up_r, job.down_w = up_r, down_w
    job.started_mono, job.started_wall = time.monotonic(), time.time()
    if cfg.timeout:
        job.deadline = job.started_mono + cfg.timeout
        job.timeout_text = (f"JOB TIMED OUT AFTER {format_seconds(cfg.timeout)} "
                            "SECONDS - MOVING TO ERR")
    return {"pid": job.pid, "pgid": job.pid,
            "start_time": proc.start_time(job.pid) if started is None else started,
            "started": round(job.started_wall, 3)}


def header_text(real: str, now: float | None = None) -> str:
    """The part of the RQ START line after `<pid> - ` (S6.3)."""
    stamp = time.strftime("%Y-%m-%d %H:%M:%S %z", time.localtime(now))
    return f"{stamp} - RQ START - {real}"


def format_seconds(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


@dataclass(frozen=True)
class Outcome:
    state: str                    # done, relayed, err or que
    status: str | None            # the status text to record
    due_delay: float | None = None  # for que: seconds after the exit


def decide(job: Job, *, stopping: bool) -> Outcome:
    """The next state of a job whose process has exited (S6.6 and its exceptions)."""
    assert job.exited is not None
    code, core = job.exited
    if job.timed_out:
        return Outcome("err", job.timeout_text)
    if stopping and job.completion is None:
        return Outcome("que", "QUEUE SHUTDOWN - MOVING TO QUE", 0.0)
    honour = stopping  # a completion sent before our stop signal is honoured (S2.5)
    if code != 0 and job.completion != "err" and not honour:
        completion = job.completion or ""
        return Outcome("err", "PROCESS EXITED IMPROPERLY - MOVING TO ERR - Completion was "
                       f"{completion} but exit status was "
                       f"{protocol.exit_text(job.pid, code, core)}")
    if job.completion in ("done", "relayed", "err"):
        return Outcome(job.completion, job.status)
    if job.completion == "resend":
        if int(job.fields.get("count", 0)) >= int(job.fields.get("max_count", 15)):
            return Outcome("err", "HIT MAX RESEND COUNT - MOVING TO ERR")
        return Outcome("que", job.status, float(job.resend_secs))
    return Outcome("err", job.status)
