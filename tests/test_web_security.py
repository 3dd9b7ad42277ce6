"""The web server as an attacker sees it (SPEC S14, S15, S17): hostile identifiers in every
path, form, query and header position of every route, auth, address filter and CSRF on
every route, no state change from GET, the manager check, methods, path normalisation and
the upload limit.

Everything runs against a real rq-mgr.  The hostile pass sends about 1,100 generated values
(traversals in many encodings, absolute paths, NUL and control characters, overlong names,
Unicode look-alikes, backslashes, names of symlinks planted inside the root that point
outside it, valid-looking ids that do not exist) through the Flask test client, and a
subset as raw request lines over a real socket to the web server that rq-mgr runs, so
percent-encoding reaches the server untouched.  Canary files outside the root (and secrets
inside its config) carry unique markers that must never appear in an answer; the files
outside the root and the root itself are compared before and after.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import io
import json
import multiprocessing
import os
import re
import socket
import stat
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote, urlsplit

import pytest
from browser import WebServer
from flask import Flask
from flask.testing import EnvironBuilder, FlaskClient
from werkzeug.datastructures import Headers
from werkzeug.exceptions import HTTPException
from werkzeug.test import run_wsgi_app
from rqtest import make_queue, short_id, wait_for
from webtest import Mgr, build_root, running

from rq import client as rqclient
from rq import protocol
from rq.config import load_main_config
from rq.errors import ConnectError, Fail
from rq.queue import journal, snapshot as que_snapshot
from rq.store import Store, check_attachment_name
from rq.web import create_app
from rq.web.wsgi import normalize_path

pytestmark = pytest.mark.timeout(900)

RUN = uuid.uuid4().hex[:12]
MARKER = f"OUTSIDE-CANARY-{RUN}"          # in every file planted outside the root
CFG_MARKER = f"CONFIG-CANARY-{RUN}"       # an ignored key of config/config.json
SECRET = f"session-secret-{RUN}"          # session_secret
ENV_MARKER = f"ENV-CANARY-{RUN}"          # in the environment of rq-mgr and the web server
TRUSTED = "https://trusted.example:8443"  # csrf_trusted_origins
REALM = "RQ Test Realm"
USERS = {"alice": "s3cret", "bob": "pa:ss:word", "carol": "pässwörd"}
HOST = "localhost"                        # the Flask test client's Host
SAME_ORIGIN = f"http://{HOST}"
# 5xx answers the spec documents (S15 routes 13, 14, 19, 20, 27; S16.5; S15 DOWN queues)
DOCUMENTED_5XX = (b"Couldn&#39;t clone message.", b"Couldn't clone message.",
                  b"Couldn&#39;t run message.", b"Couldn't run message.",
                  b"Operationally Down", b"Bad overrides file")


# ---------------------------------------------------------------- hostile values


def hostile_values(outside: Path, root: Path) -> list[str]:
    """About 1,100 distinct hostile identifiers.  None of them names an existing queue,
    message, log or attachment, except the symlinks the fixture plants on purpose."""
    dots = ["..", "%2e%2e", ".%2e", "%252e%252e", "%c0%ae%c0%ae", "\u2024\u2024",
            "\uff0e\uff0e", "\u3002\u3002", "...."]
    seps = ["/", "%2f", "\\", "%5c", "%252f", "\u2215", "\uff0f"]
    targets = ["etc/passwd", "etc/shadow", "config/config.json",
               os.path.relpath(outside / "canary.txt", "/"), "web/__init__.py"]
    values: list[str] = []
    for d in dots:
        for s in seps:
            for depth, wanted in ((1, targets[:2]), (3, targets[2:4]), (9, targets[4:])):
                for t in wanted:
                    values.append(s.join([d] * depth) + s + t)
            values.append(s.join([d] * 4))
            values.append(d + s)
    values += dots + ["%2E%2E", "%c0%af", "..//", "...", ".", "./", "../", "..;", "..\\..",
                      "..%00", "..\x00", "..%2f..",
                      "%2e", "%2e%2e%2f", "..%2f", "%252e%252e%252f", "..%252f", "%2e%2e%5c",
                      "..%5c", "%c0%ae%c0%ae%c0%af", "%uff0e%uff0e", "%u2024%u2024",
                      "\u2025", "\u2215", "\uff0f", "..\u2215..", "..\uff0f..",
                      "\u2024\u2024/\u2024\u2024", ".. ", " ..", "..\t", "..\n", "..\r\n",
                      "..%u2215", "..%e2%88%95", "\u2024", "\uff0e", "\u2024\u2024\u2215etc"]
    # absolute paths, inside and outside the root
    for p in ["/etc/passwd", "/etc/shadow", "/etc", "/", "//", "///etc/passwd",
              "/proc/self/environ", "/proc/self/cmdline", "/proc/self/maps", "/proc/self/fd/0",
              "/dev/zero",
              "/dev/urandom", "/dev/stdin", "/dev/null", "/root/.bashrc", "/var/log",
              str(outside), str(outside / "canary.txt"), str(outside / "canary.json"),
              str(outside / "canary.log"), str(outside / "fifo"), str(outside / "canarydir"),
              str(root / "config" / "config.json"), str(root / "config" / "queuemgr.sock"),
              str(root / "queue" / "test" / "queue.sock"), str(root / "log" / "queuemgr.log"),
              "file:///etc/passwd", "file://localhost/etc/passwd", "\\etc\\passwd",
              "C:\\Windows\\win.ini", "\\\\server\\share\\x", "/etc/passwd\x00.json",
              "/etc/passwd%00.json", "%2fetc%2fpasswd", "%252fetc%252fpasswd",
              "\u2215etc\u2215passwd", "\uff0fetc\uff0fpasswd"]:
        values += [p, p + "/", "x/" + p.lstrip("/"), "../" + p.lstrip("/")]
    # names relative to the root and to a message directory
    for rel in ["config/config.json", "config/queuemgr.pid", "config/queuemgr.sock",
                "queue/test/config.json", "queue/test/queue.sock", "log/queuemgr.log",
                "../rqroot/config/config.json", "../outside/canary.txt", "../outside/canary.json",
                "../../msg", "../msg", "../status", "../attach/a.txt", "../job/stdio.log",
                "job/stdio.log", "attach/a.txt", "msg", "status", "job", "attach", "pid",
                "proc.json", "lease.json", "config.json", "form.json", "queue.pid", "queue.sock",
                "cron.state.json", "scandir.json", "prep", "que", "run", "done", "err",
                "relayed", "stdio.log.tmp", "a.txt.tmp", ".stdio.log", ".a.txt", ".hidden",
                ".", ".htaccess", "..hidden", "new", "delete", "clone", "run_now",
                "adminoper", "new_message", "config", "done.json", "state.json",
                "log", "logstream", "tailview", "tailviewlog"]:
        values += [rel, rel.replace("/", "%2f"), rel.replace("/", "\\")]
    # symlinks the fixture plants inside the root, pointing outside it
    values += ["evil", "evil2", "evil/passwd", "evil2/canary.txt", "passwd_link", "shadow_link",
               "canary_link", "canary_dir", "canary_dir/canary.txt", "config_link", "up_link",
               "fifo", "fifo_link", "x", "dir_link", "evil%2fpasswd"]
    # NUL, control characters, whitespace
    for c in [chr(i) for i in range(0, 32)] + ["\x7f", "\x85", "\xa0", "\u2028", "\u2029",
                                              "\u200b", "\u202e", "\ufeff", "\ufffd"]:
        values += [c, f"test{c}", f"stdio.log{c}", f"{c}..", f"a{c}b"]
    values += ["%00", "test%00", "stdio.log%00", "stdio.log%00.png", "%0d%0aSet-Cookie:%20x=1",
               "\r\nSet-Cookie: x=1", "%0a", "%09", "%20", " ", "  ", "\t"]
    # overlong names and ids
    for n in (129, 200, 255, 256, 1024, 4096, 4097, 20000):
        values += ["a" * n, "." * n, "../" * (n // 3), "%2e" * (n // 3)]
    values += ["\u00e9" * 65, "\U0001f600" * 33, "\u2024" * 200]
    for n in (6, 10, 20, 50, 64, 200, 4096):
        values.append("20200101.0000.00.000." + "9" * n)
    # valid-looking ids that do not exist, and near misses
    for i in range(60):
        values.append(f"1999{(i % 12) + 1:02d}{(i % 28) + 1:02d}.{i % 24:02d}{i % 60:02d}."
                      f"{i % 60:02d}.{i * 7 % 1000:03d}.{1000 + i}")
    values += ["20200101.0000.00.000.", "20200101.0000.00.000", "20200101.0000.00.000.-1",
               "20200101.0000.00.000.1.json", "20200101.0000.00.000.1/",
               "20200101.0000.00.000.1%00", "20200101.0000.00.000.1\x00", "2020010..0000.00.000.1",
               "20200101.0000.00.000.1 ", " 20200101.0000.00.000.1",
               "\uff12\uff10\uff12\uff10\uff10\uff11\uff10\uff11.0000.00.000.1",
               "٢٠٢٠٠١٠١.0000.00.000.1", "20200101.0000.00.000.1e5", "20200101.0000.00.000.0x1"]
    # other syntax: urls, shell, format strings, globs, reserved device names
    values += ["http://evil.example/", "//evil.example", "/\\evil.example", "\\\\evil.example",
               "javascript:alert(1)", "data:text/html,x", "$(id)", "`id`", ";id", "|id", "&&id",
               "%s%s%s%n", "{0}", "{{7*7}}", "${7*7}", "*", "?", "[a-z]*", "**/*", "~", "~root",
               "CON", "NUL", "aux", "COM1", "lpt1", "con.txt", "test.", "test..", "test.json",
               "test.txt", "test/", "TEST", "Test", "test ", " test", "te%73t", "te\u0073t",
               "tes\u0442", "t\u0435st", "test\u200b", "test\u0301", "victim.deleted.1",
               "queue", "rqroot", "outside", "%", "%%", "%zz", "%2", "%e2%88", "%ff%fe",
               "%ed%a0%80", "%c0%80", "\ufffd\ufffd\ufffd"]
    seen: set[str] = set()
    unique = [v for v in values
              if v not in seen and not seen.add(v)]  # type: ignore[func-returns-value]
    return [v for v in unique if v not in ("test", "victim", "stdio.log", "a.txt", "rq.css")]


# ---------------------------------------------------------------- the site


@dataclass
class Site:
    base: Path
    root: Path
    outside: Path
    app: Flask
    web: WebServer
    done_id: str          # queue test, done, has job/stdio.log and attach/a.txt
    prep_id: str          # queue test, prep, has attach/a.txt
    victim_done: str      # queue victim, done (POST targets of the auth and CSRF passes)
    victim_prep: str      # queue victim, prep, has attach/a.txt
    secrets: list[bytes] = field(default_factory=list)

    def queue(self, name: str, cmd: str, arg: Any = None) -> Any:
        return rqclient.call_queue(str(self.root), name, cmd, arg, timeout=30)


def finished(root: Path, queue: str, full_id: str) -> str:
    msg_id = short_id(full_id)
    store = Store(str(root), queue)
    wait_for(lambda: (store.locate(msg_id) or ("",))[0] in ("done", "err"), 30,
             what=f"{msg_id} to finish")
    return msg_id


def prep_with_attachment(root: Path, queue: str, src: Path) -> str:
    reply = rqclient.call_queue(str(root), queue, "prep_message", {"dest": queue})
    assert reply[0] == "ok", reply
    msg_id = short_id(reply[1])
    reply = rqclient.call_queue(str(root), queue, "attach_message",
                                {"msg_id": msg_id, "pathname": str(src), "name": "a.txt"})
    assert reply[0] == "ok", reply
    return msg_id


def plant_outside(outside: Path) -> None:
    outside.mkdir()
    (outside / "canary.txt").write_text(f"{MARKER}\n")
    (outside / "canary.log").write_text(f"{MARKER} log\n")
    # route 4 redirects to q/<the file's "name">, so only the other fields are secret
    (outside / "canary.json").write_text(json.dumps({"name": "bad name", "x": MARKER}))
    (outside / "canarydir").mkdir()
    (outside / "canarydir" / "canary.txt").write_text(MARKER)
    (outside / "canarydir" / "form.json").write_text(json.dumps({"mesg_dest": {"label": MARKER}}))
    os.mkfifo(outside / "fifo")


def plant_symlinks(root: Path, outside: Path, done_dir: Path) -> None:
    """Symlinks inside the root pointing out of it (as a job or an operator could make)."""
    os.symlink("/etc", root / "queue" / "evil")
    os.symlink(outside / "canarydir", root / "queue" / "evil2")
    job, attach = done_dir / "job", done_dir / "attach"
    for name, target in [("passwd_link", "/etc/passwd"), ("shadow_link", "/etc/shadow"),
                         ("canary_link", outside / "canary.txt"),
                         ("canary_dir", outside / "canarydir"), ("dir_link", "/etc"),
                         ("config_link", root / "config" / "config.json"),
                         ("up_link", "../../../../../../config/config.json"),
                         ("fifo_link", outside / "fifo"), ("x", "/etc/passwd")]:
        os.symlink(target, job / name)
    os.mkfifo(job / "fifo")
    for name, target in [("x", "/etc/shadow"), ("shadow_link", "/etc/shadow"),
                         ("passwd_link", "/etc/passwd"), ("fifo_link", outside / "fifo"),
                         ("config_link", root / "config" / "config.json")]:
        os.symlink(target, attach / name)
    os.mkfifo(attach / "fifo")


def first_line(path: str) -> bytes | None:
    try:
        with open(path, "rb") as fh:
            line = fh.readline().strip()
    except OSError:
        return None
    return line if len(line) >= 8 else None


def publish_analytics(root: Path) -> None:
    """A minimal published analytics result (docs/analytics.md), so that
    GET /stats.json answers 200 like every other GET route here."""
    run = root / "analytics" / "runs" / "r1"
    run.mkdir(parents=True)
    (run / "summary.json").write_text(
        '{"version":1,"run_id":"r1","total":{},"queues":{"test":{}}}')
    (run / "hourly.json").write_text("[]")
    (root / "analytics" / "current").symlink_to("runs/r1")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    base = tmp_path_factory.mktemp("websec")
    outside = base / "outside"
    plant_outside(outside)
    (base / "spool").mkdir()
    root = build_root(base, tmpdir=str(base / "spool"), csrf_trusted_origins=[TRUSTED],
                      session_secret=SECRET, canary_secret=CFG_MARKER)
    make_queue(root, "victim", script=base / "done.sh")
    publish_analytics(root)
    (base / "a.txt").write_text("attachment a\n")
    old_env = os.environ.get("RQ_TEST_ENV_CANARY")
    os.environ["RQ_TEST_ENV_CANARY"] = ENV_MARKER  # inherited by rq-mgr and its web server
    try:
        with running(root, web=True) as web:
            done_full = rqclient.call_queue(str(root), "test", "prep_message", {"dest": "test"})[1]
            done_id = short_id(done_full)
            assert rqclient.call_queue(str(root), "test", "attach_message",
                                       {"msg_id": done_id, "pathname": str(base / "a.txt"),
                                        "name": "a.txt"})[0] == "ok"
            assert rqclient.call_queue(str(root), "test", "commit_message",
                                       {"msg_id": done_id})[0] == "ok"
            finished(root, "test", done_full)
            prep_id = prep_with_attachment(root, "test", base / "a.txt")
            victim_done = finished(root, "victim", rqclient.call_queue(
                str(root), "victim", "create_message", {"dest": "victim"})[1])
            victim_prep = prep_with_attachment(root, "victim", base / "a.txt")
            found = Store(str(root), "test").locate(done_id)
            assert found is not None and found[0] == "done"
            plant_symlinks(root, outside, Path(found[1]))
            secrets = [s.encode() for s in (MARKER, CFG_MARKER, SECRET, ENV_MARKER)]
            secrets += [b"def create_app(", b"def load_main_config("]
            secrets += [line for line in (first_line("/etc/passwd"), first_line("/etc/shadow"))
                        if line]
            yield Site(base, root, outside, create_app(str(root)), web, done_id, prep_id,
                       victim_done, victim_prep, secrets)
    finally:
        if old_env is None:
            os.environ.pop("RQ_TEST_ENV_CANARY", None)
        else:
            os.environ["RQ_TEST_ENV_CANARY"] = old_env


@pytest.fixture(scope="module")
def hostile(site: Site) -> list[str]:
    values = hostile_values(site.outside, site.root)
    assert len(values) >= 1000, len(values)
    return values


# ---------------------------------------------------------------- checking answers


@dataclass
class Audit:
    """Every answer of a pass: no unexpected 5xx, no secret, no redirect off the server."""

    secrets: list[bytes]
    hosts: tuple[str, ...] = (HOST,)
    count: int = 0
    statuses: Counter = field(default_factory=Counter)
    problems: list[str] = field(default_factory=list)

    def check(self, where: str, status: int, headers: Iterable[tuple[str, str]],
              body: bytes) -> None:
        self.count += 1
        self.statuses[status] += 1
        headers = list(headers)
        if status >= 500 and not (status in (500, 503) and
                                  any(text in body for text in DOCUMENTED_5XX)):
            self.problems.append(f"{where}: {status} {body[:160]!r}")
        blob = body + "\n".join(f"{k}: {v}" for k, v in headers).encode("utf-8", "replace")
        for secret in self.secrets:
            if secret in blob:
                self.problems.append(f"{where}: answer contains {secret[:40]!r}")
        for key, value in headers:
            if key.lower() == "location":
                netloc = urlsplit(value).netloc
                if netloc not in self.hosts or value.startswith("//"):
                    self.problems.append(f"{where}: redirect off the server: {value!r}")

    def response(self, where: str, resp: Any) -> None:
        self.check(where, resp.status_code, resp.headers.items(), resp.get_data())

    def verdict(self) -> None:
        shown = "\n".join(self.problems[:40])
        assert not self.problems, (f"{len(self.problems)} bad answers out of {self.count} "
                                   f"(statuses {dict(self.statuses)}):\n{shown}")


def fill(rule: str, values: dict[str, str]) -> str:
    """The URL of a rule with each <converter:var> replaced by values[var] (already encoded)."""
    return re.sub(r"<(?:[^:<>]+:)?([^<>]+)>", lambda m: values[m.group(1)], rule)


def seg(value: str) -> str:
    """A path segment that reaches the view as exactly `value`."""
    return quote(value, safe="")


def raw_seg(value: str) -> str | None:
    """`value` written into the URL as it is (the server decodes its %xx, and '/' splits
    segments); None when that is no different from seg(value) or cannot be a URL."""
    if not any(c in value for c in "%/\\?#;") or not value.isascii() or not value.isprintable():
        return None
    return value.replace(" ", "%20")


def real_values(site: Site, rule: str, method: str) -> dict[str, str]:
    msg = site.prep_id if "attach" in rule and method == "POST" else site.done_id
    return {"name": "test", "msg_id": msg, "logname": "stdio.log", "attname": "a.txt",
            "filename": "rq.css"}


def app_rules(app: Flask) -> list[tuple[str, str, str]]:
    """(rule, method, endpoint) for every rule and every method it serves, static included."""
    out = []
    for rule in app.url_map.iter_rules():
        for method in sorted((rule.methods or set()) - {"HEAD", "OPTIONS"}):
            out.append((rule.rule, method, rule.endpoint))
    return out


def no_cookies(app: Flask) -> FlaskClient:
    # flashes of thousands of redirects would pile up in one session cookie otherwise
    return app.test_client(use_cookies=False)


# ---------------------------------------------------------------- file-system snapshots


def snapshot(top: Path, skip: Callable[[str], bool] = lambda rel: False) -> dict[str, tuple]:
    """rel path -> (kind, size, mtime_ns, sha1 or link target) of everything under `top`."""
    out: dict[str, tuple] = {}
    for dirpath, dirnames, filenames in os.walk(top):
        for name in dirnames + filenames:
            full = os.path.join(dirpath, name)
            rel = os.path.relpath(full, top)
            if skip(rel):
                continue
            st = os.lstat(full)
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("link", 0, 0, os.readlink(full))
            elif stat.S_ISREG(st.st_mode):
                with open(full, "rb") as fh:
                    digest = hashlib.sha1(fh.read()).hexdigest()
                out[rel] = ("file", st.st_size, st.st_mtime_ns, digest)
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = ("dir", 0, 0, "")
            else:
                out[rel] = ("other", 0, 0, oct(st.st_mode))
        dirnames[:] = [d for d in dirnames
                       if not skip(os.path.relpath(os.path.join(dirpath, d), top))
                       and not os.path.islink(os.path.join(dirpath, d))]
    return out


def diff(before: dict[str, tuple], after: dict[str, tuple]) -> list[str]:
    changes = [f"created {k}" for k in sorted(after.keys() - before.keys())]
    changes += [f"deleted {k}" for k in sorted(before.keys() - after.keys())]
    changes += [f"changed {k}" for k in sorted(before.keys() & after.keys())
                if before[k] != after[k]]
    return changes


def runtime_file(rel: str) -> bool:
    """Files daemons rewrite on their own: logs, sockets, pids, the pool of spare message
    directories a queue refills in the background (rq/spares.py), and a queue's create
    journal segments and que/ checkpoint, which it writes and removes a while after the
    creates that caused them (rq/queue/journal.py, rq/queue/snapshot.py)."""
    parts = rel.split(os.sep)
    daemon_files = ("queue.sock", "queue.pid", "queuemgr.sock", "queuemgr.pid",
                    que_snapshot.CHECKPOINT)
    segment = parts[-1].startswith(journal.PREFIX) and parts[-1].endswith(journal.SUFFIX)
    return parts[0] == "log" or ".spare" in parts or parts[-1] in daemon_files or segment


def outside_snapshot(site: Site) -> dict[str, tuple]:
    """Everything next to the root (the test's temp directory: canaries, spool, scripts),
    the entries of the directories above it (its siblings: other tests' temp directories),
    the files it was sent to read, and upload spool names in /tmp."""
    root_rel = os.path.relpath(site.root, site.base)
    snap = snapshot(site.base, lambda rel: rel == root_rel or rel.startswith(root_rel + os.sep))
    for top in (site.base.parent, site.base.parent.parent):
        for entry in os.scandir(top):
            if top == site.base.parent.parent and \
                    re.fullmatch(r"pytest-\d+|garbage-[-0-9a-f]+", entry.name):
                continue  # other pytest runs' base dirs come and go (pytest keeps 3, and
                #           renames one to garbage-UUID while it removes it)
            st = entry.stat(follow_symlinks=False)
            size = st.st_size if entry.is_file(follow_symlinks=False) else 0
            snap[entry.path] = ("entry", size, st.st_mtime_ns if size else 0, str(st.st_ino))
    for extra in ("/etc/passwd", "/etc/shadow", "/etc"):
        try:
            st = os.stat(extra)
            snap[extra] = ("stat", st.st_size, st.st_mtime_ns, str(st.st_ino))
        except OSError:
            pass
    snap["/etc listing"] = ("list", 0, 0, ",".join(sorted(os.listdir("/etc"))))
    snap["/tmp uploads"] = ("list", 0, 0, ",".join(sorted(
        n for n in os.listdir("/tmp") if n.startswith("rq-upload-"))))
    return snap


# ---------------------------------------------------------------- hostile identifiers


@dataclass(frozen=True)
class Req:
    """One request of a pass, as plain data (it crosses to a worker process).  A form
    value ("file", DATA, NAME) is an uploaded file."""

    label: str
    method: str
    path: str
    data: tuple[tuple[str, Any], ...] = ()
    headers: tuple[tuple[str, str], ...] = ()


def upload(data: bytes, name: str) -> tuple[str, bytes, str]:
    return ("file", data, name)


def form_data(data: tuple[tuple[str, Any], ...]) -> dict[str, Any] | None:
    if not data:
        return None
    return {k: (io.BytesIO(v[1]), v[2]) if isinstance(v, tuple) else v for k, v in data}


def send(cl: FlaskClient, method: str, path: str, **kw: Any) -> Any:
    resp = cl.open(path, method=method, **kw)
    # The log stream of a finished message ends by itself: read it (it could leak too).
    # Another event stream (route 31, /events) never ends: its headers are the answer.
    if resp.mimetype != "text/event-stream" or "/logstream/" in path:
        resp.get_data()
    resp.close()
    return resp


def send_lean(app: Flask, environ_base: dict[str, Any], r: Req) -> tuple[int, Headers, bytes]:
    """`send` of one Req without the test client's wrapping: the same environ (the
    client's EnvironBuilder and environ_base), the same app call, and the same body read
    (an endless event stream: the first chunk, which is what send's response holds once
    closed), without the Request and TestResponse objects and the cookie bookkeeping
    around them (a third of the pass's CPU went to the client)."""
    builder = EnvironBuilder(app, r.path, method=r.method, data=form_data(r.data),
                             headers=dict(r.headers), environ_base=environ_base)
    try:
        environ = builder.get_environ()
    finally:
        builder.close()
    body_iter, status, headers = run_wsgi_app(app, environ)
    try:
        mimetype = headers.get("Content-Type", "").partition(";")[0].strip().lower()
        if mimetype != "text/event-stream" or "/logstream/" in r.path:
            body = b"".join(body_iter)
        else:
            body = next(iter(body_iter), b"")
    finally:
        close = getattr(body_iter, "close", None)
        if close is not None:
            close()
    return int(status.split(" ", 1)[0]), headers, body


def run_chunk(job: tuple[str, list[Req], list[bytes]]) -> tuple[int, dict[int, int], list[str]]:
    """A worker process: its own app of the root, its share of the requests."""
    root, reqs, secrets = job
    app = create_app(root)
    # The manager answers every request's ping (S14.6, tested below); here it would only
    # double the time of 100,000 requests, so the pass skips that one round trip.
    app.config["RQ_BACKEND"].mgr_alive = lambda: True
    environ_base = dict(no_cookies(app).environ_base)  # what the test client adds
    audit = Audit(secrets)
    for r in reqs:
        audit.check(r.label, *send_lean(app, environ_base, r))
    return audit.count, dict(audit.statuses), audit.problems


def run_requests(root: Path, reqs: list[Req], secrets: list[bytes], workers: int = 3) -> Audit:
    """All `reqs` through the Flask test client, spread over worker processes (the
    machine has two cores and every request waits on the manager's socket).  Spawned, not
    forked: a fork of this multi-threaded process (the xdist worker's execnet threads, the
    daemons' helper threads) can copy a lock another thread holds, and the child then waits
    on it for ever (seen in CI: the pool's children idle until the 900 s timeout)."""
    ctx = multiprocessing.get_context("spawn")
    chunks = [(str(root), reqs[i::workers], secrets) for i in range(workers)]
    with ctx.Pool(workers) as pool:
        results = pool.map(run_chunk, chunks)
    audit = Audit(secrets)
    for count, statuses, problems in results:
        audit.count += count
        audit.statuses.update(statuses)
        audit.problems += problems
    return audit


def header_safe(value: str) -> bool:
    try:
        value.encode("latin-1")
    except UnicodeEncodeError:
        return False
    return "\r" not in value and "\n" not in value and "\x00" not in value


def query_requests(site: Site, value: str) -> list[Req]:
    """The hostile value in each query parameter and request header of the GET routes."""
    d, v = site.done_id, seg(value)
    log, stream = f"/q/test/{d}/log/stdio.log", f"/q/test/{d}/logstream/stdio.log"
    reqs = [Req("search name", "GET", f"/search?name={v}"),
            Req("search query key", "GET", f"/search?name=test&query%5B{v}%5D=x"),
            Req("search query value", "GET", f"/search?name=test&query%5Bdest%5D={v}&exact=1"),
            Req("q.json limit", "GET", f"/q/test.json?limit={v}"),
            Req("done.json limit", "GET", f"/q/test/done.json?limit={v}"),
            Req("logstream offset", "GET", f"{stream}?offset={v}"),
            Req("events pattern", "GET", f"/events?pattern={v}"),       # route 31
            Req("events since", "GET", f"/events?pattern=nosuchtopic&since={v}")]
    if header_safe(value):
        reqs += [Req("log Range", "GET", log, headers=(("Range", value),)),
                 Req("attach Range", "GET", f"/q/test/{d}/attach/a.txt",
                     headers=(("Range", "bytes=" + value),)),
                 Req("log If-Modified-Since", "GET", log, headers=(("If-Modified-Since", value),)),
                 Req("logstream Last-Event-ID", "GET", stream, headers=(("Last-Event-ID", value),)),
                 Req("POST Origin", "POST", "/q/test/adminoper", (("resume", "1"),),
                     (("Origin", value),)),
                 Req("POST Sec-Fetch-Site", "POST", "/q/test/adminoper", (("resume", "1"),),
                     (("Sec-Fetch-Site", value),))]
    return [dataclasses.replace(r, label=f"{r.label}={value[:60]!r}") for r in reqs]


VERBS = ("delete", "destroy", "commit", "run_now", "prep", "single_que")  # real _method values


def form_requests(site: Site, v: str) -> list[Req]:
    """The hostile value in every form field of every POST route that names a file, a
    queue, a message or a place to go (a `_method` field gets no real verb)."""
    script = str(site.base / "done.sh")
    msg, prep = f"/q/test/{site.done_id}", f"/q/test/{site.prep_id}"
    reqs = [
        Req("new_queue queue[name]", "POST", "/new_queue",
            (("queue[name]", v), ("queue[script]", script), ("queue[num_workers]", "0"))),
        Req("new_queue queue[script]", "POST", "/new_queue",
            (("queue[name]", "x y"), ("queue[script]", v))),
        Req("new_queue_link queue[json_path]", "POST", "/new_queue_link",
            (("queue[json_path]", v),)),
        Req("delete_queue queue_name", "POST", "/delete_queue", (("queue_name", v),)),
        Req("adminoper back", "POST", "/q/test/adminoper", (("resume", "1"), ("back", v))),
        Req("new_message back", "POST", "/q/test/new_message",
            (("x_format", "html"), ("mesg[src]", "no dest"), ("back", v))),
        Req("new_message mesg[_method]", "POST", "/q/test/new_message",
            (("x_format", "html"), ("mesg[dest]", "test"), ("mesg[_method]", v))),
        Req("message msg_id", "POST", msg, (("_method", "commit"), ("msg_id", v))),
        Req("message _method", "POST", msg, (("_method", v),)),
        Req("attach delete _method", "POST", f"{prep}/attach/a.txt", (("_method", v),)),
        Req("attach/new msg_id+pathname", "POST", f"{prep}/attach/new",
            (("filedata", upload(b"ok\n", "ok.txt")), ("msg_id", v), ("pathname", v),
             ("x_format", "json"))),
        Req("attach/new filename", "POST", f"{prep}/attach/new",
            (("filedata", upload(b"hostile name\n", v)), ("x_format", "json"))),
    ]
    # S8.5 consumer routes (routes 30): the ids, tokens and patterns they take
    full = f"http://127.0.0.1:1/q/test/{site.done_id}"
    reqs += [
        Req("consumer/reserve pattern", "POST", "/consumer/reserve", (("pattern", v),)),
        Req("consumer/reserve consumer", "POST", "/consumer/reserve",
            (("pattern", "nosuchtopic"), ("consumer", v))),
        Req("consumer/report msg_id", "POST", "/consumer/report",
            (("msg_id", v), ("token", "0" * 32), ("line", "run x"))),
        Req("consumer/report token", "POST", "/consumer/report",
            (("msg_id", full), ("token", v), ("line", "done x"))),
        Req("consumer/renew msg_id", "POST", "/consumer/renew", (("msg_id", v), ("token", v))),
    ]
    return [dataclasses.replace(r, label=f"{r.label}={v[:60]!r}") for r in reqs
            if not (v in VERBS and any(k.endswith("_method]") or k == "_method"
                                       for k, _ in r.data))]


def path_positions(app: Flask) -> list[tuple[str, str, str, str]]:
    """(rule, method, variable, endpoint) for every variable of every rule."""
    out = []
    for rule, method, endpoint in app_rules(app):
        for var in re.findall(r"<(?:[^:<>]+:)?([^<>]+)>", rule):
            out.append((rule, method, var, endpoint))
    return out


def post_form(rule: str) -> tuple[tuple[str, Any], ...]:
    """A body for a POST rule with a hostile path part, so that each view gets past its
    own parameter checks to the lookup of that part."""
    if rule.endswith("/attach/new"):
        return (("filedata", upload(b"x\n", "pos.txt")), ("x_format", "json"))
    if rule.endswith("/adminoper"):
        return (("resume", "1"),)
    if rule.endswith("<msg_id>"):
        return (("_method", "commit"),)
    if rule.endswith("<attname>"):
        return (("_method", "delete"),)
    return ()


RAW_RULES = ("/q/<name>.json", "/q/<name>/<msg_id>.json", "/q/<name>/<msg_id>/log/<logname>",
             "/q/<name>/<msg_id>/attach/<attname>", "/q/<name>/<msg_id>/tailviewlog/<logname>",
             "/static/<path:filename>")


def path_requests(site: Site, positions: list[tuple[str, str, str, str]],
                  value: str) -> list[Req]:
    """The hostile value in each path position, URL-encoded (the view sees exactly the
    value) and, on the routes of RAW_RULES, also written raw (the server decodes its %xx
    and splits it at '/').  Left out: a URL that normalises (S14.2) to the real one, and a
    POST whose '..' segments make it another route's legitimate request (e.g.
    /q/test/ID/attach/.. is a POST to the message itself): both are tested as what they are."""
    reqs = []
    adapter = site.app.url_map.bind(HOST)
    for rule, method, var, endpoint in positions:
        real = {k: seg(v) for k, v in real_values(site, rule, method).items()}
        real_path = canonical(fill(rule, real))
        encodings = [seg(value)]
        raw = raw_seg(value)
        if raw is not None and rule in RAW_RULES:
            encodings.append(raw)
        for enc in encodings:
            path = fill(rule, dict(real, **{var: enc}))
            if canonical(path) == real_path or \
                    method == "POST" and lands_elsewhere(adapter, endpoint, path):
                continue
            reqs.append(Req(f"{method} {rule} [{var}={value[:60]!r} as {enc[:60]!r}]", method,
                            path, post_form(rule) if method == "POST" else ()))
    return reqs


def lands_elsewhere(adapter: Any, endpoint: str, path: str) -> bool:
    try:
        found, _ = adapter.match(canonical(path), method="POST")
    except HTTPException:
        return False  # 404 or 405: no view runs
    return bool(found != endpoint)


def canonical(path: str) -> str:
    return normalize_path(unquote(path.split("?", 1)[0]))


def test_hostile_identifiers_in_every_position(site: Site, hostile: list[str]) -> None:
    app = site.app
    cl = no_cookies(app)
    positions = path_positions(app)
    assert {var for _, _, var, _ in positions} == {"name", "msg_id", "logname", "attname",
                                                   "filename"}
    # the real URL of each GET position answers 200, so the hostile ones mean something
    for rule, method, _, _ in positions:
        if method == "GET":
            path = fill(rule, {k: seg(v) for k, v in real_values(site, rule, method).items()})
            assert send(cl, "GET", path).status_code == 200, path
    reqs: list[Req] = []
    for value in hostile:
        reqs += path_requests(site, positions, value)
        reqs += query_requests(site, value)
        reqs += form_requests(site, value)
    before_out, before_root = outside_snapshot(site), snapshot(site.root, runtime_file)
    audit = run_requests(site.root, reqs, site.secrets)
    audit.verdict()
    assert audit.count == len(reqs) > 60_000, audit.count
    assert diff(before_out, outside_snapshot(site)) == []
    assert illegitimate_changes(site, diff(before_root, snapshot(site.root, runtime_file))) == []
    found = Store(str(site.root), "test").locate(site.prep_id)
    assert found is not None  # the uploads really went through (so their names were tried)
    attached = os.listdir(os.path.join(found[1], "attach"))
    assert "ok.txt" in attached and "a.txt" in attached and len(attached) > 50, attached
    for name in ("evil", "evil2"):  # for the tests after this one
        if not os.path.lexists(site.root / "queue" / name):
            os.symlink("/etc" if name == "evil" else site.outside / "canarydir",
                       site.root / "queue" / name)


def illegitimate_changes(site: Site, changes: list[str]) -> list[str]:
    """The changes no legitimate request could make.  Legitimate: attachments of the prep
    message (the uploads, under their base names), and delete_queue trashing the planted
    queue-level symlinks."""
    found = Store(str(site.root), "test").locate(site.prep_id)
    assert found is not None
    attach = os.path.relpath(os.path.join(found[1], "attach"), site.root)
    bad = []
    for change in changes:
        verb, rel = change.split(" ", 1)
        head, name = os.path.split(rel)
        if verb in ("created", "changed") and head == attach and valid_attachment(name):
            continue
        if head == "queue" and (name in ("evil", "evil2") and verb == "deleted" or
                                re.fullmatch(r"evil2?\.deleted\.\d+", name)):
            continue  # delete_queue queue_name=evil: the manager trashes that entry
        bad.append(change)
    return bad


def valid_attachment(name: str) -> bool:
    try:
        check_attachment_name(name)
    except Fail:
        return False
    return bool(name)  # S4.8 allows a name ending in .tmp (the store hides it: see report)


def test_json_path_outside_the_root_is_read_only_as_json(site: Site) -> None:
    """S15 route 4: any readable file is allowed, but only a JSON queue config is used; the
    answer to anything else is the parse error with the path, never the file."""
    cl = no_cookies(site.app)
    for path in ("/etc/passwd", "/etc/shadow", "/proc/self/environ",
                 str(site.outside / "canary.txt"), "../outside/canary.txt", "/dev/zero",
                 str(site.outside / "fifo"), "/etc"):
        resp = send(cl, "POST", "/new_queue_link", data={"queue[json_path]": path})
        text = resp.get_data(as_text=True)
        assert resp.status_code == 404, (path, resp.status_code, text[:300])
        assert f"404 - Couldn&#39;t parse json file ({path})." in text or \
            f"404 - Couldn't parse json file ({path})." in text, text[:500]
        assert not any(s in resp.get_data() for s in site.secrets), path
    # a JSON file outside the root: the manager refuses its config; its content stays hidden
    resp = send(cl, "POST", "/new_queue_link?x_format=json",
                data={"queue[json_path]": str(site.outside / "canary.json"), "x_format": "json"})
    assert resp.status_code == 200 and resp.get_json() == [
        "fail", "queue name has invalid characters"], resp.get_data()[:300]
    assert MARKER.encode() not in resp.get_data()
    assert not (site.root / "queue" / "bad name").exists()


def test_look_alike_queue_names_stay_one_directory_inside_the_root(site: Site) -> None:
    """Names valid under S3.1 that look like paths are created as one directory under
    queue/, and deleted into its trash, and nothing else moves."""
    names = ["\u2024\u2024", "\uff0e\uff0e\uff0fetc", "\u2215etc\u2215passwd",
             "\u2024\u2024\u2215\u2024\u2024\u2215config", "\u3002\u3002"]
    assert all(protocol.valid_queue_name(n) for n in names)
    cl = no_cookies(site.app)
    before_out = outside_snapshot(site)
    script = str(site.base / "done.sh")
    for name in names:
        resp = send(cl, "POST", "/new_queue", data={"queue[name]": name, "queue[script]": script,
                                                    "queue[exec_prefix]": "", "x_format": "json"})
        assert resp.get_json() == ["success", "queue created - awesome"], (name, resp.get_data())
        assert (site.root / "queue" / name / "config.json").is_file()
        assert send(cl, "GET", f"/q/{seg(name)}.json").status_code == 200
    for name in names:
        resp = send(cl, "POST", "/delete_queue", data={"queue_name": name, "x_format": "json"})
        assert resp.get_json()[0] in ("ok", "success"), (name, resp.get_data())
        wait_for(lambda: not (site.root / "queue" / name).exists(), 30, 0.05, f"{name} trashed")
        assert list((site.root / "queue").glob(f"{name}.deleted.*")), name
    assert diff(before_out, outside_snapshot(site)) == []


def test_symlinks_out_of_a_message_are_not_followed(site: Site) -> None:
    """A job may plant symlinks in job/ and attach/: logs, attachments, tail views and the
    stream never serve what they point to (S17.1, route 24)."""
    cl = no_cookies(site.app)
    base = f"/q/test/{site.done_id}"
    for name in ("passwd_link", "shadow_link", "canary_link", "canary_dir", "dir_link",
                 "config_link", "up_link", "fifo", "fifo_link", "x"):
        for path in (f"{base}/log/{name}", f"{base}/logstream/{name}"):
            resp = send(cl, "GET", path)
            assert resp.status_code == 404, (path, resp.status_code, resp.get_data()[:200])
            assert f"Message ID log &#39;{name}&#39; not found" in resp.get_data(as_text=True) \
                or path.find("/logstream/") > 0
            assert not any(s in resp.get_data() for s in site.secrets), path
    for name in ("x", "shadow_link", "passwd_link", "fifo_link", "config_link", "fifo"):
        resp = send(cl, "GET", f"{base}/attach/{name}")
        assert resp.status_code == 404, (name, resp.status_code, resp.get_data()[:200])
        assert not any(s in resp.get_data() for s in site.secrets), name
    # queue/evil -> /etc and queue/evil2 -> a directory outside: no queue of that name
    for name in ("evil", "evil2"):
        for path in (f"/q/{name}", f"/q/{name}.json", f"/q/{name}/config.json",
                     f"/q/{name}/new_message", f"/q/{name}/config"):
            resp = send(cl, "GET", path)
            assert resp.status_code == 404, (path, resp.status_code)
            assert not any(s in resp.get_data() for s in site.secrets), path
    listing = send(cl, "GET", "/q.txt").get_data(as_text=True)
    assert "evil" not in listing


def test_message_json_does_not_read_attachments_through_symlinks(site: Site) -> None:
    """S4.5 `_attachments` lists a message's attachments; a symlink a job planted in
    attach/ must not make the server read (and publish the md5 and size of) a file outside
    the message, e.g. /etc/shadow."""
    resp = send(no_cookies(site.app), "GET", f"/q/test/{site.done_id}.json")
    attachments = resp.get_json().get("_attachments", {})
    leaked = {name: info for name, info in attachments.items()
              if name in ("x", "shadow_link", "passwd_link", "config_link")}
    assert leaked == {}, f"md5/size of files outside the message published: {leaked}"


# ---------------------------------------------------------------- raw HTTP over a socket


def raw_request(port: int, target: str, method: str = "GET",
                headers: dict[str, str] | None = None, body: bytes = b"",
                send_body: bool = True,
                head_only: bool = False) -> tuple[int, list[tuple[str, str]], bytes]:
    """One request on its own connection; the whole answer (until the server closes), or
    with `head_only` just its head (for streams that never end)."""
    head = [f"{method} {target} HTTP/1.1", f"Host: 127.0.0.1:{port}", "Connection: close"]
    head += [f"{k}: {v}" for k, v in (headers or {}).items()]
    if (body or method == "POST") and "Content-Length" not in (headers or {}):
        head.append(f"Content-Length: {len(body)}")
    data = ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + (body if send_body else b"")
    chunks = []
    with socket.create_connection(("127.0.0.1", port), timeout=20) as sock:
        sock.sendall(data)
        while True:
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            chunks.append(chunk)
            if head_only and b"\r\n\r\n" in b"".join(chunks):
                break
    raw = b"".join(chunks)
    head_bytes, _, payload = raw.partition(b"\r\n\r\n")
    lines = head_bytes.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1]) if lines and lines[0].startswith("HTTP/") else 0
    hdrs = [tuple(x.strip() for x in line.split(":", 1)) for line in lines[1:] if ":" in line]
    return status, hdrs, payload  # type: ignore[return-value]


def header(headers: list[tuple[str, str]], name: str) -> str | None:
    return next((v for k, v in headers if k.lower() == name.lower()), None)


def settle(root: Path, queue: str) -> None:
    """Wait for a queue that a request may have restarted to answer again."""
    def answers() -> bool:
        try:
            return rqclient.call_queue(str(root), queue, "ping", timeout=5) == ["pong"]
        except ConnectError:
            return False
    wait_for(answers, 30, 0.05, f"queue {queue} to answer")


def wire(value: str) -> str:
    """`value` for a request line: % kept as it is (so %2e reaches the server encoded), any
    byte that may not stand in a request line percent-encoded."""
    return quote(value, safe="%/\\;:@&=+$,!~*'()[]?#.")


def test_hostile_paths_over_a_real_socket(site: Site, hostile: list[str]) -> None:
    port = site.web.main.port
    audit = Audit(site.secrets, hosts=(f"127.0.0.1:{port}",))
    before = outside_snapshot(site)
    d = site.done_id
    templates = [f"/q/test/{d}/log/{{}}", f"/q/test/{d}/attach/{{}}", "/static/{}", "/q/{}",
                 "/q/{}/config.json", "/q/test/{}.json", f"/q/test/{d}/tailviewlog/{{}}", "/{}"]
    picked = [v for v in hostile if "%" in v or "/" in v or "\\" in v or not v.isascii()][:400]
    assert len(picked) >= 300
    for i, value in enumerate(picked):
        target = templates[i % len(templates)].format(wire(value))
        status, headers, body = raw_request(port, target)
        assert status, f"no HTTP answer to {target!r}"
        audit.check(f"GET {target[:120]!r}", status, headers, body)
    for target in ["/../../../../etc/passwd", "/%2e%2e/%2e%2e/%2e%2e/etc/passwd",
                   "/static/../../../../../../etc/passwd", "/static/%2e%2e/%2e%2e/web/__init__.py",
                   "/static/..%2f..%2fweb%2f__init__.py", "/static/..%5c..%5cweb%5c__init__.py",
                   "/static//etc/passwd", "/static/%2fetc%2fpasswd", "//etc/passwd",
                   f"/q/test/{d}/log/..%2f..%2f..%2f..%2f..%2f..%2f..%2fetc%2fpasswd",
                   f"/q/test/{d}/log/%2e%2e%2fmsg", f"/q/test/{d}/attach/%2e%2e%2f%2e%2e%2fmsg",
                   f"/q/test/{d}/log/passwd_link", f"/q/test/{d}/attach/x",
                   f"/q/test/{d}/log/canary_link", f"/q/test/{d}/log/fifo_link",
                   "/q/test/..%2f..%2fconfig/config.json", "/q/%2e%2e/config.json",
                   "/q/..%2fconfig/config.json", "/q/evil/passwd", "/q/evil2/canary.txt",
                   f"http://127.0.0.1:{port}/../../etc/passwd", "../../etc/passwd",
                   "/q/test/%00", "/%c0%ae%c0%ae/%c0%ae%c0%ae/etc/passwd", "/%ff%fe%fd",
                   "*", "/q.json#/../../etc/passwd", "/q.json?/../../etc/passwd",
                   "/q/test\\..\\..\\config\\config.json", "/" + "a" * 8000]:
        status, headers, body = raw_request(port, target)
        assert status, f"no HTTP answer to {target!r}"
        audit.check(f"GET {target[:120]!r}", status, headers, body)
    audit.verdict()
    assert diff(before, outside_snapshot(site)) == []


# ---------------------------------------------------------------- auth, address filter, CSRF


def basic(user: str, password: str) -> dict[str, str]:
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    return {"Authorization": f"Basic {token}"}


@dataclass
class AuthSite:
    root: Path
    app: Flask
    web: WebServer
    done_id: str
    prep_id: str


@pytest.fixture(scope="module")
def auth_site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AuthSite]:
    """A second root with basic_auth, a ROOT prefix and a small upload limit."""
    base = tmp_path_factory.mktemp("webauth")
    root = build_root(base, basic_auth={"realm": REALM, "users": USERS},
                      relative_root="/therq", max_upload_bytes=4096,
                      csrf_trusted_origins=[TRUSTED])
    publish_analytics(root)
    (base / "a.txt").write_text("a\n")
    mgr = Mgr(root)
    try:
        web = WebServer_with_auth(root)
        done_id = prep_with_attachment(root, "test", base / "a.txt")
        assert rqclient.call_queue(str(root), "test", "commit_message",
                                   {"msg_id": done_id})[0] == "ok"
        finished(root, "test", done_id)
        prep_id = prep_with_attachment(root, "test", base / "a.txt")
        yield AuthSite(root, create_app(str(root)), web, done_id, prep_id)
        web.stop()
    finally:
        mgr.stop()


