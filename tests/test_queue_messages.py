"""Messages through a real queue process: S4.4 input rules and the stored `msg` file, S4.1 ids
(format, uniqueness under concurrent creation), S5.6 single_que, S3.2 hashdir placement and the
S13 event log.  Real queue processes, real /bin/sh queue scripts, real sockets, no mocks; every
wait polls a condition with a deadline."""

from __future__ import annotations

import calendar
import json
import os
import re
import subprocess
import sys
import threading
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rq import client
from rq.events import FIELDS, decode_line
from rq.message import STORED_FIELDS
from rqtest import QueueProc, make_queue, make_root, read_events, short_id, wait_for, write_script

DONE_SCRIPT = "#!/bin/sh\necho 'done ok' >&3\n"
ID_RE = re.compile(r"^\d{8}\.\d{4}\.\d{2}\.\d{3}\.\d+$")
FULL_PREFIX = "http://127.0.0.1:3333/q/test/"


def start_queue(procs: list[QueueProc], root: Path, name: str = "test",
                body: str = DONE_SCRIPT, *, paused: bool = False, **cfg: Any) -> QueueProc:
    script = write_script(root.parent / f"{name}.sh", body)
    make_queue(root, name, script, **cfg)
    if paused:
        (root / "config" / f"{name}.pause").touch()
    qp = QueueProc(root, name)
    procs.append(qp)
    return qp


@pytest.fixture(scope="module")
def paused(tmp_path_factory: pytest.TempPathFactory) -> Iterator[QueueProc]:
    """One paused queue for the input-rule tests: its messages stay in que."""
    root = make_root(tmp_path_factory.mktemp("inputs"))
    make_queue(root, "test", write_script(root.parent / "s.sh", DONE_SCRIPT))
    (root / "config" / "test.pause").touch()
    qp = QueueProc(root, "test")
    yield qp
    qp.stop(20)


def ok(reply: Any) -> Any:
    assert isinstance(reply, list) and reply and reply[0] == "ok", reply
    return reply[1]


def stored(qp: QueueProc, full_id: str) -> dict[str, Any]:
    """The msg file on disk, wherever the message is."""
    path = qp.root / qp.message(full_id)["path"] / "msg"
    return json.loads(path.read_text())


def create_stored(qp: QueueProc, fields: dict[str, Any]) -> dict[str, Any]:
    return stored(qp, ok(qp.call("create_message", fields)))


# ---------------------------------------------------------------- S4.4 input rules

def test_s4_4_minimal_message_and_the_msg_file(paused: QueueProc) -> None:
    before = int(time.time())
    full = ok(paused.call("create_message", {"dest": "test"}))
    after = time.time()
    assert full.startswith(FULL_PREFIX)
    sid = short_id(full)
    msg = stored(paused, full)
    assert msg == {"msg_id": sid, "dest": "test", "due": msg["due"], "count": 0,
                   "max_count": 15, "orig_msg_id": full}
    assert isinstance(msg["due"], int) and before <= msg["due"] <= after
    assert paused.state(full) == "que"


def test_s4_4_other_keys_are_dropped(paused: QueueProc) -> None:
    """S4.4: only the input keys are taken; the msg file holds only stored fields, never
    computed ones (status, state, path, process data)."""
    msg = create_stored(paused, {
        "dest": "test", "_method": "prep", "x_format": "json", "status": "done - fake",
        "state": "done", "path": "/etc", "msg_id": "20000101.0000.00.000.1", "pid": 1,
        "cloned_from": "x", "dups": ["x"], "dup": "x", "_attachments": {}, "job_status": "x",
        "mesg": {"param1": "a"}, "param5": "5"})
    assert set(msg) == {"msg_id", "dest", "due", "count", "max_count", "orig_msg_id"}
    assert msg["msg_id"] != "20000101.0000.00.000.1"


@pytest.mark.parametrize("fields", [{}, {"dest": ""}, {"dest": None}, {"src": "x"},
                                    {"dest": ["test"]}])
@pytest.mark.parametrize("cmd", ["create_message", "prep_message", "single_que"])
def test_s4_4_missing_dest(paused: QueueProc, cmd: str, fields: dict[str, Any]) -> None:
    before = paused.counts()
    assert paused.call(cmd, fields) == ["fail", 'input missing required "dest" parameter']
    assert paused.call(cmd, ["not", "an", "object"]) == [
        "fail", 'input missing required "dest" parameter']
    assert paused.call(cmd) == ["fail", 'input missing required "dest" parameter']
    assert paused.counts() == before


