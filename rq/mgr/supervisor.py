"""The supervisor: the `rq-mgr` daemon's Manager (SPEC S2.1-S2.5).

Owns: the pid file and the manager socket of a root, the table of supervised children (one
queue process per queue directory, started through rq.mgr.spawner, and the singleton services
of rq.mgr.programs: web, scandir, timers), the start-up order (host limits first, issue 17;
then the web server: a `fatal` line from it fails start-up, S2.2 step 4), the main loop,
signals (SIGTERM/SIGINT graceful stop, SIGHUP reload), reaping (orphans too, as a subreaper),
restarts with backoff, graceful stop with a SIGKILL deadline, and the queue directory
operations that need a stopped queue (delete to trash).

The children table is touched by the loop thread only: socket threads (rq.mgr.commands) hand
work to it with `call_in_loop` (rq.mgr.calls), so no locks.  It must not import rq.queue.
"""

from __future__ import annotations

import functools
import logging
import os
import select
import signal
import subprocess
import time
from collections.abc import Callable, Mapping
from typing import Any

from rq import proc
from rq.client import mgr_socket
from rq.config import MainConfig
from rq.errors import RQError
from rq.fsops import FsOps
from rq.loop import Loop
from rq.mgr import limits, pidfile, queuedirs
from rq.mgr.calls import LoopCalls
from rq.mgr.children import Child, Policy, State
from rq.mgr.commands import Commands
from rq.mgr.events_hub import EventHub
from rq.mgr.programs import SERVICES, STATUS_SERVICES, WEB, ArgvBuilder, default_argv
from rq.mgr.spawner import Spawner
from rq.protocol import describe_exit
from rq.sockserve import Rq1Server

log = logging.getLogger(__name__)

SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD, signal.SIGUSR1)
WEB_START_TIMEOUT = 15.0  # then start-up goes on with the web still STARTING
MAX_WAIT = 5.0           # the loop looks around at least this often
READY_CAP = 20.0         # announce readiness even if a queue is still STARTING

