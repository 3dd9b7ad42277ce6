"""Shared test helpers: real roots in temp directories, real daemon processes,
and waiting on conditions with deadlines (never fixed sleeps)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from rq import client

REPO = Path(__file__).resolve().parent.parent
STATES = ("prep", "que", "run", "done", "relayed", "err")


def wait_for(cond: Callable[[], Any], timeout: float = 15.0, interval: float = 0.05,
             what: str = "condition") -> Any:
    """Poll `cond` until it returns a truthy value; fail after `timeout` seconds.  The
    pause between polls starts at 2 ms and grows by half each time up to `interval`: a
    quick condition is seen at once, a long wait costs few polls (each poll is CPU of the
    test and of the daemon it asks, and the suite is CPU-bound: issue 14 section 4)."""
    deadline = time.monotonic() + timeout
    pause = min(0.002, interval)
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(pause)
        pause = min(pause * 1.5, interval)


PathT = TypeVar("PathT", str, Path)


def write_root(path: PathT, config: Any, *dirs: str) -> PathT:
    """A root at `path` (returned as given): config/config.json holding `config` (a str as
    it is, anything else as JSON) and the directories `dirs` below it."""
    for d in ("config", *dirs):
        os.makedirs(os.path.join(path, d), exist_ok=True)
    text = config if isinstance(config, str) else json.dumps(config)
    with open(os.path.join(path, "config", "config.json"), "w") as fh:
        fh.write(text)
    return path


def make_root(base: Path, *, port: int = 3333, **extra: Any) -> Path:
    """The root `base`/rqroot with every directory of a real one and a test main config."""
    cfg = {"env": "test", "host": "127.0.0.1", "port": port, "addr": "127.0.0.1", **extra}
    return write_root(base / "rqroot", cfg, "queue", "scandir", "timers", "log/events")


def write_script(path: Path, body: str) -> Path:
    path.write_text(body)
    path.chmod(0o755)
    return path


def make_queue(root: Path, name: str, script: str | Path | None = None, **cfg: Any) -> Path:
    qdir = root / "queue" / name
    for s in STATES:
        (qdir / s).mkdir(parents=True, exist_ok=True)
    conf = {"name": name, "exec_prefix": "", **cfg}
    if script is not None:
        conf["script"] = str(script)
    (qdir / "config.json").write_text(json.dumps(conf))
    return qdir


class QueueProc:
    """A real queue process started by hand (`python -m rq.queue`)."""

    def __init__(self, root: Path, name: str, env: dict[str, str] | None = None) -> None:
        self.root, self.name = root, name
        full_env = dict(os.environ, **(env or {}))
        full_env["PYTHONPATH"] = str(REPO)
        self.log = open(root / "log" / f"{name}.stderr", "ab")
        self.popen = subprocess.Popen(
            [sys.executable, "-m", "rq.queue", "--root", str(root), "--name", name],
            cwd=str(root), env=full_env, stdout=self.log, stderr=self.log,
            start_new_session=True)
        wait_for(self.ping, 20, what=f"queue {name} to answer ping")

    def ping(self) -> bool:
        if self.popen.poll() is not None:
            raise AssertionError(f"queue process exited with {self.popen.returncode}")
        try:
            return self.call("ping") == ["pong"]
        except Exception:
            return False

    def call(self, cmd: str, arg: Any = None, **kw: Any) -> Any:
        return client.call_queue(str(self.root), self.name, cmd, arg, **kw)

    def stop(self, timeout: float = 30) -> int:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        self.log.close()
        return self.popen.returncode

    def kill(self) -> None:
        if self.popen.poll() is None:
            os.killpg(self.popen.pid, signal.SIGKILL)
            self.popen.wait(10)
        self.log.close()

    def counts(self) -> dict[str, int]:
        return self.call("num_messages")

    def state(self, full_id: str) -> str | None:
        reply = self.call("get_message_state", {"msg_id": full_id})
        return reply[1] if reply[0] == "ok" else None

    def wait_state(self, full_id: str, state: str, timeout: float = 10) -> None:
        wait_for(lambda: self.state(full_id) == state, timeout,
                 what=f"{full_id} to reach {state}")

    def message(self, full_id: str) -> dict[str, Any]:
        reply = self.call("get_message", {"msg_id": full_id})
        assert reply[0] == "ok", reply
        return reply[1]


def interrupt(proc: subprocess.Popen[str]) -> tuple[str, str]:
    """SIGINT, as a user's Ctrl-C, and what the watcher (`rq watch`) printed.  One that does
    not stop is killed (never left running into the next test) and the failure says where
    each of its threads was and what became of the signal (caught, ignored, pending), or,
    when it did exit, that another process still held its output pipes open."""
    proc.send_signal(signal.SIGINT)
    try:
        return proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        where = watcher_state(proc.pid) if proc.poll() is None else \
            [f"exited {proc.returncode}, its stdout/stderr still open in another process"]
        proc.kill()
        try:
            out, err = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            out = err = "(pipes held open)"
        raise AssertionError(f"rq watch did not end within 30 s of SIGINT ({where}); "
                             f"stdout {out!r} stderr {err!r}") from None


def watcher_state(pid: int) -> list[str]:
    """Each thread's wait channel and state, and the signal masks, of process `pid`."""
    base = Path(f"/proc/{pid}")
    try:
        where = [f"{t.name}: {(t / 'wchan').read_text(errors='replace')} "
                 f"{(t / 'stat').read_text(errors='replace').strip()}"
                 for t in sorted((base / "task").iterdir())]
        return where + [line for line in (base / "status").read_text().splitlines()
                        if line.startswith(("SigPnd", "ShdPnd", "SigBlk", "SigIgn", "SigCgt"))]
    except OSError as exc:
        return [f"/proc/{pid} unreadable: {exc}"]


