"""Durable named subscriber cursors (issue 18 item 3; SPEC S8.8, S13; seed 001's
consumer state file): a real rq-mgr with real (paused) queue processes; what a
cursor stream delivers is compared with the event-log files.

Paused queues keep their messages in que/, so each `create_message` logs
exactly two events (null -> prep, prep -> que) and nothing else moves.
"""

from __future__ import annotations

import calendar
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rqtest import REPO, interrupt, make_queue, read_events, wait_for
from webtest import Mgr, build_root, rq_mgr

from rq import client, protocol
from rq.errors import ConnectError, Fail
from rq.mgr.cursors import check_name, decode_state, encode_state

Key = tuple[Any, ...]


def key(ev: dict[str, Any]) -> Key:
    return (ev["queue"], ev["msg_id"], ev["from"] or "", ev["to"])


@pytest.fixture
def root(tmp_path: Path) -> Iterator[Path]:
    root = build_root(tmp_path)
    for name, topic in (("held", "billing.held"), ("other", "other")):
        make_queue(root, name, script="/bin/true", topic=topic)
        (root / "config" / f"{name}.pause").write_text("")
    mgr = Mgr(root)
    yield root
    mgr.stop()


def send(root: Path, queue: str = "held", n: int = 1) -> list[str]:
    ids = []
    for _ in range(n):
        reply = client.call_queue(str(root), queue, "create_message", {"dest": queue})
        assert reply[0] == "ok", reply
        ids.append(reply[1].rsplit("/", 1)[-1])
    return ids


def events(sub: client.Subscription, n: int, timeout: float = 30) -> list[dict[str, Any]]:
    """The next n event records (replies to acks are skipped)."""
    got: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    while len(got) < n:
        assert time.monotonic() < deadline, f"timed out; got {got}"
        item = sub.next(0.5)
        if isinstance(item, dict):
            got.append(item)
        elif isinstance(item, list) and item[0] == "fail":
            raise AssertionError(item)
    return got


def quiet(sub: client.Subscription, wait: float = 0.5) -> list[Any]:
    """What arrives within `wait` seconds: proves nothing more is sent (a
    negative check: it passes only when the stream stays quiet)."""
    got, deadline = [], time.monotonic() + wait
    while time.monotonic() < deadline:
        item = sub.next(0.1)
        if item is not None:
            got.append(item)
    return got


def ack(sub: client.Subscription, pos: str) -> Any:
    sub.ack(pos)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        item = sub.next(0.5)
        if isinstance(item, list):
            return item
    raise AssertionError("no ack reply")


def log_keys(root: Path, queue: str = "held") -> list[Key]:
    return [key(e) for e in read_events(root, queue)]


# ---------------------------------------------------------------- pure parts


@pytest.mark.parametrize("name", ["a", "billing", "Bill_2.x-y", "9" * 64])
def test_issue18_good_cursor_names(name: str) -> None:
    assert check_name(name) == name


@pytest.mark.parametrize("name", ["", ".hidden", "-x", "a/b", "../x", "a..b", "a b", "é",
                                  "x" * 65, None, 7])
def test_issue18_bad_cursor_names(name: Any) -> None:
    with pytest.raises(Fail, match="invalid cursor name"):
        check_name(name)


def test_issue18_state_record_roundtrip_and_damage() -> None:
    """Seed 001's state file, laid out as an S13.2 record: any damaged byte is caught."""
    payload = {"name": "c", "patterns": ["#"], "from_day": "20261126",
               "offsets": {"20261126/q.jsonl": 120}, "position": 3}
    data = encode_state(payload)
    assert decode_state(data) == payload
    for i in range(len(data)):
        bad = data[:i] + bytes([data[i] ^ 0x20]) + data[i + 1:]
        with pytest.raises(ValueError):
            decode_state(bad)
    for cut in range(len(data)):
        with pytest.raises(ValueError):
            decode_state(data[:cut])


