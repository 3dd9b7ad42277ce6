"""The queue's side of every job's two pipes (S6.3, S6.4, S6.5).

Owns reading fd 3 (job → queue) and acting on its lines, and writing the
replies to fd 4 (queue → job).  A job's output must never stall the socket or
the other jobs of its queue (issue 13, D3), so:
* each pass reads at most READ_BUDGET bytes from one job, and the lines are
  parsed and applied without the queue's lock (only the loop thread touches a
  running job's pipe state); of a burst of lines only the last status is
  written to disk, and a burst of `resend` lines rewrites the msg once;
* lines are bounded (rq.protocol.LineBuffer: MAX_LINE, longer ones cut with
  a marker), so neither memory nor the status file nor an event follows a
  job that never writes a newline;
* `dup` requests run in order on one helper thread per job, and their replies
  go to fd 4 without blocking: what the pipe cannot take now is kept (up to
  REPLY_BACKLOG bytes) and written by the loop's later passes, so a job that
  never reads fd 4 blocks nobody.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
from collections.abc import Callable

from rq import protocol
from rq.loop import Loop
from rq.queue import jobs as J
from rq.queue.dup import make_dup
from rq.queue.state import QueueState

log = logging.getLogger(__name__)
READ_BUDGET = 256 * 1024        # bytes read from one job per loop pass
READ_AT_EXIT = 4 * 1024 * 1024  # what is already in the pipe when the job exits (S6.4)
REPLY_BACKLOG = 1024 * 1024     # fd 4 bytes kept for a job that does not read them


class Replies:
    """fd 4 of one job: replies in request order, never a blocking write."""

    def __init__(self, fd: int, wake: Callable[[], None]) -> None:
        self.fd = fd
        self.wake = wake
        self._lock = threading.Lock()
        self._pending = bytearray()
        self._work: queue.SimpleQueue[Callable[[], str] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self.dropped = 0

    def submit(self, work: Callable[[], str]) -> None:
        """Run `work` on this job's helper thread after the earlier requests,
        and send the line it returns."""
        self._work.put(work)
        if self._thread is None:
            self._thread = threading.Thread(target=self._serve, daemon=True,
                                            name=f"rq-replies-{self.fd}")
            self._thread.start()

    def _serve(self) -> None:
        while (work := self._work.get()) is not None:
            try:
                line = work()
            except Exception as exc:  # a bug in a dup: the job still gets its one reply
                log.exception("dup failed")
                line = f"fail dup failed - {exc}"
            self.send(line)

    def send(self, line: str) -> None:
        with self._lock:
            if self.fd < 0:
                return
            if len(self._pending) > REPLY_BACKLOG:
                self.dropped += 1  # the job has not read fd 4 for a long while
                return
            self._pending += line.encode() + b"\n"
            self._flush_locked()
            if self._pending:
                self.wake()  # the loop writes the rest when the pipe has room

    def flush(self) -> bool:
        """Write what the pipe takes now; True while something is left."""
        with self._lock:
            self._flush_locked()
            return bool(self._pending)

    def _flush_locked(self) -> None:
        while self._pending and self.fd >= 0:
            try:
                n = os.write(self.fd, self._pending)
            except BlockingIOError:
                return
            except OSError:  # the job is gone or closed fd 4: nobody will read
                self._pending.clear()
                return
            del self._pending[:n]

    def close(self) -> None:
        self._work.put(None)
        with self._lock:
            if self.fd >= 0:
                os.close(self.fd)
                self.fd = -1
            self._pending.clear()
        if self.dropped:
            log.warning("%d repl%s to a job that did not read fd 4 dropped", self.dropped,
                        "y" if self.dropped == 1 else "ies")


class Pipes:
    """Reading and answering every running job of one queue process."""

    def __init__(self, state: QueueState, loop: Loop) -> None:
        self.state = state
        self.loop = loop
        self.by_fd: dict[int, J.Job] = {}   # loop thread only
        self.replies: dict[str, Replies] = {}

    def open(self, job: J.Job) -> None:
        """A job was spawned: its fd 4 becomes non-blocking (never a blocked loop)."""
        os.set_blocking(job.down_w, False)
        self.by_fd[job.up_r] = job
        self.loop.add_reader(job.up_r, self.on_readable)
        self.replies[job.msg_id] = Replies(job.down_w, self.state.wake)

    def on_readable(self, fd: int) -> None:
        job = self.by_fd.get(fd)
        if job is not None:
            self.read(job, READ_BUDGET)

    def read(self, job: J.Job, budget: int) -> bool:
        """Read up to `budget` bytes now and act on the whole lines; close on
        EOF.  True when the pipe had no more to give (empty or closed)."""
        lines: list[bytes] = []
        done = False
        while job.up_r >= 0 and budget > 0:
            try:
                data = os.read(job.up_r, min(65536, budget))
            except BlockingIOError:
                done = True
                break
            except OSError:
                data = b""
            if not data:
                self.handle_lines(job, lines)
                lines = []
                self.close_read(job)
                done = True
                break
            budget -= len(data)
            lines += job.buffer.feed_raw(data)
        self.handle_lines(job, lines)
        return done or job.up_r < 0

    def drain_at_exit(self, job: J.Job) -> None:
        """S6.4: after the exit, what is already in the pipe (bounded, since a
        leftover descendant may go on writing), then the last line."""
        self.read(job, READ_AT_EXIT)
        self.close_read(job)

    def close_read(self, job: J.Job) -> None:
        """Stop reading the job; act on its unterminated last line (S6.4)."""
        if job.up_r < 0:
            return
        self.by_fd.pop(job.up_r, None)
        self.loop.remove_reader(job.up_r)
        os.close(job.up_r)
        job.up_r = -1
        self.handle_lines(job, [line.encode() for line in job.buffer.flush()])

    def handle_lines(self, job: J.Job, lines: list[bytes]) -> None:
        """Act on a burst of raw lines in order (S6.4); write the last status once."""
        resends = 0
        last = len(lines) - 1
        for i, raw in enumerate(lines):
            if i < last and raw.startswith(b"run "):
                continue  # progress only: a later line replaces its status (a flood's bulk)
            line = protocol.decode_line(raw)
            if not line:
                continue  # empty lines are ignored (S6.4)
            parsed = protocol.parse_pipe_line(line)
            job.status = parsed.text
            if parsed.kind in ("done", "err", "relayed"):
                job.completion = parsed.kind
            elif parsed.kind == "resend":
                job.completion = "resend"
                job.resend_secs = parsed.secs
                job.fields["count"] = int(job.fields.get("count", 0)) + 1
                resends += 1
            elif parsed.kind == "dup":
                self.request_dup(job, parsed)
            elif protocol.is_malformed_dup(parsed):
                self.reply(job, lambda: "fail malformed dup request")
        store = self.state.store
        if resends:  # S5.4: count is incremented at once
            try:
                store.write_msg(job.path, job.fields, sync=False)
            except OSError as exc:
                log.warning("status update failed: %s", exc)
        if job.status is not None and job.status != job.status_on_disk:
            self.state.write_job_status(job, job.status)

    def request_dup(self, job: J.Job, parsed: protocol.PipeLine) -> None:
        """S6.5: the copy is made on the job's helper thread (the target may be
        this very queue, whose socket needs the loop free)."""
        main, name, fields, path = self.state.main, self.state.name, dict(job.fields), job.path
        self.reply(job, lambda: make_dup(main, name, fields, path, parsed.due, parsed.newdest))

    def reply(self, job: J.Job, work: Callable[[], str]) -> None:
        replies = self.replies.get(job.msg_id)
        if replies is not None:
            replies.submit(work)

    def flush_replies(self) -> bool:
        """Write pending replies where the pipes have room; True while any is left."""
        return any([replies.flush() for replies in list(self.replies.values())])

    def close(self, job: J.Job) -> None:
        """The job is finished: no more reading, no more replies."""
        self.close_read(job)
        replies = self.replies.pop(job.msg_id, None)
        if replies is not None:
            replies.close()
        job.down_w = -1
