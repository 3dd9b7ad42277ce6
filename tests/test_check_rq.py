"""check_rq (SPEC S22) as a real program against a real HTTP server on 127.0.0.1 that serves
`ROOTq.txt` (S15 route 6) and `ROOTq/NAME.txt` in the S15.2 `key: value` format."""

from __future__ import annotations

import base64
import os
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from rqtest import REPO, free_port

CHECK_RQ = REPO / "bin" / "check_rq"


def queue_txt(status: str = "UP", prep: int = 0, que: int = 0, run: int = 0, done: int = 0,
              err: int = 0, relayed: int = 0) -> str:
    """A queue's page exactly as S15.2 shows it; DOWN sends only its status line."""
    if status != "UP":
        return f"status: {status}\n"
    return (f"status: {status}\nuptime: 1234\n\nprep: {prep}\nque: {que}\nrun: {run}\n\n"
            f"done: {done}\nerr: {err}\nrelayed: {relayed}\n")


@dataclass
class FakeRQ:
    """What the test server answers: path → body; absent → 404."""

    port: int = 0
    pages: dict[str, str] = field(default_factory=dict)
    auth: tuple[str, str] | None = None
    slow: set[str] = field(default_factory=set)
    release: threading.Event = field(default_factory=threading.Event)

    def set_queues(self, prefix: str = "/", **queues: str) -> None:
        self.pages.clear()
        self.pages[f"{prefix}q.txt"] = "".join(f"{prefix}q/{n}.txt\n" for n in sorted(queues))
        for name, body in queues.items():
            self.pages[f"{prefix}q/{name}.txt"] = body


