"""The Spark session of the analytics job (issue 5): quiet, fast, one per process.

Owns everything that must be decided before the JVM starts: the Java check (one clear error when
Java 17+ is missing), the environment (`SPARK_LOCAL_IP`, `SPARK_CONF_DIR` pointing at a private
`log4j2.properties` at level error, `PYSPARK_PYTHON`), the class-data-sharing archive of the
driver JVM (`cds_options`), the default configuration of docs/guide/analytics.md (UI and progress
bar off, UTC, small shuffles; the collector and JIT by the input's size: `driver_java_options`),
and keeping the JVM's own stdout/stderr out of the user's terminal: while the gateway starts, file
descriptors 1 and 2 point at a log file, so the JVM inherits that file; ours are restored right
after.
"""

from __future__ import annotations

import glob
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlparse

from rq.analytics import localfs
from rq.errors import RQError
from rq.fsops import unlink_quiet

MIN_JAVA = 17
LOG4J2 = """\
# Written by rq.analytics: Spark and Hadoop log nothing below error on the user's terminal.
rootLogger.level = error
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{yy/MM/dd HH:mm:ss} %p %c{1}: %m%n%ex
"""


class AnalyticsError(RQError):
    """A failure of the analytics job, printed as one line (`rq analytics: …`)."""


def java_major(version_text: str) -> int | None:
    """The major version in `java -version` output: `"17.0.15"` → 17, `"1.8.0_392"` → 8."""
    m = re.search(r'version "(\d+)(?:\.(\d+))?', version_text)
    if not m:
        return None
    major = int(m[1])
    return int(m[2] or 0) if major == 1 else major


def java_command(env: Mapping[str, str]) -> str | None:
    home = env.get("JAVA_HOME")
    if home and os.access(os.path.join(home, "bin", "java"), os.X_OK):
        return os.path.join(home, "bin", "java")
    return shutil.which("java", path=env.get("PATH"))


def check_java(env: Mapping[str, str]) -> str:
    """Raise AnalyticsError with one line when Java 17+ is not there (issue 5 set-up); return
    the output of `java -version`."""
    java = java_command(env)
    if java is None:
        raise AnalyticsError(f"Java {MIN_JAVA} or newer is required but `java` was not found "
                             "(install e.g. openjdk-17-jre-headless or set JAVA_HOME)")
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=60,
                             env=dict(env)).stderr
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise AnalyticsError(f"cannot run {java} -version: {exc}") from None
    major = java_major(out)
    if major is None or major < MIN_JAVA:
        first = out.strip().splitlines()[0] if out.strip() else "no version output"
        raise AnalyticsError(f"Java {MIN_JAVA} or newer is required, found: {first}")
    return out


