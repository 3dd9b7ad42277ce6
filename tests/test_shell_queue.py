"""`rq push` / `rq pop`: the shell message queue (issue 18 item 1, seed 000).

Every `rq` here is a real process (`bin/rq`) talking to a real queue process
(`python -m rq.queue`) of a pull queue (S8) in a temporary root; pipelines are
real pipes.  Lease expiry (S8.3) is what brings back a message whose pop
failed, so the queues use a 1 s lease."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rqtest import REPO, QueueProc, make_queue, make_root, read_events, short_id, wait_for

RQ = str(REPO / "bin" / "rq")
BINARY = bytes(range(256)) * 64 + b"\x00\r\n\xff no final newline"


def env() -> dict[str, str]:
    out = {k: v for k, v in os.environ.items() if k not in ("RQ_ROOT", "RQ_FS_FAULTS")}
    out["PYTHONPATH"] = str(REPO)
    return out


def rq(root: Path, *args: str, data: bytes = b"", timeout: float = 60) -> tuple[int, bytes, str]:
    res = subprocess.run([RQ, "--root", str(root), *args], input=data, capture_output=True,
                         env=env(), timeout=timeout, check=False)
    err = res.stderr.decode()
    assert "Traceback" not in err, err
    return res.returncode, res.stdout, err


STARTED: list[subprocess.Popen[bytes]] = []


def start_rq(root: Path, *args: str, **kw: Any) -> subprocess.Popen[bytes]:
    kw.setdefault("start_new_session", True)  # its own group: teardown reaches --exec's sh too
    proc = subprocess.Popen([RQ, "--root", str(root), *args], env=env(), **kw)
    STARTED.append(proc)
    return proc


@pytest.fixture(autouse=True)
def reap_started() -> Iterator[None]:
    """A test that fails half-way leaves no `rq` running behind it."""
    yield
    while STARTED:
        proc = STARTED.pop()
        if proc.poll() is None:  # not reaped yet, so its group id is still its own
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return make_root(tmp_path)


@pytest.fixture
def jobs(root: Path) -> Iterator[QueueProc]:
    make_queue(root, "jobs", mode="pull", lease_timeout=1)
    q = QueueProc(root, "jobs")
    yield q
    q.stop()


def push(root: Path, data: bytes, queue: str = "jobs") -> str:
    code, out, err = rq(root, "push", queue, data=data)
    assert (code, err) == (0, ""), err
    assert re.fullmatch(rb"ok http://127\.0\.0\.1:\d+/q/%s/[\d.]+\n" % queue.encode(), out), out
    return out[3:-1].decode()


def set_main(root: Path, **keys: Any) -> None:
    path = root / "config" / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **keys}))


def test_round_trip_of_binary_bytes(root: Path, jobs: QueueProc) -> None:
    """Any bytes in, the same bytes out; the body is the message's `body`
    attachment (S4.8), shown on the message page; done only after the write."""
    full = push(root, BINARY)
    msg = jobs.message(full)
    assert (msg["state"], msg["src"], msg["dest"]) == ("que", "push", "jobs")
    assert msg["_attachments"]["body"]["size"] == len(BINARY)
    assert rq(root, "pop", "jobs") == (0, BINARY, "")
    assert jobs.message(full)["status"] == "done - popped"
    assert rq(root, "push", "jobs", data=b"")[0] == 0
    assert rq(root, "pop", "jobs") == (0, b"", "")


def test_body_on_the_message_page(tmp_path: Path) -> None:
    """The body is the message's `body` attachment on the dashboard (S15
    route 24), through a real rq-mgr and its queue process."""
    from webtest import build_root, running

    from rq.web import create_app

    root = build_root(tmp_path)
    make_queue(root, "jobs", mode="pull")
    with running(root):
        wait_for(lambda: (root / "queue" / "jobs" / "queue.sock").exists(), what="queue")
        full = push(root, BINARY)
        web = create_app(str(root)).test_client()
        page = web.get(f"/q/jobs/{short_id(full)}")
        assert page.status_code == 200 and b"/attach/body" in page.data
        assert web.get(f"/q/jobs/{short_id(full)}/attach/body").data == BINARY
        assert rq(root, "pop", "jobs") == (0, BINARY, "")


def test_push_and_pop_in_click_runner(root: Path, jobs: QueueProc) -> None:
    """The same commands through rq.cli.app under click's CliRunner (STYLE 14):
    stdin and stdout without file descriptors."""
    from click.testing import CliRunner

    from rq.cli import app

    runner = CliRunner()
    pushed = runner.invoke(app.cli, ["--root", str(root), "push", "jobs"], input=b"text body\n")
    assert pushed.exit_code == 0 and pushed.output.startswith("ok http://"), pushed.output
    popped = runner.invoke(app.cli, ["--root", str(root), "pop", "jobs"])
    assert (popped.exit_code, popped.output) == (0, "text body\n")
    assert jobs.message(pushed.output[3:-1])["state"] == "done"


def test_default_queue_and_missing_queue(root: Path, jobs: QueueProc) -> None:
    assert rq(root, "push", data=b"x") == (1, b"", "rq: no queue given and no default_queue "
                                           "in config/config.json (rq push QUEUE)\n")
    assert rq(root, "push", "nosuch", data=b"x") == (1, b"", "rq: queue not found: nosuch\n")
    set_main(root, default_queue="jobs")
    code, out, _ = rq(root, "push", data=b"to the default")
    assert code == 0 and jobs.message(out[3:-1].decode())["state"] == "que"
    set_main(root, default_queue="no/queue")
    assert rq(root, "push", data=b"x") == (
        1, b"", "rq: bad config file config/config.json: default_queue must be a queue name\n")
    assert rq(root, "pop") == (1, b"", "rq: missing queue name (rq pop QUEUE)\n")


def test_oversize_stdin_is_refused_and_nothing_queued(root: Path, jobs: QueueProc) -> None:
    set_main(root, push_max_bytes=1000)
    assert rq(root, "push", "jobs", data=b"y" * 1001) == (
        1, b"", "rq: stdin is larger than push_max_bytes (1000 bytes): nothing queued\n")
    assert sum(jobs.counts().values()) == 0
    assert sum(1 for _ in (root / "queue" / "jobs" / "prep").iterdir()) == 0
    push(root, b"y" * 1000)
    assert jobs.counts()["que"] == 1


def test_pop_refusals(root: Path, jobs: QueueProc) -> None:
    make_queue(root, "scripted", "/bin/true")
    scripted = QueueProc(root, "scripted")
    try:
        assert rq(root, "pop", "scripted") == (
            1, b"", "rq: queue scripted: queue is not in pull mode\n")
    finally:
        scripted.stop()
    assert rq(root, "pop", "jobs") == (1, b"", "rq: no message in queue jobs\n")
    assert rq(root, "pop", "jobs", "--loop") == (1, b"", "rq: --loop needs --exec CMD\n")
    assert rq(root, "pop", "jobs", "--wait", "x") == (1, b"", "rq: invalid --wait: x (seconds)\n")


def test_pop_waits_for_a_push(root: Path, jobs: QueueProc) -> None:
    popper = start_rq(root, "pop", "jobs", "--wait", "30", stdout=subprocess.PIPE)
    wait_for(lambda: jobs.call("lease_waiters") == ["ok", 1], what="pop to wait")
    push(root, b"late")
    out, _ = popper.communicate(timeout=30)
    assert (popper.returncode, out) == (0, b"late")


def returns_to_que(jobs: QueueProc, full: str) -> None:
    """S8.3: no report → the lease expires → que, count + 1: not lost."""
    jobs.wait_state(full, "que", timeout=20)
    msg = jobs.message(full)
    assert (msg["count"], msg["status"]) == (1, "que - LEASE EXPIRED - MOVING TO QUE")


def test_pipeline_killed_mid_pop(root: Path, jobs: QueueProc) -> None:
    """`rq pop jobs | reader`: the pipeline killed while the body (larger than
    a pipe buffer) is being written → no report; after the lease expiry the
    message is back in que and a later pop gets all of it."""
    body = os.urandom(4 * 1024 * 1024)
    full = push(root, body)
    popper = start_rq(root, "pop", "jobs", stdout=subprocess.PIPE)
    assert popper.stdout is not None
    assert len(popper.stdout.read(65536)) == 65536  # the write is under way
    assert jobs.state(full) == "run"
    os.killpg(popper.pid, signal.SIGKILL)
    popper.wait(10)
    popper.stdout.close()
    returns_to_que(jobs, full)
    assert rq(root, "pop", "jobs")[:2] == (0, body)
    assert jobs.state(full) == "done"


def test_broken_pipe_is_not_done(root: Path, jobs: QueueProc) -> None:
    """The reader goes away (EPIPE): one clear line, exit 1, no `done`."""
    full = push(root, os.urandom(1024 * 1024))
    popper = start_rq(root, "pop", "jobs", stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert popper.stdout is not None and popper.stderr is not None
    popper.stdout.read(10)
    popper.stdout.close()
    err = popper.stderr.read().decode()
    popper.stderr.close()
    assert popper.wait(30) == 1
    assert err == (f"rq: cannot write {full} to stdout (Broken pipe): it returns to queue "
                   "jobs when its lease expires\n")
    returns_to_que(jobs, full)


def test_two_pops_racing_get_each_message_once(root: Path, jobs: QueueProc) -> None:
    """Two one-shot pops started together take the two messages, one each."""
    bodies = {b"first", b"second"}
    for body in sorted(bodies):
        push(root, body)
    pops = [start_rq(root, "pop", "jobs", "--wait", "10", stdout=subprocess.PIPE)
            for _ in range(2)]
    outs = {p.communicate(timeout=30)[0] for p in pops}
    assert outs == bodies and [p.returncode for p in pops] == [0, 0]


def test_two_loops_racing(root: Path, jobs: QueueProc, tmp_path: Path) -> None:
    """`--loop` workers: 40 messages shared by two racing loops, each message
    run by exactly one of them once; both exit when idle for --wait s."""
    fulls = {push(root, f"m{n}\n".encode()): f"m{n}" for n in range(40)}
    loops = [start_rq(root, "pop", "jobs", "--exec", f"cat >> {tmp_path / f'out{i}'}",
                      "--loop", "--wait", "2") for i in range(2)]
    assert [p.wait(120) for p in loops] == [0, 0]
    seen = [(tmp_path / f"out{i}").read_text().split() if (tmp_path / f"out{i}").exists()
            else [] for i in range(2)]
    assert sorted(seen[0] + seen[1]) == sorted(fulls.values())
    assert jobs.counts()["done"] == 40
    ends = [e for e in read_events(root, "jobs") if e["to"] == "done"]
    assert sorted(e["msg_id"] for e in ends) == sorted(short_id(f) for f in fulls)


def test_exec_success_and_failure(root: Path, jobs: QueueProc, tmp_path: Path) -> None:
    """--exec: body on stdin, the message's RQ_* variables set; exit 0 → done,
    else err with the last stderr line (stderr passed through)."""
    ok = push(root, b"hello")
    out = tmp_path / "out"
    code, _, err = rq(root, "pop", "jobs", "--exec",
                      f'tr a-z A-Z > {out}; echo "$RQ_MSG_ID" >> {out}')
    assert (code, err) == (0, "")
    assert out.read_text() == f"HELLO{short_id(ok)}\n"
    assert jobs.message(ok)["status"] == "done - exit status 0"
    bad = push(root, b"data")
    code, _, err = rq(root, "pop", "jobs", "--exec",
                      'cat >/dev/null; echo first >&2; echo "bad input  here" >&2; exit 3')
    assert (code, err) == (0, "first\nbad input  here\n")
    assert jobs.message(bad)["status"] == "err - bad input here"
    silent = push(root, b"data")
    assert rq(root, "pop", "jobs", "--exec", "exit 4")[0] == 0
    assert jobs.message(silent)["status"] == "err - exit status 4"


@pytest.mark.parametrize("prefix", ["", "exec 2>&-; "])
def test_exec_renews_the_lease_while_it_runs(root: Path, jobs: QueueProc, tmp_path: Path,
                                             prefix: str) -> None:
    """A command that outlives the 1 s lease (also one that closed its
    stderr): renewed every third of it, so the message is done once, never
    expired and requeued."""
    full = push(root, b"slow")
    flag = tmp_path / "go"
    popper = start_rq(root, "pop", "jobs", "--exec",
                      f"{prefix}while [ ! -e {flag} ]; do sleep 0.1; done")
    wait_for(lambda: jobs.state(full) == "run", what="the lease")
    msg = jobs.message(full)
    lease_file = root / msg["path"] / "lease.json"
    first = json.loads(lease_file.read_text())["expires"]
    wait_for(lambda: json.loads(lease_file.read_text())["expires"] > first + 2.5, 20,
             what="three renewals")
    flag.touch()
    assert popper.wait(30) == 0
    msg = jobs.message(full)
    assert (msg["state"], msg["count"]) == ("done", 0)


def test_pop_imports_only_what_it_uses() -> None:
    """`rq pop` in a shell loop pays for every import (issue 15): no typing,
    dataclasses, config records or psutil on its path (`--exec` loads rq.proc)."""
    import sys

    probe = ("import sys\nfrom rq.cli import base, entry\n"
             "assert base.load_command('pop') is not None\n"
             "print(' '.join(sorted(sys.modules)))\n")
    res = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         env=env(), timeout=60, check=True)
    heavy = {"dataclasses", "inspect", "typing", "rq.config", "rq.proc", "psutil", "tempfile",
             "rq.cli.helptext", "click"}
    assert not heavy & set(res.stdout.split())
