"""The facts stored beside the per-message state, and a run on them (issue 19).

Owns `OUT/compacted/state.<token>.facts/`, written by `write_facts` whenever the state is
(rq.analytics.state.maintain):
* `totals.json` — the state's small facts (rq.analytics.totals.Totals: counts per queue and
  hour, per queue, per err text and coarse value bucket, the value statistics, the per-hour
  percentiles and each queue's SLOW_KEEP slowest messages);
* `values_h/`, `values_b/` — its value multisets (rq.analytics.facts) sorted by hour and by
  coarse bucket in small row groups, so that a reader skips what it does not need;
* `messages/` — its messages/ table in files by the hash of each message's first day (`_d0`),
  `layout.json` how many: the messages a new hour recomputes began on the last day or two, so
  a run rewrites those days' files only.

`run_carried` is an unwindowed run on them: the messages with raw events are recomputed from
all their events (as rq.analytics.state.run_messages does), their facts minus their stored
rows' are collected in one query and added to the stored totals in Python; only the hours
whose stored values change, and the value buckets that hold the percentiles' ranks, are read
back in Spark; the messages/ table is hard links to the stored files that hold no recomputed
message plus new files: the recomputed messages and the other rows of the files they hit.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from rq.analytics import compact, facts, load, state, summary, totals
from rq.analytics import transform as T

SLOW_KEEP = 100         # per queue: the slowest of a run are found among these (`slowest`)
ROW_GROUP = str(2 << 20)
MESSAGE_FILES = 64      # at most; one per 4 MiB of state, at least 4
LAYOUT = "layout.json"
TOTALS = "totals.json"


def slow_candidates(rows: DataFrame) -> DataFrame:
    return rows.where(F.col("run_s").isNotNull()).select("queue", "msg_id", "host", "run_s")


def write_facts(spark: SparkSession, rows_path: str, dest: str) -> totals.Totals:
    """The facts of the state rows at `rows_path`, stored under `dest` (see the module);
    returns their totals (what `totals.json` holds)."""
    rows = state.read_state(spark, rows_path)
    f = facts.make(rows)
    values = f.values.persist()
    values_b = facts.by_queue(values).persist()
    parts = facts.small_parts(f, values, values_b)
    parts["slow"] = T.top_per_queue(slow_candidates(rows), T.slowest_order(),
                                    SLOW_KEEP).drop("rank")
    stored = totals.from_rows(facts.collect(parts))
    # Files as the values are partitioned (by queue and kind, facts.make: no shuffle), each
    # sorted by the one column its readers select on (`hours`: hour; group_percentiles: b),
    # so that the row groups' min/max let a reader skip what it does not need.  One integral
    # key: Spark sorts it by radix, where more keys (hour, queue, kind) compared most rows
    # in full: 2.5-3.8 s against 1.0-1.7 s a table over 10 M events' values, warm, the files
    # ~40 % larger (docs/benchmarks.md, nineteenth session).
    size = compact.tree_bytes(rows_path)
    files = max(1, min(4, size // (32 << 20)))
    sorted_tables = {"values_h": values.where(F.col("hour").isNotNull()).coalesce(files)
                     .sortWithinPartitions("hour"),
                     "values_b": values_b.coalesce(files).sortWithinPartitions("b")}
    for name, df in sorted_tables.items():
        df.write.option("parquet.block.size", ROW_GROUP).parquet(f"file://{dest}/{name}")
    values.unpersist()
    values_b.unpersist()
    write_messages(rows, dest, max(4, min(MESSAGE_FILES, size // (4 << 20))))
    load.write_json(os.path.join(dest, TOTALS), totals.to_json(stored))
    return stored


def write_messages(rows: DataFrame, dest: str, files: int) -> None:
    """`dest/messages`: the messages/ columns of the state rows `rows` in `files` files by
    the hash of their first day (file k holds the rows with message_file(files) = k), and
    `dest/layout.json` saying how many.  By day, not by key: the messages a new hour's events
    recompute began on its day or the one before, and only their files are rewritten
    (link_messages; by key every file held some, and a run rewrote the whole table)."""
    (rows.repartition(files, "_d0").select(*T.MESSAGE_COLUMNS)
     .write.parquet(f"file://{dest}/messages"))
    load.write_json(os.path.join(dest, LAYOUT), {"message_files": files})


def message_file(files: int) -> Column:
    """The stored messages file of a state row: Spark's hash partitioning of
    `repartition(files, "_d0")` (pmod of the seed-42 Murmur3 hash, SQL's `hash`), so a part
    file's number says which rows it holds."""
    return F.expr(f"pmod(hash(_d0), {files})")


def part_number(name: str) -> int | None:
    """`part-00007-….parquet` → 7 (the task's partition); None for other names."""
    if name.startswith("part-") and name.endswith(".parquet") and name[5:10].isdigit():
        return int(name[5:10])
    return None


def message_files(facts_dir: str) -> int:
    """How many files the stored messages/ table has (write_messages' layout.json)."""
    with open(os.path.join(facts_dir, LAYOUT), encoding="utf-8") as f:
        return int(json.load(f)["message_files"])


def touched(old: DataFrame, facts_dir: str) -> tuple[set[int], list[tuple[str, str]]]:
    """The stored messages files holding the rows `old` (message_file) and the (first, last)
    day ranges of their events (rq.analytics.state.DAYS): one small action."""
    files = message_file(message_files(facts_dir)).alias("_f")
    got = old.select(files, *state.DAYS).distinct().collect()
    return {int(r["_f"]) for r in got}, [(r["_d0"], r["_d1"]) for r in got]


def link_messages(spark: SparkSession, stored: str, dest: str, hit: set[int],
                  raw_keys: DataFrame | None, recomputed: DataFrame | None) -> None:
    """A run's messages/ at `dest`: hard links to the stored files (`stored`, write_messages)
    but those numbered in `hit` (the files holding the old rows of recomputed messages, from
    `touched`), and new files: the recomputed messages and the other rows of the hit files."""
    files: dict[int, list[str]] = {}
    for name in os.listdir(stored):
        k = part_number(name)
        if k is not None:
            files.setdefault(k, []).append(os.path.join(stored, name))
    parts = [] if recomputed is None else [recomputed.select(*T.MESSAGE_COLUMNS)]
    rewritten = [p for k in sorted(hit) for p in files.get(k, [])]
    if rewritten and raw_keys is not None:
        parts.append(state.join_keys(spark.read.parquet(*["file://" + p for p in rewritten]),
                                     raw_keys, "left_anti"))
    if parts:
        # Two tasks, not one: the rows of the hit files (tens of thousands each) are most
        # of the work, and two cores share it.
        T.union_all(parts).coalesce(2).write.parquet("file://" + dest)
    else:
        os.makedirs(dest)
    for k, paths in files.items():
        if k not in hit:
            for p in paths:
                os.link(p, os.path.join(dest, "stored-" + os.path.basename(p)))


def read_table(spark: SparkSession, facts_dir: str, name: str) -> DataFrame:
    return spark.read.parquet(f"file://{facts_dir}/{name}")


def read_totals(facts_dir: str) -> totals.Totals:
    with open(os.path.join(facts_dir, TOTALS), encoding="utf-8") as f:
        return totals.from_json(json.load(f))


@dataclass
class Carried:
    """A run on the stored facts: its totals, the value rows of given buckets
    (facts.group_percentiles) and the writer of its messages/ table."""
    totals: totals.Totals
    values_b: Callable[[list[int]], DataFrame]
    write_messages: Callable[[str], None]


def run_carried(spark: SparkSession, out: str, dirs: list[str], raw: DataFrame | None,
                path: str, facts_dir: str, figures: state.Figures,
                known: totals.Totals | None = None) -> Carried:
    """An unwindowed run on the state at `path` and its facts at `facts_dir` (the module);
    `known`: their totals when this run has just written them (else read from the files:
    11 MB of JSON over 10 M events, ~1.3 s)."""
    figures.path = "state"
    rows = state.read_state(spark, path)
    stored = read_totals(facts_dir) if known is None else known
    stored_messages = os.path.join(facts_dir, "messages")

    def stored_values(buckets: list[int]) -> DataFrame:
        return read_table(spark, facts_dir, "values_b").where(facts.in_list("b", buckets))

    if raw is None:
        return Carried(stored, stored_values,
                       lambda dest: link_messages(spark, stored_messages, dest, set(), None,
                                                  None))
    raw_events = T.window_events(raw, None, None)
    raw_keys = state.keys(raw_events)
    # `old`, `recomputed` and the delta's values are bounded by the raw events' messages: each
    # is computed once, its lineage cut (localCheckpoint), so that the queries after it neither
    # plan nor run it again (docs/benchmarks.md: 2.3 s of a 31-s new hour at 10 M events).
    old = state.join_keys(rows, raw_keys, "left_semi").localCheckpoint()
    hit, ranges = touched(old, facts_dir)
    parts = [raw_events]
    old_dirs = state.dirs_within(ranges, dirs)
    if old_dirs:
        parts.append(state.counted(state.join_keys(
            state.read_events(spark, out, old_dirs, None, None), raw_keys, "left_semi"),
            "compacted_events_read", figures))
    recomputed = state.counted(T.message_table(T.union_all(parts)), "messages_recomputed",
                               figures).localCheckpoint()
    delta = facts.merge(facts.make(recomputed, 1), facts.make(old, -1))
    d_values = delta.values.where(F.col("n") != 0).localCheckpoint()
    d_b = facts.by_queue(d_values).localCheckpoint()
    got = facts.collect({
        "queue_hour": delta.queue_hour, "queues": delta.queues, "errors": delta.errors,
        "stats": facts.value_stats(d_b), "coarse": facts.coarse(d_b),
        "values": d_values.where(F.col("hour").isNotNull() & (F.col("kind") != "total")),
        "slow": slow_candidates(recomputed), "old": old.select(*T.KEY)})
    change = totals.from_rows(got)
    merged = totals.add(stored, change)
    hours(spark, facts_dir, merged, stored, got["values"], d_values)
    merged.slow = slowest(spark, rows, raw_keys, stored, change,
                          {(r["queue"], r["msg_id"], r["host"]) for r in got["old"]})

    def values_b(buckets: list[int]) -> DataFrame:  # not added up: group_percentiles
        columns = ["queue", "kind", "b", "v", "n"]
        return stored_values(buckets).select(*columns).unionByName(
            d_b.where(facts.in_list("b", buckets)).select(*columns))

    return Carried(merged, values_b,
                   lambda dest: link_messages(spark, stored_messages, dest, hit, raw_keys,
                                              recomputed))


def hours(spark: SparkSession, facts_dir: str, merged: totals.Totals, stored: totals.Totals,
          changed: list[dict[str, Any]], d_values: DataFrame) -> None:
    """merged.hour_pct brought up to date with the changed values (rows of the delta's
    wait/run values): an hour the stored facts have no values of is ranked here from its
    change alone; the others from their stored values (read by hour) plus the change."""
    groups: dict[tuple[str, int, str], list[tuple[int, int]]] = {}
    for r in changed:
        groups.setdefault((r["queue"], r["hour"], r["kind"]), []).append((r["v"], r["n"]))
    again = []
    for key, pairs in groups.items():
        if key in stored.hour_pct or any(n <= 0 for _, n in pairs):
            again.append(key)
        else:
            merged.hour_pct[key] = totals.nearest_rank(pairs)
    if not again:
        return
    on = ["queue", "hour", "kind"]
    wanted = facts.literal_rows(spark, "queue string, hour long, kind string", again)
    in_hours = facts.in_list("hour", sorted({h for _, h, _ in again}))
    base = read_table(spark, facts_dir, "values_h").where(in_hours).join(wanted, on,
                                                                         "left_semi")
    change = d_values.where(in_hours).join(wanted, on, "left_semi")
    for key in again:
        merged.hour_pct.pop(key, None)
    for r in T.rows(facts.hour_percentiles(facts.add_table("values", base, change))):
        merged.hour_pct[(r["queue"], r["hour"], r["kind"])] = [r["n"], *[r[p] for p in
                                                                          totals.PNAMES]]


def slowest(spark: SparkSession, rows: DataFrame, raw_keys: DataFrame, stored: totals.Totals,
            change: totals.Totals, old: set[tuple[str, str, Any]]) -> dict[Any, float]:
    """The candidates for each queue's slowest messages: the stored SLOW_KEEP of each queue
    but the recomputed ones, and the recomputed ones.  Exact for the top summary.TOP unless
    recomputation took more than SLOW_KEEP - TOP from a queue's full list; such queues are
    ranked from all their rows."""
    kept = {k: v for k, v in stored.slow.items() if k not in old}
    had: dict[str, int] = {}
    left: dict[str, int] = {}
    for k in stored.slow:
        had[k[0]] = had.get(k[0], 0) + 1
    for k in kept:
        left[k[0]] = left.get(k[0], 0) + 1
    short = sorted(q for q, n in had.items() if n >= SLOW_KEEP and left.get(q, 0) < summary.TOP)
    kept.update(change.slow)
    if short:
        whole = state.join_keys(rows.where(facts.in_list("queue", short)), raw_keys, "left_anti")
        kept = {k: v for k, v in kept.items() if k[0] not in short or k in change.slow}
        for r in T.rows(T.top_per_queue(slow_candidates(whole), T.slowest_order(),
                                        summary.TOP)):
            kept[(r["queue"], r["msg_id"], r["host"])] = float(r["run_s"])
    return kept
