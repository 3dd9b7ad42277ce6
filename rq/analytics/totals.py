"""The small facts of a run as Python data: sums, JSON, and the summary's rows (issue 19, pure).

rq.analytics.facts computes, in Spark, the additive facts of a message table; all of them but
the value multisets are small (a row per queue, per queue and hour, per err text, per coarse
value bucket), so they are collected once into a `Totals` and worked on here: two Totals add
up (`add`: the stored facts of the state and the change a run brings), a Totals is stored as
JSON beside the state, and the summary's rows are made from one (`summary_rows`,
`top_lists`).  No pyspark here.

Values: integers (counts, microseconds) except `first_ts`/`last_ts` (event times) and the
slowest messages' `run_s`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rq.analytics import summary

US = 1_000_000
# p50, p90, p99 as exact fractions: rank = ceil(n * a / b), in integers.
PCTS = ((1, 2), (9, 10), (99, 100))
PNAMES = ("p50", "p90", "p99")
STATES = ("done", "err", "relayed", "deleted")
COUNTS = ("unfinished", "events", "resend", "lease_expired", "recovered")
HIST = 8            # wait histogram bins (summary.WAIT_EDGES)
STAT_FIELDS = ("n", "sum", *(f"h{i}" for i in range(HIST)))
Key = tuple[Any, ...]


@dataclass
class Totals:
    queue_hour: dict[Key, list[int]] = field(default_factory=dict)   # (q, hour): STATES
    queues: dict[str, dict[str, Any]] = field(default_factory=dict)  # q: STATES, COUNTS, ts
    stats: dict[Key, list[int]] = field(default_factory=dict)        # (q, kind): STAT_FIELDS
    coarse: dict[Key, int] = field(default_factory=dict)             # (q, kind, b): n
    errors: dict[Key, int] = field(default_factory=dict)             # (q, status): n
    hour_pct: dict[Key, list[int | None]] = field(default_factory=dict)  # (q, h, kind): n, p…
    slow: dict[Key, float] = field(default_factory=dict)             # (q, msg_id, host): run_s


def from_rows(rows: Mapping[str, Sequence[Mapping[str, Any]]]) -> Totals:
    """A Totals from the rows of facts.collect (one list per table name)."""
    t = Totals()
    for r in rows.get("queue_hour", ()):
        t.queue_hour[(r["queue"], r["hour"])] = [int(r[s] or 0) for s in STATES]
    for r in rows.get("queues", ()):
        q = {s: int(r[s] or 0) for s in (*STATES, *COUNTS)}
        q.update(first_ts=r["first_ts"], last_ts=r["last_ts"])
        t.queues[r["queue"]] = q
    for r in rows.get("stats", ()):
        t.stats[(r["queue"], r["kind"])] = [int(r[f] or 0) for f in STAT_FIELDS]
    for r in rows.get("coarse", ()):
        t.coarse[(r["queue"], r["kind"], int(r["b"]))] = int(r["n"])
    for r in rows.get("errors", ()):
        t.errors[(r["queue"], r["status"])] = int(r["n"])
    for r in rows.get("hour_pct", ()):
        t.hour_pct[(r["queue"], r["hour"], r["kind"])] = [
            int(r["n"]), *[None if r[p] is None else int(r[p]) for p in PNAMES]]
    for r in rows.get("slow", ()):
        t.slow[(r["queue"], r["msg_id"], r["host"])] = float(r["run_s"])
    return t


def add_counts(a: Mapping[Key, Any], b: Mapping[Key, Any]) -> dict[Key, Any]:
    """Per key, the sums of two tables of counts (ints or lists of ints); all-zero dropped."""
    out = dict(a)
    for k, v in b.items():
        if k in out:
            old = out[k]
            v = [x + y for x, y in zip(old, v)] if isinstance(v, list) else old + v
        if (any(v) if isinstance(v, list) else v):
            out[k] = v
        else:
            out.pop(k, None)
    return out


def add(a: Totals, b: Totals) -> Totals:
    """The totals of two parts.  first_ts, last_ts: the min and max of both, exact when `b`
    only adds events to messages (a run on carried state); `hour_pct` and `slow` are not
    sums: they are `a`'s (the caller brings them up to date)."""
    queues = {q: dict(v) for q, v in a.queues.items()}
    for q, v in b.queues.items():
        cur = queues.get(q)
        if cur is None:
            queues[q] = dict(v)
            continue
        for s in (*STATES, *COUNTS):
            cur[s] += v[s]
        for k, pick in (("first_ts", min), ("last_ts", max)):
            vals = [x for x in (cur[k], v[k]) if x is not None]
            cur[k] = pick(vals) if vals else None
    queues = {q: v for q, v in queues.items() if any(v[s] for s in (*STATES, *COUNTS))}
    return Totals(add_counts(a.queue_hour, b.queue_hour), queues, add_counts(a.stats, b.stats),
                  add_counts(a.coarse, b.coarse), add_counts(a.errors, b.errors),
                  dict(a.hour_pct), dict(a.slow))


