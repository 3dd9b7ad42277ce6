"""The analytics job (issue 5): options, then extract → transform → load for one run.

Owns the order of the Spark actions (each cached input is computed once), the run's metadata and
the command-line glue shared by `rq analytics`, `python -m rq.analytics` and the builtin
`analytics` queue: `parse_options` (pure) and `main` (session, run, one-line errors).
"""

from __future__ import annotations

import datetime as dt
import os
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

from rq.analytics.session import AnalyticsError

DEFAULT_MASTER = "local[*]"
RELATIVE = re.compile(r"^(\d+(?:\.\d+)?)([smhdw])$")
UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


@dataclass(frozen=True)
class Options:
    inputs: tuple[str, ...]
    output: str
    since: float | None = None
    until: float | None = None
    master: str = DEFAULT_MASTER
    conf: Mapping[str, str] = field(default_factory=dict)
    full: bool = False      # issue 19: recompute from the raw event log, ignoring compaction


def parse_time(flag: str, text: str, now: float) -> float:
    """`--since`/`--until`: epoch seconds, an ISO 8601 date or time (UTC unless it says
    otherwise), or `N[smhdw]` meaning that long before now (`24h`, `7d`)."""
    text = text.strip()
    try:
        return float(text)
    except ValueError:
        pass
    m = RELATIVE.match(text)
    if m:
        return now - float(m[1]) * UNITS[m[2]]
    try:
        when = dt.datetime.fromisoformat(text)
    except ValueError:
        raise AnalyticsError(f"invalid --{flag}: {text} (epoch, ISO 8601 or e.g. 24h)") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.timezone.utc)
    return when.timestamp()


def as_list(value: Any) -> list[str]:
    values = value if isinstance(value, list) else [] if value is None else [value]
    out = []
    for v in values:
        if not isinstance(v, str) or not v:
            raise AnalyticsError("a flag that needs a value was given none")
        out.append(v)
    return out


def parse_conf(items: Sequence[str]) -> dict[str, str]:
    conf = {}
    for item in items:
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise AnalyticsError(f"invalid --conf {item} (expected key=value)")
        conf[key.strip()] = value
    return conf


def parse_options(root: str | None, flags: Mapping[str, Any], now: float) -> Options:
    """Options from the S19.1 flags of `rq analytics` (`input`, `conf` may repeat)."""
    inputs = as_list(flags.get("input")) or ([root] if root else [])
    output = as_list(flags.get("output"))
    if not inputs:
        raise AnalyticsError("no --input and no RQ root")
    if not output and not root:
        raise AnalyticsError("no --output and no RQ root")
    since = as_list(flags.get("since"))
    until = as_list(flags.get("until"))
    master = as_list(flags.get("master"))
    opts = Options(
        inputs=tuple(inputs),
        output=output[-1] if output else os.path.join(root or "", "analytics"),
        since=parse_time("since", since[-1], now) if since else None,
        until=parse_time("until", until[-1], now) if until else None,
        master=master[-1] if master else DEFAULT_MASTER,
        conf=parse_conf(as_list(flags.get("conf"))),
        full=flags.get("full") not in (None, False, "false", "0", "no"))
    if opts.since is not None and opts.until is not None and opts.since >= opts.until:
        raise AnalyticsError("--since must be before --until")
    return opts


def run(spark: Any, opts: Options, *, now: float | None = None) -> tuple[str, dict[str, Any]]:
    """One run: read, check, aggregate, write and publish. Returns (run dir, summary)."""
    from rq.analytics import load, manifest

    started = time.time() if now is None else now
    out = load.output_dir(opts.output)
    if opts.full:
        return run_locked(spark, opts, out, started)
    # Incremental: compaction, the state and the reads of compacted days under one lock, so
    # that no other run replaces a directory this one reads.
    with manifest.locked(out):
        return run_locked(spark, opts, out, started)


