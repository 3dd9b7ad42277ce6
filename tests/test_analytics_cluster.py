"""Cluster test of the analytics job (issue 5): a real Spark standalone master and worker.

Both daemons are started on loopback from the pyspark installation with `spark-daemon.sh`
(its sbin/ has no start-master.sh), the job runs with master `spark://127.0.0.1:PORT` and
its result must equal a `local[2]` run's over the same event-log history (S13).  Skips, saying
so, only when Java is absent.

The local run comes first, before the cluster starts: the driver's class-data-sharing archive
(rq/analytics/session.py) then exists (that run writes it into an empty cache), and the master,
worker and executor JVMs, which `rq analytics` does not start, map it too (test-only options,
`-Xshare:auto`: a missing or mismatching archive is ignored) and start with about half the CPU.

All three runs come from one driver process (DRIVER), as `rq analytics` makes them
(rq.analytics.job.execute for the local one; the two cluster runs share one session, so one
application and one executor): one driver JVM, not three, and one executor, not two.  The
command line itself (`rq analytics --master`, its output and exit status) is tested in
tests/test_analytics_e2e.py.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from rq.events import encode_event
from rqtest import REPO, free_port, make_root, wait_for

pytestmark = [pytest.mark.timeout(900),
              pytest.mark.skipif(shutil.which("java") is None,
                                 reason="Java 17+ is not installed: Spark cannot run")]
MASTER = "org.apache.spark.deploy.master.Master"
WORKER = "org.apache.spark.deploy.worker.Worker"
T0 = 1767225600  # 2026-01-01T00:00:00Z
VOLATILE = ("run_id", "generated_at", "duration_s", "stages_s", "master", "compaction")
# Every JVM here (master, worker, the two drivers, the executor) works on a tiny input for
# seconds: SPARK.md's warm-up setting (serial collector, no C2 compiler threads) saves them
# CPU on a 2-core machine shared with the other test workers (issue 14 section 4).  Both runs
# get the same settings, so the comparison of their results is unchanged.
JVM_OPTS = "-XX:+UseSerialGC -XX:TieredStopAtLevel=1"
JOB_CONF = (f"spark.driver.extraJavaOptions={JVM_OPTS}",
            f"spark.executor.extraJavaOptions={JVM_OPTS}",
            "spark.sql.shuffle.partitions=2", "spark.default.parallelism=2")


def write_history(tree: Path) -> int:
    """Three queues over two days: done, resent, err, recovered and unfinished messages, plus a
    torn tail.  Returns the number of events."""
    n = 0
    files: dict[Path, Any] = {}

    def emit(queue: str, msg: str, ts: float, frm: str | None, to: str,
             status: str | None = None, duration: float | None = None) -> None:
        nonlocal n
        import time
        day = time.strftime("%Y%m%d", time.gmtime(ts))
        path = tree / "log" / "events" / day / f"{queue}.jsonl"
        if path not in files:
            path.parent.mkdir(parents=True, exist_ok=True)
            files[path] = open(path, "ab")
        files[path].write(encode_event({
            "ts": round(ts, 3), "host": "h", "queue": queue, "msg_id": msg, "from": frm,
            "to": to, "status": status, "count": 0, "pid": None, "exit_code": None,
            "duration": duration}))
        n += 1

    for qi, queue in enumerate(("alpha", "beta", "gamma")):
        for i in range(300):
            msg, t = f"m{i}", T0 + i * 577.3 + qi * 13.1
            emit(queue, msg, t, None, "prep")
            emit(queue, msg, t, "prep", "que")
            emit(queue, msg, t + i % 7, "que", "run")
            kind = i % 10
            run = 0.25 + (i * 37 % 101) / 10
            if kind == 8:                   # resend, then done
                emit(queue, msg, t + i % 7 + run, "run", "que", "again", run)
                emit(queue, msg, t + i % 7 + run + 30, "que", "run")
                emit(queue, msg, t + i % 7 + 2 * run + 30, "run", "done", "ok", run)
            elif kind == 9 and i % 20 == 9:  # restarted queue, then err
                emit(queue, msg, t + i % 7 + run, "run", "que", "QUEUE RESTARTED - MOVING TO QUE")
                emit(queue, msg, t + i % 7 + run + 1, "que", "run")
                emit(queue, msg, t + i % 7 + 2 * run + 1, "run", "err", f"boom {i % 3}", run)
            elif kind == 9:                 # still running at the end
                pass
            else:
                emit(queue, msg, t + i % 7 + run, "run", "err" if kind == 7 else "done",
                     "bad" if kind == 7 else "ok", run)
    for f in files.values():
        f.close()
    with open(tree / "log" / "events" / "20260101" / "alpha.jsonl", "ab") as f:
        f.write(b'{"crc32":"0000')
    return n


def driver_archive() -> tuple[str, Path | None]:
    """JVM options that map the driver's CDS archive, and the stable empty conf dir its class
    path starts with (the cluster's JVMs need the same class path); nothing with CDS off."""
    from rq.analytics import session
    cache = session.cds_dir(os.environ)
    if cache is None:
        return "", None
    key = session.cds_key(session.check_java(os.environ), os.environ)
    return f"-XX:SharedArchiveFile={cache}/{key}.jsa -Xshare:auto", Path(cache, "conf")


# The driver: argv root, input, the local run's output and conf (JSON).  It prints the local
# run's result, reads the master URL, output and conf (one JSON line) from stdin, runs twice
# on that master in one session and prints both results; one JSON line per result.
DRIVER = """
import json, sys, time
from rq.analytics import job, session
root, data, out, conf = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])

def result(final):
    return {name: json.load(open(f"{final}/{name}.json")) for name in ("summary", "hourly")}

final, _ = job.execute(root, {"input": data, "output": out, "master": "local[2]",
                              "conf": conf, "full": True})
print(json.dumps(result(final)), flush=True)
master, out, conf = json.loads(sys.stdin.readline())
opts = job.parse_options(root, {"input": data, "output": out, "master": master, "conf": conf},
                         time.time())
with session.spark_session(master, opts.conf) as spark:
    for _ in range(2):
        final, _ = job.run(spark, opts)
        print(json.dumps(result(final)), flush=True)
"""


@pytest.fixture
def local_run(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """The history, a root, the driver process and its `local[2]` full recompute (the
    reference), made before the cluster starts."""
    root = make_root(tmp_path)
    data = tmp_path / "history"
    events = write_history(data)
    with subprocess.Popen([sys.executable, "-c", DRIVER, str(root), str(data),
                           str(tmp_path / "out-local"), json.dumps(JOB_CONF)],
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, env=dict(os.environ, PYTHONPATH=str(REPO)),
                          cwd=str(root)) as driver:
        try:
            yield {"events": events, "driver": driver,
                   "result": read_result(driver)}
        finally:
            if driver.poll() is None:
                driver.kill()


def read_result(driver: subprocess.Popen[str]) -> dict[str, Any]:
    """The driver's next result; its stderr (the JVM's output goes to a log) if it ended."""
    assert driver.stdout is not None and driver.stderr is not None
    line = driver.stdout.readline()
    if not line:
        driver.wait(timeout=60)
        raise AssertionError(f"the driver ended ({driver.returncode}): {driver.stderr.read()}")
    return json.loads(line)


@pytest.fixture
def cluster(tmp_path: Path, local_run: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """A standalone master and one worker (2 cores, 2 GiB) on 127.0.0.1; yields the master URL
    and the executors' JVM options."""
    import pyspark
    home = Path(pyspark.__file__).parent
    daemon = home / "sbin" / "spark-daemon.sh"
    assert daemon.exists(), f"{daemon} missing from the pyspark installation"
    log4j = tmp_path / "log4j2.properties"
    log4j.write_text("rootLogger.level = error\n")
    cds, conf_dir = driver_archive()
    if conf_dir is None:
        conf_dir = tmp_path / "spark-conf"
        conf_dir.mkdir()
    jvm_opts = f"{JVM_OPTS} {cds} -Dlog4j2.configurationFile=file:{log4j}"
    env = dict(os.environ, SPARK_HOME=str(home), SPARK_CONF_DIR=str(conf_dir),
               SPARK_LOG_DIR=str(tmp_path / "spark-logs"), SPARK_PID_DIR=str(tmp_path / "pids"),
               SPARK_WORKER_DIR=str(tmp_path / "work"), SPARK_LOCAL_IP="127.0.0.1",
               SPARK_IDENT_STRING=f"rqtest{os.getpid()}", SPARK_DAEMON_JAVA_OPTS=jvm_opts)
    port, ui, worker_ui = free_port(), free_port(), free_port()
    url = f"spark://127.0.0.1:{port}"

    def sbin(*args: str) -> None:
        subprocess.run(["bash", str(daemon), *args], env=env, check=True, timeout=120,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def master_json() -> dict[str, Any] | None:
        try:
            return requests.get(f"http://127.0.0.1:{ui}/json/", timeout=5).json()
        except (requests.RequestException, ValueError):
            return None

    sbin("start", MASTER, "1", "--host", "127.0.0.1", "--port", str(port),
         "--webui-port", str(ui))
    try:
        # The worker starts at once, beside the master's JVM: it retries its registration
        # until the master listens, so the two JVM start-ups overlap.
        sbin("start", WORKER, "1", url, "--host", "127.0.0.1", "--cores", "2", "--memory", "2g",
             "--webui-port", str(worker_ui))
        wait_for(lambda: (master_json() or {}).get("status") == "ALIVE", 120, 0.5,
                 what="the Spark master to be ALIVE")
        wait_for(lambda: any(w.get("state") == "ALIVE"
                             for w in (master_json() or {}).get("workers", [])), 120, 0.5,
                 what="the Spark worker to register")
        yield url, jvm_opts
        apps = (master_json() or {}).get("completedapps", [])
        assert any(a.get("name") == "rq-analytics" for a in apps), apps  # it really ran there
    finally:
        for cls in (WORKER, MASTER):
            subprocess.run(["bash", str(daemon), "stop", cls, "1"], env=env, timeout=120,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def same(a: Any, b: Any) -> bool:
    """Equal, floats to 1e-6 (sums may be added in another order on another executor)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, float) or isinstance(b, float):
        return a == pytest.approx(b, rel=1e-9, abs=1e-6)
    return bool(a == b)


def test_standalone_cluster_result_equals_local_run(tmp_path: Path, local_run: dict[str, Any],
                                                    cluster: tuple[str, str]) -> None:
    """Issue 19: the cluster compacts the finished days (first run) and then reads them back
    (second run); both equal a local full recompute from the raw event log."""
    events, local = local_run["events"], local_run["result"]
    master, executor_opts = cluster
    cluster_conf = (*(c for c in JOB_CONF if not c.startswith("spark.executor.")),
                    f"spark.executor.extraJavaOptions={executor_opts}",
                    "spark.executor.memory=1g", "spark.cores.max=2")
    driver = local_run["driver"]
    assert driver.stdin is not None and driver.stderr is not None
    driver.stdin.write(json.dumps([master, str(tmp_path / "out-cluster"), cluster_conf]) + "\n")
    driver.stdin.close()
    remote, again = read_result(driver), read_result(driver)
    assert driver.wait(timeout=120) == 0 and driver.stderr.read() == ""
    assert remote["summary"]["master"] == master
    assert local["summary"]["compaction"]["mode"] == "full"
    assert remote["summary"]["compaction"]["days_compacted_now"] == 2
    assert again["summary"]["compaction"]["days_compacted_now"] == 0
    assert again["summary"]["compaction"]["days_read"] == 2
    assert local["summary"]["lines"] == {"read": events + 1, "valid": events, "skipped": 1,
                                         "skipped_by_reason": {"torn": 1, "layout": 0,
                                                               "crc": 0, "json": 0}}
    assert local["summary"]["total"]["finished"]["done"] > 0
    for result in (local, remote, again):
        for key in VOLATILE:
            result["summary"].pop(key)
    for result in (remote, again):
        assert same(local["summary"], result["summary"])
        assert same(local["hourly"], result["hourly"])
