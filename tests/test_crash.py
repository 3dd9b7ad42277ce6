"""Crash test (1) of issue 2, at scale for issue 13 part 7: messages (1,000 by
default; RQ_CRASH_MESSAGES) created over the queue socket and, a quarter of
them, over HTTP, through a 2-worker queue while a seeded random schedule
SIGKILLs the queue process, rq-mgr, rq-web and jobs (at least 20 kills;
RQ_CRASH_KILLS).  Afterwards, checked against a ledger the queue script keeps:

* every acknowledged message is in exactly one state (`rq fsck`, crash test 3)
  and none is lost;
* it ended in done with the script's own status, except that a message whose
  job the schedule SIGKILLed may instead end in err with the S6.6 SIGKILL text
  (a killed job is a failed run, S6.6 rule 1);
* no message ever had two job processes alive at once: each job holds an
  flock on a per-message lock file for its whole life and records an overlap
  if it cannot take it (S2.7: recovery kills a survivor before re-running);
* at most one run→done transition per message in the event log (S13).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import threading
from pathlib import Path

import pytest

from rq import client
from rq.errors import RQError
from rq.fsck import check_root
from rq.message import bucket
from rq.mgr import pidfile
from rqtest import REPO, free_port, make_queue, make_root, read_events, wait_for, write_script
from webtest import web_pid

N_MESSAGES = int(os.environ.get("RQ_CRASH_MESSAGES", "1000"))
MIN_KILLS = int(os.environ.get("RQ_CRASH_KILLS", "20"))
HTTP_SHARE = 4   # one message in HTTP_SHARE is created over HTTP
SEED = 20261122

LEDGER_SCRIPT = r"""#!/bin/sh
# Ledger queue script: flock proves no second live job for this message.
exec 9>"$LEDGER/$RQ_MSG_ID.lock"
flock -n 9 || echo "$RQ_MSG_ID $$" >> "$LEDGER/overlaps"
echo "start $RQ_MSG_ID $$" >> "$LEDGER/ledger"
sleep 0.0$(( $$ % 4 + 1 ))
echo "end $RQ_MSG_ID $$" >> "$LEDGER/ledger"
echo "done ok" >&3
"""


def mgr(root: Path, *args: str, timeout: float = 90) -> subprocess.CompletedProcess:
    return subprocess.run([str(REPO / "bin" / "rq-mgr"), "--root", str(root), *args],
                          capture_output=True, text=True, timeout=timeout)


def read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


class Producer(threading.Thread):
    """Creates its messages, retrying each until it is acknowledged: over the
    queue socket, or over HTTP (rq-web, which the schedule kills too)."""

    def __init__(self, root: Path, numbers: list[int], http_port: int | None = None) -> None:
        super().__init__(daemon=True)
        self.root = root
        self.numbers = numbers
        self.http_port = http_port
        self.acked: list[str] = []
        self.error: BaseException | None = None

    def create(self, i: int) -> list:
        fields = {"dest": "crash", "param1": str(i)}
        if self.http_port is None:
            return client.call_queue(str(self.root), "crash", "create_message", fields,
                                     timeout=30)
        import requests
        try:
            resp = requests.post(f"http://127.0.0.1:{self.http_port}/q/crash/new_message",
                                 json=fields, timeout=30)
            return resp.json() if resp.status_code == 200 else ["retry"]
        except (requests.RequestException, ValueError):
            threading.Event().wait(0.02)  # rq-web is restarting: try again soon
            return ["retry"]

    def run(self) -> None:
        try:
            for i in self.numbers:
                while True:
                    try:
                        reply = self.create(i)
                    except RQError:
                        wait_for(lambda: os.path.exists(client.queue_socket(str(self.root),
                                                                            "crash")),
                                 60, interval=0.02, what="queue socket")
                        continue
                    if reply[0] == "ok":
                        self.acked.append(reply[1].rsplit("/", 1)[1])
                        break
        except BaseException as exc:  # reported by the test thread
            self.error = exc


def started_jobs(ledger: Path) -> int:
    try:
        return ledger.read_text().count("start ")
    except OSError:
        return 0


def kill_once(kind: str, root: Path, rng: random.Random, killed_jobs: set[str]) -> bool:
    qdir = root / "queue" / "crash"
    if kind == "web":
        pid = web_pid(root)
        if pid is None:
            return False
        os.kill(pid, signal.SIGKILL)
        return True
    if kind == "job":
        runs = sorted((qdir / "run").glob("*/pid"))
        if not runs:
            return False
        target = rng.choice(runs)
        pid = read_pid(target)
        if pid is None:
            return False
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            return False
        killed_jobs.add(target.parent.name)
        return True
    if kind == "queue":
        pid = read_pid(qdir / "queue.pid")
    else:
        pid = read_pid(root / "config" / "queuemgr.pid")
    if pid is None:
        return False
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return False
    if kind == "mgr":
        # The queue process sees its lifeline close and stops gracefully; a
        # new manager starts as soon as the killed one is gone (the stale pid
        # file must not stop it).  SIGKILL takes effect when the process next
        # leaves the kernel (an fsync, say): until then it is still a live
        # manager of this root, and `start` rightly refuses (seen once in CI).
        wait_for(lambda: not pidfile.is_manager_of(pid, str(root)), 30, interval=0.01,
                 what="the killed rq-mgr to exit")
        result = mgr(root, "start")
        assert result.returncode == 0, result.stderr
    return True


@pytest.mark.slow
def test_sigkill_schedule_loses_nothing(tmp_path: Path) -> None:
    root = make_root(tmp_path, port=free_port())
    ledger_dir = tmp_path / "ledger"
    ledger_dir.mkdir()
    script = write_script(tmp_path / "ledger.sh", LEDGER_SCRIPT)
    make_queue(root, "crash", script=script, num_workers=2, kill_grace=2,
               env_vars={"LEDGER": str(ledger_dir)})
    ledger = ledger_dir / "ledger"
    assert mgr(root, "start").returncode == 0
    rng = random.Random(SEED)
    killed_jobs: set[str] = set()
    kills: list[str] = []
    port = json.loads((root / "config" / "config.json").read_text())["port"]
    producers = [Producer(root, [i for i in range(N_MESSAGES) if i % HTTP_SHARE == 0], port),
                 Producer(root, [i for i in range(N_MESSAGES) if i % HTTP_SHARE])]
    for producer in producers:
        producer.start()
    try:
        restarts_since_mgr = 0
        threshold = 0
        # Kills are spread over the work by job starts (not time): one every
        # 10..30 starts, so all of them land while messages are still running.
        while len(kills) < MIN_KILLS + 4:
            threshold += rng.randint(10, 30)
            wait_for(lambda: started_jobs(ledger) >= threshold, 120, interval=0.02,
                     what=f"{threshold} job starts")
            kind = rng.choice(["job", "job", "queue", "mgr", "web"])
            if kind in ("queue", "web") and restarts_since_mgr >= 2:
                kind = "mgr"  # keep the supervisor's backoff short (S2.3)
            if kill_once(kind, root, rng, killed_jobs):
                kills.append(kind)
                restarts_since_mgr = 0 if kind == "mgr" else \
                    restarts_since_mgr + (kind in ("queue", "web"))
        for producer in producers:
            producer.join(300 + N_MESSAGES / 10)
            assert producer.error is None, producer.error
            assert not producer.is_alive()
        assert len(kills) >= MIN_KILLS, kills
        assert {"job", "queue", "mgr", "web"} <= set(kills), kills

        acked = {msg_id for producer in producers for msg_id in producer.acked}
        assert len(acked) == N_MESSAGES

        def settled() -> bool:
            states = check_root(str(root)).states.get("crash", {})
            return all(states.get(i) in ("done", "err") for i in acked)
        wait_for(settled, 240 + N_MESSAGES / 20, interval=0.2,
                 what="every acknowledged message to finish")
    finally:
        mgr(root, "stop")

    report = check_root(str(root))
    assert report.problems == []
    states = report.states["crash"]
    qdir = root / "queue" / "crash"
    for msg_id in acked:
        state = states.get(msg_id)
        assert state in ("done", "err"), (msg_id, state)
        path = qdir / state / bucket(msg_id) / msg_id if state == "done" else qdir / "err" / msg_id
        status = (path / "status").read_text()
        if state == "done":
            assert '"ok"' in status, status
        else:
            assert msg_id in killed_jobs, (msg_id, status)
            assert "SIGKILL (signal 9)" in status, status
    assert not (ledger_dir / "overlaps").exists(), (ledger_dir / "overlaps").read_text()
    done_events: dict[str, int] = {}
    for ev in read_events(root, "crash"):
        if ev["from"] == "run" and ev["to"] == "done":
            done_events[ev["msg_id"]] = done_events.get(ev["msg_id"], 0) + 1
    assert all(n == 1 for n in done_events.values())
    ended = {line.split()[1] for line in ledger.read_text().splitlines()
             if line.startswith("end ")}
    assert {i for i in acked if states[i] == "done"} <= ended
