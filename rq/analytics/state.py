"""Per-message state carried across compactions (issue 19): only messages with news are recomputed.

Owns `OUT/compacted/state.<token>/`, a Parquet table with one row per message of the compacted
days (S13 events that passed the S13.4 checks): the row `transform.message_table` computes from
all of that message's compacted events, plus `_d0`/`_d1`, the first and last day directory its
events came from.  The manifest's `state` entry names it and the compacted day directories it
covers (`covers`); a day recompacted after a late write has a new directory, so the state no longer
covers what a run reads and is brought up to date first.

Why a carried row is exact: `message_table` is computed per message, from that message's events
sorted by (ts, pos), and from nothing else.  A message without events outside the covered days
(no raw line of it in the run, all its events inside the run's window) has exactly the events its
state row was computed from, so its row is the full recompute's row.  Every other message
("affected") is recomputed by the same function from all of its events: its compacted ones (read
from the days `_d0`…`_d1` of its state row only, filtered by a semi-join on the affected keys)
plus its raw ones.  Brought up to date the same way when days are compacted: messages with events
in newly compacted days, or in days whose directory was replaced, are recomputed from their
compacted events; the others keep their rows.

The aggregates downstream are sums of exact per-message facts (rq.analytics.facts), so they do
not depend on how the rows are laid out.
"""

from __future__ import annotations

import datetime as dt
import os
import secrets
import shutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql import Column, DataFrame, Observation, SparkSession
from pyspark.sql import functions as F

from rq.analytics import compact, extract, load, manifest
from rq.analytics import transform as T

DAYS = ("_d0", "_d1")
MESSAGE_FIELDS = ["queue", "msg_id", "host", "final_state", "wait_s", "run_s", "total_s",
                  "resends", "lease_expiries", "recoveries", "first_ts", "final_ts", "status",
                  "events", "last_ts", "created_ts", "spans"]


def day_aggs() -> tuple[Column, ...]:
    """The aggregates of a state row beyond message_table's: its first and last day."""
    return (F.min("_day").alias("_d0"), F.max("_day").alias("_d1"))


def day_of(rel: str) -> str:
    """`compacted/<key>/<DAY>.<token>` → DAY."""
    return os.path.basename(rel).split(".", 1)[0]


def tree_of(rel: str) -> str:
    return os.path.basename(os.path.dirname(rel))


def rel_dirs(out: str, dirs: Iterable[str]) -> list[str]:
    return sorted(os.path.relpath(d, out) for d in dirs)


def read_events(spark: SparkSession, out: str, dirs: list[str], since: float | None,
                until: float | None, *, with_day: bool = False) -> DataFrame:
    """The valid events (with since <= ts < until) of compacted day directories (relative
    to `out`); `with_day` adds `_day`, the day directory each came from."""
    df = compact.read_compacted(spark, [os.path.join(out, d) for d in dirs])
    if with_day:
        # A compacted event's file: `compacted/<key>/<DAY>.<token>/src_queue=Q/<part>`.
        df = df.withColumn("_day", F.substring_index(
            compact.path_element(F.col("_metadata.file_path"), 3), ".", 1))
    return T.window_events(df, since, until)


def keys(df: DataFrame) -> DataFrame:
    """The distinct message keys of `df`, renamed for the joins below."""
    return df.select(*[F.col(c).alias("_j_" + c) for c in T.KEY]).distinct()


def join_keys(df: DataFrame, keyset: DataFrame, how: str) -> DataFrame:
    """`df` semi- or anti-joined with `keyset` (from `keys`) on the message key.  Null-safe: an
    event's `host` may be null (S13.3), and a null host is a key like any other."""
    cond = [F.col(c).eqNullSafe(F.col("_j_" + c)) for c in T.KEY]
    return df.join(keyset, cond, how)


def days_between(ranges: Iterable[tuple[str, str]]) -> set[str]:
    """Every YYYYMMDD day within the given (first, last) ranges."""
    out: set[str] = set()
    for first, last in ranges:
        day = dt.datetime.strptime(first, "%Y%m%d")
        end = dt.datetime.strptime(last, "%Y%m%d")
        while day <= end:
            out.add(day.strftime("%Y%m%d"))
            day += dt.timedelta(days=1)
    return out


def affected_dirs(hit: DataFrame, dirs: list[str]) -> list[str]:
    """The directories of `dirs` holding events of the state rows `hit` (one small action)."""
    return dirs_within([(r["_d0"], r["_d1"]) for r in hit.select(*DAYS).distinct().collect()],
                       dirs)


def dirs_within(ranges: Iterable[tuple[str, str]], dirs: list[str]) -> list[str]:
    """The directories of `dirs` whose day is within one of the (first, last) day ranges."""
    wanted = days_between(ranges)
    return [d for d in dirs if day_of(d) in wanted]


# ---------------------------------------------------------------- the stored state


