"""Benchmark: `GET /q/NAME.json` of a queue holding 100,000 done messages (SPEC S15.3).

The dashboard's queue page polls this route (S16.2), so it must stay cheap however many
finished messages a queue keeps: each list is cut to `limit` (default 100) while the
`*_size` values are the full counts (S15.3, fix: the original listed every done message on
every poll).  The messages are written straight to disk in RQ's hashdir layout (S3.2:
`done/YYYYMMDD/HH/MM/ID/` with `msg` as S4.4 and `status` as S4.6; ids as S4.1, one every
--spacing seconds so they spread over many minute buckets), without fsyncs, before a real
`rq-mgr start` (manager, queue process, the `rq-web` daemon) on a free port.  Once the queue
reports done == N, the bench sends --warmup unrecorded requests, then --samples requests,
one at a time on one keep-alive HTTP/1.1 connection, and prints the latency from sending the
request to the last byte of the body: median, p90, max.  Every reply is checked: done_size
== N and 100 done entries, newest first.

Target (issue 3): median <= 100 ms.
Usage:  .venv/bin/python bench/qjson.py [--n 100000] [--samples 50] [--spacing 0.5]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (QUEUE, BenchError, add_common_args, bench_queue, disk_probe,  # noqa: E402
                    dumps, machine_line, median, temp_base, wait_for)
from http_enqueue import ManagedRQ, new_http_root  # noqa: E402

from rq import client  # noqa: E402

TARGET_MS = 100.0
LIMIT = 100  # S15 route 9b default


def message_id(epoch: float, serial: int) -> str:
    """An S4.1 short id for a creation time (UTC) and a serial number."""
    t = time.gmtime(epoch)
    ms = int(round((epoch % 1) * 1000)) % 1000
    return time.strftime("%Y%m%d.%H%M.%S", t) + f".{ms:03d}.{serial}"


def write_done(qdir: Path, n: int, spacing: float, base_url: str) -> list[str]:
    """n done messages in their hashdir buckets (no fsync: this is set-up); their ids."""
    start = time.time() - 86400 * 2 - n * spacing  # finished long ago, all in the past
    ids = []
    for i in range(n):
        now = start + i * spacing
        msg_id = message_id(now, 1000000 + i)
        bucket = qdir / "done" / msg_id[0:8] / msg_id[9:11] / msg_id[11:13]
        if not bucket.is_dir():
            bucket.mkdir(parents=True)
        d = bucket / msg_id
        d.mkdir()
        fields = {"msg_id": msg_id, "dest": QUEUE, "src": "bench", "param1": f"p{i}",
                  "due": int(now), "count": 0, "max_count": 15,
                  "orig_msg_id": f"{base_url}q/{QUEUE}/{msg_id}"}
        (d / "msg").write_bytes(dumps(fields).encode())
        (d / "status").write_bytes(dumps({"job_status": "done ok"}).encode())
        ids.append(msg_id)
    return ids


def fetch(conn: http.client.HTTPConnection) -> tuple[float, dict]:
    t0 = time.perf_counter()
    conn.request("GET", f"/q/{QUEUE}.json")
    resp = conn.getresponse()
    body = resp.read()
    elapsed = time.perf_counter() - t0
    if resp.status != 200:
        raise BenchError(f"HTTP {resp.status}: {body[:300]!r}")
    return elapsed, json.loads(body)


def check(reply: dict, n: int, newest: list[str]) -> None:
    if reply.get("done_size") != n:
        raise BenchError(f"done_size {reply.get('done_size')} != {n}")
    done = reply["messages"]["done"]
    got = [e["msg_id"] if isinstance(e, dict) else e for e in done]
    if got != newest:
        raise BenchError(f"done list is not the {LIMIT} newest ids: {got[:3]} ... vs "
                         f"{newest[:3]} ...")


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, int(round(p * len(ordered) + 0.5)) - 1))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=100_000, help="done messages (default 100000)")
    ap.add_argument("--samples", type=int, default=50, help="timed requests (default 50)")
    ap.add_argument("--warmup", type=int, default=5, help="unrecorded requests (default 5)")
    ap.add_argument("--spacing", type=float, default=0.5,
                    help="seconds between message ids (default 0.5: ~120 per minute bucket)")
    add_common_args(ap)
    args = ap.parse_args()
    print(f"qjson: {args.n} done messages, {args.samples} samples, {machine_line()}")
    print(f"  {disk_probe(args.tmpdir)}")
    with temp_base(args.tmpdir, args.keep) as base:
        root = new_http_root(base, "root")
        qdir = bench_queue(root, num_workers=1)
        port = json.loads((root / "config" / "config.json").read_text())["port"]
        t0 = time.monotonic()
        ids = write_done(qdir, args.n, args.spacing, f"http://127.0.0.1:{port}/")
        buckets = len({i[:13] for i in ids})
        print(f"  wrote {args.n} done messages in {buckets} minute buckets "
              f"in {time.monotonic() - t0:.0f} s (set-up, not timed)", flush=True)
        newest = sorted(ids, reverse=True)[:LIMIT]
        with ManagedRQ(root) as rq:
            t0 = time.monotonic()
            rq.wait_queue(timeout=300)
            wait_for(lambda: client.call_queue(str(root), QUEUE, "num_messages")["done"]
                     == args.n, 300, f"done == {args.n}", interval=0.05)
            print(f"  queue serving with done == {args.n} after {time.monotonic() - t0:.1f} s",
                  flush=True)
            conn = http.client.HTTPConnection("127.0.0.1", rq.port, timeout=60)
            try:
                for _ in range(args.warmup):
                    check(fetch(conn)[1], args.n, newest)
                samples = []
                for _ in range(args.samples):
                    elapsed, reply = fetch(conn)
                    check(reply, args.n, newest)
                    samples.append(elapsed * 1e3)
            finally:
                conn.close()
    med = median(samples)
    print()
    print(f"GET /q/{QUEUE}.json, {args.n} done: median {med:.1f} ms   (target <= "
          f"{TARGET_MS:.0f} ms: {'ok' if med <= TARGET_MS else 'MISSED'})   "
          f"p90 {percentile(samples, 0.9):.1f} ms, max {max(samples):.1f} ms, "
          f"min {min(samples):.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
