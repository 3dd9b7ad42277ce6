"""Cross-cutting request checks (SPEC S14.3–S14.6), run before every view.

Owns: the Host header check (against DNS rebinding), the client address
filter (prefixes or CIDR networks), HTTP Basic auth with constant-time
comparison, the CSRF rule for POSTs (Origin / Sec-Fetch-Site), and the manager
check (503 while rq-mgr does not answer, except /metrics).  Order: Host,
address, auth, CSRF, manager.

Why the Host check: a page on another site can rebind its own name to this
server's address; the browser then sends that page's requests here with
`Host: evil.example` and `Origin: http://evil.example`, which the CSRF rule
sees as same-origin.  Only names this server is known by are answered.
"""

from __future__ import annotations

import base64
import hmac
import ipaddress
from typing import Any

from flask import Flask, current_app, request

from .errors import fail


def host_name(header: str) -> str:
    """The name part of a Host header (`[::1]:3333` → `::1`), lower case,
    without a trailing dot."""
    name = header.strip()
    if name.startswith("["):
        name = name[1:].partition("]")[0]
    elif name.count(":") == 1:
        name = name.partition(":")[0]
    return name.rstrip(".").lower()


def host_allowed(header: str | None, known: tuple[str, ...]) -> bool:
    """Whether a request's Host may be answered: a loopback name
    (`localhost`, `*.localhost`), an IP literal (a rebinding page always names
    its own host), one of `known` (the configured host and addr plus
    `allowed_hosts`), where `*` admits every name and `.example.com` admits
    example.com and its subdomains.  No Host at all (HTTP/1.0 tools) is allowed:
    every browser sends one."""
    if header is None:
        return True
    name = host_name(header)
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        ipaddress.ip_address(name)
        return True
    except ValueError:
        pass
    for entry in known:
        entry = entry.rstrip(".").lower()
        if entry == "*" or name == entry or \
                (entry.startswith(".") and (name == entry[1:] or name.endswith(entry))):
            return True
    return False


def known_hosts(main: Any) -> tuple[str, ...]:
    """The names this server answers to besides loopback and IP literals."""
    return (main.host, main.addr, *main.allowed_hosts)


def client_allowed(addr: str, allowed: tuple[str, ...] | None) -> bool:
    if not allowed:
        return True
    for entry in allowed:
        if "/" in entry:
            try:
                if ipaddress.ip_address(addr) in ipaddress.ip_network(entry, strict=False):
                    return True
            except ValueError:
                continue
        elif addr.startswith(entry):
            return True
    return False


def credentials_ok(header: str | None, users: dict[str, str]) -> bool:
    if not header or not header.lower().startswith("basic "):
        return False
    try:
        user, _, password = base64.b64decode(header[6:].strip()).decode("utf-8").partition(":")
    except (ValueError, UnicodeDecodeError):
        return False
    ok = False
    for name, secret in users.items():  # compare with every entry: no timing hint
        same_user = hmac.compare_digest(name.encode(), user.encode())
        same_pass = hmac.compare_digest(str(secret).encode(), password.encode())
        ok |= same_user and same_pass
    return ok


def cross_origin_refused(headers: Any, trusted: tuple[str, ...]) -> bool:
    """S14.5 for one POST."""
    origin = headers.get("Origin")
    if origin is not None and origin in trusted:
        return False
    site = headers.get("Sec-Fetch-Site")
    if site is not None:
        return site not in ("same-origin", "none")
    if origin is not None:
        if origin == "null":
            return True
        scheme = headers.get("X-Forwarded-Proto") or "http"
        return origin != f"{scheme}://{headers.get('Host', '')}"
    return False


def install(app: Flask) -> None:
    app.config["RQ_HOSTS"] = known_hosts(app.config["RQ_MAIN"])

    @app.before_request
    def check_request() -> None:
        if request.method == "OPTIONS":  # S14.1: only GET, HEAD and POST
            fail(405, "Method Not Allowed", {"Allow": "GET, HEAD, POST"})
        main = current_app.config["RQ_MAIN"]
        if not host_allowed(request.headers.get("Host"), current_app.config["RQ_HOSTS"]):
            fail(400, "Invalid Host header")
        if not client_allowed(request.remote_addr or "", main.allowed_ips):
            fail(403, "Forbidden")
        auth = main.basic_auth
        if auth and not credentials_ok(request.headers.get("Authorization"),
                                       dict(auth.get("users") or {})):
            realm = str(auth.get("realm") or "RQ").replace('"', "'")
            fail(401, "Unauthorized", {"WWW-Authenticate": f'Basic realm="{realm}"'})
        if request.method == "POST" and \
                cross_origin_refused(request.headers, tuple(main.csrf_trusted_origins)):
            fail(403, "Cross-origin request refused")
        if request.path != "/metrics" and request.endpoint != "static" \
                and not current_app.config["RQ_BACKEND"].mgr_alive():
            fail(503, "QueueMgr not running")
