"""Bulk create over HTTP (issue 15, the remote side of `rq sendmesg --stdin --url`):
`POST /q/NAME/new_messages`, an extension of S15 route 12.

The body is either NDJSON (one JSON object of message fields per line, S4.4;
blank lines skipped), or, with `Content-Type: application/json`, one JSON
array of such objects; a message without `dest` goes to NAME.  The messages
are handed on, in order and in frames of FRAME, to the queue's
`create_messages` stream (rq.queue.createstream), which creates each frame's
messages together, sharing their fsyncs.  Replies:

- `200 ["ok", [FULL_ID, ...]]`: every message created, ids in input order,
  sent only after the queue has answered (after the fsync of the last one);
- `400 ["fail", "line N: REASON", [FULL_ID, ...]]`: line N (the N-th element of
  an array) is not plain JSON (`Invalid JSON`), not a JSON object, or was
  refused by the queue; the ids are those
  of the lines before it, all created; nothing after it is acted on;
- `413` (body over `max_body_bytes`, or more than MAX_MESSAGES messages) and
  the other errors of S14.8 as `["fail", TEXT]`: nothing created.

Host, credentials and CSRF are checked as for every POST (web.security).  Owns
only the parsing of the body and the mapping of replies; the checks of each
message and the creating are the queue process's.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from flask import Blueprint, Response, jsonify, request

from rq import client
from rq.errors import ConnectError
from rq.producer import BulkRefused, BulkSender
from rq.transports import SocketBulk

from .errors import fail
from .views import (backend, finite_float, parse_json, reject_constant, require_not_down,
                    require_queue)

bp = Blueprint("bulkcreate", __name__)

FRAME = 256  # messages per create_messages frame (as rq sendmesg --stdin)
MAX_MESSAGES = 100_000  # per request; above it 413 and nothing is created
DOWN = "status: DOWN"


@bp.post("/q/<name>/new_messages")
def new_messages(name: str) -> Any:
    require_queue(name)
    require_not_down(name)
    items = body_items(request.get_data(cache=False))
    if len(items) > MAX_MESSAGES:
        fail(413, f"Too many messages: more than {MAX_MESSAGES} in one request")
    return create_all(name, items)


def body_items(body: bytes) -> list[tuple[int, bytes | Any]]:
    """(line number, raw line) per non-blank NDJSON line, or (position, element)
    per element of a JSON array body; 400 for an array body that is not one."""
    if request.mimetype == "application/json":
        data = parse_json(body)
        if not isinstance(data, list):
            fail(400, "Invalid JSON: a JSON array of messages expected")
        return list(enumerate(data, 1))
    return [(n, line) for n, line in enumerate(body.split(b"\n"), 1) if line.strip()]


def messages(items: list[tuple[int, bytes | Any]]) -> Iterator[tuple[int, Any]]:
    """(number, message fields) per item, up to and including the first that is
    not a plain JSON object (S0.3.5: no NaN, no number out of range), which is
    yielded as (number, its refusal text)."""
    for number, item in items:
        if isinstance(item, bytes):
            try:
                item = json.loads(item, parse_constant=reject_constant,
                                  parse_float=finite_float)
            except (ValueError, RecursionError):
                yield number, "Invalid JSON"
                return
        if not isinstance(item, dict):
            yield number, "not a JSON object"
            return
        yield number, item


def create_all(name: str, items: list[tuple[int, bytes | Any]]) -> Response:
    numbers: list[int] = []  # of each message sent, in order
    ids: list[str] = []
    try:
        sock = SocketBulk(client.queue_socket(backend().root, name))
    except ConnectError:
        fail(503, "Queue not running")
    with BulkSender(sock) as sender:
        try:
            batch: list[dict[str, Any]] = []
            for number, msg in messages(items):
                if isinstance(msg, str):  # the line's refusal
                    ids += sender.send(batch) + sender.flush() if batch else sender.flush()
                    return refused(number, msg, ids)
                batch.append(msg if "dest" in msg else {**msg, "dest": name})
                numbers.append(number)
                if len(batch) >= FRAME:
                    ids += sender.send(batch)
                    batch = []
            if batch:
                ids += sender.send(batch)
            ids += sender.flush()
        except BulkRefused as exc:
            if exc.reason == DOWN and not exc.ids and not ids:
                fail(503, "Service Unavailable - Operationally Down")
            return refused(numbers[exc.index], exc.reason, ids + exc.ids)
        except ConnectError:
            fail(503, "Queue not running")  # ids created so far are lost to the client
    return jsonify(["ok", ids])


def refused(number: int, reason: str, ids: list[str]) -> Response:
    resp = jsonify(["fail", f"line {number}: {reason}", ids])
    resp.status_code = 400
    return resp
