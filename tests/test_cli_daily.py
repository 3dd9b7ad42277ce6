"""Daily use of the `rq` command (issue 16 items 3, 4, 5; issue 15 item 3), end to end:
`--json` on every read command, help and bash completion, queue admin (`createqueue`,
`configqueue`, `deletequeue`), and the imports of a plain message command.  Real
processes throughout: `bin/rq` against a real `rq-mgr` with real queue processes in a
root made by `rq-install` (the helpers of test_cli_e2e), and a real bash running the
completion script."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from rqtest import REPO, make_queue, short_id, wait_for
from test_cli_e2e import FINAL, PYTHON, Rig, install_root, rq_mgr, run_prog, stop_mgr

from rq import client
from rq.cli import base, helptext

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    """A root with queue `jq` (JOB_SH, 4 workers) served by one `rq-mgr`."""
    base_dir = tmp_path_factory.mktemp("cli_daily")
    root, port = install_root(base_dir, "jq")
    try:
        assert rq_mgr(root, "start").triple == (0, "", "")
        yield Rig(root, port, base_dir)
    finally:
        stop_mgr(root)


def json_out(rig: Rig, *args: str) -> object:
    """Run `rq ARGS --json`: exit 0, nothing on stderr, one JSON document on stdout."""
    res = rig.rq(*args, "--json")
    assert (res.code, res.err) == (0, ""), res
    assert res.out.endswith("\n") and res.out.count("\n") == 1, res.out
    return json.loads(res.out)


# ---------------------------------------------------------------- --json (issue 16 item 3)


def test_read_commands_print_one_json_document(rig: Rig) -> None:
    full = rig.send("jq", "--dest", "jq", "--param1", "json")
    assert rig.wait_state(full, *FINAL) == "done"
    assert json_out(rig, "state", "--msg_id", full) == {"msg_id": full, "state": "done"}
    status = json_out(rig, "statusmesg", "--msg_id", full)
    assert isinstance(status, dict)
    assert (status["msg_id"], status["state"], status["status"]) == (
        full, "done", "done - hello json")
    assert json_out(rig, "statuscountmesg", "--msg_id", full) == {"msg_id": full, "count": 0}
    assert json_out(rig, "showmesg", "--msg_id", full) == rig.message(full)
    assert json_out(rig, "attachstatusmesg", "--msg_id", full) == {
        "msg_id": full, "attachments": []}


def test_attachments_as_json(rig: Rig, tmp_path: Path) -> None:
    held = rig.send("jq", "--dest", "jq", cmd="prepmesg")
    (tmp_path / "b.txt").write_bytes(b"bee\n")
    (tmp_path / "a.txt").write_bytes(b"a\n")
    for name in ("b.txt", "a.txt"):
        assert rig.rq("attachmesg", "--msg_id", held, "--pathname",
                      str(tmp_path / name)).code == 0
    got = json_out(rig, "attachstatusmesg", "--msg_id", held)
    assert isinstance(got, dict)
    assert [(a["name"], a["size"]) for a in got["attachments"]] == [("a.txt", 2), ("b.txt", 4)]
    text = rig.rq("attachstatusmesg", "--msg_id", held).out.splitlines()
    assert text[0] == "ok 2" and [line.split()[0] for line in text[1:]] == ["a.txt", "b.txt"]


def test_queues_as_json(rig: Rig) -> None:
    got = json_out(rig, "queues")
    assert isinstance(got, list)
    by_name = {q["name"]: q for q in got}
    assert sorted(by_name) == ["analytics", "cleaner", "jq", "relay", "webhook"]
    jq = by_name["jq"]
    assert (jq["status"], jq["state"]) == ("UP", "RUNNING") and jq["pid"] > 0
    assert jq["counts"] == client.call_queue(str(rig.root), "jq", "num_messages")


def test_reserve_as_json(rig: Rig) -> None:
    """A pull queue made with `rq createqueue --queue pq --mode pull` (S8.1; `--queue` is
    taken as `--name`); `reserve --json` prints null when nothing is there, else the S8.2
    reservation alone."""
    assert rig.rq("createqueue", "--queue", "pq", "--mode", "pull").triple == (
        0, "ok pq running\n", "")
    try:
        assert json_out(rig, "reserve", "--pattern", "pq") is None
        full = rig.send("pq", "--dest", "pq", "--param1", "p")
        res = json_out(rig, "reserve", "--pattern", "pq", "--wait", "5", "--consumer", "t")
        assert isinstance(res, dict)
        assert (res["full_msg_id"], res["queue"], res["topic"]) == (full, "pq", "pq")
        assert rig.rq("report", "--msg_id", full, "--token", res["token"],
                      "--line", "done ok").code == 0
    finally:
        assert rig.rq("deletequeue", "--queue", "pq").code == 0


def test_json_errors_are_one_line_on_stderr(rig: Rig) -> None:
    gone = rig.full("jq", "20100625.0127.35.122.7509656")
    for cmd in ("state", "statusmesg", "statuscountmesg", "showmesg", "attachstatusmesg"):
        assert rig.rq(cmd, "--msg_id", gone, "--json").triple == (
            1, "", "rq: msg not found\n"), cmd
    # the text form keeps S19.3's reply on stdout
    assert rig.rq("state", "--msg_id", gone).triple == (1, "fail msg not found\n", "")


# ---------------------------------------------------------------- queue admin (issue 16 item 5)


def test_create_change_and_delete_a_queue(rig: Rig) -> None:
    script = rig.base / "job.sh"
    assert rig.rq("createqueue", "--name", "made", "--script", str(script),
                  "--exec_prefix", "", "--num_workers", "2",
                  "--env_vars", '{"GREETING": "hi"}').triple == (0, "ok made running\n", "")
    config = client.call_queue(str(rig.root), "made", "config")[1]
    assert (config["num_workers"], config["env_vars"]) == (2, {"GREETING": "hi"})
    full = rig.send("made", "--dest", "made", "--param1", "x")
    assert rig.wait_state(full, *FINAL) == "done"

    assert rig.rq("configqueue", "--queue", "made", "--num_workers", "3",
                  "--blocking_params", "1,2").triple == (0, "ok made reloaded\n", "")
    config = client.call_queue(str(rig.root), "made", "config")[1]
    assert (config["num_workers"], config["blocking_params"]) == (3, [1, 2])
    on_disk = json.loads((rig.root / "queue" / "made" / "config.json").read_text())
    assert on_disk["num_workers"] == 3 and on_disk["env_vars"] == {"GREETING": "hi"}

    before = (rig.root / "queue" / "made" / "config.json").read_text()
    assert rig.rq("configqueue", "--queue", "made", "--num_workers", "500").triple == (
        1, "", "rq: cannot change queue made: "
               "json config has invalid num_workers field (out of range 1..128)\n")
    assert (rig.root / "queue" / "made" / "config.json").read_text() == before

    assert rig.rq("deletequeue", "--queue", "made").triple == (0, "ok made deleted\n", "")
    assert not (rig.root / "queue" / "made").exists()
    assert "made" not in rig.rq("queues").out.split()


def test_create_from_a_file_and_its_errors(rig: Rig, tmp_path: Path) -> None:
    spec = tmp_path / "fromfile.json"
    spec.write_text(json.dumps({"name": "fromfile", "script": str(rig.base / "job.sh"),
                                "exec_prefix": "", "num_workers": 1}))
    # flags override the file
    assert rig.rq("createqueue", "--file", str(spec), "--num_workers", "2").triple == (
        0, "ok fromfile running\n", "")
    assert client.call_queue(str(rig.root), "fromfile", "config")[1]["num_workers"] == 2
    try:
        assert rig.rq("createqueue", "--file", str(spec)).triple == (
            1, "", "rq: cannot create queue fromfile: already created\n")
        assert rig.rq("createqueue", "--name", "noscript").triple == (
            1, "", "rq: cannot create queue noscript: json config is missing script field\n")
        assert rig.rq("createqueue", "--file", str(tmp_path / "nosuch.json")).triple == (
            1, "", f"rq: cannot read {tmp_path / 'nosuch.json'}: No such file or directory\n")
        (tmp_path / "bad.json").write_text("[1]")
        assert rig.rq("createqueue", "--file", str(tmp_path / "bad.json")).triple == (
            1, "", f"rq: {tmp_path / 'bad.json'}: not a JSON object\n")
        assert rig.rq("createqueue", "--name", "x", "--env_vars", "{nope").triple == (
            1, "", "rq: --env_vars is not valid JSON: {nope\n")
        assert rig.rq("createqueue").triple == (
            1, "", 'rq: missing required argument --name (or a "name" in --file)\n')
        assert rig.rq("configqueue", "--queue", "nosuch", "--num_workers", "2").triple == (
            1, "", "rq: queue not found: nosuch\n")
        assert rig.rq("deletequeue", "--queue", "nosuch").triple == (
            1, "", "rq: queue not found: nosuch\n")
    finally:
        assert rig.rq("deletequeue", "--queue", "fromfile").code == 0


def test_configqueue_mends_a_queue_that_could_not_start(rig: Rig) -> None:
    """A queue whose config.json can never work is FATAL (S2.3); `rq configqueue` gives it
    the missing script, the manager's reload restarts it (S2.4), and it runs messages."""
    make_queue(rig.root, "mend")                                      # no script: S3.4
    assert rq_mgr(rig.root, "reload").code == 0
    wait_for(lambda: "mend FATAL\n" in rig.rq("queues").out, what="mend FATAL")
    try:
        res = rig.rq("configqueue", "--queue", "mend", "--script", str(rig.base / "job.sh"))
        assert res.code == 0 and res.err == "" and res.out in (
            "ok mend saved\n", "ok mend reloaded\n"), res       # saved: not up yet
        wait_for(lambda: "mend UP\n" in rig.rq("queues").out, what="mend UP")
        full = rig.send("mend", "--dest", "mend", "--param1", "mended")
        assert rig.wait_state(full, *FINAL) == "done"
    finally:
        assert rig.rq("deletequeue", "--queue", "mend").code == 0


