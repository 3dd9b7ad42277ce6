"""Bulk retry and clean-up inside the queue process (issue 16 item 6; S7.3, S13).

Owns the queue commands `requeue_messages` (err, done or relayed → que) and
`purge_messages` (done, err, relayed → deleted): choosing the messages (a
state; a search with the rules of `GET /search`, S15 route 8; an age measured
by the id's time, as the cleaner does, S12.3) and moving them in batches.
Each message still makes the transition a single command makes: one rename
of its whole directory, then one S13 event once the rename is on disk.  A
batch takes the queue lock once and fsyncs each directory it touched once, so
the queue keeps answering between batches; a SIGKILL half way leaves every
message either moved or not, never both (a purged one may leave a hidden
`.deleting.*` directory, removed at the next start by recovery).  The reply
counts the messages moved, only after they are durable.

Must not: spawn, reap or know the socket framing; the replies' texts are
built here because these commands are only ever answered from here.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterable, Iterator
from typing import Any

from rq import message, protocol
from rq.errors import Fail, ProtocolError
from rq.queue.state import QueueState

log = logging.getLogger(__name__)
BATCH = 256                      # messages per hold of the queue lock
REQUEUE_FROM = ("err", "done", "relayed")
PURGE_FROM = ("done", "err", "relayed")
REQUEUED = "REQUEUED - MOVING TO QUE"


class Stopped(Exception):
    """A batch stopped by an IO error after `done` durable moves."""

    def __init__(self, done: int, exc: OSError) -> None:
        super().__init__(done, exc)
        self.done = done
        self.reason = exc.strerror or str(exc)


class Bulk:
    def __init__(self, state: QueueState) -> None:
        self.state = state

    # ------------------------------------------------------------ commands
    def requeue(self, data: Any) -> list[Any]:
        """`requeue_messages {state, query?, exact?, dry_run?}` → ["ok", N]: every
        matching message of `state` back to que, due now, `count` kept (the same
        rule as the S2.5 and S2.7 requeues), `dup`/`dups` dropped."""
        args = _args(data)
        state = args.get("state", "err")
        if state not in REQUEUE_FROM:
            raise Fail(f"invalid state for requeue ({state})")
        query, exact = _query(args)
        chosen = (i for i in self.ids(state) if self.wanted(state, i, query, exact))
        if args.get("dry_run") is True:
            return ["ok", sum(1 for _ in chosen)]
        return self.run_batches("requeue", self.requeue_batch, state, chosen)

    def purge(self, data: Any) -> list[Any]:
        """`purge_messages {states?, older_than, query?, exact?, dry_run?}` → ["ok", N]:
        every matching done/err/relayed message whose id is older than `older_than`
        seconds deleted, as `delete_message` would (S7.3)."""
        args = _args(data)
        states = args.get("states", list(PURGE_FROM))
        if isinstance(states, str):
            states = [states]
        if not isinstance(states, list) or not states or \
                any(s not in PURGE_FROM for s in states):
            raise Fail(f"invalid states for purge ({protocol.dumps(states)})")
        older = args.get("older_than")
        if not isinstance(older, (int, float)) or isinstance(older, bool) or older < 0:
            raise Fail("invalid older_than")
        query, exact = _query(args)
        cutoff = time.time() - older
        total = 0
        for state in dict.fromkeys(states):
            chosen = (i for i in self.ids(state, before=cutoff)
                      if self.wanted(state, i, query, exact))
            if args.get("dry_run") is True:
                total += sum(1 for _ in chosen)
                continue
            reply = self.run_batches("purge", self.purge_batch, state, chosen, total)
            if reply[0] != "ok":
                return reply
            total = reply[1]
        return ["ok", total]

    def run_batches(self, verb: str, one_batch: Any, state: str, chosen: Iterable[str],
                    total: int = 0) -> list[Any]:
        """["ok", total] once every batch is done; an IO error stops the work with a
        reply that counts what was done before it (each of those is durable)."""
        for batch in _batches(chosen):
            try:
                total += one_batch(state, batch)
            except Stopped as exc:
                total += exc.done
                return ["fail", f"{verb} stopped after {total} messages: {exc.reason}"]
        return ["ok", total]

    # ------------------------------------------------------------ choosing
    def ids(self, state: str, before: float | None = None) -> Iterator[str]:
        """The ids in `state`, oldest first; with `before`, only those created before it."""
        store = self.state.store
        ids = store.list_flat(state) if state == "err" else \
            store.iter_hashed(state, newest_first=False)
        for msg_id in ids:
            try:
                created = message.id_epoch(msg_id)
            except ProtocolError:  # shaped like an id but no real time: not ours to move
                continue
            if before is not None and created > before:
                if state != "err":
                    return  # a hashdir walked oldest first holds only newer ids from here
                continue
            yield msg_id

    def wanted(self, state: str, msg_id: str, query: dict[str, str], exact: bool) -> bool:
        """Whether the message, read now, matches the search (S15 route 8: the message as
        read, without `_attachments`); one that moved or cannot be read is not wanted."""
        if not query:
            return True
        store = self.state.store
        path = store.msg_path(state, msg_id)
        try:
            fields = store.read_msg(path)
        except (OSError, ValueError):
            return False
        fields.update(path=store.relpath(path), state=state,
                      status=message.computed_status(state, store.read_status_text(path)))
        return message.matches_query(fields, query, exact)

    # ------------------------------------------------------------ moving
    def requeue_batch(self, state: str, batch: list[str]) -> int:
        q = self.state
        store = q.store
        moved: list[tuple[str, dict[str, Any]]] = []
        sync: list[str] = []
        with q.lock:
            now = round(time.time(), 3)
            for msg_id in batch:
                path = store.msg_path(state, msg_id)
                if not os.path.isdir(path):
                    continue  # moved or deleted since it was chosen
                try:
                    fields = store.read_msg(path)
                    for stale in ("dup", "dups"):  # S4.4: they told how the last run ended
                        fields.pop(stale, None)
                    fields["due"] = now
                    store.write_msg(path, fields, sync=False)
                    store.write_status(path, REQUEUED)
                    _, dirs = store.move_unsynced(msg_id, state, "que")
                except FileNotFoundError:
                    continue
                except ValueError:
                    continue  # unreadable: left where it is, as a single clone would
                except OSError as exc:
                    self.finish_requeue(state, moved, sync)
                    raise Stopped(len(moved), exc) from exc
                sync += [d for d in dirs if d not in sync]
                moved.append((msg_id, fields))
            self.finish_requeue(state, moved, sync)
            q.schedule()
        return len(moved)

    def finish_requeue(self, state: str, moved: list[tuple[str, dict[str, Any]]],
                       sync: list[str]) -> None:
        """Make the batch's renames durable, then index, count and log them (S13.1)."""
        q = self.state
        q.store.sync_dirs(sync)
        for msg_id, fields in moved:
            q.index.add_que(msg_id, fields["due"], fields)
            q.index.counts[state] = max(0, q.index.counts[state] - 1)
            q.events.log(msg_id, state, "que", status=REQUEUED, count=_count(fields))

    def purge_batch(self, state: str, batch: list[str]) -> int:
        q = self.state
        store = q.store
        hidden: list[tuple[str, str, str | None, int | None]] = []
        sync: list[str] = []
        if store.journal is not None:
            store.journal.settle_for(*batch)  # its syncfs outside the lock (rq.queue.journal)
        with q.lock:
            for msg_id in batch:
                path = store.msg_path(state, msg_id)
                if not os.path.isdir(path):
                    continue
                text, count = store.read_status_text(path), stored_count(store, path)
                try:
                    hidden.append((msg_id, store.hide(path), text, count))
                except FileNotFoundError:
                    continue
                except OSError as exc:
                    self.finish_purge(state, hidden, sync)
                    raise Stopped(len(hidden), exc) from exc
                if os.path.dirname(path) not in sync:
                    sync.append(os.path.dirname(path))
            self.finish_purge(state, hidden, sync)
        return len(hidden)

    def finish_purge(self, state: str, hidden: list[tuple[str, str, str | None, int | None]],
                     sync: list[str]) -> None:
        q = self.state
        q.store.sync_dirs(sync)
        for msg_id, path, text, count in hidden:
            q.index.counts[state] = max(0, q.index.counts[state] - 1)
            q.events.log(msg_id, state, "deleted", status=text, count=count)
        for _, path, _, _ in hidden:
            try:
                q.fs.rmtree(path)
            except OSError as exc:  # out of every state already; the next start retries
                log.warning("cannot remove %s: %s", path, exc)


def _args(data: Any) -> dict[str, Any]:
    return data if isinstance(data, dict) else {}


def _query(args: dict[str, Any]) -> tuple[dict[str, str], bool]:
    query = args.get("query") or {}
    if not isinstance(query, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in query.items()):
        raise Fail("invalid query")
    return query, args.get("exact") is True


def _batches(ids: Iterable[str]) -> Iterator[list[str]]:
    batch: list[str] = []
    for msg_id in ids:
        batch.append(msg_id)
        if len(batch) >= BATCH:
            yield batch
            batch = []
    if batch:
        yield batch


def _count(fields: dict[str, Any]) -> int | None:
    count = fields.get("count")
    return count if isinstance(count, int) and not isinstance(count, bool) else None


def stored_count(store: Any, path: str) -> int | None:
    """The message's `count` for its event (S13.3), None if unreadable."""
    try:
        return _count(store.read_msg(path))
    except (OSError, ValueError):
        return None
