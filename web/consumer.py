"""The pull-consumer HTTP API (SPEC S8.5, S15 route 30).

Owns `POST ROOTconsumer/reserve|report|renew`: reading the body (JSON, or
form fields of the same names; for `reserve` a repeatable `pattern` field
whose values may hold comma-separated lists), the 400 for a missing field,
and passing the request to the manager (which owns the logic, rq.mgr.consumer).
Basic auth, allowed_ips and the CSRF rule apply through web.security like on
every POST (S14); error bodies are JSON (S14.8: `/consumer/…`).
"""

from __future__ import annotations

from typing import Any

from flask import Blueprint, Response, jsonify, request

from .errors import fail
from .views import ask_mgr

bp = Blueprint("consumer", __name__)

REQUIRED = {"reserve": ("patterns",), "report": ("msg_id", "token", "line"),
            "renew": ("msg_id", "token")}
FIELDS = {"reserve": ("lease", "wait", "consumer"), "report": (), "renew": ("lease",)}
MGR_SLACK = 30.0   # seconds on top of a reservation's `wait` for the manager's reply


def request_body(cmd: str) -> dict[str, Any]:
    """The S8.4 object of this request; 400 for a missing field."""
    if request.mimetype == "application/json":
        data = request.get_json(silent=True)
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


def wait_of(data: dict[str, Any]) -> float:
    try:
        return min(max(float(data.get("wait") or 0), 0.0), 60.0)
    except (TypeError, ValueError):
        return 0.0


def forward(cmd: str) -> Response:
    data = request_body(cmd)
    timeout = wait_of(data) + MGR_SLACK if cmd == "reserve" else MGR_SLACK
    return jsonify(ask_mgr(cmd, data, raw=False, timeout=timeout))


@bp.post("/consumer/reserve")
def reserve() -> Response:
    return forward("reserve")


@bp.post("/consumer/report")
def report() -> Response:
    return forward("report")


@bp.post("/consumer/renew")
def renew() -> Response:
    return forward("renew")
