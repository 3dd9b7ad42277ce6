"""The class-data-sharing archive of the analytics driver JVM (rq/analytics/session.py).

The first session writes the archive into the cache directory (and nothing half-written is left
beside it), the next sessions load Spark's classes from it (the JVM's class+load log names the
archive as their source), and a corrupt archive file only costs the speed-up: the run works.
Each run is a real `python` process with a real JVM; two sessions in the first process show
that the JVM ended for the dump is started again for a later session.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

JAVA = shutil.which("java") is not None
pytestmark = pytest.mark.skipif(not JAVA, reason="Java 17+ is not installed: Spark cannot run")

RUN = """
import sys
from rq.analytics import session
conf = {"spark.sql.shuffle.partitions": "1",
        "spark.driver.extraJavaOptions": "-XX:+UseSerialGC -XX:TieredStopAtLevel=1 " + sys.argv[1]}
for n in range(int(sys.argv[2])):
    with session.spark_session("local[1]", conf, log_path=sys.argv[3]) as s:
        print(s.range(10).selectExpr("sum(id)").collect()[0][0])
"""


def run(tmp_path: Path, name: str, sessions: int = 1, jvm_opts: str = "") -> Path:
    """One process with `sessions` sessions in a row; returns its JVM log."""
    log = tmp_path / f"{name}.log"
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache"))
    env.pop("RQ_ANALYTICS_CDS", None)
    proc = subprocess.run([sys.executable, "-c", RUN, jvm_opts, str(sessions), str(log)],
                          capture_output=True, text=True, timeout=600, env=env,
                          cwd=Path(__file__).resolve().parent.parent)
    assert proc.returncode == 0, proc.stderr + log.read_text(errors="replace")
    assert proc.stdout.split() == ["45"] * sessions
    return log


def test_archive_is_written_once_then_used_and_a_corrupt_one_is_ignored(tmp_path: Path) -> None:
    cache = tmp_path / "cache" / "rq" / "analytics-cds"
    run(tmp_path, "first", sessions=2)
    archives = sorted(p.name for p in cache.iterdir() if p.name != "conf")
    assert len(archives) == 1 and archives[0].endswith(".jsa"), archives  # no *.tmp left
    archive = cache / archives[0]
    assert archive.stat().st_size > 1 << 20
    assert list((cache / "conf").iterdir()) == []  # the class path's conf dir stays empty
    inode = archive.stat().st_ino  # a new archive would be renamed over it: another inode

    classes = tmp_path / "classes.txt"
    log = run(tmp_path, "second", jvm_opts=f"-Xlog:class+load=info:file={classes}")
    loaded = classes.read_text()
    assert "org.apache.spark.SparkContext source: shared objects file (top)" in loaded, \
        log.read_text(errors="replace")
    assert archive.stat().st_ino == inode  # used, not written again
    assert sorted(p.name for p in cache.iterdir()) == sorted(["conf", archive.name])

    archive.chmod(0o644)
    with open(archive, "r+b") as f:  # same name and size, garbage header and contents
        f.write(os.urandom(1 << 16))
    classes.unlink()
    log = run(tmp_path, "corrupt", jvm_opts=f"-Xlog:class+load=info:file={classes}")
    assert "shared objects file (top)" not in classes.read_text()
    assert "org.apache.spark.SparkContext source: " in classes.read_text()
