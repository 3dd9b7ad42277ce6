"""S8.8 event subscriptions on the manager socket, and `rq watch` (S19).

Pure parts (the per-subscriber buffer, the in-stream replies) are tested
table-driven; the hub is stepped by hand over real event-log files (S13);
everything else runs against a real rq-mgr with real queue processes and
compares what subscribers got with the event-log files.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rqtest import REPO, interrupt, make_queue, read_events, wait_for
from webtest import Mgr, build_root

from rq import client, protocol
from rq.errors import ConnectError, Fail
from rq.events import EventLog
from rq.mgr import events_hub, substream
from rq.mgr.events_hub import BUFFER_LIMIT, EventHub, Subscriber

Key = tuple[Any, ...]


def key(ev: dict[str, Any]) -> Key:
    """What identifies one transition (sortable: a null `from` becomes "")."""
    return (ev["queue"], ev["msg_id"], ev["from"] or "", ev["to"], ev["ts"])


def frame_payload(frame: bytes) -> Any:
    return json.loads(frame[protocol.HEADER_LEN:])


# ---------------------------------------------------------------- pure parts


def test_s8_8_overflow_record_replaces_dropped_events() -> None:
    """More than BUFFER_LIMIT behind: later events are dropped and one
    overflow record with their number takes their place, in order."""
    sub = Subscriber(["#"])
    for i in range(BUFFER_LIMIT + 25):
        sub.push(b"%d" % i)
    sub.control(b"reply")  # control frames are never dropped
    got: list[bytes] = []
    while (batch := sub.take(0)):
        got.extend(batch)
    assert got[:BUFFER_LIMIT] == [b"%d" % i for i in range(BUFFER_LIMIT)]
    assert got[BUFFER_LIMIT] == b"reply"
    assert frame_payload(got[-1]) == {"event": "overflow", "dropped": 25}
    sub.push(b"after")  # caught up: delivery goes on
    assert sub.take(0) == [b"after"]


def test_s8_8_overflow_record_comes_before_later_events() -> None:
    sub = Subscriber(["#"])
    for i in range(BUFFER_LIMIT + 3):
        sub.push(b"%d" % i)
    assert len(sub.take(0) or []) == events_hub.SEND_BATCH  # room again
    sub.push(b"new")
    rest: list[bytes] = []
    while (batch := sub.take(0)):
        rest.extend(batch)
    assert frame_payload(rest[-2]) == {"event": "overflow", "dropped": 3}
    assert rest[-1] == b"new"


@pytest.mark.parametrize("payload, reply", [
    (b'subscribe {"patterns":["video.*"]}', ["ok", ["a", "video.*"]]),
    (b'subscribe {"patterns":["a"]}', ["ok", ["a"]]),
    (b'unsubscribe {"patterns":["a"]}', ["ok", []]),
    (b'unsubscribe {"patterns":["#"]}', ["ok", []]),
    (b'unsubscribe {"patterns":[]}', ["ok", []]),
    (b'unsubscribe {"patterns":["zzz"]}', ["ok", ["a"]]),
    (b'subscribe {"patterns":["a..b"]}', ["fail", "invalid pattern: a..b"]),
    (b'subscribe {"patterns":["#.a"]}', ["fail", "invalid pattern: #.a"]),
    (b'subscribe {"patterns":"a"}', ["ok", ["a"]]),
    (b'subscribe {}', ["fail", "missing patterns"]),
    (b'subscribe [1]', ["fail", "bad request"]),
    (b'subscribe {nope', ["fail", "bad request"]),
    (b'subscribe', ["fail", "bad request"]),
    (b'ping', ["error"]),
])
def test_s8_8_in_stream_replies(payload: bytes, reply: list[Any]) -> None:
    sub = Subscriber(["a"])
    assert substream.stream_request_reply(sub, payload) == reply


@pytest.mark.parametrize("value, since", [
    (None, None), (0, 0.0), (1795310400.5, 1795310400.5), ("12.5", 12.5)])
def test_s8_8_since_values(value: object, since: float | None) -> None:
    assert events_hub.parse_since(value) == since


@pytest.mark.parametrize("value", [-1, "x", True, [1], {"a": 1}, float("nan"), "inf"])
def test_s8_8_bad_since(value: object) -> None:
    with pytest.raises(Fail, match="invalid since"):
        events_hub.parse_since(value)


# ---------------------------------------------------------------- the hub over real files


def test_s8_8_hub_replay_joins_live_without_gap_or_repeat(tmp_path: Path) -> None:
    """S8.8 + S13.4, stepped by hand: events written before a subscription
    come from the replay, events after it from the tailer, each exactly once;
    torn and corrupt lines are skipped and counted; `topic` comes from the
    queue config."""
    root = tmp_path
    make_queue(root, "enc", script="/bin/true", topic="video.encode")
    hub = EventHub(str(root))  # not started: the test steps it
    log_a = EventLog(str(root), "h", "enc")
    log_b = EventLog(str(root), "h", "other")
    ts = time.time() - 5
    for i in range(5):
        log_a.log(f"a{i}", None, "prep", ts=ts + i * 0.01)
        log_b.log(f"b{i}", None, "prep", ts=ts + i * 0.01 + 0.001)
    other = root / "log" / "events" / events_hub.day_name(ts) / "other.jsonl"
    with open(other, "ab") as fh:
        fh.write(b'{"crc32":"00000000","event":{}}\n')  # bad crc: skipped
    first, _ = hub.subscribe(["#"])            # the hub starts following here
    sub, replay = hub.subscribe(["video.*"], since=ts + 0.015)
    for i in range(5, 8):
        log_a.log(f"a{i}", None, "prep", ts=ts + 1 + i * 0.01)
        log_b.log(f"b{i}", None, "prep", ts=ts + 1 + i * 0.01)
    with open(other, "ab") as fh:
        fh.write(b'{"crc32":"0000')  # a torn tail: not read until complete
    assert hub.tail_once() == 6
    replayed = [frame_payload(f) for f in replay]
    live = [frame_payload(f) for f in sub.take(0) or []]
    assert [e["msg_id"] for e in replayed] == ["a2", "a3", "a4"]
    assert [e["msg_id"] for e in live] == ["a5", "a6", "a7"]
    assert {e["topic"] for e in replayed + live} == {"video.encode"}
    assert hub.skipped == 0  # nothing bad came after the subscription
    all_live = [frame_payload(f)["msg_id"] for f in first.take(0) or []]
    assert all_live == ["a5", "b5", "a6", "b6", "a7", "b7"]
    with open(other, "ab") as fh:
        fh.write(b'\n')  # S13.4: the mended fragment is one skipped line
    assert hub.tail_once() == 0 and hub.skipped == 1
    log_a.close()
    log_b.close()


# ---------------------------------------------------------------- real rq-mgr


@pytest.fixture(scope="module")
def mgr_root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """rq-mgr with `test` (a script queue), `held` (paused: messages stay in
    que, so events cost no job) and queues with dotted topics."""
    root = build_root(tmp_path_factory.mktemp("sub"))
    make_queue(root, "held", script="/bin/true")
    (root / "config" / "held.pause").write_text("")
    make_queue(root, "enc", script="/bin/true", topic="video.encode")
    make_queue(root, "thumbs", script="/bin/true", topic="video.thumbs")
    make_queue(root, "deep", script="/bin/true", topic="video.encode.hd")
    (root / "config" / "enc.pause").write_text("")
    (root / "config" / "thumbs.pause").write_text("")
    (root / "config" / "deep.pause").write_text("")
    mgr = Mgr(root)
    yield root
    mgr.stop()


def send(root: Path, queue: str, n: int = 1, threads: int = 1) -> list[str]:
    """Create n messages on `queue` from `threads` client threads."""
    ids: list[str] = []
    lock = threading.Lock()

    def work(count: int) -> None:
        for _ in range(count):
            reply = client.call_queue(str(root), queue, "create_message", {"dest": queue})
            assert reply[0] == "ok", reply
            with lock:
                ids.append(reply[1])

    workers = [threading.Thread(target=work, args=(n // threads + (i < n % threads),))
               for i in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert len(ids) == n
    return ids


def collect(sub: client.Subscription, until: Any, timeout: float = 90) -> list[Any]:
    """Frames until `until(frames)` is true (deadline: AssertionError)."""
    got: list[Any] = []
    deadline = time.monotonic() + timeout
    while not until(got):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out; got {len(got)} frames, last {got[-3:]}")
        item = sub.next(1.0)
        if item is not None:
            got.append(item)
    return got


def until_marker(sub: client.Subscription, marker: str) -> list[Any]:
    """Events up to the `que` event of message `marker`.  The hub dispatches
    in time order, so every event logged before the marker came before it, as
    long as the marker's queue sorts after theirs (a tie of one millisecond
    between files read in one pass keeps the files' name order)."""
    short = marker.rsplit("/", 1)[-1]
    got = collect(sub, lambda g: bool(g) and g[-1].get("msg_id") == short
                  and g[-1].get("to") == "que")
    return got[:-2]


