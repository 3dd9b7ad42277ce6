"""Pull consumers end to end (SPEC S8.1-S8.7, S15 route 30, S19): a real rq-mgr
with its queues and web server, and real consumer processes (Python with
rq.consumer, and plain shell with curl) over the manager socket and HTTP."""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from rqtest import REPO, make_queue, read_events, short_id, wait_for, write_script
from webtest import build_root, running

from rq import client

TABLE_QUEUES = {"venc": "video.encode", "vthumb": "video.thumbs", "vhd": "video.encode.hd",
                "video": None, "audio": None}   # None: the default topic, the queue's name


class Site:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.port = json.loads((root / "config" / "config.json").read_text())["port"]
        self.url = f"http://127.0.0.1:{self.port}/"

    def mgr(self, cmd: str, arg: Any, timeout: float = 60) -> Any:
        return client.call_mgr(str(self.root), cmd, arg, timeout=timeout)

    def http(self, cmd: str, arg: Any, timeout: float = 60) -> Any:
        resp = requests.post(self.url + "consumer/" + cmd, json=arg, timeout=timeout)
        assert resp.status_code == 200, resp.text
        assert resp.headers["Content-Type"].startswith("application/json")
        return resp.json()

    def call(self, transport: str, cmd: str, arg: Any, timeout: float = 60) -> Any:
        return (self.mgr if transport == "socket" else self.http)(cmd, arg, timeout)

    def queue(self, name: str, cmd: str, arg: Any = None) -> Any:
        return client.call_queue(str(self.root), name, cmd, arg)

    def create(self, name: str, **fields: Any) -> str:
        fields.setdefault("dest", name)
        reply = self.queue(name, "create_message", fields)
        assert reply[0] == "ok", reply
        return reply[1]

    def state(self, full: str) -> str:
        return self.queue(full.split("/q/")[1].split("/")[0], "get_message_state",
                          {"msg_id": full})[1]

    def message(self, full: str) -> dict[str, Any]:
        return self.queue(full.split("/q/")[1].split("/")[0], "get_message",
                          {"msg_id": full})[1]


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    root = build_root(tmp_path_factory.mktemp("pull"))
    for name, topic in TABLE_QUEUES.items():
        make_queue(root, name, mode="pull", **({"topic": topic} if topic else {}))
    make_queue(root, "work", mode="pull", topic="work.jobs", num_workers=8, lease_timeout=30)
    make_queue(root, "copies", mode="pull", topic="copies")
    make_queue(root, "kill", mode="pull", topic="kill.me", lease_timeout=2)
    make_queue(root, "lat", mode="pull", topic="lat.x")
    make_queue(root, "lat2", mode="pull", topic="lat.y")
    with running(root):
        yield Site(root)


def drain(site: Site, transport: str, patterns: list[str]) -> list[dict[str, Any]]:
    """Reserve until nothing is left, finishing each message; the RES list."""
    got = []
    while True:
        reply = site.call(transport, "reserve", {"patterns": patterns, "consumer": "drain"})
        assert reply[0] == "ok", reply
        if reply[1] is None:
            return got
        got.append(reply[1])
        done = site.call(transport, "report", {"msg_id": reply[1]["full_msg_id"],
                                               "token": reply[1]["token"], "line": "done"})
        assert done == ["ok", "done"], done


@pytest.mark.parametrize("transport", ["socket", "http"])
@pytest.mark.parametrize("patterns,expected", [
    (["video.*"], {"venc", "vthumb"}),
    (["video.#"], {"venc", "vthumb", "vhd", "video"}),
    (["video.encode.#"], {"venc", "vhd"}),
    (["*.encode"], {"venc"}),
    (["*"], {"video", "audio"}),
    (["#"], {"venc", "vthumb", "vhd", "video", "audio"}),
    (["video.encode.hd"], {"vhd"}),
    (["audio.#"], {"audio"}),
    (["video.encode", "audio"], {"venc", "audio"}),
    (["nomatch.*"], set()),
    (["test"], set()),                       # a script-mode queue never hands out leases
])
def test_s8_1_s8_7_wildcard_matching_table(site: Site, transport: str, patterns: list[str],
                                           expected: set[str]) -> None:
    created = {name: site.create(name) for name in TABLE_QUEUES}
    got = drain(site, transport, patterns)
    assert {res["queue"] for res in got} == expected
    assert len(got) == len(expected)
    for res in got:
        assert res["full_msg_id"] == created[res["queue"]]
        assert site.state(res["full_msg_id"]) == "done"
    drain(site, "socket", ["#"])            # leave the table queues empty


