"""The two ways rq.producer talks to an RQ root (issue 16 item 1): the root's
own sockets (`LocalTransport`: the queue sockets, S7.3, and the manager
socket, S7.2, S8.8) and the web API of any RQ server (`HttpTransport`: the S15
routes, S8.8 `GET /events`).  Both offer the same verbs, each taking a queue
name and a short id and returning plain data; a `["fail", reason]` reply
becomes `Refused(reason)`, nothing answering becomes `ConnectError`.

Owns the wire formats of those verbs and nothing else: which queue a `dest`
goes to, waiting and the bulk window are rq.producer's.  `requests` is
imported only by the HTTP transport, so the local path stays cheap to import
(`rq sendmesg --stdin`, issue 15 item 3).
"""

from __future__ import annotations

import os
import queue as queue_mod
import socket
import tempfile
import threading
from typing import Any

from rq import client, protocol
from rq.errors import ConnectError, Fail, RQError


class Refused(RQError):
    """The server refused the request: `reason` is its text (e.g. `msg not found`)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def ok_value(reply: Any) -> Any:
    """reply[1] of an `["ok", …]` reply; Refused with the server's reason otherwise."""
    if isinstance(reply, list) and len(reply) >= 2 and reply[0] == "ok":
        return reply[1]
    if isinstance(reply, list) and len(reply) >= 2 and reply[0] == "fail":
        raise Refused(str(reply[1]))
    raise Refused(protocol.dumps(reply))


BULK_CMD = "create_messages"  # rq.queue.createstream
CALL_TIMEOUT = 60.0
KEEP_MAX = 16  # kept connections open at once per LocalTransport (a client of many queues)


# ================================================================ local: the root's sockets


class SocketBulk:
    """A `create_messages` stream on one queue socket (rq.queue.createstream): `send`
    a batch, `recv` the reply of the oldest batch in flight."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(120.0)
        try:
            self.sock.connect(path)
        except OSError as exc:
            self.sock.close()
            raise ConnectError(f"cannot connect to {path}: {exc.strerror or exc}") from exc

    def send(self, batch: list[dict[str, Any]]) -> None:
        try:
            self.sock.sendall(protocol.encode_request(BULK_CMD, batch))
        except OSError as exc:
            raise ConnectError(f"no reply from {self.path}: {exc.strerror or exc}") from exc

    def recv(self) -> Any:
        import json
        try:
            return json.loads(client.read_frame(self.sock))
        except (OSError, RQError, ValueError) as exc:
            raise ConnectError(f"no reply from {self.path}: {exc}") from exc

    def close(self) -> None:
        self.sock.close()


class LocalTransport:
    """The sockets of the RQ root `root` on this machine.  From the second request to a
    queue on, its requests share one kept connection (rq.client.Connection, issue 15),
    as the HTTP transport's share the session's: a client of one request pays no `keep`.
    At most KEEP_MAX stay open; the least recently used is closed first."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.conns: dict[str, client.Connection | None] = {}  # None: one request so far

    def prefix(self) -> str:
        from rq.config import load_main_config
        return load_main_config(self.root).relative_root

    def queue(self, name: str, cmd: str, arg: Any = None,
              timeout: float = CALL_TIMEOUT) -> Any:
        if not protocol.valid_queue_name(name) or not os.path.exists(
                os.path.join(self.root, "queue", name, "config.json")):
            raise Refused(f"queue not found: {name}")
        try:
            return self._call(client.queue_socket(self.root, name), cmd, arg, timeout)
        except ConnectError:
            raise ConnectError(f"cannot connect to queue {name} (is rq-mgr running?)") from None

    def _call(self, path: str, cmd: str, arg: Any, timeout: float) -> Any:
        if path not in self.conns or timeout != CALL_TIMEOUT:
            self.conns.setdefault(path, None)
            return client.call(path, cmd, arg, timeout=timeout)
        conn = self.conns.pop(path) or client.Connection(path, timeout)
        if conn.sock is None:  # about to open one: the least recently used close first
            open_ = [c for c in self.conns.values() if c is not None and c.sock is not None]
            for old in open_[:len(open_) - KEEP_MAX + 1]:
                old.close()
        self.conns[path] = conn  # last in the dict: the most recently used
        return conn.call(cmd, arg)

    def close(self) -> None:
        for conn in self.conns.values():
            if conn is not None:
                conn.close()
        self.conns.clear()

    def create(self, name: str, fields: dict[str, Any], *, prep: bool = False) -> str:
        cmd = "prep_message" if prep else "create_message"
        return str(ok_value(self.queue(name, cmd, fields)))

    def fanout(self, fields: dict[str, Any]) -> list[str]:
        """Issue 18 item 2: one copy per queue whose topic matches `fields["dest"]`
        (the manager's `create_message`, rq.mgr.fanout); every full id."""
        try:
            reply = client.call_mgr(self.root, "create_message", fields)
        except ConnectError:
            raise ConnectError("cannot connect to rq-mgr (is it running?)") from None
        return [str(i) for i in ok_value(reply)]

    def attach(self, name: str, short: str, att_name: str, data: bytes | str) -> str:
        if isinstance(data, str):
            path = os.path.abspath(data)
            return str(ok_value(self.queue(name, "attach_message", {
                "msg_id": short, "pathname": path, "name": att_name})))
        fd, path = tempfile.mkstemp(prefix="rq-attach-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            return str(ok_value(self.queue(name, "attach_message", {
                "msg_id": short, "pathname": path, "name": att_name})))
        finally:
            os.unlink(path)  # the queue hard-linked or copied it

    def message_cmd(self, name: str, cmd: str, short: str) -> Any:
        return ok_value(self.queue(name, cmd, {"msg_id": short}))

    def read(self, name: str, short: str) -> dict[str, Any]:
        return dict(self.message_cmd(name, "get_message", short))

    def status(self, name: str, short: str) -> dict[str, Any]:
        return dict(self.message_cmd(name, "get_message_status", short))

    def queues(self) -> list[dict[str, Any]]:
        try:
            reply = client.call_mgr(self.root, "status")
        except ConnectError:
            raise ConnectError("cannot connect to rq-mgr (is it running?)") from None
        out = []
        for name, child in sorted((ok_value(reply).get("queues") or {}).items()):
            state, counts = str(child.get("state")), None
            if state == "RUNNING":
                try:
                    state = str(client.call_queue(self.root, name, "status", timeout=5)[0])
                    counts = client.call_queue(self.root, name, "num_messages", timeout=5)
                except (ConnectError, LookupError, TypeError):
                    pass
            out.append({"name": name, "status": state, "counts": counts})
        return out

    def topic(self, name: str) -> str:
        return str(ok_value(self.queue(name, "config")).get("topic") or name)

    def subscribe(self, patterns: list[str]) -> client.Subscription:
        try:
            return client.subscribe(self.root, patterns)
        except Fail as exc:
            raise Refused(str(exc)) from None
        except ConnectError:
            raise ConnectError("cannot connect to rq-mgr (is it running?)") from None

    def bulk(self, name: str) -> SocketBulk:
        self.queue(name, "ping", timeout=10)  # `queue not found` / cannot connect, said once
        return SocketBulk(client.queue_socket(self.root, name))


