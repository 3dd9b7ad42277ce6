"""Hostile jobs (issue 13, D3 and part 6): a job's output never stalls its queue.

Real queue processes running real /bin/sh jobs that flood fd 3 with millions of lines, write
one huge line without a newline, and send thousands of `dup` requests without ever reading
the replies on fd 4.  Throughout, a probe asks the queue's socket for `ping` and
`create_message` and times every answer, and plain jobs of the same queue keep finishing.
Scale knob: RQ_HOSTILE_SCALE (1 = the issue's figures: 3,000,000 lines, a 300 MB line,
5,000 unread replies; the default 0.1 keeps CI short, the 300 MB line stays whole).
"""

from __future__ import annotations

import os
import statistics
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from rqtest import QueueProc, create_msg, make_queue, make_root, wait_for, write_script

from rq import protocol

pytestmark = pytest.mark.timeout(600)

SCALE = float(os.environ.get("RQ_HOSTILE_SCALE", "0.1"))
FLOOD_LINES = int(3_000_000 * SCALE)
DUPS = max(2000, int(5000 * SCALE))      # ~40 bytes a reply: well past a 64 KiB pipe
BIG_LINE = 300_000_000
PROBE_LIMIT = 0.1                        # the 100 ms ...
PROBE_SLOW_SHARE = 0.05                  # ... for all but 5 % of the requests, and
PROBE_MAX = 1.0                          # none over 1 s (4 test workers share 2 cores)

SCRIPT = """#!/bin/sh
case "$RQ_PARAM1" in
flood)
    yes "run flooding" | head -n {lines} >&3
    echo "run flood sent" >&3 ;;
bigline)
    printf 'run ' >&3
    head -c {big} /dev/zero | tr '\\0' x >&3
    printf '\\n' >&3
    [ "$RQ_PARAM3" = quiet ] || echo "run big line sent" >&3 ;;
dups)
    i=0
    while [ $i -lt {dups} ]; do echo "dup 0-X-nosuchqueue" >&3; i=$((i+1)); done
    echo "run dups sent" >&3 ;;
*)
    echo "done plain" >&3
    exit 0 ;;
esac
while [ ! -e "$RQ_PARAM2" ]; do sleep 0.05; done
echo "done $RQ_PARAM1 released" >&3
"""


@pytest.fixture
def hostile(tmp_path: Path) -> Iterator[QueueProc]:
    root = make_root(tmp_path)
    script = write_script(tmp_path / "hostile.sh",
                          SCRIPT.format(lines=FLOOD_LINES, big=BIG_LINE, dups=DUPS))
    make_queue(root, "h", script, num_workers=4)
    qp = QueueProc(root, "h")
    yield qp
    qp.stop(60)


class Probe:
    """Times `ping` and `create_message` (on a paused queue) back to back until stopped."""

    def __init__(self, qp: QueueProc, other: QueueProc) -> None:
        self.qp, self.other = qp, other
        self.times: list[float] = []
        self.failures: list[object] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        while not self.stop.is_set():
            for cmd, arg in (("ping", None), ("create_message", {"dest": "h", "due": 4e9})):
                t0 = time.monotonic()
                try:
                    reply = self.qp.call(cmd, arg, timeout=30)
                except Exception as exc:  # noqa: BLE001 - recorded, asserted below
                    reply = exc
                self.times.append(time.monotonic() - t0)
                if not (isinstance(reply, list) and reply[0] in ("pong", "ok")):
                    self.failures.append(reply)
            time.sleep(0.005)

    def finish(self) -> list[float]:
        self.stop.set()
        self.thread.join(60)
        assert self.failures == []
        return self.times


def test_hostile_jobs_never_stall_the_queue(hostile: QueueProc, tmp_path: Path) -> None:
    qp = hostile
    release = tmp_path / "release"
    probe = Probe(qp, qp)
    fulls = {kind: create_msg(qp, param1=kind, param2=str(release))
             for kind in ("flood", "bigline", "dups")}
    # the three hostile jobs say they are done sending; meanwhile plain jobs go through
    # the fourth worker, one after another
    plain = [create_msg(qp, param1="plain") for _ in range(10)]
    wait_for(lambda: all(qp.state(f) == "done" for f in plain), 120, 0.05,
             what="plain jobs to finish beside the hostile ones")
    wait_for(lambda: all(qp.message(f)["status"].endswith(" sent")
                         for f in fulls.values()), 300, 0.1,
             what="the hostile jobs to finish sending")
    assert all(qp.state(f) == "run" for f in fulls.values())   # still holding their slots
    times = probe.finish()
    release.touch()
    for kind, full in fulls.items():
        wait_for(lambda full=full: qp.state(full) == "done", 60, 0.05, what=f"{kind} done")
        assert qp.message(full)["status"] == f"done - {kind} released"
    assert len(times) > 20
    print(f"probe: {len(times)} requests, median {statistics.median(times) * 1000:.1f} ms, "
          f"max {max(times) * 1000:.1f} ms")
    # the old code left requests unanswered for 40-130 s (socket timeouts)
    slow = [t for t in times if t > PROBE_LIMIT]
    assert len(slow) <= PROBE_SLOW_SHARE * len(times), sorted(times)[-5:]
    assert max(times) <= PROBE_MAX, sorted(times)[-5:]
    # the huge line cost neither the status file nor the event log more than MAX_LINE
    events = sum(f.stat().st_size for f in (qp.root / "log" / "events").rglob("*.jsonl"))
    assert events < 4 * protocol.MAX_LINE, events
    # a graceful stop is prompt
    t0 = time.monotonic()
    assert qp.stop(30) == 0
    assert time.monotonic() - t0 < 10


def test_a_huge_line_is_kept_up_to_the_limit_and_marked(hostile: QueueProc,
                                                       tmp_path: Path) -> None:
    """S6.4 keeps lines up to MAX_LINE (at least 1 MiB) whole; of a longer one the status
    holds the first MAX_LINE bytes and a marker with the count of bytes cut."""
    release = tmp_path / "release"
    full = create_msg(hostile, param1="bigline", param2=str(release), param3="quiet")
    seen: list[str] = []

    def status() -> str:
        seen.append(hostile.message(full)["status"])
        return seen[-1]
    wait_for(lambda: "bytes cut]" in status(), 120, 0.1, what="the cut line as status")
    text = seen[-1]
    assert text.startswith("run - " + "x" * 1000)
    assert text.endswith(f"x [... {BIG_LINE + 4 - protocol.MAX_LINE} bytes cut]"), text[-80:]
    assert len(text) < protocol.MAX_LINE + 100
    release.touch()
    wait_for(lambda: hostile.state(full) == "done", 60, what="done")


@pytest.mark.parametrize("chunks", [
    [b"run " + b"y" * 5000 + b"\n"],
    [b"run ", b"y" * 3000, b"y" * 2000, b"\nrun next\n"],
    [b"run " + b"y" * 5000],
])
def test_line_buffer_cuts_long_lines_linearly(chunks: list[bytes]) -> None:
    buf = protocol.LineBuffer(limit=1004)
    lines = [line for chunk in chunks for line in buf.feed(chunk)] + buf.flush()
    assert lines[0] == "run " + "y" * 1000 + " [... 4000 bytes cut]"
    assert lines[1:] in ([], ["run next"])