def WebServer_with_auth(root: Path) -> WebServer:  # noqa: N802 - a constructor
    """browser.WebServer polls the dashboard for 200, which basic_auth turns into 401:
    wait for the 401 here instead."""
    import browser
    plain = browser.http_status
    browser.http_status = lambda url: 200 if plain(url) == 401 else plain(url)  # type: ignore
    try:
        return WebServer(root)
    finally:
        browser.http_status = plain


def concrete(rule: str, method: str, done_id: str, prep_id: str, name: str = "test") -> str:
    msg = prep_id if "attach" in rule and method == "POST" else done_id
    query = {"/search": f"?name={name}",  # route 8 needs a queue
             "/events": "?pattern=%23"}.get(rule, "")  # route 31 a pattern
    return fill(rule, {"name": name, "msg_id": msg, "logname": "stdio.log", "attname": "a.txt",
                       "filename": "rq.css"}) + query


def all_routes(app: Flask, done_id: str, prep_id: str, name: str = "test") -> list[tuple[str, str]]:
    routes = [(method, concrete(rule, method, done_id, prep_id, name))
              for rule, method, _ in app_rules(app)]
    assert len(routes) >= 34 and ("GET", "/metrics") in routes
    assert ("GET", "/static/rq.css") in routes
    return routes