def test_issue18_a_cursor_stream_ends_rather_than_drop_events(tmp_path: Path) -> None:
    """S8.8's overflow record would skip events: a cursor stream more than
    BUFFER_LIMIT behind sends what it holds, then one `fail` frame, and ends."""
    from rq.mgr.cursors import Cursor, CursorBook
    from rq.mgr.cursorstream import CursorSubscriber
    from rq.mgr.events_hub import BUFFER_LIMIT
    book = CursorBook(str(tmp_path), lambda queue: queue)
    cursor = Cursor("c", ["#"], "20261126", {})
    sub = CursorSubscriber(cursor, book)
    cursor.owner = sub
    for i in range(BUFFER_LIMIT + 5):
        sub.push_record({"msg_id": str(i)}, "q", "20261126/q.jsonl", 10 * (i + 1))
    frames: list[bytes] = []
    while (batch := sub.take(0)) is not None:
        frames.extend(batch)
    payloads = [json.loads(f[protocol.HEADER_LEN:]) for f in frames]
    assert [p["msg_id"] for p in payloads[:-1]] == [str(i) for i in range(BUFFER_LIMIT)]
    assert payloads[-1] == ["fail", f"cursor c fell more than {BUFFER_LIMIT} events behind; "
                            "subscribe again to resume"]
    assert [p["pos"] for p in payloads[:2]] == [f"{cursor.epoch}:1", f"{cursor.epoch}:2"]


