"""The relay builtin queue script (SPEC S12.1).

First the pure protocol decisions (steps 1-8, the prep message, what each reply means), table
driven; then two real RQ roots on loopback (two rq-mgr instances on different ports): the
`local` root's `relay` queue relays to the `remote` root's `test` queue over HTTP.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rq import client
from rq.builtin import jobio
from rq.builtin import relay as R
from rqtest import short_id, wait_for
from webtest import EnvMgr, Mgr, build_root, install_builtin

REMOTE = "http://127.0.0.1:9/q/test"
FULL = "http://127.0.0.1:9/q/test/20240101.0000.00.000.7"
LOG_LINE = re.compile(r"^(\d+) - \d{4}-\d\d-\d\d \d\d:\d\d:\d\d [+-]\d{4} - (.*)$")


# ================================================================ pure decisions


def test_s12_1_loop_check_ignores_credentials_in_dest() -> None:
    assert R.is_loop(REMOTE + "/20240101.0000.00.000.1", "http://u:p@127.0.0.1:9/q/test")
    assert not R.is_loop(REMOTE + "x/20240101.0000.00.000.1", "http://u:p@127.0.0.1:9/q/test")


@pytest.mark.parametrize("count,orig,has_id,step,lines", [
    (16, "x", False, R.Step.FAIL, ("run RQ_COUNT > 15 - failing", "fail RQ_COUNT > 15 FAIL")),
    (15, "x", False, R.Step.PREP, ()),
    (0, REMOTE + "/20240101.0000.00.000.1", False, R.Step.FAIL,
     ("fail Relay loop detected: RQ_DEST queue same as RQ_ORIG_MSG_ID",)),
    (0, REMOTE + "_other/20240101.0000.00.000.1", False, R.Step.PREP, ()),
    (0, "http://127.0.0.1:9/q/other/1", True, R.Step.CHECK, ()),
])
def test_s12_1_steps_1_2_start(count: int, orig: str, has_id: bool, step: R.Step,
                               lines: tuple[str, ...]) -> None:
    decision = R.start(count, orig, REMOTE + "/", has_id)
    assert decision.step is step and decision.lines == lines


@pytest.mark.parametrize("code,body,step,forget", [
    (200, b'["prep"]', R.Step.ATTACH, False),
    (200, b'["que"]', R.Step.RELAYED, False),
    (200, b'["done"]', R.Step.RELAYED, False),
    (200, b'["err"]', R.Step.RELAYED, False),
    (404, b'["fail","Message ID not found"]', R.Step.PREP, True),
    (404, b"<html>", R.Step.PREP, True),
    (503, b'["fail","QueueMgr not running"]', R.Step.RESEND, False),
    (200, b"not json", R.Step.RESEND, False),
    (200, b'["prep","x"]', R.Step.RESEND, False),
])
def test_s12_1_step_4_state_check(code: int, body: bytes, step: R.Step, forget: bool) -> None:
    decision = R.after_state(code, body)
    assert (decision.step, decision.forget) == (step, forget)


@pytest.mark.parametrize("code,body,step,relay_id", [
    (200, json.dumps(["ok", FULL]).encode(), R.Step.ATTACH, FULL),
    (200, b'["ok","not a full id"]', R.Step.RESEND, None),
    (200, b'["fail","input missing required \\"dest\\" parameter"]', R.Step.RESEND, None),
    (503, b'["fail","Service Unavailable - Operationally Down"]', R.Step.RESEND, None),
    (401, b"", R.Step.RESEND, None),
])
def test_s12_1_step_5_prep_reply(code: int, body: bytes, step: R.Step,
                                 relay_id: str | None) -> None:
    decision = R.after_prep(code, body)
    assert (decision.step, decision.relay_id) == (step, relay_id)


MD5 = "0123456789abcdef0123456789abcdef"


@pytest.mark.parametrize("code,body,step,forget", [
    (200, json.dumps(["ok", f"{MD5}-Attached successfully"]).encode(), R.Step.ATTACH, False),
    (200, b'["ok","ffffffffffffffffffffffffffffffff-Attached successfully"]',
     R.Step.RESEND, False),
    (200, b'["fail","cannot find message"]', R.Step.RESEND, True),
    (200, b'["fail","msg not in prep"]', R.Step.RESEND, False),
    (500, b"", R.Step.RESEND, False),
])
def test_s12_1_step_6_attach_reply(code: int, body: bytes, step: R.Step, forget: bool) -> None:
    decision = R.after_attach("a.bin", MD5, code, body)
    assert (decision.step, decision.forget) == (step, forget)


@pytest.mark.parametrize("code,body,step,forget", [
    (200, b'["ok","msg commited"]', R.Step.RELAYED, False),
    (200, b'["ok","msg already committed"]', R.Step.RELAYED, False),
    (200, b'["fail","cannot find message"]', R.Step.RESEND, True),
    (503, b"busy", R.Step.RESEND, False),
    (200, b"[]", R.Step.RESEND, False),
])
def test_s12_1_step_7_commit_reply(code: int, body: bytes, step: R.Step, forget: bool) -> None:
    decision = R.after_commit(code, body)
    assert (decision.step, decision.forget) == (step, forget)


def test_s12_1_step_5_prep_message_keys() -> None:
    fields = {"msg_id": "20240101.0000.00.000.1", "dest": REMOTE, "src": "s", "count": 2,
              "max_count": 9, "param1": "a", "param4": "d", "due": 123, "force_remote": True,
              "post_run_webhook": ["http://h/x"], "orig_msg_id": "http://a:1/q/x/1",
              "cloned_from": "z"}
    msg = R.prep_message(fields, "fallback")
    assert msg == {"dest": REMOTE, "src": "s", "count": 3, "max_count": 9, "param1": "a",
                   "param4": "d", "post_run_webhook": ["http://h/x"],
                   "orig_msg_id": "http://a:1/q/x/1", "_method": "prep"}
    assert R.prep_message({"dest": REMOTE}, "http://me/q/relay/1") == {
        "dest": REMOTE, "count": 1, "orig_msg_id": "http://me/q/relay/1", "_method": "prep"}
    form = R.prep_form({"dest": REMOTE}, "o")
    assert form["x_format"] == "json" and json.loads(form["mesg"])["_method"] == "prep"


def test_s12_1_forms_urls_and_resend() -> None:
    assert R.commit_form(FULL) == {"msg_id": "20240101.0000.00.000.7", "_method": "commit",
                                   "x_format": "json"}
    assert R.attach_form(FULL, "f.csv") == {"pathname": "f.csv",
                                            "msg_id": "20240101.0000.00.000.7",
                                            "x_format": "json"}
    assert R.prep_url(REMOTE + "//") == REMOTE + "/new_message"
    assert [R.resend_line(c, "why") for c in (0, 1, 2, 3)] == [
        "resend 0-why", "resend 10-why", "resend 40-why", "resend 90-why"]
    assert R.resend_line(1, "a\nb  c") == "resend 10-a b c"


@pytest.mark.parametrize("url,bare,auth", [
    ("http://h:1/q/t", "http://h:1/q/t", None),
    ("http://u:p@h:1/q/t", "http://h:1/q/t", ("u", "p")),
    ("https://us%40r:p%3Aw%20x@h/q/t/", "https://h/q/t/", ("us@r", "p:w x")),
    ("http://u@h:1/q/t", "http://h:1/q/t", ("u", "")),
])
def test_s12_1_credentials_split(url: str, bare: str, auth: tuple[str, str] | None) -> None:
    assert jobio.split_credentials(url) == (bare, auth)


def test_s12_1_relay_id_written_atomically(tmp_path: Path) -> None:
    job_dir = tmp_path / "ID" / "job"
    job_dir.mkdir(parents=True)
    files = R.JobFiles(str(job_dir))
    assert files.read_relay_id() is None
    files.write_relay_id(FULL)
    assert (job_dir / "relay_id").read_text() == FULL + "\n"
    assert sorted(p.name for p in job_dir.iterdir()) == ["relay_id"]  # no temp file left
    assert files.read_relay_id() == FULL
    (job_dir / "relay_id").write_text("garbage")
    assert files.read_relay_id() is None and not (job_dir / "relay_id").exists()


def test_s12_1_step_6_attachment_list(tmp_path: Path) -> None:
    """Regular files of ../attach/ by name; dot-files, directories and symlinks skipped."""
    (tmp_path / "ID" / "job").mkdir(parents=True)
    attach = tmp_path / "ID" / "attach"
    attach.mkdir()
    for name in ("b.txt", "a.bin", ".hidden"):
        (attach / name).write_text(name)
    (attach / "dir").mkdir()
    (attach / "link").symlink_to(attach / "a.bin")
    files = R.JobFiles(str(tmp_path / "ID" / "job"))
    assert [n for n, _ in files.attachments()] == ["a.bin", "b.txt"]
    assert R.file_md5(str(attach / "a.bin")) == md5(b"a.bin")


# ================================================================ two real roots


class Pair:
    """`local` (queue `relay`, the builtin script) relays to `remote` (queue `test`)."""

    def __init__(self, base: Path, *, remote_main: dict[str, Any] | None = None,
                 local_env: dict[str, str | None] | None = None,
                 relay_workers: int = 1) -> None:
        self.remote_root = build_root(base / "remote", **(remote_main or {}))
        self.local_root = build_root(base / "local")
        install_builtin(self.local_root, "relay", num_workers=relay_workers)
        self.remote_port = json.loads(
            (self.remote_root / "config" / "config.json").read_text())["port"]
        self.mgrs: list[Mgr] = []
        self.mgrs.append(Mgr(self.remote_root))
        # No proxy unless a test asks for one: the machine's own settings must not interfere.
        env: dict[str, str | None] = {k: None for k in (
            "HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "NO_PROXY", "no_proxy",
            "ALL_PROXY", "all_proxy")}
        self.mgrs.append(EnvMgr(self.local_root, {**env, **(local_env or {})}))
        for root, name in ((self.remote_root, "test"), (self.local_root, "relay")):
            wait_for(lambda r=root, n=name: self.ping(r, n), 60, what=f"queue {name} up")

    @staticmethod
    def ping(root: Path, name: str) -> bool:
        try:
            return client.call_queue(str(root), name, "ping") == ["pong"]
        except Exception:
            return False

    def stop(self) -> None:
        for mgr in self.mgrs:
            mgr.stop()

    def dest(self, queue: str = "test", userinfo: str = "") -> str:
        return f"http://{userinfo}127.0.0.1:{self.remote_port}/q/{queue}"

    def relay(self, cmd: str, arg: Any = None) -> Any:
        return client.call_queue(str(self.local_root), "relay", cmd, arg)

    def remote(self, cmd: str, arg: Any = None) -> Any:
        return client.call_queue(str(self.remote_root), "test", cmd, arg)

    def send(self, attachments: dict[str, bytes] | None = None, **fields: Any) -> str:
        """A relay message (prep, attach, commit when there are attachments)."""
        fields.setdefault("dest", self.dest())
        if not attachments:
            reply = self.relay("create_message", fields)
            assert reply[0] == "ok", reply
            return str(reply[1])
        reply = self.relay("prep_message", fields)
        assert reply[0] == "ok", reply
        full = str(reply[1])
        files = self.local_root.parent / "files" / short_id(full)
        files.mkdir(parents=True)
        for name, data in attachments.items():
            (files / name).write_bytes(data)
            att = self.relay("attach_message", {"msg_id": full, "pathname": str(files / name)})
            assert att == ["ok", f"{md5(data)}-Attached successfully"], att
        assert self.relay("commit_message", {"msg_id": full}) == ["ok", "msg commited"]
        return full

    def state(self, full: str) -> str | None:
        reply = self.relay("get_message_state", {"msg_id": full})
        return reply[1] if reply[0] == "ok" else None

    def wait_final(self, full: str, timeout: float = 90) -> dict[str, Any]:
        wait_for(lambda: self.state(full) in ("relayed", "err"), timeout,
                 what=f"{full} to be relayed or err")
        reply = self.relay("get_message", {"msg_id": full})
        assert reply[0] == "ok", reply
        return dict(reply[1])

    def log_lines(self, msg: dict[str, Any]) -> list[str]:
        text = (self.local_root / msg["path"] / "job" / "stdio.log").read_text()
        return [m.group(2) for m in map(LOG_LINE.match, text.splitlines())
                if m and not m.group(2).startswith("RQ START - ")]  # the S6.3 header

    def remote_messages(self) -> list[dict[str, Any]]:
        """Every committed message on the remote side (prep excluded), read from disk."""
        return remote_messages(self.remote_root)


def remote_messages(root: Path) -> list[dict[str, Any]]:
    out = []
    for state in ("que", "run", "done", "relayed", "err"):
        for path in sorted((root / "queue" / "test" / state).glob("**/msg")):
            msg = json.loads(path.read_text())
            msg["_dir"] = path.parent
            msg["_state"] = state
            out.append(msg)
    return out


def md5(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    p = Pair(tmp_path_factory.mktemp("relay"))
    yield p
    p.stop()


def remote_copy(p: Pair, relayed: dict[str, Any], timeout: float = 60) -> dict[str, Any]:
    """The remote message a relayed one points at, once it is done there."""
    full = relayed["status"].split(" - ", 1)[1]
    wait_for(lambda: p.remote("get_message_state", {"msg_id": full}) == ["ok", "done"],
             timeout, what=f"remote {full} done")
    reply = p.remote("get_message", {"msg_id": full})
    assert reply[0] == "ok", reply
    return dict(reply[1])


def by_orig(p: Pair, orig: str) -> list[dict[str, Any]]:
    return [m for m in p.remote_messages() if m.get("orig_msg_id") == orig]


def test_s12_1_plain_relay_and_force_remote_log_lines(pair: Pair) -> None:
    full = pair.send(param1="p1", param2="two", src="me", max_count=7, force_remote=True)
    msg = pair.wait_final(full)
    assert msg["state"] == "relayed", msg
    remote_full = msg["status"].removeprefix("relayed - ")
    assert re.fullmatch(rf"http://127\.0\.0\.1:{pair.remote_port}/q/test/[\d.]+", remote_full)
    got = remote_copy(pair, msg)
    # S12.1: the receiving side sees count + 1, the original orig_msg_id, dest = the full URL
    assert (got["dest"], got["count"], got["orig_msg_id"]) == (pair.dest(), 1, full)
    assert (got["param1"], got["param2"], got["src"], got["max_count"]) == ("p1", "two", "me", 7)
    assert "force_remote" not in got and "_attachments" not in got
    lines = pair.log_lines(msg)
    assert lines[0] == f"dest - {pair.dest()}"
    assert lines[1] == "FORCE REMOTE"
    assert f"attempting remote {pair.dest()}" in lines
    assert f"Now using relay_id: {remote_full}" in lines
    assert lines[-1] == f"relayed {remote_full}"      # status lines are echoed (S12)
    assert len(by_orig(pair, full)) == 1


def test_s12_1_no_force_remote_line_without_the_flag(pair: Pair) -> None:
    msg = pair.wait_final(pair.send())
    assert msg["state"] == "relayed"
    assert "FORCE REMOTE" not in pair.log_lines(msg)


def test_s12_1_attachments_md5_equal_on_both_sides(pair: Pair) -> None:
    files = {"data.bin": bytes(range(256)) * 4099, "quote\"s.csv": b'a,"b ""c"""\r\n1,2\n',
             "empty.txt": b"", "naïve résumé.txt": "ünïcode\n".encode()}
    full = pair.send(attachments=files)
    msg = pair.wait_final(full)
    assert msg["state"] == "relayed", msg
    got = remote_copy(pair, msg)
    assert {n: a["md5"] for n, a in got["_attachments"].items()} == {
        n: md5(d) for n, d in files.items()}
    for name, att in got["_attachments"].items():
        assert md5(Path(att["path"]).read_bytes()) == md5(files[name])
        assert msg["_attachments"][name]["md5"] == att["md5"]
    lines = pair.log_lines(msg)
    assert sum(line.startswith("attaching ") for line in lines) == 4


