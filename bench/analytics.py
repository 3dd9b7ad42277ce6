"""Benchmark of the analytics job (issues 5, 19): N synthetic S13 events, Spark vs one Python pass.

Generates `--events` (10 M) events over `--queues` (100) queues and `--days` (30) days as real
event-log files (`log/events/YYYYMMDD/QUEUE.jsonl`, lines written by rq.events.encode_event's
format), runs the whole job (JVM start, read, check, aggregate, write, publish) on `--master`
(local[2]) and, in the same run, a single-process baseline: a plain Python pass over the same
files that checks every line (rq.events.decode_line: layout, CRC-32, JSON) and computes the same
per-queue counts of messages by final state.  The two sets of counts must agree.  Printed: time of
each part, events/s, and the ratio.  Target: 10 M events in <= 120 s end to end on 2 cores.

Issue 19 (`--incremental`): every Spark run in its own Python process, so each is timed end to
end from the JVM's start (pyspark keeps a stopped session's JVM for the next session of the same
process), with the clock of the job set to one hour into the day after the history (`now`), so
every history day is finished: (0) a bare session start and stop (the JVM's share of the runs
below; writes the class-data-sharing archive when there is none, so that no timed run does);
(1) the first incremental run over a fresh output, which compacts all the days and builds the
per-message state (target <= 120 s); (2) one new hour of raw events (a second input tree) on top
of the compacted days and their state (target <= 20 s); (3) the full recompute (`--full`) of the
same input.  The results must agree, and the one-process Python pass over the same input is
printed beside them.

The generated data is kept for the next run under --tmpdir (about 2.5 GB for 10 M events; reuse
saves a minute or two of generation); --clean removes it after the run.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import time
import zlib
from collections import Counter
from multiprocessing import Pool
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.common import DEFAULT_TMPDIR, machine_line  # noqa: E402
from rq.events import decode_line  # noqa: E402

START = 1_767_225_600  # 2026-01-01T00:00:00Z
DAY = 86400
ERRORS = ("boom", "exit 3", "timeout upstream", "disk full", "bad input")
# (weight, lifecycle): each lifecycle is the list of (from, to, status) after creation
LIFECYCLES: list[tuple[int, list[tuple[str, str, str | None]]]] = [
    (80, [("que", "run", None), ("run", "done", "ok")]),
    (9, [("que", "run", None), ("run", "que", "try later"), ("que", "run", None),
         ("run", "done", "ok")]),
    (7, [("que", "run", None), ("run", "err", "*")]),
    (2, [("que", "run", None), ("run", "que", "QUEUE RESTARTED - MOVING TO QUE"),
         ("que", "run", None), ("run", "done", "ok")]),
    (1, [("que", "run", None), ("run", "que", "LEASE EXPIRED - MOVING TO QUE"),
         ("que", "run", None), ("run", "relayed", "http://h/q/x/1")]),
    (1, [("que", "deleted", None)]),
]
WEIGHTS = [w for w, _ in LIFECYCLES]
MEAN_EVENTS = sum(w * (2 + len(lc)) for w, lc in LIFECYCLES) / sum(WEIGHTS)


def line(ts: float, queue: str, msg: str, frm: str | None, to: str, status: str | None,
         duration: float | None) -> bytes:
    """One S13.2 line; the payload is what protocol.dumps would write for these values."""
    f = "null" if frm is None else f'"{frm}"'
    st = "null" if status is None else json.dumps(status)
    du = "null" if duration is None else repr(round(duration, 3))
    body = (f'{{"ts":{ts!r},"host":"bench","queue":"{queue}","msg_id":"{msg}","from":{f},'
            f'"to":"{to}","status":{st},"count":0,"pid":null,"exit_code":null,'
            f'"duration":{du}}}').encode()
    return b'{"crc32":"%08x","event":' % zlib.crc32(body) + body + b"}\n"


def gen_queue(args: tuple[str, int, int, int, int]) -> tuple[str, int, Counter[str]]:
    """Write every event of one queue; return (queue, events, count by final state)."""
    events_dir, qi, n_msgs, days, seed = args
    rng = random.Random(seed * 1000 + qi)
    queue = f"q{qi:03d}"
    out: list[tuple[float, bytes]] = []
    finals: Counter[str] = Counter()
    span = days * DAY
    for i in range(n_msgs):
        t = START + rng.random() * span
        msg = f"m{i}"
        life = rng.choices(LIFECYCLES, WEIGHTS)[0][1]
        t = round(t, 3)
        out.append((t, line(t, queue, msg, None, "prep", None, None)))
        out.append((t, line(t, queue, msg, "prep", "que", None, None)))
        started = t
        for frm, to, status in life:
            if frm == "que":
                t = round(t + rng.expovariate(1 / 5.0), 3)
                started = t
                out.append((t, line(t, queue, msg, frm, to, status, None)))
                continue
            t = round(t + rng.lognormvariate(0, 1.2), 3)
            if status == "*":
                status = rng.choice(ERRORS)
            out.append((t, line(t, queue, msg, frm, to, status, t - started)))
        last_to = life[-1][1]
        finals[last_to if last_to != "que" else "unfinished"] += 1
    out.sort(key=lambda e: e[0])
    current, fh = "", None
    for ts, data in out:
        day = time.strftime("%Y%m%d", time.gmtime(ts))
        if day != current:
            if fh:
                fh.close()
            os.makedirs(os.path.join(events_dir, day), exist_ok=True)
            fh = open(os.path.join(events_dir, day, queue + ".jsonl"), "ab")
            current = day
        assert fh is not None
        fh.write(data)
    if fh:
        fh.close()
    return queue, len(out), finals


def generate(data: Path, events: int, queues: int, days: int, seed: int) -> dict[str, Any]:
    marker = data / "generated.json"
    if marker.exists():
        return json.loads(marker.read_text())
    shutil.rmtree(data, ignore_errors=True)
    events_dir = data / "log" / "events"
    events_dir.mkdir(parents=True)
    per_queue = max(1, round(events / MEAN_EVENTS / queues))
    t = time.monotonic()
    with Pool(os.cpu_count() or 2) as pool:
        done = pool.map(gen_queue, [(str(events_dir), q, per_queue, days, seed)
                                    for q in range(queues)])
    seconds = round(time.monotonic() - t, 1)
    # Written back now, not under the runs: a real history was written over its 30 days,
    # while a fresh one is ~2 GB of dirty pages that expire (dirty_expire_centisecs, 30 s)
    # during the first run.  (No effect on the figures was measured: a guard, not a fix.)
    t = time.monotonic()
    os.sync()
    info = {"events": sum(n for _, n, _ in done), "messages": per_queue * queues,
            "queues": queues, "days": days, "seed": seed, "seconds": seconds,
            "sync_seconds": round(time.monotonic() - t, 1)}
    marker.write_text(json.dumps(info))
    return info


def baseline(trees: list[Path]) -> tuple[float, dict[str, Counter[str]], int]:
    """One Python process: decode every line (S13.4 checks) and count messages per queue by
    final state (the last done/err/relayed, else deleted; unfinished otherwise)."""
    t = time.monotonic()
    last: dict[tuple[str, str], tuple[float, str]] = {}
    finals = ("done", "err", "relayed")
    valid = 0  # the per-message rule of rq.analytics.transform.message_table
    paths = [base / day / name for base in (tree / "log" / "events" for tree in trees)
             for day in sorted(os.listdir(base)) for name in sorted(os.listdir(base / day))]
    for path in paths:
        with open(path, "rb") as fh:
            for raw in fh:
                ev = decode_line(raw)
                if ev is None:
                    continue
                valid += 1
                key = (ev["queue"], ev["msg_id"])
                prev = last.get(key)
                to = ev["to"]
                if prev is None or (_rank(to), ev["ts"]) >= (_rank(prev[1]), prev[0]):
                    last[key] = (ev["ts"], to)
    counts: dict[str, Counter[str]] = {}
    for (queue, _), (_, to) in last.items():
        state = to if to in (*finals, "deleted") else "unfinished"
        counts.setdefault(queue, Counter())[state] += 1
    return time.monotonic() - t, counts, valid


def _rank(to: str) -> int:
    return 2 if to in ("done", "err", "relayed") else 1 if to == "deleted" else 0


def spark_run(inputs: list[Path], out: Path, master: str, *, full: bool = False,
              now: float | None = None, fork: bool = False
              ) -> tuple[float, float, dict[str, Any], int]:
    """One session and one job: (session start s, end to end s, summary, JVM peak RSS KiB).
    `fork`: in a fresh Python process (a fresh JVM), timed from before its start."""
    if fork:
        import subprocess
        t = time.monotonic()
        spec = json.dumps({"inputs": [str(i) for i in inputs], "out": str(out),
                           "master": master, "full": full, "now": now})
        done = subprocess.run([sys.executable, __file__, "--one-run", spec], check=True,
                              capture_output=True, text=True)
        total = time.monotonic() - t
        up, _, result, hwm = json.loads(done.stdout.strip().splitlines()[-1])
        return up, total, result, hwm
    from rq.analytics import compact, job, session
    t = time.monotonic()
    # the JVM's options from what the run will read, as `rq analytics` picks them (job.execute)
    size = (compact.input_bytes([str(i) for i in inputs], None, None, str(out.resolve()), full,
                                time.time() if now is None else now)
            if inputs and master.startswith("local") else None)
    with session.spark_session(master, {}, log_path=str(out.parent / "spark.log"),
                               input_bytes=size) as spark:
        up = time.monotonic() - t
        result: dict[str, Any] = {}
        if inputs:
            _, result = job.run(spark, job.Options(inputs=tuple(str(i) for i in inputs),
                                                   output=str(out), master=master, full=full),
                                now=now)
        hwm = jvm_hwm_kib(spark)
    return up, time.monotonic() - t, result, hwm


def one_run(spec: str) -> int:
    """--one-run: spark_run in this process, its figures as one JSON line on stdout."""
    a = json.loads(spec)
    figures = spark_run([Path(i) for i in a["inputs"]], Path(a["out"]), a["master"],
                        full=a["full"], now=a["now"])
    print(json.dumps(figures))
    return 0


def new_hour(tree: Path, events: int, queues: int, days: int, seed: int) -> int:
    """One hour of fresh events (the history's rate) just after it, in their own tree."""
    shutil.rmtree(tree, ignore_errors=True)
    rng = random.Random(seed + 19)
    start = START + days * DAY
    day_dir = tree / "log" / "events" / time.strftime("%Y%m%d", time.gmtime(start))
    day_dir.mkdir(parents=True)
    per_queue = max(1, round(events / (days * 24) / MEAN_EVENTS / queues))
    n = 0
    for qi in range(queues):
        queue = f"q{qi:03d}"
        with open(day_dir / f"{queue}.jsonl", "wb") as fh:
            for i in range(per_queue):
                t = round(start + rng.random() * 3000, 3)
                msg = f"new{i}"
                fh.write(line(t, queue, msg, None, "prep", None, None))
                fh.write(line(t, queue, msg, "prep", "que", None, None))
                fh.write(line(t + 1, queue, msg, "que", "run", None, None))
                fh.write(line(t + 3, queue, msg, "run", "done", "ok", 2.0))
                n += 4
    return n


def same_result(a: dict[str, Any], b: dict[str, Any]) -> bool:
    volatile = ("run_id", "generated_at", "duration_s", "stages_s", "compaction")
    return {k: v for k, v in a.items() if k not in volatile} == {
        k: v for k, v in b.items() if k not in volatile}


def jvm_hwm_kib(spark: Any) -> int:
    try:
        pid = spark.sparkContext._gateway.proc.pid
        with open(f"/proc/{pid}/status") as f:
            for ln in f:
                if ln.startswith("VmHWM:"):
                    return int(ln.split()[1])
    except (OSError, AttributeError):
        pass
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=10_000_000)
    ap.add_argument("--queues", type=int, default=100)
    ap.add_argument("--days", type=int, default=30)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--tmpdir", default=os.environ.get("RQ_BENCH_TMPDIR", DEFAULT_TMPDIR))
    ap.add_argument("--clean", action="store_true", help="remove the generated data afterwards")
    ap.add_argument("--no-baseline", action="store_true")
    ap.add_argument("--incremental", action="store_true",
                    help="issue 19: first run with compaction, one new hour, full recompute")
    ap.add_argument("--one-run", help=argparse.SUPPRESS)  # internal: one forked Spark run
    args = ap.parse_args()
    if args.one_run:
        return one_run(args.one_run)
    print(machine_line())
    data = Path(args.tmpdir) / (f"rq-bench-analytics-{args.events}-{args.queues}q-"
                                f"{args.days}d-s{args.seed}")
    info = generate(data, args.events, args.queues, args.days, args.seed)
    size = sum(f.stat().st_size for f in (data / "log" / "events").rglob("*.jsonl"))
    print(f"data: {info['events']:,} events, {info['messages']:,} messages, {info['queues']} "
          f"queues, {info['days']} days, {size / 1e9:.2f} GB in {data} "
          f"(generated in {info['seconds']} s, written back in {info.get('sync_seconds', '-')} s)")
    out = data.parent / (data.name + "-out")
    fresh = data.parent / (data.name + "-newhour")
    shutil.rmtree(out, ignore_errors=True)
    try:
        if args.incremental:
            return incremental(args, data, fresh, out)
        up, total, result, hwm = spark_run([data], out, args.master, full=True)
        events = result["total"]["events"]
        print(f"spark {args.master}: {total:.1f} s end to end (session {up:.1f} s, job "
              f"{result['duration_s']:.1f} s), {events / total:,.0f} events/s, "
              f"JVM peak RSS {hwm / 1024:.0f} MiB; target <= 120 s: "
              f"{'met' if total <= 120 else 'NOT met'}")
        print("  job stages (s): " + ", ".join(f"{k} {v:.1f}"
                                              for k, v in result["stages_s"].items())
              + "; load avg after: " + ", ".join(f"{x:.2f}" for x in os.getloadavg()))
        if not args.no_baseline:
            secs, counts, valid = baseline([data])
            print(f"baseline (one Python process, decode_line + per-queue counts): {secs:.1f} s, "
                  f"{valid / secs:,.0f} events/s; spark/baseline time ratio "
                  f"{total / secs:.2f} (spark {secs / total:.2f}x as fast)")
            if not counts_agree(result, counts, valid):
                return 1
    finally:
        shutil.rmtree(out, ignore_errors=True)
        shutil.rmtree(fresh, ignore_errors=True)
        if args.clean:
            shutil.rmtree(data, ignore_errors=True)
    return 0


