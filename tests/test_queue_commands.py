"""The queue socket (SPEC S7.1 framing, S7.3 commands, S3.5 admin status, S4.8 attachments,
S5.5 run now, S6.8 destroy) against real queue processes, real /bin/sh queue scripts and real
Unix sockets.  No mocks and no fixed sleeps: every wait polls a condition with a deadline."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rq import client, protocol
from rqtest import (QueueProc, decode_reply_frame, make_queue, make_root, raw_exchange,
                    short_id, wait_for, write_script)

DONE_SCRIPT = "#!/bin/sh\necho 'done ok' >&3\n"
BAD_REQUEST = ["fail", "bad request"]

# Every S7.3 command that takes a msg_id, with the ARG shape it takes.
MSG_ID_COMMANDS = ("attach_message", "delete_attach_message", "commit_message", "get_message",
                   "get_message_state", "get_message_status", "delete_message",
                   "destroy_message", "run_message", "clone_message")
ALWAYS_ANSWERED = ("ping", "uptime", "config", "status", "num_messages", "messages")
KNOWN_COMMANDS = set(ALWAYS_ANSWERED) | set(MSG_ID_COMMANDS) | {
    "shutdown", "create_message", "prep_message", "single_que"}


# ---------------------------------------------------------------- fixtures and helpers

def start_queue(procs: list[QueueProc], root: Path, name: str = "test",
                body: str = DONE_SCRIPT, *, paused: bool = False, **cfg: Any) -> QueueProc:
    script = write_script(root.parent / f"{name}.sh", body)
    make_queue(root, name, script, **cfg)
    if paused:
        pause(root, name)
    qp = QueueProc(root, name)
    procs.append(qp)
    return qp


def pause(root: Path, name: str = "test") -> None:
    (root / "config" / f"{name}.pause").touch()


def resume(root: Path, name: str = "test") -> None:
    (root / "config" / f"{name}.pause").unlink()


def gate_script(gates: Path) -> str:
    """A script that reports progress, then waits until the file named by its param1 exists
    in `gates` (the test opens the gate), then completes done."""
    return ("#!/bin/sh\n"
            "echo 'run waiting' >&3\n"
            f"while [ ! -e '{gates}/'\"$RQ_PARAM1\" ]; do sleep 0.02; done\n"
            "echo 'done released' >&3\n")


def ok(reply: Any) -> Any:
    assert isinstance(reply, list) and reply and reply[0] == "ok", reply
    return reply[1]


def create(qp: QueueProc, **fields: Any) -> str:
    return ok(qp.call("create_message", {"dest": qp.name, **fields}))


def sock_path(qp: QueueProc) -> Path:
    return qp.root / "queue" / qp.name / "queue.sock"


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def run_pid(qp: QueueProc, full_id: str) -> int:
    path = qp.root / "queue" / qp.name / "run" / short_id(full_id) / "pid"
    return int(wait_for(lambda: path.exists() and path.read_text().strip(), 10,
                        what="run/ID/pid"))


# ---------------------------------------------------------------- S7.1 on the queue's socket
# (bad frames as such are tested once, on the rq1 server: tests/test_sockserve.py)

@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[QueueProc]:
    """One paused queue shared by the framing tests (they never change its messages)."""
    root = make_root(tmp_path_factory.mktemp("framing"))
    script = write_script(root.parent / "s.sh", DONE_SCRIPT)
    make_queue(root, "test", script)
    pause(root)
    qp = QueueProc(root, "test")
    yield qp
    assert qp.ping(), "the queue process died during the framing tests"
    qp.stop(20)


def test_s7_1_the_queue_process_serves_its_socket_with_the_rq1_server(shared: QueueProc) -> None:
    """Bad frames are tested on the rq1 server itself (tests/test_sockserve.py); this is the
    proof that the queue process answers through it."""
    assert decode_reply_frame(raw_exchange(sock_path(shared), b"rq2 00000004 ")) == BAD_REQUEST
    assert shared.ping()


@pytest.mark.parametrize("cmd", ["create_message", "prep_message", "single_que", "messages",
                                 "get_message", "commit_message", "attach_message",
                                 "delete_message", "clone_message"])
@pytest.mark.parametrize("arg", ["{not json", "{\"dest\": \"test\"", "nan", "'x'", "\xff"])
def test_s7_1_non_json_arg_is_a_bad_request(shared: QueueProc, cmd: str, arg: str) -> None:
    before = shared.counts()
    assert client.call(str(sock_path(shared)), cmd, arg, raw=True) == BAD_REQUEST
    assert shared.counts() == before


JSON_BOMBS = {"deep-array": "[" * 100_000, "deep-object": '{"a":' * 100_000,
              "deep-in-a-field": '{"dest":"test","param1":' + "[" * 100_000,
              "huge-integer": '{"dest":"test","param1":%s}' % ("9" * 5000)}


@pytest.mark.parametrize("cmd", ["create_message", "prep_message", "single_que",
                                 "get_message", "messages"])
@pytest.mark.parametrize("bomb", sorted(JSON_BOMBS))
def test_s7_1_json_bomb_is_a_bad_request_without_a_traceback(shared: QueueProc, cmd: str,
                                                             bomb: str) -> None:
    """Issue 13, D9: JSON nested 100,000 deep (or an integer of 5,000 digits) is a bad request
    (S7.1), not an "internal error" with a traceback in the log."""
    log = shared.root / "log" / "queuemgr.log"
    before = log.stat().st_size
    assert client.call(str(sock_path(shared)), cmd, JSON_BOMBS[bomb], raw=True) == BAD_REQUEST
    assert shared.ping()
    with open(log, "rb") as fh:
        fh.seek(before)
        assert b"Traceback" not in fh.read()


@pytest.mark.parametrize("key", ["param1", "param4", "src", "orig_msg_id"])
@pytest.mark.parametrize("literal", ["1e999", "-1e999", "NaN", "Infinity", "[1, 1e999]",
                                     '{"k": -Infinity}', "[" * 990 + "]" * 990])
def test_s0_3_5_a_field_plain_json_cannot_hold_is_refused(shared: QueueProc, key: str,
                                                          literal: str) -> None:
    """Issue 13, D9: `{"param1": 1e999}` used to be stored as the text "Infinity" (not plain
    JSON, S0.3.5); every field kept as text now refuses what plain JSON cannot write back,
    and so does one nested too deep to write back."""
    before = shared.counts()
    arg = '{"dest": "test", "%s": %s}' % (key, literal)
    reply = client.call(str(sock_path(shared)), "create_message", arg, raw=True)
    assert reply in (["fail", f"invalid {key} value"], BAD_REQUEST)
    assert reply == ["fail", f"invalid {key} value"] or literal.startswith("[[")
    assert shared.counts() == before


def exchange_tolerating_reset(qp: QueueProc, data: bytes, unread_left: bool) -> bytes | None:
    """raw_exchange, but a reset is accepted (-> None) when the client sent more bytes than
    its well-formed frame announced: the server answers the frame it read and closes, and
    the kernel may reset a connection closed with unread input; otherwise it fails."""
    try:
        return raw_exchange(sock_path(qp), data)
    except ConnectionResetError:
        if not unread_left:
            raise
        return None


def expected_reply_kind(payload: bytes) -> str | None:
    """What a well-framed request with this payload must get, or None when it happens to name
    a real command (then any JSON reply is fine)."""
    try:
        text = payload.decode("utf-8")
    except UnicodeDecodeError:
        return "bad"
    cmd, _, _ = text.partition(" ")
    if not cmd:
        return "bad"
    return None if cmd in KNOWN_COMMANDS else "error"


@settings(max_examples=150, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(payload=st.one_of(
    st.binary(max_size=200),
    st.builds(lambda c, a: (c + " " + a).encode(), st.sampled_from(sorted(KNOWN_COMMANDS)),
              st.text(max_size=100)),
    st.builds(lambda c, a: (c + " " + json.dumps(a)).encode(),
              st.sampled_from(sorted(KNOWN_COMMANDS - {"shutdown"})),
              st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=20),
                           lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.sampled_from(
                               ["dest", "msg_id", "state", "limit", "pathname", "name",
                                "attachment_name", "due", "count", "param1"]), inner,
                               max_size=4),
                           max_leaves=8))),
       announced=st.one_of(st.none(), st.integers(0, 400)))
def test_s7_1_random_frames_never_crash_the_queue(shared: QueueProc, payload: bytes,
                                                   announced: int | None) -> None:
    """Well-formed headers around random payloads (plain garbage, real commands with random
    text or random JSON, sizes that lie): every request gets one JSON reply and the daemon
    lives.  The queue is paused, so a message that happens to be created never runs."""
    if payload.startswith(b"shutdown"):
        payload = b"x" + payload
    size = len(payload) if announced is None else announced
    frame = protocol.MAGIC + b"%08d " % size + payload
    raw = exchange_tolerating_reset(shared, frame, size < len(payload))
    assert shared.call("ping") == ["pong"]
    if raw is None:
        return
    reply = decode_reply_frame(raw)
    if size > len(payload):
        assert reply == BAD_REQUEST
        return
    assert reply != ["fail", "internal error"]
    kind = expected_reply_kind(payload[:size])
    if kind == "bad":
        assert reply == BAD_REQUEST
    elif kind == "error":
        assert reply == ["ERROR"]


def test_s7_1_slow_clients_do_not_block_others(shared: QueueProc) -> None:
    """S7.1: a client that sends half a frame and stalls (and one that stalls inside the
    header, and one that sends nothing) does not delay concurrent requests; the stalled
    frame is answered once it is completed."""
    path = str(sock_path(shared))
    stalled = []
    for part in (b"rq1 00000004 pi", b"rq1 000", b""):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(10)
        sock.connect(path)
        sock.sendall(part)
        stalled.append(sock)
    try:
        errors: list[BaseException] = []
        replies: list[Any] = []

        def worker(i: int) -> None:
            try:
                for _ in range(5):
                    replies.append(client.call(path, "ping", timeout=5))
                    replies.append(client.call(path, "get_message_state",
                                               {"msg_id": f"20200101.0000.00.000.{i}"},
                                               timeout=5))
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)
        t0 = time.monotonic()
        threads = [threading.Thread(target=worker, args=(i,)) for i in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(20)
        assert not errors, errors
        assert replies.count(["pong"]) == 80
        assert replies.count(["fail", "msg not found"]) == 80
        assert time.monotonic() - t0 < 10
        stalled[0].sendall(b"ng")
        stalled[0].shutdown(socket.SHUT_WR)
        data = b""
        while chunk := stalled[0].recv(4096):
            data += chunk
        assert decode_reply_frame(data) == ["pong"]
    finally:
        for sock in stalled:
            sock.close()
    assert shared.call("ping") == ["pong"]


# ---------------------------------------------------------------- S7.3 always-answered commands

def test_s7_3_ping_uptime_and_unknown_command(procs: list[QueueProc], root: Path) -> None:
    qp = start_queue(procs, root)
    assert qp.call("ping") == ["pong"]
    up = qp.call("uptime")
    assert isinstance(up, list) and len(up) == 1 and isinstance(up[0], int) and up[0] >= 0
    wait_for(lambda: qp.call("uptime")[0] >= 1, 5, 0.05, what="uptime to count seconds")
    assert qp.call("no_such_command") == ["ERROR"]
    assert qp.call("no_such_command", {"msg_id": "x"}) == ["ERROR"]
    assert qp.call("PING") == ["ERROR"]


def test_s7_3_config_is_the_normalised_config(procs: list[QueueProc], root: Path) -> None:
    """S3.3: every key of the table, defaults applied, numbers as integers, param lists sorted
    without duplicates, schedule entries as given."""
    script = write_script(root.parent / "n.sh", DONE_SCRIPT)
    sched = [{"cron": "*/5 * * * *", "param1": "a", "id": "five"}]
    make_queue(root, "norm", script, num_workers="3", exec_prefix=None,
               coalesce_params=["2", 1, 2], blocking_params=[4, "3"], schedule=sched,
               timeout=2.0, env_vars={"A": "b"})
    qp = QueueProc(root, "norm")
    procs.append(qp)
    assert qp.call("config") == ["ok", {
        "name": "norm", "script": str(script), "num_workers": 3, "exec_prefix": "bash -lc",
        "env_vars": {"A": "b"}, "coalesce_params": [1, 2], "blocking_params": [3, 4],
        "schedule": sched, "timeout": 2, "kill_grace": 10, "mode": "script", "topic": "norm",
        "lease_timeout": 300}]


def test_s7_3_status_follows_the_admin_flags(procs: list[QueueProc], root: Path) -> None:
    """S3.5: DOWN if .down exists, else PAUSE if .pause, else UP; re-read at every request."""
    qp = start_queue(procs, root)
    flags = root / "config"
    assert qp.call("status") == ["UP"]
    (flags / "test.pause").touch()
    assert qp.call("status") == ["PAUSE"]
    (flags / "test.down").touch()
    assert qp.call("status") == ["DOWN"]
    (flags / "test.pause").unlink()
    assert qp.call("status") == ["DOWN"]
    (flags / "test.down").unlink()
    assert qp.call("status") == ["UP"]
    (flags / "other.down").touch()  # another queue's flag
    assert qp.call("status") == ["UP"]


def test_s3_5_down_refuses_every_message_command(procs: list[QueueProc], root: Path,
                                                 tmp_path: Path) -> None:
    """S3.5/S7.3: while DOWN every message command answers ["fail","status: DOWN"] and changes
    nothing; ping, uptime, config, status, num_messages and messages are still answered."""
    qp = start_queue(procs, root)
    done_id = create(qp)
    qp.wait_state(done_id, "done")
    prep_id = ok(qp.call("prep_message", {"dest": "test"}))
    (tmp_path / "f.txt").write_text("x")
    (root / "config" / "test.down").touch()
    before = qp.counts()
    requests: list[tuple[str, Any]] = [
        ("create_message", {"dest": "test"}), ("prep_message", {"dest": "test"}),
        ("single_que", {"dest": "test"}),
        ("attach_message", {"msg_id": prep_id, "pathname": str(tmp_path / "f.txt")}),
        ("delete_attach_message", {"msg_id": prep_id, "attachment_name": "f.txt"}),
        ("commit_message", {"msg_id": prep_id}), ("get_message", {"msg_id": done_id}),
        ("get_message_state", {"msg_id": done_id}), ("get_message_status", {"msg_id": done_id}),
        ("delete_message", {"msg_id": done_id}), ("destroy_message", {"msg_id": done_id}),
        ("run_message", {"msg_id": done_id}), ("clone_message", {"msg_id": done_id}),
        ("delete_message", {}), ("get_message", None),
    ]
    for cmd, arg in requests:
        assert qp.call(cmd, arg) == ["fail", "status: DOWN"], cmd
    assert qp.call("ping") == ["pong"]
    assert isinstance(qp.call("uptime")[0], int)
    assert ok(qp.call("config"))["name"] == "test"
    assert qp.call("status") == ["DOWN"]
    assert qp.counts() == before == {"prep": 1, "que": 0, "run": 0, "done": 1, "relayed": 0,
                                     "err": 0}
    assert qp.call("messages", {"state": "done"}) == [{"msg_id": short_id(done_id)}]
    assert qp.call("no_such_command") == ["ERROR"]
    (root / "config" / "test.down").unlink()
    assert qp.state(done_id) == "done" and qp.state(prep_id) == "prep"


def test_s3_5_pause_accepts_messages_but_starts_nothing(procs: list[QueueProc],
                                                        root: Path) -> None:
    qp = start_queue(procs, root, paused=True)
    assert qp.call("status") == ["PAUSE"]
    full = create(qp)
    assert qp.state(full) == "que"
    assert qp.counts()["que"] == 1
    prep = ok(qp.call("prep_message", {"dest": "test"}))
    assert qp.call("commit_message", {"msg_id": prep}) == ["ok", "msg commited"]
    assert qp.state(prep) == "que" and qp.state(full) == "que"


def test_s5_1_resumed_queue_starts_a_due_message_within_1s(procs: list[QueueProc],
                                                          root: Path) -> None:
    qp = start_queue(procs, root, paused=True)
    due = time.time() + 1
    full = create(qp, due=due)
    queued = root / "queue" / "test" / "que" / short_id(full)
    # The loop wakes at the message's due time and finds the queue paused; after that no
    # request is sent (a request would itself trigger a pass): watch the directory only.
    wait_for(lambda: time.time() >= due + 0.5, 5, what="the message to be due while paused")
    assert queued.exists()
    resume(root)
    wait_for(lambda: not queued.exists(), 1.5, what="a start within 1 s of the resume")


def test_s7_3_shutdown_stops_the_queue_process(procs: list[QueueProc], root: Path) -> None:
    qp = start_queue(procs, root)
    qdir = root / "queue" / "test"
    assert (qdir / "queue.pid").read_text().strip() == str(qp.popen.pid)
    assert qp.call("shutdown") == ["ok"]
    assert qp.popen.wait(10) == 0
    assert not (qdir / "queue.pid").exists()


# ---------------------------------------------------------------- num_messages and messages

def test_s7_3_num_messages_counts_every_state(procs: list[QueueProc], root: Path,
                                              tmp_path: Path) -> None:
    gates = tmp_path / "gates"
    gates.mkdir()
    body = gate_script(gates) + "\n"
    qp = start_queue(procs, root, body=body)
    assert qp.counts() == dict.fromkeys(("prep", "que", "run", "done", "relayed", "err"), 0)
    ok(qp.call("prep_message", {"dest": "test"}))
    running = create(qp, param1="a")
    wait_for(lambda: qp.counts()["run"] == 1, what="a running job")
    create(qp, param1="b")
    create(qp, param1="c")
    assert qp.counts() == {"prep": 1, "que": 2, "run": 1, "done": 0, "relayed": 0, "err": 0}
    for gate in "abc":
        (gates / gate).touch()
    wait_for(lambda: qp.counts()["done"] == 3, what="three done")
    assert qp.counts() == {"prep": 1, "que": 0, "run": 0, "done": 3, "relayed": 0, "err": 0}
    assert qp.state(running) == "done"


def test_s7_3_messages_invalid_state(procs: list[QueueProc], root: Path) -> None:
    qp = start_queue(procs, root)
    for bad in ("bogus", "deleted", "DONE", "que "):
        assert qp.call("messages", {"state": bad}) == [
            "fail", f"invalid or missing 'state' field ({bad})"]
    reply = qp.call("messages", {})
    assert reply[0] == "fail" and reply[1].startswith("invalid or missing 'state' field (")
    reply = qp.call("messages")
    assert reply[0] == "fail" and reply[1].startswith("invalid or missing 'state' field (")


def test_s7_3_messages_que_is_in_scheduling_order(procs: list[QueueProc], root: Path) -> None:
    """S7.3/S5.1: que lists by ascending (due, short id) with {msg_id, due, dest}; limit cuts
    the list."""
    qp = start_queue(procs, root, paused=True)
    now = int(time.time())
    dues = [now + 300, now + 100, now + 200, now + 100, now - 50, now + 100.5]
    made = []
    for due in dues:
        made.append((due, short_id(create(qp, due=due, dest="elsewhere"))))
    expected = [{"msg_id": i, "due": d, "dest": "elsewhere"} for d, i in sorted(made)]
    assert qp.call("messages", {"state": "que"}) == expected
    assert qp.call("messages", {"state": "que", "limit": 2}) == expected[:2]
    assert qp.call("messages", {"state": "que", "limit": 0}) == []


def test_s7_3_messages_prep_err_and_done_are_newest_first(procs: list[QueueProc], root: Path,
                                                          tmp_path: Path) -> None:
    body = "#!/bin/sh\nif [ \"$RQ_PARAM1\" = bad ]; then echo 'err bad' >&3; exit 0; fi\n" \
           "echo 'done good' >&3\n"
    qp = start_queue(procs, root, body=body)
    preps = [short_id(ok(qp.call("prep_message", {"dest": "test"}))) for _ in range(3)]
    dones, errs = [], []
    for i in range(6):
        kind = "bad" if i % 2 else "good"
        full = create(qp, param1=kind)
        qp.wait_state(full, "err" if kind == "bad" else "done")
        (errs if kind == "bad" else dones).append(short_id(full))
    assert qp.call("messages", {"state": "prep"}) == [{"msg_id": i} for i in sorted(preps)[::-1]]
    assert qp.call("messages", {"state": "err"}) == [{"msg_id": i} for i in sorted(errs)[::-1]]
    assert qp.call("messages", {"state": "done"}) == [{"msg_id": i}
                                                      for i in sorted(dones)[::-1]]
    assert qp.call("messages", {"state": "done", "limit": 2}) == [
        {"msg_id": i} for i in sorted(dones)[::-1][:2]]
    assert qp.call("messages", {"state": "prep", "limit": 1}) == [{"msg_id": max(preps)}]
    assert qp.call("messages", {"state": "err", "limit": 1}) == [{"msg_id": max(errs)}]
    assert qp.call("messages", {"state": "relayed"}) == []
    assert qp.call("messages", {"state": "run"}) == []


def put_message(qdir: Path, state: str, msg_id: str, **fields: Any) -> Path:
    """Place a message directory on disk the way a previous run would have left it."""
    if state in ("done", "relayed"):
        path = qdir / state / msg_id[0:8] / msg_id[9:11] / msg_id[11:13] / msg_id
    else:
        path = qdir / state / msg_id
    path.mkdir(parents=True)
    (path / "msg").write_text(json.dumps({"msg_id": msg_id, "dest": "test", **fields}))
    return path


def test_s7_3_messages_default_limit_is_1000(procs: list[QueueProc], root: Path) -> None:
    """S7.3: without `limit` at most 1000 entries, for hashdir states too; newest first across
    day, hour and minute buckets (S3.2)."""
    script = write_script(root.parent / "s.sh", DONE_SCRIPT)
    qdir = make_queue(root, "test", script)
    err_ids = [f"20200101.0000.00.000.{n}" for n in range(1000, 2005)]
    for msg_id in err_ids:
        put_message(qdir, "err", msg_id)
    done_ids = [f"2019{m:02d}{d:02d}.{h:02d}{mi:02d}.00.000.{n}"
                for n, (m, d, h, mi) in enumerate(
                    [(1, 1, 0, 0), (1, 1, 0, 1), (1, 1, 23, 59), (12, 31, 0, 0), (6, 15, 12, 30)]
                    * 201)]
    done_ids = sorted(set(done_ids))
    for msg_id in done_ids:
        put_message(qdir, "done", msg_id)
    qp = QueueProc(root, "test")
    procs.append(qp)
    assert qp.counts()["err"] == 1005 and qp.counts()["done"] == len(done_ids) == 1005
    listed = qp.call("messages", {"state": "err"})
    assert listed == [{"msg_id": i} for i in sorted(err_ids, reverse=True)[:1000]]
    assert len(qp.call("messages", {"state": "err", "limit": 5000})) == 1005
    # S3.2 newest first: reverse order of day, hour and minute buckets, then of ids
    by_bucket = sorted(done_ids, key=lambda i: (i[0:8], i[9:11], i[11:13], i), reverse=True)
    assert qp.call("messages", {"state": "done"}) == [{"msg_id": i} for i in by_bucket[:1000]]
    assert qp.call("messages", {"state": "done", "limit": 3}) == [
        {"msg_id": i} for i in by_bucket[:3]]


def test_s7_3_messages_run_shows_the_live_status(procs: list[QueueProc], root: Path,
                                                 tmp_path: Path) -> None:
    gates = tmp_path / "gates"
    gates.mkdir()
    body = ("#!/bin/sh\necho 'run step one' >&3\n"
            f"while [ ! -e '{gates}/one' ]; do sleep 0.02; done\n"
            "echo 'run step two' >&3\n"
            f"while [ ! -e '{gates}/two' ]; do sleep 0.02; done\n"
            "echo 'done finished' >&3\n")
    qp = start_queue(procs, root, body=body)
    full = create(qp, dest="somewhere")
    entry = {"msg_id": short_id(full), "status": "step one", "dest": "somewhere"}
    wait_for(lambda: qp.call("messages", {"state": "run"}) == [entry], what="step one")
    (gates / "one").touch()
    entry["status"] = "step two"
    wait_for(lambda: qp.call("messages", {"state": "run"}) == [entry], what="step two")
    assert qp.message(full)["status"] == "run - step two"
    (gates / "two").touch()
    qp.wait_state(full, "done")
    assert qp.call("messages", {"state": "run"}) == []


def test_s7_3_messages_relayed_entries(procs: list[QueueProc], root: Path) -> None:
    remote = "http://10.0.0.9:3333/q/other/20200101.0000.00.000.7"
    body = f"#!/bin/sh\necho 'relayed sent to {remote}' >&3\n"
    qp = start_queue(procs, root, body=body)
    full = create(qp, dest="http://10.0.0.9:3333/q/other")
    qp.wait_state(full, "relayed")
    assert qp.call("messages", {"state": "relayed"}) == [{
        "msg_id": short_id(full), "status": f"relayed - sent to {remote}",
        "dest": "http://10.0.0.9:3333/q/other", "new_msg": remote}]
    assert qp.call("messages", {"state": "relayed", "limit": 0}) == []
    assert qp.counts()["relayed"] == 1


# ---------------------------------------------------------------- missing msg_id, lookups

@pytest.mark.parametrize("cmd", MSG_ID_COMMANDS)
def test_s7_3_missing_msg_id(shared: QueueProc, cmd: str) -> None:
    for arg in ({}, None, {"msg_id": ""}, {"msg_id": None}, {"pathname": "/etc/hostname"}):
        assert shared.call(cmd, arg) == ["fail", "lacking 'msg_id' field"], (cmd, arg)


@pytest.mark.parametrize("cmd", ["get_message", "get_message_state", "get_message_status",
                                 "delete_message", "destroy_message", "run_message",
                                 "clone_message"])
def test_s7_3_unknown_msg_id_is_not_found(shared: QueueProc, cmd: str) -> None:
    for ref in ("20200101.0000.00.000.1", "http://127.0.0.1:3333/q/test/20200101.0000.00.000.1"):
        assert shared.call(cmd, {"msg_id": ref}) == ["fail", "msg not found"], (cmd, ref)


def test_s7_3_commit_and_attach_of_unknown_message(shared: QueueProc, tmp_path: Path) -> None:
    f = tmp_path / "a.txt"
    f.write_text("a")
    missing = "20200101.0000.00.000.1"
    assert shared.call("commit_message", {"msg_id": missing}) == ["fail", "cannot find message"]
    assert shared.call("attach_message", {"msg_id": missing, "pathname": str(f)}) == [
        "fail", "cannot find message"]
    assert shared.call("delete_attach_message",
                       {"msg_id": missing, "attachment_name": "a.txt"}) == [
        "fail", "msg not found"]


def test_s4_5_get_message_state_and_status(procs: list[QueueProc], root: Path) -> None:
    """S4.5 fields; S4.2: a full id with another host, port and prefix names the local
    queue's message."""
    qp = start_queue(procs, root, body="#!/bin/sh\necho 'done done sleeping' >&3\n")
    full = create(qp, param2="p")
    qp.wait_state(full, "done")
    sid = short_id(full)
    rel = f"queue/test/done/{sid[0:8]}/{sid[9:11]}/{sid[11:13]}/{sid}"
    msg = qp.message(full)
    assert msg["path"] == rel and msg["state"] == "done"
    assert msg["status"] == "done - done sleeping"
    assert msg["msg_id"] == sid and msg["param2"] == "p" and msg["dest"] == "test"
    assert "_attachments" not in msg
    for ref in (full, sid, f"http://elsewhere.example:9/prefix/q/test/{sid}"):
        assert qp.call("get_message_state", {"msg_id": ref}) == ["ok", "done"]
        assert qp.call("get_message_status", {"msg_id": ref}) == [
            "ok", {"path": rel, "status": "done - done sleeping", "state": "done"}]
    prep = ok(qp.call("prep_message", {"dest": "test"}))
    assert qp.call("get_message_status", {"msg_id": prep}) == [
        "ok", {"path": f"queue/test/prep/{short_id(prep)}", "status": "prep", "state": "prep"}]
    assert qp.message(prep)["status"] == "prep"