def test_s12_1_loop_detection_exact_status(pair: Pair) -> None:
    dest = f"http://127.0.0.1:{pair.remote_port}/q/test/"
    orig = f"http://127.0.0.1:{pair.remote_port}/q/test/20240101.0000.00.000.1"
    msg = pair.wait_final(pair.send(dest=dest, orig_msg_id=orig))
    assert msg["state"] == "err"
    assert msg["status"] == ("err - Relay loop detected: RQ_DEST queue same as "
                             "RQ_ORIG_MSG_ID")
    assert by_orig(pair, orig) == []


def test_s12_1_rq_count_over_15_fails(pair: Pair) -> None:
    msg = pair.wait_final(pair.send(count=16, max_count=20))
    assert msg["state"] == "err" and msg["status"] == "err - RQ_COUNT > 15 FAIL"
    lines = pair.log_lines(msg)
    assert lines == ["run RQ_COUNT > 15 - failing", "fail RQ_COUNT > 15 FAIL"]
    assert by_orig(pair, msg["orig_msg_id"]) == []


def test_s12_1_stale_relay_id_404_preps_again(pair: Pair) -> None:
    """Step 4: the stored remote message is gone (404) → forget it, prep a new one."""
    reply = pair.relay("prep_message", {"dest": pair.dest()})
    full = reply[1]
    job = pair.local_root / "queue" / "relay" / "prep" / short_id(full) / "job"
    job.mkdir()
    stale = f"http://127.0.0.1:{pair.remote_port}/q/test/20240101.0000.00.000.424242"
    (job / "relay_id").write_text(stale + "\n")
    assert pair.relay("commit_message", {"msg_id": full}) == ["ok", "msg commited"]
    msg = pair.wait_final(full)
    assert msg["state"] == "relayed", msg
    lines = pair.log_lines(msg)
    assert f"checking remote state of relay_id: {stale}" in lines
    assert f"forgetting relay_id: {stale}" in lines
    assert lines.index(f"forgetting relay_id: {stale}") < lines.index(
        f"attempting remote {pair.dest()}")
    remote_full = msg["status"].removeprefix("relayed - ")
    assert remote_full != stale and f"Now using relay_id: {remote_full}" in lines
    assert len(by_orig(pair, full)) == 1


