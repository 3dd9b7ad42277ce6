"""The fork server rq-mgr starts (issue 17, issue 14 section 4): `python -m rq.forkserver
--sock-fd F [--title T]`.

rq.queue.forkserver's server (preloaded and warmed for queue processes, one fork per
request) with two more programs it may fork: the timers and scandir daemons, imported here
once so that each start of a root no longer pays a fresh interpreter for each (~0.15 s CPU
apiece).  A request names its program (`"module": "rq.timers"`); the forked process runs
that program's `main` exactly as `python -m rq.timers ARGV` would.  It lives here, not in
rq.queue, because the daemons' packages must not import each other (docs/DESIGN.md).  The
web server is not among them: the engine never imports rq.web (it starts as a fresh
interpreter, without Flask until its first request).
"""

from __future__ import annotations

import sys

import rq.queue.__main__
import rq.scandir.__main__
import rq.timers.__main__
from rq.queue import forkserver

PROGRAMS: forkserver.Programs = {"rq.queue": rq.queue.__main__, "rq.timers": rq.timers.__main__,
                                 "rq.scandir": rq.scandir.__main__}


def main(argv: list[str] | None = None) -> int:
    return forkserver.main(argv, PROGRAMS, prog="python -m rq.forkserver")


if __name__ == "__main__":
    sys.exit(main())