def test_s7_3_get_message_of_an_unreadable_msg_file(procs: list[QueueProc],
                                                    root: Path) -> None:
    qp = start_queue(procs, root)
    prep = ok(qp.call("prep_message", {"dest": "test"}))
    (root / "queue" / "test" / "prep" / short_id(prep) / "msg").write_text("{torn")
    assert qp.call("get_message", {"msg_id": prep}) == ["fail", "msg couldn't be read"]
    assert qp.call("get_message_state", {"msg_id": prep}) == ["ok", "prep"]
    assert qp.ping()


def test_s7_3_get_message_of_a_message_moving_through_its_states(procs: list[QueueProc],
                                                                 root: Path) -> None:
    """A message read while it moves que → run → done is looked up again, never
    answered "msg couldn't be read" (STYLE habit 2; seen once in CI)."""
    qp = start_queue(procs, root, num_workers=2)
    replies: list[Any] = []
    for _ in range(30):
        full = create(qp)
        while True:  # read it over and over while it runs to done
            reply = qp.call("get_message", {"msg_id": full})
            replies.append(reply)
            if reply[0] != "ok" or reply[1]["state"] == "done":
                break
    assert [r for r in replies if r[0] != "ok"] == []
    assert {r[1]["state"] for r in replies} >= {"done"}


