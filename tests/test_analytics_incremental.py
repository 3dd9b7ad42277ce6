"""Incremental analytics over compacted history (issue 19) against the full recompute.

A three-day event log (S13) with messages that span midnight, resends, lease expiries, torn and
corrupt lines (S13.4) and lines out of ts order is analysed twice on one input: incrementally
(finished days compacted into Parquet, today's raw lines on top) and with `--full`; every result
file must be equal field by field.  Then a late write lands in a compacted day, which must be
compacted again, not read stale.  Incremental runs carry per-message state across compactions
(rq.analytics.state): the figures in summary.json say how many compacted events were read and how
many messages were recomputed, and `expected_figures` derives both from the event files, so a run
that reads history it does not need fails here.  One `local[1]` SparkSession serves the module,
and the first incremental run over a copy of the history is made once (`first_run`): the tests
that start from it restore that copy, output included, before they go on.  Without Java the Spark
tests skip with that reason.
"""

from __future__ import annotations

import calendar
import json
import os
import random
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from rq.analytics import job, load, manifest, progress
from rq.builtin import cleaner
from rq.events import decode_line, encode_event

JAVA = shutil.which("java") is not None
needs_spark = pytest.mark.skipif(not JAVA, reason="Java 17+ is not installed: Spark cannot run")
pytestmark = pytest.mark.timeout(900)

D0 = 1700006400            # 2023-11-15 00:00:00 UTC
DAY = 86400
NOW = D0 + 2 * DAY + 7200  # 02:00 on the third day: days 0 and 1 are finished, day 2 is not
# Fields that describe the run, not the data: they differ between any two runs.
RUN_FIELDS = ("run_id", "generated_at", "duration_s", "stages_s", "compaction")


def ev(queue: str, msg: str, ts: float, frm: str | None, to: str, status: str | None = None,
       duration: float | None = None) -> dict[str, Any]:
    return {"ts": round(ts, 3), "host": "h1", "queue": queue, "msg_id": msg, "from": frm,
            "to": to, "status": status, "count": 0, "pid": None, "exit_code": None,
            "duration": duration}


def message_events(rng: random.Random, queue: str, msg: str, t: float) -> list[dict[str, Any]]:
    """One message's life from `t`: waits, runs, maybe a resend or a lease expiry, an end."""
    out = [ev(queue, msg, t, None, "prep"), ev(queue, msg, t, "prep", "que")]
    for attempt in range(3):
        t += rng.uniform(0, 900)
        out.append(ev(queue, msg, t, "que", "run"))
        run = round(rng.uniform(0.1, 2400), 3)
        t += run
        kind = rng.choice(["done", "done", "err", "resend", "lease", "open"])
        if kind == "open" and attempt == 2:
            return out  # still running
        if kind in ("resend", "lease") and attempt < 2:
            status = "LEASE EXPIRED - MOVING TO QUE" if kind == "lease" else "try again"
            out.append(ev(queue, msg, t, "run", "que", status, run))
            continue
        end = "err" if kind == "err" else "done"
        out.append(ev(queue, msg, t, "run", end, "boom" if end == "err" else "ok", run))
        if rng.random() < 0.1:
            out.append(ev(queue, msg, t + 5, end, "deleted"))
        return out
    return out


def append(tree: Path, event: dict[str, Any], data: bytes | None = None) -> Path:
    day = time.strftime("%Y%m%d", time.gmtime(event["ts"]))
    path = tree / "log" / "events" / day / f"{event['queue']}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "ab") as f:
        f.write(encode_event(event) if data is None else data)
    return path


