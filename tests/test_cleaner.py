"""The cleaner builtin queue script (SPEC S12.3), run as a real job would be: a subprocess with
fd 3 open to a pipe (S6.3), RQ_ROOT and RQ_PARAM1/2 in its environment (S6.2)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rqtest import QueueProc, wait_for

REPO = Path(__file__).resolve().parents[1]
CLEANER = REPO / "rq" / "builtin" / "cleaner.py"
DAY = 86400
# argv: FD PROGRAM ARGS...: move FD to 3 (inheritable), then exec PROGRAM.
LAUNCH_ON_FD3 = """import os, sys
fd = int(sys.argv[1])
if fd != 3:
    os.dup2(fd, 3)
    os.close(fd)
os.execv(sys.argv[2], sys.argv[2:])
"""
LOG_LINE = re.compile(r"^\d+ - \d{4}-\d\d-\d\d \d\d:\d\d:\d\d [+-]\d{4} - .+$")


def short_id(epoch: float, n: int = 1) -> str:
    t = time.gmtime(epoch)
    return time.strftime("%Y%m%d.%H%M.%S", t) + f".{int(epoch * 1000) % 1000:03d}.{n}"


def bucket(epoch: float) -> str:
    return time.strftime("%Y%m%d/%H/%M", time.gmtime(epoch))


class Root:
    """A fake RQ root with one queue directory per name."""

    def __init__(self, path: Path, *queues: str, retention: object = None) -> None:
        self.path = path
        config: dict[str, object] = {"env": "test", "host": "localhost", "port": 3333,
                                     "addr": "127.0.0.1"}
        if retention is not None:
            config["event_retention_days"] = retention
        (path / "config").mkdir(parents=True)
        (path / "config" / "config.json").write_text(json.dumps(config))
        for name in queues:
            for state in ("prep", "que", "run", "done", "relayed", "err"):
                (path / "queue" / name / state).mkdir(parents=True)
        self.n = 0

    def message(self, queue: str, state: str, epoch: float) -> Path:
        """A message directory whose id (and so its hashdir bucket) is from `epoch`."""
        self.n += 1
        msg_id = short_id(epoch, self.n)
        where = f"{bucket(epoch)}/{msg_id}" if state in ("done", "relayed") else msg_id
        path = self.path / "queue" / queue / state / where
        (path / "job").mkdir(parents=True)
        (path / "msg").write_text(json.dumps({"msg_id": msg_id, "dest": queue}))
        (path / "job" / "stdio.log").write_text("log\n")
        return path


def run_cleaner(root: Path, param1: str | None, param2: str | None = None,
                ) -> tuple[int, str, list[str]]:
    """Run cleaner.py with fd 3 on a pipe; return (exit code, fd 3 text, stdout lines)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RQ_")}
    env["RQ_ROOT"] = str(root)
    if param1 is not None:
        env["RQ_PARAM1"] = param1
    if param2 is not None:
        env["RQ_PARAM2"] = param2
    read_fd, write_fd = os.pipe()
    try:
        # A tiny launcher puts our pipe on fd 3, as the queue process does for a job (S6.3).
        proc = subprocess.Popen(
            [sys.executable, "-c", LAUNCH_ON_FD3, str(write_fd), sys.executable, str(CLEANER)],
            env=env, cwd=root, pass_fds=(write_fd,), stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    finally:
        os.close(write_fd)
    with os.fdopen(read_fd) as pipe:
        status = pipe.read()  # EOF once the job (and so fd 3) has gone
    out, err = proc.communicate(timeout=60)
    assert err == "", err
    lines = out.splitlines()
    assert all(LOG_LINE.match(line) for line in lines), lines
    return proc.returncode, status, lines


def test_prunes_old_done_and_relayed_buckets_and_old_prep(tmp_path: Path) -> None:
    now = time.time()
    root = Root(tmp_path, "test", "other")
    gone = [root.message("test", "done", now - 3 * DAY),
            root.message("test", "done", now - 2 * DAY - 120),
            root.message("test", "relayed", now - 10 * DAY),
            root.message("test", "prep", now - 2 * DAY - 60)]
    kept = [root.message("test", "done", now - 1 * DAY),
            root.message("test", "done", now - 2 * DAY + 600),
            root.message("test", "relayed", now - 60),
            root.message("test", "prep", now - 1 * DAY),
            root.message("test", "err", now - 30 * DAY),  # err/ is never touched
            root.message("test", "que", now - 30 * DAY),
            root.message("other", "done", now - 30 * DAY)]  # not selected
    odd = tmp_path / "queue" / "test" / "prep" / "not-an-id"
    odd.mkdir()

    code, status, lines = run_cleaner(tmp_path, "test")

    assert (code, status) == (0, "done successfully ran this script\n")
    assert lines[-1].endswith(" - done successfully ran this script")
    assert [p for p in gone if p.exists()] == []
    assert [p for p in kept if not p.exists()] == []
    assert odd.is_dir()
    # Emptied hour and day buckets go too; a day that still holds a kept minute stays.
    for path in gone[:3]:
        minute = path.parent
        assert not minute.parent.exists() or any(minute.parent.iterdir())
    day_of_kept = kept[0].parent.parent.parent
    assert day_of_kept.is_dir()


def test_days_from_param2_first_digits(tmp_path: Path) -> None:
    now = time.time()
    root = Root(tmp_path, "test")
    three = root.message("test", "done", now - 3 * DAY)
    six = root.message("test", "done", now - 6 * DAY)
    code, status, _ = run_cleaner(tmp_path, "test", "keep 5 days")
    assert (code, status) == (0, "done successfully ran this script\n")
    assert three.exists() and not six.exists()


def test_minute_bucket_end_decides(tmp_path: Path) -> None:
    # A bucket goes once its end (start + 60 s) is at least `days` old.
    now = time.time()
    root = Root(tmp_path, "test")
    minute_start = (now - 1 * DAY) // 60 * 60
    just_old = root.message("test", "done", minute_start - 60)  # ended at minute_start
    young = root.message("test", "done", minute_start + 60)  # ends within the last day
    code, _, _ = run_cleaner(tmp_path, "test", "1")
    assert code == 0
    assert not just_old.exists() and young.exists()


def test_missing_param1_fails(tmp_path: Path) -> None:
    Root(tmp_path, "test")
    code, status, lines = run_cleaner(tmp_path, None)
    assert (code, status) == (1, "fail need to specify a PARAM1\n")
    assert lines[-1].endswith(" - fail need to specify a PARAM1")


@pytest.mark.parametrize("name", ["nosuchqueue", "../config", "test.deleted.5"])
def test_unknown_queue_fails_without_touching_anything(tmp_path: Path, name: str) -> None:
    root = Root(tmp_path, "test")
    old = root.message("test", "done", time.time() - 30 * DAY)
    code, status, _ = run_cleaner(tmp_path, name)
    assert (code, status) == (0, f"fail no such queue: {name}\n")
    assert old.exists()


def test_allqueues_cleans_every_queue_and_the_event_log(tmp_path: Path) -> None:
    now = time.time()
    root = Root(tmp_path, "a", "b", "relay", retention=3)
    gone = [root.message("a", "done", now - 5 * DAY), root.message("b", "prep", now - 5 * DAY),
            root.message("relay", "relayed", now - 5 * DAY)]
    trash = tmp_path / "queue" / "a.deleted.123"
    (trash / "done").mkdir(parents=True)
    trash_msg = trash / "done" / bucket(now - 9 * DAY)
    trash_msg.mkdir(parents=True)
    events = tmp_path / "log" / "events"
    old_days = [time.strftime("%Y%m%d", time.gmtime(now - d * DAY)) for d in (5, 10)]
    new_days = [time.strftime("%Y%m%d", time.gmtime(now - d * DAY)) for d in (0, 1)]
    for day in old_days + new_days:
        (events / day).mkdir(parents=True)
        (events / day / "a.jsonl").write_text("")
    (events / "notaday").mkdir()

    code, status, _ = run_cleaner(tmp_path, "ALLQUEUES")

    assert (code, status) == (0, "done successfully ran this script\n")
    assert [p for p in gone if p.exists()] == []
    assert trash_msg.is_dir()  # trash is never a queue
    assert sorted(p.name for p in events.iterdir()) == sorted(new_days + ["notaday"])


@pytest.mark.parametrize("retention", [0, "bogus"])
def test_event_retention_zero_keeps_forever_and_bad_value_defaults(tmp_path: Path,
                                                                   retention: object) -> None:
    now = time.time()
    Root(tmp_path, "a", retention=retention)
    events = tmp_path / "log" / "events"
    days = {d: time.strftime("%Y%m%d", time.gmtime(now - d * DAY)) for d in (2, 40)}
    for name in days.values():
        (events / name).mkdir(parents=True)
    code, _, _ = run_cleaner(tmp_path, "ALLQUEUES")
    assert code == 0
    left = {p.name for p in events.iterdir()}
    # 0 keeps everything; an invalid value falls back to the default of 30 days.
    assert left == (set(days.values()) if retention == 0 else {days[2]})


def test_event_retention_waits_for_analytics_compaction(tmp_path: Path) -> None:
    """Issue 19: once the analytics job has compacted (ROOT/analytics/compacted/manifest.json),
    a raw day past retention is removed only when its Parquet partition is listed and on disk."""
    from rq.analytics import manifest

    now = time.time()
    Root(tmp_path, "a", retention=3)
    events = tmp_path / "log" / "events"
    days = [time.strftime("%Y%m%d", time.gmtime(now - d * DAY)) for d in (5, 6, 7)]
    for day in days:
        (events / day).mkdir(parents=True)
        (events / day / "a.jsonl").write_text("")
    out = tmp_path / "analytics"
    book = manifest.load_manifest(str(out))
    for day in days[:2]:  # days[1]'s partition directory is missing: not durable
        manifest.set_day_entry(book, str(events), day, {"dir": f"compacted/k/{day}.x",
                                                        "empty": True, "files": {}})
    (out / "compacted" / "k" / f"{days[0]}.x").mkdir(parents=True)
    Path(manifest.manifest_path(str(out))).write_text(json.dumps(book))
    code, _, _ = run_cleaner(tmp_path, "ALLQUEUES")
    assert code == 0
    assert sorted(p.name for p in events.iterdir()) == sorted(days[1:])


def load_cleaner():  # type: ignore[no-untyped-def]
    """The script as a module (it imports its neighbour rq.builtin.jobio)."""
    from rq.builtin import cleaner
    return cleaner


def test_trim_relayed_keeps_the_newest(tmp_path: Path) -> None:
    # The 60000 limit is exercised with a small `keep`; the walk is the same.
    cleaner = load_cleaner()
    assert cleaner.RELAYED_KEEP == 60000
    root = Root(tmp_path, "relay")
    now = time.time()
    msgs = [root.message("relay", "relayed", now - k * 3600) for k in range(6)]  # newest first
    msgs.append(root.message("relay", "relayed", now - 5 * 3600))  # same bucket as msgs[5]
    removed = cleaner.trim_relayed(str(tmp_path / "queue" / "relay" / "relayed"), keep=4)
    assert removed == 3
    assert [m.exists() for m in msgs] == [True] * 4 + [False] * 3
    # Buckets emptied by the trim are removed.
    assert not msgs[4].parent.exists()


def test_trim_relayed_under_the_limit_removes_nothing(tmp_path: Path) -> None:
    cleaner = load_cleaner()
    root = Root(tmp_path, "relay")
    msgs = [root.message("relay", "relayed", time.time() - k * 60) for k in range(3)]
    assert cleaner.trim_relayed(str(tmp_path / "queue" / "relay" / "relayed"), keep=3) == 0
    assert all(m.exists() for m in msgs)


def test_queue_counts_follow_the_cleaner_within_the_refresh(tmp_path: Path) -> None:
    """S7.3, S12.3, issue 16 item 8: prep messages the cleaner deletes leave the queue's
    `num_messages` (and so q.json, /metrics, check_rq) at the next re-count from disk, like
    done ones, instead of staying counted until the queue restarts.  The 60 s period is
    shortened to 0.5 s through the queue's RQ_COUNT_REFRESH_SECONDS test seam."""
    now = time.time()
    root = Root(tmp_path, "test")
    (tmp_path / "log").mkdir()
    (tmp_path / "queue" / "test" / "config.json").write_text(json.dumps(
        {"name": "test", "script": "/bin/true", "exec_prefix": ""}))
    root.message("test", "prep", now - 3 * DAY)
    root.message("test", "prep", now - 3 * DAY)
    root.message("test", "done", now - 3 * DAY)
    kept = root.message("test", "prep", now - 60)
    qp = QueueProc(tmp_path, "test", env={"RQ_COUNT_REFRESH_SECONDS": "0.5"})
    try:
        assert (qp.counts()["prep"], qp.counts()["done"]) == (3, 1)
        code, status, _ = run_cleaner(tmp_path, "test")
        assert (code, status) == (0, "done successfully ran this script\n")
        wait_for(lambda: (qp.counts()["prep"], qp.counts()["done"]) == (1, 0), 10,
                 what="the counts to follow the disk")
        listed = qp.call("messages", {"state": "prep"})
        assert listed == [{"msg_id": kept.name}]
    finally:
        qp.stop()