# ---------------------------------------------------------------- attachments (S4.8)

def md5(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()


def test_s4_8_attach_hard_links_and_reports_md5(procs: list[QueueProc], root: Path,
                                                tmp_path: Path) -> None:
    qp = start_queue(procs, root, paused=True)
    prep = ok(qp.call("prep_message", {"dest": "test"}))
    src = tmp_path / "report.csv"
    content = b"a,b\n1,2\n"
    src.write_bytes(content)
    assert qp.call("attach_message", {"msg_id": prep, "pathname": str(src)}) == [
        "ok", f"{md5(content)}-Attached successfully"]
    adir = root / "queue" / "test" / "prep" / short_id(prep) / "attach"
    assert (adir / "report.csv").stat().st_ino == src.stat().st_ino  # hard link, same fs
    assert sorted(os.listdir(adir)) == ["report.csv"]  # no .tmp left behind
    assert qp.message(prep)["_attachments"] == {"report.csv": {
        "md5": md5(content), "size": 8, "path": str(adir / "report.csv")}}
    # a name given explicitly; local_fs_only is fine on the same filesystem
    assert qp.call("attach_message", {"msg_id": prep, "pathname": str(src), "name": "other",
                                      "local_fs_only": "true"})[0] == "ok"
    assert sorted(qp.message(prep)["_attachments"]) == ["other", "report.csv"]


def test_s4_8_same_name_replaces(procs: list[QueueProc], root: Path, tmp_path: Path) -> None:
    qp = start_queue(procs, root, paused=True)
    prep = ok(qp.call("prep_message", {"dest": "test"}))
    first, second = tmp_path / "one", tmp_path / "two"
    first.write_bytes(b"first version")
    second.write_bytes(b"second, longer version")
    assert ok(qp.call("attach_message", {"msg_id": prep, "pathname": str(first),
                                         "name": "data"})).startswith(md5(b"first version"))
    assert qp.call("attach_message", {"msg_id": prep, "pathname": str(second),
                                      "name": "data"}) == [
        "ok", f"{md5(b'second, longer version')}-Attached successfully"]
    att = qp.message(prep)["_attachments"]
    assert list(att) == ["data"]
    assert att["data"]["md5"] == md5(b"second, longer version") and att["data"]["size"] == 22
    assert first.read_bytes() == b"first version"  # the replaced source is untouched


@pytest.fixture
def shm_file() -> Iterator[Path]:
    """A file on /dev/shm, a tmpfs: another filesystem than the queue's."""
    if not os.path.isdir("/dev/shm"):
        pytest.skip("no /dev/shm")
    fd, name = tempfile.mkstemp(dir="/dev/shm", prefix="rqtest-")
    os.write(fd, b"bytes from another filesystem\n")
    os.close(fd)
    yield Path(name)
    os.unlink(name)


def test_s4_8_attachment_on_another_filesystem_is_copied(
        procs: list[QueueProc], root: Path, shm_file: Path) -> None:
    if shm_file.stat().st_dev == root.stat().st_dev:
        pytest.skip("/dev/shm is on the same filesystem as the test root")
    qp = start_queue(procs, root, paused=True)
    prep = ok(qp.call("prep_message", {"dest": "test"}))
    assert qp.call("attach_message", {"msg_id": prep, "pathname": str(shm_file)}) == [
        "ok", f"{md5(shm_file.read_bytes())}-Attached successfully"]
    copy = root / "queue" / "test" / "prep" / short_id(prep) / "attach" / shm_file.name
    assert copy.read_bytes() == shm_file.read_bytes()
    assert copy.stat().st_dev != shm_file.stat().st_dev
    for flag in (True, "true", "yes", "1", 1):
        assert qp.call("attach_message", {"msg_id": prep, "pathname": str(shm_file),
                                          "name": "strict", "local_fs_only": flag}) == [
            "fail", f"Attachment must be on same filesystem as que: {shm_file}"]
    assert list(qp.message(prep)["_attachments"]) == [shm_file.name]
    for flag in (False, "no", 0, "false"):
        assert qp.call("attach_message", {"msg_id": prep, "pathname": str(shm_file),
                                          "name": "lenient", "local_fs_only": flag})[0] == "ok"


def test_s4_8_every_refusal_text(procs: list[QueueProc], root: Path, tmp_path: Path) -> None:
    qp = start_queue(procs, root, paused=True)
    prep = ok(qp.call("prep_message", {"dest": "test"}))
    good = tmp_path / "good.txt"
    good.write_text("ok")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    dotfile = tmp_path / ".hidden"
    dotfile.write_text("x")
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "nowhere")

    def attach(pathname: Any, **extra: Any) -> Any:
        return qp.call("attach_message", {"msg_id": prep, "pathname": pathname, **extra})

    assert attach("good.txt") == [
        "fail", "Invalid pathname, must be normalized good.txt (ie. must start with /"]
    assert attach(f"{tmp_path}/missing") == [
        "fail", f"No such file {tmp_path}/missing to attach to message"]
    assert attach(str(dangling)) == ["fail", f"No such file {dangling} to attach to message"]
    assert attach(str(tmp_path)) == [
        "fail", f"Attachment currently cannot be a directory {tmp_path}"]
    assert attach(str(fifo)) == ["fail", f"Attachment currently not of supported type: {fifo}"]
    assert attach("/dev/null") == [
        "fail", "Attachment currently not of supported type: /dev/null"]
    assert attach(str(dotfile)) == ["fail", "Attachment name as a dot-file not allowed: .hidden"]
    assert attach(str(good), name=".x") == [
        "fail", "Attachment name as a dot-file not allowed: .x"]
    for bad in "/~?[]%|$&<>":
        name = f"a{bad}b"
        assert attach(str(good), name=name) == [
            "fail", f"Attachment name has invalid character. not allowed: {name}"], name
    assert "_attachments" not in qp.message(prep)
    committed = create(qp)
    assert attach(str(good))[0] == "ok"
    assert qp.call("attach_message", {"msg_id": committed, "pathname": str(good)}) == [
        "fail", "msg not in prep"]


