"""Pull-mode leases inside one real queue process (SPEC S8.2, S8.3, S2.5, S2.7, S13.3).

The queue-level commands the manager uses (`grant_lease`, `lease_candidate`,
`lease_wait`, `report`, `renew`) are driven directly over the queue socket;
the manager, HTTP and consumer-process paths are in test_pull_consumers.py.
"""

from __future__ import annotations

import json
import re
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from rqtest import (QueueProc, create_msg, job_log, make_queue, msg_events, read_events,
                    short_id, wait_for, wait_final)


def pull_queue(root: Path, name: str = "pq", **cfg: Any) -> None:
    cfg.setdefault("topic", "video.encode")
    make_queue(root, name, mode="pull", **cfg)


def grant(q: QueueProc, **arg: Any) -> dict[str, Any]:
    arg.setdefault("consumer", "tester")
    reply = q.call("grant_lease", arg)
    assert reply[0] == "ok" and reply[1] is not None, reply
    return reply[1]


def report(q: QueueProc, res: dict[str, Any], line: str, token: str | None = None) -> Any:
    return q.call("report", {"msg_id": res["full_msg_id"], "token": token or res["token"],
                             "line": line})


def test_s8_2_grant_moves_to_run_with_lease_file_log_line_and_event(root: Path, launch) -> None:
    pull_queue(root, lease_timeout=30)
    q = launch("pq")
    full = create_msg(q, param1="a")
    res = grant(q, consumer="worker-7")
    assert res["full_msg_id"] == full and res["msg_id"] == short_id(full)
    assert res["queue"] == "pq" and res["topic"] == "video.encode"
    assert re.fullmatch(r"[0-9a-f]{32,}", res["token"])
    assert abs(res["lease_expires"] - (time.time() + 30)) < 5
    assert res["msg"]["state"] == "run" and res["msg"]["param1"] == "a"
    env = res["env"]
    assert env["RQ_MSG_ID"] == short_id(full) and env["RQ_FULL_MSG_ID"] == full
    assert env["RQ_PARAM1"] == "a" and env["RQ_COUNT"] == "0"
    assert not {"RQ_WRITE", "RQ_READ", "RQ_PIPE", "RQ_MSG_DIR"} & set(env)
    assert all(k.startswith("RQ_") for k in env)
    lease = json.loads((root / res["msg"]["path"] / "lease.json").read_text())
    assert lease["token"] == res["token"] and lease["consumer"] == "worker-7"
    assert re.search(r"\n\d{4}-\d\d-\d\d \d\d:\d\d:\d\d [+-]\d{4} - RQ RESERVED BY worker-7\n",
                     job_log(root, res["msg"]))
    assert q.call("messages", {"state": "run"})[0]["consumer"] == "worker-7"
    assert q.counts()["run"] == 1
    ev = msg_events(root, "pq", full, last_to="run")[-1]
    assert ev["from"] == "que" and ev["consumer"] == "worker-7" and ev["pid"] is None
    assert report(q, res, "done all good") == ["ok", "done"]
    assert q.message(full)["status"] == "done - all good"
    assert not (root / q.message(full)["path"] / "lease.json").exists()
    ev = msg_events(root, "pq", full, last_to="done")[-1]
    assert ev["consumer"] == "worker-7" and ev["pid"] is None and ev["exit_code"] is None
    assert q.call("grant_lease", {"consumer": "x"}) == ["ok", None]


@pytest.mark.parametrize("line,reply,state,status", [
    ("run half way", ["ok", "run"], "run", "run - half way"),
    ("err broke", ["ok", "err"], "err", "err - broke"),
    ("fail broke", ["ok", "err"], "err", "err - broke"),
    ("fails broke", ["ok", "err"], "err", "err - broke"),
    ("relayed http://x/q/a/1", ["ok", "relayed"], "relayed", "relayed - http://x/q/a/1"),
    ("resend 0-again", ["ok", "que"], "que", "que - 0-again"),
    ("bogus line", ["fail", "malformed line"], "run", "run - bogus line"),
    ("resend x", ["fail", "malformed line"], "run", "run - resend x"),
])
def test_s8_3_report_lines(root: Path, launch, line: str, reply: list, state: str,
                           status: str) -> None:
    pull_queue(root)
    q = launch("pq")
    full = create_msg(q)
    res = grant(q)
    assert report(q, res, line) == reply
    assert q.state(full) == state
    assert q.message(full)["status"] == status
    assert q.message(full)["count"] == (1 if reply == ["ok", "que"] else 0)


