#!/usr/bin/env python3
"""Example queue script (used by scripts/demo): fails twice, then succeeds.

While RQ_COUNT < 2 it asks to be run again in 2 seconds (`resend 2-retrying`, SPEC S5.4, S6.4);
RQ increments RQ_COUNT on every resend, so the third run reports `done ok`.
"""

import os

count = int(os.environ.get("RQ_COUNT", "0"))
line = "resend 2-retrying" if count < 2 else "done ok"
print(f"flaky: RQ_COUNT={count}, sending: {line}", flush=True)
with os.fdopen(3, "w") as pipe:  # fd 3 = RQ_WRITE
    pipe.write(line + "\n")