def test_issue18_a_cursor_stream_ends_after_too_many_unacked(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from rq.mgr import cursorstream
    from rq.mgr.cursors import Cursor, CursorBook
    monkeypatch.setattr(cursorstream, "MAX_UNACKED", 3)
    cursor = Cursor("c", ["#"], "20261126", {})
    sub = cursorstream.CursorSubscriber(cursor, CursorBook(str(tmp_path), lambda q: q))
    cursor.owner = sub
    for i in range(5):
        sub.push_record({"msg_id": str(i)}, "q", "20261126/q.jsonl", 10 * (i + 1))
    frames: list[bytes] = []
    while (batch := sub.take(0)) is not None:
        frames.extend(batch)
    payloads = [json.loads(f[protocol.HEADER_LEN:]) for f in frames]
    assert [p["msg_id"] for p in payloads[:-1]] == ["0", "1", "2"]
    assert payloads[-1][0] == "fail" and "3 events sent without an ack" in payloads[-1][1]


def test_issue18_a_failed_state_write_refuses_the_ack_and_undoes_it(tmp_path: Path) -> None:
    """Fault at the OS seam (the state write): the ack is refused with one line,
    nothing of it stays in memory, and the same ack succeeds once the disk does."""
    import errno

    from rq.fsops import FsOps
    from rq.mgr import cursors

    class FullDisk(FsOps):
        full = False

        def write_file_private(self, path: str, data: bytes, *, sync: bool = True) -> None:
            if self.full:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            super().write_file_private(path, data, sync=sync)

    fs = FullDisk()
    book = cursors.CursorBook(str(tmp_path), lambda q: q, fs)
    cursor = book.open("c", ["#"], {}, "20261126")
    first, second = cursor.stamp("20261126/q.jsonl", 10), cursor.stamp("20261126/q.jsonl", 20)
    fs.full = True
    with pytest.raises(Fail, match="^cursor c: cannot save its state: No space left on device$"):
        book.ack("c", second)
    assert (cursor.position, cursor.offsets, len(cursor.inflight)) == (0, {}, 2)
    assert os.listdir(tmp_path / "log" / "cursors") == ["c.cursor"]  # no temp file left
    fs.full = False
    assert book.ack("c", second) == 2
    assert book.ack("c", first) == 2  # already acknowledged: a no-op
    state = decode_state((tmp_path / "log" / "cursors" / "c.cursor").read_bytes())
    assert state["offsets"] == {"20261126/q.jsonl": 20}


def test_issue18_a_state_write_a_crash_cut_short_is_swept_at_the_next_start(
        tmp_path: Path) -> None:
    """The state is replaced through FsOps.write_file_atomic: a manager killed mid-write
    leaves its temporary file, which the next manager's CursorBook removes; the cursor
    itself keeps its last saved state."""
    from rq.mgr.cursors import CursorBook
    book = CursorBook(str(tmp_path), lambda q: q)
    cursor = book.open("c", ["#"], {}, "20261126")
    book.ack("c", cursor.stamp("20261126/q.jsonl", 10))
    cdir = tmp_path / "log" / "cursors"
    (cdir / ".c.cursor.tmp99999.1").write_bytes(b'{"crc32":"0000')  # the cut-short write
    again = CursorBook(str(tmp_path), lambda q: q)
    assert os.listdir(cdir) == ["c.cursor"]
    assert again.open("c", None, {}, "20261126").offsets == {"20261126/q.jsonl": 10}


def test_issue18_a_well_framed_state_with_bad_fields_is_corrupt_not_a_crash(
        tmp_path: Path) -> None:
    from rq.mgr.cursors import CursorBook
    (tmp_path / "log" / "cursors").mkdir(parents=True)
    (tmp_path / "log" / "cursors" / "c.cursor").write_bytes(encode_state(
        {"patterns": ["#"], "from_day": "20261126", "offsets": {"a": "x"}, "position": 1}))
    with pytest.raises(Fail, match=r"^cursor c: state file log/cursors/c.cursor is corrupt"):
        CursorBook(str(tmp_path), lambda q: q).open("c", None, {}, "20261126")


# ---------------------------------------------------------------- over the manager socket


def test_issue18_reconnect_resumes_after_the_last_ack(root: Path) -> None:
    """Acked events are never sent again; unacked ones are, then live ones,
    without a gap; events logged while nobody listened are delivered too."""
    sub = client.subscribe(str(root), ["billing.#"], cursor="bill")
    ids = send(root, n=3)
    got = events(sub, 6)
    assert [key(e) for e in got] == log_keys(root)
    assert all(e["topic"] == "billing.held" and e["pos"] for e in got)
    assert ack(sub, got[3]["pos"]) == ["ok", "acked", 4]  # cumulative: the first four
    sub.close()
    later = send(root, n=2)  # nobody subscribed now
    send(root, "other")       # not the cursor's topic
    with client.subscribe(str(root), [], cursor="bill") as sub:
        again = events(sub, 2 + 4)
        assert [key(e) for e in again] == log_keys(root)[4:]
        assert [e["msg_id"] for e in again] == [ids[2]] * 2 + [later[0]] * 2 + [later[1]] * 2
        assert ack(sub, again[-1]["pos"]) == ["ok", "acked", 10]
        assert quiet(sub) == []
    with client.subscribe(str(root), ["billing.#"], cursor="bill") as sub:
        assert quiet(sub) == []  # everything acked: nothing repeated
        new = send(root)
        assert [e["msg_id"] for e in events(sub, 2)] == new * 2


def test_issue18_restart_resumes_and_old_positions_are_refused(root: Path) -> None:
    sub = client.subscribe(str(root), ["billing.#"], cursor="bill")
    send(root, n=2)
    got = events(sub, 4)
    assert ack(sub, got[1]["pos"]) == ["ok", "acked", 2]
    sub.close()
    assert rq_mgr(root, "stop").returncode == 0
    Mgr(root)
    more = send(root)
    # an SSE client's Last-Event-ID from before the restart names nothing now: the
    # stream resumes from the last acknowledgement that was written
    with client.subscribe(str(root), [], cursor="bill", last_id=got[3]["pos"]) as sub:
        again = events(sub, 4)
        assert [key(e) for e in again] == log_keys(root)[2:]
        assert again[-1]["msg_id"] == more[0]
        # a position from before the restart names nothing now
        reply = ack(sub, got[3]["pos"])
        assert reply == ["fail", f"unknown position {got[3]['pos']!r} for cursor bill"]
        assert ack(sub, again[0]["pos"]) == ["ok", "acked", 3]
        assert ack(sub, again[0]["pos"]) == ["ok", "acked", 3]  # again: a no-op
    state = decode_state((root / "log" / "cursors" / "bill.cursor").read_bytes())
    assert state["position"] == 3


def test_issue18_ack_errors_and_fixed_patterns(root: Path) -> None:
    with client.subscribe(str(root), ["#"]) as plain:
        assert ack(plain, "x:1") == ["fail", 'ack needs a cursor stream (subscribe with "cursor")']
    with client.subscribe(str(root), ["billing.#"], cursor="bill") as sub:
        assert ack(sub, "nope") == ["fail", "unknown position 'nope' for cursor bill"]
        sub.send("subscribe", {"patterns": ["other"]})
        assert sub.next(10) == ["fail", "a cursor's patterns are fixed: "
                                "delete the cursor to change them"]
    with pytest.raises(Fail, match="cursor bill follows billing.#"):
        client.subscribe(str(root), ["other"], cursor="bill")
    with pytest.raises(Fail, match="cursor nosuch does not exist"):
        client.subscribe(str(root), [], cursor="nosuch")
    with pytest.raises(Fail, match="since and cursor cannot be combined"):
        client.subscribe(str(root), ["#"], since=1.0, cursor="bill")
    for bad in ("../etc", "", "a b"):
        with pytest.raises(Fail, match="invalid cursor name"):
            client.subscribe(str(root), ["#"], cursor=bad)
    assert not (root / "log" / "cursors" / "..").joinpath("etc.cursor").exists()
    assert client.call_mgr(str(root), "ack_cursor", {"cursor": "bill", "pos": "z:9"}) == \
        ["fail", "unknown position 'z:9' for cursor bill"]


def test_issue18_a_second_subscriber_takes_the_cursor_over(root: Path) -> None:
    first = client.subscribe(str(root), ["billing.#"], cursor="bill")
    send(root)
    events(first, 2)
    with client.subscribe(str(root), [], cursor="bill") as second:
        assert [e["to"] for e in events(second, 2)] == ["prep", "que"]  # never acked
        with pytest.raises(ConnectError):
            for _ in range(100):
                first.next(0.5)
    first.close()


def test_issue18_list_and_delete(root: Path) -> None:
    with client.subscribe(str(root), ["billing.#"], cursor="bill") as sub:
        send(root, n=3)
        got = events(sub, 6)
        ack(sub, got[1]["pos"])
        rows = client.call_mgr(str(root), "cursors", {})[1]
        (row,) = rows
        assert (row["name"], row["position"], row["lag"], row["state"], row["gap"]) == \
            ("bill", 2, 4, "streaming", 0)
        assert row["patterns"] == ["billing.#"] and row["acked_at"] > time.time() - 60
        assert client.call_mgr(str(root), "delete_cursor", "bill", raw=True) == \
            ["ok", "cursor deleted"]
        assert sub.next(10) == ["fail", "cursor bill deleted"]  # its stream ends
    assert client.call_mgr(str(root), "cursors", {}) == ["ok", []]
    assert client.call_mgr(str(root), "delete_cursor", "bill", raw=True) == \
        ["fail", "no such cursor: bill"]
    assert client.call_mgr(str(root), "delete_cursor", "a/b", raw=True)[1].startswith(
        "invalid cursor name 'a/b'")
    assert not (root / "log" / "cursors" / "bill.cursor").exists()


def test_issue18_corrupt_state_is_refused_listed_and_repaired(root: Path) -> None:
    with client.subscribe(str(root), ["billing.#"], cursor="bill") as sub:
        send(root)
        ack(sub, events(sub, 2)[1]["pos"])
    assert rq_mgr(root, "stop").returncode == 0  # rq-mgr caches state: damage it while down
    path = root / "log" / "cursors" / "bill.cursor"
    data = bytearray(path.read_bytes())
    data[40] ^= 1
    path.write_bytes(bytes(data))
    Mgr(root)
    with pytest.raises(Fail) as info:
        client.subscribe(str(root), [], cursor="bill")
    assert str(info.value) == ("cursor bill: state file log/cursors/bill.cursor is corrupt "
                               "(crc mismatch); delete the cursor to start it again")
    (row,) = client.call_mgr(str(root), "cursors", {})[1]
    assert row["state"] == "corrupt" and "crc mismatch" in row["problem"]
    out = rq(root, "cursors")
    assert out.returncode == 0 and out.stdout.startswith("bill CORRUPT cursor bill: state")
    assert client.call_mgr(str(root), "delete_cursor", "bill", raw=True) == \
        ["ok", "cursor deleted"]
    assert (root / "log" / "cursors" / "bill.cursor.corrupt").read_bytes() == bytes(data)
    with client.subscribe(str(root), ["billing.#"], cursor="bill") as sub:
        assert quiet(sub) == []  # a new cursor starts at the end
    assert client.call_mgr(str(root), "ping") == ["pong"]


def test_issue18_retention_reports_one_gap_record(root: Path) -> None:
    """The cleaner's retention (S13) asks rq-mgr before removing a day: the
    events of it the cursor had not passed come back as one gap record.
    Yesterday's events are written with the queues' own EventLog (as a late
    write by queue `held`), so that retention can remove yesterday only."""
    from rq.builtin import cleaner
    from rq.events import EventLog
    today = calendar.timegm(time.gmtime()[:3] + (0, 0, 0, 0, 0, 0))
    with client.subscribe(str(root), ["billing.#"], cursor="bill") as sub:
        writer = EventLog(str(root), "h", "held")
        for i in range(3):
            writer.log(f"old{i}", None, "prep", ts=today - 3600 + i)
        writer.close()
        got = events(sub, 3)
        assert [e["msg_id"] for e in got] == ["old0", "old1", "old2"]
        ack(sub, got[0]["pos"])
    yesterday = time.strftime("%Y%m%d", time.gmtime(today - 3600))
    events_dir = str(root / "log" / "events")
    removed = cleaner.prune_events(events_dir, today + 2 * 86400 - 1, 1, str(root / "none"))
    assert removed == 1 and not (root / "log" / "events" / yesterday).exists()
    new = send(root)
    with client.subscribe(str(root), [], cursor="bill") as sub:
        first, *rest = events(sub, 3)
        assert {k: v for k, v in first.items() if k != "pos"} == {"event": "gap", "lost": 2}
        assert [e["msg_id"] for e in rest] == new * 2
        ack(sub, rest[-1]["pos"])
    (row,) = client.call_mgr(str(root), "cursors", {})[1]
    assert (row["gap"], row["position"], row["lag"]) == (0, 3, 0)
    state = decode_state((root / "log" / "cursors" / "bill.cursor").read_bytes())
    assert not any(rel.startswith(yesterday) for rel in state["offsets"])  # kept small
    with client.subscribe(str(root), [], cursor="bill") as sub:
        assert quiet(sub) == []  # the gap, once acked, is not reported again
    assert client.call_mgr(str(root), "retire_events", {"day": "2000-01-01"}) == \
        ["fail", "invalid day (YYYYMMDD)"]


def test_issue18_retention_asked_twice_counts_once(root: Path) -> None:
    """A cleaner that died after asking and before removing asks again: the
    day's events count once, and the cursor has passed them."""
    with client.subscribe(str(root), ["billing.#"], cursor="bill") as sub:
        send(root, n=2)
        events(sub, 4)
    today = time.strftime("%Y%m%d", time.gmtime())
    assert client.call_mgr(str(root), "retire_events", {"day": today}) == ["ok", {"bill": 4}]
    assert client.call_mgr(str(root), "retire_events", {"day": today}) == ["ok", {"bill": 0}]
    with client.subscribe(str(root), [], cursor="bill") as sub:
        (gap,) = events(sub, 1)
        assert (gap["event"], gap["lost"]) == ("gap", 4)
        assert quiet(sub) == []


def test_issue18_retention_keeps_a_day_while_rq_mgr_is_away(root: Path) -> None:
    with client.subscribe(str(root), ["billing.#"], cursor="bill") as sub:
        send(root)
        events(sub, 2)
    assert rq_mgr(root, "stop").returncode == 0
    from rq.builtin import cleaner
    events_dir = str(root / "log" / "events")
    assert cleaner.prune_events(events_dir, time.time() + 40 * 86400, 30, "none") == 0
    assert any((root / "log" / "events").iterdir())
    Mgr(root)


# ---------------------------------------------------------------- the rq command


def rq(root: Path, *args: str, **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "rq", "--root", str(root), *args],
                          capture_output=True, text=True, timeout=60, cwd=REPO, **kw)


