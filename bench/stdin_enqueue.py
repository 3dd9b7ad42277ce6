"""Bulk enqueue from the shell (issue 15 item 3): `rq sendmesg --stdin` against
a shell loop of task-spooler's `tsp`, measured in the same run (target: RQ at
least 2x tsp's shell-loop enqueue rate).

Trials interleaved, `--runs` of each, `--n` messages per trial:
  * tsp: `while …; do tsp true; done` against tsp servers of its own (TS_SOCKET
    in the temp dir) whose one slot is held by a long job, so the loop measures
    enqueueing only (as RQ's paused queue does); not durable.  One server admits
    994 unfinished jobs (see TSP_PER_SERVER), so the loop moves to the next
    server, its slot held too, after every 500;
  * rq --stdin: `seq N | rq sendmesg --dest bench --stdin` to a paused queue;
    every message durable (fsynced) before its id is printed;
  * for scale, a shell loop of single `rq sendmesg` calls (`--loop-n` messages).
Printed per system: msg/s (median and the runs), the CPU seconds per 1,000
messages of the client processes (getrusage of the children: the tsp or rq
commands and their shell, not the tsp server or the queue process), and the
ratio to tsp's rate; then the queue process's own CPU per 1k messages.
Needs tsp (Debian task-spooler: apt-get install task-spooler).  Runs under a
subreaper (`tini -s`; re-executes itself under it when not): each trial's
daemonized tsp processes are reaped as they exit.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (  # noqa: E402
    QUEUE, BenchError, QueueProc, add_common_args, bench_queue, disk_probe, fmt_runs,
    machine_line, median, new_root, temp_base, wait_for,
)
from peerlib import parse_tsp_list  # noqa: E402
from peers import reexec_under_tini  # noqa: E402


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_timed(argv: list[str], env: dict[str, str], n: int,
              stdin: bytes | None = None) -> tuple[float, float, bytes]:
    """(msg/s, client CPU s per 1k messages, stdout) of one trial of `n` messages;
    BenchError when it is not done at 1 msg/s plus a minute (the shell loop of
    single `rq sendmesg` calls ran at 2 msg/s at load 30)."""
    limit = 60 + n
    cpu0, t0 = children_cpu(), time.perf_counter()
    try:
        done = subprocess.run(argv, env=env, input=stdin, capture_output=True, check=False,
                              timeout=limit)
    except subprocess.TimeoutExpired:
        raise BenchError(f"{argv[:3]}: {n} messages not done in {limit} s") from None
    wall, cpu = time.perf_counter() - t0, children_cpu() - cpu0
    if done.returncode != 0:
        raise BenchError(f"{argv[:3]} failed: {done.stderr.decode()[-500:]}")
    return n / wall, cpu / n * 1000, done.stdout


# task-spooler 1.0.1 keeps each unfinished job's client connected to its server,
# and its server admits a bounded number of unfinished jobs, derived from its
# connection limit min(1000, TS_MAXCONN, RLIMIT_NOFILE - 5) (TS_MAXCONN can only
# lower it; its select() could not go past FD_SETSIZE anyway): 994 here, the
# holder included.  The next `tsp` then blocks until a job finishes (with -B it
# exits 2, "queue full"): with the slot held by a long job, the old loop of
# 2,000 hung at the 994th until that job ended.  So a trial's N enqueues go to
# ceil(N / TSP_PER_SERVER) servers, each with its one slot held, in one shell
# loop that moves to the next socket after every TSP_PER_SERVER.  Shorter
# queues per server can only help tsp (its server walks its job list, a linked
# list, at each enqueue).
TSP_PER_SERVER = 500
# The loop: $1 = tsp, $2 = the sockets' directory, then one count per server.
# The inner loop's body is the plain `tsp true` of a user's loop; -B only makes
# a full queue an error instead of a block.
TSP_LOOP = (
    'tsp=$1; d=$2; shift 2; k=0\n'
    'for c in "$@"; do\n'
    '  export TS_SOCKET="$d/s$k"; j=0\n'
    '  while [ $j -lt $c ]; do\n'
    '    "$tsp" -B true >/dev/null || { echo "tsp -B true exited $? at job $j of server $k" >&2; '
    'exit 1; }\n'
    '    j=$((j+1))\n'
    '  done\n'
    '  k=$((k+1))\n'
    'done\n')


def tsp_env(sockets: Path) -> dict[str, str]:
    """Our environment without the caller's TS_* settings (TS_ENV would run a
    shell at each enqueue, TS_SLOTS or TS_MAXCONN change the server)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TS_")}
    env["TMPDIR"] = str(sockets)  # the holders' output files
    return env


def tsp_call(tsp: str, args: list[str], env: dict[str, str], what: str) -> str:
    try:
        done = subprocess.run([tsp, *args], env=env, capture_output=True, text=True,
                              timeout=30, check=False)
    except subprocess.TimeoutExpired:
        raise BenchError(f"tsp {' '.join(args)} ({what}): no answer in 30 s") from None
    if done.returncode != 0:
        raise BenchError(f"tsp {' '.join(args)} ({what}) exited {done.returncode}: "
                         f"{done.stderr.strip()[-300:]}")
    return done.stdout


