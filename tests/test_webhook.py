"""The webhook builtin queue (SPEC S12.2): the pure decisions, then a real root (rq-mgr, a
`test` queue, the builtin `webhook` queue) posting to a small real HTTP server in the test."""

from __future__ import annotations

import base64
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import pytest

from rq import client
from rq.builtin import jobio
from rq.builtin import webhook as W
from rqtest import free_port, make_queue, short_id, wait_for, write_script
from webtest import build_root, install_builtin, running

# ================================================================ pure decisions


@pytest.mark.parametrize("count,url,line", [
    (16, "http://h/x", "fail RQ_COUNT > 15 FAIL"),
    (15, "http://h/x", None),
    (0, "https://h/x", None),
    (0, "", "fail invalid webhook url in RQ_PARAM1: ''"),
    (0, "ftp://h/x", "fail invalid webhook url in RQ_PARAM1: 'ftp://h/x'"),
])
def test_s12_2_start(count: int, url: str, line: str | None) -> None:
    assert W.start(count, url) == line


@pytest.mark.parametrize("count,code,detail,line", [
    (0, 200, "ok", "done successfull post 200"),
    (3, 204, "", "done successfull post 204"),
    (0, 500, "boom", "resend 0-post got HTTP 500: boom"),
    (1, 302, "moved", "resend 60-post got HTTP 302: moved"),
    (2, None, "Connection refused", "resend 240-post failed: Connection refused"),
    (3, 404, "a\nb", "resend 540-post got HTTP 404: a b"),
])
def test_s12_2_outcome(count: int, code: int | None, detail: str, line: str) -> None:
    assert W.outcome(count, code, detail) == line


def test_s12_2_form_and_credentials() -> None:
    assert W.form('{"a":1}') == {"x_format": "json", "payload": '{"a":1}'}
    assert jobio.split_credentials("http://u:p%21@h:1/x") == ("http://h:1/x", ("u", "p!"))


# ================================================================ a real root


class Hooks:
    """A real HTTP server recording each POST; replies with the codes queued per path."""

    def __init__(self) -> None:
        self.posts: list[dict[str, Any]] = []
        self.codes: dict[str, list[int]] = {}
        self.lock = threading.Lock()
        hooks = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with hooks.lock:
                    queued = hooks.codes.get(self.path) or [200]
                    code = queued.pop(0) if len(queued) > 1 else queued[0]
                    hooks.posts.append({"path": self.path, "code": code,
                                        "auth": self.headers.get("Authorization"),
                                        "type": self.headers.get("Content-Type"),
                                        "form": parse_qs(body.decode(), keep_blank_values=True),
                                        "time": time.time()})
                self.send_response(code)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def to(self, path: str) -> list[dict[str, Any]]:
        with self.lock:
            return [p for p in self.posts if p["path"] == path]

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class Site:
    def __init__(self, base: Path) -> None:
        self.root = build_root(base)
        install_builtin(self.root, "webhook")
        bad = write_script(base / "bad.sh", '#!/bin/sh\necho "fail by design" >&3\n')
        make_queue(self.root, "bad", script=bad)

    def wait_up(self) -> None:
        for name in ("test", "bad", "webhook"):
            wait_for(lambda n=name: self.ping(n), 60, what=f"queue {name} up")

    def ping(self, name: str) -> bool:
        try:
            return self.call(name, "ping") == ["pong"]
        except Exception:
            return False

    def call(self, queue: str, cmd: str, arg: Any = None) -> Any:
        return client.call_queue(str(self.root), queue, cmd, arg)

    def hook_messages(self) -> list[dict[str, Any]]:
        """Every message of the webhook queue, as read: one entry per message (a message that
        moves que -> run between two listings is listed twice; each is read once, as it is now)."""
        out: dict[str, dict[str, Any]] = {}
        for state in ("que", "run", "done", "err"):
            for entry in self.call("webhook", "messages", {"state": state}):
                reply = self.call("webhook", "get_message", {"msg_id": entry["msg_id"]})
                if reply[0] == "ok":
                    out[reply[1]["msg_id"]] = reply[1]
        return list(out.values())

    def hook_for(self, url: str) -> dict[str, Any] | None:
        found = [m for m in self.hook_messages() if m.get("param1") == url]
        assert len(found) <= 1, found
        return found[0] if found else None

    def wait_hook(self, url: str, state: str, timeout: float = 60) -> dict[str, Any]:
        def get() -> dict[str, Any] | None:
            m = self.hook_for(url)
            return m if m and m["state"] == state else None
        return wait_for(get, timeout, interval=0.1, what=f"webhook to {url} in {state}")

    def log_lines(self, msg: dict[str, Any]) -> list[str]:
        text = (self.root / msg["path"] / "job" / "stdio.log").read_text()
        return [line.split(" - ", 2)[2] for line in text.splitlines()
                if line.count(" - ") >= 2 and " - RQ START - " not in line]


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    s = Site(tmp_path_factory.mktemp("webhook"))
    with running(s.root):
        s.wait_up()
        yield s


@pytest.fixture
def hooks() -> Iterator[Hooks]:
    h = Hooks()
    yield h
    h.stop()