def write_history(tree: Path) -> None:
    rng = random.Random(19)
    events = []
    for i in range(120):  # starts spread over the three days; many cross midnight
        queue = rng.choice(["a", "b"])
        start = D0 + rng.uniform(0, 2 * DAY + 3600)
        events += message_events(rng, queue, f"m{i}", start)
    events = [e for e in events if e["ts"] < NOW]
    # Out of order: each file gets its lines shuffled in blocks, not in ts order.
    rng.shuffle(events)
    for e in events:
        append(tree, e)
    bad = ev("a", "mX", D0 + 100, None, "prep")
    append(tree, bad, b'{"crc32":"zz","event":{}}\n')                            # layout
    append(tree, bad, encode_event(bad).replace(b'"mX"', b'"mY"'))             # crc
    append(tree, bad, b'{"crc32":"%08x","event":[1]}\n' % __import__("zlib").crc32(b"[1]"))
    # a torn tail at the end of a finished day's file (S13.4) and of today's
    append(tree, ev("b", "mT", D0 + DAY - 1, None, "prep"),
           encode_event(ev("b", "mT", D0 + DAY - 1, None, "prep"))[:30])
    append(tree, ev("a", "mU", NOW - 60, None, "prep"),
           encode_event(ev("a", "mU", NOW - 60, None, "prep"))[:50])


def analyse(spark: Any, tree: Path, out: Path, *, full: bool, since: float | None = None,
            until: float | None = None, now: float = NOW) -> dict[str, Any]:
    opts = job.Options(inputs=(str(tree),), output=str(out), since=since, until=until,
                       master="local[1]", full=full)
    final, _ = job.run(spark, opts, now=now)
    summary = json.loads(Path(final, "summary.json").read_text())
    # Sorted by repr: a column can hold None in one row and text in another.
    tables = {name: sorted((tuple(sorted(r.asDict(recursive=True).items())) for r in
                            spark.read.parquet("file://" + os.path.join(final, name)).collect()),
                           key=repr)
              for name in ("messages", "errors", "hourly")}
    return {"summary": summary, "hourly.json": json.loads(Path(final, "hourly.json").read_text()),
            **tables}


def assert_same(incremental: dict[str, Any], full: dict[str, Any],
                ignore: tuple[str, ...] = ()) -> None:
    assert incremental["summary"]["compaction"]["mode"] == "incremental"
    assert full["summary"]["compaction"]["mode"] == "full"
    for name in ("messages", "errors", "hourly", "hourly.json"):
        assert incremental[name] == full[name], name
    a = {k: v for k, v in incremental["summary"].items() if k not in RUN_FIELDS + ignore}
    b = {k: v for k, v in full["summary"].items() if k not in RUN_FIELDS + ignore}
    for key in sorted(set(a) | set(b)):
        assert a.get(key) == b.get(key), key


Key = tuple[str, str, Any]


def valid_events(tree: Path) -> list[tuple[str, Key, float]]:
    """(day directory, message key, ts) of every line of the tree that passes the S13.4
    checks (rq.events.decode_line; a last line without its newline is torn)."""
    out = []
    for path in sorted((tree / "log" / "events").glob("*/*.jsonl")):
        for raw in path.read_bytes().splitlines(keepends=True):
            e = decode_line(raw)
            if e is not None and all(e.get(f) is not None for f in ("ts", "queue", "msg_id",
                                                                    "to")):
                out.append((path.parent.name, (e["msg_id"], e["queue"], e.get("host")),
                            float(e["ts"])))
    return out


