"""The compaction manifest of the analytics job (issue 19): which raw days are compacted, from what.

Owns `OUT/compacted/manifest.json` and its lock.  Finished UTC days of an event log
(`log/events/YYYYMMDD/`, S13.1) are compacted once into a Parquet directory
`OUT/compacted/<events-key>/<DAY>.<token>/` (rq.analytics.compact); the manifest records, per
events directory and day, that directory's name and every source file it came from: size, mtime
and a SHA-256 of the prefix that was read and checked (S13.4).  A day is *fresh* when its raw
directory is gone (retention removed it after compaction) or holds exactly those files with those
sizes and contents; anything else (a late writer, a repaired torn tail, a new queue file) makes it
stale, and it is compacted again.  Each day entry also records the day's line counts (`lines`:
valid, and skipped by S13.4 reason).  The top-level `state` entry names the per-message state
table (rq.analytics.state) and the compacted day directories it covers.  Pure Python, no
pyspark: the cleaner (S13 retention) reads it to remove only raw days whose partition is durable.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
from collections.abc import Iterator, Mapping
from typing import Any

DAY = 86400
# A day is finished this long after its UTC midnight: a queue process appends an event after
# the transition is on disk (S13.1), so the last lines of a day can land a moment after it.
# A line later still only makes the day stale (it is then compacted again), never lost.
GRACE_S = 600
VERSION = 1
CHUNK = 1 << 20
REASONS = ("torn", "layout", "crc", "json")   # S13.4, as rq.analytics.transform.REASONS
STATE_PREFIX = "state."                      # OUT/compacted/state.<token>/
FACTS_SUFFIX = ".facts"                      # OUT/compacted/state.<token>.facts/
# The stored facts' layout and the bucket function they were written with (facts.bucket):
# facts of another version are written again from the state (rq.analytics.stored).
# 4: messages/ files by the first day of each message, no longer by its key.
FACTS_VERSION = 4


def zero_lines() -> dict[str, int]:
    return {"valid": 0, **{r: 0 for r in REASONS}}


def compacted_dir(out: str) -> str:
    return os.path.join(out, "compacted")


def manifest_path(out: str) -> str:
    return os.path.join(compacted_dir(out), "manifest.json")


def events_key(events_dir: str) -> str:
    """A directory name for one events tree (several inputs may be compacted side by side)."""
    return hashlib.sha256(os.path.abspath(events_dir).encode()).hexdigest()[:16]


def day_finished(day_start: int, now: float) -> bool:
    return day_start + DAY + GRACE_S <= now


def prefix_sha256(path: str, size: int) -> str:
    """SHA-256 of the first `size` bytes of `path` (the part that was read and checked)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        left = size
        while left > 0:
            chunk = f.read(min(CHUNK, left))
            if not chunk:
                break
            digest.update(chunk)
            left -= len(chunk)
    return digest.hexdigest()


def source_record(path: str, size: int) -> dict[str, Any]:
    st = os.stat(path)
    return {"size": size, "mtime": st.st_mtime, "sha256": prefix_sha256(path, size)}


def load_manifest(out: str) -> dict[str, Any]:
    """The manifest, or an empty one (no compaction yet, or an unreadable file: recompact)."""
    try:
        with open(manifest_path(out), encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return {"version": VERSION, "trees": {}}
    if not isinstance(data, dict) or data.get("version") != VERSION:
        return {"version": VERSION, "trees": {}}
    data.setdefault("trees", {})
    return data


def day_entry(manifest: Mapping[str, Any], events_dir: str, day: str) -> dict[str, Any] | None:
    tree = manifest["trees"].get(events_key(events_dir))
    return tree["days"].get(day) if tree else None


def set_day_entry(manifest: dict[str, Any], events_dir: str, day: str,
                  entry: dict[str, Any]) -> None:
    tree = manifest["trees"].setdefault(
        events_key(events_dir), {"events_dir": os.path.abspath(events_dir), "days": {}})
    tree["days"][day] = entry


def raw_files(day_dir: str) -> dict[str, int]:
    """name → size of the `QUEUE.jsonl` files of a raw day directory ({} when it is gone)."""
    try:
        with os.scandir(day_dir) as it:
            return {e.name: e.stat().st_size for e in it
                    if e.name.endswith(".jsonl") and "." not in e.name[:-6] and e.is_file()}
    except FileNotFoundError:
        return {}


def day_fresh(entry: Mapping[str, Any] | None, day_dir: str, out: str) -> bool:
    """The compacted day still stands for its raw files (or they were removed by retention)."""
    if entry is None or not os.path.isdir(os.path.join(out, entry["dir"])):
        return False
    if not os.path.isdir(day_dir):
        return True
    sources = entry["files"]
    if raw_files(day_dir) != {name: rec["size"] for name, rec in sources.items()}:
        return False
    for name, rec in sources.items():
        path = os.path.join(day_dir, name)
        # Same size and mtime: unchanged.  Same size, new mtime (a rewrite in place, a copy):
        # the content hash of the checked prefix decides.
        if os.stat(path).st_mtime != rec["mtime"] and prefix_sha256(path, rec["size"]) != rec[
                "sha256"]:
            return False
    return True


@contextlib.contextmanager
def locked(out: str) -> Iterator[None]:
    """One compacting run at a time per output (an flock: it dies with its process)."""
    os.makedirs(compacted_dir(out), exist_ok=True)
    fd = os.open(os.path.join(compacted_dir(out), ".lock"),
                 os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def facts_path(out: str, book: dict[str, Any]) -> str | None:
    """The state's stored facts (rq.analytics.stored), when they exist in this version."""
    entry = book.get("state") or {}
    rel = entry.get("facts")
    if not rel or entry.get("facts_version") != FACTS_VERSION:
        return None
    return os.path.join(out, rel) if os.path.isdir(os.path.join(out, rel)) else None