@pytest.mark.skipif(os.geteuid() == 0, reason="root can read any file")
def test_s4_8_unreadable_attachment(procs: list[QueueProc], root: Path, tmp_path: Path) -> None:
    qp = start_queue(procs, root, paused=True)
    prep = ok(qp.call("prep_message", {"dest": "test"}))
    secret = tmp_path / "secret"
    secret.write_text("x")
    secret.chmod(0)
    assert qp.call("attach_message", {"msg_id": prep, "pathname": str(secret)}) == [
        "fail", f"Attachment currently cannot be read: {secret}"]


def test_s4_8_delete_attach_message(procs: list[QueueProc], root: Path, tmp_path: Path) -> None:
    qp = start_queue(procs, root, paused=True)
    prep = ok(qp.call("prep_message", {"dest": "test"}))
    src = tmp_path / "f.bin"
    src.write_bytes(b"\x00\x01")
    ok(qp.call("attach_message", {"msg_id": prep, "pathname": str(src)}))
    ok(qp.call("attach_message", {"msg_id": prep, "pathname": str(src), "name": "keep"}))

    def delete(name: Any) -> Any:
        return qp.call("delete_attach_message", {"msg_id": prep, "attachment_name": name})

    for name in ("nope", "", None, ".", "..", "../msg", "attach"):
        assert delete(name) == ["fail", "No attachment with that name for msg"], name
    assert delete("f.bin") == ["ok", "Attachment deleted successfully"]
    assert delete("f.bin") == ["fail", "No attachment with that name for msg"]
    assert list(qp.message(prep)["_attachments"]) == ["keep"]
    assert src.read_bytes() == b"\x00\x01"
    assert qp.call("commit_message", {"msg_id": prep}) == ["ok", "msg commited"]
    assert delete("keep") == ["fail", "msg not in prep"]
    assert list(qp.message(prep)["_attachments"]) == ["keep"]


