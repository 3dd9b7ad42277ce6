"""Compaction and the incremental input of the analytics job (issue 19).

Owns the Parquet side of rq.analytics.manifest: finished UTC days of local event logs (S13.1) are
checked once (S13.4, the same `transform.check_lines` as a full run) and written, every checked
line with its `reason` (so skipped lines are still counted), under
`OUT/compacted/<events-key>/<DAY>.<token>/src_queue=<QUEUE>/` (partitions by day and by the
queue file the lines came from).  A day's directory is built in a private staging directory,
fsynced, renamed into place, and only then named in the manifest; the directory it replaces is
removed after that.  Compaction also records each day's line counts (valid, and skipped by
S13.4 reason) in its manifest entry, so a later run counts the lines of compacted days without
reading them again.  `prepare` compacts what is due and returns what a run reads: compacted day
directories plus the raw files not compacted (today, days not finished yet, remote inputs);
rq.analytics.state turns them into the run's message table.
"""

from __future__ import annotations

import os
import secrets
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from pyspark.sql import Column, DataFrame, Observation, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StringType, StructField, StructType

from rq.analytics import extract, load, manifest
from rq.analytics import transform as T
from rq.analytics.session import PARQUET_WEIGHT, AnalyticsError

CHECKED_SCHEMA = StructType([StructField("reason", StringType()), StructField("pos", LongType()),
                             *[f for f in T.EVENT_SCHEMA.fields if f.name != T.CORRUPT]])


@dataclass
class Plan:
    """What a run reads: compacted day directories, raw files, days to compact first."""
    compacted: list[str] = field(default_factory=list)        # paths under OUT
    raw: list[extract.EventFile] = field(default_factory=list)
    to_compact: list[tuple[str, str, list[extract.EventFile]]] = field(default_factory=list)
    files: int = 0                                             # source files behind it all
    days: list[tuple[str, str]] = field(default_factory=list)  # (events dir, day) read compacted
    trees: list[str] = field(default_factory=list)             # events keys of local inputs


def group_by_day(files: list[extract.EventFile]) -> dict[tuple[str, str], list[extract.EventFile]]:
    """(events dir, day) → its local files."""
    days: dict[tuple[str, str], list[extract.EventFile]] = {}
    for f in files:
        day_dir = os.path.dirname(extract.local_path(f.uri))
        days.setdefault((os.path.dirname(day_dir), os.path.basename(day_dir)), []).append(f)
    return days


def make_plan(spark: SparkSession, inputs: list[str], since: float | None, until: float | None,
              out: str, now: float) -> Plan:
    plan = Plan()
    book = manifest.load_manifest(out)
    for uri in inputs:
        if not extract.is_local(uri):
            plan.raw += extract.list_remote(spark, uri, since, until)
            continue
        events_dir = extract.events_dir_local(extract.local_path(uri))
        plan.trees.append(manifest.events_key(events_dir))
        days = group_by_day(extract.list_local(uri, since, until))
        tree = book["trees"].get(manifest.events_key(events_dir), {"days": {}})
        for day in tree["days"]:  # raw days removed by retention after compaction
            if extract.day_wanted(day, since, until):
                days.setdefault((events_dir, day), [])
        for (_, day), files in sorted(days.items()):
            plan_day(plan, book, out, events_dir, day, files, now)
    return plan


def plan_day(plan: Plan, book: dict[str, Any], out: str, events_dir: str, day: str,
             files: list[extract.EventFile], now: float) -> None:
    entry = manifest.day_entry(book, events_dir, day)
    start = extract.day_start(day)
    if manifest.day_fresh(entry, os.path.join(events_dir, day), out):
        assert entry is not None
        plan.files += len(entry["files"])
        plan.days.append((events_dir, day))
        if not entry.get("empty"):
            plan.compacted.append(os.path.join(out, entry["dir"]))
    elif start is not None and manifest.day_finished(start, now):
        plan.to_compact.append((events_dir, day, files))
        plan.days.append((events_dir, day))
        plan.files += len(files)
    else:
        plan.raw += files
        plan.files += len(files)


# A run on stored facts (rq.analytics.stored) reads its raw files and scans the per-message state
# once (a semi-join on the keys they touch) instead of parsing events: a state byte counts
# 1/STATE_SCAN_SHARE of a raw one.
# Measured (docs/benchmarks.md): one new hour over a 10 M-event history (a 144 MB state) took 27.6
# against 36.0 s with the warm-up options rather than the throughput ones.
STATE_SCAN_SHARE = 8


