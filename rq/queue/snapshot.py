"""The que/ index a clean stop leaves for the next start (S2.7, issue 15: a restart with a
million queued messages).

Owns the file `.que-index` of a queue directory: `save` writes the index entries of every
queued message when the queue process ends its graceful stop (S2.5), `load` gives them back
to the next start instead of a read of every `que/ID/msg`, or None, when the full read must
be done.  The directory stays the truth (STYLE habit 3): the file is used only while que/ is
provably the directory it describes, and it describes one stop only.

* Its header holds que/'s identity and change time (device, inode, ctime and mtime in ns,
  link count) as they were after the last move of the stopping process.  Any entry added to,
  removed from or renamed in que/ afterwards (by RQ, a user or a restore) changes its ctime,
  which no user can set; a run/ message requeued at start (recovery) does too.  `save`
  returns only once the clock has passed the recorded ctime by more than the kernel's
  timestamp granularity, so a later change cannot carry the same ctime.
* Its body is the entries in scheduling order, in blocks of CHUNK, each with its length and
  CRC-32, then an end mark with the count: a torn or damaged file (a crash while it was
  written; no fsync is needed for that) is refused as a whole, and a block is checked before
  it is unmarshalled.
* `load` removes the file before it returns, whatever it decided: the next start after a
  crash reads que/ in full.
A queue with fewer than MIN_ENTRIES queued messages writes none: its full read costs less
than the file.  What a file cannot see: a `que/ID/msg` rewritten in place (not renamed in)
while its queue was stopped; RQ itself only replaces msg files by rename, and only while the
queue runs.  README, conformance notes.

Also owns `.que-checkpoint`, for a start after a crash (no `.que-index`): `save_checkpoint`
writes the entries as they were at one moment of a running queue (`Checkpoints`, run by
QueueState.housekeeping now and then), `load_checkpoint` gives them back with that moment;
the file stays.  It is never trusted as a whole: recovery lists que/ and keeps an entry only for a
message still there whose msg file has not changed since (its ctime, which every rename of a
new msg into place and every write sets, more than TICK before the moment); every other
message is read.  Each block's CRC-32 is seeded with the header's, so that blocks of two
different checkpoints never pass as one file.
"""

from __future__ import annotations

import logging
import marshal
import os
import struct
import threading
import time
import zlib
from collections.abc import Iterable
from typing import BinaryIO

from rq.fsops import unlink_quiet
from rq.queue.index import QueItem
from rq.store import Store

log = logging.getLogger(__name__)

NAME = ".que-index"
MAGIC = b"rq-que-index 2"
CHECKPOINT = ".que-checkpoint"
CHECKPOINT_MAGIC = b"rq-que-checkpoint 1"
CHECKPOINT_EVERY = 60.0  # seconds at least between two checkpoints
SPREAD = 20  # ... and 20 times as long as the last one took (at most ~5 % of one core)
MIN_ENTRIES = 1000
TICK = 0.025  # > the coarse clock's step of file times (1 jiffy: 4 ms at HZ=250, 10 at 100)
CHUNK = 4096  # entries per block
BLOCK = struct.Struct("<II")  # a block's length and CRC-32; (0, count) ends the file


def identity(path: str) -> tuple[int, ...]:
    """What changes whenever an entry of the directory `path` is added, removed or renamed."""
    st = os.stat(path)
    return (st.st_dev, st.st_ino, st.st_ctime_ns, st.st_mtime_ns, st.st_nlink)


def header(ident: tuple[int, ...]) -> bytes:
    """The first line: the format (marshal's, which depends on the interpreter's marshal
    version only) and que/'s identity."""
    return b" ".join([MAGIC, b"%d" % marshal.version, *(b"%d" % v for v in ident)]) + b"\n"


def encode(items: list[QueItem], seed: int = 0) -> bytes:
    """One block: the entries as plain tuples (due, id, dest, params, tries), marshalled
    (the C loader is 4x faster than a JSON line each; equal strings in a block are stored
    once, so the dests and the empty params of a block stay shared objects)."""
    data = marshal.dumps(tuple(item[:5] for item in items))
    return BLOCK.pack(len(data), zlib.crc32(data, seed)) + data


def decode(data: bytes) -> list[QueItem]:
    """The entries of one checked block (seq 0: found at start, S5.6); ValueError or
    TypeError when it holds anything else."""
    return [QueItem(due, msg_id, dest, params, tries, 0)
            for due, msg_id, dest, params, tries in marshal.loads(data)]


def save(store: Store, items: Iterable[QueItem], count: int) -> bool:
    """Write the file for the `count` entries `items` (in scheduling order) of a queue whose
    que/ no longer changes; False when there are too few or on an error (logged; the next
    start reads que/)."""
    path = os.path.join(store.qdir, NAME)
    unlink_quiet(path)
    if count < MIN_ENTRIES:
        return False
    tmp = path + ".tmp"
    try:
        ident = identity(store.state_dir("que"))
        write_file(tmp, header(ident), items, 0)
        if identity(store.state_dir("que")) != ident:
            raise OSError("que/ changed while its index was written")
        os.rename(tmp, path)
    except (OSError, ValueError) as exc:
        unlink_quiet(tmp)
        log.warning("cannot write the que/ index for the next start: %s", exc)
        return False
    wait = ident[2] / 1e9 + TICK - time.time()
    if wait > TICK:  # que/ changed "in the future": the clock was set back; no index
        unlink_quiet(path)
        return False
    if wait > 0:
        time.sleep(wait)  # a later change of que/ gets a later ctime than the one recorded
    return True


