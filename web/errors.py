"""Error responses in the request's format (SPEC S14.8).

Owns `RQHTTPError` (raise `fail(code, text)` from any view) and the one error
handler: JSON requests get `["fail","<text>"]`, `.txt` routes the text
`<code> - <text>`, every other request an HTML page with the layout, the
pending flash, a heading and `<p class="error"><code> - <text></p>`.
"""

from __future__ import annotations

import traceback
from typing import Any, NoReturn

from flask import Flask, Response, jsonify, render_template, request
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
        html = render_template("error.html", code=code, text=text,
                               heading=HEADINGS.get(code, "Error"))
        resp = Response(html, mimetype="text/html")
    resp.status_code = code
    for key, value in (headers or {}).items():
        resp.headers[key] = value
    return resp


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
