"""Group commit of `create_message` requests (S7.3, S4.1, S0.3): the file
work of creates in flight together is done as one batch.

Owns the batch.  A request thread hands its fields to `create()`.  When no
other create is being committed it commits at once, itself (one client pays
no hand-off); otherwise it waits, and the next thread to lead takes every
create waiting by then.  A batch: each message is allocated (msg written and
fsynced in a spare, published as prep/ID: Store.allocate), the batch moves
prep → que, one fsync makes que/ durable, and only then are the messages
indexed, their events logged and one scheduler pass run (S5.1: a due message
with a free slot is in run/ before its reply).  A message whose own steps fail
gets its own `fail`; a failed fsync of que/ fails every message of the batch,
each put back in prep/ and removed, as a single create would.  No reply says
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
        item = _Item(fields)
        with self._cond:
            self._pending.append(item)
        while True:
            with self._cond:
                while self._leading and not item.finished:
                    self._cond.wait()
                if item.finished:
                    break
                self._leading = True
                batch, self._pending = self._pending[:MAX_BATCH], self._pending[MAX_BATCH:]
            try:
                results = self.commands.create_batch([(other.fields, None) for other in batch])
                for other, (msg_id, error) in zip(batch, results):
                    other.msg_id, other.error = msg_id, error
            except BaseException as exc:  # never leave a waiting request without an answer
                log.exception("create batch failed")
                for other in batch:
                    if other.error is None:
                        other.error = Fail(f"msg couldn't be created: {exc}")
            finally:
                with self._cond:
                    for other in batch:
                        other.finished = True
                    self._leading = False
                    self._cond.notify_all()
        if item.error is not None:
            raise item.error
        return item.msg_id
