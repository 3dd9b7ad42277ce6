"""Entry point of a queue process (a program you can run by hand, STYLE habit 8).

`python -m rq.queue --root ROOT --name NAME [--lifeline-fd F --ready-fd F]`.
rq.daemon does the program edge (process title `[rq-que] [NAME]`, S2.1; logging
as `rq-que NAME`; the main config); this module reads the queue's config (an
invalid one is `fatal` on the ready pipe, exit 2: FATAL at once, S2.3), chooses
the file-operation seam from the environment, and runs QueueProcess.  `warm_up`
runs throw-away queues for the fork server (rq.queue.forkserver, issue 17).
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Mapping

from rq import fsops
from rq.client import queue_socket_problem
from rq.config import load_queue_config
from rq.daemon import Context, DaemonSpec, run_daemon
from rq.errors import RQError, StartError

log = logging.getLogger("rq.queue")
WARM_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD)


# Python 3.11 rewrites a function's bytecode in place (quickening) on its 8th call or loop
# iteration, then specialises each instruction as it runs.  What a queue process runs a few
# times only, once in the fork server left it to each queue process to do, and so to copy
# those pages (issue 17: 8 runs, USS per queue process 4.16 -> 3.96 MiB in a probe of 50).
WARM_RUNS = 8


def serve(ctx: Context) -> int:
    return serve_with(ctx, fsops.from_environment(ctx.env))


def serve_with(ctx: Context, fs: fsops.FsOps) -> int:
    try:
        cfg, warnings = load_queue_config(ctx.root, ctx.args.name)
    except RQError as exc:
        raise StartError(str(exc)) from exc
    for text in warnings:
        log.warning("%s", text)
    problem = queue_socket_problem(ctx.root, cfg.name)
    if problem:  # no retry can bind it (issue 13, D7)
        raise StartError(problem)
    from rq.queue.process import QueueProcess
    try:
        q = QueueProcess(ctx.config, cfg, fs, lifeline_fd=ctx.lifeline_fd, ready_fd=ctx.ready.fd)
        refresh = seam_seconds(ctx.env, "RQ_COUNT_REFRESH_SECONDS")
        if refresh is not None:
            q.state.set_count_refresh(refresh)
        every = seam_seconds(ctx.env, "RQ_QUE_CHECKPOINT_SECONDS")
        if every is not None:
            q.state.checkpoints.set_every(every)
        return q.run()
    except RQError as exc:
        log.error("%s", exc)
        return 1


def warm_up(title: str, runs: int = WARM_RUNS) -> None:
    """Run `runs` throw-away queues (start, serve, stop) in a temporary root, the whole
    program from its parsed command line on, so what every queue process would otherwise
    do for itself is done here, once, and shared: the interpreter's specialised bytecode,
    caches and lazily made objects.  Then single-threaded again; signals, working
    directory, descriptors, logging handlers and the process title (`title`, also while
    they run) as they were."""
    from dataclasses import replace

    from rq import cron  # noqa: F401 - loaded only by a queue with a schedule: shared here

    from rq.store import STATES

    def serve_warm(ctx: Context) -> int:
        fs = fsops.FsOps()  # never the environment's seam: a test's faults or record
        fs.spares = False  # no spare directories made (and fsynced) for nothing
        return serve_with(ctx, fs)

    spec = replace(SPEC, title=title, serve=serve_warm)
    saved = {sig: signal.getsignal(sig) for sig in WARM_SIGNALS}
    cwd, fds = os.getcwd(), set(os.listdir("/proc/self/fd"))
    handlers, level = list(logging.root.handlers), logging.root.level
    try:
        with tempfile.TemporaryDirectory(prefix="rq-warm-") as root:
            os.makedirs(os.path.join(root, "config"))
            write_json(os.path.join(root, "config", "config.json"),
                       {"env": "warm", "host": "localhost", "port": 1, "addr": "127.0.0.1"})
            for i in range(runs):  # a queue each: a queue's lock is held until its process ends
                name = f"warm{i}"
                for sub in STATES:
                    os.makedirs(os.path.join(root, "queue", name, sub))
                write_json(os.path.join(root, "queue", name, "config.json"),
                           {"name": name, "script": "/bin/true", "exec_prefix": ""})
                life_r, life_w = os.pipe()
                os.close(life_w)  # EOF at once: it starts, sees the manager gone, stops
                ready_r, ready_w = os.pipe()
                os.close(ready_r)  # its ready line is lost (ReadyPipe ignores EPIPE)
                argv = ["--root", root, "--name", name, "--lifeline-fd", str(life_r),
                        "--ready-fd", str(ready_w)]
                try:
                    run_daemon(spec, argv, SPEC.parse(argv))
                finally:
                    restore_logging(handlers, level)
    except Exception:  # only a lost optimisation
        pass
    finally:
        os.chdir(cwd)
        signal.set_wakeup_fd(-1)
        for sig, handler in saved.items():
            signal.signal(sig, handler)
    deadline = time.monotonic() + 5
    while threading.active_count() > 1 and time.monotonic() < deadline:
        time.sleep(0.01)  # its daemon threads see the stop and end
    gc.collect()  # what the queues left in cycles (selectors, sockets) closes as it goes
    for fd in set(os.listdir("/proc/self/fd")) - fds:  # plain pipes and lock files left open
        try:
            os.close(int(fd))
        except OSError:
            pass  # the listing's own descriptor


def restore_logging(handlers: list[logging.Handler], level: int) -> None:
    """The root logger as it was before a throw-away queue set it up (rq.logs)."""
    for old in list(logging.root.handlers):
        if old not in handlers:
            logging.root.removeHandler(old)
            old.close()
    for old in handlers:
        if old not in logging.root.handlers:
            logging.root.addHandler(old)
    logging.root.setLevel(level)


def write_json(path: str, obj: object) -> None:
    with open(path, "w") as fh:
        json.dump(obj, fh)


def seam_seconds(env: Mapping[str, str], name: str) -> float | None:
    """Test seams that shorten a 60 s period: RQ_COUNT_REFRESH_SECONDS the re-count from disk
    (S7.3), RQ_QUE_CHECKPOINT_SECONDS the que/ checkpoint (rq.queue.snapshot)."""
    try:
        value = float(env.get(name, ""))
    except ValueError:
        return None
    return value if 0 < value <= 60 else None


SPEC = DaemonSpec(prog="rq.queue", logger="rq.queue", role="rq-que {name}",
                  title="[rq-que] [{name}]", serve=serve,
                  options=(("--name", {"required": True}),),
                  crash_text="queue {name} crashed")


def main(argv: list[str] | None = None, args: argparse.Namespace | None = None) -> int:
    return run_daemon(SPEC, argv, args)


if __name__ == "__main__":
    sys.exit(main())
