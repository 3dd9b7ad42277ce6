"""Benchmark (c): dispatch latency on an idle queue (num_workers 1).

The queue script writes one line into a FIFO whose path is param1
(`echo go > "$RQ_PARAM1"`), then `echo "done ok" >&3`.  For each sample the
bench opens the FIFO for reading (non-blocking) and starts a thread that waits
on it, sends create_message, and takes the time the reply was read and the time
the line arrived; latency = arrival - reply.  (S5.1 has the job started before
the reply is sent, so a line can arrive before the client has read the reply:
such samples are negative and are counted.)  It then waits until the message
is done, so every request finds the queue idle.

Targets (issue c): p50 <= 3 ms, p99 <= 10 ms.
Usage:  .venv/bin/python bench/latency.py [--n 300] [--warmup 10]
"""

from __future__ import annotations

import argparse
import os
import select
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (QUEUE, BenchError, QueueProc, add_common_args, bench_queue,  # noqa: E402
                    check_ok, disk_probe, machine_line, new_root, percentile, temp_base,
                    wait_for)

SCRIPT = '#!/bin/sh\necho go > "$RQ_PARAM1"\necho "done ok" >&3\n'
TARGET_P50_MS = 3.0
TARGET_P99_MS = 10.0
LINE_TIMEOUT = 10.0


def wait_line(fd: int, result: list[float]) -> None:
    """Wait for data on the FIFO and record the monotonic time it arrived.

    Before any writer has opened the FIFO, poll() reports nothing (Linux only
    reports POLLHUP once a writer has come and gone), so no spin."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    deadline = time.monotonic() + LINE_TIMEOUT
    while time.monotonic() < deadline:
        events = poller.poll(100)
        now = time.monotonic()
        if not events:
            continue
        try:
            data = os.read(fd, 4096)
        except BlockingIOError:
            continue
        if data:
            result.append(now)
            return
        time.sleep(0.0005)  # a HUP without data: a writer that wrote nothing yet


def measure(base: Path, n: int, warmup: int) -> tuple[list[float], list[float]]:
    """(reply->line latencies, request round-trip times), in seconds."""
    root = new_root(base, "latency")
    bench_queue(root, num_workers=1, script_body=SCRIPT)
    fifo = str(base / "line.fifo")
    os.mkfifo(fifo)
    latencies: list[float] = []
    round_trips: list[float] = []
    with QueueProc(root) as q:
        for i in range(warmup + n):
            fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
            try:
                arrival: list[float] = []
                reader = threading.Thread(target=wait_line, args=(fd, arrival), daemon=True)
                reader.start()
                sent = time.monotonic()
                check_ok(q.call("create_message", {"dest": QUEUE, "param1": fifo}))
                replied = time.monotonic()
                reader.join(LINE_TIMEOUT + 1)
                if not arrival:
                    raise BenchError(f"sample {i}: no line from the job within {LINE_TIMEOUT}s")
            finally:
                os.close(fd)
            wait_for(lambda: q.call("num_messages")["done"] >= i + 1, 10,
                     f"message {i} done", interval=0.0005)
            if i >= warmup:
                latencies.append(arrival[0] - replied)
                round_trips.append(replied - sent)
        counts = q.call("num_messages")
        if counts["err"]:
            raise BenchError(f"messages went to err: {counts}")
    return latencies, round_trips


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=300, help="samples (default 300)")
    ap.add_argument("--warmup", type=int, default=10, help="unrecorded first samples (default 10)")
    add_common_args(ap)
    args = ap.parse_args()
    print(f"latency: {args.n} samples after {args.warmup} warm-up, {machine_line()}")
    print(f"  {disk_probe(args.tmpdir)}")
    with temp_base(args.tmpdir, args.keep) as base:
        lat, rtt = measure(base, args.n, args.warmup)
    ms = sorted(x * 1e3 for x in lat)
    rt = sorted(x * 1e3 for x in rtt)
    p50, p90, p99 = (percentile(ms, p) for p in (50, 90, 99))
    print()
    print("create_message reply -> first line of the job (ms):")
    print(f"  p50 {p50:.2f}   p90 {p90:.2f}   p99 {p99:.2f}   max {ms[-1]:.2f}   min {ms[0]:.2f}")
    print(f"  p50 target <= {TARGET_P50_MS}: {'ok' if p50 <= TARGET_P50_MS else 'MISSED'};  "
          f"p99 target <= {TARGET_P99_MS}: {'ok' if p99 <= TARGET_P99_MS else 'MISSED'}")
    negative = sum(1 for x in ms if x < 0)
    print(f"  {negative} of {len(ms)} lines arrived before the client had read the reply")
    print("for context, create_message round trip (request -> reply, includes fsyncs and "
          "the job's spawn) (ms):")
    print(f"  p50 {percentile(rt, 50):.2f}   p90 {percentile(rt, 90):.2f}   "
          f"p99 {percentile(rt, 99):.2f}   max {rt[-1]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