def driver_memory() -> str:
    """A quarter of the physical memory, between 1 and 8 GiB (`spark.driver.memory`)."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        total = 8 << 30
    return f"{max(1, min(8, total // 4 >> 30))}g"


# The driver JVM's collector and JIT by the size of the run's input (docs/guide/analytics.md,
# measured in docs/benchmarks.md): the parallel collector and the full JIT (C1 then C2) check
# and aggregate a large history faster, but their GC and C2 compiler threads cost more CPU than
# a small run's whole work; the serial collector with C1 only (SPARK.md's warm-up setting) costs
# half as much on tiny to ~20 MB inputs and the same at ~190 MB of raw event log (or ~70 MB of
# compacted Parquet, which holds about 3x the work per byte); above that it loses.
THROUGHPUT_OPTIONS = "-XX:+UseParallelGC"
WARMUP_OPTIONS = "-XX:+UseSerialGC -XX:TieredStopAtLevel=1"
WARMUP_BYTES = 128 << 20  # of raw event log, a Parquet byte counting PARQUET_WEIGHT
PARQUET_WEIGHT = 3
# A collector or JIT tier named in the user's spark.driver.defaultJavaOptions is theirs: ours
# would follow it on the command line (two collectors stop the JVM; a later tier flag wins).
USER_GC = re.compile(r"-XX:\+Use\w*GC\b")
USER_JIT = re.compile(r"-XX:(?:[+-]TieredCompilation\b|TieredStopAtLevel=|CICompilerCount=)")


def small_local(master: str, input_bytes: int | None, limit: int) -> bool:
    """A local master and an input known (before the JVM starts) to be below `limit`."""
    return master.startswith("local") and input_bytes is not None and input_bytes < limit


def driver_java_options(master: str, input_bytes: int | None, user_default: str = "") -> str:
    """The default `spark.driver.extraJavaOptions`: the warm-up options for a local master
    whose input is known (`input_bytes`, before the JVM starts) and below WARMUP_BYTES, else
    the throughput options (a cluster master, an input of unknown size, a large one); without
    the collector or the JIT option when `user_default` (the user's defaultJavaOptions) names
    one of its own."""
    small = small_local(master, input_bytes, WARMUP_BYTES)
    options = WARMUP_OPTIONS if small else THROUGHPUT_OPTIONS
    return " ".join(o for o in options.split()
                    if not ((USER_GC.search(user_default) and USER_GC.match(o))
                            or (USER_JIT.search(user_default) and USER_JIT.match(o))))


# Tiny inputs by their size: Spark compiles generated Java (Janino) for each whole stage and for
# each projection, ordering and predicate of every query it plans, and a run is many small
# queries: over a tiny input it spends more CPU compiling (and looking up the names the generated
# code refers to in every jar of its class path) than evaluating.  Below TINY_BYTES a local run
# evaluates interpreted, Spark's own path for code it cannot compile, and plans each query once
# (adaptive execution off: it runs every shuffle stage as a job of its own and replans after it,
# which pays off for skewed or large shuffles, not for a few partitions of kilobytes).  Same
# results.  Measured (docs/benchmarks.md): over the incremental tests' history (a few thousand
# events) interpreted evaluation 1.2 CPU-s cheaper a run in the JVM (-30 %), level at 2.5 MB of
# event log, 5 % dearer at 25 MB; adaptive execution off on top, an incremental and a full run
# 5.7 against 7.1 CPU-s (-20 %, 20 Spark jobs against 38 and 9 against 22).
TINY_BYTES = 4 << 20  # of raw event log, a Parquet byte counting PARQUET_WEIGHT
TINY_CONF = {"spark.sql.codegen.wholeStage": "false",
             "spark.sql.codegen.factoryMode": "NO_CODEGEN",
             "spark.sql.adaptive.enabled": "false"}


# Cached tables (the facts' value rows, a full run's message table) kept as they are rather
# than encoded column by column: in local mode the driver's heap is a quarter of the RAM and
# holds them either way, and encoding them was a tenth of the facts' query (its statistics
# gathered value by value): 13.4 against 14.6-15.1 s over 10 M events' state, warm
# (docs/benchmarks.md, nineteenth session).  A cluster's executors keep Spark's default.
LOCAL_CONF = {"spark.sql.inMemoryColumnarStorage.compressed": "false"}


def default_conf(master: str, tmpdir: str, input_bytes: int | None = None,
                 user_default: str = "") -> dict[str, str]:
    """The quiet, fast configuration (SPARK.md); `--conf` values override it.  `input_bytes`
    (None: unknown) and the user's defaultJavaOptions pick the driver's JVM options;
    `input_bytes` picks the tiny-input settings too (TINY_CONF)."""
    cores = os.cpu_count() or 2
    parallel = "2" if master == "local[1]" else str(max(2, 2 * cores))
    loopback = {"spark.driver.bindAddress": "127.0.0.1", "spark.driver.host": "127.0.0.1"}
    return {
        "spark.app.name": "rq-analytics",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": parallel,
        "spark.default.parallelism": parallel,
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.warehouse.dir": os.path.join(tmpdir, "warehouse"),
        "spark.local.dir": os.path.join(tmpdir, "local"),
        # In local mode the driver is the executor: a quarter of the RAM (1-8 GiB) keeps the
        # per-message table and the hourly percentile digests in memory.
        "spark.driver.memory": driver_memory(),
        "spark.driver.extraJavaOptions": driver_java_options(master, input_bytes, user_default),
        "spark.sql.sources.parallelPartitionDiscovery.threshold": "100000",
        "spark.sql.files.openCostInBytes": "65536",
        "spark.sql.adaptive.enabled": "true",
        # Aggregations whose input is already sorted by their keys (the per-message table after
        # its window) stream as sort aggregates instead of hashing every key.
        "spark.sql.execution.replaceHashWithSortAgg": "true",
        # Hash aggregates of objects (percentile digests, lists) fall back to sorting their
        # input after 128 keys by default; the hourly percentiles have ~100 queues x 720 hours.
        "spark.sql.objectHashAggregate.sortBased.fallbackThreshold": "1000000",
        "spark.log.level": "ERROR",
        **(LOCAL_CONF if master.startswith("local") else {}),
        **(TINY_CONF if small_local(master, input_bytes, TINY_BYTES) else {}),
        **(loopback if is_loopback(master) else {}),
    }


# ---------------------------------------------------------------- class data sharing
# Starting the driver JVM loads many thousands of classes from Spark's jars; a dynamic CDS
# archive of them (Java 13+: -XX:ArchiveClassesAtExit on one run, -XX:SharedArchiveFile afterwards)
# halves the CPU of a short run (docs/guide/analytics.md).  The archive is only valid for the same
# JVM and the same class path, so it is named by a hash of both; Java's default -Xshare:auto
# ignores an archive that does not match or cannot be mapped (a warning in the JVM's log) and
# runs without it.  The class path's first entry is SPARK_CONF_DIR: CDS requires a stable,
# empty directory there, so the log4j2 file is named by -Dlog4j2.configurationFile instead.
CDS_ENV = "RQ_ANALYTICS_CDS"  # "0": no archive is used or written
CDS_OPTIONS = ("-Xshare", "SharedArchiveFile", "ArchiveClassesAtExit")
STALE_TMP = 24 * 3600
KEEP_ARCHIVES = 3  # the most recently used; older ones (other Java or pyspark) are removed


def cache_home(env: Mapping[str, str]) -> str:
    """`$XDG_CACHE_HOME/rq`: the archives (analytics-cds/) and the compiled file system
    (analytics-jvm/, rq/analytics/localfs.py)."""
    base = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "rq")


def cds_dir(env: Mapping[str, str]) -> str | None:
    """The cache directory of the archives (`$XDG_CACHE_HOME/rq/analytics-cds`), created with
    its empty `conf` directory; None when disabled or when it cannot be created."""
    if env.get(CDS_ENV, "1") == "0":
        return None
    path = os.path.join(cache_home(env), "analytics-cds")
    try:
        os.makedirs(os.path.join(path, "conf"), exist_ok=True)
    except OSError:
        return None
    return path


def cds_key(java_version: str, env: Mapping[str, str], extra: Iterable[str] = ()) -> str:
    """A hash of what the archive depends on: the JVM (its binary and version) and the class
    path (pyspark's version and jars, SPARK_HOME, SPARK_DIST_CLASSPATH, the `extra` jars)."""
    import pyspark
    h = hashlib.sha256()
    java = java_command(env) or ""
    h.update(f"{os.path.realpath(java)}\0{java_version}\0{pyspark.__version__}\0".encode())
    home = env.get("SPARK_HOME") or os.path.dirname(pyspark.__file__)
    h.update(f"{home}\0{env.get('SPARK_DIST_CLASSPATH', '')}\0".encode())
    for jar in [*sorted(glob.glob(os.path.join(home, "jars", "*"))), *extra]:
        try:
            st = os.stat(jar)
        except OSError:
            continue
        h.update(f"{jar}\0{st.st_size}\0{st.st_mtime_ns}\0".encode())
    return h.hexdigest()[:24]


def cds_options(directory: str, key: str, user_options: str, write: bool = True
                ) -> tuple[str, str | None]:
    """The JVM options for the archive `key` in `directory` and, when this run writes it, the
    temporary file it goes to (renamed by `finish_cds` once the JVM has exited cleanly).
    Nothing when the user's own options already decide about class data sharing, and nothing
    when the archive is missing and this run is not to write it (`write` False, or another
    live process is writing it: runs started together dump one archive, not one each)."""
    if any(opt in user_options for opt in CDS_OPTIONS):
        return "", None
    for old in glob.glob(os.path.join(directory, "*.tmp")) + glob.glob(
            os.path.join(directory, "*.claim")):  # left by killed runs (~180 MB each)
        if leftover(old):
            unlink_quiet(old)
    archive = os.path.join(directory, key + ".jsa")
    if os.path.exists(archive):
        try:
            os.utime(archive)  # its mtime is its last use (prune_archives)
        except OSError:
            pass
        return f"-XX:SharedArchiveFile={archive} -Xshare:auto", None
    if not write:
        return "", None
    claim = os.path.join(directory, key + ".claim")  # our pid while our JVM runs
    try:
        fd = os.open(claim, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except OSError:
        return "", None  # another live process writes this archive (or no write access)
    try:
        os.write(fd, b"%d" % os.getpid())
    finally:
        os.close(fd)
    tmp = os.path.join(directory, f"{key}.{os.getpid()}.tmp")
    # The dump lists every class it cannot archive as a warning: thousands of log lines.
    return f"-XX:ArchiveClassesAtExit={tmp} -Xlog:cds=error,cds+dynamic=error", tmp


def leftover(path: str) -> bool:
    """Is this claim (KEY.claim, holding a pid) or temporary archive (KEY.PID.tmp) left by a
    run that is gone, or older than STALE_TMP?"""
    from rq.proc import alive
    try:
        if time.time() - os.stat(path).st_mtime > STALE_TMP:
            return True
        if path.endswith(".claim"):
            with open(path, "rb") as fh:
                text = fh.read(16)
        else:
            text = os.path.basename(path).split(".")[1].encode()
        return not alive(int(text))
    except (OSError, ValueError, IndexError):
        return False


def finish_cds(tmp: str) -> None:
    """End the driver JVM (the archive is written when it exits) and move a complete archive
    into place atomically; a later session in this process starts a new JVM."""
    from pyspark import SparkContext
    gateway = SparkContext._gateway
    proc = getattr(gateway, "proc", None)
    SparkContext._gateway = None
    SparkContext._jvm = None
    rc = None
    if gateway is not None:
        try:
            gateway.shutdown()
        except Exception:  # noqa: BLE001 - the JVM ends below either way
            pass
    if proc is not None:
        try:
            if proc.stdin:
                proc.stdin.close()  # the gateway exits on EOF of its stdin
            rc = proc.wait(timeout=300)
        except (OSError, subprocess.TimeoutExpired):
            rc = None
    directory, key = os.path.dirname(tmp), os.path.basename(tmp).split(".")[0]
    try:
        if rc == 0 and os.path.getsize(tmp) > 0:
            os.replace(tmp, os.path.join(directory, key + ".jsa"))
            prune_archives(directory)
        else:
            os.unlink(tmp)
    except OSError:
        pass
    unlink_quiet(os.path.join(directory, key + ".claim"))


def prune_archives(directory: str) -> None:
    """Keep the KEEP_ARCHIVES most recently used archives (a running JVM keeps its mapping)."""
    def mtime(path: str) -> float:
        try:
            return os.stat(path).st_mtime
        except OSError:
            return 0.0
    archives = sorted(glob.glob(os.path.join(directory, "*.jsa")), key=mtime, reverse=True)
    for old in archives[KEEP_ARCHIVES:]:
        unlink_quiet(old)


def prepare_env(conf_dir: str, env: dict[str, str], loopback: bool) -> str:
    """Set what the JVM reads at start-up (SPARK.md), keeping values the user set; write the
    log4j2 configuration to `conf_dir` and return its path."""
    log4j = os.path.join(conf_dir, "log4j2.properties")
    with open(log4j, "w", encoding="utf-8") as f:
        f.write(LOG4J2)
    if loopback:
        env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    env["SPARK_CONF_DIR"] = conf_dir
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    env.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    return log4j


@contextmanager
def jvm_output_to(path: str) -> Iterator[None]:
    """Point fds 1 and 2 at `path` while the JVM is launched (it inherits them)."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
    try:
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        yield
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for f in (fd, *saved):
            os.close(f)


def is_loopback(master: str) -> bool:
    """Local masters and masters on this machine's loopback keep the driver on 127.0.0.1."""
    host = urlparse(master).hostname if "://" in master else None
    return master.startswith("local") or host in ("127.0.0.1", "localhost", "::1")


@contextmanager
def spark_session(master: str, conf: Mapping[str, str], *, log_path: str | None = None,
                  input_bytes: int | None = None, cds_write: bool = True) -> Iterator[Any]:
    """A SparkSession for `master` with the default conf plus `conf`, stopped (and its temp
    directory removed) on exit.  The JVM's own output goes to `log_path` (default: a file in
    the temp dir); `input_bytes` is what the run will read, when known (driver_java_options);
    `cds_write` False: a missing class-data archive is not written by this JVM (a session
    that lives long would write it only when it ends).  Raises AnalyticsError when Java or
    pyspark is missing."""
    version = check_java(os.environ)
    try:
        from pyspark.sql import SparkSession
    except ImportError:
        raise AnalyticsError("pyspark is not installed (run scripts/bootstrap)") from None
    tmpdir = tempfile.mkdtemp(prefix="rq-analytics-")
    dump: list[str] = []
    try:
        try:
            spark = _start(SparkSession, master, conf, tmpdir, log_path, version, dump,
                           input_bytes, cds_write)
        except BaseException:
            if dump:  # no JVM will write it: let another run claim the archive
                finish_cds(dump[0])
            raise
        try:
            yield spark
        finally:
            spark.stop()
            if dump:
                finish_cds(dump[0])
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)


# The file system's jar on the running driver JVM's class path (localfs), kept for later
# sessions of this process: the class path is fixed when the JVM starts.
_jvm_fs_jar: str | None = None


def _start(session_cls: Any, master: str, conf: Mapping[str, str], tmpdir: str,
           log_path: str | None, java_version: str, dump: list[str],
           input_bytes: int | None = None, cds_write: bool = True) -> Any:
    conf_dir = os.path.join(tmpdir, "conf")
    os.makedirs(conf_dir)
    log4j = prepare_env(conf_dir, os.environ, is_loopback(master))  # type: ignore[arg-type]
    from pyspark import SparkContext
    global _jvm_fs_jar
    if SparkContext._gateway is None:  # else: the JVM runs already, with its class path
        _jvm_fs_jar = (localfs.jar(os.path.join(cache_home(os.environ), "analytics-jvm"),
                                   java_command(os.environ), java_version, os.environ)
                       if localfs.wanted(master, conf) else None)
    fs_conf = localfs.conf(master, conf, _jvm_fs_jar)
    settings = {**default_conf(master, tmpdir, input_bytes,
                               conf.get("spark.driver.defaultJavaOptions", "")),
                **fs_conf, **conf}
    jvm_opts = [f"-Dlog4j2.configurationFile=file:{log4j}"]
    cache = cds_dir(os.environ)
    if cache is not None and SparkContext._gateway is None:
        os.environ["SPARK_CONF_DIR"] = os.path.join(cache, "conf")  # stable and empty
        user = " ".join(settings.get(k, "") for k in (
            "spark.driver.extraJavaOptions", "spark.driver.defaultJavaOptions"))
        archive = cds_key(java_version, os.environ, [_jvm_fs_jar] if _jvm_fs_jar else [])
        cds, tmp = cds_options(cache, archive, user, cds_write)
        jvm_opts.append(cds)
        if tmp:
            dump.append(tmp)
    if settings.get("spark.driver.defaultJavaOptions"):
        jvm_opts.append(settings["spark.driver.defaultJavaOptions"])
    settings["spark.driver.defaultJavaOptions"] = " ".join(o for o in jvm_opts if o)
    builder = session_cls.builder.master(master)
    for key, value in settings.items():
        builder = builder.config(key, value)
    with jvm_output_to(log_path or os.path.join(tmpdir, "spark.log")):
        spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark
