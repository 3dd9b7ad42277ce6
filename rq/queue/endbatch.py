"""When the loop fsyncs finished jobs' moves: the group commit of completions (issue 15).

Owns the ends that are renamed (run/ID into done/, relayed/ or err/,
QueueState.complete_move) but not yet fsynced, and the starts that must be logged
after them.  The loop `add`s each pass's ends with the jobs it started in their
slots, asks `due` whether to fsync now, and `take`s the whole batch when it does:
one fsync of each directory (`sync_moves`) then covers every end of the batch, whose
bookkeeping follows pass by pass: a pass's ends, then the starts that pass made (a job
started in one pass may end in the next before the batch is due).

The batch waits for more ends, up to PER_WORKER × num_workers of them or WAIT
seconds after its first, and goes at once when no job is left running (nothing else
will join it) or the queue is stopping.  With two workers the loop was the queue's
bottleneck and an fsync (~0.2 ms here) in every pass delayed each end that came
meanwhile: +8–10 % jobs/s, −4 % CPU per job.  With one worker the batch of four is
full in the pass that reaps its fourth end, right after that pass started the next
job, so the fsync still runs while a job does (a batch that waited for WAIT instead,
at any moment of a short job's life, cost 5 %): −1 to −5 % CPU per job, the rate
unchanged or better (docs/benchmarks.md, twenty-first session).

Until its batch is published a message stays in QueueState.ending, so no reader sees
it final before its bookkeeping (S6.6, S13); the price is that a finished job is
counted done up to WAIT later.

A job started outside such a pass while a batch waits is logged after the batch
(`defer_start`): the event log never shows more than num_workers jobs running.
"""

from __future__ import annotations

from rq.queue import jobs as J
from rq.store import Store

PER_WORKER = 4
WAIT = 0.010


Segment = tuple[list[J.Job], list[J.Job]]  # one pass's ends, then the starts it made


class EndBatch:
    def __init__(self) -> None:
        self.segments: list[Segment] = []
        self.count = 0                   # ends waiting
        self.since: float | None = None  # monotonic time of the batch's first end

    def __bool__(self) -> bool:
        return bool(self.segments)

    def add(self, ended: list[J.Job], started: list[J.Job], mono: float) -> None:
        if not self.segments:
            self.since = mono
        self.segments.append((ended, started))
        self.count += len(ended)

    def defer_start(self, job: J.Job) -> bool:
        """Log `job`'s start after the waiting ends; False when none wait."""
        if self.segments:
            self.segments[-1][1].append(job)
        return bool(self.segments)

    def due(self, mono: float, jobs: dict[str, J.Job], *, workers: int, stopping: bool) -> bool:
        """Whether to fsync now, `jobs` being the queue's job table."""
        return bool(self.segments) and (
            stopping or self.count >= PER_WORKER * workers
            or mono >= self.deadline() or all(job.exited is not None for job in jobs.values()))

    def deadline(self) -> float:
        return (self.since or 0.0) + WAIT

    def take(self) -> list[Segment]:
        out, self.segments, self.count, self.since = self.segments, [], 0, None
        return out


def sync_moves(store: Store, ended: list[J.Job]) -> OSError | None:
    """One fsync of each directory the moves of `ended` changed; what is left to fsync
    (after an error) stays in each job's `sync_dirs`."""
    dirs = list(dict.fromkeys(d for job in ended for d in job.sync_dirs or []))
    error: OSError | None = None
    try:
        store.sync_dirs(dirs)  # pops each directory once it is durable
    except OSError as exc:
        error = exc
    for job in ended:
        job.sync_dirs = [d for d in job.sync_dirs or [] if d in dirs]
    return error
