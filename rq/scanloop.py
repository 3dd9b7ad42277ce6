"""The loop of a daemon that looks again at directories: timers (S10.3) and scandir (S11.4).

Owns: the loop (rq.loop) with the stop signals, SIGHUP and SIGUSR1; the lifeline (EOF: the
manager is gone, S2.1); the `ready` line; the DirWatcher; and when the next scan is due:
every `rescan` s, SETTLE s after a watchdog notification (the directory is the truth,
events only mean "look again", STYLE habit 3), and at once after SIGHUP.  A subclass
names itself (`role`) and does the scan (`scan`); `start`, `serve`, `close`, `work` and
`work_due` are its other hooks.  Signal handlers only wake the loop (STYLE habit 4).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Mapping

from rq import fsops
from rq.config import MainConfig
from rq.daemon import Context
from rq.dirwatch import DirWatcher
from rq.fsops import FsOps
from rq.loop import Loop
from rq.proc import ReadyPipe, lifeline_closed

log = logging.getLogger(__name__)

RESCAN = 10.0        # a full scan at least this often (S10.3, S11.4: <= 15 s)
SETTLE = 0.2         # after a notification, wait this long for the write to finish
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
SIGNALS = (*STOP_SIGNALS, signal.SIGHUP, signal.SIGUSR1)


def rescan_seconds(env: Mapping[str, str]) -> float:
    """Test seam: RQ_RESCAN_SECONDS overrides the periodic rescan (a huge
    value leaves only the watchdog notifications; S10.3, S11.4)."""
    try:
        value = float(env.get("RQ_RESCAN_SECONDS", ""))
    except ValueError:
        return RESCAN
    return value if 0 < value < float("inf") else RESCAN


class ScanLoop:
    role = "rq-scan"  # names the daemon in its log lines

    def __init__(self, config: MainConfig, fs: FsOps, *, lifeline_fd: int | None,
                 ready: ReadyPipe, rescan: float = RESCAN) -> None:
        self.root = config.root
        self.config = config
        self.fs = fs
        self.lifeline_fd = lifeline_fd
        self.ready = ready
        self.rescan = rescan
        self.loop = Loop(SIGNALS)
        self.stopping = False
        self.notified = threading.Event()
        self.scan_at = 0.0  # monotonic: the next scan
        self.watcher = DirWatcher(self.notify)

    @classmethod
    def run_from(cls, ctx: Context) -> int:
        """The `serve` of the daemon's DaemonSpec: built from what rq.daemon read."""
        return cls(ctx.config, fsops.from_environment(ctx.env), lifeline_fd=ctx.lifeline_fd,
                   ready=ctx.ready, rescan=rescan_seconds(ctx.env)).run()

    # ------------------------------------------------------------ hooks

    def scan(self, mono: float) -> None:
        """Look at the directories again (the loop thread)."""
        raise NotImplementedError

    def start(self, mono: float) -> None:
        """Before `ready`; nothing by default: the first scan comes with the first step."""

    def work(self) -> None:
        """After the scan in every step (timers: fire what is due)."""

    def work_due(self) -> float | None:
        """Seconds until `work` has something to do, or None."""
        return None

    def close(self) -> None:
        self.watcher.close()

    # ------------------------------------------------------------ main loop

    def run(self) -> int:
        if self.lifeline_fd is not None:
            self.loop.add_reader(self.lifeline_fd, self.on_lifeline)
        log.info("%s started, pid %d", self.role, os.getpid())
        try:
            self.start(time.monotonic())
            self.ready.send("ready")
            self.serve()
        finally:
            self.close()
        log.info("%s stopped", self.role)
        return 0

    def serve(self) -> None:
        while not self.stopping:
            self.run_once(self.next_timeout())

    def run_once(self, timeout: float | None, now: float | None = None) -> None:
        """wait -> signals -> scan if asked or due -> work."""
        for sig in self.loop.wait(timeout):
            self.handle_signal(sig)
        if self.stopping:
            return
        mono = time.monotonic() if now is None else now
        self.take_notification(mono)
        if mono >= self.scan_at:
            self.scheduled_scan(mono)
        self.work()

    def scheduled_scan(self, mono: float) -> None:
        self.scan_at = mono + self.rescan
        self.scan(mono)

    def next_timeout(self) -> float:
        mono = time.monotonic()
        self.take_notification(mono)
        wait = self.scan_at - mono
        due = self.work_due()
        return max(0.0, wait if due is None else min(wait, due))

    def take_notification(self, mono: float) -> None:
        """A notification moves the next scan to SETTLE s from now.  Also
        checked before every wait: the wake byte that came with it may have
        been drained by an earlier wait."""
        if self.notified.is_set():
            self.notified.clear()
            self.scan_at = min(self.scan_at, mono + SETTLE)

    def notify(self) -> None:
        """From watchdog's thread: something in a watched directory changed."""
        self.notified.set()
        self.loop.wake()

    def handle_signal(self, sig: int) -> None:
        if sig in STOP_SIGNALS:
            log.info("%s: %s, stopping", self.role, signal.Signals(sig).name)
            self.stopping = True
        elif sig == signal.SIGHUP:
            self.scan_at = 0.0  # look again now

    def on_lifeline(self, fd: int) -> None:
        if lifeline_closed(fd):  # the manager is gone (S2.1)
            self.loop.remove_reader(fd)
            os.close(fd)
            self.lifeline_fd = None
            log.info("%s: manager gone, stopping", self.role)
            self.stopping = True