def finished(site: Site, queue: str, full: str) -> dict[str, Any]:
    wait_for(lambda: site.call(queue, "get_message_state", {"msg_id": full})[1]
             in ("done", "err", "relayed"), 60, what=f"{full} finished")
    return dict(site.call(queue, "get_message", {"msg_id": full})[1])


def expected_payload(site: Site, msg: dict[str, Any], full: str) -> dict[str, Any]:
    """S12.2: the stored fields (the msg file, S4.4) with the full id and the final state."""
    stored = json.loads((site.root / msg["path"] / "msg").read_text())
    return {**stored, "msg_id": full, "state": msg["state"]}


def test_s12_2_exact_payload_and_basic_auth(site: Site, hooks: Hooks) -> None:
    plain, authed = f"{hooks.url}/plain", hooks.url.replace("://", "://hu:h%20pw@") + "/auth"
    reply = site.call("test", "create_message", {
        "dest": "test", "param1": "p é", "src": "me", "post_run_webhook": [plain, authed]})
    full = reply[1]
    msg = finished(site, "test", full)
    assert msg["state"] == "done"
    hook = site.wait_hook(plain, "done")
    assert hook["status"] == "done - successfull post 200"
    assert (hook["dest"], hook["count"]) == ("webhook", 0)
    [post] = hooks.to("/plain")
    assert post["type"] == "application/x-www-form-urlencoded"
    assert sorted(post["form"]) == ["payload", "x_format"] and post["form"]["x_format"] == ["json"]
    raw = post["form"]["payload"][0]
    assert raw == hook["param2"]                        # posted exactly as queued
    payload = json.loads(raw)
    assert payload == expected_payload(site, msg, full)
    assert raw == json.dumps(payload, separators=(",", ":"), ensure_ascii=False)  # compact
    assert payload["state"] == "done" and payload["msg_id"] == full
    site.wait_hook(authed, "done")
    [post] = hooks.to("/auth")
    assert post["auth"] == "Basic " + base64.b64encode(b"hu:h pw").decode()
    assert "h pw" not in "\n".join(site.log_lines(site.hook_for(authed) or {}))


def test_s12_2_err_message_fires_too(site: Site, hooks: Hooks) -> None:
    url = f"{hooks.url}/err"
    full = site.call("bad", "create_message", {"dest": "bad", "post_run_webhook": url})[1]
    msg = finished(site, "bad", full)
    assert msg["state"] == "err"
    site.wait_hook(url, "done")
    [post] = hooks.to("/err")
    assert json.loads(post["form"]["payload"][0]) == expected_payload(site, msg, full)


def test_s12_2_non_2xx_resends_with_backoff(site: Site, hooks: Hooks) -> None:
    """500 at RQ_COUNT 0 → `resend 0-…` (again at once); 503 at RQ_COUNT 1 → `resend 60-…`
    (due 60 s later); nudged with run_message (S5.5), 201 → done with count 2."""
    url = f"{hooks.url}/flaky"
    hooks.codes["/flaky"] = [500, 503, 201]
    full = site.call("test", "create_message", {"dest": "test", "post_run_webhook": [url]})[1]
    finished(site, "test", full)

    def waiting() -> dict[str, Any] | None:
        m = site.hook_for(url)
        return m if m and m["state"] == "que" and m["count"] == 2 else None
    hook = wait_for(waiting, 60, interval=0.1, what="two failed posts")
    second = hooks.to("/flaky")[1]
    assert [p["code"] for p in hooks.to("/flaky")] == [500, 503]
    assert 59 <= hook["due"] - second["time"] <= 75   # due = exit time + 60 (S5.4)
    assert hook["status"] == "que - 60-post got HTTP 503: ok"
    reply = site.call("webhook", "run_message", {"msg_id": short_id(hook["msg_id"])})
    assert reply == ["ok", "msg sent to front of run queue"]
    done = site.wait_hook(url, "done")
    assert done["status"] == "done - successfull post 201" and done["count"] == 2
    lines = site.log_lines(done)
    assert [line for line in lines if line.startswith(("resend", "done"))] == [
        "resend 0-post got HTTP 500: ok", "resend 60-post got HTTP 503: ok",
        "done successfull post 201"]


def test_s12_2_unreachable_url_resends(site: Site) -> None:
    url = f"http://127.0.0.1:{free_port()}/gone"
    reply = site.call("webhook", "create_message", {"dest": "webhook", "param1": url,
                                                     "param2": "{}", "count": 1})
    hook = wait_for(lambda: (m := site.hook_for(url)) and m["state"] == "que"
                    and m["count"] == 2 and m, 60,
                    interval=0.1, what="a resend")
    assert hook["status"].startswith("que - 60-post failed: ")
    assert site.call("webhook", "delete_message", {"msg_id": short_id(reply[1])})[0] == "ok"


def test_s12_2_rq_count_over_15_fails(site: Site) -> None:
    url = "http://127.0.0.1:9/never"
    site.call("webhook", "create_message", {"dest": "webhook", "param1": url, "param2": "{}",
                                            "count": 16, "max_count": 20})
    hook = site.wait_hook(url, "err")
    assert hook["status"] == "err - RQ_COUNT > 15 FAIL"
