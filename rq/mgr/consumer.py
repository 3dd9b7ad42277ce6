"""The manager's pull-consumer commands `reserve`, `report`, `renew` (SPEC S8.2-S8.4).

Owns: request validation and the exact failure texts of S8.4, finding the
pull queues whose topic matches a reservation's patterns (S8.1, S8.7, from
their config files, cached by file identity), choosing the fairest grant over
several queues (the smallest (due, short id), S8.2), and the long-poll `wait`.
The queues themselves own their messages and leases: this module asks them
over their sockets (`lease_candidate`, `grant_lease`, `lease_wait`, `report`,
`renew`, see rq/queue/commands.py) and never touches a queue directory.

The wait: with one matching queue the queue process itself waits and grants
(`grant_lease` with `wait`), so a commit is answered by one hop; with several,
one `lease_wait` per queue is sent on its own connection and the first
"available" answer starts a new fair round.  Waits run in slices of
WAIT_SLICE seconds so a queue created or reconfigured meanwhile is seen.
"""

from __future__ import annotations

import json
import logging
import os
import selectors
import socket
import time
from typing import Any

from rq import client, protocol
from rq.config import load_queue_config
from rq.errors import ConfigError, ConnectError, Fail, ProtocolError
from rq.client import read_frame
from rq.topics import check_patterns, matches_any

log = logging.getLogger(__name__)

MAX_LEASE = 86400
MAX_WAIT = 60
MAX_CONSUMER_BYTES = 200
WAIT_SLICE = 5.0          # seconds: re-read the set of matching queues at least this often
CALL_TIMEOUT = 30.0       # a queue request that is not a wait
RETRY_PAUSE = 0.5         # seconds before asking again a queue that cannot wait now
Reply = list[Any]


# ------------------------------------------------------------------ pure parts

def number(value: Any, low: float, high: float, what: str) -> float | None:
    """A request number (JSON number, or the decimal text of a form field)
    within [low, high]; None when absent; Fail("invalid <what>") otherwise."""
    if value is None or value == "":
        return None
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            raise Fail(f"invalid {what}") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not low <= value <= high or value != value:
        raise Fail(f"invalid {what}")
    return int(value) if float(value).is_integer() else float(value)


def require(data: dict[str, Any], name: str) -> Any:
    value = data.get(name)
    if value is None or value == "" or value == []:
        raise Fail(f"missing {name}")
    return value


def parse_reserve(data: Any) -> tuple[tuple[str, ...], float | None, float, str]:
    """(patterns, lease or None for the queue's default, wait, consumer) of S8.2."""
    if not isinstance(data, dict):
        raise Fail("missing patterns")
    patterns = require(data, "patterns")
    if isinstance(patterns, str):
        patterns = [p for p in patterns.split(",") if p]
    patterns = check_patterns(patterns)
    lease = number(data.get("lease"), 1, MAX_LEASE, "lease")
    wait = number(data.get("wait"), 0, MAX_WAIT, "wait") or 0
    consumer = data.get("consumer")
    if consumer is None or consumer == "":
        consumer = "anonymous"
    if not isinstance(consumer, str) or len(consumer.encode("utf-8", "surrogatepass")) \
            > MAX_CONSUMER_BYTES or "\n" in consumer:
        raise Fail("invalid consumer")
    return patterns, lease, wait, consumer


def parse_msg_target(data: Any, fields: tuple[str, ...]) -> tuple[str, dict[str, Any]]:
    """(queue name, the request to forward) for report/renew (S8.4)."""
    if not isinstance(data, dict):
        raise Fail(f"missing {fields[0]}")
    for name in fields:
        require(data, name)
    ref = data["msg_id"]
    if not isinstance(ref, str):
        raise Fail("msg not found")
    try:
        queue, _ = protocol.parse_msg_ref(ref)
    except ProtocolError:
        raise Fail("msg not found") from None
    if queue is None or not protocol.valid_queue_name(queue):
        raise Fail("msg not found")
    return queue, data


def ok(reply: Any) -> bool:
    return isinstance(reply, list) and len(reply) >= 2 and reply[0] == "ok"


# ------------------------------------------------------------------ the handlers

