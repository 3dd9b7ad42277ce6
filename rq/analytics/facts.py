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
from dataclasses import dataclass
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from rq.analytics import summary
from rq.analytics import transform as T
from rq.analytics.totals import COUNTS, PCTS, PNAMES, STATES, US

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
    # Shuffled once, by (queue, kind): every table derived from the values groups by keys
    # that include both (by_queue, hour_percentiles, the stored files' sorts), so none of
    # them shuffles the millions of value rows again.  (Values are mostly distinct: a partial
    # aggregation before the shuffle saved little.)
    values = (spans.unionByName(totals).repartition("queue", "kind")
              .groupBy("queue", "hour", "kind", "v").agg(F.sum(sg).alias("n")))
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


def group_percentiles(spark: SparkSession, coarse_counts: Mapping[tuple[str, str, int], int],
                      values_b: Callable[[list[int]], DataFrame]
                      ) -> dict[tuple[str | None, str], list[float | None]]:
    """Nearest-rank p50, p90, p99 (seconds) per (queue, kind) and (None, kind) (every queue).
    `coarse_counts`: (queue, kind, b) → n (totals.Totals.coarse); `values_b(buckets)`: the
    (queue, kind, b, v, n) rows, of at least those buckets (a reader can skip the rest).  A
    value may come in several rows, some with a negative n (a run's change beside the stored
    rows): each value's count is the sum of its rows, so they are never added up first (a
    shuffle of every row of the buckets); the ranking's frames take each value's rows whole."""
    counts: dict[tuple[str | None, str], dict[int, int]] = {}
    for (queue, kind, b), n in coarse_counts.items():
        if n:
            for group in ((queue, kind), (None, kind)):
                per = counts.setdefault(group, {})
                per[b] = per.get(b, 0) + n
    targets = []          # (queue or None, kind, bucket, rank within the bucket, name)
    for (group_queue, kind), per in counts.items():
        total = sum(per.values())
        for (a, b), name in zip(PCTS, PNAMES):
            rank = (total * a + b - 1) // b
            seen = 0
            for bk in sorted(per):
                if seen + per[bk] >= rank:
                    targets.append((group_queue, kind, bk, rank - seen, name))
                    break
                seen += per[bk]
    out: dict[tuple[str | None, str], list[float | None]] = {
        g: [None, None, None] for g in counts}
    if not targets:
        return out
    buckets = sorted({t[2] for t in targets})
    fine = values_b(buckets).where(in_list("b", buckets))
    queue_groups = literal_rows(spark, "queue string, kind string, b int",
                                sorted({(q, k, b) for q, k, b, _, _ in targets if q is not None}))
    all_groups = literal_rows(spark, "kind string, b int",
                              sorted({(k, b) for q, k, b, _, _ in targets if q is None}))
    per_queue = fine.join(F.broadcast(queue_groups), ["queue", "kind", "b"], "left_semi")
    everything = (fine.join(F.broadcast(all_groups), ["kind", "b"], "left_semi")
                  .groupBy("kind", "b", "v").agg(F.sum("n").alias("n"))  # 100 queues' rows
                  .withColumn("queue", F.lit(None).cast("string")))
    rows = per_queue.select("queue", "kind", "b", "v", "n").unionByName(
        everything.select("queue", "kind", "b", "v", "n"))
    # _c: the count of the values up to v, _p: below v (RANGE frames: all rows of a value)
    order = Window.partitionBy("queue", "kind", "b").orderBy("v")
    ranked = rows.select(
        "queue", "kind", "b", "v",
        F.sum("n").over(order.rangeBetween(Window.unboundedPreceding, Window.currentRow))
        .alias("_c"),
        F.coalesce(F.sum("n").over(order.rangeBetween(Window.unboundedPreceding, -1)),
                   F.lit(0)).alias("_p"))
    wanted = literal_rows(spark, "_q string, _k string, _b int, _r long, _name string", targets)
    on = (ranked["queue"].eqNullSafe(wanted["_q"]) & (ranked["kind"] == wanted["_k"])
          & (ranked["b"] == wanted["_b"]) & (ranked["_c"] >= wanted["_r"])
          & (ranked["_p"] < wanted["_r"]))
    for r in T.rows(ranked.join(F.broadcast(wanted), on).select("_q", "_k", "_name", "v")):
        out[(r["_q"], r["_k"])][PNAMES.index(r["_name"])] = r["v"] / US
    return out


# ---------------------------------------------------------------- collected in one query


def collect(parts: Mapping[str, DataFrame]) -> dict[str, list[dict[str, Any]]]:
    """The rows of several small DataFrames from one query (a Spark job costs more than such
    rows do): their union by name, tagged, split again by tag, each row with its own
    table's columns."""
    names = list(parts)
    if not names:
        return {}
    tagged = None
    for i, name in enumerate(names):
        df = parts[name].withColumn("_t", F.lit(i))
        tagged = df if tagged is None else tagged.unionByName(df, allowMissingColumns=True)
    columns = [parts[name].columns for name in names]
    out: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    assert tagged is not None
    for r in T.rows(tagged):
        i = r["_t"]
        out[names[i]].append({c: r[c] for c in columns[i]})
    return out


def small_parts(f: Facts, values: DataFrame, values_b: DataFrame) -> dict[str, DataFrame]:
    """The small tables of a set of facts (totals.Totals' fields but `slow`)."""
    return {"queue_hour": f.queue_hour, "queues": f.queues, "stats": value_stats(values_b),
            "coarse": coarse(values_b), "errors": f.errors,
            "hour_pct": hour_percentiles(values)}
