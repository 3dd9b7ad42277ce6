"""The group commit of completions (issue 15, rq.queue.endbatch): when the loop fsyncs
finished jobs' moves, and that deferring it keeps S6.6 and S13's order.

The rules are checked as the pure decision they are; then a real queue process with
two workers runs trivial jobs under the recording file-operation seam (RQ_FS_RECORD),
so the test sees how many fsyncs of done/ buckets the ends took, and reads the event
log to check that it never shows more jobs running than the queue has workers.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rq.queue.endbatch import PER_WORKER, WAIT, EndBatch
from rqtest import QueueProc, make_queue, read_events, wait_for, write_script

pytestmark = pytest.mark.timeout(120)


class _Job:
    def __init__(self, exited: bool = False) -> None:
        self.exited = (0, False) if exited else None


def test_due_rules() -> None:
    running, gone = {"r": _Job()}, {"g": _Job(exited=True)}
    b = EndBatch()
    assert not b.due(0.0, running, workers=1, stopping=False)  # nothing waits
    b.add(["a"], ["b"], 10.0)  # type: ignore[list-item]  # jobs are opaque here
    assert not b.due(10.0, running, workers=1, stopping=False)  # four ends with one worker
    assert not b.due(10.0, running, workers=2, stopping=False)  # another may end soon
    assert b.due(10.0, gone, workers=2, stopping=False)  # nothing left to join it
    assert b.due(10.0, running, workers=2, stopping=True)  # a stop does not wait
    assert not b.due(10.0 + WAIT * 0.9, running, workers=2, stopping=False)
    assert b.due(10.0 + WAIT, running, workers=2, stopping=False)  # its deadline
    assert b.deadline() == 10.0 + WAIT
    b.add(["c"] * (2 * PER_WORKER - 1), ["b2"], 11.0)  # type: ignore[list-item]
    assert b.due(10.0, running, workers=2, stopping=False)  # full: 2 × PER_WORKER
    assert b.defer_start("d")  # type: ignore[arg-type]
    # pass by pass: a job started in one pass and ended in the next is logged in order
    assert b.take() == [(["a"], ["b"]), (["c"] * (2 * PER_WORKER - 1), ["b2", "d"])]
    assert not b and not b.defer_start("e")  # type: ignore[arg-type]  # logged at once


def test_two_workers_share_fsyncs_and_the_log_keeps_order(tmp_path: Path, root: Path) -> None:
    n = 80
    script = write_script(tmp_path / "quick.sh", '#!/bin/sh\necho "done ok" >&3\n')
    make_queue(root, "pair", script, num_workers=2)
    oplog = tmp_path / "ops.jsonl"
    q = QueueProc(root, "pair", env={"RQ_FS_RECORD": str(oplog)})
    try:
        for _ in range(n):
            assert q.call("create_message", {"dest": "pair"})[0] == "ok"
        wait_for(lambda: q.counts()["done"] == n, 60, what=f"{n} jobs done")
    finally:
        assert q.stop() == 0
    events = read_events(root, "pair")
    running = peak = 0
    for ev in events:  # in the order they were logged
        if ev.get("to") == "run":
            running += 1
        elif ev.get("from") == "run":
            running -= 1
        peak = max(peak, running)
    assert running == 0 and peak <= 2, peak
    steps: dict[str, list[tuple[str, str]]] = {}
    for ev in events:
        steps.setdefault(ev["msg_id"], []).append((ev["from"], ev["to"]))
    assert all(seq[-2:] == [("que", "run"), ("run", "done")] for seq in steps.values()), steps
    assert sum(ev.get("to") == "done" for ev in events) == n
    done_syncs = 0
    for line in oplog.read_text().splitlines():
        op = json.loads(line)
        if op["op"] == "fsyncdir" and "/queue/pair/done/" in op["path"]:
            done_syncs += 1
    # one per end without the group commit; the bucket's own mkdir fsyncs are a few more
    assert done_syncs < n * 0.35, done_syncs


def test_next_job_starts_before_the_end_is_renamed(tmp_path: Path, root: Path) -> None:
    """A serial queue's chain of exit, reap and start carries no rename of the ended job:
    the job started in its slot leaves que/ before the ended one leaves run/."""
    n = 30
    script = write_script(tmp_path / "quick.sh", '#!/bin/sh\necho "done ok" >&3\n')
    make_queue(root, "one", script, num_workers=1)
    pause = root / "config" / "one.pause"
    pause.touch()  # every end finds its successor queued
    oplog = tmp_path / "ops.jsonl"
    q = QueueProc(root, "one", env={"RQ_FS_RECORD": str(oplog)})
    try:
        for _ in range(n):
            assert q.call("create_message", {"dest": "one"})[0] == "ok"
        pause.unlink()
        wait_for(lambda: q.counts()["done"] == n, 60, what=f"{n} jobs done")
    finally:
        assert q.stop() == 0
    in_run, at_end = 0, []  # messages in run/ (on disk) when each end is renamed
    for line in oplog.read_text().splitlines():
        op = json.loads(line)
        if op["op"] != "rename":
            continue
        if "/queue/one/que/" in op["src"] and "/queue/one/run/" in op["dst"]:
            in_run += 1
        elif "/queue/one/run/" in op["src"] and "/queue/one/done/" in op["dst"]:
            at_end.append(in_run)
            in_run -= 1
    assert len(at_end) == n
    assert at_end[:-1] == [2] * (n - 1), at_end  # the last end has no successor
    assert at_end[-1] == 1
