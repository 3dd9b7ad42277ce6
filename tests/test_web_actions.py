"""The POST routes of web.actions (SPEC S15 routes 3–5, 12–14, 19–22, 27) against a real
rq-mgr: flashes, redirects, JSON replies, error texts, uploads, DOWN queues."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient
from markupsafe import escape
from werkzeug.datastructures import MultiDict

from rq import client as rqclient
from rq.config import load_main_config
from rq.errors import ConnectError
from rqtest import job, make_queue, short_id, wait_for, write_driver
from webtest import pull_queue
from rq.web import create_app
from rq.web.forms import nested, parse_nested, split_name

DOWN = "503 - Service Unavailable - Operationally Down"
HOST = "http://localhost"


# ---------------------------------------------------------------- helpers


def qcall(root: Path, name: str, cmd: str, arg: Any = None) -> Any:
    return rqclient.call_queue(str(root), name, cmd, arg, timeout=10)


def answers(root: Path, name: str) -> bool:
    try:
        return qcall(root, name, "ping") == ["pong"]
    except ConnectError:
        return False


def wait_queue(root: Path, name: str) -> None:
    wait_for(lambda: answers(root, name), 30, what=f"queue {name} to answer")


def state_of(root: Path, name: str, full: str) -> str | None:
    reply = qcall(root, name, "get_message_state", {"msg_id": short_id(full)})
    return reply[1] if reply[0] == "ok" else None


def wait_state(root: Path, name: str, full: str, *states: str) -> str:
    return wait_for(lambda: state_of(root, name, full) if state_of(root, name, full) in states
                    else None, 20, what=f"{full} to reach {states}")


def message(root: Path, name: str, full: str) -> dict[str, Any]:
    reply = qcall(root, name, "get_message", {"msg_id": short_id(full)})
    assert reply[0] == "ok", reply
    return reply[1]


def pop_flashes(client: FlaskClient) -> list[str]:
    """The pending flashes (read from the session cookie), cleared."""
    with client.session_transaction() as session:
        return [text for _, text in session.pop("_flashes", [])]


def compact(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


def mgr_flash(form: Any, reply: Any) -> str:
    """Routes 3-5: fixed markup, with the form and the reply escaped (S14.9)."""
    return (f"We got <code>{escape(compact(form))}</code> from form, and "
            f"<code>{escape(compact(reply))}</code> from QueueMgr")


def create(client: FlaskClient, name: str = "test", **fields: Any) -> str:
    """A message created through route 12 (JSON body); its full id."""
    fields.setdefault("dest", name)
    resp = client.post(f"/q/{name}/new_message", json=fields)
    assert resp.status_code == 200, resp.data
    reply = resp.get_json()
    assert reply[0] == "ok", reply
    return reply[1]


def app_with(root: Path, **main: Any) -> Flask:
    config = dataclasses.replace(load_main_config(str(root)), **main)
    return create_app(main=config)


def is_error_page(resp: Any, code: int, text: str) -> bool:
    body = resp.get_data(as_text=True)
    return resp.status_code == code and f'<p class="error">{code} - {text}</p>' in body \
        and resp.mimetype == "text/html"


def is_json_fail(resp: Any, code: int, text: str) -> bool:
    return resp.status_code == code and resp.mimetype == "application/json" \
        and resp.get_json() == ["fail", text]


def multipart(parts: list[tuple[str, str | None, bytes]], boundary: str = "XyZzY") -> bytes:
    """A multipart/form-data body with the parts in the given order:
    (field name, file name or None for a plain field, content)."""
    out = b""
    for name, filename, content in parts:
        disposition = f'form-data; name="{name}"'
        if filename is not None:
            disposition += f'; filename="{filename}"'
        out += f"--{boundary}\r\nContent-Disposition: {disposition}\r\n".encode()
        if filename is not None:
            out += b"Content-Type: text/csv\r\n"
        out += b"\r\n" + content + b"\r\n"
    return out + f"--{boundary}--\r\n".encode()


def upload(client: FlaskClient, path: str, parts: list[tuple[str, str | None, bytes]],
           **kw: Any) -> Any:
    return client.post(path, data=multipart(parts),
                       content_type="multipart/form-data; boundary=XyZzY", **kw)


CSV = b'id,name,comment\n1,"Smith, John","said ""hi"""\n2,plain,"multi\nline"\r\n--XyZz\n'


# ---------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def mod_client(mgr_root: Path) -> FlaskClient:
    return create_app(str(mgr_root)).test_client()


@pytest.fixture(scope="module")
def slowq(mgr_root: Path, mod_client: FlaskClient) -> Iterator[str]:
    """Queue `slowq` (created through route 3) running the scriptable driver: a job
    waits for a file, so a test can hold a message in `run`.  Released at the end."""
    driver = write_driver(mgr_root.parent / "driver.py")
    resp = mod_client.post("/new_queue", data={
        "queue[name]": "slowq", "queue[script]": str(driver), "queue[exec_prefix]": "",
        "queue[num_workers]": "4", "x_format": "json"})
    assert resp.get_json() == ["success", "queue created - awesome"]
    wait_queue(mgr_root, "slowq")
    yield "slowq"
    for n in range(10):
        (mgr_root.parent / f"release{n}").touch()


@pytest.fixture(scope="module")
def adminq(mgr_root: Path, mod_client: FlaskClient) -> Iterator[str]:
    """Queue `adminq`: flags and restarts, so they never disturb `test`."""
    resp = mod_client.post("/new_queue", data={
        "queue[name]": "adminq", "queue[script]": str(mgr_root.parent / "done.sh"),
        "queue[exec_prefix]": "", "x_format": "json"})
    assert resp.get_json()[0] == "success"
    wait_queue(mgr_root, "adminq")
    yield "adminq"
    for flag in ("down", "pause"):
        (mgr_root / "config" / f"adminq.{flag}").unlink(missing_ok=True)


