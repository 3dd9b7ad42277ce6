"""Benchmark: durable enqueue over HTTP (SPEC S15 route 12, form (a): a JSON body).

A real `rq-mgr start` (so the real `rq-web` daemon: waitress, Flask, the security
checks of S14) on a fresh root with a free port and a PAUSEd queue, so nothing runs
and only the enqueue path is timed: `POST /q/bench/new_message` with
`Content-Type: application/json` and the message as the body, answered
`200 ["ok", FULL_ID]` once the queue process has made the message durable.
N messages per run from 1 client process, then from 8 concurrent client processes
(N/8 each; processes, since one Python client is GIL-bound).  Each client keeps
one HTTP/1.1 connection open (keep-alive, as any real client does), sends one
unrecorded warm-up request, then waits; the clock runs from releasing the clients
until the last reply.  Medians of --runs runs, a fresh root and manager per run.
For context, each run also times one client doing the same enqueues straight over the
queue's Unix socket (`create_message`, no HTTP, no web server): the floor that the HTTP
path adds to, measured at the same moment of the machine.

Target (issue 3): >= 500 messages/s for one client.
Usage:  .venv/bin/python bench/http_enqueue.py [--n 2000] [--runs 3] [--clients 8]
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing as mp
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (QUEUE, REPO, BenchError, add_common_args, bench_queue,  # noqa: E402
                    disk_probe, fmt_runs, machine_line, median, temp_base, wait_for)
from rqtest import free_port, make_root  # noqa: E402

from rq import client  # noqa: E402

TARGET_ONE = 500.0
PATH = f"/q/{QUEUE}/new_message"


class ManagedRQ:
    """`rq-mgr start` on `root` (manager, web server, queues); `stop()` always runs."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.port = int(json.loads((root / "config" / "config.json").read_text())["port"])
        res = self.rq_mgr("start")
        if res.returncode != 0:
            raise BenchError(f"rq-mgr start failed: {res.stderr.strip()}")

    def rq_mgr(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(REPO / "bin" / "rq-mgr"), "--root", str(self.root), *args],
                              capture_output=True, text=True, timeout=120)

    def wait_queue(self, name: str = QUEUE, timeout: float = 60.0) -> None:
        def running() -> bool:
            reply = client.call_mgr(str(self.root), "status", timeout=10)
            child = reply[1]["queues"].get(name) if reply[0] == "ok" else None
            return bool(child) and child["state"] == "RUNNING"
        wait_for(running, timeout, f"queue {name} RUNNING", interval=0.01)

    def stop(self) -> None:
        self.rq_mgr("stop")

    def __enter__(self) -> ManagedRQ:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def new_http_root(base: Path, label: str) -> Path:
    """A fresh RQ root with a port nothing listens on (its web server's)."""
    sub = base / label
    sub.mkdir()
    return make_root(sub, port=free_port())