# ================================================================ remote: the web API


class SseStream:
    """`GET /events` (S8.8) on a connection of its own, read by a thread;
    `next(timeout)` as client.Subscription's.  http.client rather than
    requests: close() must be able to shut the socket under the reading thread."""

    def __init__(self, url: str, auth: tuple[str, str] | None, timeout: float) -> None:
        import base64
        import http.client
        from urllib.parse import urlsplit
        parts = urlsplit(url)
        host = parts.hostname or "localhost"
        lines = [f"GET {parts.path}?{parts.query} HTTP/1.1", f"Host: {parts.netloc}",
                 "Accept: text/event-stream", "Connection: close"]
        if auth is not None:
            token = base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
            lines.append(f"Authorization: Basic {token}")
        try:
            self.sock = socket.create_connection((host, parts.port or 80), timeout)
        except OSError as exc:
            raise ConnectError(f"cannot connect to {url}: {exc}") from exc
        try:
            self.sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
            self.resp = http.client.HTTPResponse(self.sock, method="GET")
            self.resp.begin()  # sent once the manager has subscribed us
        except (OSError, http.client.HTTPException) as exc:
            self.sock.close()
            raise ConnectError(f"no reply from {url}: {exc}") from exc
        if self.resp.status != 200:
            import json
            body = self.resp.read(65536)
            self.sock.close()
            try:
                ok_value(json.loads(body))
            except ValueError:
                pass
            raise Refused(f"{self.resp.status} - {body.decode('utf-8', 'replace').strip()}")
        self.sock.settimeout(None)
        self.items: queue_mod.SimpleQueue[Any] = queue_mod.SimpleQueue()
        threading.Thread(target=self._read, name="rq-sse", daemon=True).start()

    def _read(self) -> None:
        import json
        data: list[str] = []
        try:
            while line := self.resp.readline():
                text = line.decode("utf-8", "replace").rstrip("\r\n")
                if text.startswith("data:"):
                    data.append(text[5:].lstrip())
                elif text == "" and data:
                    self.items.put(json.loads("\n".join(data)))
                    data = []
        except Exception:  # noqa: BLE001 -- closed by us, or the server went away
            pass
        self.items.put(ConnectError("event stream ended"))

    def next(self, timeout: float | None = None) -> Any:
        try:
            item = self.items.get(timeout=timeout)
        except queue_mod.Empty:
            return None
        if isinstance(item, ConnectError):
            self.items.put(item)
            raise item
        return item

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes the reading thread
        except OSError:
            pass
        self.resp.close()
        self.sock.close()

    def __enter__(self) -> SseStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class HttpBulk:
    """The bulk stream over HTTP: each batch one `POST …/new_messages` (web.bulkcreate)
    as NDJSON on the session's kept-alive connection, answered as a
    `create_messages` frame is; after a refusal no later batch is sent."""

    def __init__(self, transport: HttpTransport, name: str) -> None:
        self.transport, self.name = transport, name
        self.replies: list[Any] = []
        self.stopped = False

    def send(self, batch: list[dict[str, Any]]) -> None:
        if self.stopped:
            self.replies.append(["fail", "not created: an earlier message was refused", []])
            return
        body = "".join(protocol.dumps(fields) + "\n" for fields in batch).encode()
        reply = self.transport.request("POST", f"q/{self.name}/new_messages", data=body,
                                       headers={"Content-Type": "application/x-ndjson"})
        if not (isinstance(reply, list) and reply[:1] == ["ok"]):
            self.stopped = True
            reply = bulk_refusal(reply)
        self.replies.append(reply)

    def recv(self) -> Any:
        return self.replies.pop(0)

    def close(self) -> None:
        pass