@dataclass
class Part:
    """What a path gives a run: its message table, or for a run on stored facts its totals,
    its value rows by bucket and the writer of its messages/ (None: computed from the
    table)."""
    messages: Any
    counts: Callable[[], Mapping[str, Any]]
    compaction: dict[str, Any]
    stages: dict[str, float]
    totals: Any = None
    values_b: Callable[[list[int]], Any] | None = None
    write_messages: Callable[[str], None] | None = None
    cached: list[Any] = field(default_factory=list)


def run_locked(spark: Any, opts: Options, out: str, started: float
               ) -> tuple[str, dict[str, Any]]:
    from pyspark import StorageLevel

    from rq.analytics import facts, load, summary, totals
    from rq.analytics import transform as T

    clock = time.monotonic()
    run_id = load.new_run_id(started)
    part = (full_messages(spark, opts, clock) if opts.full
            else incremental_messages(spark, opts, out, started, clock))
    stages, compaction = part.stages, part.compaction
    messages = part.messages
    if part.totals is None:
        messages = messages.persist(StorageLevel.MEMORY_AND_DISK)
        f = facts.make(messages)
        values = f.values.persist()
        values_b = facts.by_queue(values).persist()
        parts = facts.small_parts(f, values, values_b)
        parts["slow"] = T.slowest(messages, summary.TOP).drop("rank")
        part.totals = totals.from_rows(facts.collect(parts))
        part.values_b = lambda _buckets: values_b
        part.cached += [messages, values, values_b]
    if not opts.full:
        stages["messages"] = round(time.monotonic() - clock - sum(stages.values()), 3)
    assert part.values_b is not None
    pct = facts.group_percentiles(spark, part.totals.coarse, part.values_b)
    msg_rows, span_rows = totals.summary_rows(part.totals, pct)
    line_counts = part.counts()
    if opts.full:
        stages["read_check_messages"] = round(time.monotonic() - clock - stages["compact"], 3)
    else:
        compaction["messages"] = totals.message_count(part.totals)
    queue_errors, total_errors, slow_rows = totals.top_lists(part.totals)
    hourly = summary.hourly(part.totals.queue_hour, part.totals.hour_pct, totals.US)
    stages["aggregates"] = round(time.monotonic() - clock - sum(stages.values()), 3)

    work = load.partial_dir(out, run_id)
    uri = "file://" + work
    if part.write_messages is not None:
        part.write_messages(work + "/messages")
    else:
        messages.select(*T.MESSAGE_COLUMNS).write.parquet(uri + "/messages")
    # The hourly rows and the errors are Python data: written as JSON and read back by the
    # JVM (createDataFrame of a list would start Python worker processes: ~1 CPU-s a run).
    load.write_json(os.path.join(work, "hourly.json"), hourly)
    json_to_parquet(spark, os.path.join(work, "hourly.json"), HOURLY_SCHEMA, uri + "/hourly")
    rows_json = os.path.join(work, "errors.rows.json")
    load.write_json(rows_json, [{"queue": q, "status": s, "n": n}
                                for (q, s), n in sorted(part.totals.errors.items())])
    json_to_parquet(spark, rows_json, ERRORS_SCHEMA, uri + "/errors")
    os.unlink(rows_json)
    for df in part.cached:
        df.unpersist()
    stages["write"] = round(time.monotonic() - clock - sum(stages.values()), 3)
    meta = {"run_id": run_id, "generated_at": round(started, 3),
            "duration_s": round(time.monotonic() - clock, 3), "since": opts.since,
            "until": opts.until, "inputs": list(opts.inputs), "master": opts.master}
    result = summary.build(meta, line_counts, msg_rows, span_rows, queue_errors, total_errors,
                           slow_rows)
    result["files"] = compaction.pop("files")
    result["compaction"] = compaction
    result["stages_s"] = stages
    load.write_json(os.path.join(work, "summary.json"), result)
    final = load.publish(out, run_id)
    load.prune(out, time.time())
    return final, result


