"""Issue 15: `POST /q/NAME/new_messages` (web.bulkcreate), many messages in one request,
against a real rq-mgr and its real web server, over real HTTP: ids in input order, a
refused line stops everything after it, oversize bodies create nothing, and the POST
checks (Host, CSRF; S14.4, S14.5) apply as on every other POST route."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from rqtest import REPO, make_queue, wait_for
from webtest import build_root, running

from rq import client

MAX_BODY = 64 * 1024  # the site's max_body_bytes


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str]]:
    base = tmp_path_factory.mktemp("bulkcreate")
    root = build_root(base, relative_root="/rq", max_body_bytes=MAX_BODY)
    make_queue(root, "held", script="/bin/true")
    (root / "config" / "held.pause").write_text("")  # S3.5: its messages stay in que
    with running(root, web=True) as web:
        yield root, web.url


def que_count(root: Path) -> int:
    return int(client.call_queue(str(root), "held", "num_messages")["que"])


def param1(root: Path, full: str) -> Any:
    reply = client.call_queue(str(root), "held", "get_message", {"msg_id": full.rsplit("/", 1)[1]})
    assert reply[0] == "ok", reply
    return reply[1].get("param1")


def post(
    url: str, body: bytes | str, ctype: str = "application/x-ndjson", **headers: str
) -> requests.Response:
    return requests.post(
        url + "q/held/new_messages",
        data=body,
        timeout=60,
        headers={"Content-Type": ctype, **headers},
    )


def ndjson(n: int, start: int = 0) -> str:
    return "".join(json.dumps({"param1": f"m{i}"}) + "\n" for i in range(start, start + n))


def test_ndjson_creates_all_in_input_order(site: tuple[Path, str]) -> None:
    root, url = site
    before = que_count(root)
    body = ndjson(300) + "\n  \n"  # blank lines are skipped
    resp = post(url, body)
    assert resp.status_code == 200 and resp.headers["Content-Type"] == "application/json"
    status, ids = resp.json()
    assert status == "ok" and len(ids) == 300 and len(set(ids)) == 300
    assert all("/rq/q/held/" in i for i in ids)
    assert [param1(root, i) for i in (ids[0], ids[255], ids[256], ids[299])] == [
        "m0",
        "m255",
        "m256",
        "m299",
    ]
    assert que_count(root) == before + 300


def test_json_array_body(site: tuple[Path, str]) -> None:
    root, url = site
    resp = post(
        url, json.dumps([{"param1": "a"}, {"param1": "b", "param2": 3}]), "application/json"
    )
    status, ids = resp.json()
    assert (resp.status_code, status, len(ids)) == (200, "ok", 2)
    assert [param1(root, i) for i in ids] == ["a", "b"]
    resp = post(url, json.dumps({"param1": "not an array"}), "application/json")
    assert (resp.status_code, resp.json()) == (
        400,
        ["fail", "Invalid JSON: a JSON array of messages expected"],
    )


@pytest.mark.parametrize(
    "bad, reason",
    [
        ('{"param1": ', "Invalid JSON"),  # not JSON at all
        ('{"param1": NaN}', "Invalid JSON"),  # not plain JSON (S0.3.5)
        ('["a list"]', "not a JSON object"),
        ('{"due": "soon"}', "invalid due value"),  # refused by the queue (S4.4)
    ],
)
def test_a_bad_line_in_the_middle_stops_there(
    site: tuple[Path, str], bad: str, reason: str
) -> None:
    """Lines before it are created (and their ids given, in order), none after it."""
    root, url = site
    before = que_count(root)
    lines = ndjson(400).splitlines()
    lines[299] = bad  # line 300, in the second frame of 256
    resp = post(url, "\n".join(lines) + "\n")
    assert resp.status_code == 400
    status, text, ids = resp.json()
    assert (status, text, len(ids)) == ("fail", f"line 300: {reason}", 299)
    assert param1(root, ids[-1]) == "m298"
    assert que_count(root) == before + 299


def test_oversize_creates_nothing(site: tuple[Path, str]) -> None:
    root, url = site
    before = que_count(root)
    body = ndjson(MAX_BODY // 10)  # ~20 bytes a line: over the limit
    assert len(body) > MAX_BODY
    resp = post(url, body)
    assert resp.status_code == 413 and resp.json()[0] == "fail"
    assert que_count(root) == before


def test_post_checks_apply(site: tuple[Path, str]) -> None:
    root, url = site
    before = que_count(root)
    resp = post(url, ndjson(2), Origin="http://evil.example")
    assert (resp.status_code, resp.json()) == (403, ["fail", "Cross-origin request refused"])
    resp = post(url, ndjson(2), Host="evil.example")
    assert (resp.status_code, resp.json()) == (400, ["fail", "Invalid Host header"])
    resp = requests.post(url + "q/nosuch/new_messages", data=ndjson(1), timeout=30)
    assert (resp.status_code, resp.json()) == (404, ["fail", "Queue not found"])
    assert que_count(root) == before


def test_down_queue_is_503(site: tuple[Path, str]) -> None:
    root, url = site
    flag = root / "config" / "held.down"
    flag.write_text("")
    try:
        resp = post(url, ndjson(1))
        assert resp.status_code == 503
        assert resp.json() == ["fail", "Service Unavailable - Operationally Down"]
    finally:
        flag.unlink()


def web_posts(root: Path, path: str) -> int:
    log = root / "log" / "queuemgr.log"  # rq-web logs there under rq-mgr
    return log.read_text().count(f'"POST /rq/q/held/{path} ') if log.exists() else 0


def test_rq_sendmesg_stdin_url_posts_batches(site: tuple[Path, str]) -> None:
    """`rq sendmesg --stdin --url` sends a batch per POST (rq.transports.HttpBulk), not a
    POST per message: 600 lines are three requests of at most 256 messages."""
    root, url = site
    env = {k: v for k, v in os.environ.items() if k != "RQ_ROOT"}
    before = (web_posts(root, "new_messages"), web_posts(root, "new_message"), que_count(root))
    result = subprocess.run(
        [str(REPO / "bin" / "rq"), "sendmesg", "--url", url, "--dest", "held", "--stdin"],
        input="".join(f"s{i}\n" for i in range(600)),
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd="/",
    )
    assert (result.returncode, result.stderr) == (0, "")
    ids = result.stdout.splitlines()
    assert len(ids) == 600 and param1(root, ids[599]) == "s599"
    wait_for(lambda: web_posts(root, "new_messages") >= before[0] + 3, what="access log lines")
    assert web_posts(root, "new_messages") == before[0] + 3
    assert (web_posts(root, "new_message"), que_count(root)) == (before[1], before[2] + 600)
