"""Benchmark: bulk create over HTTP (issue 15; web.bulkcreate) against one POST per message.

A real `rq-mgr start` (manager, the real `rq-web` daemon, the queue process) on a fresh
root with a PAUSEd queue, so only the enqueue path is timed.  Interleaved trials of N
messages each, one client thread in this process:
- `per message`: `POST /q/bench/new_message` per message on one kept-alive connection
  (rq.transports.HttpTransport.create: what `rq sendmesg --stdin --url` did before);
- `new_messages`: rq.producer.Client(url=…).send_many, one `POST /q/bench/new_messages`
  of NDJSON per batch of 256 (what `rq sendmesg --stdin --url` does now);
- `socket stream`: the same send_many over the queue's own socket (`create_messages`),
  no web server: the floor the HTTP path adds to, measured at the same moment.
Printed: msg/s and CPU per 1,000 messages of the whole machine (/proc/stat: includes
other users' load) and of RQ's processes (the manager's tree + this process), medians,
and each path's ratio to the socket stream of the same trial.

Usage:  tini -s -- .venv/bin/python bench/http_bulk.py --tmpdir DIR [--n 2000] [--trials 3]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (QUEUE, add_common_args, bench_queue, disk_probe, machine_line,  # noqa: E402
                    median, temp_base)
from http_enqueue import ManagedRQ, new_http_root  # noqa: E402
from peerlib import machine_cpu_seconds, tree_cpu_seconds  # noqa: E402

from rq.producer import Client  # noqa: E402
from rq.transports import HttpTransport  # noqa: E402


def mgr_pid(root: Path) -> int:
    from rq.mgr import pidfile
    pid = pidfile.running_pid(str(root))
    assert pid is not None, "rq-mgr not running"
    return pid


def measure(send: Callable[[], list[str]], n: int, pid: int) -> tuple[float, float, float]:
    """(msg/s, machine CPU s per 1k, RQ CPU s per 1k) of one send of n messages."""
    m0, t0 = machine_cpu_seconds(), tree_cpu_seconds(pid) + tree_cpu_seconds(os.getpid())
    w0 = time.monotonic()
    ids = send()
    w1 = time.monotonic()
    m1, t1 = machine_cpu_seconds(), tree_cpu_seconds(pid) + tree_cpu_seconds(os.getpid())
    assert len(ids) == n and len(set(ids)) == n, len(ids)
    return n / (w1 - w0), (m1 - m0) / n * 1000, (t1 - t0) / n * 1000


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_args(ap)
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--trials", type=int, default=3)
    args = ap.parse_args()
    print(machine_line())
    with temp_base(args.tmpdir, args.keep) as base:
        print(disk_probe(base))
        root = new_http_root(base, "http-bulk")
        bench_queue(root, num_workers=1, paused=True)
        with ManagedRQ(root) as rq:
            rq.wait_queue()
            url = f"http://127.0.0.1:{rq.port}/"
            http, local = HttpTransport(url), Client(str(root))
            remote = Client(url=url)
            msgs = [{"dest": QUEUE, "param1": f"m{i}"} for i in range(args.n)]
            paths: dict[str, Callable[[], list[str]]] = {
                "per message": lambda: [http.create(QUEUE, m) for m in msgs],
                "new_messages": lambda: remote.send_many(QUEUE, msgs),
                "socket stream": lambda: local.send_many(QUEUE, msgs),
            }
            http.create(QUEUE, {"dest": QUEUE, "param1": "warm"})
            results: dict[str, list[tuple[float, float, float]]] = {k: [] for k in paths}
            ratios: dict[str, list[float]] = {k: [] for k in paths}
            pid = mgr_pid(root)
            for trial in range(args.trials):
                got = {k: measure(fn, args.n, pid) for k, fn in paths.items()}
                for k, r in got.items():
                    results[k].append(r)
                    ratios[k].append(r[0] / got["socket stream"][0])
                print(f"trial {trial + 1}: " + ", ".join(
                    f"{k} {r[0]:.0f}/s" for k, r in got.items()), flush=True)
    print(f"\nN = {args.n} per path per trial, medians of {args.trials}\n")
    print("| path | msg/s | × socket stream | CPU s/1k machine | CPU s/1k RQ |")
    print("|---|---|---|---|---|")
    for k, rs in results.items():
        print(f"| {k} | {median([r[0] for r in rs]):.0f} | {median(ratios[k]):.2f} | "
              f"{median([r[1] for r in rs]):.2f} | {median([r[2] for r in rs]):.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