def test_s8_8_wildcards_and_in_stream_subscribe(mgr_root: Path) -> None:
    """S8.1/S8.7 filters (`*`, `#`), `topic` added, and in-stream
    subscribe/unsubscribe answered with the current pattern list; a pattern
    change applies to the events dispatched after it."""
    root = mgr_root
    with client.subscribe(str(root), ["video.*"]) as sub:
        for q in ("enc", "thumbs", "deep", "held", "test"):
            send(root, q)
        got = until_marker(sub, send(root, "thumbs")[0])
        assert sorted((e["queue"], e["topic"], e["to"]) for e in got) == [
            ("enc", "video.encode", "prep"), ("enc", "video.encode", "que"),
            ("thumbs", "video.thumbs", "prep"), ("thumbs", "video.thumbs", "que")]
        sub.send("subscribe", {"patterns": ["video.#", "held"]})
        assert sub.next(10) == ["ok", ["video.*", "video.#", "held"]]
        for q in ("deep", "test", "held"):
            send(root, q)
        # The marker's queue sorts after the others: events of one millisecond (S13's ts) read
        # in one pass come in file order, so a marker `enc` in the same millisecond as held's
        # `que` event came before it (a fresh-clone run of the suite met it once creates took
        # under 1 ms; 1 run of 15 here).
        got = until_marker(sub, send(root, "thumbs")[0])
        assert [e["queue"] for e in got] == ["deep", "deep", "held", "held"]
        sub.send("unsubscribe", {"patterns": ["#"]})
        assert sub.next(10) == ["ok", []]
        send(root, "enc")  # delivery stopped: must not show up
        sub.send("subscribe", {"patterns": ["held"]})
        assert sub.next(10) == ["ok", ["held"]]
        assert until_marker(sub, send(root, "held")[0]) == []
        sub.send("unsubscribe", {"patterns": ["video.#", "held"]})
        assert sub.next(10) == ["ok", []]
        sub.send("subscribe", {"patterns": ["#"]})
        assert sub.next(10) == ["ok", ["#"]]
        got = until_marker(sub, send(root, "held")[0])
        sub.send("subscribe", {"patterns": ["bad..pattern"]})
        assert sub.next(10) == ["fail", "invalid pattern: bad..pattern"]
        sub.sock.sendall(protocol.encode_frame(b"subscribe {not json"))
        assert sub.next(10) == ["fail", "bad request"]
        sub.send("unsubscribe", {"patterns": ["#"]})
        assert sub.next(10) == ["ok", []]  # the stream survived both
        sub.sock.sendall(b"rq9 garbage")  # the framing is lost: answered, then closed
        assert sub.next(10) == ["fail", "bad request"]
        with pytest.raises(ConnectError):
            sub.next(10)
    assert client.call_mgr(str(root), "ping") == ["pong"]


