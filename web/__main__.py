"""The `rq-web` daemon: `python -m rq.web --root ROOT [--lifeline-fd F --ready-fd F]`
(SPEC S2.1, S2.2 step 4, S14.1), a program you can run by hand and that rq-mgr
supervises.

Owns: binding `addr:port` (before `ready` is written, so the manager's start
returns only once the dashboard answers), serving `create_app(root)` with
waitress, built at the first request (LazyApp: Flask and the app cost ~0.3 s CPU, which a
root whose dashboard nobody opens never pays; issue 14 section 4), and the child side of
supervision: `ready` / `fatal ERROR: cannot
listen on <addr>:<port>: <reason>` (exit 2) on the ready pipe, stop on
SIGTERM/SIGINT or on EOF of the lifeline (the manager died, S2.1 fix).
rq.daemon does the program edge: the process title `[rq-web]`, logging to
log/queuemgr.log (role `rq-web`; the access log comes from rq.web.wsgi.AccessLog),
the main config and the `fatal ERROR: ...` lines of the other start-up errors.

Threads: waitress's own select loop runs in a thread of its own and hands each
request to a pool of THREADS + LONG_SLOTS workers; a log or event stream (S17.2,
S8.8) or a long poll (S8.2) holds one of LONG_SLOTS slots (web.limits, 503 when
none is free), so THREADS workers always remain for short requests (S14.1).  The main
thread runs rq.loop.Loop: signal handlers only wake it (STYLE habit 4).
Waitress flushes every chunk an app yields at once (its `send_bytes` is 1),
and answers `Expect: 100-continue` with an interim `100 Continue` as soon as
the headers are parsed, before the body is read; other `Expect` values get 417
from rq.web.wsgi.
"""

from __future__ import annotations

import functools
import ipaddress
import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import Callable
from typing import Any

from waitress.server import BaseWSGIServer

from rq.config import MainConfig
from rq.daemon import Context, DaemonSpec, run_daemon
from rq.errors import StartError
from rq.loop import Loop
from rq.proc import ReadyPipe, lifeline_closed

from .connections import guarded_server
from .limits import LONG_SLOTS

log = logging.getLogger("rq.web")

THREADS = 64               # workers for short requests; streams have LONG_SLOTS more
CONNECTION_LIMIT = 1000    # open connections; above it idle ones are closed (web.connections)
STOP_GRACE = 2.0           # seconds requests in flight get once we stop
UPLOAD_MARGIN = 1 << 20    # multipart framing on top of max_upload_bytes
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def serve(ctx: Context) -> int:
    config = ctx.config
    try:
        sock = listen_socket(config.addr, config.port)
    except OSError as exc:
        raise StartError(f"cannot listen on {config.addr}:{config.port}: "
                         f"{exc.strerror or exc}") from exc
    warn_if_exposed(config)
    app = LazyApp(functools.partial(build_app, ctx.root, config, ctx.args.long_requests))
    try:
        server = make_server(app, config, sock, ctx.args.threads, ctx.args.long_requests)
    except Exception:  # a server we cannot build is a crash: BACKOFF and retry, not FATAL
        log.exception("rq-web cannot build the server")
        sock.close()
        return 1
    web = WebDaemon(server, ctx.lifeline_fd, ctx.ready)
    app.on_broken = web.broke
    return web.run()


SPEC = DaemonSpec(prog="python -m rq.web", logger="rq.web", role="rq-web", title="[rq-web]",
                  serve=serve, options=(("--threads", {"type": int, "default": THREADS}),
                                        ("--long-requests", {"type": int,
                                                             "default": LONG_SLOTS})),
                  fatal_text="ERROR: {reason}", stderr_text="{line}")


def main(argv: list[str] | None = None) -> int:
    return run_daemon(SPEC, argv)


def warn_if_exposed(config: MainConfig) -> None:
    """Logged at every start: a dashboard that can create queues and run their
    scripts, reachable from other machines, with no password (README:
    exposing the dashboard safely)."""
    if config.basic_auth or is_loopback(config.addr):
        return
    log.warning("rq-web listens on %s:%s without basic_auth: anyone who can reach it can "
                "create queues and run commands; set basic_auth and allowed_ips in "
                "config/config.json, or listen on 127.0.0.1 behind a proxy",
                config.addr, config.port)


def is_loopback(addr: str) -> bool:
    if addr == "localhost":
        return True
    try:
        return ipaddress.ip_address(addr.strip("[]")).is_loopback
    except ValueError:
        return False


def listen_socket(addr: str, port: int) -> socket.socket:
    """A bound, listening TCP socket on `addr:port` (raises OSError).

    Bound here rather than by waitress so that the error text is ours and so
    that `ready` is written only once clients can connect."""
    family, kind, proto, _, sockaddr = socket.getaddrinfo(
        addr, port, socket.AF_UNSPEC, socket.SOCK_STREAM, 0, socket.AI_PASSIVE)[0]
    sock = socket.socket(family, kind, proto)
    try:
        # A restart must not wait for TIME_WAIT connections of our predecessor;
        # Linux still refuses the port while anyone else listens on it.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind(sockaddr)
        sock.listen(1024)
    except BaseException:
        sock.close()
        raise
    sock.set_inheritable(False)
    return sock