def state_path(out: str, book: dict[str, Any]) -> str | None:
    entry = book.get("state")
    if not entry or not os.path.isdir(os.path.join(out, entry["dir"])):
        return None
    return os.path.join(out, entry["dir"])


def read_state(spark: SparkSession, path: str) -> DataFrame:
    return spark.read.parquet("file://" + path)


def build(spark: SparkSession, out: str, dirs: list[str]) -> DataFrame:
    """State rows of every message of `dirs`, from scratch."""
    return T.message_table(read_events(spark, out, dirs, None, None, with_day=True),
                           day_aggs(), ("_day",))


def update(spark: SparkSession, out: str, old: DataFrame, covered: list[str],
           dirs: list[str]) -> DataFrame:
    """State rows of `dirs` from the rows `old` of `covered`: messages with events in a day
    directory added or removed are recomputed from all their compacted events."""
    added = [d for d in dirs if d not in covered]
    gone = sorted({day_of(d) for d in covered if d not in dirs})
    new_keys = keys(read_events(spark, out, added, None, None)) if added else None
    in_gone = F.lit(False)
    for day in gone:
        in_gone |= (F.col("_d0") <= day) & (F.col("_d1") >= day)
    hit = old.where(in_gone)
    if new_keys is not None:
        hit = hit.unionByName(join_keys(old, new_keys, "left_semi"))
    hit_keys = keys(hit)
    kept = affected_dirs(hit, [d for d in dirs if d not in added])
    parts = [join_keys(read_events(spark, out, kept, None, None, with_day=True), hit_keys,
                       "left_semi")] if kept else []
    if added:
        parts.append(read_events(spark, out, added, None, None, with_day=True))
    carried = join_keys(old, hit_keys, "left_anti")
    if new_keys is not None:
        carried = join_keys(carried, new_keys, "left_anti")
    if not parts:
        return carried
    return carried.unionByName(T.message_table(T.union_all(parts), day_aggs(), ("_day",)))


def maintain(spark: SparkSession, out: str, book: dict[str, Any], dirs: list[str],
             write_facts: Callable[[str, str], object]) -> tuple[str | None, str]:
    """Bring the state up to date with the compacted days `dirs` (relative to `out`, every
    day of the run's trees), and its facts with it (`write_facts(state dir, dest)`,
    rq.analytics.stored); the caller holds manifest.locked(out).  Returns (state path, what
    was done: kept, updated or built).  Written like a compacted day: in a staging directory,
    fsynced, renamed into place, then named in the manifest; the old one removed after."""
    entry = book.get("state")
    path = state_path(out, book)
    if path is not None and entry is not None and entry["covers"] == dirs:
        # No facts: stored before its facts were, or in another version.
        if not manifest.facts_path(out, book):
            stale = entry.get("facts")
            entry["facts"] = stage(out, lambda dest: write_facts(path, dest),
                                   f"{os.path.basename(path)}.{secrets.token_hex(4)}"
                                   f"{manifest.FACTS_SUFFIX}")
            entry["facts_version"] = manifest.FACTS_VERSION
            load.write_json(manifest.manifest_path(out), book)
            if stale:
                shutil.rmtree(os.path.join(out, stale), ignore_errors=True)
        return path, "kept"
    if not dirs:  # nothing compacted: no state (a run reads raw lines only)
        return None, "none"
    if path is not None and entry is not None:
        rows, how = update(spark, out, read_state(spark, path), entry["covers"], dirs), "updated"
    else:
        rows, how = build(spark, out, dirs), "built"
    token = secrets.token_hex(4)
    rel = stage(out, lambda dest: rows.write.parquet("file://" + dest),
                manifest.STATE_PREFIX + token)
    rel_facts = stage(out, lambda dest: write_facts(os.path.join(out, rel), dest),
                      manifest.STATE_PREFIX + token + manifest.FACTS_SUFFIX)
    book["state"] = {"dir": rel, "covers": dirs, "facts": rel_facts,
                     "facts_version": manifest.FACTS_VERSION}
    load.write_json(manifest.manifest_path(out), book)
    if entry is not None:
        for old in (entry["dir"], entry.get("facts")):
            if old:
                shutil.rmtree(os.path.join(out, old), ignore_errors=True)
    return os.path.join(out, rel), how


def stage(out: str, write: Callable[[str], object], name: str) -> str:
    """`write(dir)` into a staging directory, fsynced and renamed to compacted/<name>;
    returns that path relative to `out`."""
    top = manifest.compacted_dir(out)
    staging = os.path.join(top, f".staging-{secrets.token_hex(4)}")
    write(staging)
    load.fsync_tree(staging)
    rel = os.path.join("compacted", name)
    os.rename(staging, os.path.join(out, rel))
    load.fsync_path(top)
    return rel


