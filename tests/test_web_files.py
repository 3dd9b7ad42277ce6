"""Logs, attachments, the log stream and the tail views (SPEC S15 routes 23-26, S16.6, S17)
against a real rq-mgr.  Log bytes are written by the tests themselves into a message's
`job/` directory (found through the store), so every case is exact and needs no job
timing; the stream's latency and disconnect handling are checked over a real waitress
server.  The browser-side rendering (static/tail.js) is run under node when it exists."""

from __future__ import annotations

import html
import http.client
import json
import os
import shutil
import socket
import statistics
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from email.utils import formatdate
from pathlib import Path
from typing import Any

import pytest

from rq import client
from rq.store import Store
from rqtest import REPO, short_id, wait_for, write_script

HOLD_SCRIPT = ('#!/bin/sh\necho "run holding" >&3\n'
               'while [ ! -e "$RQ_PARAM2" ]; do sleep 0.05; done\necho "done released" >&3\n')
ERR_SCRIPT = '#!/bin/sh\necho "err by design" >&3\n'
DOWN_TEXT = "503 - Service Unavailable - Operationally Down"
KEEPALIVE = 0.2  # the stream's idle comment interval in these tests (S17.2 says 15 s)


# ---------------------------------------------------------------- helpers


def call(root: Path, queue: str, cmd: str, arg: Any = None) -> Any:
    return client.call_queue(str(root), queue, cmd, arg)


def state_of(root: Path, queue: str, msg_id: str) -> str | None:
    found = Store(str(root), queue).locate(msg_id)
    return found[0] if found else None


def msg_dir(root: Path, queue: str, msg_id: str) -> Path:
    found = Store(str(root), queue).locate(msg_id)
    assert found is not None, msg_id
    return Path(found[1])


def prep_message(root: Path, queue: str = "test") -> str:
    reply = call(root, queue, "prep_message", {"dest": queue})
    assert reply[0] == "ok", reply
    return short_id(reply[1])


def finished_message(root: Path, queue: str = "test", **fields: Any) -> str:
    reply = call(root, queue, "create_message", {"dest": queue, **fields})
    assert reply[0] == "ok", reply
    msg_id = short_id(reply[1])
    wait_for(lambda: state_of(root, queue, msg_id) in ("done", "err"), 20,
             what=f"{msg_id} to finish")
    return msg_id


def put(root: Path, queue: str, msg_id: str, rel: str, data: bytes, append: bool = False) -> Path:
    """Write (or append) bytes to `<message dir>/rel`, as a job would."""
    path = msg_dir(root, queue, msg_id) / rel
    path.parent.mkdir(exist_ok=True)
    with open(path, "ab" if append else "wb") as fh:
        fh.write(data)
    return path


def error_text(resp: Any) -> str:
    return html.unescape(resp.get_data(as_text=True))


def open_fds_to(path: Path) -> int:
    """How many descriptors of this process are open on `path`."""
    real = os.path.realpath(path)
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}") == real:
                count += 1
        except OSError:
            pass
    return count


class Events:
    """Parses Server-Sent Events from an iterator of byte chunks."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self.chunks, self.buf = chunks, b""
        self.comments: list[str] = []

    def block(self, timeout: float = 15) -> bytes:
        deadline = time.monotonic() + timeout
        while b"\n\n" not in self.buf:
            assert time.monotonic() < deadline, f"no event within {timeout}s: {self.buf!r}"
            self.buf += next(self.chunks)
        block, self.buf = self.buf.split(b"\n\n", 1)
        return block

    def next(self, timeout: float = 15) -> dict[str, Any]:
        """The next event (comments are collected, not returned)."""
        deadline = time.monotonic() + timeout
        while True:
            lines = self.block(max(deadline - time.monotonic(), 0.01)).decode("utf-8").split("\n")
            event: dict[str, Any] = {"data": []}
            for line in lines:
                if line.startswith(":"):
                    self.comments.append(line)
                    continue
                field, _, value = line.partition(": ")
                if field == "data":
                    event["data"].append(value)
                else:
                    event[field] = value
            if len(event) > 1 or event["data"]:
                event["text"] = "\n".join(event["data"])
                return event

    def log_text(self, until_size: int, timeout: float = 15) -> tuple[str, list[dict[str, Any]]]:
        """Log events until the one whose id is `until_size`; their joined text."""
        events = []
        while not events or int(events[-1]["id"]) < until_size:
            ev = self.next(timeout)
            assert ev.get("event") == "log", ev
            events.append(ev)
        return "".join(e["text"] for e in events), events


@contextmanager
def stream(client_: Any, url: str, **kw: Any) -> Iterator[Events]:
    resp = client_.get(url, buffered=False, **kw)
    assert resp.status_code == 200, resp.get_data(as_text=True)
    assert resp.mimetype == "text/event-stream"
    try:
        yield Events(iter(resp.response))
    finally:
        resp.close()


@contextmanager
def waitress_server(app: Any, **adjustments: Any) -> Iterator[int]:
    """The app served by a real waitress in a thread; yields the port."""
    from waitress import wasyncore
    from waitress.server import create_server
    server = create_server(app, host="127.0.0.1", port=0, **adjustments)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        yield server.effective_port
    finally:
        try:
            server.trigger.pull_trigger(lambda: wasyncore.close_all(server._map))
        except OSError:  # the trigger closed itself (its pipe seen closed or hung up): the
            wasyncore.close_all(server._map)  # loop gets no thunk; close its map from here
        thread.join(10)
        assert not thread.is_alive(), "the waitress loop did not stop"
        server.task_dispatcher.shutdown()


@contextmanager
def http_stream(port: int, path: str) -> Iterator[tuple[Events, Any]]:
    """A stream read over a real socket; yields the events and a `hang_up()` that closes
    the connection the way a browser tab going away does."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", path)
    resp = conn.getresponse()
    assert resp.status == 200, resp.read()

    def hang_up() -> None:
        if conn.sock is not None:
            conn.sock.shutdown(socket.SHUT_RDWR)
        resp.close()
        conn.close()
    try:
        yield Events(iter(lambda: resp.read1(65536), b"")), hang_up
    finally:
        hang_up()