@pytest.mark.parametrize("transport", ["socket", "http"])
def test_s8_2_fairest_by_due_then_id_over_all_matching_queues(site: Site,
                                                              transport: str) -> None:
    now = time.time()
    order = [site.create("vthumb", due=now - 30), site.create("venc", due=now - 20),
             site.create("vthumb", due=now - 20), site.create("venc", due=now - 10)]
    order[1:3] = sorted(order[1:3], key=short_id)   # equal due: the smaller short id first
    got = drain(site, transport, ["video.*"])
    assert [res["full_msg_id"] for res in got] == order


@pytest.mark.parametrize("bad", ["video.#.x", "", "a..b", "vi deo", "#.x"])
def test_s8_1_invalid_patterns(site: Site, bad: str) -> None:
    assert site.mgr("reserve", {"patterns": [bad]}) == ["fail", f"invalid pattern: {bad}"]
    assert site.http("reserve", {"patterns": ["ok", bad]}) == ["fail", f"invalid pattern: {bad}"]


def test_s8_4_socket_failures(site: Site) -> None:
    assert site.mgr("reserve", {}) == ["fail", "missing patterns"]
    assert site.mgr("reserve", {"patterns": ["a"], "lease": 0}) == ["fail", "invalid lease"]
    assert site.mgr("reserve", {"patterns": ["a"], "wait": 61}) == ["fail", "invalid wait"]
    assert site.mgr("reserve", {"patterns": ["a"], "consumer": "x" * 201}) == \
        ["fail", "invalid consumer"]
    assert site.mgr("report", {"token": "t", "line": "done"}) == ["fail", "missing msg_id"]
    full = site.create("audio")
    assert site.mgr("report", {"msg_id": full, "line": "done"}) == ["fail", "missing token"]
    assert site.mgr("report", {"msg_id": full, "token": "t"}) == ["fail", "missing line"]
    assert site.mgr("renew", {"msg_id": full}) == ["fail", "missing token"]
    assert site.mgr("report", {"msg_id": full, "token": "t", "line": "done"}) == \
        ["fail", "lease not held"]
    gone = full.replace("/q/audio/", "/q/nosuch/")
    assert site.mgr("report", {"msg_id": gone, "token": "t", "line": "done"}) == \
        ["fail", "msg not found"]
    # Another id of the same queue: the last two digits changed (never to full's own).
    other = full[:-2] + ("78" if full.endswith("77") else "77")
    assert site.mgr("renew", {"msg_id": other, "token": "t"}) == ["fail", "msg not found"]
    script_msg = site.create("test")
    wait_for(lambda: site.state(script_msg) == "done", 30)
    assert site.mgr("report", {"msg_id": script_msg, "token": "t", "line": "done"}) == \
        ["fail", "queue is not in pull mode"]
    drain(site, "socket", ["audio"])


