"""`rq push` and `rq pop`: a message queue for shell pipelines (issue 18 item 1,
seed 000's push/pop with a journal).

`echo data | rq push [QUEUE]` queues stdin (any bytes, at most the root's
`push_max_bytes`) as the body of a new message: prep_message, the body
attached as `attach/body` (S4.8, so the message page shows it like any
attachment), commit_message.  `ok <full id>` is printed only after the commit
(the queue's create journal holds the commit first).  Without QUEUE the root's `default_queue`.

`rq pop QUEUE [--wait SECS]` takes a lease on the oldest eligible message of a
pull queue (S8.2, over the queue's own socket: `grant_lease`), writes its body
to stdout, flushes it (and fsyncs it when stdout is a regular file), and only
then reports `done`.  A failed write (EPIPE, a killed pipeline) or a crash
sends no report: the message returns when its lease expires (S8.3), never
lost.  `--exec CMD` runs CMD with the body on stdin (renewing the lease while
it runs): exit 0 → done, else err with CMD's last stderr line; `--loop` keeps
taking messages.  Nothing here touches the spool except reading a leased
message's body.
"""

from __future__ import annotations

import os
import selectors
import socket
import stat
import sys
import time

from rq import client, protocol
from rq.cli.base import CliError, Invocation, check_queue, command, optional, silence
from rq.errors import ConfigError, ConnectError

# Issue 15: `rq pop` in a shell loop pays for every import, so neither typing nor the
# config records (rq.config: dataclasses) nor rq.proc are loaded on its path;
# `rq push` reads the main config, `--exec` spawns through rq.proc.
TYPE_CHECKING = False
if TYPE_CHECKING:
    import subprocess
    from typing import IO, Any

    from rq.config import MainConfig

BODY = "body"            # the attachment that holds a pushed message's body
CHUNK = 1024 * 1024
GRANT_WAIT_MAX = 60.0    # S8.2: one grant waits at most 60 s; longer waits ask again
STATUS_MAX = 1000        # characters of CMD's last stderr line kept as the status text


# ---------------------------------------------------------------- rq push


@command("push")
def push(inv: Invocation) -> int:
    """Queue stdin as a new message's body → `ok <FULL_ID>`."""
    main = main_config(inv)
    name = inv.args[0] if inv.args else main.default_queue
    if name is None:
        raise CliError("no queue given and no default_queue in config/config.json "
                       "(rq push QUEUE)")
    check_queue(inv.root, name)
    path, fd = body_file(main.tmpdir)
    try:
        copy_stdin(fd, main.push_max_bytes)
        full = ask(inv, name, "prep_message", {"dest": name, "src": "push"})
        try:
            ask(inv, name, "attach_message", {"msg_id": full, "pathname": path, "name": BODY})
        except CliError:
            call_quiet(inv.root, name, "delete_message", {"msg_id": full})
            raise
    finally:
        os.close(fd)
        os.unlink(path)
    try:
        ask(inv, name, "commit_message", {"msg_id": full})
    except CliError:  # not acknowledged: do not leave it to be delivered
        call_quiet(inv.root, name, "delete_message", {"msg_id": full})
        raise
    inv.say(f"ok {full}")
    return 0


def main_config(inv: Invocation) -> MainConfig:
    from rq import config

    try:
        return config.load_main_config(inv.root)
    except ConfigError as exc:
        raise CliError(f"bad config file config/config.json: {exc}") from None


def body_file(tmpdir: str | None) -> tuple[str, int]:
    """A new private file for the body (not `tempfile`: its imports cost a
    `rq push` more than the rest of the command, issue 15)."""
    base = tmpdir or os.environ.get("TMPDIR") or "/tmp"
    while True:
        path = os.path.join(base, f"rq-push-{os.getpid()}-{os.urandom(6).hex()}")
        try:
            return path, os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        except FileExistsError:
            continue