@pytest.mark.parametrize("arg, reply", [
    ({}, ["fail", "missing patterns"]),
    ({"patterns": []}, ["fail", "invalid patterns"]),
    ({"patterns": ["a.#.b"]}, ["fail", "invalid pattern: a.#.b"]),
    ({"patterns": ["#"], "since": "yesterday"}, ["fail", "invalid since"]),
])
def test_s8_8_refused_subscriptions(mgr_root: Path, arg: dict[str, Any],
                                    reply: list[Any]) -> None:
    assert client.call_mgr(str(mgr_root), "subscribe", arg) == reply


def test_s8_8_a_stream_opened_by_unsubscribe_starts_empty(mgr_root: Path) -> None:
    assert client.call_mgr(str(mgr_root), "unsubscribe", {"patterns": ["#"]}) == ["ok", []]
    assert client.call_mgr(str(mgr_root), "unsubscribe", {"patterns": ["a..b"]}) == \
        ["fail", "invalid pattern: a..b"]


def test_s7_1_subscribe_with_bad_json_is_a_bad_request(mgr_root: Path) -> None:
    assert client.call_mgr(str(mgr_root), "subscribe", "{x", raw=True) == \
        ["fail", "bad request"]


def test_s8_8_replay_since_joins_live_without_gap_or_repeat(mgr_root: Path) -> None:
    """A subscriber with `since` joins while messages are being created: it
    gets every event at or after `since` exactly once (compared with the
    event-log files)."""
    root = mgr_root
    stop = threading.Event()
    created = [0]

    def flow() -> None:
        while not stop.is_set():
            send(root, "held")
            created[0] += 1

    worker = threading.Thread(target=flow)
    worker.start()
    try:
        wait_for(lambda: created[0] >= 30, 30, what="messages flowing")
        since = time.time() - 0.2
        sub = client.subscribe(str(root), ["held"], since=since)
        joined = time.time()
        # Live means created clearly after the join: count from a point past
        # joined + 0.05 so the threshold below does not depend on timing.
        wait_for(lambda: time.time() > joined + 0.1, 5, what="join settled")
        after_join = created[0]
        wait_for(lambda: created[0] >= after_join + 60, 60, what="more messages")
    finally:
        stop.set()
        worker.join()
    with sub:
        expected = [key(e) for e in read_events(root, "held") if e["ts"] >= since]
        got = collect(sub, lambda g: len(g) >= len(expected))
        assert sub.next(0.5) is None  # nothing more: no repeat at the tail either
    keys = [key(e) for e in got]
    assert len(keys) == len(set(keys)), "an event was delivered twice"
    assert sorted(keys) == sorted(expected)
    assert any(k[4] < joined - 0.05 for k in keys), "nothing came from the replay"
    assert sum(k[4] > joined + 0.05 for k in keys) >= 60, "too little came live"
    assert all(e["topic"] == "held" for e in got)


