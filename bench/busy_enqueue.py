"""Benchmark: one client enqueueing over the socket while the queue runs jobs (issue 15).

One queue process (`python -m rq.queue`), W workers (default 2) running the trivial
`/bin/sh` script.  Interleaved trials, each on a fresh root:
- `idle`: the queue PAUSEd, nothing runs: N `create_message` back to back from one
  client thread, a connection each (rq.client.call_queue);
- `busy`: the same client and N while W workers run those messages as they come.
The clock runs from the first request to the last reply (the enqueue rate only: the
jobs may still be running).  Printed: msg/s of each, busy/idle (same trial), and CPU
per 1,000 messages of the queue process tree (its jobs included) and of the machine
(/proc/stat: includes other users' load).  With `--profile DIR`, the busy trial of the
first round is recorded by `py-spy record` (--idle --threads, a flame graph SVG and
a speedscope file) and `strace -c -f` in a second busy trial.

Target (issue 15): busy >= 1,000 msg/s (durable), i.e. ~ idle.
Usage:  tini -s -- .venv/bin/python bench/busy_enqueue.py --tmpdir DIR [--n 2000]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (QUEUE, QueueProc, add_common_args, bench_queue, check_ok,  # noqa: E402
                    disk_probe, machine_line, median, new_root, temp_base, wait_for)
from peerlib import machine_cpu_seconds, tree_cpu_seconds  # noqa: E402


def trial(base: Path, label: str, n: int, workers: int, busy: bool,
          profile: list[str] | None = None, site: Path | None = None
          ) -> tuple[float, float, float]:
    """(msg/s, queue tree CPU s per 1k, machine CPU s per 1k); `site`: a directory
    put first on the queue process's PYTHONPATH (an experiment's sitecustomize)."""
    root = new_root(base, label)
    bench_queue(root, num_workers=workers, paused=not busy)
    saved = os.environ.get("PYTHONPATH")
    if site is not None:
        os.environ["PYTHONPATH"] = f"{site}{os.pathsep}{saved}" if saved else str(site)
    try:
        q = QueueProc(root)
    finally:
        if saved is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved
    with q:
        check_ok(q.call("create_message", {"dest": QUEUE, "param1": "warm"}))
        tool = None
        if profile is not None:
            tool = subprocess.Popen([*profile, "-p", str(q.pid)] if profile[0] != "strace"
                                    else [*profile, "-p", str(q.pid)],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            time.sleep(1.0)  # the profiler attaches (not a synchronisation of RQ)
        c0, m0 = tree_cpu_seconds(q.pid), machine_cpu_seconds()
        t0 = time.monotonic()
        for i in range(n):
            check_ok(q.call("create_message", {"dest": QUEUE, "param1": str(i)}))
        t1 = time.monotonic()
        c1, m1 = tree_cpu_seconds(q.pid), machine_cpu_seconds()
        if busy:
            wait_for(lambda: q.call("num_messages")["done"] >= n + 1, max(60.0, n * 0.05),
                     "all jobs done", interval=0.05)
        if tool is not None:
            tool.send_signal(2)
            _, err = tool.communicate(timeout=120)
            if profile[0] == "strace":
                print(err.decode(errors="replace")[-6000:])
    return n / (t1 - t0), (c1 - c0) / n * 1000, (m1 - m0) / n * 1000


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_args(ap)
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--profile", help="directory for py-spy output (and print strace -c)")
    ap.add_argument("--switch-interval", type=float,
                    help="experiment: also a busy trial whose queue process runs "
                         "sys.setswitchinterval(X) (a sitecustomize), interleaved")
    args = ap.parse_args()
    print(machine_line())
    res: dict[str, list[tuple[float, float, float]]] = {"idle": [], "busy": []}
    with temp_base(args.tmpdir, args.keep) as base:
        print(disk_probe(base))
        site = None
        if args.switch_interval is not None:
            site = base / "site-switch"
            site.mkdir()
            (site / "sitecustomize.py").write_text(
                f"import sys\nsys.setswitchinterval({args.switch_interval!r})\n")
            res[f"busy, switch interval {args.switch_interval * 1e3:g} ms"] = []
        if args.profile:
            out = Path(args.profile)
            out.mkdir(parents=True, exist_ok=True)
            pyspy = str(Path(sys.executable).parent / "py-spy")
            for fmt, ext in (("flamegraph", "svg"), ("speedscope", "json")):
                trial(base, f"prof-{fmt}", args.n, args.workers, True,
                      [pyspy, "record", "--idle", "--threads", "-r", "200", "-f", fmt,
                       "-o", str(out / f"busy.{ext}")])
            trial(base, "strace", args.n, args.workers, True, ["strace", "-c", "-f"])
        for t in range(args.trials):
            idle = trial(base, f"idle{t}", args.n, args.workers, False)
            busy = trial(base, f"busy{t}", args.n, args.workers, True)
            res["idle"].append(idle)
            res["busy"].append(busy)
            line = f"trial {t + 1}: idle {idle[0]:.0f}/s, busy {busy[0]:.0f}/s"
            if site is not None:
                key = list(res)[2]
                res[key].append(trial(base, f"sw{t}", args.n, args.workers, True, site=site))
                line += f", {key} {res[key][-1][0]:.0f}/s"
            print(line, flush=True)
    print(f"\nN = {args.n}, W = {args.workers}, medians of {args.trials}\n")
    print("| queue | msg/s | busy/idle | CPU s/1k queue tree | CPU s/1k machine |")
    print("|---|---|---|---|---|")
    idle_rates = [r[0] for r in res["idle"]]
    for k, rs in res.items():
        ratio = "1" if k == "idle" else \
            f"{median([r[0] / i for r, i in zip(rs, idle_rates)]):.2f}"
        print(f"| {k} | {median([r[0] for r in rs]):.0f} | {ratio} | "
              f"{median([r[1] for r in rs]):.2f} | {median([r[2] for r in rs]):.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