# ---------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def queues(mgr_root: Path) -> Path:
    """Queues `hold` (a job that runs until a file appears) and `failing` (ends in err)."""
    for name, body in (("hold", HOLD_SCRIPT), ("failing", ERR_SCRIPT)):
        script = write_script(mgr_root.parent / f"{name}.sh", body)
        opts = {"name": name, "script": str(script), "exec_prefix": "", "num_workers": 4}
        assert client.call_mgr(str(mgr_root), "create_queue", opts)[0] == "success"
        wait_for(lambda n=name: _pings(mgr_root, n), 30, 0.05, what=f"queue {name}")
    return mgr_root


def _pings(root: Path, name: str) -> bool:
    try:
        return call(root, name, "ping") == ["pong"]
    except Exception:
        return False


@pytest.fixture
def app(mgr_root: Path):  # noqa: ANN201 - a flask.Flask
    from rq.web import create_app
    app = create_app(str(mgr_root))
    app.config["RQ_STREAM_KEEPALIVE"] = KEEPALIVE
    return app


@pytest.fixture(scope="module")
def logged(mgr_root: Path) -> tuple[str, bytes]:
    """A done message whose job/data.log holds 100 known bytes."""
    msg_id = finished_message(mgr_root)
    data = bytes(range(32, 127)) + b"\nend\n"
    put(mgr_root, "test", msg_id, "job/data.log", data)
    return msg_id, data


# ---------------------------------------------------------------- S17.1 Range


def test_whole_file_with_headers(client: Any, mgr_root: Path, logged: tuple[str, bytes]) -> None:
    msg_id, data = logged
    resp = client.get(f"/q/test/{msg_id}/log/data.log")
    assert resp.status_code == 200 and resp.data == data
    assert resp.headers["Content-Type"] == "text/plain; charset=utf-8"
    assert resp.headers["Accept-Ranges"] == "bytes"
    assert resp.headers["Cache-Control"] == "no-cache"
    assert resp.headers["Content-Length"] == str(len(data))
    mtime = int(os.stat(msg_dir(mgr_root, "test", msg_id) / "job" / "data.log").st_mtime)
    assert resp.headers["Last-Modified"] == formatdate(mtime, usegmt=True)


@pytest.mark.parametrize("spec, first, last", [
    ("bytes=0-", 0, 99), ("bytes=10-", 10, 99), ("bytes=99-", 99, 99),
    ("bytes=10-19", 10, 19), ("bytes=0-0", 0, 0), ("bytes=90-500", 90, 99),
    ("bytes=-5", 95, 99), ("bytes=-100", 0, 99), ("bytes=-1000", 0, 99),
    ("bytes = 5 - 6", 5, 6),
])
def test_single_range(client: Any, logged: tuple[str, bytes], spec: str, first: int,
                      last: int) -> None:
    msg_id, data = logged
    resp = client.get(f"/q/test/{msg_id}/log/data.log", headers={"Range": spec})
    assert resp.status_code == 206
    assert resp.headers["Content-Range"] == f"bytes {first}-{last}/100"
    assert resp.data == data[first:last + 1]
    assert resp.headers["Content-Length"] == str(last - first + 1)
    assert resp.headers["Accept-Ranges"] == "bytes"


@pytest.mark.parametrize("spec", ["bytes=100-", "bytes=150-", "bytes=100-200", "bytes=-0"])
def test_unsatisfiable_range(client: Any, logged: tuple[str, bytes], spec: str) -> None:
    msg_id, _ = logged
    resp = client.get(f"/q/test/{msg_id}/log/data.log", headers={"Range": spec})
    assert resp.status_code == 416
    assert resp.headers["Content-Range"] == "bytes */100"


@pytest.mark.parametrize("spec", ["bytes=0-", "bytes=-5", "bytes=0-10"])
def test_empty_file_is_416(client: Any, mgr_root: Path, logged: tuple[str, bytes],
                           spec: str) -> None:
    msg_id, _ = logged
    put(mgr_root, "test", msg_id, "job/empty.log", b"")
    resp = client.get(f"/q/test/{msg_id}/log/empty.log", headers={"Range": spec})
    assert resp.status_code == 416 and resp.headers["Content-Range"] == "bytes */0"
    whole = client.get(f"/q/test/{msg_id}/log/empty.log")
    assert whole.status_code == 200 and whole.data == b""


@pytest.mark.parametrize("spec", ["bytes=0-1,5-6", "items=0-5", "bytes=abc", "bytes=5-2",
                                  "bytes=-"])