class Sizes(NamedTuple):
    """An input tree's bytes as a run reads them: `total` (fresh compacted days as their
    Parquet, PARQUET_WEIGHT a byte), `raw` (the files of unfinished days) and whether a
    finished day is due for compaction (`due`)."""
    total: int
    raw: int
    due: bool


def input_bytes(inputs: list[str], since: float | None, until: float | None, out: str,
                full: bool, now: float | None = None) -> int | None:
    """What a run will read, known before its JVM starts (session.driver_java_options): the
    sizes of the raw event-log files it lists, a fresh compacted day counting as its Parquet
    files instead (plus the per-message state), each Parquet byte PARQUET_WEIGHT times, unless
    `full`; for a run on stored facts (unwindowed, facts of the current version, no day due
    for compaction at `now`) its raw files plus the state at 1/STATE_SCAN_SHARE.  None when an
    input is remote (listed only through the JVM) or anything fails here (a missing input,
    files removed meanwhile: the run itself then says what is wrong)."""
    if not all(extract.is_local(uri) for uri in inputs):
        return None
    now = time.time() if now is None else now
    try:
        book = manifest.load_manifest(out)
        sizes = [tree_input_bytes(book, uri, since, until, out, full, now) for uri in inputs]
        total = sum(s.total for s in sizes)
        if not full and book.get("state"):
            state_bytes = tree_bytes(os.path.join(out, book["state"]["dir"]))
            if (since is None and until is None and manifest.facts_path(out, book)
                    and not any(s.due for s in sizes)):
                return sum(s.raw for s in sizes) + state_bytes // STATE_SCAN_SHARE
            total += PARQUET_WEIGHT * state_bytes
    except (AnalyticsError, OSError, LookupError, TypeError, ValueError):
        return None
    return total


def tree_input_bytes(book: dict[str, Any], uri: str, since: float | None, until: float | None,
                     out: str, full: bool, now: float) -> Sizes:
    events_dir = extract.events_dir_local(extract.local_path(uri))
    days = group_by_day(extract.list_local(uri, since, until))
    tree = book["trees"].get(manifest.events_key(events_dir), {"days": {}})
    for day in [] if full else tree["days"]:  # raw days removed after compaction
        if extract.day_wanted(day, since, until):
            days.setdefault((events_dir, day), [])
    total = raw = 0
    due = False
    for (_, day), files in days.items():
        entry = manifest.day_entry(book, events_dir, day)
        if not full and entry and manifest.day_fresh(entry, os.path.join(events_dir, day), out):
            total += PARQUET_WEIGHT * tree_bytes(os.path.join(out, entry["dir"]))
            continue
        size = sum(f.size for f in files)
        total += size
        start = extract.day_start(day)
        if start is not None and manifest.day_finished(start, now):
            due = True
        else:
            raw += size
    return Sizes(total, raw, due)


def tree_bytes(path: str) -> int:
    """The sizes of the files under `path` (0 when it is gone)."""
    total = 0
    for top, _, names in os.walk(path):
        for name in names:
            try:
                total += os.lstat(os.path.join(top, name)).st_size
            except OSError:
                pass
    return total


def compact(spark: SparkSession, out: str,
            days: list[tuple[str, str, list[extract.EventFile]]]) -> list[str]:
    """Check and write `days` as Parquet, publish them in the manifest; their directories."""
    # The source records (a SHA-256 of each file's listed prefix: 1.9 GB for 30 days of 10 M
    # events, ~1.4 s) are hashed in a thread while the JVM plans and runs the write: during
    # its planning one core would idle (docs/benchmarks.md, fifteenth session).
    with ThreadPoolExecutor(1, "rq-hash") as pool:
        hashed = pool.submit(source_records, days)
        lines, staging, token = write_staged(spark, out, days)
    records = hashed.result()
    trees = events_dirs(days)
    os.makedirs(staging, exist_ok=True)
    book = manifest.load_manifest(out)
    replaced, made = [], []
    for events_dir, day, day_files in days:
        rel = os.path.join("compacted", manifest.events_key(events_dir), f"{day}.{token}")
        built = os.path.join(staging, str(trees.index(events_dir)), f"day={day}")
        empty = not os.path.isdir(built)
        os.makedirs(built, exist_ok=True)
        load.fsync_tree(built)
        os.makedirs(os.path.dirname(os.path.join(out, rel)), exist_ok=True)
        os.rename(built, os.path.join(out, rel))
        load.fsync_path(os.path.dirname(os.path.join(out, rel)))
        old = manifest.day_entry(book, events_dir, day)
        if old:
            replaced.append(old["dir"])
        manifest.set_day_entry(book, events_dir, day, {
            "dir": rel, "empty": empty,
            "lines": lines.get((events_dir, day), manifest.zero_lines()),
            "files": {os.path.basename(extract.local_path(f.uri)): records[f.uri]
                      for f in day_files}})
        made.append(os.path.join(out, rel))
    load.write_json(manifest.manifest_path(out), book)
    load.fsync_path(manifest.compacted_dir(out))
    for rel in replaced:  # only now: the manifest no longer names them
        shutil.rmtree(os.path.join(out, rel), ignore_errors=True)
    shutil.rmtree(staging, ignore_errors=True)
    return made


