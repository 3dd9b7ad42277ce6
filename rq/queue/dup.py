"""The `dup` pipe command (SPEC S6.5): copy a running message to another queue.

Owns choosing the target queue, building the copy's fields, and the exact
reply line written back to the job on fd 4.  It talks to the target queue
over its socket (even when the target is this queue), from a helper thread,
so the queue process's loop never blocks on it.
"""

from __future__ import annotations

import os
import time
from typing import Any

from rq import client, protocol
from rq.config import MainConfig
from rq.errors import RQError
from rq.fsops import is_regular

# A target rq-mgr reports as STARTING or BACKOFF is on its way up (all queues of a root start
# together, so after a restart a re-run job may dup to a queue that is not listening yet):
# the copy waits for it this long before `fail couldn't connect`.  RUNNING counts too: the
# target may have come up between the failed ping and the status (a test saw it once in 90
# runs), so it is pinged again.  A target nobody is starting (no manager, stopped, FATAL)
# fails at once, as S6.5 says.
START_GRACE = 15.0
START_POLL = 0.2
COMING_UP = frozenset({"STARTING", "BACKOFF", "RUNNING"})

COPIED = ("orig_msg_id", "max_count", "src", "param1", "param2", "param3", "param4",
          "post_run_webhook")


def target_queue(newdest: str, root_prefix: str) -> str:
    return protocol.dest_queue_name(newdest, root_prefix)


def copy_fields(fields: dict[str, Any], newdest: str, due_secs: float, now: float) -> dict:
    copy = {k: fields[k] for k in COPIED if k in fields}
    copy.update(dest=newdest, count=0, due=round(now + due_secs, 3))
    return copy


def make_dup(main: MainConfig, own: str, fields: dict[str, Any], path: str,
             due_secs: float, newdest: str) -> str:
    """Do the dup and return the reply line for fd 4 (without newline)."""
    name = target_queue(newdest, main.relative_root)
    copy = copy_fields(fields, newdest, due_secs, time.time())
    if not protocol.valid_queue_name(name) or not wait_listening(main.root, name):
        return f"fail couldn't connect to queue - {name}"
    attach_dir = os.path.join(path, "attach")
    names = sorted(n for n in os.listdir(attach_dir) if not n.startswith(".")
                   and not n.endswith(".tmp") and is_regular(os.path.join(attach_dir, n))
                   ) if os.path.isdir(attach_dir) else []
    try:
        if not names:
            return _reply(client.call_queue(main.root, name, "create_message", copy), "")
        return _with_attachments(main, name, copy, attach_dir, names)
    except RQError:
        return f"fail couldn't connect to queue - {name}"


def listening(root: str, name: str) -> bool:
    """Whether queue `name` answers a ping on its socket."""
    try:
        return client.call(client.queue_socket(root, name), "ping", timeout=5) == ["pong"]
    except RQError:
        return False


def coming_up(root: str, name: str) -> bool:
    """Whether this root's rq-mgr is starting queue `name` (STARTING or BACKOFF) or has just
    started it (RUNNING: it may have come up since the ping that failed)."""
    try:
        reply = client.call(client.mgr_socket(root), "status", timeout=5)
        child = reply[1]["queues"].get(name) if reply[0] == "ok" else None
    except (RQError, LookupError, TypeError, AttributeError):
        return False
    return isinstance(child, dict) and child.get("state") in COMING_UP


def wait_listening(root: str, name: str) -> bool:
    """True once the target answers; waits up to START_GRACE only while rq-mgr says it is
    coming up (or up).  Runs on the job's helper thread (or a consumer's request), never the
    loop."""
    deadline = time.monotonic() + START_GRACE
    while not listening(root, name):
        if time.monotonic() >= deadline or not coming_up(root, name):
            return False
        time.sleep(START_POLL)
    return True


def _with_attachments(main: MainConfig, name: str, copy: dict, attach_dir: str,
                      names: list[str]) -> str:
    reply = client.call_queue(main.root, name, "prep_message", copy)
    if not _ok(reply):
        return _reply(reply, "prep fail ")
    full = reply[1]
    for att in names:
        r = client.call_queue(main.root, name, "attach_message",
                              {"msg_id": full, "pathname": os.path.join(attach_dir, att),
                               "name": att})
        if not _ok(r):
            return _reply(r, "attach fail ")
    r = client.call_queue(main.root, name, "commit_message", {"msg_id": full})
    if not _ok(r):
        return _reply(r, "commit fail ")
    return f"ok {full}"


def _ok(reply: Any) -> bool:
    return isinstance(reply, list) and len(reply) >= 2 and reply[0] == "ok"


def _reply(reply: Any, step: str) -> str:
    if _ok(reply):
        return f"ok {reply[1]}"
    reason = reply[1] if isinstance(reply, list) and len(reply) > 1 else protocol.dumps(reply)
    if reason == "status: DOWN":
        step = ""  # the target refused as a whole: `fail dup failed - status: DOWN` (S6.5)
    return f"fail dup failed - {step}{reason}"
