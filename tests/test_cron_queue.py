"""Cron schedules in real queue processes (SPEC S9.2-S9.4; rq/queue/cron.py).

Each test starts real queue processes (`python -m rq.queue`); the web tests
run a real rq-mgr and the Flask app over it.  To avoid waiting for wall-clock
minutes, most tests pre-write `cron.state.json` with a `last_fire` that puts
the next slot inside the firing window at once; one test waits for a real
minute slot.  Which messages a queue created is read from its event log
(S13: one `null -> prep` event per message) and their fields over its socket.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from rq.message import id_epoch
from rqtest import QueueProc, make_queue, read_events, wait_for, write_script

DONE = '#!/bin/sh\necho "done ok" >&3\n'
NAME = "cq"
EVERY_MINUTE = {"cron": "* * * * *", "id": "m"}


def minute(t: float) -> int:
    return int(t // 60 * 60)


def qdir(root: Path) -> Path:
    return root / "queue" / NAME


def make_cron_queue(root: Path, schedule: list[dict[str, Any]]) -> Path:
    script = write_script(root.parent / "done.sh", DONE)
    return make_queue(root, NAME, script=script, schedule=schedule)


def write_state(root: Path, state: dict[str, Any]) -> None:
    path = qdir(root) / "cron.state.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(state))
    os.replace(tmp, path)


def read_state(root: Path) -> dict[str, Any]:
    try:
        return json.loads((qdir(root) / "cron.state.json").read_text())
    except FileNotFoundError:
        return {}


def created(qp: Any) -> list[dict[str, Any]]:
    """Every message the queue created, oldest first, as get_message reads it."""
    ids = [e["msg_id"] for e in read_events(qp.root, NAME) if e["from"] is None]
    return [qp.message(i) for i in ids]


def settled(qp: Any, key: str = "m") -> list[dict[str, Any]] | None:
    """The created messages once the entry's last fire is complete: the state's
    `last_msg_id` is the message of its `last_fire` (due at that slot, or later for a
    catch-up).  Between the state write and the message's creation it is not."""
    track = read_state(qp.root).get(key) or {}
    msgs = created(qp)
    done = any(m["msg_id"] == track.get("last_msg_id") and m["due"] >= track["last_fire"]
               for m in msgs)
    return msgs if done else None


def check_each_slot_once(msgs: list[dict[str, Any]], first: int, last: int) -> None:
    """Dues are minute slots in (first - 60, last], strictly increasing: none twice."""
    got = dues(msgs)
    assert got == sorted(set(got)), f"a slot fired twice: {got}"
    assert set(got) <= set(range(first, last + 60, 60)), got


def dues(messages: list[dict[str, Any]]) -> list[float]:
    return [m["due"] for m in messages]


def log_text(root: Path) -> str:
    try:
        return (root / "log" / "queuemgr.log").read_text()
    except FileNotFoundError:
        return ""


def jan1(year: int) -> int:
    return int(datetime(year, 1, 1, tzinfo=timezone.utc).timestamp())


# ---------------------------------------------------------------- firing (S9.3)

def test_s9_3_every_minute_entry_fires_once_per_slot_up_to_60_s_early(root: Path,
                                                                      launch: Any) -> None:
    """Seen first: no past slot; the next minute slot fires at once (it is less than
    60 s away), the one after it exactly when it comes within 60 s (a real wait)."""
    make_cron_queue(root, [EVERY_MINUTE])
    started = time.time()
    qp = launch(NAME)
    msgs = wait_for(lambda: settled(qp), 30, what="the first fire")
    first = msgs[0]["due"]
    assert first % 60 == 0 and started < first <= started + 90
    assert (msgs[0]["src"], msgs[0]["dest"]) == ("cron", NAME)
    assert id_epoch(msgs[0]["msg_id"]) >= first - 61

    msgs = wait_for(lambda: (m := settled(qp)) and len(m) >= 2 and m, 75, interval=0.1,
                    what="the next minute slot")
    assert dues(msgs) == [first, first + 60]
    made = id_epoch(msgs[1]["msg_id"])
    assert first + 60 - 61 <= made <= first + 60 - 60 + 15, "created about 60 s early"
    assert read_state(root)["m"]["last_msg_id"] == msgs[1]["msg_id"]
    assert msgs[1]["src"] == "cron" and "param1" not in msgs[1]


