"""The manager's `timers` and `timers_status` commands (SPEC S7.2, S10.8).

The timers daemon (rq.timers) owns the timers and their counters; it serves
them on `config/timers.sock` and these handlers forward the request there, so
the reply is always live.  Run in the manager's socket threads; they never
touch the children table.  While the timers daemon does not answer (not
started yet, BACKOFF, FATAL) the reply is `["fail","timers not running"]`.
"""

from __future__ import annotations

import os
from typing import Any

from rq.client import call
from rq.errors import ConnectError

TIMEOUT = 5.0
NOT_RUNNING = ["fail", "timers not running"]


def timers_socket(root: str) -> str:
    """Must equal rq.timers.daemon.timers_socket (daemons do not import each other)."""
    return os.path.join(root, "config", "timers.sock")


def forward(root: str, cmd: str, shape: type) -> list[Any]:
    try:
        reply = call(timers_socket(root), cmd, timeout=TIMEOUT)
    except ConnectError:
        return NOT_RUNNING
    if isinstance(reply, list) and len(reply) == 2 and reply[0] == "ok" \
            and isinstance(reply[1], shape):
        return reply
    return NOT_RUNNING


def timers(root: str) -> list[Any]:
    """`["ok", [[name, due_epoch], ...]]` sorted by due."""
    return forward(root, "timers", list)


def timers_status(root: str) -> list[Any]:
    """`["ok", {"sent": n, "errors": n}]`."""
    return forward(root, "timers_status", dict)
