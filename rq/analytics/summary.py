"""Turn the collected aggregates of the analytics job into docs/analytics.md's JSON (pure).

Owns the shape of `summary.json` and `hourly.json` (version 1): input is plain rows (dicts) as
collected from rq.analytics.transform's small aggregates, output plain JSON-able values.  No
pyspark here, so the shape is testable and the web app's contract lives in one place.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

VERSION = 1
FINAL = ("done", "err", "relayed")
REASONS = ("torn", "layout", "crc", "json")
WAIT_EDGES = [0, 0.01, 0.1, 1, 10, 60, 600, 3600]
TOP = 10
Row = Mapping[str, Any]

# grouping ids over (queue, hour) of transform's grouping sets (G_HOUR: summed here)
G_QUEUE_HOUR, G_QUEUE, G_HOUR, G_ALL = 0, 1, 2, 3


def num(value: Any) -> float | None:
    """A JSON-friendly float (6 decimals, no float noise), or None."""
    return None if value is None else round(float(value), 6)


def dist(row: Row | None, prefix: str) -> dict[str, Any]:
    n = int(row.get(f"{prefix}_n") or 0) if row else 0
    p = (row or {}).get(f"{prefix}_p") or [None, None, None]
    if n == 0:
        return {"p50": None, "p90": None, "p99": None, "mean": None, "n": 0}
    return {"p50": num(p[0]), "p90": num(p[1]), "p99": num(p[2]),
            "mean": num(row[f"{prefix}_mean"]) if row else None, "n": n}


def line_summary(counts: Row) -> dict[str, Any]:
    """`lines` of summary.json from {"valid": n, "torn": n, …} (missing keys count 0)."""
    skipped = {reason: int(counts.get(reason) or 0) for reason in REASONS}
    valid = int(counts.get("valid") or 0)
    return {"read": valid + sum(skipped.values()), "valid": valid,
            "skipped": sum(skipped.values()), "skipped_by_reason": skipped}


def error_rate(counts: Row) -> float:
    finished = sum(int(counts.get(s) or 0) for s in FINAL)
    return num(int(counts.get("err") or 0) / finished) if finished else 0.0  # type: ignore[return-value]


def busiest(hour_rows: Iterable[Row]) -> list[dict[str, Any]]:
    hours = [(sum(int(r[s] or 0) for s in FINAL), int(r["hour"])) for r in hour_rows
             if r.get("hour") is not None]
    hours = sorted((h for h in hours if h[0] > 0), key=lambda h: (-h[0], h[1]))[:TOP]
    return [{"hour": hour, "finished": n} for n, hour in hours]


def qsum(msg: Row | None, span: Row | None, hour_rows: Sequence[Row], errors: Sequence[Row],
         slow: Sequence[Row], hours: float | None) -> dict[str, Any]:
    """One QSUM of docs/analytics.md from the rows of one queue (or of everything)."""
    m = msg or {}
    finished = {s: int(m.get(s) or 0) for s in (*FINAL, "deleted")}
    done_err_relayed = sum(finished[s] for s in FINAL)
    bins = [int((span or {}).get(f"wait_h{i}") or 0) for i in range(len(WAIT_EDGES))]
    return {
        "events": int(m.get("events") or 0),
        "finished": finished,
        "unfinished": int(m.get("unfinished") or 0),
        "throughput_per_hour": num(done_err_relayed / hours) if hours else 0.0,
        "wait": dist(span, "wait"), "run": dist(span, "run"), "total": dist(msg, "total"),
        "error_rate": error_rate(finished),
        "retries": {k: int(m.get(k) or 0) for k in ("resend", "lease_expired", "recovered")},
        "top_errors": [{"status": e["status"], "n": int(e["n"])} for e in errors[:TOP]],
        "slowest": [{"queue": s["queue"], "msg_id": s["msg_id"], "run_s": num(s["run_s"])}
                    for s in slow[:TOP]],
        "busiest_hours": busiest(hour_rows),
        "wait_histogram": {"edges": list(WAIT_EDGES), "counts": bins},
    }


def hour_totals(queue_hour_rows: Iterable[Row]) -> list[dict[str, Any]]:
    """Per-hour counts by final state (the g = 2 rows) summed from the queue+hour rows."""
    out: dict[int, dict[str, Any]] = {}
    for r in queue_hour_rows:
        if r.get("hour") is not None:
            t = out.setdefault(int(r["hour"]), {"g": G_HOUR, "hour": int(r["hour"]),
                                                **{s: 0 for s in (*FINAL, "deleted")}})
            for s in (*FINAL, "deleted"):
                t[s] += int(r.get(s) or 0)
    return [out[h] for h in sorted(out)]


def window(since: float | None, until: float | None,
           total: Row | None) -> tuple[float | None, float | None, float | None]:
    """(start, end, hours) of the analysed window: the bounds given, else the first and last
    event seen; hours is at least one second's worth so a burst still has a rate."""
    start = since if since is not None else (total or {}).get("first_ts")
    end = until if until is not None else (total or {}).get("last_ts")
    if start is None or end is None:
        return start, end, None
    return start, end, max(float(end) - float(start), 1.0) / 3600