def test_other_ranges_get_the_whole_file(client: Any, logged: tuple[str, bytes],
                                         spec: str) -> None:
    msg_id, data = logged
    resp = client.get(f"/q/test/{msg_id}/log/data.log", headers={"Range": spec})
    assert resp.status_code == 200 and resp.data == data


def test_if_modified_since(client: Any, logged: tuple[str, bytes]) -> None:
    msg_id, data = logged
    url = f"/q/test/{msg_id}/log/data.log"
    last_modified = client.get(url).headers["Last-Modified"]
    resp = client.get(url, headers={"If-Modified-Since": last_modified})
    assert resp.status_code == 304 and resp.data == b""
    older = client.get(url, headers={"If-Modified-Since": "Mon, 01 Jan 2001 00:00:00 GMT"})
    assert older.status_code == 200 and older.data == data


def test_head(client: Any, logged: tuple[str, bytes]) -> None:
    msg_id, data = logged
    resp = client.head(f"/q/test/{msg_id}/log/data.log")
    assert resp.status_code == 200 and resp.data == b""
    assert resp.headers["Content-Length"] == str(len(data))
    ranged = client.head(f"/q/test/{msg_id}/log/data.log", headers={"Range": "bytes=-3"})
    assert ranged.status_code == 206 and ranged.headers["Content-Range"] == "bytes 97-99/100"


def test_large_file_is_streamed_exactly(client: Any, mgr_root: Path,
                                        logged: tuple[str, bytes]) -> None:
    msg_id, _ = logged
    data = os.urandom(3 * 1024 * 1024 + 7)
    path = put(mgr_root, "test", msg_id, "job/big.log", data)
    with client.get(f"/q/test/{msg_id}/log/big.log") as resp:
        assert resp.data == data
    with client.get(f"/q/test/{msg_id}/log/big.log", headers={"Range": "bytes=5-"}) as resp:
        assert resp.status_code == 206 and resp.data == data[5:]
    assert open_fds_to(path) == 0


def test_log_of_a_message_in_prep(client: Any, mgr_root: Path) -> None:
    msg_id = prep_message(mgr_root)
    resp = client.get(f"/q/test/{msg_id}/log/stdio.log")
    assert resp.status_code == 404
    assert "404 - Message ID log 'stdio.log' not found" in error_text(resp)
    put(mgr_root, "test", msg_id, "job/stdio.log", b"early\n")
    assert client.get(f"/q/test/{msg_id}/log/stdio.log").data == b"early\n"


def test_real_job_log(client: Any, mgr_root: Path) -> None:
    msg_id = finished_message(mgr_root)
    resp = client.get(f"/q/test/{msg_id}/log/stdio.log")
    assert resp.status_code == 200
    assert f"hello from {msg_id}" in resp.get_data(as_text=True)


# ---------------------------------------------------------------- errors and path safety


@pytest.mark.parametrize("route", ["log", "logstream", "attach", "tailview", "tailviewlog"])
def test_queue_and_message_errors(client: Any, logged: tuple[str, bytes], route: str) -> None:
    msg_id, _ = logged
    resp = client.get(f"/q/nosuch/{msg_id}/{route}/data.log")
    assert resp.status_code == 404 and "404 - Queue not found" in error_text(resp)
    for bad in ("20100625.0127.35.122.7509656", "not-an-id", "20100625.0127.35.122"):
        resp = client.get(f"/q/test/{bad}/{route}/data.log")
        assert resp.status_code == 404 and "404 - Message ID not found" in error_text(resp)


@pytest.mark.parametrize("route, sub, text", [
    ("log", "job", "log"), ("logstream", "job", "log"), ("attach", "attach", "attachment"),
])
def test_missing_and_bad_names(client: Any, mgr_root: Path, logged: tuple[str, bytes],
                               route: str, sub: str, text: str) -> None:
    msg_id, _ = logged
    put(mgr_root, "test", msg_id, f"{sub}/.hidden", b"secret")
    for name in ("nosuch.log", ".hidden", "..."):
        resp = client.get(f"/q/test/{msg_id}/{route}/{name}")
        assert resp.status_code == 404
        assert f"404 - Message ID {text} '{name}' not found" in error_text(resp)
    assert client.get(f"/q/test/{msg_id}/{route}/a%2Fb").status_code == 404
    os.mkdir(msg_dir(mgr_root, "test", msg_id) / sub / "adir")
    try:
        assert client.get(f"/q/test/{msg_id}/{route}/adir").status_code == 404
    finally:
        os.rmdir(msg_dir(mgr_root, "test", msg_id) / sub / "adir")


def test_symlink_out_of_the_message_is_refused(client: Any, mgr_root: Path,
                                               logged: tuple[str, bytes]) -> None:
    msg_id, data = logged
    other = finished_message(mgr_root)
    secret = mgr_root.parent / "secret.txt"
    secret.write_text("top secret\n")
    job = msg_dir(mgr_root, "test", msg_id) / "job"
    links = {"out.log": str(secret), "passwd.log": "/etc/passwd",
             "other.log": str(msg_dir(mgr_root, "test", other) / "job" / "stdio.log"),
             "up.log": "../../../../config/config.json", "loop.log": "loop.log",
             "inside.log": "data.log", "msg.log": "../msg"}
    for name, target in links.items():
        os.symlink(target, job / name)
    (msg_dir(mgr_root, "test", msg_id) / "attach").mkdir(exist_ok=True)
    os.symlink(str(secret), msg_dir(mgr_root, "test", msg_id) / "attach" / "out.txt")
    for name in ("out.log", "passwd.log", "other.log", "up.log", "loop.log"):
        for route in ("log", "logstream"):
            resp = client.get(f"/q/test/{msg_id}/{route}/{name}")
            assert resp.status_code == 404, (route, name)
    assert client.get(f"/q/test/{msg_id}/attach/out.txt").status_code == 404
    # a link that stays inside the message directory is fine
    assert client.get(f"/q/test/{msg_id}/log/inside.log").data == data
    assert client.get(f"/q/test/{msg_id}/log/msg.log").status_code == 200


