"""The job side that the builtin queue scripts share (SPEC S6.3, S6.4, S12).

Owns: the log line `<pid> - <time> - <text>` on stdout (the job's stdio.log), the status
line on fd 3 (RQ_WRITE) echoed to that log, and the small texts a status line is made of:
a reason on one bounded line, RQ_COUNT as a number, a URL's embedded credentials taken out
for Basic auth.  Stdlib only, like the scripts: run as a file (`python rq/builtin/relay.py`)
a script finds this module next to it, as the first entry of sys.path; imported as
`rq.builtin.relay` it imports `rq.builtin.jobio`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from urllib.parse import unquote, urlsplit, urlunsplit

REASON_MAX = 300


def log(text: str) -> None:
    stamp = time.strftime("%Y-%m-%d %H:%M:%S %z")
    print(f"{os.getpid()} - {stamp} - {text}", flush=True)


def send(line: str, fd: int = 3) -> None:
    """One status line on RQ_WRITE (S6.4), echoed to the log (S12).  fd 3 stays open: a
    script may send two lines (S12.1 step 1)."""
    log(line)
    data = (line + "\n").encode("utf-8")
    try:
        while data:
            data = data[os.write(fd, data):]
    except OSError:
        pass  # run by hand without fd 3: the log line above is all there is


def one_line(text: str) -> str:
    """Reason texts end up in one pipe line (S6.4): no line breaks, bounded length."""
    flat = " ".join(text.split())
    return flat if len(flat) <= REASON_MAX else flat[:REASON_MAX - 3] + "..."


def as_count(value: object) -> int:
    """RQ_COUNT (S6.2) as a number; 0 when it is missing or no number."""
    try:
        return max(int(str(value)), 0)
    except (TypeError, ValueError):
        return 0


def resend_status(count: int, reason: str, step: int) -> str:
    """Soft fail: `resend <RQ_COUNT² × step>-<reason>` (backoff 0, step, 4 step, 9 step … s)."""
    return f"resend {count * count * step}-{one_line(reason)}"


def split_credentials(url: str) -> tuple[str, tuple[str, str] | None]:
    """`http://user:pass@host/…` → (`http://host/…`, (user, pass)); sent as Basic auth on
    every request (S12.1, S12.2), so they are taken out of the URL once, here."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url, None
    netloc = parts.netloc.rpartition("@")[2]
    bare = urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))
    return bare, (unquote(parts.username or ""), unquote(parts.password or ""))


def run_or_resend(run: Callable[[Mapping[str, str]], int], what: str, step: int) -> int:
    """`run(environment)`; should it raise, the message is resent later with the error as its
    reason (S0.3.3: a failure becomes the message's status, not a trace)."""
    env = dict(os.environ)
    try:
        return run(env)
    except Exception as err:
        send(resend_status(as_count(env.get("RQ_COUNT")), f"{what} error: {err!r}", step),
             int(env.get("RQ_WRITE") or 3))
        return 0
