"""The `rq` command end to end (SPEC S19): every command run as a real process
(`bin/rq`, and `python -m rq`, S1.1) against a real `rq-mgr` with real queue
processes and /bin/sh queue scripts, in a root made by `rq-install` (S20).

One manager serves the whole module (starting one costs about a second); each
test uses its own messages, and the tests that change a queue's admin status
use their own queue and put it back.  The test that stops a manager has a root
of its own.  Every program run goes through `run_prog`, which also checks that no
command ever shows a Python traceback (S0.3.3, S19.3)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from rqtest import REPO, free_port, make_queue, short_id, wait_for, write_script

from rq import client
from rq.errors import ConnectError
from rq.mgr import pidfile

pytestmark = pytest.mark.timeout(120)

PYTHON = str(REPO / ".venv" / "bin" / "python") if (REPO / ".venv" / "bin" / "python").exists() \
    else sys.executable
ID_RE = r"\d{8}\.\d{4}\.\d{2}\.\d{3}\.\d+"
FINAL = ("done", "err", "relayed")

# RQ_PARAM1 chooses what a job does, so no test needs a fixed sleep: a `hold` job runs
# until the file named by RQ_PARAM2 exists (or 30 s pass).
JOB_SH = """#!/bin/sh
case "$RQ_PARAM1" in
hold)
    echo "run holding" >&3
    i=0
    while [ ! -e "$RQ_PARAM2" ] && [ $i -lt 600 ]; do sleep 0.05; i=$((i + 1)); done
    echo "done released" >&3 ;;
resend)
    if [ "$RQ_COUNT" -lt "$RQ_PARAM2" ]; then echo "resend 0-again" >&3
    else echo "done after $RQ_COUNT resends" >&3; fi ;;
fail)
    echo "err by design" >&3 ;;
*)
    echo "done hello $RQ_PARAM1" >&3 ;;
esac
"""


@dataclass(frozen=True)
class Result:
    code: int
    out: str
    err: str

    @property
    def triple(self) -> tuple[int, str, str]:
        return self.code, self.out, self.err


def subprocess_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This checkout importable; no RQ_ROOT or fault injection from the caller."""
    env = {k: v for k, v in os.environ.items() if k not in ("RQ_ROOT", "RQ_FS_FAULTS")}
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"]
                                     if env.get("PYTHONPATH") else "")
    env.update(extra or {})
    return env


def run_prog(argv: list[str], cwd: Path | str | None = None,
             env: dict[str, str] | None = None, timeout: float = 60) -> Result:
    res = subprocess.run(argv, check=False, capture_output=True, text=True,
                         cwd=str(cwd or REPO), env=subprocess_env(env), timeout=timeout)
    for stream in (res.stdout, res.stderr):
        assert "Traceback" not in stream, f"{argv}: {stream}"
    return Result(res.returncode, res.stdout, res.stderr)


def rq_mgr(root: Path, *args: str) -> Result:
    return run_prog([str(REPO / "bin" / "rq-mgr"), "--root", str(root), *args])


def install_root(base: Path, *queues: str, **config: Any) -> tuple[Path, int]:
    """`rq-install` a root under `base`, plus /bin/sh queues running JOB_SH; `config`
    adds keys to config/config.json."""
    root, port = base / "root", free_port()
    res = run_prog([str(REPO / "bin" / "rq-install"), "--root", str(root),
                    "--port", str(port), "--host", "127.0.0.1", "--addr", "127.0.0.1"])
    assert res.code == 0 and res.out.endswith(f"RQ installed in {root}\n"), res
    if config:
        path = root / "config" / "config.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), **config}))
    script = write_script(base / "job.sh", JOB_SH)
    for name in queues:
        make_queue(root, name, script, num_workers=4, kill_grace=2)
    return root, port


def stop_mgr(root: Path) -> None:
    """`rq-mgr stop`; a manager that survives it is killed, so no test leaks one."""
    try:
        rq_mgr(root, "stop")
    finally:
        pid = pidfile.running_pid(str(root))
        if pid is not None:
            os.kill(pid, signal.SIGKILL)


