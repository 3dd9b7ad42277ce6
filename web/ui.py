"""HTML pages (SPEC S16; S15 routes 1, 2, 9, 11 and 17): the dashboard, the
queue-creation form, the queue page, the new-message form and the message
pages.

Views gather what a page shows (the manager, the queue processes, and a
read-only look at the store and config files) and render a template.  Nothing
here changes state: every button posts to a route of web.actions, by plain
path under ROOT.  Pages are complete without JavaScript; static/dashboard.js
and static/queue.js keep them fresh from the JSON routes of web.api and
render times relative to now.  What they show about queues is gathered by
web.queues, shared with the JSON routes.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import time
from typing import Any

from flask import Blueprint, render_template
from markupsafe import Markup, escape

from rq import __version__, message
from rq.config import load_queue_config
from rq.errors import RQError

from . import queues
from .backend import BUILTIN
from .errors import fail
from .views import (backend, first, flag, main_config, queue_url, read_int_file,
                    require_queue, require_queue_creation, root_url)

bp = Blueprint("ui", __name__)

STATES = ("prep", "que", "run", "err", "done", "relayed")
LIST_LIMIT = 100         # entries per state on the queue page (as q/NAME.json)
SUMMARY_KEYS = ("msg_id", "count", "max_count", "param1", "param2", "param3", "param4",
                "post_run_webhook", "orig_msg_id", "cloned_from", "dups", "dup",
                "force_remote")
URL_RE = re.compile(r"^https?://", re.IGNORECASE)

# S16.4: (field key, default label, default help) in page order.
FORM_FIELDS: tuple[tuple[str, str, str | None], ...] = (
    ("mesg_dest", "Destination Queue", None),
    ("mesg_src", "Source Identifier", "a free-form tag saying who sends the message"),
    *((f"mesg_param{i}", f"Param {i}", "optional parameter") for i in range(1, 5)),
    ("mesg_status", "Status",
     "'commit' queues the message now; 'prep' keeps it in prep until it is committed, "
     "so files can be attached; 'single_que' queues it only when no message waits in "
     "que, else answers with the waiting one."),
    ("mesg_post_run_webhook", "post_run_hook",
     "URLs, separated by spaces, that get a POST when the message finishes"),
)


# ------------------------------------------------------------------ gathering

def manager_info() -> dict[str, Any]:
    """The manager part of S15.1 (the security hook has already seen it answer)."""
    b = backend()
    return {"status": "OPERATIONAL", "ping": "pong",
            "pid": read_int_file(os.path.join(b.root, "config", "queuemgr.pid")),
            "uptime": first(b.mgr("uptime")), "version": first(b.mgr("version")),
            "time": int(time.time())}


def state_lists(name: str, running: bool, limit: int) -> dict[str, list[dict[str, Any]]]:
    """Entries per state as `messages` lists them (S7.3); ids only, from disk,
    when the queue process does not answer."""
    store = backend().store(name)
    lists: dict[str, list[dict[str, Any]]] = {}
    for state in STATES:
        reply = queues.ask_or_none(name, "messages", {"state": state, "limit": limit}) \
            if running else None
        if isinstance(reply, list) and all(isinstance(e, dict) for e in reply):
            lists[state] = reply
        else:
            ids = itertools.islice(queues.ids_in(name, store, state), limit)
            lists[state] = [{"msg_id": i} for i in ids]
    return lists


def queue_schedule(name: str, now: float) -> list[dict[str, Any]]:
    """S9.4 entries (cron, id, next, last, tz, params) of the queue's valid schedule."""
    try:
        config, _ = load_queue_config(main_config().root, name)
    except (RQError, OSError, ValueError):
        return []
    entries = queues.schedule_view(name, [dict(e) for e in config.schedule], now)
    for entry in entries:
        entry["params"] = {k: entry[k] for k in queues.PARAMS if entry.get(k) is not None}
    return entries


def load_overrides(name: str) -> dict[str, Any]:
    """queue/NAME/form.json (S16.5), re-read on every request."""
    path = os.path.join(main_config().root, "queue", name, "form.json")
    try:
        with open(path, "rb") as fh:
            data = json.loads(fh.read())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError):
        fail(500, "Bad overrides file")
    if not isinstance(data, dict):
        fail(500, "Bad overrides file")
    return data


def form_fields(overrides: dict[str, Any]) -> dict[str, dict[str, Any]]:
    hide_by_default = overrides.get("default") == "hidden"
    fields = {}
    for key, label, help_text in FORM_FIELDS:
        entry = overrides.get(key)
        custom = entry if isinstance(entry, dict) else {}
        fields[key] = {
            "label": custom["label"] if isinstance(custom.get("label"), str) else label,
            "help": custom["help"] if isinstance(custom.get("help"), str) else help_text,
            "hidden": hide_by_default and key not in overrides}
    return fields


# ------------------------------------------------------------------ message summary

def msg_link(ref: Any) -> Markup:
    """A full id as a link (local ones relative to ROOT); anything else as text."""
    text = str(ref)
    if not URL_RE.match(text):
        return escape(text)
    base = main_config().base_url
    href = root_url() + text[len(base):] if text.startswith(base) else text
    return Markup('<a href="{}">{}</a>').format(href, text)


def summary_value(name: str, msg: dict[str, Any], key: str) -> Markup:
    value = msg[key]
    if key in ("orig_msg_id", "dup"):
        return msg_link(value)
    if key == "dups" and isinstance(value, list):
        return Markup(" ").join(msg_link(v) for v in value)
    if key == "cloned_from":  # a short id in the same queue
        return Markup('<a href="{}/{}">{}</a>').format(queue_url(name), value, value)
    if isinstance(value, bool):
        return escape("true" if value else "false")
    if isinstance(value, list):
        return escape(" ".join(str(v) for v in value))
    return escape(str(value))