def post_message(conn: http.client.HTTPConnection, body: bytes) -> str:
    conn.request("POST", PATH, body=body, headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    data = resp.read()
    if resp.status != 200:
        raise BenchError(f"HTTP {resp.status}: {data[:200]!r}")
    reply = json.loads(data)
    if not (isinstance(reply, list) and reply[0] == "ok"):
        raise BenchError(f"unexpected reply {reply!r}")
    return str(reply[1])


def client_proc(port: int, count: int, tag: int, ready: Any, go: Any, out: Any) -> None:
    """One client process: connect, warm up, wait for `go`, POST `count` messages."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        post_message(conn, json.dumps({"dest": QUEUE, "param1": f"warm-{tag}"}).encode())
        ready.put(tag)
        go.wait()
        t0 = time.monotonic()
        for i in range(count):
            post_message(conn, json.dumps({"dest": QUEUE, "param1": f"{tag}-{i}"}).encode())
        out.put((tag, t0, time.monotonic(), None))
    except BaseException as exc:  # reported by the parent
        ready.put(tag)
        out.put((tag, 0.0, time.monotonic(), repr(exc)))
    finally:
        conn.close()


def run(base: Path, label: str, n: int, clients: int) -> float:
    """Messages/s for `n` messages POSTed by `clients` processes."""
    ctx = mp.get_context("fork")  # forked before any daemon thread exists in this process
    root = new_http_root(base, label)
    bench_queue(root, num_workers=1, paused=True)
    with ManagedRQ(root) as rq:
        rq.wait_queue()
        ready, out, go = ctx.Queue(), ctx.Queue(), ctx.Event()
        shares = [n // clients + (1 if i < n % clients else 0) for i in range(clients)]
        procs = [ctx.Process(target=client_proc, args=(rq.port, c, i, ready, go, out),
                             daemon=True) for i, c in enumerate(shares)]
        try:
            for p in procs:
                p.start()
            for _ in procs:
                ready.get(timeout=60)
            t0 = time.monotonic()
            go.set()
            results = [out.get(timeout=max(120.0, n * 0.1)) for _ in procs]
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
        counts = client.call_queue(str(root), QUEUE, "num_messages")
        if counts["que"] != n + clients:
            raise BenchError(f"expected {n + clients} queued, queue reports {counts}")
    return n / (end - t0)


def run_socket(base: Path, label: str, n: int) -> float:
    """Messages/s of one client calling create_message on the queue socket directly."""
    root = new_http_root(base, label)
    bench_queue(root, num_workers=1, paused=True)
    with ManagedRQ(root) as rq:
        rq.wait_queue()
        client.call_queue(str(root), QUEUE, "create_message", {"dest": QUEUE})  # warm-up
        t0 = time.monotonic()
        for i in range(n):
            reply = client.call_queue(str(root), QUEUE, "create_message",
                                      {"dest": QUEUE, "param1": f"s-{i}"})
            if reply[0] != "ok":
                raise BenchError(f"unexpected reply {reply!r}")
        return n / (time.monotonic() - t0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=2000, help="messages per run (default 2000)")
    ap.add_argument("--runs", type=int, default=3, help="runs per figure; medians (default 3)")
    ap.add_argument("--clients", type=int, default=8, help="concurrent clients (default 8)")
    add_common_args(ap)
    args = ap.parse_args()
    print(f"http_enqueue: N={args.n} per run, {args.runs} run(s) per figure, {machine_line()}")
    print(f"  {disk_probe(args.tmpdir)}")
    one: list[float] = []
    many: list[float] = []
    direct: list[float] = []
    with temp_base(args.tmpdir, args.keep) as base:
        for i in range(args.runs):  # interleaved, so machine noise hits all alike
            one.append(run(base, f"one-{i}", args.n, 1))
            many.append(run(base, f"many-{i}", args.n, args.clients))
            direct.append(run_socket(base, f"socket-{i}", args.n))
            print(f"  run {i + 1}: 1 client {one[-1]:.0f} msg/s, "
                  f"{args.clients} clients {many[-1]:.0f} msg/s, "
                  f"socket 1 client {direct[-1]:.0f} msg/s", flush=True)
    m1, m8, md = median(one), median(many), median(direct)
    print()
    print(f"1 client:          {m1:7.0f} msg/s   (target >= {TARGET_ONE:.0f}: "
          f"{'ok' if m1 >= TARGET_ONE else 'MISSED'})   runs {fmt_runs(one)}")
    print(f"{args.clients} clients:         {m8:7.0f} msg/s   runs {fmt_runs(many)}")
    print(f"{args.clients} clients / 1 client: {m8 / m1:5.2f}x")
    print(f"per-request latency, 1 client: {1e3 / m1:.2f} ms "
          "(HTTP parse, manager ping of S14.6, queue create_message with its fsyncs)")
    print(f"context: the same enqueue over the queue socket, 1 client: {md:.0f} msg/s "
          f"({1e3 / md:.2f} ms each; HTTP adds {1e3 / m1 - 1e3 / md:.2f} ms)   "
          f"runs {fmt_runs(direct)}")
    print(f"load average now: {', '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
