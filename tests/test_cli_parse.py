"""The `rq` command without daemons: S19.1 parsing, S19.2 usage texts, the
S19.3 local errors, and the S19.3 output shapes against stand-in rq1 servers
(the real daemons' end-to-end tests live elsewhere)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from rq import cli
from rq import client as rqclient
from rq.cli import app, base, helptext
from rq.sockserve import Rq1Server

REPO = Path(__file__).resolve().parent.parent
SHORT = "20100625.0127.35.122.7509656"
FULL = f"http://rq.example.com:3333/q/test/{SHORT}"
COMMANDS = sorted(["sendmesg", "prepmesg", "single_que", "attachmesg", "commitmesg",
                   "statusmesg", "state", "statuscountmesg", "attachstatusmesg", "clone",
                   "showmesg", "deletemesg", "destroymesg", "runmesg", "queues", "admin",
                   "fsck", "reserve", "report", "renew", "watch", "analytics",
                   "createqueue", "configqueue", "deletequeue", "completion",
                   "wait", "requeue", "purge",  # issue 16 items 2, 6
                   "push", "pop",  # issue 18
                   "cursors", "deletecursor"])  # issue 18 item 3
USAGE = "Valid commands are:\n" + "".join(f"  {name}\n" for name in COMMANDS)
MESSAGE_COMMANDS = ["commitmesg", "statusmesg", "state", "statuscountmesg",
                    "attachstatusmesg", "clone", "showmesg", "deletemesg", "destroymesg",
                    "runmesg"]


@pytest.fixture
def root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An RQ root (S1.3) with one queue `test` and no daemons."""
    monkeypatch.delenv("RQ_ROOT", raising=False)
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "config.json").write_text(json.dumps(
        {"env": "test", "host": "localhost", "port": 3333, "addr": "127.0.0.1"}))
    (tmp_path / "queue" / "test").mkdir(parents=True)
    (tmp_path / "queue" / "test" / "config.json").write_text(
        json.dumps({"name": "test", "script": "true"}))
    return tmp_path


