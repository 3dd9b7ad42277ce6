"""Benchmark: bulk retry and clean-up (issue 16 item 6) against one request per message.

Each run builds two fresh roots holding N finished messages written straight to disk in
RQ's format (no fsyncs: set-up) with the queue PAUSEd, starts `python -m rq.queue` on each
and times, interleaved in the same run:
  * purge: one `purge_messages {older_than: 0}` request, against N `delete_message`
    requests over the socket (what a script had to do before): the same end state, every
    message logged as `done -> deleted` (S13);
  * requeue: one `requeue_messages {state: err}` request; there is no single-message
    requeue to compare with, so its figures are absolute (messages per second, CPU per
    message of the queue process).
Wall time and the queue process's CPU time (psutil, user+system) are printed per run,
then medians and the bulk/loop ratio.

Usage:  tini -s -- .venv/bin/python bench/bulk.py --tmpdir /var/tmp/rqbench [--n 2000] [--runs 3]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import psutil

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (QUEUE, QueueProc, add_common_args, bench_queue, check_ok,  # noqa: E402
                    disk_probe, dumps, fmt_runs, machine_line, median, new_root, temp_base)

BUCKETED = ("done", "relayed")


def write_messages(qdir: Path, state: str, n: int) -> list[str]:
    """n messages in `state` as RQ leaves them (msg + status), a day old."""
    start = time.time() - 86400
    ids = []
    for i in range(n):
        now = start + i * 0.001
        t = time.gmtime(now)
        msg_id = (time.strftime("%Y%m%d.%H%M.%S", t)
                  + f".{int(round((now % 1) * 1000)) % 1000:03d}.{1000000 + i}")
        where = qdir / state / (time.strftime("%Y%m%d/%H/%M/", t) if state in BUCKETED else "")
        d = where / msg_id
        d.mkdir(parents=True)
        (d / "msg").write_text(dumps({"dest": QUEUE, "due": int(now), "count": 1,
                                      "max_count": 15}))
        (d / "status").write_text(dumps({"job_status": "finished"}))
        ids.append(msg_id)
    return ids


def cpu(q: QueueProc) -> float:
    times = psutil.Process(q.pid).cpu_times()
    return times.user + times.system


def timed(q: QueueProc, work: object) -> tuple[float, float]:
    """(wall seconds, queue-process CPU seconds) of `work()`."""
    c0, t0 = cpu(q), time.perf_counter()
    work()  # type: ignore[operator]
    return time.perf_counter() - t0, cpu(q) - c0


def run_once(base: Path, n: int, k: int) -> dict[str, tuple[float, float]]:
    out = {}
    for label, state in (("purge bulk", "done"), ("purge loop", "done"),
                         ("requeue bulk", "err")):
        root = new_root(base, f"{label.replace(' ', '-')}-{k}")
        qdir = bench_queue(root, num_workers=1, paused=True)
        ids = write_messages(qdir, state, n)
        with QueueProc(root) as q:
            if label == "purge bulk":
                def work() -> None:
                    assert check_ok(q.call("purge_messages", {"older_than": 0})) == n
            elif label == "purge loop":
                def work() -> None:
                    for msg_id in ids:
                        check_ok(q.call("delete_message", {"msg_id": msg_id}))
            else:
                def work() -> None:
                    assert check_ok(q.call("requeue_messages", {"state": "err"})) == n
            out[label] = timed(q, work)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--runs", type=int, default=3)
    add_common_args(ap)
    args = ap.parse_args()
    print(machine_line())
    print(disk_probe(Path(args.tmpdir)))
    runs: list[dict[str, tuple[float, float]]] = []
    with temp_base(args.tmpdir, args.keep) as base:
        for k in range(args.runs):
            runs.append(run_once(base, args.n, k))
    print(f"N = {args.n} messages, {args.runs} runs (wall s, queue CPU s)")
    med = {}
    for label in runs[0]:
        walls = [r[label][0] for r in runs]
        cpus = [r[label][1] for r in runs]
        med[label] = (median(walls), median(cpus))
        print(f"  {label:13s} wall {fmt_runs(walls, '{:.2f}')} cpu {fmt_runs(cpus, '{:.2f}')}"
              f"  -> {args.n / med[label][0]:,.0f} msg/s, "
              f"{med[label][1] / args.n * 1e6:.0f} us CPU/msg")
    bulk, loop = med["purge bulk"], med["purge loop"]
    print(f"purge: bulk is {loop[0] / bulk[0]:.1f}x faster (wall) and uses "
          f"{bulk[1] / loop[1]:.2f}x the queue CPU of one delete_message per message")
    return 0


if __name__ == "__main__":
    sys.exit(main())