# ---------------------------------------------------------------- commit, delete

def test_s7_3_commit_message_is_idempotent(procs: list[QueueProc], root: Path) -> None:
    qp = start_queue(procs, root)
    prep = ok(qp.call("prep_message", {"dest": "test", "due": time.time() + 3600}))
    assert qp.state(prep) == "prep"
    assert qp.call("commit_message", {"msg_id": prep}) == ["ok", "msg commited"]
    assert qp.state(prep) == "que"
    assert qp.call("commit_message", {"msg_id": prep}) == ["ok", "msg already committed"]
    ok(qp.call("run_message", {"msg_id": prep}))
    qp.wait_state(prep, "done")
    assert qp.call("commit_message", {"msg_id": prep}) == ["ok", "msg already committed"]
    assert qp.counts() == {"prep": 0, "que": 0, "run": 0, "done": 1, "relayed": 0, "err": 0}


def test_s5_1_commit_starts_the_job_before_replying(procs: list[QueueProc], root: Path,
                                                    tmp_path: Path) -> None:
    gates = tmp_path / "gates"
    gates.mkdir()
    qp = start_queue(procs, root, body=gate_script(gates))
    prep = ok(qp.call("prep_message", {"dest": "test", "param1": "g"}))
    assert qp.call("commit_message", {"msg_id": prep}) == ["ok", "msg commited"]
    assert qp.state(prep) == "run"
    (gates / "g").touch()
    qp.wait_state(prep, "done")


