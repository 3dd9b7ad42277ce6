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
* Its body is one compact JSON array per entry in scheduling order, then a trailer with the
  count and the CRC-32 of the body: a torn or damaged file (a crash while it was written; no
  fsync is needed for that) is refused as a whole.
* `load` removes the file before it returns, whatever it decided: the next start after a
  crash reads que/ in full.
A queue with fewer than MIN_ENTRIES queued messages writes none: its full read costs less
than the file.  What a file cannot see: a `que/ID/msg` rewritten in place (not renamed in)
while its queue was stopped; RQ itself only replaces msg files by rename, and only while the
queue runs.  README, conformance notes.
"""

from __future__ import annotations

import logging
import os
import sys
import time
import zlib
from collections.abc import Iterable

from rq import jsonwire
from rq.fsops import unlink_quiet
from rq.queue.index import NO_PARAMS, QueItem
from rq.store import Store

log = logging.getLogger(__name__)

NAME = ".que-index"
MAGIC = b"rq-que-index 1"
MIN_ENTRIES = 1000
TICK = 0.025  # > the coarse clock's step of file times (1 jiffy: 4 ms at HZ=250, 10 at 100)
CHUNK = 4096  # lines per write


def identity(path: str) -> tuple[int, ...]:
    """What changes whenever an entry of the directory `path` is added, removed or renamed."""
    st = os.stat(path)
    return (st.st_dev, st.st_ino, st.st_ctime_ns, st.st_mtime_ns, st.st_nlink)


def encode(item: QueItem) -> bytes:
    due = int(item.due) if item.due.is_integer() else item.due
    fields = [due, item.msg_id, item.dest]
    if item.params != NO_PARAMS:
        fields.extend(item.params)
    fields.append(item.tries)
    return jsonwire.dumps(fields).encode() + b"\n"


def decode(line: bytes) -> QueItem:
    """The entry of one body line (seq 0: found at start, S5.6); ValueError when damaged."""
    v = jsonwire.loads(line)
    if not isinstance(v, list) or len(v) not in (4, 8):
        raise ValueError("not an entry")
    params = NO_PARAMS if len(v) == 4 else tuple(v[3:7])
    if not all(isinstance(p, str) for p in params) or not isinstance(v[1], str) \
            or not isinstance(v[2], str) or not isinstance(v[-1], int):
        raise ValueError("not an entry")
    return QueItem(float(v[0]), v[1], sys.intern(v[2]), params, v[-1], 0)  # type: ignore[arg-type]


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
        crc, n = 0, 0
        with open(tmp, "wb") as f:
            f.write(MAGIC + b" " + b" ".join(b"%d" % v for v in ident) + b"\n")
            lines: list[bytes] = []
            for item in items:
                lines.append(encode(item))
                if len(lines) >= CHUNK:
                    block = b"".join(lines)
                    crc, n, lines = zlib.crc32(block, crc), n + len(lines), []
                    f.write(block)
            block = b"".join(lines)
            crc, n = zlib.crc32(block, crc), n + len(lines)
            f.write(block + b"end %d %08x\n" % (n, crc))
        if identity(store.state_dir("que")) != ident:
            raise OSError("que/ changed while its index was written")
        os.rename(tmp, path)
    except (OSError, ValueError) as exc:  # ValueError: a due JSON cannot hold (inf)
        unlink_quiet(tmp)
        log.warning("cannot write the que/ index for the next start: %s", exc)
        return False
    wait = ident[2] / 1e9 + TICK - time.time()
    if wait > 0:
        time.sleep(wait)  # a later change of que/ gets a later ctime than the one recorded
    return True


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


def _read(f: Iterable[bytes], store: Store) -> list[QueItem] | None:
    lines = iter(f)
    header = next(lines, b"").split()
    try:
        ident = identity(store.state_dir("que"))
    except OSError:
        return None
    if b" ".join(header[:2]) != MAGIC or header[2:] != [b"%d" % v for v in ident]:
        log.info("que/ changed since the last stop: reading every queued message")
        return None
    items: list[QueItem] = []
    crc = 0
    try:
        for line in lines:
            if line.startswith(b"end "):
                n, want = line.split()[1:]
                if int(n) == len(items) and int(want, 16) == crc and next(lines, None) is None:
                    return items
                break
            crc = zlib.crc32(line, crc)
            items.append(decode(line))
    except (ValueError, UnicodeDecodeError):
        pass
    log.warning("the que/ index %s is damaged: reading every queued message", NAME)
    return None
