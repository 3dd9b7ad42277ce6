"""Helpers for web tests: a real rq-mgr over a temp root, and the Flask app of it."""

from __future__ import annotations

import socket
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rqtest import REPO, free_port, make_queue, make_root, write_script

DONE_SCRIPT = ('#!/bin/sh\necho "run working"  >&3\necho "hello from $RQ_MSG_ID"\n'
               'echo "done ok" >&3\n')


def rq_mgr(root: Path, *args: str, timeout: float = 90) -> subprocess.CompletedProcess:
    return subprocess.run([str(REPO / "bin" / "rq-mgr"), "--root", str(root), *args],
                          capture_output=True, text=True, timeout=timeout)


class Mgr:
    """rq-mgr started with `rq-mgr start` on a root; `stop()` always."""

    def __init__(self, root: Path) -> None:
        self.root = root
        result = rq_mgr(root, "start")
        assert result.returncode == 0, result.stderr

    def stop(self) -> None:
        rq_mgr(self.root, "stop")


def build_root(base: Path, **main: object) -> Path:
    """A root with a free port and a queue `test` running DONE_SCRIPT."""
    root = make_root(base, port=free_port(), allow_new_queue=True, **main)
    script = write_script(base / "done.sh", DONE_SCRIPT)
    make_queue(root, "test", script=script)
    return root


@contextmanager
def running(root: Path, *, web: bool = False) -> Iterator[Any]:
    """rq-mgr on `root` for the length of the block, the life of a module's shared `site`;
    with `web`, the dashboard answering too (browser.WebServer, yielded; None otherwise).
    Both are stopped afterwards, also when a start fails."""
    manager = Mgr(root)
    server = None
    try:
        if web:
            from browser import WebServer
            server = WebServer(root)
        yield server
    finally:
        if server is not None:
            server.stop()
        manager.stop()


# ---------------------------------------------------------------- builtin queues, mgr with env
# (added for the relay/webhook tests, S12)


def install_builtin(root: Path, name: str, **overrides: object) -> Path:
    """The builtin queue `name` (S12) in a test root, configured as rq-install does (S20),
    with config keys replaced by `overrides` (e.g. num_workers)."""
    import json

    from rq.install import STATE_DIRS, builtin_queue_config
    qdir = root / "queue" / name
    for state in STATE_DIRS:
        (qdir / state).mkdir(parents=True, exist_ok=True)
    (qdir / "config.json").write_text(json.dumps({**builtin_queue_config(name), **overrides}))
    return qdir


class EnvMgr(Mgr):
    """Mgr started with extra environment variables (S6.2: jobs inherit the manager's
    environment), e.g. HTTP_PROXY for the relay's fault proxy; None removes a variable."""

    def __init__(self, root: Path, env: dict[str, str | None]) -> None:
        import os
        self.root = root
        full = dict(os.environ)
        for key, value in env.items():
            full.pop(key, None)
            if value is not None:
                full[key] = value
        result = subprocess.run([str(REPO / "bin" / "rq-mgr"), "--root", str(root), "start"],
                                capture_output=True, text=True, timeout=90, env=full)
        assert result.returncode == 0, result.stderr


def web_pid(root: Path) -> int | None:
    """The pid of the root's running rq-web, from the manager's `status` (S7.2); None while
    the manager or the web is down."""
    from rq import client
    from rq.errors import RQError
    try:
        reply = client.call_mgr(str(root), "status", timeout=10)
        return int(reply[1]["web"]["pid"])
    except (RQError, LookupError, TypeError, ValueError):
        return None


def pull_queue(root: Path, name: str) -> None:
    """A pull-mode queue (S8) created through the running manager, once it answers.  Its
    messages may hold params no job's environment could (1 MiB, S4.4): consumers get them
    over the socket, so only script-mode queues refuse those (issue 13, D10)."""
    from rq import client
    from rq.errors import ConnectError
    from rqtest import wait_for
    reply = client.call_mgr(str(root), "create_queue", {"name": name, "mode": "pull"})
    assert reply in (["success", "queue created - awesome"], ["fail", "already created"]), reply

    def answers() -> bool:
        try:
            return client.call_queue(str(root), name, "ping", timeout=5) == ["pong"]
        except ConnectError:
            return False
    wait_for(answers, 30, what=f"pull queue {name} to answer")


def http_head(sock: socket.socket) -> bytes:
    """What the server has sent so far on a raw socket, up to the end of the headers
    (blocking; less when it closes first)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(4096)
        if not chunk:
            break
        data += chunk
    return data