def test_s9_3_sigkill_right_after_a_fire_never_fires_a_slot_twice(root: Path,
                                                                 queues: list[QueueProc]) -> None:
    make_cron_queue(root, [EVERY_MINUTE])
    base = minute(time.time())
    write_state(root, {"m": {"last_fire": base, "last_msg_id": None}})
    qp = QueueProc(root, NAME)
    queues.append(qp)
    wait_for(lambda: settled(qp), 30, what="a fire")
    qp.kill()  # SIGKILL to the queue process (and its jobs) right after the fire
    before = created(QueueProcReader(root))
    assert before and before[0]["due"] == base + 60

    # mark the file so the restarted process's first pass is visible (it drops the key)
    write_state(root, {**read_state(root), "gone": {"last_fire": 1, "last_msg_id": None}})
    qp2 = QueueProc(root, NAME)
    queues.append(qp2)
    wait_for(lambda: "gone" not in read_state(root), 30, what="the restarted queue's pass")
    after = wait_for(lambda: settled(qp2), 75, what="the state to settle")
    check_each_slot_once(after, base + 60, read_state(root)["m"]["last_fire"])
    ids = [m["msg_id"] for m in after]
    assert ids[:len(before)] == [m["msg_id"] for m in before]


class QueueProcReader:
    """Reads a stopped queue's messages from disk (the socket is gone after a kill)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def message(self, msg_id: str) -> dict[str, Any]:
        found = list(qdir(self.root).glob(f"*/{msg_id}/msg")) + list(
            qdir(self.root).glob(f"*/*/*/*/{msg_id}/msg"))
        assert len(found) == 1, found
        return json.loads(found[0].read_text())


def test_s9_3_failed_creation_skips_the_slot_and_never_refires_it(root: Path,
                                                                  queues: list[QueueProc]) -> None:
    """The state is written before the message: when creating it fails (here the first
    mkdir of prep/ID fails with EIO, as a crash between the two would leave it), the
    slot is skipped, and a restart does not fire it again."""
    make_cron_queue(root, [EVERY_MINUTE])
    base = minute(time.time())
    write_state(root, {"m": {"last_fire": base - 60, "last_msg_id": None}})
    qp = QueueProc(root, NAME, env={"RQ_FS_FAULTS": "mkdir:1:EIO"})
    queues.append(qp)
    wait_for(lambda: f"slot {base} skipped, message not created" in log_text(root), 30,
             what="the failed creation to be logged")
    before = wait_for(lambda: settled(qp), 30, what="the next slot's message")
    assert before[0]["due"] == base + 60
    qp.kill()
    write_state(root, {**read_state(root), "gone": {"last_fire": 1, "last_msg_id": None}})
    qp2 = QueueProc(root, NAME)
    queues.append(qp2)
    wait_for(lambda: "gone" not in read_state(root), 30, what="the restarted queue's pass")
    after = wait_for(lambda: settled(qp2), 75, what="the state to settle")
    check_each_slot_once(after, base + 60, read_state(root)["m"]["last_fire"])
    assert base not in dues(after)


def test_s9_3_state_not_durable_means_no_message_yet(root: Path, launch: Any) -> None:
    """The 2nd write of the process is the state file's: it fails (EIO), so no message
    is created until a later pass has written it; then each slot fires once."""
    make_cron_queue(root, [EVERY_MINUTE])
    base = minute(time.time())
    write_state(root, {"m": {"last_fire": base, "last_msg_id": None}})
    qp = launch(NAME, env={"RQ_FS_FAULTS": "write:2:EIO"})
    msgs = wait_for(lambda: settled(qp), 30, what="a fire after the retry")
    assert "cannot write cron.state.json" in log_text(root)
    last = read_state(root)["m"]["last_fire"]
    assert dues(msgs) == list(range(base + 60, last + 60, 60))


def test_s9_3_two_entries_in_the_same_minute_give_two_messages(root: Path, launch: Any) -> None:
    a = {"cron": "* * * * *", "param1": "a"}
    b = {"cron": "*/1 * * * *", "id": "b", "param1": "b", "param2": "x"}
    make_cron_queue(root, [a, b])
    base = minute(time.time())
    key_a = '{"cron":"* * * * *","param1":"a"}'
    write_state(root, {key_a: {"last_fire": base, "last_msg_id": None},
                       "b": {"last_fire": base, "last_msg_id": None}})
    qp = launch(NAME)
    wait_for(lambda: settled(qp, key_a) and settled(qp, "b"), 30, what="both entries to fire")
    state = read_state(root)
    msgs = created(qp)
    by_param = {p: [m for m in msgs if m.get("param1") == p] for p in ("a", "b")}
    assert dues(by_param["a"]) == list(range(base + 60, state[key_a]["last_fire"] + 60, 60))
    assert dues(by_param["b"]) == list(range(base + 60, state["b"]["last_fire"] + 60, 60))
    assert by_param["b"][0]["param2"] == "x" and "param2" not in by_param["a"][0]
    assert len(msgs) == len(by_param["a"]) + len(by_param["b"])


def test_s9_2_entry_seen_first_never_fires_past_slots(root: Path, launch: Any) -> None:
    make_cron_queue(root, [{"cron": "0 0 1 1 *", "tz": "UTC", "id": "y", "catch_up": True}])
    started = time.time()
    qp = launch(NAME)
    state = wait_for(lambda: read_state(root), 30, what="the entry to be tracked")
    assert state["y"]["last_msg_id"] is None
    assert int(started) <= state["y"]["last_fire"] <= time.time()
    assert created(qp) == []


def test_s9_3_missed_slots_catch_up_once_or_are_skipped(root: Path, launch: Any) -> None:
    year = datetime.now(timezone.utc).year
    make_cron_queue(root, [
        {"cron": "0 0 1 1 *", "tz": "UTC", "id": "c", "catch_up": True, "param1": "c"},
        {"cron": "0 0 1 1 *", "tz": "UTC", "id": "s", "param1": "s"}])
    old = {"last_fire": jan1(year - 3), "last_msg_id": None}
    write_state(root, {"c": old, "s": old})
    started = time.time()
    qp = launch(NAME)
    wait_for(lambda: read_state(root)["s"]["last_fire"] == jan1(year), 30, what="the skip")
    state = wait_for(lambda: read_state(root)["c"]["last_msg_id"] and read_state(root), 30,
                     what="the catch-up message")
    assert state["c"]["last_fire"] == jan1(year) and state["s"]["last_msg_id"] is None
    msgs = created(qp)
    assert [(m["src"], m["param1"]) for m in msgs] == [("cron", "c")]
    assert started - 1 <= msgs[0]["due"] <= time.time(), "due = now"
    assert msgs[0]["msg_id"] == state["c"]["last_msg_id"]


def test_s9_3_paused_queue_changes_nothing_until_up(root: Path, launch: Any) -> None:
    year = datetime.now(timezone.utc).year
    make_cron_queue(root, [{"cron": "0 0 1 1 *", "tz": "UTC", "id": "c", "catch_up": True}])
    write_state(root, {"c": {"last_fire": jan1(year - 2), "last_msg_id": None},
                       "gone": {"last_fire": 5, "last_msg_id": None}})
    raw = (qdir(root) / "cron.state.json").read_bytes()
    pause = root / "config" / f"{NAME}.pause"
    pause.touch()
    qp = launch(NAME)
    wait_for(lambda: "waiting while PAUSE" in log_text(root), 30, what="a paused pass")
    assert qp.call("status") == ["PAUSE"]
    assert (qdir(root) / "cron.state.json").read_bytes() == raw and created(qp) == []
    pause.unlink()
    qp.call("ping")  # any request is followed by a pass (S2.6); the 5 s pass would do too
    msgs = wait_for(lambda: settled(qp, "c"), 30, what="the first UP pass")
    assert [m["src"] for m in msgs] == ["cron"]
    assert read_state(root) == {"c": {"last_fire": jan1(year), "last_msg_id": msgs[0]["msg_id"]}}


def test_s9_2_reload_drops_removed_entries_and_adds_new_ones(root: Path, launch: Any) -> None:
    qd = make_cron_queue(root, [{"cron": "0 0 1 1 *", "id": "y"}])
    qp = launch(NAME)
    wait_for(lambda: "y" in read_state(root), 30, what="the entry to be tracked")
    config = json.loads((qd / "config.json").read_text())
    config["schedule"] = [EVERY_MINUTE, {"cron": "61 * * * *", "id": "bad"}]
    (qd / "config.json").write_text(json.dumps(config))
    qp.popen.send_signal(signal.SIGHUP)
    wait_for(lambda: set(read_state(root)) == {"m"} and settled(qp), 30,
             what="the new schedule (S3.6)")
    assert [m["src"] for m in created(qp)] == ["cron"]
    assert "json config has invalid schedule entry 1" in log_text(root)


# ---------------------------------------------------------------- web (S9.4, S16)

@pytest.fixture(scope="module")
def web_root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A real rq-mgr over a root whose queue `cq` has two schedule entries."""
    from webtest import Mgr, build_root
    base = tmp_path_factory.mktemp("cronweb")
    root = build_root(base)
    make_cron_queue(root, [
        {"cron": "0 0 1 1 *", "tz": "UTC", "id": "yearly", "param1": "p1", "param3": "p3"},
        {"cron": "0 0 29 2 *", "tz": "UTC", "param2": "leap"}])
    mgr = Mgr(root)
    yield root
    mgr.stop()


