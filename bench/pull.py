"""Benchmark (issue 6): pull consumers against script mode, and the `wait` latency.

Throughput: N trivial messages are queued on a PAUSEd queue, then released
and processed, the clock running from the release until `num_messages`
shows done == N:
* script mode: a queue with 4 workers running `echo "done ok" >&3` (/bin/sh);
* pull over the manager socket: 4 consumer processes (rq.consumer) that
  reserve, then report `done ok`;
* pull over HTTP: the same 4 processes through the web server's
  /consumer/ API (S8.5).
Everything runs under one real rq-mgr (queues, web server); the runs of the
three are interleaved so machine noise hits all of them.  Printed: medians of
messages/s and the ratios of each pull figure to the script-mode figure.

Latency: a consumer waits in `reserve` with `wait`; the clock runs from the
create_message reply (the commit) to the reservation's reply (0 when the
grant beat the reply to the producer); also from sending create_message.
Patterns: `lat.x` (one matching queue: the queue itself waits and grants)
and `lat.*` (two matching queues: the manager waits on both, then picks the
fairest candidate).
Target p99 <= 20 ms.  Usage:
    .venv/bin/python bench/pull.py [--n 1000] [--runs 3] [--latency 200]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (REPO, TRIVIAL_SCRIPT, BenchError, add_common_args, check_ok,  # noqa: E402
                    disk_probe, fmt_runs, machine_line, make_queue, make_root, median,
                    temp_base, wait_for, write_script)

from rq import client  # noqa: E402

CONSUMERS = 4
POLL = 0.005
CONSUMER_SOURCE = r'''
import json, os, sys, time
sys.path.insert(0, sys.argv[1])
from rq.consumer import reserve, transport_for
kw, go = json.loads(sys.argv[2]), sys.argv[3]
transport = transport_for(**kw)
open("%s.ready.%d" % (go, os.getpid()), "w").close()
while not os.path.exists(go):
    time.sleep(0.002)
n = 0
while True:
    job = reserve(transport, ["bench.*"], wait=1, consumer="bench-%d" % os.getpid())
    if job is None:
        break
    job.done("ok")
    n += 1
print(n)
'''


def free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Site:
    """One rq-mgr root: queue `script` (4 workers), pull queue `pull`
    (topic bench.pull, 4 leases), pull queues `lat`, `lat2` (topics lat.x, lat.y)."""

    def __init__(self, base: Path) -> None:
        self.port = free_port()
        self.root = make_root(base, port=self.port)
        script = write_script(self.root / "bench.sh", TRIVIAL_SCRIPT)
        make_queue(self.root, "script", script, num_workers=CONSUMERS)
        make_queue(self.root, "pull", mode="pull", topic="bench.pull", num_workers=CONSUMERS)
        make_queue(self.root, "lat", mode="pull", topic="lat.x")
        make_queue(self.root, "lat2", mode="pull", topic="lat.y")
        self.url = f"http://127.0.0.1:{self.port}/"
        self.rq_mgr("start")

    def rq_mgr(self, *args: str) -> None:
        env = dict(os.environ, PYTHONPATH=str(REPO))
        out = subprocess.run([str(REPO / "bin" / "rq-mgr"), "--root", str(self.root), *args],
                             capture_output=True, text=True, timeout=120, env=env)
        if out.returncode != 0:
            raise BenchError(f"rq-mgr {args}: {out.stderr}")

    def call(self, name: str, cmd: str, arg: Any = None) -> Any:
        return client.call_queue(str(self.root), name, cmd, arg)

    def pause(self, name: str, paused: bool) -> None:
        flag = self.root / "config" / f"{name}.pause"
        if paused:
            flag.touch()
        else:
            flag.unlink()
        self.call(name, "ping")  # a request makes the queue look at its flags now

    def fill(self, name: str, n: int) -> None:
        self.pause(name, True)
        for _ in range(n):
            check_ok(self.call(name, "create_message", {"dest": name}))

    def wait_done(self, name: str, target: int) -> None:
        """Until nothing is queued or running, then check on disk that all are done.
        (`que` and `run` are the live in-memory counts; the finished counts are
        re-read from disk every 60 s by a background walk, so they are not
        polled here.)"""
        def finished() -> bool:
            counts = self.call(name, "num_messages")
            return bool(counts["que"] == 0 and counts["run"] == 0 and counts["prep"] == 0)
        wait_for(finished, 600, f"{target} done in {name}", interval=POLL)
        done = self.done_on_disk(name)
        errs = list((self.root / "queue" / name / "err").iterdir())
        if errs or done < target:
            raise BenchError(f"{name}: {done} done (want {target}), {len(errs)} in err")

    def done_on_disk(self, name: str) -> int:
        done = self.root / "queue" / name / "done"
        return sum(1 for p in done.glob("*/*/*/*") if p.is_dir())


def run_script(site: Site, n: int) -> float:
    before = site.done_on_disk("script")
    site.fill("script", n)
    t0 = time.monotonic()
    site.pause("script", False)
    site.wait_done("script", before + n)
    return n / (time.monotonic() - t0)


def run_pull(site: Site, n: int, transport: str, base: Path, label: str) -> float:
    before = site.done_on_disk("pull")
    site.fill("pull", n)
    site.pause("pull", False)
    go = base / f"go-{label}"
    kw = {"root": str(site.root)} if transport == "socket" else {"url": site.url}
    env = dict(os.environ, PYTHONPATH=str(REPO))
    procs = [subprocess.Popen([sys.executable, "-c", CONSUMER_SOURCE, str(REPO), json.dumps(kw),
                               str(go)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=env) for _ in range(CONSUMERS)]
    try:
        # the consumers start up before the clock runs, then wait for `go`
        wait_for(lambda: _ready(procs, base, go.name) >= CONSUMERS, 60, "consumers to start")
        t0 = time.monotonic()
        go.touch()
        site.wait_done("pull", before + n)
        elapsed = time.monotonic() - t0
    finally:
        for proc in procs:
            out, err = proc.communicate(timeout=120)
            if proc.returncode != 0:
                raise BenchError(f"consumer failed: {err[-2000:]}")
    return n / elapsed


def _ready(procs: list[subprocess.Popen], base: Path, go: str) -> int:
    for proc in procs:
        if proc.poll() is not None:
            raise BenchError(f"consumer exited early: {proc.stderr.read() if proc.stderr else ''}")
    return len(list(base.glob(f"{go}.ready.*")))


def latency(site: Site, transport: str, rounds: int,
            patterns: list[str]) -> tuple[list[float], list[float]]:
    from rq.consumer import reserve, transport_for
    kw: dict[str, Any] = {"root": str(site.root)} if transport == "socket" else {"url": site.url}
    tr = transport_for(**kw)
    from_commit, from_send = [], []
    for _ in range(rounds):
        got: list[Any] = []

        def waiter() -> None:
            got.append((reserve(tr, patterns, wait=20), time.monotonic()))
        thread = threading.Thread(target=waiter)
        thread.start()
        names = ["lat", "lat2"] if patterns == ["lat.*"] else ["lat"]
        wait_for(lambda: all(site.call(n, "lease_waiters")[1] >= 1 for n in names), 30,
                 "a waiting reserve", interval=0.001)
        sent = time.monotonic()
        full = check_ok(site.call("lat", "create_message", {"dest": "lat"}))
        committed = time.monotonic()
        thread.join(60)
        job, at = got[0]
        if job is None or job.msg_id != full:
            raise BenchError(f"unexpected reservation {job}")
        from_commit.append(max(0.0, at - committed))
        from_send.append(at - sent)
        job.done("ok")
    return from_commit, from_send


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, int(len(ordered) * p + 0.5) - 1))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--latency", type=int, default=200, help="rounds of the wait latency")
    add_common_args(ap)
    args = ap.parse_args()
    print(machine_line())
    print(disk_probe(Path(args.tmpdir)))
    with temp_base(args.tmpdir, args.keep) as base:
        site = Site(base)
        try:
            figures: dict[str, list[float]] = {"script": [], "socket": [], "http": []}
            for run in range(args.runs):
                figures["script"].append(run_script(site, args.n))
                figures["socket"].append(run_pull(site, args.n, "socket", base, f"s{run}"))
                figures["http"].append(run_pull(site, args.n, "http", base, f"h{run}"))
            script = median(figures["script"])
            print(f"\nthroughput, N = {args.n}, {CONSUMERS} workers / consumers, "
                  f"medians of {args.runs} (msg/s):")
            print(f"  script mode (4 workers, /bin/sh)   {script:8.0f}  "
                  f"{fmt_runs(figures['script'])}")
            for name in ("socket", "http"):
                value = median(figures[name])
                print(f"  pull over {name:6} (4 consumers)     {value:8.0f}  "
                      f"{fmt_runs(figures[name])}  ratio to script mode {value / script:.2f}")
            print(f"\nreserve with wait: {args.latency} rounds, commit -> reply "
                  "(from sending create_message in brackets), target p99 <= 20 ms")
            for name, patterns in (("socket", ["lat.x"]), ("http", ["lat.x"]),
                                   ("socket", ["lat.*"])):
                lat, sent = latency(site, name, args.latency, patterns)
                label = f"{name} {patterns[0]}"
                print(f"  {label:13}  p50 {pct(lat, .5) * 1e3:5.1f} ms  "
                      f"p99 {pct(lat, .99) * 1e3:5.1f} ms  max {max(lat) * 1e3:5.1f} ms   "
                      f"(p50 {pct(sent, .5) * 1e3:.1f}, "
                      f"p99 {pct(sent, .99) * 1e3:.1f} ms)")
        finally:
            site.rq_mgr("stop")
    return 0


if __name__ == "__main__":
    sys.exit(main())
