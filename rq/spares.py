"""Spare message directories made ahead of need, off the request path.

Owns `queue/NAME/.spare/`: a background thread, running only while a kind is
being refilled, keeps a few spares of each kind there: `msg-N/` holding an
empty `msg` file, `job-N/` holding an empty `stdio.log`, and plain empty files
`file-N`. Creating an inode is the dearest step of a durable enqueue on ext4
(a `mkdir` plus a file create cost 0.3-1 ms of kernel time while the journal
is busy with the previous message's fsyncs or recently deleted inodes are
skipped, against ~20 us for a rename), so Store.allocate writes a message's
msg inside a `msg` spare and then publishes the whole directory as `prep/ID`
with one no-clobber rename (S4.1); a job start claims a `job` spare
as `run/ID/job/` (S6.1), and the small files written per job (pid, proc.json,
status) go through a `file` spare renamed over their target (as atomic as a
rename from a temp file beside the target: same filesystem, S0.3.1).

Files that a message no longer needs (pid and proc.json when a job ends, the
old status a new one replaces, a lease record) are not deleted but recycled
as `file` spares (`recycle`): on this filesystem kind (ext4 without a journal)
every inode allocation skips the inodes freed in the last minutes one by one,
so a queue that freed two inodes per job made each later create, mkdir and
spare slower the longer it ran (a job's spares cost ~0.1 ms of kernel time
on fresh directories, 1.5-3 ms after a few thousand jobs).

No spare is fsynced.  A journaled create needs nothing of its spare's
durability (its create journal record stands for the message until the
journal settles: rq.queue.journal, issue 15); a create that must be durable by
itself (prep_message) fsyncs the spare's directory after its msg
(Store.allocate).  Until the journal, every `msg` spare's directory was fsynced
here, ~0.1 ms apiece on this filesystem (docs/benchmarks.md, eighteenth
session).  A crash may
leave or lose some spares; `reset()` at queue start clears whatever is
there.  A failure to make spares (a full disk, a read-only queue) only means
allocate falls back to `mkdir`.  Spare-making does not go through the
file-operation seam's counters (a background thread would make
injected-fault sequences nondeterministic); fault-injection runs use no
spares unless a test asks for them.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading

log = logging.getLogger(__name__)

DIRNAME = ".spare"
# kind -> the empty file inside the spare directory; "" = the spare is a plain empty file
# (the temporary file of a small atomic write: pid, proc.json, status)
KINDS = {"msg": "msg", "job": "stdio.log", "file": ""}
LOW, HIGH = 8, 32      # refill when fewer than LOW are ready, up to HIGH
KEEP = 2 * HIGH        # recycled files kept at most; beyond that they are deleted
RETRY_AFTER = 5.0      # seconds to wait after a failure to make one


class Spares:
    def __init__(self, qdir: str) -> None:
        self.base = os.path.join(qdir, DIRNAME)
        self._ready: dict[str, list[str]] = {kind: [] for kind in KINDS}
        self._cond = threading.Condition()
        self._closed = False
        self._serial = 0
        self._thread: threading.Thread | None = None

    def reset(self) -> None:
        """Remove what an earlier run left and start the filler thread."""
        shutil.rmtree(self.base, ignore_errors=True)
        try:
            os.mkdir(self.base, 0o755)
        except OSError as exc:
            log.warning("no spare message directories (%s): enqueue uses mkdir", exc)
            return
        with self._cond:
            self._wake_filler()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def take(self, kind: str = "msg") -> str | None:
        """A ready spare directory of `kind` (its file inside), or None."""
        with self._cond:
            ready = self._ready[kind]
            if not ready:
                self._wake_filler()
                return None
            path = ready.pop()
            if len(ready) < LOW:
                self._wake_filler()
            return path

    def recycle(self, path: str) -> bool:
        """Keep the plain file `path` as a `file` spare instead of deleting it
        (renamed into .spare/ unless it is there already; its content does not
        matter: a spare file is truncated when written).  False when the pool
        is full or closed or the rename fails: the caller deletes it."""
        with self._cond:
            if self._closed or len(self._ready["file"]) >= KEEP:
                return False
            target = path if os.path.dirname(path) == self.base else self._next_path("file")
        if target != path:
            try:
                os.rename(path, target)
            except OSError:
                return False
        self._publish("file", [target])
        return True

    def ready(self, kind: str = "msg") -> int:
        with self._cond:
            return len(self._ready[kind])

    def _wanted(self) -> list[str]:
        """Kinds to make, one entry per spare, when any kind is below LOW."""
        if all(len(r) >= LOW for r in self._ready.values()):
            return []
        return [kind for kind, r in self._ready.items() for _ in range(HIGH - len(r))]

    def _wake_filler(self) -> None:
        """Start the filler thread when a kind is below LOW and it does not run (called
        with the lock held).  It leaves once it has made every kind up to HIGH again: an
        idle queue keeps its spares but no thread for them (a thread is private memory of
        each of a host's queue processes, issue 17)."""
        if self._thread is None and not self._closed and self._wanted():
            self._thread = threading.Thread(target=self._fill, name="rq-spares", daemon=True)
            self._thread.start()

    def _fill(self) -> None:
        while True:
            with self._cond:
                if self._closed or not self._wanted():
                    self._thread = None
                    return
                wanted = self._wanted()
            try:
                self._make_all(wanted)
            except OSError as exc:
                log.warning("cannot make a spare directory: %s", exc)
                with self._cond:
                    self._cond.wait(RETRY_AFTER)

    def _make_all(self, wanted: list[str]) -> None:
        """Make `wanted`; each is usable as soon as it is made."""
        for kind in wanted:
            self._publish(kind, [self._make(kind)])

    def _publish(self, kind: str, paths: list[str]) -> None:
        with self._cond:
            self._ready[kind].extend(paths)

    def _next_path(self, kind: str) -> str:
        """A new name in .spare/ (the caller holds the condition's lock)."""
        self._serial += 1
        return os.path.join(self.base, f"{kind}-{self._serial}")

    def _make(self, kind: str) -> str:
        with self._cond:
            path = self._next_path(kind)
        if not KINDS[kind]:
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644))
            return path
        os.mkdir(path, 0o755)
        os.close(os.open(os.path.join(path, KINDS[kind]),
                         os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644))
        return path

