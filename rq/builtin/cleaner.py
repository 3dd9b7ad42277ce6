#!/usr/bin/env python3
"""The `cleaner` builtin queue script (SPEC S12.3): prunes finished and abandoned messages.

RQ_PARAM1 = a queue name or ALLQUEUES; RQ_PARAM2 = days to keep (its first run of digits,
default 2).  For each selected queue under the RQ root (RQ_ROOT; fix: the original hard-coded
/rq/current) it deletes done/ and relayed/ minute buckets whose end is at least that old, then
the hour and day buckets that became empty, and prep/ messages whose id time is older; err/ is
never touched.  ALLQUEUES also trims queue/relay/relayed/ to its newest 60000 messages and drops
log/events/YYYYMMDD/ directories older than event_retention_days (S1.4, S13), each only after
rq-mgr has counted what its named cursors lose (issue 18: their `gap` record).

S0.3.2 lets the cleaner delete finished messages directly (no queue process is asked).  It logs
`<pid> - <time> - <text>` lines to stdout (the job's stdio.log) and reports on fd 3 (S6.4).
Standalone on purpose: stdlib only, nothing of rq but its neighbour jobio, so it also runs by
hand.
"""

from __future__ import annotations

import calendar
import json
import os
import re
import shutil
import sys
import time
from collections.abc import Iterator

if __package__:  # imported as rq.builtin.cleaner
    from rq.builtin import jobio
else:  # run as a file (S12): python put this folder first on sys.path
    import jobio  # type: ignore[no-redef]

ALL = "ALLQUEUES"
DEFAULT_DAYS = 2
RELAYED_KEEP = 60000
DEFAULT_EVENT_RETENTION_DAYS = 30
HASHDIR_STATES = ("done", "relayed")
ID_RE = re.compile(r"^(\d{4})(\d{2})(\d{2})\.(\d{2})(\d{2})\.(\d{2})\.(\d{3})\.\d+$")
DAY_RE = re.compile(r"^(\d{4})(\d{2})(\d{2})$")
TWO_DIGITS = re.compile(r"^\d{2}$")
BAD_NAME_CHARS = set("/. ,;:@\"(){}\\+='^`#~?[]%|$&<>*")  # S3.1


def valid_queue_name(name: str) -> bool:
    return (0 < len(name.encode()) <= 128
            and not any(c in BAD_NAME_CHARS or c.isspace() or not c.isprintable() for c in name))


def day_start(name: str) -> int | None:
    """Epoch of 00:00 UTC of a YYYYMMDD bucket name, or None for anything else."""
    m = DAY_RE.match(name)
    if not m:
        return None
    year, month, mday = int(m[1]), int(m[2]), int(m[3])
    if not (1 <= month <= 12 and 1 <= mday <= 31):
        return None
    return calendar.timegm((year, month, mday, 0, 0, 0, 0, 0, 0))


def id_epoch(msg_id: str) -> float | None:
    """Creation time (UTC) encoded in a short id (S4.1), or None if it is not one."""
    m = ID_RE.match(msg_id)
    if not m:
        return None
    start = day_start(m[1] + m[2] + m[3])
    if start is None:
        return None
    return start + int(m[4]) * 3600 + int(m[5]) * 60 + int(m[6]) + int(m[7]) / 1000


def subdirs(path: str, pattern: re.Pattern[str] = TWO_DIGITS) -> Iterator[tuple[str, str]]:
    """(name, path) of the real (non-symlink) subdirectories whose name matches, sorted."""
    try:
        entries = sorted(os.scandir(path), key=lambda e: e.name)
    except OSError:
        return
    for entry in entries:
        if pattern.match(entry.name) and entry.is_dir(follow_symlinks=False):
            yield entry.name, entry.path


def remove_tree(path: str) -> bool:
    try:
        shutil.rmtree(path)
        return True
    except FileNotFoundError:
        return True  # already gone (an operator or the queue deleted it): fine
    except OSError as err:
        jobio.log(f"could not remove {path}: {err.strerror or err}")
        return False


def remove_if_empty(path: str) -> bool:
    try:
        os.rmdir(path)
        return True
    except OSError:
        return False  # not empty (or gone): leave it


def prune_hashdir(state_dir: str, cutoff: float) -> int:
    """Delete minute buckets ending at or before `cutoff`, then the hour/day buckets emptied."""
    removed = 0
    for day, day_dir in subdirs(state_dir, DAY_RE):
        start = day_start(day)
        if start is None or start + 60 > cutoff:
            continue  # not even its first minute is old enough
        day_touched = False
        for hour, hour_dir in subdirs(day_dir):
            hour_start = start + int(hour) * 3600
            if int(hour) > 23 or hour_start + 60 > cutoff:
                continue
            hour_touched = False
            for minute, minute_dir in subdirs(hour_dir):
                ended = hour_start + int(minute) * 60 + 60
                if int(minute) < 60 and ended <= cutoff and remove_tree(minute_dir):
                    removed += 1
                    hour_touched = True
            if (hour_touched or hour_start + 3600 <= cutoff) and remove_if_empty(hour_dir):
                day_touched = True
        if day_touched or start + 86400 <= cutoff:
            remove_if_empty(day_dir)
    return removed


