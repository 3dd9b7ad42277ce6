#!/usr/bin/env python3
"""The `webhook` builtin queue script (SPEC S12.2): PLACEHOLDER.

NOT IMPLEMENTED IN THIS RELEASE: the real webhook arrives with a later issue.  Until then every
message in the `webhook` queue ends in err with the status text below, so nothing is silently lost.
"""

import os
import sys
import time

STATUS = "fail webhook script not implemented in this release"


def main() -> int:
    stamp = time.strftime("%Y-%m-%d %H:%M:%S %z")
    print(f"{os.getpid()} - {stamp} - {STATUS}", flush=True)  # S12: echo each status line
    try:
        with os.fdopen(3, "w") as pipe:  # fd 3 = RQ_WRITE (S6.3)
            pipe.write(STATUS + "\n")
    except OSError:
        pass  # run by hand without fd 3: the stdout line above is all there is
    return 0


if __name__ == "__main__":
    sys.exit(main())