def watch(root: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "rq", "--root", str(root), "watch", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)


def lines_of(proc: subprocess.Popen[str], n: int) -> list[str]:
    assert proc.stdout is not None
    return [proc.stdout.readline() for _ in range(n)]


def test_issue18_rq_watch_cursor_acks_what_it_printed(root: Path) -> None:
    ids = send(root, n=2)
    proc = watch(root, "--cursor", "w", "--pattern", "billing.#", "--json")
    try:
        wait_for(lambda: (root / "log" / "cursors" / "w.cursor").exists(), what="the cursor")
        later = send(root)
        lines = [json.loads(line) for line in lines_of(proc, 2)]
        assert [e["msg_id"] for e in lines] == later * 2 and "pos" not in lines[0]
        wait_for(lambda: client.call_mgr(str(root), "cursors", {})[1][0]["position"] == 2,
                 what="the ack")
    finally:
        out, err = interrupt(proc)
    assert proc.returncode == 0, err
    assert ids  # made before the cursor: not its business
    again = send(root)
    proc = watch(root, "--cursor", "w")
    try:
        line = lines_of(proc, 1)[0]
        assert f"held {again[0]} - -> prep" in line
    finally:
        interrupt(proc)
    out = rq(root, "cursors")
    assert out.returncode == 0
    assert out.stdout.startswith("w position=") and " patterns=billing.#\n" in out.stdout
    js = rq(root, "cursors", "--json")
    assert json.loads(js.stdout)[0]["name"] == "w"
    assert rq(root, "deletecursor", "--cursor", "w").stdout == "ok cursor deleted\n"
    gone = rq(root, "deletecursor", "--cursor", "w")
    assert (gone.returncode, gone.stdout) == (1, "fail no such cursor: w\n")