def make_handler(fake: FakeRQ) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
            if self.path in fake.slow:
                fake.release.wait(30)  # longer than the client's timeout; released at teardown
            if fake.auth and not self.authorized():
                self.send_response(401)
                self.send_header("WWW-Authenticate", 'Basic realm="rq"')
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            body = fake.pages.get(self.path)
            data = (body if body is not None else f"Not Found: {self.path}").encode()
            self.send_response(200 if body is not None else 404)
            self.send_header("Content-Type", "text/plain; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def authorized(self) -> bool:
            assert fake.auth
            want = base64.b64encode(":".join(fake.auth).encode()).decode()
            return self.headers.get("Authorization") == f"Basic {want}"

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002
            pass

    return Handler


@pytest.fixture
def rq_http() -> Iterator[FakeRQ]:
    fake = FakeRQ()
    server = ThreadingHTTPServer(("127.0.0.1", 0), make_handler(fake))
    server.daemon_threads = True
    fake.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield fake
    finally:
        fake.release.set()
        server.shutdown()
        server.server_close()
        thread.join(10)


def check_rq(fake: FakeRQ | None, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k != "RQ_PORT"}
    base.update(env)
    port = ["-p", str(fake.port)] if fake else []
    return subprocess.run([str(CHECK_RQ), *port, *args], env=base, capture_output=True,
                          text=True, timeout=60)


def expect(res: subprocess.CompletedProcess[str], code: int, line: str) -> None:
    assert (res.returncode, res.stdout, res.stderr) == (code, line + "\n", "")


def test_all_normal(rq_http: FakeRQ) -> None:
    rq_http.set_queues(a=queue_txt(prep=1, que=2, run=1, done=10), b=queue_txt())
    expect(check_rq(rq_http), 0, "OK: all queue tests normal")


def test_the_environments_proxies_are_not_used(rq_http: FakeRQ) -> None:
    """A monitoring probe talks to the RQ it names: proxy variables pointing nowhere (and no
    no_proxy exception) change nothing."""
    rq_http.set_queues(a=queue_txt(done=1))
    dead = "http://127.0.0.1:1"
    expect(check_rq(rq_http, http_proxy=dead, HTTP_PROXY=dead, all_proxy=dead, no_proxy=""),
           0, "OK: all queue tests normal")


def test_no_queues_is_ok(rq_http: FakeRQ) -> None:
    rq_http.set_queues()
    expect(check_rq(rq_http), 0, "OK: all queue tests normal")


@pytest.mark.parametrize(("counts", "code", "line"), [
    ({"prep": 5, "que": 4, "run": 0}, 0, "OK: all queue tests normal"),
    ({"prep": 5, "que": 4, "run": 1}, 1, "WARNING: a: backlog 10 >= 10"),
    ({"que": 19}, 1, "WARNING: a: backlog 19 >= 10"),
    ({"prep": 10, "que": 5, "run": 5}, 2, "CRITICAL: a: backlog 20 >= 20"),
    ({"err": 1}, 2, "CRITICAL: a: err 1 > 0"),
    ({"done": 2999}, 0, "OK: all queue tests normal"),
    ({"done": 3000}, 1, "WARNING: a: done 3000 >= 3000"),
    ({"done": 3500}, 2, "CRITICAL: a: done 3500 >= 3500"),
    ({"relayed": 3001}, 1, "WARNING: a: relayed 3001 >= 3000"),
    ({"relayed": 9999}, 2, "CRITICAL: a: relayed 9999 >= 3500"),
])
def test_default_thresholds(rq_http: FakeRQ, counts: dict[str, int], code: int,
                            line: str) -> None:
    rq_http.set_queues(a=queue_txt(**counts))
    expect(check_rq(rq_http), code, line)


@pytest.mark.parametrize("status", ["DOWN", "PAUSE", "SCRIPTERROR", "BACKOFF", "FATAL"])
def test_status_other_than_up_is_critical(rq_http: FakeRQ, status: str) -> None:
    rq_http.set_queues(a=queue_txt(status))
    expect(check_rq(rq_http), 2, f"CRITICAL: a: status {status}")


def test_every_problem_listed_by_queue_name(rq_http: FakeRQ) -> None:
    rq_http.set_queues(zeta=queue_txt("DOWN"), alpha=queue_txt(que=25, err=2, done=3100),
                       mid=queue_txt(relayed=3000))
    expect(check_rq(rq_http), 2,
           "CRITICAL: alpha: backlog 25 >= 20, alpha: err 2 > 0, alpha: done 3100 >= 3000, "
           "mid: relayed 3000 >= 3000, zeta: status DOWN")


def test_only_warnings_give_warning(rq_http: FakeRQ) -> None:
    rq_http.set_queues(a=queue_txt(que=12), b=queue_txt(done=3200))
    expect(check_rq(rq_http), 1, "WARNING: a: backlog 12 >= 10, b: done 3200 >= 3000")


@pytest.mark.parametrize("args", [["-t", "1:2:3:4:5:6"], ["--thresh", "1:2:5:6"],
                                  ["--thresh=1:2:99:99:5:6"], ["-t1:2:5:6"]])
def test_threshold_lists(rq_http: FakeRQ, args: list[str]) -> None:
    rq_http.set_queues(a=queue_txt(que=1, done=5), b=queue_txt(run=2, relayed=6))
    expect(check_rq(rq_http, *args), 2,
           "CRITICAL: a: backlog 1 >= 1, a: done 5 >= 5, b: backlog 2 >= 2, b: relayed 6 >= 6")


def test_dump_prints_every_value_and_exits_0(rq_http: FakeRQ) -> None:
    rq_http.set_queues(a=queue_txt(que=50, err=3), b=queue_txt("DOWN"))
    res = check_rq(rq_http, "--dump")
    assert (res.returncode, res.stderr) == (0, "")
    assert res.stdout.splitlines() == [
        "a status: UP", "a uptime: 1234", "a prep: 0", "a que: 50", "a run: 0", "a done: 0",
        "a err: 3", "a relayed: 0", "b status: DOWN"]


def test_dump_after_a_fetch_failure_exits_2(rq_http: FakeRQ) -> None:
    rq_http.set_queues(a=queue_txt(que=1))
    rq_http.pages["/q.txt"] += "/q/gone.txt\n"
    res = check_rq(rq_http, "-d")
    assert res.returncode == 2
    assert res.stdout.splitlines()[-1] == "CRITICAL: Could not Fetch /q/gone.txt"
    assert "a que: 1" in res.stdout.splitlines()


def test_queue_page_missing_is_could_not_fetch(rq_http: FakeRQ) -> None:
    rq_http.set_queues(a=queue_txt())
    del rq_http.pages["/q/a.txt"]
    expect(check_rq(rq_http), 2, "CRITICAL: Could not Fetch /q/a.txt")


def test_index_missing_is_could_not_fetch(rq_http: FakeRQ) -> None:
    rq_http.set_queues("/therq/", a=queue_txt())
    expect(check_rq(rq_http), 2, "CRITICAL: Could not Fetch /q.txt")


@pytest.mark.parametrize("root", ["/therq", "/therq/", "therq"])
def test_relative_root(rq_http: FakeRQ, root: str) -> None:
    rq_http.set_queues("/therq/", a=queue_txt(err=1))
    expect(check_rq(rq_http, "-r", root), 2, "CRITICAL: a: err 1 > 0")
    expect(check_rq(rq_http, f"--relative-root={root}"), 2, "CRITICAL: a: err 1 > 0")


def test_basic_auth(rq_http: FakeRQ) -> None:
    rq_http.auth = ("mon", "s3:cret")
    rq_http.set_queues(a=queue_txt())
    expect(check_rq(rq_http), 2, "CRITICAL: Could not Fetch /q.txt")
    expect(check_rq(rq_http, "-a", "mon:wrong"), 2, "CRITICAL: Could not Fetch /q.txt")
    expect(check_rq(rq_http, "--auth", "mon:s3:cret"), 0, "OK: all queue tests normal")


def test_server_and_port_from_rq_port(rq_http: FakeRQ) -> None:
    rq_http.set_queues(a=queue_txt())
    res = check_rq(None, "-s", "127.0.0.1", RQ_PORT=str(rq_http.port))
    expect(res, 0, "OK: all queue tests normal")
    res = check_rq(None, "--server=127.0.0.1", f"--port={rq_http.port}", RQ_PORT="1")
    expect(res, 0, "OK: all queue tests normal")


def test_connect_failure() -> None:
    res = check_rq(None, "-s", "127.0.0.1", "-p", str(free_port()))
    expect(res, 2, "CRITICAL: Could not connect")
    res = check_rq(None, "--dump", "-p", str(free_port()))
    expect(res, 2, "CRITICAL: Could not connect")


def test_timeout(rq_http: FakeRQ) -> None:
    rq_http.set_queues(a=queue_txt())
    rq_http.slow.add("/q/a.txt")
    expect(check_rq(rq_http, "-T", "0.3"), 2, "CRITICAL: Timed out")


@pytest.mark.parametrize("args", [
    ["--bogus"], ["-x"], ["stray"], ["-t", "1:2:3"], ["-t", "1:2:3:4:5"], ["-t", "a:b:c:d"],
    ["--thresh=1:-2:3:4"], ["-p", "0"], ["-p", "http"], ["--port=70000"], ["-T", "0"],
    ["-T", "soon"], ["-a", "nocolon"], ["-s"], ["--dump=yes"],
])
def test_bad_options_exit_3(args: list[str]) -> None:
    res = check_rq(None, *args)
    assert res.returncode == 3 and res.stdout == ""
    assert res.stderr.count("\n") == 1 and res.stderr.startswith("check_rq: ")


def test_help() -> None:
    for flag in ("-h", "--help"):
        res = check_rq(None, flag)
        assert res.returncode == 0 and res.stdout.startswith("usage: check_rq")
