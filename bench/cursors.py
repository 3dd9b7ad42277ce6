"""Benchmark: what a named cursor costs (issue 18 item 3, docs/guide/cursors.md).

One RQ root run by a real `rq-mgr` (the event hub and the cursors live in
the manager); N events already in the event log (written by the queues' own
`rq.events.EventLog` over Q queue files, no queue process: only the log
matters here).  Per run, interleaved:

* `since`  -- a plain subscription with `since` = 0 replays the N events (the
  baseline: tail, parse, encode, send);
* `cursor` -- a cursor made before the events were written replays the same
  N events, each stamped with its position token, and the subscriber acks
  once at the end (what `rq watch --cursor` does for one burst).

Printed: events/s per variant (median of --runs), the ratio cursor/since and
the rq-mgr CPU seconds of each run, then the latency of one `ack` round trip
(a durable state write: temp, fsync, rename, fsync dir), median and p90 of
--acks acks each after one event.  Usage:
    tini -s -- .venv/bin/python bench/cursors.py --tmpdir /var/tmp/rqbench [--n 20000] [--runs 3]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (REPO, BenchError, add_common_args, disk_probe, fmt_runs,  # noqa: E402
                    machine_line, median, new_root, temp_base)

from rq import client  # noqa: E402
from rq.events import EventLog  # noqa: E402


def rq_mgr(root: Path, *args: str) -> None:
    result = subprocess.run([str(REPO / "bin" / "rq-mgr"), "--root", str(root), *args],
                            capture_output=True, text=True, timeout=120)
    if result.returncode != 0:
        raise BenchError(f"rq-mgr {' '.join(args)}: {result.stderr.strip()}")


def mgr_cpu(root: Path) -> float:
    import psutil
    pid = int((root / "config" / "queuemgr.pid").read_text().split()[0])
    return sum(psutil.Process(pid).cpu_times()[:2])


def write_events(root: Path, n: int, queues: int) -> None:
    logs = [EventLog(str(root), "bench", f"q{i}") for i in range(queues)]
    now = time.time()
    for i in range(n):
        logs[i % queues].log(f"m{i}", "que", "run", ts=now + i * 1e-4)
    for log in logs:
        log.close()


def receive(sub: client.Subscription, n: int) -> str | None:
    """Read n events; the last one's pos (None for a plain stream)."""
    got, last = 0, None
    while got < n:
        item = sub.next(60)
        if item is None:
            raise BenchError(f"stalled after {got} of {n} events")
        if isinstance(item, dict) and "msg_id" in item:
            got += 1
            last = item.get("pos")
    return last


def replay(root: Path, variant: str, name: str, n: int) -> tuple[float, float]:
    cpu0, t0 = mgr_cpu(root), time.perf_counter()
    if variant == "since":
        with client.subscribe(str(root), ["#"], 0.0) as sub:
            receive(sub, n)
    else:
        with client.subscribe(str(root), [], cursor=name) as sub:
            pos = receive(sub, n)
            sub.ack(str(pos))
            if sub.next(60) != ["ok", "acked", n]:
                raise BenchError("ack failed")
    return n / (time.perf_counter() - t0), mgr_cpu(root) - cpu0


def ack_latency(root: Path, acks: int) -> list[float]:
    with client.subscribe(str(root), ["#"], cursor="acks") as sub:
        out = []
        for _ in range(acks):
            write_events(root, 1, 1)  # one event at a time: the reply is the next frame
            pos = receive(sub, 1)
            t0 = time.perf_counter()
            sub.ack(str(pos))
            if not (isinstance(reply := sub.next(30), list) and reply[:2] == ["ok", "acked"]):
                raise BenchError(f"ack: {reply}")
            out.append(time.perf_counter() - t0)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=20000)
    ap.add_argument("--queues", type=int, default=10)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--acks", type=int, default=200)
    add_common_args(ap)
    args = ap.parse_args(argv)
    print(machine_line())
    print(disk_probe(Path(args.tmpdir)))
    rates: dict[str, list[float]] = {"since": [], "cursor": []}
    cpus: dict[str, list[float]] = {"since": [], "cursor": []}
    with temp_base(args.tmpdir, args.keep) as base:
        root = new_root(base, "cur")
        rq_mgr(root, "start")
        try:
            for run in range(args.runs):  # cursors made before the events: they replay all N
                with client.subscribe(str(root), ["#"], cursor=f"c{run}"):
                    pass
            write_events(root, args.n, args.queues)
            for run in range(args.runs):
                for variant in (("since", "cursor") if run % 2 == 0 else ("cursor", "since")):
                    rate, cpu = replay(root, variant, f"c{run}", args.n)
                    rates[variant].append(rate)
                    cpus[variant].append(cpu)
                    print(f"run {run + 1} {variant:6s} {rate:9.0f} events/s  rq-mgr cpu "
                          f"{cpu:5.2f} s  (load {os.getloadavg()[0]:.1f})", flush=True)
            lat = sorted(ack_latency(root, args.acks))
        finally:
            rq_mgr(root, "stop")
    print(f"\nN = {args.n} events over {args.queues} queue files, {args.runs} runs (interleaved)")
    for variant in ("since", "cursor"):
        print(f"{variant:6s} median {median(rates[variant]):9.0f} events/s "
              f"{fmt_runs(rates[variant])}  rq-mgr cpu median {median(cpus[variant]):.2f} s")
    print(f"ratio cursor/since: throughput {median(rates['cursor']) / median(rates['since']):.2f}, "
          f"rq-mgr cpu {median(cpus['cursor']) / median(cpus['since']):.2f}")
    print(f"ack round trip (durable): median {median(lat) * 1e3:.2f} ms, "
          f"p90 {lat[int(len(lat) * 0.9)] * 1e3:.2f} ms over {len(lat)} acks")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BenchError as exc:
        print(f"bench/cursors.py: {exc}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        sys.exit(130)
