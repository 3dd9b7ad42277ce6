"""Long-lived requests (SPEC S14.1, issue 13 D1): event streams (S8.8, route 31),
log streams (S17.2, route 23b) and reserves that wait (S8.2, route 30).

Owns the count of those requests in flight.  rq-web runs waitress with
`--threads` workers for short requests plus LONG_SLOTS more (web.__main__); a
long request holds a slot for its whole life or, when none is free, is answered
at once with `503 - Too many long requests` and `Retry-After`.  So at most
LONG_SLOTS workers ever wait on a stream or a long poll, and short requests
(`/`, `/q.json`) always find a free one.  Each long request also ends within
about a second of its client leaving: streams look at waitress's
`client_disconnected` at every turn, and a reserve waits in slices (web.consumer).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

TYPE_CHECKING = False  # Flask is imported at the first request (web.__main__.LazyApp)
if TYPE_CHECKING:
    from flask import Flask

LONG_SLOTS = 64     # app.config["RQ_LONG_SLOTS"] (rq-web --long-requests) overrides it
RETRY_AFTER = 5     # seconds, in the 503 of a request that found no slot
BUSY = "Too many long requests"


class LongSlots:
    """A counter with a ceiling, shared by the worker threads."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.in_use = 0
        self._lock = threading.Lock()

    def take(self) -> bool:
        with self._lock:
            if self.in_use >= self.limit:
                return False
            self.in_use += 1
            return True

    def give_back(self) -> None:
        with self._lock:
            self.in_use -= 1


def install(app: Flask) -> None:
    app.extensions["rq_long_slots"] = LongSlots(int(app.config.get("RQ_LONG_SLOTS",
                                                                  LONG_SLOTS)))


def take_long_slot() -> Callable[[], None]:
    """A slot for this request, or 503 with Retry-After; returns the function that
    gives it back (calling it again does nothing)."""
    from flask import current_app

    from .errors import fail
    slots: LongSlots = current_app.extensions["rq_long_slots"]
    if not slots.take():
        fail(503, BUSY, {"Retry-After": str(RETRY_AFTER)})
    once = threading.Lock()

    def release() -> None:
        if once.acquire(blocking=False):
            slots.give_back()
    return release


class HeldBody:
    """A streamed body that gives its slot back when the server closes it (the
    client left, the stream ended, or it was never sent).  A class rather than
    Response.call_on_close: a direct_passthrough body is handed to the server as
    it is, so the Response's own close is never called."""

    def __init__(self, body: Iterator[bytes], release: Callable[[], None]) -> None:
        self.body = body
        self.release = release

    def __iter__(self) -> Iterator[bytes]:
        return self.body

    def close(self) -> None:
        try:
            close = getattr(self.body, "close", None)
            if close is not None:
                close()
        finally:
            self.release()