def test_a_linked_config_is_not_replaced(rig: Rig, tmp_path: Path) -> None:
    """`create_queue_link` (S7.2) makes config.json a link to the user's own file:
    `update_queue` refuses to write over it, and says what to do instead."""
    own = tmp_path / "linked.json"
    own.write_text(json.dumps({"name": "linked", "script": str(rig.base / "job.sh"),
                               "exec_prefix": ""}))
    assert client.call_mgr(str(rig.root), "create_queue_link", str(own), raw=True)[0] == "success"
    try:
        assert rig.rq("configqueue", "--queue", "linked", "--num_workers", "2").triple == (
            1, "", f"rq: cannot change queue linked: the config of queue linked is a link to "
                   f"{own.resolve()}: change that file, then reload\n")
        assert json.loads(own.read_text())["name"] == "linked"
        assert "num_workers" not in json.loads(own.read_text())
    finally:
        assert rig.rq("deletequeue", "--queue", "linked").code == 0


def test_delete_is_refused_while_messages_run_and_force_drains(rig: Rig) -> None:
    assert rig.rq("createqueue", "--name", "busy", "--script", str(rig.base / "job.sh"),
                  "--exec_prefix", "").code == 0
    release = rig.base / "release-busy"
    held = rig.send("busy", "--dest", "busy", "--param1", "hold", "--param2", str(release))
    rig.wait_state(held, "run")
    waiting = rig.send("busy", "--dest", "busy", "--param1", "later")
    assert rig.rq("deletequeue", "--queue", "busy").triple == (
        1, "", "rq: queue busy is running 1 message(s): wait for them, or use --force to "
               "pause it and delete it once they end\n")
    assert rig.state(held) == "run"
    assert rig.rq("deletequeue", "--queue", "busy", "--force", "--timeout", "0.2").triple == (
        1, "", "rq: queue busy still runs 1 message(s) after 0.2 s; it is left paused\n")

    cmd = [str(REPO / "bin" / "rq"), "--root", str(rig.root), "deletequeue", "--queue", "busy",
           "--force"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          env=env) as proc:
        release.touch()  # the held job ends; the paused queue starts no other one
        out, err = proc.communicate(timeout=60)
    assert (proc.returncode, out, err) == (0, "ok busy deleted\n", "")
    trash = [p for p in (rig.root / "queue").iterdir() if p.name.startswith("busy.deleted.")]
    assert len(trash) == 1                                            # S3.7
    assert list(trash[0].glob(f"done/*/*/*/{short_id(held)}"))        # it finished, not killed
    assert (trash[0] / "que" / short_id(waiting)).is_dir()            # never started
    (rig.root / "config" / "busy.pause").unlink()


