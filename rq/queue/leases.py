"""Pull-consumer leases inside a queue process (SPEC S8.2, S8.3, S2.5 step 5, S2.7).

Owns, for one queue in `pull` mode: the leases held on its `run/` messages
(in memory and as `run/ID/lease.json`), granting a lease on the next eligible
message (S5.1 order, blocking, coalescing), the long-poll wait for one,
reports of pipe-protocol lines, renewals, and the ends of a lease: a
completion, expiry, timeout or destroy.  A lease's completion goes through
the same finishing path as a job's (`QueueState.complete`: dups, webhooks,
the event with `pid`/`exit_code` null plus `"consumer"`).

Every method that touches state takes the state's lock; `cond` shares that lock, so
a waiting reservation sleeps without holding it and the scheduler pass that
sees a new candidate wakes it (S8.2 `wait`).  The pure parts (the lease
record and its validation) are the module-level functions.
"""

from __future__ import annotations

import hmac
import logging
import os
import secrets
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from rq import protocol
from rq.errors import Fail
from rq.fsops import read_json, unlink_quiet
from rq.queue import jobs as J
from rq.queue.dup import make_dup
from rq.queue.index import QueItem
from rq.queue.state import QueueState

log = logging.getLogger(__name__)

LEASE_FILE = "lease.json"
MAX_LEASE = 86400
EXPIRED_TOKENS_KEPT = 4096      # so a late report hears "lease expired", not "lease not held"
STRIPPED_ENV = ("RQ_WRITE", "RQ_READ", "RQ_PIPE", "RQ_MSG_DIR")  # S8.2: not for consumers


# ------------------------------------------------------------------ pure parts

def new_token() -> str:
    """A fresh lease token: 128 random bits, hex (S8.2)."""
    return secrets.token_hex(16)


def lease_record(token: str, consumer: str, length: float, expires: float,
                 reserved: float) -> dict[str, Any]:
    """The content of `lease.json`."""
    return {"token": token, "consumer": consumer, "lease": length,
            "expires": round(expires, 3), "reserved": round(reserved, 3)}


def parse_lease_record(data: Any) -> dict[str, Any] | None:
    """A `lease.json` object that has every field with a usable type, else None."""
    if not isinstance(data, dict):
        return None
    token, consumer = data.get("token"), data.get("consumer")
    numbers = [data.get(k) for k in ("lease", "expires", "reserved")]
    if not isinstance(token, str) or not token or not isinstance(consumer, str):
        return None
    if not all(isinstance(n, (int, float)) and not isinstance(n, bool) for n in numbers):
        return None
    return data


def lease_length(value: Any, default: int) -> float:
    """The `lease` of a request (S8.2: 1..86400 s, default the queue's
    `lease_timeout`); raises Fail("invalid lease")."""
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not 1 <= value <= MAX_LEASE:
        raise Fail("invalid lease")
    return value


def consumer_env(env: dict[str, str]) -> dict[str, str]:
    """The S6.2 RQ_* variables a consumer gets (S8.2), without the job-only ones."""
    return {k: v for k, v in env.items() if k.startswith("RQ_") and k not in STRIPPED_ENV}


def reserved_line(consumer: str, now: float | None = None) -> str:
    """The `job/stdio.log` line of a grant (S8.2; time as in S6.3)."""
    stamp = time.strftime("%Y-%m-%d %H:%M:%S %z", time.localtime(now))
    return f"\n{stamp} - RQ RESERVED BY {consumer}\n"


@dataclass
class LeaseJob(J.Job):
    """A leased message, shaped as a Job so it finishes on the job path."""

    consumer: str = ""

    @property
    def event_extra(self) -> dict[str, Any]:
        return {"consumer": self.consumer}   # S13.3: pull transitions add "consumer"


@dataclass
class Lease:
    job: LeaseJob
    token: str
    length: float
    expires: float                  # epoch
    reserved: float                 # epoch of the grant: the S6.7 timeout counts from here

    @property
    def msg_id(self) -> str:
        return self.job.msg_id

    def record(self) -> dict[str, Any]:
        return lease_record(self.token, self.job.consumer, self.length, self.expires,
                            self.reserved)


# ------------------------------------------------------------------ the queue's leases

