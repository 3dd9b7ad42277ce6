"""Issue 18 item 2: fan-out, one message to every queue whose topic matches a pattern
(S8.1, S8.7), all or nothing (rq.mgr.fanout, rq.queue.fanoutprep; docs/guide/fanout.md).

Against a real rq-mgr with real queue processes, through every interface: the manager
socket's `create_message`, `rq sendmesg --dest PATTERN` (a subprocess), the Python
Client over both transports and `POST ROOTfanout`.  The crash tests kill rq-mgr
(SIGKILL, through its RQ_FANOUT_KILL seam) after each step of a fan-out, on a schedule
drawn from a seeded generator, restart it and check that every matching queue holds its
copy or none does, and that no `ok` was ever sent for a fan-out that did not finish."""

from __future__ import annotations

import json
import os
import random
import subprocess
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import requests
from rqtest import REPO, STATES, make_queue, process_gone, wait_for
from webtest import EnvMgr, Mgr, build_root, install_builtin, running

from rq import Client, client, protocol
from rq.errors import ConnectError
from rq.producer import Refused

SEED = 18  # the crash schedule (issue 18)


def copies(root: Path, name: str) -> dict[str, str]:
    """Every message of queue `name` on disk: short id -> state (done/relayed hashdirs too)."""
    out = {}
    for state in STATES:
        # os.walk skips a directory that vanishes while it walks (a job of an earlier test
        # ending): that message is found in its next state, walked after this one.
        for dirpath, dirnames, filenames in os.walk(root / "queue" / name / state):
            dirnames[:] = [d for d in dirnames if not d.startswith(".")]
            if "msg" in filenames:
                out[os.path.basename(dirpath)] = state
    return out


def journals(root: Path) -> list[Path]:
    d = root / "fanout"
    return sorted(p for p in d.iterdir() if not p.name.startswith(".")) if d.exists() else []


def short(full: str) -> tuple[str, str]:
    name, msg_id = protocol.parse_msg_ref(full)
    assert name is not None
    return name, msg_id


# ---------------------------------------------------------------- one shared rq-mgr


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str]]:
    base = tmp_path_factory.mktemp("fanout")
    root = build_root(base)                       # queue `test`, topic `test`
    done = base / "done.sh"
    make_queue(root, "enc", script=done, topic="video.encode")
    make_queue(root, "thumbs", script=done, topic="video.thumbs", mode="pull")
    make_queue(root, "hd", script=done, topic="video.encode.hd")
    make_queue(root, "daily", script=done, topic="reports.daily")
    make_queue(root, "news_a", script=done, topic="news.a")
    make_queue(root, "news_b", script=done, topic="news.b")
    install_builtin(root, "webhook")              # S3.8: never a fan-out target
    (root / "config" / "news_b.down").write_text("")  # S3.5: refuses new messages
    with running(root, web=True) as web:
        yield root, web.url


def mgr_create(root: Path, fields: dict[str, Any]) -> Any:
    return client.call_mgr(str(root), "create_message", fields)


def test_issue18_fanout_socket_one_copy_per_matching_queue(site: tuple[Path, str]) -> None:
    root, _ = site
    reply = mgr_create(root, {"dest": "video.*", "param1": "a.mov"})
    assert reply[0] == "ok", reply
    refs = [short(full) for full in reply[1]]
    # one copy in each queue whose topic matches, in queue-name order, one shared short id
    assert [name for name, _ in refs] == ["enc", "thumbs"]
    assert len({msg_id for _, msg_id in refs}) == 1
    for name, msg_id in refs:
        msg = client.call_queue(str(root), name, "get_message", {"msg_id": msg_id})[1]
        assert msg["state"] != "prep" and msg["dest"] == "video.*" and msg["param1"] == "a.mov"
    assert msg_id not in copies(root, "hd") and journals(root) == []


@pytest.mark.parametrize("pattern, queues", [
    ("video.#", ["enc", "hd", "thumbs"]),
    ("reports.#", ["daily"]),
    ("video.encode", ["enc"]),
    ("*.encode.*", ["hd"]),
    ("#", ["daily", "enc", "hd", "news_a", "test", "thumbs"]),  # news_b DOWN: see below
])
def test_issue18_fanout_patterns(site: tuple[Path, str], pattern: str,
                                 queues: list[str]) -> None:
    root, _ = site
    down = root / "config" / "news_b.down"
    down.unlink()       # `#` also reaches news_b while it is UP; never the builtin webhook
    try:
        reply = mgr_create(root, {"dest": pattern})
    finally:
        down.write_text("")
    names = [short(full)[0] for full in reply[1]]
    assert reply[0] == "ok" and names == sorted(queues + (["news_b"] if pattern == "#" else []))


