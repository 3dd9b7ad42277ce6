"""The queue fork server (issue 17): queue processes forked from one preloaded parent.

`python -m rq.queue.forkserver --sock-fd F`, started by rq-mgr (rq.mgr.spawner) with one end
of a socket pair.  It imports what a queue process runs (rq.queue.process and everything
under it) once, then, for each request on the socket (`{"argv": [...]}` plus two file
descriptors, the lifeline read end and the ready write end, as SCM_RIGHTS), forks and
answers `{"pid": N}` or `{"error": TEXT}`.  The forked process does what
`python -m rq.queue ARGV --lifeline-fd L --ready-fd R` does, from `rq.queue.__main__.main`
on: a program you can still run by hand that way (STYLE habit 8); only its start is cheaper.

Why fork, here only: a fresh interpreter costs each queue process ~0.3 s CPU of imports and
~14 MiB of private memory; a fork shares the imported code and module objects copy-on-write.
`gc.freeze()` before each fork moves every object the parent holds into the collector's
permanent generation, so a collection in a child never writes to (and so never copies) them.
The fork server is single-threaded (no lock can be copied held) and never runs a queue.

Why a double fork: the queue process must be rq-mgr's child, so that rq-mgr reaps it and
reads its exit status exactly as for a process it spawned itself (S2.3).  rq-mgr is a child
subreaper (PR_SET_CHILD_SUBREAPER, rq.proc.become_subreaper): the middle process forks the
queue process and exits at once, the kernel hands its orphan to rq-mgr, and only then (the
middle one reaped) does this server answer with the pid, so rq-mgr can waitpid it at once.
The queue process calls setsid() like `start_new_session=True` (its own session and process
group; its jobs get their own, S6.3), and keeps only fds 0-2 and its two pipes.

EOF on the socket (rq-mgr closed it, or died) ends the server; its queue processes are not
its children and go on under rq-mgr, watching their own lifelines (S2.1).
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import select
import signal
import socket
import sys
import tempfile
import threading
import time

import setproctitle

import rq.queue.__main__ as queue_main
import rq.queue.process  # noqa: F401 - preloaded: what every queue process runs

MAX_REQUEST = 65536
WARM_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rq.queue.forkserver")
    parser.add_argument("--sock-fd", type=int, required=True)
    parser.add_argument("--title", default="[rq-que-fork]")
    args = parser.parse_args(argv)
    setproctitle.setproctitle(args.title)
    threading.stack_size(THREAD_STACK)  # inherited: 1 MiB of address space, not 8, per thread
    sock = socket.socket(fileno=args.sock_fd)
    warm_up()
    gc.disable()  # enabled again in each queue process (gc.freeze() docs)
    sock.sendall(b'{"ready": true}')
    queue_argv = Server(sock).serve()
    if queue_argv is None:
        return 0
    gc.enable()
    sys.argv = [queue_main.__file__, *queue_argv]
    return queue_main.main(queue_argv)


THREAD_STACK = 1024 * 1024  # a queue process's threads parse frames and JSON, no deep recursion


def warm_up() -> None:
    """Run a throw-away queue once (start, serve, stop) in a temporary root, so what every
    queue process would otherwise do for itself is done once, here, and shared: the
    interpreter's specialised bytecode (Python 3.11 rewrites code objects as they run),
    caches and lazily made objects.  Then single-threaded again, signals as they were."""
    from rq.config import load_main_config, load_queue_config
    from rq.fsops import FsOps
    from rq.queue.process import QueueProcess
    from rq.store import STATES

    saved = {sig: signal.getsignal(sig) for sig in WARM_SIGNALS}
    level = logging.root.manager.disable
    logging.disable(logging.CRITICAL)
    try:
        with tempfile.TemporaryDirectory(prefix="rq-warm-") as root:
            qdir = os.path.join(root, "queue", "warm")
            for sub in ("config", *(os.path.join("queue", "warm", s) for s in STATES)):
                os.makedirs(os.path.join(root, sub))
            write_json(os.path.join(root, "config", "config.json"),
                       {"env": "warm", "host": "localhost", "port": 1, "addr": "127.0.0.1"})
            write_json(os.path.join(qdir, "config.json"),
                       {"name": "warm", "script": "/bin/true", "exec_prefix": ""})
            life_r, life_w = os.pipe()
            os.close(life_w)  # EOF at once: it starts, sees the manager gone, stops
            cfg, _ = load_queue_config(root, "warm")
            fs = FsOps()
            fs.spares = False  # no spare directories made (and fsynced) for nothing
            QueueProcess(load_main_config(root), cfg, fs, lifeline_fd=life_r).run()
    except Exception:  # only a lost optimisation
        pass
    finally:
        logging.disable(level)
        signal.set_wakeup_fd(-1)
        for sig, handler in saved.items():
            signal.signal(sig, handler)
    deadline = time.monotonic() + 5
    while threading.active_count() > 1 and time.monotonic() < deadline:
        time.sleep(0.01)  # its daemon threads see the stop and end


def write_json(path: str, obj: object) -> None:
    with open(path, "w") as fh:
        json.dump(obj, fh)


class Server:
    """The request loop: many requests in flight (rq-mgr sends a window of them at once and
    reads the answers, in any order, by `id`), each middle process waited for only once it
    has written the pid and exited.  A `select.poll` object, not a selector: it holds no
    descriptor a forked queue process could later close by mistake."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.poll = select.poll()
        self.poll.register(sock, select.POLLIN)
        self.middles: dict[int, tuple[object, int]] = {}  # pipe read end -> (id, middle pid)

    def serve(self) -> list[str] | None:
        """Answer requests until EOF (None); in a forked queue process, its argv."""
        while True:
            for fd, _ in self.poll.poll():
                if fd in self.middles:
                    self.answer(fd)
                    continue
                try:
                    data, fds, _flags, _addr = socket.recv_fds(self.sock, MAX_REQUEST, 2)
                except OSError:
                    return None
                if not data:
                    return None
                argv = self.start(data, fds)
                if argv is not None:
                    return argv  # the queue process: run it

    def start(self, data: bytes, fds: list[int]) -> list[str] | None:
        try:
            req = json.loads(data)
            rid, argv = req.get("id"), [str(a) for a in req["argv"]]
            if len(fds) != 2:
                raise ValueError("want two descriptors")
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            close_all(fds)
            self.reply({"error": f"bad request: {exc}"})
            return None
        try:
            forked = fork_queue(self.sock, fds)
        except OSError as exc:
            forked = None
            self.reply({"id": rid, "error": f"cannot fork: {exc.strerror or exc}"})
        if forked == 0:
            return [*argv, "--lifeline-fd", str(fds[0]), "--ready-fd", str(fds[1])]
        close_all(fds)
        if isinstance(forked, tuple):
            middle, pipe_r = forked
            self.middles[pipe_r] = (rid, middle)
            self.poll.register(pipe_r, select.POLLIN)
        return None

    def answer(self, pipe_r: int) -> None:
        """The middle process wrote the pid and exited (EOF): reap it, then answer.  Its
        exit is what hands the queue process to rq-mgr, so only now may rq-mgr wait on it."""
        rid, middle = self.middles.pop(pipe_r)
        self.poll.unregister(pipe_r)
        with os.fdopen(pipe_r, "rb") as fh:
            text = fh.read()
        os.waitpid(middle, 0)
        pid = int(text) if text.lstrip(b"-").isdigit() else 0
        if pid > 0:
            self.reply({"id": rid, "pid": pid})
        else:
            why = os.strerror(-pid) if pid else "the middle process died"
            self.reply({"id": rid, "error": f"cannot fork: {why}"})

    def reply(self, obj: dict[str, object]) -> None:
        self.sock.sendall(json.dumps(obj).encode())


