"""The time slice of the queue's threads and of its jobs (issue 15, S6.3).

Owns: asking Linux's EEVDF scheduler (6.12 and later: sched_setattr's sched_runtime, for
SCHED_OTHER too; older kernels ignore it) for a thread's time slice.  A slice is inherited
by the threads and the children a thread starts: the queue process asks for a short one
before its threads start, and every job is given the kernel's default back (rq.proc, and
rq/_spawn.c in the child before its exec).
"""

from __future__ import annotations

import os

SHORT_SLICE_NS = 100_000  # the shortest the kernel allows: 0.1 ms
_SCHED_SETATTR = {"x86_64": 314, "aarch64": 274}.get(os.uname().machine)


def set_time_slice(pid: int = 0, ns: int = 0, nice: int | None = None) -> bool:
    """Ask for a time slice of `ns` nanoseconds (0: the kernel's default) for thread `pid`
    (0: the calling thread) and what it starts later, at nice `nice` (None: its own, read
    first; a child that may change its own nice meanwhile needs it given).  The queue
    process asks for SHORT_SLICE_NS: a thread woken by a request, an fsync's end or a
    job's line then preempts a running job at once, where with the default slice it
    waited for the job's slice to end (a durable create took 3.8-8 ms instead of 0.6 ms
    beside two CPU-bound jobs: docs/benchmarks.md).  Jobs get the default back
    (rq/_spawn.c).  Best effort: False where the kernel or the machine says no."""
    if _SCHED_SETATTR is None:
        return False
    import ctypes  # only the queue process needs it
    import struct

    try:
        nice = os.getpriority(os.PRIO_PROCESS, pid) if nice is None else nice
        # struct sched_attr, its first version: size, policy (SCHED_OTHER), flags, nice,
        # priority, runtime, deadline, period
        attr = ctypes.create_string_buffer(struct.pack("IIQiIQQQ", 48, 0, 0, nice, 0, ns, 0, 0),
                                           48)
        return ctypes.CDLL(None, use_errno=True).syscall(_SCHED_SETATTR, pid, attr, 0) == 0
    except (OSError, AttributeError):
        return False