@pytest.fixture
def web(web_root: Path) -> Any:
    from rq.web import create_app
    return create_app(str(web_root)).test_client()


def queue_json(web: Any) -> dict[str, Any]:
    reply = web.get(f"/q/{NAME}.json")
    return reply.get_json() if reply.status_code == 200 else {}


def test_s9_4_name_json_shows_each_entry_with_next_and_last(web: Any, web_root: Path) -> None:
    body = wait_for(lambda: "schedule" in queue_json(web) and queue_json(web), 60,
                    what="the queue to run")
    state = wait_for(lambda: len(read_state(web_root)) == 2 and read_state(web_root), 30,
                     what="both entries tracked")
    now = time.time()
    yearly, leap = body["schedule"]
    year = datetime.fromtimestamp(now, timezone.utc).year
    assert (yearly["cron"], yearly["id"], yearly["next"]) == ("0 0 1 1 *", "yearly", jan1(year + 1))
    assert yearly["last"] == state["yearly"]["last_fire"]
    leap_year = next(y for y in range(year, year + 9)
                     if y % 4 == 0 and datetime(y, 2, 29, tzinfo=timezone.utc).timestamp() > now)
    assert (leap["cron"], leap["id"]) == ("0 0 29 2 *", None)
    assert leap["next"] == int(datetime(leap_year, 2, 29, tzinfo=timezone.utc).timestamp())
    key = '{"cron":"0 0 29 2 *","param2":"leap","tz":"UTC"}'
    assert leap["last"] == state[key]["last_fire"]