def fork_queue(sock: socket.socket, keep: list[int]) -> tuple[int, int] | int:
    """Fork the queue process through a middle one: 0 in the queue process, else (the
    middle's pid, the read end of the pipe it writes the queue process's pid to)."""
    pipe_r, pipe_w = os.pipe()
    gc.freeze()
    try:
        middle = os.fork()
    except OSError:
        os.close(pipe_r)
        os.close(pipe_w)
        raise
    if middle == 0:  # the middle process: fork, report, exit
        os.close(pipe_r)
        try:
            pid = os.fork()
        except OSError as exc:
            os.write(pipe_w, str(-(exc.errno or 1)).encode())
            os._exit(1)
        if pid:
            os.write(pipe_w, str(pid).encode())
            os._exit(0)
        os.setsid()
        keep_only([0, 1, 2, *keep])
        sock.detach()
        return 0
    os.close(pipe_w)
    return middle, pipe_r


def keep_only(fds: list[int]) -> None:
    """Close every descriptor but `fds` (as `close_fds=True` of a spawn does)."""
    last = 0
    for fd in sorted(set(fds)):
        if fd > last:  # closerange(n, n) closes from n upwards on Python 3.11
            os.closerange(last, fd)
        last = fd + 1
    os.closerange(last, os.sysconf("SC_OPEN_MAX"))


def close_all(fds: list[int]) -> None:
    for fd in fds:
        os.close(fd)


if __name__ == "__main__":
    sys.exit(main())
