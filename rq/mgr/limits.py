"""Host limits a root's queues must fit in (issue 17), checked before rq-mgr starts anything.

Owns: what N queue processes need from the host and the limits that say no, each read once
at start-up: open files of rq-mgr itself (RLIMIT_NOFILE: it holds each queue's lifeline and,
until `ready`, its ready pipe), tasks (every queue process is 1 + QUEUE_THREADS tasks before
any job runs; kernel.pid_max, kernel.threads-max, RLIMIT_NPROC of a user without
CAP_SYS_RESOURCE/CAP_SYS_ADMIN, cgroup pids.max) and inotify instances (scandir and timers
hold one each; queue processes none: a shortfall is logged by `warnings()`, not refused).
`problems()` gives one line per limit that the root would exceed, naming the limit, the
numbers and how to raise it; rq-mgr refuses to start then (S2.2: start-up fails with one
ERROR line, nothing half-started).  A limit hit later (a job that forks a lot) is handled as
before: a spawn that fails is a failed start with backoff (S2.3).

Pure over `Host` (the numbers), so tests can check every rule with plain numbers; `read_host()`
is the only part that reads /proc, /sys and getrlimit.
"""

from __future__ import annotations

import errno
import logging
import os
import resource
from dataclasses import dataclass

from rq.errors import RQError

log = logging.getLogger(__name__)
MGR_FDS_BASE = 64      # rq-mgr's own: sockets, logs, event hub, services' pipes, clients
MGR_FDS_PER_QUEUE = 2  # the lifeline write end and the ready pipe's read end
QUEUE_THREADS = 7      # loop, socket I/O, socket workers, spares, pipe helpers (measured)
SERVICE_TASKS = 200    # rq-mgr, web (a thread pool), scandir, timers, fork server
WATCHERS = 2           # inotify instances: scandir and timers
CAP_SYS_ADMIN, CAP_SYS_RESOURCE = 21, 24
UNLIMITED = resource.RLIM_INFINITY


@dataclass(frozen=True)
class Host:
    nofile: int                  # soft RLIMIT_NOFILE of rq-mgr
    nofile_hard: int
    pid_max: int                 # kernel.pid_max
    threads_max: int             # kernel.threads-max
    tasks: int                   # tasks (threads) on the host now
    nproc: int                   # soft RLIMIT_NPROC, UNLIMITED when not enforced for us
    user_tasks: int              # tasks of our user now
    pids_max: int                # cgroup pids.max, UNLIMITED when none
    cgroup_tasks: int            # the cgroup's pids.current
    inotify_instances: int       # fs.inotify.max_user_instances
    inotify_in_use: int          # of our user now (counted only when a probe was refused)


def problems(host: Host, queues: int) -> list[str]:
    """One line per limit that `queues` queue processes would exceed (empty: they fit)."""
    out = []
    fds = MGR_FDS_BASE + MGR_FDS_PER_QUEUE * queues
    if fds > host.nofile:
        hard = "" if fds <= host.nofile_hard else f" (and its hard limit {host.nofile_hard})"
        out.append(f"{queues} queues need about {fds} open files in rq-mgr, but its limit "
                   f"RLIMIT_NOFILE is {host.nofile}: raise it{hard} with `ulimit -n "
                   f"{round_up(fds)}` before rq-mgr start, or LimitNOFILE={round_up(fds)} "
                   "in rq-mgr.service")
    tasks = queues * (1 + QUEUE_THREADS) + SERVICE_TASKS
    for name, limit, used, how in (
            ("kernel.pid_max", host.pid_max, host.tasks,
             "sysctl -w kernel.pid_max={}"),
            ("kernel.threads-max", host.threads_max, host.tasks,
             "sysctl -w kernel.threads-max={}"),
            ("RLIMIT_NPROC (tasks of this user)", host.nproc, host.user_tasks,
             "`ulimit -u {}` before rq-mgr start, or LimitNPROC={} in rq-mgr.service"),
            ("the cgroup's pids.max", host.pids_max, host.cgroup_tasks,
             "TasksMax={} in rq-mgr.service, or the container's pids limit")):
        if limit != UNLIMITED and used + tasks > limit:
            want = round_up(used + tasks)
            out.append(f"{queues} queues need about {tasks} tasks (processes and threads, "
                       f"before any job runs), {used} are in use, and {name} is {limit}: "
                       f"raise it with {how.format(want, want)}")
    return out


def warnings(host: Host) -> list[str]:
    """Shortfalls that do not depend on the number of queues: logged, not refused (the
    queues run without them; the daemon that needs it shows the failure in `status`)."""
    if host.inotify_in_use + WATCHERS <= host.inotify_instances:
        return []
    want = round_up(host.inotify_in_use + WATCHERS)
    return [f"scandir and timers need {WATCHERS} inotify instances, {host.inotify_in_use} of "
            f"this user's are in use, and fs.inotify.max_user_instances is "
            f"{host.inotify_instances}: raise it with "
            f"sysctl -w fs.inotify.max_user_instances={want}"]


