"""WSGI middleware in front of the Flask app (SPEC S14.1, S14.2, S1.5).

Owns: path normalisation (runs of `/` collapsed, `.`/`..` resolved, never above
`/`), the `relative_root` prefix (requests outside ROOT get `404 Not Found:
<path>` as text/plain; inside, the prefix moves to SCRIPT_NAME so url_for
builds prefixed URLs), refusing `Expect` values other than `100-continue`
with 417, and the Common Log Format access log, whose values are escaped by
`printable` so that no request can write a line of its own into the log
(issue 13 D6; every log call of web/ that logs request text uses it).
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Iterable
from typing import Any

log = logging.getLogger("rq.web.access")
StartResponse = Callable[..., Any]
WSGIApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]
# C0 and C1 controls (NEL included), DEL, the Unicode line and paragraph separators, and
# the two characters that would make an escaped or quoted value ambiguous.
UNPRINTABLE = re.compile('[\x00-\x1f\x7f-\x9f\u2028\u2029\\\\"]')
SHORT_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def printable(text: object) -> str:
    """`text` on one line, for a log: control characters become `\\n`, `\\xNN` or
    `\\uNNNN`, and backslash and double quote are escaped, as Apache does."""
    return UNPRINTABLE.sub(_escape, str(text))


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    if char in SHORT_ESCAPES:
        return SHORT_ESCAPES[char]
    return f"\\x{ord(char):02x}" if ord(char) < 0x100 else f"\\u{ord(char):04x}"


def wsgi_text(value: str) -> str:
    """A WSGI string (bytes as latin-1, PEP 3333) as the UTF-8 text it carries;
    bytes that are not UTF-8 come out as `\\xNN`."""
    try:
        return value.encode("latin-1").decode("utf-8", "backslashreplace")
    except UnicodeEncodeError:
        return value


def normalize_path(path: str) -> str:
    """Collapse slashes and resolve dot segments; the result starts with '/'."""
    out: list[str] = []
    for part in path.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if out:
                out.pop()
            continue
        out.append(part)
    trailing = "/" if path.endswith("/") and out else ""
    return "/" + "/".join(out) + trailing


class RootMiddleware:
    def __init__(self, app: WSGIApp, relative_root: str) -> None:
        self.app = app
        self.prefix = relative_root.rstrip("/")  # "" for ROOT "/"

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        expect = environ.get("HTTP_EXPECT")
        if expect and expect.strip().lower() != "100-continue":
            return _plain(start_response, "417 Expectation Failed", "417 - Expectation Failed")
        path = normalize_path(environ.get("PATH_INFO") or "/")
        if self.prefix:
            if path != self.prefix and not path.startswith(self.prefix + "/"):
                return _plain(start_response, "404 Not Found", f"Not Found: {path}")
            environ["SCRIPT_NAME"] = environ.get("SCRIPT_NAME", "") + self.prefix
            path = path[len(self.prefix):] or "/"
        environ["PATH_INFO"] = path
        return self.app(environ, start_response)


def _plain(start_response: StartResponse, status: str, text: str) -> list[bytes]:
    body = text.encode("utf-8", "replace")
    start_response(status, [("Content-Type", "text/plain; charset=utf-8"),
                            ("Content-Length", str(len(body)))])
    return [body]


class AccessLog:
    """One Common Log Format line per request (S1.5)."""

    def __init__(self, app: WSGIApp) -> None:
        self.app = app

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        seen: dict[str, Any] = {}

        def recording_start(status: str, headers: list[tuple[str, str]], *exc: Any) -> Any:
            seen["status"] = status.split(" ", 1)[0]
            seen["size"] = next((v for k, v in headers if k.lower() == "content-length"), "-")
            return start_response(status, headers, *exc)

        result = self.app(environ, recording_start)
        user = environ.get("REMOTE_USER") or "-"
        when = time.strftime("%d/%b/%Y:%H:%M:%S %z")
        uri = (environ.get("SCRIPT_NAME", "") + environ.get("PATH_INFO", "")) or "/"
        if environ.get("QUERY_STRING"):
            uri += "?" + environ["QUERY_STRING"]
        values = (environ.get("REMOTE_ADDR", "-"), user, when, environ.get("REQUEST_METHOD"),
                  wsgi_text(uri), environ.get("SERVER_PROTOCOL"))
        log.info('%s - %s [%s] "%s %s %s" %s %s', *map(printable, values),
                 seen.get("status", "-"), seen.get("size", "-"))
        return result
