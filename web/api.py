"""Read-only JSON and text routes and `/metrics` (SPEC S15 routes 6-10, 15-18, 28, 29).

Where each figure comes from: a queue's supervision state, pid and restarts
from the manager's `status` (S7.2); while its process is RUNNING, its status,
uptime, counts, message lists and normalised config from the queue process
itself (S7.3: `messages` is bounded by `limit` and the counts are kept in
memory, so a queue page never walks the done hashdir); otherwise counts from
disk (`web.metrics.DiskCounts`).  Messages "as read" (S4.5), states and done
ids are read from the store directly with the same read-only code the queue
uses, looking a message up again when it moves under us (STYLE habit 2).
Schedules (S9.4): `next` and the tracking key come from `rq.cron` (the slot
arithmetic the queue fires by), `last` from `cron.state.json`.
Nothing here changes state.  The S18 exposition lives in `web.metrics`.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from flask import Blueprint, Response, current_app, jsonify, request
from flask.blueprints import BlueprintSetupState

from rq import cron, protocol
from rq.config import MainConfig, load_queue_config
from rq.errors import ConfigError, ConnectError
from rq.store import HASHED, Store
from . import metrics
from .backend import Backend
from .errors import fail

bp = Blueprint("api", __name__)

ORDER = metrics.COUNT_ORDER                                    # S15.1 counts, route 8
LIST_ORDER = ("prep", "que", "run", "done", "err", "relayed")  # S15.3 sizes and lists
PARAMS = ("param1", "param2", "param3", "param4")
QUERY_RE = re.compile(r"query\[(.+)\]")
QUEUE_TIMEOUT = 10.0
ALL = 1 << 31              # `messages` limit meaning "every entry"


@dataclass(frozen=True)
class Supervised:
    state: str          # STARTING, RUNNING, BACKOFF, STOPPING or FATAL (S2.3)
    pid: int | None
    restarts: int


class ApiState:
    """What the api blueprint remembers per app."""

    def __init__(self, root: str) -> None:
        self.disk = metrics.DiskCounts()
        self.tally = metrics.EventTally(root)


@bp.record_once
def _attach_state(setup: BlueprintSetupState) -> None:
    setup.app.extensions["rq_api"] = ApiState(setup.app.config["RQ_MAIN"].root)


# ---------------------------------------------------------------- helpers


def backend() -> Backend:
    return current_app.config["RQ_BACKEND"]


def main_config() -> MainConfig:
    return current_app.config["RQ_MAIN"]


def api_state() -> ApiState:
    return current_app.extensions["rq_api"]


def ask(name: str, cmd: str, arg: Any = None) -> Any:
    """The queue's reply; ConnectError when its process does not answer."""
    return backend().queue(name, cmd, arg, timeout=QUEUE_TIMEOUT)


def ok_payload(reply: Any, kind: type) -> Any:
    """X of a `["ok", X]` reply when X is a `kind`, else None."""
    if isinstance(reply, list) and len(reply) == 2 and reply[0] == "ok" \
            and isinstance(reply[1], kind):
        return reply[1]
    return None


def first(reply: Any) -> Any:
    return reply[0] if isinstance(reply, list) and reply else None


def text_response(text: str) -> Response:
    return Response(text, mimetype="text/plain")  # Flask adds charset=utf-8


def require_queue(name: str) -> None:
    if not backend().queue_exists(name):
        fail(404, "Queue not found")


def require_not_down(name: str) -> None:
    """Routes 17-27 on a DOWN queue (S15)."""
    if os.path.exists(os.path.join(main_config().root, "config", f"{name}.down")):
        fail(503, "Service Unavailable - Operationally Down")


def limit_arg(default: int) -> int:
    value = request.args.get("limit", "")
    return int(value) if value.isdecimal() and value.isascii() else default


def read_int_file(path: str) -> int | None:
    try:
        with open(path, encoding="ascii") as fh:
            return int(fh.read().strip())
    except (OSError, ValueError):
        return None


