"""Pure transforms of the analytics job (issue 5): DataFrames in, DataFrames out, no IO.

Everything here runs inside the JVM (Spark built-in functions only, no Python UDF), so a
cluster's executors need nothing of ours.  The stages:

1. `mark_torn_tail` / `check_lines` — the S13.4 reader checks of every line (`value`, `torn`,
   optional `pos`, the line's place in its file): torn (no final
   newline), layout (S13.2), CRC-32 (`crc32` of the payload's UTF-8 bytes, 8 lowercase hex digits)
   and JSON (`from_json` with an explicit schema: an object with `ts`, `queue`, `msg_id`, `to`).
   Failing lines keep a `reason` and are skipped downstream.
2. `window_events` — valid events with `since <= ts < until`.
3. `message_table` — one row per message (host, queue, msg_id): its events sorted by `ts` (so order
   across files and hosts does not matter), wait and run spans, retries, final state.
4. `slowest` for the slowest messages; the counts and percentiles come from the
   message table's additive facts (rq.analytics.facts).  rq.analytics.summary turns the
   collected rows into the JSON of docs/analytics.md.

Definitions (docs/analytics.md): a *wait span* is que → run (entry into que to the start), a *run
span* is run → next state (the event's `duration`, else the time since the run started); a *resend*
is run → que not caused by a restart or lease expiry, or run → err `HIT MAX RESEND COUNT` (S5.4); a
*lease expiry* is a run → que/err whose status starts `LEASE EXPIRED` (S8.3); a *recovery* is
run → que with `QUEUE RESTARTED` (S2.7) or `QUEUE SHUTDOWN` (S2.5).
"""

from __future__ import annotations

import json
from typing import Any

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql.types import DoubleType, FloatType, StringType, StructField, StructType

FINAL = ("done", "err", "relayed")
PREFIX = '{"crc32":"'
MIDDLE = '","event":'
PAYLOAD_AT = 29             # 1-based position of PAYLOAD in the line (byte offset 28, S13.2)
HOUR = 3600
HIT_MAX = "HIT MAX RESEND COUNT - MOVING TO ERR"   # S5.4
RECOVERY_PREFIXES = ("QUEUE RESTARTED", "QUEUE SHUTDOWN")  # S2.7, S2.5
LEASE_PREFIX = "LEASE EXPIRED"                      # S8.3
CORRUPT = "_corrupt"

# The S13.3 fields the job uses (count, pid, exit_code, consumer are not needed: leaving them
# out of the schema saves converting them).
EVENT_SCHEMA = StructType([
    StructField("ts", DoubleType()), StructField("host", StringType()),
    StructField("queue", StringType()), StructField("msg_id", StringType()),
    StructField("from", StringType()), StructField("to", StringType()),
    StructField("status", StringType()), StructField("duration", DoubleType()),
    StructField(CORRUPT, StringType()),
])
EVENT_FIELDS = [f.name for f in EVENT_SCHEMA.fields if f.name != CORRUPT]
# The columns of a run's messages/ table (docs/analytics.md).
MESSAGE_COLUMNS = ["queue", "msg_id", "host", "final_state", "wait_s", "run_s", "total_s",
                   "resends", "lease_expiries", "recoveries", "first_ts", "final_ts", "status",
                   "events"]
# A message's key, most selective first: the sort behind the per-message window compares a
# prefix of the first column, and `host` is often one value for everything.
KEY = ["msg_id", "queue", "host"]
# The per-message shuffle and sort lead with a 64-bit hash of KEY: the sort then decides almost
# every comparison on its 8-byte prefix instead of comparing strings (msg ids such as `m17`
# repeat across queues and share prefixes).  KEY itself follows, so a hash collision cannot
# merge two messages.
HASH = "_k"


# ---------------------------------------------------------------- S13.4 line checks


def mark_torn_tail(lines: DataFrame) -> DataFrame:
    """For lines of files whose last byte is not a newline: `torn` = the file's last line.

    `lines` has `value`, `file` and `pos` (increasing along a file); the result adds `torn`.
    (`pos` comes from monotonically_increasing_id: a file's splits are numbered in order.)
    """
    last = lines.groupBy("file").agg(F.max("pos").alias("_last"))
    return (lines.join(F.broadcast(last), "file")
            .withColumn("torn", F.col("pos") == F.col("_last")).drop("_last"))


