"""RQ beside its peers on one workload, in one run (issue 15, item 1).

The workload: N trivial jobs, each one OS process running /bin/sh that creates
its marker file (bench/peerlib.py), end to end from the first enqueue to the
last completion, with 1 and 2 workers.  Systems, trials interleaved:
  tsp          task-spooler (Debian), jobs added by a shell loop of `tsp`, its
               own TS_SOCKET and TMPDIR, slots = workers (in memory, not durable)
  celery       Celery's prefork pool (concurrency = workers)      } Redis with
  pyrq-simple  python-rq's SimpleWorker (one per worker)          } appendonly yes,
  pyrq-fork    python-rq's forking Worker (one per worker)        } appendfsync always
  rq-py        RQ from a Python program: `Client.send`, create_message over the queue socket
  rq-sh        RQ from a shell loop of `rq sendmesg` (--shell-n jobs)
Each system's trial is preceded, seconds before, by a bare spawn loop (W Python
threads spawning the same /bin/sh job, no queue): the figure's denominator.
python-rq and Celery run in throwaway virtualenvs under --venvs (cached), never
in the project's .venv (python-rq's package is named `rq` too); the Redis
server is private to the run (own port and dir).  Every trial checks that all
N markers exist and that the system itself reports N successes.

Printed: one Markdown table of medians over --trials: jobs/s, ratio to the bare
loop (median of per-trial ratios), enqueue rate of the one client, and CPU
seconds per 1,000 jobs, both of the whole machine (/proc/stat) and of this
benchmark's process tree (steadier on a shared machine).  Runs under a
subreaper (`tini -s`) so that orphaned job processes and daemons are reaped at
once; it re-executes itself under tini when it is not.  Usage:
    tini -s -- .venv/bin/python bench/peers.py --tmpdir DIR [--n 2000] [--trials 3]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (QUEUE, BenchError, QueueProc, add_common_args,  # noqa: E402
                    bench_queue, disk_probe, machine_line, new_root, temp_base,
                    wait_for)
from peerlib import (JOB_SH, TREE_ROOT_ENV, Record, Trial, Window, aggregate,  # noqa: E402
                     count_markers, format_table, job_argv, marker_path, parse_result,
                     parse_tsp_list, wait_markers)
from rqtest import free_port  # noqa: E402
from throughput import wait_done  # noqa: E402

from rq.producer import Client  # noqa: E402

BENCH = Path(__file__).resolve().parent
SYSTEMS = ("tsp", "celery", "rq-py", "pyrq-simple", "pyrq-fork", "rq-sh")
REDIS_SYSTEMS = {"celery", "pyrq-simple", "pyrq-fork"}
# The peers' virtualenvs: name -> (pip requirements, distribution whose version is shown).
VENVS = {"pyrq": (["rq>=2.0", "redis>=5.0"], "rq"),
         "celery": (["celery[redis]>=5.3"], "celery")}
VENV_OF = {"pyrq-simple": "pyrq", "pyrq-fork": "pyrq", "celery": "celery"}
APT = {"tsp": "task-spooler", "redis-server": "redis-server", "tini": "tini"}
# RQ's queue script: the same /bin/sh job, then the S6 status line on fd 3.
RQ_SCRIPT = '#!/bin/sh\n: > "$RQ_PARAM1"\necho "done ok" >&3\n'
# A shell loop that runs "$@" MARKS/i for i in 0..N-1 (tsp's and rq sendmesg's clients).
SHELL_LOOP = ('n=$1; m=$2; shift 2; i=0; while [ "$i" -lt "$n" ]; do '
              '"$@" "$m/$i" >/dev/null || exit 1; i=$((i+1)); done')
REEXEC_ENV = "RQ_PEERS_UNDER_TINI"
# task-spooler 1.0.1's server admits this many unfinished (queued + running) jobs
# and blocks the next `tsp` until one finishes (bench/stdin_enqueue.py).  Here
# the jobs run, so it only caps the enqueue rate when the backlog gets there.
TSP_MAX_UNFINISHED = 994


# ---------------------------------------------------------------- set-up
def under_subreaper() -> bool:
    """True when this process is pid 1 or the child of `tini -s`."""
    if os.getpid() == 1:
        return True
    try:
        argv = Path(f"/proc/{os.getppid()}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    opts = argv[1:argv.index(b"--")] if b"--" in argv else argv[1:]
    return os.path.basename(argv[0]) == b"tini" and b"-s" in opts


def apt_install(tool: str) -> str:
    """The path of `tool`, installing its Debian package when it is missing."""
    path = shutil.which(tool)
    if path:
        return path
    if os.geteuid() != 0:
        raise BenchError(f"{tool} is missing: run apt-get install {APT[tool]}")
    print(f"  installing {APT[tool]} (apt-get)", flush=True)
    cmd = ["apt-get", "install", "-y", "-q", APT[tool]]
    if subprocess.run(cmd, stdout=subprocess.DEVNULL).returncode != 0:
        subprocess.run(["apt-get", "update", "-q"], stdout=subprocess.DEVNULL)
        subprocess.run(cmd, stdout=subprocess.DEVNULL, check=True)
    path = shutil.which(tool)
    if not path:
        raise BenchError(f"apt-get install {APT[tool]} gave no {tool}")
    return path


def reexec_under_tini() -> None:
    """Orphaned job processes and daemonized servers (tsp's) must be reaped at
    once and stay in one process tree: re-execute under `tini -s`."""
    if under_subreaper():
        return
    if os.environ.get(REEXEC_ENV):
        raise BenchError("not under a subreaper although re-executed under tini -s")
    tini = apt_install("tini")
    os.execve(tini, [tini, "-s", "--", sys.executable, *sys.argv],
              dict(os.environ, **{REEXEC_ENV: "1"}))


def ensure_venv(venvs: Path, name: str) -> tuple[str, str]:
    """(python of the cached virtualenv `name`, version of its peer), creating it
    with pip when missing.  Outside the project's .venv on purpose."""
    reqs, dist = VENVS[name]
    path = venvs / name
    python, ok = path / "bin" / "python", path / ".installed"
    if not ok.exists() or ok.read_text() != " ".join(reqs):
        print(f"  creating the {name} virtualenv in {path} (pip install {' '.join(reqs)})",
              flush=True)
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(path)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", *reqs], check=True)
        ok.write_text(" ".join(reqs))
    version = subprocess.run(
        [str(python), "-c", f"import importlib.metadata as m; print(m.version({dist!r}))"],
        capture_output=True, text=True, check=True).stdout.strip()
    return str(python), version


class RedisServer:
    """A private redis-server: own port and dir, AOF with fsync at every write."""

    def __init__(self, base: Path) -> None:
        self.dir = base / "redis"
        self.dir.mkdir()
        self.port = free_port()
        self.popen = subprocess.Popen(
            [apt_install("redis-server"), "--port", str(self.port), "--bind", "127.0.0.1",
             "--dir", str(self.dir), "--appendonly", "yes", "--appendfsync", "always",
             "--save", "", "--daemonize", "no", "--logfile", str(self.dir / "redis.log")],
            stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            wait_for(self.ping, 30, "redis-server to answer PING", 0.02)
        except BaseException:
            self.stop()
            raise

    def ping(self) -> bool:
        if self.popen.poll() is not None:
            raise BenchError(f"redis-server exited with {self.popen.returncode}; "
                             f"see {self.dir / 'redis.log'}")
        out = subprocess.run(["redis-cli", "-p", str(self.port), "ping"],
                             capture_output=True, text=True)
        return out.stdout.strip() == "PONG"

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(30)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()


@dataclass
class Context:
    base: Path
    venvs: dict[str, tuple[str, str]]  # venv name -> (python, peer version)
    redis: RedisServer | None


def marks_dir(base: Path, label: str) -> str:
    path = base / label / "marks"
    path.mkdir(parents=True)
    return str(path)


def check_markers(marks: str, n: int, system: str) -> None:
    have = count_markers(marks)
    if have != n:
        raise BenchError(f"{system}: {have} markers for {n} jobs")


def run_shell_loop(prefix: list[str], n: int, marks: str, env: dict[str, str]) -> None:
    subprocess.run(["/bin/sh", "-c", SHELL_LOOP, "sh", str(n), marks, *prefix], env=env,
                   check=True, stdin=subprocess.DEVNULL)


# ---------------------------------------------------------------- the systems
def run_bare(ctx: Context, label: str, n: int, workers: int) -> Trial:
    """W threads spawning the job N times in all, no queue: the denominator."""
    marks = marks_dir(ctx.base, label)
    todo = iter(range(n))
    lock = threading.Lock()
    failed: list[int] = []

    def worker() -> None:
        while True:
            with lock:
                i = next(todo, None)
            if i is None:
                return
            pid = os.posix_spawn("/bin/sh", job_argv(marker_path(marks, i)), os.environ)
            if os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) != 0:
                failed.append(i)

    window = Window()
    window.start()
    threads = [threading.Thread(target=worker) for _ in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    trial = window.stop(n)
    if failed:
        raise BenchError(f"bare loop: {len(failed)} job(s) failed")
    check_markers(marks, n, "bare loop")
    return trial


def run_rq(ctx: Context, label: str, n: int, workers: int, shell: bool) -> Trial:
    """A queue process (python -m rq.queue) with W workers; the client is this
    program over the socket, or a shell loop of `rq sendmesg`."""
    root = new_root(ctx.base, label)
    bench_queue(root, num_workers=workers, script_body=RQ_SCRIPT)
    marks = marks_dir(ctx.base, label)
    with QueueProc(root) as q:
        errors: list[BaseException] = []
        window = Window()

        def produce() -> None:
            try:
                if shell:
                    rq = os.path.join(os.path.dirname(sys.executable), "rq")
                    run_shell_loop([rq, "sendmesg", "--dest", QUEUE, "--param1"], n, marks,
                                   dict(os.environ, RQ_ROOT=str(root)))
                else:  # the producer API users call: one kept connection (rq.client.Connection)
                    with Client(str(root)) as rq_client:
                        for i in range(n):
                            rq_client.send(QUEUE, param1=marker_path(marks, i))
                window.enqueue_done()
            except BaseException as exc:  # reported by wait_done in the main thread
                errors.append(exc)

        producer = threading.Thread(target=produce, daemon=True)
        def check() -> None:
            q.alive()
            if errors:
                raise BenchError(f"enqueue failed: {errors[0]!r}")

        window.start()
        producer.start()
        wait_markers(marks, n, check=check)  # a deadline on progress, then the last commits
        wait_done(q, n, errors)
        # The shell loop's sh must be reaped before the window closes: reaped
        # during the /proc scan, its children's CPU could be in neither its
        # stat nor ours yet (seen: 2 of 6 rq-sh trials at ~7 instead of ~70 s/1k).
        producer.join(30)
        trial = window.stop(n)
    check_markers(marks, n, "rq")
    return trial


def run_tsp(ctx: Context, label: str, n: int, workers: int) -> Trial:
    """task-spooler with its own socket and TMPDIR, W slots, jobs added by a
    shell loop of `tsp`; done when `tsp -l` lists N finished with E-Level 0."""
    marks = marks_dir(ctx.base, label)
    tmp = ctx.base / label / "tsp"
    tmp.mkdir()
    tsp = apt_install("tsp")
    env = dict(os.environ, TS_SOCKET=str(tmp / "socket"), TMPDIR=str(tmp),
               TS_MAXFINISHED=str(n + 10))
    env.pop("TS_ENV", None)
    subprocess.run([tsp, "-S", str(workers)], env=env, check=True)  # starts its server
    try:
        window = Window()
        window.start()
        run_shell_loop([tsp, "/bin/sh", "-c", JOB_SH, "sh"], n, marks, env)
        window.enqueue_done()
        backlog = n - count_markers(marks)
        if backlog >= TSP_MAX_UNFINISHED - 10:
            print(f"  note: {label}: {backlog} jobs not done at the last enqueue, at tsp's "
                  f"limit of {TSP_MAX_UNFINISHED} unfinished jobs: the loop's enqueue rate "
                  "was capped by the completions (tsp blocks the enqueue past it)", flush=True)
        wait_markers(marks, n)

        def all_finished() -> bool:
            counts = parse_tsp_list(subprocess.run([tsp, "-l"], env=env, capture_output=True,
                                                   text=True, check=True).stdout)
            if counts.get("failed") or counts.get("skipped"):
                raise BenchError(f"tsp: jobs failed: {counts}")
            return counts.get("finished", 0) >= n

        wait_for(all_finished, 60, "tsp to list every job finished", 0.002)
        trial = window.stop(n)
    finally:
        subprocess.run([tsp, "-K"], env=env, stderr=subprocess.DEVNULL)
    check_markers(marks, n, "tsp")
    return trial


def run_redis_peer(ctx: Context, system: str, label: str, n: int, workers: int) -> Trial:
    """bench/peers_redis.py in the peer's own virtualenv."""
    assert ctx.redis is not None
    marks = marks_dir(ctx.base, label)
    python = ctx.venvs[VENV_OF[system]][0]
    out = subprocess.run(
        [python, str(BENCH / "peers_redis.py"), "--system", system, "--n", str(n),
         "--workers", str(workers), "--marks", marks, "--port", str(ctx.redis.port),
         "--log", str(ctx.base / label / "workers.log")],
        capture_output=True, text=True, stdin=subprocess.DEVNULL, cwd=str(ctx.base))
    if out.returncode != 0:
        raise BenchError(out.stderr.strip().splitlines()[-1] if out.stderr.strip()
                         else f"{system} driver exited with {out.returncode}")
    check_markers(marks, n, system)
    return parse_result(out.stdout)


def runner(system: str) -> Callable[[Context, str, int, int], Trial]:
    if system == "tsp":
        return run_tsp
    if system in ("rq-py", "rq-sh"):
        return lambda ctx, label, n, w: run_rq(ctx, label, n, w, shell=system == "rq-sh")
    return lambda ctx, label, n, w: run_redis_peer(ctx, system, label, n, w)


def labels(systems: list[str], ctx: Context, shell_n: int, n: int) -> dict[str, str]:
    tsp_version = subprocess.run(["dpkg-query", "-W", "-f", "${Version}", "task-spooler"],
                                 capture_output=True, text=True).stdout.strip() or "?"
    v = {name: ver for name, (_, ver) in ctx.venvs.items()}
    names = {
        "tsp": f"task-spooler {tsp_version}, shell loop of `tsp` (not durable)",
        "celery": f"Celery {v.get('celery')} prefork pool, Redis AOF always",
        "rq-py": "RQ, Python program, `Client.send` over the queue socket",
        "pyrq-simple": f"python-rq {v.get('pyrq')} SimpleWorker, Redis AOF always",
        "pyrq-fork": f"python-rq {v.get('pyrq')} Worker (forking), Redis AOF always",
        "rq-sh": "RQ, shell loop of `rq sendmesg`" + (f" (N={shell_n})" if shell_n != n else ""),
    }
    return {s: names[s] for s in SYSTEMS if s in systems}


# ---------------------------------------------------------------- main
def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    ap.add_argument("--n", type=int, default=2000, help="jobs per trial (default 2000)")
    ap.add_argument("--shell-n", type=int, default=200,
                    help="jobs per trial of the `rq sendmesg` shell loop (default 200, at "
                         "most --n: one call costs ~0.1 s of CPU today)")
    ap.add_argument("--trials", type=int, default=3, help="trials per figure; medians (default 3)")
    ap.add_argument("--workers", default="1,2", help="worker counts (default 1,2)")
    ap.add_argument("--systems", default=",".join(SYSTEMS),
                    help=f"comma-separated subset of {','.join(SYSTEMS)} (default all)")
    ap.add_argument("--venvs", help="where the peers' virtualenvs are cached "
                                    "(default TMPDIR/rqbench-venvs)")
    add_common_args(ap)
    args = ap.parse_args()
    args.systems = [s for s in args.systems.split(",") if s]
    bad = [s for s in args.systems if s not in SYSTEMS]
    if bad:
        ap.error(f"unknown system(s) {','.join(bad)}; choose from {','.join(SYSTEMS)}")
    args.workers = [int(w) for w in args.workers.split(",")]
    args.shell_n = min(args.shell_n, args.n)
    return args


def print_table(records: list[Record], names: dict[str, str], workers: list[int],
                title: str) -> None:
    now = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    print(f"\n{title}, {now}, load avg now {', '.join(f'{x:.2f}' for x in os.getloadavg())}:")
    print("\n".join(format_table(aggregate(records), names, workers)))
    print("(× bare: median of each trial's jobs/s over the bare spawn loop measured just before "
          "it; CPU machine: /proc/stat, includes other users' load; CPU tree: this benchmark's "
          "processes only)\n", flush=True)


def measure(args: argparse.Namespace, ctx: Context,
            names: dict[str, str]) -> tuple[list[Record], list[str]]:
    records: list[Record] = []
    failures: list[str] = []
    for trial in range(args.trials):
        for w in args.workers:
            for system in args.systems:  # each right after its own bare loop
                if any(f.startswith(f"{system} ") for f in failures):
                    continue
                n = args.shell_n if system == "rq-sh" else args.n
                label = f"{system}-w{w}-t{trial}"
                try:
                    bare = run_bare(ctx, f"bare-{label}", n, w)
                    res = runner(system)(ctx, label, n, w)
                except (BenchError, subprocess.CalledProcessError) as exc:
                    failures.append(f"{system} W={w} trial {trial + 1}: {exc}")
                    print(f"  FAILED {failures[-1]}", flush=True)
                    continue
                records.append(Record(system, w, res, bare))
                print(f"  trial {trial + 1} W={w} {system:12} {res.rate:8.1f} jobs/s "
                      f"(bare {bare.rate:6.0f}: x{res.rate / bare.rate:.2f}), enqueue "
                      f"{res.enqueue_rate:7.0f}/s, CPU/1k machine {res.cpu_per_1k:6.2f} s, "
                      f"tree {res.tree_cpu_per_1k:6.2f} s", flush=True)
        # The disk again: durable systems are bound by fsync, whose cost moves with the load.
        print(f"  after trial {trial + 1}: {disk_probe(args.tmpdir)}", flush=True)
        if trial + 1 < args.trials and records:  # usable figures if the run is cut short
            print_table(records, names, args.workers, f"so far, after {trial + 1} trial(s)")
    return records, failures


def main() -> int:
    args = parse_args()
    try:
        reexec_under_tini()
        os.environ[TREE_ROOT_ENV] = str(os.getppid() if os.getpid() != 1 else 1)
        print(f"peers: N={args.n} (rq sendmesg loop {args.shell_n}), {args.trials} trial(s), "
              f"workers {args.workers}, {machine_line()}", flush=True)
        print(f"  {disk_probe(args.tmpdir)}", flush=True)
        if "tsp" in args.systems:
            apt_install("tsp")
        venvs_dir = Path(args.venvs or os.path.join(args.tmpdir, "rqbench-venvs"))
        venvs_dir.mkdir(parents=True, exist_ok=True)
        venvs = {VENV_OF[s]: ensure_venv(venvs_dir, VENV_OF[s])
                 for s in args.systems if s in VENV_OF}
        with temp_base(args.tmpdir, args.keep) as base:
            redis = RedisServer(base) if REDIS_SYSTEMS & set(args.systems) else None
            try:
                ctx = Context(base, venvs, redis)
                names = labels(args.systems, ctx, args.shell_n, args.n)
                records, failures = measure(args, ctx, names)
            finally:
                if redis:
                    redis.stop()
    except (BenchError, subprocess.CalledProcessError) as exc:
        print(f"peers: {exc}", file=sys.stderr)
        return 1
    print_table(records, names, args.workers, f"medians of {args.trials} trial(s)")
    for f in failures:
        print(f"FAILED {f}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
