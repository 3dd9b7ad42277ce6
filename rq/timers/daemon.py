"""The timers daemon's loop and IO (SPEC S10, S7.2 `timers` / `timers_status`).

Owns: scanning `timers/` (when rq.scanloop, its loop, says a scan is due),
firing due timers with `create_message` on the target queue's socket,
`config/timers.state.json` (written atomically after every fire), the
`sent` / `errors` counters, and the small rq1 server at `config/timers.sock`
through which the manager answers its `timers` and `timers_status` commands
(rq.mgr.timercmds forwards them).  Due-time rules live in rq.timers.schedule.

Threads: the loop thread does all the work; socket threads only read a
snapshot under `lock`.  Signal handlers only wake the loop (rq.scanloop).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from typing import Any

from rq import protocol
from rq.client import call_mgr, call_queue
from rq.config import MainConfig
from rq.errors import ConnectError
from rq.fsops import FsOps
from rq.proc import ReadyPipe
from rq.scanloop import RESCAN, ScanLoop
from rq.sockserve import Rq1Server
from rq.timers.schedule import (
    Found,
    ScanResult,
    TimerError,
    Timetable,
    message_for,
    parse_state,
    parse_timer,
    stat_key,
    timer_name,
)

log = logging.getLogger("rq.timers")

FIRE_TIMEOUT = 10.0  # seconds a create_message may take
QUEUES_GRACE = 30.0  # at start, wait this long at most for queues to leave STARTING


def timers_socket(root: str) -> str:
    """The daemon's socket; rq.mgr.timercmds connects to the same path."""
    return os.path.join(root, "config", "timers.sock")


def state_path(root: str) -> str:
    return os.path.join(root, "config", "timers.state.json")


def load_state(root: str) -> dict[str, tuple[float, str]]:
    try:
        with open(state_path(root), encoding="utf-8") as f:
            return parse_state(json.load(f))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        log.warning("ignoring unreadable config/timers.state.json: %s", exc)
        return {}


def read_timer(path: str, name: str) -> Found | None:
    """One entry of timers/: None unless it resolves to a regular file (S10.1)."""
    try:
        st = os.stat(path)
    except OSError:
        return None  # e.g. a dangling symlink: not a timer
    if not os.path.isfile(path):
        return None
    key = stat_key(st)
    try:
        with open(path, encoding="utf-8") as f:
            return Found(name, key, spec=parse_timer(json.load(f, parse_constant=_no_nan)))
    except (OSError, ValueError) as exc:  # UnicodeDecodeError and JSON errors too
        return Found(name, key, error=f"cannot read timer file: {exc}")
    except TimerError as exc:
        return Found(name, key, error=str(exc))


def _no_nan(word: str) -> Any:
    raise ValueError(f"{word} is not plain JSON")  # S0.3.5: it could not be sent on


