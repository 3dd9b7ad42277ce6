"""The Host header check against DNS rebinding (issue 13, D5; S14): a page on another site
that rebinds its own name to this server must get nothing from it, not even with a
same-origin-looking `Origin`.  Table-driven for the rule, then over a real socket to the web
server a real rq-mgr runs; plus the start-up warning for a dashboard exposed without auth."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlencode

import pytest
from rqtest import wait_for
from webtest import Mgr, build_root, running

from rq.web.security import host_allowed, host_name

KNOWN = ("rq.example.com", "127.0.0.1", "alias.internal", ".corp.example")


@pytest.mark.parametrize("header,name", [
    ("rq.example.com", "rq.example.com"), ("RQ.Example.COM.:3333", "rq.example.com"),
    ("[::1]:3333", "::1"), ("[::1]", "::1"), ("::1", "::1"), ("127.0.0.1:80", "127.0.0.1"),
])
def test_host_name(header: str, name: str) -> None:
    assert host_name(header) == name


@pytest.mark.parametrize("header", [
    None, "localhost", "localhost:3333", "LOCALHOST.", "app.localhost:8080", "127.0.0.1:3333",
    "10.1.2.3", "[::1]:3333", "[fe80::1]", "rq.example.com", "rq.example.com:3333",
    "alias.internal", "corp.example", "a.b.corp.example:9",
])
def test_names_this_server_answers_to(header: str | None) -> None:
    assert host_allowed(header, KNOWN)


@pytest.mark.parametrize("header", [
    "evil.example", "evil.example:3333", "rq.example.com.evil.example", "example.com",
    "xcorp.example", "localhost.evil.example", "", "rq.example.co", "127.0.0.1.nip.io",
])
def test_rebinding_names_are_refused(header: str) -> None:
    assert not host_allowed(header, KNOWN)


def test_a_star_admits_every_name() -> None:
    assert host_allowed("evil.example", ("*",))


# ---------------------------------------------------------------- over the real server


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    root = build_root(tmp_path_factory.mktemp("hosts"), host="rq.example.com",
                      allowed_hosts=["dash.example.org"])
    with running(root):
        yield root


def request(root: Path, method: str, target: str, host: str,
            headers: dict[str, str] | None = None, body: bytes = b"") -> tuple[int, bytes]:
    port = json.loads((root / "config" / "config.json").read_text())["port"]
    head = [f"{method} {target} HTTP/1.1", f"Host: {host}", "Connection: close",
            f"Content-Length: {len(body)}", *(f"{k}: {v}" for k, v in (headers or {}).items())]
    with socket.create_connection(("127.0.0.1", port), timeout=20) as sock:
        sock.sendall("\r\n".join(head).encode() + b"\r\n\r\n" + body)
        raw = b""
        while chunk := sock.recv(65536):
            raw += chunk
    status_line, _, rest = raw.partition(b"\r\n")
    return int(status_line.split()[1]), rest.partition(b"\r\n\r\n")[2]


def new_queue_form(name: str) -> bytes:
    return urlencode({"queue[name]": name, "queue[script]": "/bin/true",
                      "queue[num_workers]": "1", "queue[exec_prefix]": "touch /tmp/pwned;"}
                     ).encode()


FORM = {"Content-Type": "application/x-www-form-urlencoded"}


@pytest.mark.parametrize("target", ["/", "/q.json", "/q/test.json", "/static/dashboard.js",
                                    "/metrics", "/new_queue"])
def test_every_route_refuses_a_foreign_host(site: Path, target: str) -> None:
    status, body = request(site, "GET", target, "evil.example:3333")
    assert status == 400 and b"Invalid Host header" in body, (status, body[:200])


def test_a_rebinding_page_cannot_create_a_queue(site: Path) -> None:
    """The attack of D5: POST /new_queue with the page's own Host and Origin, which the
    CSRF rule alone takes for same-origin."""
    status, body = request(site, "POST", "/new_queue", "evil.example",
                           {**FORM, "Origin": "http://evil.example"}, new_queue_form("rebound"))
    assert status == 400 and b"Invalid Host header" in body, (status, body[:200])
    assert not (site / "queue" / "rebound").exists()
    # the same request under a name the server answers to goes through: the check is the Host
    status, _ = request(site, "POST", "/new_queue", "dash.example.org",
                        {**FORM, "Origin": "http://dash.example.org"}, new_queue_form("named"))
    assert status == 303
    wait_for(lambda: (site / "queue" / "named" / "config.json").exists(), 30,
             what="queue created through an allowed host")


@pytest.mark.parametrize("host", ["rq.example.com", "RQ.example.com:3333", "localhost",
                                  "127.0.0.1", "dash.example.org"])
def test_known_names_are_served(site: Path, host: str) -> None:
    status, body = request(site, "GET", "/q.json", host)
    assert status == 200 and body.startswith(b"{"), (status, body[:200])


# ---------------------------------------------------------------- the start-up warning


def web_warnings(root: Path) -> list[str]:
    log = (root / "log" / "queuemgr.log").read_text()
    return [line for line in log.splitlines() if "rq-web" in line and "without basic_auth" in line]


@pytest.mark.parametrize("addr,auth,warned", [
    ("0.0.0.0", None, True), ("127.0.0.1", None, False),
    ("0.0.0.0", {"realm": "RQ", "users": {"u": "p"}}, False),
])
def test_an_exposed_dashboard_without_auth_is_warned_at_every_start(
        tmp_path: Path, addr: str, auth: dict | None, warned: bool) -> None:
    extra = {"basic_auth": auth} if auth else {}
    root = build_root(tmp_path, addr=addr, **extra)
    for start in (1, 2):
        mgr = Mgr(root)
        mgr.stop()
        if warned:
            assert len(web_warnings(root)) == start
    if not warned:
        assert "rq-web serving on" in (root / "log" / "queuemgr.log").read_text()
        assert web_warnings(root) == []
