"""Helpers for web tests: a real rq-mgr over a temp root, and the Flask app of it."""

from __future__ import annotations

import subprocess
from pathlib import Path

from rqtest import REPO, free_port, make_queue, make_root, write_script

DONE_SCRIPT = ('#!/bin/sh\necho "run working"  >&3\necho "hello from $RQ_MSG_ID"\n'
               'echo "done ok" >&3\n')


def rq_mgr(root: Path, *args: str, timeout: float = 90) -> subprocess.CompletedProcess:
    return subprocess.run([str(REPO / "bin" / "rq-mgr"), "--root", str(root), *args],
                          capture_output=True, text=True, timeout=timeout)


class Mgr:
    """rq-mgr started with `rq-mgr start` on a root; `stop()` always."""

    def __init__(self, root: Path) -> None:
        self.root = root
        result = rq_mgr(root, "start")
        assert result.returncode == 0, result.stderr

    def stop(self) -> None:
        rq_mgr(self.root, "stop")


def build_root(base: Path, **main: object) -> Path:
    """A root with a free port and a queue `test` running DONE_SCRIPT."""
    root = make_root(base, port=free_port(), allow_new_queue=True, **main)
    script = write_script(base / "done.sh", DONE_SCRIPT)
    make_queue(root, "test", script=script)
    return root