class LazyApp:
    """The WSGI application, built by the first request that needs it (the others wait for
    it).  A broken application is a crash, as it was when it was built at start: that
    request gets a 500, the failure is logged and `on_broken` tells the daemon to exit 1
    (BACKOFF and retry at the manager, S2.3)."""

    def __init__(self, build: Callable[[], Any]) -> None:
        self.build = build
        self.on_broken: Callable[[], None] = lambda: None
        self.app: Any = None
        self.lock = threading.Lock()

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        app = self.app
        if app is None:
            with self.lock:
                if self.app is None:
                    try:
                        self.app = self.build()
                        log.info("rq-web: application built at the first request")
                    except Exception:
                        log.exception("rq-web cannot build the application")
                        self.on_broken()
                        start_response("500 Internal Server Error",
                                       [("Content-Type", "text/plain; charset=utf-8")])
                        return [b"rq-web cannot build the application\n"]
                app = self.app
        return app(environ, start_response)


def build_app(root: str, config: MainConfig, long_slots: int) -> Any:
    from .app import create_app
    return create_app(root, main=config, overrides={"RQ_LONG_SLOTS": long_slots})


def make_server(app: Any, config: MainConfig, sock: socket.socket,
                threads: int, long_slots: int = LONG_SLOTS) -> BaseWSGIServer:
    """`threads` workers for short requests and `long_slots` more for streams and
    long polls, which never hold more (web.limits, S14.1)."""
    server: Any = guarded_server(
        app, sock, CONNECTION_LIMIT, threads=threads + long_slots,
        # S14.5 reads X-Forwarded-Proto itself: waitress must pass it through.
        clear_untrusted_proxy_headers=False,
        max_request_body_size=config.max_upload_bytes + UPLOAD_MARGIN,
        asyncore_use_poll=True,  # select() stops at fd 1024
        # Keep reading while a request runs, so a stream (S17.2) sees its
        # client leave (environ["waitress.client_disconnected"]) at once.
        channel_request_lookahead=1,
        log_socket_errors=False,  # a browser closing a stream is no error
        ident="rq-web",
    )
    return server


class WebDaemon:
    """The main thread: wait for a stop request while waitress serves."""

    def __init__(self, server: BaseWSGIServer, lifeline_fd: int | None,
                 ready: ReadyPipe) -> None:
        self.server = server
        self.lifeline_fd = lifeline_fd
        self.ready = ready
        # SIGHUP and SIGUSR1 must not kill us (an admin may signal every rq process):
        # nothing to reload, and the WatchedFileHandler reopens a rotated log by itself.
        self.loop = Loop((*STOP_SIGNALS, signal.SIGHUP, signal.SIGUSR1))
        self.stopping = False
        self.server_done = threading.Event()
        self.broken = threading.Event()  # LazyApp could not build the app

    def run(self) -> int:
        if self.lifeline_fd is not None:
            self.loop.add_reader(self.lifeline_fd, self.on_lifeline)
        thread = threading.Thread(target=self.serve, name="rq-web-server", daemon=True)
        thread.start()
        host, port = self.server.effective_host, self.server.effective_port
        log.info("rq-web serving on %s:%s, pid %d", host, port, os.getpid())
        self.ready.send("ready")
        while not self.stopping and not self.server_done.is_set() and not self.broken.is_set():
            for sig in self.loop.wait(None):
                self.handle_signal(sig)
        if self.broken.is_set() and not self.stopping:  # a crash: supervision restarts us
            self.shutdown()
            return 1
        if not self.stopping:  # the server loop ended by itself: let supervision restart us
            log.error("rq-web server loop ended unexpectedly")
            return 1
        self.shutdown()
        log.info("rq-web stopped")
        return 0

    def serve(self) -> None:
        try:
            self.server.run()
        except Exception:
            log.exception("rq-web server loop crashed")
        finally:
            self.server_done.set()
            self.loop.wake()

    def broke(self) -> None:
        """From a worker thread: the app could not be built (LazyApp)."""
        self.broken.set()
        self.loop.wake()

    def handle_signal(self, sig: int) -> None:
        if sig in STOP_SIGNALS:
            log.info("rq-web: %s, stopping", signal.Signals(sig).name)
            self.stopping = True

    def on_lifeline(self, fd: int) -> None:
        if lifeline_closed(fd):  # the manager is gone (S2.1)
            self.loop.remove_reader(fd)
            os.close(fd)
            self.lifeline_fd = None
            log.info("rq-web: manager gone, stopping")
            self.stopping = True

    def shutdown(self) -> None:
        """Stop accepting, give requests in flight STOP_GRACE seconds, then close
        every connection, which ends the streams and long polls still running
        (they check `waitress.client_disconnected`).  Sockets are closed in
        waitress's own thread: its socket map is not thread-safe."""
        from waitress import wasyncore
        listener = self.server
        workers = listener.task_dispatcher
        # dispatcher.close, not server.close: the trigger must stay open, since
        # worker threads still pull it when they finish a response.
        listener.trigger.pull_trigger(lambda: wasyncore.dispatcher.close(listener))
        workers.shutdown(cancel_pending=True, timeout=STOP_GRACE)
        if workers.threads:
            def close_connections() -> None:
                for channel in list(listener.active_channels.values()):
                    channel.handle_close()
            listener.trigger.pull_trigger(close_connections)
            workers.shutdown(cancel_pending=True, timeout=STOP_GRACE)


if __name__ == "__main__":
    sys.exit(main())