def counts_agree(result: dict[str, Any], counts: dict[str, Counter[str]], valid: int) -> bool:
    agree = all(
        {s: q["finished"][s] for s in ("done", "err", "relayed", "deleted")}
        | {"unfinished": q["unfinished"]}
        == {s: counts.get(name, Counter())[s]
            for s in ("done", "err", "relayed", "deleted", "unfinished")}
        for name, q in result["queues"].items()) and len(counts) == len(
        result["queues"]) and valid == result["lines"]["valid"]
    print(f"per-queue counts agree: {agree}")
    return agree


def describe(result: dict[str, Any]) -> str:
    """The incremental figures of a summary: how its message table was made."""
    c = result["compaction"]
    return (f"{c['mode']}: path {c.get('path', '-')}, state {c.get('state', '-')}, "
            f"{c.get('messages', '-')} messages, {c.get('messages_recomputed', 0)} recomputed, "
            f"{c.get('compacted_events_read', 0)} compacted events read")


def incremental(args: argparse.Namespace, data: Path, fresh: Path, out: Path) -> int:
    """Issue 19: JVM start, first run (compacts), + one new hour, full recompute (each in its
    own process); the Python pass beside."""
    now = START + args.days * DAY + 3600
    load = [os.getloadavg()]
    jvm_up, jvm, _, _ = spark_run([], out, args.master, fork=True)
    print(f"JVM start alone (session start and stop in a fresh process): {jvm:.1f} s "
          f"(session {jvm_up:.1f} s)")
    up, first, r1, _ = spark_run([data], out, args.master, now=now, fork=True)
    print(f"incremental, first run (compacts {r1['compaction']['days_compacted_now']} days, "
          f"builds the state): {first:.1f} s end to end (session {up:.1f} s); target <= 120 s: "
          f"{'met' if first <= 120 else 'NOT met'}\n  {describe(r1)}")
    load.append(os.getloadavg())
    n = new_hour(fresh, args.events, args.queues, args.days, args.seed)
    up, hour, r2, hwm = spark_run([data, fresh], out, args.master, now=now, fork=True)
    print(f"incremental, + one new hour ({n:,} raw events, {r2['compaction']['days_read']} "
          f"compacted days read): {hour:.1f} s end to end (session {up:.1f} s, JVM peak RSS "
          f"{hwm / 1024:.0f} MiB); target <= 20 s: {'met' if hour <= 20 else 'NOT met'}"
          f"\n  {describe(r2)}")
    load.append(os.getloadavg())
    full_out = out.parent / (out.name + "-full")
    try:
        up, full, r3, _ = spark_run([data, fresh], full_out, args.master, full=True, now=now,
                                    fork=True)
    finally:
        shutil.rmtree(full_out, ignore_errors=True)
    load.append(os.getloadavg())
    print(f"full recompute of the same input: {full:.1f} s end to end (session {up:.1f} s); "
          f"new hour/full time ratio {hour / full:.2f}, first/full {first / full:.2f}")
    print("  stages (s) first / new hour / full: " + " / ".join(
        ", ".join(f"{k} {v:.1f}" for k, v in r["stages_s"].items()) for r in (r1, r2, r3)))
    print("  load avg (1, 5, 15 min) before, after each run: " + " | ".join(
        ", ".join(f"{x:.2f}" for x in la) for la in load))
    agree = same_result(r2, r3)
    print(f"incremental result equals the full recompute: {agree}")
    if not agree:
        for key in sorted(set(r2) | set(r3)):
            if key not in ("run_id", "generated_at", "duration_s", "stages_s", "compaction") \
                    and r2.get(key) != r3.get(key):
                print(f"  differs: {key}")
    if not args.no_baseline:
        secs, counts, valid = baseline([data, fresh])
        print(f"baseline (one Python process over the same input): {secs:.1f} s; "
              f"first/baseline {first / secs:.2f}, new hour/baseline {hour / secs:.2f}, "
              f"full/baseline {full / secs:.2f}")
        agree = counts_agree(r2, counts, valid) and agree
    return 0 if agree else 1


if __name__ == "__main__":
    sys.exit(main())