def to_json(t: Totals) -> dict[str, Any]:
    return {"queue_hour": [[*k, *v] for k, v in t.queue_hour.items()],
            "queues": [[q, v] for q, v in t.queues.items()],
            "stats": [[*k, *v] for k, v in t.stats.items()],
            "coarse": [[*k, v] for k, v in t.coarse.items()],
            "errors": [[*k, v] for k, v in t.errors.items()],
            "hour_pct": [[*k, *v] for k, v in t.hour_pct.items()],
            "slow": [[*k, v] for k, v in t.slow.items()]}


def from_json(doc: Mapping[str, Any]) -> Totals:
    return Totals({(r[0], r[1]): r[2:] for r in doc["queue_hour"]},
                  {r[0]: r[1] for r in doc["queues"]},
                  {(r[0], r[1]): r[2:] for r in doc["stats"]},
                  {(r[0], r[1], r[2]): r[3] for r in doc["coarse"]},
                  {(r[0], r[1]): r[2] for r in doc["errors"]},
                  {(r[0], r[1], r[2]): r[3:] for r in doc["hour_pct"]},
                  {(r[0], r[1], r[2]): r[3] for r in doc["slow"]})


def nearest_rank(values: Iterable[tuple[int, int]]) -> list[int | None]:
    """[n, p50, p90, p99] of a multiset given as (value, count > 0) pairs: the same numbers as
    facts.nearest_rank's window, for the small groups a run computes here."""
    pairs = sorted(values)
    total = sum(n for _, n in pairs)
    out: list[int | None] = [total]
    for a, b in PCTS:
        rank, seen, pick = (total * a + b - 1) // b, 0, None
        for v, n in pairs:
            seen += n
            if seen >= rank:
                pick = v
                break
        out.append(pick)
    return out


def slow_order(item: tuple[Key, float]) -> tuple[Any, ...]:
    """transform.slowest_order in Python: longest run first, then msg_id, then host (nulls
    first, as Spark sorts them ascending)."""
    (_, msg_id, host), run_s = item
    return (-run_s, msg_id, host is not None, host or "")


# ---------------------------------------------------------------- the summary's rows


def mean(stat: Sequence[int] | None) -> float | None:
    return (stat[1] / stat[0]) / US if stat and stat[0] else None


def dist_fields(prefix: str, stat: Sequence[int] | None,
                pct: Sequence[float | None] | None) -> dict[str, Any]:
    return {f"{prefix}_p": list(pct) if pct else [None, None, None],
            f"{prefix}_mean": mean(stat), f"{prefix}_n": int(stat[0]) if stat else 0}