def events_dirs(days: list[tuple[str, str, list[extract.EventFile]]]) -> list[str]:
    """The events directories of `days`, sorted: the staging trees' order (write_staged)."""
    return sorted({events_dir for events_dir, _, _ in days})


def source_records(days: list[tuple[str, str, list[extract.EventFile]]]
                   ) -> dict[str, dict[str, Any]]:
    """uri → manifest.source_record of every file of `days`."""
    return {f.uri: manifest.source_record(extract.local_path(f.uri), f.size)
            for _, _, day_files in days for f in day_files}


def write_staged(spark: SparkSession, out: str,
                 days: list[tuple[str, str, list[extract.EventFile]]]
                 ) -> tuple[dict[tuple[str, str], dict[str, int]], str, str]:
    """The checked lines of `days` written under a new staging directory, one tree per
    events directory (`<staging>/<i>/day=D/src_queue=Q/`, i its index among the sorted
    events directories): (line counts per (events dir, day), staging path, its token)."""
    token = secrets.token_hex(4)
    staging = os.path.join(manifest.compacted_dir(out), f".staging-{token}")
    # One staging tree per events directory: two inputs may both have a day D, and each gets
    # its own partition (and its own line counts).
    trees = events_dirs(days)
    lines: dict[tuple[str, str], dict[str, int]] = {}
    for i, tree in enumerate(trees):
        tree_files = [f for ed, _, day_files in days if ed == tree for f in day_files
                      if f.size > 0]
        if not tree_files:
            continue
        target = os.path.join(staging, str(i))
        checked = T.check_lines(extract.read_lines(spark, tree_files, with_file=True),
                                ("file",))
        staged = checked.select(*CHECKED_SCHEMA.fieldNames(),
                                path_element(F.col("file"), 2).alias("day"),
                                F.substring_index(path_element(F.col("file"), 1), ".", 1)
                                .alias("src_queue"))
        tree_days = sorted({day for ed, day, day_files in days if ed == tree
                            and any(f.size > 0 for f in day_files)})
        observed = Observation()
        (staged.observe(observed, *day_sums(tree_days))
         .write.partitionBy("day", "src_queue").parquet("file://" + target))
        lines.update(((tree, day), counts) for day, counts
                     in observed_line_counts(spark, target, observed.get).items())
    return lines, staging, token


def path_element(path: Column, k: int) -> Column:
    """The k-th element from the end of a `/`-separated path (1: the file's name).  String
    functions, not a regular expression: a pattern searched along every line's path cost
    compaction's write about a fifth of its time (docs/benchmarks.md, eleventh session).  The
    layouts it reads: raw `<events>/<DAY>/<QUEUE>.jsonl` (extract.list_local: a queue name
    holds no `.`), staged `…/day=<DAY>/src_queue=<QUEUE>/<part>` and compacted
    `…/<DAY>.<token>/src_queue=<QUEUE>/<part>`."""
    return F.substring_index(F.substring_index(path, "/", -k), "/", 1)


# A day's lines are counted in the pass that writes them (DataFrame.observe): one sum per day in
# which a valid line weighs 1 and a skipped one (S13.4) INVALID, so the low 32 bits count the
# valid lines and the rest the skipped ones (exact below 2^32 valid and 2^31 skipped lines a
# day).  Skipped lines are rare: only a day that has some is read again, for their reasons.
# (Reading the `reason` column of the 3,000 files of 30 days × 100 queues back took 6–9 s of a
# first run; a counter per day and reason in the pass cost as much.)
INVALID = 1 << 32


def day_sums(days: list[str]) -> list[Column]:
    """The observed sum of each of `days` (named by the day) over staged lines.  The day is
    compared as a number (YYYYMMDD: a compacted day's name is always 8 digits,
    extract.day_start), cast once per line: 30 such sums over 2 M lines took ~0.4 s less than
    30 text comparisons a line, half of what the sums cost (docs/benchmarks.md, fifteenth
    session)."""
    weight = F.when(F.col("reason").isNull(), F.lit(1)).otherwise(F.lit(INVALID))
    number = F.col("day").cast("int")
    return [F.sum(F.when(number == int(day), weight)).alias(day) for day in days]


