"""Issue 16 item 1: the producer API (rq.producer, `from rq import Client`) against a real
rq-mgr with real queue processes, over both transports: the root's sockets (S7) and the
web server rq-mgr starts (S15, under a relative_root), with the same test bodies.  Also the
queue's bulk create stream (rq.queue.createstream, issue 15 item 3) spoken raw."""

from __future__ import annotations

import hashlib
import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from rqtest import REPO, make_queue, wait_for, write_script
from webtest import build_root, running

from rq import Client, client, producer, protocol
from rq.producer import BulkRefused, Refused, Status, WaitTimeout


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str]]:
    base = tmp_path_factory.mktemp("producer")
    root = build_root(base, relative_root="/therq")
    make_queue(root, "bad", script=write_script(base / "err.sh",
                                                 '#!/bin/sh\necho "err by design" >&3\n'))
    make_queue(root, "enc", script=base / "done.sh", topic="video.encode")
    make_queue(root, "held", script="/bin/true")
    (root / "config" / "held.pause").write_text("")  # S3.5: its messages stay in que
    with running(root, web=True) as web:
        yield root, web.url


@pytest.fixture(params=["socket", "http"])
def rq(request: pytest.FixtureRequest, site: tuple[Path, str]) -> Iterator[Client]:
    root, url = site
    with Client(str(root)) if request.param == "socket" else Client(url=url) as rq:
        yield rq


def que_count(root: Path, name: str) -> int:
    return int(client.call_queue(str(root), name, "num_messages")["que"])