def test_s7_3_delete_message_in_every_state(procs: list[QueueProc], root: Path,
                                            tmp_path: Path) -> None:
    gates = tmp_path / "gates"
    gates.mkdir()
    body = ("#!/bin/sh\ncase \"$RQ_PARAM1\" in\n"
            "  done) echo 'done d' >&3 ;;\n"
            "  err) echo 'err e' >&3 ;;\n"
            "  relayed) echo 'relayed http://h:1/q/x/20200101.0000.00.000.1' >&3 ;;\n"
            f"  *) while [ ! -e '{gates}/go' ]; do sleep 0.02; done; echo 'done late' >&3 ;;\n"
            "esac\n")
    qp = start_queue(procs, root, body=body, num_workers=2)
    qdir = root / "queue" / "test"
    finished = {s: create(qp, param1=s) for s in ("done", "err", "relayed")}
    for state, full in finished.items():
        qp.wait_state(full, state)
    running = create(qp, param1="wait")
    qp.wait_state(running, "run")
    pause(root)
    queued = create(qp, param1="later")
    prep = ok(qp.call("prep_message", {"dest": "test"}))
    assert qp.counts() == {"prep": 1, "que": 1, "run": 1, "done": 1, "relayed": 1, "err": 1}

    assert qp.call("delete_message", {"msg_id": running}) == [
        "fail", "cannot delete message in run state"]
    assert qp.state(running) == "run"
    for full in (prep, queued, *finished.values()):
        path = qp.root / qp.message(full)["path"]
        assert qp.call("delete_message", {"msg_id": full}) == ["ok", "msg deleted"]
        assert not path.exists()
        assert qp.call("get_message", {"msg_id": full}) == ["fail", "msg not found"]
        assert qp.call("delete_message", {"msg_id": full}) == ["fail", "msg not found"]
    assert qp.counts() == {"prep": 0, "que": 0, "run": 1, "done": 0, "relayed": 0, "err": 0}
    assert [p.name for p in qdir.iterdir() if p.name.startswith(".deleting")] == []
    (gates / "go").touch()
    qp.wait_state(running, "done")
    assert qp.call("delete_message", {"msg_id": running}) == ["ok", "msg deleted"]
    assert qp.counts()["done"] == 0