def test_s5_4_resend_at_max_count_goes_to_err(root: Path, launch) -> None:
    pull_queue(root)
    q = launch("pq")
    full = create_msg(q, count=2, max_count=3)
    res = grant(q)
    assert report(q, res, "resend 5") == ["ok", "err"]
    msg = q.message(full)
    assert msg["count"] == 3 and msg["status"] == "err - HIT MAX RESEND COUNT - MOVING TO ERR"


def test_s8_3_wrong_and_expired_token_texts(root: Path, launch) -> None:
    pull_queue(root)
    q = launch("pq")
    full = create_msg(q)
    res = grant(q, lease=1)
    assert report(q, res, "run x", token="0" * 32) == ["fail", "lease not held"]
    assert q.call("renew", {"msg_id": full, "token": "nope"}) == ["fail", "lease not held"]
    q.wait_state(full, "que", 30)
    assert report(q, res, "done late") == ["fail", "lease expired"]
    assert q.call("renew", {"msg_id": full, "token": res["token"]}) == ["fail", "lease expired"]
    missing = full[:-3] + "999"
    assert q.call("report", {"msg_id": missing, "token": "t", "line": "done"}) == \
        ["fail", "msg not found"]
    assert q.call("report", {"msg_id": full, "token": "t"}) == ["fail", "missing line"]


def test_s8_3_lease_expiry_requeues_with_count_plus_one(root: Path, launch) -> None:
    pull_queue(root, lease_timeout=1)
    q = launch("pq")
    full = create_msg(q)
    res = grant(q)
    granted = time.time()
    q.wait_state(full, "que", 30)
    assert time.time() - granted < 8           # checked at least every 5 s (+ a loaded machine)
    msg = q.message(full)
    assert msg["count"] == 1 and msg["status"] == "que - LEASE EXPIRED - MOVING TO QUE"
    assert msg["due"] <= time.time()
    ev = msg_events(root, "pq", full, last_to="que")[-1]
    assert ev["from"] == "run" and ev["count"] == 1 and ev["consumer"] == "tester"
    again = grant(q, consumer="second")
    assert again["msg_id"] == res["msg_id"] and again["token"] != res["token"]
    assert again["env"]["RQ_COUNT"] == "1"


def test_s8_3_lease_expiry_at_max_count_goes_to_err(root: Path, launch) -> None:
    pull_queue(root)
    q = launch("pq")
    full = create_msg(q, count=0, max_count=1)
    grant(q, lease=1)
    q.wait_state(full, "err", 30)
    msg = q.message(full)
    assert msg["count"] == 1
    assert msg["status"] == "err - LEASE EXPIRED - HIT MAX RESEND COUNT - MOVING TO ERR"


def test_s8_3_lease_renewed_past_its_first_expiry(root: Path, launch) -> None:
    pull_queue(root)
    q = launch("pq")
    full = create_msg(q)
    res = grant(q, lease=3)
    first_expiry = res["lease_expires"]
    while time.time() < first_expiry + 2:     # renew (and report run) past the first expiry
        reply = q.call("renew", {"msg_id": full, "token": res["token"], "lease": 3})
        assert reply[0] == "ok" and reply[1] > time.time() + 1, reply
        assert report(q, res, "run still busy") == ["ok", "run"]
        wait_for(lambda: time.time() > reply[1] - 2, 5, interval=0.05, what="renew time")
    assert q.state(full) == "run"
    assert report(q, res, "done finally") == ["ok", "done"]
    assert q.message(full)["count"] == 0


def test_s2_7_leases_survive_a_queue_restart(root: Path, launch) -> None:
    pull_queue(root, num_workers=2)
    q = launch("pq")
    kept = create_msg(q)
    short = create_msg(q)
    res_kept = grant(q, lease=60)
    res_short = grant(q, lease=60)
    assert q.stop() == 0
    # the second lease runs out while the queue is down (its file says so)
    lease_file = root / res_short["msg"]["path"] / "lease.json"
    record = json.loads(lease_file.read_text())
    lease_file.write_text(json.dumps({**record, "expires": time.time() - 1}))
    q2 = launch("pq")
    assert q2.state(kept) == "run"
    assert q2.call("messages", {"state": "run"})[0]["consumer"] == "tester"
    # the lease that expired while the queue was down is recovered as S2.7 says
    msg = q2.message(short)
    assert msg["state"] == "que" and msg["status"] == "que - QUEUE RESTARTED - MOVING TO QUE"
    assert msg["count"] == 0
    assert report(q2, res_kept, "run after restart") == ["ok", "run"]
    assert report(q2, res_kept, "done after restart") == ["ok", "done"]
    assert q2.state(kept) == "done"


