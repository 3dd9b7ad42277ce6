"""S8.8 / S15 route 31: `GET /events` as Server-Sent Events, through the real
web server that rq-mgr starts (basic auth on, S14.3), plus the keep-alive
comment through the app (with a short keep-alive) over the same manager."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from rqtest import make_queue, read_events, wait_for
from webtest import Mgr, build_root, running

from rq import client
from rq.config import load_main_config

USERS = {"watcher": "s3cret"}
AUTH = ("watcher", "s3cret")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    root = build_root(tmp_path_factory.mktemp("sse"),
                      basic_auth={"realm": "RQ events", "users": USERS},
                      relative_root="/therq")
    make_queue(root, "enc", script="/bin/true", topic="video.encode")
    (root / "config" / "enc.pause").write_text("")
    with running(root):
        yield root


def url(root: Path) -> str:
    main = load_main_config(str(root))
    return f"http://127.0.0.1:{main.port}{main.relative_root}events"


def create(root: Path, queue: str) -> str:
    reply = client.call_queue(str(root), queue, "create_message", {"dest": queue})
    assert reply[0] == "ok", reply
    return str(reply[1]).rsplit("/", 1)[-1]


class SSE:
    """Reads one text/event-stream response record by record."""

    def __init__(self, resp: requests.Response) -> None:
        self.resp = resp
        self.lines = resp.iter_lines(decode_unicode=True)

    def record(self) -> list[str]:
        out: list[str] = []
        for line in self.lines:
            if line == "":
                if out:
                    return out
                continue
            out.append(line)
        raise AssertionError("stream ended")

    def events(self, until: Any) -> list[tuple[str, dict[str, Any]]]:
        got: list[tuple[str, dict[str, Any]]] = []
        while not until(got):
            rec = self.record()
            if rec[0].startswith(":"):
                continue
            assert rec[0].startswith("event: ") and rec[1].startswith("data: "), rec
            got.append((rec[0][7:], json.loads(rec[1][6:])))
        return got


def test_s14_3_events_needs_basic_auth(site: Path) -> None:
    resp = requests.get(url(site), params={"pattern": "#"}, timeout=30)
    assert resp.status_code == 401
    assert resp.headers["WWW-Authenticate"] == 'Basic realm="RQ events"'


@pytest.mark.parametrize("params, text", [
    ({}, "400 - missing pattern"),
    ({"pattern": "a..b"}, "400 - invalid pattern: a..b"),
    ({"pattern": ["ok", "#.x"]}, "400 - invalid pattern: #.x"),
    ({"pattern": "#", "since": "later"}, "400 - invalid since"),
])
def test_s8_8_bad_requests(site: Path, params: dict[str, Any], text: str) -> None:
    resp = requests.get(url(site), params=params, auth=AUTH, timeout=30)
    assert resp.status_code == 400
    assert text in resp.text


def test_s14_1_head(site: Path) -> None:
    resp = requests.head(url(site), params={"pattern": "#"}, auth=AUTH, timeout=30)
    assert resp.status_code == 200
    assert resp.headers["Content-Type"].startswith("text/event-stream")


def test_s8_8_sse_replays_since_then_follows_live(site: Path) -> None:
    """A stream with `since` (and a comma list of patterns) gets the logged
    events of a finished message as `transition` records with `topic`, then
    the live events of new messages; other topics are filtered out."""
    since = time.time()
    first = create(site, "test")
    wait_for(lambda: any(e["msg_id"] == first and e["to"] == "done"
                         for e in read_events(site, "test")), 30, what="first message done")
    create(site, "enc")  # video.encode: not subscribed
    with requests.get(url(site), params={"pattern": "test,nothing.*", "since": str(since)},
                      auth=AUTH, stream=True, timeout=(10, 60)) as resp:
        assert resp.status_code == 200
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        assert resp.headers["Cache-Control"] == "no-cache"
        sse = SSE(resp)
        assert sse.record() == [": subscribed"]
        got = sse.events(lambda g: len(g) >= 4)
        assert [(kind, e["msg_id"], e["to"], e["topic"]) for kind, e in got] == [
            ("transition", first, to, "test") for to in ("prep", "que", "run", "done")]
        second = create(site, "enc")
        third = create(site, "test")
        got = sse.events(lambda g: len(g) >= 4)
    assert {e["msg_id"] for _, e in got} == {third}
    assert second not in json.dumps(got)
    assert [e["to"] for _, e in got] == ["prep", "que", "run", "done"]


def test_s8_8_sse_wildcard_and_multiple_patterns(site: Path) -> None:
    since = time.time()
    enc = create(site, "enc")
    with requests.get(url(site), params={"pattern": ["video.*", "other"], "since": since},
                      auth=AUTH, stream=True, timeout=(10, 60)) as resp:
        got = SSE(resp).events(lambda g: len(g) >= 2)
    assert [(e["queue"], e["msg_id"], e["topic"]) for _, e in got] == \
        [("enc", enc, "video.encode")] * 2


def test_s8_8_keepalive_comment(site: Path) -> None:
    """A comment is sent when nothing happened for the keep-alive period
    (15 s in production; shortened here through the app's config)."""
    import base64

    from rq.web import create_app
    app = create_app(str(site), overrides={"RQ_STREAM_KEEPALIVE": 0.3})
    auth = {"Authorization": "Basic " + base64.b64encode(b"watcher:s3cret").decode()}
    resp = app.test_client().get("/therq/events?pattern=nothing.here", headers=auth,
                                 buffered=False)
    assert resp.status_code == 200
    body = iter(resp.response)
    try:
        assert next(body) == b": subscribed\n\n"
        t0 = time.monotonic()
        assert next(body) == b": keepalive\n\n"
        assert time.monotonic() - t0 >= 0.25
    finally:
        resp.close()


def test_s2_5_open_streams_do_not_hold_up_the_manager(tmp_path: Path) -> None:
    root = build_root(tmp_path)
    mgr = Mgr(root)
    resp = None
    try:
        resp = requests.get(url(root), params={"pattern": "#"}, stream=True, timeout=(10, 60))
        assert SSE(resp).record() == [": subscribed"]
    finally:
        t0 = time.monotonic()
        mgr.stop()
    assert time.monotonic() - t0 < 30
    assert resp is not None
    with pytest.raises((AssertionError, requests.RequestException)):
        SSE(resp).record()  # the stream ended with the server
    resp.close()