def test_s5_3_delete_a_waiting_dup(procs: list[QueueProc], root: Path, tmp_path: Path) -> None:
    """S7.3: delete_message removes a coalesced message waiting on its running parent (S5.3);
    the parent then finishes without it and the other dup follows the parent."""
    gates = tmp_path / "gates"
    gates.mkdir()
    qp = start_queue(procs, root, body=gate_script(gates), coalesce_params=[1])
    blocker = create(qp, param1="b")
    qp.wait_state(blocker, "run")
    parent, dup, keep = (create(qp, param1="g") for _ in range(3))
    (gates / "b").touch()
    qp.wait_state(parent, "run")  # started after the blocker: dup and keep attached to it
    assert qp.state(dup) == "que" and qp.counts()["que"] == 2
    assert qp.call("delete_message", {"msg_id": dup}) == ["ok", "msg deleted"]
    assert qp.counts()["que"] == 1
    (gates / "g").touch()
    qp.wait_state(parent, "done")
    qp.wait_state(keep, "done")
    assert qp.message(parent)["dups"] == [keep]
    assert qp.message(keep)["status"] == f"done - duplicate {parent}"
    assert qp.call("get_message", {"msg_id": dup}) == ["fail", "msg not found"]


# ---------------------------------------------------------------- destroy (S6.8)

def test_s6_8_destroy_sends_sigterm_to_the_whole_group(procs: list[QueueProc], root: Path,
                                                       tmp_path: Path) -> None:
    child_pid_file = tmp_path / "child.pid"
    body = ("#!/bin/sh\necho 'run sleeping' >&3\n"
            f"sleep 1000 & echo $! > '{child_pid_file}'\nwait\n")
    qp = start_queue(procs, root, body=body)
    full = create(qp)
    pid = run_pid(qp, full)
    child = int(wait_for(lambda: child_pid_file.exists() and child_pid_file.read_text().strip(),
                         what="the job's child pid"))
    assert os.getpgid(child) == pid
    assert qp.call("destroy_message", {"msg_id": full}) == ["ok", "msg destroyed"]
    qp.wait_state(full, "err")
    assert qp.message(full)["status"] == (
        "err - PROCESS EXITED IMPROPERLY - MOVING TO ERR - Completion was  but exit status "
        f"was pid {pid} SIGTERM (signal 15)")
    wait_for(lambda: gone(child), 5, what="the job's child to die with its group")
    path = root / "queue" / "test" / "err" / short_id(full)
    assert not (path / "pid").exists() and not (path / "proc.json").exists()
    assert qp.call("destroy_message", {"msg_id": full}) == ["fail", "msg not running"]


def test_s6_8_destroy_escalates_to_sigkill_after_kill_grace(procs: list[QueueProc],
                                                            root: Path) -> None:
    body = "#!/bin/sh\ntrap '' TERM\necho 'run stubborn' >&3\nwhile :; do sleep 0.05; done\n"
    qp = start_queue(procs, root, body=body, kill_grace=0.3)
    full = create(qp)
    pid = run_pid(qp, full)
    wait_for(lambda: [e["status"] for e in qp.call("messages", {"state": "run"})] == ["stubborn"],
             what="the TERM trap to be set")
    assert qp.call("destroy_message", {"msg_id": full}) == ["ok", "msg destroyed"]
    qp.wait_state(full, "err", 10)
    assert qp.message(full)["status"].endswith(
        f"Completion was  but exit status was pid {pid} SIGKILL (signal 9)")
    wait_for(lambda: gone(pid), 5, what="the job to be gone")


def test_s7_3_destroy_of_a_message_that_is_not_running(procs: list[QueueProc],
                                                       root: Path) -> None:
    qp = start_queue(procs, root)
    done = create(qp)
    qp.wait_state(done, "done")
    pause(root)
    queued = create(qp)
    prep = ok(qp.call("prep_message", {"dest": "test"}))
    for full in (done, queued, prep):
        assert qp.call("destroy_message", {"msg_id": full}) == ["fail", "msg not running"]
    assert qp.state(queued) == "que" and qp.state(prep) == "prep"


# ---------------------------------------------------------------- run_message (S5.5)