@pytest.mark.parametrize(("given", "kept"), [
    ("text", "text"), (5, "5"), (-2.5, "-2.5"), (True, "true"), (False, "false"),
    ({"b": [1, 2], "a": "é"}, '{"b":[1,2],"a":"é"}'), ([1, "x", None], '[1,"x",null]'),
    ("", ""), (None, None),
])
def test_s4_4_params_are_stored_as_text(paused: QueueProc, given: Any, kept: Any) -> None:
    msg = create_stored(paused, {"dest": "test", "param1": given, "param2": given,
                                 "param3": given, "param4": given})
    for key in ("param1", "param2", "param3", "param4"):
        if kept is None:
            assert key not in msg
        else:
            assert msg[key] == kept


@pytest.mark.parametrize(("given", "kept"), [
    (1700000000, 1700000000), (1700000000.25, 1700000000.25), ("1700000000", 1700000000),
    ("1700000000.5", 1700000000.5), (0, 0), (4102444800, 4102444800),
])
def test_s4_4_due_is_a_number(paused: QueueProc, given: Any, kept: Any) -> None:
    msg = create_stored(paused, {"dest": "test", "due": given})
    assert msg["due"] == kept and type(msg["due"]) is type(kept)


@pytest.mark.parametrize("given", ["soon", "", "12abc", True, [1], {"at": 1}, "nan", "inf",
                                   "1e999"])
def test_s4_4_invalid_due(paused: QueueProc, given: Any) -> None:
    assert paused.call("create_message", {"dest": "test", "due": given}) == [
        "fail", "invalid due value"]


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity", "1e400",
                                     "1" + "0" * 400])
def test_s4_4_non_finite_or_huge_due_is_refused(paused: QueueProc, literal: str) -> None:
    """Python's JSON reader accepts NaN/Infinity and integers of any size; none is a usable due
    (S0.3.5 plain JSON), so they are refused and the queue keeps working."""
    arg = '{"dest": "test", "due": %s}' % literal
    before = paused.counts()
    sock = str(paused.root / "queue" / "test" / "queue.sock")
    assert client.call(sock, "create_message", arg, raw=True) == ["fail", "invalid due value"]
    assert paused.counts() == before
    assert paused.ping()


@pytest.mark.parametrize(("key", "given", "kept"), [
    ("count", 3, 3), ("count", "7", 7), ("count", 0, 0), ("count", 2.0, 2),
    ("max_count", 0, 0), ("max_count", "40", 40), ("max_count", None, 15), ("count", None, 0),
])
def test_s4_4_count_and_max_count(paused: QueueProc, key: str, given: Any, kept: int) -> None:
    msg = create_stored(paused, {"dest": "test", key: given})
    assert msg[key] == kept and type(msg[key]) is int


@pytest.mark.parametrize("key", ["count", "max_count"])
@pytest.mark.parametrize("given", [-1, "-1", "x", "1.5", 1.5, True, [], {}, "3x"])
def test_s4_4_invalid_count_and_max_count(paused: QueueProc, key: str, given: Any) -> None:
    assert paused.call("create_message", {"dest": "test", key: given}) == [
        "fail", f"invalid {key} value"]


@pytest.mark.parametrize(("given", "kept"), [
    ("http://a.example/x http://b.example/y", ["http://a.example/x", "http://b.example/y"]),
    ("  http://a.example/x\n\thttp://b.example/y  ", ["http://a.example/x",
                                                      "http://b.example/y"]),
    ("http://only.example", ["http://only.example"]),
    (["http://a.example/x", "http://b.example/y"], ["http://a.example/x", "http://b.example/y"]),
    ([], None), ("", None), ("   ", None), (None, None),
])
def test_s4_4_post_run_webhook(paused: QueueProc, given: Any, kept: Any) -> None:
    msg = create_stored(paused, {"dest": "test", "post_run_webhook": given})
    assert msg.get("post_run_webhook") == kept


@pytest.mark.parametrize("given", [5, {"url": "x"}, ["http://a", 5], True])
def test_s4_4_invalid_post_run_webhook(paused: QueueProc, given: Any) -> None:
    assert paused.call("create_message", {"dest": "test", "post_run_webhook": given}) == [
        "fail", "invalid post_run_webhook value"]


@pytest.mark.parametrize(("given", "kept"), [
    (True, True), ("true", True), ("yes", True), ("1", True), (1, True),
    (False, None), ("no", None), ("0", None), (0, None), ("TRUE", None), ("", None),
    (None, None),
])
def test_s4_4_force_remote(paused: QueueProc, given: Any, kept: Any) -> None:
    msg = create_stored(paused, {"dest": "test", "force_remote": given})
    assert msg.get("force_remote") is kept