def read_events(root: Path, queue: str | None = None) -> list[dict[str, Any]]:
    from rq.events import decode_line
    out = []
    base = root / "log" / "events"
    for day in sorted(base.glob("*")):
        for f in sorted(day.glob("*.jsonl")):
            if queue is not None and f.stem != queue:
                continue
            with open(f, "rb") as fh:
                for line in fh:
                    ev = decode_line(line)
                    if ev is not None:
                        out.append(ev)
    return sorted(out, key=lambda e: e["ts"])


def raw_exchange(sock_path: str | Path, data: bytes, *, half_close: bool = True,
                 timeout: float = 10.0) -> bytes:
    """Send raw bytes to an rq1 socket and return every byte the server sends
    until it closes.  With `half_close` the write side is shut down after
    `data`, so a server waiting for more of a frame sees EOF (a short read)."""
    import socket
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(str(sock_path))
        if data:
            sock.sendall(data)
        if half_close:
            sock.shutdown(socket.SHUT_WR)
        chunks = []
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)


def decode_reply_frame(raw: bytes) -> Any:
    """The JSON reply of one complete rq1 frame (S7.1); AssertionError otherwise."""
    from rq import protocol
    size = protocol.parse_header(raw[:protocol.HEADER_LEN])
    payload = raw[protocol.HEADER_LEN:]
    assert len(payload) == size, f"reply frame announces {size} bytes, has {len(payload)}"
    return json.loads(payload)


def short_id(full_id: str) -> str:
    """The short id (S4.1) at the end of a full id (S4.2)."""
    return full_id.rstrip("/").rsplit("/", 1)[-1]


# ---------------------------------------------------------------- a scriptable queue script
# Used by the queue-process tests (test_queue_*.py): one python queue script whose behaviour
# each message chooses, so a test needs no fixed sleeps: a job that must "run for a while"
# waits for a file the test creates.

