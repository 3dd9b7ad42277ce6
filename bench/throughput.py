"""Benchmark (a): end-to-end throughput of a trivial /bin/sh queue script.

RQ: a queue process with W workers runs `echo "done ok" >&3` for N messages
that a client thread enqueues (create_message) while they execute; the clock
runs from the first enqueue until `num_messages` shows done == N.

Baseline, in the same run and with no daemon: a Python producer thread makes
each message durable with RQ's own sequence (mkdir prep/ID; msg via temp file +
fsync + rename; fsync ID/; rename prep/ID -> que/ID; fsync que/), and W consumer
threads each take a message, rename que -> run, mkdir job/, posix_spawn the same
script (stdout/stderr appended to job/stdio.log, fd 3 a pipe they read), wait
for it, write a status file (temp + rename), rename run/ID into its
done/YYYYMMDD/HH/MM/ bucket and fsync the bucket.

Target (issue a): RQ >= 60 % of the baseline.  Usage:
    .venv/bin/python bench/throughput.py [--n 1000] [--runs 3] [--workers 1,2]
"""

from __future__ import annotations

import argparse
import itertools
import os
import queue as queue_mod
import signal
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (PEERS, QUEUE, TRIVIAL_SCRIPT, BenchError, QueueProc,  # noqa: E402
                    add_common_args, bench_queue, check_ok, disk_probe, dumps, machine_line,
                    median, new_root, temp_base, wait_for, write_script)

TARGET_RATIO = 0.60
# Polling for the end: every num_messages call is a connection the queue process
# serves beside the work being measured (the baseline's threads pay nothing like
# it), so the wait is sized to what remains: POLL_PER_JOB per unfinished job (no
# RQ run is near 1,000 jobs/s, so the end is not overshot), between POLL_MIN and
# POLL_MAX.  ~20-40 calls per run instead of one every 5 ms.
POLL_MIN, POLL_MAX, POLL_PER_JOB = 0.002, 0.1, 0.001


# ---------------------------------------------------------------- RQ
def wait_done(q: QueueProc, n: int, errors: list[BaseException]) -> None:
    deadline = time.monotonic() + max(60.0, n * 0.05)
    while True:
        if errors:
            raise BenchError(f"enqueue failed: {errors[0]!r}")
        counts = q.call("num_messages")
        if counts["err"]:
            raise BenchError(f"{counts['err']} message(s) went to err: {counts}")
        if counts["done"] >= n:
            return
        if time.monotonic() > deadline:
            raise BenchError(f"timed out waiting for {n} done: {counts}")
        time.sleep(min(POLL_MAX, max(POLL_MIN, (n - counts["done"]) * POLL_PER_JOB)))


def run_rq(base: Path, label: str, n: int, workers: int) -> tuple[float, float]:
    """(jobs/s end to end, messages/s of the enqueuing client alone)."""
    root = new_root(base, label)
    bench_queue(root, num_workers=workers)
    with QueueProc(root) as q:
        errors: list[BaseException] = []
        enqueued: list[float] = []
        t0 = time.monotonic()

        def produce() -> None:
            try:
                for i in range(n):
                    check_ok(q.call("create_message", {"dest": QUEUE, "param1": str(i)}))
                enqueued.append(time.monotonic())
            except BaseException as exc:  # reported by the main thread
                errors.append(exc)

        producer = threading.Thread(target=produce, daemon=True)
        producer.start()
        wait_done(q, n, errors)
        elapsed = time.monotonic() - t0
        producer.join(10)
    return n / elapsed, n / (enqueued[0] - t0)


def drain_rq(base: Path, label: str, n: int, workers: int) -> tuple[float, float]:
    """Execution alone: N messages enqueued on a PAUSEd queue, then resumed
    (pause file removed + SIGHUP, which wakes the queue's loop for a scheduler
    pass).  (jobs/s from the resume to done == N, ms until the first start)."""
    root = new_root(base, label)
    bench_queue(root, num_workers=workers, paused=True)
    with QueueProc(root) as q:
        for i in range(n):
            check_ok(q.call("create_message", {"dest": QUEUE, "param1": str(i)}))
        t0 = time.monotonic()
        (root / "config" / f"{QUEUE}.pause").unlink()
        os.kill(q.pid, signal.SIGHUP)
        wait_for(lambda: (lambda c: c["run"] + c["done"])(q.call("num_messages")),
                 timeout=30, what="first start after resume", interval=0.001)
        first = time.monotonic() - t0
        wait_done(q, n, [])
        elapsed = time.monotonic() - t0
    return n / elapsed, first * 1e3


# ---------------------------------------------------------------- baseline
def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _msg_id(now: float, n: int) -> str:
    t = time.gmtime(now)
    return time.strftime("%Y%m%d.%H%M.%S", t) + f".{int((now % 1) * 1000):03d}.{n}"


