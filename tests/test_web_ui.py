"""The HTML pages (SPEC S16; S15 routes 1, 2, 9, 11, 17) through the Flask test
client against a real rq-mgr: page structure (parsed with html.parser), the
S16.1 and S16.3 regular expressions, the new-message form and its form.json
overrides (S16.5), escaping of user data, and the error pages (S14.8, S15).
Messages in states a test needs are made by the queue process where that is
quick, or planted on disk (relayed, dups) where no job could make them."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import time
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from rqtest import make_queue, short_id, wait_for, write_script

from rq import __version__, client, cron
from rq.config import load_main_config
from rq.store import new_msg_id

HOLD_SCRIPT = ('#!/bin/sh\necho "run holding" >&3\n'
               'while [ ! -e "$RQ_PARAM1" ]; do sleep 0.05; done\necho "done released" >&3\n')
STATES = ("prep", "que", "run", "err", "done", "relayed")
FIELD_IDS = ["mesg_dest_field", "mesg_src_field", "mesg_param1_field", "mesg_param2_field",
             "mesg_param3_field", "mesg_param4_field", "mesg_status_field",
             "mesg_post_run_webhook_field", "mesg_submit_field"]
DEFAULT_LABELS = ["Destination Queue", "Source Identifier", "Param 1", "Param 2", "Param 3",
                  "Param 4", "Status", "post_run_hook"]
DOWN_TEXT = "503 - Service Unavailable - Operationally Down"
_seq = iter(range(50_000_000, 99_999_999))


# ---------------------------------------------------------------- a small DOM


VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source",
        "track", "wbr"}


class Node:
    def __init__(self, tag: str, attrs: dict[str, str | None], parent: Node | None) -> None:
        self.tag, self.attrs, self.parent = tag, attrs, parent
        self.children: list[Node | str] = []

    @property
    def classes(self) -> list[str]:
        return (self.attrs.get("class") or "").split()

    @property
    def text(self) -> str:
        return "".join(c if isinstance(c, str) else c.text for c in self.children)

    def get(self, key: str) -> str | None:
        return self.attrs.get(key)

    def walk(self) -> Iterator[Node]:
        for c in self.children:
            if isinstance(c, Node):
                yield c
                yield from c.walk()

    def all(self, tag: str | None = None, cls: str | None = None, **attrs: str) -> list[Node]:
        return [n for n in self.walk()
                if (tag is None or n.tag == tag) and (cls is None or cls in n.classes)
                and all(n.attrs.get(k.rstrip("_").replace("_", "-")) == v
                        for k, v in attrs.items())]

    def one(self, tag: str | None = None, cls: str | None = None, **attrs: str) -> Node:
        found = self.all(tag, cls, **attrs)
        assert len(found) == 1, f"expected one {tag} {cls} {attrs}, found {len(found)}"
        return found[0]

    def by_id(self, ident: str) -> Node:
        return self.one(id=ident)

    def form_fields(self) -> dict[str, str | None]:
        return {i.get("name") or "": i.get("value") for i in self.all("input")}


class DomBuilder(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.root = Node("#document", {}, None)
        self.cur = self.root

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        node = Node(tag, dict(attrs), self.cur)
        self.cur.children.append(node)
        if tag not in VOID:
            self.cur = node

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.cur.children.append(Node(tag, dict(attrs), self.cur))

    def handle_endtag(self, tag: str) -> None:
        node: Node | None = self.cur
        while node is not None and node.tag != tag:
            node = node.parent
        if node is not None and node.parent is not None:
            self.cur = node.parent

    def handle_data(self, data: str) -> None:
        self.cur.children.append(data)


def parse(html: str) -> Node:
    builder = DomBuilder()
    builder.feed(html)
    builder.close()
    return builder.root


# ---------------------------------------------------------------- helpers


def page(client_: Any, url: str, status: int = 200) -> tuple[str, Node]:
    resp = client_.get(url)
    body = resp.get_data(as_text=True)
    assert resp.status_code == status, (url, resp.status_code, body[:2000])
    assert resp.headers["Content-Type"] == "text/html; charset=utf-8"
    return body, parse(body)


def mgr(root: Path, cmd: str, arg: Any = None) -> Any:
    """A manager command; a queue name goes as a raw string (S7.2)."""
    return client.call_mgr(str(root), cmd, arg, raw=isinstance(arg, str))


def qcall(root: Path, name: str, cmd: str, arg: Any = None) -> Any:
    return client.call_queue(str(root), name, cmd, arg)


def running(root: Path, name: str) -> None:
    def up() -> bool:
        child = mgr(root, "status")[1]["queues"].get(name)
        if not child or child["state"] != "RUNNING":
            return False
        try:
            return qcall(root, name, "ping") == ["pong"]
        except Exception:
            return False
    wait_for(up, 30, 0.05, f"queue {name} to run")


def add_queue(root: Path, name: str, script: Path | None = None, **cfg: Any) -> None:
    """A queue made on disk and loaded by a manager reload."""
    make_queue(root, name, script=script or root.parent / "done.sh", **cfg)
    assert mgr(root, "reload") == ["ok"]
    running(root, name)


def state_of(root: Path, name: str, msg_id: str) -> str | None:
    reply = qcall(root, name, "get_message_state", {"msg_id": msg_id})
    return reply[1] if reply[0] == "ok" else None


def send(root: Path, name: str, fields: dict[str, Any], state: str = "done") -> str:
    reply = qcall(root, name, "create_message", {"dest": name, **fields})
    assert reply[0] == "ok", reply
    msg_id = short_id(reply[1])
    wait_for(lambda: state_of(root, name, msg_id) == state, 30, 0.05, f"{msg_id} in {state}")
    return msg_id


def held(root: Path, name: str, go: Path) -> str:
    """A message of queue `hold` whose job runs and has said `run holding`."""
    msg_id = send(root, name, {"param1": str(go)}, state="run")
    wait_for(lambda: qcall(root, name, "get_message_status", {"msg_id": msg_id})[1]["status"]
             == "run - holding", 30, 0.05, f"{msg_id} to say holding")
    return msg_id


def plant(root: Path, queue: str, state: str, fields: dict[str, Any],
          status: str | None = None) -> str:
    """A finished message written by hand (S4.6), for states no quick job reaches."""
    msg_id = new_msg_id(time.time() - 5, next(_seq))
    path = root / "queue" / queue / state / msg_id[0:8] / msg_id[9:11] / msg_id[11:13] / msg_id
    path.mkdir(parents=True)
    (path / "msg").write_text(json.dumps({"msg_id": msg_id, "dest": queue, "due": 1,
                                          "count": 0, "max_count": 15, **fields}))
    if status is not None:
        (path / "status").write_text(json.dumps({"job_status": status}))
    return msg_id


def error_text(node: Node) -> str:
    return node.one("p", "error").text


@pytest.fixture(scope="module")
def hold(mgr_root: Path) -> Iterator[str]:
    """Queue `hold`: each job runs until the file named by its param1 exists."""
    add_queue(mgr_root, "hold", write_script(mgr_root.parent / "hold.sh", HOLD_SCRIPT),
              num_workers=4)
    yield "hold"


@pytest.fixture
def form_json(mgr_root: Path) -> Iterator[Path]:
    path = mgr_root / "queue" / "test" / "form.json"
    yield path
    path.unlink(missing_ok=True)


# ---------------------------------------------------------------- S16.1 dashboard


def test_dashboard_operational_line_and_manager_spans(client: Any) -> None:
    body, doc = page(client, "/")
    assert 'QUEUEMGR:<span class="green" id="status">OPERATIONAL</span>' in body
    assert any(re.search(r"QUEUEMGR:.*OPERATIONAL", line) for line in body.splitlines())
    for ident in ("ping", "pid", "uptime", "time", "version"):
        assert doc.by_id(ident).tag == "span"
    assert doc.by_id("ping").text == "pong"
    assert doc.by_id("version").text == __version__
    assert "red" not in doc.by_id("version").classes
    pid = int((Path(client.application.config["RQ_MAIN"].root) / "config" /
               "queuemgr.pid").read_text())
    assert doc.by_id("pid").text == str(pid)
    assert client.head("/").status_code == 200


def test_dashboard_version_mismatch_in_red(client: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import rq.web.ui
    monkeypatch.setattr(rq.web.ui, "__version__", "0.0.0-other")
    _, doc = page(client, "/")
    version = doc.by_id("version")
    assert "red" in version.classes and __version__ in version.text


def test_dashboard_queue_table(client: Any, mgr_root: Path) -> None:
    add_queue(mgr_root, "webhook")
    add_queue(mgr_root, "aaa_custom")
    send(mgr_root, "test", {"param1": "counted"})
    _, doc = page(client, "/")
    table = doc.by_id("queue-list")
    assert table.tag == "table"
    custom = [r.get("data-queue") for r in table.one("tbody", id="custom-queues").all("tr")]
    builtin = [r.get("data-queue") for r in table.one("tbody", id="builtin-queues").all("tr")]
    assert custom == sorted(custom) and {"aaa_custom", "test"} <= set(custom)
    assert "webhook" not in custom
    assert builtin == ["webhook"]

    row = table.one("tr", data_queue="test")
    assert row.one("td", "name").one("a").get("href") == "/q/test"
    counts = qcall(mgr_root, "test", "num_messages")
    for state in STATES:
        assert row.one(data_k=state).text == str(counts[state])
    assert int(row.one(data_k="done").text) >= 1
    assert row.one(data_k="ping").text == "pong"
    assert row.one(data_k="pid").text.isdigit()
    assert row.one(data_k="status").text == "UP"
    assert row.one(data_k="uptime").text.endswith(("s", "min", "h", "d"))

    admin = row.one("form", data_suffix="adminoper")
    assert admin.get("action") == "/q/test/adminoper" and admin.get("method") == "post"
    assert admin.form_fields() == {"back": "/"}
    assert {b.get("name") for b in admin.all("button")} == {"pause", "down"}
    restart = row.one("form", data_suffix="restart")
    assert restart.get("action") == "/q/test/restart"
    assert restart.form_fields() == {"back": "/"}


def test_dashboard_buttons_follow_the_admin_flags(client: Any, mgr_root: Path) -> None:
    assert mgr(mgr_root, "pause_queue", "aaa_custom")[0] == "ok"
    try:
        _, doc = page(client, "/")
        row = doc.by_id("queue-list").one("tr", data_queue="aaa_custom")
        assert row.one(data_k="status").text == "PAUSE"
        assert {b.get("name") for b in row.one("form", data_suffix="adminoper").all("button")} \
            == {"resume", "down"}
        assert mgr(mgr_root, "down_queue", "aaa_custom")[0] == "ok"
        _, doc = page(client, "/")
        row = doc.by_id("queue-list").one("tr", data_queue="aaa_custom")
        assert row.one(data_k="status").text == "DOWN"
        assert {b.get("name") for b in row.one("form", data_suffix="adminoper").all("button")} \
            == {"resume", "up"}
    finally:
        mgr(mgr_root, "up_queue", "aaa_custom")
        mgr(mgr_root, "resume_queue", "aaa_custom")


def test_dashboard_schedule_entries_with_next_time_and_run_now(client: Any,
                                                              mgr_root: Path) -> None:
    add_queue(mgr_root, "sched", schedule=[
        {"cron": "*/5 * * * *", "param1": "p<1>", "id": "five"},
        {"cron": "@daily", "tz": "UTC"}])
    _, doc = page(client, "/")
    entries = doc.by_id("queue-list").one("tr", data_queue="sched").all("div", "sched")
    assert [e.one("code", "cron").text for e in entries] == ["*/5 * * * *", "@daily"]
    now = time.time()
    nexts = [float(e.one("time", "rel").get("data-epoch") or 0) for e in entries]
    # S9.3 fires a slot up to WINDOW s early: within a minute before a 5-minute
    # boundary the queue may already have fired it, and `next` is the one after
    assert now < nexts[0] <= now + 300 + cron.WINDOW
    assert nexts[1] % 86400 == 0 and now < nexts[1] <= now + 86400
    form = entries[0].one("form")
    assert form.get("action") == "/q/sched/new_message" and form.get("method") == "post"
    assert form.one("button").text == "Run Now"
    assert form.form_fields() == {"x_format": "html", "back": "/", "mesg[dest]": "sched",
                                  "mesg[src]": "cron-now", "mesg[param1]": "p<1>"}
    assert "mesg[param1]" not in entries[1].one("form").form_fields()


def test_dashboard_new_queue_link_and_timer_list(client: Any, mgr_root: Path) -> None:
    _, doc = page(client, "/")
    assert doc.by_id("new-queue").get("href") == "/new_queue"
    assert doc.by_id("new-queue").text == "New Queue"
    timers = doc.by_id("timer-list")
    assert timers.one("h2").text == "Timer List"
    assert timers.one("table", id="timers")


def test_dashboard_scripts_are_local(client: Any) -> None:
    _, doc = page(client, "/")
    sources = [s.get("src") for s in doc.all("script") if s.get("src")]
    assert sources == ["/static/queue.js", "/static/dashboard.js"]
    for src in sources + ["/static/rq.css", "/static/rq.svg"]:
        with client.get(src) as resp:
            assert resp.status_code == 200
    links = [n.get("href") or "" for n in doc.all("link")]
    assert all(h.startswith("/static/") for h in links)


def test_queue_creation_not_allowed(mgr_root: Path) -> None:
    from rq.web import create_app
    main = dataclasses.replace(load_main_config(str(mgr_root)), allow_new_queue=False)
    closed = create_app(main=main).test_client()
    body, doc = page(closed, "/")
    assert "New Queue" not in body and not doc.all(id="new-queue")
    resp = closed.get("/new_queue")
    assert resp.status_code == 403
    assert parse(resp.get_data(as_text=True)).one("p", "error").text == \
        "403 - Queue creation not allowed at this time."


# ---------------------------------------------------------------- route 2


def test_new_queue_form(client: Any) -> None:
    _, doc = page(client, "/new_queue")
    form = doc.by_id("new-queue-form")
    assert form.get("action") == "/new_queue" and form.get("method") == "post"
    fields = {i.get("name"): i for i in form.all("input") + form.all("select")}
    for key in ("name", "script", "num_workers", "exec_prefix", "timeout", "kill_grace",
                "mode", "topic", "lease_timeout"):
        assert f"queue[{key}]" in fields
    assert fields["queue[num_workers]"].get("value") == "1"
    assert fields["queue[exec_prefix]"].get("value") == "bash -lc"
    for kind in ("coalesce_params", "blocking_params"):
        boxes = [i for i in form.all("input") if i.get("name") == f"queue[{kind}][]"]
        assert [b.get("type") for b in boxes] == ["checkbox"] * 4
        assert [b.get("value") for b in boxes] == ["1", "2", "3", "4"]
    modes = [o.get("value") for o in fields["queue[mode]"].all("option")]
    assert modes == ["script", "pull"]
    link = doc.by_id("new-queue-link-form")
    assert link.get("action") == "/new_queue_link"
    assert "queue[json_path]" in link.form_fields()


# ---------------------------------------------------------------- S16.2 queue page


def test_queue_page(client: Any, mgr_root: Path) -> None:
    done_id = send(mgr_root, "test", {"param1": "listed"})
    _, doc = page(client, "/q/test")
    assert doc.by_id("queue-status").text == "UP"
    assert doc.by_id("q-status").text == "UP" and doc.by_id("q-ping").text == "pong"
    assert doc.by_id("q-pid").text.isdigit() and doc.by_id("q-uptime").text
    assert "Queue is HARD DOWN" not in doc.text
    assert doc.one("form", data_suffix="adminoper").form_fields() == {"back": "/q/test"}
    assert doc.one("form", data_suffix="restart").get("action") == "/q/test/restart"
    delete = doc.by_id("delete-queue")
    assert delete.get("action") == "/delete_queue" and delete.get("method") == "post"
    assert delete.form_fields() == {"queue_name": "test"}
    assert doc.by_id("new-message-link").get("href") == "/q/test/new_message"
    config = doc.one("details", "config")
    assert json.loads(config.one("pre").text)["name"] == "test"
    assert doc.one("body").get("data-json-url") == "/q/test.json"
    sections = [s.get("data-state") for s in doc.all("section", "state-list")]
    assert sections == ["prep", "que", "run", "err", "done", "relayed"]
    entry = doc.by_id("done-list").one("li", data_id=done_id)
    assert entry.one("a", "mid").get("href") == f"/q/test/{done_id}"
    assert entry.one("time").get("data-epoch")


def test_queue_page_que_entries_have_run_now_and_delete(client: Any, mgr_root: Path) -> None:
    assert mgr(mgr_root, "pause_queue", "test")[0] == "ok"
    try:
        msg_id = send(mgr_root, "test", {}, state="que")
        _, doc = page(client, "/q/test")
        assert doc.by_id("queue-status").text == "PAUSE"
        entry = doc.by_id("que-list").one("li", data_id=msg_id)
        forms = entry.all("form")
        assert [f.get("action") for f in forms] == [f"/q/test/{msg_id}/run_now",
                                                    f"/q/test/{msg_id}"]
        assert [f.one("button").text for f in forms] == ["Run now", "Delete"]
        assert forms[1].form_fields() == {"_method": "delete"}
        assert len(entry.all("time", "rel")) == 2  # age and due
    finally:
        mgr(mgr_root, "resume_queue", "test")


def test_queue_page_run_entries_have_destroy(client: Any, mgr_root: Path, hold: str) -> None:
    go = mgr_root.parent / "go-destroy"
    msg_id = held(mgr_root, hold, go)
    try:
        _, doc = page(client, f"/q/{hold}")
        entry = doc.by_id("run-list").one("li", data_id=msg_id)
        assert entry.one("span", "stext").text == "holding"
        form = entry.one("form")
        assert form.get("action") == f"/q/{hold}/{msg_id}"
        assert form.form_fields() == {"_method": "destroy"}
        assert form.one("button").text == "Destroy"
        assert not doc.by_id("que-list").all("li")
    finally:
        go.touch()


def test_relay_queue_shows_relayed_in_place_of_done(client: Any, mgr_root: Path) -> None:
    add_queue(mgr_root, "relay")
    _, doc = page(client, "/q/relay")
    sections = [s.get("data-state") for s in doc.all("section", "state-list")]
    assert sections == ["prep", "que", "run", "err", "relayed"]
    assert doc.by_id("relayed-list").one("h2").text.startswith("RELAYED")


def test_down_queue(client: Any, mgr_root: Path) -> None:
    msg_id = send(mgr_root, "test", {})
    assert mgr(mgr_root, "down_queue", "test")[0] == "ok"
    try:
        _, doc = page(client, "/q/test")
        assert doc.by_id("down-banner").one("p").text == "Queue is HARD DOWN"
        assert doc.by_id("queue-status").text == "DOWN"
        admin = doc.one("form", data_suffix="adminoper")
        assert "up" in {b.get("name") for b in admin.all("button")}
        _, doc = page(client, f"/q/test/{msg_id}", 503)
        assert error_text(doc) == DOWN_TEXT
        page(client, "/q/test/new_message")  # the form itself is not a message route
    finally:
        mgr(mgr_root, "up_queue", "test")


@pytest.mark.parametrize("url", ["/q/nosuchqueue", "/q/no.such", "/q/nosuchqueue/new_message",
                                 "/q/nosuchqueue/20200101.0000.00.000.1",
                                 "/q/%20bad/new_message"])
def test_unknown_queue_is_404(client: Any, url: str) -> None:
    _, doc = page(client, url, 404)
    assert doc.one("h2").text == "Not Found"
    assert error_text(doc) == "404 - Queue not found"


# ---------------------------------------------------------------- S16.4, S16.5 form


def wrappers(doc: Node) -> list[Node]:
    return doc.all(cls="field")


def test_new_message_form_structure(client: Any) -> None:
    _, doc = page(client, "/q/test/new_message")
    form = doc.one("form", id="new-message-form")
    assert form.get("action") == "/q/test/new_message" and form.get("method") == "post"
    hidden = [i for i in form.all("input") if i.get("type") == "hidden"]
    assert [(i.get("name"), i.get("value")) for i in hidden] == [("x_format", "html")]
    fields = wrappers(doc)
    assert [f.get("id") for f in fields] == FIELD_IDS
    assert all(f.tag == "div" and f.parent is not None for f in fields)
    assert all(form in _ancestors(f) for f in fields)
    for field, label in zip(fields, DEFAULT_LABELS):
        assert field.all("label")[0].text == label
        assert "style" not in field.attrs
    assert "style" not in fields[-1].attrs
    assert not fields[0].all("p", "note")
    notes = [f.all("p", "note")[0].text for f in fields[1:8]]
    assert notes[1:5] == ["optional parameter"] * 4
    assert all(notes)

    inputs = {i.get("name"): i for i in form.all("input")}
    assert inputs["mesg[dest]"].get("value") == "/q/test"
    for name in ("mesg[src]", "mesg[param1]", "mesg[param2]", "mesg[param3]", "mesg[param4]",
                 "mesg[post_run_webhook]"):
        assert inputs[name].get("type") == "text"
    radios = [i for i in form.all("input") if i.get("name") == "mesg[_method]"]
    assert [(r.get("type"), r.get("value")) for r in radios] == \
        [("radio", "commit"), ("radio", "prep"), ("radio", "single_que")]
    assert "checked" in radios[0].attrs and all("checked" not in r.attrs for r in radios[1:])
    assert fields[6] in _ancestors(radios[0])
    assert fields[-1].one("input").get("type") == "submit"


def _ancestors(node: Node) -> list[Node]:
    out = []
    while node.parent is not None:
        node = node.parent
        out.append(node)
    return out


def test_form_overrides_default_hidden(client: Any, form_json: Path) -> None:
    form_json.write_text('{ "default" : "hidden" }')
    body, doc = page(client, "/q/test/new_message")
    fields = wrappers(doc)
    assert all(f.get("style") == "display: none;" for f in fields[:-1])
    assert "style" not in fields[-1].attrs
    assert body.count('style="display: none;"') == 8


def test_form_overrides_labels_help_and_visibility(client: Any, form_json: Path) -> None:
    form_json.write_text(json.dumps({
        "default": "hidden",
        "mesg_param1": {"label": "Cluster ID", "help": "The unique <cluster> identifier"},
        "mesg_param3": {"label": "Branch", "help": "Branch to push"},
        "mesg_status": {}}))
    body, doc = page(client, "/q/test/new_message")
    by_id = {f.get("id"): f for f in wrappers(doc)}
    for ident, field in by_id.items():
        if ident in ("mesg_param1_field", "mesg_param3_field", "mesg_status_field",
                     "mesg_submit_field"):
            assert "style" not in field.attrs, ident
        else:
            assert field.get("style") == "display: none;", ident
    assert by_id["mesg_param1_field"].all("label")[0].text == "Cluster ID"
    assert by_id["mesg_param1_field"].all("p", "note")[0].text == "The unique <cluster> identifier"
    assert "The unique &lt;cluster&gt; identifier" in body
    assert by_id["mesg_param3_field"].all("label")[0].text == "Branch"
    assert by_id["mesg_status_field"].all("label")[0].text == "Status"  # empty entry: defaults


def test_form_overrides_without_default_hide_nothing(client: Any, form_json: Path) -> None:
    form_json.write_text(json.dumps({"mesg_src": {"label": "Who"},
                                     "mesg_dest": {"help": "where it goes"}}))
    _, doc = page(client, "/q/test/new_message")
    fields = wrappers(doc)
    assert all("style" not in f.attrs for f in fields)
    assert fields[1].all("label")[0].text == "Who"
    assert fields[1].all("p", "note")[0].text  # the default help stays
    assert fields[0].all("p", "note")[0].text == "where it goes"
    # re-read on every request
    form_json.unlink()
    _, doc = page(client, "/q/test/new_message")
    assert wrappers(doc)[1].all("label")[0].text == "Source Identifier"


@pytest.mark.parametrize("content", ["{ not json", "[1, 2]", ""])
def test_form_overrides_bad_file(client: Any, form_json: Path, content: str) -> None:
    form_json.write_text(content)
    _, doc = page(client, "/q/test/new_message", 500)
    assert error_text(doc) == "500 - Bad overrides file"


def test_form_overrides_apply_to_the_form_only(client: Any, form_json: Path) -> None:
    form_json.write_text("{ not json")
    page(client, "/q/test")
    page(client, "/")


# ---------------------------------------------------------------- S16.3 message pages


def info_rows(doc: Node) -> list[tuple[str, str, bool]]:
    table = doc.one("table", "message-info")
    return [(r.one("td", "key").text.strip(), r.all("td")[2].text.strip(), "hideme" in r.classes)
            for r in table.all("tr")]


def test_done_message_page(client: Any, mgr_root: Path) -> None:
    msg_id = send(mgr_root, "test", {"count": 2, "max_count": 3, "param1": "<b>one</b>",
                                     "src": "<script>alert(1)</script>",
                                     "post_run_webhook": "http://127.0.0.1:9/a http://h/b"})
    body, doc = page(client, f"/q/test/{msg_id}")
    assert re.search(r"\scount[^:]+:[^2]+2\s", body)
    assert re.search(r"\smax_count[^:]+:[^3]+3\s", body)
    assert '<td class="key">\n count</td><td class="sep"> : </td><td> 2 </td>' in body
    assert "<script>alert(1)" not in body and "&lt;b&gt;one&lt;/b&gt;" in body
    rows = info_rows(doc)
    assert [(k, hidden) for k, _, hidden in rows[:4]] == \
        [("dest", False), ("status", False), ("state", False), ("src", False)]
    assert rows[1][1] == "done - ok" and rows[2][1] == "done"
    assert rows[3][1] == "<script>alert(1)</script>"
    rest = {k: v for k, v, hidden in rows[4:] if hidden}
    assert list(rest) == ["msg_id", "count", "max_count", "param1", "post_run_webhook",
                          "orig_msg_id"]
    assert len(rows) == 10
    assert rest["msg_id"] == msg_id and rest["param1"] == "<b>one</b>"
    assert rest["post_run_webhook"] == "http://127.0.0.1:9/a http://h/b"
    orig = doc.one("table", "message-info").all("tr")[9].one("a")
    assert orig.get("href") == f"/q/test/{msg_id}"  # a local full id links inside ROOT
    assert orig.text.endswith(f"/q/test/{msg_id}")
    assert doc.one("label", "toggle").text == "full/summary"

    actions = doc.by_id("message-actions")
    forms = {f.one("button").text: f for f in actions.all("form")}
    assert list(forms) == ["Clone", "Run message (risky)", "Delete"]
    assert forms["Clone"].get("action") == f"/q/test/{msg_id}/clone"
    assert forms["Run message (risky)"].get("action") == f"/q/test/{msg_id}/run_now"
    assert forms["Delete"].get("action") == f"/q/test/{msg_id}"
    assert forms["Delete"].form_fields() == {"_method": "delete"}
    frame = doc.one("iframe")
    assert frame.get("src") == f"/q/test/{msg_id}/tailviewlog/stdio.log"
    assert doc.by_id("raw-log").text == "Raw log"
    assert doc.by_id("raw-log").get("href") == f"/q/test/{msg_id}/log/stdio.log"
    assert doc.by_id("full-tail").text == "Full tail"
    assert doc.by_id("full-tail").get("href") == f"/q/test/{msg_id}/tailviewlog/stdio.log"
    assert client.head(f"/q/test/{msg_id}").status_code == 200


def test_running_message_page_has_destroy_not_delete(client: Any, mgr_root: Path,
                                                     hold: str) -> None:
    go = mgr_root.parent / "go-page"
    msg_id = held(mgr_root, hold, go)
    try:
        _, doc = page(client, f"/q/{hold}/{msg_id}")
        forms = {f.one("button").text: f for f in doc.by_id("message-actions").all("form")}
        assert list(forms) == ["Clone", "Run message (risky)", "Destroy"]
        assert forms["Destroy"].form_fields() == {"_method": "destroy"}
        assert doc.by_id("msg-state").text == "run"
        assert info_rows(doc)[1][1] == "run - holding"
    finally:
        go.touch()


def test_prep_page(client: Any, mgr_root: Path) -> None:
    msg_id = short_id(qcall(mgr_root, "test", "prep_message", {"dest": "test"})[1])
    data = b"attached <content>\n"
    source = mgr_root.parent / "notes.txt"
    source.write_bytes(data)
    reply = qcall(mgr_root, "test", "attach_message",
                  {"msg_id": msg_id, "pathname": str(source), "name": "notes 1+x.txt"})
    assert reply[0] == "ok", reply
    _, doc = page(client, f"/q/test/{msg_id}")
    forms = {f.one("button").text: f for f in doc.by_id("message-actions").all("form")}
    assert list(forms) == ["Commit", "Delete"]
    assert all(f.get("action") == f"/q/test/{msg_id}" and f.get("method") == "post"
               for f in forms.values())
    assert forms["Commit"].form_fields() == {"_method": "commit"}
    assert forms["Delete"].form_fields() == {"_method": "delete"}

    upload = doc.by_id("upload-form")
    assert upload.get("action") == f"/q/test/{msg_id}/attach/new"
    assert upload.get("enctype") == "multipart/form-data" and upload.get("method") == "post"
    assert upload.one("input", type="file").get("name") == "filedata"

    table = doc.by_id("attachments")
    assert [th.text for th in table.all("th")][:3] == ["Name", "MD5", "Size"]
    row = table.one("tbody").one("tr")
    cells = row.all("td")
    assert cells[0].text == "notes 1+x.txt"
    assert cells[0].one("a").get("href") == f"/q/test/{msg_id}/attach/notes%201%2Bx.txt"
    assert cells[1].text == hashlib.md5(data).hexdigest()
    assert cells[2].text == f"{len(data)} B"
    delete = row.one("form")
    assert delete.get("action") == f"/q/test/{msg_id}/attach/notes%201%2Bx.txt"
    assert delete.form_fields() == {"_method": "delete"}
    assert delete.one("button").text == "Delete"
    assert not doc.all("iframe")
    qcall(mgr_root, "test", "delete_message", {"msg_id": msg_id})


def test_links_for_dups_dup_cloned_and_relayed_id(client: Any, mgr_root: Path) -> None:
    base = load_main_config(str(mgr_root)).base_url
    remote = "http://remote.example:3333/q/test/20200101.0000.00.000.9"
    parent = plant(mgr_root, "test", "done", {
        "dups": [f"{base}q/test/20200101.0000.00.000.1", remote],
        "dup": remote, "cloned_from": "20200101.0000.00.000.2",
        "orig_msg_id": "javascript:alert(1)", "force_remote": True})
    body, doc = page(client, f"/q/test/{parent}")
    rows = {r.one("td", "key").text.strip(): r for r in doc.one("table", "message-info").all("tr")}
    assert [a.get("href") for a in rows["dups"].all("a")] == \
        ["/q/test/20200101.0000.00.000.1", remote]
    assert rows["dup"].one("a").get("href") == remote
    assert rows["cloned_from"].one("a").get("href") == "/q/test/20200101.0000.00.000.2"
    assert not rows["orig_msg_id"].all("a")  # not an http(s) URL: text only
    assert rows["force_remote"].all("td")[2].text == " true "
    assert list(rows)[4:] == ["msg_id", "count", "max_count", "orig_msg_id", "cloned_from",
                              "dups", "dup", "force_remote"]

    relayed = plant(mgr_root, "test", "relayed", {"dest": remote}, status=remote)
    _, doc = page(client, f"/q/test/{relayed}")
    status = doc.one("table", "message-info").all("tr")[1]
    assert status.all("td")[2].text == f" relayed - {remote} "
    assert status.one("a").get("href") == remote


@pytest.mark.parametrize("msg_id", ["20200101.0000.00.000.1", "not-an-id", "x.json.y"])
def test_missing_message_is_404(client: Any, msg_id: str) -> None:
    _, doc = page(client, f"/q/test/{msg_id}", 404)
    assert doc.one("h2").text == "Not Found"
    assert error_text(doc) == "404 - Message ID not found"


def test_flash_is_shown_and_escaped_on_pages(client: Any) -> None:
    with client.session_transaction() as session:
        session["_flashes"] = [("message", "made <b>bold</b>")]
    body, doc = page(client, "/q/test")
    assert doc.one("ul", "flash").one("li").text == "made <b>bold</b>"
    assert "made &lt;b&gt;bold&lt;/b&gt;" in body
    assert not page(client, "/q/test")[1].all("ul", "flash")


def test_error_page_shows_the_pending_flash_once(client: Any) -> None:
    with client.session_transaction() as session:
        session["_flashes"] = [("message", "gone <i>away</i>")]
    body, doc = page(client, "/q/nosuchqueue", 404)
    assert doc.one("ul", "flash").one("li").text == "gone <i>away</i>"
    assert "gone &lt;i&gt;away&lt;/i&gt;" in body and error_text(doc) == "404 - Queue not found"
    _, doc = page(client, "/q/nosuchqueue", 404)
    assert not doc.all("ul", "flash") and error_text(doc) == "404 - Queue not found"


@pytest.mark.parametrize("prefix", ["", "/therq"])
def test_error_pages_are_the_rendered_template(mgr_root: Path, prefix: str) -> None:
    """web.errors serves an HTML error page without a pending flash from a cut
    rendering: it is the same page as error.html rendered for that request."""
    from flask import render_template
    from rq.web import create_app, errors
    main = dataclasses.replace(load_main_config(str(mgr_root)), relative_root=prefix + "/")
    app = create_app(main=main)
    hostile = ['<script>alert("x")</script>', "a & b 'c' {{ 7*7 }} {% x %}", "\x00\u2028é",
               "\x00rq-error-text\x00", "\x00rq-error-now\x00", "Queue not found"]
    for code, text in [(404, t) for t in hostile] + [(400, "Bad"), (503, "Down"), (599, "x")]:
        heading = errors.HEADINGS.get(code, "Error")
        for _ in range(2):  # the page that fills the cache, then one from it
            with app.test_request_context("/q/x", base_url=f"http://localhost{prefix}/"):
                before = int(time.time())
                fast = errors.error_page(code, text, heading)
                after = int(time.time())
                full = render_template("error.html", code=code, text=text, heading=heading)
            now = int(re.search(r'data-now="(\d+)"', fast).group(1))
            assert before <= now <= after
            same = re.sub(r'data-now="\d+"', 'data-now=""', full)
            assert re.sub(r'data-now="\d+"', 'data-now=""', fast) == same, (code, text)
    assert f'href="{prefix}/static/rq.css"' in fast and f'data-root="{prefix}/"' in fast


def test_pages_under_a_relative_root(mgr_root: Path) -> None:
    from rq.web import create_app
    main = dataclasses.replace(load_main_config(str(mgr_root)), relative_root="/therq/")
    prefixed = create_app(main=main).test_client()
    _, doc = page(prefixed, "/therq/")
    assert doc.one("body").get("data-root") == "/therq/"
    row = doc.by_id("queue-list").one("tr", data_queue="test")
    assert row.one("td", "name").one("a").get("href") == "/therq/q/test"
    admin = row.one("form", data_suffix="adminoper")
    assert admin.get("action") == "/therq/q/test/adminoper"
    assert admin.form_fields() == {"back": "/therq/"}
    assert doc.by_id("new-queue").get("href") == "/therq/new_queue"
    assert [s.get("src") for s in doc.all("script") if s.get("src")][0] == "/therq/static/queue.js"
    _, doc = page(prefixed, "/therq/q/test/new_message")
    form = doc.by_id("new-message-form")
    assert form.get("action") == "/therq/q/test/new_message"
    assert form.form_fields()["mesg[dest]"] == "/therq/q/test"
    _, doc = page(prefixed, "/therq/q/test")
    assert doc.by_id("delete-queue").get("action") == "/therq/delete_queue"
    assert prefixed.get("/q/test").status_code == 404  # outside ROOT


def test_queue_that_is_not_running(client: Any, mgr_root: Path) -> None:
    qdir = make_queue(mgr_root, "broken", script=mgr_root.parent / "done.sh", num_workers=0)
    (qdir / "err" / "20200101.0000.00.000.7").mkdir()
    (qdir / "err" / "20200101.0000.00.000.7" / "msg").write_text(
        json.dumps({"msg_id": "20200101.0000.00.000.7", "dest": "broken"}))
    assert mgr(mgr_root, "reload") == ["ok"]
    wait_for(lambda: (mgr(mgr_root, "status")[1]["queues"].get("broken") or {}).get("state")
             == "FATAL", 30, 0.05, "queue broken to be FATAL")
    _, doc = page(client, "/")
    row = doc.by_id("queue-list").one("tr", data_queue="broken")
    assert row.one(data_k="status").text == "FATAL"
    assert row.one(data_k="ping").text == "–" and row.one(data_k="pid").text == "–"
    assert row.one(data_k="err").text == "1"
    _, doc = page(client, "/q/broken")
    assert doc.by_id("queue-status").text == "FATAL"
    assert doc.by_id("err-list").one("li").get("data-id") == "20200101.0000.00.000.7"


@pytest.mark.parametrize(("secs", "text"), [(None, "–"), (0, "0 s"), (59, "59 s"), (60, "1 min"),
                                            (125, "2 min 5 s"), (3600, "1 h"),
                                            (7384, "2 h 3 min"), (90000, "1 d 1 h")])
def test_duration_filter(secs: int | None, text: str) -> None:
    from rq.web.ui import duration
    assert duration(secs) == text


@pytest.mark.parametrize(("size", "text"), [(0, "0 B"), (1023, "1023 B"), (1536, "1.5 KiB"),
                                            (5 * 1024 ** 2, "5.0 MiB"), (None, "–")])
def test_bytes_filter(size: int | None, text: str) -> None:
    from rq.web.ui import human_bytes
    assert human_bytes(size) == text
