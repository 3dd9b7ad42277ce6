"""A small typed client for programs that put work into RQ (issue 16 item 1).

    from rq import Client
    rq = Client()                                   # the root as `rq` finds it (S1.2)
    msg = rq.send("video", param1="a.mov")          # durable once it returns
    print(rq.wait(msg).status)                      # e.g. "done - encoded"

`Client(root=...)` talks to the root's sockets (S7); `Client(url="http://host:3333/",
auth=(user, password))` to any RQ web server (S15); the methods are the same.
Owns: which queue a `dest` goes to (S19 sendmesg, S4.3), the S4.4 fields a
send takes (attachments from paths or bytes, `due` as a datetime or seconds
from now), waiting for messages to end (S8.8 events, then a re-check of the
message, so an end that happened before the subscription is seen too), and
the bulk window of `send_many` / `BulkSender` (rq.queue.createstream).  The wire
formats are rq.transports'.  Errors: `Refused` carries the server's reason;
`ConnectError` when nothing answers; `WaitTimeout` from `wait`.  A client keeps a
connection to each queue it sends to more than once (rq.transports), until `close()`.

Importing it loads neither click nor Flask nor requests (that one only for
`url=`), so scripts and `rq sendmesg --stdin` start fast.
"""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from rq import protocol
from rq.errors import ConnectError, ProtocolError, RQError
from rq.topics import is_pattern
from rq.transports import HttpTransport, LocalTransport, Refused, Transport

__all__ = ["Client", "Status", "QueueInfo", "Refused", "BulkRefused", "WaitTimeout",
           "ConnectError", "BulkSender"]

ENDED = frozenset({"done", "err", "relayed"})
OK_ENDS = frozenset({"done", "relayed"})
GONE = "deleted"      # Status.state of a message that no longer exists
RECHECK = 10.0        # seconds between re-reads of messages still waited for (lost events)
BATCH = 256           # messages per create_messages frame in send_many
WINDOW = 2            # frames in flight on a bulk stream

Attachments = Mapping[str, "bytes | str | os.PathLike[str]"] | Sequence["str | os.PathLike[str]"]


@dataclass(frozen=True)
class Status:
    """A message's state (S4.7) and computed status (S4.5), e.g. `done`, `done - encoded`."""

    msg_id: str        # the full id
    state: str         # prep, que, run, done, relayed, err, or "deleted" when gone
    status: str

    @property
    def ended(self) -> bool:
        return self.state in ENDED or self.state == GONE

    @property
    def ok(self) -> bool:
        return self.state in OK_ENDS


@dataclass(frozen=True)
class QueueInfo:
    name: str
    status: str                         # UP, DOWN, PAUSE, SCRIPTERROR or a supervision state
    counts: dict[str, int] | None       # messages per state; None when the queue is not serving


class WaitTimeout(RQError):
    """`wait` ran out of time; `statuses` are the messages' statuses at that moment."""

    def __init__(self, statuses: list[Status]) -> None:
        pending = [s.msg_id for s in statuses if not s.ended]
        super().__init__(f"timed out waiting for {', '.join(pending)}")
        self.statuses = statuses


class BulkRefused(Refused):
    """A bulk send stopped at a refused message: `index` is its position in the
    input (0-based), `ids` the ids created before it that were not yet returned
    (by BulkSender.send/flush; send_many's carry every id created)."""

    def __init__(self, reason: str, index: int, ids: list[str]) -> None:
        super().__init__(reason)
        self.index, self.ids = index, ids


def due_epoch(due: datetime | timedelta | float | int, now: float) -> float:
    """A datetime (naive = local time) as is; a timedelta or a number of seconds from `now`."""
    if isinstance(due, datetime):
        return due.timestamp()
    if isinstance(due, timedelta):
        return now + due.total_seconds()
    if isinstance(due, bool) or not isinstance(due, (int, float)):
        raise TypeError("due must be a datetime, a timedelta or seconds")
    return now + due