def json_to_parquet(spark: Any, path: str, schema: str, dest: str) -> None:
    """A JSON array of rows (load.write_json) as one Parquet file."""
    (spark.read.schema(schema).option("multiLine", "true").option("mode", "FAILFAST")
     .json("file://" + path).coalesce(1).write.parquet(dest))


def full_messages(spark: Any, opts: Options, clock: float) -> Part:
    """`--full`: the message table from every raw line (the reference the incremental path
    must equal), its line counts (observed in the same pass) and figures."""
    from pyspark.sql import Observation

    from rq.analytics import extract
    from rq.analytics import transform as T

    # One pass over the lines: they are checked, counted (observe) and fed to the per-message
    # shuffle together; only the much smaller message table is cached.
    # (An input with no lines at all is planned as an empty relation, which never fills an
    # Observation: it is counted as zero lines instead.)
    observed = Observation("lines")
    files = extract.list_inputs(spark, list(opts.inputs), opts.since, opts.until)
    readable = [f for f in files if f.size > 0]
    stages = {"compact": round(time.monotonic() - clock, 3)}
    checked = T.check_lines(extract.read_lines(spark, readable))
    if readable:
        checked = checked.observe(observed, *T.line_count_columns())
    messages = T.message_table(T.window_events(checked, opts.since, opts.until))
    return Part(messages, lambda: observed.get if readable else {},
                {"mode": "full", "files": len(files)}, stages)


def incremental_messages(spark: Any, opts: Options, out: str, now: float, clock: float
                         ) -> Part:
    """Compacted days plus raw files not compacted yet (issue 19, rq.analytics.compact), with
    per-message state and its facts carried across compactions (rq.analytics.state).  Line
    counts: those compaction recorded for the compacted days, plus a count of the raw lines.
    The caller holds manifest.locked(out)."""
    from pyspark import StorageLevel

    from rq.analytics import compact, extract, manifest, state, stored
    from rq.analytics import transform as T

    plan, book = compact.prepare(spark, list(opts.inputs), opts.since, opts.until, out, now)
    stages = {"compact": round(time.monotonic() - clock, 3)}
    dirs = state.rel_dirs(out, plan.compacted)
    figures = state.Figures()
    windowed = opts.since is not None or opts.until is not None
    path = None
    written: list[Any] = []  # the totals of the facts written by this run, if any
    if not windowed:  # the state covers whole trees: only unwindowed runs keep it up to date
        path, figures.state = state.maintain(
            spark, out, book, dirs,
            lambda rows, dest: written.append(stored.write_facts(spark, rows, dest)))
    elif state.usable(book.get("state"), dirs, plan.trees, opts.since, opts.until):
        path = state.state_path(out, book)
        figures.state = "kept" if path else "none"
    else:
        figures.state = "not usable" if book.get("state") else "none"
    stages["state"] = round(time.monotonic() - clock - stages["compact"], 3)
    lines = manifest_lines(book, plan.days)
    raw_files = [f for f in plan.raw if f.size > 0]
    raw = None
    if raw_files:
        # Read once, used twice (the keys of the messages it touches, their events): cached.
        raw = T.check_lines(extract.read_lines(spark, raw_files)).persist(
            StorageLevel.MEMORY_AND_DISK)
        for key, value in T.rows(T.line_counts(raw))[0].items():
            lines[key] += int(value or 0)
    compaction: dict[str, Any] = {"mode": "incremental", "files": plan.files,
                                  "days_read": len(dirs),
                                  "days_compacted_now": len(plan.to_compact),
                                  "raw_files": len(plan.raw)}
    facts_dir = manifest.facts_path(out, book) if path and not windowed else None
    part = Part(None, lambda: lines, compaction, stages)
    compaction["tables"] = "facts" if path and facts_dir else "messages"
    if path and facts_dir:
        carried = stored.run_carried(spark, out, dirs, raw, path, facts_dir, figures,
                                     written[-1] if written else None)
        part.totals = carried.totals
        part.values_b, part.write_messages = carried.values_b, carried.write_messages
    else:
        part.messages = state.run_messages(spark, out, dirs, raw, opts.since, opts.until, path,
                                           figures)
    if raw is not None:
        part.cached.append(raw)

    def counts() -> Mapping[str, Any]:
        compaction.update(figures.collect())
        return lines
    part.counts = counts
    return part