def check_lines(lines: DataFrame, keep: tuple[str, ...] = ()) -> DataFrame:
    """S13.4: `reason` (torn, layout, crc, json or null when valid) plus the payload's fields
    (and the columns `keep` of `lines`, passed through)."""
    v = F.col("value")
    # Byte positions throughout (S13.2 places PAYLOAD at byte offset 28): Spark's string
    # substring and length count characters, a scan of the whole line per call, which made
    # them the dearest part of the check; binary substrings slice bytes.
    raw = v.cast("binary")
    crc_hex = F.substring(raw, 11, 8).cast("string")
    layout = ((F.octet_length(v) > PAYLOAD_AT)
              & v.startswith(PREFIX)
              & crc_hex.rlike("^[0-9a-f]{8}$")
              & (F.substring(raw, 19, len(MIDDLE)) == F.lit(bytearray(MIDDLE.encode())))
              & v.endswith("}"))
    payload = F.expr(f"substring(cast(value as binary), {PAYLOAD_AT}, "
                     f"octet_length(value) - {PAYLOAD_AT})")
    pos = F.col("pos") if "pos" in lines.columns else F.monotonically_increasing_id()
    # The payload is cut out once, in its own projection: from_json runs interpreted, and
    # would otherwise evaluate the substring again for itself.
    cut = lines.select(
        pos.alias("pos"), F.coalesce(F.col("torn"), F.lit(False)).alias("_torn"),
        layout.alias("_layout"), F.when(layout, crc_hex).alias("_hex"),
        F.when(layout, payload).alias("_p"), *keep)
    # Compared as numbers (the layout check has made the text 8 lowercase hex digits): about
    # twice as fast as formatting every CRC as text.
    crc_ok = F.crc32("_p") == F.conv("_hex", 16, 10).cast("long")
    event = F.from_json(F.col("_p").cast("string"), EVENT_SCHEMA,
                        {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT})
    parsed = cut.select("pos", "_torn", "_layout", F.when(F.col("_layout"), crc_ok).alias("_crc"),
                        F.when(F.col("_layout"), event).alias("e"), *keep)
    e = F.col("e")
    json_ok = (e[CORRUPT].isNull() & e["ts"].isNotNull() & e["queue"].isNotNull()
               & e["msg_id"].isNotNull() & e["to"].isNotNull())
    reason = (F.when(F.col("_torn"), "torn").when(~F.col("_layout"), "layout")
              .when(~F.col("_crc"), "crc").when(~json_ok, "json"))
    return parsed.select(reason.alias("reason"), "pos", *[e[f].alias(f) for f in EVENT_FIELDS],
                         *keep)


REASONS = ("torn", "layout", "crc", "json")


def line_count_columns() -> list[Column]:
    """Aggregates over checked lines: `valid` and one count per S13.4 reason.  Used with
    DataFrame.observe, so the lines are counted in the same pass that reads them."""
    reason = F.col("reason")
    return [F.count(F.when(reason.isNull(), 1)).alias("valid"),
            *[F.count(F.when(reason == r, 1)).alias(r) for r in REASONS]]


def line_counts(checked: DataFrame) -> DataFrame:
    """One row: `valid` and the count of each reason (as line_count_columns)."""
    return checked.agg(*line_count_columns())


def window_events(checked: DataFrame, since: float | None, until: float | None) -> DataFrame:
    """Valid events with since <= ts < until (either bound may be None)."""
    cond = F.col("reason").isNull()
    if since is not None:
        cond &= F.col("ts") >= F.lit(float(since))
    if until is not None:
        cond &= F.col("ts") < F.lit(float(until))
    return checked.where(cond).drop("reason")


# ---------------------------------------------------------------- per message


def message_steps(events: DataFrame, keep: tuple[str, ...] = ()) -> DataFrame:
    """Each event with the span it closes and the retry it is, from the previous event of
    its message in ts order (plus the columns `keep` of `events`, passed through)."""
    # Events of one message logged in the same millisecond keep their order in the file: one
    # queue process appends them in order to one file (S13.1), and `pos` grows along a file.
    order = Window.partitionBy(HASH, *KEY).orderBy("ts", "pos")
    frm, to, status = F.col("from"), F.col("to"), F.coalesce(F.col("status"), F.lit(""))
    since_prev = F.col("ts") - F.col("_prev_ts")
    recovered = (frm == "run") & (to == "que") & (
        status.startswith(RECOVERY_PREFIXES[0]) | status.startswith(RECOVERY_PREFIXES[1]))
    lease = (frm == "run") & status.startswith(LEASE_PREFIX)
    resend = (frm == "run") & ~lease & (
        ((to == "que") & ~recovered) | ((to == "err") & (status == HIT_MAX)))
    wait_s = F.when((frm == "que") & (to == "run") & (F.col("_prev_to") == "que"), since_prev)
    run_s = F.when(frm == "run", F.coalesce(
        F.col("duration"), F.when(F.col("_prev_to") == "run", since_prev)))
    return (events
            .withColumn(HASH, F.xxhash64(*KEY))
            .withColumn("_prev_to", F.lag("to").over(order))
            .withColumn("_prev_ts", F.lag("ts").over(order))
            .select(HASH, *KEY, "ts", "pos", "from", "to", "status",
                    wait_s.alias("wait_s"), run_s.alias("run_s"),
                    resend.cast("int").alias("resend"), lease.cast("int").alias("lease"),
                    recovered.cast("int").alias("recovered"), *keep))