@pytest.fixture(scope="module")
def downq(mgr_root: Path, mod_client: FlaskClient) -> Iterator[str]:
    """Queue `downq`, DOWN through route 13, with one prep message kept from before."""
    resp = mod_client.post("/new_queue", data={
        "queue[name]": "downq", "queue[script]": str(mgr_root.parent / "done.sh"),
        "x_format": "json"})
    assert resp.get_json()[0] == "success"
    wait_queue(mgr_root, "downq")
    full = create(mod_client, "downq", _method="prep")
    resp = mod_client.post("/q/downq/adminoper", data={"down": "1", "x_format": "json"})
    assert resp.get_json() == ["ok", "downq"]
    yield short_id(full)
    mod_client.post("/q/downq/adminoper", data={"up": "1", "x_format": "json"})


@pytest.fixture
def held(mgr_root: Path, slowq: str, client: FlaskClient) -> Iterator[str]:
    """A message of `slowq` held in `run` until the test ends."""
    gate = mgr_root.parent / f"gate-{time.monotonic_ns()}"
    full = create(client, slowq, param1=job(["wait", str(gate)]))
    wait_state(mgr_root, slowq, full, "run")
    yield full
    gate.touch()


@pytest.fixture
def done_msg(mgr_root: Path, client: FlaskClient) -> str:
    full = create(client, "test", param1="finished")
    wait_state(mgr_root, "test", full, "done")
    return full


@pytest.fixture
def prep_msg(client: FlaskClient) -> str:
    return create(client, "test", _method="prep")


# ---------------------------------------------------------------- nested form names (S14.7)


@pytest.mark.parametrize("name, parts", [
    ("mesg", ["mesg"]),
    ("mesg[param1]", ["mesg", "param1"]),
    ("queue[coalesce_params][]", ["queue", "coalesce_params", ""]),
    ("a[b][c]", ["a", "b", "c"]),
    ("a]b[", ["a]b["]),
    ("a[b]c", ["a[b]c"]),
])
def test_split_name(name: str, parts: list[str]) -> None:
    assert split_name(name) == parts


def test_parse_nested_dicts_lists_and_conflicts() -> None:
    items = [("queue[name]", "q"), ("queue[coalesce_params][]", "1"),
             ("queue[coalesce_params][]", "3"), ("queue[env_vars][A]", "x"),
             ("rows[][k]", "1"), ("rows[][v]", "2"), ("rows[][k]", "3"),
             ("x[y]", "flat"), ("x[y][z]", "deep"), ("plain", "p"), ("plain", "p2")]
    assert parse_nested(items) == {
        "queue": {"name": "q", "coalesce_params": ["1", "3"], "env_vars": {"A": "x"}},
        "rows": [{"k": "1", "v": "2"}, {"k": "3"}],
        "x": {"y": {"z": "deep"}}, "plain": "p2"}


def test_nested_takes_only_the_bracketed_fields() -> None:
    values = MultiDict([("mesg", '{"dest":"x"}'), ("mesg[dest]", "test"),
                        ("mesg[param1]", "a b"), ("mesgx[dest]", "no"), ("x_format", "html")])
    assert nested(values, "mesg") == {"dest": "test", "param1": "a b"}
    assert nested(values, "queue") == {}
    assert nested(MultiDict([("mesg[]", "1")]), "mesg") == {}


# ---------------------------------------------------------------- route 3: POST /new_queue


def test_new_queue_creates_flashes_redirects_and_runs(mgr_root: Path, client: FlaskClient) -> None:
    resp = client.post("/new_queue", data=MultiDict([
        ("queue[name]", "webq1"), ("queue[script]", str(mgr_root.parent / "done.sh")),
        ("queue[num_workers]", "2"), ("queue[exec_prefix]", ""),
        ("queue[coalesce_params][]", "3"), ("queue[coalesce_params][]", "1"),
        ("queue[blocking_params][]", "2"), ("queue[timeout]", ""), ("queue[kill_grace]", "5"),
        ("queue[mode]", ""), ("queue[topic]", ""), ("queue[lease_timeout]", "")]))
    assert resp.status_code == 303
    assert resp.headers["Location"] == f"{HOST}/q/webq1"
    [text] = pop_flashes(client)
    assert text.startswith("We got <code>" + str(escape('{"name":"webq1","script":')))
    assert str(escape('"coalesce_params":["3","1"]')) in text and "timeout" not in text
    reply_part = mgr_flash({}, ["success", "queue created - awesome"]).split("</code>", 1)[1]
    assert text.endswith(reply_part)
    config = json.loads((mgr_root / "queue" / "webq1" / "config.json").read_text())
    assert config["coalesce_params"] == [1, 3] and config["blocking_params"] == [2]
    assert (config["num_workers"], config["timeout"], config["kill_grace"]) == (2, 0, 5)
    wait_queue(mgr_root, "webq1")
    wait_state(mgr_root, "webq1", create(client, "webq1"), "done")


def test_new_queue_refused_name_flash_is_escaped_and_shown_on_404(client: FlaskClient) -> None:
    resp = client.post("/new_queue", data={"queue[name]": "<b>x</b>", "queue[script]": "/bin/true"})
    assert resp.status_code == 303
    assert resp.headers["Location"] == f"{HOST}/q/%3Cb%3Ex%3C%2Fb%3E"
    page = client.get(resp.headers["Location"])
    body = page.get_data(as_text=True)
    assert page.status_code == 404
    assert "We got <code>{&#34;name&#34;:&#34;&lt;b&gt;x&lt;/b&gt;&#34;" in body
    assert "queue name has invalid characters" in body and "<b>x</b>" not in body


def test_new_queue_json_reply(client: FlaskClient) -> None:
    resp = client.post("/new_queue?x_format=json",
                       data={"queue[name]": "test", "queue[script]": "/bin/true"})
    assert resp.status_code == 200 and resp.get_json() == ["fail", "already created"]
    resp = client.post("/new_queue", data={"x_format": "json"})
    assert resp.get_json() == ["fail", "json config is missing name field"]
    assert pop_flashes(client) == []


