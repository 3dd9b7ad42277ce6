"""HTTP for the builtin queue scripts (SPEC S12): a small HTTP/1.1 client on http.client.

Owns the requests a builtin job makes to another server: URL-encoded forms and multipart
uploads (the file streamed from disk, its length announced), Basic auth, one kept-alive
connection per origin, connect and read timeouts, and (unless `proxies=False`, as check_rq
asks) the environment's proxy settings as requests reads them (`http_proxy`, `https_proxy`,
`all_proxy`, lower case first; `no_proxy`; credentials in a proxy URL go out as
Proxy-Authorization; https through a proxy is a CONNECT tunnel).  TLS is verified against
the system's CA store (ssl.create_default_context; SSL_CERT_FILE overrides it), or against
the bundle REQUESTS_CA_BUNDLE or CURL_CA_BUNDLE names, as with requests.

Stdlib only, like jobio, and for start-up cost: a builtin job is a process per attempt, and
importing requests cost it about twice the rest of its start-up (python -X importtime);
http.client, and urllib.request only when a proxy variable is set, are imported on first use.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterator
    from typing import Any

if __package__:  # imported as rq.builtin.jobhttp
    from rq.builtin import jobio
else:  # a builtin script run as a file: its folder is first on sys.path
    import jobio  # type: ignore[no-redef]


class RemoteError(Exception):
    """A request that got no usable HTTP reply (connect, send, TLS, read, a bad URL)."""


class Client:
    """HTTP/1.1 requests; every call returns (status code, body) and raises one of
    `self.errors` when no reply came.  One kept-alive connection per origin (the proxy's,
    through a proxy); redirects are not followed."""

    def __init__(self, auth: tuple[str, str] | None, connect_timeout: float,
                 read_timeout: float, *, proxies: bool = True) -> None:
        import http.client  # imported here so that importing this module costs nothing

        self.http = http.client
        self.connect_timeout, self.read_timeout = connect_timeout, read_timeout
        # UnicodeError: a header value (a host name) http.client cannot encode as Latin-1
        self.errors: tuple[type[BaseException], ...] = (
            OSError, http.client.HTTPException, UnicodeError, RemoteError)
        self.auth = basic_auth(auth) if auth else None
        self.conns: dict[tuple[str, ...], Any] = {}
        self.proxies = proxies  # False: the environment's proxy settings are ignored

    def get(self, url: str) -> tuple[int, bytes]:
        return self.request("GET", url, b"", {})

    def post_form(self, url: str, form: dict[str, str]) -> tuple[int, bytes]:
        from urllib.parse import urlencode
        return self.request("POST", url, urlencode(form).encode("ascii"),
                            {"Content-Type": "application/x-www-form-urlencoded"})

    def post_file(self, url: str, form: dict[str, str], name: str,
                  path: str) -> tuple[int, bytes]:
        """multipart/form-data: the form fields, then the file as `filedata`, streamed from
        disk with its length announced."""
        boundary = os.urandom(16).hex()
        head = b"".join(
            multipart_head(boundary, f'name="{quote_param(key)}"') + value.encode("utf-8")
            + b"\r\n" for key, value in form.items())
        head += multipart_head(boundary, f'name="filedata"; filename="{quote_param(name)}"',
                               "application/octet-stream")
        tail = f"\r\n--{boundary}--\r\n".encode("ascii")
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size

            def body() -> Iterator[bytes]:
                yield head
                left = size
                while left > 0 and (chunk := f.read(min(left, 1 << 16))):
                    left -= len(chunk)
                    yield chunk
                if left:
                    raise RemoteError(f"{name} shrank while being sent")
                yield tail
            return self.request("POST", url, body(), {
                "Content-Type": f"multipart/form-data; boundary={boundary}",
                "Content-Length": str(len(head) + size + len(tail))})

    def request(self, method: str, url: str, body: bytes | Iterator[bytes],
                headers: dict[str, str]) -> tuple[int, bytes]:
        from urllib.parse import quote, urlsplit
        try:
            parts = urlsplit(url)
            host, port = parts.hostname, parts.port
        except ValueError as err:
            raise RemoteError(f"invalid URL {url!r}: {err}") from None
        if parts.scheme not in ("http", "https") or not host:
            raise RemoteError(f"invalid URL {url!r}")
        port = port or (443 if parts.scheme == "https" else 80)
        netloc = parts.netloc.rpartition("@")[2]
        target = quote((parts.path or "/") + (f"?{parts.query}" if parts.query else ""),
                       safe="!#$%&'()*+,/:;=?@[]~")   # as requests requotes a URL
        headers = {"Host": netloc, "Accept": "*/*", "User-Agent": "rq-builtin", **headers}
        if self.auth:
            headers["Authorization"] = self.auth
        proxy = self.proxy_for(parts.scheme, netloc)
        if proxy is not None and parts.scheme == "http":
            target = f"http://{netloc}{target}"   # absolute form, to the proxy
            if proxy[3]:
                headers["Proxy-Authorization"] = proxy[3]
        if isinstance(body, bytes):
            headers["Content-Length"] = str(len(body))
        key = (parts.scheme, host, str(port), *(proxy or ()))
        conn = self.conns.get(key)
        if conn is not None and dropped(conn):
            del self.conns[key]
            conn.close()
            conn = None
        if conn is None:
            conn = self.conns[key] = self.connect(parts.scheme, host, port, proxy)
        try:
            conn.request(method, target, body=body, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
        except BaseException:
            del self.conns[key]
            conn.close()
            raise
        if conn.sock is None:   # the reply closed it: the next request connects anew
            del self.conns[key]
        return resp.status, data

    def connect(self, scheme: str, host: str, port: int,
                proxy: tuple[str, str, int, str | None] | None) -> Any:
        """A connected connection: connect_timeout to connect, read_timeout on each read."""
        conn: Any
        if scheme == "https":
            import ssl
            bundle = os.environ.get("REQUESTS_CA_BUNDLE") or os.environ.get("CURL_CA_BUNDLE")
            ctx = ssl.create_default_context(cafile=bundle or None)
            if proxy is None:
                conn = self.http.HTTPSConnection(host, port, timeout=self.connect_timeout,
                                                 context=ctx)
            else:
                conn = self.http.HTTPSConnection(proxy[1], proxy[2], timeout=self.connect_timeout,
                                                 context=ctx)
                tunnel = {"Proxy-Authorization": proxy[3]} if proxy[3] else None
                conn.set_tunnel(host, port, headers=tunnel)
        elif proxy is not None:
            conn = self.http.HTTPConnection(proxy[1], proxy[2], timeout=self.connect_timeout)
        else:
            conn = self.http.HTTPConnection(host, port, timeout=self.connect_timeout)
        conn.connect()
        conn.sock.settimeout(self.read_timeout)
        return conn

    def proxy_for(self, scheme: str, netloc: str) -> tuple[str, str, int, str | None] | None:
        """(scheme, host, port, Proxy-Authorization) of the proxy for this origin, or None."""
        if not self.proxies or not any(key.lower().endswith("_proxy") for key in os.environ):
            return None   # the common case, without urllib.request's import
        import urllib.request
        proxies = urllib.request.getproxies_environment()
        if urllib.request.proxy_bypass(netloc):   # no_proxy (as requests asks it)
            return None
        url = proxies.get(scheme) or proxies.get("all")
        if not url:
            return None
        if "://" not in url:
            url = "http://" + url
        bare, creds = jobio.split_credentials(url)
        from urllib.parse import urlsplit
        try:
            parts = urlsplit(bare)
            host, port = parts.hostname, parts.port
        except ValueError as err:
            raise RemoteError(f"invalid proxy URL: {err}") from None
        if parts.scheme != "http" or not host:
            raise RemoteError(f"unsupported proxy URL scheme: {parts.scheme}")
        return parts.scheme, host, port or 80, basic_auth(creds) if creds else None

    def close(self) -> None:
        for conn in self.conns.values():
            conn.close()
        self.conns.clear()


def dropped(conn: Any) -> bool:
    """True when a kept-alive connection can no longer carry a request: the server closed it
    while it was idle (an idle connection is readable only at EOF or with bytes nobody asked
    for), as urllib3 checks a pooled connection before reusing it."""
    import select
    return conn.sock is None or bool(select.select([conn.sock], [], [], 0)[0])


def basic_auth(creds: tuple[str, str]) -> str:
    """The `Basic` header value; user and password as UTF-8 (how rq-web decodes them)."""
    import base64
    return "Basic " + base64.b64encode(f"{creds[0]}:{creds[1]}".encode()).decode("ascii")


def quote_param(value: str) -> str:
    """A multipart header parameter value: `"`, CR and LF percent-encoded (the WHATWG form
    rules, as browsers, curl and urllib3 send them)."""
    return value.replace('"', "%22").replace("\r", "%0D").replace("\n", "%0A")


def multipart_head(boundary: str, disposition: str, ctype: str | None = None) -> bytes:
    lines = [f"--{boundary}", f"Content-Disposition: form-data; {disposition}"]
    if ctype:
        lines.append(f"Content-Type: {ctype}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("utf-8")