def read_json_file(path: str) -> Any:
    try:
        with open(path, "rb") as fh:
            return json.loads(fh.read())
    except (OSError, ValueError):
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
    return api_state().disk.counts(backend().store(name))


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


def matches(msg: dict[str, Any], query: dict[str, str], exact: bool) -> bool:
    for field, wanted in query.items():
        if field not in msg:
            return False
        value = msg[field]
        text = value if isinstance(value, str) else protocol.dumps(value)
        if (text != wanted) if exact else (wanted not in text):
            return False
    return True


# ---------------------------------------------------------------- schedules (S9.4)


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


# ---------------------------------------------------------------- routes 6-8


@bp.get("/q.txt")
def queues_txt() -> Response:
    prefix = main_config().relative_root
    return text_response("".join(f"{prefix}q/{n}.txt\n" for n in sorted(backend().queue_names())))


@bp.get("/q.json")
def queues_json() -> Response:
    be = backend()
    sup = supervision()
    pid = read_int_file(os.path.join(main_config().root, "config", "queuemgr.pid"))
    return jsonify({"status": "OPERATIONAL", "ping": first(be.mgr("ping")), "pid": pid,
                    "uptime": first(be.mgr("uptime")), "version": first(be.mgr("version")),
                    "time": int(time.time()),
                    "queues": [queue_entry(n, sup) for n in be.queue_names()]})


@bp.get("/search")
def search() -> Response:
    name = request.args.get("name", "")
    require_queue(name)
    query = {m.group(1): value for key, value in request.args.items()
             if (m := QUERY_RE.fullmatch(key))}
    exact = request.args.get("exact") not in (None, "false", "0")
    store = backend().store(name)
    candidates = (read_message(store, msg_id, state)
                  for state in ORDER for msg_id in ids_in(name, store, state))
    found = (m for m in candidates if m is not None and matches(m, query, exact))
    return jsonify(list(itertools.islice(found, limit_arg(1000))))


# ---------------------------------------------------------------- routes 9a, 9b, 10


@bp.get("/q/<name>.txt")
def queue_txt(name: str) -> Response:
    require_queue(name)
    sv = supervised(name, supervision())
    live = live_view(name, sv)
    if live is None or live["status"] == "DOWN":
        return text_response(f"status: {live['status'] if live else shown_state(sv)}\n")
    c = live["counts"]
    lines = [f"status: {live['status']}", f"uptime: {live['uptime']}", "",
             *(f"{s}: {c[s]}" for s in ("prep", "que", "run")), "",
             *(f"{s}: {c[s]}" for s in ("done", "err", "relayed"))]
    return text_response("\n".join(lines) + "\n")


@bp.get("/q/<name>.json")
def queue_json(name: str) -> Response:
    require_queue(name)
    sv = supervised(name, supervision())
    live = live_view(name, sv)
    if live is None or live["status"] == "DOWN":
        return jsonify({"status": live["status"] if live else shown_state(sv)})
    limit = limit_arg(100)
    try:
        lists = {s: ask(name, "messages", {"state": s, "limit": limit}) for s in LIST_ORDER}
        config = ok_payload(ask(name, "config"), dict) or {}
    except ConnectError:
        return jsonify({"status": shown_state(sv)})
    body = {"status": live["status"], "ping": live["ping"], "pid": sv.pid,
            "uptime": live["uptime"], "time": int(time.time())}
    body.update({f"{s}_size": live["counts"][s] for s in LIST_ORDER})
    body["messages"] = lists
    body["schedule"] = schedule_view(name, list(config.get("schedule") or []), time.time())
    return jsonify(body)


@bp.get("/q/<name>/done.json")
def done_json(name: str) -> Response:
    require_queue(name)
    ids = backend().store(name).iter_hashed("done")
    return jsonify(list(itertools.islice(ids, limit_arg(10))))


# ---------------------------------------------------------------- routes 15-18


@bp.get("/q/<name>/config.json")
def config_file(name: str) -> Response:
    qdir = os.path.join(main_config().root, "queue", name)
    if not protocol.valid_queue_name(name) or not os.path.isdir(qdir):
        fail(404, "Queue not found")
    try:
        with open(os.path.join(qdir, "config.json"), "rb") as fh:
            data = fh.read()
    except OSError:
        fail(404, f"Queue config for '{name}' not found")
    return Response(data, mimetype="application/json")