def test_s8_5_http_bodies_missing_fields_and_csrf(site: Site) -> None:
    url = site.url + "consumer/"
    for cmd, body, field in [("reserve", {}, "patterns"), ("report", {"msg_id": "x"}, "token"),
                             ("report", {"msg_id": "x", "token": "t"}, "line"),
                             ("renew", {"token": "t"}, "msg_id")]:
        for kw in ({"json": body}, {"data": body}):
            resp = requests.post(url + cmd, timeout=30, **kw)  # type: ignore[arg-type]
            assert resp.status_code == 400, (cmd, kw, resp.text)
            assert resp.json() == ["fail", f"missing {field}"]
    resp = requests.post(url + "reserve", data="{nope", timeout=30,
                         headers={"Content-Type": "application/json"})
    assert resp.status_code == 400 and resp.json()[0] == "fail"
    # form fields: `pattern` repeated, each value a comma-separated list
    a, b = site.create("audio"), site.create("vhd")
    got = []
    for _ in range(2):
        resp = requests.post(url + "reserve", data={"pattern": ["nomatch,audio", "video.#"],
                                                    "consumer": "form", "lease": "30"},
                             timeout=30)
        res = resp.json()[1]
        got.append(res["full_msg_id"])
        assert requests.post(url + "report", data={"msg_id": res["full_msg_id"],
                                                   "token": res["token"], "line": "done form"},
                             timeout=30).json() == ["ok", "done"]
    assert sorted(got) == sorted([a, b])
    assert site.message(a)["status"] == "done - form"
    resp = requests.post(url + "reserve", json={"patterns": ["#"]}, timeout=30,
                         headers={"Origin": "http://evil.example"})
    assert resp.status_code == 403
    assert resp.json() == ["fail", "Cross-origin request refused"]


def test_s8_3_renew_and_run_over_http(site: Site) -> None:
    full = site.create("video")
    res = site.http("reserve", {"patterns": ["video"], "lease": 5})[1]
    renewed = site.http("renew", {"msg_id": full, "token": res["token"], "lease": 100})
    assert renewed[0] == "ok" and renewed[1] > time.time() + 90
    assert site.http("report", {"msg_id": full, "token": res["token"], "line": "run 50%"}) == \
        ["ok", "run"]
    run = site.queue("video", "messages", {"state": "run"})
    assert run == [{"msg_id": short_id(full), "status": "50%", "dest": "video",
                    "consumer": "anonymous", "lease_expires": run[0]["lease_expires"]}]
    assert site.http("renew", {"msg_id": full, "token": "bad"}) == ["fail", "lease not held"]
    # the dashboard shows who holds the lease and when it expires
    page = requests.get(site.url + "q/video.json", timeout=30).json()
    assert page["messages"]["run"][0]["consumer"] == "anonymous"
    html = requests.get(site.url + "q/video", timeout=30).text
    assert 'leased by <b class="consumer">anonymous</b>, expires <time' in html
    assert site.http("report", {"msg_id": full, "token": res["token"], "line": "err no"}) == \
        ["ok", "err"]
    xss = site.create("video")
    held = site.mgr("reserve", {"patterns": ["video"], "consumer": "<b>x</b>", "lease": 60})[1]
    assert held["full_msg_id"] == xss
    html = requests.get(site.url + "q/video", timeout=30).text
    assert "leased by <b class=\"consumer\">&lt;b&gt;x&lt;/b&gt;</b>" in html
    assert site.mgr("report", {"msg_id": xss, "token": held["token"], "line": "done"}) == \
        ["ok", "done"]


# ---------------------------------------------------------------- consumer processes

PY_CONSUMER = r'''
import json, os, sys
sys.path.insert(0, sys.argv[1])
from rq.consumer import consume
kw = json.loads(sys.argv[2])
for job in consume(["work.*"], burst=True, wait=2, **kw):
    job.run("working on " + job.short_id)
    if job.params[0] == "dup":
        job.dup("copies")
    if job.params[0] == "resend" and job.msg["count"] == 0:
        job.resend(0, "again")
        continue
    job.done("py " + job.env["RQ_MSG_ID"])
'''

SH_CONSUMER = r'''#!/bin/sh
# A pull consumer in plain shell with curl (docs/notes/pull.md): take every
# message of the topics matching work.*, report it done, stop when idle.
base=$1
while :; do
  res=$(curl -sS -X POST -d 'pattern=work.*' -d wait=2 -d consumer=shell \
        "${base}consumer/reserve") || exit 1
  [ "$res" = '["ok",null]' ] && exit 0
  id=$(printf '%s' "$res" | sed -n 's/.*"full_msg_id":"\([^"]*\)".*/\1/p')
  token=$(printf '%s' "$res" | sed -n 's/.*"token":"\([^"]*\)".*/\1/p')
  [ -n "$id" ] && [ -n "$token" ] || { echo "unexpected reply: $res" >&2; exit 1; }
  curl -sS -X POST --data-urlencode "msg_id=$id" -d "token=$token" \
       --data-urlencode "line=run shell at work" "${base}consumer/report" >/dev/null
  reply=$(curl -sS -X POST --data-urlencode "msg_id=$id" -d "token=$token" \
       --data-urlencode "line=done by shell" "${base}consumer/report")
  [ "$reply" = '["ok","done"]' ] || { echo "report failed: $reply" >&2; exit 1; }
done
'''