def copy_stdin(fd: int, limit: int) -> None:
    """Stdin into the file `fd`, fsynced (the queue hard-links it: the same
    inode); more than `limit` bytes → an error before anything is queued."""
    size = 0
    stdin = sys.stdin.buffer
    while chunk := stdin.read(CHUNK):
        size += len(chunk)
        if size > limit:
            raise CliError(f"stdin is larger than push_max_bytes ({limit} bytes): "
                           "nothing queued")
        view = memoryview(chunk)
        while view:
            view = view[os.write(fd, view):]
    os.fsync(fd)


def ask(inv: Invocation, name: str, cmd: str, arg: Any, timeout: float = 60.0) -> Any:
    """The reply's value; a `fail` reply or no answer → CliError."""
    try:
        reply = client.call_queue(inv.root, name, cmd, arg, timeout=timeout)
    except ConnectError:
        raise CliError(f"cannot connect to queue {name} (is rq-mgr running?)") from None
    if not isinstance(reply, list) or len(reply) < 2 or reply[0] != "ok":
        reason = reply[1] if isinstance(reply, list) and len(reply) > 1 else reply
        raise CliError(f"queue {name}: {reason}")
    return reply[1]


def call_quiet(root: str, name: str, cmd: str, arg: Any) -> None:
    try:
        client.call_queue(root, name, cmd, arg)
    except ConnectError:
        pass


# ---------------------------------------------------------------- rq pop


@command("pop", "wait", "exec", "loop", "lease", "consumer")
def pop(inv: Invocation) -> int:
    """One message's body to stdout (or to `--exec CMD`), then `done`."""
    if not inv.args:
        raise CliError("missing queue name (rq pop QUEUE)")
    name = inv.args[0]
    check_queue(inv.root, name)
    wait, cmd, loop = pop_wait(inv), optional(inv, "exec"), "loop" in inv.flags
    if loop and cmd is None:
        raise CliError("--loop needs --exec CMD")
    grant: dict[str, Any] = {"consumer": optional(inv, "consumer")
             or f"rq pop {socket.gethostname()}:{os.getpid()}"}
    if (lease := optional(inv, "lease")) is not None:
        grant["lease"] = number(lease, "--lease")
    while True:
        res = take(inv, name, grant, wait if wait is not None else None if loop else 0.0)
        if res is None:
            if loop:
                return 0
            raise CliError(f"no message in queue {name}")
        if cmd is None:
            return write_body(inv, name, res)
        run_exec(inv, name, res, cmd)
        if not loop:
            return 0


def pop_wait(inv: Invocation) -> float | None:
    raw = optional(inv, "wait")
    return None if raw is None else number(raw, "--wait")