def usable(entry: dict[str, Any] | None, dirs: list[str], trees: list[str],
           since: float | None, until: float | None) -> bool:
    """The stored state can stand for the compacted days `dirs` of a run over `trees` with
    this window: it covers every one of them, and the other days it covers are days of the
    same trees outside the window (their events are outside it too; see `window_rows`)."""
    if entry is None:
        return False
    covers = entry["covers"]
    extra = list(covers)
    for d in dirs:
        if d not in extra:
            return False
        extra.remove(d)
    return all(tree_of(d) in trees and not extract.day_wanted(day_of(d), since, until)
               for d in extra)


def first_wanted_day(since: float) -> str:
    """The first YYYYMMDD that extract.day_wanted keeps from `since` (its UTC day)."""
    return dt.datetime.fromtimestamp((since // extract.DAY) * extract.DAY,
                                     dt.timezone.utc).strftime("%Y%m%d")


def last_wanted_day(until: float) -> str:
    """The last YYYYMMDD that extract.day_wanted keeps before `until` (the day holding the
    instant just before it)."""
    return dt.datetime.fromtimestamp(-(-until // extract.DAY) * extract.DAY - extract.DAY,
                                     dt.timezone.utc).strftime("%Y%m%d")


def window_rows(state: DataFrame, since: float | None, until: float | None
                ) -> tuple[DataFrame, DataFrame | None]:
    """(rows whose every event is in the window, rows with events on both sides of it) of the
    state.  Inside: since <= first_ts, last_ts < until and the days of its first and last
    events are read by such a run (extract.day_wanted), so the full recompute sees exactly the
    events the row came from.  Rows with every event before since or at/after until have none
    in the window and are dropped; the rest are recomputed from their windowed events."""
    if since is None and until is None:
        return state, None
    inside: Column = F.lit(True)
    outside: Column = F.lit(False)
    if since is not None:
        inside &= (F.col("first_ts") >= float(since)) & (F.col("_d0") >= first_wanted_day(since))
        outside |= F.col("last_ts") < float(since)
    if until is not None:
        inside &= (F.col("last_ts") < float(until)) & (F.col("_d1") <= last_wanted_day(until))
        outside |= F.col("first_ts") >= float(until)
    return state.where(inside), state.where(~inside & ~outside)


# ---------------------------------------------------------------- a run's message table


@dataclass
class Figures:
    """What a run's message table was made from (summary.json `compaction`)."""
    path: str = "events"                 # "state": carried rows; "events": all compacted events
    state: str = "none"                  # kept, updated, built, not usable, none
    observed: dict[str, Observation] = field(default_factory=dict)

    def collect(self) -> dict[str, Any]:
        out: dict[str, Any] = {"path": self.path, "state": self.state,
                               "compacted_events_read": 0, "messages_recomputed": 0}
        for name, obs in self.observed.items():
            out[name] = int(obs.get.get("n") or 0)
        return out


def counted(df: DataFrame, name: str, figures: Figures) -> DataFrame:
    obs = Observation(name)
    figures.observed[name] = obs
    return df.observe(obs, F.count(F.lit(1)).alias("n"))


def run_messages(spark: SparkSession, out: str, dirs: list[str], raw: DataFrame | None,
                 since: float | None, until: float | None, state: str | None,
                 figures: Figures) -> DataFrame:
    """The run's message table (transform.message_table's columns).  `dirs`: its compacted
    days (relative to `out`); `raw`: the checked lines not compacted, or None; `state`: the
    path of a usable state, else None (every compacted event is read: the path a run takes
    without state)."""
    raw_events = T.window_events(raw, since, until) if raw is not None else None
    if state is None:
        parts = [counted(read_events(spark, out, dirs, since, until),
                         "compacted_events_read", figures)] if dirs else []
        if raw_events is not None:
            parts.append(raw_events)
        if not parts:
            return T.message_table(T.window_events(
                T.check_lines(extract.read_lines(spark, [])), since, until))
        return counted(T.message_table(T.union_all(parts)), "messages_recomputed", figures)
    figures.path = "state"
    rows = read_state(spark, state)
    carried, straddling = window_rows(rows, since, until)
    hit = straddling
    raw_keys = keys(raw_events) if raw_events is not None else None
    if raw_keys is not None:
        touched = join_keys(rows, raw_keys, "left_semi")
        hit = touched if hit is None else hit.unionByName(touched)
        carried = join_keys(carried, raw_keys, "left_anti")
    carried = carried.select(*MESSAGE_FIELDS)
    if hit is None:
        return carried
    hit_keys = keys(hit)
    parts = []
    old = affected_dirs(hit, dirs)
    if old:
        parts.append(counted(join_keys(read_events(spark, out, old, since, until), hit_keys,
                                       "left_semi"), "compacted_events_read", figures))
    if raw_events is not None:
        parts.append(raw_events)
    if not parts:
        return carried
    recomputed = counted(T.message_table(T.union_all(parts)), "messages_recomputed", figures)
    return carried.unionByName(recomputed)