def test_basic_auth_on_every_route(auth_site: AuthSite) -> None:
    cl = auth_site.app.test_client()
    prefix = "/therq"
    good = basic("alice", USERS["alice"])
    wrong = [basic("alice", "wrong"), basic("alice", ""), basic("mallory", USERS["alice"]),
             basic("Alice", USERS["alice"]), basic("alice", USERS["alice"] + " "),
             basic("bob", "pa"), basic("", ""), {"Authorization": "Basic !!!not-base64"},
             {"Authorization": "Basic " + base64.b64encode(b"\xff\xfe:\xff").decode()},
             {"Authorization": "Bearer " + USERS["alice"]}, {"Authorization": "Basic"},
             {"Authorization": f"Digest username=alice, response={USERS['alice']}"}]
    others_right = [basic("bob", USERS["bob"]), basic("carol", USERS["carol"]),
                    {"Authorization": "basic " + good["Authorization"].split()[1]}]
    routes = all_routes(auth_site.app, auth_site.done_id, auth_site.prep_id)
    for method, path in routes:
        url = prefix + path
        for headers in [{}] + wrong:
            resp = send(cl, method, url, headers=headers)
            assert resp.status_code == 401, (method, url, headers, resp.status_code)
            assert resp.headers.get("WWW-Authenticate") == f'Basic realm="{REALM}"', url
        if method == "GET":
            head = send(cl, "HEAD", url)
            assert head.status_code == 401 and head.get_data() == b"", url
        resp = send(cl, method, url, headers=good)
        assert resp.status_code != 401, (method, url)
        settle(auth_site.root, "test")
    for headers in others_right:
        for method, path in routes:
            if method == "GET":
                assert send(cl, "GET", prefix + path, headers=headers).status_code != 401, path
    # the real server of that root asks for credentials too (static files and metrics included)
    port = auth_site.web.main.port
    for method, path in routes:
        url = prefix + path
        status, headers, _ = raw_request(port, url, method)
        assert status == 401, (method, url, status)
        assert header(headers, "WWW-Authenticate") == f'Basic realm="{REALM}"', headers
        assert raw_request(port, url, method, basic("alice", "nope"))[0] == 401, url
        if method == "GET":
            assert raw_request(port, url, method, good, head_only=True)[0] == 200, url
        else:
            assert raw_request(port, url, method, good)[0] not in (401, 403), url
            settle(auth_site.root, "test")