def run_consumers(cmds: list[list[str]]) -> None:
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for cmd in cmds]
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, (out, err)


@pytest.mark.parametrize("transport", ["socket", "http"])
def test_python_consumer_processes(site: Site, tmp_path: Path, transport: str) -> None:
    script = tmp_path / "consumer.py"
    script.write_text(PY_CONSUMER)
    kw = {"root": str(site.root)} if transport == "socket" else {"url": site.url}
    ids = [site.create("work", param1=p) for p in ["plain"] * 16 + ["dup", "resend"]]
    run_consumers([[sys.executable, str(script), str(REPO),
                    json.dumps({**kw, "consumer": f"py-{transport}-{i}"})] for i in range(2)])
    for full in ids:
        msg = site.message(full)
        assert msg["state"] == "done" and msg["status"] == f"done - py {short_id(full)}"
    assert site.message(ids[-1])["count"] == 1            # resent once
    copies = drain(site, "socket", ["copies"])
    assert len(copies) == 1 and copies[0]["msg"]["param1"] == "dup"
    consumers = {e.get("consumer") for e in read_events(site.root, "work")
                 if e["to"] == "done" and e["msg_id"] in {short_id(f) for f in ids}}
    assert consumers <= {f"py-{transport}-0", f"py-{transport}-1"} and consumers


def test_shell_curl_consumer_processes(site: Site, tmp_path: Path) -> None:
    script = write_script(tmp_path / "consumer.sh", SH_CONSUMER)
    ids = [site.create("work") for _ in range(12)]
    run_consumers([["/bin/sh", str(script), site.url] for _ in range(2)])
    for full in ids:
        assert site.message(full)["status"] == "done - by shell"
    events = [e for e in read_events(site.root, "work") if e["msg_id"] in
              {short_id(f) for f in ids} and e["to"] == "done"]
    assert len(events) == 12 and {e["consumer"] for e in events} == {"shell"}


KILLED_CONSUMER = r'''
import sys, time
sys.path.insert(0, sys.argv[1])
import json
from rq.consumer import reserve, transport_for
job = reserve(transport_for(**json.loads(sys.argv[2])), ["kill.*"], wait=20, consumer="doomed")
job.run("started")
open(sys.argv[3] + ".tmp", "w").write(job.msg_id)
import os; os.rename(sys.argv[3] + ".tmp", sys.argv[3])
while True:
    time.sleep(1)
'''


@pytest.mark.parametrize("transport", ["socket", "http"])
def test_s8_3_consumer_killed_mid_lease(site: Site, tmp_path: Path, transport: str) -> None:
    script = tmp_path / "doomed.py"
    script.write_text(KILLED_CONSUMER)
    marker = tmp_path / "got"
    full = site.create("kill")
    kw = {"root": str(site.root)} if transport == "socket" else {"url": site.url}
    proc = subprocess.Popen([sys.executable, str(script), str(REPO), json.dumps(kw),
                             str(marker)])
    try:
        wait_for(marker.exists, 30, what="the consumer to take its message")
        assert marker.read_text() == full and site.state(full) == "run"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    wait_for(lambda: site.state(full) == "que", 30, what="the lease to expire")
    msg = site.message(full)
    assert msg["count"] == 1 and msg["status"] == "que - LEASE EXPIRED - MOVING TO QUE"
    got = drain(site, "socket", ["kill.me"])
    assert [res["full_msg_id"] for res in got] == [full]
    assert got[0]["msg"]["count"] == 1 and site.state(full) == "done"