def procs_with_env(entry: bytes) -> list[int]:
    """Pids of live processes whose environment holds `entry` (zombies have none)."""
    pids = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                environ = Path(f"/proc/{name}/environ").read_bytes()
            except OSError:
                continue
            if entry in environ:
                pids.append(int(name))
    return pids


def holder_pid(tsp: str, env: dict[str, str]) -> int:
    """The pid of job 0, the holder.  `tsp -p` prints 0 until the job's client
    has reported it (seen right after the enqueue), and kill(0) would signal
    our own process group."""
    def pid() -> int:
        value = int(tsp_call(tsp, ["-p", "0"], env, "the holder's pid").strip() or 0)
        return value if value > 1 else 0

    return wait_for(pid, 30, "tsp -p 0 to print the holder's pid", 0.01)


def tsp_trial(tsp: str, base: Path, n: int) -> tuple[float, float]:
    """(msg/s, client CPU s per 1k) of a shell loop of `n` `tsp true` enqueues
    to servers whose one slot is held by a `sleep`: nothing runs, nothing is
    durable.  Every wait has a deadline."""
    sockets = base / f"tsp.{time.monotonic_ns()}"
    sockets.mkdir()
    env = tsp_env(sockets)
    counts = [min(TSP_PER_SERVER, n - i) for i in range(0, n, TSP_PER_SERVER)]
    envs = [dict(env, TS_SOCKET=str(sockets / f"s{k}")) for k in range(len(counts))]
    holders: list[int] = []
    try:
        for e in envs:  # starts the server; job 0 takes the slot
            tsp_call(tsp, ["sleep", "3600"], e, "the holder job")
            holders.append(holder_pid(tsp, e))
        cpu0, t0 = children_cpu(), time.perf_counter()
        limit = 60 + n * 0.1  # 10 msg/s: tsp fell to 53 msg/s at load 30
        try:
            done = subprocess.run(["sh", "-c", TSP_LOOP, "sh", tsp, str(sockets),
                                   *map(str, counts)], env=env, capture_output=True,
                                  timeout=limit, check=False)
        except subprocess.TimeoutExpired:
            raise BenchError(f"tsp shell loop of {n}: not done in {limit:.0f} s") from None
        wall, cpu = time.perf_counter() - t0, children_cpu() - cpu0
        if done.returncode != 0:
            raise BenchError(f"tsp shell loop failed: {done.stderr.decode()[-500:]}")
        for k, (e, c) in enumerate(zip(envs, counts)):
            listed = parse_tsp_list(tsp_call(tsp, ["-l"], e, "the list"))
            if listed != {"running": 1, "queued": c}:
                raise BenchError(f"tsp server {k}: {listed}, expected the holder running "
                                 f"and {c} queued")
    finally:
        tsp_stop(tsp, sockets, envs, holders)
    return n / wall, cpu / n * 1000


def tsp_stop(tsp: str, sockets: Path, envs: list[dict[str, str]], holders: list[int]) -> None:
    """Stop the servers, then the holders (before, the queued jobs would run),
    and wait until no process of the trial is left (`tsp -K` returns before its
    server is gone; each queued job's client exits when its connection closes),
    so none of them runs into the next trial."""
    for e in envs:
        subprocess.run([tsp, "-K"], env=e, capture_output=True, timeout=30, check=False)
    wait_for(lambda: not any(Path(e["TS_SOCKET"]).exists() for e in envs), 30,
             "the tsp servers to remove their sockets")
    for pid in holders:
        try:
            os.kill(pid, signal.SIGTERM)  # pid > 1: holder_pid
        except ProcessLookupError:
            pass
    entry = f"TS_SOCKET={sockets}/".encode()
    left: list[int] = []

    def none_left() -> bool:
        left[:] = procs_with_env(entry)
        return not left

    try:
        wait_for(none_left, 60, "the tsp clients to exit", 0.05)
    except BenchError as exc:
        raise BenchError(f"{exc}: {len(left)} left (pids {left[:5]} ...)") from None


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
        raise BenchError("rq sendmesg --stdin: not every message was queued")
    return rate, cpu


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--n", type=int, default=2000, help="messages per trial")
    ap.add_argument("--runs", type=int, default=3, help="trials of each system")
    ap.add_argument("--loop-n", type=int, default=50, help="messages of the rq sendmesg loop")
    add_common_args(ap)
    args = ap.parse_args()
    reexec_under_tini()
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
            tsp_trial(tsp, base, 100)
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
    pairs = [r / t for (r, _), (t, _) in zip(results["stdin"], results["tsp"])]
    print(f"  --stdin / tsp per run (each tsp trial and the --stdin trial right after it): "
          f"{fmt_runs(pairs, '{:.2f}')}")
    print("  target: rq sendmesg --stdin >= 2x the tsp shell loop")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (BenchError, subprocess.CalledProcessError) as exc:
        sys.exit(f"stdin_enqueue: {exc}")