@pytest.mark.parametrize("path", ["/new_queue", "/new_queue_link"])
def test_queue_creation_forbidden(mgr_root: Path, path: str) -> None:
    client = app_with(mgr_root, allow_new_queue=False).test_client()
    resp = client.post(path, data={"queue[name]": "nope", "queue[json_path]": "x.json"})
    assert is_error_page(resp, 403, "Queue creation not allowed at this time.")
    resp = client.post(path, data={"queue[name]": "nope", "x_format": "json"})
    assert is_json_fail(resp, 403, "Queue creation not allowed at this time.")
    assert not (mgr_root / "queue" / "nope").exists()


# ---------------------------------------------------------------- route 4: POST /new_queue_link


def test_new_queue_link_absolute_and_relative(mgr_root: Path, client: FlaskClient) -> None:
    script = str(mgr_root.parent / "done.sh")
    absolute = mgr_root.parent / "linkq.json"
    absolute.write_text(json.dumps({"name": "linkq", "script": script, "exec_prefix": ""}))
    resp = client.post("/new_queue_link", data={"queue[json_path]": str(absolute)})
    assert resp.status_code == 303 and resp.headers["Location"] == f"{HOST}/q/linkq"
    [text] = pop_flashes(client)
    assert text == mgr_flash({"json_path": str(absolute)}, ["success", "queue created - awesome"])
    assert (mgr_root / "queue" / "linkq" / "config.json").is_symlink()
    (mgr_root / "config" / "linkq2.json").write_text(json.dumps({"name": "linkq2",
                                                                  "script": script}))
    resp = client.post("/new_queue_link", data={"queue[json_path]": "config/linkq2.json",
                                                "x_format": "json"})
    assert resp.get_json() == ["success", "queue created - awesome"]
    wait_queue(mgr_root, "linkq")
    wait_state(mgr_root, "linkq", create(client, "linkq"), "done")


@pytest.mark.parametrize("content", [None, "not json {", "[1, 2]", "dir"])
def test_new_queue_link_unparsable(mgr_root: Path, client: FlaskClient,
                                   content: str | None) -> None:
    path = mgr_root.parent / f"bad-{content and len(content)}.json"
    if content == "dir":
        path.mkdir(exist_ok=True)
    elif content is not None:
        path.write_text(content)
    resp = client.post("/new_queue_link", data={"queue[json_path]": str(path)})
    assert is_error_page(resp, 404, f"Couldn&#39;t parse json file ({path}).")
    resp = client.post("/new_queue_link", data={"queue[json_path]": str(path),
                                                "x_format": "json"})
    assert is_json_fail(resp, 404, f"Couldn't parse json file ({path}).")


def test_new_queue_link_without_path(client: FlaskClient) -> None:
    resp = client.post("/new_queue_link", data={"x_format": "json"})
    assert is_json_fail(resp, 404, "Couldn't parse json file ().")


# ---------------------------------------------------------------- route 5: POST /delete_queue


def test_delete_queue(mgr_root: Path, client: FlaskClient) -> None:
    assert client.post("/new_queue", data={"queue[name]": "delq", "queue[script]": "/bin/true",
                                           "x_format": "json"}).get_json()[0] == "success"
    resp = client.post("/delete_queue", data={"queue_name": "delq"})
    assert resp.status_code == 303 and resp.headers["Location"] == f"{HOST}/"
    assert pop_flashes(client) == [mgr_flash({"queue_name": "delq"},
                                             ["ok", "started deleting queue"])]
    wait_for(lambda: not (mgr_root / "queue" / "delq").exists(), 30, what="delq to go")
    resp = client.post("/delete_queue", data={"queue_name": "delq", "x_format": "json"})
    assert resp.get_json() == ["fail", "no such queue"]
    client.post("/delete_queue", data={"queue_name": "<i>"})
    [text] = pop_flashes(client)
    assert text == mgr_flash({"queue_name": "<i>"}, ["fail", "no such queue"])
    assert "&lt;i&gt;" in text


# ---------------------------------------------------------------- routes 13, 14: admin


@pytest.mark.parametrize("op, done, flag, present", [
    ("pause", "paused", "pause", True), ("resume", "resumed", "pause", False),
    ("down", "downed", "down", True), ("up", "upped", "down", False)])
def test_adminoper(mgr_root: Path, client: FlaskClient, adminq: str, op: str, done: str,
                   flag: str, present: bool) -> None:
    resp = client.post(f"/q/{adminq}/adminoper", data={op: "whatever"})
    assert resp.status_code == 303 and resp.headers["Location"] == f"{HOST}/q/{adminq}"
    assert pop_flashes(client) == [f"Successfully {done} queue {adminq}"]
    assert (mgr_root / "config" / f"{adminq}.{flag}").exists() == present


def test_flash_shows_once_on_the_next_page(client: FlaskClient, adminq: str) -> None:
    resp = client.post(f"/q/{adminq}/adminoper", data={"resume": "1"}, follow_redirects=True)
    assert resp.status_code == 200 and resp.request.path == f"/q/{adminq}"
    assert f"Successfully resumed queue {adminq}" in resp.get_data(as_text=True)
    assert "Successfully resumed" not in client.get(f"/q/{adminq}").get_data(as_text=True)
    resp = client.post("/q/test/new_message", data={
        "x_format": "html", "back": "/q/test", "mesg[dest]": "test"}, follow_redirects=True)
    assert "Created message http://" in resp.get_data(as_text=True)


def test_adminoper_first_op_wins_and_json(mgr_root: Path, client: FlaskClient,
                                          adminq: str) -> None:
    resp = client.post(f"/q/{adminq}/adminoper?down=1", data={"up": "", "resume": "",
                                                             "x_format": "json"})
    assert resp.status_code == 200 and resp.get_json() == ["ok", adminq]
    assert not (mgr_root / "config" / f"{adminq}.down").exists()  # resume came first
    assert pop_flashes(client) == []


