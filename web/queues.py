"""What the pages (web.ui) and the JSON routes (web.api) show about queues,
messages, schedules and timers, gathered once for both; nothing here changes
state.

Where each figure comes from: a queue's supervision state, pid and restarts
from the manager's `status` (S7.2); while its process is RUNNING, its status,
uptime, counts and message lists from the queue process itself (S7.3: the
counts are kept in memory, so a queue page never walks the done hashdir);
otherwise counts from disk (`web.metrics.DiskCounts`).  Messages "as read"
(S4.5), states and done ids are read from the store directly with the same
read-only code the queue uses, looking a message up again when it moves under
us (STYLE habit 2).  Schedules (S9.4): `next` and the tracking key come from
`rq.cron` (the slot arithmetic the queue fires by), `last` from
`cron.state.json`.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from flask import current_app

from rq import cron
from rq.errors import ConnectError
from rq.store import HASHED, Store

from . import metrics
from .errors import fail
from .views import (backend, first, main_config, ok_payload, read_int_file, read_json_file,
                    require_not_down, require_queue)

ORDER = metrics.COUNT_ORDER   # S15.1 counts
PARAMS = ("param1", "param2", "param3", "param4")
QUEUE_TIMEOUT = 10.0          # a page or poll never waits long for one slow queue process
ALL = 1 << 31                 # `messages` limit meaning "every entry"


@dataclass(frozen=True)
class Supervised:
    state: str          # STARTING, RUNNING, BACKOFF, STOPPING or FATAL (S2.3)
    pid: int | None
    restarts: int


class Counters:
    """What the app remembers between requests: cached disk counts and the
    event tally of /metrics (one per app, `app.extensions["rq_counters"]`)."""

    def __init__(self, root: str) -> None:
        self.disk = metrics.DiskCounts()
        self.tally = metrics.EventTally(root)


def counters() -> Counters:
    return current_app.extensions["rq_counters"]  # type: ignore[no-any-return]


def ask(name: str, cmd: str, arg: Any = None) -> Any:
    """The queue's reply; ConnectError when its process does not answer."""
    return backend().queue(name, cmd, arg, timeout=QUEUE_TIMEOUT)


def ask_or_none(name: str, cmd: str, arg: Any = None) -> Any:
    """The queue's reply, or None when its process does not answer."""
    try:
        return ask(name, cmd, arg)
    except (ConnectError, OSError):
        return None


# ---------------------------------------------------------------- queue state


def supervision() -> dict[str, Any]:
    """NAME -> CHILD of the manager's `status` reply ({} when it has none)."""
    status = ok_payload(backend().mgr("status"), dict) or {}
    queues = status.get("queues")
    return queues if isinstance(queues, dict) else {}


def supervised(name: str, sup: dict[str, Any]) -> Supervised:
    child = sup.get(name)
    if isinstance(child, dict) and isinstance(child.get("state"), str):
        return Supervised(child["state"], child.get("pid"), int(child.get("restarts") or 0))
    # Not (yet) supervised: a process started by hand still counts when it answers.
    try:
        if ask(name, "ping") == ["pong"]:
            pid = read_int_file(os.path.join(main_config().root, "queue", name, "queue.pid"))
            return Supervised("RUNNING", pid, 0)
    except ConnectError:
        pass
    return Supervised("STOPPING", None, 0)


def shown_state(sv: Supervised) -> str:
    """S3.5: the supervision state of a queue that is not answering."""
    return "STOPPING" if sv.state == "RUNNING" else sv.state


def live_view(name: str, sv: Supervised) -> dict[str, Any] | None:
    """Status, ping, uptime and counts from a RUNNING queue process, else None."""
    if sv.state != "RUNNING":
        return None
    try:
        counts = ask(name, "num_messages")
        return {"status": first(ask(name, "status")), "ping": first(ask(name, "ping")),
                "uptime": first(ask(name, "uptime")), "counts": {s: counts[s] for s in ORDER}}
    except (ConnectError, LookupError, TypeError):
        return None