def status_value(msg: dict[str, Any]) -> Markup:
    """The computed status; for a relayed message its last word, the new id, as a link."""
    status = str(msg.get("status", ""))
    if msg.get("state") != "relayed" or " - " not in status:
        return escape(status)
    new_id = status.split()[-1]
    return Markup("{}{}").format(status[:status.rindex(new_id)], msg_link(new_id))


def info_row(key: str, value: Markup, hidden: bool = False) -> Markup:
    """One S16.3 row, exactly: `<td class="key">` NL SP KEY ... SP VALUE SP `</td>`."""
    cls = Markup(' class="hideme"') if hidden else Markup("")
    return Markup('<tr{}><td class="key">\n {}</td><td class="sep"> : </td>'
                  '<td> {} </td></tr>\n').format(cls, key, value)


def summary_rows(name: str, msg: dict[str, Any]) -> Markup:
    rows = [info_row("dest", escape(str(msg.get("dest", "")))),
            info_row("status", status_value(msg)),
            info_row("state", escape(str(msg.get("state", "")))),
            info_row("src", escape(str(msg.get("src", ""))))]
    rows += [info_row(k, summary_value(name, msg, k), hidden=True)
             for k in SUMMARY_KEYS if k in msg]
    return Markup("").join(rows)


# ------------------------------------------------------------------ template helpers

@bp.app_context_processor
def page_values() -> dict[str, Any]:
    return {"ui_root": root_url(), "ui_now": int(time.time()), "queue_url": queue_url}


@bp.app_template_filter("duration")
def duration(secs: Any) -> str:
    """`3 d 4 h`, `2 h 5 min`, `4 min 2 s`, `42 s` (queue.js formats the same)."""
    if not isinstance(secs, (int, float)):
        return "–"
    secs = int(secs)
    for unit, size, sub, sub_size in (("d", 86400, "h", 3600), ("h", 3600, "min", 60),
                                      ("min", 60, "s", 1)):
        if secs >= size:
            rest = (secs % size) // sub_size
            return f"{secs // size} {unit}" + (f" {rest} {sub}" if rest else "")
    return f"{secs} s"


@bp.app_template_filter("clock")
def clock(epoch: Any) -> str:
    if not isinstance(epoch, (int, float)):
        return "–"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(epoch))


@bp.app_template_filter("bytes")
def human_bytes(size: Any) -> str:
    if not isinstance(size, int):
        return "–"
    if size < 1024:
        return f"{size} B"
    value = size / 1024
    for unit in ("KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            break
        value /= 1024
    return f"{value:.1f} {unit}"


@bp.app_template_filter("id_epoch")
def id_epoch(msg_id: Any) -> float | None:
    try:
        return message.id_epoch(str(msg_id))
    except RQError:
        return None


# ------------------------------------------------------------------ views

@bp.get("/")
def dashboard() -> str:
    now = time.time()
    sup = queues.supervision()
    entries = [queues.queue_entry(n, sup) for n in backend().queue_names()]
    for q in entries:
        q["schedule"] = queue_schedule(q["name"], now)
        q["paused"], q["down"] = flag(q["name"], "pause"), flag(q["name"], "down")
    mgr = manager_info()
    return render_template(
        "dashboard.html", mgr=mgr, version_ok=mgr["version"] == __version__,
        custom=[q for q in entries if q["name"] not in BUILTIN],
        builtin=[q for q in entries if q["name"] in BUILTIN], builtin_names=BUILTIN,
        timers=queues.timer_list(), allow_new_queue=main_config().allow_new_queue)


@bp.get("/new_queue")
def new_queue() -> str:
    require_queue_creation()
    return render_template("new_queue.html")


@bp.get("/q/<name>")
def queue_page(name: str) -> str:
    require_queue(name)
    q = queues.queue_entry(name, queues.supervision())
    q["paused"], q["down"] = flag(name, "pause"), flag(name, "down")
    q["schedule"] = queue_schedule(name, time.time())  # S9.4 entries with Run Now
    lists = state_lists(name, q["ping"] == "pong", LIST_LIMIT)
    return render_template("queue.html", q=q, lists=lists, config_text=config_text(name),
                           limit=LIST_LIMIT)


def config_text(name: str) -> str:
    path = os.path.join(main_config().root, "queue", name, "config.json")
    try:
        with open(path, "rb") as fh:
            raw = fh.read().decode("utf-8", "replace")
    except OSError as exc:
        return f"(cannot read config.json: {exc.strerror or exc})"
    try:
        return json.dumps(json.loads(raw), indent=2, ensure_ascii=False)
    except ValueError:
        return raw


@bp.get("/q/<name>/new_message")
def new_message(name: str) -> str:
    require_queue(name)
    fields = form_fields(load_overrides(name))
    dest = f"{main_config().relative_root}q/{name}"
    return render_template("new_message.html", name=name, fields=fields, dest=dest)


@bp.get("/q/<name>/<msg_id>")
def message_page(name: str, msg_id: str) -> str:
    msg = queues.find_message(name, msg_id)  # 404 (queue, message) or 503 (DOWN queue)
    template = "prep_message.html" if msg["state"] == "prep" else "message.html"
    return render_template(template, name=name, msg_id=msg_id, msg=msg,
                           rows=summary_rows(name, msg), attachments=msg.get("_attachments") or {},
                           msg_url=f"{queue_url(name)}/{msg_id}")