def _bucket(msg_id: str) -> str:
    day, hhmm = msg_id.split(".")[:2]
    return f"{day}/{hhmm[:2]}/{hhmm[2:]}"


class Baseline:
    """The same durable work as RQ, without a daemon, a socket or an index."""

    def __init__(self, qdir: Path, script: str, n: int, workers: int) -> None:
        self.q = str(qdir)
        self.script = script
        self.n = n
        self.workers = workers
        self.todo: queue_mod.Queue[str | None] = queue_mod.Queue()
        self.done = 0
        self.done_lock = threading.Lock()
        self.all_done = threading.Event()
        self.errors: list[BaseException] = []
        self.env = dict(os.environ)
        self.counter = itertools.count(1000000)
        self.enqueued = 0.0

    def produce(self) -> None:
        prep, que = os.path.join(self.q, "prep"), os.path.join(self.q, "que")
        try:
            for i in range(self.n):
                now = time.time()
                msg_id = _msg_id(now, next(self.counter))
                path = os.path.join(prep, msg_id)
                os.mkdir(path)
                fields = {"msg_id": msg_id, "dest": QUEUE, "param1": str(i), "due": int(now),
                          "count": 0, "max_count": 15,
                          "orig_msg_id": f"http://127.0.0.1:3333/q/{QUEUE}/{msg_id}"}
                tmp = os.path.join(path, ".msg.tmp")
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                try:
                    os.write(fd, dumps(fields).encode())
                    os.fsync(fd)
                finally:
                    os.close(fd)
                os.rename(tmp, os.path.join(path, "msg"))
                _fsync_dir(path)
                os.rename(path, os.path.join(que, msg_id))
                _fsync_dir(que)
                self.todo.put(msg_id)
            self.enqueued = time.monotonic()
        except BaseException as exc:
            self.errors.append(exc)
            self.all_done.set()

    def consume(self) -> None:
        try:
            while not self.all_done.is_set():
                msg_id = self.todo.get()
                if msg_id is None:
                    return
                self.run_one(msg_id)
                with self.done_lock:
                    self.done += 1
                    if self.done >= self.n:
                        self.all_done.set()
        except BaseException as exc:
            self.errors.append(exc)
            self.all_done.set()

    def run_one(self, msg_id: str) -> None:
        run = os.path.join(self.q, "run", msg_id)
        os.rename(os.path.join(self.q, "que", msg_id), run)
        job = os.path.join(run, "job")
        os.mkdir(job)
        r, w = os.pipe()
        try:
            actions = [
                (os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDONLY, 0),
                (os.POSIX_SPAWN_OPEN, 1, os.path.join(job, "stdio.log"),
                 os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644),
                (os.POSIX_SPAWN_DUP2, 1, 2),
                (os.POSIX_SPAWN_DUP2, w, 3),
            ]
            pid = os.posix_spawn(self.script, [self.script], self.env, file_actions=actions,
                                 setsid=True)
            os.close(w)
            w = -1
            chunks = []
            while True:
                data = os.read(r, 65536)
                if not data:
                    break
                chunks.append(data)
        finally:
            os.close(r)
            if w >= 0:
                os.close(w)
        _, status = os.waitpid(pid, 0)
        if os.waitstatus_to_exitcode(status) != 0 or not b"".join(chunks).startswith(b"done"):
            raise BenchError(f"baseline job {msg_id} failed: status {status}, {chunks!r}")
        tmp = os.path.join(run, ".status.tmp")
        with open(tmp, "wb") as fh:
            fh.write(dumps({"job_status": "ok"}).encode())
        os.rename(tmp, os.path.join(run, "status"))
        bucket = os.path.join(self.q, "done", _bucket(msg_id))
        made = []
        for part in (os.path.dirname(os.path.dirname(bucket)), os.path.dirname(bucket), bucket):
            try:
                os.mkdir(part)
                made.append(part)
            except FileExistsError:
                pass
        os.rename(run, os.path.join(bucket, msg_id))
        for d in made:  # a new bucket's own name must be durable too
            _fsync_dir(os.path.dirname(d))
        _fsync_dir(bucket)

    def run(self, drain: bool = False) -> tuple[float, float]:
        """(jobs/s, producer msg/s); with `drain`, every message is made
        durable before the clock starts and only execution is timed."""
        consumers = [threading.Thread(target=self.consume, daemon=True)
                     for _ in range(self.workers)]
        producer = threading.Thread(target=self.produce, daemon=True)
        if drain:
            producer.start()
            producer.join()
        t0 = time.monotonic()
        if not drain:
            producer.start()
        for c in consumers:
            c.start()
        if not self.all_done.wait(max(60.0, self.n * 0.05)):
            raise BenchError("baseline timed out")
        elapsed = time.monotonic() - t0
        for _ in consumers:
            self.todo.put(None)
        producer.join(10)
        for c in consumers:
            c.join(10)
        if self.errors:
            raise BenchError(f"baseline failed: {self.errors[0]!r}")
        return self.n / elapsed, self.n / max(1e-9, self.enqueued - t0)