def test_s2_5_lease_survives_restart_queue_over_http(site: Site) -> None:
    full = site.create("vthumb")
    res = site.http("reserve", {"patterns": ["video.thumbs"], "lease": 120})[1]
    pid_file = site.root / "queue" / "vthumb" / "queue.pid"
    before = pid_file.read_text()
    assert client.call_mgr(str(site.root), "restart_queue", "vthumb", raw=True) == \
        ["ok", "vthumb"]
    wait_for(lambda: _restarted(site, pid_file, before), 60, what="vthumb to restart")
    assert site.state(full) == "run"
    assert site.http("report", {"msg_id": full, "token": res["token"], "line": "done later"}) \
        == ["ok", "done"]


def _restarted(site: Site, pid_file: Path, before: str) -> bool:
    try:
        return pid_file.read_text() != before and site.queue("vthumb", "ping") == ["pong"]
    except Exception:
        return False


# ---------------------------------------------------------------- reserve with wait (S8.2)

def measure_wait_latency(site: Site, transport: str, patterns: list[str], queue: str,
                         rounds: int) -> tuple[list[float], list[float]]:
    """Seconds from the commit (the create_message reply; 0 when the grant
    beat it) and from sending create_message, to the waiting reservation's reply."""
    from_commit, from_send = [], []
    for _ in range(rounds):
        got: list[Any] = []

        def waiter() -> None:
            reply = site.call(transport, "reserve", {"patterns": patterns, "wait": 20})
            got.append((reply, time.monotonic()))
        thread = threading.Thread(target=waiter)
        thread.start()
        wait_for(lambda: _waiters(site, patterns) >= 1, 30, interval=0.002,
                 what="the reservation to wait")
        sent = time.monotonic()
        full = site.create(queue)
        committed = time.monotonic()
        thread.join(60)
        reply, at = got[0]
        assert reply[0] == "ok" and reply[1]["full_msg_id"] == full, reply
        from_commit.append(max(0.0, at - committed))
        from_send.append(at - sent)
        site.mgr("report", {"msg_id": full, "token": reply[1]["token"], "line": "done"})
    return from_commit, from_send


def _waiters(site: Site, patterns: list[str]) -> int:
    names = ["lat", "lat2"] if patterns == ["lat.*"] else ["lat"]
    return min(site.queue(n, "lease_waiters")[1] for n in names)


def p99(values: list[float]) -> float:
    return sorted(values)[max(0, int(len(values) * 0.99 + 0.5) - 1)]


@pytest.mark.parametrize("transport,patterns", [("socket", ["lat.x"]), ("socket", ["lat.*"]),
                                                ("http", ["lat.x"])])
def test_s8_2_wait_returns_as_soon_as_a_message_is_committed(site: Site, transport: str,
                                                             patterns: list[str]) -> None:
    lat, from_send = measure_wait_latency(site, transport, patterns, "lat", 30)
    print(f"\nwait latency {transport} {patterns}: commit->reply median "
          f"{statistics.median(lat) * 1000:.1f} ms, p99 {p99(lat) * 1000:.1f} ms; "
          f"create sent->reply p99 {p99(from_send) * 1000:.1f} ms")
    # target p99 <= 20 ms (bench/pull.py reports it); the bound here is generous
    # because other test suites share this machine's two cores
    assert statistics.median(lat) < 0.5 and p99(lat) < 2.0


def test_s8_2_wait_times_out_with_null(site: Site) -> None:
    start = time.monotonic()
    assert site.mgr("reserve", {"patterns": ["nomatch.#"], "wait": 1}) == ["ok", None]
    assert site.http("reserve", {"patterns": ["lat.x"], "wait": 1}) == ["ok", None]
    assert 2 <= time.monotonic() - start < 20


# ---------------------------------------------------------------- CLI (S19)

def rq(site: Site, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(REPO / "bin" / "rq"), "--root", str(site.root), *args],
                          capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, PYTHONPATH=str(REPO)))


