"""Entry point of the scandir daemon (SPEC S2.1, S11), a program you can run by hand.

`python -m rq.scandir --root ROOT [--lifeline-fd F --ready-fd F]`: rq.daemon does the
program edge (process title `[rq-scandir]`, logging to log/queuemgr.log as `rq-scandir`, the
main config, `fatal` on the ready pipe and exit 2 for what a retry cannot fix, S2.3),
then ScandirDaemon runs until stopped.
"""

from __future__ import annotations

import sys

from rq.daemon import DaemonSpec, run_daemon
from rq.scandir.daemon import ScandirDaemon

SPEC = DaemonSpec(prog="python -m rq.scandir", logger="rq.scandir", role="rq-scandir",
                  title="[rq-scandir]", serve=ScandirDaemon.run_from)


def main(argv: list[str] | None = None) -> int:
    return run_daemon(SPEC, argv)


if __name__ == "__main__":
    sys.exit(main())