def bulk_refusal(reply: Any) -> list[Any]:
    """A refusal of `new_messages` as a `create_messages` frame's: `["fail", REASON,
    IDS]`, REASON without the `line N: ` the server puts before it (the client
    numbers its own lines); the whole-request errors (413, 503, …) created nothing."""
    if isinstance(reply, list) and len(reply) >= 3 and isinstance(reply[2], list):
        reason = str(reply[1]).removeprefix(f"line {len(reply[2]) + 1}: ")
        return ["fail", reason, reply[2]]
    if isinstance(reply, list) and len(reply) >= 2:
        return ["fail", str(reply[1]), []]
    return ["fail", protocol.dumps(reply), []]


class HttpTransport:
    """The web API at `url` (`http://HOST:PORT` + ROOT); `auth` = (user, password)."""

    def __init__(self, url: str, auth: tuple[str, str] | None = None,
                 timeout: float = 60.0) -> None:
        import requests
        self.base = url if url.endswith("/") else url + "/"
        self.session = requests.Session()
        self.session.auth = self.auth = auth
        self.timeout = timeout

    def close(self) -> None:
        self.session.close()

    def prefix(self) -> str:
        from urllib.parse import urlsplit
        path = urlsplit(self.base).path or "/"
        return path if path.endswith("/") else path + "/"

    def request(self, method: str, path: str, **kw: Any) -> Any:
        """The decoded JSON body of any answer (errors come as `["fail", text]`, S14.8)."""
        import requests
        try:
            resp = self.session.request(method, self.base + path,
                                        timeout=kw.pop("timeout", self.timeout), **kw)
        except requests.RequestException as exc:
            raise ConnectError(f"cannot connect to {self.base}: {exc}") from exc
        try:
            return resp.json()
        except ValueError:
            raise Refused(f"{resp.status_code} - {resp.text.strip()[:200]}") from None

    def post(self, path: str, **form: str) -> Any:
        return ok_value(self.request("POST", path, data={**form, "x_format": "json"}))

    def create(self, name: str, fields: dict[str, Any], *, prep: bool = False) -> str:
        body = {**fields, "_method": "prep"} if prep else fields
        return str(ok_value(self.request("POST", f"q/{name}/new_message", json=body)))

    def fanout(self, fields: dict[str, Any]) -> list[str]:
        return [str(i) for i in ok_value(self.request("POST", "fanout", json=fields))]

    def attach(self, name: str, short: str, att_name: str, data: bytes | str) -> str:
        if isinstance(data, str):
            with open(data, "rb") as f:
                data = f.read()
        reply = self.request("POST", f"q/{name}/{short}/attach/new",
                             data={"x_format": "json"}, files={"filedata": (att_name, data)})
        return str(ok_value(reply))

    def message_cmd(self, name: str, cmd: str, short: str) -> Any:
        if cmd == "clone_message":
            return self.post(f"q/{name}/{short}/clone")
        method = {"commit_message": "commit", "delete_message": "delete"}[cmd]
        return self.post(f"q/{name}/{short}", _method=method)

    def read(self, name: str, short: str) -> dict[str, Any]:
        body = self.request("GET", f"q/{name}/{short}.json")
        if not isinstance(body, dict):
            ok_value(body)  # raises Refused with the reason
            raise Refused(protocol.dumps(body))
        return body

    def status(self, name: str, short: str) -> dict[str, Any]:
        msg = self.read(name, short)
        return {"state": msg.get("state"), "status": msg.get("status"), "path": msg.get("path")}

    def queues(self) -> list[dict[str, Any]]:
        body = self.request("GET", "q.json")
        if not isinstance(body, dict):
            ok_value(body)
        return [{"name": q.get("name"), "status": q.get("status"), "counts": q.get("counts")}
                for q in body.get("queues") or []]

    def topic(self, name: str) -> str:
        body = self.request("GET", f"q/{name}/config")
        if not isinstance(body, dict):
            ok_value(body)
        return str(body.get("topic") or name)

    def subscribe(self, patterns: list[str]) -> SseStream:
        from urllib.parse import urlencode
        query = urlencode([("pattern", p) for p in patterns])
        return SseStream(f"{self.base}events?{query}", self.auth, self.timeout)

    def bulk(self, name: str) -> HttpBulk:
        return HttpBulk(self, name)


Transport = LocalTransport | HttpTransport
