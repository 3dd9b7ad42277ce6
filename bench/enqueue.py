"""Benchmark (b): durable enqueue (create_message) over the queue socket.

The queue is PAUSEd, so nothing runs and only the enqueue path is timed.
N messages per run are sent by 1 client process, then by 8 concurrent client
processes (N/8 each; processes, not threads, since one Python client is
GIL-bound).  Each run uses a fresh root and queue process; medians of --runs.
The clock runs from releasing the (already started, already connected-ready)
clients until the last reply; every reply is an "ok" sent only after fsync.
Each request goes on a connection of its own (S7.1); one more figure has the
single client send them all on one kept connection (`keep`, rq.client.Connection,
as rq.Client does from a queue's second request on).

Targets (issue b): >= 1,000 messages/s for one client; 8 clients >= 1.5x one.
Usage:  .venv/bin/python bench/enqueue.py [--n 2000] [--runs 3] [--clients 8]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (QUEUE, BenchError, QueueProc, add_common_args, bench_queue,  # noqa: E402
                    check_ok, disk_probe, fmt_runs, machine_line, median, new_root, temp_base)

TARGET_ONE = 1000.0
TARGET_SCALE = 1.5


def client_proc(root: str, count: int, tag: int, kept: bool, ready: Any, go: Any,
                out: Any) -> None:
    """One client process: wait for `go`, send `count` create_message requests."""
    from rq import client
    conn = client.Connection(client.queue_socket(root, QUEUE))
    call = conn.call if kept else lambda cmd, arg: client.call_queue(root, QUEUE, cmd, arg)
    ready.put(tag)
    go.wait()
    t0 = time.monotonic()
    try:
        for i in range(count):
            check_ok(call("create_message", {"dest": QUEUE, "param1": f"{tag}-{i}"}))
        conn.close()
        out.put((tag, t0, time.monotonic(), None))
    except BaseException as exc:  # reported by the parent
        out.put((tag, t0, time.monotonic(), repr(exc)))


def run(base: Path, label: str, n: int, clients: int, kept: bool = False) -> float:
    """Messages/s for `n` messages split over `clients` processes."""
    ctx = mp.get_context("fork")  # the bench process is small; no daemon is forked
    root = new_root(base, label)
    bench_queue(root, num_workers=1, paused=True)
    with QueueProc(root) as q:
        ready, out, go = ctx.Queue(), ctx.Queue(), ctx.Event()
        shares = [n // clients + (1 if i < n % clients else 0) for i in range(clients)]
        procs = [ctx.Process(target=client_proc, args=(str(root), c, i, kept, ready, go, out),
                             daemon=True) for i, c in enumerate(shares)]
        try:
            for p in procs:
                p.start()
            for _ in procs:
                ready.get(timeout=30)
            t0 = time.monotonic()
            go.set()
            results = [out.get(timeout=max(60.0, n * 0.05)) for _ in procs]
            end = max(r[2] for r in results)
        finally:
            for p in procs:
                p.join(10)
                if p.is_alive():
                    p.kill()
                    p.join()
        failed = [r for r in results if r[3]]
        if failed:
            raise BenchError(f"client {failed[0][0]} failed: {failed[0][3]}")
        counts = q.call("num_messages")
        if counts["que"] != n:
            raise BenchError(f"expected {n} queued, queue reports {counts}")
    return n / (end - t0)


def bare_create(base: Path, label: str, n: int) -> float:
    """Messages/s of throughput.py's bare producer: RQ's durable create
    sequence (mkdir, msg temp file + fsync + rename, fsync ID/, rename to que/,
    fsync que/) in a plain loop, no socket and no daemon: the floor on this disk."""
    from throughput import Baseline
    root = new_root(base, label)
    qdir = bench_queue(root, num_workers=1)
    b = Baseline(qdir, str(root / "bench.sh"), n, 1)
    t0 = time.monotonic()
    b.produce()
    if b.errors:
        raise BenchError(f"bare create failed: {b.errors[0]!r}")
    return n / (time.monotonic() - t0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=2000, help="messages per run (default 2000)")
    ap.add_argument("--runs", type=int, default=3, help="runs per figure; medians (default 3)")
    ap.add_argument("--clients", type=int, default=8, help="concurrent clients (default 8)")
    add_common_args(ap)
    args = ap.parse_args()
    print(f"enqueue: N={args.n} per run, {args.runs} run(s) per figure, {machine_line()}")
    print(f"  {disk_probe(args.tmpdir)}")
    one: list[float] = []
    many: list[float] = []
    bare: list[float] = []
    kept: list[float] = []
    with temp_base(args.tmpdir, args.keep) as base:
        for i in range(args.runs):  # interleaved, so machine noise hits both alike
            one.append(run(base, f"one-{i}", args.n, 1))
            many.append(run(base, f"many-{i}", args.n, args.clients))
            bare.append(bare_create(base, f"bare-{i}", args.n))
            kept.append(run(base, f"kept-{i}", args.n, 1, kept=True))
            print(f"  run {i + 1}: 1 client {one[-1]:.0f} msg/s, "
                  f"{args.clients} clients {many[-1]:.0f} msg/s, "
                  f"bare create loop {bare[-1]:.0f} msg/s, "
                  f"1 client on a kept connection {kept[-1]:.0f} msg/s", flush=True)
    m1, m8 = median(one), median(many)
    print()
    print(f"1 client:          {m1:7.0f} msg/s   (target >= {TARGET_ONE:.0f}: "
          f"{'ok' if m1 >= TARGET_ONE else 'MISSED'})   runs {fmt_runs(one)}")
    print(f"{args.clients} clients:         {m8:7.0f} msg/s   runs {fmt_runs(many)}")
    print(f"{args.clients} clients / 1 client: {m8 / m1:5.2f}x       (target >= {TARGET_SCALE}x: "
          f"{'ok' if m8 / m1 >= TARGET_SCALE else 'MISSED'})")
    print(f"per-request latency, 1 client: {1e3 / m1:.2f} ms")
    mb = median(bare)
    print(f"context: bare durable create loop, same syscalls, no daemon: {mb:.0f} msg/s "
          f"({1e3 / mb:.2f} ms each; RQ 1 client = {m1 / mb:.0%} of it)   runs {fmt_runs(bare)}")
    mk = median(kept)
    print(f"1 client, one kept connection: {mk:.0f} msg/s ({mk / m1:.2f}x a connection each)"
          f"   runs {fmt_runs(kept)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
