"""Entry point of a queue process (a program you can run by hand, STYLE habit 8).

`python -m rq.queue --root ROOT --name NAME [--lifeline-fd F --ready-fd F]`.
rq.daemon does the program edge (process title `[rq-que] [NAME]`, S2.1; logging
as `rq-que NAME`; the main config); this module reads the queue's config (an
invalid one is `fatal` on the ready pipe, exit 2: FATAL at once, S2.3), chooses
the file-operation seam from the environment, and runs QueueProcess.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Mapping

from rq import fsops
from rq.client import queue_socket_problem
from rq.config import load_queue_config
from rq.daemon import Context, DaemonSpec, run_daemon
from rq.errors import RQError, StartError

log = logging.getLogger("rq.queue")


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