def test_fifo_is_not_served(client: Any, mgr_root: Path, logged: tuple[str, bytes]) -> None:
    msg_id, _ = logged
    fifo = msg_dir(mgr_root, "test", msg_id) / "job" / "fifo.log"
    os.mkfifo(fifo)
    try:
        assert client.get(f"/q/test/{msg_id}/log/fifo.log").status_code == 404
    finally:
        fifo.unlink()


def test_down_queue_is_503(client: Any, mgr_root: Path, logged: tuple[str, bytes]) -> None:
    msg_id, _ = logged
    flag = mgr_root / "config" / "test.down"
    flag.touch()
    try:
        for route in ("log", "logstream", "attach", "tailview", "tailviewlog"):
            resp = client.get(f"/q/test/{msg_id}/{route}/data.log")
            assert resp.status_code == 503, route
            assert DOWN_TEXT in error_text(resp)
    finally:
        flag.unlink()
    assert client.get(f"/q/test/{msg_id}/log/data.log").status_code == 200


# ---------------------------------------------------------------- route 24 attachments


def attach(root: Path, queue: str, msg_id: str, name: str, data: bytes) -> None:
    src = root.parent / f"upload-{msg_id}-{name}"
    src.write_bytes(data)
    reply = call(root, queue, "attach_message", {"msg_id": msg_id, "pathname": str(src),
                                                 "name": name})
    assert reply[0] == "ok", reply


@pytest.mark.parametrize("queue, final", [("test", "done"), ("failing", "err")])
def test_attachment_in_every_state(client: Any, queues: Path, queue: str, final: str) -> None:
    msg_id = prep_message(queues, queue)
    data = os.urandom(5000)
    attach(queues, queue, msg_id, "blob.bin", data)
    attach(queues, queue, msg_id, "table.csv", b'a,"b"\n1,2\n')
    attach(queues, queue, msg_id, "noext", b"x")
    url = f"/q/{queue}/{msg_id}/attach"
    assert client.get(f"{url}/blob.bin").data == data  # in prep
    assert call(queues, queue, "commit_message", {"msg_id": msg_id})[0] == "ok"
    wait_for(lambda: state_of(queues, queue, msg_id) == final, 20, what=final)
    resp = client.get(f"{url}/blob.bin")
    assert resp.status_code == 200 and resp.data == data
    assert resp.headers["Content-Type"] == "application/octet-stream"
    assert resp.headers["Accept-Ranges"] == "bytes"
    csv = client.get(f"{url}/table.csv")
    assert csv.headers["Content-Type"].startswith("text/csv") and csv.data == b'a,"b"\n1,2\n'
    assert client.get(f"{url}/noext").headers["Content-Type"] == "application/octet-stream"
    part = client.get(f"{url}/blob.bin", headers={"Range": "bytes=-10"})
    assert part.status_code == 206 and part.data == data[-10:]
    assert part.headers["Content-Range"] == "bytes 4990-4999/5000"
    far = client.get(f"{url}/blob.bin", headers={"Range": "bytes=5000-"})
    assert far.status_code == 416 and far.headers["Content-Range"] == "bytes */5000"
    missing = client.get(f"{url}/nosuch.bin")
    assert "404 - Message ID attachment 'nosuch.bin' not found" in error_text(missing)


# ---------------------------------------------------------------- S17.2 stream


def test_stream_framing_and_utf8_boundaries(client: Any, mgr_root: Path) -> None:
    msg_id = prep_message(mgr_root)
    path = put(mgr_root, "test", msg_id, "job/stdio.log", b"")
    with stream(client, f"/q/test/{msg_id}/logstream/stdio.log") as events:
        writes = [b"one\ntwo\n\nthr", b"ee caf\xc3", b"\xa9 \xe2\x82", b"\xac\n", b"\xf0\x9f",
                  b"\x98\x80 bad \xff\xfe end\n", b"\n\n", b"x"]
        sent = b""
        texts = []
        for chunk in writes:
            put(mgr_root, "test", msg_id, "job/stdio.log", chunk, append=True)
            sent += chunk
            if sent.endswith((b"\xc3", b"\xe2\x82", b"\xf0\x9f")):
                continue  # a character is incomplete: no event may end inside it
            ev = events.next()
            assert ev["event"] == "log" and int(ev["id"]) == len(sent)
            texts.append(ev["text"])
            # every event is whole UTF-8 text: its data lines rebuild the chunk exactly
            assert "\n".join(ev["data"]) == ev["text"]
        assert "".join(texts) == sent.decode("utf-8", "replace")
        assert "\ufffd\ufffd" in "".join(texts)  # invalid bytes become U+FFFD
        assert os.path.getsize(path) == len(sent)