@pytest.mark.parametrize("args, out, err", [
    (("watch", "--cursor", "../x", "--pattern", "#"),
     "fail invalid cursor name '../x': use 1-64 letters, digits, '_', '.' or '-', "
     "starting with a letter or digit\n", ""),
    (("watch", "--cursor", "fresh"),
     "fail cursor fresh does not exist: give patterns to create it\n", ""),
    (("deletecursor",), "", "rq: missing required argument --cursor\n"),
])
def test_issue18_rq_cursor_errors(root: Path, args: tuple[str, ...], out: str, err: str) -> None:
    result = rq(root, *args)
    assert (result.returncode, result.stdout, result.stderr) == (1, out, err)


def test_issue18_state_file_written_atomically(root: Path) -> None:
    """Temp file, fsync, rename, fsync of the directory (seen with strace-free
    means: no temp file is left, the file is one whole record)."""
    with client.subscribe(str(root), ["billing.#"], cursor="bill") as sub:
        send(root)
        ack(sub, events(sub, 2)[1]["pos"])
    names = os.listdir(root / "log" / "cursors")
    assert names == ["bill.cursor"]
    assert decode_state((root / "log" / "cursors" / "bill.cursor").read_bytes())["position"] == 2
    assert protocol  # imported for the framing used by client


