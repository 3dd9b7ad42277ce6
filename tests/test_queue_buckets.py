"""The done/ buckets a queue makes ahead of its jobs' ends (S3.2, issue 13 D8), and how
rarely a busy queue's passes look again (issue 15: each pass used to recompute and look up
every bucket; now a pass in the same minute with no new job does nothing).

QueueState.prepare_buckets is called here as the loop calls it, with plain numbers for the
clock, on a real queue directory; `makedirs` (at the file seam) and `message.bucket` are
counted, not replaced.
"""

from __future__ import annotations

import calendar
import os
import time
from pathlib import Path

import pytest
from rqtest import make_queue, make_root

from rq import message
from rq.config import load_main_config, load_queue_config
from rq.fsops import FsOps
from rq.queue import jobs as J
from rq.queue.state import QueueState


class CountingFsOps(FsOps):
    def __init__(self) -> None:
        super().__init__()
        self.made: list[str] = []

    def makedirs(self, path: str) -> list[str]:
        self.made.append(path)
        return super().makedirs(path)


def epoch(text: str) -> float:
    return float(calendar.timegm(time.strptime(text, "%Y%m%d %H:%M:%S")))


def queue_state(tmp_path: Path) -> tuple[QueueState, CountingFsOps, Path]:
    root = make_root(tmp_path)
    qdir = make_queue(root, "q", tmp_path / "none.sh")
    fs = CountingFsOps()
    state = QueueState(load_main_config(str(root)), load_queue_config(str(root), "q")[0], fs,
                       lambda: None)
    return state, fs, qdir


def run_job(state: QueueState, msg_id: str) -> None:
    state.jobs[msg_id] = J.Job(msg_id, str(state.store.qdir), {})


def test_buckets_of_this_minute_and_of_every_new_jobs_id_and_no_work_in_between(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    state, fs, qdir = queue_state(tmp_path)
    looked: list[str] = []
    real = message.bucket

    def bucket(msg_id: str) -> str:
        looked.append(msg_id)
        return real(msg_id)
    monkeypatch.setattr(message, "bucket", bucket)
    done = qdir / "done"
    try:
        now = epoch("20261129 10:30:20")
        run_job(state, "20261129.0815.02.001.1")  # created long ago, started now
        state.prepare_buckets(now, 100.0)
        made = {os.path.relpath(p, done) for p in fs.made}
        assert made == {"20261129/10/29", "20261129/10/30", "20261129/10/31",
                        "20261129/08/15"}
        assert all((done / b).is_dir() for b in made)

        fs.made.clear()  # later passes of the same minute, the same job: nothing to do
        looked.clear()
        state.prepare_buckets(now + 5, 105.0)
        state.prepare_buckets(now + 30, 130.0)
        assert fs.made == [] and looked == []

        run_job(state, "20261128.2359.59.001.2")  # a new job of another old minute
        state.prepare_buckets(now + 31, 131.0)
        assert looked == ["20261128.2359.59.001.2"]  # the new job's only
        assert [os.path.relpath(p, done) for p in fs.made] == ["20261128/23/59"]
        assert (done / "20261128/23/59").is_dir()

        fs.made.clear()  # the next minute: its next minute's bucket
        state.prepare_buckets(now + 45, 145.0)
        assert [os.path.relpath(p, done) for p in fs.made] == ["20261129/10/32"]

        fs.made.clear()  # once the queue has relayed messages, relayed/ too, at once
        state.index.counts["relayed"] = 1
        state.prepare_buckets(now + 46, 146.0)
        relayed = {os.path.relpath(p, qdir / "relayed") for p in fs.made if "/relayed/" in p}
        assert relayed == {"20261129/10/30", "20261129/10/31", "20261129/10/32",
                           "20261129/08/15", "20261128/23/59"}
    finally:
        state.events.close()