def round_up(n: int) -> int:
    """A round figure to suggest: the next multiple of 1,024 above `n`."""
    return (n // 1024 + 1) * 1024


# ---------------------------------------------------------------- reading the host (Linux)

def read_host() -> Host:
    nofile, nofile_hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    nproc = resource.getrlimit(resource.RLIMIT_NPROC)[0]
    pids_max, cgroup_tasks = cgroup_pids()
    instances = read_int("/proc/sys/fs/inotify/max_user_instances", UNLIMITED)
    # Counting this user's instances reads the link of every descriptor of every process of
    # theirs (tens of thousands beside a browser or a JVM: most of a start's reading of the
    # host): only when making WATCHERS instances now fails, for the warning's figures.
    count = instances != UNLIMITED and not inotify_available(WATCHERS)
    user_tasks, in_use = user_usage(os.getuid(), count_inotify=count)
    return Host(nofile=nofile, nofile_hard=nofile_hard,
                pid_max=read_int("/proc/sys/kernel/pid_max", UNLIMITED),
                threads_max=read_int("/proc/sys/kernel/threads-max", UNLIMITED),
                tasks=host_tasks(), nproc=UNLIMITED if nproc_exempt() else nproc,
                user_tasks=user_tasks, pids_max=pids_max, cgroup_tasks=cgroup_tasks,
                inotify_instances=instances, inotify_in_use=in_use)


def read_int(path: str, default: int) -> int:
    try:
        with open(path) as fh:
            text = fh.read().strip()
    except OSError:
        return default
    return int(text) if text.isdigit() else default


def host_tasks() -> int:
    """Tasks on the host now: the total of /proc/loadavg's `running/total` field."""
    try:
        with open("/proc/loadavg") as fh:
            return int(fh.read().split()[3].split("/")[1])
    except (OSError, IndexError, ValueError):
        return 0


def nproc_exempt() -> bool:
    """The kernel does not apply RLIMIT_NPROC to a process with either capability."""
    try:
        with open("/proc/self/status") as fh:
            caps = next(int(line.split()[1], 16) for line in fh if line.startswith("CapEff:"))
    except (OSError, StopIteration, ValueError):
        return False
    return bool(caps & (1 << CAP_SYS_ADMIN | 1 << CAP_SYS_RESOURCE))


def cgroup_pids() -> tuple[int, int]:
    """(pids.max, pids.current) of our cgroup (v2, else v1's pids controller)."""
    try:
        with open("/proc/self/cgroup") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return UNLIMITED, 0
    for line in lines:
        _, controllers, path = line.split(":", 2)
        base = ("/sys/fs/cgroup" if controllers == "" else
                "/sys/fs/cgroup/pids" if "pids" in controllers.split(",") else None)
        if base is None:
            continue
        here = os.path.join(base, path.lstrip("/"))
        limit = read_int(os.path.join(here, "pids.max"), UNLIMITED)
        if limit != UNLIMITED:
            return limit, read_int(os.path.join(here, "pids.current"), 0)
    return UNLIMITED, 0


def inotify_available(n: int) -> bool:
    """Can this user make `n` more inotify instances now?  Made and closed at once; only the
    per-user limit (EMFILE) says no."""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    fds = []
    try:
        for _ in range(n):
            fd = libc.inotify_init1(os.O_CLOEXEC)
            if fd < 0:
                return ctypes.get_errno() != errno.EMFILE
            fds.append(fd)
        return True
    finally:
        for fd in fds:
            os.close(fd)


def user_usage(uid: int, *, count_inotify: bool) -> tuple[int, int]:
    """(tasks, inotify instances) of processes of `uid` now, from /proc."""
    tasks = watchers = 0
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        try:
            if os.stat(f"/proc/{pid}").st_uid != uid:
                continue
            tasks += len(os.listdir(f"/proc/{pid}/task"))
            if count_inotify:
                for fd in os.listdir(f"/proc/{pid}/fd"):
                    if os.readlink(f"/proc/{pid}/fd/{fd}") == "anon_inode:inotify":
                        watchers += 1
        except OSError:
            continue  # gone, or not ours to read
    return tasks, watchers


def check(queues: int) -> None:
    """Raise RQError (rq-mgr start's ERROR line) when `queues` would exceed a host limit;
    log what only some daemons need."""
    host = read_host()
    for line in warnings(host):
        log.warning("%s", line)
    found = problems(host, queues)
    if found:
        raise RQError("ERROR: cannot start: " + "; ".join(found))
