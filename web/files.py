"""Logs and attachments of a message (SPEC S15 routes 23–26, S16.6, S17).

Owns: serving `job/LOGNAME` and `attach/ATTNAME` of a message in any state
with single byte ranges (S17.1), the log as Server-Sent Events (S17.2) and the
tail-view pages (S16.6; the rendering lives in static/tail.js).

Files are read straight from the store (STYLE habit 2) and never written.
A name is a plain file name; the file is opened first and its real path
checked afterwards (through /proc/self/fd), so a symlink a job plants in
`job/` cannot reach outside its message directory, not even by swapping the
file between a check and the open.  A message may move between states while
we look (one rename of its directory): a failed open looks the message up
again, and an open file keeps working across moves.
"""

from __future__ import annotations

import codecs
import mimetypes
import os
import re
import stat
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from urllib.parse import quote

from flask import Blueprint, Response, current_app, render_template, request, url_for
from werkzeug.http import http_date, parse_date

from rq import protocol
from rq.store import STATES, Store

from .errors import fail
from .limits import HeldBody, take_long_slot
from .views import backend, require_not_down, require_queue

bp = Blueprint("files", __name__)

LOG_MISSING = "Message ID log '{}' not found"
ATTACH_MISSING = "Message ID attachment '{}' not found"
FINAL_STATES = ("done", "err", "relayed")
READ_SIZE = 65536
EAGER_SIZE = 1 << 20      # smaller answers are read at once and the file closed in the view
POLL_SECONDS = 0.1        # the stream looks at the file this often: new data within 250 ms
KEEPALIVE_SECONDS = 15.0  # S17.2; app.config["RQ_STREAM_KEEPALIVE"] overrides it (tests)
RANGE_RE = re.compile(r"\s*(\d*)\s*-\s*(\d*)\s*")
# A file a job or an uploader controls must never run as a page of this origin.
FILE_HEADERS = {"Cache-Control": "no-cache", "Accept-Ranges": "bytes",
                "X-Content-Type-Options": "nosniff", "Content-Security-Policy": "sandbox"}


@dataclass(frozen=True)
class Located:
    store: Store
    msg_id: str
    state: str
    path: str


# ---------------------------------------------------------------- routes

@bp.route("/q/<name>/<msg_id>/log/<logname>")
def log_file(name: str, msg_id: str, logname: str) -> Response:
    fd = open_message_file(locate_message(name, msg_id), "job", logname, LOG_MISSING)
    return serve_file(fd, log_content_type(logname))


@bp.route("/q/<name>/<msg_id>/attach/<attname>", methods=["GET"])
def attachment(name: str, msg_id: str, attname: str) -> Response:
    fd = open_message_file(locate_message(name, msg_id), "attach", attname, ATTACH_MISSING)
    return serve_file(fd, mimetypes.guess_type(attname)[0] or "application/octet-stream")


@bp.route("/q/<name>/<msg_id>/logstream/<logname>")
def log_stream(name: str, msg_id: str, logname: str) -> Response:
    found = locate_message(name, msg_id)
    offset = stream_offset()
    fd = open_message_file(found, "job", logname, LOG_MISSING)
    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    if request.method == "HEAD":
        os.close(fd)
        return Response(status=200, mimetype="text/event-stream", headers=headers)
    try:
        release = take_long_slot()  # S14.1: a stream never takes a short request's worker
    except BaseException:
        os.close(fd)
        raise
    keepalive = float(current_app.config.get("RQ_STREAM_KEEPALIVE", KEEPALIVE_SECONDS))
    events = stream_events(fd, lambda: message_state(found), offset, keepalive,
                           request.environ.get("waitress.client_disconnected"))
    return Response(HeldBody(events, release), mimetype="text/event-stream", headers=headers,
                    direct_passthrough=True)


@bp.route("/q/<name>/<msg_id>/tailview/<attname>")
def tail_attachment(name: str, msg_id: str, attname: str) -> str:
    found = locate_message(name, msg_id)
    if not plain_name(attname):
        fail(404, ATTACH_MISSING.format(attname))
    src = url_for("files.attachment", name=name, msg_id=msg_id, attname=attname)
    return render_tail(found, attname, src, stream=None)


