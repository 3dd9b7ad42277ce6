"""The event loop every daemon runs: a selector, the signal wakeup fd, and a
wake pipe other threads use to ask for a pass (STYLE habits 4 and 5).

Signal handlers do nothing but let Python write the signal number to the
wakeup fd; the loop reads the numbers and hands them to the daemon's own
`handle_<signal>` methods in normal code.
"""

from __future__ import annotations

import os
import selectors
import signal
from collections.abc import Callable, Iterable
from typing import Any

Callback = Callable[[int], None]


class Loop:
    def __init__(self, signals: Iterable[int] = ()) -> None:
        self.selector = selectors.DefaultSelector()
        self._sig_r, self._sig_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self.selector.register(self._sig_r, selectors.EVENT_READ, None)
        self.selector.register(self._wake_r, selectors.EVENT_READ, None)
        signal.set_wakeup_fd(self._sig_w, warn_on_full_buffer=False)
        for sig in signals:
            signal.signal(sig, _noop)

    def add_reader(self, fd: int, callback: Callback) -> None:
        self.selector.register(fd, selectors.EVENT_READ, callback)

    def remove_reader(self, fd: int) -> None:
        try:
            self.selector.unregister(fd)
        except (KeyError, ValueError):
            pass

    def wake(self) -> None:
        """Ask the loop for a pass; safe from any thread."""
        try:
            os.write(self._wake_w, b"w")
        except BlockingIOError:
            pass  # a wake is already pending

    def wait(self, timeout: float | None) -> list[int]:
        """Wait for IO, a signal or a wake; run reader callbacks; return the
        signals received, in order."""
        got: list[int] = []
        for key, _ in self.selector.select(timeout):
            if key.fd == self._sig_r:
                got.extend(_drain(self._sig_r))
            elif key.fd == self._wake_r:
                _drain(self._wake_r)
            elif key.data is not None:
                key.data(key.fd)
        return got


def _noop(signum: int, frame: Any) -> None:
    """A handler must exist for the wakeup fd to see the signal; it does nothing."""


def _drain(fd: int) -> list[int]:
    out: list[int] = []
    while True:
        try:
            data = os.read(fd, 512)
        except BlockingIOError:
            return out
        if not data:
            return out
        out.extend(data)
