"""A full disk and exhausted inodes on a real small file system (issue 13, part 3; S0.3,
S0.3.3, S6.6, S7.1, S14.8).

The whole root lives on a tmpfs mounted with `size=` (blocks) or `nr_inodes=` (inodes) by the
test (root only: the CI runs as root).  A real rq-mgr with its web server and a queue runs
there; then the file system is filled to the last block or the last inode.  Checked:
* every interface refuses a create with one clear line (socket `fail`, `rq sendmesg`'s
  output and exit 1, HTTP JSON) and no daemon dies;
* nothing acknowledged before is lost: jobs that end while the disk is full finish once
  space is back, without a restart (D8: not stuck in run/), and the log does not flood
  with one line per retry;
* service comes back on its own as soon as space is freed.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from rqtest import REPO, wait_for, write_script
from webtest import Mgr, build_root, rq_mgr

from rq import client
from rq.fsck import check_root

pytestmark = pytest.mark.timeout(600)

SCRIPT = """#!/bin/sh
while [ ! -e "$RQ_PARAM1" ]; do sleep 0.05; done
echo "done finished" >&3
"""


def mount_tmpfs(where: Path, options: str) -> None:
    where.mkdir()
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)],
                            capture_output=True, text=True)
    if result.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({result.stderr.strip()}): needs root")


@pytest.fixture(params=["blocks", "inodes"])
def small(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, Path]]:
    if os.geteuid() != 0:
        pytest.skip("mounting a small file system needs root")
    mnt = tmp_path / "fs"
    mount_tmpfs(mnt, "size=64m,nr_inodes=20000")
    try:
        yield request.param, mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def fill(kind: str, mnt: Path) -> list[Path]:
    """Use up the file system's blocks or inodes; the files to remove to free it."""
    filler = mnt / "filler"
    filler.mkdir()
    made: list[Path] = []
    if kind == "blocks":
        path = filler / "blocks"
        for bs, flags in (("1M", []), ("4k", ["oflag=append", "conv=notrunc"])):
            subprocess.run(["dd", "if=/dev/zero", f"of={path}", f"bs={bs}", *flags],
                           capture_output=True)
        made.append(path)
        return made
    i = 0
    while True:
        path = filler / f"i{i}"
        try:
            path.touch()
        except OSError:
            return made
        made.append(path)
        i += 1


def free(made: list[Path]) -> None:
    for path in made:
        path.unlink()


def log_lines(root: Path, text: str) -> int:
    try:
        return sum(text in line for line in (root / "log" / "queuemgr.log").read_text(
            errors="replace").splitlines())
    except OSError:
        return 0


def test_full_file_system(small: tuple[str, Path], tmp_path: Path) -> None:
    kind, mnt = small
    root = build_root(mnt)
    write_script(root.parent / "done.sh", SCRIPT)
    (root / "queue" / "test" / "config.json").write_text(json.dumps(
        {"name": "test", "script": str(root.parent / "done.sh"), "num_workers": 3,
         "exec_prefix": ""}))
    port = json.loads((root / "config" / "config.json").read_text())["port"]
    release = tmp_path / "release"          # outside the full file system
    mgr = Mgr(root)
    try:
        acked = [client.call_queue(str(root), "test", "create_message",
                                   {"dest": "test", "param1": str(release)})[1]
                 for _ in range(3)]
        wait_for(lambda: client.call_queue(str(root), "test", "num_messages")["run"] == 3, 20,
                 what="three running jobs")
        made = fill(kind, mnt)
        # creates go on while the queue's spare directories last (rq.spares: made ahead);
        # each one acknowledged must survive; then every interface refuses clearly
        for _ in range(500):
            reply = client.call_queue(str(root), "test", "create_message",
                                      {"dest": "test", "param1": str(release)})
            if reply[0] != "ok":
                break
            acked.append(reply[1])
        assert reply[0] == "fail" and "No space left on device" in reply[1], reply
        # The create journal's settle removes a segment (an inode) about once a second, so a
        # later create may find one free inode and succeed: each interface is asked until it
        # refuses, and whatever it acknowledged meanwhile must survive too.
        for _ in range(20):
            cli = subprocess.run([str(REPO / "bin" / "rq"), "--root", str(root), "sendmesg",
                                  "--dest", "test", "--param1", str(release)],
                                 capture_output=True, text=True, timeout=60)
            if cli.returncode != 0 or not cli.stdout.startswith("ok "):
                break
            acked.append(cli.stdout.split()[1])
        assert cli.returncode == 1 and "No space left on device" in cli.stdout + cli.stderr, cli
        assert "Traceback" not in cli.stdout + cli.stderr
        for _ in range(20):
            resp = requests.post(f"http://127.0.0.1:{port}/q/test/new_message",
                                 json={"dest": "test", "param1": str(release)}, timeout=30)
            assert resp.status_code < 500 or resp.status_code == 503, resp.status_code
            body = resp.json()
            if body[0] != "ok":
                break
            acked.append(body[1])
        assert body[0] == "fail" and "No space left on device" in body[1], body
        # the jobs end while the disk is full: they wait in run/, retried with backoff.  The
        # three that run now end first: one of them fails to finish, or all three finish (on
        # spares and buckets made ahead).  Those queued behind them may not even start until
        # inodes are back (a job start takes spares the queue may not have made in time).
        release.touch()
        wait_for(lambda: log_lines(root, "cannot finish") >= 1 or all(
            client.call_queue(str(root), "test", "get_message_state", {"msg_id": a})[1]
            == "done" for a in acked[:3]), 20, what="the first finish attempt")
        assert client.call_queue(str(root), "test", "ping") == ["pong"]
        assert client.call_mgr(str(root), "ping") == ["pong"]
        assert requests.get(f"http://127.0.0.1:{port}/q.json", timeout=30).status_code == 200
        # space back: the jobs finish and creates succeed, with no restart
        free(made)
        wait_for(lambda: all(client.call_queue(str(root), "test", "get_message_state",
                                               {"msg_id": a})[1] == "done" for a in acked),
                 60, 0.05, what="the acknowledged messages to finish once space is back")
        reply = wait_for(lambda: (r := client.call_queue(
            str(root), "test", "create_message", {"dest": "test", "param1": str(release)}))[0]
            == "ok" and r, 10, what="creates to succeed again")
        assert client.call_queue(str(root), "test", "get_message_state",
                                 {"msg_id": reply[1]})[0] == "ok"
        assert log_lines(root, "cannot finish") <= 10   # D8: no line per retry
    finally:
        mgr.stop()
    assert check_root(str(root)).problems == []
    assert rq_mgr(root, "status").returncode == 3   # stopped cleanly
