"""Every POST route of the web server (SPEC S15 routes 3–5, 12–14, 19–22, 27).

Owns: turning a form, multipart upload or JSON body into one manager command
(create, link, delete, admin flags, restart) or one queue command (create,
commit, delete, destroy, run, clone, attach), then answering with the reply as
JSON, or with a flash and a 303 redirect (S14.9, S14.10).  It never changes a
file itself: an upload is only spooled to `tmpdir` for the queue process to
link, and removed afterwards.  Names are checked before any path is built, so
no request reaches outside the root.
"""

from __future__ import annotations

import os
import posixpath
import tempfile
from typing import IO, Any

from flask import (Blueprint, Response, current_app, flash, g, jsonify, redirect, render_template,
                   request)
from markupsafe import Markup
from werkzeug.datastructures import FileStorage
from werkzeug.exceptions import RequestEntityTooLarge

from rq import protocol
from rq.errors import Fail, ProtocolError
from rq.message import normalize_input
from rq.mgr.fanout import COMMIT_WAIT, MISSING_DEST, NO_MATCH
from rq.topics import pattern_problem

from .errors import RQHTTPError, fail
from .forms import nested
from .views import (ask_mgr, ask_queue, back_or, is_ok, json_body, main_config, page_url,
                    parse_json, read_json_file, require_message, require_queue,
                    require_queue_creation, safe_back, text_response, wants_reply)

bp = Blueprint("actions", __name__)

MGR_FLASH = Markup("We got <code>{}</code> from form, and <code>{}</code> from QueueMgr")
MAX_UPLOAD_PARTS = 64              # fields and files of one route 21 form
MAX_UPLOAD_FILES = 4               # file parts spooled to tmpdir; one more is a 413
MAX_UPLOAD_FIELD_BYTES = 1 << 20  # x_format, msg_id, back; above the parser's 64 KiB reads
ATTACH_TIMEOUT = 600.0  # the queue copies an upload that is on another filesystem (S4.8)
ADMIN_OPS = (("pause", "paused"), ("resume", "resumed"), ("down", "downed"), ("up", "upped"))
OPTIONAL_QUEUE_KEYS = ("num_workers", "timeout", "kill_grace", "mode", "topic", "lease_timeout")
MESSAGE_COMMANDS = {"commit": "create_message", "prep": "prep_message",
                    "single_que": "single_que"}
# route 27: _method -> (queue command, flash on success, flash prefix on failure,
#                       success goes to the queue page rather than the message page)
MESSAGE_ACTIONS = {
    "delete": ("delete_message", "Message deleted successfully", "Delete got", True),
    "destroy": ("destroy_message", "Message destroyed successfully", "destroy got", True),
    "commit": ("commit_message", "Message committed successfully", "Commit got", False),
}
BULK_ACTIONS = {"requeue": ("requeue_messages", "Requeue", "Requeued"),
                "purge": ("purge_messages", "Purge", "Purged")}
FANOUT_TIMEOUT = COMMIT_WAIT * 3  # rq-mgr may wait that long for a queue (rq.mgr.fanout)
BULK_TIMEOUT = 3600.0  # a purge of a large hashdir takes a while (rq.queue.bulkmove)
CREATED_PAGE = """{% extends "layout.html" %}
{% block title %}New message{% endblock %}
{% block body %}
<h2>New message for queue {{ name }}</h2>
{% if link %}<p>Created message <a href="{{ link }}">{{ reply[1] }}</a></p>
{% else %}<p class="error">Error creating message: {{ reason }}</p>{% endif %}
<p>Reply: <code>{{ reply_json }}</code></p>
<p><a href="{{ queue_link }}">Back to queue {{ name }}</a></p>
{% endblock %}
"""


@bp.before_request
def set_body_limits() -> None:
    """Every body is bounded by max_body_bytes (the app's MAX_CONTENT_LENGTH) but
    route 21's, whose files go straight to tmpdir: its parts, its fields and its
    whole size are capped before the parser writes anything (issue 13 D2)."""
    if request.endpoint == "actions.attach_new":
        request.max_content_length = main_config().max_upload_bytes
        request.max_form_parts = MAX_UPLOAD_PARTS
        request.max_form_memory_size = MAX_UPLOAD_FIELD_BYTES
        spool_uploads(upload_dir())


@bp.teardown_request
def remove_spooled(exc: BaseException | None = None) -> None:
    """Close and remove every file spooled for this request, whatever happened
    to it (refused, failed, answered, or its client gone)."""
    for stream, path in g.pop("rq_spooled", ()):
        stream.close()
        try:
            os.unlink(path)
        except OSError:
            pass