def test_s12_1_relay_id_of_committed_message_is_not_sent_again(pair: Pair) -> None:
    """Step 4: a stored relay_id whose remote message is already committed → step 8 at once
    (the case of a lost commit reply), without a second prep."""
    remote = pair.remote("create_message", {"dest": pair.dest(), "src": "earlier"})
    reply = pair.relay("prep_message", {"dest": pair.dest()})
    full = reply[1]
    job = pair.local_root / "queue" / "relay" / "prep" / short_id(full) / "job"
    job.mkdir()
    (job / "relay_id").write_text(remote[1] + "\n")
    pair.relay("commit_message", {"msg_id": full})
    msg = pair.wait_final(full)
    assert msg["status"] == f"relayed - {remote[1]}"
    assert not any(line.startswith("attempting remote") for line in pair.log_lines(msg))
    assert by_orig(pair, full) == []


def test_s12_1_soft_fail_resends_with_backoff(pair: Pair) -> None:
    """Nothing listens at the dest: RQ_COUNT 0 → `resend 0-…`, RQ_COUNT 1 → `resend 10-…`."""
    from faultproxy import port_is_closed
    from rqtest import free_port
    port = free_port()
    assert port_is_closed(port)
    full = pair.send(dest=f"http://127.0.0.1:{port}/q/test")

    def requeued_twice() -> dict[str, Any] | None:
        reply = pair.relay("get_message", {"msg_id": full})
        msg = reply[1] if reply[0] == "ok" else {}
        return msg if msg.get("state") == "que" and msg.get("count") == 2 else None
    msg = wait_for(requeued_twice, 60, what="two soft fails")
    assert msg["status"].startswith("que - 10-prep failed: ")
    assert time.time() < msg["due"] <= time.time() + 10
    lines = pair.log_lines(msg)
    resends = [line for line in lines if line.startswith("resend ")]
    assert [r.split("-", 1)[0] for r in resends] == ["resend 0", "resend 10"]
    assert pair.relay("delete_message", {"msg_id": full}) == ["ok", "msg deleted"]