# ---------------------------------------------------------------- help (issue 16 item 4)


def every_flag() -> dict[str, frozenset[str]]:
    return {name: cmd.flags for name in base.COMMAND_MODULES
            if (cmd := base.load_command(name)) is not None}


def test_every_command_and_flag_has_help() -> None:
    """The dispatch table, the registry and the help table agree, so a command added
    to one and not the others fails here."""
    flags = every_flag()
    assert sorted(flags) == sorted(base.COMMAND_MODULES) == sorted(helptext.COMMANDS)
    for name, known in flags.items():
        summary, documented, example = helptext.COMMANDS[name]
        assert summary and example.startswith(f"rq {name}"), name
        assert set(documented) == known, name
        for flag, (text, sample) in documented.items():
            assert text and sample.startswith(f"--{flag}"), (name, flag)


def test_a_closed_pipe_is_not_an_error() -> None:
    """`rq completion bash | head`: no `Broken pipe` line when the reader stops early (here
    `true`, gone long before Python has started, so every write meets a closed pipe)."""
    res = subprocess.run(f"set -o pipefail; '{REPO / 'bin' / 'rq'}' completion bash | true",
                         shell=True, executable="bash", capture_output=True, text=True,
                         timeout=60, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert (res.returncode, res.stdout, res.stderr) == (0, "", "")


def test_command_help_as_a_subprocess() -> None:
    res = run_prog([str(REPO / "bin" / "rq"), "configqueue", "--help"])
    assert (res.code, res.err) == (0, "")
    assert res.out.startswith("usage: rq configqueue [--root PATH] [FLAGS]\n")
    assert "  --num_workers\n      jobs run at once, 1..128\n      e.g. --num_workers 4\n" \
        in res.out
    assert res.out.endswith("Example:\n  rq configqueue --queue video --num_workers 4\n")


# ---------------------------------------------------------------- bash completion


def complete(rig: Rig, *words: str) -> list[str]:
    """What bash offers for the last of `words` (COMP_WORDS) with `rq completion bash`
    sourced; `rq` is the checkout's bin/rq on PATH."""
    script = rig.rq("completion", "bash", root_flag=False).out
    quoted = " ".join(json.dumps(w) for w in ("rq", *words))
    program = (f"{script}\nCOMP_WORDS=({quoted}); COMP_CWORD={len(words)}\n"
               '_rq_complete; printf "%s\\n" "${COMPREPLY[@]}"\n')
    env = {**os.environ, "PATH": f"{REPO / 'bin'}{os.pathsep}{os.environ['PATH']}",
           "PYTHONPATH": str(REPO)}
    env.pop("RQ_ROOT", None)
    res = subprocess.run(["bash", "--norc", "--noprofile", "-c", program], env=env,
                         capture_output=True, text=True, timeout=60, cwd=str(rig.base))
    assert res.returncode == 0 and res.stderr == "", res
    return sorted(line for line in res.stdout.splitlines() if line)


def test_bash_completion(rig: Rig) -> None:
    assert complete(rig, "s") == ["sendmesg", "showmesg", "single_que", "state",
                                  "statuscountmesg", "statusmesg"]
    assert complete(rig, "--root", str(rig.root), "create") == ["createqueue"]
    assert complete(rig, "sendmesg", "--d") == ["--dest", "--due"]
    assert "--json" in complete(rig, "showmesg", "--")
    assert "--force" in complete(rig, "deletequeue", "--")
    assert complete(rig, "admin", "--op", "re") == ["restart", "resume"]
    assert complete(rig, "createqueue", "--mode", "") == ["pull", "script"]
    queues = ["analytics", "cleaner", "jq", "relay", "webhook"]
    assert complete(rig, "--root", str(rig.root), "sendmesg", "--dest", "") == queues
    assert complete(rig, "--root", str(rig.root), "sendmesg", "--dest", "j") == ["jq"]
    assert complete(rig, "admin", "--root", str(rig.root), "--queue", "re") == ["relay"]
    assert complete(rig, "--root", str(rig.root), "sendmesg", "--dest", "=", "c") == ["cleaner"]
    # outside any root there are no queue names, and no error either
    assert complete(rig, "sendmesg", "--dest", "") == []


# ---------------------------------------------------------------- the fast path (issue 15)


@pytest.mark.parametrize("name", ["sendmesg", "state", "statusmesg", "showmesg", "reserve"])
def test_message_commands_import_only_what_they_use(name: str) -> None:
    """A shell loop of `rq sendmesg` pays for every import (issue 15 item 3): no
    dataclasses (inspect, ast, dis …), typing, config records, help texts or other
    commands' modules on a message command's path; no json package (re, enum, functools:
    rq.jsonwire speaks JSON through its C codec)."""
    probe = ("import sys\nfrom rq.cli import base, entry\n"
             f"assert base.load_command({name!r}) is not None\n"
             "print(' '.join(sorted(sys.modules)))\n")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    res = subprocess.run([PYTHON, "-c", probe], capture_output=True, text=True, env=env,
                         timeout=60, check=True)
    loaded = set(res.stdout.split())
    heavy = {"dataclasses", "inspect", "typing", "rq.config", "rq.cli.helptext",
             "rq.cli.queueadmin", "rq.cli.completion", "click", "croniter",
             "socket", "selectors",  # rq.client speaks through _socket (issue 15)
             "json", "re", "enum", "functools", "collections"}
    assert not heavy & loaded
