"""Named event cursors over HTTP (issue 18 item 3; S8.8, S15, S16): `GET
/events?cursor=NAME` (each record's `id` is its position; `Last-Event-ID` on a
reconnect acknowledges it), `POST events/ack`, `cursors.json`, `POST
cursors/NAME/delete`, and the Cursors page in headless Chromium.  A real rq-web
over a real rq-mgr with paused queues (two events per message: prep, que).
"""

from __future__ import annotations

import html
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests
from browser import browser_unavailable, screenshot
from rqtest import make_queue
from webtest import build_root, running

from rq import client


@dataclass
class Site:
    root: Path
    url: str  # ends with ROOT's "/"


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    root = build_root(tmp_path_factory.mktemp("cursors"))
    make_queue(root, "held", script="/bin/true", topic="billing.held")
    (root / "config" / "held.pause").write_text("")
    with running(root, web=True) as web:
        yield Site(root, web.url)


def send(site: Site, n: int = 1) -> list[str]:
    out = []
    for _ in range(n):
        reply = client.call_queue(str(site.root), "held", "create_message", {"dest": "held"})
        assert reply[0] == "ok", reply
        out.append(reply[1].rsplit("/", 1)[-1])
    return out


def records(resp: requests.Response, n: int) -> list[dict[str, Any]]:
    """The next n SSE records (comments skipped) as {"id"?, "event", "data"}."""
    got: list[dict[str, Any]] = []
    rec: dict[str, Any] = {}
    for line in resp.iter_lines(decode_unicode=True):
        if line == "":
            if rec:
                got.append(rec)
                rec = {}
                if len(got) == n:
                    return got
            continue
        if line.startswith(":"):
            continue
        field, _, value = line.partition(": ")
        rec[field] = json.loads(value) if field == "data" else value
    raise AssertionError(f"stream ended after {got}")


def stream(site: Site, name: str, headers: dict[str, str] | None = None,
           **params: str) -> requests.Response:
    resp = requests.get(site.url + "events", params={"cursor": name, **params},
                        headers=headers or {}, stream=True, timeout=(10, 60))
    assert resp.status_code == 200, resp.text
    return resp


def test_issue18_sse_last_event_id_resumes_after_it(site: Site) -> None:
    with stream(site, "sse1", pattern="billing.#") as resp:
        ids = send(site, 2)
        got = records(resp, 4)
    assert [(r["event"], r["data"]["msg_id"], r["data"]["to"]) for r in got] == [
        ("transition", ids[0], "prep"), ("transition", ids[0], "que"),
        ("transition", ids[1], "prep"), ("transition", ids[1], "que")]
    assert all(re.fullmatch(r"[0-9a-f]{6}:\d+", r["id"]) and "pos" not in r["data"]
               for r in got)
    # the browser's reconnect: Last-Event-ID acknowledges up to the second record
    more = send(site)
    with stream(site, "sse1", {"Last-Event-ID": got[1]["id"]}) as resp:
        again = records(resp, 4)
    assert [(r["data"]["msg_id"], r["data"]["to"]) for r in again] == [
        (ids[1], "prep"), (ids[1], "que"), (more[0], "prep"), (more[0], "que")]
    # the explicit ack route makes it durable while connected
    ack = requests.post(site.url + "events/ack", data={"cursor": "sse1", "id": again[-1]["id"]},
                        timeout=30)
    assert (ack.status_code, ack.json()) == (200, {"cursor": "sse1", "position": 6})
    listed = requests.get(site.url + "cursors.json", timeout=30).json()
    row = next(r for r in listed if r["name"] == "sse1")
    assert (row["position"], row["lag"], row["patterns"]) == (6, 0, ["billing.#"])


@pytest.mark.parametrize("params, code, text", [
    ({"cursor": "a/b", "pattern": "#"}, 400, "400 - invalid cursor name 'a/b'"),
    ({"cursor": "nosuch"}, 404, "404 - cursor nosuch does not exist: give patterns to create it"),
    ({"cursor": "x", "pattern": "#", "since": "1"}, 400, "400 - since and cursor cannot"),
])
def test_issue18_sse_bad_requests(site: Site, params: dict[str, str], code: int,
                                  text: str) -> None:
    resp = requests.get(site.url + "events", params=params, timeout=30)
    assert resp.status_code == code
    assert text in html.unescape(resp.text) and "Traceback" not in resp.text


def test_issue18_ack_route_errors(site: Site) -> None:
    bad = requests.post(site.url + "events/ack", json={"cursor": "nosuch", "id": "a:1"},
                        timeout=30)
    assert (bad.status_code, bad.json()) == (404, ["fail", "no such cursor: nosuch"])
    missing = requests.post(site.url + "events/ack", json={"cursor": "x"}, timeout=30)
    assert (missing.status_code, missing.json()) == (400, ["fail", "missing cursor or id"])


def test_issue18_delete_route(site: Site) -> None:
    with stream(site, "gone", pattern="#") as live:
        resp = requests.post(site.url + "cursors/gone/delete", data={"x_format": "json"},
                             timeout=30)
        assert resp.json() == ["ok", "cursor deleted"]
        (end,) = records(live, 1)  # the open stream says why it ends
        assert (end["event"], end["data"]) == ("end", ["fail", "cursor gone deleted"])
    again = requests.post(site.url + "cursors/gone/delete", data={"x_format": "json"},
                          timeout=30)
    assert again.json() == ["fail", "no such cursor: gone"]
    assert all(r["name"] != "gone" for r in requests.get(site.url + "cursors.json",
                                                          timeout=30).json())


# ---------------------------------------------------------------- the page, in Chromium

UNAVAILABLE = browser_unavailable()


@pytest.mark.skipif(UNAVAILABLE is not None, reason=f"no browser: {UNAVAILABLE}")
def test_issue18_cursors_page_shows_position_lag_and_deletes(site: Site, page: Any) -> None:
    from playwright.sync_api import expect
    with client.subscribe(str(site.root), ["billing.#"], cursor="pagecur") as sub:
        send(site, 3)
        got = []
        while len(got) < 6:
            item = sub.next(10)
            if isinstance(item, dict):
                got.append(item)
        sub.ack(got[1]["pos"])
        assert sub.next(10) == ["ok", "acked", 2]
    page.goto(site.url)
    page.click("#nav-cursors")
    row = page.locator('tr[data-cursor="pagecur"]')
    expect(row.locator('[data-col="position"]')).to_have_text("2")
    expect(row.locator('[data-col="lag"]')).to_have_text("4")
    expect(row.locator('[data-col="state"]')).to_have_text("idle")
    expect(row.locator('[data-col="acked"]')).not_to_have_text("never")
    expect(row.locator("td").nth(1)).to_have_text("billing.#")
    screenshot(page, "cursors.png")
    row.locator("button", has_text="Delete").click()
    expect(page.locator(".flash")).to_contain_text("Cursor pagecur deleted")
    expect(page.locator('tr[data-cursor="pagecur"]')).to_have_count(0)