def test_s12_1_basic_auth_on_every_request(tmp_path: Path) -> None:
    """S14.3 on the receiver: the credentials in the dest URL go out on the prep, the
    multipart upload and the commit; wrong ones soft-fail with the 401."""
    p = Pair(tmp_path, remote_main={"basic_auth": {"realm": "rq",
                                                   "users": {"ru": "s3cr:t p@ss"}}})
    try:
        good = p.dest(userinfo="ru:s3cr%3At%20p%40ss@")
        full = p.send(attachments={"a.txt": b"hello\n"}, dest=good)
        msg = p.wait_final(full)
        assert msg["state"] == "relayed", msg
        got = remote_copy(p, msg)
        assert got["_attachments"]["a.txt"]["md5"] == md5(b"hello\n")
        assert got["dest"] == good
        bad = p.send(dest=p.dest(userinfo="ru:wrong@"), max_count=1)
        msg = p.wait_final(bad)
        assert msg["state"] == "err"
        assert msg["status"] == "err - HIT MAX RESEND COUNT - MOVING TO ERR"
        assert any("prep got HTTP 401" in line for line in p.log_lines(msg))
        assert by_orig(p, bad) == []
    finally:
        p.stop()


def test_s12_1_cli_sendmesg_relay_ok_goes_through_the_relay(pair: Pair) -> None:
    """S19: `rq sendmesg` with a URL dest and --relay-ok lands in the relay queue."""
    import subprocess

    from rqtest import REPO
    result = subprocess.run(
        [str(REPO / "bin" / "rq"), "--root", str(pair.local_root), "sendmesg",
         "--dest", pair.dest(), "--param1", "cli", "--relay-ok"],
        capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    full = result.stdout.split()[1]
    assert "/q/relay/" in full
    msg = pair.wait_final(full)
    assert msg["state"] == "relayed"
    assert remote_copy(pair, msg)["param1"] == "cli"