@pytest.mark.parametrize("back, location", [
    ("/", f"{HOST}/"), ("/q/test?x=1", f"{HOST}/q/test?x=1"),
    ("//evil.example/x", f"{HOST}/q/adminq"), ("http://evil.example/", f"{HOST}/q/adminq"),
    ("/\\evil.example", f"{HOST}/q/adminq"), ("q/test", f"{HOST}/q/adminq"),
    ("/x\r\nSet-Cookie: a=b", f"{HOST}/q/adminq"), ("", f"{HOST}/q/adminq")])
def test_admin_back_parameter(client: FlaskClient, adminq: str, back: str,
                              location: str) -> None:
    for path, op in ((f"/q/{adminq}/adminoper", {"resume": "1"}), (f"/q/{adminq}/restart", {})):
        resp = client.post(path, data={**op, "back": back})
        assert resp.status_code == 303 and resp.headers["Location"] == location
    wait_queue(Path(client.application.config["RQ_MAIN"].root), adminq)


def test_admin_errors(client: FlaskClient, adminq: str) -> None:
    resp = client.post(f"/q/{adminq}/adminoper", data={"back": "/"})
    assert is_error_page(resp, 400, "Invalid admin operation")
    for name in ("nosuch", "a.b", "x%20y", "%3Cb%3E"):
        for route in ("adminoper", "restart"):
            resp = client.post(f"/q/{name}/{route}", data={"pause": "1"})
            assert is_error_page(resp, 404, "Queue not found"), (name, route)
            resp = client.post(f"/q/{name}/{route}", data={"pause": "1", "x_format": "json"})
            assert is_json_fail(resp, 404, "Queue not found")


def fake_mgr(monkeypatch: pytest.MonkeyPatch, app: Flask, reply: Any) -> None:
    """The manager answers `reply` to everything but ping."""
    backend = app.config["RQ_BACKEND"]
    real = backend.mgr
    monkeypatch.setattr(backend, "mgr", lambda cmd, arg=None, **kw:
                        real(cmd, arg, **kw) if cmd == "ping" else reply)


@pytest.mark.parametrize("op", ["pause", "resume", "down", "up"])
def test_adminoper_manager_failure(monkeypatch: pytest.MonkeyPatch, app: Flask,
                                   client: FlaskClient, adminq: str, op: str) -> None:
    fake_mgr(monkeypatch, app, ["fail", f"not allowed to {op}"])
    resp = client.post(f"/q/{adminq}/adminoper", data={op: "1"})
    assert is_error_page(resp, 500, f"Couldn&#39;t {op} queue. "
                                    f"[&#34;fail&#34;,&#34;not allowed to {op}&#34;].")
    resp = client.post(f"/q/{adminq}/adminoper", data={op: "1", "x_format": "json"})
    assert resp.get_json() == ["fail", f"not allowed to {op}"]


def test_manager_gone_mid_request(monkeypatch: pytest.MonkeyPatch, app: Flask,
                                  client: FlaskClient, adminq: str) -> None:
    fake_mgr(monkeypatch, app, None)
    resp = client.post(f"/q/{adminq}/restart", data={"x_format": "json"})
    assert is_json_fail(resp, 503, "QueueMgr not running")
    resp = client.post("/delete_queue", data={"queue_name": "x"})
    assert is_error_page(resp, 503, "QueueMgr not running")


def test_restart(mgr_root: Path, monkeypatch: pytest.MonkeyPatch, app: Flask,
                 client: FlaskClient, adminq: str) -> None:
    resp = client.post(f"/q/{adminq}/restart")
    assert resp.status_code == 303 and resp.headers["Location"] == f"{HOST}/q/{adminq}"
    assert pop_flashes(client) == [f"Successfully restarted queue {adminq}"]
    resp = client.post(f"/q/{adminq}/restart", data={"x_format": "json"})
    assert resp.get_json() == ["ok", adminq]
    wait_queue(mgr_root, adminq)
    fake_mgr(monkeypatch, app, ["fail", "invalid queue name"])
    resp = client.post(f"/q/{adminq}/restart")
    assert is_error_page(resp, 500, "Couldn&#39;t restart queue. "
                                    "[&#34;fail&#34;,&#34;invalid queue name&#34;].")


def test_relative_root_in_location(mgr_root: Path, adminq: str) -> None:
    client = app_with(mgr_root, relative_root="/therq/").test_client()
    resp = client.post(f"/therq/q/{adminq}/adminoper", data={"resume": "1"})
    assert resp.status_code == 303
    assert resp.headers["Location"] == f"{HOST}/therq/q/{adminq}"
    resp = client.post("/therq/delete_queue", data={"queue_name": "nosuch"})
    assert resp.headers["Location"] == f"{HOST}/therq/"
    resp = client.post(f"/therq/q/{adminq}/adminoper", data={"resume": "1",
                                                             "back": "/therq/q/test"})
    assert resp.headers["Location"] == f"{HOST}/therq/q/test"


# ---------------------------------------------------------------- route 12: new_message


def test_new_message_json_body_runs_to_done(mgr_root: Path, client: FlaskClient) -> None:
    port = load_main_config(str(mgr_root)).port
    full = create(client, "test", param1="one", src="web-test")
    assert full.startswith(f"http://127.0.0.1:{port}/q/test/")
    wait_state(mgr_root, "test", full, "done")
    msg = message(mgr_root, "test", full)
    assert msg["status"] == "done - ok" and msg["param1"] == "one"
    log = (mgr_root / msg["path"] / "job" / "stdio.log").read_text()
    assert f"hello from {short_id(full)}" in log


