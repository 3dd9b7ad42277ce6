#!/usr/bin/env python3
"""The `webhook` builtin queue script (SPEC S12.2): notifies one URL that a message finished.

The trigger lives in the queue process (S6.6, `fire_webhooks`): for each URL in a finished
message's `post_run_webhook` it creates a `webhook` message with `param1` = the URL and
`param2` = the compact JSON of the finished message.  This job POSTs that payload as a form
(`x_format=json`, `payload=<RQ_PARAM2>`, timeout 30 s): a 2xx reply ends it with
`done successfull post <code>` (sic); anything else, a network error included, with
`resend <RQ_COUNT² × 60>-<reason>`.  Credentials embedded in the URL are sent as Basic auth.

The decisions are pure functions (`start`, `outcome`); `post` is the only IO.  Log lines
`<pid> - <time> - <text>` go to stdout, status lines to fd 3 (RQ_WRITE) and the log (S12).
Standalone on purpose: nothing of rq is imported, so it also runs by hand.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Mapping
from urllib.parse import unquote, urlsplit, urlunsplit

MAX_RQ_COUNT = 15
TIMEOUT = 30.0
REASON_MAX = 300


# ================================================================ pure decisions


def as_count(value: object) -> int:
    try:
        return max(int(str(value)), 0)
    except (TypeError, ValueError):
        return 0


def one_line(text: str) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= REASON_MAX else flat[:REASON_MAX - 3] + "..."


def start(count: int, url: str) -> str | None:
    """The `fail` line that ends the job before any request, or None to go on."""
    if count > MAX_RQ_COUNT:
        return f"fail RQ_COUNT > {MAX_RQ_COUNT} FAIL"
    scheme = urlsplit(url).scheme.lower() if url else ""
    if scheme not in ("http", "https"):
        # A permanent error: resending could never help (SPEC is silent; see notes).
        return f"fail invalid webhook url in RQ_PARAM1: {one_line(url)!r}"
    return None


def form(payload: str) -> dict[str, str]:
    return {"x_format": "json", "payload": payload}


def resend_line(count: int, reason: str) -> str:
    """`resend <RQ_COUNT² × 60>-<reason>`: 0, 60, 240, 540 … s."""
    return f"resend {count * count * 60}-{one_line(reason)}"


def outcome(count: int, code: int | None, detail: str) -> str:
    """The status line for a reply `code` (None: no reply, `detail` says why)."""
    if code is not None and 200 <= code < 300:
        return f"done successfull post {code}"
    if code is None:
        return resend_line(count, f"post failed: {detail}")
    return resend_line(count, f"post got HTTP {code}: {detail}")


def split_credentials(url: str) -> tuple[str, tuple[str, str] | None]:
    """`http://user:pass@host/…` → (`http://host/…`, (user, pass)) for Basic auth."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url, None
    netloc = parts.netloc.rpartition("@")[2]
    bare = urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))
    return bare, (unquote(parts.username or ""), unquote(parts.password or ""))


# ================================================================ IO


def log(text: str) -> None:
    stamp = time.strftime("%Y-%m-%d %H:%M:%S %z")
    print(f"{os.getpid()} - {stamp} - {text}", flush=True)


def send(line: str, fd: int = 3) -> None:
    """One status line on RQ_WRITE (S6.4), echoed to the log (S12)."""
    log(line)
    data = (line + "\n").encode("utf-8")
    try:
        while data:
            data = data[os.write(fd, data):]
    except OSError:
        pass  # run by hand without fd 3: the log line above is all there is


def post(url: str, payload: str) -> tuple[int | None, str]:
    """POST the form; (status code, start of the body) or (None, the error)."""
    import requests

    bare, auth = split_credentials(url)
    try:
        resp = requests.post(bare, data=form(payload), auth=auth, timeout=TIMEOUT)
    except requests.RequestException as err:
        return None, str(err)
    return resp.status_code, resp.content[:REASON_MAX].decode("utf-8", "replace")


def run(env: Mapping[str, str]) -> int:
    fd = int(env.get("RQ_WRITE") or 3)
    count = as_count(env.get("RQ_COUNT"))
    url = env.get("RQ_PARAM1", "").strip()
    early = start(count, url)
    if early is not None:
        send(early, fd)
        return 0
    log(f"posting to {split_credentials(url)[0]} (try {count + 1})")  # no password in logs
    code, detail = post(url, env.get("RQ_PARAM2", ""))
    send(outcome(count, code, detail), fd)
    return 0


def main() -> int:
    try:
        return run(dict(os.environ))
    except Exception as err:  # S0.3.3: a failure becomes the message's status, not a trace
        send(resend_line(as_count(os.environ.get("RQ_COUNT")), f"webhook error: {err!r}"),
             int(os.environ.get("RQ_WRITE") or 3))
        return 0


if __name__ == "__main__":
    sys.exit(main())