def test_allowed_ips_on_every_route(site: Site) -> None:
    main = load_main_config(str(site.root))
    routes = all_routes(site.app, site.done_id, site.prep_id)
    for allowed in (("10.0.",), ("27.0.0.1",), ("127.0.0.10",), ("10.0.0.0/8", "::1"),
                    ("127.0.0.2/32",), ("not an address/8",)):
        app = create_app(main=dataclasses.replace(main, allowed_ips=allowed))
        cl = no_cookies(app)
        for method, path in routes:
            for m in ([method, "HEAD"] if method == "GET" else [method]):
                resp = send(cl, m, path)
                assert resp.status_code == 403, (allowed, m, path, resp.status_code)
                if m == "HEAD":
                    continue
                body = resp.get_data(as_text=True)
                assert "403 - Forbidden" in body or resp.get_json(silent=True) == [
                    "fail", "Forbidden"], (path, body[:300])
    for allowed in (("127.0.0.1",), ("127.",), ("127.0.0.0/8",), ("10.0.0.0/8", "127.0.0.1/32")):
        cl = no_cookies(create_app(main=dataclasses.replace(main, allowed_ips=allowed)))
        for method, path in routes:
            if method == "GET":
                assert send(cl, "GET", path).status_code == 200, (allowed, path)