@bp.route("/q/<name>/<msg_id>/tailviewlog/<logname>")
def tail_log(name: str, msg_id: str, logname: str) -> str:
    found = locate_message(name, msg_id)
    if not plain_name(logname):
        fail(404, LOG_MISSING.format(logname))
    src = url_for("files.log_file", name=name, msg_id=msg_id, logname=logname)
    stream = url_for("files.log_stream", name=name, msg_id=msg_id, logname=logname)
    return render_tail(found, logname, src, stream)


def render_tail(found: Located, fname: str, src: str, stream: str | None) -> str:
    msg_url = f"{request.script_root}/q/{quote(found.store.name, safe='')}/{found.msg_id}"
    return render_template("tailview.html", queue=found.store.name, msg_id=found.msg_id,
                           fname=fname, src=src, stream=stream, msg_url=msg_url,
                           state_url=msg_url + "/state.json")


# ---------------------------------------------------------------- finding the file

def locate_message(name: str, msg_id: str) -> Located:
    """The message, or the S15 error: unknown queue, DOWN queue, missing message."""
    require_queue(name)
    require_not_down(name)  # S3.5
    store = backend().store(name)
    found = store.locate(msg_id) if protocol.valid_msg_id(msg_id) else None
    if found is None:
        fail(404, "Message ID not found")
    return Located(store, msg_id, found[0], found[1])


def message_state(found: Located) -> str | None:
    where = found.store.locate(found.msg_id)
    return where[0] if where else None


def plain_name(fname: str) -> bool:
    return bool(fname) and "/" not in fname and "\0" not in fname and not fname.startswith(".")


def open_message_file(found: Located, sub: str, fname: str, missing: str) -> int:
    """`<message dir>/sub/fname` opened for reading (a descriptor), or fail 404."""
    if not plain_name(fname):
        fail(404, missing.format(fname))
    path = found.path
    for _ in range(3):  # the message may move between the lookup and the open
        try:
            return open_inside(found, os.path.join(path, sub, fname))
        except FileNotFoundError:
            where = found.store.locate(found.msg_id)
            if where is None:
                fail(404, "Message ID not found")
            if where[1] == path:
                break
            path = where[1]
        except OSError:
            break
    fail(404, missing.format(fname))


def open_inside(found: Located, path: str) -> int:
    # O_NONBLOCK: a FIFO planted under the name must not hang the request.
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    if not stat.S_ISREG(os.fstat(fd).st_mode) or not inside_message(found, real_path(fd, path)):
        os.close(fd)
        raise PermissionError(path)
    return fd


def real_path(fd: int, path: str) -> str:
    """The path of what `fd` really is (Linux: /proc), symlinks resolved."""
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return os.path.realpath(path)


def inside_message(found: Located, real: str) -> bool:
    """True when `real` lies under the message's directory, in whatever state it is now."""
    qdir = os.path.realpath(found.store.qdir)
    for state in STATES:
        rel = os.path.relpath(found.store.msg_path(state, found.msg_id), found.store.qdir)
        if real.startswith(os.path.join(qdir, rel) + os.sep):
            return True
    return False


def log_content_type(logname: str) -> str:
    if logname.endswith(".log"):
        return "text/plain; charset=utf-8"
    guessed = mimetypes.guess_type(logname)[0] or "text/plain"
    return guessed + "; charset=utf-8" if guessed.startswith("text/") else guessed


# ---------------------------------------------------------------- S17.1 Range

def parse_range(header: str | None, size: int) -> tuple[int, int] | None | str:
    """(first, last) of a single satisfiable byte range; None to send the whole file
    (no Range, another unit, several ranges, bad syntax); "416" when not satisfiable."""
    if not header:
        return None
    unit, _, spec = header.partition("=")
    if unit.strip().lower() != "bytes" or "," in spec:
        return None
    m = RANGE_RE.fullmatch(spec)
    if m is None or m.group(1) == m.group(2) == "":
        return None
    if m.group(1) == "":  # bytes=-N: the last N bytes
        suffix = int(m.group(2))
        return (max(size - suffix, 0), size - 1) if suffix and size else "416"
    first = int(m.group(1))
    if m.group(2) and int(m.group(2)) < first:
        return None
    if first >= size:
        return "416"
    return first, min(int(m.group(2)), size - 1) if m.group(2) else size - 1