def test_s4_4_every_input_key_is_kept(paused: QueueProc) -> None:
    full = ok(paused.call("create_message", {
        "dest": "http://remote.example:3333/q/far", "src": "cron", "param1": "a",
        "param2": "b", "param3": "c", "param4": "d", "due": 1234567890, "count": 2,
        "max_count": 3, "orig_msg_id": "http://o.example:1/q/x/20100625.0127.35.122.7509656",
        "post_run_webhook": ["http://hook.example/"], "force_remote": "yes"}))
    assert stored(paused, full) == {
        "msg_id": short_id(full), "dest": "http://remote.example:3333/q/far", "src": "cron",
        "param1": "a", "param2": "b", "param3": "c", "param4": "d", "due": 1234567890,
        "count": 2, "max_count": 3,
        "orig_msg_id": "http://o.example:1/q/x/20100625.0127.35.122.7509656",
        "post_run_webhook": ["http://hook.example/"], "force_remote": True}


def test_s4_4_a_1_mib_message_is_accepted(procs: list[QueueProc], root: Path) -> None:
    """In pull mode, where params travel over a socket (S8.2); a script-mode queue refuses
    params no job's environment can hold (next test)."""
    qp = start_queue(procs, root, "pulled", mode="pull")
    big = "x" * (1 << 20)
    wide = "é€😀" * 50_000
    full = ok(qp.call("create_message", {"dest": "pulled", "param1": big, "param2": wide,
                                         "param3": {"k": big}, "param4": "a\u0000b"}))
    msg = qp.message(full)
    assert msg["param1"] == big and msg["param2"] == wide and msg["param4"] == "a\0b"
    assert msg["param3"] == json.dumps({"k": big}, separators=(",", ":"))
    assert stored(qp, full)["param1"] == big


ENV_MAX = 131072 - len("RQ_PARAM1=") - 1  # Linux MAX_ARG_STRLEN, with the name and the NUL


@pytest.mark.parametrize("cmd", ["create_message", "prep_message", "single_que"])
@pytest.mark.parametrize(("key", "value", "reason"), [
    ("param1", "x" * (ENV_MAX + 1), f"param1 too large for a job's environment "
                                    f"({ENV_MAX + 1} bytes, at most {ENV_MAX})"),
    ("param4", "é" * 70_000, f"param4 too large for a job's environment "
                             f"(140000 bytes, at most {ENV_MAX})"),
    ("param2", "x" * 60_000_000, f"param2 too large for a job's environment "
                                 f"(60000000 bytes, at most {ENV_MAX})"),
    ("param3", "a\0b", "param3 holds a NUL character, which a job's environment cannot carry"),
    ("dest", "test\0", "dest holds a NUL character, which a job's environment cannot carry"),
])
def test_s6_2_params_no_job_environment_can_hold_are_refused_at_create(
        paused: QueueProc, cmd: str, key: str, value: str, reason: str) -> None:
    """Issue 13, D10: a script-mode queue used to accept them, then the job could not start
    (exit 127, or err for a NUL); now the create fails with the reason and nothing is kept."""
    before = paused.counts()
    assert paused.call(cmd, {"dest": "test", key: value}) == ["fail", reason]
    assert paused.counts() == before


def test_s6_2_the_largest_param_that_fits_reaches_the_job(procs: list[QueueProc],
                                                          root: Path) -> None:
    qp = start_queue(procs, root, "big", '#!/bin/sh\necho "done ${#RQ_PARAM1}" >&3\n')
    full = ok(qp.call("create_message", {"dest": "big", "param1": "y" * ENV_MAX}))
    qp.wait_state(full, "done")
    assert qp.message(full)["status"] == f"done - {ENV_MAX}"


@pytest.mark.parametrize("cmd", ["prep_message", "single_que"])
def test_s4_4_the_same_rules_for_prep_and_single_que(paused: QueueProc, cmd: str) -> None:
    assert paused.call(cmd, {"dest": "test", "count": "x"}) == ["fail", "invalid count value"]
    assert paused.call(cmd, {"dest": "test", "due": "x"}) == ["fail", "invalid due value"]


