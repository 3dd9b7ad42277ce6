"""The driver JVM's options by the size of the analytics input (rq/analytics/session.py
`driver_java_options`, rq/analytics/compact.py `input_bytes`; docs/guide/analytics.md).

A local run whose input is small gets SPARK.md's warm-up options (serial collector, C1 only); a
large or unknown input, a cluster master, or the user's own options keep the throughput
default.  The size is what the run will read, known before the JVM starts: raw event-log files,
and compacted days as their Parquet.  Two real `rq analytics` processes show the options on the
driver JVM's command line (/proc/PID/cmdline): the warm-up ones for a tiny root, the user's own
`--conf spark.driver.extraJavaOptions` when given.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rqtest import REPO, make_root, wait_for

from rq.analytics import compact, manifest
from rq.analytics.session import (LOCAL_CONF, PARQUET_WEIGHT, THROUGHPUT_OPTIONS, TINY_BYTES,
                                  TINY_CONF, WARMUP_BYTES, WARMUP_OPTIONS, default_conf,
                                  driver_java_options)
from rq.events import encode_event

JAVA = shutil.which("java") is not None
DAY = 86400


def test_small_local_inputs_get_the_warmup_options_and_the_rest_the_throughput_ones(
        tmp_path: Path) -> None:
    assert WARMUP_OPTIONS == "-XX:+UseSerialGC -XX:TieredStopAtLevel=1"
    assert THROUGHPUT_OPTIONS == "-XX:+UseParallelGC"
    assert (WARMUP_BYTES, PARQUET_WEIGHT) == (128 << 20, 3)  # docs/benchmarks.md, 2026-11-27
    for master in ("local[*]", "local[2]", "local"):
        assert driver_java_options(master, 0) == WARMUP_OPTIONS
        assert driver_java_options(master, WARMUP_BYTES - 1) == WARMUP_OPTIONS
        assert driver_java_options(master, WARMUP_BYTES) == THROUGHPUT_OPTIONS
        assert driver_java_options(master, 50 * WARMUP_BYTES) == THROUGHPUT_OPTIONS
        assert driver_java_options(master, None) == THROUGHPUT_OPTIONS  # size unknown
    # A cluster's driver: today's default, whatever the size.
    assert driver_java_options("spark://127.0.0.1:7077", 10) == THROUGHPUT_OPTIONS
    assert driver_java_options("yarn", 10) == THROUGHPUT_OPTIONS
    # A collector or JIT tier in the user's defaultJavaOptions is theirs: the default adds no
    # second one (two collectors stop the JVM; a later tier option would override theirs).
    assert driver_java_options("local[*]", 10, "-Xss4m -XX:+UseG1GC") == \
        "-XX:TieredStopAtLevel=1"
    assert driver_java_options("local[*]", WARMUP_BYTES, "-XX:+UseSerialGC") == ""
    for jit in ("-XX:TieredStopAtLevel=4", "-XX:-TieredCompilation", "-XX:CICompilerCount=2"):
        assert driver_java_options("local[*]", 10, jit) == "-XX:+UseSerialGC", jit
        assert driver_java_options("local[*]", WARMUP_BYTES, jit) == THROUGHPUT_OPTIONS, jit
    assert driver_java_options("local[*]", 10, "-XX:+UseSerialGC -XX:TieredStopAtLevel=1") == ""
    assert driver_java_options("local[*]", 10, "-Dx=1 -Xss4m -XX:+UseCompressedOops") == \
        WARMUP_OPTIONS
    conf = default_conf("local[2]", str(tmp_path), 1000)
    assert conf["spark.driver.extraJavaOptions"] == WARMUP_OPTIONS
    assert default_conf("local[2]", str(tmp_path))["spark.driver.extraJavaOptions"] == \
        THROUGHPUT_OPTIONS


def test_tiny_local_inputs_are_evaluated_interpreted_without_adaptive_plans(tmp_path: Path
                                                                          ) -> None:
    assert TINY_CONF == {"spark.sql.codegen.wholeStage": "false",
                         "spark.sql.codegen.factoryMode": "NO_CODEGEN",
                         "spark.sql.adaptive.enabled": "false"}
    assert TINY_BYTES == 4 << 20  # docs/benchmarks.md, 2026-11-27

    def tiny(master: str, size: int | None) -> bool:
        conf = default_conf(master, str(tmp_path), size)
        picked = {k: conf.get(k) for k in TINY_CONF}
        other = {"spark.sql.codegen.wholeStage": None, "spark.sql.codegen.factoryMode": None,
                 "spark.sql.adaptive.enabled": "true"}  # Spark's own codegen, adaptive plans
        assert picked in (other, TINY_CONF), picked
        return picked == TINY_CONF
    for master in ("local[*]", "local[2]", "local"):
        assert tiny(master, 0) and tiny(master, TINY_BYTES - 1)
        assert not tiny(master, TINY_BYTES)
        assert not tiny(master, None)  # size unknown
    assert not tiny("spark://127.0.0.1:7077", 10) and not tiny("yarn", 10)


def test_local_masters_cache_tables_unencoded() -> None:
    """LOCAL_CONF: the driver's heap holds the cached tables of a local run as they are;
    a cluster's executors keep Spark's encoded cache."""
    key = "spark.sql.inMemoryColumnarStorage.compressed"
    assert LOCAL_CONF == {key: "false"}
    for master in ("local[*]", "local[2]", "local"):
        for size in (None, 10, TINY_BYTES, 1 << 40):
            assert default_conf(master, "/tmp/x", size)[key] == "false", (master, size)
    for master in ("spark://127.0.0.1:7077", "yarn"):
        assert key not in default_conf(master, "/tmp/x", 10)


def write_day(events_dir: Path, day: str, sizes: dict[str, int]) -> None:
    (events_dir / day).mkdir(parents=True)
    for name, size in sizes.items():
        (events_dir / day / f"{name}.jsonl").write_bytes(b"x" * (size - 1) + b"\n")


def test_input_bytes_counts_raw_files_and_fresh_compacted_days_as_their_parquet(
        tmp_path: Path) -> None:
    root = tmp_path / "root"
    events = root / "log" / "events"
    write_day(events, "20260101", {"a": 1000, "b": 200})
    write_day(events, "20260102", {"a": 30})
    (events / "20260102" / "notes.txt").write_bytes(b"y" * 5000)  # not an event file
    write_day(events, "20260103", {"a": 7})
    out = tmp_path / "out"
    assert compact.input_bytes([str(root)], None, None, str(out), False) == 1237
    assert compact.input_bytes([str(events)], None, None, str(out), True) == 1237
    since = 1767225600 + DAY  # 2026-01-02T00:00Z: the first day is not read
    assert compact.input_bytes([str(root)], since, None, str(out), False) == 37
    assert compact.input_bytes([str(root), str(root)], since, since + DAY, str(out), False) \
        == 60
    # A remote input is listed only through the JVM; a missing one fails in the run itself.
    assert compact.input_bytes([str(root), "hdfs://nn/rq"], None, None, str(out), False) is None
    assert compact.input_bytes([str(tmp_path / "nope")], None, None, str(out), False) is None

    # Day 1 compacted (its Parquet: 40 + 2 bytes) and still fresh; day 2 compacted but stale
    # (a queue file grew after): its raw files count.  A per-message state of 9 bytes.  A byte
    # of Parquet counts 3 (PARQUET_WEIGHT): it holds about 3x the work of a raw byte.
    book = manifest.load_manifest(str(out))
    for day, parquet in (("20260101", {"p0": 40, "sub/p1": 2}), ("20260102", {"p0": 3})):
        rel = f"compacted/key/{day}.tok"
        for name, size in parquet.items():
            (out / rel / name).parent.mkdir(parents=True, exist_ok=True)
            (out / rel / name).write_bytes(b"p" * size)
        files = {p.name: manifest.source_record(str(p), p.stat().st_size)
                 for p in (events / day).glob("*.jsonl")}
        manifest.set_day_entry(book, str(events), day, {"dir": rel, "files": files})
    (out / "compacted" / "state.tok").mkdir()
    (out / "compacted" / "state.tok" / "s").write_bytes(b"s" * 9)
    book["state"] = {"dir": "compacted/state.tok", "covers": []}
    Path(manifest.manifest_path(str(out))).write_text(json.dumps(book))
    with open(events / "20260102" / "a.jsonl", "ab") as f:
        f.write(b"late\n")
    assert compact.input_bytes([str(root)], None, None, str(out), False) == \
        3 * (42 + 9) + 35 + 7
    assert compact.input_bytes([str(root)], None, None, str(out), True) == 1242  # --full: raw
    # Retention removed day 1's raw files: its compacted Parquet is still read.
    shutil.rmtree(events / "20260101")
    assert compact.input_bytes([str(root)], None, None, str(out), False) == \
        3 * (42 + 9) + 35 + 7
    # A manifest this code cannot follow: unknown size (the run itself deals with it).
    del book["trees"][manifest.events_key(str(events))]["days"]["20260102"]["files"]
    Path(manifest.manifest_path(str(out))).write_text(json.dumps(book))
    assert compact.input_bytes([str(root)], None, None, str(out), False) is None


def test_input_bytes_of_a_run_on_stored_facts_counts_raw_files_and_a_share_of_the_state(
        tmp_path: Path) -> None:
    """A run on stored facts (unwindowed, facts of this version, no finished day left to
    compact) reads its raw files and scans the state once: raw bytes plus the state's over
    STATE_SCAN_SHARE.  A day due for compaction (the state is then updated), a window or facts
    of another version: the full count (compacted days and state at PARQUET_WEIGHT)."""
    root = tmp_path / "root"
    events = root / "log" / "events"
    write_day(events, "20260101", {"a": 1000})
    write_day(events, "20260102", {"a": 30, "b": 70})
    out = tmp_path / "out"
    book = manifest.load_manifest(str(out))
    rel = "compacted/key/20260101.tok"
    (out / rel).mkdir(parents=True)
    (out / rel / "p0").write_bytes(b"p" * 40)
    files = {p.name: manifest.source_record(str(p), p.stat().st_size)
             for p in (events / "20260101").glob("*.jsonl")}
    manifest.set_day_entry(book, str(events), "20260101", {"dir": rel, "files": files})
    (out / "compacted" / "state.tok").mkdir()
    (out / "compacted" / "state.tok" / "s").write_bytes(b"s" * 800)
    (out / "compacted" / "state.tok.facts").mkdir()
    book["state"] = {"dir": "compacted/state.tok", "covers": [],
                     "facts": "compacted/state.tok.facts",
                     "facts_version": manifest.FACTS_VERSION}
    Path(manifest.manifest_path(str(out))).write_text(json.dumps(book))
    day2 = 1767225600 + DAY
    during, after = day2 + 3600, day2 + 2 * DAY

    def size(since: float | None, now: float) -> int | None:
        return compact.input_bytes([str(root)], since, None, str(out), False, now)

    assert size(None, during) == 100 + 800 // compact.STATE_SCAN_SHARE
    assert size(None, after) == 3 * (40 + 800) + 100           # day 2 due: the state updated
    assert size(day2, during) == 3 * 800 + 100                 # a window: day 1 not read
    assert compact.input_bytes([str(root)], None, None, str(out), True, during) == 1100
    book["state"]["facts_version"] = manifest.FACTS_VERSION - 1
    Path(manifest.manifest_path(str(out))).write_text(json.dumps(book))
    assert size(None, during) == 3 * (40 + 800) + 100


def driver_cmdline(proc: subprocess.Popen[str]) -> list[str]:
    """The command line of the driver JVM among `proc`'s descendants, once it runs (pyspark
    starts bin/spark-class, which runs a launcher JVM and then execs the driver JVM)."""
    def find() -> list[str] | None:
        if proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(f"rq analytics exited ({proc.returncode}) before its JVM was seen: "
                        f"{out}{err}")
        parents: dict[int, int] = {}
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    with open(f"/proc/{entry}/stat") as f:
                        parents[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
                except (OSError, IndexError, ValueError):
                    continue
        for pid in parents:
            up = pid
            while up in parents and up != proc.pid:
                up = parents[up]
            if up != proc.pid or pid == proc.pid:
                continue
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    args = f.read().decode().split("\0")
            except OSError:
                continue
            # Not the spark-class script, nor the launcher JVM that prints the real command.
            if os.path.basename(args[0]) == "java" and "org.apache.spark.deploy.SparkSubmit" in \
                    args and "org.apache.spark.launcher.Main" not in args:
                return args
        return None
    return wait_for(find, 300, interval=0.2, what="the driver JVM of rq analytics")


def run_analytics(root: Path, out: Path, *conf: str, whole: bool = True) -> list[str]:
    """One real `rq analytics` over `root`; the driver JVM's command line.  Not `whole`: the
    run (its process group, the JVM with it) is stopped once that command line is read."""
    args = [arg for item in conf for arg in ("--conf", item)]
    env = dict(os.environ, PYTHONPATH=str(REPO))
    with subprocess.Popen([sys.executable, "-m", "rq.analytics", "--root", str(root),
                           "--output", str(out), *args], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, env=env, cwd=str(root),
                          start_new_session=True) as proc:
        try:
            cmdline = driver_cmdline(proc)
            if not whole:
                return cmdline
            stdout, stderr = proc.communicate(timeout=600)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.communicate()
    assert proc.returncode == 0, stderr
    assert "read 8 lines from 2 files, 0 skipped" in stdout, stdout
    assert (out / "current" / "summary.json").exists()
    return cmdline


@pytest.mark.skipif(not JAVA, reason="Java 17+ is not installed: Spark cannot run")
def test_a_tiny_run_starts_its_jvm_with_the_warmup_options_unless_the_user_chose(
        tmp_path: Path) -> None:
    now = time.time()
    day = time.strftime("%Y%m%d", time.gmtime(now))
    root = make_root(tmp_path)
    (root / "log" / "events" / day).mkdir(parents=True)
    for queue in ("a", "b"):
        with open(root / "log" / "events" / day / f"{queue}.jsonl", "wb") as f:
            for i, (frm, to) in enumerate(((None, "prep"), ("prep", "que"), ("que", "run"),
                                           ("run", "done"))):
                f.write(encode_event({
                    "ts": now - 60 + i, "host": "h1", "queue": queue, "msg_id": "m1",
                    "from": frm, "to": to, "status": "ok" if to == "done" else None,
                    "count": 0, "pid": None, "exit_code": None,
                    "duration": 1.0 if to == "done" else None}))
    cmdline = run_analytics(root, tmp_path / "out1")
    assert "-XX:+UseSerialGC" in cmdline and "-XX:TieredStopAtLevel=1" in cmdline, cmdline
    assert "-XX:+UseParallelGC" not in cmdline, cmdline
    for key, value in TINY_CONF.items():  # spark-submit's --conf pairs
        assert f"{key}={value}" in cmdline, cmdline

    # The user's own options replace the default (the first run showed a whole run works: this
    # one is stopped once its JVM's command line is read).
    cmdline = run_analytics(root, tmp_path / "out2", "spark.driver.extraJavaOptions="
                            "-XX:+UseSerialGC -XX:TieredStopAtLevel=2 -Dwarmup.test=user",
                            whole=False)
    assert "-XX:TieredStopAtLevel=2" in cmdline and "-Dwarmup.test=user" in cmdline, cmdline
    assert not {"-XX:+UseParallelGC", "-XX:TieredStopAtLevel=1"} & set(cmdline), cmdline