def expected_figures(tree: Path, compacted: set[str], since: float | None = None,
                     until: float | None = None) -> dict[str, int]:
    """What a run on carried state must read and recompute (rq.analytics.state): the messages
    with raw events in the window, and those whose compacted events straddle the window, are
    recomputed from their own windowed compacted events; every other message is carried."""
    lo = since if since is not None else float("-inf")
    hi = until if until is not None else float("inf")

    def wanted(day: str) -> bool:  # rq.analytics.extract.day_wanted
        start = calendar.timegm(time.strptime(day, "%Y%m%d"))
        return start + DAY > lo and start < hi

    events = valid_events(tree)
    comp = [e for e in events if e[0] in compacted]
    raw = [e for e in events if e[0] not in compacted and wanted(e[0]) and lo <= e[2] < hi]
    span: dict[Key, list[Any]] = {}
    for day, key, ts in comp:
        s = span.setdefault(key, [ts, ts, day, day])
        s[0], s[1] = min(s[0], ts), max(s[1], ts)
        s[2], s[3] = min(s[2], day), max(s[3], day)
    raw_keys = {key for _, key, _ in raw}

    def straddles(s: list[Any]) -> bool:
        inside = lo <= s[0] and s[1] < hi and wanted(s[2]) and wanted(s[3])
        return not inside and not (s[1] < lo or s[0] >= hi)
    hit = {key for key, s in span.items() if key in raw_keys or straddles(s)}
    read = [e for e in comp if e[1] in hit and wanted(e[0]) and lo <= e[2] < hi]
    in_window = {key for day, key, ts in comp if wanted(day) and lo <= ts < hi} | raw_keys
    return {"compacted_events_read": len(read),
            "messages_recomputed": len({key for _, key, _ in read} | raw_keys),
            "messages": len(in_window)}


def assert_carried(summary: dict[str, Any], tree: Path, compacted: set[str],
                   since: float | None = None, until: float | None = None) -> None:
    """The run took the carried-state path and read and recomputed only what it needed."""
    comp = summary["compaction"]
    assert comp["path"] == "state", comp
    want = expected_figures(tree, compacted, since, until)
    got = {k: comp[k] for k in want}
    assert got == want, (got, want)
    assert 0 < want["messages_recomputed"] < want["messages"] / 2, want  # most are carried


def days(*n: int) -> set[str]:
    return {time.strftime("%Y%m%d", time.gmtime(D0 + i * DAY)) for i in n}


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tree = tmp_path_factory.mktemp("hist") / "root"
    write_history(tree)
    return tree


@dataclass
class FirstRun:
    """A copy of `history` at `tree` after one incremental run into `tree/analytics`."""
    tree: Path
    out: Path
    result: dict[str, Any]
    pristine: Path

    def restore(self) -> None:
        """Put the tree and its output back as the first run left them (same paths, so the
        manifest's events key and the files' sizes, mtimes and hashes still match)."""
        shutil.rmtree(self.tree)
        shutil.copytree(self.pristine, self.tree, symlinks=True)


@pytest.fixture(scope="module")
def first_run(spark: Any, history: Path, tmp_path_factory: pytest.TempPathFactory
              ) -> FirstRun:
    """The first incremental run over the history, made once for the tests that start from
    it (each restores the copy before using it)."""
    base = tmp_path_factory.mktemp("first")
    tree = base / "root"
    shutil.copytree(history, tree)
    out = tree / "analytics"
    result = analyse(spark, tree, out, full=False)
    shutil.copytree(tree, base / "pristine", symlinks=True)
    return FirstRun(tree, out, result, base / "pristine")


