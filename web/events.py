"""Event subscriptions over HTTP (SPEC S8.8, S15 route 31): `GET /events`,
also of a named cursor (`cursor=NAME`, issue 18; docs/guide/cursors.md).

Owns: turning `pattern` (repeatable; a value may hold several patterns
separated by commas, as in S8.5) and `since` into a `subscribe` on the
manager socket (the manager's event hub does the following, filtering and
buffering), and relaying the stream as Server-Sent Events: `event: transition`
with `data: <event JSON incl. topic>`, an overflow record as `event: overflow`,
and a `: keepalive` comment after KEEPALIVE_SECONDS without output.  Basic
auth and the other S14 checks run before the view (web.security).

Each open stream holds one waitress worker, one long-request slot (web.limits:
503 when none is free) and one manager connection; it ends when the client
goes away (checked every POLL_SECONDS) or the manager ends the stream.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from flask import Blueprint, Response, current_app, request

from rq import client, topics
from rq.errors import ConnectError, Fail
from .errors import fail
from .limits import HeldBody, take_long_slot

bp = Blueprint("events", __name__)

KEEPALIVE_SECONDS = 15.0  # S8.8; app.config["RQ_STREAM_KEEPALIVE"] overrides it (tests)
POLL_SECONDS = 1.0        # how often a quiet stream checks that its client is still there
HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def request_patterns(required: bool = True) -> list[str]:
    patterns = [p.strip() for value in request.args.getlist("pattern")
                for p in value.split(",") if p.strip()]
    if not patterns:
        if not required:
            return []
        fail(400, "missing pattern")
    try:
        return list(topics.check_patterns(patterns))
    except Fail as exc:
        fail(400, str(exc))


def request_since() -> float | None:
    raw = request.args.get("since")
    if raw is None or raw == "":
        return None
    try:
        since = float(raw)
    except ValueError:
        fail(400, "invalid since")
    if not since >= 0 or since == float("inf"):
        fail(400, "invalid since")
    return since


def sse_record(payload: Any) -> bytes:
    """One SSE record; a named cursor's events carry their position as the
    record's `id` (the browser sends it back as Last-Event-ID on reconnect)."""
    kind = "transition"
    if isinstance(payload, list):  # the manager ended the stream (a cursor deleted, ...)
        kind = "end"
    elif payload.get("event") in ("overflow", "gap"):
        kind = payload["event"]
    pos = payload.pop("pos", None) if isinstance(payload, dict) else None
    data = json.dumps(payload, separators=(",", ":"), ensure_ascii=False)
    head = f"id: {pos}\n" if isinstance(pos, str) and pos.isprintable() else ""
    return f"{head}event: {kind}\ndata: {data}\n\n".encode()


def request_cursor() -> tuple[str | None, str | None]:
    """Issue 18: `cursor=NAME`, and the position to acknowledge first
    (`Last-Event-ID`, or `last_id=` for clients that cannot set headers)."""
    name = request.args.get("cursor") or None
    last = request.headers.get("Last-Event-ID") or request.args.get("last_id") or None
    return name, last


@bp.route("/events")
def events() -> Response:
    cursor, last_id = request_cursor()
    patterns = request_patterns(required=cursor is None)
    since = request_since()
    if request.method == "HEAD":
        return Response(status=200, mimetype="text/event-stream", headers=HEADERS)
    root = current_app.config["RQ_MAIN"].root
    release = take_long_slot()  # S14.1: a stream never takes a short request's worker
    try:
        sub = client.subscribe(root, patterns, since, cursor=cursor, last_id=last_id)
    except ConnectError:
        release()
        fail(503, "QueueMgr not running")
    except Fail as exc:
        release()
        fail(404 if str(exc).endswith("give patterns to create it") else 400, str(exc))
    keepalive = float(current_app.config.get("RQ_STREAM_KEEPALIVE", KEEPALIVE_SECONDS))
    body = stream(sub, keepalive, request.environ.get("waitress.client_disconnected"))
    return Response(HeldBody(body, release), mimetype="text/event-stream", headers=HEADERS,
                    direct_passthrough=True)


def stream(sub: client.Subscription, keepalive: float,
           disconnected: Any) -> Iterator[bytes]:
    """The body: a first comment (so the headers go out at once), then the
    events; closes the manager connection in every case."""
    import time

    try:
        yield b": subscribed\n\n"
        last = time.monotonic()
        while not (disconnected and disconnected()):
            try:
                payload = sub.next(min(POLL_SECONDS, keepalive))
            except ConnectError:
                return  # rq-mgr ended the stream (it is stopping)
            now = time.monotonic()
            if isinstance(payload, list) and payload[:1] == ["fail"]:
                yield sse_record(payload)
                return
            if isinstance(payload, dict):
                yield sse_record(payload)
                last = now
            elif now - last >= keepalive:
                yield b": keepalive\n\n"
                last = now
    finally:
        sub.close()