def split_ref(msg_id: str) -> tuple[str, str]:
    """(queue, short id) of a full id (S4.2); Refused for anything else."""
    try:
        name, short = protocol.parse_msg_ref(msg_id)
    except ProtocolError as exc:
        raise Refused(str(exc)) from None
    if name is None:
        raise Refused(f"invalid msg_id: {msg_id} (a full id names its queue)")
    return name, short


def message_fields(dest: str, param1: Any, param2: Any, param3: Any, param4: Any,
                   src: str | None, due: datetime | timedelta | float | None,
                   count: int | None, max_count: int | None, orig_msg_id: str | None,
                   post_run_webhook: Sequence[str] | str | None,
                   force_remote: bool) -> dict[str, Any]:
    """The S4.4 input fields of a send: `due` a datetime, a timedelta or seconds from now."""
    fields: dict[str, Any] = {"dest": dest}
    for key, value in (("param1", param1), ("param2", param2), ("param3", param3),
                       ("param4", param4), ("src", src), ("count", count),
                       ("max_count", max_count), ("orig_msg_id", orig_msg_id)):
        if value is not None:
            fields[key] = value
    if post_run_webhook is not None:
        fields["post_run_webhook"] = post_run_webhook if isinstance(post_run_webhook, str) \
            else list(post_run_webhook)
    if due is not None:
        fields["due"] = due_epoch(due, time.time())
    if force_remote:
        fields["force_remote"] = True
    return fields