DRIVER_SOURCE = r'''"""Test queue script: runs the JSON steps in RQ_PARAM1 (rqtest.job)."""
import fcntl, json, os, signal, subprocess, sys, time

CHILD = """
import os, signal, sys, time
if sys.argv[3] == "1":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
tmp = sys.argv[1] + ".tmp"
with open(tmp, "w") as fh:
    fh.write(str(os.getpid()))
os.rename(tmp, sys.argv[1])
deadline = time.monotonic() + 30
while not os.path.exists(sys.argv[2]) and time.monotonic() < deadline:
    time.sleep(0.01)
"""


def publish(path, text):
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        fh.write(text)
    os.rename(tmp, path)


def wait_file(path):
    deadline = time.monotonic() + 30
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            sys.exit(99)
        time.sleep(0.01)


def fd_table():
    out = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            out[name] = os.readlink("/proc/self/fd/" + name)
        except OSError:
            pass  # the descriptor listdir itself used, already closed
    return out


def info():
    try:
        stdin_data = os.read(0, 100).decode()
    except OSError as exc:
        stdin_data = "error: %s" % exc
    return {"pid": os.getpid(), "pgid": os.getpgid(0), "sid": os.getsid(0),
            "ppid": os.getppid(), "nice": os.getpriority(os.PRIO_PROCESS, 0),
            "cwd": os.getcwd(), "env": dict(os.environ), "argv": sys.argv,
            "fds": fd_table(), "stdin": stdin_data,
            "fd1_append": bool(os.O_APPEND & fcntl.fcntl(1, fcntl.F_GETFL)),
            "fd3_mode": os.O_ACCMODE & fcntl.fcntl(3, fcntl.F_GETFL),
            "fd4_mode": os.O_ACCMODE & fcntl.fcntl(4, fcntl.F_GETFL)}


def note(signame, path):
    def handler(signum, frame):
        with open(path, "a") as fh:
            fh.write(signame + "\n")
    signal.signal(getattr(signal, signame), handler)


def program():
    # RQ_PARAM1, or RQ_PARAM4 when a test needs param1 for blocking or coalescing
    for var in ("RQ_PARAM1", "RQ_PARAM4"):
        try:
            spec = json.loads(os.environ.get(var) or "")
        except ValueError:
            continue
        if isinstance(spec, (list, dict)):
            return spec
    return []


spec = program()
if isinstance(spec, dict):  # a program per RQ_COUNT, "*" for the others
    spec = spec.get(os.environ.get("RQ_COUNT", ""), spec.get("*", []))
for op, *args in spec:
    if op == "w":
        os.write(3, args[0].encode())
    elif op == "wb":
        os.write(3, bytes.fromhex(args[0]))
    elif op == "wx":  # prefix + char * n + suffix: lines too long for an env var
        os.write(3, (args[0] + args[1] * args[2] + args[3]).encode())
    elif op == "out":
        os.write(1, args[0].encode())
    elif op == "stderr":
        os.write(2, args[0].encode())
    elif op == "wait":
        wait_file(args[0])
    elif op == "touch":
        open(args[0], "a").close()
    elif op == "log":  # append "<RQ_MSG_ID>\n": the order jobs started in
        with open(args[0], "a") as fh:
            fh.write(os.environ["RQ_MSG_ID"] + "\n")
    elif op == "reply":
        line = b""
        while not line.endswith(b"\n"):
            chunk = os.read(4, 1)
            if not chunk:
                break
            line += chunk
        publish(args[0], line.decode())
    elif op == "info":
        publish(args[0], json.dumps(info()))
    elif op == "ignore":
        signal.signal(getattr(signal, args[0]), signal.SIG_IGN)
    elif op == "note":
        note(args[0], args[1])
    elif op == "child":
        opts = args[2] if len(args) > 2 else {}
        subprocess.Popen([sys.executable, "-c", CHILD, args[0], args[1],
                          "1" if opts.get("ignore_term") else "0"],
                         pass_fds=(3, 4) if opts.get("keep_pipe") else ())
        wait_file(args[0])
    elif op == "sleep":
        time.sleep(args[0])
    elif op == "kill":
        os.kill(os.getpid(), getattr(signal, args[0]))
    elif op == "close":
        os.close(args[0])
    elif op == "core":  # die of SIGABRT with a core dump
        import resource
        hard = resource.getrlimit(resource.RLIMIT_CORE)[1]
        resource.setrlimit(resource.RLIMIT_CORE, (hard, hard))
        os.abort()
    elif op == "exit":
        sys.exit(args[0])
sys.exit(0)
'''