def test_s19_reserve_report_renew_commands(site: Site) -> None:
    full = site.create("audio")
    out = rq(site, "reserve", "--pattern", "nomatch", "--pattern", "x,audio", "--lease", "30",
             "--consumer", "cli")
    assert out.returncode == 0 and out.stdout.startswith("ok {"), out
    res = json.loads(out.stdout[3:])
    assert res["full_msg_id"] == full and "\n" not in out.stdout.strip()
    out = rq(site, "renew", "--msg_id", full, "--token", res["token"], "--lease", "60")
    assert out.returncode == 0 and float(out.stdout.split()[1]) > time.time() + 50
    out = rq(site, "report", "--msg_id", full, "--token", "bad", "--line", "done x")
    assert (out.returncode, out.stdout) == (1, "fail lease not held\n")
    out = rq(site, "report", "--msg_id", full, "--token", res["token"], "--line", "done via cli")
    assert (out.returncode, out.stdout) == (0, "ok done\n")
    assert site.message(full)["status"] == "done - via cli"
    assert rq(site, "reserve", "--pattern", "audio").stdout == "ok null\n"
    out = rq(site, "reserve")
    assert (out.returncode, out.stderr) == (1, "rq: missing required argument --pattern\n")
    out = rq(site, "report", "--msg_id", full, "--token", "t")
    assert (out.returncode, out.stderr) == (1, "rq: missing required argument --line\n")


def test_s8_2_wait_with_a_down_queue(site: Site) -> None:
    flag = site.root / "config" / "lat2.down"
    flag.touch()
    try:
        start = time.monotonic()
        assert site.mgr("reserve", {"patterns": ["lat.y"], "wait": 1}) == ["ok", None]
        assert 1 <= time.monotonic() - start < 15
        got: list[Any] = []
        thread = threading.Thread(target=lambda: got.append(
            site.mgr("reserve", {"patterns": ["lat.*"], "wait": 20})))
        thread.start()
        wait_for(lambda: site.queue("lat", "lease_waiters")[1] >= 1, 30,
                 what="the reservation to wait on lat")
        full = site.create("lat")
        thread.join(30)
        assert got and got[0][1]["full_msg_id"] == full
        site.mgr("report", {"msg_id": full, "token": got[0][1]["token"], "line": "done"})
    finally:
        flag.unlink()


@pytest.mark.parametrize("transport", ["socket", "http"])
def test_s8_3_renewed_past_first_expiry_then_expired_token(site: Site, transport: str) -> None:
    from rq.consumer import LeaseError, reserve, transport_for
    tr = transport_for(**({"root": str(site.root)} if transport == "socket" else
                          {"url": site.url}))
    full = site.create("audio")
    job = reserve(tr, ["audio"], lease=2, consumer=f"renewer-{transport}")
    assert job is not None and job.msg_id == full
    first_expiry = job.res["lease_expires"]
    expiry = first_expiry
    while time.time() < first_expiry + 1.5:   # keep renewing past the first expiry
        expiry = job.renew(lease=2)
        assert expiry > time.time()
        wait_for(lambda: time.time() > expiry - 1.3, 5, interval=0.02, what="time to renew")
    assert site.state(full) == "run" and site.message(full)["count"] == 0
    wait_for(lambda: site.state(full) == "que", 30, what="the lease to expire")
    with pytest.raises(LeaseError, match="lease expired"):
        job.done("too late")
    assert site.message(full)["count"] == 1
    drain(site, "socket", ["audio"])


def test_s8_5_basic_auth_applies(site: Site) -> None:
    import base64
    import dataclasses

    from rq.config import load_main_config
    from rq.web import create_app
    main = dataclasses.replace(load_main_config(str(site.root)),
                               basic_auth={"realm": "rq", "users": {"alice": "s3cret"}})
    web = create_app(main=main).test_client()
    resp = web.post("/consumer/reserve", json={"patterns": ["nomatch"]})
    assert resp.status_code == 401 and "WWW-Authenticate" in resp.headers
    good = "Basic " + base64.b64encode(b"alice:s3cret").decode()
    resp = web.post("/consumer/reserve", json={"patterns": ["nomatch"]},
                    headers={"Authorization": good})
    assert resp.status_code == 200 and resp.get_json() == ["ok", None]