class Rig:
    """One root with its manager: runs `rq` and looks at messages."""

    def __init__(self, root: Path, port: int, base: Path, prefix: str = "/") -> None:
        self.root, self.port, self.base, self.prefix = root, port, base, prefix

    def full(self, queue: str, short: str) -> str:
        """S4.2: `http://HOST:PORT` + ROOT + `q/QUEUE/ID`."""
        return f"http://127.0.0.1:{self.port}{self.prefix}q/{queue}/{short}"

    def rq(self, *args: str, cwd: Path | str | None = None, module: bool = False,
           env: dict[str, str] | None = None, root_flag: bool = True) -> Result:
        """`bin/rq --root ROOT ARGS` (or `.venv/bin/python -m rq ...`) as a real process;
        without `root_flag` the root is found by S1.2 rules 2 and 3."""
        prog = [PYTHON, "-m", "rq"] if module else [str(REPO / "bin" / "rq")]
        root = ["--root", str(self.root)] if root_flag else []
        return run_prog([*prog, *root, *args], cwd=cwd, env=env)

    def send(self, queue: str, *args: str, cmd: str = "sendmesg", **kw: Any) -> str:
        """Run a sending command; assert `ok <FULL_ID>` for `queue`; return the full id."""
        res = self.rq(cmd, *args, **kw)
        m = re.fullmatch(rf"ok ({re.escape(self.full(queue, ''))}{ID_RE})\n", res.out)
        assert m and res.code == 0 and res.err == "", res
        return m.group(1)

    def call(self, full: str, cmd: str) -> Any:
        queue = full.split("/q/", 1)[1].split("/", 1)[0]
        return client.call_queue(str(self.root), queue, cmd, {"msg_id": short_id(full)})

    def state(self, full: str) -> str | None:
        reply = self.call(full, "get_message_state")
        return reply[1] if reply[0] == "ok" else None

    def wait_state(self, full: str, *states: str, timeout: float = 15) -> str:
        return wait_for(lambda: (s := self.state(full)) in states and s, timeout,
                        what=f"{full} to reach {states}")

    def message(self, full: str) -> dict[str, Any]:
        reply = self.call(full, "get_message")
        assert reply[0] == "ok", reply
        return reply[1]

    def counts(self, queue: str) -> dict[str, int]:
        return client.call_queue(str(self.root), queue, "num_messages")

    def expect(self, args: tuple[str, ...], code: int, out: str, err: str = "",
               **kw: Any) -> None:
        assert self.rq(*args, **kw).triple == (code, out, err)


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    """A root made by rq-install with queues `test`, `adm` and `sq` (paused on disk before
    start, S3.5), served by one `rq-mgr` for the whole module; always stopped."""
    base = tmp_path_factory.mktemp("cli_e2e")
    root, port = install_root(base, "test", "adm", "sq")
    (root / "config" / "sq.pause").touch()
    try:
        res = rq_mgr(root, "start")
        assert res.triple == (0, "", ""), res
        yield Rig(root, port, base)
    finally:
        stop_mgr(root)


def release_file(rig: Rig, name: str) -> Path:
    return rig.base / f"release-{name}"


# ---------------------------------------------------------------- sendmesg and dests (S19, S4.3)


def test_sendmesg_bare_name_and_paths(rig: Rig) -> None:
    full = rig.send("test", "--dest", "test", "--param1", "bare")
    assert rig.wait_state(full, *FINAL) == "done"
    rig.expect(("statusmesg", "--msg_id", full), 0, "ok done - hello bare\n")
    rig.expect(("state", "--msg_id", full), 0, "ok done\n")
    assert rig.message(full)["dest"] == "test"

    for dest in ("/q/test", "/q/test/"):                      # a `/q/NAME` path
        full = rig.send("test", "--dest", dest, "--param1", "path", module=True)
        assert rig.wait_state(full, *FINAL) == "done"
        rig.expect(("statusmesg", "--msg_id", full), 0, "ok done - hello path\n", module=True)
        assert rig.message(full)["dest"] == dest