def write_driver(path: Path) -> Path:
    """Write the scriptable queue script (run directly: use exec_prefix "")."""
    return write_script(path, f"#!{sys.executable}\n" + DRIVER_SOURCE)


def job(*ops: Any, **by_count: Any) -> str:
    """RQ_PARAM1 (or RQ_PARAM4) for the driver: `job(["w", "done ok\\n"], ["exit", 0])`.
    Keyword form `job(c0=[...], other=[...])` picks a program by RQ_COUNT (`other`: the rest)."""
    if by_count:
        return json.dumps({("*" if k == "other" else k[1:]): v for k, v in by_count.items()})
    return json.dumps([list(op) for op in ops])


def process_gone(pid: int) -> bool:
    """True when `pid` no longer runs (an unreaped zombie counts as gone: orphans are
    reparented to a pid 1 that may never reap them)."""
    import psutil
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def thread_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def settled_threads(*pids: int, timeout: float = 20.0) -> tuple[int, ...]:
    """The thread counts of `pids` once they have not changed for half a second (a queue's
    helper threads, spares and settler, come and go; a kept socket worker stays)."""
    seen: list[tuple[int, ...]] = []

    def settled() -> tuple[int, ...] | None:
        seen.append(tuple(thread_count(pid) for pid in pids))
        return seen[-1] if len(seen) > 5 and len(set(seen[-6:])) == 1 else None
    return wait_for(settled, timeout, interval=0.1, what="the thread counts to settle")


def wait_file(path: Path, timeout: float = 10.0) -> str:
    """Wait for a file a job publishes (by rename) and return its text."""
    wait_for(path.exists, timeout, what=f"{path} to appear")
    return path.read_text()


PORT_BASE, PORT_SPAN = 20000, 1500   # below Linux's ephemeral range (32768-60999)
_next_port: list[int] = []


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing is bound to right now, from this xdist worker's
    own block below the ephemeral range.  A port the kernel handed out (bind to 0) could be
    taken again, before the daemon binds it, as the local port of any connection another
    worker makes, or by another worker's free_port: "Address already in use" at start."""
    import socket
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")[2:]
    block = PORT_BASE + (int(worker) if worker.isdigit() else 0) % 8 * PORT_SPAN
    if not _next_port:
        _next_port.append(os.getpid() % PORT_SPAN)
    for _ in range(PORT_SPAN):
        port = block + _next_port[0] % PORT_SPAN
        _next_port[0] += 1
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))  # no SO_REUSEADDR: a port in TIME_WAIT is skipped
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {block}..{block + PORT_SPAN - 1}")


# ---------------------------------------------------------------- message helpers (queue tests)

RQ_START_RE = re.compile(
    r"\n(\d+) - (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d [+-]\d{4}) - RQ START - (.*)\n")


def create_msg(q: QueueProc, **fields: Any) -> str:
    """create_message on `q` (dest defaults to the queue's name); returns the full id."""
    fields.setdefault("dest", q.name)
    reply = q.call("create_message", fields)
    assert reply[0] == "ok", reply
    return reply[1]


def wait_final(q: QueueProc, full: str, timeout: float = 10) -> str:
    """Wait until the message is done, err or relayed; return that state."""
    def final() -> str | None:
        state = q.state(full)
        return state if state in ("done", "err", "relayed") else None
    return wait_for(final, timeout, what=f"{full} to finish")