CROSS_SITE = [{"Origin": "http://evil.example"}, {"Origin": "null"},
              {"Origin": "http://localhost.evil.example"}, {"Origin": "http://localhost:8080"},
              {"Origin": "https://localhost"}, {"Origin": "HTTP://LOCALHOST"},
              {"Origin": "http://evil.example", "Referer": "http://localhost/"},
              {"Sec-Fetch-Site": "cross-site"}, {"Sec-Fetch-Site": "same-site"},
              {"Sec-Fetch-Site": "cross-site", "Origin": SAME_ORIGIN},
              {"Sec-Fetch-Site": "bogus"}, {"Origin": TRUSTED + "/"},
              {"Origin": "https://trusted.example"}, {"Origin": TRUSTED.upper()},
              {"Origin": "http://localhost", "X-Forwarded-Proto": "https"}]
SAME_SITE = [{}, {"Origin": SAME_ORIGIN}, {"Origin": TRUSTED},
             {"Origin": TRUSTED, "Sec-Fetch-Site": "cross-site"},
             {"Sec-Fetch-Site": "same-origin"}, {"Sec-Fetch-Site": "none"},
             {"Sec-Fetch-Site": "same-origin", "Origin": SAME_ORIGIN},
             {"Origin": "https://localhost", "X-Forwarded-Proto": "https"}]