@needs_spark
def test_incremental_equals_full_and_compacts_finished_days(spark: Any,
                                                            first_run: FirstRun) -> None:
    first_run.restore()
    tree, out, first = first_run.tree, first_run.out, first_run.result
    comp = first["summary"]["compaction"]
    assert comp["days_compacted_now"] == 2 and comp["raw_files"] == 2  # today's a and b
    again = analyse(spark, tree, out, full=False)  # now read back from Parquet
    assert again["summary"]["compaction"]["days_compacted_now"] == 0
    assert again["summary"]["compaction"]["days_read"] == 2
    full = analyse(spark, tree, out, full=True)
    assert_same(first, full)
    assert_same(again, full)
    # Both on carried state (S13.4 counts of compacted days from the manifest, not re-read):
    # the first run built it, the second found it current.
    assert (comp["state"], again["summary"]["compaction"]["state"]) == ("built", "kept")
    for run in (first, again):
        assert_carried(run["summary"], tree, days(0, 1))
    lines = full["summary"]["lines"]["skipped_by_reason"]
    assert lines == {"torn": 2, "layout": 1, "crc": 1, "json": 1}
    spans = [m for m in full["messages"] if dict(m)["final_state"] and
             int(dict(m)["first_ts"] // DAY) != int(dict(m)["final_ts"] // DAY)]
    assert spans, "the history must have messages that end on a later day"


@needs_spark
def test_since_until_on_both_paths(spark: Any, history: Path, first_run: FirstRun,
                                   tmp_path: Path) -> None:
    window = {"since": D0 + DAY - 3600, "until": D0 + 2 * DAY + 3600}
    inc = analyse(spark, history, tmp_path / "out", full=False, **window)
    assert inc["summary"]["since"] == window["since"]
    # A fresh output: a windowed run keeps no state, so it reads every compacted event.
    assert inc["summary"]["compaction"]["path"] == "events"
    full = analyse(spark, history, tmp_path / "out", full=True, **window)
    assert_same(inc, full)
    # Over the state of an unwindowed run: messages with events on both sides of `since` (and
    # those with raw events) are recomputed from their windowed events, the rest carried.
    first_run.restore()
    carried = analyse(spark, first_run.tree, first_run.out, full=False, **window)
    assert_carried(carried["summary"], first_run.tree, days(0, 1), **window)
    assert_same(carried, full, ignore=("inputs",))  # the same events under another path
    # A window whose first day is after a compacted day the state covers: day 0 is not read
    # at all, so a message with events on day 0 is recomputed even when its day-0 events are
    # before `since` (extract.day_wanted decides which files a run reads, not only `ts`).
    late = {"since": D0 + DAY + 3600}
    carried = analyse(spark, first_run.tree, first_run.out, full=False, **late)
    assert_carried(carried["summary"], first_run.tree, days(0, 1), **late)
    assert_same(carried, analyse(spark, first_run.tree, first_run.out, full=True, **late))


@needs_spark
def test_late_write_recompacts_the_day(spark: Any, first_run: FirstRun) -> None:
    first_run.restore()  # after the first incremental run
    tree, out = first_run.tree, first_run.out
    book = manifest.load_manifest(str(out))
    events_dir = str(tree / "log" / "events")
    day0 = time.strftime("%Y%m%d", time.gmtime(D0))
    entry = manifest.day_entry(book, events_dir, day0)
    assert entry is not None and set(entry["files"]) == {"a.jsonl", "b.jsonl"}
    path = tree / "log" / "events" / day0 / "a.jsonl"
    assert entry["files"]["a.jsonl"]["size"] == path.stat().st_size
    # A late writer appends to day 0 (its torn tail was in b.jsonl: this one is whole).
    append(tree, ev("a", "late1", D0 + DAY - 2, None, "prep"))
    # What a run killed mid-compaction leaves is swept by the next one.
    leftovers = [out / "compacted" / ".staging-dead" / "day=20231115",
                 out / "compacted" / manifest.events_key(events_dir) / f"{day0}.dead"]
    for left in leftovers:
        left.mkdir(parents=True)
    inc = analyse(spark, tree, out, full=False)
    assert not any(left.exists() for left in leftovers)
    assert inc["summary"]["compaction"]["days_compacted_now"] == 1
    # The state covered the replaced directory: it is brought up to date, then carried.
    assert inc["summary"]["compaction"]["state"] == "updated"
    assert_carried(inc["summary"], tree, days(0, 1))
    assert any(dict(m)["msg_id"] == "late1" for m in inc["messages"])
    new_entry = manifest.day_entry(manifest.load_manifest(str(out)), events_dir, day0)
    assert new_entry is not None and new_entry["dir"] != entry["dir"]
    assert not (out / entry["dir"]).exists() and (out / new_entry["dir"]).is_dir()
    assert_same(inc, analyse(spark, tree, out, full=True))
    # Touched but unchanged (same size, same content hash): not compacted again.
    os.utime(path, (time.time() + 5, time.time() + 5))
    assert analyse(spark, tree, out, full=False)["summary"]["compaction"][
        "days_compacted_now"] == 0


def last_states(tree: Path) -> dict[Key, tuple[float, str, dict[str, Any]]]:
    """Each message's last valid event: (ts, to, event)."""
    last: dict[Key, tuple[float, str, dict[str, Any]]] = {}
    for path in sorted((tree / "log" / "events").glob("*/*.jsonl")):
        for raw in path.read_bytes().splitlines(keepends=True):
            e = decode_line(raw)
            if e is not None:
                key = (e["msg_id"], e["queue"], e["host"])
                if key not in last or e["ts"] >= last[key][0]:
                    last[key] = (e["ts"], e["to"], e)
    return last


def append_shuffled(tree: Path, events: list[dict[str, Any]], seed: int) -> None:
    """Append `events` in a shuffled order (lines out of ts order, S13.1 only orders a file
    by write)."""
    random.Random(seed).shuffle(events)
    for e in events:
        append(tree, e)


@needs_spark
def test_carried_state_across_runs(spark: Any, first_run: FirstRun) -> None:
    """Second and third incremental runs on carried state: resends and lease expiries of
    messages whose earlier events are compacted, messages finished after the compaction
    boundary, a day compacted on top of the state; each equal to the full recompute."""
    first_run.restore()
    tree, out = first_run.tree, first_run.out
    last = last_states(tree)
    running = sorted(k for k, (ts, to, _) in last.items() if to == "run" and ts < D0 + 2 * DAY)
    done = sorted(k for k, (ts, to, _) in last.items() if to == "done" and ts < D0 + 2 * DAY)
    errs = sorted(k for k, (ts, to, _) in last.items() if to == "err" and ts < D0 + 2 * DAY)
    assert len(running) >= 2 and done and errs

    def at(key: Key, ts: float, frm: str | None, to: str, status: str | None = None,
           duration: float | None = None) -> dict[str, Any]:
        return ev(key[1], key[0], ts, frm, to, status, duration)

    # Run 2, today (raw): a resend and a lease expiry of messages running since a compacted
    # day, a finished message deleted, a new message queued.
    t = NOW - 3000
    resent, leased = running[0], running[1]
    append_shuffled(tree, [
        at(resent, t, "run", "que", "try again", 30.0), at(resent, t + 60, "que", "run"),
        at(resent, t + 90, "run", "done", "ok", 30.0),
        at(leased, t + 5, "run", "que", "LEASE EXPIRED - MOVING TO QUE", 40.0),
        at(leased, t + 70, "que", "run"),
        at(done[0], t + 100, "done", "deleted"),
        ev("b", "fresh1", t + 200, None, "prep"), ev("b", "fresh1", t + 200, "prep", "que"),
    ], 2)
    second = analyse(spark, tree, out, full=False)
    comp = second["summary"]["compaction"]
    assert (comp["state"], comp["days_compacted_now"], comp["tables"]) == ("kept", 0, "facts")
    assert_carried(second["summary"], tree, days(0, 1))
    # messages/: at most two files of new rows, one a core (the links are tested below)
    names = os.listdir(out / "current" / "messages")
    assert 1 <= len([n for n in names if n.startswith("part-")]) <= 2, names
    assert_same(second, analyse(spark, tree, out, full=True))

    # Run 3, a day later: today is compacted on top of the state (which is updated, not
    # rebuilt), and tomorrow's raw lines finish messages begun before it.
    later = NOW + DAY
    t = D0 + 3 * DAY + 1000
    append_shuffled(tree, [
        at(leased, t, "run", "done", "ok", 900.0),
        ev("b", "fresh1", t + 10, "que", "run"), ev("b", "fresh1", t + 20, "run", "err", "boom"),
        at(errs[0], t + 30, "err", "deleted"),
        ev("a", "fresh2", t + 40, None, "prep"), ev("a", "fresh2", t + 40, "prep", "que"),
    ], 3)
    third = analyse(spark, tree, out, full=False, now=later)
    comp = third["summary"]["compaction"]
    assert (comp["state"], comp["days_compacted_now"], comp["tables"]) == ("updated", 1, "facts")
    assert_carried(third["summary"], tree, days(0, 1, 2))
    assert_same(third, analyse(spark, tree, out, full=True, now=later))
    # The state now covers the three compacted days, and the one before it is gone.
    book = manifest.load_manifest(str(out))
    assert len(book["state"]["covers"]) == 3
    assert sorted(p.name for p in (out / "compacted").iterdir()
                  if p.name.startswith("state.")) == sorted(
        Path(book["state"][k]).name for k in ("dir", "facts"))


@needs_spark
def test_stored_value_tables_are_sorted_by_the_column_their_readers_select_on(
        spark: Any, first_run: FirstRun) -> None:
    """values_h by hour and values_b by bucket, file by file (rq.analytics.stored): a new
    hour's run reads a few hours and buckets of them, and skips the row groups whose min/max
    rule them out."""
    first_run.restore()
    facts_dir = manifest.facts_path(str(first_run.out), manifest.load_manifest(
        str(first_run.out)))
    assert facts_dir
    for table, key in (("values_h", "hour"), ("values_b", "b")):
        files = sorted((Path(facts_dir) / table).glob("part-*.parquet"))
        assert files, table
        for f in files:
            got = [r[key] for r in spark.read.parquet(str(f)).select(key).collect()]
            assert len(set(got)) > 1 and got == sorted(got), (table, f.name)


@needs_spark
def test_facts_of_another_version_are_written_again(spark: Any, first_run: FirstRun) -> None:
    """Stored facts of another version (another bucket function, say) are never added to:
    the next run writes them again from the state, removes the old ones, and gives the same
    result."""
    first_run.restore()
    out = first_run.out
    book = manifest.load_manifest(str(out))
    old = book["state"]["facts"]
    book["state"]["facts_version"] = 0
    load.write_json(manifest.manifest_path(str(out)), book)
    again = analyse(spark, first_run.tree, out, full=False)
    comp = again["summary"]["compaction"]
    assert (comp["state"], comp["tables"]) == ("kept", "facts")
    book = manifest.load_manifest(str(out))
    assert book["state"]["facts"] != old and not (out / old).exists()
    assert (out / book["state"]["facts"] / "messages").is_dir()
    for name in ("messages", "errors", "hourly", "hourly.json"):
        assert again[name] == first_run.result[name], name
    keep = RUN_FIELDS + ("files",)
    assert ({k: v for k, v in again["summary"].items() if k not in keep}
            == {k: v for k, v in first_run.result["summary"].items() if k not in keep})


@needs_spark
def test_retention_waits_for_compaction_then_partitions_stand_in(spark: Any,
                                                                 first_run: FirstRun) -> None:
    first_run.restore()
    tree, out, before = first_run.tree, first_run.out, first_run.result
    events_dir = tree / "log" / "events"
    day0 = time.strftime("%Y%m%d", time.gmtime(D0))
    # Day 1 is not compacted (its entry is dropped): retention must keep its raw files.
    book = manifest.load_manifest(str(out))
    day1 = time.strftime("%Y%m%d", time.gmtime(D0 + DAY))
    del book["trees"][manifest.events_key(str(events_dir))]["days"][day1]
    Path(manifest.manifest_path(str(out))).write_text(json.dumps(book))
    removed = cleaner.prune_events(str(events_dir), NOW + 3 * DAY, 1)
    assert removed >= 1 and not (events_dir / day0).exists() and (events_dir / day1).is_dir()
    after = analyse(spark, tree, out, full=False)  # day 0 from its partition only
    assert after["summary"]["compaction"]["days_compacted_now"] == 1  # day 1 again
    for name in ("messages", "errors", "hourly", "hourly.json"):
        assert after[name] == before[name], name
    assert after["summary"]["lines"] == before["summary"]["lines"]
    assert after["summary"]["files"] == before["summary"]["files"]


def test_full_flag_parses() -> None:
    assert job.parse_options("/r", {"full": True}, 0).full
    assert not job.parse_options("/r", {}, 0).full


# ---------------------------------------------------------------- terminal progress


def run_cli(args: list[str], cwd: Path) -> tuple[int, str, str]:
    """`python -m rq.analytics ARGS` with stderr on a pseudo-terminal."""
    import pty
    import select
    import subprocess
    import sys

    from rqtest import REPO

    env = {k: v for k, v in os.environ.items() if k != "RQ_MSG_DIR"}
    env["PYTHONPATH"] = str(REPO)
    cmd = [sys.executable, "-m", "rq.analytics", *args]
    master, slave = pty.openpty()
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=slave,
                            env=env, cwd=cwd)
    os.close(slave)
    seen = b""
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 1.0)
        if not ready:
            if proc.poll() is not None:
                break
            continue
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        seen += chunk
    os.close(master)
    out, _ = proc.communicate(timeout=60)
    return proc.returncode, out.decode(), seen.decode(errors="replace")


@needs_spark
def test_progress_shows_on_a_terminal_only(history: Path, tmp_path: Path) -> None:
    from rqtest import make_root
    args = ["--root", str(make_root(tmp_path)), "--input", str(history), "--master", "local[1]",
            "--conf", "spark.driver.extraJavaOptions=-XX:+UseSerialGC -XX:TieredStopAtLevel=1"]
    rc, out, term = run_cli([*args, "--output", str(tmp_path / "a")], tmp_path)
    assert rc == 0, term
    assert "published" in out
    assert "tasks" in term and "%|" in term and "stage " in term, term
    # Not on a pipe: test_analytics_e2e's `rq analytics` on a pipe prints nothing at all on
    # stderr (test_rq_analytics_exits_0_quietly_and_publishes), so no progress either.


@pytest.mark.parametrize(("stages", "shown"), [
    ([], ("starting", 0, 0)),
    ([progress.Stage(3, "parquet at NativeMethodAccessorImpl.java:0", 8, 2)],
     ("stage 3 parquet", 8, 2)),
    ([progress.Stage(5, "collect at x", 4, 4), progress.Stage(4, "run at y", 2, 1)],
     ("stage 4 run +1", 6, 5)),
])
def test_progress_describes_active_stages(stages: list[Any], shown: tuple[str, int, int]) -> None:
    assert progress.describe(stages) == shown


