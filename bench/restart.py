"""Benchmark (d): restart time and memory of a queue holding 100,000 messages.

The messages are written straight to disk in RQ's exact format (que/ID/msg,
compact JSON with msg_id, dest, due, count 0, max_count 15, orig_msg_id; ids
`YYYYMMDD.HHMM.SS.mmm.N` as S4.1) without fsyncs, and the queue is PAUSEd so
nothing starts.  Each run spawns `python -m rq.queue` and times, from the
spawn, the first `ping` answer and the first `num_messages` that shows
que == N ("serving again"), then reads the process's RSS (psutil) and stops
it.  Each run times three starts: with no index at all (`.que-index` and
`.que-checkpoint` removed first: every que/ID/msg is read, S2.7; this start
then waits for its first checkpoint, RQ_QUE_CHECKPOINT_SECONDS=1, and is
killed with SIGKILL), after that crash (the running queue's checkpoint: a stat
of each msg instead of a read) and after the clean stop of that start (its
index read instead, rq.queue.snapshot).  Medians of --runs
runs over the same directory (its files are in the page cache after the first
write: a warm-cache figure).  An empty queue's start is timed too, as the
floor (interpreter start and imports).

Targets (issue d): serving again <= 3 s, RSS <= 150 MB; and issue 15: with
--n 1000000, serving again <= 10 s, RSS <= 300 MB (writing and removing a
million message directories takes several minutes each; only restarts are timed).
Usage:  .venv/bin/python bench/restart.py [--n 100000] [--runs 3]
        .venv/bin/python bench/restart.py --n 1000000 --runs 1
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import psutil

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (QUEUE, BenchError, QueueProc, add_common_args, bench_queue,  # noqa: E402
                    disk_probe, dumps, fmt_runs, machine_line, median, new_root, temp_base,
                    wait_for)

TARGET_SECONDS = 3.0
TARGET_MB = 150.0
BIG = 1_000_000                      # issue 15: a million queued messages
BIG_SECONDS, BIG_MB = 10.0, 300.0


def targets(n: int) -> tuple[float, float]:
    """(serving seconds, RSS MB) targets for n queued messages."""
    return (BIG_SECONDS, BIG_MB) if n >= BIG else (TARGET_SECONDS, TARGET_MB)
BASE_URL = "http://127.0.0.1:3333/"  # make_root's host and port, ROOT "/"


def write_messages(qdir: Path, n: int) -> None:
    """n que/ID/msg files as RQ writes them (no fsync: this is set-up)."""
    que = qdir / "que"
    start = time.time() - 3600  # an hour ago: all due, ids spread over many seconds
    for i in range(n):
        now = start + i * 0.001
        t = time.gmtime(now)
        msg_id = (time.strftime("%Y%m%d.%H%M.%S", t)
                  + f".{int(round((now % 1) * 1000)) % 1000:03d}.{1000000 + i}")
        fields = {"msg_id": msg_id, "dest": QUEUE, "due": int(now), "count": 0,
                  "max_count": 15, "orig_msg_id": f"{BASE_URL}q/{QUEUE}/{msg_id}"}
        d = que / msg_id
        os.mkdir(d)
        with open(d / "msg", "wb") as fh:
            fh.write(dumps(fields).encode())


def start_once(root: Path, n: int, crash: bool = False) -> tuple[float, float, float]:
    """(seconds to ping, seconds to num_messages que == n, RSS MB then).  `crash`: then
    wait for the queue's checkpoint and SIGKILL it, else stop it gracefully."""
    if crash:
        os.environ["RQ_QUE_CHECKPOINT_SECONDS"] = "1"
    try:
        q = QueueProc(root, wait=False)
    finally:
        os.environ.pop("RQ_QUE_CHECKPOINT_SECONDS", None)
    try:
        timeout = 120.0
        wait_for(q.ping, timeout, "ping", interval=0.002)
        t_ping = time.monotonic() - q.spawned

        def serving() -> bool:
            reply = q.try_call("num_messages")
            return isinstance(reply, dict) and reply.get("que") == n

        wait_for(serving, timeout, f"num_messages que == {n}", interval=0.002)
        t_ready = time.monotonic() - q.spawned
        rss = psutil.Process(q.pid).memory_info().rss / 1e6
        counts = q.call("num_messages")
        if counts["run"] or counts["done"] or counts["err"]:
            raise BenchError(f"a PAUSEd queue ran messages: {counts}")
        if crash:
            checkpoint = root / "queue" / QUEUE / ".que-checkpoint"  # rq.queue.snapshot
            wait_for(checkpoint.exists, timeout, "the running queue's checkpoint", interval=0.05)
            q.kill()
    finally:
        q.stop()
    return t_ping, t_ready, rss


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=100_000, help="queued messages (default 100000)")
    ap.add_argument("--runs", type=int, default=3, help="restarts; medians (default 3)")
    add_common_args(ap)
    args = ap.parse_args()
    print(f"restart: {args.n} queued messages, {args.runs} restart(s), {machine_line()}")
    print(f"  {disk_probe(args.tmpdir)}")
    with temp_base(args.tmpdir, args.keep) as base:
        empty = new_root(base, "empty")
        bench_queue(empty, num_workers=1, paused=True)
        empty_runs = [start_once(empty, 0) for _ in range(args.runs)]

        root = new_root(base, "full")
        qdir = bench_queue(root, num_workers=1, paused=True)
        t = time.monotonic()
        write_messages(qdir, args.n)
        print(f"  wrote {args.n} messages in {time.monotonic() - t:.1f} s")
        runs: dict[str, list[tuple[float, float, float]]] = {"none": [], "crash": [],
                                                              "stop": []}
        for i in range(args.runs):
            for name in (".que-index", ".que-checkpoint"):  # rq.queue.snapshot
                (qdir / name).unlink(missing_ok=True)
            runs["none"].append(start_once(root, args.n, crash=True))
            if (qdir / ".que-index").exists():
                raise BenchError("a crash left a .que-index")
            runs["crash"].append(start_once(root, args.n))
            if not (qdir / ".que-index").exists():
                raise BenchError("the clean stop left no .que-index")
            runs["stop"].append(start_once(root, args.n))
            for kind in runs:
                print(f"  run {i + 1}, {kind:5}: ping {runs[kind][-1][0]:.2f} s, "
                      f"serving {runs[kind][-1][1]:.2f} s, RSS {runs[kind][-1][2]:.0f} MB",
                      flush=True)
        print("  removing the temporary directory (untimed)...", flush=True)
    target_s, target_mb = targets(args.n)
    print()
    print(f"empty queue:  ping after {median([r[0] for r in empty_runs]):.2f} s, "
          f"RSS {median([r[2] for r in empty_runs]):.0f} MB  (interpreter + imports floor)")
    for kind, label in (("stop", "after a clean stop (its que/ index)"),
                        ("crash", "after a crash (the running queue's checkpoint)"),
                        ("none", "with no index at all (every msg read)")):
        rows = runs[kind]
        ping, ready = median([r[0] for r in rows]), median([r[1] for r in rows])
        rss = median([r[2] for r in rows])
        print(f"{args.n} queued, {label}:")
        print(f"  ping answered after        {ping:6.2f} s   "
              f"runs {fmt_runs([r[0] for r in rows], '{:.2f}')}")
        print(f"  serving again (que == N)   {ready:6.2f} s   (target <= {target_s:.0f} s: "
              f"{'ok' if ready <= target_s else 'MISSED'})   "
              f"runs {fmt_runs([r[1] for r in rows], '{:.2f}')}")
        print(f"  RSS then                   {rss:6.0f} MB  (target <= {target_mb:.0f} MB: "
              f"{'ok' if rss <= target_mb else 'MISSED'})   runs {fmt_runs([r[2] for r in rows])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