def test_stream_event_split_at_character(client: Any, mgr_root: Path) -> None:
    msg_id = prep_message(mgr_root)
    put(mgr_root, "test", msg_id, "job/stdio.log", b"ab\xe2")
    with stream(client, f"/q/test/{msg_id}/logstream/stdio.log") as events:
        first = events.next()
        assert (first["id"], first["data"]) == ("2", ["ab"])
        put(mgr_root, "test", msg_id, "job/stdio.log", b"\x82\xac\nz", append=True)
        second = events.next()
        assert (second["id"], second["data"]) == ("7", ["\u20ac", "z"])


def test_stream_resume_by_offset_and_last_event_id(client: Any, mgr_root: Path) -> None:
    msg_id = prep_message(mgr_root)
    data = "line 1\nlíne 2 ✓\nline 3\n".encode()
    put(mgr_root, "test", msg_id, "job/stdio.log", data)
    url = f"/q/test/{msg_id}/logstream/stdio.log"
    with stream(client, url) as events:
        text, evs = events.log_text(len(data))
    assert text == data.decode()
    cut = data.index(b"\n") + 1
    with stream(client, f"{url}?offset={cut}") as events:
        assert events.log_text(len(data))[0] == data[cut:].decode()
    with stream(client, f"{url}?offset=0", headers={"Last-Event-ID": str(cut)}) as events:
        assert events.log_text(len(data))[0] == data[cut:].decode()  # the header wins
    # resuming from an id given earlier continues exactly where that event ended
    put(mgr_root, "test", msg_id, "job/stdio.log", "more ☃\n".encode(), append=True)
    full = data + "more ☃\n".encode()
    with stream(client, url, headers={"Last-Event-ID": evs[-1]["id"]}) as events:
        assert events.log_text(len(full))[0] == "more ☃\n"
    for bad in ("-1", "x", "1.5"):
        assert client.get(f"{url}?offset={bad}").status_code == 400


def test_stream_of_a_finished_message_ends_with_its_state(client: Any, queues: Path) -> None:
    for queue, final in (("test", "done"), ("failing", "err")):
        msg_id = finished_message(queues, queue)
        size = os.path.getsize(msg_dir(queues, queue, msg_id) / "job" / "stdio.log")
        with stream(client, f"/q/{queue}/{msg_id}/logstream/stdio.log") as events:
            events.log_text(size)
            end = events.next()
            assert end == {"event": "end", "data": [final], "text": final}
            with pytest.raises(StopIteration):
                events.next()
        # at the end of the file already: just the end event
        with stream(client, f"/q/{queue}/{msg_id}/logstream/stdio.log?offset={size}") as events:
            assert events.next()["data"] == [final]


def test_stream_follows_a_running_job_to_done(client: Any, queues: Path) -> None:
    release = queues.parent / "release-follow"
    reply = call(queues, "hold", "create_message", {"dest": "hold", "param2": str(release)})
    msg_id = short_id(reply[1])
    wait_for(lambda: state_of(queues, "hold", msg_id) == "run", 20, what="run")
    log = msg_dir(queues, "hold", msg_id) / "job" / "stdio.log"
    # stdio.log exists from the reply on (S6.1 step 2); wait for the job's header in it
    wait_for(lambda: log.exists() and b"RQ START" in log.read_bytes(), what="RQ START header")
    with stream(client, f"/q/hold/{msg_id}/logstream/stdio.log") as events:
        header = log.read_bytes()
        assert events.log_text(len(header))[0] == header.decode()
        with open(log, "ab") as fh:
            fh.write("\x1b[31mred\x1b[0m progress 50%\r".encode())
        ev = events.next()
        assert ev["text"] == "\x1b[31mred\x1b[0m progress 50%\r"
        release.touch()
        end = events.next()
        assert end["event"] == "end" and end["data"] == ["done"]
    assert state_of(queues, "hold", msg_id) == "done"


def test_stream_ends_when_the_message_is_deleted(client: Any, mgr_root: Path) -> None:
    msg_id = prep_message(mgr_root)
    put(mgr_root, "test", msg_id, "job/stdio.log", b"before delete\n")
    with stream(client, f"/q/test/{msg_id}/logstream/stdio.log") as events:
        assert events.next()["text"] == "before delete\n"
        assert call(mgr_root, "test", "delete_message", {"msg_id": msg_id}) == \
            ["ok", "msg deleted"]
        assert events.next() == {"event": "end", "data": ["deleted"], "text": "deleted"}


def test_stream_of_a_committed_message_ends_done(client: Any, mgr_root: Path) -> None:
    """A message followed from prep through que and run to done: bytes written before,
    during and after the moves all arrive, then the end event."""
    msg_id = prep_message(mgr_root)
    put(mgr_root, "test", msg_id, "job/stdio.log", b"from prep\n")
    with stream(client, f"/q/test/{msg_id}/logstream/stdio.log") as events:
        assert events.next()["text"] == "from prep\n"
        assert call(mgr_root, "test", "commit_message", {"msg_id": msg_id})[0] == "ok"
        texts = []
        while (ev := events.next())["event"] == "log":
            texts.append(ev["text"])
        assert ev["data"] == ["done"]
    log = msg_dir(mgr_root, "test", msg_id) / "job" / "stdio.log"
    assert "from prep\n" + "".join(texts) == log.read_text()
    assert f"hello from {msg_id}" in "".join(texts)