def manifest_lines(book: Mapping[str, Any], days: Sequence[tuple[str, str]]) -> dict[str, int]:
    """The line counts compaction recorded for these (events dir, day)s."""
    from rq.analytics import manifest

    total = manifest.zero_lines()
    for events_dir, day in days:
        entry = manifest.day_entry(book, events_dir, day)
        for key, value in (entry or {}).get("lines", {}).items():
            total[key] += int(value)
    return total


ERRORS_SCHEMA = "queue string, status string, n long"
HOURLY_SCHEMA = ("queue string, hour long, done long, err long, relayed long, deleted long, "
                 "error_rate double, run_p50 double, run_p90 double, run_p99 double, "
                 "wait_p50 double, wait_p90 double, wait_p99 double")


def report_lines(final: str, result: Mapping[str, Any]) -> list[str]:
    lines, total = result["lines"], result["total"]
    skipped = ", ".join(f"{k} {v}" for k, v in lines["skipped_by_reason"].items() if v)
    fin = total["finished"]
    return [
        f"read {lines['read']} lines from {result.get('files', 0)} files, "
        f"{lines['skipped']} skipped{f' ({skipped})' if skipped else ''}",
        f"{total['events']} events in {len(result['queues'])} queues: done {fin['done']}, "
        f"err {fin['err']}, relayed {fin['relayed']}, deleted {fin['deleted']}, "
        f"unfinished {total['unfinished']}",
        f"published {final} in {result['duration_s']} s",
    ]


def short_error(exc: BaseException) -> str:
    """One line for a Spark/Py4J failure (whose text is a Java stack trace)."""
    java = getattr(exc, "java_exception", None)
    text = str(java.toString()) if java is not None else str(exc)
    first = next((ln.strip() for ln in text.splitlines() if ln.strip()), type(exc).__name__)
    return first[:400]


def main(root: str | None, flags: Mapping[str, Any], out: TextIO,
         err: TextIO | None = None) -> int:
    """`rq analytics`: run the job, print three lines; errors raise AnalyticsError.  On a
    terminal `err` shows the stages' progress meanwhile (rq.analytics.progress)."""
    final, result = execute(root, flags, progress_to=err)
    for line in report_lines(final, result):
        print(line, file=out)
    return 0


def execute(root: str | None, flags: Mapping[str, Any], progress_to: TextIO | None = None
            ) -> tuple[str, dict[str, Any]]:
    """Options from `flags`, a session, one run; the JVM's output goes to
    ROOT/log/analytics-spark.log.  Every failure is an AnalyticsError (one line)."""
    from rq.analytics import progress, session

    opts = parse_options(root, flags, time.time())
    log_path = os.path.join(root, "log", "analytics-spark.log") if root and os.path.isdir(
        os.path.join(root, "log")) else None
    size = None
    if opts.master.startswith("local"):  # before the JVM starts: it picks the JVM's options
        from rq.analytics import compact
        size = compact.input_bytes(list(opts.inputs), opts.since, opts.until,
                                   os.path.abspath(opts.output.removeprefix("file://")),
                                   opts.full, time.time())
    with session.spark_session(opts.master, opts.conf, log_path=log_path,
                               input_bytes=size) as spark:
        try:
            if progress_to is None:
                final, result = run(spark, opts)
            else:
                with progress.progress(spark, progress_to, os.environ):
                    final, result = run(spark, opts)
        except AnalyticsError:
            raise
        except Exception as exc:  # noqa: BLE001 -- Spark failures become one line
            raise AnalyticsError(f"analytics failed: {short_error(exc)}") from None
    return final, result
