"""Transform tests of the analytics job (issue 5) on small hand-made event sets (S13).

Every expected number is worked out by hand in the comments, not computed by the code under
test.  One session-scoped `local[1]` SparkSession (conftest.py's `spark`, shared with
tests/test_analytics_incremental.py) serves every test here; without Java the Spark tests skip
with that reason (the pure ones still run).
"""

from __future__ import annotations

import json
import os
import shutil
import zlib
from pathlib import Path
from typing import Any

import pytest

from rq.analytics import job, load, summary
from rq.analytics.session import AnalyticsError, java_major
from rq.events import encode_event

JAVA = shutil.which("java") is not None
needs_spark = pytest.mark.skipif(not JAVA, reason="Java 17+ is not installed: Spark cannot run")

T0 = 1700002800          # 2023-11-14 23:00:00 UTC, an hour boundary; the day ends at T0 + 3600
H0, H1 = T0, T0 + 3600


def ev(queue: str, msg: str, ts: float, frm: str | None, to: str, status: str | None = None,
       duration: float | None = None, host: str = "h1") -> dict[str, Any]:
    return {"ts": ts, "host": host, "queue": queue, "msg_id": msg, "from": frm, "to": to,
            "status": status, "count": 0, "pid": None, "exit_code": None, "duration": duration}


def created(queue: str, msg: str, ts: float) -> list[dict[str, Any]]:
    return [ev(queue, msg, ts, None, "prep"), ev(queue, msg, ts, "prep", "que")]


def raw_line(payload: bytes) -> bytes:
    return b'{"crc32":"%08x","event":' % zlib.crc32(payload) + payload + b"}\n"


# ---------------------------------------------------------------- the hand-made history
# Window: since T0, until T0 + 7200 (2 hours).  Queue `a` (messages m1..m9) and `b` (m6, m10).
A = [
    # m1: waits 10, runs 30 -> done "ok" at T0+40; total 40
    *created("a", "m1", T0), ev("a", "m1", T0 + 10, "que", "run"),
    ev("a", "m1", T0 + 40, "run", "done", "ok", 30),
    # m2: resend: wait 5, run 1, back to que (backoff 100 s), wait 100, run 2 -> done; total 108
    *created("a", "m2", T0 + 100), ev("a", "m2", T0 + 105, "que", "run"),
    ev("a", "m2", T0 + 106, "run", "que", "try later", 1),
    ev("a", "m2", T0 + 206, "que", "run"), ev("a", "m2", T0 + 208, "run", "done", "ok", 2),
    # m3: recovery (S2.7) without a duration: the run span is 400 - 300 = 100 from the ts;
    #     wait 100 then 1; run 3299 -> err "boom" at T0+3700 (hour H1); total 3500
    *created("a", "m3", T0 + 200), ev("a", "m3", T0 + 300, "que", "run"),
    ev("a", "m3", T0 + 400, "run", "que", "QUEUE RESTARTED - MOVING TO QUE"),
    ev("a", "m3", T0 + 401, "que", "run"), ev("a", "m3", T0 + 3700, "run", "err", "boom", 3299),
    # m4: two lease expiries (S8.3): wait 10, run 300, wait 0 (same ms), run 300 -> err;
    #     total 660 - 50 = 610
    *created("a", "m4", T0 + 50), ev("a", "m4", T0 + 60, "que", "run"),
    ev("a", "m4", T0 + 360, "run", "que", "LEASE EXPIRED - MOVING TO QUE", 300),
    ev("a", "m4", T0 + 360, "que", "run"),
    ev("a", "m4", T0 + 660, "run", "err", "LEASE EXPIRED - HIT MAX RESEND COUNT - MOVING TO ERR",
       300),
    # m5: still running at the end of the window (its done at T0+7300 is after `until`): wait 10
    *created("a", "m5", T0 + 1000), ev("a", "m5", T0 + 1010, "que", "run"),
    ev("a", "m5", T0 + 7300, "run", "done", "late", 6290),
    # m7: a resend that hits max_count (S5.4): wait 20, run 10 -> err; total 30
    *created("a", "m7", T0 + 500), ev("a", "m7", T0 + 520, "que", "run"),
    ev("a", "m7", T0 + 530, "run", "err", "HIT MAX RESEND COUNT - MOVING TO ERR", 10),
    # m8: deleted while queued at T0+700
    *created("a", "m8", T0 + 600), ev("a", "m8", T0 + 700, "que", "deleted"),
    # m9: created before `since` (those two events are outside the window): no wait span, no
    #     total; run 1 -> done
    *created("a", "m9", T0 - 10), ev("a", "m9", T0 + 5, "que", "run"),
    ev("a", "m9", T0 + 6, "run", "done", "ok", 1),
]
B = [
    # m6: wait 10, run 5 -> done; total 15.  Its start is written before its creation (the
    # creation's two same-ms events in their order), its done in another tree.
    *created("b", "m6", T0 + 10), ev("b", "m6", T0 + 20, "que", "run"),
    ev("b", "m6", T0 + 25, "run", "done", "fine", 5),
    # m10: a coalesced dup (que -> relayed): no spans; total 1
    *created("b", "m10", T0 + 30), ev("b", "m10", T0 + 31, "que", "relayed", "duplicate x"),
]
BAD_LINES = {  # reason -> raw lines
    "layout": [b"hello\n", encode_event({"a": 1}).replace(b'"crc32":"', b'"crc32":"X')[:-1]
               + b"\n"],
    "crc": [encode_event(ev("a", "mX", T0 + 1, None, "prep")).replace(b'"mX"', b'"mY"')],
    "json": [raw_line(b"[1,2]"), raw_line(b'{"ts":1}')],
}


