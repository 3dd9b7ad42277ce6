"""Error responses in the request's format (SPEC S14.8).

Owns `RQHTTPError` (raise `fail(code, text)` from any view) and the one error
handler: JSON requests get `["fail","<text>"]`, `.txt` routes the text
`<code> - <text>`, every other request an HTML page with the layout, the
pending flash, a heading and `<p class="error"><code> - <text></p>`.

An HTML error page without a pending flash is the rendered error.html cut at
two markers (the text and `data-now`) once per (script root, code, heading),
then joined with the escaped text and the time: the same bytes as a rendering,
without Jinja, url_for and the context processors on every 4xx (about a fifth
of the web's CPU under a stream of bad requests, issue 14).  With a flash
pending the page is rendered in full (the flash is shown once, S14.9).
"""

from __future__ import annotations

import time
import traceback
from typing import Any, NoReturn

from flask import Flask, Response, current_app, jsonify, render_template, request, session
from flask.globals import request_ctx
from markupsafe import Markup, escape
from werkzeug.exceptions import HTTPException

from .wsgi import printable

HEADINGS = {400: "Bad Request", 401: "Unauthorized", 403: "Forbidden", 404: "Not Found",
            405: "Method Not Allowed", 413: "Payload Too Large", 416: "Range Not Satisfiable",
            417: "Expectation Failed", 500: "Internal Server Error", 503: "Service Unavailable"}
DEFAULT_TEXT = {404: "Not Found", 405: "Method Not Allowed", 413: "Request Entity Too Large",
                400: "Bad Request", 500: "Internal Server Error"}


class RQHTTPError(HTTPException):
    def __init__(self, code: int, text: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(description=text)
        self.code = code
        self.text = text
        self.extra_headers = headers or {}


def fail(code: int, text: str, headers: dict[str, str] | None = None) -> NoReturn:
    raise RQHTTPError(code, text, headers)


def wants_json(code: int = 200) -> bool:
    path = request.path
    if path.endswith((".json", "/new_messages")) or path == "/search" \
            or path.startswith("/consumer/"):
        return True
    try:  # a refused body (413) is never parsed again for its x_format
        fmt = request.values.get("x_format") if code != 413 else request.args.get("x_format")
    except HTTPException:  # the body itself was refused (e.g. 413): use the query only
        fmt = request.args.get("x_format")
    if fmt == "json":
        return True
    return bool(request.mimetype == "application/json")


def wants_text() -> bool:
    return request.path.endswith(".txt")


def render_error(code: int, text: str, headers: dict[str, str] | None = None) -> Response:
    if wants_json(code):
        resp = jsonify(["fail", text])
    elif wants_text():
        resp = Response(f"{code} - {text}", mimetype="text/plain")
    else:
        resp = Response(error_page(code, text, HEADINGS.get(code, "Error")),
                        mimetype="text/html")
    resp.status_code = code
    for key, value in (headers or {}).items():
        resp.headers[key] = value
    return resp


TEXT_MARK = "\x00rq-error-text\x00"   # cannot come from the config or a template
NOW_MARK = "\x00rq-error-now\x00"
PAGES_KEPT = 64  # (script root, code, heading) keys; a new key past it starts a new cache


def error_page(code: int, text: str, heading: str) -> str:
    """error.html for this request: from the cut page when no flash is pending (the
    check does not mark the session accessed, as get_flashed_messages would not)."""
    if request_ctx.flashes is not None or "_flashes" in session:
        return render_template("error.html", code=code, text=text, heading=heading)
    pages: dict[tuple[str, int, str], tuple[str, str, str] | None] = \
        current_app.extensions.setdefault("rq_error_pages", {})
    key = (request.script_root, code, heading)
    if key not in pages:
        if len(pages) >= PAGES_KEPT:
            pages.clear()
        pages[key] = cut_page(code, heading)
    parts = pages.get(key)
    if parts is None:  # the markers did not each appear once: render every time
        return render_template("error.html", code=code, text=text, heading=heading)
    head, middle, tail = parts
    return f"{head}{int(time.time())}{middle}{escape(text)}{tail}"


def cut_page(code: int, heading: str) -> tuple[str, str, str] | None:
    html = render_template("error.html", code=code, text=Markup(TEXT_MARK), heading=heading,
                           ui_now=Markup(NOW_MARK))
    if html.count(NOW_MARK) != 1 or html.count(TEXT_MARK) != 1 \
            or html.index(NOW_MARK) > html.index(TEXT_MARK):
        return None
    head, _, rest = html.partition(NOW_MARK)
    middle, _, tail = rest.partition(TEXT_MARK)
    return head, middle, tail


def install(app: Flask) -> None:
    @app.errorhandler(HTTPException)
    def handle(exc: HTTPException) -> Any:
        if isinstance(exc, RQHTTPError):
            return render_error(exc.code or 500, exc.text, exc.extra_headers)
        code = exc.code or 500
        resp = render_error(code, DEFAULT_TEXT.get(code, exc.name))
        if code == 405 and exc.get_response().headers.get("Allow"):
            resp.headers["Allow"] = exc.get_response().headers["Allow"]
        return resp

    @app.errorhandler(Exception)
    def crash(exc: Exception) -> Any:
        # The traceback's frames are ours; the path and the exception's text may
        # carry request text, so they are escaped (issue 13 D6).
        frames = "".join(traceback.format_tb(exc.__traceback__))
        app.logger.error("unhandled error on %s\nTraceback (most recent call last):\n%s%s",
                         printable(request.path), frames,
                         printable(f"{type(exc).__qualname__}: {exc}"))
        return render_error(500, "Internal Server Error")
