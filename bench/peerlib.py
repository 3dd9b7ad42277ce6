"""Helpers of bench/peers.py that also run inside the peers' own virtualenvs
(python-rq, Celery), so this module imports nothing from the project and
nothing outside the standard library.

It owns: the job every system runs (one /bin/sh process creating a marker
file, issue 15 item 1), the measured window (wall clock + CPU seconds of the
whole machine from /proc/stat), waiting for markers, the result line a
driver prints, and the pure functions that turn trials into the table.
`wait_for` and `BenchError` live here so that bench/common.py can re-export
them: one copy for every bench script.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from typing import Any


class BenchError(RuntimeError):
    pass


def wait_for(cond: Callable[[], Any], timeout: float, what: str,
             interval: float = 0.002) -> Any:
    """Poll `cond` until it returns something truthy; BenchError after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise BenchError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


# ---------------------------------------------------------------- the job
# Every system runs the same thing per job: one /bin/sh process that creates
# its marker file (the count of markers proves that every job ran).
JOB_SH = ': > "$1"'


def job_argv(marker: str) -> list[str]:
    return ["/bin/sh", "-c", JOB_SH, "sh", marker]


def marker_path(marks: str, i: int) -> str:
    return os.path.join(marks, str(i))


def count_markers(marks: str) -> int:
    with os.scandir(marks) as it:
        return sum(1 for _ in it)


def wait_markers(marks: str, n: int, stall: float = 60.0,
                 check: Callable[[], None] | None = None) -> None:
    """Until `n` markers exist; BenchError when no new one appeared for `stall`
    seconds (a deadline on progress, not on the total: python-rq's forking
    worker took over 400 s for 2,000 jobs on the loaded machine).  Polls sized
    to what remains (0.5 ms per missing job, 2-50 ms) so that polling costs
    little beside the measured work; `check` runs each round and raises if the
    system under test failed."""
    have, progress = -1, time.monotonic()
    while True:
        if check is not None:
            check()
        now_have = count_markers(marks)
        if now_have >= n:
            return
        if now_have != have:
            have, progress = now_have, time.monotonic()
        elif time.monotonic() - progress > stall:
            raise BenchError(f"no progress for {stall:.0f} s: {have} of {n} jobs ran")
        time.sleep(min(0.05, max(0.002, (n - have) * 0.0005)))


# ---------------------------------------------------------------- measuring
def parse_proc_stat(text: str) -> float:
    """Busy CPU ticks of the whole machine from /proc/stat's `cpu` line: user,
    nice, system, irq, softirq and steal (guest time is already in user);
    idle and iowait are not work."""
    for line in text.splitlines():
        fields = line.split()
        if fields and fields[0] == "cpu":
            v = [int(x) for x in fields[1:9]]
            user, nice, system, _idle, _iowait, irq, softirq, steal = v + [0] * (8 - len(v))
            return float(user + nice + system + irq + softirq + steal)
    raise BenchError("no cpu line in /proc/stat")


def machine_cpu_seconds() -> float:
    with open("/proc/stat") as fh:
        return parse_proc_stat(fh.read()) / os.sysconf("SC_CLK_TCK")


def parse_pid_stat(text: str) -> tuple[int, int]:
    """(ppid, CPU ticks) from a /proc/PID/stat line: utime + stime of the
    process + cutime + cstime of the children it has reaped (which include
    theirs, recursively).  The command name may hold spaces and parentheses."""
    fields = text[text.rindex(")") + 2:].split()
    # fields[0] is the state (field 3); ppid is field 4, utime..cstime 14-17.
    return int(fields[1]), sum(int(x) for x in fields[11:15])


TREE_ROOT_ENV = "PEERS_TREE_ROOT"


