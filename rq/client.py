"""Talks to the daemons' rq1 sockets: one request, one reply (S7.1).

Owns the client side of the framing and the socket paths of a root.  Raises
ConnectError when nothing answers, so callers can print S19.3's texts.
"""

from __future__ import annotations

import os
import socket
from typing import Any

from rq import protocol
from rq.errors import ConnectError, ProtocolError
from rq.sockserve import read_frame


def mgr_socket(root: str) -> str:
    return os.path.join(root, "config", "queuemgr.sock")


def queue_socket(root: str, name: str) -> str:
    return os.path.join(root, "queue", name, "queue.sock")


def call(path: str, cmd: str, arg: Any = None, *, raw: bool = False,
         timeout: float | None = 60.0) -> Any:
    """Send one request to the socket at `path` and return the decoded reply."""
    frame = protocol.encode_request(cmd, arg, raw=raw)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        try:
            sock.connect(path)
        except OSError as exc:
            raise ConnectError(f"cannot connect to {path}: {exc.strerror or exc}") from exc
        try:
            sock.sendall(frame)
            payload = read_frame(sock)
        except (OSError, ProtocolError) as exc:
            raise ConnectError(f"no reply from {path}: {exc}") from exc
    finally:
        sock.close()
    try:
        import json
        return json.loads(payload)
    except ValueError as exc:
        raise ConnectError(f"bad reply from {path}") from exc


def call_queue(root: str, name: str, cmd: str, arg: Any = None, **kw: Any) -> Any:
    return call(queue_socket(root, name), cmd, arg, **kw)


def call_mgr(root: str, cmd: str, arg: Any = None, **kw: Any) -> Any:
    return call(mgr_socket(root), cmd, arg, **kw)