def message_table(events: DataFrame, extra: tuple[Column, ...] = (),
                  keep: tuple[str, ...] = ()) -> DataFrame:
    """One row per message: the docs/analytics.md `messages` columns plus `events`,
    `last_ts` and `spans` (array of {kind, end_ts, s}); `extra` aggregates (named) over the
    columns `keep` of `events` are added at the end (rq.analytics.state: the days a message's
    events came from)."""
    steps = message_steps(events, keep)
    point = F.struct("ts", "pos", "to", "status")
    span = (F.when(F.col("wait_s").isNotNull(),
                   F.struct(F.lit("wait").alias("kind"), F.col("ts").alias("end_ts"),
                            F.col("wait_s").alias("s")))
            .when(F.col("run_s").isNotNull(),
                  F.struct(F.lit("run").alias("kind"), F.col("ts").alias("end_ts"),
                           F.col("run_s").alias("s"))))
    # Grouped like the window's partitions, so no second shuffle; with
    # spark.sql.execution.replaceHashWithSortAgg (session.default_conf) it streams over the
    # window's sorted output instead of hashing two million keys.
    agg = steps.groupBy(HASH, *KEY).agg(
        F.count(F.lit(1)).alias("events"),
        F.min("ts").alias("first_ts"), F.max("ts").alias("last_ts"),
        F.min(F.when(F.col("from").isNull(), F.col("ts"))).alias("created_ts"),
        F.max(point).alias("_last"),
        F.max(F.when(F.col("to").isin(*FINAL), point)).alias("_fin"),
        F.sum("wait_s").alias("wait_s"), F.sum("run_s").alias("run_s"),
        F.sum("resend").alias("resends"), F.sum("lease").alias("lease_expiries"),
        F.sum("recovered").alias("recoveries"),
        F.collect_list(span).alias("spans"), *extra)
    last, fin = F.col("_last"), F.col("_fin")
    deleted = last["to"] == "deleted"
    final_ts = F.coalesce(fin["ts"], F.when(deleted, last["ts"]))
    return agg.select(
        "queue", "msg_id", "host",
        F.coalesce(fin["to"], F.when(deleted, F.lit("deleted"))).alias("final_state"),
        "wait_s", "run_s", (final_ts - F.col("created_ts")).alias("total_s"),
        "resends", "lease_expiries", "recoveries", "first_ts", final_ts.alias("final_ts"),
        F.coalesce(fin["status"], last["status"]).alias("status"),
        "events", "last_ts", "created_ts", "spans",
        *agg.columns[len(agg.columns) - len(extra):])


# ---------------------------------------------------------------- aggregates


def hour_of(ts: Column) -> Column:
    """The start of the UTC hour of `ts` (epoch seconds)."""
    return (F.floor(ts / HOUR) * HOUR).cast("long")


def top_per_queue(df: DataFrame, order: list[Column], n: int = 10) -> DataFrame:
    """The first `n` rows of each queue in `order`, with `rank` (1-based)."""
    w = Window.partitionBy("queue").orderBy(*order)
    return df.withColumn("rank", F.row_number().over(w)).where(F.col("rank") <= n)


def slowest_order() -> list[Column]:
    """Longest run first; host last: two messages of one queue may share a msg_id (a message
    is its host, queue and id), and their rank must not be left to chance."""
    return [F.col("run_s").desc(), F.col("msg_id"), F.col("host")]


def slowest(messages: DataFrame, n: int = 10) -> DataFrame:
    """Per queue, the `n` messages with the longest total run time."""
    return top_per_queue(messages.where(F.col("run_s").isNotNull())
                         .select("queue", "msg_id", "host", "run_s"), slowest_order(), n)


def union_all(parts: list[DataFrame]) -> DataFrame:
    """The rows of every DataFrame of `parts` (at least one), by column name."""
    out = parts[0]
    for part in parts[1:]:
        out = out.unionByName(part)
    return out


def rows(df: DataFrame) -> list[dict[str, Any]]:
    """Collect `df` to plain dicts (small aggregates only).  Each row crosses Py4J as one JSON
    text (to_json) decoded by the C parser: the first run's facts (256,000 rows) come ~1.6 s
    sooner than as Row objects turned into dicts (docs/benchmarks.md, fifteenth session).
    Integers (decimals too) come back as int, doubles as float (Java's text of a double reads back
    as the same double), a null as None."""
    names = df.columns
    doubles = [f.name for f in df.schema.fields if isinstance(f.dataType, (DoubleType, FloatType))]
    out = []
    packed = df.select(F.to_json(F.struct(*[df[c] for c in names])).alias("_json"))
    for (text,) in packed.collect():
        got = json.loads(text)
        row = {c: got.get(c) for c in names}  # to_json leaves null fields out
        for c in doubles:
            if isinstance(row[c], str):  # NaN and the infinities are written as text
                row[c] = float(row[c])
        out.append(row)
    return out
