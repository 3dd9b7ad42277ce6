"""Benchmark: what one trivial job costs a whole RQ root (issue 15, item 2).

The workload of issue 15's table: N trivial jobs (`/bin/sh`, `echo "done ok" >&3`), each one
OS process, enqueued by a Python program over the queue socket (one `create_message` call
per message, a new connection each, as `rq.client.call_queue` does) *while* W workers run
them, on a root started with `rq-mgr start`: so the manager (and its event hub), the web
server, the timers and scandir daemons all run beside the queue process, and every one of
them that does work per message is counted.  The clock runs from the first enqueue to the
`num_messages` reply that shows done == N.

CPU per 1,000 jobs, two ways:
* *tree*: user + system time of the manager and every process under it (the jobs are reaped
  by the queue process, so they are in its children's times), plus this benchmark process
  (the client and the polling), as deltas over the run: the cost of RQ alone;
* *machine*: the non-idle time of every CPU from /proc/stat over the run, which is what
  issue 15 compares against its peers, but on a shared machine it includes whatever else runs.

Baseline, seconds before each RQ run: a bare spawn loop (W threads, each `os.posix_spawn`
of the same script with fd 3 on /dev/null and `waitpid`), no queue and no durability.

`--src DIR` (repeatable) also runs the same workload, interleaved, with the RQ of another
checkout (e.g. a `git worktree` of an earlier commit, with its compiled `rq/_spawn*.so`
copied in), so a change is measured against its predecessor in the same minutes.  The order
of the checkouts is reversed every other run: in one order only, the one measured first was
slower in several sessions' runs (the disk's state left by what ran just before).

    tini -s -- .venv/bin/python bench/jobcost.py --tmpdir DIR [--n 2000] [--runs 3]
        [--workers 1,2] [--src OTHER_CHECKOUT ...]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (QUEUE, REPO, TRIVIAL_SCRIPT, BenchError, add_common_args,  # noqa: E402
                    bench_queue, check_ok, disk_probe, machine_line, median, new_root,
                    temp_base, wait_for, write_script)

from rq import client  # noqa: E402

# issue 15 / PERF.md, 2 cores, N = 2000, medians of 3 (measured elsewhere: context only)
TSP = (404, 560, 3.3)   # task-spooler: jobs/s with 1 and 2 workers, CPU s per 1k jobs (2 w)
TARGET_CPU = 3.3


# ---------------------------------------------------------------- CPU accounting
def machine_busy() -> float:
    """Seconds of non-idle CPU time since boot, summed over CPUs (/proc/stat)."""
    with open("/proc/stat") as fh:
        fields = [int(x) for x in fh.readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def tree_cpu(pid: int, names: dict[int, str] | None = None) -> dict[int, float]:
    """pid -> user+system time of it and its reaped children, for `pid` and every
    descendant (their command lines into `names` when given)."""
    out: dict[int, float] = {}
    try:
        top = psutil.Process(pid)
        procs = [top, *top.children(recursive=True)]
    except psutil.Error:
        return out
    for p in procs:
        try:
            t = p.cpu_times()
        except psutil.Error:
            continue
        out[p.pid] = t.user + t.system + t.children_user + t.children_system
        if names is not None:
            try:
                names[p.pid] = " ".join(p.cmdline())[:70]
            except psutil.Error:
                names[p.pid] = "?"
    return out


def self_cpu() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


# ---------------------------------------------------------------- RQ under rq-mgr
class Manager:
    """`rq-mgr start` of the checkout `src` on `root`; `stop()` always."""

    def __init__(self, root: Path, src: Path) -> None:
        self.root, self.src = root, src
        self.env = dict(os.environ, PYTHONPATH=str(src))
        self.run("start")
        pid_text = (root / "config" / "queuemgr.pid").read_text().split()
        self.pid = int(pid_text[0])

    def run(self, cmd: str) -> None:
        code = ("import sys\nsys.path[:] = [p for p in sys.path if p not in ('', '.')]\n"
                "from rq.mgr.cli import main\nsys.exit(main())")
        result = subprocess.run([sys.executable, "-c", code, "--root", str(self.root), cmd],
                                cwd=str(self.root), env=self.env, capture_output=True,
                                text=True, timeout=120)
        if result.returncode != 0:
            raise BenchError(f"rq-mgr {cmd} failed: {result.stderr.strip()}")

    def stop(self) -> None:
        self.run("stop")


def run_rq(base: Path, label: str, src: Path, n: int, workers: int,
           breakdown: bool = False) -> dict[str, float]:
    root = new_root(base, label)
    bench_queue(root, num_workers=workers)
    mgr = Manager(root, src)
    try:
        wait_for(lambda: _ping(root), 60, "queue to answer under rq-mgr")
        errors: list[BaseException] = []
        enqueued: list[float] = []
        before, busy0, self0 = tree_cpu(mgr.pid), machine_busy(), self_cpu()
        t0 = time.monotonic()

        def produce() -> None:
            try:
                for i in range(n):
                    check_ok(client.call_queue(str(root), QUEUE, "create_message",
                                               {"dest": QUEUE, "param1": str(i)}))
                enqueued.append(time.monotonic())
            except BaseException as exc:  # reported by the main thread
                errors.append(exc)

        producer = threading.Thread(target=produce, daemon=True)
        producer.start()
        wait_done(root, n, errors)
        elapsed = time.monotonic() - t0
        busy, own = machine_busy() - busy0, self_cpu() - self0
        names: dict[int, str] = {}
        after = tree_cpu(mgr.pid, names)
        producer.join(10)
        if breakdown:
            for pid, t in sorted(after.items(), key=lambda kv: -(kv[1] - before.get(kv[0], 0))):
                print(f"    {(t - before.get(pid, 0.0)) * 1000 / n:6.2f} CPU s/1k  {names[pid]}")
            print(f"    {own * 1000 / n:6.2f} CPU s/1k  this benchmark (client + polling)")
    finally:
        mgr.stop()
    tree = sum(t - before.get(pid, 0.0) for pid, t in after.items()) + own
    return {"rate": n / elapsed, "enq": n / (enqueued[0] - t0) if enqueued else 0.0,
            "tree": tree * 1000 / n, "machine": busy * 1000 / n}


def _ping(root: Path) -> bool:
    try:
        return client.call_queue(str(root), QUEUE, "ping") == ["pong"]
    except Exception:
        return False


def wait_done(root: Path, n: int, errors: list[BaseException]) -> None:
    """Poll num_messages, sleeping 1 ms per unfinished job (2-100 ms), as throughput.py."""
    deadline = time.monotonic() + max(60.0, n * 0.05)
    while True:
        if errors:
            raise BenchError(f"enqueue failed: {errors[0]!r}")
        counts = client.call_queue(str(root), QUEUE, "num_messages")
        if counts["err"]:
            raise BenchError(f"{counts['err']} message(s) went to err: {counts}")
        if counts["done"] >= n:
            return
        if time.monotonic() > deadline:
            raise BenchError(f"timed out waiting for {n} done: {counts}")
        time.sleep(min(0.1, max(0.002, (n - counts["done"]) * 0.001)))


# ---------------------------------------------------------------- bare spawn loop
def run_bare(script: str, n: int, workers: int) -> dict[str, float]:
    todo = iter(range(n))
    lock = threading.Lock()
    env = dict(os.environ)
    actions = [(os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDONLY, 0),
               (os.POSIX_SPAWN_OPEN, 3, "/dev/null", os.O_WRONLY, 0)]

    def work() -> None:
        while True:
            with lock:
                if next(todo, None) is None:
                    return
            pid = os.posix_spawn(script, [script], env, file_actions=actions, setsid=True)
            _, status = os.waitpid(pid, 0)
            if os.waitstatus_to_exitcode(status) != 0:
                raise BenchError("bare job failed")

    busy0, self0, t0 = machine_busy(), self_cpu(), time.monotonic()
    threads = [threading.Thread(target=work) for _ in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - t0
    return {"rate": n / elapsed, "enq": 0.0, "tree": (self_cpu() - self0) * 1000 / n,
            "machine": (machine_busy() - busy0) * 1000 / n}


# ---------------------------------------------------------------- main
def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--workers", default="1,2")
    ap.add_argument("--only-src", action="store_true",
                    help="measure only the --src checkouts, not this one")
    ap.add_argument("--breakdown", action="store_true", help="CPU of each RQ process")
    ap.add_argument("--src", action="append", default=[], type=Path,
                    help="another checkout to measure interleaved (repeatable)")
    add_common_args(ap)
    args = ap.parse_args()
    worker_counts = [int(w) for w in args.workers.split(",")]
    systems = [("this", REPO)] + [(f"src{i + 1}", p.resolve()) for i, p in enumerate(args.src)]
    if args.only_src:
        systems = systems[1:]
    print(machine_line())
    print(disk_probe(Path(args.tmpdir)))
    for label, src in systems:
        if label != "this":
            print(f"{label} = {src}")
    results: dict[tuple[str, int], list[dict[str, float]]] = {}
    with temp_base(args.tmpdir, args.keep) as base:
        script = str(write_script(base / "bare.sh", TRIVIAL_SCRIPT))
        for run in range(args.runs):
            for w in worker_counts:
                results.setdefault(("bare", w), []).append(run_bare(script, args.n, w))
                for label, src in (systems if run % 2 == 0 else systems[::-1]):
                    r = run_rq(base, f"{label}-w{w}-r{run}", src, args.n, w, args.breakdown)
                    results.setdefault((label, w), []).append(r)
                    print(f"run {run + 1} W={w} {label}: {r['rate']:.0f} jobs/s, "
                          f"tree {r['tree']:.2f} / machine {r['machine']:.2f} CPU s per 1k, "
                          f"client {r['enq']:.0f} msg/s", flush=True)
    print(f"\nN = {args.n}, medians of {args.runs} (CPU s per 1k jobs; jobs/s end to end)")
    print(f"{'system':<10} {'W':>2} {'jobs/s':>7} {'x bare':>7} {'tree CPU':>9} "
          f"{'machine CPU':>12} {'client msg/s':>13}")
    for w in worker_counts:
        bare = median([r["rate"] for r in results[("bare", w)]])
        for label in ["bare", *(s for s, _ in systems)]:
            rs = results[(label, w)]
            rate = median([r["rate"] for r in rs])
            enq = median([r["enq"] for r in rs])
            print(f"{label:<10} {w:>2} {rate:>7.0f} {rate / bare:>7.2f} "
                  f"{median([r['tree'] for r in rs]):>9.2f} "
                  f"{median([r['machine'] for r in rs]):>12.2f} "
                  f"{enq if enq else float('nan'):>13.0f}")
    print(f"task-spooler (issue 15, elsewhere): {TSP[0]} / {TSP[1]} jobs/s with 1 / 2 workers, "
          f"{TSP[2]} CPU s per 1k jobs; target CPU <= {TARGET_CPU}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
