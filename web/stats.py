"""The Stats pages (issue 5, Dashboard part): charts and numbers from the
latest analytics result, and the button that queues a fresh run.

Routes (under ROOT, S14 rules as every other route): `GET stats` (all queues),
`GET q/NAME/stats` (one queue), `GET stats.json` (the current summary, or
`404 ["fail","No analytics run yet"]`) and `POST stats/run` (a
`create_message` on the builtin `analytics` queue, then a flash and a 303 back).

The result is the one rq/analytics publishes (ANALYTICS_CONTRACT):
`ROOT/analytics/current` -> `runs/<RUNID>/` holding `summary.json` and
`hourly.json`.  `current` is resolved once per request and only files inside
that run directory are read, so a run published meanwhile never mixes with the
one being shown.  This module never imports pyspark.  Every value of the
result is checked for its type before it is shown: a missing, unreadable or
half-wrong result gives a clear message on the page, never a 500.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from typing import Any

from flask import Blueprint, Response, flash, jsonify, redirect, render_template
from markupsafe import Markup

from rq import protocol

from . import charts
from .errors import RQHTTPError, fail
from .views import (ask_queue, back_or, backend, is_ok, main_config, page_url, queue_url,
                    reject_constant, root_url, wants_reply)

bp = Blueprint("stats", __name__)

ANALYTICS_QUEUE = "analytics"
RESULT_VERSION = 1
MAX_RESULT_BYTES = 64 * 1024 * 1024  # hourly.json of 100 queues x 30 days is ~15 MB
MAX_HOURS = 24 * 31                  # charts show at most the last 31 days of hours
FINAL = ("done", "err", "relayed", "deleted")
STACKED = ("done", "err", "relayed")
SPANS = ("wait", "run", "total")
PERCENTILES = ("p50", "p90", "p99")
NO_RUN = "No analytics run yet"


class ResultError(Exception):
    """The result exists but cannot be shown; the text says why."""


@dataclass(frozen=True)
class Result:
    run_dir: str
    summary: dict[str, Any]
    hourly: list[dict[str, Any]] | None
    problems: list[str] = field(default_factory=list)


# ---------------------------------------------------------------- reading the result

def output_dir(root: str) -> str:
    return os.path.join(root, "analytics")


def read_result_file(path: str) -> Any:
    """The JSON in `path`; ResultError with a one-line reason otherwise."""
    name = os.path.basename(path)
    try:
        with open(path, "rb") as fh:
            data = fh.read(MAX_RESULT_BYTES + 1)
    except FileNotFoundError:
        raise ResultError(f"{name} is missing") from None
    except OSError as exc:
        raise ResultError(f"{name} cannot be read: {exc.strerror or exc}") from None
    if len(data) > MAX_RESULT_BYTES:
        raise ResultError(f"{name} is larger than {MAX_RESULT_BYTES // (1024 * 1024)} MiB")
    try:
        return json.loads(data, parse_constant=reject_constant)
    except (ValueError, RecursionError):
        raise ResultError(f"{name} is not valid JSON") from None


def load_result(root: str) -> Result | None:
    """The published result, None before the first run, ResultError when broken."""
    current = os.path.join(output_dir(root), "current")
    if not os.path.lexists(current):
        return None
    run_dir = os.path.realpath(current)  # resolved once: a new run may be published meanwhile
    if not os.path.isdir(run_dir):
        raise ResultError("analytics/current does not point to a run directory")
    summary = read_result_file(os.path.join(run_dir, "summary.json"))
    if not isinstance(summary, dict):
        raise ResultError("summary.json is not a JSON object")
    if summary.get("version") != RESULT_VERSION:
        raise ResultError(f"summary.json has version {json.dumps(summary.get('version'))}, "
                          f"this dashboard reads version {RESULT_VERSION}")
    problems = []
    if not isinstance(summary.get("total"), dict) or not isinstance(summary.get("queues"), dict):
        problems.append("summary.json lacks its \"total\" or \"queues\" part")
    hourly: list[dict[str, Any]] | None = None
    try:
        rows = read_result_file(os.path.join(run_dir, "hourly.json"))
        if not isinstance(rows, list):
            raise ResultError("hourly.json is not a JSON list")
        hourly = [r for r in rows if isinstance(r, dict)]
    except ResultError as exc:
        problems.append(f"{exc}: the charts over time are left out")
    return Result(run_dir, summary, hourly, problems)


# ---------------------------------------------------------------- checking values

def num(value: Any) -> float | None:
    """A finite number, else None (bool is not a number here)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def count(value: Any) -> int | None:
    n = num(value)
    return int(n) if n is not None and n >= 0 else None


