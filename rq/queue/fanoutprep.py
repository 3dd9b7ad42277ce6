"""The queue's side of a fan-out (issue 18 item 2, docs/guide/fanout.md): one copy
of a message under the short id rq-mgr chose, made in prep/, then committed or removed.

Owns the three commands the manager's fan-out (rq.mgr.fanout) sends each target queue:
* `fanout_prep {"msg_id": SHORT, "msg": {fields}}`: the fields as `create_message`
  takes them (S4.4), allocated as `prep/SHORT` (S4.1) and durable with prep/ before
  `["ok", FULL_ID]`; an id held by a message in any state → `["fail","msg id taken"]`.
* `fanout_commit {"msg_id"}`: `commit_message` (S7.3: prep → que, idempotent).
* `fanout_abort {"msg_id"}`: removes the copy only while it is in prep →
  `["ok","msg deleted"]`, `["ok","msg not found"]`, else `["fail","msg not in prep"]`.
Commit and abort finish a fan-out this queue already took part in, so they are answered
while the queue is DOWN too (S3.5): a journal never waits on an operator.  This module
never moves a message itself: Enqueue allocates and commits, `delete_message` removes.
"""

from __future__ import annotations

import time
from typing import Any, Protocol

from rq import protocol
from rq.errors import Fail
from rq.queue.enqueue import Enqueue
from rq.queue.state import QueueState

FINISHING = frozenset({"fanout_commit", "fanout_abort"})  # answered while DOWN


class Commands(Protocol):
    """What this module uses of rq.queue.commands.Commands (which imports it)."""
    state: QueueState
    enqueue: Enqueue

    def new_fields(self, data: Any, now: float) -> dict[str, Any]: ...
    def msg_id(self, data: Any) -> str: ...
    def cmd_delete_message(self, data: Any) -> Any: ...


def prep(cmds: Commands, data: Any) -> Any:
    msg_id = data.get("msg_id") if isinstance(data, dict) else None
    if not isinstance(msg_id, str) or not protocol.valid_msg_id(msg_id):
        raise Fail("lacking 'msg_id' field" if msg_id in (None, "") else "invalid msg_id")
    fields = cmds.new_fields(data.get("msg"), time.time())
    if cmds.state.store.locate(msg_id) is not None:
        raise Fail("msg id taken")
    cmds.enqueue.allocate(fields, sync_prep=True, msg_id=msg_id, exact=True)
    return ["ok", cmds.state.full_id(msg_id)]


def abort(cmds: Commands, data: Any) -> Any:
    msg_id = cmds.msg_id(data)
    with cmds.state.lock:  # an RLock: delete_message takes it again
        found = cmds.state.store.locate(msg_id)
        if found is None:
            return ["ok", "msg not found"]
        if found[0] != "prep":
            return ["fail", "msg not in prep"]
        return cmds.cmd_delete_message(data)
