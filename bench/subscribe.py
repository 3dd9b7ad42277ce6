"""Benchmark: does an event subscriber slow message processing? (SPEC S8.8)

One RQ root run by a real `rq-mgr` (the event hub lives in the manager), one
queue `bench` with W workers running the trivial /bin/sh script.  A run
enqueues N messages from a client thread while they execute; the clock runs
from the first enqueue until N more are done.  Three variants, interleaved
run by run (their order rotated each run) so that machine noise hits all
of them:

* `none`     -- nobody subscribed;
* `stalled`  -- a subscriber to `#` that never reads (its socket receive
  buffer shrunk), i.e. the case S8.8 says must not slow the queues; with
  N >= 2,500 (4 events per message) it also falls more than 10,000 events
  behind, so the hub's drop path runs; when it finally reads, the overflow
  record is checked;
* `reading`  -- `rq watch --pattern '#' --json` in its own process, reading
  every event (the cost of the hub itself: tailing, parsing, encoding,
  sending, and of the watcher sharing the CPUs).

Printed: messages/s per variant (median of --runs, every run listed), the
ratios stalled/none and reading/none in the same invocation, and per run the
CPU time used by the rq-mgr process (where the hub runs) and by the queue
process during the run.  Usage:
    .venv/bin/python bench/subscribe.py [--n 3000] [--runs 3] [--workers 2]
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (QUEUE, REPO, BenchError, add_common_args, bench_queue,  # noqa: E402
                    check_ok, disk_probe, fmt_runs, machine_line, median, new_root,
                    temp_base, wait_for)

from rq import client  # noqa: E402

VARIANTS = ("none", "stalled", "reading")


def rq_mgr(root: Path, *args: str) -> None:
    result = subprocess.run([str(REPO / "bin" / "rq-mgr"), "--root", str(root), *args],
                            capture_output=True, text=True, timeout=120)
    if result.returncode != 0:
        raise BenchError(f"rq-mgr {' '.join(args)}: {result.stderr.strip()}")


def done_count(root: Path) -> int:
    counts = client.call_queue(str(root), QUEUE, "num_messages")
    if counts["err"]:
        raise BenchError(f"messages went to err: {counts}")
    return int(counts["done"])


def one_run(root: Path, n: int) -> float:
    """messages/s from the first enqueue to N more done."""
    start_done = done_count(root)
    errors: list[BaseException] = []

    def produce() -> None:
        try:
            for i in range(n):
                check_ok(client.call_queue(str(root), QUEUE, "create_message",
                                           {"dest": QUEUE, "param1": str(i)}))
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    t0 = time.monotonic()
    producer = threading.Thread(target=produce, daemon=True)
    producer.start()

    def finished() -> bool:
        if errors:
            raise BenchError(f"enqueue failed: {errors[0]!r}")
        return done_count(root) - start_done >= n

    wait_for(finished, timeout=max(120.0, n * 0.1), what=f"{n} done", interval=0.005)
    elapsed = time.monotonic() - t0
    producer.join(10)
    return n / elapsed


def reading_subscriber(root: Path, out: Path, since: float) -> subprocess.Popen[bytes]:
    """`rq watch --pattern '#' --json` in a process of its own (so its reading
    does not compete with the producer thread for this process's GIL)."""
    with open(out, "wb") as fh:
        proc = subprocess.Popen([str(REPO / "bin" / "rq"), "--root", str(root), "watch",
                                 "--pattern", "#", "--json", "--since", repr(since)],
                                stdout=fh,
                                stderr=subprocess.DEVNULL)
    return proc


def line_count(path: Path) -> int:
    with open(path, "rb") as fh:
        return sum(1 for _ in fh)


def drain_stalled(sub: client.Subscription) -> tuple[int, int]:
    """(events, dropped) once the stalled subscriber reads again."""
    events = dropped = 0
    while (item := sub.next(2.0)) is not None:
        if isinstance(item, dict) and item.get("event") == "overflow":
            dropped += int(item["dropped"])
        else:
            events += 1
    return events, dropped


def cpu_seconds(root: Path) -> tuple[float, float]:
    """CPU seconds (user + system) used so far by the rq-mgr process, whose
    threads include the event hub, and by the queue process `bench`: on a
    busy machine steadier figures of what a subscriber costs than throughput."""
    import psutil

    mgr = psutil.Process(int((root / "config" / "queuemgr.pid").read_text().split()[0]))
    queue = [c for c in mgr.children() if QUEUE in " ".join(c.cmdline())]  # retitled
    return (sum(mgr.cpu_times()[:2]),
            sum(queue[0].cpu_times()[:2]) if queue else float("nan"))


def run_variant(root: Path, variant: str, n: int) -> tuple[float, str]:
    mgr0, queue0 = cpu_seconds(root)
    rate, note = run_variant_inner(root, variant, n)
    mgr1, queue1 = cpu_seconds(root)
    return rate, f"cpu: rq-mgr {mgr1 - mgr0:5.2f} s, queue {queue1 - queue0:5.1f} s  {note}"


def run_variant_inner(root: Path, variant: str, n: int) -> tuple[float, str]:
    if variant == "none":
        return one_run(root, n), ""
    if variant == "stalled":
        sub = client.subscribe(str(root), ["#"])
        sub.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        try:
            rate = one_run(root, n)
            events, dropped = drain_stalled(sub)
        finally:
            sub.close()
        return rate, f"delivered {events} + dropped {dropped} (overflow records)"
    out = root / "watch.out"
    proc = reading_subscriber(root, out, time.time())
    try:
        # The watcher is following once it printed the marker's last event
        # (--since makes that independent of when it subscribed).
        marker = check_ok(client.call_queue(str(root), QUEUE, "create_message",
                                            {"dest": QUEUE})).rsplit("/", 1)[-1]
        done_line = f'"msg_id":"{marker}","from":"run","to":"done"'
        wait_for(lambda: done_line in out.read_text(), 60, "the watcher to follow")
        start = line_count(out)
        rate = one_run(root, n)
        wait_for(lambda: line_count(out) - start >= 4 * n, 60,
                 "the watcher to get every event")
    finally:
        proc.terminate()
        proc.wait(10)
    return rate, f"rq watch printed {line_count(out) - start} events"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=3000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2)
    add_common_args(ap)
    args = ap.parse_args(argv)
    print(machine_line())
    print(disk_probe(Path(args.tmpdir)))
    results: dict[str, list[float]] = {v: [] for v in VARIANTS}
    notes: dict[str, list[str]] = {v: [] for v in VARIANTS}
    with temp_base(args.tmpdir, args.keep) as base:
        root = new_root(base, "sub")
        bench_queue(root, num_workers=args.workers)
        rq_mgr(root, "start")
        try:
            wait_for(lambda: client.call_queue(str(root), QUEUE, "ping") == ["pong"],
                     60, "queue bench to answer")
            one_run(root, min(100, args.n))  # warm-up, not counted
            for run in range(args.runs):
                # Rotated each run, so no variant always follows the same one.
                for variant in VARIANTS[run % 3:] + VARIANTS[:run % 3]:
                    rate, note = run_variant(root, variant, args.n)
                    results[variant].append(rate)
                    notes[variant].append(note)
                    print(f"run {run + 1} {variant:8s} {rate:7.1f} msg/s {note}  "
                          f"(load {os.getloadavg()[0]:.1f})", flush=True)
        finally:
            rq_mgr(root, "stop")
    print(f"\nN = {args.n} trivial jobs per run, {args.workers} workers, "
          f"{args.runs} runs per variant (interleaved)")
    for variant in VARIANTS:
        print(f"{variant:8s} median {median(results[variant]):7.1f} msg/s  "
              f"{fmt_runs(results[variant], '{:.1f}')}")
    base_rate = median(results["none"])
    for variant in ("stalled", "reading"):
        print(f"ratio {variant}/none: {median(results[variant]) / base_rate:.3f}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BenchError as exc:
        print(f"bench/subscribe.py: {exc}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        sys.exit(130)