@pytest.mark.parametrize("data", [
    {"mesg": json.dumps({"dest": "test", "param2": 5})},
    {"mesg": json.dumps({"dest": "test", "param2": 5}), "x_format": "json"},
    {"mesg[dest]": "test", "mesg[param2]": "5", "x_format": "json"},
])
def test_new_message_json_forms(mgr_root: Path, client: FlaskClient,
                                data: dict[str, str]) -> None:
    resp = client.post("/q/test/new_message", data=data)
    assert resp.status_code == 200 and resp.mimetype == "application/json"
    ok, full = resp.get_json()
    assert ok == "ok"
    wait_state(mgr_root, "test", full, "done")
    assert message(mgr_root, "test", full)["param2"] == "5"


def test_new_message_multipart_field_of_over_a_mib(mgr_root: Path, client: FlaskClient) -> None:
    """S4.4's 1 MiB message through a multipart form; to a pull-mode queue, since a
    script-mode one refuses a param no job's environment can hold (issue 13, D10)."""
    pull_queue(mgr_root, "bigpull")
    big = "x" * (1024 * 1024 + 10)
    body = multipart([("mesg", None, json.dumps({"dest": "bigpull", "param3": big,
                                                 "_method": "prep"}).encode())])
    resp = client.post("/q/bigpull/new_message", data=body,
                       content_type="multipart/form-data; boundary=XyZzY")
    ok, full = resp.get_json()
    assert ok == "ok" and message(mgr_root, "bigpull", full)["param3"] == big


def test_new_message_html_form_with_back(mgr_root: Path, client: FlaskClient) -> None:
    resp = client.post("/q/test/new_message", data={
        "x_format": "html", "back": "/q/test", "mesg[dest]": "test", "mesg[src]": "form",
        "mesg[param1]": "p1", "mesg[param4]": "p4", "mesg[_method]": "prep",
        "mesg[status]": "ignored", "mesg[post_run_webhook]": " http://a/x  http://b/y "})
    assert resp.status_code == 303 and resp.headers["Location"] == f"{HOST}/q/test"
    [text] = pop_flashes(client)
    assert text.startswith("Created message http://")
    msg = message(mgr_root, "test", text.split()[-1])
    assert msg["state"] == "prep" and (msg["src"], msg["param1"], msg["param4"]) == \
        ("form", "p1", "p4")
    assert msg["post_run_webhook"] == ["http://a/x", "http://b/y"]
    resp = client.post("/q/test/new_message", data={
        "x_format": "html", "back": "/q/test", "mesg[src]": "no dest"})
    assert resp.status_code == 303
    assert pop_flashes(client) == ['Error creating message: input missing required "dest" '
                                   'parameter']


@pytest.mark.parametrize("back", [None, "//evil.example/", "https://evil.example/"])
def test_new_message_html_form_without_back_shows_reply(mgr_root: Path, client: FlaskClient,
                                                        back: str | None) -> None:
    data = {"x_format": "html", "mesg[dest]": "test", "mesg[param1]": "<i>x</i>"}
    if back is not None:
        data["back"] = back
    resp = client.post("/q/test/new_message", data=data)
    body = resp.get_data(as_text=True)
    assert resp.status_code == 200 and resp.mimetype == "text/html"
    full = body.split('">http://', 1)[1].split("<", 1)[0]
    assert f'<a href="{HOST}/q/test/{short_id(full)}">' in body
    wait_state(mgr_root, "test", "http://" + full, "done")
    resp = client.post("/q/test/new_message", data={"x_format": "html", "mesg[src]": "<b>"})
    body = resp.get_data(as_text=True)
    assert resp.status_code == 200
    assert "Error creating message: input missing required &#34;dest&#34; parameter" in body
    assert pop_flashes(client) == []


@pytest.mark.parametrize("method, state", [("prep", "prep"), ("commit", None),
                                           ("single_que", None)])
def test_new_message_methods(mgr_root: Path, client: FlaskClient, method: str,
                             state: str | None) -> None:
    full = create(client, "test", _method=method)
    if state is not None:
        assert state_of(mgr_root, "test", full) == state
    else:
        wait_state(mgr_root, "test", full, "done")


@pytest.mark.parametrize("kwargs, as_json", [
    ({"json": {"dest": "test", "_method": "bogus"}}, True),
    ({"json": {"dest": "test", "_method": ["commit"]}}, True),
    ({"data": {"mesg": '{"dest":"test","_method":""}'}}, True),
    ({"data": {"mesg[dest]": "test", "mesg[_method]": "nope", "x_format": "html"}}, False)])
def test_new_message_invalid_method(client: FlaskClient, kwargs: dict[str, Any],
                                    as_json: bool) -> None:
    resp = client.post("/q/test/new_message", **kwargs)
    if as_json:
        assert is_json_fail(resp, 400, "Invalid method param")
    else:
        assert is_error_page(resp, 400, "Invalid method param")


@pytest.mark.parametrize("kwargs", [
    {"data": "{", "content_type": "application/json"},
    {"data": "[1, 2]", "content_type": "application/json"},
    {"data": '{"dest": NaN}', "content_type": "application/json"},
    {"data": b'{"dest": "\xff"}', "content_type": "application/json"},
    {"data": "[" * 100000, "content_type": "application/json"},
    {"data": {"mesg": "{not json"}},
    {"data": {"mesg": '"a string"', "x_format": "json"}},
    {"data": {"x_format": "json"}},
    {"data": {}}])
def test_new_message_invalid_json(client: FlaskClient, kwargs: dict[str, Any]) -> None:
    resp = client.post("/q/test/new_message", **kwargs)
    assert is_json_fail(resp, 400, "Invalid JSON")


def test_new_message_unknown_queue(client: FlaskClient) -> None:
    resp = client.post("/q/nosuch/new_message", json={"dest": "x"})
    assert is_json_fail(resp, 404, "Queue not found")
    resp = client.post("/q/no.such/new_message", data={"mesg": '{"dest":"x"}'})
    assert is_json_fail(resp, 404, "Queue not found")
    resp = client.post("/q/nosuch/new_message", data={"x_format": "html", "mesg[dest]": "x"})
    assert is_error_page(resp, 404, "Queue not found")