def test_stream_keepalive_and_head(client: Any, mgr_root: Path) -> None:
    msg_id = prep_message(mgr_root)
    path = put(mgr_root, "test", msg_id, "job/stdio.log", b"")
    with stream(client, f"/q/test/{msg_id}/logstream/stdio.log") as events:
        events.block()
        events.block()  # idle: comments only
        assert events.buf == b""
    head = client.head(f"/q/test/{msg_id}/logstream/stdio.log")
    assert head.status_code == 200 and head.mimetype == "text/event-stream"
    assert open_fds_to(path) == 0


def test_closing_the_response_stops_the_generator(client: Any, mgr_root: Path) -> None:
    msg_id = prep_message(mgr_root)
    path = put(mgr_root, "test", msg_id, "job/stdio.log", b"x\n")
    with stream(client, f"/q/test/{msg_id}/logstream/stdio.log") as events:
        events.next()
        assert open_fds_to(path) == 1
    assert open_fds_to(path) == 0


def test_stream_latency_over_waitress(app: Any, mgr_root: Path) -> None:
    msg_id = prep_message(mgr_root)
    put(mgr_root, "test", msg_id, "job/stdio.log", b"start\n")
    with waitress_server(app, threads=4, channel_request_lookahead=1) as port:
        with http_stream(port, f"/q/test/{msg_id}/logstream/stdio.log") as (events, _):
            assert events.next()["text"] == "start\n"
            delays = []
            for i in range(5):
                t0 = time.monotonic()
                put(mgr_root, "test", msg_id, "job/stdio.log", f"tick {i}\n".encode(), True)
                assert events.next()["text"] == f"tick {i}\n"
                delays.append(time.monotonic() - t0)
            assert statistics.median(delays) < 0.25, delays


@pytest.mark.parametrize("lookahead", [1, 0])
def test_disconnect_frees_the_worker(app: Any, mgr_root: Path, lookahead: int) -> None:
    """With one worker thread, a second request is served only once the stream of a client
    that went away has stopped; its file is closed and no thread is left behind."""
    msg_id = prep_message(mgr_root)
    path = put(mgr_root, "test", msg_id, "job/stdio.log", b"hello\n")
    with waitress_server(app, threads=1, channel_request_lookahead=lookahead) as port:
        baseline = threading.active_count()
        with http_stream(port, f"/q/test/{msg_id}/logstream/stdio.log") as (events, hang_up):
            assert events.next()["text"] == "hello\n"
            assert open_fds_to(path) == 1
            hang_up()
        wait_for(lambda: open_fds_to(path) == 0, 10, what="the stream to close its file")
        other = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        other.request("GET", f"/q/test/{msg_id}/log/stdio.log")
        assert other.getresponse().read() == b"hello\n"
        other.close()
        assert threading.active_count() == baseline


def test_stream_through_the_real_rq_web(mgr_root: Path) -> None:
    """The rq-web that rq-mgr started: new data within 250 ms, and a client that hangs up
    leaves no open file and no extra thread in the server process."""
    import psutil
    web = client.call_mgr(str(mgr_root), "status")[1]["web"]
    if web["state"] != "RUNNING":
        pytest.skip(f"rq-web is {web['state']}")
    server = psutil.Process(web["pid"])
    port = json.loads((mgr_root / "config" / "config.json").read_text())["port"]
    msg_id = prep_message(mgr_root)
    path = put(mgr_root, "test", msg_id, "job/stdio.log", b"start\n")
    threads = server.num_threads()

    def server_has_open() -> bool:
        return os.path.realpath(path) in {f.path for f in server.open_files()}
    with http_stream(port, f"/q/test/{msg_id}/logstream/stdio.log") as (events, hang_up):
        assert events.next()["text"] == "start\n"
        assert server_has_open()
        delays = []
        for i in range(3):
            t0 = time.monotonic()
            put(mgr_root, "test", msg_id, "job/stdio.log", f"tick {i}\n".encode(), True)
            assert events.next()["text"] == f"tick {i}\n"
            delays.append(time.monotonic() - t0)
        assert statistics.median(delays) < 0.25, delays
        hang_up()
    wait_for(lambda: not server_has_open(), 10, what="rq-web to close the stream's file")
    assert server.num_threads() == threads


# ---------------------------------------------------------------- S16.6 tail views


def test_tail_view_pages(client: Any, mgr_root: Path, logged: tuple[str, bytes]) -> None:
    msg_id, _ = logged
    put(mgr_root, "test", msg_id, "attach/out.txt", b"attached\n")
    for route, target in (("tailviewlog", "log"), ("tailview", "attach")):
        resp = client.get(f"/q/test/{msg_id}/{route}/stdio.log")
        assert resp.status_code == 200 and resp.mimetype == "text/html"
        page = resp.get_data(as_text=True)
        assert f'data-src="/q/test/{msg_id}/{target}/stdio.log"' in page
        assert f'data-state-url="/q/test/{msg_id}/state.json"' in page
        assert "static/tail.js" in page and "static/tail.css" in page
        assert '<input type="checkbox" id="tail-scroll" checked> Tail scroll to bottom' in page
        assert 'id="tail-pos"' in page
    bad = client.get(f"/q/test/{msg_id}/tailviewlog/.secret")
    assert bad.status_code == 404
    odd = client.get(f"/q/test/{msg_id}/tailviewlog/a<b>.log")
    assert odd.status_code == 200 and "a<b>" not in odd.get_data(as_text=True)
    for static in ("tail.js", "tail.css"):
        with client.get(f"/static/{static}") as resp:
            assert resp.status_code == 200