def test_sendmesg_fields(rig: Rig) -> None:
    """Every S19 sendmesg flag reaches the stored message (S4.4), read back by showmesg."""
    due = int(time.time()) + 3600
    full = rig.send("test", "--dest", "test", "--src", "cli-e2e", "--param1", "p1",
                    "--param2=p 2", "--param3", "3", "--param4", "four", f"--due={due}",
                    "--count", "3", "--max_count", "7", "--force_remote")
    res = rig.rq("showmesg", "--msg_id", full)
    assert res.code == 0 and res.err == "" and res.out.startswith("ok ")
    msg = json.loads(res.out[3:])
    assert {k: msg.get(k) for k in ("msg_id", "dest", "src", "param1", "param2", "param3",
                                    "param4", "due", "count", "max_count", "force_remote",
                                    "orig_msg_id", "state", "status")} == {
        "msg_id": short_id(full), "dest": "test", "src": "cli-e2e", "param1": "p1",
        "param2": "p 2", "param3": "3", "param4": "four", "due": due, "count": 3,
        "max_count": 7, "force_remote": True, "orig_msg_id": full, "state": "que",
        "status": "que"}
    assert msg["path"] == f"queue/test/que/{short_id(full)}"
    rig.expect(("statuscountmesg", "--msg_id", full), 0, "ok 3\n")
    rig.expect(("deletemesg", "--msg_id", full), 0, "ok msg deleted\n")
    rig.expect(("state", "--msg_id", full), 1, "fail msg not found\n")
    rig.expect(("deletemesg", "--msg_id", full), 1, "fail msg not found\n")


def test_sendmesg_server_failures(rig: Rig) -> None:
    """S4.4 input failures come back as `fail <reason>` on stdout, exit 1."""
    rig.expect(("sendmesg", "--dest", "test", "--due", "soon"), 1, "fail invalid due value\n")
    rig.expect(("sendmesg", "--dest", "test", "--count", "-1"), 1, "fail invalid count value\n")
    rig.expect(("sendmesg", "--dest", "test", "--max_count=x"), 1,
               "fail invalid max_count value\n")


def test_sendmesg_refuses_bytes_that_are_not_utf8(rig: Rig) -> None:
    """Issue 13, D10 / S0.3.4: one clear line, exit 1 (it was the codec's own error text);
    the "\\udcff" below is the byte 0xff on the command line (surrogateescape)."""
    for cmd in ("sendmesg", "prepmesg", "single_que"):
        rig.expect((cmd, "--dest", "test", "--param1", "a\udcff\udcfeb"), 1, "",
                   "rq: --param1 is not valid UTF-8 text\n")
    rig.expect(("sendmesg", "--dest=te\udcffst"), 1, "", "rq: --dest is not valid UTF-8 text\n")


def test_sendmesg_refuses_a_param_no_job_environment_can_hold(rig: Rig) -> None:
    """Issue 13, D10: refused when created (it used to be accepted, then its job exit 127)."""
    most = 131072 - len("RQ_PARAM1=") - 1
    rig.expect(("sendmesg", "--dest", "test", "--param1", "x" * (most + 1)), 1,
               f"fail param1 too large for a job's environment ({most + 1} bytes, "
               f"at most {most})\n")


def test_sendmesg_post_run_webhook(rig: Rig) -> None:
    """A whitespace-separated --post_run_webhook is split (S4.4) and fires (S12.2)."""
    urls = ["http://127.0.0.1:9/hook-a", "http://127.0.0.1:9/hook-b"]
    before = sum(rig.counts("webhook").values())
    full = rig.send("test", "--dest", "test", "--param1", "hooked",
                    "--post_run_webhook", " ".join(urls))
    assert rig.wait_state(full, *FINAL) == "done"
    assert rig.message(full)["post_run_webhook"] == urls
    # S12.2: one webhook message per URL once the message has ended
    wait_for(lambda: sum(rig.counts("webhook").values()) == before + 2,
             what="two webhook messages")


def test_relay_needs_relay_ok(rig: Rig) -> None:
    """A URL dest (S4.3, https too, any case) goes to `relay`, only with --relay-ok (S19)."""
    for dest in ("http://far.example:3333/q/remote", "HTTPS://far.example/q/remote"):
        rig.expect(("sendmesg", "--dest", dest), 1, "",
                   f"rq: cannot relay to {dest} without --relay-ok\n")
        rig.expect(("prepmesg", "--dest", dest), 1, "",
                   f"rq: cannot relay to {dest} without --relay-ok\n")
    dest = "http://far.example:3333/q/remote"
    full = rig.send("relay", "--dest", dest, "--relay-ok")
    rig.wait_state(full, "que", "run", *FINAL)
    assert rig.message(full)["dest"] == dest
    full = rig.send("relay", "--dest", dest, "--relay-ok", cmd="prepmesg", module=True)
    rig.expect(("state", "--msg_id", full), 0, "ok prep\n")
    rig.expect(("deletemesg", "--msg_id", full), 0, "ok msg deleted\n")


# ---------------------------------------------------------------- prepmesg, attachments, commit