def run_main(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def run_rq(*argv: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """`python -m rq` as a real process (S1.1)."""
    env = {k: v for k, v in os.environ.items() if k != "RQ_ROOT"}
    env["PYTHONPATH"] = str(REPO)
    return subprocess.run([sys.executable, "-m", "rq", *argv], check=False,
                          capture_output=True, text=True, env=env, cwd=cwd or REPO, timeout=60)


# ---------------------------------------------------------------- S19.1 parsing


@pytest.mark.parametrize("args, flags", [
    ([], {}),
    (["--k=v"], {"k": "v"}),
    (["--k", "v"], {"k": "v"}),
    (["--k"], {"k": True}),
    (["--k", "--j"], {"k": True, "j": True}),
    (["--k", "--j=2"], {"k": True, "j": "2"}),
    (["--k", "-v"], {"k": "-v"}),                 # only `--` makes a flag
    (["-k", "v"], {}),
    (["a--b", "x"], {}),                          # fix: *contains* `--` is not a flag
    (["stray", "--k", "v", "other"], {"k": "v"}),  # other arguments are ignored
    (["--k=1", "--k", "2"], {"k": "2"}),          # the last value wins
    (["--k=a=b"], {"k": "a=b"}),
    (["--k="], {"k": ""}),
    (["--k", ""], {"k": ""}),
    (["--k", "--"], {"k": True, "": True}),
    (["--pattern", "a", "--pattern=b", "--pattern"], {"pattern": ["a", "b", True]}),
    (["--relay-ok", "--max_count", "3", "--msg_id=x", "--force_remote", "--local_fs_only"],
     {"relay-ok": True, "max_count": "3", "msg_id": "x", "force_remote": True,
      "local_fs_only": True}),
])
def test_parse_flags(args: list[str], flags: dict[str, Any]) -> None:
    assert base.parse_flags(args) == flags


@pytest.mark.parametrize("args, positional", [
    (["jobs"], ("jobs",)),
    (["jobs", "--wait", "5", "--loop"], ("jobs",)),
    (["--wait", "5", "jobs"], ("jobs",)),
    (["--loop", "jobs"], ()),                     # `--k v`: the value of --loop (S19.1)
    (["--exec=cat", "jobs", "--", "x"], ("jobs",)),  # a bare `--` takes x too
    (["-v", "jobs"], ("-v", "jobs")),
])
def test_positional_args(args: list[str], positional: tuple[str, ...]) -> None:
    """The arguments parse_flags ignores, for `rq push/pop QUEUE` (issue 18)."""
    assert base.positional_args(args) == positional


@pytest.mark.parametrize("argv, command, rest", [
    ([], None, []),
    (["--root", "/r"], None, []),
    (["--root=/r"], None, []),
    (["sendmesg"], "sendmesg", []),
    (["--root", "/r", "sendmesg", "--dest", "x"], "sendmesg", ["--dest", "x"]),
    (["sendmesg", "--root=/r", "--dest", "x"], "sendmesg", ["--dest", "x"]),
    (["sendmesg", "--dest", "x", "--root", "/r"], "sendmesg", ["--dest", "x"]),
    (["--root", "--odd", "state"], "state", []),  # --root always takes the next argument
    (["--dest", "x", "sendmesg"], "--dest", ["x", "sendmesg"]),  # the first argument is the command
])
def test_split_command(argv: list[str], command: str | None, rest: list[str]) -> None:
    assert base.split_command(argv) == (command, rest)


# ---------------------------------------------------------------- S19.2 usage


def test_command_list() -> None:
    assert sorted(base.COMMAND_MODULES) == COMMANDS
    assert base.usage_text() + "\n" == USAGE


OVERVIEW = helptext.overview() + "\n"


def test_overview_lists_every_command_with_a_description() -> None:
    """Issue 16 item 4: S19.2's list, each name followed by its one-line description."""
    lines = OVERVIEW.splitlines()
    assert lines[0] == "Valid commands are:"
    assert [line.split()[0] for line in lines[1:len(COMMANDS) + 1]] == COMMANDS
    assert all(len(line.split()) > 2 for line in lines[1:len(COMMANDS) + 1])


@pytest.mark.parametrize("argv", [
    ["-h"], ["--help"], ["nosuch", "--help"], ["--root", "/nonexistent", "-h"],
])
def test_help_anywhere_prints_the_overview_on_stdout(capsys: pytest.CaptureFixture[str],
                                                     argv: list[str]) -> None:
    assert run_main(capsys, *argv) == (0, OVERVIEW, "")


@pytest.mark.parametrize("argv", [["sendmesg", "-h"], ["sendmesg", "--dest", "x", "--help"],
                                  ["--root", "/nonexistent", "sendmesg", "--help"]])
def test_command_help_on_stdout(capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    assert run_main(capsys, *argv) == (0, helptext.command_help("sendmesg") + "\n", "")


@pytest.mark.parametrize("argv", [[], ["--root", "/nonexistent"], ["--root=/x"]])
def test_no_command_prints_usage_on_stderr(capsys: pytest.CaptureFixture[str],
                                           argv: list[str]) -> None:
    assert run_main(capsys, *argv) == (1, "", USAGE)


@pytest.mark.parametrize("name", ["nosuch", "Watch", "reserves", "cmd_state", "--dest"])
def test_unknown_command(capsys: pytest.CaptureFixture[str], name: str) -> None:
    assert run_main(capsys, name, "--msg_id", FULL) == (1, "", f"Command not found: {name}\n")


def test_unknown_flags_warn_and_are_ignored(capsys: pytest.CaptureFixture[str],
                                            root: Path) -> None:
    code, out, err = run_main(capsys, "admin", "--root", str(root), "--bogus", "1", "--op",
                              "pause", "--queue", "test", "--x=y")
    assert (code, out) == (1, "")
    assert err.splitlines() == ["rq: warning: ignoring unknown flag --bogus",
                                "rq: warning: ignoring unknown flag --x",
                                "rq: cannot connect to rq-mgr (is it running?)"]


# ---------------------------------------------------------------- S19.3 local errors


def local_error_cases() -> list[tuple[list[str], str]]:
    cases = [
        (["sendmesg"], "missing required argument --dest"),
        (["sendmesg", "--dest"], "missing required argument --dest"),
        (["prepmesg", "--dest="], "missing required argument --dest"),
        (["sendmesg", "--dest", "http://other:3333/q/test"],
         "cannot relay to http://other:3333/q/test without --relay-ok"),
        (["prepmesg", "--dest", "HTTPS://other/q/test"],
         "cannot relay to HTTPS://other/q/test without --relay-ok"),
        (["sendmesg", "--dest", "http://other/q/test", "--relay-ok"], "queue not found: relay"),
        (["sendmesg", "--dest", "nope"], "queue not found: nope"),
        (["sendmesg", "--dest", "/q/nope/x"], "queue not found: nope"),
        (["sendmesg", "--dest", "../queue/test"], "queue not found: ../queue/test"),
        (["sendmesg", "--dest", "test"], "cannot connect to queue test (is rq-mgr running?)"),
        (["prepmesg", "--dest", "/q/test"], "cannot connect to queue test (is rq-mgr running?)"),
        (["single_que", "--dest", "http://other:1/q/test"],  # not relayed: the local queue
         "cannot connect to queue test (is rq-mgr running?)"),
        (["single_que", "--dest", "http://other:1/x"], "queue not found: http://other:1/x"),
        (["statusmesg"], "missing required argument --msg_id"),
        (["state", "--msg_id"], "missing required argument --msg_id"),
        (["state", "--msg_id", SHORT], f"invalid msg_id: {SHORT}"),
        (["state", "--msg_id", "garbage"], "invalid msg_id: garbage"),
        (["state", "--msg_id", "http://h:1/q/test/123"], "invalid msg_id: http://h:1/q/test/123"),
        (["state", "--msg_id", f"http://h:1/q/nope/{SHORT}"], "queue not found: nope"),
        (["attachmesg", "--msg_id", FULL], "missing required argument --pathname"),
        (["attachmesg", "--pathname", "/etc/hostname"], "missing required argument --msg_id"),
        (["queues"], "cannot connect to rq-mgr (is it running?)"),
        (["admin", "--queue", "test", "--op", "pause"],
         "cannot connect to rq-mgr (is it running?)"),
        (["admin", "--op", "pause"], "missing required argument --queue"),
        (["admin", "--queue", "test"], "missing required argument --op"),
        (["admin", "--queue", "test", "--op", "explode"],
         "invalid --op explode (one of: pause, resume, down, up, restart)"),
    ]
    cases += [([name, "--msg_id", FULL], "cannot connect to queue test (is rq-mgr running?)")
              for name in MESSAGE_COMMANDS]
    return cases


@pytest.mark.parametrize("argv, error", local_error_cases())
def test_local_errors(capsys: pytest.CaptureFixture[str], root: Path, argv: list[str],
                      error: str) -> None:
    assert run_main(capsys, "--root", str(root), *argv) == (1, "", f"rq: {error}\n")


def test_root_errors(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RQ_ROOT", raising=False)
    monkeypatch.chdir(tmp_path)
    no_root = "rq: no RQ root found (use --root, set RQ_ROOT, or run inside an RQ root)\n"
    assert run_main(capsys, "queues") == (1, "", no_root)
    assert run_main(capsys, "queues", "--root", str(tmp_path)) == (
        1, "", f"rq: not an RQ root: {tmp_path} (missing config/config.json)\n")


def test_bad_main_config_is_one_line(capsys: pytest.CaptureFixture[str], root: Path) -> None:
    (root / "config" / "config.json").write_text("{}")
    # A path dest needs ROOT (S1.4), so config.json is read; a plain name does not read it
    # (issue 15: the fast path), and test_cli_e2e checks such a message is queued.
    code, out, err = run_main(capsys, "sendmesg", "--root", str(root), "--dest", "/q/test")
    assert (code, out) == (1, "")
    assert err.startswith("rq: bad config file config/config.json: ")
    assert err.count("\n") == 1


# S4.8 checks made locally before the queue is asked.

def attach_error(root: Path, tmp_path: Path, kind: str) -> tuple[list[str], str]:
    sub = tmp_path / "files"
    sub.mkdir(exist_ok=True)
    plain = sub / "plain.txt"
    plain.write_text("x")
    if kind == "missing":
        return [str(sub / "nope")], f"No such file {sub / 'nope'} to attach to message"
    if kind == "relative":
        return ["nope"], f"No such file {Path.cwd() / 'nope'} to attach to message"
    if kind == "dir":
        return [str(sub)], f"Attachment currently cannot be a directory {sub}"
    if kind == "fifo":
        os.mkfifo(sub / "fifo")
        return [str(sub / "fifo")], f"Attachment currently not of supported type: {sub / 'fifo'}"
    if kind == "dotname":
        return ([str(plain), "--name", ".hidden"],
                "Attachment name as a dot-file not allowed: .hidden")
    if kind == "dotfile":
        (sub / ".rc").write_text("x")
        return [str(sub / ".rc")], "Attachment name as a dot-file not allowed: .rc"
    assert kind == "badchar"
    return [str(plain), "--name", "a|b"], "Attachment name has invalid character. not allowed: a|b"


@pytest.mark.parametrize("kind", ["missing", "relative", "dir", "fifo", "dotname", "dotfile",
                                  "badchar"])
def test_attachmesg_local_checks(capsys: pytest.CaptureFixture[str], root: Path,
                                 tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                 kind: str) -> None:
    monkeypatch.chdir(tmp_path)
    args, error = attach_error(root, tmp_path, kind)
    code = cli.main(["attachmesg", "--root", str(root), "--msg_id", FULL, "--pathname", *args])
    assert (code, *capsys.readouterr()) == (1, "", f"rq: {error}\n")


@pytest.mark.skipif(os.geteuid() == 0, reason="root can read any file")
def test_attachmesg_unreadable(capsys: pytest.CaptureFixture[str], root: Path,
                               tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("x")
    secret.chmod(0)
    code, out, err = run_main(capsys, "attachmesg", "--root", str(root), "--msg_id", FULL,
                              "--pathname", str(secret))
    assert (code, out, err) == (1, "", f"rq: Attachment currently cannot be read: {secret}\n")


def test_unexpected_exception_is_one_line(capsys: pytest.CaptureFixture[str], root: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(*_a: object, **_k: object) -> None:
        raise ValueError("kaboom\nsecond line")

    monkeypatch.setattr(rqclient, "call_mgr", boom)
    assert run_main(capsys, "queues", "--root", str(root)) == (1, "", "rq: kaboom second line\n")


# ---------------------------------------------------------------- S19.3 output shapes
# Stand-in rq1 servers on the real socket paths: they record each request and
# answer from a table, so the CLI's side of S7 is checked without daemons.

Replies = dict[str, Any]


class FakeDaemon:
    def __init__(self, path: Path, replies: Replies) -> None:
        self.replies = replies
        self.requests: list[tuple[str, Any]] = []
        self.server = Rq1Server(str(path), self.handle)

    def handle(self, cmd: str, arg: str | None, _conn: object) -> Any:
        try:
            decoded = json.loads(arg) if arg is not None else None
        except ValueError:
            decoded = arg  # manager commands take a raw queue name
        self.requests.append((cmd, decoded))
        return self.replies.get(cmd, ["ERROR"])


@pytest.fixture
def serve(root: Path) -> Iterator[Callable[[str, Replies], FakeDaemon]]:
    started: list[FakeDaemon] = []

    def start(where: str, replies: Replies) -> FakeDaemon:
        path = root / ("config/queuemgr.sock" if where == "mgr" else f"queue/{where}/queue.sock")
        path.parent.mkdir(parents=True, exist_ok=True)
        daemon = FakeDaemon(path, replies)
        daemon.server.start()
        started.append(daemon)
        return daemon

    yield start
    for daemon in started:
        daemon.server.close()


def test_sendmesg_passes_flags_through(capsys: pytest.CaptureFixture[str], root: Path,
                                       serve: Callable[[str, Replies], FakeDaemon]) -> None:
    queue = serve("test", {"create_message": ["ok", FULL]})
    code, out, err = run_main(capsys, "sendmesg", "--root", str(root), "--dest", "/q/test",
                              "--param1", "a b", "--count=2", "--force_remote", "--relay-ok",
                              "--due", "5", "--post_run_webhook", "http://x/ http://y/")
    assert (code, out, err) == (0, f"ok {FULL}\n", "")
    assert queue.requests == [("create_message", {
        "dest": "/q/test", "param1": "a b", "count": "2", "force_remote": True, "due": "5",
        "post_run_webhook": "http://x/ http://y/"})]


@pytest.mark.parametrize("command, server_cmd", [("prepmesg", "prep_message"),
                                                 ("single_que", "single_que")])
def test_prepmesg_and_single_que(capsys: pytest.CaptureFixture[str], root: Path,
                                 serve: Callable[[str, Replies], FakeDaemon], command: str,
                                 server_cmd: str) -> None:
    queue = serve("test", {server_cmd: ["fail", "invalid due value"]})
    assert run_main(capsys, command, "--root", str(root), "--dest", "test", "--due", "x") == (
        1, "fail invalid due value\n", "")
    assert queue.requests == [(server_cmd, {"dest": "test", "due": "x"})]


def test_url_dest_goes_to_relay(capsys: pytest.CaptureFixture[str], root: Path,
                                serve: Callable[[str, Replies], FakeDaemon]) -> None:
    (root / "queue" / "relay").mkdir()
    (root / "queue" / "relay" / "config.json").write_text('{"name":"relay","script":"x"}')
    relay = serve("relay", {"create_message": ["ok", "http://localhost:3333/q/relay/" + SHORT]})
    code, out, _ = run_main(capsys, "sendmesg", "--root", str(root), "--dest",
                            "https://far:3333/q/test", "--relay-ok")
    assert (code, out) == (0, f"ok http://localhost:3333/q/relay/{SHORT}\n")
    assert relay.requests == [("create_message", {"dest": "https://far:3333/q/test"})]


MSG = {"msg_id": SHORT, "dest": "test", "count": 3, "state": "done",
       "status": "done - done sleeping", "path": f"queue/test/done/20100625/01/27/{SHORT}",
       "_attachments": {"b.txt": {"md5": "bb", "size": 2, "path": "/r/b.txt"},
                        "a.txt": {"md5": "aa", "size": 1, "path": "/r/a.txt"}}}


@pytest.mark.parametrize("command, replies, out, code", [
    ("statusmesg", {"get_message_status": ["ok", {"status": "done - done sleeping",
                                                  "state": "done", "path": "p"}]},
     "ok done - done sleeping\n", 0),
    ("statusmesg", {"get_message_status": ["fail", "msg not found"]}, "fail msg not found\n", 1),
    ("state", {"get_message_state": ["ok", "que"]}, "ok que\n", 0),
    ("commitmesg", {"commit_message": ["ok", "msg commited"]}, "ok msg commited\n", 0),
    ("clone", {"clone_message": ["ok", FULL + "1"]}, f"ok {FULL}1\n", 0),
    ("clone", {"clone_message": ["fail", "cannot clone message in que state"]},
     "fail cannot clone message in que state\n", 1),
    ("deletemesg", {"delete_message": ["ok", "msg deleted"]}, "ok msg deleted\n", 0),
    ("destroymesg", {"destroy_message": ["fail", "msg not running"]}, "fail msg not running\n", 1),
    ("runmesg", {"run_message": ["ok", "msg sent to front of run queue"]},
     "ok msg sent to front of run queue\n", 0),
    ("statuscountmesg", {"get_message": ["ok", MSG]}, "ok 3\n", 0),
    ("showmesg", {"get_message": ["ok", MSG]},
     "ok " + json.dumps(MSG, separators=(",", ":")) + "\n", 0),
    ("showmesg", {"get_message": ["fail", "msg not found"]}, "fail msg not found\n", 1),
    ("attachstatusmesg", {"get_message": ["ok", MSG]},
     "ok 2\na.txt aa 1 /r/a.txt\nb.txt bb 2 /r/b.txt\n", 0),
    ("attachstatusmesg", {"get_message": ["ok", {"msg_id": SHORT}]}, "ok 0\n", 0),
    ("state", {"get_message_state": {"not": "a list"}}, '{"not":"a list"}\n', 1),
    ("state", {}, "ERROR\n", 1),
])
def test_message_command_output(capsys: pytest.CaptureFixture[str], root: Path,
                                serve: Callable[[str, Replies], FakeDaemon], command: str,
                                replies: Replies, out: str, code: int) -> None:
    queue = serve("test", replies)
    assert run_main(capsys, command, "--root", str(root), "--msg_id", FULL) == (code, out, "")
    assert [arg for _, arg in queue.requests] == [{"msg_id": SHORT}]


def test_attachmesg_output(capsys: pytest.CaptureFixture[str], root: Path, tmp_path: Path,
                           monkeypatch: pytest.MonkeyPatch,
                           serve: Callable[[str, Replies], FakeDaemon]) -> None:
    (tmp_path / "data.bin").write_bytes(b"hello")
    monkeypatch.chdir(tmp_path)
    queue = serve("test", {"attach_message": ["ok", "5d41-Attached successfully"]})
    assert run_main(capsys, "attachmesg", "--root", str(root), "--msg_id", FULL,
                    "--pathname", "data.bin", "--local_fs_only") == (
        0, f"ok 5d41-Attached successfully for Message: {FULL} attachment\n", "")
    assert queue.requests == [("attach_message", {
        "msg_id": SHORT, "pathname": str(tmp_path / "data.bin"), "name": "data.bin",
        "local_fs_only": True})]
    queue.replies["attach_message"] = ["fail", "msg not in prep"]
    assert run_main(capsys, "attachmesg", "--root", str(root), "--msg_id", FULL,
                    "--pathname", "data.bin", "--name", "other") == (
        1, f"fail msg not in prep for Message: {FULL} attachment\n", "")
    assert queue.requests[-1][1]["name"] == "other"


def child(state: str) -> dict[str, Any]:
    return {"state": state, "pid": None, "restarts": 0, "since": 0, "error": None}


def test_queues(capsys: pytest.CaptureFixture[str], root: Path,
                serve: Callable[[str, Replies], FakeDaemon]) -> None:
    serve("mgr", {"status": ["ok", {"queues": {
        "test": child("RUNNING"), "broken": child("FATAL"), "mute": child("RUNNING"),
        "booting": child("STARTING")}, "web": child("RUNNING")}]})
    serve("test", {"status": ["PAUSE"]})  # `mute` has no socket: its state is shown
    assert run_main(capsys, "queues", "--root", str(root)) == (
        0, "booting STARTING\nbroken FATAL\nmute RUNNING\ntest PAUSE\n", "")


@pytest.mark.parametrize("op, cmd", [("pause", "pause_queue"), ("resume", "resume_queue"),
                                     ("down", "down_queue"), ("up", "up_queue"),
                                     ("restart", "restart_queue")])
def test_admin(capsys: pytest.CaptureFixture[str], root: Path,
               serve: Callable[[str, Replies], FakeDaemon], op: str, cmd: str) -> None:
    mgr = serve("mgr", {cmd: ["ok", "test"]})
    assert run_main(capsys, "admin", "--root", str(root), "--queue", "test", "--op", op) == (
        0, "ok test\n", "")
    assert mgr.requests == [(cmd, "test")]


def test_admin_failure_reply(capsys: pytest.CaptureFixture[str], root: Path,
                             serve: Callable[[str, Replies], FakeDaemon]) -> None:
    serve("mgr", {"down_queue": ["fail", "invalid queue name"]})
    assert run_main(capsys, "admin", "--root", str(root), "--queue", "x", "--op", "down") == (
        1, "fail invalid queue name\n", "")


# ---------------------------------------------------------------- click and real processes


def test_click_runner_sees_exit_codes() -> None:
    runner = CliRunner()
    assert runner.invoke(app.cli, ["--help"]).exit_code == 0
    result = runner.invoke(app.cli, ["nosuch"])
    assert result.exit_code == 1
    assert "Command not found: nosuch" in result.output


@pytest.mark.parametrize("argv, code, out, err", [
    (["-h"], 0, OVERVIEW, ""),
    (["state", "--help"], 0, helptext.command_help("state") + "\n", ""),
    ([], 1, "", USAGE),
    (["nosuch"], 1, "", "Command not found: nosuch\n"),
])
def test_usage_as_subprocess(argv: list[str], code: int, out: str, err: str) -> None:
    proc = run_rq(*argv)
    assert (proc.returncode, proc.stdout, proc.stderr) == (code, out, err)


def test_errors_as_subprocess(root: Path) -> None:
    proc = run_rq("sendmesg", "--bogus", cwd=root)  # root found from the cwd (S1.2 rule 3)
    assert (proc.returncode, proc.stdout) == (1, "")
    assert proc.stderr == ("rq: warning: ignoring unknown flag --bogus\n"
                           "rq: missing required argument --dest\n")
    proc = run_rq("--root", str(root), "queues")
    assert (proc.returncode, proc.stdout, proc.stderr) == (
        1, "", "rq: cannot connect to rq-mgr (is it running?)\n")
    proc = run_rq("state", "--root", str(root), "--msg_id", SHORT)
    assert (proc.returncode, proc.stderr) == (1, f"rq: invalid msg_id: {SHORT}\n")


def test_sendmesg_as_subprocess(root: Path,
                                serve: Callable[[str, Replies], FakeDaemon]) -> None:
    queue = serve("test", {"create_message": ["ok", FULL]})
    proc = run_rq("sendmesg", "--root", str(root), "--dest", "test", "--src", "cli")
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, f"ok {FULL}\n", "")
    assert queue.requests == [("create_message", {"dest": "test", "src": "cli"})]


def test_issue16_a_commands_own_flags_accumulate() -> None:
    """`rq wait --msg_id A --msg_id B` waits for both: wait's --msg_id accumulates,
    every other command's keeps its last value (S19.1)."""
    args = ["--msg_id", "a", "--msg_id=b"]
    assert base.parse_flags(args, frozenset({"msg_id"})) == {"msg_id": ["a", "b"]}
    assert base.parse_flags(args) == {"msg_id": "b"}
    wait = base.load_command("wait")
    assert wait is not None and wait.accumulating == {"msg_id"}