def serve_file(fd: int, content_type: str) -> Response:
    """S17.1 for an open file; `fd` is closed when the answer is done with it."""
    st = os.fstat(fd)
    size, mtime = st.st_size, int(st.st_mtime)
    headers = dict(FILE_HEADERS, **{"Last-Modified": http_date(mtime)})
    since = parse_date(request.headers.get("If-Modified-Since"))
    wanted = parse_range(request.headers.get("Range"), size)
    status, first, last = 200, 0, size - 1
    if since is not None and mtime <= since.timestamp():
        status = 304
    elif wanted == "416":
        status = 416
        headers["Content-Range"] = f"bytes */{size}"
    elif isinstance(wanted, tuple):
        status, (first, last) = 206, wanted
        headers["Content-Range"] = f"bytes {first}-{last}/{size}"
    length = last - first + 1 if status in (200, 206) else 0
    if request.method == "HEAD" or length <= EAGER_SIZE:
        body = read_slice(fd, first, length) if request.method != "HEAD" else b""
        os.close(fd)
        resp = Response(body, status=status, headers=headers, content_type=content_type)
    else:
        resp = Response(file_chunks(fd, first, length), status=status, headers=headers,
                        content_type=content_type, direct_passthrough=True)
    if status != 304:
        resp.headers["Content-Length"] = str(length)  # also for HEAD
    return resp


def read_slice(fd: int, start: int, length: int) -> bytes:
    return b"".join(file_chunks(fd, start, length, close=False))


def file_chunks(fd: int, start: int, length: int, *, close: bool = True) -> Iterator[bytes]:
    """`length` bytes from `start`: the size seen when the request came, so a growing log
    sends exactly what Content-Length promised.  Closes `fd` when done or closed."""
    try:
        pos, end = start, start + length
        while pos < end:
            data = os.pread(fd, min(READ_SIZE, end - pos), pos)
            if not data:  # truncated under us: the server closes the short answer
                return
            pos += len(data)
            yield data
    finally:
        if close:
            os.close(fd)


# ---------------------------------------------------------------- S17.2 stream

def stream_offset() -> int:
    raw = request.headers.get("Last-Event-ID")
    if raw is None or not raw.strip():
        raw = request.args.get("offset", "0")
    raw = raw.strip()
    if not raw.isdigit() or not raw.isascii() or len(raw) > 18:  # pread takes < 2**63
        fail(400, "Invalid offset")
    return int(raw)


def sse_event(text: str, offset: int) -> bytes:
    """One `log` event; the data lines joined with \\n give back `text`."""
    lines = [f"id: {offset}", "event: log"] + [f"data: {piece}" for piece in text.split("\n")]
    return ("\n".join(lines) + "\n\n").encode("utf-8")


def sse_end(state: str) -> bytes:
    return f"event: end\ndata: {state}\n\n".encode()


KEEPALIVE = b": keepalive\n\n"


def stream_events(fd: int, state: Callable[[], str | None], offset: int, keepalive: float,
                  disconnected: Callable[[], bool] | None) -> Iterator[bytes]:
    """The body of one S17.2 stream; stops at the end event, when the client goes away
    (waitress's `client_disconnected`, or the server closing us after a failed write)
    and closes `fd` in every case."""
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    pos, last_sent = offset, None  # the first idle turn sends a comment: headers go out at once
    try:
        while not (disconnected and disconnected()):
            data = os.pread(fd, READ_SIZE, pos)
            if data:
                pos += len(data)
                text = decoder.decode(data)  # an incomplete character waits in the decoder
                if text:
                    yield sse_event(text, pos - len(decoder.getstate()[0]))
                    last_sent = time.monotonic()
                continue
            now_state = state()
            if (now_state is None or now_state in FINAL_STATES) and os.fstat(fd).st_size <= pos:
                tail = decoder.decode(b"", final=True)
                if tail:
                    yield sse_event(tail, pos)
                yield sse_end(now_state or "deleted")
                return
            if last_sent is None or time.monotonic() - last_sent >= keepalive:
                yield KEEPALIVE
                last_sent = time.monotonic()
            time.sleep(POLL_SECONDS)
    finally:
        os.close(fd)
