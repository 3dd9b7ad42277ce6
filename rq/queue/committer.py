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
import os
import threading
import time
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
    path: str = ""
    error: BaseException | None = None


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
                self._commit(batch)
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

    def _commit(self, batch: list[_Item]) -> None:
        cmds, q = self.commands, self.commands.q
        for item in batch:
            try:
                item.msg_id, item.path = cmds.allocate(item.fields, sync_prep=False)
            except Fail as exc:
                item.error = exc
        made = [item for item in batch if item.error is None]
        if not made:
            return
        moved: list[_Item] = []
        with q.lock:
            for item in made:
                try:
                    q.store.move(item.msg_id, "prep", "que", sync=False)
                except OSError as exc:
                    item.error = Fail(f"commit failed: {exc.strerror or exc}")
                    continue
                q.index.prep.discard(item.msg_id)
                moved.append(item)
        try:
            if moved:
                q.fs.fsync_dir_shared(q.store.state_dir("que"))
        except OSError as exc:
            with q.lock:  # not durable: back to prep, so the state matches the reply
                for item in moved:
                    item.error = Fail(f"commit failed: {exc.strerror or exc}")
                    try:
                        q.store.move(item.msg_id, "que", "prep", sync=False)
                        q.index.prep.add(item.msg_id)
                    except OSError:
                        log.error("commit of %s failed and could not be undone", item.msg_id)
            moved = []
        for item in made:
            if item.error is not None:
                cmds.discard_prep(item.msg_id, item.path)
        if not moved:
            return
        with q.lock:
            now = time.time()
            later = False
            for item in moved:
                fields = item.fields
                if item.msg_id not in q.index.que and os.path.isdir(
                        q.store.msg_path("que", item.msg_id)):  # not deleted meanwhile
                    q.index.add_que(item.msg_id, fields.get("due", 0), fields)
                q.events.log(item.msg_id, "prep", "que", count=fields.get("count"))
                later = later or float(fields.get("due", 0) or 0) > now
            q.schedule(now)
        if later:
            q.loop.wake()  # the loop's next wake-up may now be earlier