class Consumers:
    def __init__(self, root: str) -> None:
        self.root = root
        self.queue_root = os.path.join(root, "queue")
        self._topics: dict[str, tuple[tuple[int, int, int], str | None]] = {}

    # -------------------------------------------------------------- reserve (S8.2)
    def reserve(self, arg: str | None) -> Reply:
        patterns, lease, wait, consumer = parse_reserve(protocol.parse_json_arg(arg or "null"))
        request: dict[str, Any] = {"consumer": consumer}
        if lease is not None:
            request["lease"] = lease
        deadline = time.monotonic() + wait
        while True:
            names = self.matching_queues(patterns)
            res = self.grant_fairest(names, request)
            if res is not None:
                return ["ok", res]
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return ["ok", None]
            slice_ = min(remaining, WAIT_SLICE)
            if len(names) == 1:
                reply = self.call(names[0], "grant_lease", {**request, "wait": slice_},
                                  timeout=slice_ + CALL_TIMEOUT)
                if ok(reply) and reply[1] is not None:
                    return ["ok", reply[1]]
                if not ok(reply):  # not running, DOWN, no longer pull: look again soon
                    time.sleep(min(slice_, RETRY_PAUSE))
            elif names:
                self.wait_any(names, slice_)
            else:
                time.sleep(min(slice_, 1.0))      # no such queue yet: look again

    def grant_fairest(self, names: list[str], request: dict[str, Any]) -> Any:
        """Grant on the queue whose candidate has the smallest (due, short id)."""
        for _ in range(8):  # another consumer may take a candidate between the two steps
            if len(names) == 1:
                target = names[0]
            else:
                best = None
                for name in names:
                    reply = self.call(name, "lease_candidate")
                    if ok(reply) and isinstance(reply[1], list):
                        key = (reply[1][0], reply[1][1])
                        if best is None or key < best[0]:
                            best = (key, name)
                if best is None:
                    return None
                target = best[1]
            reply = self.call(target, "grant_lease", request)
            if ok(reply) and reply[1] is not None:
                return reply[1]
            if len(names) == 1:
                return None
        return None

    def wait_any(self, names: list[str], timeout: float) -> None:
        """Return when any queue says a grant could succeed, or after `timeout`."""
        sel = selectors.DefaultSelector()
        socks = []
        frame = protocol.encode_request("lease_wait", {"timeout": timeout})
        try:
            for name in names:
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                socks.append(sock)
                try:
                    sock.settimeout(CALL_TIMEOUT)
                    sock.connect(client.queue_socket(self.root, name))
                    sock.sendall(frame)
                except OSError:
                    continue
                sel.register(sock, selectors.EVENT_READ)
            end = time.monotonic() + timeout + 1.0
            while sel.get_map() and time.monotonic() < end:
                for key, _ in sel.select(max(0.0, end - time.monotonic())):
                    sock = key.fileobj  # type: ignore[assignment]
                    sel.unregister(sock)
                    try:
                        reply = json.loads(read_frame(sock))  # type: ignore[arg-type]
                    except (OSError, ProtocolError, ValueError):
                        continue
                    if reply == ["ok", True]:
                        return
            # every queue answered without a candidate before the timeout (not
            # running, DOWN, no longer pull): do not spin, look again soon
            time.sleep(max(0.0, min(end - 1.0 - time.monotonic(), RETRY_PAUSE)))
        finally:
            sel.close()
            for sock in socks:
                sock.close()

    def matching_queues(self, patterns: tuple[str, ...]) -> list[str]:
        """Pull queues whose topic matches any pattern, sorted by name."""
        try:
            names = sorted(os.listdir(self.queue_root))
        except OSError:
            return []
        out = []
        for name in names:
            if protocol.valid_queue_name(name):
                topic = self.topic_of(name)
                if topic is not None and matches_any(patterns, topic):
                    out.append(name)
        return out

    def topic_of(self, name: str) -> str | None:
        """The topic of a pull queue, None for any other; re-read when
        config.json (or the file it links to) changes."""
        path = os.path.join(self.queue_root, name, "config.json")
        try:
            st = os.stat(path)
        except OSError:
            self._topics.pop(name, None)
            return None
        stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
        cached = self._topics.get(name)
        if cached is not None and cached[0] == stamp:
            return cached[1]
        try:
            cfg, _ = load_queue_config(self.root, name)
            topic = cfg.topic if cfg.mode == "pull" else None
        except ConfigError:
            topic = None
        self._topics[name] = (stamp, topic)
        return topic

    # -------------------------------------------------------------- report, renew (S8.3)
    def report(self, arg: str | None) -> Reply:
        queue, data = parse_msg_target(protocol.parse_json_arg(arg or "null"),
                                       ("msg_id", "token", "line"))
        if not isinstance(data["line"], str):
            raise Fail("malformed line")
        return self.forward(queue, "report", {k: data[k] for k in ("msg_id", "token", "line")})

    def renew(self, arg: str | None) -> Reply:
        queue, data = parse_msg_target(protocol.parse_json_arg(arg or "null"),
                                       ("msg_id", "token"))
        request = {"msg_id": data["msg_id"], "token": data["token"]}
        lease = number(data.get("lease"), 1, MAX_LEASE, "lease")
        if lease is not None:
            request["lease"] = lease
        return self.forward(queue, "renew", request)

    def forward(self, queue: str, cmd: str, request: dict[str, Any]) -> Reply:
        if not os.path.isfile(os.path.join(self.queue_root, queue, "config.json")):
            return ["fail", "msg not found"]
        reply = self.call(queue, cmd, request)
        if reply is None:
            return ["fail", f"cannot connect to queue {queue}"]
        if reply == ["fail", "lacking 'msg_id' field"]:
            return ["fail", "missing msg_id"]
        return reply if isinstance(reply, list) else ["fail", "bad reply"]

    def call(self, name: str, cmd: str, arg: Any = None, *,
             timeout: float = CALL_TIMEOUT) -> Any:
        """A queue's reply, or None when its process does not answer."""
        try:
            return client.call_queue(self.root, name, cmd, arg, timeout=timeout)
        except ConnectError:
            return None