def test_progress_only_on_a_terminal_outside_queue_jobs() -> None:
    class Tty:
        def isatty(self) -> bool:
            return True
    assert progress.wanted(Tty(), {})  # type: ignore[arg-type]
    assert not progress.wanted(Tty(), {"RQ_MSG_DIR": "/x/job"})  # type: ignore[arg-type]
    with open(os.devnull, "w") as devnull:
        assert not progress.wanted(devnull, {})


@needs_spark
def test_slowest_from_the_stored_lists_and_their_fallback(spark: Any,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """rq.analytics.stored.slowest then totals.top_lists equal transform.slowest of the whole
    message table, both when the stored lists suffice and when recomputation emptied a
    queue's list (the queue is then ranked from all its rows)."""
    from rq.analytics import facts, state, stored, summary, totals
    from rq.analytics import transform as T

    schema = "queue string, msg_id string, host string, run_s double"
    table = [("a", f"m{i}", "h", float(i % 7 + i / 100)) for i in range(30)] + [
        ("b", f"m{i}", "h", float(i)) for i in range(4)] + [("a", "m3", "h2", 3.03)]
    again = [("a", "m6", "h", 99.0), ("a", "m27", "h", 1.0), ("b", "m1", "h", 0.5)]
    rows = facts.literal_rows(spark, schema, table)
    recomputed = facts.literal_rows(spark, schema, again)
    raw_keys = state.keys(recomputed)
    whole = state.join_keys(rows, raw_keys, "left_anti").unionByName(recomputed)
    old = {(q, m, h) for q, m, h, _ in again} & {(q, m, h) for q, m, h, _ in table}
    # all held; the lists suffice; `a`'s list (m27 6.27, m20, m13) loses m27: `a` falls back
    for keep, top in ((100, 10), (3, 2), (3, 3)):
        monkeypatch.setattr(stored, "SLOW_KEEP", keep)
        monkeypatch.setattr(summary, "TOP", top)
        listed: dict[Any, float] = {}
        for queue in ("a", "b"):
            mine = sorted((((q, m, h), r) for q, m, h, r in table if q == queue),
                          key=totals.slow_order)
            listed.update(mine[:keep])
        change = totals.Totals(slow={(q, m, h): r for q, m, h, r in again})
        candidates = stored.slowest(spark, rows, raw_keys, totals.Totals(slow=listed), change,
                                    old)
        got = sorted(tuple(r.values()) for r in
                     totals.top_lists(totals.Totals(slow=candidates), top)[2])
        want = sorted(tuple(r) for r in T.slowest(whole, top).collect())
        assert got == want, (keep, top)
        assert ("a", "m20", "h", 6.2, 2) in got


@needs_spark
def test_messages_files_are_linked_unless_a_recomputed_message_is_in_them(
        spark: Any, tmp_path: Path) -> None:
    """stored.link_messages: the stored messages files holding none of the recomputed messages
    are hard links in the run's messages/, the others' remaining rows and the recomputed ones
    are one new file, and the table read back is the stored one with the recomputed rows
    replacing their old ones.  The stored files hold whole days (a message's first day,
    `_d0`): the messages of one day are in one file."""
    from pyspark.sql import functions as F

    from rq.analytics import facts, state, stored

    def table(ids: list[int], final: str) -> Any:
        cols = {"queue": F.lit("a"), "msg_id": F.concat(F.lit("m"), F.col("id")),
                "host": F.lit("h"), "final_state": F.lit(final),
                "_d0": F.concat(F.lit("2026010"), F.col("id") % 5)}
        return spark.range(100).where(facts.in_list("id", ids)).select(*[
            cols.get(c, F.lit(None)).cast(t).alias(c) for c, t in (
                ("queue", "string"), ("msg_id", "string"), ("host", "string"),
                ("final_state", "string"), ("wait_s", "double"), ("run_s", "double"),
                ("total_s", "double"), ("resends", "long"), ("lease_expiries", "long"),
                ("recoveries", "long"), ("first_ts", "double"), ("final_ts", "double"),
                ("status", "string"), ("events", "long"), ("_d0", "string"))])

    facts_dir = tmp_path / "facts"
    stored.write_messages(table(list(range(40)), "done"), str(facts_dir), 8)
    assert json.loads((facts_dir / stored.LAYOUT).read_text()) == {"message_files": 8}
    files = [n for n in os.listdir(facts_dir / "messages") if n.startswith("part-")]
    days_of_file = [{int(r["msg_id"][1:]) % 5 for r in
                     spark.read.parquet(str(facts_dir / "messages" / n)).collect()}
                    for n in files]
    assert sorted(d for days in days_of_file for d in days) == list(range(5))
    recomputed = table([7, 99], "err").drop("_d0")  # m7 changes, m99 is new
    old = table([7], "done")
    dest = tmp_path / "run" / "messages"
    dest.parent.mkdir()
    hit = {int(r["f"]) for r in old.select(stored.message_file(8).alias("f")).collect()}
    stored.link_messages(spark, str(facts_dir / "messages"), str(dest), hit,
                         state.keys(recomputed), recomputed)
    names = os.listdir(dest)
    linked = [n for n in names if n.startswith("stored-")]
    assert len(linked) == len(files) - 1
    assert 1 <= len([n for n in names if n.startswith("part-")]) <= 2
    assert all(os.stat(dest / n).st_nlink == 2 for n in linked)
    got = {(r["msg_id"], r["final_state"]) for r in spark.read.parquet(str(dest)).collect()}
    assert got == {(f"m{i}", "err" if i == 7 else "done") for i in range(40)} | {("m99", "err")}
    assert len(spark.read.parquet(str(dest)).collect()) == 41