def test_s4_4_msg_file_holds_only_stored_fields_after_a_run(procs: list[QueueProc],
                                                           root: Path) -> None:
    """After a resend, a completion and a clone, the msg file still holds stored fields only."""
    body = ("#!/bin/sh\nif [ \"$RQ_COUNT\" = 0 ]; then echo 'resend 0-again' >&3; exit 0; fi\n"
            "echo 'run working' >&3\necho 'done finished' >&3\n")
    qp = start_queue(procs, root, body=body)
    full = ok(qp.call("create_message", {"dest": "test", "status": "x", "_method": "y"}))
    qp.wait_state(full, "done")
    msg = stored(qp, full)
    assert set(msg) <= set(STORED_FIELDS)
    assert msg["count"] == 1
    (root / "config" / "test.pause").touch()
    clone = ok(qp.call("clone_message", {"msg_id": full}))
    assert set(stored(qp, clone)) <= set(STORED_FIELDS)
    for state_dir in (root / "queue" / "test").glob("*/"):
        if state_dir.name.startswith("."):
            continue  # .spare/ (rq.spares): empty msg files not used yet
        for msg_file in state_dir.rglob("msg"):
            assert set(json.loads(msg_file.read_text())) <= set(STORED_FIELDS), msg_file


# ---------------------------------------------------------------- S4.1 ids

def id_epoch(msg_id: str) -> float:
    day, hhmm, ss, ms = msg_id.split(".")[:4]
    t = (int(day[:4]), int(day[4:6]), int(day[6:8]), int(hhmm[:2]), int(hhmm[2:]), int(ss))
    return calendar.timegm((*t, 0, 0, 0)) + int(ms) / 1000


def test_s4_1_ids_are_unique_under_concurrent_creation(procs: list[QueueProc],
                                                       root: Path) -> None:
    """8 threads x 100 create_message on a paused queue: 800 distinct ids of the S4.1 form,
    each encoding its creation time (UTC, ms), all in que on disk and in the listing."""
    qp = start_queue(procs, root, paused=True)
    results: list[list[str]] = [[] for _ in range(8)]
    errors: list[BaseException] = []

    def worker(out: list[str]) -> None:
        try:
            for _ in range(100):
                out.append(ok(qp.call("create_message", {"dest": "test"})))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    t0 = time.time()
    threads = [threading.Thread(target=worker, args=(out,)) for out in results]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    t1 = time.time()
    assert not errors, errors[:3]
    fulls = [f for out in results for f in out]
    ids = [short_id(f) for f in fulls]
    assert len(ids) == 800 and len(set(ids)) == 800
    assert all(f == FULL_PREFIX + i for f, i in zip(fulls, ids))
    for msg_id in ids:
        assert ID_RE.match(msg_id), msg_id
        assert t0 - 0.002 <= id_epoch(msg_id) <= t1 + 0.002, msg_id
    for out in results:  # one thread's ids sort by creation time to the millisecond
        stamps = [short_id(f)[:20] for f in out]
        assert stamps == sorted(stamps)
    assert qp.counts() == {"prep": 0, "que": 800, "run": 0, "done": 0, "relayed": 0, "err": 0}
    assert sorted(os.listdir(root / "queue" / "test" / "que")) == sorted(ids)
    assert os.listdir(root / "queue" / "test" / "prep") == []
    listed = qp.call("messages", {"state": "que"})
    assert sorted(e["msg_id"] for e in listed) == sorted(ids)


def test_enqueue_batches_the_creates_that_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    """rq.queue.enqueue: the first create commits alone and at once; the creates
    arriving while it runs wait and are committed together by the next leader;
    every caller gets its own result, and a failed one its own Fail."""
    from types import SimpleNamespace

    from rq.errors import Fail
    from rq.queue.enqueue import Enqueue
    enqueue = Enqueue(SimpleNamespace())  # type: ignore[arg-type]
    batches: list[list[str]] = []
    first_inside, release = threading.Event(), threading.Event()

    def fake_create_batch(specs: list) -> list:
        names = [fields["n"] for fields, _ in specs]
        batches.append(names)
        if len(batches) == 1:
            first_inside.set()
            release.wait(30)
        return [("", Fail("no " + n)) if n == "bad" else ("id-" + n, None) for n in names]

    monkeypatch.setattr(enqueue, "create_batch", fake_create_batch)
    results: dict[str, object] = {}

    def caller(n: str) -> None:
        try:
            results[n] = enqueue.submit({"n": n})
        except Fail as exc:
            results[n] = exc.args[0]

    first = threading.Thread(target=caller, args=("0",))
    first.start()
    assert first_inside.wait(10)
    others = [threading.Thread(target=caller, args=(n,)) for n in ("1", "2", "3", "bad")]
    for t in others:
        t.start()
    wait_for(lambda: len(enqueue._pending) == 4, 10, what="four creates waiting")
    release.set()
    for t in [first, *others]:
        t.join(10)
    assert batches == [["0"], ["1", "2", "3", "bad"]]
    assert results == {"0": "id-0", "1": "id-1", "2": "id-2", "3": "id-3", "bad": "no bad"}