def test_s9_4_run_now_creates_a_cron_now_message_without_touching_tracking(
        web: Any, web_root: Path) -> None:
    wait_for(lambda: "schedule" in queue_json(web), 60, what="the queue to run")
    wait_for(lambda: len(read_state(web_root)) == 2, 30, what="both entries tracked")
    page = web.get(f"/q/{NAME}")
    assert page.status_code == 200
    html = page.get_data(as_text=True)
    assert html.count(">Run Now</button>") == 2 and 'value="cron-now"' in html
    assert 'name="mesg[param3]" value="p3"' in html
    raw = (qdir(web_root) / "cron.state.json").read_bytes()
    reply = web.post(f"/q/{NAME}/new_message", data={
        "x_format": "html", "back": f"/q/{NAME}", "mesg[dest]": NAME, "mesg[src]": "cron-now",
        "mesg[param1]": "p1", "mesg[param3]": "p3"})
    assert reply.status_code == 303 and reply.headers["Location"].endswith(f"/q/{NAME}")
    events = read_events(web_root, NAME)
    new = [e["msg_id"] for e in events if e["from"] is None]
    assert len(new) == 1
    msg = wait_for(lambda: read_msg_anywhere(web_root, new[0]), 30, what="the message")
    assert (msg["src"], msg["param1"], msg["param3"], msg["dest"]) == ("cron-now", "p1", "p3",
                                                                      NAME)
    assert "param2" not in msg
    assert (qdir(web_root) / "cron.state.json").read_bytes() == raw


def read_msg_anywhere(root: Path, msg_id: str) -> dict[str, Any] | None:
    """A message's msg file in whatever state it is (it may move while we look)."""
    for path in qdir(root).glob(f"**/{msg_id}/msg"):
        try:
            return json.loads(path.read_text())
        except (OSError, ValueError):
            return None
    return None
