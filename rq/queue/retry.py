"""Finishing that hit an IO error, retried with backoff (S6.6; issue 13, D8).

Owns the jobs (and leases) that have ended but whose message could not be
moved to its next state yet (a full disk, EIO): when each is tried again
(0.5 s, doubling to 30 s), and what the log and the queue's `status` say
about it.  The log gets one line when finishing gets stuck, a summary every
few minutes while it stays stuck, and one line when it works again, never a
line per attempt.  Retrying is the queue process's: it asks for the jobs that
are due and reports each attempt back.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

from rq.queue.jobs import Job

log = logging.getLogger(__name__)
FIRST_DELAY = 0.5
MAX_DELAY = 30.0
SUMMARY_EVERY = 300.0


class Unfinished:
    def __init__(self) -> None:
        self.jobs: list[Job] = []
        self.stuck_since: float | None = None      # monotonic
        self.stuck_wall = 0.0
        self.failures = 0                          # failed attempts while stuck
        self.last_error = ""
        self.next_summary = 0.0

    def __len__(self) -> int:
        return len(self.jobs)

    def __iter__(self) -> Iterator[Job]:
        return iter(self.jobs)

    def not_in(self, jobs: dict[str, Job]) -> int:
        """How many are not in `jobs` (a job stays in the job table until it
        is finished: counting both would count it twice)."""
        return sum(1 for j in self.jobs if j.msg_id not in jobs)

    def failed(self, job: Job, exc: OSError, mono: float) -> None:
        """An attempt to finish `job` failed: try again later, doubling the wait."""
        job.retry_delay = min(job.retry_delay * 2, MAX_DELAY) if job.retry_delay else FIRST_DELAY
        job.retry_at = mono + job.retry_delay
        if not any(j is job for j in self.jobs):
            self.jobs.append(job)
        self.failures += 1
        self.last_error = str(exc)
        if self.stuck_since is None:
            self.stuck_since, self.stuck_wall = mono, time.time()
            self.next_summary = mono + SUMMARY_EVERY
            log.error("cannot finish %s (%s); retrying with backoff (%.1f s doubling to %d s)",
                      job.msg_id, exc, FIRST_DELAY, MAX_DELAY)
        elif mono >= self.next_summary:
            self.next_summary = mono + SUMMARY_EVERY
            log.error("finishing still stuck after %d s: %d message(s) wait in run/, "
                      "%d failed attempts (last error: %s)", mono - self.stuck_since,
                      len(self.jobs), self.failures, exc)

    def finished(self, job: Job, mono: float) -> None:
        """`job` finished: once none is left, say that finishing works again."""
        self.jobs = [j for j in self.jobs if j is not job]
        if self.stuck_since is None:
            return
        for other in self.jobs:  # the disk is back: no need to wait out the backoff
            other.retry_at = min(other.retry_at, mono)
        if not self.jobs:
            log.info("finishing works again after %d s and %d failed attempts",
                     mono - self.stuck_since, self.failures)
            self.stuck_since, self.failures = None, 0

    def due(self, mono: float) -> list[Job]:
        """The jobs to try again now (taken out; `failed` puts one back)."""
        due = [j for j in self.jobs if j.retry_at <= mono]
        self.jobs = [j for j in self.jobs if j.retry_at > mono]
        return due

    def next_at(self) -> float | None:
        """Monotonic time of the next retry, None when nothing waits."""
        return min((j.retry_at for j in self.jobs), default=None)

    def describe(self) -> str | None:
        """For the queue's `status` reply while finishing is stuck, else None."""
        if self.stuck_since is None:
            return None
        since = time.strftime("%Y-%m-%d %H:%M:%S %z", time.localtime(self.stuck_wall))
        return (f"finishing stuck since {since}: {len(self.jobs)} message(s) wait in run/, "
                f"{self.failures} failed attempts (last error: {self.last_error})")