def test_csrf_on_every_post_route(site: Site) -> None:
    """S14.5 on every POST rule, on the queue `victim` (allowed requests really run)."""
    cl = no_cookies(site.app)
    posts = [path for method, path in all_routes(site.app, site.victim_done, site.victim_prep,
                                                 "victim") if method == "POST"]
    assert len(posts) >= 11
    for path in posts:
        for headers in CROSS_SITE:
            resp = send(cl, "POST", path, headers=headers)
            assert resp.status_code == 403, (path, headers, resp.status_code)
            body = resp.get_data(as_text=True)
            assert "403 - Cross-origin request refused" in body or resp.get_json(silent=True) == [
                "fail", "Cross-origin request refused"], (path, body[:300])
        for headers in SAME_SITE:
            settle(site.root, "victim")  # route 14 restarts it
            resp = send(cl, "POST", path, headers=headers)
            assert resp.status_code not in (401, 403), (path, headers, resp.status_code,
                                                        resp.get_data()[:300])
            assert resp.status_code < 500 or any(t in resp.get_data() for t in DOCUMENTED_5XX), \
                (path, headers, resp.status_code, resp.get_data()[:300])
    # GET routes are never refused for their Origin (they change nothing)
    for method, path in all_routes(site.app, site.done_id, site.prep_id):
        if method == "GET":
            resp = send(cl, "GET", path, headers={"Origin": "http://evil.example",
                                                  "Sec-Fetch-Site": "cross-site"})
            assert resp.status_code == 200, path
    # over the real server too, with its own Host
    port = site.web.main.port
    for path in posts:
        status, _, body = raw_request(port, path, "POST", {"Origin": "http://evil.example"})
        assert status == 403 and b"Cross-origin request refused" in body, (path, status)
        settle(site.root, "victim")
        status, _, _ = raw_request(port, path, "POST", {"Origin": f"http://127.0.0.1:{port}"})
        assert status not in (401, 403), (path, status)
    settle(site.root, "victim")


