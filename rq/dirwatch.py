"""Filesystem notifications for the scan-directory daemons (SPEC S10.3, S11.4).

Owns a watchdog Observer over a changing set of directories (non-recursive)
and turns every event that can change what a scan sees into one call of
`wake` (normally `Loop.wake`, safe from watchdog's threads).  It never scans
anything itself: events only mean "look again" (STYLE habit 3), and the
daemons rescan on a timer as well, so a missed or failed watch costs at most
one rescan period.  Used by rq.timers and rq.scandir, which must not import
each other.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable

from watchdog.events import FileSystemEvent, FileSystemEventHandler
from watchdog.observers import Observer
from watchdog.observers.api import ObservedWatch

log = logging.getLogger(__name__)

# Reading a file is no change: without this, a scan that opens the files of a
# watched directory would wake itself forever.
IGNORED_EVENTS = frozenset({"opened", "closed_no_write"})


class _Waker(FileSystemEventHandler):
    def __init__(self, wake: Callable[[], None]) -> None:
        self.wake = wake

    def on_any_event(self, event: FileSystemEvent) -> None:
        if event.event_type not in IGNORED_EVENTS:
            self.wake()


class DirWatcher:
    """Watch exactly the directories last given to `watch`; call `wake` on change."""

    def __init__(self, wake: Callable[[], None]) -> None:
        self.handler = _Waker(wake)
        self.observer = Observer()
        self.observer.daemon = True
        self.watches: dict[str, tuple[int, ObservedWatch]] = {}  # path -> (inode, watch)
        self.started = False

    def watch(self, dirs: Iterable[str]) -> None:
        """Add watches for new directories and drop those no longer wanted.
        A directory that cannot be watched (gone, no permission, out of
        inotify watches) is skipped with a debug line: the rescan covers it."""
        wanted: dict[str, int] = {}
        for path in set(dirs):
            try:
                wanted[path] = os.stat(path).st_ino
            except OSError:
                pass
        for path in sorted(self.watches):
            # A directory removed and made again has a new inode and a dead watch.
            if wanted.get(path) != self.watches[path][0]:
                self._unwatch(path)
        for path in sorted(set(wanted) - set(self.watches)):
            try:
                watch = self.observer.schedule(self.handler, path, recursive=False)
            except (OSError, RuntimeError) as exc:
                log.debug("cannot watch %s: %s", path, exc)
                continue
            self.watches[path] = (wanted[path], watch)
        if not self.started:
            self.observer.start()
            self.started = True

    def _unwatch(self, path: str) -> None:
        _, watch = self.watches.pop(path)
        try:
            self.observer.unschedule(watch)
        except (KeyError, OSError, RuntimeError):
            pass  # its directory is gone and the emitter already stopped

    def close(self) -> None:
        if self.started:
            self.observer.stop()
            self.observer.join(5)
