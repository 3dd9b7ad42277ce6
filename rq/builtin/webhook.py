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
Standalone on purpose: nothing of rq is imported but its neighbour jobio (stdlib only), so it
also runs by hand.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from urllib.parse import urlsplit

if __package__:  # imported as rq.builtin.webhook
    from rq.builtin import jobio
else:  # run as a file (S12): python put this folder first on sys.path
    import jobio  # type: ignore[no-redef]

MAX_RQ_COUNT = 15
TIMEOUT = 30.0
RESEND_STEP = 60  # seconds × RQ_COUNT²


# ================================================================ pure decisions


def start(count: int, url: str) -> str | None:
    """The `fail` line that ends the job before any request, or None to go on."""
    if count > MAX_RQ_COUNT:
        return f"fail RQ_COUNT > {MAX_RQ_COUNT} FAIL"
    scheme = urlsplit(url).scheme.lower() if url else ""
    if scheme not in ("http", "https"):
        # A permanent error: resending could never help (SPEC is silent; see notes).
        return f"fail invalid webhook url in RQ_PARAM1: {jobio.one_line(url)!r}"
    return None


def form(payload: str) -> dict[str, str]:
    return {"x_format": "json", "payload": payload}


def resend_line(count: int, reason: str) -> str:
    """`resend <RQ_COUNT² × 60>-<reason>`: 0, 60, 240, 540 … s."""
    return jobio.resend_status(count, reason, RESEND_STEP)


def outcome(count: int, code: int | None, detail: str) -> str:
    """The status line for a reply `code` (None: no reply, `detail` says why)."""
    if code is not None and 200 <= code < 300:
        return f"done successfull post {code}"
    if code is None:
        return resend_line(count, f"post failed: {detail}")
    return resend_line(count, f"post got HTTP {code}: {detail}")


# ================================================================ IO


def post(url: str, payload: str) -> tuple[int | None, str]:
    """POST the form; (status code, start of the body) or (None, the error)."""
    import requests

    bare, auth = jobio.split_credentials(url)
    try:
        resp = requests.post(bare, data=form(payload), auth=auth, timeout=TIMEOUT)
    except requests.RequestException as err:
        return None, str(err)
    return resp.status_code, resp.content[:jobio.REASON_MAX].decode("utf-8", "replace")


def run(env: Mapping[str, str]) -> int:
    fd = int(env.get("RQ_WRITE") or 3)
    count = jobio.as_count(env.get("RQ_COUNT"))
    url = env.get("RQ_PARAM1", "").strip()
    early = start(count, url)
    if early is not None:
        jobio.send(early, fd)
        return 0
    bare = jobio.split_credentials(url)[0]  # no password in logs
    jobio.log(f"posting to {bare} (try {count + 1})")
    code, detail = post(url, env.get("RQ_PARAM2", ""))
    jobio.send(outcome(count, code, detail), fd)
    return 0


def main() -> int:
    return jobio.run_or_resend(run, "webhook", RESEND_STEP)


if __name__ == "__main__":
    sys.exit(main())
