"""The queue fork server (issue 17): queue processes forked from one preloaded parent.

`python -m rq.queue.forkserver --sock-fd F`, or rq.forkserver, which rq-mgr starts
(rq.mgr.spawner) with one end of a socket pair.  Once, it imports what a queue process runs,
and for a root of more than WARM_AFTER queues (`--queues`, or once that many are asked for)
runs a few throw-away queues (rq.queue.__main__.warm_up); then, for each request on the
socket (`{"id": I, "module": M, "argv": [...]}` plus the lifeline read end and the ready
write end as SCM_RIGHTS), it forks and answers `{"id": I, "pid": N}` or `{"id": I, "error": TEXT}`.
The forked process does what `python -m M ARGV --lifeline-fd L --ready-fd R` does, from
`M.__main__.main` on, for M one of the programs the server was given (`rq.queue` when the
request names none): a program you can still run by hand that way (STYLE habit 8); only
its start is cheaper.  Run as `python -m rq.queue.forkserver` it forks queue processes
only; rq.forkserver adds the timers and scandir daemons (which this package must not
import, docs/DESIGN.md).

Why fork, here only: a fresh interpreter costs each queue process ~0.3 s CPU of imports and
~14 MiB of private memory; a fork shares the imported code, module objects and specialised
bytecode copy-on-write.  `gc.freeze()` before each fork moves every object the server holds
into the collector's permanent generation, so a child's collections never write to them.
The server is single-threaded (no lock can be copied held) and never runs a queue itself.

Why a double fork (rq.proc.fork_adopted): the queue process must be rq-mgr's own child, so
that rq-mgr reaps it and reads its exit status exactly as for a process it spawned (S2.3).
rq-mgr is a child subreaper (rq.proc.become_subreaper): a middle process forks the queue
process and exits at once, the kernel hands the orphan to rq-mgr, and only once the middle
one is reaped does the server answer with the pid.  The queue process has its own session
and process group, as with `start_new_session=True` (its jobs get their own, S6.3), and
keeps only fds 0-2 and its two pipes.

EOF on the socket (rq-mgr closed it, or died) ends the server; its queue processes are not
its children and go on under rq-mgr, watching their own lifelines (S2.1).
"""

from __future__ import annotations

import argparse
import array
import functools
import gc
import json
import logging
import os
import select
import socket
import sys
import threading
from collections.abc import Callable, Mapping
from types import ModuleType

import setproctitle

import rq.queue.__main__ as queue_main
from rq import proc

MAX_REQUEST = 65536
# A program: the module run with `python -m` -> its entry module (with `main(argv)`),
# imported before the server forks anything.
Programs = Mapping[str, ModuleType]
QUEUE_ONLY: Programs = {"rq.queue": queue_main}
# The warm-up (~0.07 CPU-s) saves each queue process forked after it ~0.1-0.2 MiB of private
# memory (issue 17): worth it for a root of many queues, not for one of a few.  It runs at
# start when the root has more queues than this, else before forking the batch that takes
# the number of queue processes asked for past it (queues created later).
WARM_AFTER = 4


def main(argv: list[str] | None = None, programs: Programs = QUEUE_ONLY,
         prog: str = "python -m rq.queue.forkserver") -> int:
    parser = argparse.ArgumentParser(prog=prog)
    parser.add_argument("--sock-fd", type=int, required=True)
    parser.add_argument("--title", default="[rq-que-fork]")
    parser.add_argument("--queues", type=int, default=0,
                        help="queue processes the root will ask for at start")
    args = parser.parse_args(argv)
    setproctitle.setproctitle(args.title)
    threading.stack_size(THREAD_STACK)  # inherited: 1 MiB of address space, not 8, per thread
    sock = socket.socket(fileno=args.sock_fd)
    # Runs what every queue process runs, in this process: at once for a root of many queues
    # (while rq-mgr starts the web server), else once many are asked for.
    warm = functools.partial(queue_main.warm_up, args.title)
    if args.queues > WARM_AFTER:
        warm()
    gc.disable()  # enabled again in each queue process (gc.freeze() docs)
    try:
        sock.sendall(b'{"ready": true}')
    except OSError:  # rq-mgr is gone already (a start that failed): nothing to serve
        return 0
    forked = Server(sock, programs, warm=None if args.queues > WARM_AFTER else warm).serve()
    if forked is None:
        return 0
    gc.enable()
    program, child_argv = forked
    sys.argv = [program.__file__ or program.__name__, *child_argv]
    if program is queue_main:  # the command line rq-mgr sends, parsed without argparse
        code = queue_main.main(child_argv, quick_parse(child_argv))
    else:
        code = program.main(child_argv)
    # The daemon has stopped and closed what it owns.  A normal interpreter exit would now
    # free every module object, writing to (and so copying) each page shared with this
    # server: most of `rq-mgr stop`'s time with a thousand queues.  Flush and go.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


THREAD_STACK = 1024 * 1024  # a queue process's threads parse frames and JSON, no deep recursion


