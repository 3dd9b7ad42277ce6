"""The queue process's side of cron schedules (SPEC S9.2, S9.3): the IO around `rq.cron.plan`.

Owns `queue/NAME/cron.state.json`: loaded once at start, rewritten atomically
and durably through `fsops` whenever it changes (keys of removed entries
dropped, new entries added).  For every fire the new `last_fire` is on disk
BEFORE the message is created, so a crash can skip a slot but never fire it
twice; the message's id is recorded afterwards.  Runs in the queue's loop
thread with the queue's lock held; the messages are created through the
enqueue path, as `create_message` does (so a due message on an UP queue
starts at once).  rq.cron (croniter, zoneinfo: ~60 ms CPU) is imported only by a queue with
a schedule or a tracking state (issue 14 section 4); the fork server preloads it.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from typing import Any

from rq import message
from rq.errors import Fail
from rq.queue.state import QueueState

TYPE_CHECKING = False
if TYPE_CHECKING:
    from rq import cron

log = logging.getLogger(__name__)
STATE_FILE = "cron.state.json"


class Cron:
    """Tracking state and firing for one queue process."""

    def __init__(self, queue: QueueState, create: Callable[[dict[str, Any]], str]) -> None:
        self.queue = queue
        self.create_message = create        # Enqueue.create: durable in que/ on return
        self.path = os.path.join(queue.store.qdir, STATE_FILE)
        self.state = load_state(self.path)
        self.on_disk = dict(self.state)
        self.wake_at: float | None = 0.0  # when the next slot enters the window; 0: at once
        self.active: bool | None = None    # last pass's decision, logged when it changes

    def run_pass(self, now: float) -> None:
        """S9.3 for one scheduler pass; the caller holds the queue's lock."""
        q = self.queue
        if not q.cfg.schedule and not self.state:  # the common case: no schedule at all
            self.wake_at = None
            return
        from rq import cron
        entries = [cron.Entry.from_config(e) for e in q.cfg.schedule]
        active = not q.stopping and q.admin_status() == "UP"  # UP or SCRIPTERROR (S3.5)
        decided = cron.plan(q.name, entries, self.state, active, now)
        self.wake_at = decided.wake_at
        if entries and active != self.active:
            log.info("cron: %d schedule entr%s %s", len(entries),
                     "y" if len(entries) == 1 else "ies",
                     "active" if active else f"waiting while {self.status_text()}")
        self.active = active if entries else None
        if not active:
            return
        self.state = decided.base
        for action in decided.actions:
            previous = self.state[action.key]
            self.state[action.key] = cron.Track(action.last_fire, previous.last_msg_id)
            if not self.save():  # not durable: no message; the same slot is retried later
                self.state[action.key] = previous
                self.wake_at = now + 1
                return
            if action.message is not None:
                msg_id = self.create(action)
                if msg_id is not None:
                    self.state[action.key] = cron.Track(action.last_fire, msg_id)
        self.save()

    def status_text(self) -> str:
        return "stopping" if self.queue.stopping else self.queue.admin_status()

    def create(self, action: cron.Action) -> str | None:
        """Create the message of `action`; its short id, or None (logged) on failure."""
        if action.message is None:
            return None
        try:
            fields = message.normalize_input(action.message, action.message["due"])
            msg_id = self.create_message(fields)
        except (Fail, OSError) as exc:
            log.error("cron %s: slot %d skipped, message not created: %s",
                      action.key, action.last_fire, exc)
            return None
        log.info("cron %s: %s message %s (due %s)", action.key, action.kind, msg_id,
                 action.message["due"])
        return msg_id

    def save(self) -> bool:
        """Write the state when it differs from the file; False when that failed."""
        if self.state == self.on_disk:
            return True
        try:
            from rq import cron
            self.queue.fs.write_file_atomic(self.path, cron.dump_state(self.state), sync=True)
        except OSError as exc:
            log.error("cannot write %s: %s", STATE_FILE, exc)
            return False
        self.on_disk = dict(self.state)
        return True


def load_state(path: str) -> dict[str, cron.Track]:
    """The tracking state on disk; a missing or unreadable file is an empty state
    (every entry is then seen for the first time: no past slot fires)."""
    try:
        with open(path, "rb") as fh:
            data = json.loads(fh.read())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        log.warning("ignoring unreadable %s: %s", STATE_FILE, exc)
        return {}
    from rq import cron
    return cron.parse_state(data)