@bp.get("/q/<name>/config")
def config_normalised(name: str) -> Response:
    require_queue(name)
    try:
        config = ok_payload(ask(name, "config"), dict)
    except ConnectError:
        config = None
    if config is None:
        try:
            config = load_queue_config(main_config().root, name)[0].normalised()
        except ConfigError as exc:
            fail(500, f"Invalid queue config: {exc}")
    return jsonify(config)


def find_message(name: str, msg_id: str) -> dict[str, Any]:
    require_queue(name)
    require_not_down(name)
    msg = read_message(backend().store(name), msg_id)
    if msg is None:
        fail(404, "Message ID not found")
    return msg


@bp.get("/q/<name>/<msg_id>.json")
def message_json(name: str, msg_id: str) -> Response:
    return jsonify(find_message(name, msg_id))


@bp.get("/q/<name>/<msg_id>/state.json")
def message_state(name: str, msg_id: str) -> Response:
    require_queue(name)
    require_not_down(name)
    found = backend().store(name).locate(msg_id)  # no message read: tail views poll this
    if found is None:
        fail(404, "Message ID not found")
    return jsonify([found[0]])


# ---------------------------------------------------------------- routes 28, 29


def timer_entry(name: str, due: Any) -> dict[str, Any]:
    plain = name and "/" not in name and "." not in name  # S10.1 names: stay in timers/
    data = read_json_file(os.path.join(main_config().root, "timers", f"{name}.json")) \
        if plain else None
    data = data if isinstance(data, dict) else {}
    msg = data["msg"] if isinstance(data.get("msg"), dict) else {}
    return {"name": name, "due": due, "period": data.get("period"), "dest": msg.get("dest")}


@bp.get("/timers.json")
def timers_json() -> Response:
    be = backend()
    listed = ok_payload(be.mgr("timers"), list) or []
    totals = ok_payload(be.mgr("timers_status"), dict) or {}
    timers = [timer_entry(str(t[0]), t[1]) for t in listed
              if isinstance(t, list) and len(t) == 2]
    return jsonify({"timers": timers, "sent": totals.get("sent", 0),
                    "errors": totals.get("errors", 0)})


def queue_figures(name: str, sup: dict[str, Any], now: float) -> metrics.QueueFigures:
    sv = supervised(name, sup)
    live = live_view(name, sv)
    store = backend().store(name)
    if live is None:
        try:
            workers: int | None = load_queue_config(main_config().root, name)[0].num_workers
        except ConfigError:
            workers = None
        oldest = api_state().disk.oldest_due(store)
        age = max(0.0, now - oldest) if oldest is not None else 0.0
        return metrics.QueueFigures(name, shown_state(sv), disk_counts(name), workers,
                                    sv.restarts, age)
    try:
        config = ok_payload(ask(name, "config"), dict) or {}
        head = ask(name, "messages", {"state": "que", "limit": 1})
    except ConnectError:
        config, head = {}, []
    due = head[0].get("due") if isinstance(head, list) and head else None
    age = max(0.0, now - due) if isinstance(due, (int, float)) else 0.0
    return metrics.QueueFigures(name, live["status"], live["counts"],
                                config.get("num_workers"), sv.restarts, age)


@bp.get("/metrics")
def metrics_view() -> Response:
    be = backend()
    version = current_app.config["RQ_VERSION"]
    if not be.mgr_alive():
        return Response(metrics.render_down(version), content_type=metrics.CONTENT_TYPE)
    sup = supervision()
    now = time.time()
    figures = [queue_figures(n, sup, now) for n in be.queue_names()]
    tally = api_state().tally
    tally.update()
    timers = ok_payload(be.mgr("timers_status"), dict) or {}
    text = metrics.render(version, first(be.mgr("uptime")) or 0, figures, tally, timers)
    return Response(text, content_type=metrics.CONTENT_TYPE)
