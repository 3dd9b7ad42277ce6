"""Group commit of `create_message` requests (S7.3, S4.1, S0.3): the file
work of creates in flight together is done as one batch.

Owns the batch.  The socket's I/O thread hands the create_message requests
read in one pass to `create_many()` (rq.sockserve), single_que a request
thread's one to `create()`.  When no other create is being committed the
caller commits at once, itself (one client pays no hand-off); otherwise it
waits, and the next caller to lead takes every create waiting by then.
A batch: each message is allocated (msg written and fsynced in a spare,
published as prep/ID: Store.allocate), the batch moves prep → que, one fsync
makes que/ durable, and only then are the messages indexed, their events
logged and one scheduler pass run (S5.1: a due message with a free slot is in
run/ before its reply).  A message whose own steps fail gets its own `fail`;
a failed fsync of que/ fails every message of the batch, each put back in
prep/ and removed, as a single create would.  No reply says
ok before its message is durable.

Why: with a thread per connection and no batching, eight clients made eight
threads run the ~35 system calls of a create side by side, each call handing
the GIL to another thread (~180 futex calls per create under strace), and
que/ was fsynced once per create.

Creates made while holding the queue lock (cron, clone) keep calling
Commands.create directly: a batch takes that lock itself.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rq.errors import Fail

if TYPE_CHECKING:
    from rq.queue.commands import Commands

log = logging.getLogger(__name__)
MAX_BATCH = 64


@dataclass
class _Item:
    fields: dict[str, Any]
    finished: bool = False
    msg_id: str = ""
    error: Fail | None = None


class Committer:
    def __init__(self, commands: Commands) -> None:
        self.commands = commands
        self._cond = threading.Condition()
        self._pending: list[_Item] = []
        self._leading = False

    def create(self, fields: dict[str, Any]) -> str:
        """The id of the new message once it is durable in que/; Fail otherwise."""
        [outcome] = self.create_many([fields])
        if isinstance(outcome, Fail):
            raise outcome
        return outcome

    def create_many(self, many: list[dict[str, Any]]) -> list[str | Fail]:
        """create() for each of `many` (the socket's I/O thread hands over the
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
            self._commit(batch)
        return [item.error if item.error is not None else item.msg_id for item in items]

    def _commit(self, batch: list[_Item]) -> None:
        """Commit `batch` as the leader; every item ends finished."""
        try:
            results = self.commands.create_batch([(item.fields, None) for item in batch])
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
