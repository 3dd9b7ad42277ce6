"""Benchmark: a fan-out (issue 18 item 2) against the same copies sent one by one.

One RQ root run by a real `rq-mgr`, K paused queues (topics `fan.q0` … `fan.qK-1`,
so nothing runs and only the create path is timed).  Two variants, interleaved in
blocks and rotated each run:
* `direct`:  K `create_message` requests, one to each queue socket, one after the other
  (what a client did before: K durable messages, but no all-or-nothing);
* `fanout`:  one `create_message {"dest": "fan.*"}` to rq-mgr: the journal written and
  fsynced, K `fanout_prep`, the journal rewritten, K `fanout_commit`, the journal removed.
Printed per variant: fan-outs (sets of K copies) per second from one client, and the CPU
seconds of rq-mgr and of all the queue processes per 1,000 sets, measured in the same
run; then the ratios fanout/direct.  Usage:
    tini -s -- .venv/bin/python bench/fanout.py --tmpdir DIR
        [--n 300] [--runs 3] [--k 3,8]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (REPO, BenchError, add_common_args, check_ok, disk_probe,  # noqa: E402
                    fmt_runs, machine_line, make_queue, make_root, median, temp_base,
                    wait_for, write_script)

from rq import client  # noqa: E402
from rqtest import free_port  # noqa: E402

VARIANTS = ("direct", "fanout")
SCRIPT = '#!/bin/sh\necho "done ok" >&3\n'


def rq_mgr(root: Path, *args: str) -> None:
    result = subprocess.run([str(REPO / "bin" / "rq-mgr"), "--root", str(root), *args],
                            capture_output=True, text=True, timeout=120)
    if result.returncode != 0:
        raise BenchError(f"rq-mgr {' '.join(args)}: {result.stderr.strip()}")


def build(base: Path, k: int) -> tuple[Path, list[str]]:
    sub = base / f"k{k}"
    sub.mkdir()
    root = make_root(sub, port=free_port())
    script = write_script(root / "bench.sh", SCRIPT)
    names = [f"q{i}" for i in range(k)]
    for name in names:
        make_queue(root, name, script, topic=f"fan.{name}")
        (root / "config" / f"{name}.pause").touch()  # S3.5: created, never run
    return root, names


def cpu_seconds(root: Path) -> tuple[float, float]:
    """CPU seconds (user + system) so far of rq-mgr and of all its queue processes."""
    import psutil
    mgr = psutil.Process(int((root / "config" / "queuemgr.pid").read_text().split()[0]))
    queues = [c for c in mgr.children() if "[rq-que]" in " ".join(c.cmdline())]  # retitled
    return sum(mgr.cpu_times()[:2]), sum(sum(q.cpu_times()[:2]) for q in queues)


def block(root: Path, names: list[str], variant: str, n: int) -> tuple[float, float, float]:
    """(sets per second, rq-mgr CPU s and queue CPU s per 1,000 sets) for n sets."""
    mgr0, q0 = cpu_seconds(root)
    t0 = time.perf_counter()
    for i in range(n):
        if variant == "direct":
            for name in names:
                check_ok(client.call_queue(str(root), name, "create_message",
                                           {"dest": "fan.*", "param1": str(i)}))
        else:
            reply = client.call_mgr(str(root), "create_message",
                                    {"dest": "fan.*", "param1": str(i)})
            if not (isinstance(reply, list) and reply[0] == "ok" and len(reply[1]) == len(names)):
                raise BenchError(f"fan-out failed: {reply}")
    wall = time.perf_counter() - t0
    mgr1, q1 = cpu_seconds(root)
    return n / wall, (mgr1 - mgr0) * 1000 / n, (q1 - q0) * 1000 / n


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=300, help="sets of K copies per block")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--k", default="3,8", help="queues per fan-out, comma-separated")
    add_common_args(ap)
    args = ap.parse_args(argv)
    print(machine_line())
    print(disk_probe(Path(args.tmpdir)))
    with temp_base(args.tmpdir, args.keep) as base:
        for k in (int(x) for x in args.k.split(",")):
            root, names = build(base, k)
            rq_mgr(root, "start")
            try:
                for name in names:
                    wait_for(lambda name=name: client.call_queue(str(root), name, "ping")
                             == ["pong"], 60, f"queue {name} to answer")
                block(root, names, "fanout", 20)  # warm-up, not counted
                block(root, names, "direct", 20)
                res: dict[str, list[tuple[float, float, float]]] = {v: [] for v in VARIANTS}
                for run in range(args.runs):
                    for variant in VARIANTS[run % 2:] + VARIANTS[:run % 2]:
                        r = block(root, names, variant, args.n)
                        res[variant].append(r)
                        print(f"K={k} run {run + 1} {variant:6s} {r[0]:7.1f} sets/s  cpu per "
                              f"1000 sets: rq-mgr {r[1]:5.2f} s, queues {r[2]:5.2f} s  "
                              f"(load {os.getloadavg()[0]:.1f})", flush=True)
            finally:
                rq_mgr(root, "stop")
            med = {v: [median([r[i] for r in res[v]]) for i in range(3)] for v in VARIANTS}
            print(f"\nK={k}: N = {args.n} sets per block, {args.runs} runs (interleaved)")
            for v in VARIANTS:
                print(f"  {v:6s} median {med[v][0]:7.1f} sets/s "
                      f"{fmt_runs([r[0] for r in res[v]], '{:.1f}')}; cpu per 1000 sets: "
                      f"rq-mgr {med[v][1]:.2f} s, queues {med[v][2]:.2f} s")
            print(f"  ratio fanout/direct: rate {med['fanout'][0] / med['direct'][0]:.2f}, "
                  f"queue cpu {med['fanout'][2] / med['direct'][2]:.2f}, rq-mgr cpu "
                  f"{med['fanout'][1]:.2f} s vs {med['direct'][1]:.2f} s per 1000 sets\n")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BenchError as exc:
        print(f"bench/fanout.py: {exc}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        sys.exit(130)