# ---------------------------------------------------------------- routes 19, 20: clone, run_now


def test_clone(mgr_root: Path, client: FlaskClient, done_msg: str) -> None:
    msg_id = short_id(done_msg)
    resp = client.post(f"/q/test/{msg_id}/clone")
    assert resp.status_code == 303 and resp.headers["Location"] == f"{HOST}/q/test"
    assert pop_flashes(client) == ["Message cloned successfully"]
    resp = client.post(f"/q/test/{msg_id}/clone", data={"x_format": "json"})
    ok, new = resp.get_json()
    assert ok == "ok" and new != done_msg
    wait_state(mgr_root, "test", new, "done")
    assert message(mgr_root, "test", new)["cloned_from"] == msg_id


def test_clone_failures(client: FlaskClient, prep_msg: str) -> None:
    resp = client.post(f"/q/test/{short_id(prep_msg)}/clone")
    assert is_error_page(resp, 500, "Couldn&#39;t clone message. [&#34;fail&#34;,"
                                    "&#34;cannot clone message in prep state&#34;].")
    resp = client.post("/q/test/20000101.0000.00.000.1/clone")
    assert is_error_page(resp, 500, "Couldn&#39;t clone message. "
                                    "[&#34;fail&#34;,&#34;msg not found&#34;].")
    resp = client.post("/q/test/20000101.0000.00.000.1/clone", data={"x_format": "json"})
    assert resp.status_code == 200 and resp.get_json() == ["fail", "msg not found"]


def test_run_now(mgr_root: Path, client: FlaskClient) -> None:
    for form in ({}, {"_method": "run_now"}):
        full = create(client, "test", due=time.time() + 3600)
        assert state_of(mgr_root, "test", full) == "que"
        path = f"/q/test/{short_id(full)}" + ("" if form else "/run_now")
        resp = client.post(path, data=form)
        assert resp.status_code == 303
        assert resp.headers["Location"] == f"{HOST}/q/test/{short_id(full)}"
        assert pop_flashes(client) == ["Message in run successfully"]
        wait_state(mgr_root, "test", full, "done")


def test_run_now_failures(client: FlaskClient, done_msg: str) -> None:
    for path, form in (("/run_now", {}), ("", {"_method": "run_now"})):
        url = f"/q/test/{short_id(done_msg)}{path}"
        resp = client.post(url, data=form)
        assert is_error_page(resp, 500, "Couldn&#39;t run message. "
                                        "[&#34;fail&#34;,&#34;msg not in runnable state&#34;].")
        resp = client.post(url, data={**form, "x_format": "json"})
        assert resp.get_json() == ["fail", "msg not in runnable state"]


@pytest.mark.parametrize("suffix, form", [
    ("/clone", {}), ("/run_now", {}), ("", {"_method": "delete"}),
    ("/attach/x.csv", {"_method": "delete"}), ("/attach/new", {})])
def test_message_routes_404(client: FlaskClient, suffix: str, form: dict[str, str]) -> None:
    for name, msg_id, text in (("nosuch", "20000101.0000.00.000.1", "Queue not found"),
                               ("a.b", "20000101.0000.00.000.1", "Queue not found"),
                               ("test", "abc", "Message ID not found"),
                               ("test", "20000101.0000.00.000.1x", "Message ID not found")):
        resp = client.post(f"/q/{name}/{msg_id}{suffix}", data=form)
        assert is_error_page(resp, 404, text), (name, msg_id, suffix)
        resp = client.post(f"/q/{name}/{msg_id}{suffix}", data={**form, "x_format": "json"})
        assert is_json_fail(resp, 404, text)


# ---------------------------------------------------------------- route 27: POST /q/NAME/ID


def test_delete_commit_destroy_ok(mgr_root: Path, client: FlaskClient, slowq: str,
                                  held: str) -> None:
    prep = short_id(create(client, "test", _method="prep"))
    resp = client.post(f"/q/test/{prep}", data={"_method": "commit", "msg_id": "ignored"})
    assert resp.status_code == 303 and resp.headers["Location"] == f"{HOST}/q/test/{prep}"
    assert pop_flashes(client) == ["Message committed successfully"]
    wait_state(mgr_root, "test", prep, "done")
    resp = client.post(f"/q/test/{prep}", data={"_method": "delete"})
    assert resp.status_code == 303 and resp.headers["Location"] == f"{HOST}/q/test"
    assert pop_flashes(client) == ["Message deleted successfully"]
    assert state_of(mgr_root, "test", prep) is None
    resp = client.post(f"/q/{slowq}/{short_id(held)}", data={"_method": "destroy"})
    assert resp.status_code == 303 and resp.headers["Location"] == f"{HOST}/q/{slowq}"
    assert pop_flashes(client) == ["Message destroyed successfully"]
    wait_state(mgr_root, slowq, held, "err", "done")


def test_delete_commit_destroy_failures(client: FlaskClient, slowq: str, held: str,
                                        done_msg: str) -> None:
    missing = "20000101.0000.00.000.1"
    cases = [(f"/q/{slowq}/{short_id(held)}", "delete",
              'Delete got ["fail","cannot delete message in run state"]'),
             (f"/q/test/{missing}", "delete", 'Delete got ["fail","msg not found"]'),
             (f"/q/test/{short_id(done_msg)}", "destroy", 'destroy got ["fail","msg not running"]'),
             (f"/q/test/{missing}", "commit", 'Commit got ["fail","cannot find message"]')]
    for path, method, text in cases:
        resp = client.post(path, data={"_method": method})
        assert resp.status_code == 303 and resp.headers["Location"] == f"{HOST}{path}"
        assert pop_flashes(client) == [text]


