"""Load stage of the analytics job: the run directory and its atomic publication.

Owns the on-disk layout of docs/analytics.md: `OUT/runs/<RUNID>/` is built under a private name
(`runs/<RUNID>.partial`), every file and directory in it fsynced, renamed to `runs/<RUNID>`, and
only then `OUT/current` is pointed at it by rename(2) of a fresh symlink (STYLE habit 1: publish by
one rename).  Readers that resolve `current` once never see a half-written result.  The newest
KEEP runs are kept.  The output is a local directory (the symlink and fsync need one).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from rq.analytics.session import AnalyticsError

KEEP = 5
RUN_RE = re.compile(r"^\d{8}T\d{6}Z-[0-9a-f]{6}$")
PARTIAL = ".partial"
STALE_PARTIAL_S = 6 * 3600
FSYNC_THREADS = 8


def new_run_id(now: float) -> str:
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now)) + "-" + secrets.token_hex(3)


def output_dir(output: str) -> str:
    """The absolute local output directory (created); a non-local URI is refused."""
    if "://" in output and not output.startswith("file://"):
        raise AnalyticsError(f"--output must be a local directory, not {output}")
    path = os.path.abspath(output.removeprefix("file://"))
    try:
        os.makedirs(os.path.join(path, "runs"), exist_ok=True)
    except OSError as exc:
        raise AnalyticsError(f"cannot create output directory {path}: {exc.strerror}") from None
    return path


def partial_dir(out: str, run_id: str) -> str:
    path = os.path.join(out, "runs", run_id + PARTIAL)
    os.makedirs(path)
    return path


def fsync_path(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_json(path: str, obj: Any) -> None:
    """Compact JSON, written to a temp name, fsynced, renamed into place.  Encoded in one
    piece: json.dump streams through the pure-Python encoder (~6x slower on the hourly rows
    and the stored totals, megabytes each), json.dumps uses the C one."""
    tmp = path + ".tmp"
    text = json.dumps(obj, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.rename(tmp, path)


def fsync_tree(top: str) -> None:
    """fsync every file, then every directory (Spark's writer does neither); the caller
    publishes the tree by a rename only after this returns.  The fsyncs run FSYNC_THREADS
    at a time: they wait on the device, and concurrent ones share its cache flushes (a
    compaction of 30 days is ~9,000 of them: 1.1 s one by one, docs/benchmarks.md)."""
    files: list[str] = []
    dirs: list[str] = []
    for dirpath, _dirs, names in os.walk(top, topdown=False):
        files += [os.path.join(dirpath, name) for name in names]
        dirs.append(dirpath)
    if len(files) + len(dirs) < 16:  # a few files: no threads for them
        for path in files + dirs:
            fsync_path(path)
        return
    with ThreadPoolExecutor(FSYNC_THREADS, "rq-fsync") as pool:
        for batch in (files, dirs):
            list(pool.map(fsync_path, batch))  # raises the first failure


def publish(out: str, run_id: str) -> str:
    """runs/<RUNID>.partial → runs/<RUNID>, then `current` → it; returns the run directory."""
    runs = os.path.join(out, "runs")
    final = os.path.join(runs, run_id)
    fsync_tree(final + PARTIAL)
    os.rename(final + PARTIAL, final)
    fsync_path(runs)
    tmp = os.path.join(out, f".current.{os.getpid()}.{secrets.token_hex(3)}")
    os.symlink(os.path.join("runs", run_id), tmp)
    os.rename(tmp, os.path.join(out, "current"))
    fsync_path(out)
    return final


def prune(out: str, now: float, keep: int = KEEP) -> list[str]:
    """Remove all but the newest `keep` runs, and partial runs older than STALE_PARTIAL_S."""
    runs = os.path.join(out, "runs")
    current = os.path.basename(os.path.realpath(os.path.join(out, "current")))
    names = sorted(n for n in os.listdir(runs) if RUN_RE.match(n))
    doomed = [n for n in names[:-keep] if n != current] if keep else []
    for name in os.listdir(runs):
        if name.endswith(PARTIAL):
            try:
                if now - os.stat(os.path.join(runs, name)).st_mtime > STALE_PARTIAL_S:
                    doomed.append(name)
            except OSError:
                pass
    for name in doomed:
        shutil.rmtree(os.path.join(runs, name), ignore_errors=True)
    return doomed
