"""Entry point of the timers daemon (SPEC S2.1, S10), a program you can run by hand.

`python -m rq.timers --root ROOT [--lifeline-fd F --ready-fd F]`: rq.daemon does the
program edge (process title `[rq-timers]`, logging to log/queuemgr.log as `rq-timers`, the
main config, `fatal` on the ready pipe and exit 2 for what a retry cannot fix, S2.3),
then TimersDaemon runs until stopped.
"""

from __future__ import annotations

import sys

from rq.daemon import DaemonSpec, run_daemon
from rq.timers.daemon import TimersDaemon

SPEC = DaemonSpec(prog="python -m rq.timers", logger="rq.timers", role="rq-timers",
                  title="[rq-timers]", serve=TimersDaemon.run_from)


def main(argv: list[str] | None = None) -> int:
    return run_daemon(SPEC, argv)


if __name__ == "__main__":
    sys.exit(main())
