"""The rq1 server (rq/sockserve.py, S7.1): close() lets replies being written
reach their clients (the "ok" of `shutdown` arrives before the process exits)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from rq import client
from rq.sockserve import Rq1Server


def test_close_waits_for_a_reply_in_flight(tmp_path: Path) -> None:
    started = threading.Event()
    release = threading.Event()

    def handler(cmd: str, arg: Any, conn: Any) -> Any:
        started.set()
        release.wait(5)
        return ["ok", cmd]

    path = str(tmp_path / "s.sock")
    server = Rq1Server(path, handler)
    server.start()
    got: list[Any] = []
    caller = threading.Thread(target=lambda: got.append(client.call(path, "shutdown")))
    caller.start()
    assert started.wait(5)
    threading.Timer(0.2, release.set).start()
    server.close()                 # returns only once the reply has been written
    assert release.is_set()        # it waited for the handler and its reply
    caller.join(5)
    assert got == [["ok", "shutdown"]]
    assert not Path(path).exists()


def test_close_gives_up_after_the_grace(tmp_path: Path) -> None:
    release = threading.Event()
    started = threading.Event()

    def handler(cmd: str, arg: Any, conn: Any) -> Any:
        started.set()
        release.wait(10)
        return ["ok"]

    path = str(tmp_path / "s.sock")
    server = Rq1Server(path, handler)
    server.start()
    caller = threading.Thread(target=lambda: client.call(path, "slow"), daemon=True)
    caller.start()
    assert started.wait(5)
    server.close(reply_grace=0.3)  # a stuck handler does not hold the stop forever
    assert caller.is_alive()
    release.set()
    caller.join(5)
