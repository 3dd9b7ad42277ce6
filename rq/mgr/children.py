"""Supervised children: the record of one child and its states (SPEC S2.3).

Owns: the `State` enum, the one `transition()` that moves a child between
states (and rejects moves the supervisor must never make), the restart
policy (backoff min(2^(n-1), 30) s, n reset after 60 s of running, FATAL
after 10 consecutive failures) and the child side of the ready pipe
(`ready` -> RUNNING, `fatal <reason>` -> FATAL, or one failed start for a
child with `retry_fatal`).  It only records: it never spawns, signals or
reads a pipe (the supervisor does that through rq.proc) so every rule here
can be tested with plain numbers for `now`.

`now` is always `time.monotonic()`; `since` (shown by `status`, S7.2) is
wall-clock epoch seconds.
"""

from __future__ import annotations

import enum
import logging
import time
from dataclasses import dataclass, field

from rq.proc import Daemon
from rq.protocol import describe_exit

log = logging.getLogger(__name__)


class State(enum.Enum):
    STOPPED = "STOPPED"    # not running and not due to run: new, or stopped on request
    STARTING = "STARTING"  # spawned, has not written `ready` yet
    RUNNING = "RUNNING"
    BACKOFF = "BACKOFF"    # exited unexpectedly, waiting for its restart time
    STOPPING = "STOPPING"  # sent SIGTERM, not yet exited
    FATAL = "FATAL"        # given up on until restart_queue, a reload or a manager restart


S = State
# Every move the supervisor may make.  STOPPED is internal: a child reaches it
# only to be restarted or forgotten in the same pass, so `status` never shows it.
TRANSITIONS: dict[State, frozenset[State]] = {
    S.STOPPED: frozenset({S.STARTING, S.BACKOFF, S.FATAL}),
    S.STARTING: frozenset({S.RUNNING, S.BACKOFF, S.STOPPING, S.FATAL}),
    S.RUNNING: frozenset({S.BACKOFF, S.STOPPING, S.FATAL}),
    S.BACKOFF: frozenset({S.STARTING, S.BACKOFF, S.FATAL, S.STOPPED}),
    S.STOPPING: frozenset({S.STOPPED}),
    S.FATAL: frozenset({S.STARTING, S.BACKOFF, S.FATAL, S.STOPPING, S.STOPPED}),
}

# What happens once a stopping child has exited.  Higher wins when two stop
# requests meet (a delete is never undone by a restart).
AFTER_STOP_RANK = {"forget": 0, "restart": 1, "delete": 2}


@dataclass(frozen=True)
class Policy:
    """S2.3 restart rules and the S2.5 stop margin; tests shrink the times."""

    first_delay: float = 1.0
    max_delay: float = 30.0
    reset_after: float = 60.0   # running this long resets the failure count first
    fatal_after: int = 10       # consecutive failures that end in FATAL
    stop_margin: float = 10.0   # a queue is SIGKILLed kill_grace + this after SIGTERM

    def delay(self, failures: int) -> float:
        """Seconds before restart number `failures`: 1, 2, 4, 8, 16, 30, 30 ..."""
        return min(self.first_delay * 2 ** (failures - 1), self.max_delay)


class TransitionError(RuntimeError):
    """A move not in TRANSITIONS: a supervisor bug, never a user error."""


