"""Additive facts of a message table, and the run's aggregates from them (issues 5, 19).

Every number of summary.json and hourly.json is computed from a few tables of counts that add up
across messages, so that the facts of a set of messages are the sum of the facts of its parts:

* `queue_hour` — (queue, hour of the final transition): messages by final state;
* `queues` — (queue): counts by final state, unfinished, events, retries, first and last ts;
* `values` — (queue, hour, kind, v): how many spans of `kind` (wait, run; hour = the hour the
  span ended) and times to the final state (total; hour null) took v microseconds;
* `errors` — (queue, status): messages that ended err with that status.

`make(messages, sign)` counts a message table with weight +1 or -1, `merge` adds two sets of
facts, so a run on carried state (rq.analytics.state) adds, to the facts of the stored state,
those of its recomputed messages minus those of the same messages' stored rows.  The sums are
exact (integers: counts and microseconds), so the result does not depend on the order or the
grouping of the parts: the incremental path equals the full recompute by construction.

Definitions this fixes (docs/analytics.md): span lengths are taken to the microsecond; a
percentile is the exact nearest rank (the smallest value with at least p of the values at or
below it) at any size, and a mean is the exact sum over the count.

Percentiles from the facts: per (queue, hour) by one window over that hour's values
(`nearest_rank`); per queue and over everything in two steps, since a queue holds millions of
values: counts per coarse bucket (`bucket`: an eighth of a power of two) say which bucket holds
each rank, and only those buckets' values are read and ranked (`group_percentiles`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from decimal import Decimal
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from rq.analytics import summary
from rq.analytics import transform as T

US = 1_000_000
# p50, p90, p99 as exact fractions: rank = ceil(n * a / b), in integers.
PCTS = ((1, 2), (9, 10), (99, 100))
PNAMES = ("p50", "p90", "p99")
KINDS = ("wait", "run", "total")
STATES = ("done", "err", "relayed", "deleted")
COUNTS = ("unfinished", "events", "resend", "lease_expired", "recovered")
WAIT_EDGES_US = [round(e * US) for e in summary.WAIT_EDGES]
SUM_TYPE = "decimal(38,0)"    # a sum of microseconds that cannot overflow


def micros(seconds: Column) -> Column:
    return F.round(seconds * US).cast("long")


def bucket(v: str) -> Column:
    """A coarse bucket of column `v` (microseconds), monotone in v: 8 per power of two (the
    bit length and the 3 bits after the leading one), negative for negative v.  Integer
    arithmetic only (bin() gives the bit length), so every JVM agrees."""
    bits = f"length(bin(abs({v})))"
    eighth = f"(shiftright(abs({v}), greatest({bits} - 4, 0)) % 8)"
    return F.expr(f"cast(signum({v}) as int) * ({bits} * 8 + cast({eighth} as int))")


# ---------------------------------------------------------------- the facts


@dataclass(frozen=True)
class Facts:
    queue_hour: DataFrame
    queues: DataFrame
    values: DataFrame
    errors: DataFrame


def make(messages: DataFrame, sign: int = 1) -> Facts:
    """The facts of a message table (transform.message_table's columns), each message
    counted `sign` (+1 or -1) times."""
    sg = F.lit(sign).cast("long")
    state = F.col("final_state")

    def cnt(cond: Column, name: str) -> Column:
        return F.sum(F.when(cond, sg).otherwise(F.lit(0).cast("long"))).alias(name)

    by_state = [cnt(state == s, s) for s in STATES]
    queue_hour = (messages.where(F.col("final_ts").isNotNull())
                  .withColumn("hour", T.hour_of(F.col("final_ts")))
                  .groupBy("queue", "hour").agg(*by_state))
    queues = messages.groupBy("queue").agg(
        *by_state, cnt(state.isNull(), "unfinished"),
        F.sum(F.col("events") * sg).alias("events"),
        F.sum(F.col("resends") * sg).alias("resend"),
        F.sum(F.col("lease_expiries") * sg).alias("lease_expired"),
        F.sum(F.col("recoveries") * sg).alias("recovered"),
        F.min("first_ts").alias("first_ts"), F.max("last_ts").alias("last_ts"))
    spans = messages.select("queue", F.explode("spans").alias("sp")).select(
        "queue", T.hour_of(F.col("sp.end_ts")).alias("hour"), F.col("sp.kind").alias("kind"),
        micros(F.col("sp.s")).alias("v"))
    totals = messages.where(state.isin(*T.FINAL) & F.col("total_s").isNotNull()).select(
        "queue", F.lit(None).cast("long").alias("hour"), F.lit("total").alias("kind"),
        micros(F.col("total_s")).alias("v"))
    values = (spans.unionByName(totals).groupBy("queue", "hour", "kind", "v")
              .agg(F.sum(sg).alias("n")))
    errors = (messages.where(state == "err")
              .groupBy("queue", F.coalesce(F.col("status"), F.lit("")).alias("status"))
              .agg(F.sum(sg).alias("n")))
    return Facts(queue_hour, queues, values, errors)


def add(a: DataFrame, b: DataFrame, keys: Sequence[str], nonzero: Sequence[str],
        extremes: Mapping[str, Callable[[str], Column]] = {}) -> DataFrame:
    """Rows of `a` and `b` summed by `keys` (`extremes`: columns combined by min/max instead);
    rows whose `nonzero` columns all sum to 0 are dropped."""
    sums = [c for c in a.columns if c not in keys and c not in extremes]
    out = a.unionByName(b).groupBy(*keys).agg(
        *[F.sum(c).alias(c) for c in sums], *[f(c).alias(c) for c, f in extremes.items()])
    keep = F.lit(False)
    for c in nonzero:
        keep |= F.col(c) != 0
    return out.where(keep)


# How each table of Facts adds up: (keys, columns of which one must be nonzero, min/max columns).
SUMS: dict[str, tuple[list[str], tuple[str, ...], dict[str, Callable[[str], Column]]]] = {
    "queue_hour": (["queue", "hour"], STATES, {}),
    # first_ts, last_ts: the min and max of both parts, exact when the second part only adds
    # events to messages (a run on carried state: rq.analytics.state).
    "queues": (["queue"], (*STATES, *COUNTS), {"first_ts": F.min, "last_ts": F.max}),
    "values": (["queue", "hour", "kind", "v"], ("n",), {}),
    "errors": (["queue", "status"], ("n",), {}),
}


def add_table(name: str, a: DataFrame, b: DataFrame) -> DataFrame:
    keys, nonzero, extremes = SUMS[name]
    return add(a, b, keys, nonzero, extremes)


def merge(a: Facts, b: Facts) -> Facts:
    """The facts of two parts together."""
    return Facts(*(add_table(name, getattr(a, name), getattr(b, name)) for name in SUMS))


# ---------------------------------------------------------------- tables derived from values


def by_queue(values: DataFrame) -> DataFrame:
    """(queue, kind, b, v, n): the values without their hour, with their bucket."""
    return (values.groupBy("queue", "kind", "v").agg(F.sum("n").alias("n"))
            .where(F.col("n") != 0).withColumn("b", bucket("v")))


def coarse(values_b: DataFrame) -> DataFrame:
    """(queue, kind, b, n): how many values of each bucket."""
    return values_b.groupBy("queue", "kind", "b").agg(F.sum("n").alias("n"))


def value_stats(values_b: DataFrame) -> DataFrame:
    """(queue, kind, n, sum, h0…): count, exact sum (microseconds) and the wait histogram."""
    v, n = F.col("v"), F.col("n")
    edges = WAIT_EDGES_US
    bins = [F.sum(F.when((v >= lo) & (v < hi), n).otherwise(0)).alias(f"h{i}")
            for i, (lo, hi) in enumerate(zip(edges, edges[1:]))]
    bins.append(F.sum(F.when(v >= edges[-1], n).otherwise(0)).alias(f"h{len(edges) - 1}"))
    return values_b.groupBy("queue", "kind").agg(
        F.sum(n).alias("n"), F.sum(v.cast(SUM_TYPE) * n).alias("sum"), *bins)


def nearest_rank(values: DataFrame, group: Sequence[str]) -> DataFrame:
    """Per group of `values` (group…, v, n > 0): `n` and the nearest-rank p50, p90, p99 (in
    microseconds)."""
    upto = (Window.partitionBy(*group).orderBy("v")
            .rowsBetween(Window.unboundedPreceding, Window.currentRow))
    whole = Window.partitionBy(*group)
    ranked = values.select(*group, "v", "n", F.sum("n").over(upto).alias("_c"),
                           F.sum("n").over(whole).alias("_t"))
    c, n, t = F.col("_c"), F.col("n"), F.col("_t")
    picks = [F.min(F.when((c >= F.expr(f"(_t * {a} + {b - 1}) div {b}"))
                          & (c - n < F.expr(f"(_t * {a} + {b - 1}) div {b}")), F.col("v")))
             .alias(name) for (a, b), name in zip(PCTS, PNAMES)]
    return ranked.groupBy(*group).agg(F.max(t).alias("n"), *picks)


def hour_percentiles(values: DataFrame) -> DataFrame:
    """(queue, hour, kind, n, p50, p90, p99) of the wait and run spans of each hour."""
    spans = values.where(F.col("hour").isNotNull() & (F.col("kind") != "total"))
    return nearest_rank(spans.select("queue", "hour", "kind", "v", "n"),
                        ["queue", "hour", "kind"])


def sql_literal(value: Any) -> str:
    """`value` (None, int, float or str) as a Spark SQL literal."""
    if value is None:
        return "NULL"
    if isinstance(value, str):
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
    return repr(value)


def literal_rows(spark: SparkSession, schema: str, rows: Iterable[Sequence[Any]]) -> DataFrame:
    """A small DataFrame of literal rows, planned in the JVM (no Python workers) from one SQL
    text: a Column per value would be a Py4J call each (~1 ms of Python apiece)."""
    names = [part.split()[0] for part in schema.split(",")]
    types = [part.split()[1] for part in schema.split(",")]
    values = ", ".join("(" + ", ".join(f"CAST({sql_literal(v)} AS {t})"
                                       for t, v in zip(types, row)) + ")" for row in rows)
    if not values:
        return spark.sql(f"SELECT * FROM VALUES ({', '.join(f'CAST(NULL AS {t})' for t in types)})"
                         f" AS t({', '.join(names)}) WHERE false")
    return spark.sql(f"SELECT * FROM VALUES {values} AS t({', '.join(names)})")


def in_list(column: str, values: Iterable[Any]) -> Column:
    """`column IN (values…)` as one SQL expression (Column.isin makes a Py4J call a value)."""
    return F.expr(f"{column} IN ({', '.join(sql_literal(v) for v in values)})")


def group_percentiles(spark: SparkSession, coarse_rows: Sequence[Mapping[str, Any]],
                      values_b: Callable[[list[int]], DataFrame]
                      ) -> dict[tuple[str | None, str], list[float | None]]:
    """Nearest-rank p50, p90, p99 (seconds) per (queue, kind) and (None, kind) (every queue).
    `coarse_rows`: (queue, kind, b, n) collected; `values_b(buckets)`: the (queue, kind, b, v,
    n) rows, of at least those buckets (a reader can skip the rest)."""
    counts: dict[tuple[str | None, str], dict[int, int]] = {}
    for r in coarse_rows:
        n = int(r["n"])
        if n:
            for group in ((r["queue"], r["kind"]), (None, r["kind"])):
                per = counts.setdefault(group, {})
                per[int(r["b"])] = per.get(int(r["b"]), 0) + n
    targets = []          # (queue or None, kind, bucket, rank within the bucket, name)
    for (queue, kind), per in counts.items():
        total = sum(per.values())
        for (a, b), name in zip(PCTS, PNAMES):
            rank = (total * a + b - 1) // b
            seen = 0
            for bk in sorted(per):
                if seen + per[bk] >= rank:
                    targets.append((queue, kind, bk, rank - seen, name))
                    break
                seen += per[bk]
    out: dict[tuple[str | None, str], list[float | None]] = {
        g: [None, None, None] for g in counts}
    if not targets:
        return out
    buckets = sorted({t[2] for t in targets})
    fine = values_b(buckets).where(in_list("b", buckets))
    key3 = "concat_ws('|', kind, cast(b as string), queue)"
    key2 = "concat_ws('|', kind, cast(b as string))"
    per_queue = fine.where(in_list(key3, sorted({f"{k}|{b}|{q}" for q, k, b, _, _ in targets
                                                 if q is not None})))
    everything = (fine.where(in_list(key2, sorted({f"{k}|{b}" for q, k, b, _, _ in targets
                                                  if q is None})))
                  .groupBy("kind", "b", "v").agg(F.sum("n").alias("n"))
                  .withColumn("queue", F.lit(None).cast("string")))
    rows = per_queue.select("queue", "kind", "b", "v", "n").unionByName(
        everything.select("queue", "kind", "b", "v", "n"))
    upto = (Window.partitionBy("queue", "kind", "b").orderBy("v")
            .rowsBetween(Window.unboundedPreceding, Window.currentRow))
    ranked = rows.withColumn("_c", F.sum("n").over(upto))
    wanted = literal_rows(spark, "_q string, _k string, _b int, _r long, _name string", targets)
    on = (ranked["queue"].eqNullSafe(wanted["_q"]) & (ranked["kind"] == wanted["_k"])
          & (ranked["b"] == wanted["_b"]) & (ranked["_c"] >= wanted["_r"])
          & (ranked["_c"] - ranked["n"] < wanted["_r"]))
    for r in T.rows(ranked.join(F.broadcast(wanted), on).select("_q", "_k", "_name", "v")):
        out[(r["_q"], r["_k"])][PNAMES.index(r["_name"])] = r["v"] / US
    return out


# ---------------------------------------------------------------- the run's aggregates


@dataclass(frozen=True)
class Tables:
    """What the summary is computed from: facts and the tables derived from their values.
    `values_b(buckets)` gives the (queue, kind, b, v, n) rows of at least those buckets."""
    queue_hour: DataFrame
    queues: DataFrame
    stats: DataFrame           # value_stats
    coarse: DataFrame
    hour_pct: DataFrame        # hour_percentiles
    errors: DataFrame
    values_b: Callable[[list[int]], DataFrame]
    cached: tuple[DataFrame, ...] = ()


def tables(facts: Facts) -> Tables:
    """Every table of a run from its facts (the full recompute; state.build): the values are
    cached, and their per-queue form, each read three times."""
    values = facts.values.persist()
    values_b = by_queue(values).persist()
    return Tables(facts.queue_hour, facts.queues, value_stats(values_b), coarse(values_b),
                  hour_percentiles(values), facts.errors, lambda _b: values_b,
                  (values, values_b))


def carried(spark: SparkSession, stored: Callable[[str], DataFrame], delta: Facts) -> Tables:
    """The tables of stored facts plus `delta` (the facts of a run's recomputed messages
    minus those of their stored rows): sums of small tables, and of the value tables only
    what the delta touches.  `stored(name)` reads a table state.write_facts wrote."""
    d_values = delta.values.where(F.col("n") != 0).persist()
    d_b = by_queue(d_values).persist()
    stats = add(stored("stats"), value_stats(d_b), ["queue", "kind"], ("n",))
    coarse_t = add(stored("coarse"), coarse(d_b), ["queue", "kind", "b"], ("n",))

    def values_b(buckets: list[int]) -> DataFrame:
        base = stored("values_b").where(in_list("b", buckets))
        return add(base, d_b.where(in_list("b", buckets)), ["queue", "kind", "b", "v"],
                   ("n",))

    # Hours whose spans changed: their percentiles from the stored values of those hours
    # (read by hour: the table is sorted by it) plus the delta; the other hours' are kept.
    touched = (d_values.where(F.col("hour").isNotNull() & (F.col("kind") != "total"))
               .select("queue", "hour", "kind").distinct())
    hours = sorted({r["hour"] for r in touched.select("hour").distinct().collect()})
    on = ["queue", "hour", "kind"]
    if hours:
        base = stored("values_h").where(in_list("hour", hours)).join(touched, on, "left_semi")
        fresh = hour_percentiles(add_table("values", base,
                                           d_values.where(in_list("hour", hours))))
        hour_pct = stored("hour_pct").join(touched, on, "left_anti").unionByName(fresh)
    else:
        hour_pct = stored("hour_pct")
    return Tables(add_table("queue_hour", stored("queue_hour"), delta.queue_hour),
                  add_table("queues", stored("queues"), delta.queues),
                  stats, coarse_t, hour_pct, add_table("errors", stored("errors"), delta.errors),
                  values_b, (d_values, d_b))


def stored_tables(stored: Callable[[str], DataFrame]) -> Tables:
    """The tables of stored facts as they are (a run with no raw events)."""
    return Tables(stored("queue_hour"), stored("queues"), stored("stats"), stored("coarse"),
                  stored("hour_pct"), stored("errors"),
                  lambda buckets: stored("values_b").where(in_list("b", buckets)))


def release(t: Tables) -> None:
    for df in t.cached:
        df.unpersist()


def with_values(t: Tables, values_b: Callable[[list[int]], DataFrame]) -> Tables:
    return replace(t, values_b=values_b)


def dist_fields(prefix: str, stats: Mapping[str, Any] | None,
                pct: Sequence[float | None] | None) -> dict[str, Any]:
    n = int((stats or {}).get("n") or 0)
    total = (stats or {}).get("sum")
    mean = (int(Decimal(total)) / n) / US if n and total is not None else None
    return {f"{prefix}_p": list(pct) if pct else [None, None, None],
            f"{prefix}_mean": mean, f"{prefix}_n": n}


def summary_rows(spark: SparkSession, t: Tables
                 ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(msg_rows, span_rows) in the grouping-set form rq.analytics.summary reads: g = 0
    (queue, hour), 1 (queue) and 3 (everything)."""
    # The three small tables in one query (a Spark job each costs more than their rows).
    tagged = (t.queues.withColumn("_t", F.lit(0))
              .unionByName(t.stats.withColumn("_t", F.lit(1)), allowMissingColumns=True)
              .unionByName(t.coarse.withColumn("_t", F.lit(2)), allowMissingColumns=True))
    columns = (t.queues.columns, t.stats.columns, t.coarse.columns)
    parts: tuple[list[dict[str, Any]], ...] = ([], [], [])
    for r in T.rows(tagged):
        tag = r["_t"]
        parts[tag].append({c: r[c] for c in columns[tag]})
    queues, stats, coarse_rows = parts
    pct = group_percentiles(spark, coarse_rows, t.values_b)
    msg_rows: list[dict[str, Any]] = []
    span_rows: list[dict[str, Any]] = []
    stat = {(r["queue"], r["kind"]): r for r in stats}
    every: dict[str, dict[str, Any]] = {}
    for r in stats:
        e = every.setdefault(r["kind"], {"n": 0, "sum": Decimal(0)})
        for k, v in r.items():
            if k not in ("queue", "kind"):
                e[k] = e.get(k, 0) + (v or 0)
    all_row: dict[str, Any] = {s: 0 for s in (*STATES, *COUNTS)}
    all_row.update(first_ts=None, last_ts=None)
    for q in queues:
        row = {"g": summary.G_QUEUE, "hour": None, **q}
        row.update(dist_fields("total", stat.get((q["queue"], "total")),
                               pct.get((q["queue"], "total"))))
        msg_rows.append(row)
        for s in (*STATES, *COUNTS):
            all_row[s] += int(q[s] or 0)
        for k, pick in (("first_ts", min), ("last_ts", max)):
            if q[k] is not None:
                all_row[k] = q[k] if all_row[k] is None else pick(all_row[k], q[k])
        span_rows.append(span_row(summary.G_QUEUE, q["queue"], stat, pct))
    if queues:
        all_row.update({"g": summary.G_ALL, "queue": None, "hour": None})
        all_row.update(dist_fields("total", every.get("total"), pct.get((None, "total"))))
        msg_rows.append(all_row)
        span_rows.append(span_row(summary.G_ALL, None, {(None, k): v for k, v in every.items()},
                                  pct))
    # The hours: counts and percentiles side by side, one row per (queue, hour) collected.
    wide = t.hour_pct.groupBy("queue", "hour").agg(*[
        F.max(F.when(F.col("kind") == kind, F.col(c))).alias(f"{kind}_{c}")
        for kind in ("wait", "run") for c in ("n", *PNAMES)])
    for r in T.rows(t.queue_hour.join(wide, ["queue", "hour"], "full_outer")):
        key = {"g": summary.G_QUEUE_HOUR, "queue": r["queue"], "hour": r["hour"]}
        if r["done"] is not None:
            msg_rows.append({**key, **{s: r[s] for s in STATES}})
        if r["wait_n"] is not None or r["run_n"] is not None:
            row = dict(key)
            for kind in ("wait", "run"):
                n = r[f"{kind}_n"]
                row[f"{kind}_p"] = None if n is None else [
                    None if r[f"{kind}_{p}"] is None else r[f"{kind}_{p}"] / US for p in PNAMES]
                row[f"{kind}_mean"], row[f"{kind}_n"] = None, int(n or 0)
            span_rows.append(row)
    return msg_rows, span_rows


def span_row(g: int, queue: str | None, stat: Mapping[tuple[str | None, str], Any],
             pct: Mapping[tuple[str | None, str], list[float | None]]) -> dict[str, Any]:
    row: dict[str, Any] = {"g": g, "queue": queue, "hour": None}
    for kind in ("wait", "run"):
        row.update(dist_fields(kind, stat.get((queue, kind)), pct.get((queue, kind))))
    wait = stat.get((queue, "wait")) or {}
    for i in range(len(WAIT_EDGES_US)):
        row[f"wait_h{i}"] = int(wait.get(f"h{i}") or 0)
    return row


def message_count(msg_rows: Iterable[Mapping[str, Any]]) -> int:
    """How many messages the summary counts: every one is finished, deleted or unfinished."""
    for r in msg_rows:
        if r["g"] == summary.G_ALL:
            return sum(int(r[s] or 0) for s in (*STATES, "unfinished"))
    return 0
