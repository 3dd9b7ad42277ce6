"""Issue 16 item 2 (`rq wait`) and issue 15 item 3 (`rq sendmesg --stdin`, also with
`--url`): the real `bin/rq` as a subprocess against a real rq-mgr and its web server."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from rqtest import REPO, make_queue, write_script
from webtest import build_root, running

from rq import client

RQ = str(REPO / "bin" / "rq")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str]]:
    base = tmp_path_factory.mktemp("cliwait")
    root = build_root(base, relative_root="/therq")
    make_queue(root, "bad", script=write_script(base / "err.sh",
                                                 '#!/bin/sh\necho "err by design" >&3\n'))
    make_queue(root, "held", script="/bin/true")
    (root / "config" / "held.pause").write_text("")  # S3.5: its messages stay in que
    with running(root, web=True) as web:
        yield root, web.url


def rq(root: Path | None, *args: str, stdin: str | None = None,
       timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "RQ_ROOT"}
    argv = [RQ, *(["--root", str(root)] if root is not None else []), *args]
    return subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=timeout,
                          env=env, cwd="/")


def send(root: Path, *args: str) -> str:
    result = rq(root, "sendmesg", *args)
    assert result.returncode == 0 and result.stdout.startswith("ok "), result
    return result.stdout.split()[1]


def que_count(root: Path, name: str) -> int:
    return int(client.call_queue(str(root), name, "num_messages")["que"])


def message(root: Path, full: str) -> dict:
    queue, short = full.split("/q/")[1].split("/")
    reply = client.call_queue(str(root), queue, "get_message", {"msg_id": short})
    assert reply[0] == "ok", reply
    return dict(reply[1])


# ---------------------------------------------------------------- rq wait


def test_issue16_wait_done_err_and_several(site: tuple[Path, str]) -> None:
    root, _ = site
    done = send(root, "--dest", "test", "--due", str(time.time() + 1))
    result = rq(root, "wait", "--msg_id", done)
    assert (result.returncode, result.stdout, result.stderr) == (0, f"{done} done - ok\n", "")
    bad = send(root, "--dest", "bad")
    result = rq(root, "wait", "--msg_id", bad)
    assert (result.returncode, result.stdout) == (1, f"{bad} err - by design\n")
    result = rq(root, "wait", "--msg_id", done, "--msg_id", bad, "--timeout", "30")
    assert result.returncode == 1
    assert result.stdout.splitlines() == [f"{done} done - ok", f"{bad} err - by design"]


def test_issue16_wait_timeout_exits_2(site: tuple[Path, str]) -> None:
    root, _ = site
    later = send(root, "--dest", "held")
    start = time.monotonic()
    result = rq(root, "wait", "--msg_id", later, "--timeout", "0.5")
    assert (result.returncode, result.stdout) == (2, f"{later} que\n")
    assert time.monotonic() - start < 20


def test_issue16_wait_over_http(site: tuple[Path, str]) -> None:
    root, url = site
    done = send(root, "--dest", "test")
    result = rq(None, "wait", "--url", url, "--msg_id", done, "--timeout", "30")
    assert (result.returncode, result.stdout) == (0, f"{done} done - ok\n")


@pytest.mark.parametrize("args, error", [
    ((), "rq: missing required argument --msg_id"),
    (("--msg_id", "nope"), "rq: invalid msg_id: nope"),
    (("--msg_id", "http://h:1/q/test/20200101.0000.00.000.1", "--timeout", "x"),
     "rq: invalid --timeout: x (seconds)"),
    (("--msg_id", "http://h:1/q/nosuch/20200101.0000.00.000.1"), "rq: queue not found: nosuch"),
])
def test_issue16_wait_bad_input_is_one_line(site: tuple[Path, str], args: tuple[str, ...],
                                            error: str) -> None:
    result = rq(site[0], "wait", *args)
    assert (result.returncode, result.stdout, result.stderr) == (1, "", error + "\n")


def test_issue16_wait_for_a_missing_message(site: tuple[Path, str]) -> None:
    full = "http://h:1/therq/q/test/20200101.0000.00.000.1"
    result = rq(site[0], "wait", "--msg_id", full)
    assert (result.returncode, result.stdout) == (1, f"{full} msg not found\n")


# ---------------------------------------------------------------- rq sendmesg --stdin


@pytest.mark.parametrize("transport", ["socket", "http"])
def test_issue15_stdin_one_id_per_line_in_order(site: tuple[Path, str], transport: str) -> None:
    root, url = site
    where = (root, ()) if transport == "socket" else (None, ("--url", url))
    lines = [f"plain {i}" for i in range(700)]
    lines[3] = '{"param1": "json", "param2": 5, "src": "own"}'
    lines[4] = ""  # blank lines are skipped
    result = rq(where[0], "sendmesg", "--dest", "held", "--src", "bulk", "--stdin", *where[1],
                stdin="\n".join(lines) + "\n")
    assert result.returncode == 0 and result.stderr == "", result
    ids = result.stdout.splitlines()
    assert len(ids) == 699 and len(set(ids)) == 699
    assert all("/therq/q/held/" in i for i in ids)
    first = [message(root, i) for i in ids[:5]]
    assert [m["param1"] for m in first] == ["plain 0", "plain 1", "plain 2", "json", "plain 5"]
    assert (first[3]["param2"], first[3]["src"], first[0]["src"]) == ("5", "own", "bulk")
    assert message(root, ids[-1])["param1"] == "plain 699"


@pytest.mark.parametrize("transport", ["socket", "http"])
@pytest.mark.parametrize("bad, error", [
    ('{"due": "soon"}', "invalid due value"),
    ('{"param1": ', "invalid JSON: Expecting value at column 12"),
    ('{param1: "x"}',
     "invalid JSON: Expecting property name enclosed in double quotes at column 2"),
])
def test_issue15_stdin_stops_at_the_first_refused_line(site: tuple[Path, str], transport: str,
                                                       bad: str, error: str) -> None:
    root, url = site
    where = (root, ()) if transport == "socket" else (None, ("--url", url))
    before = que_count(root, "held")
    lines = [f"line {i}" for i in range(1, 401)]
    lines[299] = bad  # line 300
    result = rq(where[0], "sendmesg", "--dest", "held", "--stdin", *where[1],
                stdin="\n".join(lines) + "\n")
    assert (result.returncode, result.stderr) == (1, f"rq: line 300: {error}\n")
    ids = result.stdout.splitlines()
    assert len(ids) == 299
    assert message(root, ids[-1])["param1"] == "line 299"
    assert que_count(root, "held") == before + 299  # none after it


def test_issue15_stdin_needs_dest_and_a_known_queue(site: tuple[Path, str]) -> None:
    root, _ = site
    result = rq(root, "sendmesg", "--stdin", stdin="x\n")
    assert (result.returncode, result.stderr) == (1, "rq: missing required argument --dest\n")
    result = rq(root, "sendmesg", "--dest", "nosuch", "--stdin", stdin="x\n")
    assert (result.returncode, result.stderr) == (1, "rq: queue not found: nosuch\n")
    result = rq(root, "sendmesg", "--dest", "http://x:1/q/a", "--stdin", stdin="x\n")
    assert result.stderr == "rq: cannot relay to http://x:1/q/a without --relay-ok\n"


def test_issue15_stdin_answers_lines_as_they_come(site: tuple[Path, str]) -> None:
    """An idle input (a producer that writes now and then) has its lines queued and their
    ids printed at once, not when the input ends."""
    root, _ = site
    with subprocess.Popen([RQ, "--root", str(root), "sendmesg", "--dest", "held", "--stdin"],
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) as proc:
        try:
            assert proc.stdin is not None and proc.stdout is not None
            proc.stdin.write("first\n")
            proc.stdin.flush()
            full = proc.stdout.readline().strip()  # while the input stays open
            assert message(root, full)["param1"] == "first"
            proc.stdin.close()
            assert proc.wait(30) == 0
        finally:
            proc.kill()


def test_issue16_sendmesg_url_one_message(site: tuple[Path, str]) -> None:
    root, url = site
    result = rq(None, "sendmesg", "--url", url, "--dest", "held", "--param1", "web")
    assert result.returncode == 0 and result.stdout.startswith("ok "), result
    assert message(root, result.stdout.split()[1])["param1"] == "web"
    result = rq(None, "sendmesg", "--url", url, "--dest", "nosuch")
    assert (result.returncode, result.stdout) == (1, "fail Queue not found\n")
