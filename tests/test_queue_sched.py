"""Scheduling (SPEC S5.1-S5.3, S5.5), admin flags (S3.5) and config reload (S3.6),
observed on real queue processes running the rqtest driver script.

Jobs that must keep a worker busy wait for a release file the test creates; the order
jobs start in is appended by each job to a file (`["log", path]`).
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from rqtest import (
    QueueProc, create_msg, make_queue, msg_events, short_id, wait_file, wait_final, wait_for,
)
from rqtest import job as ops

pytestmark = pytest.mark.timeout(60)
Launch = Callable[..., QueueProc]




def blocked(release: Path, order: Path | None = None, text: str = "ok") -> str:
    """A program that (logs its start and) waits for `release`, then completes done."""
    steps: list[list[Any]] = [["log", str(order)]] if order else []
    return ops(*steps, ["wait", str(release)], ["w", f"done {text}\n"])


def started_order(order: Path, n: int) -> list[str]:
    wait_for(lambda: order.exists() and len(order.read_text().split()) >= n, 10,
             what=f"{n} jobs to start")
    return order.read_text().split()


def flag(root: Path, name: str, kind: str) -> Path:
    return root / "config" / f"{name}.{kind}"


# ================================================================ S5.1 eligibility and order

def test_s5_1_order_is_due_then_id(root: Path, tmp_path: Path, launch: Launch,
                                   driver: Path) -> None:
    make_queue(root, "q", driver, num_workers=1)
    q = launch("q")
    release, order = tmp_path / "release", tmp_path / "order"
    blocker = create_msg(q, param1=blocked(release))
    assert q.state(blocker) == "run"
    now = time.time()
    dues = [now - 10, now - 30, now - 20, now - 40, now - 40, now - 30.5, now]
    fulls = [create_msg(q, due=d, param1=ops(["log", str(order)], ["w", "done ok\n"]))
             for d in dues]
    expected = [short_id(f) for _, f in sorted(zip(dues, fulls),
                                                key=lambda t: (t[0], short_id(t[1])))]
    assert expected[:2] == sorted(short_id(f) for f in fulls[3:5])   # equal due: by id
    assert [m["msg_id"] for m in q.call("messages", {"state": "que"})] == expected
    release.touch()
    for full in fulls:
        q.wait_state(full, "done")
    assert started_order(order, len(fulls)) == expected


def test_s5_1_future_due_waits_then_starts_within_1s(root: Path, tmp_path: Path,
                                                      launch: Launch, driver: Path) -> None:
    make_queue(root, "q", driver, num_workers=2)
    q = launch("q")
    later = create_msg(q, due=time.time() + 1000, param1=ops(["w", "done never\n"]))
    due = round(time.time() + 1.5, 3)
    soon = create_msg(q, due=due, param1=ops(["w", "done on time\n"]))
    assert q.state(soon) == "que"
    assert q.message(soon)["due"] == due
    q.wait_state(soon, "done", timeout=5)
    start = [e for e in msg_events(root, "q", soon, "done") if e["to"] == "run"][0]
    assert due <= start["ts"] <= due + 1.0
    assert q.state(later) == "que"
    # a message due now starts at once even though an earlier-created one waits
    assert q.state(create_msg(q, param1=ops(["w", "done ok\n"]))) in ("run", "done")


def test_s5_1_num_workers_limit(root: Path, tmp_path: Path, launch: Launch,
                                driver: Path) -> None:
    make_queue(root, "q", driver, num_workers=2)
    q = launch("q")
    release, order = tmp_path / "release", tmp_path / "order"
    fulls = [create_msg(q, param1=blocked(release, order)) for _ in range(5)]
    assert [q.state(f) for f in fulls] == ["run", "run", "que", "que", "que"]
    assert q.call("ping") == ["pong"]          # another pass changes nothing
    assert q.counts()["run"] == 2 and q.counts()["que"] == 3
    release.touch()
    events = []
    for full in fulls:
        q.wait_state(full, "done")
        events += msg_events(root, "q", full, "done")
    # never more than 2 at once: replay the event log
    running, peak = 0, 0
    for ev in sorted(events,
                     key=lambda e: (e["ts"], e["from"] != "run")):
        running += (ev["to"] == "run") - (ev["from"] == "run")
        peak = max(peak, running)
    assert peak == 2


def test_s5_1_start_is_synchronous_with_the_request(root: Path, tmp_path: Path,
                                                    launch: Launch, driver: Path) -> None:
    make_queue(root, "q", driver, num_workers=3)
    q = launch("q")
    release = tmp_path / "release"
    created = create_msg(q, param1=blocked(release))
    assert q.state(created) == "run"
    prepped = q.call("prep_message", {"dest": "q", "param1": blocked(release)})[1]
    assert q.state(prepped) == "prep"
    assert q.call("commit_message", {"msg_id": prepped}) == ["ok", "msg commited"]
    assert q.state(prepped) == "run"
    future = create_msg(q, due=time.time() + 1000, param1=blocked(release))
    assert q.state(future) == "que"
    assert q.call("run_message", {"msg_id": future}) == ["ok", "msg sent to front of run queue"]
    assert q.state(future) == "run"
    release.touch()
    for full in (created, prepped, future):
        q.wait_state(full, "done")


# ================================================================ S3.5 admin flags

def test_s3_5_pause_and_down_stop_starting(root: Path, tmp_path: Path, launch: Launch,
                                           driver: Path) -> None:
    make_queue(root, "q", driver, num_workers=2)
    q = launch("q")
    release = tmp_path / "release"
    running = create_msg(q, param1=blocked(release, text="finished while paused"))
    assert q.state(running) == "run"

    flag(root, "q", "pause").touch()
    assert q.call("status") == ["PAUSE"]
    waiting = create_msg(q, param1=ops(["w", "done ok\n"]))       # accepted, not started
    assert q.state(waiting) == "que"
    release.touch()                                               # running jobs continue
    q.wait_state(running, "done")
    assert q.message(running)["status"] == "done - finished while paused"
    assert q.state(waiting) == "que"

    flag(root, "q", "down").touch()
    flag(root, "q", "pause").unlink()
    assert q.call("status") == ["DOWN"]
    assert q.call("create_message", {"dest": "q"}) == ["fail", "status: DOWN"]
    assert q.call("get_message", {"msg_id": waiting}) == ["fail", "status: DOWN"]
    assert q.call("ping") == ["pong"]
    assert q.counts()["que"] == 1
    assert (root / "queue" / "q" / "que" / short_id(waiting)).is_dir()

    flag(root, "q", "down").unlink()
    t0 = time.monotonic()
    assert q.call("status") == ["UP"]                # a request triggers a pass (S2.6)
    wait_for(lambda: q.state(waiting) != "que", 5, what="the waiting message to start")
    assert time.monotonic() - t0 < 1.0               # S5.1: a due message starts within 1 s
    q.wait_state(waiting, "done")


# ================================================================ S5.2 blocking_params

@pytest.mark.parametrize("blocking, params, states", [
    # the SPEC example: 3 workers, blocking [1], param1 a, b, a -> run, run, que
    ([1], [{"param1": "a"}, {"param1": "b"}, {"param1": "a"}], ["run", "run", "que"]),
    # the tuple of all listed params counts
    ([1, 3], [{"param1": "a", "param3": "x"}, {"param1": "a", "param3": "y"},
              {"param1": "a", "param3": "x"}], ["run", "run", "que"]),
    # absent = ""
    ([2], [{}, {"param2": ""}, {"param2": "z"}], ["run", "que", "run"]),
    # string equality: "1" and "01" differ
    (["1"], [{"param1": "1"}, {"param1": "01"}, {"param1": 1}], ["run", "run", "que"]),
])
def test_s5_2_blocking_params(root: Path, tmp_path: Path, launch: Launch, driver: Path,
                              blocking: list[Any], params: list[dict[str, Any]],
                              states: list[str]) -> None:
    make_queue(root, "q", driver, num_workers=3, blocking_params=blocking)
    q = launch("q")
    rel = [tmp_path / f"release{i}" for i in range(len(params))]
    fulls = [create_msg(q, param4=blocked(rel[i]), **p) for i, p in enumerate(params)]
    assert [q.state(f) for f in fulls] == states
    rel[0].touch()                       # the blocking message finishes ...
    q.wait_state(fulls[0], "done")
    waiting = states.index("que")
    q.wait_state(fulls[waiting], "run", timeout=5)   # ... and the blocked one starts
    for r in rel:
        r.touch()
    for full in fulls:
        q.wait_state(full, "done")


# ================================================================ S5.3 coalescing

@pytest.fixture
def coalescing(root: Path, tmp_path: Path, launch: Launch, driver: Path) -> dict[str, Any]:
    """One worker, coalesce_params [1]: a blocker holds the worker while P (param1 a),
    its would-be dups and an unrelated message X queue up; then P starts."""
    make_queue(root, "q", driver, num_workers=1, coalesce_params=[1])
    q = launch("q")
    rel = {k: tmp_path / f"release-{k}" for k in ("blk", "P", "D1", "D2")}
    now = time.time()
    blk = create_msg(q, param1="blk", param4=blocked(rel["blk"]))
    p = create_msg(q, param1="a", due=now - 10, param4=blocked(rel["P"], text="parent"))
    d1 = create_msg(q, param1="a", due=now + 1000, param4=blocked(rel["D1"], text="d1"))
    d2 = create_msg(q, param1="a", param4=blocked(rel["D2"], text="d2"))
    d3 = create_msg(q, param1="a", param4=blocked(rel["D2"], text="d3"))
    x = create_msg(q, param1="b", param2="x", param4=ops(["w", "done x\n"]))
    rel["blk"].touch()
    q.wait_state(p, "run")
    return {"q": q, "rel": rel, "P": p, "D1": d1, "D2": d2, "D3": d3, "X": x, "blk": blk}


def test_s5_3_dups_follow_a_done_parent(root: Path, coalescing: dict[str, Any]) -> None:
    c = coalescing
    q: QueueProc = c["q"]
    p, d1, d2, d3, x = c["P"], c["D1"], c["D2"], c["D3"], c["X"]
    # the dups stay in que/ (and count there) but cannot start while P runs
    assert [q.state(m) for m in (d1, d2, d3, x)] == ["que"] * 4
    # the blocker counts in run until its move to done/ is durable (S6.6), maybe still now
    wait_for(lambda: q.counts()["run"] == 1, what="only P counted in run")
    assert q.counts()["que"] == 4
    assert q.call("delete_message", {"msg_id": d3}) == ["ok", "msg deleted"]  # may be deleted
    c["rel"]["P"].touch()
    q.wait_state(p, "done")
    for dup in (d1, d2):
        q.wait_state(dup, "done")
        msg = q.message(dup)
        assert msg["status"] == f"done - duplicate {p}"
        assert msg["dup"] == p
        assert not (root / msg["path"] / "job").exists()      # it never ran
        ev = msg_events(root, "q", dup, "done")[-1]
        assert (ev["from"], ev["to"], ev["status"]) == ("que", "done", f"duplicate {p}")
    parent = q.message(p)
    assert parent["status"] == "done - parent"
    assert parent["dups"] == sorted([d1, d2])
    assert "dup" not in parent
    assert wait_final(q, x) == "done"
    assert "dup" not in q.message(x)


def test_s5_3_dups_are_released_when_the_parent_errs(root: Path,
                                                     coalescing: dict[str, Any]) -> None:
    c = coalescing
    q: QueueProc = c["q"]
    p, d1, d2, d3, x = c["P"], c["D1"], c["D2"], c["D3"], c["X"]
    # make P fail: the program of P waits for its release then says done; destroy it instead
    assert q.call("destroy_message", {"msg_id": p}) == ["ok", "msg destroyed"]
    q.wait_state(p, "err")
    assert "dups" not in q.message(p)
    # released: D2 (due now, lowest id of the rest) starts and coalesces D3 and D1 in turn
    q.wait_state(d2, "run")
    assert q.state(x) == "que"
    for m in (d1, d3):
        assert q.state(m) == "que"
        assert "dup" not in q.message(m)
    c["rel"]["D2"].touch()
    q.wait_state(d2, "done")
    assert q.message(d2)["status"] == "done - d2"
    assert q.message(d2)["dups"] == sorted([d1, d3])
    for m in (d1, d3):
        q.wait_state(m, "done")
        assert q.message(m)["status"] == f"done - duplicate {d2}"
    assert wait_final(q, x) == "done"


def test_s5_3_no_coalescing_without_coalesce_params(root: Path, tmp_path: Path,
                                                    launch: Launch, driver: Path) -> None:
    make_queue(root, "q", driver, num_workers=1)
    q = launch("q")
    release, order = tmp_path / "release", tmp_path / "order"
    fulls = [create_msg(q, param1="same", param4=blocked(release, order)) for _ in range(3)]
    release.touch()
    for full in fulls:
        q.wait_state(full, "done")
        assert "dup" not in q.message(full) and "dups" not in q.message(full)
    assert started_order(order, 3) == [short_id(f) for f in fulls]


# ================================================================ S5.5 run_message

def test_s5_5_run_message_moves_to_the_front(root: Path, tmp_path: Path, launch: Launch,
                                             driver: Path) -> None:
    make_queue(root, "q", driver, num_workers=1)
    q = launch("q")
    release, order = tmp_path / "release", tmp_path / "order"
    blocker = create_msg(q, param1=blocked(release))
    now = time.time()
    prog = ops(["log", str(order)], ["w", "done ok\n"])
    m1, m2, m3 = (create_msg(q, due=round(now - d, 3), param1=prog) for d in (10, 5, 1))
    m1_due = q.message(m1)["due"]
    assert q.call("run_message", {"msg_id": m3}) == ["ok", "msg sent to front of run queue"]
    assert q.message(m3)["due"] == pytest.approx(m1_due - 1, abs=0.002)
    assert json.loads((root / "queue/q/que" / short_id(m3) / "msg").read_text())["due"] == \
        q.message(m3)["due"]
    assert [e["msg_id"] for e in q.call("messages", {"state": "que"})] == [
        short_id(m) for m in (m3, m1, m2)]
    # the failure replies
    assert q.call("run_message", {"msg_id": blocker}) == ["fail", "msg already running"]
    prep = q.call("prep_message", {"dest": "q"})[1]
    assert q.call("run_message", {"msg_id": prep}) == ["fail", "msg not in runnable state"]
    assert q.call("run_message", {"msg_id": "20100625.0127.35.122.1"}) == [
        "fail", "msg not found"]
    release.touch()
    for m in (m1, m2, m3):
        q.wait_state(m, "done")
    assert q.call("run_message", {"msg_id": m1}) == ["fail", "msg not in runnable state"]
    assert started_order(order, 3) == [short_id(m) for m in (m3, m1, m2)]


def test_s5_5_run_message_respects_pause(root: Path, launch: Launch, driver: Path) -> None:
    make_queue(root, "q", driver)
    q = launch("q")
    flag(root, "q", "pause").touch()
    full = create_msg(q, due=time.time() + 1000, param1=ops(["w", "done ok\n"]))
    assert q.call("run_message", {"msg_id": full})[0] == "ok"
    assert q.state(full) == "que"
    assert q.message(full)["due"] <= time.time()
    flag(root, "q", "pause").unlink()
    assert q.call("ping") == ["pong"]
    q.wait_state(full, "done", timeout=5)


# ================================================================ S3.6 reload

def sighup(root: Path, name: str) -> None:
    pid = int((root / "queue" / name / "queue.pid").read_text())
    os.kill(pid, signal.SIGHUP)


def write_config(root: Path, name: str, conf: dict[str, Any]) -> None:
    path = root / "queue" / name / "config.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(conf))
    tmp.rename(path)


def queue_log(root: Path) -> str:
    path = root / "log" / "queuemgr.log"
    return path.read_text() if path.exists() else ""


def test_s3_6_sighup_applies_a_valid_config(root: Path, tmp_path: Path, launch: Launch,
                                            driver: Path) -> None:
    make_queue(root, "q", driver, num_workers=1, env_vars={"FOO": "one"})
    q = launch("q")
    release = tmp_path / "release"
    info = tmp_path / "info.json"
    first = create_msg(q, param1=ops(["info", str(info)], ["wait", str(release)],
                                     ["w", "done ok\n"]))
    fulls = [create_msg(q, param1=blocked(release)) for _ in range(3)]
    assert [q.state(f) for f in fulls] == ["que"] * 3
    write_config(root, "q", {"name": "q", "script": str(driver), "exec_prefix": "",
                             "num_workers": 3, "env_vars": {"FOO": "two"}})
    sighup(root, "q")
    t0 = time.monotonic()
    wait_for(lambda: q.call("config")[1]["num_workers"] == 3, 2, what="the reload")
    assert time.monotonic() - t0 < 1.0
    wait_for(lambda: [q.state(f) for f in fulls].count("run") == 2, 5,
             what="two more jobs to start")
    assert q.call("config")[1]["env_vars"] == {"FOO": "two"}
    assert json.loads(wait_file(info))["env"]["FOO"] == "one"   # running jobs untouched
    release.touch()
    for full in (first, *fulls):
        q.wait_state(full, "done")


def test_s3_6_invalid_config_is_rejected_and_the_old_one_stays(
        root: Path, tmp_path: Path, launch: Launch, driver: Path) -> None:
    make_queue(root, "q", driver, num_workers=2)
    q = launch("q")
    release = tmp_path / "release"
    fulls = [create_msg(q, param1=blocked(release)) for _ in range(3)]
    assert [q.state(f) for f in fulls] == ["run", "run", "que"]
    old = q.call("config")[1]
    write_config(root, "q", {"name": "q", "script": str(driver), "num_workers": 0})
    sighup(root, "q")
    reason = "json config has invalid num_workers field (out of range 1..128)"
    wait_for(lambda: reason in queue_log(root), 5, what="the rejection in the log")
    (root / "queue" / "q" / "config.json").write_text("{not json")
    sighup(root, "q")
    wait_for(lambda: queue_log(root).count("reload rejected") >= 2, 5,
             what="the second rejection in the log")
    assert q.call("ping") == ["pong"]
    assert q.call("config") == ["ok", old]
    assert [q.state(f) for f in fulls] == ["run", "run", "que"]
    release.touch()
    for full in fulls:
        q.wait_state(full, "done")


def test_s5_3_a_resent_parent_releases_its_dups_and_can_be_coalesced_later(
        root: Path, tmp_path: Path, launch: Launch, driver: Path) -> None:
    make_queue(root, "q", driver, num_workers=1, coalesce_params=[1])
    q = launch("q")
    rel_blk, rel_p = tmp_path / "release-blk", tmp_path / "release-p"
    blk = create_msg(q, param1="blk", param4=blocked(rel_blk))
    p = create_msg(q, param1="a", due=time.time() - 10, param4=ops(
        c0=[["wait", str(rel_p)], ["w", "resend 0-again\n"]], other=[["w", "done p\n"]]))
    d = create_msg(q, param1="a", param4=ops(["w", "done sibling\n"]))
    rel_blk.touch()
    q.wait_state(p, "run")
    assert q.state(d) == "que"
    rel_p.touch()
    # P goes back to que with due = exit time, later than D's: D starts first and P,
    # waiting in que with the same params, is coalesced into it.
    q.wait_state(d, "done")
    q.wait_state(p, "done")
    sibling, parent = q.message(d), q.message(p)
    assert sibling["status"] == "done - sibling"
    assert sibling["dups"] == [p]
    assert parent["status"] == f"done - duplicate {d}"
    assert parent["dup"] == d and parent["count"] == 1
    assert "dups" not in parent
    assert q.state(blk) == "done"