class Manager:
    def __init__(self, root: str, config: MainConfig, *, env: Mapping[str, str],
                 argv_for: ArgvBuilder | None = None, policy: Policy | None = None,
                 fs: FsOps | None = None,
                 on_ready: Callable[[], None] | None = None) -> None:
        self.root = root
        self.config = config
        self.env = dict(env)
        self.argv_for = argv_for or functools.partial(default_argv, root)
        self.policy = policy or Policy()
        self.fs = fs or FsOps()
        self.on_ready = on_ready
        self.queue_root = os.path.join(root, "queue")
        self.children: dict[tuple[str, str], Child] = {}
        self.started = time.monotonic()
        self.stopping = False
        self.announced = False
        self.ready_deadline = 0.0
        self.loop: Loop | None = None
        self.server: Rq1Server | None = None
        self.calls = LoopCalls(self.wake)  # from socket threads (rq.mgr.commands)
        self.events_hub = EventHub(root, fs=self.fs)  # S8.8 subscriptions
        self.spawner = Spawner(root, self.env)  # forks queue processes when it can (issue 17)

    # ------------------------------------------------------------ start-up (S2.2)
    def start(self) -> None:
        """Steps 2, 3, 5 of S2.2 (step 1, the main config, is the caller's).
        Raises RQError with the line to print."""
        self.loop = Loop(SIGNALS)
        limits.check(len(self.scan_queues()))  # issue 17: refuse, naming the limit
        pidfile.claim(self.root, os.getpid(), self.fs)
        try:
            self.server = Rq1Server(mgr_socket(self.root), Commands(self).handle)
            self.server.start()
        except OSError as exc:
            pidfile.remove_pid(self.root, os.getpid())
            raise RQError(
                f"ERROR: cannot bind config/queuemgr.sock: {exc.strerror or exc}") from exc
        self.events_hub.start()
        queues = self.scan_queues()
        # it imports (and, for many queues, warms up) while the web starts
        self.spawner.start(self.argv_for("queue", "-"), len(queues))
        log.info("rq-mgr started, pid %d, root %s", os.getpid(), self.root)
        self.ready_deadline = time.monotonic() + READY_CAP  # the web's wait counts too
        if WEB in SERVICES:
            self.start_web()
        now = time.monotonic()
        self.add_children("queue", queues, now)
        for kind in SERVICES:
            if kind != WEB:
                self.add_child(kind, kind, now)

    def start_web(self) -> None:
        """S2.2 step 4: start the web server and wait for its ready line.  A
        `fatal` line (it cannot listen on addr:port) fails start-up: the pid
        and socket files go and the line is raised for `rq-mgr start` to
        print.  A crash before `ready` is only a BACKOFF (S2.3)."""
        child = self.add_child(WEB, WEB, time.monotonic())
        deadline = time.monotonic() + WEB_START_TIMEOUT
        while child.state is State.STARTING and time.monotonic() < deadline:
            daemon = child.daemon
            assert daemon is not None
            if daemon.ready_r >= 0:
                # Only the ready pipe: signals wait in the loop's wakeup fd.
                select.select([daemon.ready_r], [], [], 0.1)
                self.read_ready(child, daemon.ready_r)
            else:
                time.sleep(0.02)  # EOF without a line: it is exiting, reap it
            self.reap(time.monotonic())
        if child.state is State.FATAL:
            self.abort_start(child)
        if child.state is State.STARTING:
            log.warning("web: not ready after %g s, starting the queues anyway",
                        WEB_START_TIMEOUT)
        # From now on a web server that cannot listen (its port taken while
        # it was down) backs off and retries like any other failed start.
        child.retry_fatal = True

    def abort_start(self, web: Child) -> None:
        line = web.error or "ERROR: the web server could not start"
        if web.daemon is not None:  # it exits 2 after its fatal line; make sure
            try:
                web.daemon.popen.wait(5)
            except subprocess.TimeoutExpired:
                self.signal_child(web, signal.SIGKILL)
                web.daemon.popen.wait()
        self.close_ready(web)
        self.close_lifeline(web)
        self.children.clear()
        self.spawner.close()  # gone before our ERROR line, so none of its output follows it
        if self.server is not None:
            self.server.close()  # also removes the socket file
        pidfile.remove_pid(self.root, os.getpid())
        raise RQError(line)

    def scan_queues(self) -> list[str]:
        return queuedirs.scan(self.root)

    def has_config(self, name: str) -> bool:
        return queuedirs.has_config(self.root, name)

    # ------------------------------------------------------------ the loop
    def run(self) -> int:
        """Serve until stopped; then remove the pid and socket files (S2.5)."""
        try:
            self.run_once(0)  # announce at once when no child needs to come up
            while not (self.stopping and not self.children):
                try:
                    self.run_once(self.next_timeout(time.monotonic()))
                except Exception:  # a bug in one pass must not orphan every queue
                    log.exception("rq-mgr loop error")
                    time.sleep(0.1)  # no tight loop if the bug repeats
        finally:
            self.close()
        log.info("rq-mgr stopped")
        return 0

    def run_once(self, timeout: float | None, now: float | None = None) -> None:
        """wait -> handle signals -> handle requests -> reap -> restart -> deadlines."""
        assert self.loop is not None
        signals = self.loop.wait(timeout)
        now = time.monotonic() if now is None else now
        self.handle_signals(signals, now)
        self.calls.run_pending()
        self.reap(now)
        self.start_due(now)
        self.enforce_stop_deadlines(now)
        self.advance_shutdown(now)
        self.announce_ready(now)

    def next_timeout(self, now: float) -> float:
        times = [c.due for c in self.children.values() if c.state is State.BACKOFF]
        times += [c.stop_deadline for c in self.children.values()
                  if c.state is State.STOPPING and not c.killed]
        if not self.announced:
            times.append(self.ready_deadline)
        return max(0.0, min([now + MAX_WAIT, *times]) - now)

    def close(self) -> None:
        self.calls.close()  # answers whatever is still queued
        self.events_hub.stop()  # ends every subscription at once
        self.spawner.close()  # its queue processes are ours already
        if self.server is not None:
            self.server.close()  # also removes the socket file
        pidfile.remove_pid(self.root, os.getpid())

    # ------------------------------------------------------------ signals
    def handle_signals(self, signals: list[int], now: float) -> None:
        for sig in signals:
            if sig in (signal.SIGTERM, signal.SIGINT):
                self.handle_term(now)
            elif sig == signal.SIGHUP:
                self.reload(now)
            # SIGCHLD only wakes us (reap runs every pass); SIGUSR1 needs no
            # work: every daemon's WatchedFileHandler reopens a rotated log.

    def handle_term(self, now: float) -> None:
        """S2.5: stop every queue in parallel; a second signal is passed on."""
        if self.stopping:
            log.info("second stop signal: passing SIGTERM on to stopping children")
            for child in self.children.values():
                if child.state is State.STOPPING and child.daemon is not None:
                    proc.kill_process(child.daemon.pid, signal.SIGTERM)
            return
        log.info("stopping: %d children", len(self.children))
        self.stopping = True
        for child in list(self.children.values()):
            if child.kind == "queue":
                self.stop_child(child, now, "forget")

    def advance_shutdown(self, now: float) -> None:
        """Once every queue is gone, stop the services (S2.5)."""
        if not self.stopping or any(c.kind == "queue" for c in self.children.values()):
            return
        for child in list(self.children.values()):
            if child.state is not State.STOPPING:
                self.stop_child(child, now, "forget")

    # ------------------------------------------------------------ requests from socket threads
    def call_in_loop(self, func: Callable[..., Any], *args: Any) -> Any:
        """Run `func(*args)` in the loop thread (rq.mgr.calls) and return its result."""
        return self.calls.call_in_loop(func, *args)

    def wake(self) -> None:
        assert self.loop is not None
        self.loop.wake()

    # ------------------------------------------------------------ spawning and reaping
    def add_child(self, kind: str, name: str, now: float) -> Child:
        return self.add_children(kind, [name], now)[0]

    def add_children(self, kind: str, names: list[str], now: float) -> list[Child]:
        children = [Child(kind, name, self.argv_for(kind, name)) for name in names]
        self.children.update(((kind, c.name), c) for c in children)
        self.launch(*children, now=now)
        return children

    def launch(self, *children: Child, now: float) -> None:
        """Spawn `children`, together (issue 17); a config that can never work is FATAL at
        once (S2.3), a spawn that fails is a failed start."""
        if self.stopping:
            return
        go = []
        for child in children:
            problem = queuedirs.start_problem(self.root, child.name) \
                if child.kind == "queue" else None
            if problem:
                child.transition(State.FATAL, now, error=problem)
            else:
                go.append(child)
        for child, daemon in zip(go, self.spawner.spawn_many([c.argv for c in go])):
            if isinstance(daemon, OSError):
                child.failed(f"cannot spawn: {daemon.strerror or daemon}", now, self.policy)
                continue
            # Non-blocking: a job of the child may have inherited the write end,
            # so EOF can come late; we read only what is there.
            os.set_blocking(daemon.ready_r, False)
            assert self.loop is not None
            self.loop.add_reader(daemon.ready_r, functools.partial(self.read_ready, child))
            child.spawned(daemon, now)
            log.info("%s: spawned pid %d", child.label, daemon.pid)

    def read_ready(self, child: Child, fd: int) -> None:
        try:
            data = os.read(fd, 4096)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self.close_ready(child)
            return
        now = time.monotonic()
        for line in child.feed_ready(data):
            child.ready_line(line, now)
        if child.state is State.RUNNING and child.hup_pending:
            child.hup_pending = False
            self.signal_child(child, signal.SIGHUP)

    def close_ready(self, child: Child) -> None:
        daemon = child.daemon
        if daemon is None or daemon.ready_r < 0:
            return
        assert self.loop is not None
        self.loop.remove_reader(daemon.ready_r)
        os.close(daemon.ready_r)
        daemon.ready_r = -1

    def close_lifeline(self, child: Child) -> None:
        """Our end of a reaped child's lifeline (EOF tells a live child that
        the manager is gone, S2.1; the kernel does that if we die)."""
        daemon = child.daemon
        if daemon is not None and daemon.lifeline_w >= 0:
            os.close(daemon.lifeline_w)
            daemon.lifeline_w = -1

    def reap(self, now: float) -> None:
        """Poll every child's own process (never waitpid(-1): other code in
        this process may own children too) and decide what comes next."""
        for child in list(self.children.values()):
            daemon = child.daemon
            if daemon is None or (returncode := daemon.popen.poll()) is None:
                continue
            child.hup_pending = False  # its pid is reaped: never signal it again
            if daemon.ready_r >= 0:
                self.read_ready(child, daemon.ready_r)  # a last line written before exiting
            self.close_ready(child)
            self.close_lifeline(child)
            log.info("%s: pid %d exited: %s", child.label, daemon.pid,
                     describe_exit(returncode))
            child.exited(returncode, now, self.policy)
            if child.state is State.STOPPED:
                self.finish_stop(child, now)
        self.spawner.reap_orphans({c.pid for c in self.children.values() if c.pid})

    def start_due(self, now: float) -> None:
        self.launch(*[c for c in self.children.values()
                      if c.state is State.BACKOFF and c.due <= now], now=now)

    def signal_child(self, child: Child, sig: int) -> None:
        if child.daemon is not None:
            proc.kill_process(child.daemon.pid, sig)

    # ------------------------------------------------------------ stopping (S2.5, S3.7)
    def stop_child(self, child: Child, now: float, after: str) -> None:
        """Graceful stop by SIGTERM; `after` says what follows its exit
        ("forget", "restart" or "delete").

        The lifeline stays open until the child is reaped: a queue process
        counts lifeline EOF as a stop request of its own, and a second stop
        request skips the jobs' grace period (S2.5), so closing it here
        would turn every graceful stop into a forceful one."""
        if child.state is State.STOPPING:
            child.merge_after_stop(after)
            return
        if child.daemon is None:  # BACKOFF or FATAL: nothing runs
            child.after_stop = after
            child.transition(State.STOPPED, now)
            self.finish_stop(child, now)
            return
        child.stop_requested(now, now + self.stop_grace(child), after)
        self.signal_child(child, signal.SIGTERM)

    def stop_grace(self, child: Child) -> float:
        """S2.5: a queue gets its kill_grace + 10 s before SIGKILL."""
        grace = queuedirs.kill_grace(self.root, child.name) if child.kind == "queue" else 0.0
        return grace + self.policy.stop_margin

    def enforce_stop_deadlines(self, now: float) -> None:
        for child in self.children.values():
            if child.state is State.STOPPING and not child.killed and child.stop_deadline <= now:
                self.kill_child(child)

    def kill_child(self, child: Child) -> None:
        """SIGKILL a child that would not stop, and its jobs' process groups
        (their messages stay in run/ and are recovered at the next start)."""
        child.killed = True
        log.warning("%s: did not stop in time, sending SIGKILL", child.label)
        self.signal_child(child, signal.SIGKILL)
        if child.kind == "queue":
            for pgid in queuedirs.job_groups(os.path.join(self.queue_root, child.name)):
                proc.signal_group(pgid, signal.SIGKILL)

    def finish_stop(self, child: Child, now: float) -> None:
        """The child has stopped: forget it, start it again, or trash its queue."""
        after, key = child.after_stop, (child.kind, child.name)
        if after == "restart" and not self.stopping:
            child.reset_failures()
            self.launch(child, now=now)
            return
        self.children.pop(key, None)
        if after == "delete":
            self.trash_queue(child.name)
        log.info("%s: forgotten", child.label)

    def trash_queue(self, name: str) -> None:
        try:
            trash = queuedirs.trash(self.root, name, self.fs)
        except OSError as exc:
            log.error("queue %s: cannot move to trash: %s", name, exc)
            return
        log.info("queue %s: deleted, moved to %s", name, os.path.basename(trash))

    # ------------------------------------------------------------ reload (S2.4)
    def reload(self, now: float) -> None:
        if self.stopping:
            return
        present = set(self.scan_queues())
        log.info("reload: %d queue directories", len(present))
        for child in list(self.children.values()):
            if child.kind != "queue":
                if child.state in (State.BACKOFF, State.FATAL):
                    self.restart_child(child, now)
            elif child.name not in present:
                self.stop_child(child, now, "forget")
            elif child.state is State.RUNNING:
                self.signal_child(child, signal.SIGHUP)
            elif child.state is State.STARTING:
                child.hup_pending = True  # its SIGHUP handler may not exist yet
            elif child.state in (State.BACKOFF, State.FATAL):
                self.restart_child(child, now)
            elif child.state is State.STOPPING:
                child.merge_after_stop("restart")
        self.add_children("queue", sorted(present - {c.name for c in self.queues()}), now)

    def restart_child(self, child: Child, now: float) -> None:
        """Stop (if running) then start; clears the failure count and FATAL."""
        child.reset_failures()
        if child.daemon is not None:
            self.stop_child(child, now, "restart")
        else:
            self.launch(child, now=now)

    # ------------------------------------------------------------ what commands call (loop thread)
    def queues(self) -> list[Child]:
        return [c for c in self.children.values() if c.kind == "queue"]

    def queue_names(self) -> list[str]:
        return sorted(c.name for c in self.queues())

    def queue_is_running(self, name: str) -> bool:
        child = self.children.get(("queue", name))
        return child is not None and child.daemon is not None

    def restart_queue(self, name: str) -> bool:
        child = self.children.get(("queue", name))
        now = time.monotonic()
        if child is None:
            if self.stopping or not self.has_config(name):
                return False
            self.add_child("queue", name, now)
            return True
        self.restart_child(child, now)
        return True

    def start_new_queue(self, name: str) -> None:
        """A queue directory was just created (S3.7)."""
        child = self.children.get(("queue", name))
        now = time.monotonic()
        if child is None:
            if not self.stopping:
                self.add_child("queue", name, now)
        elif child.state not in (State.STARTING, State.RUNNING):
            self.restart_child(child, now)

    def delete_queue(self, name: str) -> bool:
        child = self.children.get(("queue", name))
        if child is not None:
            self.stop_child(child, time.monotonic(), "delete")
            return True
        if os.path.isdir(os.path.join(self.queue_root, name)):
            self.trash_queue(name)
            return True
        return False

    def reload_now(self) -> None:
        self.reload(time.monotonic())

    def status(self) -> dict[str, Any]:
        """The S7.2 `status` object; services not supervised (yet) are null."""
        out: dict[str, Any] = {"queues": {c.name: c.describe()
                                          for c in sorted(self.queues(), key=lambda c: c.name)}}
        for kind in STATUS_SERVICES:
            child = self.children.get((kind, kind))
            out[kind] = child.describe() if child is not None else None
        return out

    def uptime(self) -> int:
        return int(time.monotonic() - self.started)

    # ------------------------------------------------------------ readiness
    def announce_ready(self, now: float) -> None:
        """Tell `rq-mgr start` we are up once no child is still STARTING (or
        after READY_CAP s, so one slow recovery cannot fail the start)."""
        if self.announced:
            return
        starting = any(c.state is State.STARTING for c in self.children.values())
        if starting and now < self.ready_deadline:
            return
        self.announced = True
        log.info("rq-mgr ready")
        if self.on_ready is not None:
            self.on_ready()
