"""The Stats pages of web.stats (issue 5, Dashboard part) over a real rq-mgr, with
analytics results written by hand exactly as ANALYTICS_CONTRACT publishes them
(runs/<RUNID>/ + the `current` symlink).

Covers the formats (S14.8: HTML pages, stats.json), the empty state before any run,
broken and partial result files (a clear message, never a 500), a queue missing from
the result, escaping of every text of the result (S14.9, as tests/test_web_xss.py),
the chart data worked out by hand, and the "Run analytics now" button (S14.5 CSRF,
S14.10 redirects, a real message on a real `analytics` queue).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from flask.testing import FlaskClient
from markupsafe import escape

from rq import client as rqclient
from rq.config import load_main_config
from rq.errors import ConnectError
from rqtest import short_id, wait_for
from rq.web import charts, create_app, stats

HOUR = 1_763_776_800  # 2025-11-22 02:00:00 UTC, the start of an hour
XSS = '<img src=/xss-probe onerror="window.__xss=1">'
XSS_QUEUE = "<script>window.__xss=1</script>"


# ---------------------------------------------------------------- a result by hand


def qsum(done: int, err: int, relayed: int, **extra: Any) -> dict[str, Any]:
    finished = done + err + relayed
    out = {
        "events": 3 * finished + 2, "finished": {"done": done, "err": err, "relayed": relayed,
                                                 "deleted": 1},
        "unfinished": 2, "throughput_per_hour": finished / 3,
        "wait": {"p50": 0.85, "p90": 4.2, "p99": 95.0, "mean": 3.0, "n": finished},
        "run": {"p50": 12.0, "p90": 210.0, "p99": 7200.0, "mean": 40.0, "n": finished},
        "total": {"p50": 13.0, "p90": 215.0, "p99": 7300.0, "mean": 44.0, "n": finished},
        "error_rate": err / finished if finished else 0,
        "retries": {"resend": 4, "lease_expired": 1, "recovered": 2},
        "top_errors": [{"status": "exit status 3", "n": err - 1}, {"status": XSS, "n": 1}],
        "slowest": [{"queue": "test", "msg_id": "20251122.0301.05.123.42", "run_s": 7200.0}],
        "busiest_hours": [{"hour": HOUR + 3600, "finished": finished}],
        "wait_histogram": {"edges": [0, 0.01, 0.1, 1, 10, 60, 600, 3600],
                           "counts": [1, 2, 3, 4, 5, 0, 0, 1]},
    }
    out.update(extra)
    return out


def summary(run_id: str = "20251122T050000Z-a1b2c3", **queues: dict[str, Any]) -> dict[str, Any]:
    queues = queues or {"test": qsum(1200, 30, 4), XSS_QUEUE: qsum(5, 1, 0)}
    return {"version": 1, "run_id": run_id, "generated_at": HOUR + 3 * 3600, "duration_s": 41.5,
            "since": None, "until": None, "inputs": ["log/events"], "master": "local[*]",
            "lines": {"read": 4000, "valid": 3990, "skipped": 10,
                      "skipped_by_reason": {"torn": 1, "layout": 2, "crc": 3, "json": 4}},
            "total": qsum(1205, 31, 4), "queues": queues}


def hourly_row(queue: str, hour: int, done: int, err: int, relayed: int = 0,
               run: tuple[float | None, ...] = (None, None, None)) -> dict[str, Any]:
    finished = done + err + relayed
    return {"queue": queue, "hour": hour, "done": done, "err": err, "relayed": relayed,
            "deleted": 0, "error_rate": err / finished if finished else 0,
            "run_p50": run[0], "run_p90": run[1], "run_p99": run[2],
            "wait_p50": 0.5, "wait_p90": 1.0, "wait_p99": 2.0}


HOURLY = [hourly_row("test", HOUR, 200, 10, 4, (10.0, 100.0, 1000.0)),
          hourly_row("test", HOUR + 2 * 3600, 1000, 20, 0, (12.0, 200.0, 7000.0)),
          hourly_row(XSS_QUEUE, HOUR, 5, 1, 0, (30.0, 50.0, 60.0))]


def publish(root: Path, files: dict[str, Any], run_id: str = "20251122T050000Z-a1b2c3") -> Path:
    """runs/<RUNID>/ with `files` (dict/list -> JSON, str/bytes as they are), then
    `current` swapped by rename(2) of a temp symlink, as the contract says."""
    out = root / "analytics"
    run = out / "runs" / run_id
    run.mkdir(parents=True)
    for name, data in files.items():
        raw = data if isinstance(data, (str, bytes)) else json.dumps(data)
        (run / name).write_bytes(raw.encode() if isinstance(raw, str) else raw)
    tmp = out / "current.tmp"
    tmp.symlink_to(Path("runs") / run_id)
    os.rename(tmp, out / "current")
    return run


@pytest.fixture
def result_root(mgr_root: Path) -> Iterator[Path]:
    """The shared root, without any analytics result before and after the test."""
    shutil.rmtree(mgr_root / "analytics", ignore_errors=True)
    yield mgr_root
    shutil.rmtree(mgr_root / "analytics", ignore_errors=True)


def page(client: FlaskClient, path: str, status: int = 200) -> str:
    resp = client.get(path)
    assert resp.status_code == status, (path, resp.status_code, resp.get_data(as_text=True))
    assert resp.mimetype == "text/html"
    return resp.get_data(as_text=True)


def pop_flashes(client: FlaskClient) -> list[tuple[str, str]]:
    with client.session_transaction() as session:
        return list(session.pop("_flashes", []))


# ---------------------------------------------------------------- empty state


def test_no_run_yet_pages_say_so_and_offer_the_button(result_root: Path,
                                                      client: FlaskClient) -> None:
    for path in ("/stats", "/q/test/stats"):
        html = page(client, path)
        assert "No analytics run yet" in html
        assert 'action="/stats/run"' in html and "Run analytics now" in html
        assert "<svg" not in html
    resp = client.get("/stats.json")
    assert resp.status_code == 404 and resp.mimetype == "application/json"
    assert resp.get_json() == ["fail", "No analytics run yet"]


def test_nav_and_queue_page_link_to_the_stats(result_root: Path, client: FlaskClient) -> None:
    assert 'href="/stats"' in page(client, "/")
    assert 'href="/q/test/stats"' in page(client, "/q/test")


# ---------------------------------------------------------------- a full result


def test_stats_json_is_the_current_summary(result_root: Path, client: FlaskClient) -> None:
    publish(result_root, {"summary.json": summary(run_id="20251122T040000Z-000001"),
                          "hourly.json": HOURLY}, run_id="20251122T040000Z-000001")
    newer = summary()
    publish(result_root, {"summary.json": newer, "hourly.json": HOURLY})
    resp = client.get("/stats.json")
    assert resp.status_code == 200 and resp.mimetype == "application/json"
    assert resp.get_json() == newer
    assert client.head("/stats.json").status_code == 200


def test_whole_rq_page_shows_numbers_and_charts(result_root: Path, client: FlaskClient) -> None:
    publish(result_root, {"summary.json": summary(), "hourly.json": HOURLY})
    html = page(client, "/stats")
    assert "Stats · all queues" in html
    assert "20251122T050000Z-a1b2c3" in html and 'data-epoch="1763787600.0"' in html
    tiles = dict(re.findall(r'<span class="n" data-k="(\w+)">([^<]*)</span>', html))
    assert tiles == {"done": "1,205", "err": "31", "relayed": "4", "deleted": "1",
                     "unfinished": "2", "error_rate": "2.5 %", "throughput": "413",
                     "events": "3,722"}
    wait_row = re.search(r'<tr data-span="wait">(.*?)</tr>', html, re.S)
    assert wait_row is not None
    assert re.findall(r'data-k="p\d\d">([^<]*)<', wait_row.group(1)) == \
        ["850 ms", "4.2 s", "1.6 min"]
    run_row = re.search(r'<tr data-span="run">(.*?)</tr>', html, re.S)
    assert run_row is not None and "2 h" in run_row.group(1)  # p99 7200 s
    assert "torn 1, layout 2, crc 3, json 4" in html
    assert html.count('<svg class="chart"') == 4
    # throughput: 3 contiguous hours (the middle one empty) -> 2 bars of done, 2 of err
    assert html.count('<rect class="s-done"') == 2 and html.count('<rect class="s-err"') == 2
    assert html.count('<rect class="s-relayed"') == 1
    assert html.count('<rect class="s-wait"') == 6  # the non-zero histogram bins
    assert "exit status 3" in html and 'href="/q/test/20251122.0301.05.123.42"' in html
    assert 'href="/q/test/stats"' in html  # the per-queue table


def test_run_line_says_when_and_from_how_many_events(result_root: Path,
                                                    client: FlaskClient) -> None:
    """Issue 19: the Stats page says when the data was computed, from how many events, and
    whether the run was incremental (compacted days) or a full recompute."""
    publish(result_root, {"summary.json": {**summary(), "compaction": {
        "mode": "incremental", "days_read": 29, "days_compacted_now": 1, "raw_files": 3}},
        "hourly.json": HOURLY})
    info = re.search(r'<p class="run-line" id="run-info">(.*?)</p>', page(client, "/stats"), re.S)
    assert info is not None
    line = " ".join(re.sub(r"<[^>]+>", "", info.group(1)).split())
    assert 'data-epoch="1763787600.0"' in info.group(1)
    assert "from 3,722 events (incremental: 29 compacted days)" in line
    shutil.rmtree(result_root / "analytics")
    publish(result_root, {"summary.json": {**summary(), "compaction": {"mode": "full"}},
                          "hourly.json": HOURLY})
    assert "from 3,722 events (full recompute)" in " ".join(
        re.sub(r"<[^>]+>", "", page(client, "/stats")).split())


def test_queue_page_shows_that_queue_only(result_root: Path, client: FlaskClient) -> None:
    publish(result_root, {"summary.json": summary(), "hourly.json": HOURLY})
    html = page(client, "/q/test/stats")
    assert "Stats · test" in html
    tiles = dict(re.findall(r'<span class="n" data-k="(\w+)">([^<]*)</span>', html))
    assert tiles["done"] == "1,200" and tiles["err"] == "30" and tiles["error_rate"] == "2.4 %"
    assert html.count('<rect class="s-done"') == 2  # the other queue's hour is left out
    assert 'id="queue-stats"' not in html
    assert client.head("/q/test/stats").status_code == 200


def test_every_text_of_the_result_is_escaped(result_root: Path, client: FlaskClient) -> None:
    publish(result_root, {"summary.json": summary(), "hourly.json": HOURLY})
    html = page(client, "/stats")
    assert XSS not in html and XSS_QUEUE not in html
    assert str(escape(XSS)) in html and str(escape(XSS_QUEUE)) in html
    assert "/q/%3Cscript%3Ewindow.__xss%3D1%3C%2Fscript%3E/stats" in html


# ---------------------------------------------------------------- broken and partial results


BROKEN = [
    ({"summary.json": "{not json"}, "summary.json is not valid JSON"),
    ({"summary.json": [1, 2]}, "summary.json is not a JSON object"),
    ({"summary.json": "{\"version\": 1, \"x\": NaN}"}, "summary.json is not valid JSON"),
    ({"summary.json": {"version": 2}},
     "summary.json has version 2, this dashboard reads version 1"),
    ({"summary.json": b"\xff\xfe"}, "summary.json is not valid JSON"),
    ({"hourly.json": []}, "summary.json is missing"),
]


@pytest.mark.parametrize("files,reason", BROKEN)
def test_broken_result_gives_a_clear_message(result_root: Path, client: FlaskClient,
                                             files: dict[str, Any], reason: str) -> None:
    publish(result_root, files)
    for path in ("/stats", "/q/test/stats"):
        html = page(client, path)
        assert "The analytics result cannot be shown: " + str(escape(reason)) in html
        assert "Run analytics now" in html
    resp = client.get("/stats.json")
    assert resp.status_code == 500
    assert resp.get_json() == ["fail", f"Analytics result unreadable: {reason}"]


def test_dangling_current_link(result_root: Path, client: FlaskClient) -> None:
    (result_root / "analytics").mkdir()
    (result_root / "analytics" / "current").symlink_to("runs/gone")
    assert "does not point to a run directory" in page(client, "/stats")


@pytest.mark.parametrize("hourly,reason", [
    (None, "hourly.json is missing"), ("[{", "hourly.json is not valid JSON"),
    ({"a": 1}, "hourly.json is not a JSON list")])
def test_missing_hourly_keeps_the_summary(result_root: Path, client: FlaskClient,
                                          hourly: Any, reason: str) -> None:
    files: dict[str, Any] = {"summary.json": summary()}
    if hourly is not None:
        files["hourly.json"] = hourly
    publish(result_root, files)
    html = page(client, "/stats")
    assert f"The result is incomplete: {reason}: the charts over time are left out" in html
    assert '<span class="n" data-k="done">1,205</span>' in html
    assert html.count('<svg class="chart"') == 1  # only the wait histogram
    assert html.count("No hourly data in the result.") == 3


def test_wrong_field_types_show_dashes(result_root: Path, client: FlaskClient) -> None:
    bad = {"events": "many", "finished": [1], "unfinished": -3, "throughput_per_hour": True,
           "wait": {"p50": "1 s", "n": None}, "run": 7, "error_rate": {"x": 1},
           "retries": None, "top_errors": "oops", "slowest": [3, {"queue": 5, "run_s": "x"}],
           "busiest_hours": [{"hour": "noon"}], "wait_histogram": {"edges": [0, 1], "counts": [1]}}
    rows = [{"queue": "test", "hour": "x"}, "row", {"queue": "test", "hour": HOUR, "done": "7",
                                                    "err": None, "run_p50": "slow"}]
    publish(result_root, {"summary.json": dict(summary(), total=bad, queues={"test": bad},
                                               lines="all", inputs=7, generated_at="today"),
                          "hourly.json": rows})
    for path in ("/stats", "/q/test/stats"):
        html = page(client, path)
        assert '<span class="n" data-k="done">–</span>' in html
        assert '<span class="n" data-k="unfinished">–</span>' in html
        assert "No errors." in html and "No wait histogram in the result." in html
        assert "No finished messages" not in html  # one busiest-hours row, with dashes


def test_result_without_total_or_queues(result_root: Path, client: FlaskClient) -> None:
    publish(result_root, {"summary.json": {"version": 1, "run_id": "r"}, "hourly.json": []})
    html = page(client, "/stats")
    lacks = 'The result is incomplete: summary.json lacks its "total" or "queues" part'
    assert str(escape(lacks)) in html
    assert "No queues in the result." in html


# ---------------------------------------------------------------- queues and the result


def test_queue_not_in_the_result(result_root: Path, client: FlaskClient) -> None:
    publish(result_root, {"summary.json": summary(other=qsum(1, 0, 0)), "hourly.json": []})
    html = page(client, "/q/test/stats")
    assert "No data for queue test" in html and "<svg" not in html
    assert "Stats · other" in page(client, "/q/other/stats")  # deleted queue, still in result
    assert "404 - Queue not found" in page(client, "/q/nosuch/stats", 404)
    resp = client.get("/q/..%2Fetc/stats")
    assert resp.status_code == 404


# ---------------------------------------------------------------- chart data by hand


def test_hourly_series_fills_gaps_and_merges_queues() -> None:
    rows = HOURLY + [hourly_row("other", HOUR + 2 * 3600 + 60, 0, 5, 0, (1.0, 300.0, 9000.0))]
    one = stats.hourly_series(rows, "test")
    assert one["hours"] == [HOUR, HOUR + 3600, HOUR + 7200]
    assert one["counts"] == {"done": [200, 0, 1000], "err": [10, 0, 20], "relayed": [4, 0, 0]}
    assert one["error_rate"] == [10 / 214, None, 20 / 1020]
    assert one["run"]["p99"] == [1000.0, None, 7000.0]
    every = stats.hourly_series(rows, None)
    assert every["counts"]["err"] == [11, 0, 25] and every["counts"]["done"] == [205, 0, 1000]
    assert every["error_rate"] == [11 / 220, None, 25 / 1025]
    assert every["run"]["p50"] == [30.0, None, 12.0]  # the highest queue's value per hour
    assert every["run"]["p99"] == [1000.0, None, 9000.0]
    assert stats.hourly_series(rows, "nosuch") == {"hours": []}


def test_hourly_series_keeps_the_last_31_days() -> None:
    rows = [hourly_row("q", HOUR - 40 * 86400, 1, 0), hourly_row("q", HOUR, 1, 0)]
    series = stats.hourly_series(rows, None)
    assert len(series["hours"]) == 24 * 31 and series["hours"][-1] == HOUR
    assert series["trimmed"] and sum(series["counts"]["done"]) == 1


@pytest.mark.parametrize("secs,shown", [(None, "–"), (0, "0"), (0.0004, "0 ms"),
                                        (0.85, "850 ms"), (4.25, "4.2 s"), (42, "42 s"),
                                        (95, "1.6 min"), (7200, "2 h"), (172800, "2 d")])
def test_seconds_format(secs: float | None, shown: str) -> None:
    assert charts.fmt_seconds(secs) == shown


@pytest.mark.parametrize("value,top", [(0, 4), (1, 4), (4, 4), (5, 8), (7, 8), (11, 20),
                                       (430, 800), (1205, 2000)])
def test_count_axis_top_has_round_steps(value: float, top: float) -> None:
    assert charts.nice_max(value) == top


@pytest.mark.parametrize("value,top", [(0.3, 0.4), (7, 8), (45, 60), (500, 1200),
                                       (3000, 3600), (7300, 4 * 3600)])
def test_seconds_axis_top_has_round_steps(value: float, top: float) -> None:
    assert charts.nice_max(value, charts.SECOND_STEPS) == pytest.approx(top)


def test_histogram_bin_labels() -> None:
    edges = [0, 0.01, 0.1, 1, 10, 60, 600, 3600]
    labels = [charts.bin_label(edges, i) for i in range(len(edges))]
    assert labels == ["< 10 ms", "10 ms+", "100 ms+", "1 s+", "10 s+", "1 min+", "10 min+",
                      "≥ 1 h"]
    assert charts.bin_range(edges, 1) == "10 ms – 100 ms"


def test_chart_titles_are_escaped() -> None:
    svg = charts.stacked_bars([HOUR], [charts.Series("s-done", XSS, [3])], XSS)
    assert XSS not in svg and str(escape(XSS)) in svg


# ---------------------------------------------------------------- the run button


def queue_answers(root: Path, name: str) -> bool:
    try:
        return rqclient.call_queue(str(root), name, "ping", timeout=5) == ["pong"]
    except ConnectError:
        return False


def test_run_button_queues_a_message_on_the_analytics_queue(result_root: Path,
                                                            client: FlaskClient) -> None:
    back = {"back": "/q/test/stats"}
    resp = client.post("/stats/run", data=back)
    assert resp.status_code == 303 and resp.headers["Location"] == "http://localhost/q/test/stats"
    [(category, text)] = pop_flashes(client)
    assert category == "error" and text.startswith("No 'analytics' queue")
    resp = client.post("/stats/run", data={"x_format": "json"})
    assert resp.status_code == 404 and resp.get_json()[0] == "fail"

    script = result_root.parent / "done.sh"
    reply = rqclient.call_mgr(str(result_root), "create_queue",
                              {"name": "analytics", "script": str(script), "exec_prefix": "",
                               "num_workers": 1})
    assert reply[0] == "success", reply
    try:
        wait_for(lambda: queue_answers(result_root, "analytics"), 30,
                 what="the analytics queue to answer")
        resp = client.post("/stats/run", data={"back": "//evil.example/x"})
        assert resp.status_code == 303 and resp.headers["Location"] == "http://localhost/stats"
        [(category, text)] = pop_flashes(client)
        assert category == "message" and text.startswith("Analytics run queued as message ")
        full = text.rsplit(" ", 1)[-1]
        msg = rqclient.call_queue(str(result_root), "analytics", "get_message",
                                  {"msg_id": short_id(full)}, timeout=10)
        assert msg[0] == "ok" and msg[1]["src"] == "web-stats", msg
        resp = client.post("/stats/run", data={"x_format": "json"})
        assert resp.status_code == 200 and resp.get_json()[0] == "ok"
        (result_root / "config" / "analytics.down").touch()  # S3.5 flag: the queue is DOWN
        resp = client.post("/stats/run", data=back)
        assert resp.status_code == 303 and resp.headers["Location"].endswith("/q/test/stats")
        assert pop_flashes(client) == [
            ("error", "Couldn't queue an analytics run: Service Unavailable - Operationally Down")]
        resp = client.post("/stats/run", data={"x_format": "json"})
        assert resp.status_code == 503
    finally:
        (result_root / "config" / "analytics.down").unlink(missing_ok=True)
        rqclient.call_mgr(str(result_root), "delete_queue", "analytics")


@pytest.mark.parametrize("headers", [{"Origin": "http://evil.example"}, {"Origin": "null"},
                                     {"Sec-Fetch-Site": "cross-site"}])
def test_run_button_refuses_cross_site_posts(result_root: Path, client: FlaskClient,
                                             headers: dict[str, str]) -> None:
    resp = client.post("/stats/run", headers=headers)
    assert resp.status_code == 403
    assert "403 - Cross-origin request refused" in resp.get_data(as_text=True)
    assert pop_flashes(client) == []


def test_stats_routes_need_basic_auth(result_root: Path) -> None:
    main = dataclasses.replace(load_main_config(str(result_root)),
                               basic_auth={"realm": "RQ", "users": {"ops": "pw"}})
    cl = create_app(main=main).test_client()
    for method, path in (("GET", "/stats"), ("GET", "/stats.json"), ("GET", "/q/test/stats"),
                         ("POST", "/stats/run")):
        assert cl.open(path, method=method).status_code == 401, path
    good = {"Authorization": "Basic b3BzOnB3"}  # ops:pw
    assert cl.get("/stats", headers=good).status_code == 200


def test_line_chart_breaks_at_gaps_and_keeps_lone_points() -> None:
    hours = [HOUR + i * 3600 for i in range(5)]
    svg = charts.line_chart(hours, [charts.Series("l-p50", "p50", [1.0, 2.0, None, 4.0, None])],
                            "run")
    assert svg.count("<polyline") == 1 and svg.count("<circle") == 3
    many = [HOUR + i * 3600 for i in range(charts.MAX_POINTS + 1)]
    values: list[float | None] = [1.0] * len(many)
    values[3] = None  # the lone point at index 2 keeps its dot
    values[1] = None
    svg = charts.line_chart(many, [charts.Series("l-p50", "p50", values)], "run")
    assert svg.count("<polyline") == 1 and svg.count("<circle") == 2  # index 0 and 2