def test_files_under_a_relative_root(mgr_root: Path, logged: tuple[str, bytes]) -> None:
    import dataclasses

    from rq.config import load_main_config
    from rq.web import create_app
    main = dataclasses.replace(load_main_config(str(mgr_root)), relative_root="/therq/")
    prefixed = create_app(main=main).test_client()
    msg_id, data = logged
    page = prefixed.get(f"/therq/q/test/{msg_id}/tailviewlog/data.log").get_data(as_text=True)
    assert f'data-src="/therq/q/test/{msg_id}/log/data.log"' in page
    assert f'data-state-url="/therq/q/test/{msg_id}/state.json"' in page
    resp = prefixed.get(f"/therq/q/test/{msg_id}/log/data.log", headers={"Range": "bytes=-4"})
    assert resp.status_code == 206 and resp.data == data[-4:]


# ---------------------------------------------------------------- static/tail.js under node

NODE = shutil.which("node")
RENDER_CASES = r"""
const T = require(process.argv[2]);
const out = {};
out.escape = T.escapeHtml(`<script>alert("x") & 'y'</script>`);
out.plain = T.render("a < b & c > d");
out.colours = T.render("\x1b[31mred\x1b[0m \x1b[1;92mbold green\x1b[22m \x1b[44mblue bg\x1b[m x");
out.carry = T.render("\x1b[33myellow\nstill\x1b[0m\nplain");
out.reset39 = T.render("\x1b[35mm\x1b[39md\x1b[45mb\x1b[49mn");
out.other = T.render("\x1b[2K\x1b[1Aclear\x1b]0;title\x07\x07bell\x1b[38;5;196mx\x1b[0m");
out.url = T.render("see https://ex.com/a?b=1&c=<2> and http://h:3333/q/test/ID.");
out.js = T.render("javascript:alert(1) ftp://x");
out.paren = T.render("(http://ex.com/wiki/A_(b))");
out.cr = T.render("10%\r20%\r30%\r");
const r = new T.Renderer();
out.feed = [r.feed("par"), r.feed("tial\x1b[31m"), r.feed("red\nnext"), r.finish(), r.count];
out.range = [T.parseContentRange("bytes 5-9/100"), T.parseContentRange("bytes */0")];
const nasty = ["<img src=x onerror=alert(1)>", "\x1b[31m<b>\x1b[0m", "http://x/\"><script>",
               "\x1b[<31m<i>", "&lt;", "'\"", "\x1b]8;;http://x\x07<u>\x1b]8;;\x07"];
out.safe = nasty.map((s) => T.render(s).replace(/<\/?(span|a)( [^<>]*)?>/g, ""));
console.log(JSON.stringify(out));
"""


FOLLOW_CASE = r"""
const T = require(process.argv[2]);
// A fake page: elements, timers and fetch, driven step by step.
function place(parent) {
  parent.children.forEach((x, i) => { x.offsetTop = (i + 1) * 10; });
  parent.scrollHeight = parent.children.length * 10;
}
function el(tag) {
  return {
    tag, className: "", innerHTML: "", textContent: "", children: [], checked: true,
    scrollTop: 0, scrollHeight: 0, clientHeight: 100, offsetTop: 0,
    addEventListener() {},
    appendChild(c) { this.children.push(c); place(this); return c; },
    insertBefore(c, ref) {
      if (ref === null) { return this.appendChild(c); }
      this.children.splice(this.children.indexOf(ref), 0, c);
      place(this);
      return c;
    },
    removeChild(c) { this.children.splice(this.children.indexOf(c), 1); return c; },
  };
}
const log = el("div"), box = el("input"), pos = el("span"), status = el("span");
const parts = {".tail-log": log, "#tail-scroll": box, "#tail-pos": pos, "#tail-status": status};
const section = {
  getAttribute(name) { return {"data-src": "/f", "data-state-url": "/s.json"}[name]; },
  querySelector(sel) { return parts[sel]; },
};
globalThis.document = {createElement: el};
globalThis.addEventListener = () => {};
const timers = [];
globalThis.setTimeout = (fn, ms) => { timers.push({fn, ms}); };
const file = {data: Buffer.alloc(0)};
let state = "run";
const requests = [];
globalThis.fetch = (url, opts) => {
  const headers = opts.headers || {};
  requests.push({url, range: headers.Range, cc: headers["Cache-Control"]});
  if (url === "/s.json") {
    return Promise.resolve({status: 200, ok: true, json: () => Promise.resolve([state])});
  }
  const start = parseInt(/bytes=(\d+)-/.exec(headers.Range)[1], 10);
  const size = file.data.length;
  if (start >= size) {
    return Promise.resolve({status: 416, headers: {get: () => "bytes */" + size}});
  }
  const chunk = Uint8Array.from(file.data.subarray(start));
  return Promise.resolve({status: 206, headers: {get: () => `bytes ${start}-${size - 1}/${size}`},
                          arrayBuffer: () => Promise.resolve(chunk.buffer)});
};
const settle = () => new Promise((r) => setImmediate(r));
async function step() {  // run the next timer, let promises settle
  await settle(); await settle();
  const t = timers.shift();
  if (!t) { return null; }
  t.fn(); await settle(); await settle(); await settle();
  return t.ms;
}
const lines = () => log.children.map((c) => [c.className, c.innerHTML]);
(async () => {
  const out = {};
  file.data = Buffer.from("one\ntw\xc3", "latin1");
  T.follow(section);
  await settle(); await settle(); await settle();
  out.first = {req: requests[0], lines: lines(), timers: timers.map((t) => t.ms)};
  out.afterFirst = await step();  // 100 ms later: poll bytes=7- -> 416
  out.req2 = requests[requests.length - 1];
  out.timers2 = timers.map((t) => t.ms);
  file.data = Buffer.concat([file.data, Buffer.from("\xa9o\x1b[32m ok\n<x>", "latin1")]);
  out.stateStep = await step();  // 1 s later: state.json -> run -> poll -> 206
  out.req3 = requests.slice(-2);
  out.lines3 = lines();
  out.pos = pos.textContent;
  out.scroll = log.scrollTop;
  state = "done";
  const trail = [];
  let ms;
  while ((ms = await step()) !== null && trail.length < 20) { trail.push(ms); }
  out.trail = trail;
  out.finalLines = lines();
  out.status = status.textContent;
  console.log(JSON.stringify(out));
})();
"""