class BulkSender:
    """Messages sent on one stream in batches, up to WINDOW batches in flight
    (rq.queue.createstream).  `send` returns the ids of the batches answered so far,
    in input order; `flush` waits for the rest.  A refusal raises BulkRefused
    once its reply arrives; nothing sent after the refused message is queued."""

    def __init__(self, stream: Any, window: int = WINDOW) -> None:
        self.stream = stream
        self.window = max(1, window)
        self.in_flight: deque[int] = deque()   # batch sizes, oldest first
        self.answered = 0                      # messages whose batch was answered
        self.ready: list[str] = []             # ids answered, not yet returned

    def send(self, batch: list[dict[str, Any]]) -> list[str]:
        self.stream.send(batch)
        self.in_flight.append(len(batch))
        while len(self.in_flight) >= self.window:  # the oldest is answered by now, mostly
            self._answer()
        return self._take()

    def flush(self) -> list[str]:
        while self.in_flight:
            self._answer()
        return self._take()

    def _take(self) -> list[str]:
        ids, self.ready = self.ready, []
        return ids

    def _answer(self) -> None:
        size = self.in_flight.popleft()
        reply = self.stream.recv()
        if isinstance(reply, list) and len(reply) >= 2 and reply[0] == "ok":
            self.answered += size
            self.ready += [str(i) for i in reply[1]]
            return
        made = [str(i) for i in reply[2]] if isinstance(reply, list) and len(reply) > 2 \
            and isinstance(reply[2], list) else []
        reason = str(reply[1]) if isinstance(reply, list) and len(reply) > 1 \
            else protocol.dumps(reply)
        self.in_flight.clear()
        raise BulkRefused(reason, self.answered + len(made), self._take() + made)

    def close(self) -> None:
        self.stream.close()

    def __enter__(self) -> BulkSender:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Client:
    """Send and follow messages, over a root's sockets (`root`, or found as `rq`
    finds it: RQ_ROOT, then the current directory upwards) or over HTTP (`url`)."""

    def __init__(self, root: str | None = None, *, url: str | None = None,
                 auth: tuple[str, str] | None = None, timeout: float = 60.0) -> None:
        self.transport: Transport
        if url is not None:
            self.transport = HttpTransport(url, auth, timeout)
        else:
            from rq.root import find_root
            argv = [] if root is None else ["--root", root]
            self.transport = LocalTransport(find_root("rq", argv, os.environ)[0])
        self._prefix: str | None = None

    def close(self) -> None:
        """Close the connections kept for later requests (also at `with`'s end)."""
        self.transport.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------ sending
    def queue_for(self, dest: str, *, relay_ok: bool = False) -> str:
        """The queue that stores a message for `dest` (S19 sendmesg): `relay` for a URL
        (which needs relay_ok), NAME for `/q/NAME` or `ROOTq/NAME`, else `dest` itself."""
        if protocol.is_remote_dest(dest) and not relay_ok:
            raise Refused(f"cannot relay to {dest} without relay_ok")
        if self._prefix is None:
            self._prefix = self.transport.prefix()
        return protocol.dest_queue_name(dest, self._prefix)

    def send(self, dest: str, *, param1: Any = None, param2: Any = None, param3: Any = None,
             param4: Any = None, src: str | None = None,
             due: datetime | timedelta | float | None = None, count: int | None = None,
             max_count: int | None = None, orig_msg_id: str | None = None,
             post_run_webhook: Sequence[str] | str | None = None, force_remote: bool = False,
             attachments: Attachments | None = None, relay_ok: bool = False,
             queue: str | None = None) -> str:
        """Create a message (S4.4) and return its full id once it is durable in que/.
        With `attachments` ({name: path or bytes}, or a list of paths) it is made in
        prep, attached (S4.8) and committed; a failed attach deletes it again.  A topic
        pattern `dest` (`video.*`) is refused: fanout() sends it to every matching queue."""
        if queue is None and is_pattern(dest):
            raise Refused(f"dest {dest} is a topic pattern: Client.fanout sends it "
                          "to every matching queue")
        fields = message_fields(dest, param1, param2, param3, param4, src, due, count,
                                max_count, orig_msg_id, post_run_webhook, force_remote)
        name = queue or self.queue_for(dest, relay_ok=relay_ok)
        if not attachments:
            return self.transport.create(name, fields)
        return self._send_attached(name, fields, attachments)

    def fanout(self, pattern: str, *, param1: Any = None, param2: Any = None,
               param3: Any = None, param4: Any = None, src: str | None = None,
               due: datetime | timedelta | float | None = None, count: int | None = None,
               max_count: int | None = None, orig_msg_id: str | None = None,
               post_run_webhook: Sequence[str] | str | None = None,
               force_remote: bool = False) -> list[str]:
        """Issue 18 item 2: one copy of the message in every queue whose topic matches
        `pattern` (`video.*`, `reports.#`, `#`; S8.1, S8.7), all or nothing (rq-mgr's
        journal); the full ids, in queue-name order, once every copy is durable in
        que/.  Refused when no queue matches or a queue refuses (no copy is left then)."""
        return self.transport.fanout(message_fields(
            pattern, param1, param2, param3, param4, src, due, count, max_count,
            orig_msg_id, post_run_webhook, force_remote))

    def _send_attached(self, name: str, fields: dict[str, Any],
                       attachments: Attachments) -> str:
        items = attachments.items() if isinstance(attachments, Mapping) else \
            [(os.path.basename(os.fspath(p)), p) for p in attachments]
        full = self.transport.create(name, fields, prep=True)
        _, short = split_ref(full)
        try:
            for att_name, data in items:
                self.transport.attach(name, short, att_name,
                                      data if isinstance(data, bytes) else os.fspath(data))
            self.transport.message_cmd(name, "commit_message", short)
        except BaseException:
            try:
                self.transport.message_cmd(name, "delete_message", short)
            except RQError:
                pass
            raise
        return full

    def bulk(self, dest: str, *, relay_ok: bool = False, queue: str | None = None,
             window: int = WINDOW) -> BulkSender:
        """A BulkSender for messages to `dest`'s queue (each batch: message field dicts)."""
        name = queue or self.queue_for(dest, relay_ok=relay_ok)
        return BulkSender(self.transport.bulk(name), window)

    def send_many(self, dest: str, messages: Iterable[Mapping[str, Any]], *,
                  relay_ok: bool = False, batch: int = BATCH) -> list[str]:
        """Create every message (field dicts; `dest` defaults to `dest`) in order,
        in batches sharing their commits; their full ids.  Stops at the first refused
        one: BulkRefused (its `index`; the messages before it are queued)."""
        out: list[str] = []
        with self.bulk(dest, relay_ok=relay_ok) as sender:
            chunk: list[dict[str, Any]] = []
            try:
                for msg in messages:
                    chunk.append({"dest": dest, **msg})
                    if len(chunk) >= batch:
                        out += sender.send(chunk)
                        chunk = []
                if chunk:
                    out += sender.send(chunk)
                out += sender.flush()
            except BulkRefused as exc:
                exc.ids = out + exc.ids
                raise
        return out

    # ------------------------------------------------------------ reading and changing
    def message(self, msg_id: str) -> dict[str, Any]:
        """The message as read (S4.5): stored fields plus path, state, status, _attachments."""
        return self.transport.read(*split_ref(msg_id))

    def status(self, msg_id: str) -> Status:
        reply = self.transport.status(*split_ref(msg_id))
        return Status(msg_id, str(reply.get("state")), str(reply.get("status")))

    def state(self, msg_id: str) -> str:
        return self.status(msg_id).state

    def clone(self, msg_id: str) -> str:
        """A new message like an ended one (S7.3 clone_message); its full id."""
        name, short = split_ref(msg_id)
        return str(self.transport.message_cmd(name, "clone_message", short))

    def delete(self, msg_id: str) -> None:
        """Remove a message that is not running (S7.3 delete_message)."""
        name, short = split_ref(msg_id)
        self.transport.message_cmd(name, "delete_message", short)

    def queues(self) -> list[QueueInfo]:
        return [QueueInfo(str(q["name"]), str(q["status"]), q.get("counts"))
                for q in self.transport.queues()]

    # ------------------------------------------------------------ waiting
    def wait(self, msg_ids: str | Sequence[str], timeout: float | None = None) -> Any:
        """Block until every message has ended (done, relayed, err, or deleted); its
        Status (a list of them for a list of ids).  Woken by the event stream (S8.8),
        re-reading a message when an event says it ended, right after subscribing
        and every RECHECK seconds.  WaitTimeout after `timeout` seconds."""
        ids = [msg_ids] if isinstance(msg_ids, str) else list(msg_ids)
        refs = {msg_id: split_ref(msg_id) for msg_id in ids}
        deadline = None if timeout is None else time.monotonic() + timeout
        patterns = sorted({self.transport.topic(name) for name, _ in refs.values()})
        final: dict[tuple[str, str], Status] = {}   # by (queue, short id): spellings differ
        with self.transport.subscribe(patterns) as stream:
            pending = {ref: msg_id for msg_id, ref in refs.items()}
            self._recheck(pending, final)
            next_check = time.monotonic() + RECHECK
            while pending:
                now = time.monotonic()
                if deadline is not None and now >= deadline:
                    self._recheck(pending, final)
                    if pending:
                        raise WaitTimeout([replace(final[refs[i]], msg_id=i) if refs[i] in final
                                           else self.status(i) for i in ids])
                    break
                if now >= next_check:
                    self._recheck(pending, final)
                    next_check = now + RECHECK
                    continue
                wake = next_check if deadline is None else min(next_check, deadline)
                event = stream.next(max(0.0, wake - now))
                if not isinstance(event, dict):
                    continue
                if event.get("event") == "overflow":
                    next_check = 0.0  # events were dropped: read every message again
                    continue
                ref = (event.get("queue"), event.get("msg_id"))
                if ref in pending and (event.get("to") in ENDED or event.get("to") == GONE):
                    self._recheck(pending, final, only=ref)
        statuses = [replace(final[refs[i]], msg_id=i) for i in ids]
        return statuses[0] if isinstance(msg_ids, str) else statuses

    def _recheck(self, pending: dict[tuple[str, str], str],
                 final: dict[tuple[str, str], Status],
                 only: tuple[str, str] | None = None) -> None:
        """Read each message of `pending` (or just `only`) again; the ended ones
        move to `final`."""
        for ref, msg_id in list(pending.items()):
            if only is not None and ref != only:
                continue
            try:
                status = self.status(msg_id)
            except Refused as exc:
                if "not found" not in exc.reason:
                    raise
                status = Status(msg_id, GONE, exc.reason)
            if status.ended:
                final[ref] = status
                pending.pop(ref, None)

