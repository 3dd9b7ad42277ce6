"""Named event cursors on the web (issue 18 item 3; docs/guide/cursors.md):
the Cursors page (S16 style: name, patterns, position, lag in events, last ack
time, state), its JSON twin `cursors.json`, `POST cursors/NAME/delete`, and
`POST events/ack` (an SSE client's explicit acknowledgement of `id` on its
cursor).  Every change is one manager command (rq.mgr.cursors owns the state).
"""

from __future__ import annotations

from typing import Any

from flask import Blueprint, Response, flash, jsonify, redirect, render_template, request

from rq import protocol

from .errors import fail
from .views import ask_mgr, is_ok, json_body, page_url, wants_reply

bp = Blueprint("cursors", __name__)


def cursor_rows() -> list[dict[str, Any]]:
    reply = ask_mgr("cursors", {}, raw=False)
    if not is_ok(reply) or not isinstance(reply[1], list):
        fail(500, f"QueueMgr answered {protocol.dumps(reply)}")
    return reply[1]


@bp.get("/cursors")
def cursors_page() -> str:
    return render_template("cursors.html", cursors=cursor_rows())


@bp.get("/cursors.json")
def cursors_json() -> Response:
    return jsonify(cursor_rows())


@bp.post("/cursors/<name>/delete")
def delete_cursor(name: str) -> Any:
    reply = ask_mgr("delete_cursor", name)
    if wants_reply():
        return jsonify(reply)
    if not is_ok(reply):
        fail(404 if str(reply[1:2]).startswith("['no such") else 400, str(reply[1]))
    flash(f"Cursor {name} deleted")
    return redirect(page_url("cursors"), 303)


@bp.post("/events/ack")
def ack() -> Response:
    """`cursor` and `id` (form fields or a JSON object): acknowledge that event
    and everything sent before it on the cursor's stream, durably."""
    data = json_body() if request.mimetype == "application/json" else request.values
    if not isinstance(data, dict) and not hasattr(data, "get"):
        fail(400, "bad request")
    name, pos = data.get("cursor"), data.get("id")
    if not isinstance(name, str) or not isinstance(pos, str):
        fail(400, "missing cursor or id")
    reply = ask_mgr("ack_cursor", {"cursor": name, "pos": pos}, raw=False)
    if not is_ok(reply):
        fail(404 if str(reply[1]).startswith("no such cursor") else 400, str(reply[1]))
    return jsonify({"cursor": name, "position": reply[2]})