def prune_prep(prep_dir: str, now: float, keep_secs: float) -> int:
    """Delete prep/ messages whose id time is more than keep_secs old (fix: never cleaned)."""
    removed = 0
    try:
        entries = sorted(os.scandir(prep_dir), key=lambda e: e.name)
    except OSError:
        return 0
    for entry in entries:
        born = id_epoch(entry.name)
        if born is not None and now - born > keep_secs and entry.is_dir(follow_symlinks=False):
            removed += remove_tree(entry.path)
    return removed


def journal_since(qdir: str) -> float | None:
    """When the oldest segment of the queue's create journal was opened (its name is
    that time in ns, rq.queue.journal), or None.  A message created since may be only
    its record until the journal settles, so nothing that recent is removed: a power
    loss would bring it back."""
    try:
        names = sorted(n for n in os.listdir(qdir)
                       if n.startswith("journal-") and n.endswith(".jnl"))
    except OSError:
        return None
    if not names:
        return None
    stem = names[0][len("journal-"):-len(".jnl")]
    return int(stem) / 1e9 if stem.isdigit() else 0.0


def clean_queue(root: str, name: str, now: float, days: int) -> None:
    qdir = os.path.join(root, "queue", name)
    cutoff = now - days * 86400
    since = journal_since(qdir)
    if since is not None and since < cutoff:  # with days 0: only what settled
        cutoff = since
    counts = [f"{state} {prune_hashdir(os.path.join(qdir, state), cutoff)} buckets"
              for state in HASHDIR_STATES]
    counts.append(f"prep {prune_prep(os.path.join(qdir, 'prep'), cutoff, 0)} messages")
    jobio.log(f"cleaned queue {name} (keeping {days} days): removed " + ", ".join(counts))


def trim_relayed(relayed_dir: str, keep: int = RELAYED_KEEP) -> int:
    """Keep only the newest `keep` messages of a relayed/ hashdir (newest = S3.2 order)."""
    seen = removed = 0
    for _day, day_dir in reversed(list(subdirs(relayed_dir, DAY_RE))):
        for _hour, hour_dir in reversed(list(subdirs(day_dir))):
            for _minute, minute_dir in reversed(list(subdirs(hour_dir))):
                try:
                    ids = sorted(os.listdir(minute_dir), reverse=True)
                except OSError:
                    continue
                for msg_id in ids[max(keep - seen, 0):]:
                    removed += remove_tree(os.path.join(minute_dir, msg_id))
                seen += len(ids)
                if seen > keep:
                    remove_if_empty(minute_dir)
            if seen > keep:
                remove_if_empty(hour_dir)
        if seen > keep:
            remove_if_empty(day_dir)
    return removed


def event_retention_days(root: str) -> int:
    """event_retention_days from config/config.json (S1.4): default 30, 0 = keep forever."""
    try:
        with open(os.path.join(root, "config", "config.json"), encoding="utf-8") as f:
            value = json.load(f).get("event_retention_days", DEFAULT_EVENT_RETENTION_DAYS)
    except (OSError, ValueError, AttributeError):
        return DEFAULT_EVENT_RETENTION_DAYS
    if isinstance(value, str) and value.isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        jobio.log(f"invalid event_retention_days {value!r}; using {DEFAULT_EVENT_RETENTION_DAYS}")
        return DEFAULT_EVENT_RETENTION_DAYS
    return value


def compacted_days(analytics_dir: str, events_dir: str) -> set[str] | None:
    """Days of `events_dir` that the analytics job has compacted durably (issue 19): listed in
    its manifest (docs/analytics.md) with their Parquet directory in place.  None when nothing
    was ever compacted there (retention then works as before).  Read here with the stdlib only,
    the file's format being owned by rq.analytics.manifest."""
    try:
        with open(os.path.join(analytics_dir, "compacted", "manifest.json"),
                  encoding="utf-8") as f:
            book = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return set()  # unreadable: hold every day back until the job rewrites it
    want = os.path.abspath(events_dir)
    for tree in (book.get("trees") or {}).values():
        if isinstance(tree, dict) and tree.get("events_dir") == want:
            return {day for day, entry in (tree.get("days") or {}).items()
                    if os.path.isdir(os.path.join(analytics_dir, str(entry.get("dir"))))}
    return set()


