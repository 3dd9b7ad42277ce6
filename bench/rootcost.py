"""Benchmark: the CPU of one root's start and stop under rq-mgr (issue 14 section 4).

`python bench/rootcost.py [--n 8] CHECKOUT [CHECKOUT ...]`: for each run and each checkout in
turn (interleaved, so load changes hit every checkout alike), a fresh root with one queue
`test`, `CHECKOUT/bin/rq-mgr start`, 0.5 s for the services' first scans, then
`CHECKOUT/bin/rq-mgr stop`; the whole process tree is charged through a cpuacct cgroup of this
process (cgroup v1 at /sys/fs/cgroup/cpuacct; needs root).  Printed per checkout: the median
CPU-s of the start (with the 0.5 s), of the stop and of both, and the median CPU-s each child of
rq-mgr had spent just before the stop (by process title).  What a test pays for each root it
starts; a whole run of the suite starts about 160 (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import psutil

CGROUP = "/sys/fs/cgroup/cpuacct"
DONE = '#!/bin/sh\necho "done ok" >&3\n'
STATES = ("prep", "que", "run", "done", "relayed", "err")


def cpu_seconds(group: str) -> float:
    with open(os.path.join(group, "cpuacct.usage")) as fh:
        return int(fh.read()) / 1e9


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def make_root(base: Path) -> Path:
    root = base / "root"
    for sub in ("config", "log", *(f"queue/test/{s}" for s in STATES)):
        (root / sub).mkdir(parents=True)
    (root / "config" / "config.json").write_text(json.dumps(
        {"env": "bench", "host": "localhost", "port": free_port(), "addr": "127.0.0.1"}))
    script = base / "done.sh"
    script.write_text(DONE)
    script.chmod(0o755)
    (root / "queue" / "test" / "config.json").write_text(
        json.dumps({"name": "test", "script": str(script)}))
    return root


def children_cpu(root: Path) -> dict[str, float]:
    pid = int((root / "config" / "queuemgr.pid").read_text())
    manager = psutil.Process(pid)
    out = {}
    for proc in [manager, *manager.children(recursive=True)]:
        try:
            times = proc.cpu_times()
            title = " ".join(proc.cmdline()).replace(str(root), "ROOT").strip()
        except psutil.Error:
            continue
        out[title[:40]] = times.user + times.system
    return out


def one_root(checkout: str, group: str) -> tuple[float, float, dict[str, float]]:
    mgr = [os.path.join(checkout, "bin", "rq-mgr")]
    with tempfile.TemporaryDirectory(prefix="rootcost") as tmp:
        root = make_root(Path(tmp))
        before = cpu_seconds(group)
        res = subprocess.run([*mgr, "--root", str(root), "start"], capture_output=True,
                             text=True, timeout=120)
        if res.returncode != 0:
            raise SystemExit(f"{checkout}: rq-mgr start failed: {res.stderr.strip()}")
        time.sleep(0.5)
        started = cpu_seconds(group)
        per_child = children_cpu(root)
        stopping = cpu_seconds(group)
        subprocess.run([*mgr, "--root", str(root), "stop"], capture_output=True, timeout=120)
        return started - before, cpu_seconds(group) - stopping, per_child


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("checkouts", nargs="+")
    args = parser.parse_args()
    group = os.path.join(CGROUP, f"rq_rootcost_{os.getpid()}")
    os.makedirs(group, exist_ok=True)
    with open(os.path.join(group, "cgroup.procs"), "w") as fh:
        fh.write(str(os.getpid()))
    runs: dict[str, list[tuple[float, float, dict[str, float]]]] = {
        c: [] for c in args.checkouts}
    for _ in range(args.n):
        for checkout in args.checkouts:
            runs[checkout].append(one_root(checkout, group))
    for checkout, results in runs.items():
        starts = [r[0] for r in results]
        stops = [r[1] for r in results]
        print(f"{checkout}: start {statistics.median(starts):.3f} stop "
              f"{statistics.median(stops):.3f} both "
              f"{statistics.median([a + b for a, b in zip(starts, stops)]):.3f} CPU-s")
        titles = sorted({t for r in results for t in r[2]})
        rows = [(statistics.median([r[2][t] for r in results if t in r[2]]), t) for t in titles]
        for cpu, title in sorted(rows, reverse=True):
            print(f"  {cpu:.3f}  {title}")


if __name__ == "__main__":
    main()
