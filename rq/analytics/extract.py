"""Extract stage of the analytics job: find the S13 event-log files and read their lines.

Owns: resolving each input (an RQ root, its `log/events` directory, or the same under any URI
Spark reads: `file:`, `hdfs:`, `s3a:` …) into the `YYYYMMDD/QUEUE.jsonl` files of the days that
overlap [since, until), and reading them as text lines split on `\\n` only.  Local inputs are
listed with os.scandir; other URIs through Hadoop's FileSystem in the JVM.  A file whose last byte
is not a newline holds a torn tail (S13.4): such files are read on their own so that their last
line can be marked `torn` without a pass over every file.
"""

from __future__ import annotations

import calendar
import os
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import BooleanType, LongType, StringType, StructField, StructType

from rq.analytics import transform
from rq.analytics.session import AnalyticsError

DAY_RE = re.compile(r"^(\d{4})(\d{2})(\d{2})$")
QUEUE_FILE = re.compile(r"^[^/.]+\.jsonl$")
DAY = 86400
LINES_SCHEMA = StructType([StructField("value", StringType()), StructField("torn", BooleanType()),
                           StructField("pos", LongType())])


@dataclass(frozen=True)
class EventFile:
    uri: str
    size: int
    torn_tail: bool     # last byte is not a newline


def day_start(name: str) -> int | None:
    m = DAY_RE.match(name)
    if not m or not (1 <= int(m[2]) <= 12 and 1 <= int(m[3]) <= 31):
        return None
    return calendar.timegm((int(m[1]), int(m[2]), int(m[3]), 0, 0, 0, 0, 0, 0))


def day_wanted(name: str, since: float | None, until: float | None) -> bool:
    """A YYYYMMDD directory holds events of that UTC day (S13.1): keep it when the day
    overlaps [since, until)."""
    start = day_start(name)
    return start is not None and (since is None or start + DAY > since) and (
        until is None or start < until)


def is_local(uri: str) -> bool:
    return urlparse(uri).scheme in ("", "file")


def local_path(uri: str) -> str:
    return os.path.abspath(urlparse(uri).path if uri.startswith("file:") else uri)


def events_dir_local(path: str) -> str:
    """`ROOT/log/events` for a root, else the path itself (an events directory)."""
    candidate = os.path.join(path, "log", "events")
    if os.path.isdir(candidate):
        return candidate
    if os.path.isdir(path):
        return path
    raise AnalyticsError(f"input not found: {path}")


def last_byte_is_newline(path: str, size: int) -> bool:
    if size == 0:
        return True
    with open(path, "rb") as f:
        return os.pread(f.fileno(), 1, size - 1) == b"\n"


def list_local(path: str, since: float | None, until: float | None) -> list[EventFile]:
    base = events_dir_local(local_path(path))
    found = []
    with os.scandir(base) as days:
        for day in sorted(days, key=lambda d: d.name):
            if not day.is_dir() or not day_wanted(day.name, since, until):
                continue
            with os.scandir(day.path) as files:
                for f in sorted(files, key=lambda e: e.name):
                    if QUEUE_FILE.match(f.name) and f.is_file():
                        size = f.stat().st_size
                        found.append(EventFile("file://" + f.path, size,
                                               not last_byte_is_newline(f.path, size)))
    return found


def list_remote(spark: SparkSession, uri: str, since: float | None,
                until: float | None) -> list[EventFile]:
    """Any Hadoop URI: `URI/log/events/*/*.jsonl` (or `URI/*/*.jsonl` for an events dir)."""
    jvm: Any = spark.sparkContext._jvm
    hconf = spark.sparkContext._jsc.hadoopConfiguration()  # type: ignore[attr-defined]
    base = uri.rstrip("/")
    if not base.endswith("/events"):
        base += "/log/events"
    pattern = jvm.org.apache.hadoop.fs.Path(base + "/*/*.jsonl")
    fs = pattern.getFileSystem(hconf)
    statuses = fs.globStatus(pattern) or []
    found = []
    for st in statuses:
        path = st.getPath()
        if not day_wanted(path.getParent().getName(), since, until):
            continue
        size = int(st.getLen())
        torn = False
        if size:
            stream = fs.open(path)
            try:
                stream.seek(size - 1)
                torn = stream.read() != 10
            finally:
                stream.close()
        found.append(EventFile(path.toString(), size, torn))
    return sorted(found, key=lambda f: f.uri)


def list_inputs(spark: SparkSession, inputs: list[str], since: float | None,
                until: float | None) -> list[EventFile]:
    files: list[EventFile] = []
    for uri in inputs:
        files += (list_local(uri, since, until) if is_local(uri)
                  else list_remote(spark, uri, since, until))
    return files


def read_text(spark: SparkSession, uris: list[str]) -> DataFrame:
    return spark.read.option("lineSep", "\n").text(uris)


def read_lines(spark: SparkSession, files: list[EventFile], with_file: bool = False) -> DataFrame:
    """Lines of `files` as (value, torn, pos): `pos` grows along each file.  `with_file` adds
    `file`, the path of the line's file (compaction partitions by it)."""
    whole = [f.uri for f in files if not f.torn_tail]
    torn = [f.uri for f in files if f.torn_tail]
    extra = ["file"] if with_file else []
    parts: list[Any] = []
    if whole:
        parts.append(read_text(spark, whole).select(
            "value", F.lit(False).alias("torn"), F.monotonically_increasing_id().alias("pos"),
            *([F.col("_metadata.file_path").alias("file")] if with_file else [])))
    if torn:
        lines = read_text(spark, torn).select(
            "value", F.col("_metadata.file_path").alias("file"),
            F.monotonically_increasing_id().alias("pos"))
        parts.append(transform.mark_torn_tail(lines).select("value", "torn", "pos", *extra))
    if not parts:
        schema = StructType([*LINES_SCHEMA.fields, StructField("file", StringType())]) \
            if with_file else LINES_SCHEMA
        return spark.createDataFrame([], schema)
    return transform.union_all(parts)
