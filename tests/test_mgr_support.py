"""Helpers for the rq-mgr tests, and two small programs run as real processes.

`python tests/test_mgr_support.py child --root R --name N --lifeline-fd F --ready-fd F`
is a stand-in queue process that follows the child protocol (docs/DESIGN.md
"Child side of supervision"): ready pipe, lifeline EOF, SIGTERM, SIGHUP.  What
it does is chosen by an extra key in the queue's config.json (unknown keys are
ignored by validation, S3.3): `"test_behaviour"`:

* `ok` (default): ready, then serve until SIGTERM or lifeline EOF;
* `crash`: exit 3 before ready;  `fatal`: write `fatal test says no`, exit 2;
* `noready`: never write ready;  `stubborn`: ignore SIGTERM and EOF;
* `slowstop`: exit only on a second SIGTERM.

`"test_stop_delay"` (seconds) delays the exit after a stop.  Every event is
appended to `queue/NAME/trace` as `<event> <pid>`.  The same program stands
in for the singleton services (the web server): `--kind web` keeps its files
in `services/web/` and its optional config there, `services/web/config.json`.

`python tests/test_mgr_support.py manager ROOT POLICY_JSON` runs the real
manager (`rq.mgr.daemon.run_daemon`) with those stand-ins as its children and
a fast restart policy: the argv builder is a constructor parameter, so
production code has no test switch.

This file has no tests; its name only keeps it inside tests/test_mgr*.py.
Top-level imports are stdlib only, so the stand-in child starts quickly.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
from typing import Any

HERE = os.path.abspath(__file__)
REPO = os.path.dirname(os.path.dirname(HERE))
MAIN_CONFIG = {"env": "mgrtest", "host": "localhost", "port": 3333, "addr": "127.0.0.1"}
FAST_POLICY = {"first_delay": 0.05, "max_delay": 0.2, "reset_after": 60.0,
               "fatal_after": 10, "stop_margin": 1.0}


# ---------------------------------------------------------------- helpers for tests


def env_with_repo(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for subprocesses: this checkout importable, no RQ_ROOT."""
    env = {k: v for k, v in os.environ.items() if k not in ("RQ_ROOT", "RQ_FS_FAULTS")}
    env["PYTHONPATH"] = REPO + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.update(extra or {})
    return env


def make_queue(root: str, name: str, **extra: Any) -> str:
    qdir = os.path.join(root, "queue", name)
    for state in ("prep", "que", "run", "done", "relayed", "err"):
        os.makedirs(os.path.join(qdir, state), exist_ok=True)
    write_queue_config(root, name, {"name": name, "script": "/bin/true", **extra})
    return qdir


def write_queue_config(root: str, name: str, data: dict[str, Any]) -> None:
    path = os.path.join(root, "queue", name, "config.json")
    with open(path + ".tmp", "w") as f:
        json.dump(data, f)
    os.rename(path + ".tmp", path)


def trace(root: str, name: str) -> list[list[str]]:
    try:
        with open(os.path.join(root, "queue", name, "trace")) as f:
            return [line.split() for line in f if line.strip()]
    except FileNotFoundError:
        return []


def events(root: str, name: str, event: str) -> list[int]:
    return [int(pid) for ev, pid in trace(root, name) if ev == event]


def raw_request(path: str, data: bytes, timeout: float = 10.0) -> bytes:
    """Send raw bytes to a socket, half-close, and return everything answered."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        sock.connect(path)
        sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)
        chunks = []
        try:
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        except ConnectionResetError:
            pass  # the server closed with our unread bytes still queued
        return b"".join(chunks)
    finally:
        sock.close()


def pid_alive(pid: int) -> bool:
    """Alive and not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