def test_s8_8_ten_thousand_transitions_and_a_stalled_subscriber(mgr_root: Path) -> None:
    """One subscriber follows more than 10,000 transitions and loses none
    (compared with the event log); another stops reading meanwhile: the
    script queue still finishes its messages, the first subscriber is not
    held up, and when the stalled one resumes it gets one overflow record in
    place of the events it missed (delivered + dropped = everything)."""
    root = mgr_root
    since = time.time()
    follower = client.subscribe(str(root), ["#"])
    stalled = client.subscribe(str(root), ["#"])
    stalled.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    got: list[Any] = []
    done = threading.Event()

    def follow() -> None:
        while not done.is_set():
            item = follower.next(0.5)
            if item is not None:
                got.append(item)

    reader = threading.Thread(target=follow)
    reader.start()
    try:
        jobs = send(root, "test", 150)             # 4 transitions each, with real jobs
        send(root, "held", 6000, threads=4)        # 2 transitions each
        wait_for(lambda: client.call_queue(str(root), "test", "num_messages")["done"]
                 >= 150, 120, what="the script queue to finish while a subscriber stalls")
        total = len(jobs) * 4 + 6000 * 2
        wait_for(lambda: len(got) >= total, 120,
                 what="the follower to get every event")
    finally:
        done.set()
        reader.join()
        follower.close()
    from_files = [key(e) for e in read_events(root) if e["ts"] >= since]
    got_keys = [key(e) for e in got]
    assert len(got_keys) >= 12_000
    assert sorted(got_keys) == sorted(from_files)  # none lost, none twice
    with stalled:
        resumed: list[Any] = []
        while (item := stalled.next(2.0)) is not None:
            resumed.append(item)
    overflow = [e for e in resumed if e.get("event") == "overflow"]
    assert len(overflow) == 1 and overflow[0]["dropped"] > 0, overflow
    delivered = [e for e in resumed if "event" not in e]
    assert len(delivered) + overflow[0]["dropped"] == len(got)
    assert [key(e) for e in delivered] == [key(e) for e in got][:len(delivered)]


# ---------------------------------------------------------------- rq watch (S19)


