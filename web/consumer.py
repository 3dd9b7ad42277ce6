"""The pull-consumer HTTP API (SPEC S8.5, S15 route 30).

Owns `POST ROOTconsumer/reserve|report|renew`: reading the body (JSON, or
form fields of the same names; for `reserve` a repeatable `pattern` field
whose values may hold comma-separated lists), the 400 for a missing field,
and passing the request to the manager (which owns the logic, rq.mgr.consumer).
Basic auth, allowed_ips and the CSRF rule apply through web.security like on
every POST (S14); error bodies are JSON (S14.8: `/consumer/…`).
"""

from __future__ import annotations

import time
from typing import Any

from flask import Blueprint, Response, jsonify, request

from .errors import fail
from .limits import take_long_slot
from .views import ask_mgr, json_body

bp = Blueprint("consumer", __name__)

REQUIRED = {"reserve": ("patterns",), "report": ("msg_id", "token", "line"),
            "renew": ("msg_id", "token")}
FIELDS = {"reserve": ("lease", "wait", "consumer"), "report": (), "renew": ("lease",)}
MGR_SLACK = 30.0   # seconds on top of a reservation's `wait` for the manager's reply
MAX_WAIT = 60.0    # S8.2
WAIT_SLICE = 1.0   # seconds of one reserve asked of the manager while a client waits


def request_body(cmd: str) -> dict[str, Any]:
    """The S8.4 object of this request; 400 for a missing field."""
    if request.mimetype == "application/json":
        data = json_body()
        if not isinstance(data, dict):
            fail(400, "Invalid JSON")
    else:
        data = form_body(cmd)
    for name in REQUIRED[cmd]:
        if data.get(name) is None or data.get(name) == "" or data.get(name) == []:
            fail(400, f"missing {name}")
    return data


def form_body(cmd: str) -> dict[str, Any]:
    form = request.form
    data: dict[str, Any] = {k: form[k] for k in (*REQUIRED[cmd], *FIELDS[cmd])
                            if k in form and k != "patterns"}
    if cmd == "reserve":
        values = form.getlist("pattern") + form.getlist("patterns")
        data["patterns"] = [p.strip() for v in values for p in v.split(",") if p.strip()]
    return data


def requested_wait(data: dict[str, Any]) -> float:
    """A valid S8.2 `wait` (0 < wait <= 60), else 0 (the manager judges the value)."""
    try:
        wait = float(data.get("wait") or 0)
    except (TypeError, ValueError):
        return 0.0
    return wait if 0 < wait <= MAX_WAIT else 0.0


def forward(cmd: str) -> Response:
    data = request_body(cmd)
    wait = requested_wait(data) if cmd == "reserve" else 0.0
    if not wait:
        return jsonify(ask_mgr(cmd, data, raw=False, timeout=MGR_SLACK))
    release = take_long_slot()  # S14.1: a long poll never takes a short request's worker
    try:
        return jsonify(wait_for_reserve(data, wait))
    finally:
        release()


def wait_for_reserve(data: dict[str, Any], wait: float) -> Any:
    """S8.2's wait, asked of the manager in slices of at most WAIT_SLICE seconds so
    that a client that has gone (waitress's `client_disconnected`) frees its worker
    within one slice and is not granted a lease after it left (issue 13 D1)."""
    disconnected = request.environ.get("waitress.client_disconnected")
    deadline = time.monotonic() + wait
    while True:
        remaining = max(deadline - time.monotonic(), 0.0)
        slice_ = min(remaining, WAIT_SLICE)
        reply = ask_mgr("reserve", {**data, "wait": slice_}, raw=False,
                        timeout=slice_ + MGR_SLACK)
        if reply != ["ok", None] or remaining <= WAIT_SLICE:
            return reply
        if disconnected is not None and disconnected():
            return reply  # nobody reads it: stop asking


@bp.post("/consumer/reserve")
def reserve() -> Response:
    return forward("reserve")


@bp.post("/consumer/report")
def report() -> Response:
    return forward("report")


@bp.post("/consumer/renew")
def renew() -> Response:
    return forward("renew")