def test_no_get_route_changes_state(site: Site) -> None:
    cl = no_cookies(site.app)
    wait_idle(site)
    before = snapshot(site.root, runtime_file)
    routes = [path for method, path in all_routes(site.app, site.done_id, site.prep_id)
              if method == "GET"]
    prep_routes = [f"/q/test/{site.prep_id}", f"/q/test/{site.prep_id}.json",
                   f"/q/test/{site.prep_id}/attach/a.txt", f"/q/test/{site.prep_id}/state.json"]
    action_like = ["/q/test/adminoper?pause=1", "/q/test/restart",
                   "/q/test/new_message?mesg=%7B%7D", f"/q/test/{site.done_id}?_method=delete",
                   f"/q/test/{site.prep_id}?_method=commit",
                   f"/q/test/{site.done_id}/clone", f"/q/test/{site.done_id}/run_now",
                   f"/q/test/{site.prep_id}/attach/a.txt?_method=delete",
                   "/new_queue?queue%5Bname%5D=getq&queue%5Bscript%5D=/bin/true",
                   "/delete_queue?queue_name=test", "/new_queue_link?queue%5Bjson_path%5D=x"]
    for path in routes + prep_routes + action_like:
        for method in ("GET", "HEAD"):
            resp = send(cl, method, path)
            assert resp.status_code < 500, (method, path, resp.status_code)
    assert diff(before, snapshot(site.root, runtime_file)) == []


