"""Benchmark: durable creates and pings while CPU-bound jobs run (issue 15; S6.3 nice 19).

One queue process, W workers (default: as many as CPUs) each running a job that keeps a
CPU busy (a Python loop) for the whole trial.  Once they run, one client sends N
`create_message` (durable: each acknowledged after its fsyncs) and N `ping`, back to
back, a connection each, and records each round trip.  Baseline in the same trial: the
same client against the same queue PAUSEd, nothing running.  Printed: p50 / p99 / max
in ms, and busy/idle of each p50.

What it shows: whether the queue's threads get a CPU at once when a request or an
fsync's end wakes them while jobs (at nice 19, S6.3) keep every CPU busy.  On this 2-core
machine (Linux 6.18, autogroup on) they wait for a running job's time slice to end: a
create p50 ~3.8 ms against ~0.6 ms idle.  Two remedies were tried and not kept
(docs/benchmarks.md, fourteenth session).

`--src DIR` (repeatable) runs the same trials, interleaved, with the RQ of another
checkout (a `git worktree` of an earlier commit, its rq/_spawn*.so copied in).

    tini -s -- .venv/bin/python bench/cpu_jobs.py --tmpdir DIR [--n 300] [--trials 3]
        [--workers N] [--src OTHER_CHECKOUT ...]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (QUEUE, QueueProc, add_common_args, bench_queue, check_ok,  # noqa: E402
                    disk_probe, machine_line, median, new_root, percentile, temp_base,
                    wait_for)

SPIN = f"""#!{sys.executable}
import os, time
end = time.monotonic() + float(os.environ["RQ_PARAM1"])
while time.monotonic() < end:
    pass
os.write(3, b"done spun\\n")
"""


def round_trips(q: QueueProc, n: int) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {"create": [], "ping": []}
    for _ in range(n):
        t = time.monotonic()
        check_ok(q.call("create_message", {"dest": QUEUE, "param1": "0"}))
        out["create"].append((time.monotonic() - t) * 1e3)
        t = time.monotonic()
        q.call("ping")
        out["ping"].append((time.monotonic() - t) * 1e3)
    return {k: sorted(v) for k, v in out.items()}


def running(q: QueueProc) -> int:
    return int(q.call("num_messages")["run"])


def trial(base: Path, label: str, n: int, workers: int, busy: bool,
          src: str | None) -> dict[str, list[float]]:
    root = new_root(base, label)
    bench_queue(root, num_workers=workers, script_body=SPIN, paused=not busy)
    with QueueProc(root, src=src) as q:
        if busy:
            spin_s = 30.0 + n * 0.05  # longer than the trial: the jobs run all along
            for _ in range(workers):
                check_ok(q.call("create_message", {"dest": QUEUE, "param1": str(spin_s)}))
            wait_for(lambda: running(q) == workers, 20, what=f"{workers} jobs running")
        return round_trips(q, n)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=300, help="creates and pings per trial")
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 2,
                    help="CPU-bound jobs (default: one per CPU)")
    ap.add_argument("--src", action="append", default=[],
                    help="another checkout, measured interleaved (repeatable)")
    add_common_args(ap)
    args = ap.parse_args()
    print(f"cpu_jobs: {args.workers} CPU-bound jobs, {args.n} creates and pings, "
          f"{machine_line()}")
    print(f"  {disk_probe(args.tmpdir)}")
    sides = [("this", None)] + [(f"src{i + 1}", os.path.abspath(s))
                                for i, s in enumerate(args.src)]
    got: dict[tuple[str, str, str], list[list[float]]] = {}
    with temp_base(args.tmpdir, args.keep) as base:
        for t in range(args.trials):
            for name, src in sides:
                for busy in (False, True):
                    state = "busy" if busy else "idle"
                    res = trial(base, f"{name}-{state}-{t}", args.n, args.workers, busy, src)
                    for kind, ms in res.items():
                        got.setdefault((name, state, kind), []).append(ms)
                    print(f"trial {t + 1} {name} {state}: create p50 "
                          f"{percentile(res['create'], 50):.2f} ms, ping p50 "
                          f"{percentile(res['ping'], 50):.2f} ms", flush=True)
    print(f"\nmedians of {args.trials} trials (ms); busy: {args.workers} CPU-bound jobs running")
    print("| checkout | queue | request | p50 | p99 | max | busy/idle p50 |")
    print("|---|---|---|---|---|---|---|")
    for name, _ in sides:
        for kind in ("create", "ping"):
            idle_p50 = median([percentile(ms, 50) for ms in got[(name, "idle", kind)]])
            for state in ("idle", "busy"):
                runs = got[(name, state, kind)]
                p50 = median([percentile(ms, 50) for ms in runs])
                p99 = median([percentile(ms, 99) for ms in runs])
                top = median([ms[-1] for ms in runs])
                print(f"| {name} | {state} | {kind} | {p50:.2f} | {p99:.2f} | {top:.1f} | "
                      f"{p50 / idle_p50:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
