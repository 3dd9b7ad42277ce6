"""Read-only JSON and text routes and `/metrics` (SPEC S15 routes 6-10, 15-18, 28, 29).

The figures (supervision state, live counts or counts from disk, messages as
read, schedules, timers) are gathered by `web.queues`, shared with the HTML
pages; the S18 exposition lives in `web.metrics`.  Nothing here changes state.
"""

from __future__ import annotations

import itertools
import os
import re
import time
from typing import Any

from flask import Blueprint, Response, current_app, jsonify, request

from rq import protocol
from rq.message import matches_query
from rq.config import load_queue_config
from rq.errors import ConfigError, ConnectError

from . import metrics
from .errors import fail
from .queues import (ALL, ORDER, ask, counters, disk_counts, find_message, ids_in, live_view,
                     queue_entry, read_message, schedule_view, shown_state, supervised,
                     supervision, timer_list)
from .views import (backend, first, main_config, ok_payload, read_int_file, require_not_down,
                    require_queue, text_response)

bp = Blueprint("api", __name__)

LIST_ORDER = ("prep", "que", "run", "done", "err", "relayed")  # S15.3 sizes and lists
QUERY_RE = re.compile(r"query\[(.+)\]")
MAX_LIMIT = ALL  # "every entry": islice and the queues take no more


def limit_arg(default: int) -> int:
    """`limit`; not a number → the default; a number above MAX_LIMIT → 400 (issue 13 D9)."""
    value = request.args.get("limit", "")
    if not (value.isdecimal() and value.isascii()):
        return default
    if len(value) > 10 or int(value) > MAX_LIMIT:
        fail(400, "Invalid limit")
    return int(value)


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
    found = (m for m in candidates if m is not None and matches_query(m, query, exact))
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


@bp.get("/timers.json")
def timers_json() -> Response:
    be = backend()
    timers = timer_list()
    totals = ok_payload(be.mgr("timers_status"), dict) or {}
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
        oldest = counters().disk.oldest_due(store)
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
    tally = counters().tally
    tally.update()
    timers = ok_payload(be.mgr("timers_status"), dict) or {}
    text = metrics.render(version, first(be.mgr("uptime")) or 0, figures, tally, timers)
    return Response(text, content_type=metrics.CONTENT_TYPE)
