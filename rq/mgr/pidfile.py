"""The manager's pid file `config/queuemgr.pid` (SPEC S1.3, S2.2, S21).

Owns: reading it, claiming it at start-up, deciding whether the process it names is trusted (alive,
not a zombie, and an rq-mgr of *this* root: S21 "a pid file is trusted only
if its process is alive and is an rq-mgr of this root"), writing it by temp
file + rename (S0.3.1) and removing it only while it still names us.

Identity is the process title `[rq-mgr] <root>` (S2.1), compared by real
path so a symlinked spelling of the same root is still the same root.
"""

from __future__ import annotations

import logging
import os

from rq import proc
from rq.errors import RQError

TYPE_CHECKING = False  # rq.fsops is not imported at run time: `rq-mgr start|stop` need no seam
if TYPE_CHECKING:
    from rq.fsops import FsOps

log = logging.getLogger(__name__)

TITLE_PREFIX = "[rq-mgr] "
ALREADY_RUNNING = "ERROR: there is already one or more instance(s) of the program running"


def pid_path(root: str) -> str:
    return os.path.join(root, "config", "queuemgr.pid")


def title(root: str) -> str:
    return TITLE_PREFIX + root


def read_pid(root: str) -> int | None:
    try:
        with open(pid_path(root), encoding="ascii", errors="replace") as f:
            text = f.read(64).strip()
    except OSError:
        return None
    return int(text) if text.isdigit() and int(text) > 1 else None


def is_manager_of(pid: int, root: str) -> bool:
    """Is `pid` a live rq-mgr serving `root`?"""
    text = proc.command_line(pid)
    if text is None or not text.startswith(TITLE_PREFIX):
        return False
    return _same_path(text[len(TITLE_PREFIX):], root)


def _same_path(a: str, b: str) -> bool:
    return os.path.realpath(a) == os.path.realpath(b)


def running_pid(root: str) -> int | None:
    """The pid of the trusted manager of `root`, or None."""
    pid = read_pid(root)
    if pid is not None and is_manager_of(pid, root):
        return pid
    return None


def claim(root: str, pid: int, fs: FsOps) -> None:
    """S2.2 step 2: make the pid file name `pid`, unless a trusted manager of this
    root runs already.  Raises RQError with the line to print."""
    old = read_pid(root)
    if old is not None and old != pid and is_manager_of(old, root):
        raise RQError(ALREADY_RUNNING)
    if old is not None:
        log.info("replacing stale pid file (pid %d)", old)
    try:
        write_pid(root, pid, fs)
    except OSError as exc:
        raise RQError(
            f"ERROR: cannot write config/queuemgr.pid: {exc.strerror or exc}") from exc


def write_pid(root: str, pid: int, fs: FsOps) -> None:
    fs.write_file_atomic(pid_path(root), f"{pid}\n".encode())


def remove_pid(root: str, pid: int | None = None) -> None:
    """Remove the pid file; with `pid`, only while it still names that pid."""
    if pid is not None and read_pid(root) != pid:
        return
    try:
        os.unlink(pid_path(root))
    except FileNotFoundError:
        pass
