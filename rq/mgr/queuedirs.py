"""What the manager reads and changes in `queue/` (SPEC S2.2, S2.5, S3.2, S3.7).

Owns: which directories are queues to supervise (a valid name and a readable
config.json), whether a queue can ever start as configured, a queue's
kill_grace for stop deadlines, moving a queue to the trash, and finding the
process groups of a queue's jobs and its queue process for a forceful stop.
Messages are the queue process's: nothing here reads or moves them.
"""

from __future__ import annotations

import json
import logging
import os

from rq import proc
from rq.client import queue_socket_problem
from rq.config import load_queue_config
from rq.errors import ConfigError
from rq.protocol import valid_queue_name

TYPE_CHECKING = False  # rq.fsops is not imported at run time: `rq-mgr start|stop` need no seam
if TYPE_CHECKING:
    from rq.fsops import FsOps

log = logging.getLogger(__name__)
STATE_DIRS = ("prep", "que", "run", "done", "relayed", "err")
DEFAULT_KILL_GRACE = 10.0


def queue_root(root: str) -> str:
    return os.path.join(root, "queue")


def names(root: str) -> list[str]:
    """Entries of queue/ with a valid queue name (trash has a dot: never one)."""
    try:
        entries = os.listdir(queue_root(root))
    except OSError:
        return []
    return sorted(n for n in entries if valid_queue_name(n))


def has_config(root: str, name: str) -> bool:
    try:
        with open(os.path.join(queue_root(root), name, "config.json"), "rb"):
            return True
    except OSError:
        return False


def scan(root: str) -> list[str]:
    """The queues to supervise (S2.2 step 5)."""
    return [n for n in names(root) if has_config(root, n)]


def start_problem(root: str, name: str) -> str | None:
    """Why queue `name` can never start as it is (FATAL at once, no crash loop: S2.3, D7):
    its config, or a socket path it could never bind; None when it may start."""
    try:
        load_queue_config(root, name)
    except ConfigError as exc:
        return str(exc)
    problem = queue_socket_problem(root, name)
    if problem:
        log.error("queue %s cannot start: %s", name, problem)
    return problem


def kill_grace(root: str, name: str) -> float:
    try:
        return float(load_queue_config(root, name)[0].kill_grace)
    except ConfigError:
        return DEFAULT_KILL_GRACE


def max_kill_grace(root: str) -> float:
    """The largest kill_grace of the valid queues; 0 when there is none."""
    graces = [0.0]
    for name in names(root):
        try:
            graces.append(float(load_queue_config(root, name)[0].kill_grace))
        except ConfigError:
            continue
    return max(graces)


def trash(root: str, name: str, fs: FsOps) -> str:
    """S3.7: rename queue/NAME to queue/NAME.deleted.<inode>; the new path."""
    qdir = os.path.join(queue_root(root), name)
    target = f"{qdir}.deleted.{os.stat(qdir).st_ino}"
    fs.rename_noreplace(qdir, target)
    fs.fsync_dir(queue_root(root))
    return target


def job_groups(qdir: str) -> list[int]:
    """Process groups of the jobs recorded in `qdir/run/*/pid` that are still
    those jobs: a proc.json start time, when present, must match (S2.7)."""
    run = os.path.join(qdir, "run")
    try:
        ids = os.listdir(run)
    except OSError:
        return []
    groups = (_job_group(os.path.join(run, msg_id)) for msg_id in ids)
    return [pgid for pgid in groups if pgid is not None]


def _job_group(msg_dir: str) -> int | None:
    try:
        with open(os.path.join(msg_dir, "pid"), encoding="ascii") as f:
            pid = int(f.read().strip())
    except (OSError, ValueError):
        return None
    try:
        with open(os.path.join(msg_dir, "proc.json"), encoding="utf-8") as f:
            info = json.load(f)
    except (OSError, ValueError):
        info = None
    if isinstance(info, dict) and "start_time" in info:
        if not proc.alive_with_start(pid, info.get("start_time")):
            return None  # the pid now names another process: never signal it
        pgid = info.get("pgid", pid)
        return pgid if isinstance(pgid, int) and pgid > 1 else None
    return pid if pid > 1 else None


def queue_process(qdir: str) -> int | None:
    """The pid in queue.pid if it is still a queue process (never a reused pid)."""
    try:
        with open(os.path.join(qdir, "queue.pid"), encoding="ascii") as f:
            pid = int(f.read().strip())
    except (OSError, ValueError):
        return None
    cmdline = proc.command_line(pid) or ""
    return pid if "[rq-que]" in cmdline or "rq.queue" in cmdline else None
