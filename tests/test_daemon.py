"""The program edge the daemons share (rq.daemon; SPEC S2.1, S2.3): each daemon run by hand
reports a start it cannot make as one line on stderr and exit 2, with its own texts, and the
same reason goes to log/queuemgr.log (and to stderr by hand); under a manager the line goes
to the ready pipe instead."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rqtest import make_queue, make_root

BAD_CONFIG = "bad config file config/config.json: invalid JSON: "

# module, extra arguments, stderr prefix, ready-pipe prefix (after `fatal `), log role
DAEMONS = [
    ("rq.timers", [], "rq.timers: ", "", "rq-timers"),
    ("rq.scandir", [], "rq.scandir: ", "", "rq-scandir"),
    ("rq.web", [], "ERROR: ", "ERROR: ", "rq-web"),
    ("rq.queue", ["--name", "q"], "rq.queue: ", "", "rq-que q"),
]


def run(module: str, root: Path, *extra: str,
        pass_fds: tuple[int, ...] = ()) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", module, "--root", str(root), *extra],
                          capture_output=True, text=True, timeout=60, pass_fds=pass_fds)


@pytest.mark.parametrize("module,extra,stderr_prefix,ready_prefix,role", DAEMONS)
def test_s2_3_bad_main_config_is_fatal_by_hand_and_on_the_ready_pipe(
        tmp_path: Path, module: str, extra: list[str], stderr_prefix: str, ready_prefix: str,
        role: str) -> None:
    root = make_root(tmp_path)
    (root / "config" / "config.json").write_text("{")
    res = run(module, root, *extra)
    assert res.returncode == 2
    logged, printed = res.stderr.splitlines()  # by hand the log goes to stderr too
    assert f" {role}[" in logged and f"ERROR cannot start: {BAD_CONFIG}" in logged
    assert printed.startswith(f"{stderr_prefix}{BAD_CONFIG}")
    ready_r, ready_w = os.pipe()
    try:
        res = run(module, root, *extra, "--ready-fd", str(ready_w), pass_fds=(ready_w,))
        os.close(ready_w)
        line = os.read(ready_r, 4096).decode()
    finally:
        os.close(ready_r)
    assert res.returncode == 2 and res.stderr == ""
    assert line.startswith(f"fatal {ready_prefix}{BAD_CONFIG}") and line.endswith("\n")
    log = (root / "log" / "queuemgr.log").read_text()
    assert f" {role}[" in log and f"ERROR cannot start: {BAD_CONFIG}" in log


def test_s2_3_invalid_queue_config_is_the_queue_fatal_reason(tmp_path: Path) -> None:
    root = make_root(tmp_path)
    make_queue(root, "q")
    (root / "queue" / "q" / "config.json").write_text(json.dumps({"name": "q"}))
    res = run("rq.queue", root, "--name", "q")
    assert res.returncode == 2
    assert res.stderr.splitlines()[-1] == "rq.queue: json config is missing script field"