def test_s5_5_run_message_moves_to_the_front(procs: list[QueueProc], root: Path) -> None:
    qp = start_queue(procs, root, paused=True)
    now = time.time()
    early = create(qp, due=now + 100)
    late = create(qp, due=now + 500)
    t0 = time.time()
    assert qp.call("run_message", {"msg_id": late}) == ["ok", "msg sent to front of run queue"]
    listed = qp.call("messages", {"state": "que"})
    assert [e["msg_id"] for e in listed] == [short_id(late), short_id(early)]
    due = listed[0]["due"]
    assert due <= t0 + 1  # min(now, earliest due - 1)
    stored = json.loads((root / "queue" / "test" / "que" / short_id(late) / "msg").read_text())
    assert stored["due"] == due
    # an earlier message already past due: the new due goes one second before it
    old = create(qp, due=now - 1000)
    assert qp.call("run_message", {"msg_id": early}) == ["ok", "msg sent to front of run queue"]
    listed = qp.call("messages", {"state": "que"})
    assert listed[0]["msg_id"] == short_id(early)
    assert listed[0]["due"] == pytest.approx(now - 1000 - 1, abs=0.002)
    assert listed[1]["msg_id"] == short_id(old)


def test_s5_5_run_message_starts_at_once_on_an_up_queue(procs: list[QueueProc], root: Path,
                                                        tmp_path: Path) -> None:
    gates = tmp_path / "gates"
    gates.mkdir()
    qp = start_queue(procs, root, body=gate_script(gates))
    full = create(qp, due=time.time() + 3600, param1="g")
    assert qp.state(full) == "que"
    assert qp.call("run_message", {"msg_id": full}) == ["ok", "msg sent to front of run queue"]
    assert qp.state(full) == "run"  # synchronous with the reply (S5.1)
    assert qp.call("run_message", {"msg_id": full}) == ["fail", "msg already running"]
    (gates / "g").touch()
    qp.wait_state(full, "done")
    assert qp.call("run_message", {"msg_id": full}) == ["fail", "msg not in runnable state"]
    prep = ok(qp.call("prep_message", {"dest": "test"}))
    assert qp.call("run_message", {"msg_id": prep}) == ["fail", "msg not in runnable state"]


# ---------------------------------------------------------------- clone_message

def test_s7_3_clone_copies_the_listed_fields(procs: list[QueueProc], root: Path,
                                             tmp_path: Path) -> None:
    qp = start_queue(procs, root, body="#!/bin/sh\necho 'err by design' >&3\n")
    src_file = tmp_path / "payload"
    src_file.write_bytes(b"attached")
    prep = ok(qp.call("prep_message", {
        "dest": "http://example.com:3333/q/far", "src": "me", "param1": "1", "param2": "2",
        "param3": "3", "param4": "4", "count": 4, "max_count": 9, "force_remote": True,
        "orig_msg_id": "http://o:1/q/x/20200101.0000.00.000.1", "due": 1_600_000_000.5}))
    ok(qp.call("attach_message", {"msg_id": prep, "pathname": str(src_file)}))
    ok(qp.call("commit_message", {"msg_id": prep}))
    qp.wait_state(prep, "err")
    pause(root)
    reply = qp.call("clone_message", {"msg_id": prep})
    clone = ok(reply)
    assert clone.startswith("http://127.0.0.1:3333/q/test/") and clone != prep
    assert qp.state(clone) == "que"
    stored = json.loads((root / "queue/test/que" / short_id(clone) / "msg").read_text())
    assert stored == {
        "msg_id": short_id(clone), "dest": "http://example.com:3333/q/far", "src": "me",
        "param1": "1", "param2": "2", "param3": "3", "param4": "4", "due": 1_600_000_000.5,
        "count": 0, "max_count": 9, "orig_msg_id": "http://o:1/q/x/20200101.0000.00.000.1",
        "force_remote": True, "cloned_from": short_id(prep)}
    src_att = root / "queue/test/err" / short_id(prep) / "attach" / "payload"
    new_att = root / "queue/test/que" / short_id(clone) / "attach" / "payload"
    assert new_att.stat().st_ino == src_att.stat().st_ino  # hard-linked
    assert qp.message(clone)["_attachments"]["payload"]["md5"] == md5(b"attached")
    assert qp.message(clone)["status"] == "que"
    assert qp.state(prep) == "err"  # the source stays


def test_s7_3_clone_from_done_and_relayed_and_refusals(procs: list[QueueProc], root: Path,
                                                       tmp_path: Path) -> None:
    body = ("#!/bin/sh\nif [ \"$RQ_PARAM1\" = r ]; then "
            "echo 'relayed http://h:1/q/x/20200101.0000.00.000.1' >&3; exit 0; fi\n"
            "echo 'done fine' >&3\n")
    qp = start_queue(procs, root, body=body)
    done = create(qp, post_run_webhook="http://hook.example/a http://hook.example/b")
    relayed = create(qp, param1="r")
    qp.wait_state(done, "done")
    qp.wait_state(relayed, "relayed")
    pause(root)
    c1 = ok(qp.call("clone_message", {"msg_id": done}))
    c2 = ok(qp.call("clone_message", {"msg_id": relayed}))
    m1, m2 = qp.message(c1), qp.message(c2)
    assert m1["cloned_from"] == short_id(done)
    assert m1["post_run_webhook"] == ["http://hook.example/a", "http://hook.example/b"]
    assert m2["cloned_from"] == short_id(relayed) and m2["param1"] == "r"
    assert m1["orig_msg_id"] == done  # orig_msg_id defaulted to the source's own full id
    assert "_attachments" not in m1
    prep = ok(qp.call("prep_message", {"dest": "test"}))
    assert qp.call("clone_message", {"msg_id": prep}) == [
        "fail", "cannot clone message in prep state"]
    assert qp.call("clone_message", {"msg_id": c1}) == [
        "fail", "cannot clone message in que state"]


def test_s7_3_clone_of_a_running_message_and_of_an_unreadable_one(
        procs: list[QueueProc], root: Path, tmp_path: Path) -> None:
    gates = tmp_path / "gates"
    gates.mkdir()
    body = ("#!/bin/sh\nif [ \"$RQ_PARAM1\" = e ]; then echo 'err x' >&3; exit 0; fi\n"
            + gate_script(gates).split("\n", 1)[1])
    qp = start_queue(procs, root, body=body, num_workers=2)
    err = create(qp, param1="e")
    qp.wait_state(err, "err")
    running = create(qp, param1="g")
    qp.wait_state(running, "run")
    assert qp.call("clone_message", {"msg_id": running}) == [
        "fail", "cannot clone message in run state"]
    (root / "queue/test/err" / short_id(err) / "msg").write_text("not json")
    assert qp.call("clone_message", {"msg_id": err}) == ["fail", "msg couldn't be cloned"]
    assert qp.counts()["que"] == 0 and qp.counts()["prep"] == 0
    (gates / "g").touch()
    qp.wait_state(running, "done")