@pytest.mark.parametrize("fields, reason", [
    ({"dest": "nothing.*"}, "no queue matches pattern: nothing.*"),
    ({"dest": "video..x"}, "invalid pattern: video..x"),
    ({"dest": "#.video"}, "invalid pattern: #.video"),
    ({"param1": "x"}, 'input missing required "dest" parameter'),
    ({"dest": "video.*", "due": "soon"}, "invalid due value"),
    ({"dest": "news.*"}, "queue news_b: status: DOWN"),
])
def test_issue18_fanout_refusals_leave_no_copy(site: tuple[Path, str], fields: dict[str, Any],
                                               reason: str) -> None:
    """A refusal leaves no copy anywhere: news_a's copy (prepped before news_b refused)
    is removed again before the reply."""
    root, _ = site
    before = {name: set(copies(root, name)) for name in ("enc", "thumbs", "news_a", "news_b")}
    assert mgr_create(root, fields) == ["fail", reason]
    assert {name: set(copies(root, name)) for name in before} == before
    assert journals(root) == []


def test_issue18_fanout_concurrent_fanouts(site: tuple[Path, str]) -> None:
    """Fan-outs at once (rq-mgr's socket threads, its queue-request pool): each gets its
    own id and both copies."""
    root, _ = site
    with ThreadPoolExecutor(8) as pool:
        replies = list(pool.map(lambda i: mgr_create(root, {"dest": "video.*", "param1": i}),
                                range(24)))
    assert all(r[0] == "ok" and [short(i)[0] for i in r[1]] == ["enc", "thumbs"]
               for r in replies), replies
    ids = {short(r[1][0])[1] for r in replies}
    assert len(ids) == 24 and all(short(r[1][1])[1] == short(r[1][0])[1] for r in replies)
    assert ids <= set(copies(root, "enc")) and ids <= set(copies(root, "thumbs"))


def test_issue18_fanout_bad_json_is_a_bad_request(site: tuple[Path, str]) -> None:
    root, _ = site
    assert client.call_mgr(str(root), "create_message", "{nope", raw=True) == \
        ["fail", "bad request"]


def rq_cli(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(REPO / "bin" / "rq"), *args, "--root", str(root)],
                          capture_output=True, text=True, timeout=60)


def test_issue18_fanout_cli_sendmesg(site: tuple[Path, str]) -> None:
    root, url = site
    for extra in ((), ("--url", url)):
        done = rq_cli(root, "sendmesg", "--dest", "video.*", "--param1", "cli", *extra)
        assert done.returncode == 0 and done.stderr == "", done
        lines = done.stdout.splitlines()
        assert [line.split(" ")[0] for line in lines] == ["ok", "ok"]
        assert [short(line.split(" ")[1])[0] for line in lines] == ["enc", "thumbs"]
    refused = rq_cli(root, "sendmesg", "--dest", "nothing.#")
    assert (refused.returncode, refused.stdout) == (1, "fail no queue matches pattern: nothing.#\n")
    prep = rq_cli(root, "prepmesg", "--dest", "video.*")
    assert prep.returncode != 0 and prep.stdout == ""
    assert prep.stderr.strip().splitlines() == [
        "rq: a topic pattern dest (video.*) fans out with sendmesg only"]


@pytest.mark.parametrize("transport", ["socket", "http"])
def test_issue18_fanout_python_client(site: tuple[Path, str], transport: str) -> None:
    root, url = site
    rq = Client(str(root)) if transport == "socket" else Client(url=url)
    ids = rq.fanout("video.*", param1="py", param2={"k": 1})
    assert [short(i)[0] for i in ids] == ["enc", "thumbs"]
    assert all(rq.message(i)["param2"] == '{"k":1}' for i in ids)
    with pytest.raises(Refused, match="no queue matches pattern: nothing"):
        rq.fanout("nothing.*")
    with pytest.raises(Refused, match=r"topic pattern: Client.fanout"):
        rq.send("video.*")


def test_issue18_fanout_http_route(site: tuple[Path, str]) -> None:
    root, url = site
    resp = requests.post(url + "fanout", json={"dest": "reports.#", "param1": "h"}, timeout=60)
    assert resp.status_code == 200 and resp.json()[0] == "ok"
    assert [short(i)[0] for i in resp.json()[1]] == ["daily"]
    form = requests.post(url + "fanout", data={"mesg": json.dumps({"dest": "video.*"})},
                         timeout=60)
    assert form.status_code == 200 and len(form.json()[1]) == 2
    for body, code, reason in [
        ({"dest": "nothing.*"}, 404, "no queue matches pattern: nothing.*"),
        ({"dest": "a..b"}, 400, "invalid pattern: a..b"),
        ({"dest": "video.*", "count": -1}, 400, "invalid count value"),
        ({"dest": "news.*"}, 200, "queue news_b: status: DOWN"),
    ]:
        resp = requests.post(url + "fanout", json=body, timeout=60)
        assert (resp.status_code, resp.json()) == (code, ["fail", reason])


# ---------------------------------------------------------------- crashes at every step

TARGETS = ["va", "vb", "vc"]                      # topics video.a, video.b, video.c
PATTERNS = ["video.*", "video.#", "*.*"]          # each matches exactly the three
STEPS = ["journal", "prep-1", "prep-2", "prep-3", "commit-phase", "commit-1", "commit-2",
         "commit-3", "done"]