def job_log(root: Path, msg: dict[str, Any]) -> str:
    """The job/stdio.log of a message as read (S4.5 `path`)."""
    return (root / msg["path"] / "job" / "stdio.log").read_text()


def start_header_pids(root: Path, msg: dict[str, Any]) -> list[int]:
    """The pids of the RQ START headers (S6.3) in the message's stdio.log, in order."""
    return [int(m.group(1)) for m in RQ_START_RE.finditer(job_log(root, msg))]


def msg_events(root: Path, queue: str, full: str, last_to: str | None = None,
               timeout: float = 5) -> list[dict[str, Any]]:
    """The S13 events of one message; with `last_to`, first wait until the last one goes
    there (an event is appended just after its transition is on disk)."""
    def get() -> list[dict[str, Any]]:
        return [e for e in read_events(root, queue) if e["msg_id"] == short_id(full)]
    if last_to is not None:
        wait_for(lambda: (get() or [{}])[-1].get("to") == last_to, timeout,
                 what=f"an event of {full} to {last_to}")
    return get()


class LifelineQueueProc(QueueProc):
    """A queue process started the way rq-mgr starts it: with a lifeline pipe (S2.1).
    `close_lifeline()` is the manager's death."""

    def __init__(self, root: Path, name: str) -> None:
        self.root, self.name = root, name
        life_r, self.lifeline_w = os.pipe()
        env = dict(os.environ, PYTHONPATH=str(REPO))
        self.log = open(root / "log" / f"{name}.stderr", "ab")
        self.popen = subprocess.Popen(
            [sys.executable, "-m", "rq.queue", "--root", str(root), "--name", name,
             "--lifeline-fd", str(life_r)],
            cwd=str(root), env=env, stdout=self.log, stderr=self.log, start_new_session=True,
            pass_fds=(life_r,))
        os.close(life_r)
        wait_for(self.ping, 20, what=f"queue {name} to answer ping")

    def close_lifeline(self) -> None:
        if self.lifeline_w >= 0:
            os.close(self.lifeline_w)
            self.lifeline_w = -1

    def stop(self, timeout: float = 30) -> int:
        code = super().stop(timeout)
        self.close_lifeline()
        return code


def make_buckets_ahead(qdir: Path, minutes: int = 20) -> None:
    """Make the done/ buckets (S3.2) of the minute before and the next `minutes`
    minutes: a queue with messages in que/ makes those of the minute before, this and
    the next at its first pass of each minute (D8, rq.queue.state.prepare_buckets), and
    those mkdirs would mix with the file operations that learn_ops learns (seen: a
    create's learnt ops ending in three mkdirs and an fsync, or `mkdir 1` a new
    minute's bucket, not the create's)."""
    now = time.time()
    for t in range(-120, minutes * 60, 60):
        bucket = time.strftime("%Y%m%d/%H/%M", time.gmtime(now + t))
        (qdir / "done" / bucket).mkdir(parents=True, exist_ok=True)


def learn_ops(root: Path, name: str, action, *, plan: str = "",
              ready=None) -> list[tuple[str, int]]:
    """Run `action(q)` on a recording queue process; return the (op, nth)
    sequence the action caused, after start-up.  `plan` prefixes the fault
    plan (e.g. `spares,`); `ready(q)` is awaited before the action."""
    record = root / f"ops-{name}.txt"
    q = QueueProc(root, name, env={"RQ_FS_FAULTS": f"{plan}record={record}"})
    try:
        if ready is not None:
            wait_for(lambda: ready(q), 10, what="queue ready for the action")
        before = len(record.read_text().splitlines())
        action(q)
        lines = record.read_text().splitlines()[before:]
    finally:
        q.stop()
    return [(op, int(n)) for op, n in (line.split() for line in lines)]
