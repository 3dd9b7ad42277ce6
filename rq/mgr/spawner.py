"""How the manager starts its children (issue 17): queue processes, timers and scandir
through the fork server.

Owns: the fork server (`python -m rq.forkserver`, rq.queue.forkserver's server): starting
it beside the manager, the request that has it fork one process (its program, one of
FORKED: `rq.queue`, `rq.timers`, `rq.scandir`; the argv after `python -m PROGRAM`; and the
lifeline and ready pipe ends as SCM_RIGHTS), and falling back to `proc.spawn_daemon` (a
fresh interpreter, as before) for everything else: the web server, a child whose argv is
not the default one (tests run other programs), and every child once the fork server is
unusable (it could not start, answered nonsense or died: one warning, then spawns as
before; a failed fork it reports is a failed spawn, S2.3 backoff, like an OSError of
Popen).  The timers and scandir daemons came from fresh interpreters until issue 14
section 4: ~0.3 s CPU at every start of a root.  rq-mgr must be a child subreaper for
forked processes to be its children (rq.proc.become_subreaper): where it cannot be one, no
fork server is started.

The supervisor sees the same `proc.Daemon` either way, so supervision (S2) is unchanged.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import socket
import subprocess
from typing import Any

from rq import proc
from rq.protocol import describe_exit

log = logging.getLogger(__name__)

READY_TIMEOUT = 30.0  # the server's imports, on a loaded machine
REPLY_TIMEOUT = 30.0  # for a whole window, on a loaded machine
WINDOW = 64
FORKED = ("rq.queue", "rq.timers", "rq.scandir")  # the programs the fork server runs
PIPE_ERRORS = (errno.EMFILE, errno.ENFILE)  # os.pipe() failing: that spawn fails, not all


class Spawner:
    def __init__(self, root: str, env: dict[str, str]) -> None:
        self.root, self.env = root, env
        self.queue_argv = proc.python_argv("rq.queue")
        self.forked_argv = {module: proc.python_argv(module) for module in FORKED}
        self.sock: socket.socket | None = None
        self.server: subprocess.Popen[bytes] | None = None
        self.ready = False

    def start(self, sample_argv: list[str], queues: int = 0) -> None:
        """Start the fork server when queues run the default program (`sample_argv`); the
        root has `queues` queues now (the server warms up at once for many)."""
        if sample_argv[:len(self.queue_argv)] != self.queue_argv:
            return
        if not proc.become_subreaper():
            log.info("not a child subreaper here: queue processes, timers and scandir start "
                     "as fresh interpreters")
            return
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.server = subprocess.Popen(
                [*proc.python_argv("rq.forkserver"), "--sock-fd", str(theirs.fileno()),
                 "--title", f"[rq-que-fork] {self.root}", "--queues", str(queues)],
                cwd=self.root, env=self.env, stdin=subprocess.DEVNULL,
                start_new_session=True, pass_fds=(theirs.fileno(),), close_fds=True)
        except OSError as exc:
            ours.close()
            log.warning("cannot start the queue fork server: %s", exc.strerror or exc)
            return
        finally:
            theirs.close()
        self.sock = ours

    def reap_orphans(self, children: set[int]) -> None:
        """Reap the orphans we adopt as a subreaper (a job whose queue process was
        SIGKILLed, S2.5), leaving `children` and the fork server to their own poll."""
        known = children | ({self.server.pid} if self.server is not None else set())
        for pid, code in proc.reap_orphans(known):
            log.info("reaped orphan pid %d: %s", pid, describe_exit(code))

    def forked_program(self, argv: list[str]) -> tuple[str, list[str]] | None:
        """(program, its arguments) when the fork server can run `argv`, else None."""
        for module, prefix in self.forked_argv.items():
            if argv[:len(prefix)] == prefix:
                return module, argv[len(prefix):]
        return None

    def spawn_many(self, argvs: list[list[str]]) -> list[proc.Daemon | OSError]:
        """Start each argv as a supervised daemon: its Daemon, or the OSError that stopped
        it.  Queue processes, timers and scandir go to the fork server WINDOW requests at
        a time, all of a window in flight together (the socket's queue holds a few hundred
        datagrams)."""
        out: list[proc.Daemon | OSError | None] = [None] * len(argvs)
        forked = [i for i, argv in enumerate(argvs) if self.forked_program(argv)]
        for first in range(0, len(forked), WINDOW):
            self.fork_window(argvs, forked[first:first + WINDOW], out)
        return [self.spawn_direct(argv) if got is None else got
                for argv, got in zip(argvs, out)]

    def spawn_direct(self, argv: list[str]) -> proc.Daemon | OSError:
        """A fresh interpreter, as before the fork server (the fallback for all)."""
        try:
            return proc.spawn_daemon(argv, cwd=self.root, env=self.env)
        except OSError as exc:
            return exc

    def fork_window(self, argvs: list[list[str]], ids: list[int],
                    out: list[proc.Daemon | OSError | None]) -> None:
        """Ask the fork server for `ids` (in flight together); fill in `out`.  A pipe we
        cannot make (EMFILE) fails that spawn only; a server that fails leaves the rest
        of the window (None) to spawn_direct."""
        if self.sock is None:
            return
        ours: dict[int, tuple[int, int]] = {}  # id -> (lifeline write end, ready read end)
        try:
            self.await_ready()
            for i in ids:
                program = self.forked_program(argvs[i])
                assert program is not None
                try:
                    ours[i] = self.send(i, *program)
                except OSError as exc:
                    if exc.errno is None or exc.errno not in PIPE_ERRORS:
                        raise
                    out[i] = exc
            replies = self.collect(len(ours))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("queue fork server unusable (%s): queue processes, timers and scandir "
                        "start as fresh interpreters from now on", exc)
            self.close()
            replies = {}
        for i, (life_w, ready_r) in ours.items():
            reply = replies.get(i, {})
            if "pid" in reply:
                pid = int(reply["pid"])
                out[i] = proc.Daemon(pid, proc.ForkedProcess(pid), life_w, ready_r)
                continue
            os.close(life_w)
            os.close(ready_r)
            if reply:  # the server could not fork: a failed spawn (S2.3)
                out[i] = OSError(0, str(reply.get("error", "no reply")))

    def await_ready(self) -> None:
        assert self.sock is not None
        if not self.ready:
            self.sock.settimeout(READY_TIMEOUT)
            if not json.loads(self.sock.recv(4096) or b"{}").get("ready"):
                raise ValueError("no ready message")
            self.ready = True
            self.sock.settimeout(REPLY_TIMEOUT)

    def send(self, rid: int, module: str, args: list[str]) -> tuple[int, int]:
        """One request: new lifeline and ready pipes, the child's ends passed along (the
        message in flight holds them: ours are closed at once, so a window costs no more
        descriptors than its queues will hold anyway)."""
        assert self.sock is not None
        life_r, life_w = os.pipe()
        try:
            ready_r, ready_w = os.pipe()
        except OSError:
            os.close(life_r)
            os.close(life_w)
            raise
        try:
            request = {"id": rid, "module": module, "argv": args}
            socket.send_fds(self.sock, [json.dumps(request).encode()], [life_r, ready_w])
        except OSError:
            for fd in (life_w, ready_r):
                os.close(fd)
            raise
        finally:
            os.close(life_r)
            os.close(ready_w)
        return life_w, ready_r

    def collect(self, count: int) -> dict[int, dict[str, Any]]:
        assert self.sock is not None
        replies: dict[int, dict[str, Any]] = {}
        while len(replies) < count:
            reply = json.loads(self.sock.recv(4096) or b"null")
            replies[int(reply["id"])] = reply
        return replies

    def close(self) -> None:
        """EOF ends the server; its queue processes are ours and go on."""
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        if self.server is not None:
            try:
                self.server.wait(5)
            except subprocess.TimeoutExpired:
                self.server.kill()
                self.server.wait()
            self.server = None
