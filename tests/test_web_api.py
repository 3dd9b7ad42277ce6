"""The read-only web routes (SPEC S15 routes 6-10, 15-18, 28; S15.1-S15.3, S9.4)
against a real rq-mgr.  Each test that counts messages uses its own queue:
planted on disk (so a test needs no job to finish), then started by a manager
`reload`."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import statistics
import subprocess
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from rq import client
from rq.config import load_main_config
from rq.store import new_msg_id
from rqtest import STATES, make_queue, wait_for, write_script

HOLD_SCRIPT = ('#!/bin/sh\necho "run holding" >&3\n'
               'while [ ! -e "$RQ_PARAM2" ]; do sleep 0.05; done\necho "done released" >&3\n')
DOWN_TEXT = "Service Unavailable - Operationally Down"
_seq = iter(range(10_000_000, 99_999_999))


# ---------------------------------------------------------------- helpers


def mgr(root: Path, cmd: str, arg: Any = None, **kw: Any) -> Any:
    return client.call_mgr(str(root), cmd, arg, **kw)


def child(root: Path, name: str) -> dict[str, Any] | None:
    return mgr(root, "status")[1]["queues"].get(name)


def wait_child(root: Path, name: str, state: str) -> dict[str, Any]:
    def ready() -> dict[str, Any] | None:
        c = child(root, name)
        if c is None or c["state"] != state:
            return None
        if state == "RUNNING":
            try:
                return c if client.call_queue(str(root), name, "ping") == ["pong"] else None
            except Exception:
                return None
        return c
    return wait_for(ready, 30, 0.05, what=f"queue {name} {state}")


def msg_id_at(epoch: float) -> str:
    return new_msg_id(epoch, next(_seq))


def plant(root: Path, queue: str, state: str, fields: dict[str, Any] | None = None, *,
          epoch: float | None = None, status: str | None = None,
          attach: dict[str, bytes] | None = None) -> str:
    """Write one message directory by hand (S4.6) and return its short id."""
    epoch = time.time() - 5 if epoch is None else epoch
    msg_id = msg_id_at(epoch)
    qdir = root / "queue" / queue / state
    path = qdir / msg_id
    if state in ("done", "relayed"):
        path = qdir / msg_id[0:8] / msg_id[9:11] / msg_id[11:13] / msg_id
    path.mkdir(parents=True)
    stored = {"msg_id": msg_id, "dest": queue, "due": int(epoch), "count": 0, "max_count": 15,
              **(fields or {})}
    (path / "msg").write_text(json.dumps(stored))
    if status is not None:
        (path / "status").write_text(json.dumps({"job_status": status}))
    for att_name, data in (attach or {}).items():
        (path / "attach").mkdir(exist_ok=True)
        (path / "attach" / att_name).write_bytes(data)
    return msg_id


def new_queue(root: Path, name: str, *, script: str | Path | None = None, paused: bool = False,
              **cfg: Any) -> Path:
    """A queue directory made by hand (`start` has the manager load it)."""
    if script is None:
        script = root.parent / "done.sh"
    qdir = make_queue(root, name, script=script, **cfg)
    if paused:
        (root / "config" / f"{name}.pause").write_text("")
    return qdir


def start(root: Path, name: str) -> dict[str, Any]:
    assert mgr(root, "reload") == ["ok"]
    return wait_child(root, name, "RUNNING")


def qcall(root: Path, name: str, cmd: str, arg: Any = None) -> Any:
    return client.call_queue(str(root), name, cmd, arg)


def get_json(client_: Any, url: str, status: int = 200) -> Any:
    resp = client_.get(url)
    assert resp.status_code == status, (url, resp.status_code, resp.get_data(as_text=True))
    assert resp.mimetype == "application/json"
    return resp.get_json()


def get_text(client_: Any, url: str, status: int = 200) -> str:
    resp = client_.get(url)
    assert resp.status_code == status, (url, resp.status_code, resp.get_data(as_text=True))
    assert resp.headers["Content-Type"] == "text/plain; charset=utf-8"
    return resp.get_data(as_text=True)


def flag(root: Path, name: str, kind: str) -> Path:
    return root / "config" / f"{name}.{kind}"


# ---------------------------------------------------------------- routes 6, 7


def test_q_txt_lists_every_queue_sorted(client: Any, mgr_root: Path) -> None:
    new_queue(mgr_root, "cleaner")
    new_queue(mgr_root, "aa_first")
    start(mgr_root, "aa_first")
    text = get_text(client, "/q.txt")
    lines = text.splitlines(keepends=True)
    assert all(line.endswith("\n") for line in lines)
    names = [line[len("/q/"):-len(".txt\n")] for line in lines]
    assert all(line == f"/q/{n}.txt\n" for line, n in zip(lines, names))
    assert names == sorted(names)
    assert {"aa_first", "cleaner", "test"} <= set(names)


def test_q_txt_with_relative_root(mgr_root: Path) -> None:
    from rq.web import create_app
    main = dataclasses.replace(load_main_config(str(mgr_root)), relative_root="/therq/")
    c = create_app(main=main).test_client()
    text = get_text(c, "/therq/q.txt")
    assert "/therq/q/test.txt\n" in text.splitlines(keepends=True)


def test_q_json_shape_and_order(client: Any, mgr_root: Path) -> None:
    new_queue(mgr_root, "relay")
    new_queue(mgr_root, "zz_last_custom")
    start(mgr_root, "relay")
    wait_child(mgr_root, "zz_last_custom", "RUNNING")
    body = get_json(client, "/q.json")
    assert list(body) == ["status", "ping", "pid", "uptime", "version", "time", "queues"]
    assert body["status"] == "OPERATIONAL" and body["ping"] == "pong"
    assert body["pid"] == int((mgr_root / "config" / "queuemgr.pid").read_text())
    assert isinstance(body["uptime"], int) and body["version"] == "0.1.0"
    assert abs(body["time"] - time.time()) < 5 and isinstance(body["time"], int)
    names = [q["name"] for q in body["queues"]]
    builtin = [n for n in names if n in ("cleaner", "relay", "rq_router", "webhook")]
    assert names == sorted(set(names) - set(builtin)) + sorted(builtin)
    assert names.index("zz_last_custom") < names.index("relay")
    entry = body["queues"][names.index("test")]
    assert list(entry) == ["name", "status", "ping", "pid", "uptime", "counts"]
    assert entry["status"] == "UP" and entry["ping"] == "pong"
    assert entry["pid"] == child(mgr_root, "test")["pid"]
    assert isinstance(entry["uptime"], int)
    assert list(entry["counts"]) == ["prep", "que", "run", "err", "done", "relayed"]


def test_fatal_queue_shows_supervision_state_and_disk_counts(client: Any, mgr_root: Path) -> None:
    qdir = mgr_root / "queue" / "broken"
    for s in STATES:
        (qdir / s).mkdir(parents=True)
    (qdir / "config.json").write_text(json.dumps({"name": "broken", "num_workers": 500}))
    plant(mgr_root, "broken", "que", {"due": 200})
    plant(mgr_root, "broken", "que", {"due": 100})
    for _ in range(3):
        plant(mgr_root, "broken", "done")
    plant(mgr_root, "broken", "relayed", epoch=time.time() - 86400)
    plant(mgr_root, "broken", "err")
    assert mgr(mgr_root, "reload") == ["ok"]
    wait_child(mgr_root, "broken", "FATAL")
    body = get_json(client, "/q.json")
    entry = next(q for q in body["queues"] if q["name"] == "broken")
    assert entry == {"name": "broken", "status": "FATAL", "ping": None, "pid": None,
                     "uptime": None,
                     "counts": {"prep": 0, "que": 2, "run": 0, "err": 1, "done": 3, "relayed": 1}}
    assert get_json(client, "/q/broken.json") == {"status": "FATAL"}
    assert get_text(client, "/q/broken.txt") == "status: FATAL\n"
    # Search and reads work from disk: que in scheduling order (due, id).
    found = get_json(client, "/search?name=broken&query[state]=que")
    assert [m["due"] for m in found] == [100, 200]
    stored = json.loads((qdir / "config.json").read_text())
    assert get_json(client, "/q/broken/config.json") == stored
    resp = client.get("/q/broken/config")
    assert resp.status_code == 500
    assert "num_workers" in resp.get_data(as_text=True)


def test_stopped_queue_not_supervised(client: Any, mgr_root: Path) -> None:
    """A queue directory the manager has not loaded yet: no process answers."""
    new_queue(mgr_root, "not_loaded", num_workers="3")
    plant(mgr_root, "not_loaded", "prep")
    body = get_json(client, "/q.json")
    entry = next(q for q in body["queues"] if q["name"] == "not_loaded")
    assert entry["status"] == "STOPPING" and entry["pid"] is None
    assert entry["counts"]["prep"] == 1
    config = get_json(client, "/q/not_loaded/config")
    assert config["num_workers"] == 3 and config["exec_prefix"] == ""
    assert list(config) == ["name", "script", "num_workers", "exec_prefix", "env_vars",
                            "coalesce_params", "blocking_params", "schedule", "timeout",
                            "kill_grace", "mode", "topic", "lease_timeout"]


# ---------------------------------------------------------------- routes 9a, 9b, 10


def test_queue_txt_and_json_full_forms(client: Any, mgr_root: Path) -> None:
    new_queue(mgr_root, "counts", paused=True)
    now = time.time()
    for i in range(4):
        plant(mgr_root, "counts", "done", epoch=now - 100 + i)
    plant(mgr_root, "counts", "prep")
    ques = [plant(mgr_root, "counts", "que", {"due": now + 60 * (3 - i)}) for i in range(3)]
    plant(mgr_root, "counts", "err")
    relayed = plant(mgr_root, "counts", "relayed", {"dest": "http://h:1/q/x"},
                    status="http://h:1/q/x/20200101.0000.00.000.1")
    start(mgr_root, "counts")
    text = get_text(client, "/q/counts.txt")
    uptime = text.splitlines()[1]
    assert uptime.startswith("uptime: ") and uptime[8:].isdigit()
    assert text == (f"status: PAUSE\n{uptime}\n\nprep: 1\nque: 3\nrun: 0\n\n"
                    "done: 4\nerr: 1\nrelayed: 1\n")
    body = get_json(client, "/q/counts.json?limit=2")
    assert list(body) == ["status", "ping", "pid", "uptime", "time", "prep_size", "que_size",
                          "run_size", "done_size", "err_size", "relayed_size", "messages",
                          "schedule"]
    assert body["status"] == "PAUSE" and body["ping"] == "pong"
    assert body["pid"] == child(mgr_root, "counts")["pid"]
    sizes = {k: v for k, v in body.items() if k.endswith("_size")}
    assert sizes == {"prep_size": 1, "que_size": 3, "run_size": 0, "done_size": 4,
                     "err_size": 1, "relayed_size": 1}
    lists = body["messages"]
    assert list(lists) == ["prep", "que", "run", "done", "err", "relayed"]
    assert [m["msg_id"] for m in lists["que"]] == ques[::-1][:2]  # due order, cut to limit
    assert set(lists["que"][0]) == {"msg_id", "due", "dest"}
    assert len(lists["done"]) == 2 and set(lists["done"][0]) == {"msg_id"}
    assert lists["relayed"] == [{"msg_id": relayed, "dest": "http://h:1/q/x",
                                 "status": "relayed - http://h:1/q/x/20200101.0000.00.000.1",
                                 "new_msg": "http://h:1/q/x/20200101.0000.00.000.1"}]
    assert body["schedule"] == []
    default = get_json(client, "/q/counts.json")
    assert len(default["messages"]["done"]) == 4


def test_down_and_pause_forms(client: Any, mgr_root: Path) -> None:
    new_queue(mgr_root, "flags", paused=True)
    msg = plant(mgr_root, "flags", "err")
    start(mgr_root, "flags")
    assert get_text(client, "/q/flags.txt").startswith("status: PAUSE\nuptime: ")
    assert mgr(mgr_root, "down_queue", "flags", raw=True) == ["ok", "flags"]
    try:
        assert get_json(client, "/q/flags.json") == {"status": "DOWN"}
        assert get_text(client, "/q/flags.txt") == "status: DOWN\n"
        entry = next(q for q in get_json(client, "/q.json")["queues"] if q["name"] == "flags")
        assert entry["status"] == "DOWN" and entry["counts"]["err"] == 1
        for url in (f"/q/flags/{msg}.json", f"/q/flags/{msg}/state.json"):
            assert get_json(client, url, 503) == ["fail", DOWN_TEXT]
        assert get_json(client, "/q/flags/config")["name"] == "flags"
    finally:
        assert mgr(mgr_root, "up_queue", "flags", raw=True) == ["ok", "flags"]
    assert get_json(client, f"/q/flags/{msg}/state.json") == ["err"]


def test_running_entries_carry_live_status(client: Any, mgr_root: Path, tmp_path: Path) -> None:
    script = write_script(tmp_path / "hold.sh", HOLD_SCRIPT)
    new_queue(mgr_root, "holding", script=script)
    start(mgr_root, "holding")
    release = tmp_path / "release"
    full = qcall(mgr_root, "holding", "create_message",
                 {"dest": "holding", "param2": str(release)})[1]
    try:
        def running() -> Any:
            run = get_json(client, "/q/holding.json")["messages"]["run"]
            return run if run and run[0]["status"] == "holding" else None
        run = wait_for(running, 10, 0.05, what="live status")
        assert run == [{"msg_id": full.rsplit("/", 1)[1], "status": "holding",
                        "dest": "holding"}]
        found = get_json(client, "/search?name=holding&query[state]=run")
        assert [m["status"] for m in found] == ["run - holding"]
    finally:
        release.write_text("")
    short = full.rsplit("/", 1)[1]
    wait_for(lambda: get_json(client, f"/q/holding/{short}/state.json") == ["done"], 10, 0.05)


def test_done_json_limits(client: Any, mgr_root: Path) -> None:
    new_queue(mgr_root, "dones", paused=True)
    now = time.time()
    ids = [plant(mgr_root, "dones", "done", epoch=now - 7200 + 61 * i) for i in range(12)]
    start(mgr_root, "dones")
    newest_first = ids[::-1]
    assert get_json(client, "/q/dones/done.json") == newest_first[:10]
    assert get_json(client, "/q/dones/done.json?limit=3") == newest_first[:3]
    assert get_json(client, "/q/dones/done.json?limit=50") == newest_first
    assert get_json(client, "/q/dones/done.json?limit=bogus") == newest_first[:10]


def test_schedule_next_and_last(client: Any, mgr_root: Path) -> None:
    now = time.time()
    year = datetime.now(timezone.utc).year
    last_jan1 = datetime(year, 1, 1, tzinfo=timezone.utc).timestamp()
    next_jan1 = datetime(year + 1, 1, 1, tzinfo=timezone.utc).timestamp()
    local_year = datetime.now().year
    local_next = datetime(local_year + 1, 1, 1).timestamp()  # server-local midnight
    if min(now - last_jan1, now - datetime(local_year, 1, 1).timestamp()) < 120:
        pytest.skip("too close to the new year for a stable expectation")
    schedule = [{"cron": "0 0 1 1 *", "id": "yearly", "tz": "UTC"},
                {"cron": "0 9 1 1 *", "tz": "Asia/Tokyo", "param1": "p"},
                {"cron": "@yearly"}]
    new_queue(mgr_root, "cron", schedule=schedule, paused=True)
    keyless = json.dumps({"cron": "0 9 1 1 *", "param1": "p", "tz": "Asia/Tokyo"},
                         separators=(",", ":"), sort_keys=True)
    (mgr_root / "queue" / "cron" / "cron.state.json").write_text(json.dumps({
        "yearly": {"last_fire": last_jan1, "last_msg_id": None},
        keyless: {"last_fire": last_jan1, "last_msg_id": None}}))
    start(mgr_root, "cron")
    got = get_json(client, "/q/cron.json")["schedule"]
    assert [(e["cron"], e["id"]) for e in got] == [
        ("0 0 1 1 *", "yearly"), ("0 9 1 1 *", None), ("@yearly", None)]
    assert got[0]["next"] == next_jan1 and got[0]["last"] == last_jan1
    # 09:00 in Tokyo on 1 January is 00:00 UTC.
    assert got[1]["next"] == next_jan1 and got[1]["last"] == last_jan1
    assert got[1]["tz"] == "Asia/Tokyo" and got[1]["param1"] == "p"
    assert got[2]["next"] == local_next and got[2]["last"] is None
    assert all(isinstance(e["next"], int) for e in got)


# ---------------------------------------------------------------- route 8


def test_search_filters_order_and_limit(client: Any, mgr_root: Path) -> None:
    new_queue(mgr_root, "find", paused=True)
    t = time.time() - 1000
    prep = plant(mgr_root, "find", "prep", {"param1": "alpha"}, epoch=t)
    que_late = plant(mgr_root, "find", "que", {"param1": "alphabet", "due": t + 50}, epoch=t + 1)
    que_early = plant(mgr_root, "find", "que", {"param1": "alpha", "due": t + 10}, epoch=t + 2)
    err = plant(mgr_root, "find", "err", {"param1": "alpha", "count": 2}, epoch=t + 3,
                status="by design")
    done_old = plant(mgr_root, "find", "done", {"param1": "alpha"}, epoch=t + 4)
    done_new = plant(mgr_root, "find", "done", {"param1": "beta", "count": 12}, epoch=t + 200)
    relayed = plant(mgr_root, "find", "relayed", {"param1": "alpha"}, epoch=t + 5)
    start(mgr_root, "find")

    def ids(query: str) -> list[str]:
        return [m["msg_id"] for m in get_json(client, "/search?name=find" + query)]

    assert ids("") == [prep, que_early, que_late, err, done_new, done_old, relayed]
    assert ids("&query[param1]=alpha") == [prep, que_early, que_late, err, done_old, relayed]
    assert ids("&query[param1]=alpha&exact") == [prep, que_early, err, done_old, relayed]
    assert ids("&query[param1]=alpha&exact=1") == [prep, que_early, err, done_old, relayed]
    assert ids("&query[param1]=alpha&exact=false") == ids("&query[param1]=alpha")
    assert ids("&query[param1]=alpha&exact=0") == ids("&query[param1]=alpha")
    assert ids("&query[count]=2") == [err, done_new]          # non-strings as JSON text
    assert ids("&query[count]=2&exact=true") == [err]
    assert ids("&query[status]=by%20design") == [err]           # computed fields count
    assert ids("&query[param1]=alpha&query[state]=done") == [done_old]
    assert ids("&query[param2]=") == []                      # the field must exist
    assert ids("&query[param1]=a&limit=2") == [prep, que_early]
    found = get_json(client, "/search?name=find&query[msg_id]=" + err)
    assert found[0]["path"] == f"queue/find/err/{err}" and found[0]["state"] == "err"
    assert found[0]["status"] == "err - by design"
    assert get_json(client, "/search?name=nosuch", 404) == ["fail", "Queue not found"]
    assert get_json(client, "/search", 404) == ["fail", "Queue not found"]


# ---------------------------------------------------------------- routes 15-18


def test_config_file_as_stored(client: Any, mgr_root: Path) -> None:
    qdir = new_queue(mgr_root, "rawcfg")
    raw = json.dumps({"name": "rawcfg", "script": str(mgr_root.parent / "done.sh"),
                      "exec_prefix": "", "custom_key": [1, 2]}, indent=3)
    (qdir / "config.json").write_text(raw)
    resp = client.get("/q/rawcfg/config.json")
    assert resp.status_code == 200 and resp.mimetype == "application/json"
    assert resp.get_data(as_text=True) == raw
    start(mgr_root, "rawcfg")
    config = get_json(client, "/q/rawcfg/config")
    assert "custom_key" not in config and config["num_workers"] == 1
    assert config["topic"] == "rawcfg"
    (qdir / "config.json").unlink()
    (qdir / "config.json").symlink_to(qdir / "missing.json")
    assert get_json(client, "/q/rawcfg/config.json", 404) == [
        "fail", "Queue config for 'rawcfg' not found"]


def test_message_as_read_and_state(client: Any, mgr_root: Path) -> None:
    new_queue(mgr_root, "reads", paused=True)
    msg = plant(mgr_root, "reads", "done", {"param1": "x"}, status="done sleeping",
                attach={"data.csv": b"a,b\n"})
    prep = plant(mgr_root, "reads", "prep")
    start(mgr_root, "reads")
    body = get_json(client, f"/q/reads/{msg}.json")
    assert body["msg_id"] == msg and body["param1"] == "x"
    assert body["state"] == "done" and body["status"] == "done - done sleeping"
    assert body["path"] == f"queue/reads/done/{msg[0:8]}/{msg[9:11]}/{msg[11:13]}/{msg}"
    att = body["_attachments"]["data.csv"]
    assert att["size"] == 4 and att["md5"] == hashlib.md5(b"a,b\n").hexdigest()
    assert att["path"] == str(mgr_root / body["path"] / "attach" / "data.csv")
    assert "_attachments" not in get_json(client, f"/q/reads/{prep}.json")
    assert get_json(client, f"/q/reads/{msg}/state.json") == ["done"]
    assert get_json(client, f"/q/reads/{prep}/state.json") == ["prep"]
    missing = msg_id_at(time.time())
    for url in (f"/q/reads/{missing}.json", f"/q/reads/{missing}/state.json",
                "/q/reads/not-an-id.json", "/q/reads/not-an-id/state.json"):
        assert get_json(client, url, 404) == ["fail", "Message ID not found"]
    assert get_json(client, f"/q/nosuch/{msg}.json", 404) == ["fail", "Queue not found"]


def test_attachment_md5(client: Any, mgr_root: Path) -> None:
    new_queue(mgr_root, "md5q", paused=True)
    msg = plant(mgr_root, "md5q", "err", attach={"blob": b"\x00\x01payload"})
    start(mgr_root, "md5q")
    att = get_json(client, f"/q/md5q/{msg}.json")["_attachments"]["blob"]
    assert att == {"md5": hashlib.md5(b"\x00\x01payload").hexdigest(), "size": 9,
                   "path": str(mgr_root / "queue/md5q/err" / msg / "attach/blob")}


def test_fixed_names_win_over_message_ids(client: Any) -> None:
    assert isinstance(get_json(client, "/q/test/done.json"), list)
    assert get_json(client, "/q/test/config")["name"] == "test"
    assert get_json(client, "/q/test/config.json")["name"] == "test"


# ---------------------------------------------------------------- 404s, HEAD, route 28


@pytest.mark.parametrize("url", [
    "/q/nosuch.json", "/q/nosuch.txt", "/q/nosuch/done.json", "/q/nosuch/config",
    "/q/nosuch/config.json", "/q/nosuch/20200101.0000.00.000.1.json",
    "/q/nosuch/20200101.0000.00.000.1/state.json", "/q/bad name.json", "/q/a+b.txt",
    "/q/a%25b/config.json", "/q/test.deleted.1.json", "/search?name=a;b",
])
def test_unknown_or_invalid_queue_is_404(client: Any, url: str) -> None:
    resp = client.get(url)
    assert resp.status_code == 404
    if ".txt" in url:
        assert resp.get_data(as_text=True) == "404 - Queue not found"
    elif ".json" in url or url.startswith("/search"):
        assert resp.get_json() == ["fail", "Queue not found"]
    else:
        assert "404 - Queue not found" in resp.get_data(as_text=True)


def test_head_works(client: Any) -> None:
    for url in ("/q.json", "/q.txt", "/q/test.json", "/q/test.txt", "/metrics"):
        get = client.get(url)
        head = client.head(url)
        assert head.status_code == 200 and head.get_data() == b""
        assert head.headers["Content-Type"] == get.headers["Content-Type"]


def test_timers_json_before_and_with_timers(client: Any, app: Any, mgr_root: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    body = get_json(client, "/timers.json")
    assert set(body) == {"timers", "sent", "errors"}
    assert isinstance(body["timers"], list)
    backend = app.config["RQ_BACKEND"]
    real = backend.mgr
    replies = {"timers": ["ok", [["tick", 1700000000], ["gone", 1700000100]]],
               "timers_status": ["ok", {"sent": 4, "errors": 1}]}
    monkeypatch.setattr(backend, "mgr",
                        lambda cmd, *a, **kw: replies.get(cmd) or real(cmd, *a, **kw))
    (mgr_root / "timers" / "tick.json").write_text(json.dumps(
        {"period": 60, "msg": {"dest": "test", "param1": "x"}}))
    try:
        assert get_json(client, "/timers.json") == {
            "timers": [{"name": "tick", "due": 1700000000, "period": 60, "dest": "test"},
                       {"name": "gone", "due": 1700000100, "period": None, "dest": None}],
            "sent": 4, "errors": 1}
    finally:
        os.unlink(mgr_root / "timers" / "tick.json")


# ---------------------------------------------------------------- performance


def test_queue_json_fast_with_100k_done(client: Any, mgr_root: Path) -> None:
    """S15.3's fix: a queue page poll does not walk the done hashdir."""
    new_queue(mgr_root, "big")
    base = mgr_root / "queue" / "big" / "done"
    now = time.time() - 86400
    for i in range(100_000):
        msg_id = msg_id_at(now + i * 0.5)
        os.makedirs(base / msg_id[0:8] / msg_id[9:11] / msg_id[11:13] / msg_id)
    start(mgr_root, "big")
    get_json(client, "/q/big.json")
    times = []
    for _ in range(15):
        t0 = time.perf_counter()
        body = get_json(client, "/q/big.json")
        times.append(time.perf_counter() - t0)
    assert body["done_size"] == 100_000 and len(body["messages"]["done"]) == 100
    assert statistics.median(times) < 0.1, times
    # The largest tree of the suite's temp files, removed here while the other xdist workers
    # run (the removal waits on the disk more than it uses the CPU), not at the run's end.
    subprocess.run(["rm", "-rf", *(str(day) for day in base.iterdir())], check=True)