def summary_rows(t: Totals, pct: Mapping[tuple[str | None, str], list[float | None]]
                 ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(msg_rows, span_rows) in the grouping-set form rq.analytics.summary.build reads: g = 0
    (queue, hour; messages only), 1 (queue) and 3 (everything); `pct`:
    facts.group_percentiles."""
    msg_rows: list[dict[str, Any]] = []
    span_rows: list[dict[str, Any]] = []
    every: dict[tuple[None, str], list[int]] = {}
    for (_, kind), v in t.stats.items():
        cur = every.setdefault((None, kind), [0] * len(STAT_FIELDS))
        every[(None, kind)] = [x + y for x, y in zip(cur, v)]
    all_row: dict[str, Any] = {s: 0 for s in (*STATES, *COUNTS)}
    all_row.update(first_ts=None, last_ts=None)
    for name in sorted(t.queues):
        q = t.queues[name]
        row = {"g": summary.G_QUEUE, "queue": name, "hour": None, **q}
        row.update(dist_fields("total", t.stats.get((name, "total")), pct.get((name, "total"))))
        msg_rows.append(row)
        for s in (*STATES, *COUNTS):
            all_row[s] += q[s]
        for k, pick in (("first_ts", min), ("last_ts", max)):
            if q[k] is not None:
                all_row[k] = q[k] if all_row[k] is None else pick(all_row[k], q[k])
        span_rows.append(span_row(summary.G_QUEUE, name, t.stats, pct))
    if t.queues:
        all_row.update({"g": summary.G_ALL, "queue": None, "hour": None})
        all_row.update(dist_fields("total", every.get((None, "total")), pct.get((None, "total"))))
        msg_rows.append(all_row)
        span_rows.append(span_row(summary.G_ALL, None, every, pct))
    for (queue, hour), counts in t.queue_hour.items():
        msg_rows.append({"g": summary.G_QUEUE_HOUR, "queue": queue, "hour": hour,
                         **dict(zip(STATES, counts))})
    return msg_rows, span_rows  # the hours' spans: summary.hourly(t.queue_hour, t.hour_pct)


def span_row(g: int, queue: str | None, stats: Mapping[Key, Sequence[int]],
             pct: Mapping[tuple[str | None, str], list[float | None]]) -> dict[str, Any]:
    row: dict[str, Any] = {"g": g, "queue": queue, "hour": None}
    for kind in ("wait", "run"):
        row.update(dist_fields(kind, stats.get((queue, kind)), pct.get((queue, kind))))
    wait = stats.get((queue, "wait")) or [0] * len(STAT_FIELDS)
    for i in range(HIST):
        row[f"wait_h{i}"] = int(wait[2 + i])
    return row


def top_lists(t: Totals, n: int = summary.TOP
              ) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """(queue_errors, total_errors, slow_rows) as rq.analytics.summary.build reads them: each
    queue's n commonest err texts and n slowest messages (with `rank`), and the n commonest
    texts over every queue."""
    queue_errors: list[dict[str, Any]] = []
    by_queue: dict[str, list[tuple[str, int]]] = {}
    overall: dict[str, int] = {}
    for (queue, status), count in t.errors.items():
        by_queue.setdefault(queue, []).append((status, count))
        overall[status] = overall.get(status, 0) + count
    for queue, texts in by_queue.items():
        for rank, (status, count) in enumerate(sorted(texts, key=lambda e: (-e[1], e[0]))[:n],
                                               1):
            queue_errors.append({"queue": queue, "status": status, "n": count, "rank": rank})
    total_errors = [{"status": s, "n": c}
                    for s, c in sorted(overall.items(), key=lambda e: (-e[1], e[0]))[:n]]
    slow_rows: list[dict[str, Any]] = []
    slow_by_queue: dict[str, list[tuple[Key, float]]] = {}
    for item in t.slow.items():
        slow_by_queue.setdefault(item[0][0], []).append(item)
    for listed in slow_by_queue.values():
        for rank, ((queue, msg_id, host), run_s) in enumerate(sorted(listed, key=slow_order)[:n],
                                                              1):
            slow_rows.append({"queue": queue, "msg_id": msg_id, "host": host, "run_s": run_s,
                              "rank": rank})
    return queue_errors, total_errors, slow_rows


def message_count(t: Totals) -> int:
    """How many messages the totals count: every one is finished, deleted or unfinished."""
    return sum(q[s] for q in t.queues.values() for s in (*STATES, "unfinished"))


def dumps(t: Totals) -> str:
    return json.dumps(to_json(t), separators=(",", ":"))