class Leases:
    def __init__(self, state: QueueState) -> None:
        self.state = state
        self.active: dict[str, Lease] = {}
        self.cond = threading.Condition(state.lock)
        self.waiting = 0
        self.expired: OrderedDict[str, str] = OrderedDict()   # token -> msg_id

    # -------------------------------------------------------------- scheduling hooks
    def schedule(self, now: float) -> None:
        """Part of every scheduler pass (caller holds the lock): end leases
        that are due to end, then wake waiting reservations if a message can
        be granted."""
        with self.cond:  # the queue's lock (re-entered): notify needs it held
            self.check_deadlines(now)
            if self.waiting and self.candidate(now) is not None:
                self.cond.notify_all()

    def next_deadline(self) -> float | None:
        """The epoch of the next lease expiry or timeout (for the loop's timeout)."""
        times = [lease.expires for lease in self.active.values()]
        if self.state.cfg.timeout:
            times += [lease.reserved + self.state.cfg.timeout for lease in self.active.values()]
        return min(times) if times else None

    def check_deadlines(self, now: float) -> None:
        for lease in list(self.active.values()):
            timeout = self.state.cfg.timeout
            if timeout and now >= lease.reserved + timeout:
                text = f"JOB TIMED OUT AFTER {J.format_seconds(timeout)} SECONDS - MOVING TO ERR"
                self.end(lease, J.Outcome("err", text), now)
            elif now >= lease.expires:
                self.expire(lease, now)

    def candidate(self, now: float) -> QueItem | None:
        """The message a grant would take now (S8.2 via S5.1), or None."""
        q = self.state
        if q.stopping or q.cfg.mode != "pull" or q.admin_status() != "UP":
            return None
        if len(self.active) + len(q.unfinished) >= q.cfg.num_workers:
            return None
        params = q.cfg.blocking_params
        blocked = {lease.job.block_key(params) for lease in self.active.values()} \
            if params else set()
        for item in q.index.candidates():
            if params and item.key(params) in blocked:
                continue
            return item if item.due <= now else None
        return None

    # -------------------------------------------------------------- granting (S8.2)
    def grant(self, length: float, consumer: str, wait: float = 0.0) -> dict[str, Any] | None:
        """Grant a lease on the next eligible message, waiting up to `wait`
        seconds for one; the reservation reply (RES) or None."""
        deadline = time.monotonic() + wait
        with self.cond:
            while True:
                res = self.grant_now(length, consumer)
                if res is not None:
                    return res
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self.state.stopping:
                    return None
                self.wait(remaining)

    def wait_for_candidate(self, timeout: float) -> bool:
        """Block up to `timeout` s until a grant could succeed (the manager's
        wait over several queues, S8.2)."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while self.candidate(time.time()) is None:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self.state.stopping:
                    return False
                self.wait(remaining)
            return True

    def wait(self, timeout: float) -> None:
        self.waiting += 1
        try:
            self.cond.wait(timeout)
        finally:
            self.waiting -= 1

    def grant_now(self, length: float, consumer: str) -> dict[str, Any] | None:
        q = self.state
        with q.lock:
            for _ in range(3):  # an unreadable candidate goes to err: try the next one
                now = time.time()
                item = self.candidate(now)
                if item is None:
                    return None
                lease = self.take(item, length, consumer, now)
                if lease is not None:
                    return self.reservation(lease)
            return None

    def take(self, item: QueItem, length: float, consumer: str, now: float) -> Lease | None:
        """que → run, job/ with its RESERVED line, lease.json, event (caller holds the lock)."""
        q, msg_id = self.state, item.msg_id
        fields = q.take_from_que(item)
        if fields is None:
            return None
        path = q.store.msg_path("run", msg_id)
        job = LeaseJob(msg_id, path, fields, consumer=consumer)
        job.status = job.status_on_disk = q.store.read_status_text(path)
        job.started_mono, job.started_wall = time.monotonic(), now
        job.dups = q.index.attach_dups(msg_id, fields, q.cfg.coalesce_params)
        lease = Lease(job, new_token(), length, now + length, now)
        try:
            # Not fsynced, like a job start (S6.1): the message itself is
            # durable in que/ already.  Only an OS crash can lose the grant,
            # and then recovery puts the message back in que (S2.7) and it is
            # delivered again (at-least-once); the old token reads "lease not held".
            self.write_record(lease, sync=False)
            q.prepare_job_dir(job)
            with open(os.path.join(path, "job", "stdio.log"), "a", encoding="utf-8") as fh:
                fh.write(reserved_line(consumer, now))
        except OSError as exc:
            log.error("cannot lease run/%s: %s", msg_id, exc)
            self.undo_take(job)
            return None
        self.active[msg_id] = lease
        q.events.log(msg_id, "que", "run", status=job.status, count=fields.get("count"),
                     extra=job.event_extra)
        return lease

    def undo_take(self, job: LeaseJob) -> None:
        self.state.store.discard_file(os.path.join(job.path, LEASE_FILE))
        self.state.unspawn(job)

    def reservation(self, lease: Lease) -> dict[str, Any]:
        """RES of S8.2."""
        q, job = self.state, lease.job
        env = J.job_env(q.base_env, q.main, q.cfg, "", job.fields, job.msg_id,
                        os.path.join(job.path, "job"))
        try:
            msg = q.store.message_as_read("run", job.path)
        except (OSError, ValueError):
            msg = dict(job.fields)
        return {"msg_id": job.msg_id, "full_msg_id": q.full_id(job.msg_id), "queue": q.name,
                "topic": q.cfg.topic, "token": lease.token,
                "lease_expires": round(lease.expires, 3), "msg": msg, "env": consumer_env(env)}

    def write_record(self, lease: Lease, *, sync: bool) -> None:
        data = protocol.dumps(lease.record()).encode()
        self.state.store.write_file(os.path.join(lease.job.path, LEASE_FILE), data, sync=sync)

    # -------------------------------------------------------------- reports (S8.3)
    def held(self, msg_id: str, token: Any, now: float) -> Lease:
        """The lease `token` holds on `msg_id`; Fail with the S8.3/S8.4 text otherwise."""
        lease = self.active.get(msg_id)
        if lease is None:
            if isinstance(token, str) and self.expired.get(token) == msg_id:
                raise Fail("lease expired")
            if self.state.store.locate(msg_id) is None:
                raise Fail("msg not found")
            if self.state.cfg.mode != "pull":
                raise Fail("queue is not in pull mode")
            raise Fail("lease not held")
        if not isinstance(token, str) or not hmac.compare_digest(token.encode(),
                                                                  lease.token.encode()):
            raise Fail("lease not held")
        if now >= lease.expires:
            self.expire(lease, now)
            raise Fail("lease expired")
        return lease

    def report(self, msg_id: str, token: Any, line: str) -> list[Any]:
        parsed = protocol.parse_pipe_line(line)
        if parsed.kind == "dup":
            return self.report_dup(msg_id, token, parsed)
        with self.state.lock:
            now = time.time()
            lease = self.held(msg_id, token, now)
            job = lease.job
            job.status = parsed.text
            if parsed.kind in ("run", "malformed"):
                self.state.write_job_status(job, parsed.text)
                if parsed.kind == "malformed":
                    return ["fail", "malformed line"]
                self.extend(lease, lease.length, now)
                return ["ok", "run"]
            if parsed.kind == "resend":
                job.fields["count"] = int(job.fields.get("count", 0)) + 1
                if job.fields["count"] >= int(job.fields.get("max_count", 15)):
                    outcome = J.Outcome("err", "HIT MAX RESEND COUNT - MOVING TO ERR")
                else:
                    outcome = J.Outcome("que", parsed.text, float(parsed.secs))
                self.state.store.write_msg(job.path, job.fields, sync=False)
            else:
                outcome = J.Outcome(parsed.kind, parsed.text)
            self.end(lease, outcome, now)
            return ["ok", outcome.state]

    def report_dup(self, msg_id: str, token: Any, parsed: protocol.PipeLine) -> list[Any]:
        """S6.5 for a consumer: the copy is made outside the lock (the target
        may be this very queue), then the lease is extended."""
        with self.state.lock:
            lease = self.held(msg_id, token, time.time())
            fields, path = dict(lease.job.fields), lease.job.path
        reply = make_dup(self.state.main, self.state.name, fields, path, parsed.due, parsed.newdest)
        with self.state.lock:
            now = time.time()
            lease = self.held(msg_id, token, now)
            lease.job.status = parsed.text
            self.state.write_job_status(lease.job, parsed.text)
            self.extend(lease, lease.length, now)
        word, _, rest = reply.partition(" ")
        return ["ok", rest] if word == "ok" else ["fail", rest]

    def renew(self, msg_id: str, token: Any, length: Any) -> list[Any]:
        with self.state.lock:
            now = time.time()
            lease = self.held(msg_id, token, now)
            if length is not None:
                lease.length = lease_length(length, self.state.cfg.lease_timeout)
            self.extend(lease, lease.length, now)
            return ["ok", round(lease.expires, 3)]

    def extend(self, lease: Lease, length: float, now: float) -> None:
        lease.expires = now + length
        try:
            # not fsynced: lost only with the OS, and then the lease ends
            # early and the message is delivered again (at-least-once)
            self.write_record(lease, sync=False)
        except OSError as exc:
            log.warning("cannot extend lease of %s on disk: %s", lease.msg_id, exc)

    # -------------------------------------------------------------- ends of a lease
    def expire(self, lease: Lease, now: float) -> None:
        """S8.3: an unreported lease ends: count + 1, then que or err."""
        job = lease.job
        job.fields["count"] = int(job.fields.get("count", 0)) + 1
        if job.fields["count"] >= int(job.fields.get("max_count", 15)):
            outcome = J.Outcome("err", "LEASE EXPIRED - HIT MAX RESEND COUNT - MOVING TO ERR")
        else:
            outcome = J.Outcome("que", "LEASE EXPIRED - MOVING TO QUE", 0.0)
        try:
            self.state.store.write_msg(job.path, job.fields, sync=False)
        except OSError as exc:
            log.warning("cannot record count of %s: %s", job.msg_id, exc)
        self.expired[lease.token] = job.msg_id
        while len(self.expired) > EXPIRED_TOKENS_KEPT:
            self.expired.popitem(last=False)
        log.info("lease of %s held by %s expired", job.msg_id, job.consumer)
        self.end(lease, outcome, now)

    def destroy(self, msg_id: str) -> bool:
        """S8.3 destroy of a leased message; False when it holds no lease."""
        lease = self.active.get(msg_id)
        if lease is None:
            return False
        self.end(lease, J.Outcome("err", "LEASE REVOKED BY DESTROY - MOVING TO ERR"), time.time())
        return True

    def end(self, lease: Lease, outcome: J.Outcome, now: float) -> None:
        """End a lease and finish its message on the job path (S6.6)."""
        q, job = self.state, lease.job
        self.active.pop(job.msg_id, None)
        q.store.discard_file(os.path.join(job.path, LEASE_FILE))
        job.exit_wall = now
        job.outcome = outcome
        try:
            q.complete(job, outcome)
        except OSError as exc:
            q.unfinished.failed(job, exc, time.monotonic())
        q.wake()

    # -------------------------------------------------------------- recovery and listing
    def recover(self, msg_id: str, path: str, now: float) -> bool:
        """S2.7: keep a message whose lease has not expired; True if kept."""
        lease_path = os.path.join(path, LEASE_FILE)
        if not os.path.exists(lease_path):
            return False
        record = parse_lease_record(read_json(lease_path))
        if record is None or record["expires"] <= now:
            unlink_quiet(lease_path)
            return False
        try:
            fields = self.state.store.read_msg(path)
        except (OSError, ValueError) as exc:
            log.warning("leased run/%s unreadable: %s", msg_id, exc)
            unlink_quiet(lease_path)
            return False
        job = LeaseJob(msg_id, path, fields, consumer=record["consumer"])
        job.status = job.status_on_disk = self.state.store.read_status_text(path)
        job.started_mono, job.started_wall = time.monotonic(), float(record["reserved"])
        self.active[msg_id] = Lease(job, record["token"], float(record["lease"]),
                                    float(record["expires"]), float(record["reserved"]))
        log.info("run/%s keeps its lease (held by %s)", msg_id, job.consumer)
        return True

    def listing(self) -> list[dict[str, Any]]:
        """`messages` run entries for leased messages (S7.3 + the dashboard)."""
        return [{"msg_id": lease.msg_id, "status": lease.job.status,
                 "dest": lease.job.fields.get("dest"), "consumer": lease.job.consumer,
                 "lease_expires": round(lease.expires, 3)}
                for lease in self.active.values()]
