"""The shared lifecycle of one queue's messages (S5, S6.1, S6.6, S5.3, S12.2).

Owns what every path through a queue process shares: the lock, the store,
the index of waiting messages, the event log, the table of running jobs, the
admin status (S3.5), and the operations that move a message for all of them:
a scheduler pass that starts due messages (que → run), completing a job or a
lease (run → next state, with its dups and webhooks), failing a message that
never ran, and terminating a job's process group.  The socket commands, the
enqueue path, the leases and cron receive this object and call its verbs.

Must not: spawn jobs, read their pipes or reap them (rq.queue.process), know
the socket protocol (rq.queue.commands) or allocate messages (rq.queue.enqueue).
`self.lock` guards every in-memory structure here and every rename.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

from rq import client, message, proc, protocol
from rq.config import MainConfig, QueueConfig
from rq.errors import Fail, RQError
from rq.events import EventLog
from rq.fsops import FsOps, read_json
from rq.queue import jobs as J
from rq.queue import snapshot
from rq.queue.index import Index, QueItem
from rq.queue.retry import Unfinished
from rq.store import Store

log = logging.getLogger(__name__)
COUNT_REFRESH = 60.0      # S7.3: counts reflect outside removals within 60 s
PASS_RETRY = 5.0          # a failed bucket creation is tried again after this


def minute_buckets(now: float) -> set[str]:
    """The S3.2 buckets of the minutes around `now`: the last one too (a message created just
    before a minute ended) and the next (made ahead)."""
    return {time.strftime("%Y%m%d/%H/%M", time.gmtime(now + d)) for d in (-60, 0, 60)}


class QueueState:
    def __init__(self, main: MainConfig, cfg: QueueConfig, fs: FsOps,
                 wake: Callable[[], None]) -> None:
        self.main = main
        self.cfg = cfg                          # replaced on reload (S3.6), under the lock
        self.name = cfg.name
        self.fs = fs
        self.store = Store(main.root, cfg.name, fs)
        self.events = EventLog(main.root, main.host, cfg.name, fs)
        self.index = Index()
        self.lock = threading.RLock()
        self.wake = wake                        # ask the loop for a pass (S2.6)
        self.loop_thread: int | None = None     # the thread that runs the loop, once it does
        self.jobs: dict[str, J.Job] = {}        # script mode: running jobs by message id
        self.to_spawn: list[J.Job] = []         # moved into run/, spawned by the loop
        self.ending: set[str] = set()           # exited and renamed; the fsync follows (issue 15)
        self.settled = threading.Condition(self.lock)  # notified as messages leave `ending`
        self.unfinished = Unfinished()          # ended, but finishing hit an IO error
        self.buckets_made: set[str] = set()     # hashdir buckets made ahead (D8)
        self.bucket_sync: list[str] = []        # their parents still to fsync
        self.bucket_retry_at = 0.0
        self.buckets_for: tuple[int, tuple[str, ...]] | None = None  # (minute, states) made
        self.buckets_jobs: set[str] = set()     # the job ids whose buckets are made
        self.pass_hooks: list[Callable[[float], None]] = []  # run first in every pass
        self.script_error: str | None = None
        self.retry_soon = False                 # a start failed on IO: pass again soon
        self.stopping = False
        self.started_mono = time.monotonic()
        self.count_refresh = COUNT_REFRESH
        self.next_count_refresh = time.monotonic() + COUNT_REFRESH
        self.checkpoints = snapshot.Checkpoints(self.store)  # for a start after a crash
        self.base_env = J.base_env(main)
        self.script_check = J.ScriptCheck()     # S6.1.1 at each start, redone on a change

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

    def full_id(self, msg_id: str) -> str:
        return protocol.full_id(self.main.base_url, self.name, msg_id)

    # ================================================================ scheduling (S5)
    def schedule(self, now: float | None = None) -> None:
        """One scheduler pass; the caller holds self.lock."""
        now = time.time() if now is None else now
        for hook in self.pass_hooks:  # pull mode (S8): lease deadlines, waiting reserves
            hook(now)
        if self.stopping or self.cfg.mode != "script":
            return
        # The pause/down files are looked at only when there is something to
        # start (issue 15): most passes of a busy queue (a reply, a job's line,
        # a reap with every slot taken) have nothing due, and the two stat()s
        # were a tenth of a job's system calls.  SCRIPTERROR is re-checked on
        # every pass, as before, so a mended script clears it with nothing queued.
        picks = self.due_picks(now) if not self.script_error else None
        if picks == [] or self.admin_status() != "UP":
            return
        if self.script_error:
            if J.check_script(self.main.root, self.cfg.script, self.cfg.exec_prefix)[1]:
                return
            self.script_error = None
            log.info("script usable again; SCRIPTERROR cleared")
        for item in picks if picks is not None else self.due_picks(now):
            if item.msg_id in self.index.que and self.index.dup_of(item.msg_id) is None:
                if not self.start_job(item):
                    return

    def idle(self) -> bool:
        """Nothing a pass could act on here: no message queued, no job, no unfinished
        end, no stop, no SCRIPTERROR to re-check (with the process's own leases, kills:
        QueueProcess.next_timeout).  Every event that can change that wakes the loop by
        itself (a request, a signal, a pipe, a timer), so an idle queue sleeps longer
        between passes (issue 17: the 5 s pass was most of a thousand idle queues' CPU)."""
        return not (self.jobs or self.index.que or self.to_spawn or self.unfinished
                    or self.stopping or self.script_error)

    def next_wake(self, now: float, mono: float) -> float | None:
        """The epoch of this state's next need for a pass: a due message with a
        free slot (within 1 s while due work waits on a flag, a block or
        SCRIPTERROR, S5.1, so `rm NAME.pause` is noticed), a job's deadline or
        kill (S6.7, S6.8)."""
        wakes: list[float] = []
        if len(self.jobs) < self.cfg.num_workers:
            due = self.index.next_wake(now)
            if due is not None:
                wakes.append(due)
            earliest = self.index.earliest_due()
            if earliest is not None and earliest <= now:
                wakes.append(now + 1.0)
        for job in self.jobs.values():
            wakes += [now + (at - mono) for at in (job.deadline, job.kill_at) if at is not None]
        return min(wakes) if wakes else None

    def due_picks(self, now: float) -> list[QueItem]:
        """The due messages to start now: S5.1 order, S5.2 blocking, free slots."""
        slots = (self.cfg.num_workers - len(self.jobs) + len(self.ending)
                 - self.unfinished.not_in(self.jobs))
        if slots <= 0:
            return []
        params = self.cfg.blocking_params
        blocked = {job.block_key(params) for job in self.jobs.values()
                   if job.msg_id not in self.ending} if params else set()
        picks: list[QueItem] = []
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
        return picks

    def check_runnable(self, fields: dict[str, Any]) -> None:
        """Fail when a new message could never start as a job here (its fields
        cannot be a job's environment, S6.2; issue 13, D10): script mode only."""
        if self.cfg.mode == "script":
            problem = J.env_problem(self.base_env, self.main, self.cfg, self.store.qdir, fields)
            if problem:
                raise Fail(problem)

    def prepare_buckets(self, now: float, mono: float) -> None:
        """Make the hashdir buckets (S3.2) a finish will need before it needs
        them, at most a minute early: the last, this and the next minute's
        while the queue has work, and those of the running jobs' ids.  A finish then
        renames into an existing directory, which needs no new inode, so a full
        disk does not stop messages from finishing (issue 13, D8).  Only
        done/, and relayed/ once this queue has relayed messages."""
        if mono < self.bucket_retry_at or not (self.jobs or self.index.que):
            return
        states = ("done", "relayed") if self.index.counts.get("relayed") else ("done",)
        key = (int(now // 60), states)
        new_jobs = [job_id for job_id in self.jobs if job_id not in self.buckets_jobs]
        if key == self.buckets_for and not new_jobs and not self.bucket_sync:
            return  # every pass of a busy queue: the same minute, no job since (issue 15)
        wanted: set[str] = set()
        if key != self.buckets_for:  # a new minute: its buckets, and every job's again
            new_jobs = list(self.jobs)
            wanted = minute_buckets(now)
        wanted |= {message.bucket(job_id) for job_id in new_jobs}
        try:
            self.store.sync_dirs(self.bucket_sync)
            for state in states:
                for bucket in sorted(wanted):
                    path = os.path.join(self.store.state_dir(state), bucket)
                    if path not in self.buckets_made:
                        self.bucket_sync += self.fs.makedirs(path)
                        self.store.sync_dirs(self.bucket_sync)
                        self.buckets_made.add(path)
        except OSError as exc:
            if self.bucket_retry_at == 0.0:
                log.warning("cannot make done/relayed buckets ahead: %s", exc)
            self.bucket_retry_at = mono + PASS_RETRY
            return
        self.bucket_retry_at = 0.0
        self.buckets_for = key
        self.buckets_jobs.intersection_update(self.jobs)  # the ended ones need no more
        self.buckets_jobs.update(new_jobs)
        if len(self.buckets_made) > 256:  # the cleaner may remove old ones: forget them
            keep = tuple(minute_buckets(now) | {message.bucket(job_id) for job_id in self.jobs})
            self.buckets_made = {p for p in self.buckets_made if p.endswith(keep)}

    def start_job(self, item: QueItem) -> bool:
        """S6.1: move `item` into run/ for the loop to spawn; False when the
        script is unusable or the disk refused (the pass stops there)."""
        real, reason, argv = self.script_check.check(self.main.root, self.cfg.script,
                                                     self.cfg.exec_prefix)
        if reason:
            self.script_error = reason
            log.error("SCRIPTERROR: %s", reason)
            self.fail_unstarted(item, f"SCRIPT ERROR - MOVING TO ERR - {reason}")
            return False
        fields = self.take_from_que(item)
        if fields is None:
            return item.msg_id not in self.index.que  # gone to err: go on with the pass
        job = J.Job(item.msg_id, self.store.msg_path("run", item.msg_id), fields)
        job.status = job.status_on_disk = self.store.read_status_text(job.path)
        job.dups = self.index.attach_dups(item.msg_id, fields, self.cfg.coalesce_params)
        job.real, job.argv = real, argv
        self.jobs[item.msg_id] = job
        try:
            self.prepare_job_dir(job)
        except OSError as exc:
            log.error("cannot prepare run/%s/job: %s", item.msg_id, exc)
            self.unspawn(job)
            return False
        self.to_spawn.append(job)
        if threading.get_ident() != self.loop_thread:  # the loop's own pass spawns it next
            self.wake()
        return True

    def take_from_que(self, item: QueItem) -> dict[str, Any] | None:
        """que → run for a job or a lease: the stored fields, or None when the
        msg is unreadable (moved to err) or the disk refused (retry soon)."""
        msg_id = item.msg_id
        try:
            fields = self.store.read_msg(self.store.msg_path("que", msg_id))
        except ValueError as exc:
            self.fail_unstarted(item, f"MSG UNREADABLE - MOVING TO ERR - {exc}")
            return None
        except OSError as exc:
            log.error("cannot read que/%s: %s", msg_id, exc)
            self.retry_soon = True
            return None
        try:  # not fsynced: the message is durable in que/ already (S6.1)
            self.store.move_unsynced(msg_id, "que", "run")
        except OSError as exc:
            log.error("cannot move que/%s to run: %s", msg_id, exc)
            self.retry_soon = True
            return None
        self.index.remove_que(msg_id)
        return fields

    def prepare_job_dir(self, job: J.Job) -> None:
        """Create job/ and job/stdio.log before the reply (S6.1 step 2), so a
        client that follows the log of a message it just saw in run finds it."""
        job_dir = os.path.join(job.path, "job")
        if not os.path.isdir(job_dir):
            if self.store.claim_spare("job", job_dir):
                return  # a job spare holds its empty stdio.log already (rq.spares)
            self.fs.mkdir(job_dir)
        log_path = os.path.join(job_dir, "stdio.log")
        os.close(os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644))

    def unspawn(self, job: J.Job) -> None:
        """A job (or a lease) that could not be started goes back to que, to be retried."""
        self.jobs.pop(job.msg_id, None)
        self.index.release_dups(job.dups)
        self.retry_soon = True
        try:
            self.store.move(job.msg_id, "run", "que", sync=False)
        except OSError:
            log.error("run/%s stays in run until the next start recovers it", job.msg_id)
            return
        self.index.add_que(job.msg_id, job.fields.get("due", 0), job.fields)

    def fail_unstarted(self, item: QueItem, text: str) -> None:
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
        self.events.log(item.msg_id, "que", "err", status=text, count=item.tries)
        fields = read_json(os.path.join(self.store.msg_path("err", item.msg_id), "msg"))
        if isinstance(fields, dict) and fields.get("post_run_webhook"):  # err too (S12.2)
            self.fire_webhooks(item.msg_id, fields, "err")

    def terminate(self, job: J.Job, mono: float) -> None:
        """SIGTERM the job's group now, SIGKILL after kill_grace (S6.7, S6.8)."""
        if not job.pid:  # not spawned yet: the loop terminates it right after
            job.kill_pending = True
            return
        proc.signal_group(job.pid, signal.SIGTERM)
        job.kill_at = mono + self.cfg.kill_grace

    # ================================================================ finishing (S6.6)
    def complete(self, job: J.Job, outcome: J.Outcome) -> None:
        """Move a finished job's (or lease's) message to its next state.
        Retryable: an IO error leaves `job` recording how far it got."""
        self.complete_move(job, outcome)
        self.store.sync_dirs(job.sync_dirs or [])
        self.complete_publish(job, outcome)

    def complete_move(self, job: J.Job, outcome: J.Outcome) -> None:
        """complete() up to the rename (once: `job.sync_dirs` is set then to the
        directories whose fsync makes it durable)."""
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
            _, job.sync_dirs = self.store.move_unsynced(msg_id, "run", state, self.buckets_made)

    def settle(self, msg_ids: list[str]) -> None:
        """Out of `ending` (the group commit of their ends is done or given up): wake the
        readers waiting for them (Commands.find); the caller holds the lock."""
        self.ending.difference_update(msg_ids)
        self.settled.notify_all()

    def wait_settled(self, msg_id: str, timeout: float) -> bool:
        """Wait (the lock released meanwhile) until `msg_id` is out of `ending`; False
        after `timeout` seconds, or at once on the loop's own thread, which settles it."""
        if threading.get_ident() == self.loop_thread:
            return msg_id not in self.ending
        with self.lock:
            return self.settled.wait_for(lambda: msg_id not in self.ending, timeout)

    def complete_publish(self, job: J.Job, outcome: J.Outcome) -> None:
        """complete() after the fsync of `job.sync_dirs`: index or count, event
        (S13: after the transition is on disk), dups and webhooks."""
        msg_id, state = job.msg_id, outcome.state
        finished_dups = job.dups if state in ("done", "relayed") else []
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

    def write_job_status(self, job: J.Job, text: str) -> None:
        try:
            # no status file yet (none read at start, none written): a plain rename
            self.store.write_status(job.path, text, fresh=job.status_on_disk is None)
            job.status_on_disk = text
        except OSError as exc:
            log.warning("status update failed: %s", exc)

    # ================================================================ housekeeping
    def housekeeping(self, mono: float) -> None:
        """The loop's work now and then: the re-count from disk (S7.3), the que/ checkpoint
        a start after a crash reads (S2.7, rq.queue.snapshot)."""
        if mono >= self.next_count_refresh:
            self.refresh_counts()
        if mono >= self.checkpoints.next_at:
            with self.lock:
                self.checkpoints.take(self.index.order, len(self.index.que))

    def next_housekeeping(self) -> float:
        return min(self.next_count_refresh, self.checkpoints.next_at)

    # ================================================================ counts (S7.3)
    def count_finished(self) -> dict[str, int]:
        return {"done": self.store.count_hashed("done"),
                "relayed": self.store.count_hashed("relayed"),
                "err": len(self.store.list_flat("err"))}

    def set_count_refresh(self, seconds: float) -> None:
        """How often refresh_counts runs (test seam RQ_COUNT_REFRESH_SECONDS, read in main)."""
        self.count_refresh = seconds
        self.next_count_refresh = time.monotonic() + seconds

    def refresh_counts(self) -> None:
        """Re-count finished states and re-list prep/ from disk in the background
        (S7.3: within 60 s), so messages the cleaner (S12.3: prep included, issue
        16) or an operator removed stop being counted."""
        self.next_count_refresh = time.monotonic() + self.count_refresh

        with self.lock:
            before = dict(self.index.counts)
            prep_before = set(self.index.prep)

        def work() -> None:
            counts = self.count_finished()
            prep_on_disk = set(self.store.list_flat("prep"))
            with self.lock:
                # Only ids indexed before the listing can be judged by it: one
                # missing from it was removed outside (a commit discards its own).
                self.index.prep -= prep_before - prep_on_disk
                # Completions and deletions while the disk was being counted are
                # kept: apply the in-memory change since `before` to the count.
                now = self.index.counts
                self.index.counts = {k: max(0, counts.get(k, 0) + now.get(k, 0) - before.get(k, 0))
                                     for k in set(counts) | set(now)}
        threading.Thread(target=work, daemon=True).start()

    # ================================================================ the end of a stop (S2.5)
    def close(self) -> None:
        """The end of a graceful stop (S2.5), once nothing moves any more: the event log and
        the spare inodes closed, and the que/ index left for the next start (S2.7)."""
        if self.store.journal is not None:
            self.store.journal.close()  # settled: the next start has nothing to replay
        self.events.close()
        if self.store.spares is not None:
            self.store.spares.close()
        if len(self.index.order) == len(self.index.que):  # dups are entries of both
            snapshot.save(self.store, self.index.order, len(self.index.que))
