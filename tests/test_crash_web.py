"""The web server killed under load (issue 13, part 4; S2.3, S14, S15 route 12).

A real rq-mgr; four clients enqueue over HTTP (`POST /q/test/new_message`, JSON) as fast as
they can while rq-web is SIGKILLed again and again (rq-mgr restarts it with its backoff,
S2.3).  Every `ok` a client received must name a message that exists and ends done: the web
answers only after the queue process made the message durable (S0.3), so a kill can cost a
reply, never a message, and no reply may claim a message that is not there.  Messages whose
reply was lost in a kill may exist too (at-least-once from the client's side).

Scale knob: RQ_WEB_KILLS (default 4; each restart waits for the supervisor's backoff,
1, 2, 4, 8 … s).
"""

from __future__ import annotations

import json
import os
import signal
import threading
from pathlib import Path

import pytest
import requests
from rqtest import wait_for
from webtest import Mgr, build_root, web_pid

from rq.fsck import check_root

pytestmark = pytest.mark.timeout(600)

KILLS = int(os.environ.get("RQ_WEB_KILLS", "4"))
CLIENTS = 4
PER_KILL = 10   # acknowledged creates between two kills: the restarted web really serves


class Clients:
    def __init__(self, base: str) -> None:
        self.base = base
        self.acked: list[str] = []
        self.failures: list[str] = []
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self.run, args=(i,), daemon=True)
                        for i in range(CLIENTS)]
        for t in self.threads:
            t.start()

    def run(self, n: int) -> None:
        session = requests.Session()
        i = 0
        while not self.stop.is_set():
            i += 1
            try:
                resp = session.post(f"{self.base}q/test/new_message", timeout=30,
                                    json={"dest": "test", "param1": f"{n}-{i}"})
            except requests.RequestException:
                session = requests.Session()
                self.stop.wait(0.01)  # the web is restarting: try again soon
                continue
            try:
                reply = resp.json()
            except ValueError:
                reply = None
            with self.lock:
                if resp.status_code == 200 and isinstance(reply, list) and reply[0] == "ok":
                    self.acked.append(reply[1].rsplit("/", 1)[1])
                elif resp.status_code != 503:  # 503: the web is up, the manager check not yet
                    self.failures.append(f"{resp.status_code} {resp.text[:200]}")

    def count(self) -> int:
        with self.lock:
            return len(self.acked)

    def finish(self) -> list[str]:
        self.stop.set()
        for t in self.threads:
            t.join(60)
        return list(self.acked)


def test_web_killed_under_load_never_gives_a_false_ok(tmp_path: Path) -> None:
    root = build_root(tmp_path)
    port = json.loads((root / "config" / "config.json").read_text())["port"]
    mgr = Mgr(root)
    try:
        clients = Clients(f"http://127.0.0.1:{port}/")
        killed = []
        for _ in range(KILLS):
            target = clients.count() + PER_KILL
            wait_for(lambda: clients.count() >= target, 120, 0.02,
                     what="the web to acknowledge creates again")
            pid = wait_for(lambda: web_pid(root), 30, what="rq-web's pid")
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        target = clients.count() + PER_KILL
        wait_for(lambda: clients.count() >= target, 120, 0.02, what="the last restart serving")
        acked = clients.finish()
        assert clients.failures == []
        assert len(set(killed)) == KILLS
        assert len(acked) == len(set(acked)) >= PER_KILL * (KILLS + 1)

        def all_done() -> bool:
            states = check_root(str(root)).states.get("test", {})
            return all(states.get(i) == "done" for i in acked)
        wait_for(all_done, 240, 0.2, what="every acknowledged message to be done")
    finally:
        mgr.stop()
    report = check_root(str(root))
    assert report.problems == []
    print(f"{len(acked)} acknowledged over HTTP, {KILLS} SIGKILLs of rq-web, all done")