# ---------------------------------------------------------------- queues (manager commands)


@bp.post("/new_queue")
def new_queue() -> Any:
    require_queue_creation()
    fields = {k: v for k, v in nested(request.values, "queue").items()
              if not (k in OPTIONAL_QUEUE_KEYS and v == "")}  # a blank form field = default
    reply = ask_mgr("create_queue", fields, raw=False)
    if wants_reply():
        return jsonify(reply)
    flash_mgr(fields, reply)
    return redirect(page_url("q", text_or_empty(fields.get("name"))), 303)


@bp.post("/new_queue_link")
def new_queue_link() -> Any:
    require_queue_creation()
    form = nested(request.values, "queue")
    path = text_or_empty(form.get("json_path"))
    config = read_json_file(path)
    if not isinstance(config, dict):
        fail(404, f"Couldn't parse json file ({path}).")
    reply = ask_mgr("create_queue_link", path)
    if wants_reply():
        return jsonify(reply)
    flash_mgr(form, reply)
    return redirect(page_url("q", text_or_empty(config.get("name"))), 303)


@bp.post("/delete_queue")
def delete_queue() -> Any:
    name = request.values.get("queue_name", "")
    reply = ask_mgr("delete_queue", name)
    if wants_reply():
        return jsonify(reply)
    flash_mgr({"queue_name": name}, reply)
    return redirect(page_url(), 303)


@bp.post("/q/<name>/adminoper")
def adminoper(name: str) -> Any:
    require_queue(name)
    op = next((op for op in ADMIN_OPS if op[0] in request.values), None)
    if op is None:
        fail(400, "Invalid admin operation")
    verb, done = op
    return manager_action(name, f"{verb}_queue", verb, done)


@bp.post("/q/<name>/restart")
def restart(name: str) -> Any:
    require_queue(name)
    return manager_action(name, "restart_queue", "restart", "restarted")


def manager_action(name: str, cmd: str, verb: str, done: str) -> Any:
    """Routes 13 and 14: one manager command, then the reply, a 500 or a flash + 303."""
    reply = ask_mgr(cmd, name)
    if wants_reply():
        return jsonify(reply)
    if not is_ok(reply):
        fail(500, f"Couldn't {verb} queue. {protocol.dumps(reply)}.")
    flash(f"Successfully {done} queue {name}")
    return redirect(back_or(page_url("q", name)), 303)


# ---------------------------------------------------------------- bulk (issue 16 item 6)


@bp.post("/q/<name>/bulk")
def bulk(name: str) -> Any:
    """Requeue or purge many messages: first a page that counts what would be moved
    (a dry run) and asks to confirm, then the move and a flash with the count.
    `x_format=json` gets the queue's reply at once (`dry_run=1` to only count)."""
    require_queue(name)
    action = request.values.get("action", "")
    if action not in BULK_ACTIONS:
        fail(400, "Invalid bulk action")
    cmd, title, done = BULK_ACTIONS[action]
    arg = bulk_arg(action)
    dry = request.values.get("confirm") != "yes" if not wants_reply() \
        else request.values.get("dry_run") in ("1", "true", "yes")
    reply = ask_queue(name, cmd, {**arg, "dry_run": True} if dry else arg, timeout=BULK_TIMEOUT)
    if wants_reply():
        return jsonify(reply)
    if not is_ok(reply):
        fail(500, f"Couldn't {action} messages. {protocol.dumps(reply)}.")
    if dry:
        return render_template("bulk_confirm.html", name=name, title=title, count=reply[1],
                               arg=arg, fields=[(k, v) for k, v in request.form.items(multi=True)
                                                if k != "confirm"])
    flash(f"{done} {reply[1]} message{'' if reply[1] == 1 else 's'}")
    return redirect(page_url("q", name), 303)


def bulk_arg(action: str) -> dict[str, Any]:
    """The queue command's argument from the form: `state` (purge: repeatable, default
    done, err and relayed), `older_than` (purge: an age such as 7d), `query[FIELD]` and
    `exact` (a search as GET /search)."""
    values = request.values
    query = {k: v for k, v in nested(values, "query").items() if isinstance(v, str) and v}
    arg: dict[str, Any] = {"query": query,
                           "exact": values.get("exact") not in (None, "", "false", "0")}
    if action == "requeue":
        arg["state"] = values.get("state") or "err"
        return arg
    arg["states"] = [s for s in values.getlist("state") if s] or ["done", "err", "relayed"]
    try:
        arg["older_than"] = protocol.parse_age(values.get("older_than", ""))
    except ProtocolError:
        fail(400, "Invalid older_than")
    return arg