def run_node(tmp: Path, source: str) -> Any:
    if NODE is None:
        pytest.skip("node is not installed: tail.js is left to the browser tests")
    script = tmp / "case.js"
    script.write_text(source)
    done = subprocess.run([NODE, str(script), str(REPO / "web" / "static" / "tail.js")],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return run_node(tmp_path_factory.mktemp("js"), RENDER_CASES)  # type: ignore[no-any-return]


def test_js_escapes_text(rendered: dict[str, Any]) -> None:
    assert rendered["escape"] == \
        "&lt;script&gt;alert(&quot;x&quot;) &amp; &#39;y&#39;&lt;/script&gt;"
    assert rendered["plain"] == "a &lt; b &amp; c &gt; d"
    for out in rendered["safe"]:
        assert "<" not in out and ">" not in out, out


def test_js_ansi_colours(rendered: dict[str, Any]) -> None:
    assert rendered["colours"] == (
        '<span class="ansi-fg-31">red</span> '
        '<span class="ansi-bold ansi-fg-92">bold green</span>'
        '<span class="ansi-fg-92"> </span>'
        '<span class="ansi-fg-92 ansi-bg-44">blue bg</span> x')
    assert rendered["carry"] == ('<span class="ansi-fg-33">yellow</span>\n'
                                 '<span class="ansi-fg-33">still</span>\nplain')
    assert rendered["reset39"] == ('<span class="ansi-fg-35">m</span>d'
                                   '<span class="ansi-bg-45">b</span>n')
    assert rendered["other"] == "clearbellx"  # other sequences and controls are dropped


def test_js_links(rendered: dict[str, Any]) -> None:
    assert rendered["url"] == (
        'see <a href="https://ex.com/a?b=1&amp;c=" rel="noopener noreferrer" target="_blank">'
        'https://ex.com/a?b=1&amp;c=</a>&lt;2&gt; and '
        '<a href="http://h:3333/q/test/ID" rel="noopener noreferrer" target="_blank">'
        'http://h:3333/q/test/ID</a>.')
    assert rendered["js"] == "javascript:alert(1) ftp://x"
    assert 'href="http://ex.com/wiki/A_(b)"' in rendered["paren"]


def test_js_partial_lines_and_carriage_returns(rendered: dict[str, Any]) -> None:
    assert rendered["cr"] == "30%"
    first, second, third, final, count = rendered["feed"]
    assert first == {"lines": [], "partial": "par"}
    assert second == {"lines": [], "partial": "partial"}
    assert third == {"lines": ['partial<span class="ansi-fg-31">red</span>'],
                     "partial": '<span class="ansi-fg-31">next</span>'}
    assert final == {"lines": ['<span class="ansi-fg-31">next</span>'], "partial": None}
    assert count == 2
    assert rendered["range"] == [{"first": 5, "last": 9, "size": 100}, None]


def test_js_follower_polls_with_ranges_and_stops(tmp_path: Path) -> None:
    """follow() on a fake page (timers, fetch and elements stubbed): S16.6's polling rule."""
    out = run_node(tmp_path, FOLLOW_CASE)
    assert out["first"]["req"] == {"url": "/f", "range": "bytes=0-", "cc": "no-cache"}
    # a complete line, and the partial one shown (the split character waits in the decoder)
    assert out["first"]["lines"] == [["tail-line", "one"], ["tail-line tail-partial", "tw"]]
    assert out["first"]["timers"] == [100]  # after a 206: again in 100 ms, from the new offset
    assert out["req2"]["range"] == "bytes=7-" and out["timers2"] == [1000]  # 416: state in 1 s
    assert [r["url"] for r in out["req3"]] == ["/s.json", "/f"]  # still running: poll again
    assert out["lines3"] == [
        ["tail-line", "one"],
        ["tail-line", 'tw\u00e9o<span class="ansi-fg-32"> ok</span>'],
        ["tail-line tail-partial", '<span class="ansi-fg-32">&lt;x&gt;</span>']]
    assert out["pos"] == "Line 3 / 3" and out["scroll"] == 30  # followed to the bottom
    # done: one last round (416), then no timer is left
    assert out["trail"] == [100, 1000]
    assert out["finalLines"][-1] == ["tail-line", '<span class="ansi-fg-32">&lt;x&gt;</span>']
    assert out["status"] == "ended: done"