def test_message_action_json_and_bad_method(client: FlaskClient, done_msg: str) -> None:
    path = f"/q/test/{short_id(done_msg)}"
    resp = client.post(path, data={"_method": "commit", "x_format": "json"})
    assert resp.get_json() == ["ok", "msg already committed"]
    resp = client.post(path, data={"_method": "destroy", "x_format": "json"})
    assert resp.get_json() == ["fail", "msg not running"]
    resp = client.post(path, data={"_method": "delete", "x_format": "json"})
    assert resp.get_json() == ["ok", "msg deleted"]
    for form in ({"_method": "explode"}, {}):
        assert is_error_page(client.post(path, data=form), 400, "Invalid method param")
        resp = client.post(path, data={**form, "x_format": "json"})
        assert is_json_fail(resp, 400, "Invalid method param")
    assert pop_flashes(client) == []


# ---------------------------------------------------------------- routes 21, 22: attachments


@pytest.fixture
def spool_app(mgr_root: Path, tmp_path: Path) -> Flask:
    """An app whose main config has a tmpdir; attach_message calls are recorded with
    whether the upload file existed there at that moment."""
    app = app_with(mgr_root, tmpdir=str(tmp_path))
    backend = app.config["RQ_BACKEND"]
    real = backend.queue
    app.config["SEEN"] = seen = []

    def queue(name: str, cmd: str, arg: Any = None, **kw: Any) -> Any:
        if cmd == "attach_message":
            path = arg["pathname"]
            seen.append((os.path.dirname(path), Path(path).read_bytes()))
        return real(name, cmd, arg, **kw)
    backend.queue = queue
    return app


ORDERS = {
    "file-first": lambda msg: [("filedata", "data.csv", CSV), ("msg_id", None, b"x"),
                               ("x_format", None, b"json")],
    "file-last": lambda msg: [("x_format", None, b"json"), ("msg_id", None, msg.encode()),
                              ("filedata", "data.csv", CSV)],
    "file-middle": lambda msg: [("x_format", None, b"json"), ("filedata", "data.csv", CSV),
                                ("msg_id", None, b"20000101.0000.00.000.1")],
}


@pytest.mark.parametrize("order", sorted(ORDERS))
def test_attach_parts_in_any_order(mgr_root: Path, spool_app: Flask, tmp_path: Path,
                                   order: str) -> None:
    client = spool_app.test_client()
    full = create(client, "test", _method="prep")
    resp = upload(client, f"/q/test/{short_id(full)}/attach/new", ORDERS[order](short_id(full)))
    md5 = hashlib.md5(CSV).hexdigest()
    assert resp.status_code == 200 and resp.get_json() == ["ok", f"{md5}-Attached successfully"]
    assert spool_app.config["SEEN"] == [(str(tmp_path), CSV)]
    assert list(tmp_path.iterdir()) == []  # the spooled upload is gone
    attachment = message(mgr_root, "test", full)["_attachments"]["data.csv"]
    assert attachment["md5"] == md5 and Path(attachment["path"]).read_bytes() == CSV


def test_attach_html_then_commit_and_run(mgr_root: Path, spool_app: Flask,
                                         tmp_path: Path) -> None:
    client = spool_app.test_client()
    msg_id = short_id(create(client, "test", _method="prep"))
    big = os.urandom(3 * 1024 * 1024)
    resp = upload(client, f"/q/test/{msg_id}/attach/new",
                  [("filedata", "some/dir/blob.bin", big)],
                  environ_overrides={"SERVER_PROTOCOL": "HTTP/1.0"})
    assert resp.status_code == 303 and resp.headers["Location"] == f"{HOST}/q/test/{msg_id}"
    assert pop_flashes(client) == ["Attached message successfully"]
    assert list(tmp_path.iterdir()) == []
    msg = message(mgr_root, "test", msg_id)
    assert msg["_attachments"]["blob.bin"]["size"] == len(big)
    client.post(f"/q/test/{msg_id}", data={"_method": "commit"})
    wait_state(mgr_root, "test", msg_id, "done")


@pytest.mark.parametrize("filename, reason", [
    (".hidden", "Attachment name as a dot-file not allowed: .hidden"),
    ("a|b.txt", "Attachment name has invalid character. not allowed: a|b.txt"),
    ("x/..", "Attachment name as a dot-file not allowed: .."),
])
def test_attach_refused_names(spool_app: Flask, tmp_path: Path, filename: str,
                              reason: str) -> None:
    client = spool_app.test_client()
    msg_id = short_id(create(client, "test", _method="prep"))
    resp = upload(client, f"/q/test/{msg_id}/attach/new",
                  [("filedata", filename, b"data"), ("x_format", None, b"json")])
    assert resp.status_code == 200 and resp.get_json() == ["fail", reason]
    resp = upload(client, f"/q/test/{msg_id}/attach/new", [("filedata", filename, b"data")])
    assert resp.status_code == 200 and resp.mimetype == "text/plain"
    assert resp.get_data(as_text=True) == f'Commit test/{msg_id} got ["fail","{reason}"]'
    assert list(tmp_path.iterdir()) == []


def test_attach_not_in_prep(spool_app: Flask, done_msg: str) -> None:
    client = spool_app.test_client()
    msg_id = short_id(done_msg)
    resp = upload(client, f"/q/test/{msg_id}/attach/new", [("filedata", "f.txt", b"x")])
    assert resp.get_data(as_text=True) == f'Commit test/{msg_id} got ["fail","msg not in prep"]'
    assert pop_flashes(client) == []