@pytest.mark.parametrize("fields", [
    {"dest": "test", "param1": "\ud800"},
    {"dest": "test", "param3": ["a", "\udfff"]},
    {"dest": "test", "post_run_webhook": "http://h/\ud83d"},
    {"dest": "\ud800"},
], ids=["param1", "param3-list", "webhook", "dest"])
def test_s4_4_unencodable_text_is_refused_alone(paused: QueueProc, fields: dict[str, Any]
                                               ) -> None:
    """Legal JSON that no UTF-8 msg file can hold (a lone surrogate) is this
    request's own clear refusal, and leaves nothing in prep (issue 13, D4)."""
    reply = paused.call("create_message", json.dumps(fields), raw=True)  # \ud800 escapes
    assert reply[0] == "fail" and "not valid Unicode text" in reply[1], reply
    assert os.listdir(paused.root / "queue" / "test" / "prep") == []


def test_d4_a_bad_create_never_fails_the_others_in_its_batch(procs: list[QueueProc],
                                                           root: Path) -> None:
    """Issue 13, D4: over the socket, creates that cannot be stored race normal
    creates committed in the same batches; before the fix most normal creates
    failed with the bad one's codec error and bad ones left orphans in prep."""
    qp = start_queue(procs, root, paused=True)
    replies: dict[str, list[Any]] = {"good": [], "bad": []}
    lock = threading.Lock()

    def worker(kind: str) -> None:
        fields = {"dest": "test", "param1": "\ud800" if kind == "bad" else "fine"}
        for _ in range(40):
            reply = qp.call("create_message", json.dumps(fields), raw=True)
            with lock:
                replies[kind].append(reply)

    threads = [threading.Thread(target=worker, args=(kind,))
               for kind in ("good", "bad") * 4]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(replies["good"]) == 160 and len(replies["bad"]) == 160
    assert [r for r in replies["good"] if r[0] != "ok"] == []
    assert {tuple(r) for r in replies["bad"]} == {
        ("fail", "invalid param1 value: not valid Unicode text")}
    assert qp.counts()["que"] == 160
    assert os.listdir(root / "queue" / "test" / "prep") == []


def test_concurrent_creates_share_one_flush_of_the_journal(root: Path) -> None:
    """create_message requests in flight together are committed as one batch
    (rq.queue.enqueue): one fdatasync of the create journal for the batch (no
    fsync of the msg, of its directory or of que/: rq.queue.journal), yet every
    reply is its own id, every id is in que and fsck is clean."""
    from rq.fsck import check_root
    from rqtest import learn_ops
    make_queue(root, "b", script="/bin/true")
    (root / "config" / "b.pause").touch()
    n_threads, per_thread = 8, 40
    ids: list[str] = []
    lock = threading.Lock()

    def hammer(q: QueueProc) -> None:
        def worker() -> None:
            for _ in range(per_thread):
                reply = q.call("create_message", {"dest": "b"})
                assert reply[0] == "ok", reply
                with lock:
                    ids.append(reply[1])
        threads = [threading.Thread(target=worker) for _ in range(n_threads)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)

    ops = learn_ops(root, "b", hammer)
    total = n_threads * per_thread
    assert len(set(ids)) == total
    fsyncs = sum(1 for op, _ in ops if op == "fsync")
    # before the journal: two fsyncs per create and one of que/ per batch (~2.25 * total);
    # now one per batch of ~4-6 and the first segment's name
    assert 2 <= fsyncs < total / 2, fsyncs
    report = check_root(str(root))
    assert report.problems == []
    assert sorted(report.states["b"]) == sorted(i.rsplit("/", 1)[-1] for i in ids)
    assert set(report.states["b"].values()) == {"que"}


def test_s4_1_prep_ids_are_unique_across_concurrent_kinds(procs: list[QueueProc],
                                                          root: Path) -> None:
    qp = start_queue(procs, root, paused=True)
    out: list[str] = []
    lock = threading.Lock()

    def worker(cmd: str) -> None:
        for _ in range(40):
            full = ok(qp.call(cmd, {"dest": "test"}))
            with lock:
                out.append(full)

    threads = [threading.Thread(target=worker, args=(cmd,))
               for cmd in ("create_message", "prep_message") * 3]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(out) == 240 and len(set(out)) == 240
    assert qp.counts()["prep"] == 120 and qp.counts()["que"] == 120