def hourly(queue_hour: Mapping[tuple[str, Any], Sequence[int]],
           hour_pct: Mapping[tuple[str, Any, str], Sequence[int | None]],
           unit: int) -> list[dict[str, Any]]:
    """docs/analytics.md hourly.json rows, sorted by (queue, hour), from the totals' tables
    (rq.analytics.totals.Totals): `queue_hour` (queue, hour) → counts done, err, relayed,
    deleted; `hour_pct` (queue, hour, kind) → n, p50, p90, p99 in 1/`unit` seconds."""
    out: dict[tuple[str, int], dict[str, Any]] = {}

    def row(queue: str, hour: int) -> dict[str, Any]:
        r = out.get((queue, hour))
        if r is None:  # 72,000 of them at 100 queues and 30 days: no default made per call
            r = out[(queue, hour)] = {
                "queue": queue, "hour": hour, "done": 0, "err": 0, "relayed": 0, "deleted": 0,
                "error_rate": 0.0, "run_p50": None, "run_p90": None, "run_p99": None,
                "wait_p50": None, "wait_p90": None, "wait_p99": None}
        return r

    names = {kind: tuple(f"{kind}_{p}" for p in ("p50", "p90", "p99")) for kind in ("run", "wait")}
    for (queue, hour), (done, err, relayed, deleted) in queue_hour.items():
        if hour is not None:
            r = row(queue, int(hour))
            r["done"], r["err"], r["relayed"], r["deleted"] = (
                int(done or 0), int(err or 0), int(relayed or 0), int(deleted or 0))
            r["error_rate"] = error_rate(r)
    for (queue, hour, kind), (n, *ps) in hour_pct.items():
        r = row(queue, int(hour))
        if n and kind in names:
            for name, p in zip(names[kind], ps):
                r[name] = None if p is None else num(p / unit)
    return [out[k] for k in sorted(out)]


def build(meta: Mapping[str, Any], line_counts: Row, msg_rows: Sequence[Row],
          span_rows: Sequence[Row], queue_errors: Sequence[Row], total_errors: Sequence[Row],
          slow_rows: Sequence[Row]) -> dict[str, Any]:
    """summary.json (docs/analytics.md) from the collected aggregates and the run's `meta`
    (run_id, generated_at, duration_s, since, until, inputs, master)."""
    groups: dict[tuple[int, int, str | None], list[Row]] = {}
    for which, rows in enumerate((msg_rows, span_rows)):
        for r in rows:
            groups.setdefault((which, r["g"], None), []).append(r)
            if r["g"] != G_ALL:
                groups.setdefault((which, r["g"], r["queue"]), []).append(r)

    def pick(rows: Sequence[Row], g: int, queue: str | None = None) -> Sequence[Row]:
        return groups.get((0 if rows is msg_rows else 1, g, queue), [])

    def one(rows: Sequence[Row], g: int, queue: str | None = None) -> Row | None:
        found = pick(rows, g, queue)
        return found[0] if found else None

    total_msg = one(msg_rows, G_ALL)
    start, end, hours = window(meta.get("since"), meta.get("until"), total_msg)
    names = sorted({r["queue"] for r in msg_rows if r["g"] == G_QUEUE})
    slow_by_queue = {q: sorted((s for s in slow_rows if s["queue"] == q),
                               key=lambda s: s["rank"]) for q in names}
    all_slow = sorted(slow_rows, key=lambda s: (-s["run_s"], s["queue"], s["msg_id"]))
    queues = {}
    for q in names:
        errs = sorted((e for e in queue_errors if e["queue"] == q), key=lambda e: e["rank"])
        queues[q] = qsum(one(msg_rows, G_QUEUE, q), one(span_rows, G_QUEUE, q),
                         pick(msg_rows, G_QUEUE_HOUR, q), errs, slow_by_queue[q], hours)
    total_errs = sorted(total_errors, key=lambda e: (-int(e["n"]), e["status"]))
    return {
        "version": VERSION,
        **{k: meta.get(k) for k in ("run_id", "generated_at", "duration_s", "since", "until",
                                    "inputs", "master")},
        "window": {"start": num(start), "end": num(end), "hours": num(hours)},
        "lines": line_summary(line_counts),
        "total": qsum(total_msg, one(span_rows, G_ALL),
                      pick(msg_rows, G_HOUR) or hour_totals(pick(msg_rows, G_QUEUE_HOUR)),
                      total_errs, all_slow, hours),
        "queues": queues,
    }
