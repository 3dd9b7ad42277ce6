"""The queue socket's commands (SPEC S7.3): a thin table over the queue's owners.

Owns argument checking and the exact reply texts; the work is done by
QueueState (lifecycle), Enqueue (creating and committing) and Leases (pull
mode).  Every handler runs in a socket thread; state changes take the
state's lock, and the fsyncs that make a reply durable run outside it (group
commit, rq.queue.enqueue).  No "ok" is returned before the data it
acknowledges is on stable storage.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from rq import message, protocol
from rq.message import truthy
from rq.errors import Fail
from rq.queue import createstream, fanoutprep
from rq.queue.bulkmove import Bulk, stored_count
from rq.queue.enqueue import Enqueue
from rq.queue.leases import Leases, lease_length
from rq.queue.state import QueueState

log = logging.getLogger(__name__)
ALWAYS = {"ping", "uptime", "config", "status", "shutdown", "num_messages", "messages",
          *fanoutprep.FINISHING}
# Commands whose "ok" reply means a scheduler pass already ran inline (commit
# runs one under the lock, and wakes the loop itself for a future due), so the
# loop is not woken for another (S2.6): that spares a whole loop pass
# contending for the GIL per enqueue.
INLINE_PASS = {"create_message"}
DEFAULT_LIMIT = 1000
SETTLE_WAIT = 2.0  # seconds a command waits for the group commit of a message's end (find)
MOVED_RETRIES = 5  # a message read while it moves is looked up again (STYLE habit 2)
BULK_CHUNK = 256  # messages per commit (one journal flush) of a create_messages frame


class Commands:
    def __init__(self, state: QueueState, enqueue: Enqueue, leases: Leases,
                 request_stop: Callable[[], None]) -> None:
        self.state = state
        self.enqueue = enqueue
        self.leases = leases
        self.request_stop = request_stop    # `shutdown`: the loop begins a graceful stop
        self.single_lock = threading.Lock()  # S5.6: one single_que at a time
        self.bulk = Bulk(state)               # requeue_messages, purge_messages (issue 16)
        self.table: dict[str, Callable[[Any], Any]] = {
            name[4:]: getattr(self, name) for name in dir(self) if name.startswith("cmd_")}

    def handle(self, cmd: str, arg: str | None, conn: socket.socket) -> Any:
        if cmd == createstream.CMD:  # the connection stays open (rq.queue.createstream)
            return createstream.serve_stream(conn, arg, self.create_many)
        fn = self.table.get(cmd)
        if fn is None:
            return ["ERROR"]
        return fn(self.request_data(cmd, arg))

    def request_data(self, cmd: str, arg: str | None) -> Any:
        """The decoded ARG of a known command; Fail("status: DOWN") while the
        queue is DOWN (S3.5), except for the ALWAYS commands; ProtocolError
        for bad JSON (S7.1)."""
        if cmd not in ALWAYS and self.state.admin_status() == "DOWN":
            raise Fail("status: DOWN")
        return protocol.parse_json_arg(arg) if arg is not None else None

    # ------------------------------------------------------------ always answered
    def cmd_ping(self, _: Any) -> Any:
        return ["pong"]

    def cmd_uptime(self, _: Any) -> Any:
        return [int(time.monotonic() - self.state.started_mono)]

    def cmd_config(self, _: Any) -> Any:
        return ["ok", self.state.cfg.normalised()]

    def cmd_status(self, _: Any) -> Any:
        """S7.3 `[STATUS]`; while finishing is stuck on IO errors, a second
        element says so (issue 13, D8; readers of element 0 are unaffected)."""
        stuck = self.state.unfinished.describe()
        return [self.state.status()] if stuck is None else [self.state.status(), stuck]

    def cmd_shutdown(self, _: Any) -> Any:
        self.request_stop()
        return ["ok"]

    def cmd_num_messages(self, _: Any) -> Any:
        q = self.state
        with q.lock:
            return {"prep": len(q.index.prep), "que": len(q.index.que),
                    "run": len(q.jobs) + q.unfinished.not_in(q.jobs) + len(self.leases.active),
                    **q.index.counts}

    def cmd_messages(self, data: Any) -> Any:
        state = data.get("state") if isinstance(data, dict) else None
        limit = data.get("limit", DEFAULT_LIMIT) if isinstance(data, dict) else DEFAULT_LIMIT
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 0:
            limit = DEFAULT_LIMIT
        lister = getattr(self, f"_list_{state}", None) if isinstance(state, str) else None
        if lister is None:
            return ["fail", f"invalid or missing 'state' field ({state})"]
        return lister(limit)

    def _list_prep(self, limit: int) -> Any:
        return [{"msg_id": i} for i in sorted(self.state.index.prep, reverse=True)[:limit]]

    def _list_que(self, limit: int) -> Any:
        out: list[dict[str, Any]] = []
        with self.state.lock:
            for item in self.state.index.order:
                if len(out) >= limit:
                    break
                due = int(item.due) if item.due.is_integer() else item.due
                out.append({"msg_id": item.msg_id, "due": due, "dest": item.dest})
        return out

    def _list_run(self, limit: int) -> Any:
        with self.state.lock:
            jobs: list[dict[str, Any]] = [
                {"msg_id": j.msg_id, "status": j.status, "dest": j.fields.get("dest")}
                for j in self.state.jobs.values()]
            jobs += self.leases.listing()  # pull mode: with "consumer" (S7.3)
            return sorted(jobs, key=lambda j: str(j["msg_id"]), reverse=True)[:limit]

    def _list_err(self, limit: int) -> Any:
        return [{"msg_id": i} for i in self.state.store.list_flat("err")[::-1][:limit]]

    def _list_done(self, limit: int) -> Any:
        return [{"msg_id": i} for i in _take(self.state.store.iter_hashed("done"), limit)]

    def _list_relayed(self, limit: int) -> Any:
        store = self.state.store
        out = []
        for msg_id in _take(store.iter_hashed("relayed"), limit):
            path = store.msg_path("relayed", msg_id)
            text = store.read_status_text(path) or ""
            try:
                dest = store.read_msg(path).get("dest")
            except (OSError, ValueError):
                dest = None
            words = text.split()
            out.append({"msg_id": msg_id, "status": message.computed_status("relayed", text),
                        "dest": dest, "new_msg": words[-1] if words else ""})
        return out

    # ------------------------------------------------------------ creating messages
    def new_fields(self, data: Any, now: float) -> dict[str, Any]:
        """The stored fields of a create request (S4.4), refused when this
        queue could never run them (QueueState.check_runnable)."""
        fields = message.normalize_input(data, now)
        self.state.check_runnable(fields)
        return fields

    def cmd_create_message(self, data: Any) -> Any:
        fields = self.new_fields(data, time.time())
        return ["ok", self.state.full_id(self.enqueue.submit(fields))]

    def create_messages(self, args: list[str | None]) -> list[Any]:
        """create_message for several requests at once (the socket's batch
        handler, rq.sockserve): per request its reply, or the exception the
        server turns into one (DOWN, bad JSON, a Fail)."""
        out: list[Any] = [None] * len(args)
        todo: list[tuple[int, dict[str, Any]]] = []
        now = time.time()
        for i, arg in enumerate(args):
            try:
                data = self.request_data("create_message", arg)
                todo.append((i, self.new_fields(data, now)))
            except Exception as exc:  # its own reply: ProtocolError, Fail, or a logged bug
                out[i] = exc
        created = self.enqueue.submit_many([fields for _, fields in todo])
        for (i, _), outcome in zip(todo, created):
            out[i] = outcome if isinstance(outcome, Fail) else ["ok", self.state.full_id(outcome)]
        return out

    def create_many(self, arg: str | None) -> Any:
        """One `create_messages` frame (rq.queue.createstream, issue 15 item 3): the
        messages before the first refused one are created, in order, sharing
        their commits; `["ok", ids]` or `["fail", reason, ids created before it]`."""
        data = self.request_data(createstream.CMD, arg)
        if not isinstance(data, list):
            raise Fail("create_messages needs a JSON array of messages")
        now, todo, refusal = time.time(), [], None
        for item in data:
            try:
                todo.append(self.new_fields(item, now))
            except Fail as exc:
                refusal = str(exc)
                break
        ids: list[str] = []
        for start in range(0, len(todo), BULK_CHUNK):  # a chunk after a failed one is not sent
            chunk: list[tuple[dict[str, Any], str | None]] = [
                (fields, None) for fields in todo[start:start + BULK_CHUNK]]
            for msg_id, error in self.enqueue.create_batch(chunk, bulk=True):
                if error is not None:
                    return ["fail", str(error), ids]
                ids.append(self.state.full_id(msg_id))
        return ["ok", ids] if refusal is None else ["fail", refusal, ids]

    def cmd_prep_message(self, data: Any) -> Any:
        fields = self.new_fields(data, time.time())
        msg_id, _ = self.enqueue.allocate(fields, sync_prep=True)
        return ["ok", self.state.full_id(msg_id)]

    def cmd_single_que(self, data: Any) -> Any:
        fields = self.new_fields(data, time.time())
        with self.single_lock:
            with self.state.lock:
                item = self.state.index.latest_committed()
            if item is not None:
                return ["ok", self.state.full_id(item.msg_id)]
            return ["ok", self.state.full_id(self.enqueue.submit(fields))]

    def cmd_commit_message(self, data: Any) -> Any:
        msg_id = self.msg_id(data)
        found = self.state.store.locate(msg_id)
        if found is None:
            return ["fail", "cannot find message"]
        if found[0] != "prep":
            return ["ok", "msg already committed"]
        try:
            self.enqueue.commit(msg_id)
        except FileNotFoundError:
            return self.cmd_commit_message(data)  # moved under us: look again
        except OSError as exc:
            raise Fail(f"commit failed: {exc.strerror or exc}") from exc
        return ["ok", "msg commited"]

    # fan-out copies (issue 18 item 2): rq.queue.fanoutprep, asked by rq.mgr.fanout
    def cmd_fanout_prep(self, data: Any) -> Any:
        return fanoutprep.prep(self, data)

    def cmd_fanout_commit(self, data: Any) -> Any:
        return self.cmd_commit_message(data)

    def cmd_fanout_abort(self, data: Any) -> Any:
        return fanoutprep.abort(self, data)

    # ------------------------------------------------------------ attachments (S4.8)
    def cmd_attach_message(self, data: Any) -> Any:
        msg_id = self.msg_id(data)
        with self.state.lock:
            path = self.prep_path(msg_id, missing="cannot find message")
            name = data.get("name")
            try:
                md5 = self.state.store.attach(path, data.get("pathname"),
                                          name if isinstance(name, str) else None,
                                          truthy(data.get("local_fs_only")))
            except OSError as exc:
                raise Fail(f"attach failed: {exc.strerror or exc}") from exc
        return ["ok", f"{md5}-Attached successfully"]

    def cmd_delete_attach_message(self, data: Any) -> Any:
        msg_id = self.msg_id(data)
        with self.state.lock:
            path = self.prep_path(msg_id, missing="msg not found")
            name = data.get("attachment_name")
            target = os.path.join(path, "attach", name) if isinstance(name, str) else ""
            if not name or "/" in name or name.startswith(".") or not os.path.isfile(target):
                return ["fail", "No attachment with that name for msg"]
            self.state.fs.unlink(target)
            self.state.fs.fsync_dir(os.path.dirname(target))
        return ["ok", "Attachment deleted successfully"]

    def prep_path(self, msg_id: str, *, missing: str) -> str:
        found = self.state.store.locate(msg_id)
        if found is None:
            raise Fail(missing)
        if found[0] != "prep":
            raise Fail("msg not in prep")
        return found[1]

    # ------------------------------------------------------------ reading
    def cmd_get_message(self, data: Any) -> Any:
        msg_id = self.msg_id(data)
        for _ in range(MOVED_RETRIES):
            state, path = self.find(msg_id)
            try:
                return ["ok", self.state.store.message_as_read(state, path)]
            except FileNotFoundError:
                continue  # it moved (que → run → done) under us: look again
            except (OSError, ValueError):
                break
        return ["fail", "msg couldn't be read"]

    def cmd_get_message_state(self, data: Any) -> Any:
        return ["ok", self.find(self.msg_id(data))[0]]

    def cmd_get_message_status(self, data: Any) -> Any:
        state, path = self.find(self.msg_id(data))
        text = self.state.store.read_status_text(path)
        return ["ok", {"path": self.state.store.relpath(path), "state": state,
                       "status": message.computed_status(state, text)}]

    # ------------------------------------------------------------ changing
    def cmd_delete_message(self, data: Any) -> Any:
        msg_id = self.msg_id(data)
        q = self.state
        if q.store.journal is not None:
            q.store.journal.settle_for(msg_id)  # its syncfs outside the lock (rq.queue.journal)
        with q.lock:
            state, path = self.find(msg_id)
            if state == "run":  # also a message whose end is not yet fsynced (find)
                return ["fail", "cannot delete message in run state"]
            text, count = q.store.read_status_text(path), stored_count(q.store, path)
            try:
                q.store.remove(path)
            except FileNotFoundError:
                return ["fail", "msg not found"]
            except OSError as exc:
                raise Fail(f"msg couldn't be deleted: {exc.strerror or exc}") from exc
            if state == "que":
                dup_of = q.index.dup_of(msg_id)
                item = q.index.remove_que(msg_id)
                parent = q.jobs.get(dup_of or "") if item is not None else None
                if parent is None and item is not None and dup_of in self.leases.active:
                    parent = self.leases.active[dup_of].job
                if item is not None and parent is not None:
                    dups = parent.dups
                    if msg_id in dups:
                        dups.remove(msg_id)
            elif state == "prep":
                q.index.prep.discard(msg_id)
            else:
                q.index.counts[state] = max(0, q.index.counts[state] - 1)
            q.events.log(msg_id, state, "deleted", status=text, count=count)
        return ["ok", "msg deleted"]

    def cmd_requeue_messages(self, data: Any) -> Any:
        return self.bulk.requeue(data)

    def cmd_purge_messages(self, data: Any) -> Any:
        return self.bulk.purge(data)

    def cmd_destroy_message(self, data: Any) -> Any:
        msg_id = self.msg_id(data)
        q = self.state
        with q.lock:
            if self.leases.destroy(msg_id):  # S8.3: the lease ends, message to err
                return ["ok", "msg destroyed"]
            job = q.jobs.get(msg_id)
            if job is None:
                self.find(msg_id)
                return ["fail", "msg not running"]
            if job.exited is None:
                q.terminate(job, time.monotonic())
            q.wake()
        return ["ok", "msg destroyed"]

    def cmd_run_message(self, data: Any) -> Any:
        msg_id = self.msg_id(data)
        q = self.state
        with q.lock:
            state, path = self.find(msg_id)
            if state == "run":
                return ["fail", "msg already running"]
            item = q.index.que.get(msg_id)
            if state != "que" or item is None:
                return ["fail", "msg not in runnable state"]
            earliest = q.index.earliest_due()
            due = min(time.time(), (earliest if earliest is not None else time.time()) - 1)
            # Whole ms, rounded down: round() could put it up to 0.5 ms in the future, and a
            # pass within that window left the message waiting in que (S5.1: the start is
            # synchronous with the request).
            due = math.floor(due * 1000) / 1000
            try:
                fields = q.store.read_msg(path)
                fields["due"] = due
                q.store.write_msg(path, fields)
            except ValueError as exc:
                raise Fail("msg couldn't be read") from exc
            except OSError as exc:
                raise Fail(f"msg couldn't be updated: {exc.strerror or exc}") from exc
            q.index.set_due(msg_id, due)
            q.schedule()
        return ["ok", "msg sent to front of run queue"]

    def cmd_clone_message(self, data: Any) -> Any:
        msg_id = self.msg_id(data)
        state, path = self.find(msg_id)
        if state not in ("err", "relayed", "done"):
            return ["fail", f"cannot clone message in {state} state"]
        try:
            src = self.state.store.read_msg(path)
        except (OSError, ValueError):
            return ["fail", "msg couldn't be cloned"]
        keep = ("dest", "src", "param1", "param2", "param3", "param4", "orig_msg_id",
                "max_count", "post_run_webhook", "force_remote", "due")
        fields = {k: src[k] for k in keep if k in src}
        fields.update(count=0, cloned_from=msg_id)
        try:
            new_id = self.enqueue.create(fields, src_path=path)
        except Fail:
            return ["fail", "msg couldn't be cloned"]
        return ["ok", self.state.full_id(new_id)]

    # ------------------------------------------------------------ pull leases (S8.2, S8.3)
    # Used by the manager's reserve/report/renew (rq/mgr/consumer.py).
    def cmd_lease_candidate(self, _: Any) -> Any:
        """["ok", [due, msg_id]] of the message a grant would take now, or ["ok", null]."""
        self.pull_only()
        with self.state.lock:
            item = self.leases.candidate(time.time())
            return ["ok", None if item is None else [item.due, item.msg_id]]

    def cmd_grant_lease(self, data: Any) -> Any:
        """{lease?, consumer?, wait?} -> ["ok", RES] or ["ok", null]."""
        self.pull_only()
        data = data if isinstance(data, dict) else {}
        length = lease_length(data.get("lease"), self.state.cfg.lease_timeout)
        consumer = data.get("consumer")
        wait = data.get("wait") or 0
        if not isinstance(wait, (int, float)) or isinstance(wait, bool) or not 0 <= wait <= 60:
            raise Fail("invalid wait")
        return ["ok", self.leases.grant(length, consumer if isinstance(consumer, str)
                                           else "anonymous", wait)]

    def cmd_lease_wait(self, data: Any) -> Any:
        """{timeout} -> ["ok", true] as soon as a grant could succeed, ["ok", false] after it."""
        self.pull_only()
        timeout = data.get("timeout") if isinstance(data, dict) else None
        if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) \
                or not 0 <= timeout <= 60:
            raise Fail("invalid timeout")
        return ["ok", self.leases.wait_for_candidate(timeout)]

    def cmd_lease_waiters(self, _: Any) -> Any:
        """["ok", n]: reservations waiting in this queue now (tests, benchmarks)."""
        with self.state.lock:
            return ["ok", self.leases.waiting]

    def cmd_report(self, data: Any) -> Any:
        line = data.get("line") if isinstance(data, dict) else None
        if not isinstance(line, str):
            raise Fail("missing line")
        return self.leases.report(self.msg_id(data), data.get("token"), line)

    def cmd_renew(self, data: Any) -> Any:
        msg_id = self.msg_id(data)
        return self.leases.renew(msg_id, data.get("token"), data.get("lease"))

    def pull_only(self) -> None:
        if self.state.cfg.mode != "pull":
            raise Fail("queue is not in pull mode")

    # ------------------------------------------------------------ helpers
    @staticmethod
    def msg_id(data: Any) -> str:
        value = data.get("msg_id") if isinstance(data, dict) else None
        if value is None or value == "":
            raise Fail("lacking 'msg_id' field")
        if not isinstance(value, str):
            raise Fail("msg not found")
        try:
            return protocol.parse_msg_ref(value)[1]
        except Exception as exc:
            raise Fail("msg not found") from exc

    def find(self, msg_id: str) -> tuple[str, str]:
        """(state, path) of a message.  One whose end is moved but not yet fsynced and
        counted (QueueState.ending, the group commit of completions, issue 15) is waited
        for (the fsync takes milliseconds): a reader of the disk, the web's message view,
        already shows it final, and a command sent on seeing that must find it so.  Still
        `run` after SETTLE_WAIT: no reader here sees it final before its bookkeeping."""
        found = self.state.store.locate(msg_id)
        if found is None:
            raise Fail("msg not found")
        if msg_id in self.state.ending:
            if not self.state.wait_settled(msg_id, SETTLE_WAIT):
                return "run", found[1]
            found = self.state.store.locate(msg_id)
            if found is None:
                raise Fail("msg not found")
        return found


def _take(iterator: Any, limit: int) -> list[str]:
    out: list[str] = []
    for item in iterator:
        if len(out) >= limit:
            break
        out.append(item)
    return out