def wait_idle(site: Site) -> None:
    """No message of the site's queues in que or run (the CSRF pass clones some)."""
    settle(site.root, "victim")
    settle(site.root, "test")

    def idle() -> bool:
        return all(site.queue(q, "num_messages")[s] == 0 for q in ("test", "victim")
                   for s in ("que", "run"))
    wait_for(idle, 30, 0.05, "the queues to be idle")


def test_head_on_every_get_route_and_405_for_other_methods(site: Site) -> None:
    cl = no_cookies(site.app)
    routes = all_routes(site.app, site.done_id, site.prep_id)
    paths = {path for _, path in routes}
    for method, path in routes:
        if method == "GET":
            got, head = send(cl, "GET", path), send(cl, "HEAD", path)
            assert head.status_code == got.status_code == 200, (path, head.status_code)
            assert head.get_data() == b"", path
            assert head.headers.get("Content-Type") == got.headers.get("Content-Type"), path
    for path in sorted(paths):
        for method in ("PUT", "DELETE", "PATCH", "TRACE", "CONNECT", "PROPFIND"):
            resp = send(cl, method, path)
            assert resp.status_code == 405, (method, path, resp.status_code)
    port = site.web.main.port
    for path in sorted(paths):
        for method in ("PUT", "DELETE"):
            status = raw_request(port, path, method)[0]
            assert status == 405, (method, path, status)


def test_options_is_405_like_every_other_method(site: Site) -> None:
    """S14.1: GET, POST, and HEAD on GET routes; other methods -> 405.  OPTIONS included
    (Flask answers it by itself unless told not to)."""
    cl = no_cookies(site.app)
    answers = {path: send(cl, "OPTIONS", path).status_code
               for _, path in all_routes(site.app, site.done_id, site.prep_id)}
    assert all(status == 405 for status in answers.values()), answers


def test_manager_down_answers_503_everywhere_but_metrics(tmp_path: Path) -> None:
    root = build_root(tmp_path)  # no rq-mgr
    app = create_app(str(root))
    cl = no_cookies(app)
    for method, path in all_routes(app, "20200101.0000.00.000.1", "20200101.0000.00.000.2"):
        resp = send(cl, method, path)
        if path == "/metrics":
            assert resp.status_code == 200 and re.search(rb"(?m)^rq_up 0$", resp.get_data())
            continue
        if path.startswith("/static/"):
            continue  # not an S15 route
        assert resp.status_code == 503, (method, path, resp.status_code)
        body = resp.get_data(as_text=True)
        assert "503 - QueueMgr not running" in body or resp.get_json(silent=True) == [
            "fail", "QueueMgr not running"], (path, body[:300])
        if method == "GET":
            assert send(cl, "HEAD", path).status_code == 503, path


def test_path_normalisation(site: Site, auth_site: AuthSite) -> None:
    cl = no_cookies(site.app)
    for path in ("//q/test.txt", "/q//test.txt", "/./q/./test.txt", "/x/../q/test.txt",
                 "/../../q/test.txt", "///q///test.txt"):
        # as PATH_INFO: the test client would read "//q/..." as a host name
        resp = send(cl, "GET", "/", environ_overrides={"PATH_INFO": path})
        assert resp.status_code == 200 and resp.get_data(as_text=True).startswith("status: "), path
    port = site.web.main.port
    status, _, body = raw_request(port, "//q/test.txt")
    assert status == 200 and body.startswith(b"status: "), (status, body[:100])
    pcl = no_cookies(auth_site.app)
    good = basic("alice", USERS["alice"])
    for path, shown in (("/therq/../q.txt", "/q.txt"), ("/q.txt", "/q.txt"),
                        ("/therqx/q.txt", "/therqx/q.txt"),
                        ("/therq/../../etc/passwd", "/etc/passwd"),
                        ("/therq/%2e%2e/q.txt", "/q.txt")):
        resp = send(pcl, "GET", "/", headers=good, environ_overrides={"PATH_INFO": unquote(path)})
        assert resp.status_code == 404, (path, resp.status_code)
        assert resp.headers["Content-Type"].startswith("text/plain"), path
        assert resp.get_data(as_text=True) == f"Not Found: {shown}", (path, resp.get_data())
    for path in ("/therq//q.txt", "/therq/./q.txt", "//therq/q.txt", "/therq/x/../q.txt"):
        resp = send(pcl, "GET", "/", headers=good, environ_overrides={"PATH_INFO": path})
        assert resp.status_code == 200 and "/therq/q/test.txt" in resp.get_data(as_text=True), path
    aport = auth_site.web.main.port
    status, _, body = raw_request(aport, "/therq/../q.txt", headers=good)
    assert status == 404 and body == b"Not Found: /q.txt", (status, body)


def test_upload_over_the_limit_is_413(auth_site: AuthSite) -> None:
    """S14 / S1.4 max_upload_bytes (4096 here): a larger body is refused with 413, on the
    real server and in the app, on every POST route that reads a form."""
    good = basic("alice", USERS["alice"])
    settle(auth_site.root, "test")
    port = auth_site.web.main.port
    attach = f"/therq/q/test/{auth_site.prep_id}/attach/new"
    boundary = "b0undary"
    part = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"filedata\"; "
            f"filename=\"big.txt\"\r\nContent-Type: text/plain\r\n\r\n").encode()
    multipart = part + b"y" * 10_000 + f"\r\n--{boundary}--\r\n".encode()
    answers = {}
    for path in (attach, "/therq/q/test/new_message", "/therq/new_queue"):
        for ctype, body in ((f"multipart/form-data; boundary={boundary}", multipart),
                            ("application/x-www-form-urlencoded", b"a=" + b"x" * 10_000)):
            status, _, text = raw_request(port, path, "POST", dict(good, **{"Content-Type": ctype}),
                                          body)
            answers[(path, ctype.split(";")[0])] = (status, text[:60])
    assert all(status == 413 for status, _ in answers.values()), answers
    # far over the limit: refused from the headers alone, the body never sent
    status, _, _ = raw_request(port, attach, "POST", dict(good, **{
        "Content-Type": f"multipart/form-data; boundary={boundary}",
        "Content-Length": str(64 << 20)}), b"", send_body=False)
    assert status == 413, status
    cl = auth_site.app.test_client()
    small = send(cl, "POST", attach, headers=good,
                 data={"filedata": (io.BytesIO(b"x" * 1000), "small.txt"), "x_format": "json"})
    assert small.status_code == 200 and small.get_json()[0] == "ok", small.get_data()
    big = send(cl, "POST", attach, headers=good,
               data={"filedata": (io.BytesIO(b"x" * 10_000), "big.txt"), "x_format": "json"})
    assert big.status_code == 413, big.status_code
    found = Store(str(auth_site.root), "test").locate(auth_site.prep_id)
    assert found is not None and not os.path.exists(os.path.join(found[1], "attach", "big.txt"))
    assert list(Path(load_main_config(str(auth_site.root)).tmpdir or "/tmp").glob(
        "rq-upload-*")) == []