def test_s2_7_restart_after_kill_keeps_lease(root: Path, queues) -> None:
    pull_queue(root)
    q = QueueProc(root, "pq")
    queues.append(q)
    full = create_msg(q)
    res = grant(q, lease=60)
    q.kill()
    q2 = QueueProc(root, "pq")
    queues.append(q2)
    assert q2.state(full) == "run"
    assert report(q2, res, "done") == ["ok", "done"]


def test_s8_3_timeout_counts_from_the_reservation(root: Path, launch) -> None:
    pull_queue(root, timeout=1)
    q = launch("pq")
    full = create_msg(q)
    res = grant(q, lease=60)
    q.wait_state(full, "err", 30)
    assert q.message(full)["status"] == "err - JOB TIMED OUT AFTER 1 SECONDS - MOVING TO ERR"
    assert report(q, res, "done late")[0] == "fail"


def test_s8_3_destroy_revokes_the_lease(root: Path, launch) -> None:
    pull_queue(root)
    q = launch("pq")
    full = create_msg(q)
    res = grant(q)
    assert q.call("destroy_message", {"msg_id": full}) == ["ok", "msg destroyed"]
    assert q.state(full) == "err"
    assert q.message(full)["status"] == "err - LEASE REVOKED BY DESTROY - MOVING TO ERR"
    assert report(q, res, "done") == ["fail", "lease not held"]
    assert q.call("destroy_message", {"msg_id": full}) == ["fail", "msg not running"]


def test_s6_5_dup_from_a_consumer(root: Path, launch) -> None:
    pull_queue(root)
    pull_queue(root, "other", topic="other")
    q = launch("pq")
    other = launch("other")
    full = create_msg(q, param2="p2")
    res = grant(q, lease=5)
    before = res["lease_expires"]
    reply = report(q, res, "dup 0-X-other")
    assert reply[0] == "ok" and "/q/other/" in reply[1], reply
    copy = other.message(reply[1])
    assert copy["dest"] == "other" and copy["param2"] == "p2" and copy["count"] == 0
    assert q.message(full)["status"] == "run - 0-X-other"
    lease = json.loads((root / q.message(full)["path"] / "lease.json").read_text())
    assert lease["expires"] >= before
    assert report(q, res, "dup 0-X-nosuchqueue") == \
        ["fail", "couldn't connect to queue - nosuchqueue"]
    assert report(q, res, "dup nonsense") == ["fail", "malformed line"]
    assert report(q, res, "done") == ["ok", "done"]


def test_s8_1_script_mode_queue_refuses(root: Path, launch, driver: Path) -> None:
    make_queue(root, "sq", script=driver)
    q = launch("sq")
    full = create_msg(q, param1='[["w", "done ok\\n"]]')
    wait_final(q, full)
    assert q.call("grant_lease", {}) == ["fail", "queue is not in pull mode"]
    assert q.call("lease_candidate", {}) == ["fail", "queue is not in pull mode"]
    assert q.call("report", {"msg_id": full, "token": "t", "line": "done"}) == \
        ["fail", "queue is not in pull mode"]
    assert q.call("renew", {"msg_id": full, "token": "t"}) == ["fail", "queue is not in pull mode"]


def test_s5_num_workers_blocking_and_order(root: Path, launch) -> None:
    pull_queue(root, num_workers=2, blocking_params=[1])
    q = launch("pq")
    now = time.time()
    a1 = create_msg(q, param1="a", due=now - 3)
    a2 = create_msg(q, param1="a", due=now - 2)
    b1 = create_msg(q, param1="b", due=now - 1)
    create_msg(q, param1="c", due=now + 3600)
    first = grant(q)
    assert first["full_msg_id"] == a1
    assert q.call("lease_candidate", {})[1][1] == short_id(b1)   # a2 is blocked by a1
    second = grant(q)
    assert second["full_msg_id"] == b1
    assert q.call("grant_lease", {}) == ["ok", None]             # both slots are leased
    assert report(q, first, "done") == ["ok", "done"]
    assert grant(q)["full_msg_id"] == a2
    assert q.call("lease_candidate", {}) == ["ok", None]


