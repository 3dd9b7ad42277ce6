"""A small fault-injecting HTTP forward proxy for the relay tests (SPEC S12.1: "the retry paths
are tested from outside, for example with an HTTP proxy between two RQs that drops or delays
chosen requests or replies").

The sending RQ is started with `HTTP_PROXY` pointing here, so its relay jobs (requests honours
the variable) send every request as `METHOD http://host:port/path HTTP/1.1`; the proxy reads the
whole request, forwards it with http.client (one connection per request, `Connection: close`)
and writes the reply back.  Faults, drawn from a seeded `random.Random`:

* request: dropped (the client's connection is closed, nothing is forwarded) or delayed;
* reply: dropped (the request WAS processed upstream, the reply is thrown away: the case that
  used to create duplicates) or delayed.

`hold(method, path_regex, phase)` stops the first matching request before it is forwarded
("request") or after its reply came back ("reply") until the test calls `release()`, so a test
can kill the relay job at exactly that step.  `stats` counts what happened.
"""

from __future__ import annotations

import http.client
import random
import re
import socket
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

HOP_HEADERS = {"connection", "keep-alive", "proxy-connection", "proxy-authorization",
               "proxy-authenticate", "te", "trailer", "transfer-encoding", "upgrade"}
HOLD_TIMEOUT = 300.0


class Hold:
    """One request the proxy keeps waiting (one-shot)."""

    def __init__(self, method: str, path_re: str, phase: str, nth: int = 1) -> None:
        assert phase in ("request", "reply") and nth >= 1
        self.method, self.path_re, self.phase = method.upper(), re.compile(path_re), phase
        self.skip = nth - 1   # matching requests to let through first
        self.arrived = threading.Event()
        self.released = threading.Event()
        self.forward = True
        self.path = ""

    def matches(self, method: str, path: str, phase: str) -> bool:
        return (phase == self.phase and method == self.method
                and self.path_re.search(path) is not None)

    def wait(self, timeout: float = 60.0) -> str:
        """Wait until the request is held; return its path."""
        if not self.arrived.wait(timeout):
            raise AssertionError(f"no {self.method} {self.path_re.pattern} reached the proxy "
                                 f"within {timeout}s")
        return self.path

    def release(self, forward: bool = True) -> None:
        """Let it go on; with `forward=False` a held request is dropped instead of sent on
        (a held reply is always written, to whoever still listens)."""
        self.forward = forward
        self.released.set()