@pytest.mark.parametrize("parts, text", [
    ([("other", None, b"1")], "Missing required param filedata"),
    ([("filedata", None, b"just text")], "Wrong input type for filedata param"),
    ([("filedata", "", b"data")], "Missing filename of uploaded file in filedata param"),
    ([("filedata", "dir/", b"data")], "Missing filename of uploaded file in filedata param"),
])
def test_attach_param_errors(spool_app: Flask, tmp_path: Path, prep_msg: str,
                             parts: list[tuple[str, str | None, bytes]], text: str) -> None:
    client = spool_app.test_client()
    path = f"/q/test/{short_id(prep_msg)}/attach/new"
    assert is_error_page(upload(client, path, parts), 404, text)
    resp = upload(client, path, [*parts, ("x_format", None, b"json")])
    assert is_json_fail(resp, 404, text)
    assert list(tmp_path.iterdir()) == [] and spool_app.config["SEEN"] == []


def test_attach_plain_form_without_upload(client: FlaskClient, prep_msg: str) -> None:
    resp = client.post(f"/q/test/{short_id(prep_msg)}/attach/new", data={"x_format": "json"})
    assert is_json_fail(resp, 404, "Missing required param filedata")


def test_delete_attachment(mgr_root: Path, client: FlaskClient, prep_msg: str) -> None:
    msg_id = short_id(prep_msg)
    for name in ("a.csv", "b.csv"):
        upload(client, f"/q/test/{msg_id}/attach/new", [("filedata", name, CSV)])
    resp = client.post(f"/q/test/{msg_id}/attach/a.csv", data={"_method": "delete"})
    assert resp.status_code == 303 and resp.headers["Location"] == f"{HOST}/q/test/{msg_id}"
    assert pop_flashes(client) == ["Attached message successfully"] * 2 + \
        ["Attachment deleted successfully"]
    resp = client.post(f"/q/test/{msg_id}/attach/b.csv",
                       data={"_method": "delete", "x_format": "json"})
    assert resp.get_json() == ["ok", "Attachment deleted successfully"]
    assert "_attachments" not in message(mgr_root, "test", msg_id)
    resp = client.post(f"/q/test/{msg_id}/attach/b.csv", data={"_method": "delete"})
    assert resp.status_code == 200 and resp.mimetype == "text/plain"
    assert resp.get_data(as_text=True) == (f"Delete of attach b.csv on test/{msg_id} got "
                                           '["fail","No attachment with that name for msg"]')


def test_delete_attachment_errors(client: FlaskClient, prep_msg: str) -> None:
    path = f"/q/test/{short_id(prep_msg)}/attach"
    for form in ({"_method": "put"}, {}):
        assert is_error_page(client.post(f"{path}/a.csv", data=form), 400,
                             "Invalid method param")
    resp = client.post(f"{path}/.hidden", data={"_method": "delete", "x_format": "json"})
    assert is_json_fail(resp, 404, "Message ID attachment '.hidden' not found")


# ---------------------------------------------------------------- DOWN and dead queues


def down_requests(msg_id: str) -> list[tuple[str, dict[str, Any], bool]]:
    base = f"/q/downq/{msg_id}"
    return [
        ("/q/downq/new_message", {"json": {"dest": "downq"}}, True),
        ("/q/downq/new_message", {"data": {"mesg": '{"dest":"downq"}'}}, True),
        ("/q/downq/new_message", {"data": {"x_format": "html", "mesg[dest]": "downq",
                                           "back": "/q/downq"}}, False),
        (f"{base}/clone", {}, False), (f"{base}/clone", {"data": {"x_format": "json"}}, True),
        (f"{base}/run_now", {}, False),
        (f"{base}/attach/new", {"data": multipart([("filedata", "f.txt", b"x")]),
                                "content_type": "multipart/form-data; boundary=XyZzY"}, False),
        (f"{base}/attach/f.csv", {"data": {"_method": "delete"}}, False),
        (base, {"data": {"_method": "commit"}}, False),
        (base, {"data": {"_method": "delete", "x_format": "json"}}, True),
        (base, {"data": {"_method": "destroy"}}, False),
        (base, {"data": {"_method": "run_now"}}, False)]


def test_down_queue_answers_503(mgr_root: Path, client: FlaskClient, downq: str) -> None:
    for path, kwargs, as_json in down_requests(downq):
        resp = client.post(path, **kwargs)
        if as_json:
            assert is_json_fail(resp, 503, DOWN[6:]), path
        else:
            assert is_error_page(resp, 503, DOWN[6:]), path
    assert pop_flashes(client) == []
    assert (mgr_root / "queue" / "downq" / "prep" / downq).is_dir()  # untouched
    # admin routes still work on a DOWN queue
    resp = client.post("/q/downq/adminoper", data={"pause": "1", "x_format": "json"})
    assert resp.get_json() == ["ok", "downq"]


def test_queue_not_running(mgr_root: Path, client: FlaskClient) -> None:
    make_queue(mgr_root, "deadq")  # no script: never starts, so nothing answers
    for path, data in (("/q/deadq/20000101.0000.00.000.1/clone", {"x_format": "json"}),
                       ("/q/deadq/new_message", {"mesg": '{"dest":"deadq"}'})):
        assert is_json_fail(client.post(path, data=data), 503, "Queue not running")
    resp = client.post("/q/deadq/20000101.0000.00.000.1", data={"_method": "delete"})
    assert is_error_page(resp, 503, "Queue not running")


def test_session_serializer_is_built_once_and_still_verifies(client: FlaskClient,
                                                            adminq: str) -> None:
    """web.FrozenKeySessionInterface: one signing serializer per secret key
    (config frozen), flashes still round-trip, a tampered cookie is ignored."""
    app = client.application
    first = app.session_interface.get_signing_serializer(app)
    assert app.session_interface.get_signing_serializer(app) is first
    client.post(f"/q/{adminq}/adminoper", data={"resume": "1"})
    cookie = client.get_cookie("rq_session")
    assert cookie is not None and cookie.value
    tampered = cookie.value[:-2] + ("AA" if cookie.value[-2:] != "AA" else "BB")
    client.set_cookie("rq_session", tampered)
    assert f"Successfully resumed queue {adminq}" not in client.get(f"/q/{adminq}").get_data(
        as_text=True)
    assert app.session_interface.get_signing_serializer(app) is first
