"""The analytics driver's local file system (issue 19): Hadoop's, without a child per chmod.

Hadoop without its native library (pip's pyspark ships none) sets the mode of every local file
and directory it creates by running `chmod` in a child process.  The first incremental run
writes some 3,000 (day, queue) partitions, each a data file, its .crc and their directories:
about 9,000 children, 19 s of a 138 s run (docs/benchmarks.md, thirteenth session).
rq/analytics/jvm/RqLocalFileSystem.java is Hadoop's LocalFileSystem with the mode set by the
JVM itself; everything else (checksums, renames, listings) is Hadoop's code.

`jar` compiles it once per (source, JDK, Hadoop jars) with the JDK's `javac` into a jar in the
user's cache, `$XDG_CACHE_HOME/rq/analytics-jvm/`; the first process to finish links its jar into
place and later ones use that one, so a jar never changes under a class-data-sharing archive
that was dumped with it (the archive records its size and mtime).  `conf` names the jar and
the class for a local master's driver.  Without a JDK (a JRE has no javac), without a writable
cache, or when the compile fails, Hadoop's own file system is used: slower, same files.
Cluster masters keep Hadoop's file system: their executors write the files and do not have
the jar (a cluster session in a JVM that a local one started names Hadoop's explicitly).  A
user's `spark.hadoop.fs.file.impl` or `spark.driver.extraClassPath` wins.
"""

from __future__ import annotations

import glob
import hashlib
import os
import subprocess
import tempfile
import zipfile
from collections.abc import Mapping

FS_CLASS = "rq.analytics.RqLocalFileSystem"
HADOOP_CLASS = "org.apache.hadoop.fs.LocalFileSystem"
SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "jvm",
                      "RqLocalFileSystem.java")
JAVA_RELEASE = "17"  # the oldest Java that pyspark 4 runs on
COMPILE_TIMEOUT = 300
FS_KEY = "spark.hadoop.fs.file.impl"
USER_KEYS = (FS_KEY, "spark.driver.extraClassPath")


def javac_for(java: str | None) -> str | None:
    """The `javac` beside this `java` (the same JDK), or None for a JRE."""
    if not java:
        return None
    javac = os.path.join(os.path.dirname(os.path.realpath(java)), "javac")
    return javac if os.access(javac, os.X_OK) else None


def spark_jars(env: Mapping[str, str]) -> str:
    import pyspark
    home = env.get("SPARK_HOME") or os.path.dirname(pyspark.__file__)
    return os.path.join(home, "jars")


def key(source: bytes, javac: str, java_version: str, jars: str) -> str:
    """What the compiled classes depend on: the source, the JDK, and Hadoop's jars."""
    h = hashlib.sha256(source)
    h.update(f"\0{javac}\0{java_version}\0".encode())
    for jar in sorted(glob.glob(os.path.join(jars, "hadoop-*.jar"))):
        h.update(f"{os.path.basename(jar)}\0{os.path.getsize(jar)}\0".encode())
    return h.hexdigest()[:24]


def jar(cache: str, java: str | None, java_version: str, env: Mapping[str, str]
        ) -> str | None:
    """The path of the compiled file system's jar under `cache`, compiled now when missing;
    None when it cannot be had (no javac, no cache, a failed compile)."""
    javac = javac_for(java)
    if javac is None:
        return None
    jars = spark_jars(env)
    try:
        with open(SOURCE, "rb") as f:
            source = f.read()
        path = os.path.join(cache, f"fs-{key(source, javac, java_version, jars)}.jar")
        if os.path.exists(path):
            return path
        os.makedirs(cache, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=cache, prefix="compile-") as tmp:
            done = subprocess.run(
                [javac, "--release", JAVA_RELEASE, "-nowarn", "-proc:none", "-encoding", "UTF-8",
                 "-cp", os.path.join(jars, "*"), "-d", tmp, SOURCE],
                capture_output=True, timeout=COMPILE_TIMEOUT, env=dict(env))
            if done.returncode != 0:
                return None
            built = os.path.join(tmp, "fs.jar")
            with zipfile.ZipFile(built, "w") as z:
                z.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\r\n\r\n")
                for cls in sorted(glob.glob(os.path.join(tmp, "rq", "analytics", "*.class"))):
                    z.write(cls, os.path.relpath(cls, tmp))
            # a torn jar would fail every later run (not load.fsync_path: load imports
            # session, which imports this module, and the package has no import cycles)
            fd = os.open(built, os.O_RDONLY | os.O_CLOEXEC)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            try:
                os.link(built, path)  # never over a jar another run has linked already
            except FileExistsError:
                pass
        return path
    except (OSError, subprocess.SubprocessError):
        return None


def wanted(master: str, user_conf: Mapping[str, str]) -> bool:
    """A local master, and none of the user's settings that decide the same."""
    return master.startswith("local") and not any(k in user_conf for k in USER_KEYS)


def conf(master: str, user_conf: Mapping[str, str], jar_path: str | None) -> dict[str, str]:
    """The settings of a session whose driver JVM has `jar_path` on its class path (None: not
    there).  A local master gets the file system.  Any other session in that JVM names Hadoop's
    own again: spark-submit made every setting of the session that started the JVM a system
    property, which later sessions inherit, and a cluster's executors lack the jar."""
    if jar_path is None:
        return {}
    if not wanted(master, user_conf):
        return {} if FS_KEY in user_conf else {FS_KEY: HADOOP_CLASS}
    return {"spark.driver.extraClassPath": jar_path, FS_KEY: FS_CLASS}
