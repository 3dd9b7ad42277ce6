"""The queue process: one per queue, the only mover of its messages (S0.3.2).

Owns the process lifecycle (start-up recovery S2.7, the loop S2.6, graceful
stop S2.5, config reload S3.6), scheduling (S5), starting jobs and reading
their pipes (S6.1-S6.5), finishing jobs (S6.6-S6.8), and the admin status
(S3.5).  Socket commands (S7.3) live in `commands`; they share `self.lock`,
which guards every in-memory structure and every rename.  fsyncs that only
make a reply durable run outside the lock so concurrent requests share the
filesystem journal's commits (group commit).
"""

from __future__ import annotations

import fcntl
import logging
import os
import signal
import threading
import time
from typing import Any

from rq import client, proc, protocol
from rq.config import MainConfig, QueueConfig, load_queue_config
from rq.errors import RQError
from rq.events import EventLog
from rq.fsops import FsOps, read_json, unlink_quiet
from rq.loop import Loop
from rq.queue import jobs as J
from rq.queue.commands import INLINE_PASS
from rq.queue.cron import Cron
from rq.queue.index import Index
from rq.queue.leases import Leases
from rq.spares import Spares
from rq.sockserve import Rq1Server
from rq.store import Store

log = logging.getLogger(__name__)
PASS_INTERVAL = 5.0       # S2.6: a scheduler pass at least every 5 s
COUNT_REFRESH = 60.0      # S7.3: counts reflect outside removals within 60 s


class QueueProcess:
    def __init__(self, main: MainConfig, cfg: QueueConfig, fs: FsOps, *,
                 lifeline_fd: int | None = None, ready_fd: int | None = None) -> None:
        self.main = main
        self.cfg = cfg
        self.name = cfg.name
        self.fs = fs
        self.store = Store(main.root, cfg.name, fs)
        self.events = EventLog(main.root, main.host, cfg.name, fs)
        self.index = Index()
        self.lock = threading.RLock()
        self.leases = Leases(self)            # pull mode: leases instead of jobs (S8)
        self.single_lock = threading.Lock()
        self.loop = Loop([signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD])
        self.jobs: dict[str, J.Job] = {}
        self.by_pid: dict[int, J.Job] = {}
        self.unfinished: list[J.Job] = []     # exited jobs whose finishing hit an IO error
        self.to_spawn: list[J.Job] = []       # moved into run/, spawned by the loop
        self.group_kills: list[tuple[float, int]] = []
        self.script_error: str | None = None
        self.retry_soon = False                # a start failed on IO: pass again soon
        self.stopping = False
        self.stop_kill_at: float | None = None
        self.stop_requested = threading.Event()
        self.started_mono = time.monotonic()
        self.next_count_refresh = time.monotonic() + COUNT_REFRESH
        self.base_env = J.base_env(main)
        self.lifeline_fd = lifeline_fd
        self.ready_fd = ready_fd
        for fd in (lifeline_fd, ready_fd):  # passed to us inheritable; jobs get none (S6.3)
            if fd is not None:
                os.set_inheritable(fd, False)
        self.lock_fd = -1
        from rq.queue.commands import Commands
        self.commands = Commands(self)
        self.cron = Cron(self)  # S9: cron.state.json and firing
        self.server = Rq1Server(client.queue_socket(main.root, cfg.name), self.handle_request,
                                batch_cmds={"create_message"}, batch_handler=self.handle_creates)

    def handle_request(self, cmd: str, arg: str | None, conn: Any) -> Any:
        """Answer one socket request, then ask the loop for a scheduler pass (S2.6)."""
        reply = None
        try:
            reply = self.commands.handle(cmd, arg, conn)
            return reply
        finally:
            if cmd not in INLINE_PASS or not reply or reply[0] != "ok":
                self.loop.wake()

    def handle_creates(self, requests: list[tuple[str, str | None]]) -> list[Any]:
        """Answer the create_message requests read in one pass together (group
        commit, rq.queue.committer); like handle_request, wake the loop unless
        every reply is an ok whose scheduler pass already ran."""
        replies = self.commands.create_messages([arg for _, arg in requests])
        if not all(isinstance(r, list) and r and r[0] == "ok" for r in replies):
            self.loop.wake()
        return replies

    # ================================================================ lifecycle
    def run(self) -> int:
        """Start, serve until stopped, clean up: the whole life of the process."""
        self.take_lock_file()
        self.write_pid_file()
        self.recover()
        if self.fs.spares:  # inode creation off the enqueue path (rq.spares)
            self.store.spares = Spares(self.store.qdir)
            self.store.spares.reset()
        self.server.start()
        if self.lifeline_fd is not None:
            self.loop.add_reader(self.lifeline_fd, self.on_lifeline)
        self.signal_ready("ready")
        log.info("queue %s serving (%d queued)", self.name, len(self.index.que))
        while not (self.stopping and not self.jobs and not self.unfinished
                   and not self.group_kills):
            self.run_once(self.next_timeout())
        self.server.close()
        self.remove_pid_file()
        self.events.close()
        if self.store.spares is not None:
            self.store.spares.close()
        log.info("queue %s stopped", self.name)
        return 0

    def run_once(self, timeout: float, now: float | None = None) -> None:
        """One pass: wait → signals → register pipes → reap → deadlines → schedule."""
        for sig in self.loop.wait(timeout):
            self.handle_signal(sig)
        if self.stop_requested.is_set() and not self.stopping:
            self.begin_stop()
        self.spawn_pending()
        with self.lock:
            self.reap()
            self.check_deadlines(time.monotonic())
            self.cron.run_pass(time.time() if now is None else now)  # S9.3, any mode
            self.schedule(now)
        if time.monotonic() >= self.next_count_refresh:
            self.refresh_counts()

    def next_timeout(self) -> float:
        now = time.time()
        timeout = PASS_INTERVAL
        with self.lock:
            if len(self.jobs) < self.cfg.num_workers:
                due = self.index.next_wake(now)
                if due is not None:
                    timeout = min(timeout, max(0.0, due - now) + 0.001)
                earliest = self.index.earliest_due()
                if earliest is not None and earliest <= now:
                    # due work waits on a flag, a block or SCRIPTERROR: look
                    # again within 1 s (S5.1), so `rm NAME.pause` is noticed
                    timeout = min(timeout, 1.0)
            mono = time.monotonic()
            for job in self.jobs.values():
                for at in (job.deadline, job.kill_at):
                    if at is not None:
                        timeout = min(timeout, max(0.0, at - mono))
            for at, _ in self.group_kills:
                timeout = min(timeout, max(0.0, at - mono))
            if self.stopping and self.group_kills:
                timeout = min(timeout, 0.1)  # a stop ends as soon as those groups are gone
            if self.cron.wake_at is not None:  # the next cron slot − 60 s (S9.3)
                timeout = min(timeout, max(0.0, self.cron.wake_at - now) + 0.001)
            lease_at = self.leases.next_deadline()  # lease expiry / timeout (S8.3)
            if lease_at is not None:
                timeout = min(timeout, max(0.0, lease_at - now) + 0.001)
            if self.stop_kill_at is not None:
                timeout = min(timeout, max(0.0, self.stop_kill_at - mono))
            if self.to_spawn:
                timeout = 0.0
            if self.unfinished or self.retry_soon:
                self.retry_soon = False
                timeout = min(timeout, 0.5)
        return timeout

    def take_lock_file(self) -> None:
        """An flock that dies with the process: two queue processes for one
        queue can never run at once."""
        path = os.path.join(self.store.qdir, ".lock")
        self.lock_fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(self.lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            raise RQError(f"queue {self.name} is already running") from exc

    def write_pid_file(self) -> None:
        self.fs.write_file_atomic(os.path.join(self.store.qdir, "queue.pid"),
                                  f"{os.getpid()}\n".encode(), sync=False)

    def remove_pid_file(self) -> None:
        try:
            os.unlink(os.path.join(self.store.qdir, "queue.pid"))
        except FileNotFoundError:
            pass

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
        with self.lock:
            now = time.monotonic()
            if self.stopping:
                self.stop_kill_at = now
                return
            self.stopping = True
            self.stop_kill_at = now + self.cfg.kill_grace
            for job in self.jobs.values():
                if job.exited is None:
                    proc.signal_group(job.pid, signal.SIGTERM)
            log.info("graceful stop: %d running job(s)", len(self.jobs))

    def reload_config(self) -> None:
        try:
            cfg, warnings = load_queue_config(self.main.root, self.name)
        except RQError as exc:
            log.error("config reload rejected, keeping the previous config: %s", exc)
            return
        for text in warnings:
            log.warning("%s", text)
        with self.lock:
            self.cfg = cfg  # a SCRIPTERROR stays until the next pass finds the script usable
        log.info("config reloaded")

    # ================================================================ recovery (S2.7)
    def recover(self) -> None:
        now = time.time()
        for msg_id in self.store.list_flat("run"):
            self.recover_running(msg_id)
        for msg_id in self.store.list_flat("que"):
            path = self.store.msg_path("que", msg_id)
            try:
                fields = self.store.read_msg(path)
            except (OSError, ValueError) as exc:
                log.warning("skipping unreadable message que/%s: %s", msg_id, exc)
                continue
            if not isinstance(fields.get("due"), (int, float)) or isinstance(fields["due"], bool):
                fields["due"] = int(now)
                self.store.write_msg(path, fields)
            try:
                self.index.add_que(msg_id, fields["due"], fields)
            except (TypeError, ValueError, OverflowError):
                log.warning("skipping message que/%s: unusable due %r", msg_id, fields["due"])
        self.index.prep = set(self.store.list_flat("prep"))
        self.index.counts = self.count_finished()

    def recover_running(self, msg_id: str) -> None:
        path = self.store.msg_path("run", msg_id)
        if self.leases.recover(msg_id, path, time.time()):
            return  # an unexpired pull lease stays in run/ (S2.7, S8.3)
        info = read_json(os.path.join(path, "proc.json"))
        pid = info.get("pid") if isinstance(info, dict) else None
        if isinstance(pid, int) and proc.alive_with_start(pid, info.get("start_time")):
            log.warning("run/%s: job pid %d survived; stopping it", msg_id, pid)
            _stop_group_now(pid, self.cfg.kill_grace)
        for leftover in ("pid", "proc.json"):
            unlink_quiet(os.path.join(path, leftover))
        text = "QUEUE RESTARTED - MOVING TO QUE"
        try:
            self.store.write_status(path, text)
            self.store.move(msg_id, "run", "que")
        except OSError as exc:
            log.error("cannot recover run/%s: %s", msg_id, exc)
            return
        fields = read_json(os.path.join(self.store.msg_path("que", msg_id), "msg")) or {}
        started = info.get("started") if isinstance(info, dict) else None
        duration = (max(0.0, time.time() - started)
                    if isinstance(started, (int, float)) and not isinstance(started, bool)
                    else None)
        self.events.log(msg_id, "run", "que", status=text, count=fields.get("count"),
                        pid=pid if isinstance(pid, int) else None,   # S13.3: out of run
                        duration=duration)

    def count_finished(self) -> dict[str, int]:
        return {"done": self.store.count_hashed("done"),
                "relayed": self.store.count_hashed("relayed"),
                "err": len(self.store.list_flat("err"))}

    def refresh_counts(self) -> None:
        """Re-count finished states from disk in the background (S7.3: within 60 s)."""
        self.next_count_refresh = time.monotonic() + COUNT_REFRESH

        with self.lock:
            before = dict(self.index.counts)

        def work() -> None:
            counts = self.count_finished()
            with self.lock:
                # Completions and deletions while the disk was being counted are
                # kept: apply the in-memory change since `before` to the count.
                now = self.index.counts
                self.index.counts = {k: max(0, counts.get(k, 0) + now.get(k, 0) - before.get(k, 0))
                                     for k in set(counts) | set(now)}
        threading.Thread(target=work, daemon=True).start()

    # ================================================================ status (S3.5)
    def admin_status(self) -> str:
        cdir = os.path.join(self.main.root, "config")
        if os.path.exists(os.path.join(cdir, f"{self.name}.down")):
            return "DOWN"
        if os.path.exists(os.path.join(cdir, f"{self.name}.pause")):
            return "PAUSE"
        return "UP"

    def status(self) -> str:
        return "SCRIPTERROR" if self.script_error else self.admin_status()

    # ================================================================ scheduling (S5)
    def schedule(self, now: float | None = None) -> None:
        """One scheduler pass; the caller holds self.lock."""
        now = time.time() if now is None else now
        self.leases.schedule(now)  # pull mode (S8): lease deadlines, wake waiting reserves
        if self.stopping or self.cfg.mode != "script" or self.admin_status() != "UP":
            return
        if self.script_error:
            if J.check_script(self.main.root, self.cfg.script, self.cfg.exec_prefix)[1]:
                return
            self.script_error = None
            log.info("script usable again; SCRIPTERROR cleared")
        slots = self.cfg.num_workers - len(self.jobs) - len(self.unfinished)
        if slots <= 0:
            return
        params = self.cfg.blocking_params
        blocked = {job.block_key(params) for job in self.jobs.values()} if params else set()
        picks = []
        for item in self.index.candidates():
            key = item.key(params) if params else ()
            if params and key in blocked:
                continue
            if item.due > now:
                break
            picks.append(item)
            blocked.add(key)
            if len(picks) >= slots:
                break
        for item in picks:
            if item.dup_of is None and item.msg_id in self.index.que:
                if not self.start_job(item):
                    return

    def start_job(self, item: Any) -> bool:
        """S6.1: start one job for `item`; False when the script is unusable."""
        real, reason = J.check_script(self.main.root, self.cfg.script, self.cfg.exec_prefix)
        if reason:
            self.script_error = reason
            log.error("SCRIPTERROR: %s", reason)
            self.fail_unstarted(item, f"SCRIPT ERROR - MOVING TO ERR - {reason}")
            return False
        msg_id = item.msg_id
        try:
            fields = self.store.read_msg(self.store.msg_path("que", msg_id))
        except ValueError as exc:
            self.fail_unstarted(item, f"MSG UNREADABLE - MOVING TO ERR - {exc}")
            return True
        except OSError as exc:
            log.error("cannot read que/%s: %s", msg_id, exc)
            self.retry_soon = True
            return False
        try:
            path = self.store.move(msg_id, "que", "run", sync=False)
        except OSError as exc:
            log.error("cannot move que/%s to run: %s", msg_id, exc)
            self.retry_soon = True
            return False
        self.index.remove_que(msg_id)
        job = J.Job(msg_id, path, fields)
        job.status = job.status_on_disk = self.store.read_status_text(path)
        job.dups = self.index.attach_dups(msg_id, fields, self.cfg.coalesce_params)
        job.real = real
        self.jobs[msg_id] = job
        try:
            self.prepare_job_dir(job)
        except OSError as exc:
            log.error("cannot prepare run/%s/job: %s", msg_id, exc)
            self.unspawn(job)
            return False
        self.to_spawn.append(job)
        self.loop.wake()
        return True

    def prepare_job_dir(self, job: J.Job) -> None:
        """Create job/ and job/stdio.log before the reply (S6.1 step 2), so a
        client that follows the log of a message it just saw in run finds it."""
        job_dir = os.path.join(job.path, "job")
        if not os.path.isdir(job_dir) and not self.store.claim_spare("job", job_dir):
            self.fs.mkdir(job_dir)
        log_path = os.path.join(job_dir, "stdio.log")
        os.close(os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644))

    def spawn_pending(self) -> None:
        """Spawn the jobs that start_job moved into run/ (S6.1 steps 3-5).  The
        loop does it, so a request's reply (which S5.1 sends once the message
        is in run/) never waits for a fork and exec; and it does it outside
        self.lock, so the requests in flight do not wait for them either (a
        destroy meanwhile finds no pid yet and sets kill_pending: terminate)."""
        with self.lock:
            pending, self.to_spawn = self.to_spawn, []
        for job in pending:
            with self.lock:
                if job.msg_id not in self.jobs:
                    continue
                if self.stopping:  # never ran: back to que (S2.5)
                    job.exited, job.exit_wall = (0, False), time.time()
                    self.finish(job)
                    continue
            try:
                self.spawn(job, job.real)
            except OSError as exc:
                log.error("cannot start job for %s: %s", job.msg_id, exc)
                with self.lock:
                    self.unspawn(job)
                continue
            except ValueError as exc:  # a NUL in its environment: it can never start
                log.error("job for %s cannot start: %s", job.msg_id, exc)
                with self.lock:
                    self.fail_unspawnable(job, f"JOB CANNOT START - MOVING TO ERR - {exc}")
                continue
            with self.lock:
                self.by_pid[job.pid] = job
                self.loop.add_reader(job.up_r, self.on_pipe)
                self.events.log(job.msg_id, "que", "run", status=job.status,
                                count=job.fields.get("count"), pid=job.pid)
                if job.kill_pending:  # destroyed before it was spawned
                    self.terminate(job, time.monotonic())

    def fail_unspawnable(self, job: J.Job, text: str) -> None:
        """run → err for a job that no retry could start (S6.6 outcome err)."""
        self.events.log(job.msg_id, "que", "run", status=job.status,
                        count=job.fields.get("count"))
        job.exit_wall = time.time()
        job.outcome = J.Outcome("err", text)
        self.finish(job)

    def unspawn(self, job: J.Job) -> None:
        """A job that could not be spawned goes back to que, to be retried."""
        self.jobs.pop(job.msg_id, None)
        self.index.release_dups(job.dups)
        self.retry_soon = True
        try:
            self.store.move(job.msg_id, "run", "que", sync=False)
        except OSError:
            log.error("run/%s stays in run until the next start recovers it", job.msg_id)
            return
        self.index.add_que(job.msg_id, job.fields.get("due", 0), job.fields)

    def spawn(self, job: J.Job, real: str) -> None:
        job_dir = os.path.join(job.path, "job")
        env = J.job_env(self.base_env, self.main, self.cfg, real, job.fields, job.msg_id, job_dir)
        cmd = J.job_command(self.cfg.exec_prefix, real)
        up_w, up_r, down_w, down_r = proc.job_pipes()
        try:
            job.pid, started = proc.spawn_job(
                cmd, cwd=job_dir, env=env, stdio_log=os.path.join(job_dir, "stdio.log"),
                header=J.header_text(real), write_fd=up_w, read_fd=down_r)
        except BaseException:
            for fd in (up_w, up_r, down_w, down_r):
                os.close(fd)
            raise
        os.close(up_w)
        os.close(down_r)
        os.set_blocking(up_r, False)
        job.up_r, job.down_w = up_r, down_w
        job.started_mono, job.started_wall = time.monotonic(), time.time()
        if self.cfg.timeout:
            job.deadline = job.started_mono + self.cfg.timeout
            job.timeout_text = (f"JOB TIMED OUT AFTER {J.format_seconds(self.cfg.timeout)} "
                                "SECONDS - MOVING TO ERR")
        if started is None:
            started = proc.start_time(job.pid)
        info = {"pid": job.pid, "pgid": job.pid, "start_time": started,
                "started": round(job.started_wall, 3)}
        try:  # the job runs already: a failed write here must not undo the start
            self.store.write_file(os.path.join(job.path, "pid"), f"{job.pid}\n".encode())
            self.store.write_file(os.path.join(job.path, "proc.json"),
                                  protocol.dumps(info).encode())
        except OSError as exc:
            log.error("cannot record pid of job %s: %s", job.msg_id, exc)

    def fail_unstarted(self, item: Any, text: str) -> None:
        """que → err for a message that never ran (S6.1.1)."""
        path = self.store.msg_path("que", item.msg_id)
        try:
            self.store.write_status(path, text)
            self.store.move(item.msg_id, "que", "err")
        except OSError as exc:
            log.error("cannot move que/%s to err: %s", item.msg_id, exc)
            return
        self.index.remove_que(item.msg_id)
        self.index.counts["err"] += 1
        self.events.log(item.msg_id, "que", "err", status=text, count=item.count)
        fields = read_json(os.path.join(self.store.msg_path("err", item.msg_id), "msg"))
        if isinstance(fields, dict) and fields.get("post_run_webhook"):  # err too (S12.2)
            self.fire_webhooks(item.msg_id, fields, "err")

    # ================================================================ pipes (S6.4)
    def on_pipe(self, fd: int) -> None:
        with self.lock:
            job = next((j for j in self.jobs.values() if j.up_r == fd), None)
            if job is None:
                self.loop.remove_reader(fd)
                return
            self.read_pipe(job)

    def read_pipe(self, job: J.Job) -> None:
        """Read what is in the pipe now; process whole lines; close on EOF."""
        while job.up_r >= 0:
            try:
                data = os.read(job.up_r, 65536)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not data:
                self.close_pipe(job)
                return
            for line in job.buffer.feed(data):
                self.handle_line(job, line)

    def close_pipe(self, job: J.Job) -> None:
        if job.up_r >= 0:
            self.loop.remove_reader(job.up_r)
            os.close(job.up_r)
            job.up_r = -1
        for line in job.buffer.flush():
            self.handle_line(job, line)

    def handle_line(self, job: J.Job, line: str) -> None:
        parsed = protocol.parse_pipe_line(line)
        job.status = parsed.text
        if parsed.kind in ("done", "err", "relayed"):
            job.completion = parsed.kind
        elif parsed.kind == "resend":
            job.completion = "resend"
            job.resend_secs = parsed.secs
            job.fields["count"] = int(job.fields.get("count", 0)) + 1
            self.try_io(lambda: self.store.write_msg(job.path, job.fields, sync=False))
        elif parsed.kind == "dup":
            self.start_dup(job, parsed)
        elif protocol.is_malformed_dup(parsed):
            self.reply_to_job(job, "fail malformed dup request")
        self.write_job_status(job, parsed.text)

    def start_dup(self, job: J.Job, parsed: protocol.PipeLine) -> None:
        from rq.queue.dup import make_dup
        fields = dict(job.fields)
        path = job.path

        def work() -> None:
            reply = make_dup(self.main, self.name, fields, path, parsed.due, parsed.newdest)
            with self.lock:
                self.reply_to_job(job, reply)
        threading.Thread(target=work, daemon=True).start()

    def reply_to_job(self, job: J.Job, text: str) -> None:
        if job.down_w < 0:
            return
        try:
            os.write(job.down_w, (text + "\n").encode())
        except OSError:
            pass  # the job is gone or stopped reading

    # ================================================================ reaping and deadlines
    def reap(self) -> None:
        for pid, code, core in proc.reap_any():
            job = self.by_pid.pop(pid, None)
            if job is None:
                continue
            job.exited = (code, core)
            job.exit_wall = time.time()
            self.read_pipe(job)        # what is already in the pipe, no waiting for EOF
            self.close_pipe(job)
            self.finish(job)

    def check_deadlines(self, mono: float) -> None:
        for job in list(self.jobs.values()):
            if job.exited is not None or not job.pid:
                continue
            if job.deadline is not None and mono >= job.deadline and not job.timed_out:
                job.timed_out = True
                log.info("job %s (pid %d) timed out", job.msg_id, job.pid)
                self.terminate(job, mono)
            if job.kill_at is not None and mono >= job.kill_at:
                job.kill_at = None
                proc.signal_group(job.pid, signal.SIGKILL)
        stop_due = self.stopping and self.stop_kill_at is not None and mono >= self.stop_kill_at
        if stop_due:
            for job in self.jobs.values():
                proc.signal_group(job.pid, signal.SIGKILL)
            self.stop_kill_at = mono + 1.0
        due_kills = [(at, pgid) for at, pgid in self.group_kills
                     if at <= mono or stop_due or not proc.group_alive(pgid)]
        for entry in due_kills:
            self.group_kills.remove(entry)
            proc.signal_group(entry[1], signal.SIGKILL)
        for job in list(self.unfinished):
            self.unfinished.remove(job)
            self.finish(job)

    def terminate(self, job: J.Job, mono: float) -> None:
        """SIGTERM the job's group now, SIGKILL after kill_grace (S6.7, S6.8)."""
        if not job.pid:  # not spawned yet: the loop terminates it right after
            job.kill_pending = True
            return
        proc.signal_group(job.pid, signal.SIGTERM)
        job.kill_at = mono + self.cfg.kill_grace

    # ================================================================ finishing (S6.6)
    def finish(self, job: J.Job) -> None:
        if job.outcome is None:  # decided once, so a retry cannot change its mind
            job.outcome = J.decide(job, stopping=self.stopping)
        outcome = job.outcome
        try:
            self.complete(job, outcome)
        except OSError as exc:
            log.error("cannot finish %s (%s); will retry", job.msg_id, exc)
            if job not in self.unfinished:
                self.unfinished.append(job)
            return
        self.jobs.pop(job.msg_id, None)
        if self.stopping and self.stop_kill_at is not None:
            # S2.5 step 4: what remains of the group is SIGKILLed when the grace ends
            if proc.group_alive(job.pid):
                self.group_kills.append((self.stop_kill_at, job.pid))
        elif job.kill_at is not None or job.timed_out:
            self.group_kills.append((time.monotonic() + self.cfg.kill_grace, job.pid))
        if job.down_w >= 0:
            os.close(job.down_w)
            job.down_w = -1

    def complete(self, job: J.Job, outcome: J.Outcome) -> None:
        """Move a finished job's message to its next state.  Retryable: an IO
        error leaves `job` recording how far it got (moved, dirs to fsync)."""
        msg_id, path, state = job.msg_id, job.path, outcome.state
        finished_dups = job.dups if state in ("done", "relayed") else []
        if job.sync_dirs is None:
            for leftover in ("pid", "proc.json"):
                self.store.discard_file(os.path.join(path, leftover))
            if outcome.status is not None and outcome.status != job.status_on_disk:
                self.store.write_status(path, outcome.status)
            if state == "que":
                job.fields["due"] = round(job.exit_wall + (outcome.due_delay or 0), 3)
            if finished_dups:
                job.fields["dups"] = [self.full_id(d) for d in finished_dups]
            if state == "que" or finished_dups:
                self.store.write_msg(path, job.fields, sync=False)
            _, job.sync_dirs = self.store.move_unsynced(msg_id, "run", state)
        self.store.sync_dirs(job.sync_dirs)
        if state == "que":
            self.index.add_que(msg_id, job.fields["due"], job.fields)
        else:
            self.index.counts[state] += 1
        code = job.exited[0] if job.exited else None
        self.events.log(msg_id, "run", state, status=outcome.status, count=job.fields.get("count"),
                        pid=job.pid or None, exit_code=code if job.pid else None,
                        duration=max(0.0, job.exit_wall - job.started_wall)
                        if job.started_wall else None,
                        extra=getattr(job, "event_extra", None))  # pull: "consumer" (S13.3)
        self.finish_dups(job, state, finished_dups)
        if state != "que" and job.fields.get("post_run_webhook"):
            self.fire_webhooks(msg_id, job.fields, state)

    def finish_dups(self, job: J.Job, state: str, finished: list[str]) -> None:
        """S5.3: dups follow a done/relayed parent, else they are released."""
        if not finished:
            self.index.release_dups(job.dups)
            return
        text = f"duplicate {self.full_id(job.msg_id)}"
        for dup_id in finished:
            item = self.index.remove_que(dup_id)
            if item is None:
                continue
            path = self.store.msg_path("que", dup_id)
            fields: dict[str, Any] = {}
            try:
                fields = self.store.read_msg(path)
                fields["dup"] = self.full_id(job.msg_id)
                self.store.write_msg(path, fields, sync=False)
                self.store.write_status(path, text)
                self.store.move(dup_id, "que", state)
            except (OSError, ValueError) as exc:
                log.error("cannot finish dup %s: %s", dup_id, exc)
                self.index.add_que(dup_id, item.due, fields or {"dest": item.dest})
                continue
            self.index.counts[state] += 1
            self.events.log(dup_id, "que", state, status=text, count=fields.get("count"))
            if fields.get("post_run_webhook"):  # a dup ends done/relayed too (S12.2)
                self.fire_webhooks(dup_id, fields, state)

    def fire_webhooks(self, msg_id: str, fields: dict[str, Any], state: str) -> None:
        """S12.2 trigger: one `webhook` message per URL, sent from a thread."""
        payload = {k: v for k, v in fields.items()}
        payload["msg_id"] = self.full_id(msg_id)
        payload["state"] = state
        text = protocol.dumps(payload)
        urls = list(fields.get("post_run_webhook") or [])
        root = self.main.root

        def work() -> None:
            for url in urls:
                try:
                    reply = client.call_queue(root, "webhook", "create_message",
                                              {"dest": "webhook", "param1": url, "param2": text})
                except RQError as exc:
                    reply = ["fail", str(exc)]
                if not (isinstance(reply, list) and reply and reply[0] == "ok"):
                    log.warning("webhook for %s to %s dropped: %s", msg_id, url, reply)
        threading.Thread(target=work, daemon=True).start()

    # ================================================================ helpers
    def full_id(self, msg_id: str) -> str:
        return protocol.full_id(self.main.base_url, self.name, msg_id)

    def write_job_status(self, job: J.Job, text: str) -> None:
        try:
            self.store.write_status(job.path, text)
            job.status_on_disk = text
        except OSError as exc:
            log.warning("status update failed: %s", exc)

    def try_io(self, fn: Any) -> None:
        try:
            fn()
        except OSError as exc:
            log.warning("status update failed: %s", exc)


def _stop_group_now(pgid: int, grace: float) -> None:
    """SIGTERM a survivor's group, wait up to `grace`, then SIGKILL (S2.7)."""
    proc.signal_group(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while proc.group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.signal_group(pgid, signal.SIGKILL)