class TimersDaemon(ScanLoop):
    role = "rq-timers"

    def __init__(self, config: MainConfig, fs: FsOps, *, lifeline_fd: int | None,
                 ready: ReadyPipe, rescan: float = RESCAN) -> None:
        super().__init__(config, fs, lifeline_fd=lifeline_fd, ready=ready, rescan=rescan)
        self.timers_dir = os.path.join(self.root, "timers")
        self.table = Timetable(load_state(self.root))
        self.lock = threading.Lock()  # guards table reads from socket threads and counters
        self.sent = 0
        self.errors = 0
        self.saved_state: dict[str, Any] | None = None
        self.dir_problem: str | None = None  # logged once until it changes
        self.server = Rq1Server(timers_socket(self.root), self.handle)

    # ------------------------------------------------------------ the ScanLoop hooks

    def start(self, mono: float) -> None:
        """The socket, and every timer known before `ready`."""
        self.server.start()
        self.scheduled_scan(mono)

    def serve(self) -> None:
        self.wait_for_queues()
        super().serve()

    def work(self) -> None:
        self.fire_due(time.time())

    def work_due(self) -> float | None:
        due = self.table.next_due()
        return None if due is None else due - time.time()

    def close(self) -> None:
        super().close()
        self.server.close()

    def wait_for_queues(self) -> None:
        """S2.2 step 6 starts us right after the queue processes: give them
        up to QUEUES_GRACE s to leave STARTING before the first fires, so a
        timer due at once does not hit a queue that is still recovering."""
        deadline = time.monotonic() + QUEUES_GRACE
        while not self.stopping and time.monotonic() < deadline:
            try:
                reply = call_mgr(self.root, "status", timeout=5.0)
            except ConnectError:
                return  # run by hand, or the manager is gone (the lifeline tells)
            if not (isinstance(reply, list) and reply[:1] == ["ok"]):
                return
            queues = reply[1].get("queues", {}) if isinstance(reply[1], dict) else {}
            if not any(isinstance(c, dict) and c.get("state") == "STARTING"
                       for c in queues.values()):
                return
            for sig in self.loop.wait(0.2):
                self.handle_signal(sig)

    # ------------------------------------------------------------ scanning (S10.1-S10.3, S10.7)

    def scan(self, mono: float) -> None:
        try:
            entries = sorted(os.listdir(self.timers_dir))
        except OSError as exc:  # keep what we have: a missing dir is no removal of timers
            if self.dir_problem != str(exc):
                log.warning("cannot read timers/: %s", exc.strerror or exc)
            self.dir_problem = str(exc)
            self.watcher.watch([])
            return
        self.dir_problem = None
        found, targets = [], {self.timers_dir}
        for entry in entries:
            name = timer_name(entry)
            path = os.path.join(self.timers_dir, entry)
            item = read_timer(path, name) if name is not None else None
            if item is not None:
                found.append(item)
                targets.add(os.path.dirname(os.path.realpath(path)))
        with self.lock:
            result = self.table.update(found, time.time())
            self.errors += len(result.rejected)
        self.report(result)
        self.watcher.watch(targets)  # symlinked files change where they live
        self.save_state()

    def report(self, result: ScanResult) -> None:
        for name, reason in result.rejected:
            log.error("timer %s: rejected timers/%s.json: %s", name, name, reason)
        for what, names in (("new", result.added), ("changed", result.changed),
                            ("restored", result.restored), ("removed", result.removed)):
            for name in names:
                log.info("timer %s: %s", name, what)

    # ------------------------------------------------------------ firing (S10.4, S10.6)

    def fire_due(self, now: float) -> None:
        for timer in self.table.due(now):
            ok = self.fire(timer.name, message_for(timer.spec))
            with self.lock:
                self.table.fired(timer.name, time.time())
                if ok:
                    self.sent += 1
                else:
                    self.errors += 1
            self.save_state()

    def fire(self, name: str, msg: dict[str, Any]) -> bool:
        dest = msg["dest"]
        queue = protocol.dest_queue_name(dest, self.config.relative_root)
        if not protocol.valid_queue_name(queue):
            log.error("timer %s: cannot send to %s: invalid queue name", name, dest)
            return False
        try:
            reply = call_queue(self.root, queue, "create_message", msg, timeout=FIRE_TIMEOUT)
        except ConnectError as exc:
            log.error("timer %s: cannot send to queue %s: %s", name, queue, exc)
            return False
        if isinstance(reply, list) and len(reply) == 2 and reply[0] == "ok":
            log.info("timer %s: sent %s", name, reply[1])
            return True
        log.error("timer %s: queue %s refused the message: %s", name, queue,
                  protocol.dumps(reply))
        return False

    def save_state(self) -> None:
        """S10.5, written atomically and only when it changed."""
        with self.lock:
            state = self.table.state()
        if state == self.saved_state:
            return
        data = (json.dumps(state, indent=2, sort_keys=True) + "\n").encode()
        try:
            self.fs.write_file_atomic(state_path(self.root), data)
        except OSError as exc:
            log.error("cannot write config/timers.state.json: %s", exc.strerror or exc)
            return
        self.saved_state = state

    # ------------------------------------------------------------ socket (socket threads)

    def handle(self, cmd: str, arg: str | None, conn: socket.socket) -> Any:
        if cmd == "ping":
            return ["pong"]
        with self.lock:
            if cmd == "timers":
                return ["ok", self.table.listing()]
            if cmd == "timers_status":
                return ["ok", {"sent": self.sent, "errors": self.errors}]
        return ["error"]