class FakeManager:
    """The real manager with stand-in children, as a real process."""

    def __init__(self, root: str, policy: dict[str, Any] | None = None) -> None:
        self.root = root
        # Closed by stop() or kill().
        self.log = open(os.path.join(root, "manager.stderr"), "wb")  # noqa: SIM115
        self.popen = subprocess.Popen(
            [sys.executable, HERE, "manager", root, json.dumps(policy or FAST_POLICY)],
            env=env_with_repo(), stdin=subprocess.DEVNULL, stdout=self.log, stderr=self.log,
            start_new_session=True)
        from rqtest import wait_for  # not at the top: the stand-in child imports stdlib only
        wait_for(self.answers, what="manager ping")

    def answers(self) -> bool:
        from rq.client import call_mgr
        from rq.errors import ConnectError
        if self.popen.poll() is not None:
            raise AssertionError(f"manager exited {self.popen.returncode}: {self.stderr()}")
        try:
            return call_mgr(self.root, "ping", timeout=5) == ["pong"]
        except ConnectError:
            return False

    def call(self, cmd: str, arg: Any = None, raw: bool = False) -> Any:
        from rq.client import call_mgr
        return call_mgr(self.root, cmd, arg, raw=raw, timeout=30)

    def status(self) -> dict[str, Any]:
        reply = self.call("status")
        assert reply[0] == "ok"
        return reply[1]

    def queue(self, name: str) -> dict[str, Any] | None:
        return self.status()["queues"].get(name)

    def wait_state(self, name: str, state: str, timeout: float = 15.0) -> dict[str, Any]:
        def check() -> dict[str, Any] | None:
            child = self.queue(name)
            return child if child is not None and child["state"] == state else None
        from rqtest import wait_for
        return wait_for(check, timeout, what=f"queue {name} {state}")

    def stderr(self) -> str:
        with open(os.path.join(self.root, "manager.stderr"), errors="replace") as f:
            return f.read()

    def log_text(self) -> str:
        try:
            with open(os.path.join(self.root, "log", "queuemgr.log"), errors="replace") as f:
                return f.read()
        except FileNotFoundError:
            return ""

    def stop(self, timeout: float = 30.0) -> int:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
        try:
            return self.popen.wait(timeout)
        finally:
            self.log.close()

    def kill(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait()
        self.log.close()


# ---------------------------------------------------------------- the stand-in programs


def _parse(argv: list[str]) -> dict[str, str]:
    opts = {}
    for i in range(0, len(argv) - 1, 2):
        opts[argv[i].lstrip("-")] = argv[i + 1]
    return opts


def child_main(argv: list[str]) -> int:
    opts = _parse(argv)
    root, name = opts["root"], opts["name"]
    if opts.get("kind", "queue") == "queue":
        qdir = os.path.join(root, "queue", name)
    else:
        qdir = os.path.join(root, "services", name)
        os.makedirs(qdir, exist_ok=True)
    lifeline, ready = int(opts["lifeline-fd"]), int(opts["ready-fd"])
    pid = os.getpid()

    def note(event: str) -> None:
        fd = os.open(os.path.join(qdir, "trace"), os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        os.write(fd, f"{event} {pid}\n".encode())
        os.close(fd)

    try:
        with open(os.path.join(qdir, "config.json")) as f:
            config = json.load(f)
    except FileNotFoundError:
        if opts.get("kind", "queue") == "queue":
            raise
        config = {}
    behaviour = config.get("test_behaviour", "ok")
    stop_delay = float(config.get("test_stop_delay", 0))
    note("start")
    with open(os.path.join(qdir, "env.json"), "w") as f:
        json.dump({"env": dict(os.environ), "cwd": os.getcwd()}, f)
    if behaviour == "crash":
        note("exit")
        return 3
    if behaviour == "fatal":
        os.write(ready, b"fatal test says no\n")
        note("exit")
        return 2

    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda *a: None)  # handlers installed before `ready`
    if behaviour != "noready":
        os.write(ready, b"ready\n")
        os.close(ready)
    terms = 0
    watch = [wake_r, lifeline]
    while True:
        readable, _, _ = select.select(watch, [], [])
        stop = False
        if lifeline in readable and not os.read(lifeline, 1):
            note("eof")
            watch.remove(lifeline)
            stop = behaviour not in ("stubborn", "slowstop")
        if wake_r in readable:
            for signum in os.read(wake_r, 64):
                if signum == signal.SIGHUP:
                    note("hup")
                elif signum == signal.SIGTERM:
                    terms += 1
                    note("term")
                    stop = stop or behaviour == "ok" or behaviour == "noready" or (
                        behaviour == "slowstop" and terms >= 2)
        if stop:
            time.sleep(stop_delay)
            note("exit")
            return 0


def manager_main(argv: list[str]) -> int:
    sys.path.insert(0, REPO)
    from rq.mgr.children import Policy
    from rq.mgr.daemon import run_daemon

    root, policy = argv[0], Policy(**json.loads(argv[1]))

    def argv_for(kind: str, name: str) -> list[str]:
        return [sys.executable, HERE, "child", "--root", root, "--name", name, "--kind", kind]

    return run_daemon(root, stderr_log=True, argv_for=argv_for, policy=policy)


if __name__ == "__main__":
    role, rest = sys.argv[1], sys.argv[2:]
    sys.exit(child_main(rest) if role == "child" else manager_main(rest))
