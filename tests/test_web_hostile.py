"""The web server under hostile requests (issue 13, web part; SPEC S14.1, S14.8, S15, S1.5).

One real rq-mgr with its rq-web on a free port, shared by the module: a script queue
`test`, a pull queue `pull`, a tmpdir for uploads.  Every test talks HTTP over
127.0.0.1 (a few hostile sockets come from 127.0.0.2, so that the server can tell
them from the well-behaved client) and checks what the issue asks: short requests
stay fast, nothing is left on disk, the log keeps one line per request, bad input
is one 4xx.
"""

from __future__ import annotations

import http.client
import json
import selectors
import socket
import time
from collections.abc import Iterator
from typing import Any

import psutil
import pytest
from rqtest import make_queue, short_id, wait_for
from webtest import Mgr, build_root, http_head, pull_queue, web_pid


LONG_SLOTS = 64  # web.limits.LONG_SLOTS, rq-web's default


@pytest.fixture(scope="module")
def web(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    base = tmp_path_factory.mktemp("hostile")
    spool = base / "spool"
    spool.mkdir()
    root = build_root(base, tmpdir=str(spool), max_upload_bytes=32 * 1024 * 1024)
    make_queue(root, "pull", mode="pull", topic="pull.jobs")
    mgr = Mgr(root)
    port = json.loads((root / "config" / "config.json").read_text())["port"]
    try:
        yield {"root": root, "port": port, "spool": spool}
    finally:
        mgr.stop()


# ---------------------------------------------------------------- helpers


def request(port: int, method: str, path: str, body: bytes = b"",
            headers: dict[str, str] | None = None,
            timeout: float = 10) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request(method, path, body=body or None, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def post_json(port: int, path: str, body: bytes) -> tuple[int, Any]:
    status, _, data = request(port, "POST", path, body, {"Content-Type": "application/json"})
    return status, json.loads(data)


def send_raw(port: int, data: bytes) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(data)
    return sock


def sse_request(port: int) -> bytes:
    return (f"GET /events?pattern=%23 HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            "Accept: text/event-stream\r\n\r\n").encode()


def reserve_request(port: int, wait: int) -> bytes:
    body = json.dumps({"patterns": ["nothing.here"], "wait": wait}).encode()
    return (f"POST /consumer/reserve HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
            ).encode() + body


def answered(socks: list[socket.socket], count: int, timeout: float) -> dict[socket.socket, bytes]:
    """The heads of the first `count` sockets that get an answer within `timeout`."""
    sel = selectors.DefaultSelector()
    for sock in socks:
        sel.register(sock, selectors.EVENT_READ)
    heads: dict[socket.socket, bytes] = {}
    deadline = time.monotonic() + timeout
    try:
        while len(heads) < count and time.monotonic() < deadline:
            for key, _ in sel.select(max(0.0, deadline - time.monotonic())):
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                sel.unregister(sock)
                heads[sock] = http_head(sock)
    finally:
        sel.close()
    return heads


def close_all(socks: list[socket.socket]) -> None:
    for sock in socks:
        sock.close()


def short_request_seconds(port: int, path: str) -> float:
    start = time.monotonic()
    status, _, _ = request(port, "GET", path, timeout=5)
    assert status == 200, path
    return time.monotonic() - start


def prep_message(port: int) -> str:
    status, reply = post_json(port, "/q/test/new_message",
                              b'{"dest": "x", "_method": "prep"}')
    assert status == 200 and reply[0] == "ok", reply
    return short_id(reply[1])


def multipart(files: int, size: int) -> tuple[bytes, dict[str, str]]:
    part = (b'--XyZzY\r\nContent-Disposition: form-data; name="filedata"; '
            b'filename="a.bin"\r\n\r\n' + b"x" * size + b"\r\n")
    return (part * files + b'--XyZzY\r\nContent-Disposition: form-data; name="x_format"'
            b'\r\n\r\njson\r\n--XyZzY--\r\n',
            {"Content-Type": "multipart/form-data; boundary=XyZzY"})


# ---------------------------------------------------------------- D1: long requests (S14.1)


def test_streams_and_long_polls_leave_workers_for_short_requests(web: dict[str, Any]) -> None:
    """Issue 13 D1: 32 event streams and 100 reserves waiting 60 s at once; short
    requests still answer within 1 s, requests beyond the long-request slots get
    503 with Retry-After at once, and closed clients free their slots within seconds."""
    port = web["port"]
    streams = [send_raw(port, sse_request(port)) for _ in range(32)]
    polls: list[socket.socket] = []
    try:
        heads = answered(streams, len(streams), timeout=10)
        assert len(heads) == 32 and all(h.startswith(b"HTTP/1.1 200") for h in heads.values())
        polls = [send_raw(port, reserve_request(port, 60)) for _ in range(100)]
        refused = answered(polls, 100 - (LONG_SLOTS - 32), timeout=10)
        assert len(refused) == 68, f"only {len(refused)} reserves answered at once"
        assert all(h.startswith(b"HTTP/1.1 503") and b"\r\nRetry-After: 5\r\n" in h
                   for h in refused.values())
        times = [short_request_seconds(port, path) for path in ("/q.json", "/", "/q.json")]
        print(f"short requests with every long slot taken: {max(times):.3f} s at most")
        assert max(times) < 1.0
    finally:
        close_all(streams + polls)
    # Every slot is free again long before the reserves' 60 s have passed.
    print(f"every long slot free again {open_every_long_slot(port):.1f} s after the "
          "clients closed")


def open_every_long_slot(port: int, timeout: float = 15) -> float:
    """Open LONG_SLOTS event streams at once, opening a refused one again until
    it is let in; the seconds that took."""
    held: list[socket.socket] = []
    start = time.monotonic()
    try:
        while len(held) < LONG_SLOTS:
            assert time.monotonic() - start < timeout, f"only {len(held)} long slots free"
            sock = send_raw(port, sse_request(port))
            if http_head(sock).startswith(b"HTTP/1.1 200"):
                held.append(sock)
            else:
                sock.close()
                time.sleep(0.05)  # poll interval while a closed client's slot comes back
        return time.monotonic() - start
    finally:
        close_all(held)


# ---------------------------------------------------------------- D2: uploads leave nothing


def test_refused_uploads_leave_no_temporary_files(web: dict[str, Any]) -> None:
    """Issue 13 D2 (S15 route 21): 1,500 file parts, an unknown queue, a body above
    max_upload_bytes: one 4xx each and no file left in tmpdir; a good upload still works."""
    port, spool = web["port"], web["spool"]
    msg_id = prep_message(port)
    body, headers = multipart(1500, 2000)
    status, _, _ = request(port, "POST", f"/q/test/{msg_id}/attach/new", body, headers)
    assert status == 413 and list(spool.iterdir()) == []
    status, _, data = request(port, "POST", f"/q/nosuch/{msg_id}/attach/new", body, headers)
    assert status == 404 and b"404 - Queue not found" in data
    assert list(spool.iterdir()) == []
    body, headers = multipart(1, 32 * 1024 * 1024)  # framing pushes it above the limit
    status, _, _ = request(port, "POST", f"/q/test/{msg_id}/attach/new", body, headers)
    assert status == 413 and list(spool.iterdir()) == []
    body, headers = multipart(1, 1000)
    status, _, data = request(port, "POST", f"/q/test/{msg_id}/attach/new", body, headers)
    assert status == 200 and json.loads(data)[0] == "ok", data
    assert list(spool.iterdir()) == []


# ---------------------------------------------------------------- D6: log forging (S1.5)


def test_request_text_cannot_forge_log_lines(web: dict[str, Any]) -> None:
    """Issue 13 D6: a decoded newline or NUL in the path is escaped in the access log."""
    port, log = web["port"], web["root"] / "log" / "queuemgr.log"
    forged = "2026-11-26T00:00:00.000+00:00 rq-mgr[1] ERROR FORGED"
    path = "/x%0a" + forged.replace(" ", "%20") + "%00%e2%82%ac%c2%85"
    assert request(port, "GET", path)[0] == 404
    escaped = "/x\\n" + forged + "\\x00€\\x85"
    line = wait_for(lambda: next((ln for ln in log.read_text().splitlines()
                                  if escaped in ln), None), what="the access line")
    assert line.endswith('" 404 ' + line.rsplit(" ", 1)[1])
    assert not any(ln.startswith(forged) for ln in log.read_text().splitlines())
    assert "\0" not in log.read_text()


# ---------------------------------------------------------------- D9: 4xx, never 500


@pytest.mark.parametrize(("path", "body", "expected"), [
    ("/q/test/new_message", b'{"dest": "x", "param1": 1e999}',
     (400, ["fail", "Invalid JSON: number out of range: 1e999"])),
    ("/q/test/new_message", b'{"dest": "x", "due": -1e999}',
     (400, ["fail", "Invalid JSON: number out of range: -1e999"])),
    ("/consumer/reserve", b'{"patterns": ["a"], "wait": 1e999}',
     (400, ["fail", "Invalid JSON: number out of range: 1e999"])),
    ("/consumer/reserve", b"[" * 100_000 + b"]" * 100_000, (400, ["fail", "Invalid JSON"])),
])
def test_bad_json_bodies_are_400(web: dict[str, Any], path: str, body: bytes,
                                 expected: tuple[int, Any]) -> None:
    """Issue 13 D9, S14.8: numbers out of range and deep nesting are one 400."""
    assert post_json(web["port"], path, body) == expected


@pytest.mark.parametrize("path", ["/q/test/done.json?limit=99999999999999999999999",
                                  "/q/test.json?limit=99999999999999999999999",
                                  "/search?name=test&limit=99999999999999999999999"])
def test_huge_limits_are_400(web: dict[str, Any], path: str) -> None:
    status, _, data = request(web["port"], "GET", path)
    assert (status, json.loads(data)) == (400, ["fail", "Invalid limit"])


def test_huge_log_offset_is_400(web: dict[str, Any]) -> None:
    """Issue 13 D9 (S17.2): an offset no file can have is a 400, not a 500."""
    port = web["port"]
    status, reply = post_json(port, "/q/test/new_message", b'{"dest": "x"}')
    assert status == 200 and reply[0] == "ok", reply
    log = f"/q/test/{short_id(reply[1])}/log/stdio.log"
    wait_for(lambda: request(port, "GET", log)[0] == 200, what="the job's log")
    status, _, data = request(port, "GET", log.replace("/log/", "/logstream/")
                              + "?offset=99999999999999999999999")
    assert status == 400 and b"400 - Invalid offset" in data, (status, data[:200])


def test_large_json_body_is_413_without_growing_the_web(web: dict[str, Any]) -> None:
    """Issue 13 D9: a body above max_body_bytes (default 8 MiB) is refused before it is
    read into memory; S4.4's 1 MiB message still goes through."""
    port = web["port"]
    pid = web_pid(web["root"])
    assert pid is not None
    proc = psutil.Process(pid)
    before = proc.memory_info().rss
    big = b'{"dest": "x", "param1": "' + b"y" * (24 * 1024 * 1024) + b'"}'
    status, reply = post_json(port, "/q/test/new_message", big)
    assert status == 413 and reply == ["fail", "Request Entity Too Large"]
    grown = proc.memory_info().rss - before
    print(f"web RSS grew {grown / 2**20:.1f} MiB on a 24 MiB JSON body")
    assert grown < 12 * 1024 * 1024
    pull_queue(web["root"], "bigpull")  # script mode refuses a 1 MiB param (D10)
    one_mib = b'{"dest": "x", "_method": "prep", "param1": "' + b"z" * (1 << 20) + b'"}'
    status, reply = post_json(port, "/q/bigpull/new_message", one_mib)
    assert status == 200 and reply[0] == "ok", reply


# ---------------------------------------------------------------- D10: connection hoarding


def test_hoarded_connections_do_not_lock_out_other_clients(web: dict[str, Any]) -> None:
    """Issue 13 D10: 1,100 connections that never send a byte (above the 1,000 rq-web
    keeps open) do not stop another client from getting /q.json within 1 s."""
    port = web["port"]
    hoard: list[socket.socket] = []
    try:
        for _ in range(1100):
            sock = socket.socket()
            sock.bind(("127.0.0.2", 0))
            sock.setblocking(False)
            sock.connect_ex(("127.0.0.1", port))
            hoard.append(sock)
        times = [short_request_seconds(port, "/q.json") for _ in range(5)]
        print(f"/q.json behind 1,100 idle connections: {max(times):.3f} s at most")
        assert max(times) < 1.0
    finally:
        close_all(hoard)
