"""One trial of a Redis-backed peer for bench/peers.py, run by the peer's own
virtualenv's Python (never the project's: python-rq's package is named `rq`).

Systems: `pyrq-simple` (python-rq SimpleWorker), `pyrq-fork` (python-rq's
forking Worker), `celery` (Celery prefork pool, concurrency W).  The Redis
server is bench/peers.py's private one (`appendonly yes`, `appendfsync
always`).  The driver empties it, starts W workers (or one Celery worker with W
pool processes) and waits until they are ready, then measures: it enqueues N
jobs (bench/peerlib.py's job) from this one client, waits until N markers
exist and the peer itself reports N successes (python-rq: its finished-job
registry, Celery: N results in the backend), and prints one result line.
The workers are stopped (SIGTERM, then SIGKILL of their group) in any case.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import time

from peerlib import BenchError, Window, marker_path, result_line, wait_for, wait_markers

BENCH = os.path.dirname(os.path.abspath(__file__))
QUEUE = "bench"
WORKER_CLASS = {"pyrq-simple": "rq.worker.SimpleWorker", "pyrq-fork": "rq.worker.Worker"}


def start(argv: list[str], env: dict[str, str], log: str) -> subprocess.Popen[bytes]:
    with open(log, "ab") as fh:
        return subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=fh, stderr=fh,
                                start_new_session=True)


def stop(procs: list[subprocess.Popen[bytes]], timeout: float = 30.0) -> None:
    """Warm shutdown (SIGTERM), then SIGKILL of each process group."""
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for p in procs:
        try:
            p.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait(10)


def alive(procs: list[subprocess.Popen[bytes]], log: str) -> None:
    for p in procs:
        if p.poll() is not None:
            raise BenchError(f"a worker exited with {p.returncode}; see {log}")


def run_pyrq(args: argparse.Namespace, env: dict[str, str], log: str) -> None:
    import redis
    from rq import Queue, Worker

    from peers_tasks import run_job

    conn = redis.Redis(port=args.port)
    conn.flushall()
    bindir = os.path.dirname(sys.executable)
    procs = [start([os.path.join(bindir, "rq"), "worker", "--url", args.url, "--path", BENCH,
                    "--worker-class", WORKER_CLASS[args.system], "--quiet",
                    "--name", f"w{i}", QUEUE], env, log)
             for i in range(args.workers)]
    try:
        wait_for(lambda: alive(procs, log) or len(Worker.all(connection=conn)) == args.workers,
                 60, "python-rq workers", 0.05)
        q = Queue(QUEUE, connection=conn)
        window = Window()
        window.start()
        for i in range(args.n):
            q.enqueue(run_job, marker_path(args.marks, i))
        window.enqueue_done()

        def check() -> None:
            alive(procs, log)
            if q.failed_job_registry.count:
                raise BenchError(f"{q.failed_job_registry.count} python-rq job(s) failed")

        wait_markers(args.marks, args.n, check=check)
        wait_for(lambda: check() or q.finished_job_registry.count >= args.n, 60,
                 "python-rq's finished registry", 0.002)
        print(result_line(window.stop(args.n)), flush=True)
    finally:
        stop(procs)


def run_celery(args: argparse.Namespace, env: dict[str, str], log: str) -> None:
    import redis
    from celery.result import ResultSet

    from peers_tasks import app, celery_run_job

    redis.Redis(port=args.port).flushall()
    bindir = os.path.dirname(sys.executable)
    procs = [start([os.path.join(bindir, "celery"), "-A", "peers_tasks", "worker",
                    "--pool", "prefork", "--concurrency", str(args.workers), "-Q", QUEUE,
                    "--without-gossip", "--without-mingle", "--without-heartbeat",
                    "--loglevel", "WARNING"], env, log)]
    try:
        wait_for(lambda: alive(procs, log) or app.control.ping(timeout=0.5), 60,
                 "the Celery worker to answer ping", 0.05)
        window = Window()
        window.start()
        results = ResultSet([celery_run_job.delay(marker_path(args.marks, i))
                             for i in range(args.n)])
        window.enqueue_done()
        wait_markers(args.marks, args.n, check=lambda: alive(procs, log))

        def finished() -> bool:
            alive(procs, log)
            if any(r.failed() for r in results.results):
                raise BenchError("a Celery task failed")
            return results.completed_count() >= args.n

        wait_for(finished, 60, "Celery's results", 0.002)
        print(result_line(window.stop(args.n)), flush=True)
    finally:
        stop(procs)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--system", choices=["pyrq-simple", "pyrq-fork", "celery"], required=True)
    ap.add_argument("--n", type=int, required=True)
    ap.add_argument("--workers", type=int, required=True)
    ap.add_argument("--marks", required=True, help="directory for the jobs' markers")
    ap.add_argument("--port", type=int, required=True, help="the private redis-server's port")
    ap.add_argument("--log", required=True, help="file for the workers' output")
    args = ap.parse_args()
    args.url = f"redis://127.0.0.1:{args.port}/0"
    # No empty PYTHONPATH entry: it would mean the cwd, and the project's own
    # `rq` package there would shadow python-rq's.
    pythonpath = [BENCH] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env = dict(os.environ, PEERS_REDIS_URL=args.url, PYTHONPATH=os.pathsep.join(pythonpath))
    os.environ["PEERS_REDIS_URL"] = args.url  # for peers_tasks' Celery app in this process
    try:
        (run_celery if args.system == "celery" else run_pyrq)(args, env, args.log)
    except BenchError as exc:
        print(f"peers_redis: {args.system}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
