"""The rq1 Unix-socket server shared by the manager, queue and timer processes (S7.1).

Owns: binding the socket (stale file unlinked, mode 0660), accepting
connections, reading request frames with a deadline, turning every framing
error into ["fail","bad request"], and writing the replies.  It knows nothing
about commands: a handler callable maps (cmd, raw_arg, conn) to a JSON-able
reply, and an optional batch handler answers several requests of the same
short command at once.

One I/O thread accepts and reads every connection without blocking (a
selector), so a slow or silent client holds no thread.  A complete request is
then either answered by a worker thread (any command: workers may block as long
as the handler needs, e.g. a reserve that waits or a subscription that keeps
the connection; a worker is started whenever none is free, up to SPARE_WORKERS
free ones are kept and surplus ones retire; `prestart_workers` are started with
the server (none in a queue process: each thread is private memory of an idle
queue, its stack, thread state and malloc arena, issue 17), or, for the
commands named in `batch_cmds`, collected: the requests of those commands read
in one pass are answered together by the I/O thread itself through
`batch_handler`.  The queue process uses that for create_message, so
concurrent enqueues share one commit (rq.queue.enqueue) and the request path
runs on one thread: with a thread per request, eight clients made eight
threads hand the GIL to each other at every system call.

A `pumped` server has no I/O thread: its owner's loop watches `fileno()` and
`timeout()` and calls `pump()` and `tick()`, so that work, the batches' answers
included, runs on the loop's thread (a queue process with one worker, issue 15: two
threads that both had work handed the GIL to each other at every system call).

A client may keep its connection for further requests (`keep`, rq/sockread.py).
Replies are written without blocking; what the socket does not take at once is
left to the I/O thread, which writes it as the client reads (issue 13 part 5:
a client that never reads its reply holds no thread).  The bytes so held are
capped (`max_unsent`): over the cap, the connections that stopped reading are
dropped (rq/sockwrite.py owns those replies and says which go first).
"""

from __future__ import annotations

import logging
import math
import os
import queue
import selectors
import socket
import threading
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

from rq import protocol
from rq.errors import Fail, ProtocolError
from rq.sockread import Pending, Reading, Request, advance, expired
from rq.sockwrite import MAX_UNSENT, UnsentReplies, Writing, drain_input

log = logging.getLogger(__name__)

READ_TIMEOUT = 30.0
SPARE_WORKERS = 4
REPLY_GRACE = 2.0  # close() waits this long at most for replies being written
ACCEPT_PER_PASS = 64  # connections taken per wake-up before reading them
ACCEPT_PAUSE = 0.1  # after a failed accept (EMFILE), before trying again


BAD_REQUEST = ["fail", "bad request"]
# a reply for the I/O thread: conn, data, bytes sent, kept, set once taken
Handed = tuple[socket.socket, bytes, int, bool, threading.Event]
Batched = tuple[socket.socket, str, "str | None", bool]  # conn, cmd, arg, kept


class KeepOpen:
    """Returned by a handler that took over the connection (e.g. subscribe)."""


KEEP_OPEN = KeepOpen()
Handler = Callable[[str, "str | None", socket.socket], Any]
# Replies in request order; an item may be an exception, answered as handle() would.
BatchHandler = Callable[[list[tuple[str, "str | None"]]], list[Any]]


def reply_for(outcome: Any, cmd: str) -> Any:
    """The reply for a handler's result or the exception it raised."""
    if isinstance(outcome, ProtocolError):
        return BAD_REQUEST
    if isinstance(outcome, Fail):
        return ["fail", str(outcome)]
    if isinstance(outcome, Exception):  # a bug must not take the daemon down (S2.6)
        log.error("request %s failed", cmd, exc_info=outcome)
        return ["fail", "internal error"]
    return outcome


@dataclass
class _Job:
    """A request for a worker: call the handler, or send a reply already made
    (`reply` set: a refusal, sent and drained).  `kept`: the connection goes back to
    the I/O thread for its next request once the reply is written (rq.sockread)."""
    conn: socket.socket
    cmd: str = ""
    arg: str | None = None
    reply: Any = None
    kept: bool = False


