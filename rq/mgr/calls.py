"""Calls handed from the manager's socket threads to its loop thread (SPEC S7.2).

Owns: the queue of pending calls and their answers.  A socket thread calls
`call_in_loop(func, *args)`, which wakes the loop and waits for the result (or
the exception) of `func(*args)` run by the loop's `run_pending`; so only the
loop thread ever touches the children table and it needs no locks.  Once
`close`d, calls fail with `rq-mgr is stopping`.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from rq.errors import Fail

REQUEST_TIMEOUT = 30.0   # how long a socket thread waits for the loop


class LoopCalls:
    def __init__(self, wake: Callable[[], None], timeout: float = REQUEST_TIMEOUT) -> None:
        self.wake = wake
        self.timeout = timeout
        self._pending: queue.SimpleQueue[tuple[Callable[..., Any], tuple[Any, ...],
                                               Future[Any]]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._closed = False

    def call_in_loop(self, func: Callable[..., Any], *args: Any) -> Any:
        """Run `func(*args)` in the loop thread and return its result."""
        future: Future[Any] = Future()
        with self._lock:
            if self._closed:
                raise Fail("rq-mgr is stopping")
            self._pending.put((func, args, future))
        self.wake()
        try:
            return future.result(self.timeout)
        except TimeoutError:
            raise Fail("rq-mgr is busy") from None

    def run_pending(self) -> None:
        """In the loop thread: answer every call queued so far."""
        while True:
            try:
                func, args, future = self._pending.get_nowait()
            except queue.Empty:
                return
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(func(*args))
            except Exception as exc:  # noqa: BLE001 -- re-raised in the asking thread
                future.set_exception(exc)

    def close(self) -> None:
        """Refuse new calls, then answer whatever is still queued."""
        with self._lock:
            self._closed = True
        self.run_pending()