def test_issue18_no_skip_no_repeat_through_reconnects_and_a_kill(root: Path) -> None:
    """Messages created from two threads on two queues while the cursor's
    subscriber reads a few events, acks part of them and reconnects, over and
    over, with one SIGKILL of rq-mgr in the middle: the acknowledged events,
    in order, are exactly the log's events of the cursor's topics, each once,
    and every session starts right after the last acknowledged event."""
    import random
    import threading
    make_queue(root, "held2", script="/bin/true", topic="billing.two")
    (root / "config" / "held2.pause").write_text("")
    client.call_mgr(str(root), "reload")

    def answers() -> bool:
        try:
            return bool(client.call_queue(str(root), "held2", "ping", timeout=5) == ["pong"])
        except ConnectError:
            return False
    wait_for(answers, 30, what="held2 to answer")
    with client.subscribe(str(root), ["billing.#"], cursor="stress"):
        pass
    rng = random.Random(18)
    per_queue = 60

    def produce(queue: str) -> None:
        for _ in range(per_queue):
            for _attempt in range(200):  # rq-mgr (and its queues) may be restarting
                try:
                    send(root, queue)
                    break
                except (ConnectError, OSError, AssertionError):
                    time.sleep(0.05)
    producers = [threading.Thread(target=produce, args=(q,)) for q in ("held", "held2")]
    for p in producers:
        p.start()
    acked: list[Key] = []
    killed = False
    deadline = time.monotonic() + 240
    while len(acked) < 4 * per_queue:
        assert time.monotonic() < deadline, f"only {len(acked)} acked"
        if not killed and len(acked) > per_queue:
            pid = int((root / "config" / "queuemgr.pid").read_text().split()[0])
            os.kill(pid, signal.SIGKILL)
            wait_for(lambda: rq_mgr(root, "start").returncode == 0, 60, 0.2, "a restart")
            killed = True
        try:
            with client.subscribe(str(root), [], cursor="stress") as sub:
                got = events(sub, min(rng.randint(1, 25), 4 * per_queue - len(acked)))
                if acked:
                    assert key(got[0]) != acked[-1]  # nothing acked comes again
                upto = rng.randint(1, len(got))
                reply = ack(sub, got[upto - 1]["pos"])
                assert reply == ["ok", "acked", len(acked) + upto], reply
                acked.extend(key(e) for e in got[:upto])
        except (ConnectError, Fail):
            time.sleep(0.05)  # rq-mgr restarting
    for p in producers:
        p.join(60)
    logged = [key(e) for e in read_events(root) if e["queue"] in ("held", "held2")]
    assert len(acked) == len(set(acked)) == len(logged)
    assert sorted(acked) == sorted(logged)
    for queue in ("held", "held2"):  # each file in its own order
        assert [k for k in acked if k[0] == queue] == [k for k in logged if k[0] == queue]
