"""`check_rq` (SPEC S22) against a real RQ: rq-mgr, its queues and its web server.

tests/test_check_rq.py covers every rule against a fake HTTP server; this module checks
that the real `GET /q.txt` and `GET /q/NAME.txt` (S15 route 6, S15.2) say what check_rq
reads, with real queue states: done and err messages, a paused backlog, a DOWN queue, a
ROOT prefix with basic auth, and a stopped RQ.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from rqtest import REPO, free_port, make_queue, make_root, wait_for, write_script
from webtest import DONE_SCRIPT, Mgr, rq_mgr

from rq.client import call_mgr, call_queue

CHECK_RQ = REPO / "bin" / "check_rq"
ERR_SCRIPT = '#!/bin/sh\necho "err broken on purpose" >&3\n'

StartRQ = Callable[..., Path]


def port_of(root: Path) -> int:
    import json
    return int(json.loads((root / "config" / "config.json").read_text())["port"])


def check_rq(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "RQ_PORT"}
    return subprocess.run([str(CHECK_RQ), "-p", str(port_of(root)), *args], env=env,
                          capture_output=True, text=True, timeout=60)


def result(root: Path, *args: str) -> tuple[int, str, str]:
    res = check_rq(root, *args)
    return res.returncode, res.stdout, res.stderr


def expect(root: Path, code: int, line: str, *args: str, timeout: float = 20) -> None:
    """check_rq reaches `code` and `line` (polled: queue processes come up, jobs finish)."""
    want = (code, line + "\n", "")
    last: list[Any] = []

    def ok() -> bool:
        last[:] = [result(root, *args)]
        return last[0] == want
    try:
        wait_for(ok, timeout, interval=0.2, what=f"check_rq {line!r}")
    except AssertionError:
        raise AssertionError(f"check_rq never said {want}; last: {last}") from None


def queues_running(root: Path, *names: str) -> None:
    def running() -> bool:
        queues = call_mgr(str(root), "status")[1]["queues"]
        return all(queues.get(n, {}).get("state") == "RUNNING" for n in names)
    wait_for(running, 30, what=f"queues {names} RUNNING")


def send(root: Path, queue: str, n: int = 1) -> list[str]:
    ids = []
    for _ in range(n):
        reply = call_queue(str(root), queue, "create_message", {"dest": queue})
        assert reply[0] == "ok", reply
        ids.append(reply[1])
    return ids


def counts(root: Path, queue: str) -> dict[str, int]:
    return call_queue(str(root), queue, "num_messages")


@pytest.fixture
def start_rq(tmp_path: Path) -> Iterator[StartRQ]:
    """start_rq(queues={"name": script_body}, **main_config) -> a root served by rq-mgr."""
    started: list[Path] = []

    def start(queues: dict[str, str], **main: Any) -> Path:
        base = tmp_path / f"rq{len(started)}"
        base.mkdir()
        root = make_root(base, port=free_port(), **main)
        for name, body in queues.items():
            make_queue(root, name, script=write_script(base / f"{name}.sh", body))
        Mgr(root)
        started.append(root)
        queues_running(root, *queues)
        prefix = str(main.get("relative_root", "/")).rstrip("/") + "/"
        auth = tuple(next(iter(main["basic_auth"]["users"].items()))) \
            if "basic_auth" in main else None
        status = requests.get(f"http://127.0.0.1:{port_of(root)}{prefix}q.txt", auth=auth,
                              timeout=10).status_code
        if status == 404:
            pytest.skip("web/api.py does not serve q.txt yet (S15 route 6)")
        return root

    yield start
    for root in started:
        rq_mgr(root, "stop")


def test_idle_rq_is_ok_and_dump_shows_every_value(start_rq: StartRQ) -> None:
    root = start_rq({"alpha": DONE_SCRIPT, "beta": DONE_SCRIPT})
    expect(root, 0, "OK: all queue tests normal")
    code, out, err = result(root, "--dump")
    assert (code, err) == (0, "")
    lines = out.splitlines()
    for queue in ("alpha", "beta"):
        values = [line.split(" ", 1)[1] for line in lines if line.startswith(queue + " ")]
        keys = [v.split(":")[0] for v in values]
        assert keys == ["status", "uptime", "prep", "que", "run", "done", "err", "relayed"]
        assert values[0] == "status: UP"
        assert values[2:] == ["prep: 0", "que: 0", "run: 0", "done: 0", "err: 0", "relayed: 0"]


def test_problems_are_listed_by_queue_name(start_rq: StartRQ) -> None:
    root = start_rq({"alpha": DONE_SCRIPT, "beta": ERR_SCRIPT, "gamma": DONE_SCRIPT})
    send(root, "alpha", 3)
    send(root, "beta")
    wait_for(lambda: counts(root, "alpha")["done"] == 3 and counts(root, "beta")["err"] == 1,
             20, what="3 done in alpha, 1 err in beta")
    assert call_mgr(str(root), "down_queue", "gamma", raw=True)[0] == "ok"
    expect(root, 2, "CRITICAL: alpha: done 3 >= 3, beta: err 1 > 0, gamma: status DOWN",
           "-t", "10:20:2:3")
    expect(root, 2, "CRITICAL: beta: err 1 > 0, gamma: status DOWN")  # default thresholds


def test_backlog_of_a_paused_queue_warns(start_rq: StartRQ) -> None:
    root = start_rq({"alpha": DONE_SCRIPT})
    assert call_mgr(str(root), "pause_queue", "alpha", raw=True)[0] == "ok"
    wait_for(lambda: result(root, "-d")[1].startswith("alpha status: PAUSE"), 20,
             what="alpha PAUSE on q/alpha.txt")
    send(root, "alpha", 2)
    # A paused queue is not UP (S3.5): critical whatever the counts; the backlog is listed too.
    expect(root, 2, "CRITICAL: alpha: status PAUSE, alpha: backlog 2 >= 1",
           "-t", "1:5:100:200")
    assert call_mgr(str(root), "resume_queue", "alpha", raw=True)[0] == "ok"
    wait_for(lambda: counts(root, "alpha")["done"] == 2, 20, what="backlog done")
    expect(root, 1, "WARNING: alpha: done 2 >= 2", "-t", "1:5:2:3")


def test_prefixed_rq_with_basic_auth(start_rq: StartRQ) -> None:
    root = start_rq({"alpha": DONE_SCRIPT}, relative_root="/therq/",
                    basic_auth={"realm": "RQ", "users": {"mon": "s3:cret"}})
    expect(root, 0, "OK: all queue tests normal", "-r", "/therq", "-a", "mon:s3:cret")
    code, out, _ = result(root, "-r", "/therq")
    assert (code, out) == (2, "CRITICAL: Could not Fetch /therq/q.txt\n")
    code, out, _ = result(root, "-a", "mon:s3:cret")             # no prefix: outside ROOT
    assert (code, out) == (2, "CRITICAL: Could not Fetch /q.txt\n")


def test_stopped_rq_is_could_not_connect(start_rq: StartRQ) -> None:
    root = start_rq({"alpha": DONE_SCRIPT})
    expect(root, 0, "OK: all queue tests normal")
    assert rq_mgr(root, "stop").returncode == 0                 # the web server stops with it
    assert result(root) == (2, "CRITICAL: Could not connect\n", "")
