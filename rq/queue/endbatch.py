"""When the loop fsyncs finished jobs' moves: the group commit of completions (issue 15).

Owns the ends that are renamed (run/ID into done/, relayed/ or err/,
QueueState.complete_move) but not yet fsynced, and the starts that must be logged
after them.  The loop `add`s each pass's ends with the jobs it started in their
slots, asks `due` whether to fsync now, and `take`s the whole batch when it does:
one fsync of the bucket then covers every end of the batch (QueueProcess.sync_ended).

With one worker the batch is due at once: its job was just started in the freed slot,
so the fsync runs while that job does and no end can wait behind it.  With more
workers the other jobs end at any moment, and an fsync (~0.2 ms here) on the loop
delays each end that comes meanwhile; so the batch waits for more ends, up to
PER_WORKER × num_workers of them or WAIT seconds after its first, and goes at once
when no job is left running (nothing else will join it) or the queue is stopping.
Measured on two workers: +8 % jobs/s, −3 % CPU per job (docs/benchmarks.md,
twenty-first session).  Until its batch is published a message stays in
QueueState.ending, so no reader sees it final before its bookkeeping (S6.6, S13);
the price is that a finished job is counted done up to WAIT later.

A job started outside such a pass while a batch waits is logged after the batch
(`defer_start`): the event log never shows more than num_workers jobs running.
"""

from __future__ import annotations

from rq.queue import jobs as J

PER_WORKER = 4
WAIT = 0.010


class EndBatch:
    def __init__(self) -> None:
        self.ended: list[J.Job] = []
        self.started: list[J.Job] = []
        self.since: float | None = None  # monotonic time of the batch's first end

    def __bool__(self) -> bool:
        return bool(self.ended)

    def add(self, ended: list[J.Job], started: list[J.Job], mono: float) -> None:
        if not self.ended:
            self.since = mono
        self.ended += ended
        self.started += started

    def defer_start(self, job: J.Job) -> bool:
        """Log `job`'s start after the waiting ends; False when none wait."""
        if self.ended:
            self.started.append(job)
        return bool(self.ended)

    def due(self, mono: float, *, workers: int, running: int, stopping: bool) -> bool:
        return bool(self.ended) and (
            workers <= 1 or running == 0 or stopping
            or len(self.ended) >= PER_WORKER * workers or mono >= self.deadline())

    def deadline(self) -> float:
        return (self.since or 0.0) + WAIT

    def take(self) -> tuple[list[J.Job], list[J.Job]]:
        out = (self.ended, self.started)
        self.ended, self.started, self.since = [], [], None
        return out