def day_file(tree: Path, ts: float, queue: str) -> Path:
    import time
    path = tree / "log" / "events" / time.strftime("%Y%m%d", time.gmtime(ts)) / f"{queue}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def write_history(base: Path) -> tuple[Path, Path]:
    tree1, tree2 = base / "host1", base / "host2"
    m6_done = B[3]
    for event in [*A, B[2], B[0], B[1], *B[4:]]:
        with open(day_file(tree1, event["ts"], event["queue"]), "ab") as f:
            f.write(encode_event(event))
    with open(day_file(tree2, m6_done["ts"], "b"), "ab") as f:
        f.write(encode_event(m6_done))
    first = day_file(tree1, T0, "a")
    with open(first, "ab") as f:
        for lines in BAD_LINES.values():
            f.writelines(lines)
    with open(day_file(tree1, T0 + 3600, "a"), "ab") as f:  # a torn tail: no final newline
        f.write(encode_event(ev("a", "mZ", T0 + 3601, None, "prep"))[:40])
    return tree1, tree2


@pytest.fixture(scope="module")
def result(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    base = tmp_path_factory.mktemp("hist")
    tree1, tree2 = write_history(base)
    opts = job.Options(inputs=(str(tree1), "file://" + str(tree2)), output=str(base / "out"),
                       since=T0, until=T0 + 7200, master="local[1]")
    final, summ = job.run(spark, opts)
    out = base / "out"
    assert os.path.realpath(out / "current") == final
    hourly = json.loads((out / "current" / "hourly.json").read_text())
    messages = {r["msg_id"]: r.asDict() for r in
                spark.read.parquet(str(out / "current" / "messages")).collect()}
    errors = sorted(tuple(r) for r in spark.read.parquet(str(out / "current" / "errors"))
                    .select("queue", "status", "n").collect())
    on_disk = json.loads((out / "current" / "summary.json").read_text())
    return {"summary": summ, "on_disk": on_disk, "hourly": hourly, "messages": messages,
            "errors": errors}


# ---------------------------------------------------------------- S13.4 line checks


@needs_spark
def test_s13_4_lines_skipped_and_counted_by_reason(result: dict[str, Any]) -> None:
    lines = result["summary"]["lines"]
    # valid: 34 (a) + 2 (m9 before since) + 1 (m5 after until) + 7 (b) = 44 events written
    assert lines["skipped_by_reason"] == {"torn": 1, "layout": 2, "crc": 1, "json": 2}
    assert lines == {"read": 50, "valid": 44, "skipped": 6,
                     "skipped_by_reason": lines["skipped_by_reason"]}
    assert result["on_disk"] == result["summary"]


@needs_spark
def test_hadoop_listing_equals_the_local_one(spark: Any, tmp_path: Path) -> None:
    """Inputs that are not local paths are listed through Hadoop's FileSystem (any URI)."""
    from rq.analytics import extract
    tree1, _ = write_history(tmp_path)
    local = extract.list_local(str(tree1), T0, T0 + 7200)
    remote = extract.list_remote(spark, "file://" + str(tree1), T0, T0 + 7200)
    assert [(f.uri.rsplit("/", 2)[-2:], f.size, f.torn_tail) for f in remote] == [
        (f.uri.rsplit("/", 2)[-2:], f.size, f.torn_tail) for f in local]
    assert [f.torn_tail for f in local] == [False, False, True]   # 20231115/a.jsonl is torn
    assert extract.list_local(str(tree1), T0 + 3600, None)[0].uri.endswith("20231115/a.jsonl")


@needs_spark
def test_empty_event_log_publishes_zeros(spark: Any, tmp_path: Path) -> None:
    (tmp_path / "root" / "log" / "events" / "20231114").mkdir(parents=True)
    (tmp_path / "root" / "log" / "events" / "20231114" / "q.jsonl").write_bytes(b"")
    opts = job.Options(inputs=(str(tmp_path / "root"),), output=str(tmp_path / "out"))
    _, summ = job.run(spark, opts)
    assert summ["lines"]["read"] == 0 and summ["queues"] == {} and summ["files"] == 1
    assert summ["total"]["finished"] == {"done": 0, "err": 0, "relayed": 0, "deleted": 0}
    assert json.loads((tmp_path / "out" / "current" / "hourly.json").read_text()) == []


@needs_spark
def test_s13_4_check_lines_on_single_lines(spark: Any) -> None:
    from rq.analytics import transform as T
    good = encode_event(ev("q", "m", 5.5, None, "prep")).decode()[:-1]
    cases = [
        (good, False, None),
        (good, True, "torn"),                                   # no final newline
        (good.replace('"crc32":"', '"crc32": "'), False, "layout"),
        (good[:-3], False, "layout"),                           # cut short: no final }
        (good[:-1], False, "crc"),                   # the payload's } taken for the line's
        (good.replace('"prep"', '"prex"'), False, "crc"),
        (raw_line(b'"text"').decode()[:-1], False, "json"),     # not an object
        (raw_line(b'{"ts":"x","queue":"q","msg_id":"m","to":"que"}').decode()[:-1], False,
         "json"),                                               # ts not a number
        (raw_line('{"ts":1,"queue":"é","msg_id":"m","to":"que"}'.encode()).decode()[:-1],
         False, None),                                          # CRC over UTF-8 bytes
        (raw_line('{"ts":1,"queue":"q","msg_id":"m","to":"que","status":"✓ ü"}'.encode())
         .decode()[:-1], False, None),              # byte offsets, not character positions
        ('{"crc32":"é000000","event":{"ts":1,"queue":"q","msg_id":"m","to":"que"}}', False,
         "layout"),                                 # 8 bytes, but not 8 hex digits
        (raw_line(b'{"ts":1,"queue":"q",').decode()[:-1], False, "json"),  # CRC ok, cut JSON
    ]
    df = spark.createDataFrame([(v, t) for v, t, _ in cases], "value string, torn boolean")
    got = [r["reason"] for r in T.check_lines(df).collect()]
    assert got == [want for _, _, want in cases]


# ---------------------------------------------------------------- per queue


@needs_spark
def test_queue_a_counts_retries_and_unfinished(result: dict[str, Any]) -> None:
    a = result["summary"]["queues"]["a"]
    # events in the window: m1 4, m2 6, m3 6, m4 6, m5 3, m7 4, m8 3, m9 2 = 34
    assert a["events"] == 34
    assert a["finished"] == {"done": 3, "err": 3, "relayed": 0, "deleted": 1}  # m1 m2 m9 | m3 m4 m7
    assert a["unfinished"] == 1                                                # m5
    assert a["retries"] == {"resend": 2, "lease_expired": 2, "recovered": 1}
    assert a["error_rate"] == 0.5                                              # 3 / 6
    assert a["throughput_per_hour"] == 3.0                                     # 6 in 2 h


@needs_spark
def test_queue_a_wait_run_total_percentiles(result: dict[str, Any]) -> None:
    a = result["summary"]["queues"]["a"]
    # waits 0 1 5 10 10 10 20 100 100 (n 9, sum 256); nearest rank: p50 5th, p90 9th
    assert a["wait"] == {"p50": 10.0, "p90": 100.0, "p99": 100.0, "mean": 28.444444, "n": 9}
    # runs 1 1 2 10 30 100 300 300 3299 (n 9, sum 4043)
    assert a["run"] == {"p50": 30.0, "p90": 3299.0, "p99": 3299.0, "mean": 449.222222, "n": 9}
    # creation -> final state of finished messages created in the window: 30 40 108 610 3500
    assert a["total"] == {"p50": 108.0, "p90": 3500.0, "p99": 3500.0, "mean": 857.6, "n": 5}
    # [0,.01) 0 | [1,10) 1 5 | [10,60) 10 10 10 20 | [60,600) 100 100
    assert a["wait_histogram"]["counts"] == [1, 0, 0, 2, 4, 2, 0, 0]


@needs_spark
def test_queue_a_top_lists(result: dict[str, Any]) -> None:
    a = result["summary"]["queues"]["a"]
    assert a["top_errors"] == [
        {"status": "HIT MAX RESEND COUNT - MOVING TO ERR", "n": 1},
        {"status": "LEASE EXPIRED - HIT MAX RESEND COUNT - MOVING TO ERR", "n": 1},
        {"status": "boom", "n": 1}]
    # run time per message: m3 100+3299, m4 600, m1 30, m7 10, m2 1+2, m9 1
    assert [(s["msg_id"], s["run_s"]) for s in a["slowest"]] == [
        ("m3", 3399.0), ("m4", 600.0), ("m1", 30.0), ("m7", 10.0), ("m2", 3.0), ("m9", 1.0)]
    assert a["busiest_hours"] == [{"hour": H0, "finished": 5}, {"hour": H1, "finished": 1}]


@needs_spark
def test_queue_b_out_of_order_across_files_and_trees(result: dict[str, Any]) -> None:
    b = result["summary"]["queues"]["b"]
    assert b["finished"] == {"done": 1, "err": 0, "relayed": 1, "deleted": 0}
    assert b["events"] == 7 and b["unfinished"] == 0 and b["error_rate"] == 0.0
    assert b["wait"]["n"] == 1 and b["wait"]["p50"] == 10.0          # m6: que T0+10, run T0+20
    assert b["run"]["n"] == 1 and b["run"]["p50"] == 5.0
    assert b["total"] == {"p50": 1.0, "p90": 15.0, "p99": 15.0, "mean": 8.0, "n": 2}
    m6 = result["messages"]["m6"]
    assert (m6["final_state"], m6["wait_s"], m6["run_s"], m6["total_s"], m6["status"]) == (
        "done", 10.0, 5.0, 15.0, "fine")


@needs_spark
def test_whole_period_summary(result: dict[str, Any]) -> None:
    s = result["summary"]
    t = s["total"]
    assert (s["since"], s["until"], s["window"]["hours"]) == (T0, T0 + 7200, 2.0)
    assert t["events"] == 41
    assert t["finished"] == {"done": 4, "err": 3, "relayed": 1, "deleted": 1}
    assert t["unfinished"] == 1 and t["throughput_per_hour"] == 4.0 and t["error_rate"] == 0.375
    # waits: a's nine + 10 -> 0 1 5 10 10 10 10 20 100 100 (sum 266)
    assert t["wait"] == {"p50": 10.0, "p90": 100.0, "p99": 100.0, "mean": 26.6, "n": 10}
    # runs: a's nine + 5 -> 1 1 2 5 10 30 100 300 300 3299 (sum 4048)
    assert t["run"] == {"p50": 10.0, "p90": 300.0, "p99": 3299.0, "mean": 404.8, "n": 10}
    # totals: 1 15 30 40 108 610 3500 (sum 4304)
    assert t["total"] == {"p50": 40.0, "p90": 3500.0, "p99": 3500.0, "mean": 614.857143,
                          "n": 7}
    assert t["retries"] == {"resend": 2, "lease_expired": 2, "recovered": 1}
    assert t["slowest"][0] == {"queue": "a", "msg_id": "m3", "run_s": 3399.0}
    assert t["busiest_hours"] == [{"hour": H0, "finished": 7}, {"hour": H1, "finished": 1}]


@needs_spark
def test_hourly_rows(result: dict[str, Any]) -> None:
    rows = {(r["queue"], r["hour"]): r for r in result["hourly"]}
    assert sorted(rows) == [("a", H0), ("a", H1), ("b", H0)]
    a0, a1 = rows[("a", H0)], rows[("a", H1)]
    assert (a0["done"], a0["err"], a0["relayed"], a0["deleted"], a0["error_rate"]) == (
        3, 2, 0, 1, 0.4)
    # run spans ending in H0: 1 1 2 10 30 100 300 300 -> p50 4th, p90 8th
    assert (a0["run_p50"], a0["run_p90"], a0["run_p99"]) == (10.0, 300.0, 300.0)
    assert (a0["wait_p50"], a0["wait_p90"]) == (10.0, 100.0)
    assert (a1["err"], a1["error_rate"], a1["run_p50"], a1["wait_p50"]) == (1, 1.0, 3299.0, None)


@needs_spark
def test_messages_and_errors_tables(result: dict[str, Any]) -> None:
    m = result["messages"]
    assert m["m5"]["final_state"] is None and m["m5"]["wait_s"] == 10.0
    assert (m["m8"]["final_state"], m["m8"]["final_ts"]) == ("deleted", T0 + 700)
    assert (m["m3"]["recoveries"], m["m4"]["lease_expiries"], m["m2"]["resends"]) == (1, 2, 1)
    assert m["m9"]["total_s"] is None and m["m9"]["first_ts"] == T0 + 5
    assert len(m) == 10
    assert result["errors"] == [
        ("a", "HIT MAX RESEND COUNT - MOVING TO ERR", 1),
        ("a", "LEASE EXPIRED - HIT MAX RESEND COUNT - MOVING TO ERR", 1), ("a", "boom", 1)]


@needs_spark
def test_same_millisecond_events_keep_their_file_order(spark: Any) -> None:
    from rq.analytics import transform as T
    # all in one ms, in the order the queue appended them: a resend (run -> que) and the
    # restart (que -> run) in the same ms must chain as written, not by state name
    events = [ev("q", "m", 9.0, None, "prep"), ev("q", "m", 9.0, "prep", "que"),
              ev("q", "m", 9.0, "que", "run"), ev("q", "m", 9.0, "run", "que", "again", 0.0),
              ev("q", "m", 9.0, "que", "run"), ev("q", "m", 9.0, "run", "done", "ok", 0.0)]
    lines = spark.createDataFrame([(encode_event(e).decode()[:-1], False, i)
                                   for i, e in enumerate(events)],
                                  "value string, torn boolean, pos long")
    msgs = T.message_table(T.window_events(T.check_lines(lines), None, None)).collect()
    assert len(msgs) == 1
    row = msgs[0]
    assert (row["final_state"], row["resends"], row["total_s"], row["status"]) == (
        "done", 1, 0.0, "ok")
    assert sorted((s["kind"], s["s"]) for s in row["spans"]) == [
        ("run", 0.0), ("run", 0.0), ("wait", 0.0), ("wait", 0.0)]



@needs_spark
def test_rows_come_back_as_the_values_a_row_collect_gives(spark: Any) -> None:
    """T.rows crosses Py4J as JSON text: every kind of value the job collects must come back
    as collect() gives it (decimals as exact ints, NaN and infinities as floats, nulls as
    None, nested arrays of structs as lists of dicts, doubles bit for bit)."""
    import math

    from rq.analytics import transform as T
    df = spark.sql(
        "SELECT * FROM VALUES "
        "('q', 1795888940.501D, CAST('NaN' AS DOUBLE), CAST('-Infinity' AS DOUBLE), "
        " CAST(123456789012345678901234567890 AS DECIMAL(38,0)), 9007199254740993L, "
        " CAST(NULL AS STRING), 0.1D + 0.2D, array(named_struct('k', 'x', 's', 1.5D))), "
        "('r\"\\n\u00e9', 5E-324D, CAST(NULL AS DOUBLE), CAST('Infinity' AS DOUBLE), "
        " CAST(0 AS DECIMAL(38,0)), -1L, 'é\t', 1.0D / 3, array()) "
        "AS t(queue, ts, nan, inf, dec, big, text, sum3, spans)")
    got = T.rows(df)
    want = [r.asDict(recursive=True) for r in df.collect()]
    assert [list(r) for r in got] == [list(r) for r in want]  # the columns, in order
    for g, w in zip(got, want):
        for c in w:
            if isinstance(w[c], float) and math.isnan(w[c]):
                assert isinstance(g[c], float) and math.isnan(g[c]), c
            elif c == "dec":
                assert type(g[c]) is int and g[c] == int(w[c]), c
            else:
                assert g[c] == w[c] and type(g[c]) is type(w[c]), c


# ---------------------------------------------------------------- pure parts (no Spark)


def test_parse_options_times_and_conf() -> None:
    now = 1_000_000.0
    opts = job.parse_options("/r", {"since": "2h", "until": "1970-01-12T14:00:00Z",
                                    "input": ["/x", "hdfs://n/y"], "conf": ["a=b", "c=d=e"],
                                    "master": "spark://127.0.0.1:7077"}, now)
    assert opts.since == now - 7200 and opts.until == 11 * 86400 + 14 * 3600
    assert opts.inputs == ("/x", "hdfs://n/y") and opts.output == "/r/analytics"
    assert opts.conf == {"a": "b", "c": "d=e"} and opts.master == "spark://127.0.0.1:7077"
    assert job.parse_options("/r", {"since": "12.5"}, now).since == 12.5
    assert job.parse_options("/r", {}, now).master == "local[*]"


@pytest.mark.parametrize("flags,error", [
    ({"since": "yesterday"}, "invalid --since: yesterday"),
    ({"conf": ["novalue"]}, "invalid --conf novalue"),
    ({"since": "20", "until": "10"}, "--since must be before --until"),
    ({"output": True}, "needs a value"),
])
def test_parse_options_errors_are_one_line(flags: dict[str, Any], error: str) -> None:
    with pytest.raises(AnalyticsError, match=error):
        job.parse_options("/r", flags, 0.0)


@pytest.mark.parametrize("text,major", [
    ('openjdk version "17.0.15" 2025-04-15', 17), ('java version "1.8.0_392"', 8),
    ('openjdk version "21" 2023-09-19', 21), ("garbage", None)])
def test_java_major(text: str, major: int | None) -> None:
    assert java_major(text) == major


def test_publish_swaps_current_and_keeps_five(tmp_path: Path) -> None:
    out = load.output_dir(str(tmp_path / "out"))
    ids = [f"2026010{i}T000000Z-00000{i}" for i in range(1, 8)]
    for run_id in ids:
        work = load.partial_dir(out, run_id)
        load.write_json(os.path.join(work, "summary.json"), {"run_id": run_id})
        load.publish(out, run_id)
        assert json.loads((tmp_path / "out" / "current" / "summary.json").read_text()) == {
            "run_id": run_id}
        load.prune(out, 0.0)
    assert sorted(os.listdir(tmp_path / "out" / "runs")) == ids[-5:]
    assert os.readlink(tmp_path / "out" / "current") == os.path.join("runs", ids[-1])



def test_fsync_tree_syncs_every_file_and_directory_and_raises_a_failure(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    top = tmp_path / "tree"
    paths = {str(top)}
    for d in range(5):
        for q in range(4):
            part = top / f"day={d}" / f"src_queue=q{q}"
            part.mkdir(parents=True)
            paths |= {str(top / f"day={d}"), str(part)}
            for name in ("part-0.parquet", ".part-0.parquet.crc"):
                (part / name).write_bytes(b"x")
                paths.add(str(part / name))
    synced: list[str] = []
    real = load.fsync_path
    monkeypatch.setattr(load, "fsync_path", lambda p: (synced.append(p), real(p))[1])
    load.fsync_tree(str(top))
    assert sorted(synced) == sorted(paths)  # each once: 40 files, 26 directories
    files = {p for p in paths if os.path.isfile(p)}
    assert set(synced[:len(files)]) == files  # the files before any directory

    def failing(path: str) -> None:  # an OS seam: one fsync fails (EIO)
        if path.endswith("src_queue=q2/part-0.parquet") and "day=3" in path:
            raise OSError(5, "Input/output error")
        real(path)
    monkeypatch.setattr(load, "fsync_path", failing)
    with pytest.raises(OSError, match="Input/output error"):
        load.fsync_tree(str(top))


def test_output_must_be_local() -> None:
    with pytest.raises(AnalyticsError, match="must be a local directory"):
        load.output_dir("hdfs://nn/out")


def test_summary_of_nothing() -> None:
    s = summary.build({"since": None, "until": None}, {}, [], [], [], [], [])
    assert s["lines"] == {"read": 0, "valid": 0, "skipped": 0,
                          "skipped_by_reason": {"torn": 0, "layout": 0, "crc": 0, "json": 0}}
    assert s["queues"] == {} and s["total"]["wait"]["p50"] is None
    assert s["total"]["throughput_per_hour"] == 0.0 and s["window"]["hours"] is None


# ---------------------------------------------------------------- exact percentiles at any size


def py_nearest(values: list[int]) -> list[int]:
    """Nearest rank by hand: the ceil(n * p)-th smallest, p = 1/2, 9/10, 99/100."""
    s = sorted(values)
    return [s[(len(s) * a + b - 1) // b - 1] for a, b in ((1, 2), (9, 10), (99, 100))]


@needs_spark
def test_percentiles_are_exact_nearest_rank_beyond_ten_thousand_values(spark: Any) -> None:
    """percentile_approx (the job's first definition) is exact only up to 10,000 values per
    group; the facts' two-step percentiles are exact at any size, negative values and repeats
    included, per queue, per hour and over everything (rq.analytics.facts)."""
    from pyspark.sql import functions as F

    from rq.analytics import facts

    n = 40_000

    def v_of(i: int) -> int:
        return ((i * 7919) % 100_003) * (i % 5 + 1) - 5_000

    def queue_of(i: int) -> str:
        return "a" if i % 3 == 0 else "b"

    def hour_of(i: int) -> int:
        return 3600 * (i % 2)

    ids = F.col("id")
    raw = spark.range(n).select(
        F.when(ids % 3 == 0, "a").otherwise("b").alias("queue"),
        (ids % 2 * 3600).alias("hour"), F.lit("run").alias("kind"),
        ((ids * 7919) % 100_003 * (ids % 5 + 1) - 5_000).alias("v"))
    values = raw.groupBy("queue", "hour", "kind", "v").agg(F.count(F.lit(1)).alias("n"))
    values_b = facts.by_queue(values)
    got = facts.group_percentiles(spark, {(r["queue"], r["kind"], r["b"]): r["n"]
                                          for r in facts.coarse(values_b).collect()},
                                  lambda _buckets: values_b)
    by_queue: dict[str, list[int]] = {"a": [], "b": []}
    by_hour: dict[tuple[str, int], list[int]] = {}
    for i in range(n):
        by_queue[queue_of(i)].append(v_of(i))
        by_hour.setdefault((queue_of(i), hour_of(i)), []).append(v_of(i))
    assert len(by_queue["b"]) > 25_000
    for q, vals in by_queue.items():
        assert got[(q, "run")] == [v / facts.US for v in py_nearest(vals)], q
    everything = by_queue["a"] + by_queue["b"]
    assert got[(None, "run")] == [v / facts.US for v in py_nearest(everything)]
    hours = {(r["queue"], r["hour"]): [r["p50"], r["p90"], r["p99"], r["n"]]
             for r in facts.hour_percentiles(values).collect()}
    assert hours == {k: [*py_nearest(v), len(v)] for k, v in by_hour.items()}
    stats = {r["queue"]: (r["n"], int(r["sum"])) for r in facts.value_stats(values_b).collect()}
    assert stats == {q: (len(v), sum(v)) for q, v in by_queue.items()}


@needs_spark
def test_percentiles_count_a_value_by_the_sum_of_its_rows_some_negative(spark: Any) -> None:
    """A run on stored facts ranks the stored value rows beside its change without adding them
    up first (rq.analytics.stored run_carried, facts.group_percentiles): a value may come in
    several rows, some with n < 0, and counts by their sum; one whose rows cancel is no value.
    Per queue and over everything, against a hand computation of the net multiset.  Each
    percentile's rank has a cancelled value just below its answer, its +1 row before its -1
    row: a ranking by rows instead of by values would answer it."""
    from collections import Counter

    from pyspark.sql import functions as F

    from rq.analytics import facts

    base = {"a": [4 * ((i * 7919) % 6_007) for i in range(3_000)],        # multiples of 4
            "b": [4 * ((i * 104_729) % 5_003) + 2 for i in range(3_000)]}  # 2 more: disjoint
    removed = {q: vals[::7] for q, vals in base.items()}   # n = -1 rows
    added = {q: vals[::5] for q, vals in base.items()}     # a second row of the same values
    net = {q: +(Counter(base[q]) - Counter(removed[q]) + Counter(added[q])) for q in base}

    def rank_values(values: list[int]) -> list[int]:
        s = sorted(values)
        return [s[(len(s) * a + b - 1) // b - 1] for a, b in ((1, 2), (9, 10), (99, 100))]

    groups = {"a": list(net["a"].elements()), "b": list(net["b"].elements())}
    groups["*"] = groups["a"] + groups["b"]
    first: list[tuple[str, int, int]] = []  # cancelled values (odd: never a value of the
    last: list[tuple[str, int, int]] = []   # multisets), just below and just above an answer
    for g, values in groups.items():
        q = "a" if g == "*" else g
        for v in rank_values(values):
            first += [(q, v - 1, 1), (q, v + 1, -1)]
            last += [(q, v - 1, -1), (q, v + 1, 1)]
    rows = (first + [(q, v, n) for q, vals in base.items() for v, n in Counter(vals).items()]
            + [(q, v, -1) for q, vals in removed.items() for v in vals]
            + [(q, v, 1) for q, vals in added.items() for v in vals] + last)
    values_b = (spark.createDataFrame(rows, "queue string, v long, n long")
                .withColumn("kind", F.lit("run")).withColumn("b", facts.bucket("v")))
    assert values_b.groupBy("queue", "v").count().where("count > 1").count() > 500
    got = facts.group_percentiles(spark, {(r["queue"], r["kind"], r["b"]): r["n"]
                                          for r in facts.coarse(values_b).collect()},
                                  lambda _buckets: values_b)
    for g, values in groups.items():
        assert got[(None if g == "*" else g, "run")] == [
            v / facts.US for v in py_nearest(values)], g


@needs_spark
def test_bucket_is_monotone(spark: Any) -> None:
    """The coarse bucket (SQL, integer arithmetic) never orders two values against their
    order: around every power of two up to 2**44 us (203 days), both signs, and 0."""
    from rq.analytics import facts

    samples = sorted({*range(-300, 300), *(s * (2 ** k + d) for k in range(2, 45)
                                           for d in (-1, 0, 1) for s in (1, -1))})
    rows = facts.literal_rows(spark, "v long", [(v,) for v in samples]).select(
        "v", facts.bucket("v").alias("b")).collect()
    got = sorted((r["v"], r["b"]) for r in rows)
    assert [v for v, _ in got] == samples
    keys = [b for _, b in got]
    assert keys == sorted(keys) and len(set(keys)) > 150


@needs_spark
def test_literal_rows_and_in_lists_keep_every_value(spark: Any) -> None:
    """facts.literal_rows and facts.in_list write values as Spark SQL text: quotes,
    backslashes, non-ASCII, NULL and numbers come back as given; an empty table has the
    schema and no row."""
    from rq.analytics import facts

    rows = [("it's", 1, 0.25), ("a\\b\\'c", None, -3.5), ("été \n", 2**40, None), (None, 0, 0.0)]
    got = facts.literal_rows(spark, "s string, n long, x double", rows).collect()
    assert [tuple(r) for r in got] == rows
    df = facts.literal_rows(spark, "s string, n long, x double", rows)
    picked = df.where(facts.in_list("s", ["it's", "a\\b\\'c"])).collect()
    assert sorted(r["s"] for r in picked) == ["a\\b\\'c", "it's"]
    empty = facts.literal_rows(spark, "s string, n long", [])
    assert empty.collect() == [] and empty.columns == ["s", "n"]


def test_totals_add_round_trip_and_rank() -> None:
    """rq.analytics.totals (pure): sums drop what adds up to nothing, first/last times take
    the min/max, JSON keeps everything, the Python nearest rank is the hand computation."""
    from rq.analytics import totals

    a = totals.from_rows({
        "queue_hour": [{"queue": "q", "hour": 0, "done": 2, "err": 1, "relayed": 0,
                        "deleted": 0}],
        "queues": [{"queue": "q", "done": 2, "err": 1, "relayed": 0, "deleted": 0,
                    "unfinished": 1, "events": 9, "resend": 0, "lease_expired": 0,
                    "recovered": 0, "first_ts": 5.0, "last_ts": 50.0}],
        "coarse": [{"queue": "q", "kind": "run", "b": 40, "n": 3}],
        "errors": [{"queue": "q", "status": "boom", "n": 1}],
        "slow": [{"queue": "q", "msg_id": "m1", "host": None, "run_s": 2.5}]})
    b = totals.from_rows({
        "queue_hour": [{"queue": "q", "hour": 0, "done": -2, "err": -1, "relayed": 0,
                        "deleted": 0},
                       {"queue": "q", "hour": 3600, "done": 2, "err": 1, "relayed": 0,
                        "deleted": 0}],
        "queues": [{"queue": "q", "done": 0, "err": 0, "relayed": 0, "deleted": 0,
                    "unfinished": -1, "events": 2, "resend": 1, "lease_expired": 0,
                    "recovered": 0, "first_ts": 7.0, "last_ts": 3700.0}],
        "coarse": [{"queue": "q", "kind": "run", "b": 40, "n": -3}],
        "errors": [{"queue": "q", "status": "boom", "n": 1}]})
    c = totals.add(a, b)
    assert c.queue_hour == {("q", 3600): [2, 1, 0, 0]} and c.coarse == {}
    assert c.queues["q"] == {"done": 2, "err": 1, "relayed": 0, "deleted": 0, "unfinished": 0,
                             "events": 11, "resend": 1, "lease_expired": 0, "recovered": 0,
                             "first_ts": 5.0, "last_ts": 3700.0}
    assert c.errors == {("q", "boom"): 2} and c.slow == {("q", "m1", None): 2.5}
    assert totals.from_json(json.loads(json.dumps(totals.to_json(c)))) == c
    assert totals.message_count(c) == 3
    # 0 1 5 10 10 10 20 100 100: p50 the 5th, p90 and p99 the 9th
    assert totals.nearest_rank([(10, 3), (100, 2), (0, 1), (20, 1), (1, 1), (5, 1)]) == [
        9, 10, 100, 100]
    # ties by msg_id then host, nulls first
    t = totals.Totals(slow={("q", "b", "h"): 1.0, ("q", "a", "h"): 1.0, ("q", "a", None): 1.0,
                            ("q", "z", "h"): 3.0})
    assert [(r["msg_id"], r["host"], r["rank"]) for r in totals.top_lists(t)[2]] == [
        ("z", "h", 1), ("a", None, 2), ("a", "h", 3), ("b", "h", 4)]