@dataclass(eq=False)
class Child:
    """One supervised daemon: `kind` (queue, web, scandir, timers), `name`
    (the queue name, or the kind for singletons) and the `argv` it runs."""

    kind: str
    name: str
    argv: list[str]
    state: State = State.STOPPED
    since: float = field(default_factory=time.time)
    failures: int = 0           # consecutive failed starts (n of S2.3)
    restarts: int = 0           # spawns after the first one
    error: str | None = None
    daemon: Daemon | None = None
    running_since: float = 0.0  # monotonic; when it last became RUNNING
    due: float = 0.0            # monotonic; BACKOFF: when to start it again
    stop_deadline: float = 0.0  # monotonic; STOPPING: when to SIGKILL it
    killed: bool = False        # SIGKILL already sent for this stop
    after_stop: str = "forget"
    hup_pending: bool = False   # a reload came while it was STARTING
    spawns: int = 0
    # False: `fatal` on the ready pipe is FATAL at once (a config that can never
    # work).  True: it is one failed start, with backoff (the web server once
    # up: its port may be free again soon).
    retry_fatal: bool = False
    fatal_reason: str | None = None  # a `fatal` line of this spawn, when retried
    _ready_buf: bytes = b""

    @property
    def label(self) -> str:
        return self.name if self.kind == self.name else f"{self.kind} {self.name}"

    @property
    def pid(self) -> int | None:
        return self.daemon.pid if self.daemon is not None else None

    # ------------------------------------------------------------ the one state mover

    def transition(self, new: State, now: float, *, error: str | None = None) -> None:
        """Move to `new`, stamping `since` and logging the change."""
        if new not in TRANSITIONS[self.state]:
            raise TransitionError(f"{self.label}: {self.state.value} -> {new.value}")
        old, self.state, self.since = self.state, new, time.time()
        if new is State.RUNNING:
            self.running_since, self.error = now, None
        elif error is not None:
            self.error = error
        why = f" ({error})" if error else ""
        log.info("%s: %s -> %s%s", self.label, old.value, new.value, why)

    # ------------------------------------------------------------ events

    def spawned(self, daemon: Daemon, now: float) -> None:
        self.daemon, self._ready_buf, self.hup_pending = daemon, b"", False
        self.killed, self.fatal_reason = False, None
        if self.spawns:
            self.restarts += 1
        self.spawns += 1
        self.transition(State.STARTING, now)

    def feed_ready(self, data: bytes) -> list[str]:
        """Complete lines read from the ready pipe (a line may arrive in pieces)."""
        self._ready_buf += data
        *lines, self._ready_buf = self._ready_buf.split(b"\n")
        return [line.decode("utf-8", "replace").strip() for line in lines]

    def ready_line(self, line: str, now: float) -> None:
        """`ready` -> RUNNING; `fatal <reason>` -> FATAL at once (S2.3)."""
        if self.state is not State.STARTING:
            return  # e.g. asked to stop before it came up
        word, _, reason = line.partition(" ")
        if word == "ready":
            self.transition(State.RUNNING, now)
        elif word == "fatal" and self.retry_fatal:
            self.fatal_reason = reason or "fatal start-up error"
            log.warning("%s: %s", self.label, self.fatal_reason)  # its exit is the failure
        elif word == "fatal":
            self.transition(State.FATAL, now, error=reason or "fatal start-up error")
        elif line:
            log.warning("%s: ignoring unknown ready-pipe line %r", self.label, line)

    def exited(self, returncode: int, now: float, policy: Policy) -> None:
        """Record the exit of the child's process and pick the next state."""
        text = self.fatal_reason or describe_exit(returncode)
        self.daemon, self.fatal_reason = None, None
        if self.state is State.STOPPING:
            self.transition(State.STOPPED, now)
        elif self.state is State.FATAL:
            log.info("%s: exited (%s), stays FATAL", self.label, text)
        else:
            if self.state is State.RUNNING and now - self.running_since >= policy.reset_after:
                self.failures = 0
            self.failed(text, now, policy)

    def failed(self, text: str, now: float, policy: Policy) -> None:
        """One more consecutive failure: BACKOFF, or FATAL when n reaches the limit."""
        self.failures += 1
        if self.failures >= policy.fatal_after:
            self.transition(State.FATAL, now, error=text)
            log.error("%s entered FATAL after %d failed starts", self.name, self.failures)
            return
        self.due = now + policy.delay(self.failures)
        self.transition(State.BACKOFF, now, error=text)
        log.info("%s: restarting in %g s (failure %d)", self.label,
                 policy.delay(self.failures), self.failures)

    def stop_requested(self, now: float, deadline: float, after: str) -> None:
        self.after_stop = after
        self.stop_deadline = deadline
        self.transition(State.STOPPING, now)

    def merge_after_stop(self, after: str) -> None:
        if AFTER_STOP_RANK[after] > AFTER_STOP_RANK[self.after_stop]:
            self.after_stop = after

    def reset_failures(self) -> None:
        self.failures = 0

    def describe(self) -> dict[str, object]:
        """The CHILD object of the `status` reply (S7.2)."""
        state = self.state if self.state is not State.STOPPED else State.STOPPING
        return {"state": state.value, "pid": self.pid, "restarts": self.restarts,
                "since": round(self.since, 3), "error": self.error}
