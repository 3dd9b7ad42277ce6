"""Creating messages in one queue (S4.1, S4.8, S7.3, S0.3): allocation in
prep/, the prep → que commit, and the group commit of creates in flight.

Owns every way a message enters the queue: `allocate` (msg written in a
spare, published as prep/ID: Store.allocate; fsynced only for a message that
must be durable by itself, prep_message), `commit` / `commit_batch` (prep →
que, then one create-journal flush for the batch (rq.queue.journal), then
index, events and one scheduler pass: S5.1 wants a due message with a free
slot in run/ before its reply), `create` for callers that may hold the queue lock
(cron, clone), and `submit` / `submit_many` for socket requests: when no other
create is being committed the caller commits at once, itself (one client pays
no hand-off); otherwise it waits, and the next caller to lead takes every
create waiting by then as one batch.  A bulk frame (rq.queue.createstream) is one
`create_batch(bulk=True)`: ids taken in input order, then allocated on threads.

A message whose own steps fail gets its own Fail; a failed journal append or
fdatasync fails every message of its batch, each put back in prep/ and
removed, as a single create would.  No create returns before its message is
durable (its record, until the journal settles the directories).

Why group commit: creates in flight together share one journal flush and one
scheduler pass, and one thread does their ~35 system calls each instead of
several threads handing the GIL to one another at every call.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass
from typing import Any

from rq.errors import Fail
from rq.queue.state import QueueState

log = logging.getLogger(__name__)
MAX_BATCH = 64


@dataclass
class _Item:
    fields: dict[str, Any]
    finished: bool = False
    msg_id: str = ""
    error: Fail | None = None


class Enqueue:
    def __init__(self, state: QueueState) -> None:
        self.state = state
        self._cond = threading.Condition()
        self._pending: list[_Item] = []
        self._leading = False

    # ================================================================ group commit
    def submit(self, fields: dict[str, Any]) -> str:
        """The id of the new message once it is durable in que/; Fail otherwise."""
        [outcome] = self.submit_many([fields])
        if isinstance(outcome, Fail):
            raise outcome
        return outcome

    def submit_many(self, many: list[dict[str, Any]]) -> list[str | Fail]:
        """submit() for each of `many` (the socket's I/O thread hands over the
        create_message requests of one read pass): per message its id, or
        the Fail it gets."""
        items = [_Item(fields) for fields in many]
        with self._cond:
            self._pending.extend(items)
        while True:
            with self._cond:
                while self._leading and not all(item.finished for item in items):
                    self._cond.wait()
                if all(item.finished for item in items):
                    break
                self._leading = True
                batch, self._pending = self._pending[:MAX_BATCH], self._pending[MAX_BATCH:]
            self._lead(batch)
        return [item.error if item.error is not None else item.msg_id for item in items]

    def _lead(self, batch: list[_Item]) -> None:
        """Commit `batch` as the leader; every item ends finished."""
        try:
            results = self.create_batch([(item.fields, None) for item in batch])
            for item, (msg_id, error) in zip(batch, results):
                item.msg_id, item.error = msg_id, error
        except BaseException as exc:  # never leave a waiting request without an answer
            log.exception("create batch failed")
            for item in batch:
                if item.error is None and not item.msg_id:
                    item.error = Fail(f"msg couldn't be created: {exc}")
        finally:
            with self._cond:
                for item in batch:
                    item.finished = True
                self._leading = False
                self._cond.notify_all()

    # ================================================================ creating
    def create(self, fields: dict[str, Any], src_path: str | None = None) -> str:
        """Allocate + (attachments of `src_path`) + commit; the id once durable
        in que/.  For callers that may hold the queue lock (cron, clone)."""
        [(msg_id, error)] = self.create_batch([(fields, src_path)])
        if error is not None:
            raise error
        return msg_id

    def create_batch(self, specs: list[tuple[dict[str, Any], str | None]], *,
                     bulk: bool = False) -> list[tuple[str, Fail | None]]:
        """create() for several messages at once, sharing one commit
        (commit_batch); per message its id and None, or "" and its Fail.  A
        message that fails after its allocation is removed from prep.  With
        `bulk` (rq.queue.createstream: no attachments to link) the ids are taken
        together beforehand, in input order (so the que order, S5.1, is the input's)."""
        out: list[tuple[str, Fail | None]] = []
        made: list[tuple[int, str, str]] = []
        blobs: dict[str, bytes] = {}
        for result in (self.allocate_bulk([f for f, _ in specs]) if bulk else
                       [self._allocate_one(*spec) for spec in specs]):
            if isinstance(result, Fail):
                out.append(("", result))
                continue
            msg_id, path, blob = result
            made.append((len(out), msg_id, path))
            blobs[msg_id] = blob
            out.append((msg_id, None))
        errors = self.commit_batch([(msg_id, specs[i][0]) for i, msg_id, _ in made], blobs)
        for (i, msg_id, path), err in zip(made, errors):
            if err is None:
                continue
            self.discard_prep(msg_id, path)
            out[i] = ("", err if isinstance(err, Fail)
                      else Fail(f"msg couldn't be created: {err.strerror or err}"))
        return out

    def _allocate_one(self, fields: dict[str, Any], src_path: str | None = None,
                      msg_id: str | None = None) -> tuple[str, str, bytes] | Fail:
        try:
            return self.allocate_with(fields, src_path, msg_id)
        except Fail as exc:
            return exc

    def allocate_bulk(self, many: list[dict[str, Any]]) -> list[tuple[str, str, bytes] | Fail]:
        """One by one, on the caller's thread: with the create journal an allocation
        fsyncs nothing (allocate_with), so threads would overlap no wait, and they cost
        each frame their start and the loop the GIL (issue 15; docs/benchmarks.md)."""
        ids = self.state.store.new_ids(time.time(), len(many))
        return [self._allocate_one(f, None, i) for f, i in zip(many, ids)]

    def allocate_with(self, fields: dict[str, Any], src_path: str | None,
                      msg_id: str | None = None) -> tuple[str, str, bytes]:
        """allocate(), then hard-link the attachments of `src_path` (a clone);
        every failure is this message's own Fail, never its batch's (D4).  With
        the create journal and no attachments nothing is fsynced: the msg bytes
        are returned for the commit's record (else b"": the msg is durable)."""
        journaled: list[bytes] | None = (
            [] if src_path is None and self.state.store.journal is not None else None)
        try:
            msg_id, path = self.allocate(fields, sync_prep=False, msg_id=msg_id,
                                         journaled=journaled)
        except Fail:
            raise
        except Exception as exc:  # a bug: logged, and this message's failure only
            log.exception("cannot create a message")
            raise Fail(f"msg couldn't be created: {exc}") from exc
        if src_path is not None:
            try:
                self.state.store.link_attachments(src_path, path)
            except Exception as exc:
                self.discard_prep(msg_id, path)
                if isinstance(exc, Fail):
                    raise
                if not isinstance(exc, OSError):
                    log.exception("cannot link the attachments of a clone")
                raise Fail(f"msg couldn't be created: {getattr(exc, 'strerror', None) or exc}"
                           ) from exc
        return msg_id, path, journaled[0] if journaled else b""

    def allocate(self, fields: dict[str, Any], *, sync_prep: bool,
                 msg_id: str | None = None, exact: bool = False,
                 journaled: list[bytes] | None = None) -> tuple[str, str]:
        """prep/ID with its msg, durable (S4.1); with `sync_prep` prep/ too;
        with `exact`, under `msg_id` or not at all; with `journaled`, nothing
        fsynced and the msg bytes appended to it (Store.allocate)."""
        q = self.state
        try:
            msg_id, path = q.store.allocate(fields, time.time(), q.main.base_url,
                                            sync_prep=sync_prep, msg_id=msg_id, exact=exact,
                                            journaled=journaled)
        except OSError as exc:
            raise Fail(f"msg couldn't be created: {exc.strerror or exc}") from exc
        with q.lock:
            q.index.prep.add(msg_id)
        q.events.log(msg_id, None, "prep", count=fields.get("count"))
        return msg_id, path

    def discard_prep(self, msg_id: str, path: str) -> None:
        q = self.state
        with q.lock:
            q.index.prep.discard(msg_id)
            try:
                if os.path.isdir(path):
                    q.store.remove(path)
            except OSError as exc:
                log.warning("cannot discard prep/%s: %s", msg_id, exc)

    # ================================================================ committing
    def commit(self, msg_id: str, fields: dict[str, Any] | None = None) -> None:
        """prep → que, made durable before the message can be scheduled.
        `fields` are the stored fields when the caller has them."""
        [error] = self.commit_batch([(msg_id, fields)])
        if error is not None:
            raise error

    def commit_batch(self, items: list[tuple[str, dict[str, Any] | None]],
                     blobs: dict[str, bytes] | None = None) -> list[OSError | Fail | None]:
        """commit() for several messages with one flush and one scheduler pass:
        the create journal's record of each (its msg bytes from `blobs`, when
        its allocation was journaled), or without a journal an fsync of que/.
        Per message None, or the OSError of its rename (still in prep), or a
        Fail (not durable: put back in prep)."""
        q = self.state
        errors: list[OSError | Fail | None] = [None] * len(items)
        moved: list[int] = []
        with q.lock:
            for i, (msg_id, _) in enumerate(items):
                try:
                    q.store.move(msg_id, "prep", "que", sync=False)
                except OSError as exc:
                    errors[i] = exc
                    continue
                q.index.prep.discard(msg_id)
                moved.append(i)
        if not moved:
            return errors
        try:
            if q.store.journal is not None:
                q.store.journal.append([(items[i][0], (blobs or {}).get(items[i][0], b""))
                                        for i in moved])
            else:
                q.fs.fsync_dir_shared(q.store.state_dir("que"))
        except OSError as exc:
            for i in moved:
                errors[i] = Fail(f"commit failed: {exc.strerror or exc}")
        stored = self.stored_fields(items, moved, errors)
        with q.lock:
            self.publish(items, moved, stored)
            now = time.time()
            if stored:
                q.schedule(now)
        if any(float(f.get("due", 0) or 0) > now for f in stored.values()):
            q.wake()  # the loop's next wake-up may now be earlier
        return errors

    def stored_fields(self, items: list[tuple[str, dict[str, Any] | None]], moved: list[int],
                      errors: list[OSError | Fail | None]) -> dict[int, dict[str, Any]]:
        """The fields of each durable message of the batch (read back when the
        caller had none); a message that cannot be read gets its Fail."""
        q = self.state
        stored: dict[int, dict[str, Any]] = {}
        for i in moved:
            msg_id, fields = items[i]
            if errors[i] is None and fields is None:
                try:
                    fields = q.store.read_msg(q.store.msg_path("que", msg_id))
                except (OSError, ValueError) as exc:
                    errors[i] = Fail(f"commit failed: {getattr(exc, 'strerror', None) or exc}")
            if errors[i] is None and fields is not None:
                stored[i] = fields
        return stored

    def publish(self, items: list[tuple[str, dict[str, Any] | None]], moved: list[int],
                stored: dict[int, dict[str, Any]]) -> None:
        """Index and log the durable messages; put the others back in prep so
        the state matches their reply (caller holds the lock)."""
        q = self.state
        for i in moved:
            msg_id = items[i][0]
            if i in stored:
                que_path = q.store.msg_path("que", msg_id)
                if os.path.isdir(que_path) and msg_id not in q.index.que:
                    q.index.add_que(msg_id, stored[i].get("due", 0), stored[i])
                q.events.log(msg_id, "prep", "que", count=stored[i].get("count"))
                continue
            try:
                q.store.move(msg_id, "que", "prep", sync=False)
                q.index.prep.add(msg_id)
            except OSError:
                log.error("commit of %s failed and could not be undone", msg_id)
