"""The class-data-sharing archive of the analytics driver JVM (rq/analytics/session.py).

The first session writes the archive into the cache directory (and nothing half-written is left
beside it), the next session loads Spark's classes from it (the JVM's class+load log names the
archive as their source), and a corrupt archive file only costs the speed-up: the run works.
Each run is a real `python` process with real JVMs; the first process has two sessions, so the
JVM ended for the dump is started again for the later session, which is the one that maps the
archive (three JVMs in all: dump, use, corrupt).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

JAVA = shutil.which("java") is not None
pytestmark = [pytest.mark.timeout(900),  # three JVMs, one dumping its archive: 159 s at load 4
              pytest.mark.skipif(not JAVA, reason="Java 17+ is not installed: Spark cannot run")]

# argv: JVM options ("{n}" is the session's number), sessions, JVM log, cache directory.
# After each session one JSON line: the cache directory's entries (name -> [size, inode]).
RUN = """
import json, os, sys
from rq.analytics import session
for n in range(int(sys.argv[2])):
    conf = {"spark.sql.shuffle.partitions": "1",
            "spark.driver.extraJavaOptions": "-XX:+UseSerialGC -XX:TieredStopAtLevel=1 "
                                             + sys.argv[1].replace("{n}", str(n))}
    with session.spark_session("local[1]", conf, log_path=sys.argv[3]) as s:
        total = s.range(10).selectExpr("sum(id)").collect()[0][0]
    entries = {e.name: [e.stat().st_size, e.inode()] for e in os.scandir(sys.argv[4])}
    print(json.dumps({"sum": total, "cache": entries}), flush=True)
"""


def run(tmp_path: Path, name: str, sessions: int = 1, jvm_opts: str = "") -> list[Any]:
    """One process with `sessions` sessions in a row; returns what each printed."""
    log = tmp_path / f"{name}.log"
    cache = tmp_path / "cache" / "rq" / "analytics-cds"
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache"))
    env.pop("RQ_ANALYTICS_CDS", None)
    proc = subprocess.run([sys.executable, "-c", RUN, jvm_opts, str(sessions), str(log),
                           str(cache)],
                          capture_output=True, text=True, timeout=600, env=env,
                          cwd=Path(__file__).resolve().parent.parent)
    assert proc.returncode == 0, proc.stderr + log.read_text(errors="replace")
    printed = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [p["sum"] for p in printed] == [45] * sessions
    return printed


def test_archive_is_written_once_then_used_and_a_corrupt_one_is_ignored(tmp_path: Path) -> None:
    cache = tmp_path / "cache" / "rq" / "analytics-cds"
    classes = tmp_path / "classes-{n}.txt"
    first, second = run(tmp_path, "first", sessions=2,
                        jvm_opts=f"-Xlog:class+load=info:file={classes}")
    archives = sorted(n for n in first["cache"] if n != "conf")
    assert len(archives) == 1 and archives[0].endswith(".jsa"), archives  # no *.tmp left
    name = archives[0]
    assert first["cache"][name][0] > 1 << 20
    assert list((cache / "conf").iterdir()) == []  # the class path's conf dir stays empty
    assert "shared objects file (top)" not in (tmp_path / "classes-0.txt").read_text()

    # The second session's JVM (the first one ended for the dump) maps the archive.
    loaded = (tmp_path / "classes-1.txt").read_text()
    assert "org.apache.spark.SparkContext source: shared objects file (top)" in loaded, \
        (tmp_path / "first.log").read_text(errors="replace")
    # used, not written again (a new archive would be renamed over it: another inode)
    assert second["cache"][name][1] == first["cache"][name][1]
    assert sorted(second["cache"]) == sorted(["conf", name])

    archive = cache / name
    archive.chmod(0o644)
    with open(archive, "r+b") as f:  # same name and size, garbage header and contents
        f.write(os.urandom(1 << 16))
    (corrupt,) = run(tmp_path, "corrupt",
                     jvm_opts=f"-Xlog:class+load=info:file={tmp_path / 'bad.txt'}")
    # a new process finds the same archive (same key): it is neither replaced nor joined
    assert corrupt["cache"] == second["cache"]
    assert "shared objects file (top)" not in (tmp_path / "bad.txt").read_text()
    assert "org.apache.spark.SparkContext source: " in (tmp_path / "bad.txt").read_text()


def test_one_run_writes_a_missing_archive_and_leftovers_are_swept(tmp_path: Path) -> None:
    """Runs started together (a fresh install's first runs, the test suite's) dump one
    archive, not one each: the first claims it (`KEY.claim`, its pid) and the others run
    without while that process lives.  A claim or temporary archive whose process is gone is
    swept; a session told not to write (cds_write=False) never claims."""
    from rq.analytics import session
    d = str(tmp_path)
    opts, tmp = session.cds_options(d, "k", "")
    assert "-XX:ArchiveClassesAtExit=" in opts and tmp == f"{d}/k.{os.getpid()}.tmp"
    assert (tmp_path / "k.claim").read_text() == str(os.getpid())
    assert session.cds_options(d, "k", "") == ("", None)  # claimed by a live process
    (tmp_path / "k.claim").unlink()
    assert session.cds_options(d, "k", "", write=False) == ("", None)
    assert not (tmp_path / "k.claim").exists()
    gone = subprocess.Popen(["true"])
    gone.wait()
    (tmp_path / "k.claim").write_text(str(gone.pid))
    (tmp_path / f"k.{gone.pid}.tmp").write_bytes(b"half an archive")
    opts, tmp = session.cds_options(d, "k", "")
    assert tmp is not None and (tmp_path / "k.claim").read_text() == str(os.getpid())
    assert sorted(os.listdir(d)) == ["k.claim"]  # the dead run's archive swept
    (tmp_path / "k.jsa").write_bytes(b"an archive")
    assert session.cds_options(d, "k", "", write=False)[0] == \
        f"-XX:SharedArchiveFile={d}/k.jsa -Xshare:auto"