def run_baseline(base: Path, label: str, n: int, workers: int,
                 drain: bool = False) -> tuple[float, float]:
    root = new_root(base, label)
    qdir = bench_queue(root, num_workers=workers)
    script = str(write_script(root / "bench.sh", TRIVIAL_SCRIPT))
    return Baseline(qdir, script, n, workers).run(drain)


# ---------------------------------------------------------------- main
def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=1000, help="messages per run (default 1000)")
    ap.add_argument("--runs", type=int, default=3, help="runs per figure; medians (default 3)")
    ap.add_argument("--workers", default="1,2", help="worker counts (default 1,2)")
    ap.add_argument("--no-drain", action="store_true",
                    help="skip the secondary execution-only (drain) figures")
    add_common_args(ap)
    args = ap.parse_args()
    workers = [int(w) for w in args.workers.split(",")]
    print(f"throughput: N={args.n}, {args.runs} run(s) per figure, {machine_line()}")
    print(f"  {disk_probe(args.tmpdir)}")
    # figure -> W -> [(jobs/s, second value) per run]
    res: dict[str, dict[int, list[tuple[float, float]]]] = {
        k: {w: [] for w in workers} for k in ("rq", "bl", "rq_drain", "bl_drain")}
    with temp_base(args.tmpdir, args.keep) as base:
        for run in range(args.runs):
            for w in workers:  # interleaved, so machine noise hits both sides alike
                res["rq"][w].append(run_rq(base, f"rq-w{w}-{run}", args.n, w))
                res["bl"][w].append(run_baseline(base, f"bl-w{w}-{run}", args.n, w))
                line = (f"  run {run + 1} W={w}: RQ {res['rq'][w][-1][0]:.0f} jobs/s, "
                        f"baseline {res['bl'][w][-1][0]:.0f} jobs/s")
                if not args.no_drain:
                    res["rq_drain"][w].append(drain_rq(base, f"rqd-w{w}-{run}", args.n, w))
                    res["bl_drain"][w].append(
                        run_baseline(base, f"bld-w{w}-{run}", args.n, w, drain=True))
                    line += (f"; drain RQ {res['rq_drain'][w][-1][0]:.0f}, "
                             f"baseline {res['bl_drain'][w][-1][0]:.0f} jobs/s")
                print(line, flush=True)

    def med(key: str, w: int, i: int = 0) -> float:
        return median([x[i] for x in res[key][w]])

    print()
    print("end to end, enqueue concurrent with execution (issue target a):")
    print(f"{'':6}{'RQ jobs/s':>11}{'baseline jobs/s':>17}{'RQ/baseline':>13}"
          f"   (target >= {TARGET_RATIO:.0%}; then the median of the per-run ratios)")
    for w in workers:
        r, b = med("rq", w), med("bl", w)
        paired = median([x[0] / y[0] for x, y in zip(res["rq"][w], res["bl"][w])])
        mark = "ok" if r / b >= TARGET_RATIO else "MISSED"
        print(f"W={w:<4}{r:11.0f}{b:17.0f}{r / b:13.0%}   {mark}   (paired {paired:.0%})")
    print("  rate of the single enqueuing client during those runs (median msg/s; equal to")
    print("  jobs/s above means the serial durable enqueue, not execution, is the bound):")
    for w in workers:
        print(f"  W={w}: RQ {med('rq', w, 1):.0f}, baseline {med('bl', w, 1):.0f}")
    if not args.no_drain:
        print()
        print("secondary: execution only (N queued first; RQ resumed from PAUSE by SIGHUP):")
        print(f"{'':6}{'RQ jobs/s':>11}{'baseline jobs/s':>17}{'RQ/baseline':>13}"
              f"   first start after resume")
        for w in workers:
            r, b = med("rq_drain", w), med("bl_drain", w)
            paired = median([x[0] / y[0] for x, y in zip(res["rq_drain"][w], res["bl_drain"][w])])
            print(f"W={w:<4}{r:11.0f}{b:17.0f}{r / b:13.0%}   {med('rq_drain', w, 1):.1f} ms"
                  f"   (paired {paired:.0%})")
    print()
    print("PERF.md peers (2 cores, ext4, N=2000, medians of 3; not measured here: "
          "bench/peers.py runs them side by side):")
    print(f"  {'system':52}{'1 worker':>10}{'2 workers':>11}")
    for name, one, two in PEERS:
        print(f"  {name:52}{one:>10}{two:>11}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