def default_sigint() -> None:
    """In the child: SIGINT as a terminal user's `rq watch` has it.  A process started
    with SIGINT ignored keeps it ignored (a test worker of pytest-xdist is such a parent,
    and so is a shell's `cmd &`), and then Ctrl-C could not be what the test sends."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def rq(root: Path, *args: str, **kw: Any) -> subprocess.Popen[str]:
    return subprocess.Popen([str(REPO / "bin" / "rq"), "--root", str(root), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=default_sigint, **kw)


def read_lines(proc: subprocess.Popen[str], n: int, until: str | None = None) -> list[str]:
    """Lines of a watch until n lines (or one containing `until`) came."""
    lines: list[str] = []
    timer = threading.Timer(60, proc.kill)  # a hung watch fails the test, not the run
    timer.start()
    try:
        assert proc.stdout is not None
        while len(lines) < n or (until and not any(until in x for x in lines)):
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line.rstrip("\n"))
    finally:
        timer.cancel()
    return lines


def test_s19_rq_watch_prints_events_and_exits_0_on_sigint(mgr_root: Path) -> None:
    root = mgr_root
    since = time.time()
    full = send(root, "test")[0]
    short = full.rsplit("/", 1)[-1]
    client_wait = wait_for(lambda: client.call_queue(
        str(root), "test", "get_message_state", {"msg_id": short}) == ["ok", "done"], 30,
        what="the message to finish")
    assert client_wait
    proc = rq(root, "watch", "--pattern", "nope,test", "--since", str(since - 0.5))
    lines = read_lines(proc, 4, until=f"{short} run -> done")
    out, err = interrupt(proc)
    assert proc.returncode == 0, err
    assert err == ""
    mine = [line for line in lines if short in line]
    assert [line.split(" ", 4)[4] for line in mine] == [
        f"{short} - -> prep", f"{short} prep -> que", f"{short} que -> run",
        f"{short} run -> done ok"]
    assert all(line.split(" ")[3] == "test" for line in mine)
    time_part = " ".join(mine[0].split(" ")[:3])
    assert time.strptime(time_part, "%Y-%m-%d %H:%M:%S %z")


def test_s19_rq_watch_json(mgr_root: Path) -> None:
    root = mgr_root
    since = time.time()
    send(root, "deep")
    proc = rq(root, "watch", "--pattern", "video.#", "--json", "--since", str(since))
    lines = read_lines(proc, 2)
    interrupt(proc)
    assert proc.returncode == 0
    events = [json.loads(line) for line in lines]
    assert [(e["queue"], e["topic"], e["to"]) for e in events] == \
        [("deep", "video.encode.hd", "prep"), ("deep", "video.encode.hd", "que")]


@pytest.mark.parametrize("args, code, out, err", [
    ((), 1, "", "rq: missing required argument --pattern\n"),
    (("--pattern",), 1, "", "rq: missing required argument --pattern\n"),
    (("--pattern", "a..b"), 1, "fail invalid pattern: a..b\n", ""),
    (("--pattern", "#", "--since", "soon"), 1, "",
     "rq: invalid --since: soon (an epoch in seconds)\n"),
])
def test_s19_rq_watch_errors(mgr_root: Path, args: tuple[str, ...], code: int, out: str,
                             err: str) -> None:
    proc = rq(mgr_root, "watch", *args)
    got_out, got_err = proc.communicate(timeout=30)
    assert (proc.returncode, got_out, got_err) == (code, out, err)


def test_s19_rq_watch_without_manager(tmp_path: Path) -> None:
    root = build_root(tmp_path)
    proc = rq(root, "watch", "--pattern", "#")
    out, err = proc.communicate(timeout=30)
    assert (proc.returncode, out, err) == \
        (1, "", "rq: cannot connect to rq-mgr (is it running?)\n")


def test_s2_5_manager_stops_fast_with_a_stalled_subscriber(tmp_path: Path) -> None:
    """Stopping rq-mgr is not held up by a subscriber that does not read."""
    root = build_root(tmp_path)
    mgr = Mgr(root)
    try:
        stalled = client.subscribe(str(root), ["#"])
        stalled.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        send(root, "test", 20)
    finally:
        t0 = time.monotonic()
        mgr.stop()
    assert time.monotonic() - t0 < 20
    assert not os.path.exists(client.mgr_socket(str(root)))
    with pytest.raises(ConnectError):
        while True:
            stalled.next(5)
    stalled.close()


def test_subscription_wait_ends_when_its_wake_pipe_is_written(mgr_root: Path) -> None:
    """`rq watch` waits on its events and on a signal wakeup pipe (signal.set_wakeup_fd): a
    SIGINT that lands between the interpreter's last check for signals and the wait must wake
    it (a run of the suite saw `rq watch` blocked in recv after its SIGINT was handled).  Here
    the pipe is written by hand: next() returns None at once, where it would otherwise wait the
    whole timeout for an event that never comes."""
    sub = client.subscribe(str(mgr_root), ["nothing.comes"])
    r, w = os.pipe()
    try:
        os.write(w, b"\x02")
        started = time.monotonic()
        assert sub.next(timeout=30, wake=r) is None
        assert time.monotonic() - started < 5
        assert sub.next(timeout=0.2, wake=r) is None     # drained: now a plain timeout
    finally:
        sub.close()
        os.close(r)
        os.close(w)
