"""Bulk enqueue from the shell (issue 15 item 3): `rq sendmesg --stdin` against
a shell loop of task-spooler's `tsp`, measured in the same run (target: RQ at
least 2x tsp's shell-loop enqueue rate).

Trials interleaved, `--runs` of each, `--n` messages per trial:
  * tsp: `while …; do tsp true; done` against a tsp server of its own (TS_SOCKET
    in the temp dir) whose one slot is held by a long job, so the loop measures
    enqueueing only (as RQ's paused queue does); not durable;
  * rq --stdin: `seq N | rq sendmesg --dest bench --stdin` to a paused queue;
    every message durable (fsynced) before its id is printed;
  * for scale, a shell loop of single `rq sendmesg` calls (`--loop-n` messages).
Printed per system: msg/s (median and the runs), the CPU seconds per 1,000
messages of the client processes (getrusage of the children: the tsp or rq
commands and their shell, not the tsp server or the queue process), and the
ratio to tsp's rate; then the queue process's own CPU per 1k messages.
Needs tsp (Debian task-spooler: apt-get install task-spooler).
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

from common import (
    QUEUE, QueueProc, add_common_args, bench_queue, disk_probe, fmt_runs, machine_line,
    median, new_root, temp_base,
)


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_timed(argv: list[str], env: dict[str, str], n: int,
              stdin: bytes | None = None) -> tuple[float, float, bytes]:
    """(msg/s, client CPU s per 1k messages, stdout) of one trial of `n` messages."""
    cpu0, t0 = children_cpu(), time.perf_counter()
    done = subprocess.run(argv, env=env, input=stdin, capture_output=True, check=False)
    wall, cpu = time.perf_counter() - t0, children_cpu() - cpu0
    if done.returncode != 0:
        raise SystemExit(f"{argv[:3]} failed: {done.stderr.decode()[-500:]}")
    return n / wall, cpu / n * 1000, done.stdout


def tsp_trial(tsp: str, base: Path, n: int) -> tuple[float, float]:
    sock = base / f"tsp.{time.monotonic_ns()}.sock"
    env = dict(os.environ, TS_SOCKET=str(sock), TS_SAVELIST="", TS_MAXFINISHED="100000")
    subprocess.run([tsp, "sleep", "600"], env=env, check=True, capture_output=True)
    try:
        rate, cpu, _ = run_timed(["sh", "-c", f'i=0; while [ $i -lt {n} ]; do "{tsp}" true '
                                  '>/dev/null || exit 1; i=$((i+1)); done'], env, n)
        listed = subprocess.run([tsp, "-l"], env=env, capture_output=True, text=True).stdout
        queued = sum(1 for line in listed.splitlines() if " queued " in line)
        if queued != n:
            raise SystemExit(f"tsp: {queued} jobs queued, expected {n}")
    finally:
        subprocess.run([tsp, "-K"], env=env, capture_output=True)
    return rate, cpu


def process_cpu(pid: int) -> float:
    """User + system CPU seconds of process `pid` (its threads included)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


QUEUE_CPU: list[float] = []  # the queue process's CPU s per 1k messages, per --stdin trial


def rq_stdin_trial(rq: str, env: dict[str, str], n: int, q: QueueProc) -> tuple[float, float]:
    before, qcpu = q.call("num_messages")["que"], process_cpu(q.pid)
    lines = "".join(f"job {i}\n" for i in range(n)).encode()
    rate, cpu, out = run_timed([rq, "sendmesg", "--dest", QUEUE, "--stdin"], env, n, lines)
    QUEUE_CPU.append((process_cpu(q.pid) - qcpu) / n * 1000)
    if len(out.splitlines()) != n or q.call("num_messages")["que"] != before + n:
        raise SystemExit("rq sendmesg --stdin: not every message was queued")
    return rate, cpu


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--n", type=int, default=2000, help="messages per trial")
    ap.add_argument("--runs", type=int, default=3, help="trials of each system")
    ap.add_argument("--loop-n", type=int, default=50, help="messages of the rq sendmesg loop")
    add_common_args(ap)
    args = ap.parse_args()
    tsp = shutil.which("tsp") or shutil.which("ts")
    if tsp is None:
        raise SystemExit("tsp not found: apt-get install task-spooler")
    rq = os.path.join(os.path.dirname(sys.executable), "rq")
    print(f"stdin_enqueue: n={args.n}, runs={args.runs}, {machine_line()}")
    results: dict[str, list[tuple[float, float]]] = {"tsp": [], "stdin": [], "loop": []}
    with temp_base(args.tmpdir, args.keep) as base:
        print(f"  {disk_probe(base)}")
        root = new_root(base, "stdin")
        bench_queue(root, num_workers=1, paused=True)
        env = dict(os.environ, RQ_ROOT=str(root))
        with QueueProc(root) as q:
            rq_stdin_trial(rq, env, 100, q)  # warm up
            for _ in range(args.runs):
                results["tsp"].append(tsp_trial(tsp, base, args.n))
                results["stdin"].append(rq_stdin_trial(rq, env, args.n, q))
                results["loop"].append(run_timed(
                    ["sh", "-c", f'i=0; while [ $i -lt {args.loop_n} ]; do "{rq}" sendmesg '
                     f'--dest {QUEUE} >/dev/null || exit 1; i=$((i+1)); done'],
                    env, args.loop_n)[:2])
    base_rate = median([r for r, _ in results["tsp"]])
    print("                                         msg/s (runs)               CPU s/1k  x tsp")
    for key, label in (("tsp", "tsp shell loop (not durable)"),
                       ("stdin", "rq sendmesg --stdin (durable)"),
                       ("loop", "rq sendmesg shell loop (durable)")):
        rates = [r for r, _ in results[key]]
        cpu = median([c for _, c in results[key]])
        runs = fmt_runs(rates)
        print(f"  {label:36} {median(rates):7.0f} {runs:20} {cpu:6.2f}  "
              f"{median(rates) / base_rate:5.2f}")
    print(f"  the queue process's CPU per 1k messages of --stdin: {median(QUEUE_CPU[1:]):.2f} s")
    print("  target: rq sendmesg --stdin >= 2x the tsp shell loop")
    return 0


if __name__ == "__main__":
    sys.exit(main())