def prune_events(events_dir: str, now: float, days: int, analytics_dir: str | None = None) -> int:
    """Delete log/events/YYYYMMDD/ days that ended at least `days` days ago (0 = never); once
    the analytics job compacts (ROOT/analytics, issue 19), only days whose partition is durable."""
    if days <= 0:
        return 0
    if analytics_dir is None:
        analytics_dir = os.path.join(os.path.dirname(os.path.dirname(events_dir)), "analytics")
    durable = compacted_days(analytics_dir, events_dir)
    removed = 0
    for day, day_dir in subdirs(events_dir, DAY_RE):
        start = day_start(day)
        if durable is not None and day not in durable:
            continue
        if start is not None and start + 86400 <= now - days * 86400:
            if retire_for_cursors(events_dir, day):
                removed += remove_tree(day_dir)
    return removed


def retire_for_cursors(events_dir: str, day: str) -> bool:
    """Issue 18 item 3: before a day goes, rq-mgr counts into every named cursor
    the events of it the cursor has not passed (its stream reports them as one
    `gap` record).  No cursors: nothing to ask.  rq-mgr not answering while
    cursors exist: the day is kept for the next run (never lost silently)."""
    root = os.path.dirname(os.path.dirname(events_dir))
    try:
        if not any(n.endswith(".cursor") for n in os.listdir(os.path.join(root, "log", "cursors"))):
            return True
    except OSError:
        return True
    try:
        reply = call_mgr(root, "retire_events", {"day": day})
    except (OSError, ValueError) as err:
        jobio.log(f"kept log/events/{day}: cannot tell rq-mgr's cursors ({err})")
        return False
    if not (isinstance(reply, list) and reply[:1] == ["ok"]):
        jobio.log(f"kept log/events/{day}: rq-mgr answered {reply!r}")
        return False
    lost = {k: v for k, v in (reply[1] or {}).items() if v}
    if lost:
        jobio.log(f"log/events/{day}: events cursors had not passed: {lost}")
    return True


def call_mgr(root: str, cmd: str, arg: object, timeout: float = 600.0) -> object:
    """One rq1 request (S7.1 framing) to rq-mgr's socket, stdlib only.  A long
    timeout: counting a big day a cursor has not read means reading it."""
    import socket
    body = f"{cmd} {json.dumps(arg)}".encode()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(os.path.join(root, "config", "queuemgr.sock"))
        sock.sendall(b"rq1 %08d " % len(body) + body)
        data = b""
        while len(data) < 13 or len(data) < 13 + int(data[4:12]):
            chunk = sock.recv(65536)
            if not chunk:
                raise ValueError("no reply")
            data += chunk
    return json.loads(data[13:13 + int(data[4:12])])


def all_queue_names(root: str) -> list[str]:
    """Every queue directory; trash (`NAME.deleted.N`, S3.7) has a dot and is skipped."""
    qroot = os.path.join(root, "queue")
    try:
        names = sorted(os.listdir(qroot))
    except OSError:
        return []
    return [n for n in names if valid_queue_name(n) and os.path.isdir(os.path.join(qroot, n))]


def find_root(env: dict[str, str]) -> str:
    """RQ_ROOT (S1.2, exported by every daemon); by hand, the root above queue/Q/run/ID/job."""
    if env.get("RQ_ROOT"):
        return os.path.abspath(env["RQ_ROOT"])
    job_dir = env.get("RQ_MSG_DIR") or os.getcwd()
    return os.path.abspath(os.path.join(job_dir, *[os.pardir] * 5))


def run(env: dict[str, str], now: float) -> int:
    target = env.get("RQ_PARAM1", "").strip()
    if not target:
        jobio.send("fail need to specify a PARAM1")
        return 1
    digits = re.search(r"\d+", env.get("RQ_PARAM2", ""))
    days = int(digits.group()) if digits else DEFAULT_DAYS
    root = find_root(env)
    if target == ALL:
        queues = all_queue_names(root)
    elif valid_queue_name(target) and os.path.isdir(os.path.join(root, "queue", target)):
        queues = [target]
    else:
        jobio.send(f"fail no such queue: {target}")
        return 0
    jobio.log(f"cleaning {target} under {root}, keeping {days} days")
    for name in queues:
        clean_queue(root, name, now, days)
    if target == ALL:
        trimmed = trim_relayed(os.path.join(root, "queue", "relay", "relayed"))
        jobio.log(f"trimmed relay/relayed to the newest {RELAYED_KEEP}: removed {trimmed} messages")
        retention = event_retention_days(root)
        pruned = prune_events(os.path.join(root, "log", "events"), now, retention)
        jobio.log(f"event log retention {retention} days: removed {pruned} day directories")
    jobio.send("done successfully ran this script")
    return 0


def main() -> int:
    try:
        return run(dict(os.environ), time.time())
    except Exception as err:  # S0.3.3: a failure becomes the message's err text, not a trace
        jobio.send(f"fail cleaner failed: {err}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
