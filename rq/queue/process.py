"""The queue process: one per queue, the only mover of its messages (S0.3.2).

Owns the process: its lifecycle (start-up S2.7 through rq.queue.recovery, the loop S2.6,
graceful stop S2.5, config reload S3.6), and its jobs as OS processes: spawning them (S6.1
steps 3-5), their pipes (S6.4, S6.5, through rq.queue.pipes), reaping them, their deadlines
and kills (S6.7, S6.8), and retrying a finish that hit an IO error.  It wires together
QueueState (lifecycle), Enqueue (creates), EndBatch (ends' fsync), Leases (pull), Cron (S9) and
Commands (the socket's table, S7.3).  Only the entry point imports it.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from typing import Any

from rq import client, proc, protocol
from rq.config import MainConfig, QueueConfig, load_queue_config
from rq.errors import RQError
from rq.fsops import FsOps, unlink_quiet
from rq.loop import Loop
from rq.queue import jobs as J
from rq.queue.commands import INLINE_PASS, Commands
from rq.queue.cron import Cron
from rq.queue.endbatch import EndBatch, sync_moves
from rq.queue.enqueue import Enqueue
from rq.queue.journal import Journal
from rq.queue.leases import Leases
from rq.queue.pipes import Pipes
from rq.queue.recovery import recover
from rq.queue.state import QueueState
from rq.sockserve import Rq1Server
from rq.spares import Spares

log = logging.getLogger(__name__)
PASS_INTERVAL = 5.0       # S2.6: a scheduler pass at least every 5 s
IDLE_PASS_INTERVAL = 60.0  # an idle queue (issue 17; README conformance notes)


class QueueProcess:
    def __init__(self, main: MainConfig, cfg: QueueConfig, fs: FsOps, *,
                 lifeline_fd: int | None = None, ready_fd: int | None = None) -> None:
        self.name = cfg.name
        self.loop = Loop([signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD])
        self.state = QueueState(main, cfg, fs, self.loop.wake)
        self.leases = Leases(self.state)      # pull mode: leases instead of jobs (S8)
        self.state.pass_hooks.append(self.leases.schedule)
        self.enqueue = Enqueue(self.state)
        self.cron = Cron(self.state, self.enqueue.create)  # S9: cron.state.json and firing
        self.stop_requested = threading.Event()
        self.commands = Commands(self.state, self.enqueue, self.leases, self.request_stop)
        self.pipes = Pipes(self.state, self.loop)   # fd 3 and fd 4 of every job (S6.4, S6.5)
        self.replies_pending = False
        self.ends = EndBatch()  # ends renamed, their fsync not yet done (issue 15)
        self.by_pid: dict[int, J.Job] = {}
        self.group_kills: list[tuple[float, int]] = []
        self.stop_kill_at: float | None = None
        self.lifeline_fd, self.ready_fd = lifeline_fd, ready_fd
        for fd in (lifeline_fd, ready_fd):  # passed to us inheritable; jobs get none (S6.3)
            if fd is not None:
                os.set_inheritable(fd, False)
        self.lock_fd, self.idle_sleep = -1, False
        self.server = Rq1Server(  # threads are private pages (issue 17); pumped: see run()
            client.queue_socket(main.root, cfg.name), self.handle_request,
            batch_cmds={"create_message"}, batch_handler=self.handle_creates,
            pumped=cfg.num_workers == 1 or cfg.mode != "script", prestart_workers=0)

    def request_stop(self) -> None:
        """From a socket thread (`shutdown`): the loop begins the graceful stop."""
        self.stop_requested.set()
        self.loop.wake()

    def handle_request(self, cmd: str, arg: str | None, conn: Any) -> Any:
        """Answer one socket request, then ask the loop for a scheduler pass (S2.6)."""
        reply = None
        try:
            reply = self.commands.handle(cmd, arg, conn)
            return reply
        finally:
            if self.idle_sleep or cmd not in INLINE_PASS or not reply or reply[0] != "ok":
                self.loop.wake()

    def handle_creates(self, requests: list[tuple[str, str | None]]) -> list[Any]:
        """Answer the create_message requests read in one pass together (group commit,
        rq.queue.enqueue; pumped: on the loop's thread); wake the loop if a pass is owed."""
        replies = self.commands.create_messages([arg for _, arg in requests])
        if self.idle_sleep or not all(isinstance(r, list) and r and r[0] == "ok" for r in replies):
            self.loop.wake()
        return replies

    # ================================================================ lifecycle
    def run(self) -> int:
        """Start, serve until stopped, clean up: the whole life of the process."""
        self.lock_fd = proc.hold_lock(os.path.join(self.state.store.qdir, ".lock"),
                                      f"queue {self.name} is already running")  # one at a time
        self.write_pid_file()
        recover(self.state, self.leases)
        self.state.store.journal = Journal(self.state.store, self.state.fs)  # issue 15
        if self.state.fs.spares:  # inode creation off the enqueue path (rq.spares)
            self.state.store.spares = Spares(self.state.store.qdir)
            self.state.store.spares.reset()
        self.server.start()
        if self.server.pumped:  # one job at a time: the loop serves the socket (issue 15)
            self.loop.add_reader(self.server.fileno(), self.server.pump)
        if self.lifeline_fd is not None:
            self.loop.add_reader(self.lifeline_fd, self.on_lifeline)
        self.state.loop_thread = threading.get_ident()
        self.signal_ready("ready")
        log.info("queue %s serving (%d queued)", self.name, len(self.state.index.que))
        while not (self.state.stopping and not self.state.jobs and not self.state.unfinished
                   and not self.group_kills):
            self.run_once(self.next_timeout())
        self.server.close()
        self.state.close()  # the que/ index for the next start among what it leaves
        unlink_quiet(os.path.join(self.state.store.qdir, "queue.pid"))
        log.info("queue %s stopped", self.name)
        return 0

    def run_once(self, timeout: float, now: float | None = None) -> None:
        """One pass: wait → signals → pipes → reap → deadlines → schedule → ends' fsync."""
        for sig in self.loop.wait(timeout):
            self.handle_signal(sig)
        self.server.tick()  # pumped: a frame's deadline (S7.1), an accept pause
        self.replies_pending = self.pipes.flush_replies()
        if self.stop_requested.is_set() and not self.state.stopping:
            self.begin_stop()
        self.spawn_pending()
        with self.state.lock:
            if self.state.jobs or not self.idle_sleep:  # after an idle sleep: for jobs only
                self.state.prepare_buckets(time.time(), time.monotonic())
            ended = self.reap()
            self.check_deadlines(time.monotonic())
            self.cron.run_pass(time.time() if now is None else now)  # S9.3, any mode
            self.state.schedule(now)
        if ended:  # the jobs started in their slots first; then the ends' renames and fsync
            started: list[J.Job] = []
            self.spawn_pending(started)
            with self.state.lock:  # a rename refused (no sync_dirs) leaves for a retry (D8)
                moved = [job for job in ended if self.move_ended(job)]
                self.state.settle([job.msg_id for job in ended if job.sync_dirs is None])
            self.ends.add(moved, started, time.monotonic())
        if self.ends:  # ends wait: their fsync now? (the job table needs the lock)
            with self.state.lock:
                due = self.ends.due(time.monotonic(), self.state.jobs, stopping=self.state.stopping,
                                    workers=self.state.cfg.num_workers)
            if due:
                self.commit_ends()
        self.state.housekeeping(time.monotonic())

    def commit_ends(self) -> None:
        """The group commit of the waiting ends (rq.queue.endbatch): the fsync outside the
        lock, as a create's journal flush; then the bookkeeping, pass by pass."""
        segments = self.ends.take()
        error = sync_moves(self.state.store, [job for ended, _ in segments for job in ended])
        with self.state.lock:
            for ended, started in segments:
                self.publish_ended(ended, error)
                for job in started:  # the log never shows more than num_workers running
                    self.log_start(job)

    def next_timeout(self) -> float:
        """Seconds until something is due: the earliest of every owner's next wake."""
        now, mono = time.time(), time.monotonic()
        with self.state.lock:
            wakes = [self.state.next_wake(now, mono), self.leases.next_deadline(),
                     self.cron.wake_at]  # lease expiry (S8.3), next cron slot − 60 s (S9.3)
            self.idle_sleep = self.state.idle() and not (  # a create must wake it
                self.leases.active or self.leases.waiting or self.group_kills)
            cap = IDLE_PASS_INTERVAL if self.idle_sleep else PASS_INTERVAL
            timeout = min([cap] + [max(0.0, at - now) + 0.001 for at in wakes if at is not None])
            for at in [*(at for at, _ in self.group_kills), self.stop_kill_at,
                       self.state.next_housekeeping()]:  # re-count (S7.3), checkpoint
                if at is not None:
                    timeout = min(timeout, max(0.0, at - mono))
            if self.state.stopping and self.group_kills:
                timeout = min(timeout, 0.1)  # a stop ends as soon as those groups are gone
            if self.replies_pending:
                timeout = min(timeout, 0.05)  # a job slow to read fd 4 (S6.5)
            if self.state.to_spawn:
                timeout = 0.0
            timeout = min(timeout, self.server.timeout())
            if self.ends:  # the waiting ends' fsync (rq.queue.endbatch)
                timeout = min(timeout, max(0.0, self.ends.deadline() - mono))
            if self.state.retry_soon:
                self.state.retry_soon = False
                timeout = min(timeout, 0.5)
            retry_at = self.state.unfinished.next_at()  # a stuck finish backs off (D8)
            if retry_at is not None:
                timeout = min(timeout, max(0.0, retry_at - mono))
        return timeout

    def write_pid_file(self) -> None:
        self.state.fs.write_file_atomic(os.path.join(self.state.store.qdir, "queue.pid"),
                                        f"{os.getpid()}\n".encode(), sync=False)

    def signal_ready(self, line: str) -> None:
        proc.ReadyPipe(self.ready_fd).send(line)
        self.ready_fd = None

    # ================================================================ signals and stop
    def handle_signal(self, sig: int) -> None:
        if sig in (signal.SIGTERM, signal.SIGINT):
            self.begin_stop()
        elif sig == signal.SIGHUP:
            self.reload_config()

    def on_lifeline(self, fd: int) -> None:
        if proc.lifeline_closed(fd):  # the manager is gone (S2.1)
            self.loop.remove_reader(fd)
            os.close(fd)
            self.lifeline_fd = None
            log.info("manager gone; stopping")
            self.begin_stop()

    def begin_stop(self) -> None:
        """S2.5: first call starts the graceful stop, a second one escalates."""
        with self.state.lock:
            now = time.monotonic()
            if self.state.stopping:
                self.stop_kill_at = now
                return
            self.state.stopping = True
            self.stop_kill_at = now + self.state.cfg.kill_grace
            for job in self.state.jobs.values():
                if job.exited is None:
                    proc.signal_group(job.pid, signal.SIGTERM)
            log.info("graceful stop: %d running job(s)", len(self.state.jobs))

    def reload_config(self) -> None:
        try:
            cfg, warnings = load_queue_config(self.state.main.root, self.name)
        except RQError as exc:
            log.error("config reload rejected, keeping the previous config: %s", exc)
            return
        for text in warnings:
            log.warning("%s", text)
        with self.state.lock:
            self.state.cfg = cfg  # a SCRIPTERROR stays until the next pass finds the script usable
        log.info("config reloaded")

    def spawn_pending(self, started: list[J.Job] | None = None) -> None:
        """Spawn the jobs that start_job moved into run/ (S6.1 steps 3-5).  The
        loop does it, so a request's reply (which S5.1 sends once the message
        is in run/) never waits for a fork and exec; and it does it outside
        self.state.lock, so the requests in flight do not wait for them either (a
        destroy meanwhile finds no pid yet and sets kill_pending: terminate).
        With `started`, their que → run events are the caller's to log."""
        with self.state.lock:
            pending, self.state.to_spawn = self.state.to_spawn, []
        for job in pending:
            with self.state.lock:
                if job.msg_id not in self.state.jobs:
                    continue
                if self.state.stopping:  # never ran: back to que (S2.5)
                    job.exited, job.exit_wall = (0, False), time.time()
                    self.finish(job)
                    continue
            try:
                self.spawn(job)
            except OSError as exc:
                log.error("cannot start job for %s: %s", job.msg_id, exc)
                with self.state.lock:
                    self.state.unspawn(job)
                continue
            except ValueError as exc:  # a NUL in its environment: it can never start
                log.error("job for %s cannot start: %s", job.msg_id, exc)
                with self.state.lock:
                    self.fail_unspawnable(job, f"JOB CANNOT START - MOVING TO ERR - {exc}")
                continue
            with self.state.lock:
                self.by_pid[job.pid] = job
                self.pipes.open(job)
                if started is not None:
                    started.append(job)
                elif not self.ends.defer_start(job):
                    self.log_start(job)  # else after the ends still waiting for their fsync
                if job.kill_pending:  # destroyed before it was spawned
                    self.state.terminate(job, time.monotonic())

    def log_start(self, job: J.Job) -> None:
        self.state.events.log(job.msg_id, "que", "run", status=job.status,
                              count=job.fields.get("count"), pid=job.pid)

    def fail_unspawnable(self, job: J.Job, text: str) -> None:
        """run → err for a job that no retry could start (S6.6 outcome err)."""
        self.state.events.log(job.msg_id, "que", "run", status=job.status,
                        count=job.fields.get("count"))
        job.exit_wall = time.time()
        job.outcome = J.Outcome("err", text)
        self.finish(job)

    def spawn(self, job: J.Job) -> None:
        q = self.state
        info = J.spawn(job, q.base_env, q.main, q.cfg)
        try:  # the job runs already: a failed write here must not undo the start
            q.store.write_file(os.path.join(job.path, "pid"), f"{job.pid}\n".encode(),
                               fresh=True)  # complete() and recovery remove both (S6.6, S2.7)
            q.store.write_file(os.path.join(job.path, "proc.json"), protocol.dumps(info).encode(),
                               fresh=True)
        except OSError as exc:
            log.error("cannot record pid of job %s: %s", job.msg_id, exc)

    # ================================================================ reaping and deadlines
    def reap(self) -> list[J.Job]:
        """Reap every exited job (S6.6); the ends that run_once moves and fsyncs after
        spawning the jobs started in their slots (`ending`), the others moved here."""
        ended: list[J.Job] = []
        for pid, code, core in proc.reap_any():
            job = self.by_pid.pop(pid, None)
            if job is None:
                continue
            job.exited = (code, core)
            job.exit_wall = time.time()
            self.pipes.drain_at_exit(job)  # what is in the pipe now, no waiting for EOF
            # que/ changes (dups released or finished, itself back: S5.3, S5.4) come before
            # the scheduler's next choice; the others are renamed after the next starts and
            # share one fsync, marked `ending` first (a reader outside the lock never sees
            # final, run, final) and their slots free for the pass
            if not (job.dups or self.decide(job).state == "que"):
                self.state.ending.add(job.msg_id)
                ended.append(job)
            elif self.move_ended(job):
                self.publish_ended([job], sync_moves(self.state.store, [job]))
        return ended

    def check_deadlines(self, mono: float) -> None:
        for job in list(self.state.jobs.values()):
            if job.exited is not None or not job.pid:
                continue
            if job.deadline is not None and mono >= job.deadline and not job.timed_out:
                job.timed_out = True
                log.info("job %s (pid %d) timed out", job.msg_id, job.pid)
                self.state.terminate(job, mono)
            if job.kill_at is not None and mono >= job.kill_at:
                job.kill_at = None
                proc.signal_group(job.pid, signal.SIGKILL)
        stop_due = (self.state.stopping and self.stop_kill_at is not None
                    and mono >= self.stop_kill_at)
        if stop_due:
            for job in self.state.jobs.values():
                proc.signal_group(job.pid, signal.SIGKILL)
            self.stop_kill_at = mono + 1.0
        due_kills = [(at, pgid) for at, pgid in self.group_kills
                     if at <= mono or stop_due or not proc.group_alive(pgid)]
        for entry in due_kills:
            self.group_kills.remove(entry)
            proc.signal_group(entry[1], signal.SIGKILL)
        for job in self.state.unfinished.due(mono):
            self.finish(job)

    # ================================================================ finishing (S6.6)
    def finish(self, job: J.Job) -> None:
        if self.move_ended(job):
            self.publish_ended([job], sync_moves(self.state.store, [job]))

    def decide(self, job: J.Job) -> J.Outcome:  # once: a retry cannot change its mind
        job.outcome = job.outcome or J.decide(job, stopping=self.state.stopping)
        return job.outcome

    def move_ended(self, job: J.Job) -> bool:
        """Rename an ended job's message (QueueState.complete's first half); False on IO error."""
        try:
            self.state.complete_move(job, self.decide(job))
        except OSError as exc:
            self.state.unfinished.failed(job, exc, time.monotonic())
            return False
        return True

    def publish_ended(self, ended: list[J.Job], error: OSError | None) -> None:
        """After sync_moves, under the lock: bookkeeping (then out of `ending`, see
        Commands.find), or a retry if not durable."""
        for job in ended:
            if job.sync_dirs and error is not None:
                self.state.unfinished.failed(job, error, time.monotonic())
            elif job.outcome is not None:
                self.state.complete_publish(job, job.outcome)
                self.forget(job)
        self.state.settle([job.msg_id for job in ended])

    def forget(self, job: J.Job) -> None:
        """A finished job leaves the table and its pipes; its group may be SIGKILLed later."""
        self.state.unfinished.finished(job, time.monotonic())
        self.state.jobs.pop(job.msg_id, None)
        if self.state.stopping and self.stop_kill_at is not None:
            # S2.5 step 4: what remains of the group is SIGKILLed when the grace ends
            if proc.group_alive(job.pid):
                self.group_kills.append((self.stop_kill_at, job.pid))
        elif job.kill_at is not None or job.timed_out:
            self.group_kills.append((time.monotonic() + self.state.cfg.kill_grace, job.pid))
        self.pipes.close(job)