def observed_line_counts(spark: SparkSession, staging: str, sums: dict[str, Any]
                         ) -> dict[str, dict[str, int]]:
    """day → {"valid": n, "torn": n, …} of the lines just written to `staging`, from their
    observed `day_sums`; the `reason` column of the days with skipped lines is read back."""
    counts: dict[str, dict[str, int]] = {}
    dirty = []
    for day, total in sums.items():
        counts[day] = manifest.zero_lines()
        skipped, counts[day]["valid"] = divmod(int(total or 0), INVALID)
        if skipped:
            dirty.append(day)
    if dirty:
        rows = (spark.read.schema("reason string").option("recursiveFileLookup", "true")
                .parquet(*[f"file://{staging}/day={day}" for day in dirty])
                .where(F.col("reason").isNotNull())
                .groupBy(F.substring(path_element(F.col("_metadata.file_path"), 3), 5, 8)
                         .alias("day"), "reason").count().collect())
        for r in rows:
            counts[r["day"]][r["reason"]] += int(r["count"])
    return counts


def sweep(out: str) -> list[str]:
    """Remove what a run that died mid-compaction left (staging directories, day and state
    directories renamed into place that the manifest never came to name).  Called under the
    lock."""
    book = manifest.load_manifest(out)
    named = {entry["dir"] for tree in book["trees"].values() for entry in tree["days"].values()}
    if book.get("state"):
        named.add(book["state"]["dir"])
        if book["state"].get("facts"):
            named.add(book["state"]["facts"])
    top = manifest.compacted_dir(out)
    doomed = [os.path.join(top, n) for n in os.listdir(top) if n.startswith(".staging-")]
    doomed += [os.path.join(top, n) for n in os.listdir(top) if n.startswith(
        manifest.STATE_PREFIX) and os.path.join("compacted", n) not in named]
    for key in os.listdir(top):
        if os.path.isdir(os.path.join(top, key)) and not key.startswith((
                ".", manifest.STATE_PREFIX)):
            doomed += [os.path.join(top, key, n) for n in os.listdir(os.path.join(top, key))
                       if os.path.join("compacted", key, n) not in named]
    for path in doomed:
        shutil.rmtree(path, ignore_errors=True)
    return doomed


def read_compacted(spark: SparkSession, dirs: list[str]) -> DataFrame:
    """Checked lines (reason, pos, event fields) of compacted day directories."""
    # recursiveFileLookup: no partition discovery (queue names are not typed as numbers, and
    # the src_queue column is not needed downstream).
    return (spark.read.schema(CHECKED_SCHEMA).option("recursiveFileLookup", "true")
            .parquet(*["file://" + d for d in dirs]))


def ensure_line_counts(spark: SparkSession, out: str, plan: Plan) -> dict[str, Any]:
    """The manifest, with line counts in the entry of every compacted day of `plan` (entries
    written before counts were recorded get them from one read of their `reason` column)."""
    book = manifest.load_manifest(out)
    missing = [(ed, day) for ed, day in plan.days
               if "lines" not in (manifest.day_entry(book, ed, day) or {"lines": 0})]
    for ed, day in missing:
        entry = manifest.day_entry(book, ed, day)
        assert entry is not None
        if entry.get("empty"):
            entry["lines"] = manifest.zero_lines()
            continue
        entry["lines"] = manifest.zero_lines()
        for r in (read_compacted(spark, [os.path.join(out, entry["dir"])])
                  .groupBy("reason").count().collect()):
            entry["lines"][r["reason"] or "valid"] += int(r["count"])
    if missing:
        load.write_json(manifest.manifest_path(out), book)
    return book


def prepare(spark: SparkSession, inputs: list[str], since: float | None,
            until: float | None, out: str, now: float) -> tuple[Plan, dict[str, Any]]:
    """Compact the finished days that are due (the caller holds manifest.locked(out)); the
    run's plan, with `compacted` the non-empty compacted days it reads, and the manifest."""
    sweep(out)
    plan = make_plan(spark, inputs, since, until, out, now)
    if plan.to_compact:
        compact(spark, out, plan.to_compact)
    book = ensure_line_counts(spark, out, plan)
    plan.compacted = sorted(
        os.path.join(out, entry["dir"]) for ed, day in plan.days
        for entry in [manifest.day_entry(book, ed, day)] if entry and not entry.get("empty"))
    return plan, book