def tree_cpu_seconds(root: int | None = None) -> float:
    """CPU seconds of the process tree under `root` (default $PEERS_TREE_ROOT,
    set by bench/peers.py to its subreaper, else this process): every live
    process's own and reaped children's time.  Orphans are reparented to the
    subreaper (tini -s) and reaped by it, so nothing the benchmark started is
    lost, and other users' load on the machine is left out."""
    if root is None:
        root = int(os.environ.get(TREE_ROOT_ENV, os.getpid()))
    procs: dict[int, tuple[int, int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as fh:
                    procs[int(name)] = parse_pid_stat(fh.read())
            except (OSError, ValueError):  # exited meanwhile
                continue
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in procs.items():
        children.setdefault(ppid, []).append(pid)
    ticks, todo = 0, [root]
    while todo:
        pid = todo.pop()
        ticks += procs.get(pid, (0, 0))[1]
        todo.extend(children.get(pid, ()))
    return ticks / os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Trial:
    """One measured run: `n` jobs, wall seconds from the first enqueue to the
    last completion, wall seconds until the last enqueue returned, and CPU
    seconds over the same window of the whole machine and of the benchmark's
    own process tree."""
    n: int
    elapsed: float
    enqueued: float
    cpu: float
    tree_cpu: float

    @property
    def rate(self) -> float:
        return self.n / self.elapsed

    @property
    def enqueue_rate(self) -> float:
        return self.n / max(self.enqueued, 1e-9)

    @property
    def cpu_per_1k(self) -> float:
        return self.cpu / self.n * 1000

    @property
    def tree_cpu_per_1k(self) -> float:
        return self.tree_cpu / self.n * 1000


class Window:
    """The measured window: start() before the first enqueue, enqueue_done()
    when the last enqueue returned, stop() at the last completion."""

    def start(self) -> None:
        self.tree0 = tree_cpu_seconds()
        self.t0, self.c0 = time.monotonic(), machine_cpu_seconds()
        self.t_enq: float | None = None

    def enqueue_done(self) -> None:
        self.t_enq = time.monotonic()

    def stop(self, n: int) -> Trial:
        t1, c1 = time.monotonic(), machine_cpu_seconds()
        tree1 = tree_cpu_seconds()
        t_enq = self.t_enq if self.t_enq is not None else t1
        return Trial(n, t1 - self.t0, t_enq - self.t0, c1 - self.c0, tree1 - self.tree0)


RESULT_PREFIX = "PEERS-RESULT "


def result_line(trial: Trial) -> str:
    return RESULT_PREFIX + json.dumps(asdict(trial))


def parse_result(stdout: str) -> Trial:
    for line in stdout.splitlines():
        if line.startswith(RESULT_PREFIX):
            return Trial(**json.loads(line[len(RESULT_PREFIX):]))
    raise BenchError("the driver printed no result line")


# ---------------------------------------------------------------- task-spooler
def parse_tsp_list(text: str) -> dict[str, int]:
    """Counts of `tsp -l` lines by state; finished jobs whose E-Level is not 0
    are counted under "failed" instead of "finished".  Columns: ID State
    Output E-Level Times Command (queued/running lines have no E-Level)."""
    counts: dict[str, int] = {}
    for line in text.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 2:
            continue
        state = fields[1]
        if state == "finished" and (len(fields) < 4 or fields[3] != "0"):
            state = "failed"
        counts[state] = counts.get(state, 0) + 1
    return counts


# ---------------------------------------------------------------- the table
@dataclass(frozen=True)
class Record:
    system: str
    workers: int
    trial: Trial
    bare: Trial  # the bare spawn loop measured just before it


@dataclass(frozen=True)
class Row:
    system: str
    workers: int
    rate: float        # median jobs/s
    ratio: float       # median of per-trial rate / bare-loop rate
    enqueue_rate: float
    cpu_per_1k: float
    tree_cpu_per_1k: float
    bare_rate: float
    bare_cpu_per_1k: float
    bare_tree_cpu_per_1k: float
    trials: int


def aggregate(records: Iterable[Record]) -> dict[tuple[str, int], Row]:
    """Medians per (system, workers), in first-seen order.  The ratio is the
    median of each trial's ratio to its own bare loop, not a ratio of medians."""
    groups: dict[tuple[str, int], list[Record]] = {}
    for r in records:
        groups.setdefault((r.system, r.workers), []).append(r)
    med = statistics.median
    return {key: Row(system=key[0], workers=key[1],
                     rate=med(r.trial.rate for r in rs),
                     ratio=med(r.trial.rate / r.bare.rate for r in rs),
                     enqueue_rate=med(r.trial.enqueue_rate for r in rs),
                     cpu_per_1k=med(r.trial.cpu_per_1k for r in rs),
                     tree_cpu_per_1k=med(r.trial.tree_cpu_per_1k for r in rs),
                     bare_rate=med(r.bare.rate for r in rs),
                     bare_cpu_per_1k=med(r.bare.cpu_per_1k for r in rs),
                     bare_tree_cpu_per_1k=med(r.bare.tree_cpu_per_1k for r in rs),
                     trials=len(rs))
            for key, rs in groups.items()}


def fmt_num(x: float) -> str:
    return f"{x:,.0f}" if x >= 100 else f"{x:.1f}" if x >= 10 else f"{x:.2f}"


def format_table(rows: dict[tuple[str, int], Row], labels: dict[str, str],
                 workers: list[int]) -> list[str]:
    """A Markdown table: one line per system (in the order of `labels`), for
    each worker count its jobs/s, its ratio to the bare loop, the enqueue rate
    and CPU s per 1k jobs (whole machine, and the benchmark's process tree);
    then the bare loop's own line (median of the medians)."""
    head = ["system"]
    for w in workers:
        head += [f"{w}w jobs/s", f"{w}w × bare", f"{w}w enqueue/s", f"{w}w CPU s/1k machine",
                 f"{w}w CPU s/1k tree"]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for system, label in labels.items():
        cells = [label]
        for w in workers:
            row = rows.get((system, w))
            cells += ([fmt_num(row.rate), f"{row.ratio:.2f}", fmt_num(row.enqueue_rate),
                       fmt_num(row.cpu_per_1k), fmt_num(row.tree_cpu_per_1k)]
                      if row else ["-"] * 5)
        if any(c != "-" for c in cells[1:]):
            out.append("| " + " | ".join(cells) + " |")
    bare = ["bare spawn loop (no queue, not durable)"]
    for w in workers:
        rs = [r for (_, rw), r in rows.items() if rw == w]
        med = statistics.median
        bare += ([fmt_num(med(r.bare_rate for r in rs)), "1", "-",
                  fmt_num(med(r.bare_cpu_per_1k for r in rs)),
                  fmt_num(med(r.bare_tree_cpu_per_1k for r in rs))]
                 if rs else ["-"] * 5)
    out.append("| " + " | ".join(bare) + " |")
    return out
