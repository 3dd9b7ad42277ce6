"""The cost of one `rq sendmesg` from a shell (issue 15: at most 2.5x a bare
`python -c pass` of the same interpreter, measured in the same run).

Both commands run as real processes, interleaved, `--n` times each: `python -c
pass` and the `rq` console script of this checkout's virtualenv sending one
durable message to a paused queue.  Printed: the median wall time and CPU
time (user + system of the child, from wait4) of each, and their ratios; then
the rate of a shell loop of `rq sendmesg`.

Both run with their bytecode cached, as after `pip install` of the wheel (which
compiles every module): the children get `PYTHONPYCACHEPREFIX` under the
temporary directory and never `PYTHONDONTWRITEBYTECODE`, and the warm-up runs
fill that cache.  Without it each call also compiles every module it imports
(measured 2026-11-26: 78 ms CPU instead of ~55), a cost no installed `rq` pays.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

from common import (
    QUEUE, QueueProc, add_common_args, bench_queue, disk_probe, machine_line, median, new_root,
    temp_base,
)


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the child) of one run; it must exit 0."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"{argv[:3]} failed: {proc.stderr.read().decode() if proc.stderr else ''}")
    return wall, usage.ru_utime + usage.ru_stime


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--n", type=int, default=30, help="runs of each command")
    add_common_args(ap)
    args = ap.parse_args()
    rq = os.path.join(os.path.dirname(sys.executable), "rq")
    print(f"cli_cost: n={args.n}, {machine_line()}")
    with temp_base(args.tmpdir, args.keep) as base:
        print(f"  {disk_probe(base)}")
        root = new_root(base, "cli")
        bench_queue(root, num_workers=1, paused=True)
        env = dict(os.environ, RQ_ROOT=str(root), PYTHONPYCACHEPREFIX=str(base / "pycache"))
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        with QueueProc(root):
            bare = [timed([sys.executable, "-c", "pass"], env) for _ in range(2)]  # warm up
            send = [timed([rq, "sendmesg", "--dest", QUEUE], env) for _ in range(2)]
            bare, send = [], []
            for _ in range(args.n):
                bare.append(timed([sys.executable, "-c", "pass"], env))
                send.append(timed([rq, "sendmesg", "--dest", QUEUE], env))
            loop_n = max(10, args.n)
            t0 = time.perf_counter()
            subprocess.run(["sh", "-c", f'i=0; while [ $i -lt {loop_n} ]; do "{rq}" sendmesg '
                            f'--dest {QUEUE} >/dev/null || exit 1; i=$((i+1)); done'],
                           env=env, check=True)
            loop_rate = loop_n / (time.perf_counter() - t0)
    bw, bc = median([w for w, _ in bare]), median([c for _, c in bare])
    sw, sc = median([w for w, _ in send]), median([c for _, c in send])
    print("                       wall ms   CPU ms")
    print(f"  python -c pass       {bw * 1000:7.1f}  {bc * 1000:7.1f}")
    print(f"  rq sendmesg          {sw * 1000:7.1f}  {sc * 1000:7.1f}")
    print(f"  ratio                {sw / bw:7.2f}x {sc / bc:7.2f}x   (target <= 2.5x)")
    print(f"  shell loop of rq sendmesg: {loop_rate:.0f} msg/s (target >= 40)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