def write_file(path: str, head: bytes, items: Iterable[QueItem], seed: int) -> None:
    """The header, the entries in blocks, the end mark with their count."""
    n = 0
    with open(path, "wb") as f:
        f.write(head)
        block: list[QueItem] = []
        for item in items:
            block.append(item)
            if len(block) >= CHUNK:
                f.write(encode(block, seed))
                n, block = n + len(block), []
        if block:
            f.write(encode(block, seed))
        f.write(BLOCK.pack(0, n + len(block)))


def read_blocks(f: BinaryIO, seed: int) -> list[QueItem] | None:
    """The entries after the header, or None when the file is torn or damaged."""
    items: list[QueItem] = []
    try:
        while True:
            length, crc = BLOCK.unpack(f.read(BLOCK.size))
            if length == 0:
                if crc == len(items) and f.read(1) == b"":
                    return items
                return None
            data = f.read(length)
            if len(data) != length or zlib.crc32(data, seed) != crc:
                return None
            items.extend(decode(data))
    except (ValueError, TypeError, EOFError, struct.error):
        return None


def load(store: Store) -> list[QueItem] | None:
    """The entries the last clean stop saved, when que/ is unchanged since; else None."""
    path = os.path.join(store.qdir, NAME)
    try:
        f = open(path, "rb")
    except FileNotFoundError:
        return None
    except OSError as exc:
        log.warning("cannot read the que/ index %s: %s", NAME, exc)
        return None
    try:
        with f:
            return _read(f, store)
    finally:
        unlink_quiet(path)


def _read(f: BinaryIO, store: Store) -> list[QueItem] | None:
    first = f.readline(512)
    try:
        ident = identity(store.state_dir("que"))
    except OSError:
        return None
    if first != header(ident):
        log.info("que/ changed since the last stop: reading every queued message")
        return None
    items = read_blocks(f, 0)
    if items is None:
        log.warning("the que/ index %s is damaged: reading every queued message", NAME)
    return items


# ---------------------------------------------------------------- the running queue's checkpoint
def save_checkpoint(store: Store, items: Iterable[QueItem], taken_ns: int) -> bool:
    """Write `.que-checkpoint`: the entries `items` as they were at `taken_ns` (time.time_ns()
    when they were copied from the index).  False on an error (logged; an earlier checkpoint
    stays, checked at a start like any other)."""
    path = os.path.join(store.qdir, CHECKPOINT)
    tmp = path + ".tmp"
    head = b"%s %d %d\n" % (CHECKPOINT_MAGIC, marshal.version, taken_ns)
    try:
        write_file(tmp, head, items, zlib.crc32(head))
        os.rename(tmp, path)
    except (OSError, ValueError) as exc:
        unlink_quiet(tmp)
        log.warning("cannot write the que/ checkpoint: %s", exc)
        return False
    return True


def load_checkpoint(store: Store) -> tuple[int, dict[str, QueItem]] | None:
    """(the moment it was taken in ns, its entries by msg id), or None when there is no usable
    checkpoint (missing, damaged, another format, or taken in the future: a clock set back).
    The file stays: recovery checks every entry it keeps against que/."""
    path = os.path.join(store.qdir, CHECKPOINT)
    try:
        with open(path, "rb") as f:
            head = f.readline(512)
            magic, _, rest = head.rpartition(b" %d " % marshal.version)
            try:
                taken_ns = int(rest)
            except ValueError:
                taken_ns = -1
            if magic != CHECKPOINT_MAGIC or taken_ns < 0 or taken_ns > time.time_ns():
                log.info("the que/ checkpoint is of another format or from the future: unused")
                return None
            items = read_blocks(f, zlib.crc32(head))
    except FileNotFoundError:
        return None
    except OSError as exc:
        log.warning("cannot read the que/ checkpoint: %s", exc)
        return None
    if items is None:
        log.warning("the que/ checkpoint is damaged: reading every queued message")
        return None
    return taken_ns, {item.msg_id: item for item in items}


class Checkpoints:
    """When the running queue writes `.que-checkpoint`: at most every `every` seconds and
    SPREAD times as long as the last write took, only while MIN_ENTRIES or more are queued
    and que/ changed since the last one (its identity), from a thread (a million entries take
    ~2.5 s to write; the loop only copies the list).  Below MIN_ENTRIES the file is removed:
    a start after a crash would load all of a stale one's entries to use a few."""

    def __init__(self, store: Store, every: float = CHECKPOINT_EVERY) -> None:
        self.store = store
        self.set_every(every)
        self.busy = False
        self.written: tuple[int, ...] | None = None  # que/'s identity at the last one
        self.small = False  # below MIN_ENTRIES since the last look (the file removed)

    def set_every(self, seconds: float) -> None:
        self.every = seconds
        self.next_at = time.monotonic() + seconds

    def take(self, order: Iterable[QueItem], count: int) -> None:
        """Called by the loop, holding the queue's lock, once `next_at` has passed."""
        self.next_at = time.monotonic() + self.every
        if self.busy:
            return
        if count < MIN_ENTRIES:
            if not self.small:
                unlink_quiet(os.path.join(self.store.qdir, CHECKPOINT))
                self.small, self.written = True, None
            return
        self.small = False
        try:
            ident = identity(self.store.state_dir("que"))
        except OSError:
            return
        if ident == self.written:
            return
        items = list(order)
        if len(items) != count:  # dups are entries of both (as at a stop)
            return
        self.busy = True
        threading.Thread(target=self.write, args=(items, time.time_ns(), ident),
                         name="que-checkpoint", daemon=True).start()

    def write(self, items: list[QueItem], taken_ns: int, ident: tuple[int, ...]) -> None:
        started = time.monotonic()
        ok = save_checkpoint(self.store, items, taken_ns)
        ended = time.monotonic()
        self.written = ident if ok else None
        self.next_at = max(self.next_at, ended + SPREAD * (ended - started))
        self.busy = False
