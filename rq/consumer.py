"""A small client for pull consumers written in Python (SPEC S8).

    from rq.consumer import consume
    for job in consume(["video.*"], root="/var/rq"):        # or url="http://host:3333/"
        job.run("working")
        ...
        job.done("encoded")

Owns the two transports (the manager socket of a local root, S8.4, or the
HTTP API of any RQ web server, S8.5) and the `Job` object with one helper per
pipe-protocol line (`run`, `done`, `err`, `resend`, `dup`, `relayed`) plus
`renew`.  `consume` long-polls `reserve` with `wait` and yields each granted
message; with `burst=True` it returns once nothing is available (python-rq's
burst mode).  A failed report raises `LeaseError` with the server's reason
(e.g. `lease expired`).  Nothing here knows about queue directories.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from rq import client
from rq.errors import RQError

WAIT = 30          # seconds a reservation long-polls
SLACK = 30.0       # seconds on top of `wait` for the reply


class LeaseError(RQError):
    """A `["fail", reason]` reply to a consumer request."""


class SocketTransport:
    """The manager socket of a local RQ root (S8.4)."""

    def __init__(self, root: str) -> None:
        self.root = root

    def call(self, cmd: str, arg: dict[str, Any], timeout: float) -> Any:
        return client.call_mgr(self.root, cmd, arg, timeout=timeout)


class HttpTransport:
    """`POST <url>consumer/<cmd>` with a JSON body (S8.5); `url` is the RQ
    base URL (`http://HOST:PORT` + ROOT), `auth` an optional (user, password)."""

    def __init__(self, url: str, auth: tuple[str, str] | None = None) -> None:
        import requests
        self.base = url if url.endswith("/") else url + "/"
        self.session = requests.Session()
        self.session.auth = auth

    def call(self, cmd: str, arg: dict[str, Any], timeout: float) -> Any:
        import requests
        try:
            resp = self.session.post(self.base + "consumer/" + cmd, json=arg, timeout=timeout)
            return resp.json()
        except (requests.RequestException, ValueError) as exc:
            raise LeaseError(f"{cmd} failed: {exc}") from exc


Transport = SocketTransport | HttpTransport


def transport_for(root: str | None = None, url: str | None = None,
                  auth: tuple[str, str] | None = None) -> Transport:
    if url is not None:
        return HttpTransport(url, auth)
    if root is None:
        raise LeaseError("consume needs root= or url=")
    return SocketTransport(root)


@dataclass
class Job:
    """One granted message (RES of S8.2) and the lease on it."""

    transport: Transport
    res: dict[str, Any]
    finished: str | None = field(default=None)

    @property
    def msg_id(self) -> str:          # the full id: what report/renew take
        return str(self.res["full_msg_id"])

    @property
    def short_id(self) -> str:
        return str(self.res["msg_id"])

    @property
    def token(self) -> str:
        return str(self.res["token"])

    @property
    def msg(self) -> dict[str, Any]:
        return dict(self.res["msg"])

    @property
    def env(self) -> dict[str, str]:
        return dict(self.res["env"])

    @property
    def params(self) -> list[str]:
        return [str(self.res["msg"].get(f"param{i}") or "") for i in range(1, 5)]

    def report(self, line: str) -> Any:
        """Send one pipe-protocol line (S6.4); the reply's second element."""
        reply = self.transport.call("report", {"msg_id": self.msg_id, "token": self.token,
                                               "line": line}, SLACK)
        if not (isinstance(reply, list) and len(reply) >= 2 and reply[0] == "ok"):
            raise LeaseError(reply[1] if isinstance(reply, list) and len(reply) > 1
                             else str(reply))
        return reply[1]

    def run(self, text: str = "") -> None:
        self.report(f"run {text}")

    def done(self, text: str = "") -> None:
        self.finished = self.report(f"done {text}")

    def err(self, text: str = "") -> None:
        self.finished = self.report(f"err {text}")

    def relayed(self, text: str) -> None:
        self.finished = self.report(f"relayed {text}")

    def resend(self, secs: int = 0, text: str = "") -> str:
        line = f"resend {int(secs)}" + (f"-{text}" if text else "")
        self.finished = self.report(line)
        return self.finished or ""

    def dup(self, newdest: str, due: float = 0) -> str:
        """S6.5: copy this message to `newdest`; the new full id."""
        return str(self.report(f"dup {due}-X-{newdest}"))

    def renew(self, lease: float | None = None) -> float:
        arg: dict[str, Any] = {"msg_id": self.msg_id, "token": self.token}
        if lease is not None:
            arg["lease"] = lease
        reply = self.transport.call("renew", arg, SLACK)
        if not (isinstance(reply, list) and len(reply) >= 2 and reply[0] == "ok"):
            raise LeaseError(reply[1] if isinstance(reply, list) and len(reply) > 1
                             else str(reply))
        return float(reply[1])


def reserve(transport: Transport, patterns: Sequence[str], *, lease: float | None = None,
            wait: float = 0, consumer: str | None = None) -> Job | None:
    """One S8.2 reservation: a Job, or None when nothing came within `wait`."""
    arg: dict[str, Any] = {"patterns": list(patterns), "wait": wait}
    if lease is not None:
        arg["lease"] = lease
    if consumer is not None:
        arg["consumer"] = consumer
    reply = transport.call("reserve", arg, wait + SLACK)
    if not (isinstance(reply, list) and len(reply) >= 2 and reply[0] == "ok"):
        raise LeaseError(reply[1] if isinstance(reply, list) and len(reply) > 1
                         else str(reply))
    return None if reply[1] is None else Job(transport, reply[1])


def consume(patterns: Sequence[str], *, root: str | None = None, url: str | None = None,
            auth: tuple[str, str] | None = None, lease: float | None = None,
            wait: float = WAIT, consumer: str | None = None,
            burst: bool = False) -> Iterator[Job]:
    """Yield granted messages forever (or, with `burst`, until none is available)."""
    transport = transport_for(root, url, auth)
    while True:
        job = reserve(transport, patterns, lease=lease, wait=wait, consumer=consumer)
        if job is None:
            if burst:
                return
            continue
        yield job