def text(value: Any) -> str:
    return value if isinstance(value, str) else "" if value is None else json.dumps(value)


def mapping(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def listed(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def records(value: Any, limit: int = 10) -> list[dict[str, Any]]:
    return [r for r in value if isinstance(r, dict)][:limit] if isinstance(value, list) else []


def qsum_view(raw: Any) -> dict[str, Any]:
    """A QSUM of the contract with every field checked: wrong or missing -> None."""
    d = mapping(raw)
    finished = mapping(d.get("finished"))
    retries = mapping(d.get("retries"))
    hist = mapping(d.get("wait_histogram"))
    edges = [num(e) for e in listed(hist.get("edges"))]
    bins = [count(c) for c in listed(hist.get("counts"))]
    histogram_ok = bool(edges) and len(bins) == len(edges) and None not in edges + bins
    top_errors = [{"status": text(e.get("status")), "n": count(e.get("n"))}
                  for e in records(d.get("top_errors"))]
    return {
        "events": count(d.get("events")),
        "finished": {s: count(finished.get(s)) for s in FINAL},
        "unfinished": count(d.get("unfinished")),
        "throughput_per_hour": num(d.get("throughput_per_hour")),
        "error_rate": num(d.get("error_rate")),
        "spans": {k: {p: num(mapping(d.get(k)).get(p)) for p in (*PERCENTILES, "mean")}
                  | {"n": count(mapping(d.get(k)).get("n"))} for k in SPANS},
        "retries": {k: count(retries.get(k)) for k in ("resend", "lease_expired", "recovered")},
        "top_errors": top_errors,
        "top_errors_max": max((e["n"] or 0 for e in top_errors), default=0),
        "slowest": [{"queue": text(e.get("queue")), "msg_id": text(e.get("msg_id")),
                     "run_s": num(e.get("run_s"))} for e in records(d.get("slowest"))],
        "busiest_hours": [{"hour": num(e.get("hour")), "finished": count(e.get("finished"))}
                          for e in records(d.get("busiest_hours"))],
        "histogram": (edges, bins) if histogram_ok else None,
    }


def run_view(summary: dict[str, Any]) -> dict[str, Any]:
    """The run's own facts: id, time, window, inputs and line counts."""
    lines = mapping(summary.get("lines"))
    reasons = mapping(lines.get("skipped_by_reason"))
    compaction = mapping(summary.get("compaction"))
    return {"events": count(mapping(summary.get("total")).get("events")),
            "mode": text(compaction.get("mode")) or None,
            "days_read": count(compaction.get("days_read")),
            "run_id": text(summary.get("run_id")), "generated_at": num(summary.get("generated_at")),
            "duration_s": num(summary.get("duration_s")), "since": num(summary.get("since")),
            "until": num(summary.get("until")), "master": text(summary.get("master")),
            "inputs": [text(i) for i in summary.get("inputs") or [] if isinstance(i, str)]
            if isinstance(summary.get("inputs"), list) else [],
            "lines": {k: count(lines.get(k)) for k in ("read", "valid", "skipped")},
            "skipped_by_reason": {text(k): count(v) for k, v in reasons.items()}}


# ---------------------------------------------------------------- hourly rows -> chart data

def hourly_series(rows: list[dict[str, Any]], queue: str | None) -> dict[str, Any]:
    """Per hour (contiguous, at most MAX_HOURS): finished counts by state, error
    rate, run percentiles.  For all queues the counts are summed and each run
    percentile is the highest queue's value in that hour (the result has no
    all-queue percentiles per hour)."""
    by_hour: dict[int, dict[str, Any]] = {}
    for row in rows:
        hour = num(row.get("hour"))
        if hour is None or (queue is not None and row.get("queue") != queue):
            continue
        slot = by_hour.setdefault(int(hour) - int(hour) % 3600, empty_slot())
        for state in STACKED:
            slot[state] += count(row.get(state)) or 0
        for p in PERCENTILES:
            value = num(row.get(f"run_{p}"))
            if value is not None and (slot[p] is None or value > slot[p]):
                slot[p] = value
    if not by_hour:
        return {"hours": []}
    last = max(by_hour)
    first = max(min(by_hour), last - (MAX_HOURS - 1) * 3600)
    hours = list(range(first, last + 1, 3600))
    slots = [by_hour.get(h) or empty_slot() for h in hours]
    rates: list[float | None] = []
    for slot in slots:
        finished = sum(slot[state] for state in STACKED)
        rates.append(slot["err"] / finished if finished else None)
    return {"hours": hours, "trimmed": min(by_hour) < first,
            "counts": {k: [slot[k] for slot in slots] for k in STACKED},
            "run": {p: [slot[p] for slot in slots] for p in PERCENTILES},
            "error_rate": rates}


def empty_slot() -> dict[str, Any]:
    return {state: 0 for state in STACKED} | {p: None for p in PERCENTILES}


def chart_markup(series: dict[str, Any], qsum: dict[str, Any],
                 all_queues: bool) -> dict[str, Markup]:
    hours = series["hours"]
    out = {}
    if hours:
        out["throughput"] = charts.stacked_bars(
            hours, [charts.Series(f"s-{k}", k, series["counts"][k]) for k in STACKED],
            "messages finished per hour by final state")
        out["error_rate"] = charts.line_chart(
            hours, [charts.Series("l-err", "error rate", series["error_rate"])],
            "error rate per hour", charts.fmt_percent, top=1.0)
        label = "highest queue " if all_queues else ""
        out["run"] = charts.line_chart(
            hours, [charts.Series(f"l-{p}", f"{label}{p}", series["run"][p]) for p in PERCENTILES],
            "run time percentiles per hour", charts.fmt_seconds)
    if qsum["histogram"] is not None:
        edges, bins = qsum["histogram"]
        out["wait"] = charts.histogram(edges, bins, "queue wait distribution")
    return out


def queue_rows(summary: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"name": name, **qsum_view(q)}
            for name, q in sorted(mapping(summary.get("queues")).items())]


# ---------------------------------------------------------------- views

def render_stats(queue: str | None) -> str:
    """The page for all queues (queue None) or one queue, in every result state."""
    page = f"{queue_url(queue)}/stats" if queue is not None else f"{root_url()}stats"
    values: dict[str, Any] = {"queue": queue, "fmt": FORMATS, "result": None, "error": None,
                              "missing_queue": False, "page_url": page}
    try:
        result = load_result(main_config().root)
    except ResultError as exc:
        values["error"] = str(exc)
        result = None
    if result is not None:
        queues = mapping(result.summary.get("queues"))
        raw = result.summary.get("total") if queue is None else queues.get(queue)
        values.update(result=result, run=run_view(result.summary),
                      missing_queue=queue is not None and queue not in queues)
        qsum = qsum_view(raw)
        series = hourly_series(result.hourly or [], queue)
        values.update(q=qsum, series=series, charts=chart_markup(series, qsum, queue is None),
                      queue_rows=queue_rows(result.summary) if queue is None else [],
                      problems=result.problems)
    return render_template("stats.html", **values)


FORMATS = {"seconds": charts.fmt_seconds, "count": charts.fmt_count,
           "percent": charts.fmt_percent, "hour": charts.fmt_hour}


@bp.get("/stats")
def stats_page() -> str:
    return render_stats(None)


@bp.get("/q/<name>/stats")
def queue_stats_page(name: str) -> str:
    if not protocol.valid_queue_name(name):
        fail(404, "Queue not found")
    if not backend().queue_exists(name) and not queue_in_result(name):
        fail(404, "Queue not found")
    return render_stats(name)


def queue_in_result(name: str) -> bool:
    """A deleted queue's numbers stay viewable while the result holds them."""
    try:
        result = load_result(main_config().root)
    except ResultError:
        return False
    return result is not None and name in mapping(result.summary.get("queues"))


@bp.get("/stats.json")
def stats_json() -> Response:
    try:
        result = load_result(main_config().root)
    except ResultError as exc:
        fail(500, f"Analytics result unreadable: {exc}")
    if result is None:
        fail(404, NO_RUN)
    return jsonify(result.summary)


@bp.post("/stats/run")
def run_analytics() -> Any:
    """Queue a fresh run: one message on the `analytics` queue, whose script runs the job."""
    back = back_or(page_url("stats"))
    if not backend().queue_exists(ANALYTICS_QUEUE):
        return refused(404, f"No '{ANALYTICS_QUEUE}' queue: create it to run analytics from "
                            "here, or run `rq analytics` on the host", back)
    try:
        reply = ask_queue(ANALYTICS_QUEUE, "create_message",
                                  {"dest": ANALYTICS_QUEUE, "src": "web-stats"})
    except RQHTTPError as exc:
        return refused(exc.code or 503, f"Couldn't queue an analytics run: {exc.text}", back)
    if wants_reply():
        return jsonify(reply)
    if is_ok(reply):
        flash(f"Analytics run queued as message {reply[1] if len(reply) > 1 else ''}")
    else:
        flash(f"Couldn't queue an analytics run: {protocol.dumps(reply)}", "error")
    return redirect(back, 303)


def refused(code: int, reason: str, back: str) -> Any:
    if wants_reply():
        fail(code, reason)
    flash(reason, "error")
    return redirect(back, 303)