class Server:
    """The request loop: rq-mgr sends a window of requests at once; every request waiting
    on the socket is read, and the batch is forked by one middle process (rq.proc.
    fork_adopted), answered by `id` once that middle has exited.  Batches overlap.  A
    `select.poll` object, not a selector: it holds no descriptor that a forked queue
    process could later close by mistake."""

    def __init__(self, sock: socket.socket, programs: Programs = QUEUE_ONLY,
                 warm: Callable[[], None] | None = None) -> None:
        self.sock = sock
        self.programs = programs
        self.warm = warm  # None once it has run
        self.queues = 0  # queue processes asked for so far
        self.poll = select.poll()
        self.poll.register(sock, select.POLLIN)
        self.middles: dict[int, tuple[list[object], int]] = {}  # pipe -> (ids, middle pid)

    def serve(self) -> tuple[ModuleType, list[str]] | None:
        """Answer requests until EOF (None); in a forked process, its program and argv."""
        while True:
            for fd, _ in self.poll.poll():
                if fd in self.middles:
                    self.answer(fd)
                    continue
                batch = self.read_batch()
                if batch is None:
                    return None
                forked = self.start(batch)
                if forked is not None:
                    return forked  # the forked process: run it

    def read_batch(self) -> list[tuple[object, ModuleType, list[str], list[int]]] | None:
        """Every request waiting on the socket (at least one): [(id, program, argv, fds)]; None
        at EOF.  A bad request is answered at once and left out."""
        batch: list[tuple[object, ModuleType, list[str], list[int]]] = []
        flags = 0
        while True:
            try:
                data, fds = recv_request(self.sock, flags)
            except BlockingIOError:
                return batch
            except OSError:
                return None
            if not data:
                return None if not batch else batch
            flags = socket.MSG_DONTWAIT
            try:
                req = json.loads(data)
                if len(fds) != 2:
                    raise ValueError("want two descriptors")
                program = self.programs[req.get("module", "rq.queue")]
                batch.append((req.get("id"), program, [str(a) for a in req["argv"]], fds))
            except (ValueError, KeyError, TypeError, AttributeError) as exc:
                close_all(fds)
                self.reply({"error": f"bad request: {exc}"})

    def start(self, batch: list[tuple[object, ModuleType, list[str], list[int]]]
              ) -> tuple[ModuleType, list[str]] | None:
        if not batch:
            return None
        self.queues += sum(program is queue_main for _, program, _, _ in batch)
        if self.warm is not None and self.queues > WARM_AFTER:
            warm, self.warm = self.warm, None
            warm()
        argvs = [[*argv, "--lifeline-fd", str(fds[0]), "--ready-fd", str(fds[1])]
                 for _, _, argv, fds in batch]
        try:
            gc.freeze()  # every object so far: never touched by a child's collector
            forked = proc.fork_adopted([fds for _, _, _, fds in batch])
        except OSError as exc:
            forked = None
            for rid, _, _, _ in batch:
                self.reply({"id": rid, "error": f"cannot fork: {exc.strerror or exc}"})
        if isinstance(forked, int):
            self.sock.detach()  # closed by fork_adopted: never close that number again
            return batch[forked][1], argvs[forked]
        for _, _, _, fds in batch:
            close_all(fds)
        if forked is not None:
            middle, pipe_r = forked
            self.middles[pipe_r] = ([rid for rid, _, _, _ in batch], middle)
            self.poll.register(pipe_r, select.POLLIN)
        return None

    def answer(self, pipe_r: int) -> None:
        """The middle process wrote the pids and exited (EOF): reap it, then answer.  Its
        exit is what hands the queue processes to rq-mgr: only now may rq-mgr wait on them."""
        ids, middle = self.middles.pop(pipe_r)
        self.poll.unregister(pipe_r)
        with os.fdopen(pipe_r, "rb") as fh:
            lines = fh.read().splitlines()
        os.waitpid(middle, 0)
        pids = dict(line.split() for line in lines if len(line.split()) == 2)
        for i, rid in enumerate(ids):
            text = pids.get(str(i).encode(), b"0")
            pid = int(text) if text.lstrip(b"-").isdigit() else 0
            if pid > 0:
                self.reply({"id": rid, "pid": pid})
            else:
                why = os.strerror(-pid) if pid else "the middle process died"
                self.reply({"id": rid, "error": f"cannot fork: {why}"})

    def reply(self, obj: dict[str, object]) -> None:
        self.sock.sendall(json.dumps(obj).encode())


# What rq-mgr asks for (rq.mgr.programs.default_argv, plus the pipes): every flag once.
QUICK_FLAGS = {"--root": str, "--name": str, "--lifeline-fd": int, "--ready-fd": int}


def quick_parse(argv: list[str]) -> argparse.Namespace | None:
    """The queue command line rq-mgr sends, parsed without argparse: equal to what
    rq.queue.__main__.SPEC.parse gives for it (tests compare them), None for anything else,
    which argparse then parses in the queue process.  Running argparse there (some 40
    functions and their objects, a help formatter included) copied ~0.3 MiB of pages
    shared with this server into each queue process; run here, before the fork, it left
    this server's memory more fragmented with each request, and the queue processes forked
    later paid for it (issue 17)."""
    args = argparse.Namespace(root=None, name=None, lifeline_fd=None, ready_fd=None,
                              log_stderr=False)
    rest = list(argv)
    if rest[-1:] == ["--log-stderr"]:
        args.log_stderr = True
        rest.pop()
    if len(rest) != 2 * len(QUICK_FLAGS) or set(rest[::2]) != set(QUICK_FLAGS):
        return None
    for flag, value in zip(rest[::2], rest[1::2]):
        if value.startswith("-") or not value:
            return None
        try:
            setattr(args, flag[2:].replace("-", "_"), QUICK_FLAGS[flag](value))
        except ValueError:
            return None
    return args


def recv_request(sock: socket.socket, flags: int) -> tuple[bytes, list[int]]:
    """One datagram and the descriptors passed with it: socket.recv_fds, which (Python
    3.11) ignores its `flags`, so MSG_DONTWAIT would block."""
    fds = array.array("i")
    data, ancdata, _, _ = sock.recvmsg(MAX_REQUEST, socket.CMSG_LEN(2 * fds.itemsize), flags)
    for level, kind, payload in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[:len(payload) - len(payload) % fds.itemsize])
    return data, list(fds)


def close_all(fds: list[int]) -> None:
    for fd in fds:
        os.close(fd)


if __name__ == "__main__":
    sys.exit(main())
