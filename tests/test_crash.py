"""Crash test (1) of issue 2: 1,000 messages through a 2-worker queue while a
seeded random schedule SIGKILLs the queue process, rq-mgr and jobs (at least
20 kills).  Afterwards, checked against a ledger the queue script keeps:

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
from rqtest import REPO, free_port, make_queue, make_root, read_events, wait_for, write_script

N_MESSAGES = 1000
MIN_KILLS = 20
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
    """Creates N messages, retrying each until it is acknowledged."""

    def __init__(self, root: Path) -> None:
        super().__init__(daemon=True)
        self.root = root
        self.acked: list[str] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            for i in range(N_MESSAGES):
                while True:
                    try:
                        reply = client.call_queue(str(self.root), "crash", "create_message",
                                                  {"dest": "crash", "param1": str(i)}, timeout=30)
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
        # new manager starts at once (the stale pid file must not stop it).
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
    producer = Producer(root)
    producer.start()
    try:
        queue_kills_since_mgr = 0
        threshold = 0
        # Kills are spread over the work by job starts (not time): one every
        # 10..30 starts, so all of them land while messages are still running.
        while len(kills) < MIN_KILLS + 4:
            threshold += rng.randint(10, 30)
            wait_for(lambda: started_jobs(ledger) >= threshold, 120, interval=0.02,
                     what=f"{threshold} job starts")
            kind = rng.choice(["job", "job", "queue", "mgr"])
            if kind == "queue" and queue_kills_since_mgr >= 2:
                kind = "mgr"  # keep the supervisor's backoff short (S2.3)
            if kill_once(kind, root, rng, killed_jobs):
                kills.append(kind)
                queue_kills_since_mgr = 0 if kind == "mgr" else \
                    queue_kills_since_mgr + (kind == "queue")
        producer.join(300)
        assert producer.error is None, producer.error
        assert not producer.is_alive()
        assert len(kills) >= MIN_KILLS, kills
        assert {"job", "queue", "mgr"} <= set(kills), kills

        acked = set(producer.acked)
        assert len(acked) == N_MESSAGES

        def settled() -> bool:
            states = check_root(str(root)).states.get("crash", {})
            return all(states.get(i) in ("done", "err") for i in acked)
        wait_for(settled, 240, interval=0.2, what="every acknowledged message to finish")
    finally:
        mgr(root, "stop")

    report = check_root(str(root))
    assert report.problems == []
    states = report.states["crash"]
    qdir = root / "queue" / "crash"
    for msg_id in acked:
        state = states.get(msg_id)
        assert state in ("done", "err"), (msg_id, state)
        path = next((qdir / state).rglob(msg_id)) if state == "done" else qdir / "err" / msg_id
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