class Rq1Server:
    """Serve `handler` (and `batch_handler` for `batch_cmds`) on a Unix socket at `path`."""

    def __init__(self, path: str, handler: Handler, *, batch_cmds: Collection[str] = (),
                 batch_handler: BatchHandler | None = None, pumped: bool = False,
                 max_unsent: int = MAX_UNSENT, prestart_workers: int = SPARE_WORKERS) -> None:
        self.path = path
        self.pumped = pumped  # no I/O thread: the owner's loop calls pump() and tick()
        self.prestart_workers = prestart_workers  # started with the server; later ones on demand
        self.max_unsent = max_unsent
        self.handler = handler
        self.batch_cmds = frozenset(batch_cmds) if batch_handler is not None else frozenset()
        self.batch_handler = batch_handler
        self._sock: socket.socket | None = None
        self._io: threading.Thread | None = None

    # ------------------------------------------------------------ lifecycle
    def start(self) -> None:
        if os.path.lexists(self.path):
            os.unlink(self.path)  # stale socket from a crashed owner (S2.2)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o117)  # created 0660 (S7.1)
        try:
            sock.bind(self.path)
        finally:
            os.umask(old)
        sock.listen(512)
        sock.setblocking(False)
        self._sock = sock
        self._stopping = False
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._free = 0                      # workers that would take a job at once
        self._busy = 0                      # requests read and not yet answered
        self._busy_cond = threading.Condition(self._lock)
        self._outbox: queue.SimpleQueue[Handed] = queue.SimpleQueue()
        self._io_closed = False             # set (under _lock) once the I/O thread ended
        for _ in range(self.prestart_workers):
            self._add_worker()
        if self.pumped:
            self._io_setup()
            return
        self._io = threading.Thread(target=self._io_loop, name="rq1-io", daemon=True)
        self._io.start()

    def fileno(self) -> int:
        """Pumped: readable when pump() has work (watch it in the owner's selector)."""
        return self._sel.fileno()

    def pump(self, _fd: int = -1) -> None:
        """Pumped: one pass of the I/O thread's work, without waiting."""
        self._io_pass(0.0)

    def timeout(self) -> float:
        """Seconds until tick() has work (pumped: a deadline, an accept pause), or inf."""
        due = self._select_timeout() if self.pumped and not self._io_closed else None
        return math.inf if due is None else due

    def tick(self) -> None:
        """The owner's pass: what is due without the socket's being readable (pumped)."""
        if self.timeout() == 0.0:
            self._io_pass(0.0)

    def close(self, reply_grace: float = REPLY_GRACE) -> None:
        """Stop accepting, then wait (at most `reply_grace` s) for the replies
        being written, so e.g. the "ok" of `shutdown` reaches its client
        before the process exits.  Pumped: on the thread that pumps."""
        deadline = time.monotonic() + reply_grace
        if self.pumped:  # what the I/O thread does when it stops, here
            if self._sock is None or self._io_closed:
                return
            self._stopping = True
            self._stop_reading()
            while self._unsent.writing and time.monotonic() < deadline:
                self._io_pass(min(0.05, max(0.0, deadline - time.monotonic())))
            self._io_end()
            ended = True
        else:
            io, self._io = self._io, None
            if io is None:
                return
            self._stopping = True
            os.write(self._wake_w, b"x")
            io.join(reply_grace)  # it closes the listening socket and unread connections
            ended = not io.is_alive()
        if ended:  # closed here, never while close() may still write to it
            os.close(self._wake_r)
            os.close(self._wake_w)
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        with self._busy_cond:
            while self._busy and time.monotonic() < deadline:
                self._busy_cond.wait(max(0.0, deadline - time.monotonic()))
        for _ in range(SPARE_WORKERS):  # no more wait for a job (_worker retires the rest)
            self._jobs.put(None)  # idle workers exit; busy ones retire after their job

    # ------------------------------------------------------------ the I/O thread
    # Only the I/O thread (or the one that pumps) touches _sel, _reading, _unsent, _batch.
    def _io_setup(self) -> None:
        assert self._sock is not None
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._sock, selectors.EVENT_READ)
        self._sel.register(self._wake_r, selectors.EVENT_READ)
        self._reading: dict[int, Reading] = {}
        self._unsent = UnsentReplies(self._sel, self._done, self.max_unsent, READ_TIMEOUT,
                                     rearm=self._rearm)
        self._batch: list[Batched] = []
        self._accept_paused_until: float | None = None

    def _io_loop(self) -> None:
        self._io_setup()
        try:
            while not self._stopping:
                self._io_pass()
            self._stop_reading()
            while self._unsent.writing:  # replies still being written; close() waits for them
                self._io_pass()
        except Exception:  # a bug here must not leave the socket silently dead
            log.exception("rq1 I/O thread failed")
        finally:
            self._io_end()

    def _io_end(self) -> None:
        with self._lock:
            self._io_closed = True
        self._take_outbox()
        self._unsent.end_all()
        self._stop_reading()
        self._sel.close()

    def _io_pass(self, timeout: float | None = -1.0) -> None:
        """Wait at most `timeout` s (default: until the next deadline), then do what is ready."""
        if timeout is not None and timeout < 0:
            timeout = self._select_timeout()
        for key, _ in self._sel.select(timeout):
            if key.fileobj == self._wake_r:
                self._drain_wake()  # before the outbox: a hand-over after it wakes us again
            self._take_outbox()
            if key.fileobj is self._sock:
                self._accept()
            elif isinstance(key.data, Writing):
                self._unsent.write(key.data)
            elif isinstance(key.data, Reading):
                self._read(key.data)
        self._expire()
        if self._batch:
            batch, self._batch = self._batch, []
            self._answer_batch(batch)

    def _stop_reading(self) -> None:
        """No more requests: the listening socket and unfinished frames are closed."""
        assert self._sock is not None
        for r in self._reading.values():
            self._sel.unregister(r.conn)
            r.conn.close()
        self._reading.clear()
        if self._sock.fileno() >= 0:
            if self._accept_paused_until is None:
                self._sel.unregister(self._sock)
            self._sock.close()

    def _select_timeout(self) -> float | None:
        deadlines = [r.deadline for r in self._reading.values()]
        deadlines += self._unsent.deadlines()
        if self._accept_paused_until is not None:
            deadlines.append(self._accept_paused_until)
        return max(0.0, min(deadlines) - time.monotonic()) if deadlines else None

    def _drain_wake(self) -> None:
        try:
            os.read(self._wake_r, 512)
        except BlockingIOError:
            pass

    def _accept(self) -> None:
        assert self._sock is not None
        deadline = time.monotonic() + READ_TIMEOUT
        for _ in range(ACCEPT_PER_PASS):
            self._take_outbox()  # a worker's start may wait long for the GIL: keep up
            try:
                conn, _ = self._sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                # EMFILE and the like: the connection stays in the backlog and
                # the socket stays readable, so stop watching it for a moment
                # instead of spinning.
                log.warning("accept failed: %s; pausing accepts for %.1f s",
                            exc, ACCEPT_PAUSE)
                self._sel.unregister(self._sock)
                self._accept_paused_until = time.monotonic() + ACCEPT_PAUSE
                return
            conn.setblocking(False)
            r = Reading(conn, deadline)
            # Clients send right after connecting: read at once, and only
            # wait in the selector for what has not arrived yet.
            if not self._read(r, registered=False):
                self._reading[conn.fileno()] = r
                self._sel.register(conn, selectors.EVENT_READ, r)

    def _read(self, r: Reading, *, registered: bool = True) -> bool:
        """Read what has arrived of `r`'s frame (rq.sockread); True once it is routed."""
        request = advance(r)
        return False if isinstance(request, Pending) else self._finish(r, registered, request)

    def _rearm(self, conn: socket.socket) -> None:
        """A kept connection's reply is written: wait for its next request."""
        if self._stopping:
            conn.close()
            return
        r = Reading(conn, time.monotonic() + READ_TIMEOUT, kept=True)
        self._reading[conn.fileno()] = r
        self._sel.register(conn, selectors.EVENT_READ, r)

    def _finish(self, r: Reading, registered: bool, request: Request | None) -> bool:
        """Route a connection whose reading is over: `request` None closes it
        (the client is gone), cmd "" is refused, `keep` is answered here, batch
        commands are collected, the rest go to a worker."""
        if registered:
            self._sel.unregister(r.conn)
            del self._reading[r.conn.fileno()]
        if request is None:
            r.conn.close()
            return True
        cmd, arg = request
        with self._lock:
            self._busy += 1
        if cmd in self.batch_cmds:
            self._batch.append((r.conn, cmd, arg, r.kept))
        elif cmd == "":
            self._dispatch(_Job(r.conn, reply=BAD_REQUEST))
        elif cmd == protocol.KEEP_CMD:
            self._reply(r.conn, protocol.encode_reply(protocol.KEPT), kept=True)
        else:
            self._dispatch(_Job(r.conn, cmd, arg, kept=r.kept))
        return True

    def _expire(self) -> None:
        """Refuse the frames not complete within READ_TIMEOUT; resume accepting."""
        now = time.monotonic()
        for r in [r for r in self._reading.values() if r.deadline <= now]:
            self._finish(r, True, expired(r))
        self._unsent.expire(now)
        if self._accept_paused_until is not None and self._accept_paused_until <= now \
                and not self._stopping:
            self._accept_paused_until = None
            assert self._sock is not None
            self._sel.register(self._sock, selectors.EVENT_READ)

    def _answer_batch(self, batch: list[Batched]) -> None:
        assert self.batch_handler is not None
        try:
            outcomes = self.batch_handler([(cmd, arg) for _, cmd, arg, _ in batch])
            if len(outcomes) != len(batch):
                raise RuntimeError(f"{len(outcomes)} replies for {len(batch)} requests")
        except Exception as exc:
            outcomes = [exc] * len(batch)
        for (conn, cmd, _, kept), outcome in zip(batch, outcomes):
            reply = reply_for(outcome, cmd)
            if reply == BAD_REQUEST:  # the refusal and its drain may block: a worker's job
                self._dispatch(_Job(conn, cmd, reply=reply))
            else:
                self._reply(conn, protocol.encode_reply(reply), kept)

    def _reply(self, conn: socket.socket, data: bytes, kept: bool) -> None:
        """Send a reply from the I/O thread; what the socket does not take now is
        written as the client reads.  Then the connection is closed, or, kept,
        waits for its next request."""
        try:
            sent = conn.send(data)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError:
            conn.close()
            self._done()
            return
        if sent < len(data):
            self._unsent.add(conn, data, sent, kept)
            return
        self._done()
        if kept:
            self._rearm(conn)
        else:
            conn.close()

    # ------------------------------------------------------------ replies the client has not read
    def _hand_over(self, conn: socket.socket, data: bytes, sent: int, kept: bool) -> None:
        """From a worker: the I/O thread writes the rest of `data` (issue 13 part 5).
        The worker waits until the reply is under the cap, so that workers faster
        than the I/O thread cannot pile up replies that no cap counts."""
        taken = threading.Event()
        with self._lock:
            closed = self._io_closed
            if not closed:
                self._outbox.put((conn, data, sent, kept, taken))
                try:
                    os.write(self._wake_w, b"w")
                except BlockingIOError:
                    pass  # the pipe is full of wake-ups already
        if closed:  # _done() takes _lock: not under it
            conn.close()
            self._done()
            return
        taken.wait()

    def _take_outbox(self) -> None:
        """Replies handed over go under the cap before anything else is read."""
        while True:
            try:
                conn, data, sent, kept, taken = self._outbox.get_nowait()
            except queue.Empty:
                return
            if self._io_closed:
                conn.close()
                self._done()
            elif sent == len(data):  # a kept connection's whole reply went: its next request
                self._done()
                self._rearm(conn)
            else:
                self._unsent.add(conn, data, sent, kept)
            taken.set()

    # ------------------------------------------------------------ workers
    def _dispatch(self, job: _Job) -> None:
        """Hand `job` to a free worker, starting one if none is free.  `_free`
        counts the workers waiting for a job minus the jobs not yet taken."""
        with self._lock:
            start = self._free == 0
            if not start:
                self._free -= 1
        if start:
            threading.Thread(target=self._worker, name="rq1-worker", daemon=True).start()
        self._jobs.put(job)

    def _add_worker(self) -> None:
        with self._lock:
            self._free += 1
        threading.Thread(target=self._worker, name="rq1-worker", daemon=True).start()

    def _worker(self) -> None:
        """Serve jobs until told to stop or, with enough free workers, retire."""
        while True:
            job = self._jobs.get()
            if job is None:
                return
            self._serve(job)
            with self._lock:
                if self._free >= SPARE_WORKERS or self._stopping:
                    return
                self._free += 1

    def _serve(self, job: _Job) -> None:
        conn, keep, handed = job.conn, False, False
        try:
            conn.settimeout(READ_TIMEOUT)
            reply = job.reply
            if reply is None:
                reply = self._call(job.cmd, job.arg, conn)
                if reply is KEEP_OPEN:
                    keep = True
                    return
            data = protocol.encode_reply(reply)
            if reply == BAD_REQUEST:
                conn.sendall(data)
                drain_input(conn)
                return
            conn.setblocking(False)  # what the client does not take now: the I/O thread's
            try:
                sent = conn.send(data)
            except (BlockingIOError, InterruptedError):
                sent = 0
            if sent < len(data) or job.kept:
                handed = True
                self._hand_over(conn, data, sent, job.kept)
        except OSError:
            pass  # client went away; nothing to answer
        finally:
            if not keep and not handed:
                conn.close()
            if not handed:
                self._done()

    def _call(self, cmd: str, arg: str | None, conn: socket.socket) -> Any:
        try:
            return self.handler(cmd, arg, conn)
        except Exception as exc:
            return reply_for(exc, cmd)

    def _done(self) -> None:
        with self._busy_cond:
            self._busy -= 1
            self._busy_cond.notify_all()
