"""What the views of every blueprint share, defined once (STYLE: like the Flask
tutorial's `get_db()`): the app's config and backend, the checks that answer a
404, 403 or 503 before any path is built, asking the manager or a queue
process, reading a JSON file named in a request safely, and the reply helpers
(JSON when asked for, else a flash and a 303 to a URL under ROOT, S14.9,
S14.10).  Blueprints import this module (and web.queues), never each other.
"""

from __future__ import annotations

import json
import os
from typing import Any
from urllib.parse import quote

from flask import Response, current_app, request
from werkzeug.urls import iri_to_uri

from rq import protocol
from rq.config import MainConfig
from rq.errors import ConnectError

from .backend import Backend
from .errors import fail

DOWN = "Service Unavailable - Operationally Down"
MAX_CONFIG_BYTES = 16 * 1024 * 1024


# ---------------------------------------------------------------- the app's config


def backend() -> Backend:
    return current_app.config["RQ_BACKEND"]  # type: ignore[no-any-return]


def main_config() -> MainConfig:
    return current_app.config["RQ_MAIN"]  # type: ignore[no-any-return]


# ---------------------------------------------------------------- checks (S15)


def require_queue(name: str) -> None:
    if not backend().queue_exists(name):  # checks the name before building a path
        fail(404, "Queue not found")


def require_message(name: str, msg_id: str) -> None:
    require_queue(name)
    if not protocol.valid_msg_id(msg_id):
        fail(404, "Message ID not found")


def require_queue_creation() -> None:
    if not main_config().allow_new_queue:
        fail(403, "Queue creation not allowed at this time.")


def flag(name: str, suffix: str) -> bool:
    """The admin flag file config/NAME.<suffix> (S3.5)."""
    return os.path.exists(os.path.join(main_config().root, "config", f"{name}.{suffix}"))


def require_not_down(name: str) -> None:
    """Routes 17-27 on a DOWN queue (S15)."""
    if flag(name, "down"):
        fail(503, DOWN)


# ---------------------------------------------------------------- asking the processes


def ask_mgr(cmd: str, arg: Any, *, raw: bool = True, timeout: float = 30.0) -> Any:
    """The manager's reply; 503 when it does not answer."""
    reply = backend().mgr(cmd, arg, raw=raw, timeout=timeout)
    if reply is None:
        fail(503, "QueueMgr not running")
    return reply


def ask_queue(name: str, cmd: str, arg: Any, timeout: float = 60.0) -> Any:
    """The queue's reply to a message command; 503 while the queue is DOWN
    (its flag file, S3.5, or its own answer) or when its process does not answer."""
    if os.path.lexists(os.path.join(backend().root, "config", f"{name}.down")):
        fail(503, DOWN)
    try:
        reply = backend().queue(name, cmd, arg, timeout=timeout)
    except ConnectError:
        fail(503, "Queue not running")
    if reply == ["fail", "status: DOWN"]:
        fail(503, DOWN)
    return reply


def is_ok(reply: Any) -> bool:
    return isinstance(reply, list) and reply[:1] == ["ok"]


def ok_payload(reply: Any, kind: type) -> Any:
    """X of a `["ok", X]` reply when X is a `kind`, else None."""
    if isinstance(reply, list) and len(reply) == 2 and reply[0] == "ok" \
            and isinstance(reply[1], kind):
        return reply[1]
    return None


def first(reply: Any) -> Any:
    return reply[0] if isinstance(reply, list) and reply else None


# ---------------------------------------------------------------- reading files


def read_json_file(path: str) -> Any:
    """The JSON in a regular file (absolute, or relative to the root), or None."""
    full = os.path.join(backend().root, path)
    if not path or not os.path.isfile(full):  # no FIFOs or devices: they could block
        return None
    try:
        with open(full, "rb") as f:
            data = f.read(MAX_CONFIG_BYTES + 1)
        return None if len(data) > MAX_CONFIG_BYTES else json.loads(data)
    except (OSError, ValueError, RecursionError):
        return None


def read_int_file(path: str) -> int | None:
    try:
        with open(path, encoding="ascii") as fh:
            return int(fh.read().strip())
    except (OSError, ValueError):
        return None


def reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not plain JSON")  # S0.3.5: no NaN/Infinity


class NumberOutOfRange(ValueError):
    pass


def finite_float(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):  # 1e999: no JSON can carry it on (S0.3.5)
        raise NumberOutOfRange(text[:40])
    return value


def parse_json(raw: str | bytes) -> Any:
    """A request's JSON text; 400 when it is not plain JSON, nests too deep or holds a
    number out of range (issue 13 D9: a bad body is a 400, never a 500)."""
    try:
        return json.loads(raw, parse_constant=reject_constant, parse_float=finite_float)
    except NumberOutOfRange as exc:
        fail(400, f"Invalid JSON: number out of range: {exc}")
    except (TypeError, ValueError, RecursionError):
        fail(400, "Invalid JSON")


def json_body() -> Any:
    """The request body as JSON, read only up to `max_body_bytes` (413 above it)."""
    return parse_json(request.get_data(cache=True))


# ---------------------------------------------------------------- replies and URLs


def wants_reply() -> bool:
    return request.values.get("x_format") == "json"


def text_response(text: str) -> Response:
    return Response(text, mimetype="text/plain")  # Flask adds charset=utf-8


def root_url() -> str:
    """ROOT as the browser sees it (the prefix sits in SCRIPT_NAME)."""
    return request.script_root + "/"


def queue_url(name: str) -> str:
    return f"{root_url()}q/{quote(name, safe='')}"


def page_url(*parts: str) -> str:
    """Absolute URL of ROOT + the parts, each URL-encoded (ROOT is in SCRIPT_NAME)."""
    return request.url_root + "/".join(quote(part, safe="") for part in parts)


def safe_back() -> str | None:
    """`back` as an absolute URL when it is a path on this server (S14.10)."""
    back = request.values.get("back")
    if not back or not back.startswith("/") or back.startswith("//"):
        return None
    if "\\" in back or not back.isprintable():  # browsers read "/\host" as "//host"
        return None
    return request.host_url.rstrip("/") + iri_to_uri(back)


def back_or(default: str) -> str:
    return safe_back() or default
