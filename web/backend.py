"""How the web server reaches RQ: the manager and queue sockets of one root,
and read-only looks at the store (SPEC S14.6, STYLE habit 2: the web reads the
store directly and asks the owning process for every change).
"""

from __future__ import annotations

import os
import time
from typing import Any

from rq import client, protocol
from rq.errors import ConnectError
from rq.store import Store

PING_TTL = 1.0
BUILTIN = ("analytics", "cleaner", "relay", "rq_router", "webhook")  # S3.8, listed after the others


class Backend:
    def __init__(self, root: str) -> None:
        self.root = root
        self._alive_until = 0.0

    def mgr(self, cmd: str, arg: Any = None, *, raw: bool = False,
            timeout: float = 30.0) -> Any:
        """The manager's reply, or None when it does not answer."""
        try:
            return client.call_mgr(self.root, cmd, arg, raw=raw, timeout=timeout)
        except ConnectError:
            return None

    def mgr_alive(self) -> bool:
        """Whether rq-mgr answers `ping` (S14.6).  A positive answer is trusted
        for PING_TTL seconds, so a busy API does not ping once per request; a
        negative one is never cached, so recovery shows at once."""
        now = time.monotonic()
        if now < self._alive_until:
            return True
        alive = self.mgr("ping", timeout=5.0) == ["pong"]
        self._alive_until = now + PING_TTL if alive else 0.0
        return alive

    def queue(self, name: str, cmd: str, arg: Any = None, timeout: float = 60.0) -> Any:
        """The queue's reply; raises ConnectError when its process does not answer."""
        return client.call_queue(self.root, name, cmd, arg, timeout=timeout)

    def queue_exists(self, name: str) -> bool:
        return protocol.valid_queue_name(name) and \
            os.path.isfile(os.path.join(self.root, "queue", name, "config.json"))

    def queue_names(self) -> list[str]:
        """Known queues, non-builtin first, each group sorted (S15.1)."""
        base = os.path.join(self.root, "queue")
        try:
            names = [n for n in os.listdir(base) if self.queue_exists(n)]
        except OSError:
            names = []
        return sorted(names, key=lambda n: (n in BUILTIN, n))

    def store(self, name: str) -> Store:
        return Store(self.root, name)