def test_s5_3_coalescing_at_grant(root: Path, launch) -> None:
    pull_queue(root, coalesce_params=[1], num_workers=2)
    q = launch("pq")
    p = create_msg(q, param1="same")
    d = create_msg(q, param1="same")
    res = grant(q)
    assert res["full_msg_id"] == p
    assert q.call("grant_lease", {}) == ["ok", None]    # the dup waits on its parent
    assert report(q, res, "done ok") == ["ok", "done"]
    dup = q.message(d)
    assert dup["state"] == "done" and dup["dup"] == p
    assert q.message(p)["dups"] == [d]


def test_s3_5_pause_and_down_grant_nothing(root: Path, launch) -> None:
    pull_queue(root)
    q = launch("pq")
    create_msg(q)
    (root / "config" / "pq.pause").touch()
    assert q.call("grant_lease", {}) == ["ok", None]
    (root / "config" / "pq.pause").unlink()
    (root / "config" / "pq.down").touch()
    assert q.call("grant_lease", {}) == ["fail", "status: DOWN"]
    (root / "config" / "pq.down").unlink()
    assert grant(q)["queue"] == "pq"


def test_s8_2_wait_returns_when_a_message_is_committed(root: Path, launch) -> None:
    pull_queue(root)
    q = launch("pq")
    got: list[Any] = []

    def waiter() -> None:
        got.append((q.call("grant_lease", {"wait": 20}, timeout=40), time.monotonic()))
    thread = threading.Thread(target=waiter)
    thread.start()
    assert q.call("lease_wait", {"timeout": 0.3}) == ["ok", False]
    assert not got                      # the waiter is still waiting: nothing to grant
    full = create_msg(q)
    committed = time.monotonic()
    thread.join(30)
    reply, at = got[0]
    assert reply[0] == "ok" and reply[1]["full_msg_id"] == full
    assert at - committed < 2.0


def test_s8_2_lease_wait_and_prep_messages_are_not_candidates(root: Path, launch) -> None:
    pull_queue(root)
    q = launch("pq")
    prep = q.call("prep_message", {"dest": "pq"})[1]
    assert q.call("lease_wait", {"timeout": 0.2}) == ["ok", False]
    assert q.call("commit_message", {"msg_id": prep}) == ["ok", "msg commited"]
    assert q.call("lease_wait", {"timeout": 5}) == ["ok", True]
    assert q.call("lease_wait", {"timeout": "x"}) == ["fail", "invalid timeout"]
    assert q.call("grant_lease", {"lease": 0}) == ["fail", "invalid lease"]


def test_s13_events_of_a_leased_message(root: Path, launch) -> None:
    pull_queue(root)
    q = launch("pq")
    full = create_msg(q)
    res = grant(q, consumer="c9")
    report(q, res, "resend 0")
    res2 = grant(q, consumer="c10")
    report(q, res2, "done")
    wait_for(lambda: len([e for e in read_events(root, "pq")
                          if e["msg_id"] == short_id(full)]) >= 6, 5)
    events = [e for e in read_events(root, "pq") if e["msg_id"] == short_id(full)]
    assert [(e["from"], e["to"], e.get("consumer")) for e in events] == [
        (None, "prep", None), ("prep", "que", None), ("que", "run", "c9"), ("run", "que", "c9"),
        ("que", "run", "c10"), ("run", "done", "c10")]


def test_s2_6_unreadable_candidate_goes_to_err_and_the_next_is_granted(root: Path,
                                                                       launch) -> None:
    pull_queue(root)
    q = launch("pq")
    now = time.time()
    bad = create_msg(q, due=now - 10)
    good = create_msg(q, due=now - 5)
    (root / "queue" / "pq" / "que" / short_id(bad) / "msg").write_text("{not json")
    assert grant(q)["full_msg_id"] == good
    assert q.state(bad) == "err"
    assert q.call("get_message_status", {"msg_id": bad})[1]["status"].startswith(
        "err - MSG UNREADABLE - MOVING TO ERR")