def disk_counts(name: str) -> dict[str, int]:
    return counters().disk.counts(backend().store(name))


def queue_entry(name: str, sup: dict[str, Any]) -> dict[str, Any]:
    """One element of `queues` in S15.1."""
    sv = supervised(name, sup)
    live = live_view(name, sv)
    if live is None:
        return {"name": name, "status": shown_state(sv), "ping": None, "pid": None,
                "uptime": None, "counts": disk_counts(name)}
    return {"name": name, "status": live["status"], "ping": live["ping"], "pid": sv.pid,
            "uptime": live["uptime"], "counts": live["counts"]}


# ---------------------------------------------------------------- messages


def que_ids(name: str, store: Store) -> list[str]:
    try:
        listed = ask(name, "messages", {"state": "que", "limit": ALL})
        if isinstance(listed, list):
            return [e["msg_id"] for e in listed if isinstance(e, dict) and "msg_id" in e]
    except ConnectError:
        pass
    return [msg_id for msg_id, _ in metrics.disk_que(store)]


def ids_in(name: str, store: Store, state: str) -> Iterator[str]:
    """Ids of one state in the order of the `messages` command (S7.3)."""
    if state == "que":
        return iter(que_ids(name, store))
    if state in HASHED:
        return store.iter_hashed(state)
    return iter(store.list_flat(state)[::-1])


def read_message(store: Store, msg_id: str, state: str | None = None) -> dict[str, Any] | None:
    """The message as read (S4.5), or None when it is not there."""
    for _ in range(3):
        found = store.locate(msg_id) if state is None else (state, store.msg_path(state, msg_id))
        if found is None:
            return None
        try:
            return store.message_as_read(*found)
        except (OSError, ValueError):
            state = None  # moved (or being written) under us: look again
    return None


def find_message(name: str, msg_id: str) -> dict[str, Any]:
    """The message as read, or the S15 error: unknown queue, DOWN queue, missing message."""
    require_queue(name)
    require_not_down(name)
    msg = read_message(backend().store(name), msg_id)
    if msg is None:
        fail(404, "Message ID not found")
    return msg


# ---------------------------------------------------------------- schedules (S9.4), timers


def schedule_view(name: str, entries: list[Any], now: float) -> list[dict[str, Any]]:
    path = os.path.join(main_config().root, "queue", name, "cron.state.json")
    tracking = read_json_file(path)
    tracking = tracking if isinstance(tracking, dict) else {}
    out = []
    for entry in (e for e in entries if isinstance(e, dict)):
        tracked = tracking.get(cron.schedule_key(entry))
        last = tracked.get("last_fire") if isinstance(tracked, dict) else None
        last = last if isinstance(last, (int, float)) and not isinstance(last, bool) else None
        item = {"cron": entry.get("cron"), "id": entry.get("id"),
                "next": cron.shown_next(str(entry.get("cron", "")), entry.get("tz") or None,
                                        last, now),
                "last": last}
        item.update({k: entry[k] for k in ("tz", *PARAMS) if entry.get(k) is not None})
        out.append(item)
    return out


def timer_entry(name: str, due: Any) -> dict[str, Any]:
    plain = name and "/" not in name and "." not in name  # S10.1 names: stay in timers/
    data = read_json_file(os.path.join(main_config().root, "timers", f"{name}.json")) \
        if plain else None
    data = data if isinstance(data, dict) else {}
    msg = data["msg"] if isinstance(data.get("msg"), dict) else {}
    return {"name": name, "due": due, "period": data.get("period"), "dest": msg.get("dest")}


def timer_list() -> list[dict[str, Any]]:
    """Route 28's `timers` from the manager's `timers` reply."""
    listed = ok_payload(backend().mgr("timers"), list) or []
    return [timer_entry(str(t[0]), t[1]) for t in listed
            if isinstance(t, list) and len(t) == 2]
