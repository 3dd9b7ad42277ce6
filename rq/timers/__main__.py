"""Entry point of the timers daemon (SPEC S2.1, S10), a program you can run by hand.

`python -m rq.timers --root ROOT [--lifeline-fd F --ready-fd F]`: reads the
main config at the edge, sets the process title `[rq-timers]`, logs to
log/queuemgr.log as `rq-timers`, and runs TimersDaemon.  A main config that
cannot be read is reported as `fatal` on the ready pipe (exit 2: FATAL at the
manager, S2.3).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Mapping

import setproctitle

from rq import fsops
from rq.config import load_main_config
from rq.errors import ConfigError
from rq.logs import setup_logging
from rq.proc import ReadyPipe
from rq.timers.daemon import RESCAN, TimersDaemon

log = logging.getLogger("rq.timers")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rq.timers")
    parser.add_argument("--root", required=True)
    parser.add_argument("--lifeline-fd", type=int)
    parser.add_argument("--ready-fd", type=int)
    args = parser.parse_args(argv)
    root = os.path.abspath(args.root)
    for fd in (args.lifeline_fd, args.ready_fd):  # passed to us inheritable; keep them ours
        if fd is not None:
            os.set_inheritable(fd, False)
    ready = ReadyPipe(args.ready_fd)
    try:
        os.chdir(root)
        setup_logging(root, "rq-timers", stderr=args.ready_fd is None)
    except OSError as exc:
        return fatal(ready, f"cannot open log/queuemgr.log: {exc.strerror or exc}")
    setproctitle.setproctitle("[rq-timers]")
    try:
        config = load_main_config(root)
    except ConfigError as exc:
        return fatal(ready, f"bad config file config/config.json: {exc}")
    try:
        return TimersDaemon(config, fsops.from_environment(os.environ),
                            lifeline_fd=args.lifeline_fd, ready=ready,
                            rescan=rescan_seconds(os.environ)).run()
    except Exception:  # a crash is a BACKOFF at the manager (S2.3), never a lost timer
        log.exception("rq-timers crashed")
        return 1


def rescan_seconds(env: Mapping[str, str]) -> float:
    """Test seam: RQ_RESCAN_SECONDS overrides the periodic rescan (a huge
    value leaves only the watchdog notifications; S10.3)."""
    try:
        value = float(env.get("RQ_RESCAN_SECONDS", ""))
    except ValueError:
        return RESCAN
    return value if 0 < value < float("inf") else RESCAN


def fatal(ready: ReadyPipe, reason: str) -> int:
    log.error("cannot start: %s", reason)
    if ready.fd is None:
        print(f"rq.timers: {reason}", file=sys.stderr)
    ready.send(f"fatal {reason}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
