"""GET /metrics (SPEC S18): the Prometheus text format parsed back, every family,
live and on-disk figures, the event-log tally, and `rq_up 0` without a manager."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

from rq import client as rq_client
from rq.events import encode_event
from rqtest import STATES, wait_for, write_script
from test_web_api import mgr, new_queue, plant, start, wait_child
from rq.web import metrics

SAMPLE_RE = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)")
LABEL_RE = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="')
ESCAPES = {"\\": "\\", '"': '"', "n": "\n"}
MIXED_SCRIPT = """#!/bin/sh
case "$RQ_PARAM1" in
  err) echo "err broken" >&3 ;;
  resend) if [ "$RQ_COUNT" = 0 ]; then echo "resend 0-again" >&3; else echo "done ok" >&3; fi ;;
  *) echo "done ok" >&3 ;;
esac
"""
STATUSES = ["UP", "DOWN", "PAUSE", "SCRIPTERROR", "STARTING", "BACKOFF", "STOPPING", "FATAL"]
LE = ["0.1", "0.5", "1", "5", "10", "30", "60", "300", "900", "3600", "+Inf"]


# ---------------------------------------------------------------- a small parser


def parse_labels(text: str) -> dict[str, str]:
    labels: dict[str, str] = {}
    i = 0
    while i < len(text):
        m = LABEL_RE.match(text, i)
        assert m, f"bad label syntax at {text[i:]!r}"
        i = m.end()
        value = []
        while text[i] != '"':
            if text[i] == "\\":
                value.append(ESCAPES[text[i + 1]])
                i += 2
            else:
                assert text[i] != "\n"
                value.append(text[i])
                i += 1
        i += 1
        assert m.group(1) not in labels
        labels[m.group(1)] = "".join(value)
        if i < len(text):
            assert text[i] == ",", text
            i += 1
    return labels


def parse(text: str) -> dict[str, dict[str, Any]]:
    """Families by name: {"type", "help", "samples": [(name, labels, value)]}.
    Checks HELP then TYPE before the samples, and no sample outside its family."""
    assert text.endswith("\n")
    families: dict[str, dict[str, Any]] = {}
    current: dict[str, Any] | None = None
    seen: set[tuple[str, tuple[tuple[str, str], ...]]] = set()
    for line in text[:-1].split("\n"):
        if line.startswith("# HELP "):
            name, _, doc = line[7:].partition(" ")
            assert name not in families, f"family {name} twice"
            current = families[name] = {"name": name, "help": doc, "type": None, "samples": []}
        elif line.startswith("# TYPE "):
            name, _, kind = line[7:].partition(" ")
            assert current is not None and current["name"] == name and current["type"] is None
            assert kind in ("gauge", "counter", "histogram"), kind
            current["type"] = kind
        else:
            m = SAMPLE_RE.fullmatch(line)
            assert m and current is not None and current["type"], line
            name, labels = m.group(1), parse_labels(m.group(2) or "")
            allowed = {current["name"]}
            if current["type"] == "histogram":
                allowed = {current["name"] + s for s in ("_bucket", "_sum", "_count")}
            assert name in allowed, f"{name} outside family {current['name']}"
            key = (name, tuple(sorted(labels.items())))
            assert key not in seen, f"duplicate sample {key}"
            seen.add(key)
            current["samples"].append((name, labels, float(m.group(3))))
    return families


def value(families: dict[str, Any], family: str, name: str | None = None,
          **labels: str) -> float | None:
    for sample_name, sample_labels, v in families[family]["samples"]:
        if sample_name == (name or family) and sample_labels == labels:
            return v
    return None


def scrape(client: Any) -> dict[str, dict[str, Any]]:
    resp = client.get("/metrics")
    assert resp.status_code == 200
    assert resp.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
    return parse(resp.get_data(as_text=True))


# ---------------------------------------------------------------- against a real manager


def test_every_family_with_help_type_and_labels(client: Any, mgr_root: Path) -> None:
    fams = scrape(client)
    kinds = {"rq_up": "gauge", "rq_build_info": "gauge", "rq_mgr_uptime_seconds": "gauge",
             "rq_queue_status": "gauge", "rq_queue_messages": "gauge",
             "rq_queue_workers": "gauge", "rq_queue_restarts_total": "counter",
             "rq_queue_oldest_due_age_seconds": "gauge", "rq_jobs_finished_total": "counter",
             "rq_job_duration_seconds": "histogram", "rq_timer_fires_total": "counter",
             "rq_timer_errors_total": "counter"}
    assert {name: f["type"] for name, f in fams.items()} == kinds
    assert all(f["help"] for f in fams.values())
    assert value(fams, "rq_up") == 1
    assert value(fams, "rq_build_info", version="0.1.0") == 1
    assert value(fams, "rq_mgr_uptime_seconds") >= 0
    status = {s["status"]: v for _, s, v in fams["rq_queue_status"]["samples"]
              if s["queue"] == "test"}
    assert list(status) == STATUSES and status["UP"] == 1 and sum(status.values()) == 1
    states = [s["state"] for _, s, _ in fams["rq_queue_messages"]["samples"]
              if s["queue"] == "test"]
    assert sorted(states) == sorted(STATES)
    assert value(fams, "rq_queue_workers", queue="test") == 1
    assert value(fams, "rq_queue_restarts_total", queue="test") == 0
    assert value(fams, "rq_queue_oldest_due_age_seconds", queue="test") == 0
    for to in ("done", "err", "relayed", "que"):
        assert value(fams, "rq_jobs_finished_total", queue="test", to=to) is not None
    buckets = [(s["le"], v) for n, s, v in fams["rq_job_duration_seconds"]["samples"]
               if n.endswith("_bucket") and s["queue"] == "test"]
    assert [le for le, _ in buckets] == LE
    counts = [v for _, v in buckets]
    assert counts == sorted(counts)
    assert counts[-1] == value(fams, "rq_job_duration_seconds", "rq_job_duration_seconds_count",
                               queue="test")
    assert value(fams, "rq_job_duration_seconds", "rq_job_duration_seconds_sum",
                 queue="test") is not None
    assert value(fams, "rq_timer_fires_total") is not None
    assert value(fams, "rq_timer_errors_total") is not None


def test_counts_follow_the_queue(client: Any, mgr_root: Path) -> None:
    new_queue(mgr_root, "m_counts", paused=True, num_workers=3)
    for state in ("prep", "err", "done", "done"):
        plant(mgr_root, "m_counts", state)
    start(mgr_root, "m_counts")
    fams = scrape(client)
    got = {s["state"]: v for _, s, v in fams["rq_queue_messages"]["samples"]
           if s["queue"] == "m_counts"}
    assert got == {"prep": 1, "que": 0, "run": 0, "done": 2, "relayed": 0, "err": 1}
    assert value(fams, "rq_queue_status", queue="m_counts", status="PAUSE") == 1
    assert value(fams, "rq_queue_workers", queue="m_counts") == 3


def test_jobs_finished_and_durations_from_the_event_log(client: Any, mgr_root: Path,
                                                        tmp_path: Path) -> None:
    script = write_script(tmp_path / "mixed.sh", MIXED_SCRIPT)
    new_queue(mgr_root, "mixed", script=script)
    start(mgr_root, "mixed")
    before = scrape(client)

    def finished(fams: dict[str, Any], to: str) -> float:
        return value(fams, "rq_jobs_finished_total", queue="mixed", to=to) or 0

    for param in ("ok", "ok", "err", "resend"):
        reply = rq_client.call_queue(str(mgr_root), "mixed", "create_message",
                                     {"dest": "mixed", "param1": param})
        assert reply[0] == "ok", reply
    want = {"done": 3, "err": 1, "que": 1, "relayed": 0}

    def settled() -> dict[str, Any] | None:
        fams = scrape(client)
        ok = all(finished(fams, to) - finished(before, to) == n for to, n in want.items())
        return fams if ok else None
    after = wait_for(settled, 20, 0.05, what="five transitions out of run")
    count = "rq_job_duration_seconds_count"
    runs = value(after, "rq_job_duration_seconds", count, queue="mixed") - \
        (value(before, "rq_job_duration_seconds", count, queue="mixed") or 0)
    assert runs == 5
    inf = value(after, "rq_job_duration_seconds", "rq_job_duration_seconds_bucket",
                queue="mixed", le="+Inf")
    assert inf == value(after, "rq_job_duration_seconds", count, queue="mixed")


def test_fatal_queue_and_oldest_due_from_disk(client: Any, mgr_root: Path) -> None:
    qdir = mgr_root / "queue" / "m_broken"
    for s in STATES:
        (qdir / s).mkdir(parents=True)
    (qdir / "config.json").write_text(json.dumps({"name": "m_broken"}))  # no script
    now = time.time()
    plant(mgr_root, "m_broken", "que", {"due": now - 100})
    plant(mgr_root, "m_broken", "que", {"due": now + 1000})
    new_queue(mgr_root, "m_late", paused=True)
    plant(mgr_root, "m_late", "que", {"due": now - 300})
    plant(mgr_root, "m_late", "que", {"due": now - 30})
    assert mgr(mgr_root, "reload") == ["ok"]
    wait_child(mgr_root, "m_broken", "FATAL")
    wait_child(mgr_root, "m_late", "RUNNING")
    fams = scrape(client)
    assert value(fams, "rq_queue_status", queue="m_broken", status="FATAL") == 1
    assert value(fams, "rq_queue_status", queue="m_broken", status="UP") == 0
    assert value(fams, "rq_queue_messages", queue="m_broken", state="que") == 2
    assert value(fams, "rq_queue_workers", queue="m_broken") is None  # config unusable
    assert value(fams, "rq_queue_restarts_total", queue="m_broken") == 0
    assert 100 <= value(fams, "rq_queue_oldest_due_age_seconds", queue="m_broken") < 200
    assert 300 <= value(fams, "rq_queue_oldest_due_age_seconds", queue="m_late") < 400


def test_rq_up_zero_when_the_manager_is_down(tmp_path: Path) -> None:
    from rq.web import create_app
    from webtest import build_root
    root = build_root(tmp_path)
    c = create_app(str(root)).test_client()
    fams = scrape(c)
    assert value(fams, "rq_up") == 0
    assert fams["rq_up"]["type"] == "gauge" and fams["rq_up"]["help"]
    assert c.get("/q.json").status_code == 503


# ---------------------------------------------------------------- the text format


def test_label_values_are_escaped(tmp_path: Path) -> None:
    odd = 'we"ird\\na\nme'
    figures = metrics.QueueFigures(odd, "UP", {s: 1 for s in STATES}, 2, 0, 1.5)
    tally = metrics.EventTally(str(tmp_path))
    text = metrics.render('1.0"beta\\', 7, [figures], tally, {"sent": 3, "errors": 1})
    assert 'queue="we\\"ird\\\\na\\nme"' in text
    fams = parse(text)
    assert value(fams, "rq_queue_workers", queue=odd) == 2
    assert value(fams, "rq_queue_oldest_due_age_seconds", queue=odd) == 1.5
    assert value(fams, "rq_build_info", version='1.0"beta\\') == 1
    assert value(fams, "rq_timer_fires_total") == 3 and value(fams, "rq_timer_errors_total") == 1
    assert metrics.escape_help("a\\b\nc") == "a\\\\b\\nc"


# ---------------------------------------------------------------- the event tally


def event(queue: str, to: str, duration: float | None, frm: str = "run") -> bytes:
    return encode_event({"ts": time.time(), "host": "h", "queue": queue,
                         "msg_id": "20200101.0000.00.000.1", "from": frm, "to": to,
                         "status": None, "count": 0, "pid": 1, "exit_code": 0,
                         "duration": duration})


def test_tally_skips_history_then_reads_increments(tmp_path: Path) -> None:
    day = tmp_path / "log" / "events" / "20200101"
    day.mkdir(parents=True)
    old = day / "q.jsonl"
    partial = event("q", "done", 0.2)
    old.write_bytes(event("q", "done", 1.0) + event("q", "err", 2.0) + partial[:20])
    tally = metrics.EventTally(str(tmp_path))
    tally.update()
    assert tally.finished == {} and tally.skipped == 0
    with open(old, "ab") as fh:  # the torn write completes, then more lines
        fh.write(partial[20:] + b"garbage\n" + event("q", "que", 0.05)
                 + event("q", "run", None, frm="que") + event("q", "done", None)[:-3])
    tally.update()
    assert tally.finished == {("q", "done"): 1, ("q", "que"): 1}
    assert tally.skipped == 1
    hist = tally.durations["q"]
    assert hist.count == 2 and abs(hist.total - 0.25) < 1e-9
    assert hist.buckets[:2] == [1, 2]
    new_day = tmp_path / "log" / "events" / "20200102"
    new_day.mkdir()
    (new_day / "other.jsonl").write_bytes(event("other", "relayed", 4000.0))
    tally.update()
    assert tally.finished[("other", "relayed")] == 1
    assert tally.durations["other"].buckets == [0] * 10  # only +Inf holds 4000 s
    assert tally.durations["other"].count == 1
    old.unlink()
    tally.update()
    assert str(old) not in tally.offsets
    assert tally.finished[("q", "done")] == 1  # counters never go back


def test_exposition_of_histogram_buckets(tmp_path: Path) -> None:
    tally = metrics.EventTally(str(tmp_path))
    for d in (0.05, 0.7, 4000.0):
        tally.durations.setdefault("q", metrics.Histogram()).observe(d)
    figures = metrics.QueueFigures("q", "UP", {}, 1, 0, 0)
    fams = parse(metrics.render("v", 1, [figures], tally, {}))
    got = {s["le"]: v for n, s, v in fams["rq_job_duration_seconds"]["samples"]
           if n.endswith("_bucket")}
    assert list(got) == LE
    assert [got[le] for le in LE] == [1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3]
    assert value(fams, "rq_job_duration_seconds", "rq_job_duration_seconds_sum",
                 queue="q") == 4000.75
