"""Entry point of a queue process (a program you can run by hand, STYLE habit 8).

`python -m rq.queue --root ROOT --name NAME [--lifeline-fd F --ready-fd F]`.
Reads config at the edge, sets the process title `[rq-que] [NAME]` (S2.1),
chooses the file-operation seam from the environment, and runs QueueProcess.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

import setproctitle

from rq import fsops
from rq.config import load_main_config, load_queue_config
from rq.errors import RQError
from rq.logs import setup_logging

log = logging.getLogger("rq.queue")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rq.queue")
    parser.add_argument("--root", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--lifeline-fd", type=int)
    parser.add_argument("--ready-fd", type=int)
    args = parser.parse_args(argv)
    root = os.path.abspath(args.root)
    setup_logging(root, f"rq-que {args.name}", stderr=args.ready_fd is None)
    setproctitle.setproctitle(f"[rq-que] [{args.name}]")
    os.chdir(root)
    try:
        main_cfg = load_main_config(root)
        cfg, warnings = load_queue_config(root, args.name)
    except RQError as exc:
        return _fatal(args.ready_fd, str(exc))
    for text in warnings:
        log.warning("%s", text)
    from rq.queue.process import QueueProcess
    try:
        q = QueueProcess(main_cfg, cfg, fsops.from_environment(os.environ),
                         lifeline_fd=args.lifeline_fd, ready_fd=args.ready_fd)
        return q.run()
    except RQError as exc:
        log.error("%s", exc)
        return 1
    except Exception:
        log.exception("queue %s crashed", args.name)
        return 1


def _fatal(ready_fd: int | None, reason: str) -> int:
    log.error("cannot start: %s", reason)
    if ready_fd is not None:
        try:
            os.write(ready_fd, f"fatal {reason}\n".encode())
        except OSError:
            pass
    else:
        print(f"rq.queue: {reason}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
