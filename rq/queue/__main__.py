"""Entry point of a queue process (a program you can run by hand, STYLE habit 8).

`python -m rq.queue --root ROOT --name NAME [--lifeline-fd F --ready-fd F]`.
rq.daemon does the program edge (process title `[rq-que] [NAME]`, S2.1; logging
as `rq-que NAME`; the main config); this module reads the queue's config (an
invalid one is `fatal` on the ready pipe, exit 2: FATAL at once, S2.3), chooses
the file-operation seam from the environment, and runs QueueProcess.  `warm_up`
runs one throw-away queue for the fork server (rq.queue.forkserver, issue 17).
"""

from __future__ import annotations

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


def serve(ctx: Context) -> int:
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
        q = QueueProcess(ctx.config, cfg, fsops.from_environment(ctx.env),
                         lifeline_fd=ctx.lifeline_fd, ready_fd=ctx.ready.fd)
        refresh = count_refresh_seconds(ctx.env)
        if refresh is not None:
            q.state.set_count_refresh(refresh)
        return q.run()
    except RQError as exc:
        log.error("%s", exc)
        return 1


def warm_up() -> None:
    """Run a throw-away queue once (start, serve, stop) in a temporary root, so what every
    queue process would otherwise do for itself is done once, here, and shared: the
    interpreter's specialised bytecode (Python 3.11 rewrites code objects as they run),
    caches and lazily made objects.  Then single-threaded again, signals as they were."""
    from rq import cron  # noqa: F401 - loaded only by a queue with a schedule: shared here
    from rq.config import load_main_config
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


def count_refresh_seconds(env: Mapping[str, str]) -> float | None:
    """Test seam: RQ_COUNT_REFRESH_SECONDS shortens the 60 s re-count from disk (S7.3)."""
    try:
        value = float(env.get("RQ_COUNT_REFRESH_SECONDS", ""))
    except ValueError:
        return None
    return value if 0 < value <= 60 else None


SPEC = DaemonSpec(prog="rq.queue", logger="rq.queue", role="rq-que {name}",
                  title="[rq-que] [{name}]", serve=serve,
                  options=(("--name", {"required": True}),),
                  crash_text="queue {name} crashed")


def main(argv: list[str] | None = None) -> int:
    return run_daemon(SPEC, argv)


if __name__ == "__main__":
    sys.exit(main())