class FaultProxy:
    def __init__(self, *, seed: int = 0, drop_request: float = 0.0,
                 delay_request: float = 0.0, drop_reply: float = 0.0,
                 delay_reply: float = 0.0, max_delay: float = 0.3) -> None:
        self.rng = random.Random(seed)
        self.rates = {"request": (drop_request, delay_request),
                      "reply": (drop_reply, delay_reply)}
        self.max_delay = max_delay
        self.lock = threading.Lock()
        self.holds: list[Hold] = []
        self.stats: Counter[str] = Counter()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def start(self) -> FaultProxy:
        self.thread.start()
        return self

    def stop(self) -> None:
        for hold in list(self.holds):
            hold.release(forward=False)
        self.server.shutdown()
        self.server.server_close()

    def set_rates(self, **rates: float) -> None:
        """E.g. `set_rates(drop_request=0, delay_request=0)`: change faults while running."""
        with self.lock:
            for key, value in rates.items():
                what, phase = key.split("_")
                drop, delay = self.rates[phase]
                self.rates[phase] = (value, delay) if what == "drop" else (drop, value)

    def hold(self, method: str, path_re: str, phase: str = "request", nth: int = 1) -> Hold:
        """Hold the `nth` request matching `method` and the `path_re` search (in `phase`)."""
        hold = Hold(method, path_re, phase, nth)
        with self.lock:
            self.holds.append(hold)
        return hold

    # ------------------------------------------------------------ decisions
    def fault(self, phase: str) -> tuple[str, float]:
        """("drop" | "delay" | "pass", seconds) for one request or reply."""
        with self.lock:
            drop, delay = self.rates[phase]
            x = self.rng.random()
            seconds = self.rng.uniform(0.01, self.max_delay)
        if x < drop:
            return "drop", 0.0
        if x < drop + delay:
            return "delay", seconds
        return "pass", 0.0

    def take_hold(self, method: str, path: str, phase: str) -> Hold | None:
        with self.lock:
            for hold in self.holds:
                if hold.matches(method, path, phase):
                    if hold.skip:
                        hold.skip -= 1
                        continue
                    self.holds.remove(hold)
                    hold.path = path
                    return hold
        return None

    def count(self, what: str) -> None:
        with self.lock:
            self.stats[what] += 1

    # ------------------------------------------------------------ the handler
    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                proxy.handle(self)

            do_POST = do_HEAD = do_PUT = do_DELETE = do_GET

            def log_message(self, format: str, *args: object) -> None:
                pass

        return Handler

    def handle(self, h: BaseHTTPRequestHandler) -> None:
        h.close_connection = True
        body = read_body(h)
        target = urlsplit(h.path)
        path = target.path + (f"?{target.query}" if target.query else "")
        method = h.command
        self.count("requests")
        hold = self.take_hold(method, target.path, "request")
        if hold is not None:
            hold.arrived.set()
            hold.released.wait(HOLD_TIMEOUT)
            if not hold.forward:
                self.count("held_dropped")
                return
        else:
            fault, seconds = self.fault("request")
            if fault == "drop":
                self.count("request_dropped")
                return
            if fault == "delay":
                self.count("request_delayed")
                threading.Event().wait(seconds)  # the injected delay itself
        try:
            status, reason, headers, data = forward(method, target.hostname or "127.0.0.1",
                                                    target.port or 80, path, h, body)
        except (OSError, http.client.HTTPException):
            self.count("upstream_error")
            return
        self.count("forwarded")
        hold = self.take_hold(method, target.path, "reply")
        if hold is not None:
            hold.arrived.set()
            hold.released.wait(HOLD_TIMEOUT)
        else:
            fault, seconds = self.fault("reply")
            if fault == "drop":
                self.count("reply_dropped")
                return
            if fault == "delay":
                self.count("reply_delayed")
                threading.Event().wait(seconds)
        try:
            h.send_response(status, reason)
            for name, value in headers:
                h.send_header(name, value)
            h.send_header("Content-Length", str(len(data)))
            h.send_header("Connection", "close")
            h.end_headers()
            if method != "HEAD":
                h.wfile.write(data)
            h.wfile.flush()
        except OSError:
            self.count("reply_write_failed")


def read_body(h: BaseHTTPRequestHandler) -> bytes:
    if "chunked" in h.headers.get("Transfer-Encoding", "").lower():
        chunks = []
        while True:
            size = int(h.rfile.readline().split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while h.rfile.readline() not in (b"\r\n", b"\n", b""):
                    pass
                return b"".join(chunks)
            chunks.append(h.rfile.read(size))
            h.rfile.readline()
    length = int(h.headers.get("Content-Length") or 0)
    return h.rfile.read(length) if length else b""


def forward(method: str, host: str, port: int, path: str, h: BaseHTTPRequestHandler,
            body: bytes) -> tuple[int, str, list[tuple[str, str]], bytes]:
    conn = http.client.HTTPConnection(host, port, timeout=120)
    try:
        headers = {k: v for k, v in h.headers.items() if k.lower() not in HOP_HEADERS}
        headers["Connection"] = "close"
        headers["Content-Length"] = str(len(body))
        conn.request(method, path or "/", body=body, headers=headers)
        resp = conn.getresponse()
        data = resp.read()
        kept = [(k, v) for k, v in resp.getheaders()
                if k.lower() not in HOP_HEADERS and k.lower() != "content-length"]
        return resp.status, resp.reason, kept, data
    finally:
        conn.close()


def port_is_closed(port: int) -> bool:
    """True when nothing accepts connections on 127.0.0.1:port."""
    with socket.socket() as s:
        s.settimeout(2)
        return s.connect_ex(("127.0.0.1", port)) != 0