def schedule() -> list[tuple[str, str, dict[str, str]]]:
    """(step, pattern, params) for every kill step, the pattern and params drawn from a
    seeded generator, so a failure names a reproducible case."""
    rng = random.Random(SEED)
    return [(step, rng.choice(PATTERNS), {f"param{rng.randint(1, 4)}": f"p{rng.random():.6f}"})
            for step in STEPS]


def crash_root(base: Path) -> Path:
    root = build_root(base)
    for name in TARGETS:
        make_queue(root, name, script=base / "done.sh", topic=f"video.{name[1]}")
    make_queue(root, "audio", script=base / "done.sh", topic="audio.a")  # never matches
    return root


def mgr_pids(root: Path) -> list[int]:
    """rq-mgr and every child it supervises: queues and services (the web holds the port a
    restart binds again, S2.2)."""
    status = client.call_mgr(str(root), "status")[1]
    children = [*status["queues"].values(),
                *(c for key, c in status.items() if key != "queues" and c)]
    pids = [int(c["pid"]) for c in children if c.get("pid")]
    return pids + [int((root / "config" / "queuemgr.pid").read_text())]


def killed_fanout(root: Path, step: str, fields: dict[str, Any]) -> None:
    """Run a fan-out under an rq-mgr that SIGKILLs itself after `step`; return once it
    and its queues are gone.  No reply (above all no `ok`) may reach the client."""
    EnvMgr(root, {"RQ_FANOUT_KILL": step})
    pids = mgr_pids(root)
    with pytest.raises(ConnectError):
        mgr_create(root, fields)
    for pid in pids:  # its children stop once their lifeline (rq-mgr) is gone (S2.1)
        wait_for(lambda pid=pid: process_gone(pid), 30, what=f"process {pid} to end")


@pytest.mark.parametrize("step, pattern, params", schedule(), ids=STEPS)
def test_issue18_fanout_crash_at_each_step(tmp_path: Path, step: str, pattern: str,
                                           params: dict[str, str]) -> None:
    root = crash_root(tmp_path)
    killed_fanout(root, step, {"dest": pattern, **params})
    left = journals(root)
    committing = step.startswith("commit") or step == "done"
    if step == "done":
        assert left == []           # killed after the journal went, before the reply
    else:
        [journal] = left            # written before the first copy, fsynced
        data = json.loads(journal.read_text())
        assert data["queues"] == TARGETS and data["msg"]["dest"] == pattern
        assert data["phase"] == ("commit" if committing else "prep")
    mgr = Mgr(root)                 # restart: the journal is finished in the background
    try:
        wait_for(lambda: journals(root) == [], 60, what="the fan-out journal to be finished")
        held = {name: copies(root, name) for name in TARGETS}
        if committing:              # every matching queue holds its one committed copy
            assert all(len(c) == 1 and "prep" not in c.values() for c in held.values()), held
            assert len({msg_id for c in held.values() for msg_id in c}) == 1
        else:                       # or none does, not even in prep
            assert held == {name: {} for name in TARGETS}
        assert copies(root, "audio") == {}
        # and fan-outs work again
        assert [short(i)[0] for i in mgr_create(root, {"dest": pattern})[1]] == TARGETS
    finally:
        mgr.stop()


def test_issue18_fanout_crash_while_aborting(tmp_path: Path) -> None:
    """A refusal (vc DOWN) while two copies were made, and rq-mgr killed after aborting
    one of them: the journal (phase prep) stays, the restarted manager aborts the rest."""
    root = crash_root(tmp_path)
    (root / "config" / "vc.down").write_text("")
    killed_fanout(root, "abort-1", {"dest": "video.*"})
    [journal] = journals(root)
    assert json.loads(journal.read_text())["phase"] == "prep"
    # the two copies are aborted at once: one is gone, the other (unless its abort, in
    # flight at the kill, ended first) still in prep; vc never had one
    assert sum(len(copies(root, name)) for name in TARGETS) <= 1 and copies(root, "vc") == {}
    stale = root / "fanout" / ".f1.json.tmp1.2"  # a journal write another crash cut short
    stale.write_text('{"queues": [')
    mgr = Mgr(root)
    try:
        wait_for(lambda: journals(root) == [], 60, what="the fan-out journal to be finished")
        assert {name: copies(root, name) for name in TARGETS} == {n: {} for n in TARGETS}
        wait_for(lambda: not stale.exists(), 30, what="the stale journal temp to be swept")
    finally:
        mgr.stop()


def test_issue18_fanout_recovery_commits_into_a_down_queue(tmp_path: Path) -> None:
    """A fan-out decided (phase commit) when rq-mgr died, and one target taken DOWN
    (S3.5) before the restart: the copy is committed all the same, since the fan-out
    was accepted while the queue was UP; a journal never waits on an operator."""
    root = crash_root(tmp_path)
    killed_fanout(root, "commit-phase", {"dest": "video.*"})
    (root / "config" / "vb.down").write_text("")
    mgr = Mgr(root)
    try:
        wait_for(lambda: journals(root) == [], 60, what="the fan-out journal to be finished")
        held = {name: copies(root, name) for name in TARGETS}
        assert all(len(c) == 1 and "prep" not in c.values() for c in held.values()), held
    finally:
        mgr.stop()