def md5(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()


def test_prep_attach_commit(rig: Rig) -> None:
    """prepmesg, attachmesg (S4.8), attachstatusmesg, commitmesg (S7.3)."""
    work = rig.base / "attach-work"
    (work / "sub").mkdir(parents=True)
    files = {"a.txt": b"alpha\n", "sub/b.bin": bytes(range(256)) * 4, "new.txt": b"newer\n"}
    for rel, data in files.items():
        (work / rel).write_bytes(data)
    (work / "adir").mkdir()

    full = rig.send("test", "--dest", "test", "--param1", "att", cmd="prepmesg")
    rig.expect(("state", "--msg_id", full), 0, "ok prep\n")
    rig.expect(("statusmesg", "--msg_id", full), 0, "ok prep\n")
    rig.expect(("attachstatusmesg", "--msg_id", full), 0, "ok 0\n")

    # --pathname relative to the current directory (S19); --name overrides the base name
    ok = "ok {}-Attached successfully for Message: " + full + " attachment\n"
    rig.expect(("attachmesg", "--msg_id", full, "--pathname", "a.txt"), 0,
               ok.format(md5(files["a.txt"])), cwd=work)
    rig.expect(("attachmesg", "--msg_id", full, "--pathname", "b.bin", "--name", "zeta"), 0,
               ok.format(md5(files["sub/b.bin"])), cwd=work / "sub", module=True)
    rig.expect(("attachmesg", "--msg_id", full, "--pathname", str(work / "sub" / "b.bin"),
                "--local_fs_only"), 0, ok.format(md5(files["sub/b.bin"])))
    # a same-named attachment replaces the first (S4.8)
    rig.expect(("attachmesg", "--msg_id", full, "--pathname", "new.txt", "--name=zeta"), 0,
               ok.format(md5(files["new.txt"])), cwd=work)

    # the local S4.8 checks (S19.3: `rq: <reason>`, exit 1)
    rig.expect(("attachmesg", "--msg_id", full, "--pathname", "missing.txt"), 1, "",
               f"rq: No such file {work / 'missing.txt'} to attach to message\n", cwd=work)
    rig.expect(("attachmesg", "--msg_id", full, "--pathname", "adir"), 1, "",
               f"rq: Attachment currently cannot be a directory {work / 'adir'}\n", cwd=work)
    rig.expect(("attachmesg", "--msg_id", full, "--pathname", "a.txt", "--name", ".hidden"),
               1, "", "rq: Attachment name as a dot-file not allowed: .hidden\n", cwd=work)
    rig.expect(("attachmesg", "--msg_id", full, "--pathname", "a.txt", "--name", "a|b"),
               1, "", "rq: Attachment name has invalid character. not allowed: a|b\n", cwd=work)
    rig.expect(("attachmesg", "--msg_id", full), 1, "",
               "rq: missing required argument --pathname\n")

    def listing() -> str:
        """`ok <N>`, then `<NAME> <MD5> <SIZE> <ABSOLUTE PATH>` sorted by name (S19)."""
        path = rig.root / rig.message(full)["path"] / "attach"
        return "ok 3\n" + "".join(
            f"{name} {md5(files[src])} {len(files[src])} {path / name}\n"
            for name, src in (("a.txt", "a.txt"), ("b.bin", "sub/b.bin"), ("zeta", "new.txt")))

    rig.expect(("attachstatusmesg", "--msg_id", full), 0, listing())

    rig.expect(("commitmesg", "--msg_id", full), 0, "ok msg commited\n")
    assert rig.state(full) in ("run", "done")                     # S5.1: no waiting
    assert rig.wait_state(full, *FINAL) == "done"
    rig.expect(("statusmesg", "--msg_id", full), 0, "ok done - hello att\n")
    rig.expect(("commitmesg", "--msg_id", full), 0, "ok msg already committed\n")
    # attachments stay readable after the move into done/ (S4.8), at their new path
    assert "/done/" in listing()
    rig.expect(("attachstatusmesg", "--msg_id", full), 0, listing(), module=True)
    # a committed message takes no attachment: the server's failure (S19 attachmesg)
    rig.expect(("attachmesg", "--msg_id", full, "--pathname", "a.txt"), 1,
               f"fail msg not in prep for Message: {full} attachment\n", cwd=work)

    gone = rig.full("test", "20100625.0127.35.122.7509656")
    rig.expect(("attachmesg", "--msg_id", gone, "--pathname", "a.txt"), 1,
               f"fail cannot find message for Message: {gone} attachment\n", cwd=work)
    rig.expect(("commitmesg", "--msg_id", gone), 1, "fail cannot find message\n")


# ---------------------------------------------------------------- single_que (S5.6)


def test_single_que_returns_the_waiting_message(rig: Rig) -> None:
    """`sq` is paused, so what it holds stays in que."""
    first = rig.send("sq", "--dest", "sq", "--param1", "one", cmd="single_que")
    rig.expect(("state", "--msg_id", first), 0, "ok que\n")
    for args, module in ((("--dest", "sq", "--param1", "two"), False),
                         (("--dest", "/q/sq"), True),
                         # a URL names its queue like a full id; never relayed (S19)
                         (("--dest", "http://elsewhere.example:1/q/sq", "--relay-ok"), False)):
        assert rig.send("sq", *args, cmd="single_que", module=module) == first
    assert rig.counts("sq")["que"] == 1
    rig.expect(("deletemesg", "--msg_id", first), 0, "ok msg deleted\n")
    second = rig.send("sq", "--dest", "sq", cmd="single_que")
    assert second != first
    rig.expect(("deletemesg", "--msg_id", second), 0, "ok msg deleted\n")


# ---------------------------------------------------------------- counts, show, clone


def test_statuscountmesg_after_resends(rig: Rig) -> None:
    """statuscountmesg shows `count` after resends (S5.4)."""
    full = rig.send("test", "--dest", "test", "--param1", "resend", "--param2", "3")
    assert rig.wait_state(full, *FINAL) == "done"
    rig.expect(("statuscountmesg", "--msg_id", full), 0, "ok 3\n")
    rig.expect(("statusmesg", "--msg_id", full), 0, "ok done - after 3 resends\n")

    # S5.4: count 1, max 2, a script that keeps resending -> err with count 2
    full = rig.send("test", "--dest", "test", "--param1", "resend", "--param2", "9",
                    "--count", "1", "--max_count", "2")
    assert rig.wait_state(full, *FINAL) == "err"
    rig.expect(("statuscountmesg", "--msg_id", full), 0, "ok 2\n", module=True)
    rig.expect(("statusmesg", "--msg_id", full), 0,
               "ok err - HIT MAX RESEND COUNT - MOVING TO ERR\n")


def test_showmesg_compact_json(rig: Rig) -> None:
    """showmesg: `ok <compact JSON of the message as read>` (S19, S4.5)."""
    full = rig.send("test", "--dest", "test", "--param1", "show")
    assert rig.wait_state(full, *FINAL) == "done"
    res = rig.rq("showmesg", "--msg_id", full)
    assert res.code == 0 and res.err == "" and res.out.startswith("ok ")
    msg = json.loads(res.out[3:])
    assert res.out == "ok " + json.dumps(msg, separators=(",", ":")) + "\n"  # compact
    short = short_id(full)
    day, hm = short.split(".")[:2]
    assert msg["path"] == f"queue/test/done/{day}/{hm[:2]}/{hm[2:]}/{short}"
    assert (msg["msg_id"], msg["state"], msg["status"]) == (short, "done", "done - hello show")
    assert (rig.root / msg["path"] / "msg").is_file()


def test_clone(rig: Rig) -> None:
    """clone_message (S7.3): from err only here; never `ok ["fail",…]` (S19 fix)."""
    src = rig.send("test", "--dest", "test", "--param1", "fail", "--max_count", "4")
    assert rig.wait_state(src, *FINAL) == "err"
    rig.expect(("statusmesg", "--msg_id", src), 0, "ok err - by design\n")
    res = rig.rq("clone", "--msg_id", src)
    m = re.fullmatch(rf"ok ({re.escape(rig.full('test', ''))}{ID_RE})\n", res.out)
    assert m and res.code == 0 and res.err == "", res
    clone = m.group(1)
    assert clone != src
    assert rig.wait_state(clone, *FINAL) == "err"
    msg = rig.message(clone)
    assert (msg["cloned_from"], msg["param1"], msg["max_count"], msg["count"]) == \
        (short_id(src), "fail", 4, 0)

    waiting = rig.send("test", "--dest", "test", f"--due={int(time.time()) + 3600}")
    rig.expect(("clone", "--msg_id", waiting), 1, "fail cannot clone message in que state\n")
    rig.expect(("deletemesg", "--msg_id", waiting), 0, "ok msg deleted\n", module=True)
    rig.expect(("clone", "--msg_id", waiting), 1, "fail msg not found\n")


# ---------------------------------------------------------------- running jobs: destroy, run


def test_destroy_running_job(rig: Rig) -> None:
    """destroymesg SIGTERMs the job's group (S6.8); S6.6 rule 1 then moves it to err."""
    release = release_file(rig, "destroy")
    full = rig.send("test", "--dest", "test", "--param1", "hold", "--param2", str(release))
    try:
        # S5.1: a due message with a free slot is already in run when create_message replies
        rig.expect(("state", "--msg_id", full), 0, "ok run\n")
        wait_for(lambda: rig.message(full)["status"] == "run - holding", what="job started")
        pid_file = rig.root / rig.message(full)["path"] / "pid"
        pid = int(wait_for(lambda: pid_file.exists() and pid_file.read_text().strip(),
                           what="pid file"))
        rig.expect(("statusmesg", "--msg_id", full), 0, "ok run - holding\n")
        rig.expect(("deletemesg", "--msg_id", full), 1,
                   "fail cannot delete message in run state\n")
        rig.expect(("runmesg", "--msg_id", full), 1, "fail msg already running\n")
        rig.expect(("clone", "--msg_id", full), 1, "fail cannot clone message in run state\n")

        rig.expect(("destroymesg", "--msg_id", full), 0, "ok msg destroyed\n")
        assert rig.wait_state(full, *FINAL) == "err"
        rig.expect(("statusmesg", "--msg_id", full), 0,
                   "ok err - PROCESS EXITED IMPROPERLY - MOVING TO ERR - Completion was  "
                   f"but exit status was pid {pid} SIGTERM (signal 15)\n")
        rig.expect(("destroymesg", "--msg_id", full), 1, "fail msg not running\n")
        rig.expect(("deletemesg", "--msg_id", full), 0, "ok msg deleted\n")
        rig.expect(("destroymesg", "--msg_id", full), 1, "fail msg not found\n")
    finally:
        release.touch()


def test_runmesg(rig: Rig) -> None:
    """runmesg on a message due in an hour starts it now (S5.5)."""
    full = rig.send("test", "--dest", "test", "--param1", "later",
                    f"--due={int(time.time()) + 3600}")
    rig.expect(("state", "--msg_id", full), 0, "ok que\n")
    rig.expect(("runmesg", "--msg_id", full), 0, "ok msg sent to front of run queue\n")
    assert rig.state(full) in ("run", "done")                     # S5.1: no waiting
    assert rig.wait_state(full, *FINAL) == "done"
    rig.expect(("statusmesg", "--msg_id", full), 0, "ok done - hello later\n")
    rig.expect(("runmesg", "--msg_id", full), 1, "fail msg not in runnable state\n",
               module=True)


def test_held_job_completes_when_released(rig: Rig) -> None:
    """The `hold` job the destroy test relies on finishes normally once released."""
    release = release_file(rig, "release")
    full = rig.send("test", "--dest", "test", "--param1", "hold", "--param2", str(release))
    try:
        rig.wait_state(full, "run")
    finally:
        release.touch()
    assert rig.wait_state(full, *FINAL) == "done"
    rig.expect(("statusmesg", "--msg_id", full), 0, "ok done - released\n")


# ---------------------------------------------------------------- queues and admin (S3.5, S7.2)


def queue_lines(**status: str) -> str:
    """The expected `rq queues` output: every queue of the rig, UP unless given."""
    base = {"adm": "UP", "analytics": "UP", "cleaner": "UP", "relay": "UP", "sq": "PAUSE",
            "test": "UP", "webhook": "UP", **status}
    return "".join(f"{name} {st}\n" for name, st in sorted(base.items()))


def test_queues_and_admin(rig: Rig) -> None:
    """`rq admin` (S7.2 manager commands) and `rq queues` (S3.5 statuses)."""
    try:
        rig.expect(("queues",), 0, queue_lines())
        rig.expect(("admin", "--queue", "adm", "--op", "pause"), 0, "ok adm\n")
        rig.expect(("queues",), 0, queue_lines(adm="PAUSE"), module=True)
        paused = rig.send("adm", "--dest", "adm", "--param1", "paused")  # accepted, not run
        rig.expect(("state", "--msg_id", paused), 0, "ok que\n")
        rig.expect(("admin", "--queue", "adm", "--op", "resume"), 0, "ok adm\n")
        assert rig.wait_state(paused, *FINAL) == "done"

        rig.expect(("admin", "--queue", "adm", "--op", "down"), 0, "ok adm\n")
        rig.expect(("queues",), 0, queue_lines(adm="DOWN"))
        rig.expect(("sendmesg", "--dest", "adm"), 1, "fail status: DOWN\n")
        rig.expect(("state", "--msg_id", paused), 1, "fail status: DOWN\n")
        rig.expect(("admin", "--queue", "adm", "--op", "pause"), 0, "ok adm\n")
        rig.expect(("queues",), 0, queue_lines(adm="DOWN"))       # DOWN wins over PAUSE
        rig.expect(("admin", "--queue", "adm", "--op", "up"), 0, "ok adm\n")
        rig.expect(("queues",), 0, queue_lines(adm="PAUSE"))      # up does not clear a pause
        rig.expect(("admin", "--queue", "adm", "--op", "resume"), 0, "ok adm\n")
        rig.expect(("queues",), 0, queue_lines())

        pid = queue_pid(rig, "adm")
        rig.expect(("admin", "--queue", "adm", "--op", "restart"), 0, "ok adm\n")
        wait_for(lambda: queue_pid(rig, "adm") not in (None, pid), what="adm restarted")
        wait_for(lambda: rig.rq("queues").out == queue_lines(), what="adm UP again")
        full = rig.send("adm", "--dest", "adm", "--param1", "restarted")
        assert rig.wait_state(full, *FINAL) == "done"

        rig.expect(("admin", "--queue", "nosuch", "--op", "pause"), 1,
                   "fail invalid queue name\n")
        rig.expect(("admin", "--queue", "adm"), 1, "", "rq: missing required argument --op\n")
    finally:
        for flag in ("down", "pause"):
            (rig.root / "config" / f"adm.{flag}").unlink(missing_ok=True)


def test_queues_show_supervision_and_script_errors(rig: Rig) -> None:
    """Queues added by `rq-mgr reload` (S2.4): one whose config can never work is FATAL
    (S2.3), one whose script is missing turns SCRIPTERROR (S6.1); `rq queues` shows both
    (S3.5), and forgets them once their directories are gone."""
    make_queue(rig.root, "broken")                                   # no script: S3.4
    make_queue(rig.root, "noscript", rig.base / "no-such-script.sh")
    try:
        assert rq_mgr(rig.root, "reload").code == 0
        wait_for(lambda: rig.rq("queues").out == queue_lines(broken="FATAL", noscript="UP"),
                 what="new queues listed")
        rig.expect(("sendmesg", "--dest", "broken"), 1, "",
                   "rq: cannot connect to queue broken (is rq-mgr running?)\n")
        full = rig.send("noscript", "--dest", "noscript")
        assert rig.wait_state(full, *FINAL) == "err"
        rig.expect(("statusmesg", "--msg_id", full), 0,
                   "ok err - SCRIPT ERROR - MOVING TO ERR - script not found: "
                   f"{rig.base / 'no-such-script.sh'}\n")
        rig.expect(("queues",), 0, queue_lines(broken="FATAL", noscript="SCRIPTERROR"))
    finally:
        for name in ("broken", "noscript"):
            shutil.rmtree(rig.root / "queue" / name)
        assert rq_mgr(rig.root, "reload").code == 0
    wait_for(lambda: rig.rq("queues").out == queue_lines(), what="removed queues forgotten")


def test_root_from_environment_and_cwd(rig: Rig) -> None:
    """S1.2 rules 2 and 3 against the real manager (no --root)."""
    full = rig.send("test", "--dest", "test", "--param1", "env", root_flag=False,
                    env={"RQ_ROOT": str(rig.root)})
    assert rig.wait_state(full, *FINAL) == "done"
    rig.expect(("statusmesg", "--msg_id", full), 0, "ok done - hello env\n",
               root_flag=False, cwd=rig.root / "queue" / "test", module=True)
    rig.expect(("queues",), 0, queue_lines(), root_flag=False, cwd=rig.root / "log")


def queue_pid(rig: Rig, name: str) -> int | None:
    """The pid the manager reports for a RUNNING queue process, else None."""
    try:
        reply = client.call_mgr(str(rig.root), "status")
    except ConnectError:
        return None
    child = reply[1]["queues"][name]
    return child["pid"] if child["state"] == "RUNNING" else None


# ---------------------------------------------------------------- local errors (S19.3)


def test_local_errors(rig: Rig) -> None:
    """The S19.3 local errors: one line on stderr, nothing on stdout, exit 1."""
    far = "http://h.example:1/q/nosuch/20100625.0127.35.122.7509656"
    for args in (("state", "--msg_id", far), ("sendmesg", "--dest", "nosuch"),
                 ("sendmesg", "--dest", "/q/nosuch"), ("single_que", "--dest", "nosuch"),
                 ("attachmesg", "--msg_id", far, "--pathname", __file__)):
        rig.expect(args, 1, "", "rq: queue not found: nosuch\n")
    rig.expect(("sendmesg", "--dest", "bad.name"), 1, "", "rq: queue not found: bad.name\n")
    for bad in ("garbage", "20100625.0127.35.122.7509656", "http://h/q/test/notanid"):
        rig.expect(("showmesg", "--msg_id", bad), 1, "", f"rq: invalid msg_id: {bad}\n")
    rig.expect(("state",), 1, "", "rq: missing required argument --msg_id\n", module=True)
    rig.expect(("sendmesg", "--param1", "x"), 1, "", "rq: missing required argument --dest\n")
    # an unknown flag is ignored with a warning; the command still runs
    gone = rig.full("test", "20100625.0127.35.122.7509656")
    rig.expect(("state", "--msg_id", gone, "--bogus"), 1, "fail msg not found\n",
               "rq: warning: ignoring unknown flag --bogus\n")
    rig.expect(("nosuchcommand",), 1, "", "Command not found: nosuchcommand\n")


# ---------------------------------------------------------------- fsck, and a stopped manager


def test_fsck_and_stopped_manager(tmp_path: Path) -> None:
    """A root of its own: its store is corrupted by hand and its manager stopped."""
    root, port = install_root(tmp_path, "fq", relative_root="/therq")
    rig = Rig(root, port, tmp_path, prefix="/therq/")   # S1.4: ROOT ends with `/`
    try:
        assert rq_mgr(root, "start").triple == (0, "", "")
        # full ids carry ROOT (S4.2); a `ROOTq/NAME` dest names the local queue (S19)
        first = rig.send("fq", "--dest", "/therq/q/fq", "--param1", "a")
        second = rig.send("fq", "--dest", "/q/fq", "--param1", "b", module=True)
        for full in (first, second):
            assert rig.wait_state(full, *FINAL) == "done"
        ok = "fsck: 5 queue(s), 2 message(s): OK\n"
        rig.expect(("fsck",), 0, ok)

        msg_file = root / rig.message(first)["path"] / "msg"
        where = f"fq/done/{short_id(first)}"
        msg_file.write_text("{not json")
        res = rig.rq("fsck", module=True)
        assert res.code == 1 and res.err == "", res
        lines = res.out.splitlines()
        assert [line for line in lines if line.startswith("problem: ")] == \
            [f"problem: {where}: msg unreadable (JSONDecodeError)"]
        assert lines[-1] == "fsck: 5 queue(s), 2 message(s): 1 problem(s)"
        rig.expect(("showmesg", "--msg_id", first), 1, "fail msg couldn't be read\n")
        msg_file.write_text(json.dumps({"msg_id": short_id(second), "dest": "fq"}))
        res = rig.rq("fsck")
        assert res.code == 1 and f"problem: {where}: msg does not describe this message\n" \
            in res.out, res
        rig.expect(("state", "--msg_id", second), 0, "ok done\n")
    finally:
        stop_mgr(root)

    assert rq_mgr(root, "status").code == 3
    stopped: list[tuple[str, ...]] = [("state", "--msg_id", second), ("sendmesg", "--dest", "fq"),
                                      ("attachmesg", "--msg_id", second, "--pathname", __file__)]
    for args in stopped:
        rig.expect(args, 1, "", "rq: cannot connect to queue fq (is rq-mgr running?)\n")
    rig.expect(("sendmesg", "--dest", "http://far.example/q/x", "--relay-ok"), 1, "",
               "rq: cannot connect to queue relay (is rq-mgr running?)\n", module=True)
    for args in [("queues",), ("admin", "--queue", "fq", "--op", "pause")]:
        rig.expect(args, 1, "", "rq: cannot connect to rq-mgr (is it running?)\n")
    # fsck reads the disk only: it works without a manager
    res = rig.rq("fsck")
    assert res.code == 1 and res.out.endswith("fsck: 5 queue(s), 2 message(s): 1 problem(s)\n")
