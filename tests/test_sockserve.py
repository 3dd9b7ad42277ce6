"""The rq1 server (rq/sockserve.py, S7.1): close() lets replies being written
reach their clients (the "ok" of `shutdown` arrives before the process exits)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from rq import client
from rq.sockserve import Rq1Server


def blocking_server(tmp_path: Path, reply: Any) -> tuple[Rq1Server, str, threading.Event,
                                                          threading.Event]:
    """A started server whose handler signals `started`, then waits for `release` (10 s at
    most) before answering `reply` (None: ["ok", cmd])."""
    started = threading.Event()
    release = threading.Event()

    def handler(cmd: str, arg: Any, conn: Any) -> Any:
        started.set()
        release.wait(10)
        return ["ok", cmd] if reply is None else reply

    path = str(tmp_path / "s.sock")
    server = Rq1Server(path, handler)
    server.start()
    return server, path, started, release


def test_close_waits_for_a_reply_in_flight(tmp_path: Path) -> None:
    server, path, started, release = blocking_server(tmp_path, None)
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
    server, path, started, release = blocking_server(tmp_path, ["ok"])
    caller = threading.Thread(target=lambda: client.call(path, "slow"), daemon=True)
    caller.start()
    assert started.wait(5)
    server.close(reply_grace=0.3)  # a stuck handler does not hold the stop forever
    assert caller.is_alive()
    release.set()
    caller.join(5)