# ---------------------------------------------------------------- messages (queue commands)


@bp.post("/q/<name>/new_message")
def new_message(name: str) -> Any:
    as_json = request.mimetype == "application/json" or request.values.get("x_format") != "html"
    try:
        require_queue(name)
        fields = message_input(as_json)
        method = fields.pop("_method", "commit")
        command = MESSAGE_COMMANDS.get(method) if isinstance(method, str) else None
        if command is None:
            fail(400, "Invalid method param")
        reply = ask_queue(name, command, fields)
    except RQHTTPError as exc:  # forms (a) and (b) are JSON even without x_format=json
        if not as_json:
            raise
        return json_error(exc)
    return jsonify(reply) if as_json else message_created(name, reply)


@bp.post("/fanout")
def fanout() -> Any:
    """Issue 18 item 2 (docs/guide/fanout.md): route 12's message (a JSON body, `mesg=<JSON>`
    or `mesg[...]` fields) with `dest` a topic pattern, one copy in every queue whose topic
    matches (rq-mgr's `create_message`, rq.mgr.fanout, all or nothing).  Always JSON:
    `["ok", [FULL_ID, …]]`; a bad pattern or message 400, no matching queue 404, a
    queue's refusal 200 `["fail", reason]` (as route 12), rq-mgr not running 503."""
    try:
        fields = message_input(True)
        problem = pattern_problem(fields.get("dest")) if fields.get("dest") else MISSING_DEST
        if problem:
            fail(400, problem)
        try:
            normalize_input(fields, 0.0)
        except Fail as exc:
            fail(400, str(exc))
        reply = ask_mgr("create_message", fields, raw=False, timeout=FANOUT_TIMEOUT)
        if isinstance(reply, list) and len(reply) > 1 and str(reply[1]).startswith(NO_MATCH):
            fail(404, str(reply[1]))
    except RQHTTPError as exc:
        return json_error(exc)
    return jsonify(reply)


@bp.post("/q/<name>/<msg_id>/clone")
def clone(name: str, msg_id: str) -> Any:
    require_message(name, msg_id)
    reply = ask_queue(name, "clone_message", {"msg_id": msg_id})
    if wants_reply():
        return jsonify(reply)
    if not is_ok(reply):
        fail(500, f"Couldn't clone message. {protocol.dumps(reply)}.")
    flash("Message cloned successfully")
    return redirect(page_url("q", name), 303)


@bp.post("/q/<name>/<msg_id>/run_now")
def run_now(name: str, msg_id: str) -> Any:
    require_message(name, msg_id)
    return run_message(name, msg_id)


@bp.post("/q/<name>/<msg_id>/attach/new")
def attach_new(name: str, msg_id: str) -> Any:
    require_message(name, msg_id)  # before the body is parsed: a 404 spools nothing
    upload = filedata()
    arg = {"msg_id": msg_id, "pathname": spooled_path(upload),
           "name": posixpath.basename(upload.filename or "")}
    reply = ask_queue(name, "attach_message", arg, timeout=ATTACH_TIMEOUT)
    if wants_reply():
        return jsonify(reply)
    if not is_ok(reply):
        return text_response(f"Commit {name}/{msg_id} got {protocol.dumps(reply)}")
    flash("Attached message successfully")
    return redirect(page_url("q", name, msg_id), 303)


@bp.post("/q/<name>/<msg_id>/attach/<attname>")
def attach_delete(name: str, msg_id: str, attname: str) -> Any:
    require_message(name, msg_id)
    if not attname or attname.startswith(".") or "/" in attname:
        fail(404, f"Message ID attachment '{attname}' not found")
    if request.values.get("_method") != "delete":
        fail(400, "Invalid method param")
    arg = {"msg_id": msg_id, "attachment_name": attname}
    reply = ask_queue(name, "delete_attach_message", arg)
    if wants_reply():
        return jsonify(reply)
    if not is_ok(reply):
        return text_response(f"Delete of attach {attname} on {name}/{msg_id} got "
                          f"{protocol.dumps(reply)}")
    flash("Attachment deleted successfully")
    return redirect(page_url("q", name, msg_id), 303)