def test_s2_7_a_que_message_with_an_unusable_due_does_not_stop_start_up(
        procs: list[QueueProc], root: Path) -> None:
    qdir = make_queue(root, "test", write_script(root.parent / "s.sh", DONE_SCRIPT))
    msg_id = "20200101.0000.00.000.1"
    (qdir / "que" / msg_id).mkdir()
    (qdir / "que" / msg_id / "msg").write_text(
        '{"msg_id": "%s", "dest": "test", "due": 1%s}' % (msg_id, "0" * 400))
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    proc = subprocess.Popen([sys.executable, "-m", "rq.queue", "--root", str(root), "--name",
                             "test"], cwd=root, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    sock = str(qdir / "queue.sock")

    def answers() -> bool:
        try:
            return client.call(sock, "ping", timeout=2) == ["pong"]
        except Exception:
            return False
    try:
        wait_for(lambda: proc.poll() is not None or answers(), 20, what="start or exit")
        assert proc.poll() is None, f"the queue process exited with {proc.returncode}"
        assert client.call(sock, "status") == ["UP"]
    finally:
        if proc.poll() is None:
            proc.terminate()
        proc.wait(20)


# ---------------------------------------------------------------- prep_message and single_que

def test_s7_3_prep_message_stays_in_prep(procs: list[QueueProc], root: Path) -> None:
    qp = start_queue(procs, root)
    full = ok(qp.call("prep_message", {"dest": "test", "param1": 1}))
    assert full.startswith(FULL_PREFIX)
    assert qp.state(full) == "prep"
    assert stored(qp, full)["param1"] == "1"
    assert qp.call("messages", {"state": "prep"}) == [{"msg_id": short_id(full)}]
    assert qp.counts()["prep"] == 1 and qp.counts()["que"] == 0
    assert ok(qp.call("commit_message", {"msg_id": full})) == "msg commited"
    qp.wait_state(full, "done")


def test_s5_6_single_que(procs: list[QueueProc], root: Path) -> None:
    qp = start_queue(procs, root, paused=True)
    first = ok(qp.call("single_que", {"dest": "test", "param1": "a"}))
    assert qp.state(first) == "que"
    assert ok(qp.call("single_que", {"dest": "test", "param1": "b"})) == first
    assert qp.counts()["que"] == 1
    later = ok(qp.call("create_message", {"dest": "test", "due": 1}))  # due earlier
    assert ok(qp.call("single_que", {"dest": "test"})) == later  # most recently committed
    prep = ok(qp.call("prep_message", {"dest": "test"}))
    assert ok(qp.call("single_que", {"dest": "test"})) == later  # prep is not in que
    ok(qp.call("commit_message", {"msg_id": prep}))
    assert ok(qp.call("single_que", {"dest": "test"})) == prep
    for full in (first, later, prep):
        ok(qp.call("delete_message", {"msg_id": full}))
    fresh = ok(qp.call("single_que", {"dest": "test", "param2": "z"}))
    assert fresh not in (first, later, prep)
    assert qp.state(fresh) == "que" and stored(qp, fresh)["param2"] == "z"
    assert qp.counts()["que"] == 1


def test_s5_6_single_que_concurrently_creates_one(procs: list[QueueProc], root: Path) -> None:
    qp = start_queue(procs, root, paused=True)
    out: list[str] = []

    def worker() -> None:
        for _ in range(10):
            out.append(ok(qp.call("single_que", {"dest": "test"})))

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(out) == 80 and len(set(out)) == 1
    assert qp.counts()["que"] == 1


def test_s5_6_single_que_ignores_waiting_dups(procs: list[QueueProc], root: Path,
                                              tmp_path: Path) -> None:
    """A que holding only a coalesced message waiting on its running parent counts as
    empty: single_que creates a new message."""
    gates = tmp_path / "gates"
    gates.mkdir()
    body = ("#!/bin/sh\n"
            f"while [ ! -e '{gates}/'\"$RQ_PARAM1\" ]; do sleep 0.02; done\n"
            "echo 'done released' >&3\n")
    qp = start_queue(procs, root, body=body, coalesce_params=[1])
    blocker = ok(qp.call("create_message", {"dest": "test", "param1": "b"}))
    qp.wait_state(blocker, "run")
    parent = ok(qp.call("create_message", {"dest": "test", "param1": "g"}))
    dup = ok(qp.call("create_message", {"dest": "test", "param1": "g"}))
    (gates / "b").touch()
    qp.wait_state(parent, "run")  # dup is now attached to it and waits in que
    assert qp.state(dup) == "que"
    fresh = ok(qp.call("single_que", {"dest": "test", "param1": "s"}))
    assert fresh not in (dup, parent)
    assert ok(qp.call("single_que", {"dest": "test", "param1": "s"})) == fresh
    for gate in "gs":
        (gates / gate).touch()
    for full in (parent, dup, fresh):
        qp.wait_state(full, "done")


# ---------------------------------------------------------------- S3.2 hashdir

def bucket_path(state: str, msg_id: str) -> str:
    return f"{state}/{msg_id[0:8]}/{msg_id[9:11]}/{msg_id[11:13]}/{msg_id}"


def test_s3_2_done_and_relayed_are_bucketed_by_the_id(procs: list[QueueProc],
                                                      root: Path) -> None:
    """The bucket comes from the id's creation time, not the completion time: messages left in
    que/ with ids from 2017 and 2016 (S2.7 loads them at start) finish into those buckets."""
    body = ("#!/bin/sh\nif [ \"$RQ_PARAM1\" = r ]; then "
            "echo 'relayed http://h.example:1/q/x/20200101.0000.00.000.1' >&3; exit 0; fi\n"
            "echo 'done ok' >&3\n")
    qdir = make_queue(root, "test", write_script(root.parent / "s.sh", body))
    old_done, old_relayed = "20170508.1234.56.789.42", "20161231.2359.59.999.7"
    for msg_id, param in ((old_done, "d"), (old_relayed, "r")):
        (qdir / "que" / msg_id).mkdir()
        (qdir / "que" / msg_id / "msg").write_text(json.dumps(
            {"msg_id": msg_id, "dest": "test", "param1": param, "due": 1, "count": 0,
             "max_count": 15}))
    qp = QueueProc(root, "test")
    procs.append(qp)
    qp.wait_state(old_done, "done")
    qp.wait_state(old_relayed, "relayed")
    assert (qdir / "done/20170508/12/34/20170508.1234.56.789.42/msg").is_file()
    assert (qdir / "relayed/20161231/23/59/20161231.2359.59.999.7/msg").is_file()
    assert qp.message(old_done)["path"] == "queue/test/" + bucket_path("done", old_done)
    fresh = ok(qp.call("create_message", {"dest": "test"}))
    qp.wait_state(fresh, "done")
    sid = short_id(fresh)
    assert (qdir / bucket_path("done", sid)).is_dir()
    assert qp.message(fresh)["path"] == "queue/test/" + bucket_path("done", sid)
    # the messages' buckets (empty ones the queue makes ahead of need, issue 13 D8, aside)
    assert sorted(p.relative_to(qdir / "done").parts[0]
                  for p in (qdir / "done").glob("*/*/*/*")) == ["20170508", sid[:8]]
    assert qp.counts() == {"prep": 0, "que": 0, "run": 0, "done": 2, "relayed": 1, "err": 0}


# ---------------------------------------------------------------- S13 events

def raw_event_lines(root: Path, queue: str = "test") -> list[bytes]:
    lines = []
    for f in sorted((root / "log" / "events").glob(f"*/{queue}.jsonl")):
        lines += f.read_bytes().splitlines(keepends=True)
    return lines


def check_event_file_layout(root: Path) -> list[dict[str, Any]]:
    """S13.1/S13.2: every line decodes, its CRC is the CRC-32 of the payload bytes, the
    payload has every S13.3 field, and it sits in the file of its UTC day."""
    out = []
    for f in sorted((root / "log" / "events").glob("*/test.jsonl")):
        for line in f.read_bytes().splitlines(keepends=True):
            event = decode_line(line)
            assert event is not None, line
            body = line[28:-2]
            assert line[:10] == b'{"crc32":"' and line.endswith(b"}\n")
            assert line[10:18] == b"%08x" % (zlib.crc32(body) & 0xFFFFFFFF)
            assert json.loads(body) == event
            assert set(FIELDS) <= set(event)
            assert f.parent.name == time.strftime("%Y%m%d", time.gmtime(event["ts"]))
            assert round(event["ts"], 3) == event["ts"]
            out.append(event)
    return out


def transitions(events: list[dict[str, Any]], msg_id: str) -> list[tuple[Any, Any]]:
    return [(e["from"], e["to"]) for e in events if e["msg_id"] == msg_id]


def test_s13_create_start_complete_delete(procs: list[QueueProc], root: Path) -> None:
    qp = start_queue(procs, root, body="#!/bin/sh\necho 'run busy' >&3\necho 'done ok' >&3\n")
    full = ok(qp.call("create_message", {"dest": "test", "count": 2}))
    sid = short_id(full)
    qp.wait_state(full, "done")
    assert ok(qp.call("delete_message", {"msg_id": full})) == "msg deleted"
    events = wait_for(lambda: [e for e in read_events(root, "test") if e["msg_id"] == sid]
                      if len(transitions(read_events(root, "test"), sid)) >= 5 else None,
                      what="five events")
    assert check_event_file_layout(root) == read_events(root, "test")
    assert [(e["from"], e["to"]) for e in events] == [
        (None, "prep"), ("prep", "que"), ("que", "run"), ("run", "done"), ("done", "deleted")]
    created, committed, started, finished, deleted = events
    for e in events:
        assert e["host"] == "127.0.0.1" and e["queue"] == "test" and e["msg_id"] == sid
    assert created["status"] is None and created["pid"] is None and created["count"] == 2
    assert committed["count"] == 2 and committed["pid"] is None
    assert isinstance(started["pid"], int) and started["exit_code"] is None
    assert started["duration"] is None
    assert finished["pid"] == started["pid"] and finished["exit_code"] == 0
    assert finished["status"] == "ok" and finished["count"] == 2
    assert isinstance(finished["duration"], (int, float)) and 0 <= finished["duration"] < 10
    assert deleted["pid"] is None and deleted["exit_code"] is None
    assert deleted["count"] == 2 and deleted["status"] == "ok"
    assert [e["ts"] for e in events] == sorted(e["ts"] for e in events)


def test_s13_prep_commit_and_deletes_from_each_state(procs: list[QueueProc],
                                                     root: Path) -> None:
    qp = start_queue(procs, root, paused=True)
    prep = ok(qp.call("prep_message", {"dest": "test"}))
    other = ok(qp.call("prep_message", {"dest": "test"}))
    ok(qp.call("commit_message", {"msg_id": other}))
    ok(qp.call("commit_message", {"msg_id": other}))  # already committed: no event
    ok(qp.call("delete_message", {"msg_id": prep}))
    ok(qp.call("delete_message", {"msg_id": other}))
    events = check_event_file_layout(root)
    assert transitions(events, short_id(prep)) == [(None, "prep"), ("prep", "deleted")]
    assert transitions(events, short_id(other)) == [
        (None, "prep"), ("prep", "que"), ("que", "deleted")]


def test_s13_destroy_and_clone_events(procs: list[QueueProc], root: Path) -> None:
    body = "#!/bin/sh\necho 'run sleeping' >&3\nsleep 1000\n"
    qp = start_queue(procs, root, body=body)
    full = ok(qp.call("create_message", {"dest": "test"}))
    sid = short_id(full)
    wait_for(lambda: (root / "queue/test/run" / sid / "pid").exists(), what="the job")
    ok(qp.call("destroy_message", {"msg_id": full}))
    qp.wait_state(full, "err")
    (root / "config" / "test.pause").touch()
    clone = ok(qp.call("clone_message", {"msg_id": full}))
    events = check_event_file_layout(root)
    run_ev = [e for e in events if e["msg_id"] == sid and e["from"] == "run"]
    assert len(run_ev) == 1
    assert run_ev[0]["to"] == "err" and run_ev[0]["exit_code"] == -15
    assert run_ev[0]["status"].startswith("PROCESS EXITED IMPROPERLY - MOVING TO ERR")
    assert transitions(events, short_id(clone)) == [(None, "prep"), ("prep", "que")]


def test_s13_script_error_event(procs: list[QueueProc], root: Path) -> None:
    """S6.1.1 through the socket: a missing script sends the message que -> err, the status
    command answers SCRIPTERROR, and a later pass clears it once the script exists."""
    missing = root.parent / "later.sh"
    make_queue(root, "test", missing)
    qp = QueueProc(root, "test")
    procs.append(qp)
    full = ok(qp.call("create_message", {"dest": "test"}))
    qp.wait_state(full, "err")
    reason = f"script not found: {missing}"
    assert qp.message(full)["status"] == f"err - SCRIPT ERROR - MOVING TO ERR - {reason}"
    assert qp.call("status") == ["SCRIPTERROR"]
    events = check_event_file_layout(root)
    assert transitions(events, short_id(full)) == [(None, "prep"), ("prep", "que"),
                                                   ("que", "err")]
    write_script(missing, DONE_SCRIPT)
    again = ok(qp.call("create_message", {"dest": "test"}))
    qp.wait_state(again, "done")
    assert qp.call("status") == ["UP"]