def test_issue16_import_is_cheap() -> None:
    """`from rq import Client` loads no Flask, click, requests or pyspark."""
    code = ("import sys\nfrom rq import Client\n"
            "print([m for m in ('flask', 'click', 'requests', 'pyspark') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=REPO, timeout=60, check=True).stdout
    assert out.strip() == "[]"


def test_issue16_send_wait_status(rq: Client) -> None:
    full = rq.send("test", param1="hello")
    assert full.startswith("http://127.0.0.1:") and "/therq/q/test/" in full
    status = rq.wait(full, timeout=30)
    assert status == Status(full, "done", "done - ok") and status.ok and status.ended
    assert rq.state(full) == "done" and rq.status(full) == status
    assert rq.message(full)["param1"] == "hello"


def test_issue16_send_takes_every_s4_4_field(rq: Client) -> None:
    later = datetime.now() + timedelta(hours=1)
    full = rq.send("held", param1=5, param2={"a": 1}, param3="x", param4=True, src="me",
                   due=later, count=2, max_count=7, orig_msg_id="http://h:1/q/o/1",
                   post_run_webhook=["http://127.0.0.1:9/a", "http://127.0.0.1:9/b"],
                   force_remote=True)
    msg = rq.message(full)
    assert msg["state"] == "que"
    assert (msg["param1"], msg["param2"], msg["param3"], msg["param4"]) == \
        ("5", '{"a":1}', "x", "true")
    assert (msg["src"], msg["count"], msg["max_count"]) == ("me", 2, 7)
    assert msg["orig_msg_id"] == "http://h:1/q/o/1"
    assert msg["post_run_webhook"] == ["http://127.0.0.1:9/a", "http://127.0.0.1:9/b"]
    assert msg["force_remote"] is True
    assert abs(msg["due"] - later.timestamp()) < 0.01
    soon = rq.message(rq.send("held", due=3600))  # seconds from now
    assert abs(soon["due"] - (time.time() + 3600)) < 60
    rq.delete(full)
    with pytest.raises(Refused, match="not found"):
        rq.status(full)


def test_issue16_attachments_from_paths_and_bytes(rq: Client, tmp_path: Path) -> None:
    path = tmp_path / "input.csv"
    path.write_text('a,"b"\n1,2\n')
    full = rq.send("held", param1="att", attachments={"data.bin": b"\x00\x01payload",
                                                      "input.csv": path})
    atts = rq.message(full)["_attachments"]
    assert atts["data.bin"]["md5"] == hashlib.md5(b"\x00\x01payload").hexdigest()
    assert atts["input.csv"]["size"] == path.stat().st_size
    assert rq.state(full) == "que"  # committed after attaching
    listed = rq.send("held", attachments=[path])  # a list of paths: named by base name
    assert set(rq.message(listed)["_attachments"]) == {"input.csv"}
    before = que_count(Path(rq.transport.root), "held") if hasattr(rq.transport, "root") \
        else None
    with pytest.raises(Refused, match="dot-file"):
        rq.send("held", attachments={".hidden": b"x"})
    if before is not None:  # the half-made message was deleted again
        assert que_count(Path(rq.transport.root), "held") == before


def test_issue16_errors_carry_the_servers_reason(rq: Client) -> None:
    with pytest.raises(Refused, match="(?i)queue not found"):
        rq.send("nosuch")
    with pytest.raises(Refused, match="invalid due value"):
        rq.send_many("held", [{"due": "soon"}])
    held = rq.send("held")
    with pytest.raises(Refused, match="cannot clone message in que state"):
        rq.clone(held)
    with pytest.raises(Refused, match="cannot relay"):
        rq.send("http://elsewhere:3333/q/x")
    with pytest.raises(Refused, match="invalid msg_id"):
        rq.status("not-an-id")


def test_issue16_clone_and_err(rq: Client) -> None:
    done = rq.wait(rq.send("test", param1="c"), timeout=30)
    copy = rq.clone(done.msg_id)
    assert copy != done.msg_id and rq.wait(copy, timeout=30).state == "done"
    assert rq.message(copy)["cloned_from"] == done.msg_id.rsplit("/", 1)[1]
    failed = rq.wait(rq.send("bad"), timeout=30)
    assert (failed.state, failed.status, failed.ok) == ("err", "err - by design", False)
    other = failed.msg_id.replace("127.0.0.1", "elsewhere.example")  # S4.2: host ignored
    [a, b, c] = rq.wait([rq.send("test"), failed.msg_id, other], timeout=30)
    assert (a.state, b.state, c) == ("done", "err", Status(other, "err", "err - by design"))


def test_issue16_queues_and_counts(rq: Client) -> None:
    rq.send("held")
    infos = {q.name: q for q in rq.queues()}
    assert {"test", "bad", "enc", "held"} <= set(infos)
    assert infos["held"].status == "PAUSE" and infos["test"].status == "UP"
    assert infos["held"].counts is not None and infos["held"].counts["que"] >= 1


def test_issue16_wait_times_out(rq: Client) -> None:
    later = rq.send("test", due=3600)
    start = time.monotonic()
    with pytest.raises(WaitTimeout) as info:
        rq.wait([later], timeout=0.5)
    assert 0.5 <= time.monotonic() - start < 10
    assert [s.state for s in info.value.statuses] == ["que"]
    rq.delete(later)


def test_issue16_wait_is_woken_by_the_event_stream(rq: Client,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """With the periodic re-check out of the way, a message that ends after the wait
    began is seen within seconds: only an event (S8.8, the queue's topic, not its name)
    can have said so.  A deleted message ends a wait too."""
    monkeypatch.setattr(producer, "RECHECK", 3600.0)
    full = rq.send("enc", due=1.0)
    start = time.monotonic()
    assert rq.wait(full, timeout=60).state == "done"
    assert time.monotonic() - start < 30
    gone = rq.send("held")
    with pytest.raises(WaitTimeout):
        rq.wait(gone, timeout=0.2)
    rq.delete(gone)
    assert rq.wait(gone, timeout=30).state == "deleted"


def test_issue15_send_many_stops_at_the_first_refusal(rq: Client, site: tuple[Path, str]
                                                      ) -> None:
    root, _ = site
    before = que_count(root, "held")
    ids = rq.send_many("held", [{"param1": str(i)} for i in range(600)], batch=100)
    assert len(ids) == 600 and len(set(ids)) == 600
    assert [rq.message(i)["param1"] for i in ids[::97]] == [str(i) for i in range(0, 600, 97)]
    que = client.call_queue(str(root), "held", "messages", {"state": "que", "limit": 10**6})
    place = {m["msg_id"]: n for n, m in enumerate(que)}
    order = [place[i.rsplit("/", 1)[1]] for i in ids]
    assert order == sorted(order)  # scheduled (S5.1) in input order
    msgs = [{"param1": str(i)} for i in range(300)]
    msgs[150] = {"param1": "bad", "max_count": -1}
    with pytest.raises(BulkRefused) as info:
        rq.send_many("held", msgs, batch=64)
    assert (info.value.index, info.value.reason) == (150, "invalid max_count value")
    assert len(info.value.ids) == 150
    assert que_count(root, "held") == before + 600 + 150  # none after the refused one


def frames(*batches: object) -> bytes:
    return b"".join(protocol.encode_request("create_messages", b) for b in batches)


def test_issue15_bulk_stream_pipelined_frames(site: tuple[Path, str]) -> None:
    """Several frames in one write on one connection: one reply each, in order; after a
    refusal no later frame is acted on, and the ids before it are in the reply."""
    root, _ = site
    before = que_count(root, "held")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(30)
        sock.connect(client.queue_socket(str(root), "held"))
        sock.sendall(frames([{"dest": "held"}] * 3, [{"dest": "held"}, {"dest": ""},
                                                    {"dest": "held"}], [{"dest": "held"}]))
        replies = [json.loads(client.read_frame(sock)) for _ in range(3)]
        sock.shutdown(socket.SHUT_WR)
        assert sock.recv(1) == b""  # the server closes its side once we have
    assert replies[0][0] == "ok" and len(replies[0][1]) == 3
    assert replies[1][:2] == ["fail", 'input missing required "dest" parameter']
    assert len(replies[1][2]) == 1
    assert replies[2][0] == "fail" and replies[2][2] == []
    assert que_count(root, "held") == before + 4
    reply = client.call_queue(str(root), "held", "create_messages", {"dest": "held"})
    assert reply == ["fail", "create_messages needs a JSON array of messages"]


def test_issue15_bulk_stream_refused_while_down(site: tuple[Path, str]) -> None:
    root, _ = site
    down = root / "config" / "enc.down"
    down.write_text("")
    try:
        wait_for(lambda: client.call_queue(str(root), "enc", "status") == ["DOWN"], 15)
        with pytest.raises(BulkRefused, match="status: DOWN"):
            Client(str(root)).send_many("enc", [{}])
    finally:
        down.unlink()