def number(raw: str, flag: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 <= value < float("inf"):
        raise CliError(f"invalid {flag}: {raw} (seconds)")
    return value


def take(inv: Invocation, name: str, grant: dict[str, Any],
         wait: float | None) -> dict[str, Any] | None:
    """A reservation (S8.2 RES), waiting up to `wait` s (None: for ever; 0: not)."""
    deadline = None if wait is None else time.monotonic() + wait
    while True:
        left = GRANT_WAIT_MAX if deadline is None else max(0.0, deadline - time.monotonic())
        step = min(left, GRANT_WAIT_MAX)
        res = ask(inv, name, "grant_lease", {**grant, "wait": step}, timeout=step + 30)
        if res is not None or (deadline is not None and time.monotonic() >= deadline):
            return res


def body_path(res: dict[str, Any]) -> str | None:
    """The leased message's `attach/body`, None when it has none (an empty body)."""
    found = (res.get("msg") or {}).get("_attachments", {}).get(BODY)
    return found.get("path") if isinstance(found, dict) else None


def write_body(inv: Invocation, name: str, res: dict[str, Any]) -> int:
    """Body → stdout, flushed (fsynced if a file), then `done`; a failed write
    leaves the message to its lease expiry (S8.3)."""
    try:
        inv.out.flush()
        path = body_path(res)
        with open(path if path else os.devnull, "rb") as body:
            while chunk := body.read(CHUNK):
                write_all(inv.out, chunk)
        inv.out.flush()
        sync_if_file(inv.out)
    except OSError as exc:
        silence(inv.out)
        raise CliError(f"cannot write {res['full_msg_id']} to stdout "
                       f"({exc.strerror or exc}): it returns to queue {name} when its "
                       "lease expires") from None
    report(inv, name, res, "done popped")
    return 0


def write_all(out: IO[str], data: bytes) -> None:
    """Every byte to the stream's descriptor with os.write (a buffered writer
    can report a partial write to a pipe closed under it as success); a
    stream without a descriptor (CliRunner) gets text."""
    try:
        fd = out.fileno()
    except (OSError, ValueError, AttributeError):
        out.write(data.decode("utf-8", "replace"))
        return
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def sync_if_file(out: IO[str]) -> None:
    try:
        fd = out.fileno()
    except (OSError, ValueError, AttributeError):
        return
    if stat.S_ISREG(os.fstat(fd).st_mode):
        os.fsync(fd)


def run_exec(inv: Invocation, name: str, res: dict[str, Any], cmd: str) -> None:
    """CMD with the body on stdin and the message's RQ_* environment (S8.2
    `env`); its stderr passed through, the lease renewed while it runs."""
    env = {**os.environ, **{k: str(v) for k, v in (res.get("env") or {}).items()}}
    import subprocess

    from rq import proc

    inv.out.flush()
    child = proc.spawn_filter(cmd, body_path(res) or os.devnull, env)
    lease = Renewal(inv, name, res)
    last = relay_stderr(inv, child, lease)
    while (code := child.poll()) is None:  # stderr closed, CMD still running
        try:
            child.wait(lease.left())
        except subprocess.TimeoutExpired:
            lease.renew_if_due()
    if code == 0:
        report(inv, name, res, f"done {protocol.describe_exit(0)}")
    else:
        report(inv, name, res, f"err {last or protocol.describe_exit(code)}")


class Renewal:
    """Renews a lease every third of its length (S8.3 `renew`)."""

    def __init__(self, inv: Invocation, name: str, res: dict[str, Any]) -> None:
        self.inv, self.name, self.res = inv, name, res
        self.every = max(1.0, float(res["lease_expires"]) - time.time()) / 3
        self.due = time.monotonic() + self.every

    def left(self) -> float:
        return max(0.0, self.due - time.monotonic())

    def renew_if_due(self) -> None:
        if time.monotonic() >= self.due:
            ask(self.inv, self.name, "renew",
                {"msg_id": self.res["full_msg_id"], "token": self.res["token"]})
            self.due = time.monotonic() + self.every


def relay_stderr(inv: Invocation, child: subprocess.Popen[bytes], lease: Renewal) -> str:
    """Copy CMD's stderr to ours until EOF, renewing the lease meanwhile;
    CMD's last non-empty stderr line."""
    assert child.stderr is not None
    last, tail = "", b""
    err = getattr(inv.err, "buffer", None)
    with selectors.DefaultSelector() as sel:
        sel.register(child.stderr, selectors.EVENT_READ)
        while True:
            if sel.select(lease.left()):
                chunk = os.read(child.stderr.fileno(), 65536)
                if not chunk:
                    break
                (err.write(chunk) if err else inv.err.write(chunk.decode("utf-8", "replace")))
                (err or inv.err).flush()
                tail = (tail + chunk)[-4 * STATUS_MAX:]
                last = last_line(tail) or last
            lease.renew_if_due()
    child.stderr.close()
    return last


def last_line(data: bytes) -> str:
    lines = [x for x in data.decode("utf-8", "replace").splitlines() if x.strip()]
    return " ".join(lines[-1].split())[:STATUS_MAX] if lines else ""


def report(inv: Invocation, name: str, res: dict[str, Any], line: str) -> None:
    ask(inv, name, "report", {"msg_id": res["full_msg_id"], "token": res["token"],
                              "line": line})