@bp.post("/q/<name>/<msg_id>")
def message_action(name: str, msg_id: str) -> Any:
    require_message(name, msg_id)
    method = request.values.get("_method")
    if method == "run_now":
        return run_message(name, msg_id)
    if method not in MESSAGE_ACTIONS:
        fail(400, "Invalid method param")
    command, done, failed, to_queue = MESSAGE_ACTIONS[method]
    reply = ask_queue(name, command, {"msg_id": msg_id})
    if wants_reply():
        return jsonify(reply)
    if not is_ok(reply):
        flash(f"{failed} {protocol.dumps(reply)}", "error")
        return redirect(page_url("q", name, msg_id), 303)
    flash(done)
    return redirect(page_url("q", name) if to_queue else page_url("q", name, msg_id), 303)


def run_message(name: str, msg_id: str) -> Any:
    """Route 20, also route 27 with `_method=run_now`."""
    reply = ask_queue(name, "run_message", {"msg_id": msg_id})
    if wants_reply():
        return jsonify(reply)
    if not is_ok(reply):
        fail(500, f"Couldn't run message. {protocol.dumps(reply)}.")
    flash("Message in run successfully")
    return redirect(page_url("q", name, msg_id), 303)


def message_input(as_json: bool) -> dict[str, Any]:
    """Route 12's message: (a) a JSON body, (b) `mesg=<JSON>`, (c) `mesg[...]` fields."""
    if request.mimetype == "application/json":
        data = json_body()
    else:
        form = nested(request.values, "mesg")
        raw = request.values.get("mesg")
        if form or (raw is None and not as_json):
            return form
        data = parse_json(raw or "")  # no mesg at all: 400 Invalid JSON
    if not isinstance(data, dict):
        fail(400, "Invalid JSON")
    return data


def message_created(name: str, reply: Any) -> Any:
    """Form (c): flash and go `back`, or a page with the reply and a link to the message."""
    reason = reply[1] if isinstance(reply, list) and len(reply) > 1 else protocol.dumps(reply)
    back = safe_back()
    if back is not None:
        flash(f"Created message {reason}" if is_ok(reply) else f"Error creating message: {reason}")
        return redirect(back, 303)
    link = page_url("q", name, str(reason).rsplit("/", 1)[-1]) if is_ok(reply) else None
    # compiled once per app, not on every request as render_template_string would
    page = current_app.extensions.get("rq_created_page")
    if page is None:
        page = current_app.extensions["rq_created_page"] = \
            current_app.jinja_env.from_string(CREATED_PAGE)
    return render_template(page, name=name, reply=reply, reason=reason, link=link,
                           reply_json=protocol.dumps(reply), queue_link=page_url("q", name))


# ---------------------------------------------------------------- uploads (route 21)


def spool_uploads(directory: str) -> None:
    """Make the form parser write each uploaded file straight into `directory`
    (the main config's tmpdir: a large upload never lands in the system temp
    dir first); remove_spooled removes them when the request ends."""
    spooled: list[tuple[IO[bytes], str]] = []
    g.rq_spooled = spooled

    def new_file(total_content_length: int | None, content_type: str | None,
                 filename: str | None, content_length: int | None = None) -> IO[bytes]:
        if len(spooled) >= MAX_UPLOAD_FILES:
            raise RequestEntityTooLarge("Too many files in one upload")
        fd, path = tempfile.mkstemp(dir=directory, prefix="rq-upload-")
        stream = os.fdopen(fd, "w+b")
        spooled.append((stream, path))
        return stream

    request._get_file_stream = new_file  # type: ignore[method-assign, assignment]


def spooled_path(upload: FileStorage) -> str:
    """The file holding the upload, flushed for the queue process to link."""
    for stream, path in g.rq_spooled:
        if stream is upload.stream:
            stream.flush()
            return path
    raise RuntimeError("upload parsed outside the spool")  # set_body_limits runs first


def filedata() -> FileStorage:
    upload = request.files.get("filedata")
    if upload is None:
        fail(404, "Wrong input type for filedata param" if "filedata" in request.form
             else "Missing required param filedata")
    if not posixpath.basename(upload.filename or ""):
        fail(404, "Missing filename of uploaded file in filedata param")
    return upload


def upload_dir() -> str:
    return os.path.abspath(main_config().tmpdir or tempfile.gettempdir())


# ---------------------------------------------------------------- helpers


def flash_mgr(form: Any, reply: Any) -> None:
    flash(MGR_FLASH.format(protocol.dumps(form), protocol.dumps(reply)))


def json_error(exc: RQHTTPError) -> Response:
    resp = jsonify(["fail", exc.text])
    resp.status_code = exc.code or 500
    return resp


def text_or_empty(value: Any) -> str:
    return value if isinstance(value, str) else ""
