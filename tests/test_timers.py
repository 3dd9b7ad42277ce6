"""The timers daemon (SPEC S10, S7.2 `timers` / `timers_status`, S15 route 28).

The rules are tested on the pure Timetable with plain numbers; the rest runs
real `rq-mgr` processes (with their web server, queues and timers daemon) in
temp roots.  Periods are at least 60 s (S10.2), so the "after a period" cases
use a pre-written state file whose last fire lies in the past.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from rqtest import decode_reply_frame, make_queue, raw_exchange, wait_for
from webtest import DONE_SCRIPT, Mgr, build_root, rq_mgr

from rq.client import call_mgr
from rq.message import id_epoch
from rq.timers.schedule import Found, TimerError, TimerSpec, Timetable, parse_timer, timer_name

DEADLINE = 45.0

# ---------------------------------------------------------------- pure rules


@pytest.mark.parametrize("entry, name", [
    ("tick.json", "tick"), ("a-b_c.json", "a-b_c"), (".json", None), ("a.b.json", None),
    ("tick.json~", None), ("tick", None), ("tick.JSON", None),
])
def test_s10_1_timer_file_names(entry: str, name: str | None) -> None:
    assert timer_name(entry) == name


@pytest.mark.parametrize("data, reason", [
    ([], "timer file is not a JSON object"),
    ({"msg": {"dest": "q"}}, "timer has invalid period (not an integer)"),
    ({"period": 60.0, "msg": {"dest": "q"}}, "timer has invalid period (not an integer)"),
    ({"period": True, "msg": {"dest": "q"}}, "timer has invalid period (not an integer)"),
    ({"period": 59, "msg": {"dest": "q"}}, "timer has invalid period (less than 60)"),
    ({"period": 60}, "timer is missing msg object"),
    ({"period": 60, "msg": {"param1": "x"}}, "timer msg is missing dest"),
    ({"period": 60, "msg": {"dest": ""}}, "timer msg is missing dest"),
    ({"period": 60, "msg": {"dest": "q", "src": 3}}, "timer msg has invalid src"),
])
def test_s10_2_invalid_timer_content(data: Any, reason: str) -> None:
    with pytest.raises(TimerError, match=rf"^{reason.replace('(', '.').replace(')', '.')}$"):
        parse_timer(data)


def test_s10_2_valid_timer_keeps_dest_params_src_only() -> None:
    spec = parse_timer({"period": 60, "extra": 1,
                        "msg": {"dest": "q", "param2": "b", "src": "me", "due": 5}})
    assert spec == TimerSpec(60, {"dest": "q", "param2": "b", "src": "me"})


def spec(period: int = 60, dest: str = "q") -> TimerSpec:
    return TimerSpec(period, {"dest": dest})


def test_s10_4_new_timers_staggered_then_every_period() -> None:
    table = Timetable()
    result = table.update([Found("b", "s1", spec(120)), Found("a", "s1", spec()),
                           Found("c", "s1", spec())], 1000.0)
    assert result.added == ["a", "b", "c"]
    assert table.listing() == [["a", 1000], ["b", 1002], ["c", 1004]]
    assert [t.name for t in table.due(1000.0)] == ["a"]
    table.fired("a", 1000.5)
    assert table.listing()[-1] == ["a", 1060]           # previous due + period
    table.fired("b", 1500.0)                             # late: now + period
    assert dict(table.listing())["b"] == 1620
    assert table.update([Found("a", "s1", spec()), Found("b", "s1", spec(120)),
                         Found("c", "s1", spec())], 1001.0).added == []  # unchanged: kept
    result = table.update([Found("a", "s2", spec()), Found("b", "s1", spec(120)),
                           Found("c", "s1", spec())], 1010.0)
    assert result.changed == ["a"] and dict(table.listing())["a"] == 1010  # changed: at once


def test_s10_5_restored_due_times_and_s10_7_removal() -> None:
    saved = {"near": (1000.0, "s1"), "past": (100.0, "s1"), "edited": (1000.0, "old"),
             "gone": (1000.0, "s1")}
    table = Timetable(saved)
    result = table.update([Found(n, "s1", spec()) for n in ("edited", "near", "past")], 1030.0)
    assert result.restored == ["near", "past"] and result.added == ["edited"]
    assert dict(table.listing()) == {"near": 1060, "past": 1030, "edited": 1030}
    assert set(table.state()) == {"near", "past"}        # "gone" dropped, "edited" not fired yet
    table.fired("edited", 1030.2)               # the slot that fired, not the send time
    assert table.state()["edited"] == {"last_fire": 1030, "stat": "s1"}
    table.fired("past", 1200.5)                  # late: now
    assert table.state()["past"] == {"last_fire": 1200.5, "stat": "s1"}
    table.update([Found("near", "s1", spec())], 1231.0)
    assert set(table.state()) == {"near"} and [r[0] for r in table.listing()] == ["near"]


def test_s10_2_rejected_once_per_version() -> None:
    table = Timetable()
    assert table.update([Found("x", "s1", error="bad")], 0.0).rejected == [("x", "bad")]
    assert table.update([Found("x", "s1", error="bad")], 1.0).rejected == []
    assert table.update([Found("x", "s2", error="bad")], 2.0).rejected == [("x", "bad")]
    assert table.update([Found("x", "s3", spec())], 3.0).added == ["x"]


# ---------------------------------------------------------------- real rq-mgr processes


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return build_root(tmp_path)


@pytest.fixture
def managers(root: Path) -> Iterator[list[Mgr]]:
    started: list[Mgr] = []
    yield started
    rq_mgr(root, "stop")


def start(root: Path, managers: list[Mgr]) -> Mgr:
    mgr = Mgr(root)
    managers.append(mgr)
    return mgr


def write_timer(root: Path, name: str, data: Any) -> Path:
    """Published by one rename, as an editor or `ln -sf` would (S10.1)."""
    path = root / "timers" / f"{name}.json"
    tmp = root / f".{name}.tmp"
    tmp.write_text(data if isinstance(data, str) else json.dumps(data))
    os.replace(tmp, path)
    return path


def timer(period: int, dest: str = "test", **params: str) -> dict[str, Any]:
    return {"period": period, "msg": {"dest": dest, **params}}


def mgr_ok(root: Path, cmd: str) -> Any:
    reply = call_mgr(str(root), cmd, timeout=30)
    assert reply[0] == "ok", reply
    return reply[1]


def live(root: Path, cmd: str) -> Any:
    """The reply of `cmd` once the timers daemon answers (it starts after the queues)."""
    def ask() -> Any:
        reply = call_mgr(str(root), cmd, timeout=30)
        return reply if reply[0] == "ok" else None
    return wait_for(ask, DEADLINE, what=f"`{cmd}` from the timers daemon")[1]


def messages(root: Path, queue: str = "test") -> list[dict[str, Any]]:
    """Every message of `queue` on disk, whatever its state."""
    found: dict[str, dict[str, Any]] = {}
    # The state directories in the order messages move through them (S3.2), each walked with
    # os.walk, not rglob (it skips directories that move away under it): a message that
    # moves on while we look is met again in a later state.  A message seen twice is one
    # message, keyed by its id.  (.spare/ holds messages still being written: not yet ones.)
    for state in ("prep", "que", "run", "err", "done", "relayed"):
        for directory, _, files in os.walk(root / "queue" / queue / state):
            if "msg" in files:
                try:
                    msg = json.loads(Path(directory, "msg").read_text())
                except (OSError, ValueError):
                    continue  # moving between states right now
                found[msg["msg_id"]] = msg
    return list(found.values())


def by_param1(root: Path, queue: str = "test") -> dict[str, list[float]]:
    found: dict[str, list[float]] = {}
    for msg in messages(root, queue):
        found.setdefault(msg.get("param1", ""), []).append(id_epoch(msg["msg_id"]))
    return found


def wait_status(root: Path, expected: dict[str, int]) -> None:
    wait_for(lambda: live(root, "timers_status") == expected, DEADLINE,
             what=f"timers_status {expected}")


def wait_messages(root: Path, count: int, queue: str = "test") -> list[dict[str, Any]]:
    return wait_for(lambda: len(messages(root, queue)) >= count and messages(root, queue),
                    DEADLINE, what=f"{count} messages in {queue}")


def test_s10_4_new_timers_fire_once_staggered_and_restart_does_not_refire(
        root: Path, managers: list[Mgr]) -> None:
    write_timer(root, "a", timer(60, param1="a"))
    write_timer(root, "b", timer(120, param1="b", param2="x"))
    write_timer(root, "c", timer(60, param1="c"))
    start(root, managers)
    wait_messages(root, 3)
    wait_status(root, {"sent": 3, "errors": 0})  # each fire is counted after its message
    fires = by_param1(root)
    assert sorted(fires) == ["a", "b", "c"] and all(len(v) == 1 for v in fires.values())
    assert all(m["src"] == "timer" for m in messages(root))
    assert [m.get("param2") for m in messages(root) if m["param1"] == "b"] == ["x"]
    # S10.4: one scan found all three: due at t0, t0 + 2, t0 + 4 (name order), then + period.
    listing = dict(live(root, "timers"))
    assert listing["c"] - listing["a"] == pytest.approx(4.0, abs=0.002)
    assert listing["b"] - listing["a"] == pytest.approx(62.0, abs=0.002)
    assert fires["a"][0] < fires["b"][0] < fires["c"][0]
    # (Fire times may lag the due times here: the first fires wait for the queues to be up.)
    assert [row[0] for row in live(root, "timers")] == ["a", "c", "b"]  # sorted by due

    # S15 route 28 through the real web server.
    port = json.loads((root / "config" / "config.json").read_text())["port"]
    body = requests.get(f"http://127.0.0.1:{port}/timers.json", timeout=30).json()
    assert body["sent"] == 3 and body["errors"] == 0
    assert body["timers"][0] == {"name": "a", "due": listing["a"], "period": 60, "dest": "test"}
    assert [t["name"] for t in body["timers"]] == ["a", "c", "b"]
    page = requests.get(f"http://127.0.0.1:{port}/", timeout=30).text   # S16.1 Timer List
    timer_list = page[page.index('id="timer-list"'):]
    rows = [timer_list.index(f"<tr><td>{n}</td><td>test</td>") for n in ("a", "c", "b")]
    assert rows == sorted(rows)

    # S10.5: the state survives a restart of rq-mgr; nothing fires early.
    state = json.loads((root / "config" / "timers.state.json").read_text())
    assert set(state) == {"a", "b", "c"}
    assert state["a"]["last_fire"] == pytest.approx(fires["a"][0], abs=1.5)
    assert rq_mgr(root, "stop").returncode == 0
    start(root, managers)
    assert dict(live(root, "timers")) == pytest.approx(listing, abs=0.002)
    write_timer(root, "d", timer(60, param1="d"))  # proof that this daemon scans and fires
    wait_messages(root, 4)
    wait_status(root, {"sent": 1, "errors": 0})  # counters restart with the daemon (S18)
    fires = by_param1(root)
    assert {k: len(v) for k, v in fires.items()} == {"a": 1, "b": 1, "c": 1, "d": 1}
    # A timer that appears while everything runs fires at once: its due = fire + period.
    assert dict(live(root, "timers"))["d"] == pytest.approx(fires["d"][0] + 60, abs=1.0)

    # S10.7: removing the file removes the timer and its state entry.
    os.unlink(root / "timers" / "d.json")
    wait_for(lambda: "d" not in dict(live(root, "timers")), DEADLINE, what="d removed")
    wait_for(lambda: "d" not in json.loads((root / "config" / "timers.state.json").read_text()),
             DEADLINE, what="d's state entry removed")


def test_s10_5_recorded_fire_times_give_the_due_times(root: Path, managers: list[Mgr]) -> None:
    now = time.time()
    near = write_timer(root, "near", timer(60, param1="near"))
    past = write_timer(root, "past", timer(60, param1="past"))
    edited = write_timer(root, "edited", timer(60, param1="edited"))

    def stat(path: Path) -> str:
        st = os.stat(path)
        return f"{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}"

    last_near = round(now - 45, 3)  # due 15 s from now
    (root / "config" / "timers.state.json").write_text(json.dumps({
        "near": {"last_fire": last_near, "stat": stat(near)},
        "past": {"last_fire": now - 3600, "stat": stat(past)},
        "edited": {"last_fire": now - 10, "stat": "0:0:0:0"},   # file changed since
        "removed": {"last_fire": now - 10, "stat": "1:2:3:4"},
    }))
    start(root, managers)
    assert dict(live(root, "timers"))["near"] == pytest.approx(last_near + 60, abs=0.002)
    wait_messages(root, 2)   # past and edited: at once
    fires = by_param1(root)
    assert "near" not in fires or time.time() >= last_near + 60  # never before its due time
    assert {"edited", "past"} <= set(fires)
    wait_messages(root, 3)
    wait_status(root, {"sent": 3, "errors": 0})
    fired = by_param1(root)["near"]
    assert len(fired) == 1 and fired[0] >= last_near + 60 - 0.05
    assert dict(live(root, "timers"))["near"] == pytest.approx(last_near + 120, abs=0.002)
    state = json.loads((root / "config" / "timers.state.json").read_text())
    assert set(state) == {"near", "past", "edited"}
    assert state["edited"]["stat"] == stat(edited)


def test_s10_2_s10_6_invalid_files_and_failed_fires_count_errors(
        root: Path, tmp_path: Path, managers: list[Mgr], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RQ_RESCAN_SECONDS", "3600")  # S10.3: every change seen by watchdog
    make_queue(root, "relay", script=root.parent / "done.sh")
    (root / "config" / "relay.pause").touch()  # keep relayed messages in que
    assert (root.parent / "done.sh").read_text() == DONE_SCRIPT
    (root / "timers" / "README").write_text("not a timer")
    (root / "timers" / "x.y.json").write_text("{")       # not a timer name: ignored
    os.mkfifo(root / "timers" / "pipe.json")              # not a file: ignored, never opened
    write_timer(root, "bad", "{")
    start(root, managers)
    wait_status(root, {"sent": 0, "errors": 1})
    # the timers daemon serves its socket with the rq1 server (bad frames: test_sockserve.py)
    bad_magic = raw_exchange(root / "config" / "timers.sock", b"rq2 00000004 ping")
    assert decode_reply_frame(bad_magic) == ["fail", "bad request"]
    log = (root / "log" / "queuemgr.log").read_text()
    assert "rq-timers[" in log and "ERROR timer bad: rejected timers/bad.json" in log

    # Unchanged: not counted again; a rescan happens when another timer appears.
    write_timer(root, "web", timer(60, dest="http://example.invalid:1/q/far", param1="w"))
    relayed = wait_messages(root, 1, queue="relay")
    assert relayed[0]["dest"] == "http://example.invalid:1/q/far"
    assert relayed[0]["src"] == "timer" and relayed[0]["param1"] == "w"
    wait_status(root, {"sent": 1, "errors": 1})

    write_timer(root, "bad", {"period": 30, "msg": {"dest": "test"}})   # changed, still bad
    wait_for(lambda: live(root, "timers_status")["errors"] == 2, DEADLINE, what="errors 2")
    write_timer(root, "bad", timer(60, param1="fixed"))                # now a timer
    wait_for(lambda: "fixed" in by_param1(root), DEADLINE, what="fixed timer fires")

    # S10.6: no such queue, or a DOWN queue: errors + 1, and on to the next period.
    write_timer(root, "lost", timer(60, dest="nosuch"))
    wait_status(root, {"sent": 2, "errors": 3})
    due = dict(live(root, "timers"))["lost"]
    assert due > time.time() + 50
    (root / "config" / "test.down").touch()
    write_timer(root, "down", timer(60, param1="down"))
    wait_for(lambda: live(root, "timers_status")["errors"] == 4, DEADLINE, what="DOWN refused")
    assert "down" not in by_param1(root)
    assert "queue test refused the message" in (root / "log" / "queuemgr.log").read_text()

    # The documented way: a symlink.  Its target changing elsewhere is a change (S10.3).
    os.unlink(root / "config" / "test.down")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "linked.json").write_text(json.dumps(timer(60, param1="linked")))
    os.symlink(elsewhere / "linked.json", root / "timers" / "linked.json")
    wait_for(lambda: len(by_param1(root).get("linked", [])) == 1, DEADLINE, what="linked fires")
    tmp = elsewhere / ".linked.tmp"
    tmp.write_text(json.dumps(timer(61, param1="linked")))
    os.replace(tmp, elsewhere / "linked.json")
    wait_for(lambda: len(by_param1(root).get("linked", [])) == 2, DEADLINE,
             what="changed target fires again")
    assert call_mgr(str(root), "status", timeout=30)[1]["timers"]["restarts"] == 0


def test_s2_1_titles_and_both_daemons_exit_when_the_manager_dies(
        root: Path, managers: list[Mgr]) -> None:
    import signal

    import psutil
    start(root, managers)
    sup = wait_for(lambda: (s := call_mgr(str(root), "status", timeout=30)[1])["timers"]
                   and s["scandir"] and s["timers"]["state"] == s["scandir"]["state"] == "RUNNING"
                   and s, DEADLINE, what="timers and scandir RUNNING")
    pids = {kind: sup[kind]["pid"] for kind in ("timers", "scandir")}
    for kind, pid in pids.items():
        assert psutil.Process(pid).cmdline()[0] == f"[rq-{kind}]"
    manager = int((root / "config" / "queuemgr.pid").read_text())
    os.kill(manager, signal.SIGKILL)
    for kind, pid in pids.items():
        wait_for(lambda p=pid: not psutil.pid_exists(p) or
                 psutil.Process(p).status() == psutil.STATUS_ZOMBIE,
                 DEADLINE, what=f"{kind} to exit after the manager died")
    assert not (root / "config" / "timers.sock").exists()
