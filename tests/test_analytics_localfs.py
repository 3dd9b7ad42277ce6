"""The analytics driver's local file system (rq/analytics/localfs.py, issue 19).

Hadoop without its native library runs `chmod` in a child process for every local file and
directory it creates.  A local master's driver gets rq/analytics/jvm/RqLocalFileSystem.java,
compiled once into the user's cache, which sets the same modes from the JVM.  The real test
puts a `chmod` that logs its calls first on the PATH (the OS seam), starts a real Spark session
in a fresh cache and writes a partitioned table twice in one JVM: with the session's file system
no `chmod` runs; with Hadoop's own (named in the write's options) the logged calls show the
seam works, and both tables have the same files with the same modes.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from rqtest import REPO

from rq.analytics import localfs

JAVA = shutil.which("java") is not None

RUN = """
import json, os, sys
from rq.analytics import session
out, log = sys.argv[1], sys.argv[2]
hadoops = {"fs.file.impl": "org.apache.hadoop.fs.LocalFileSystem",
           "fs.file.impl.disable.cache": "true"}
with session.spark_session("local[1]", {}, log_path=log) as s:
    fs = s._jvm.org.apache.hadoop.fs.FileSystem.getLocal(s._jsc.hadoopConfiguration())
    df = s.range(0, 60).selectExpr("id % 3 as a", "id % 2 as b", "id")
    df.write.partitionBy("a", "b").parquet(os.path.join(out, "ours"))
    calls = os.path.getsize(os.environ["CHMOD_LOG"])
    df.write.options(**hadoops).partitionBy("a", "b").parquet(os.path.join(out, "hadoops"))
    print(json.dumps({"class": fs.getClass().getName(), "chmod_bytes_after_ours": calls}))
"""


def modes(root: Path) -> dict[str, int]:
    """Each file and directory under `root` (names without the write's unique id): its mode."""
    # part-00000-<uuid>.c000.snappy.parquet (and its .crc): the uuid is the write's
    return {re.sub(r"-[0-9a-f-]{36}\.c000", ".c000", str(path.relative_to(root))):
            path.stat().st_mode for path in [root, *root.rglob("*")]}


@pytest.mark.timeout(600)
@pytest.mark.skipif(not JAVA, reason="Java 17+ is not installed: Spark cannot run")
def test_a_local_driver_writes_the_same_modes_without_a_chmod_child(tmp_path: Path) -> None:
    if localfs.javac_for(shutil.which("java")) is None:
        pytest.skip("no javac beside java (a JRE): Hadoop's file system is used")
    real = shutil.which("chmod")
    assert real
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "chmod").write_text(f'#!/bin/sh\necho "$@" >> "$CHMOD_LOG"\nexec {real} "$@"\n')
    (fake / "chmod").chmod(0o755)
    log = tmp_path / "chmod.log"
    log.write_text("")
    env = dict(os.environ, PATH=f"{fake}:{os.environ['PATH']}", CHMOD_LOG=str(log),
               XDG_CACHE_HOME=str(tmp_path / "cache"), RQ_ANALYTICS_CDS="0")
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-c", RUN, str(out), str(tmp_path / "jvm.log")],
                          capture_output=True, text=True, timeout=500, env=env, cwd=REPO)
    assert proc.returncode == 0, proc.stderr + (tmp_path / "jvm.log").read_text(errors="replace")
    printed = json.loads(proc.stdout.splitlines()[-1])
    assert printed["class"] == localfs.FS_CLASS
    assert printed["chmod_bytes_after_ours"] == 0
    # Hadoop's own file system runs chmod for each file it creates: the seam is real.
    assert len(log.read_text().splitlines()) >= 12, log.read_text()
    ours, hadoops = modes(out / "ours"), modes(out / "hadoops")
    assert len(ours) >= 6 + 12  # 3 x 2 partitions: their directories, data and .crc files
    assert ours == hadoops
    jars = list((tmp_path / "cache" / "rq" / "analytics-jvm").iterdir())
    assert [j.suffix for j in jars] == [".jar"]  # compiled once into the cache, nothing else


def test_only_a_local_master_without_the_users_own_settings_gets_it(tmp_path: Path) -> None:
    jar = str(tmp_path / "fs.jar")
    assert localfs.conf("local[2]", {}, jar) == {
        "spark.driver.extraClassPath": jar, "spark.hadoop.fs.file.impl": localfs.FS_CLASS}
    assert localfs.conf("local", {"spark.sql.shuffle.partitions": "4"}, jar) != {}
    assert localfs.conf("local[2]", {}, None) == {}  # no JDK: Hadoop's file system
    # A JVM started by a local session holds its settings as system properties, which a later
    # session of the process inherits: a cluster one (its executors lack the jar), or one with
    # the user's extraClassPath, names Hadoop's class again; the user's own class stays.
    hadoops = {"spark.hadoop.fs.file.impl": "org.apache.hadoop.fs.LocalFileSystem"}
    assert localfs.conf("spark://127.0.0.1:7077", {}, jar) == hadoops
    assert localfs.conf("spark://127.0.0.1:7077", {}, None) == {}  # a JVM without the jar
    assert localfs.conf("local[2]", {"spark.driver.extraClassPath": "theirs"}, jar) == hadoops
    assert localfs.conf("local[2]", {"spark.hadoop.fs.file.impl": "theirs"}, jar) == {}
    for key in localfs.USER_KEYS:
        assert not localfs.wanted("local[2]", {key: "theirs"})  # nothing compiled for them
    assert localfs.wanted("local[*]", {}) and not localfs.wanted("yarn", {})


@pytest.mark.timeout(300)
@pytest.mark.skipif(not JAVA, reason="Java 17+ is not installed: Spark cannot run")
def test_the_jar_is_compiled_once_and_a_failed_compile_or_a_jre_falls_back(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    java = shutil.which("java")
    if localfs.javac_for(java) is None:
        pytest.skip("no javac beside java (a JRE)")
    cache = str(tmp_path / "cache")
    first = localfs.jar(cache, java, "v", os.environ)
    assert first is not None and os.path.getsize(first) > 1000
    inode = os.stat(first).st_ino
    assert localfs.jar(cache, java, "v", os.environ) == first  # found, not compiled again
    assert os.stat(first).st_ino == inode
    assert sorted(os.listdir(cache)) == [os.path.basename(first)]  # no compile-* left

    jre = tmp_path / "jre" / "bin"  # a java with no javac beside it
    jre.mkdir(parents=True)
    shutil.copy(os.path.realpath(java), jre / "java")
    assert localfs.javac_for(str(jre / "java")) is None
    assert localfs.jar(cache, str(jre / "java"), "v", os.environ) is None

    broken = tmp_path / "RqLocalFileSystem.java"
    broken.write_text("package rq.analytics; public class RqLocalFileSystem { nope }\n")
    monkeypatch.setattr(localfs, "SOURCE", str(broken))
    assert localfs.jar(cache, java, "v", os.environ) is None
    assert sorted(os.listdir(cache)) == [os.path.basename(first)]
