"""`rq fsck`: check that a root's message store is consistent (issue 2, crash tests).

Owns the read-only consistency rules: every message id lives in exactly one
state of its queue, every committed message's `msg` parses as a JSON object
whose `msg_id` is its directory name and which has a `dest`, and done/relayed
messages sit in the hashdir bucket of their id (S3.2).  Event-log files with a
torn or corrupt tail, and the sidecars their bad bytes were moved to, are
reported as notes (S13.4, issue 18): nothing acknowledged is lost.  Uncommitted `prep`
messages without a readable `msg` (a crash during allocation) are reported as
notes, not problems: they were never acknowledged.  A message whose create
journal record has not settled yet (rq.queue.journal: a power loss may have taken
its directory, its msg or its commit) counts where the queue's next start puts it
back, with a note.  It never changes anything.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import IO

from rq import events, message, protocol
from rq.queue import journal
from rq.store import HASHED, STATES, Store


@dataclass
class Report:
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    states: dict[str, dict[str, str]] = field(default_factory=dict)  # queue -> id -> state

    @property
    def messages(self) -> int:
        return sum(len(ids) for ids in self.states.values())


def check_root(root: str) -> Report:
    report = Report()
    qbase = os.path.join(root, "queue")
    try:
        names = sorted(os.listdir(qbase))
    except OSError as exc:
        report.problems.append(f"cannot list {qbase}: {exc.strerror}")
        return report
    for name in names:
        if protocol.valid_queue_name(name) and os.path.isdir(os.path.join(qbase, name)):
            report.states[name] = check_queue(Store(root, name), report)
    report.notes.extend(events.torn_tails(root))
    return report


def check_queue(store: Store, report: Report) -> dict[str, str]:
    seen: dict[str, str] = {}
    # A running queue settles its journal within a second and will never replay it: its
    # spool is judged as it is.  A stopped one (a crash) replays it at its next start.
    records = [] if queue_running(store.qdir) else journal.read_records(store.qdir)
    steps = {step.msg_id: step for step in journal.plan(store, records)} if records else {}
    for state in STATES:
        for msg_id, path in _entries(store, state, report):
            where = f"{store.name}/{state}/{msg_id}"
            if msg_id in seen:
                report.problems.append(
                    f"{store.name}/{msg_id}: present in both {seen[msg_id]} and {state}")
                continue
            seen[msg_id] = state
            step = steps.get(msg_id)
            if step is not None and step.mend:
                continue  # replay writes it again
            _check_msg(where, msg_id, path, state, report, cut=step is None)
    replayed = 0
    for msg_id, step in steps.items():
        final = step.final_state
        if final is None:
            report.problems.append(f"{store.name}/{msg_id}: journaled, gone, and its record "
                                   "holds no msg")
        elif step.commit or step.mend:
            seen[msg_id] = final
            replayed += 1
    if replayed:
        report.notes.append(f"{store.name}: {replayed} message(s) of the create journal not "
                            "yet settled on disk: the queue's next start puts them back")
    return seen


def queue_running(qdir: str) -> bool:
    """Whether a queue process holds the queue's `.lock` (its flock, rq.queue.process),
    read from /proc/locks: trying the lock ourselves could make a starting queue fail."""
    try:
        st = os.stat(os.path.join(qdir, ".lock"))
        with open("/proc/locks") as fh:
            table = fh.read()
    except OSError:
        return False
    key = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino} "
    return any(" FLOCK " in line and key in line for line in table.splitlines())


def _entries(store: Store, state: str, report: Report) -> list[tuple[str, str]]:
    out = []
    if state in HASHED:
        for msg_id in store.iter_hashed(state, newest_first=False):
            out.append((msg_id, store.msg_path(state, msg_id)))
        _check_buckets(store, state, report)
        return out
    sdir = store.state_dir(state)
    for entry in sorted(os.listdir(sdir)) if os.path.isdir(sdir) else []:
        if entry.startswith("."):
            continue
        if not protocol.valid_msg_id(entry):
            report.problems.append(f"{store.name}/{state}/{entry}: not a message id")
            continue
        out.append((entry, os.path.join(sdir, entry)))
    return out


def _check_buckets(store: Store, state: str, report: Report) -> None:
    """A message under a wrong bucket would be invisible to lookups by id."""
    base = store.state_dir(state)
    for dirpath, dirnames, _ in os.walk(base):
        depth = os.path.relpath(dirpath, base).count(os.sep) + (dirpath != base)
        if depth == 3:
            for msg_id in dirnames:
                expected = message.bucket(msg_id) if protocol.valid_msg_id(msg_id) else None
                if expected != os.path.relpath(dirpath, base):
                    report.problems.append(f"{store.name}/{state}/{os.path.relpath(dirpath, base)}"
                                           f"/{msg_id}: not in its id's bucket")
            dirnames[:] = []


def _check_msg(where: str, msg_id: str, path: str, state: str, report: Report,
               cut: bool) -> None:
    """Problems of the msg file.  A msg in que/ with no journal record (`cut`) that is
    missing, empty or all NUL bytes is what a power loss leaves of a create that the
    create journal never acknowledged: a note (S2.7.4 skips it and leaves it there)."""
    raw = b""
    try:
        with open(os.path.join(path, "msg"), "rb") as fh:
            raw = fh.read()
        data = json.loads(raw)
    except (OSError, ValueError) as exc:
        text = f"{where}: msg unreadable ({exc.__class__.__name__})"
        if state == "que" and cut and not raw.strip(b"\0"):
            report.notes.append(f"{text}: an unacknowledged create cut by a power loss")
            return
        (report.notes if state == "prep" else report.problems).append(text)
        return
    if not isinstance(data, dict) or data.get("msg_id") != msg_id or not data.get("dest"):
        report.problems.append(f"{where}: msg does not describe this message")


def main(root: str, out: IO[str], err: IO[str]) -> int:
    """Print the problems (and notes); exit 0 when the store is consistent."""
    report = check_root(root)
    for note in report.notes:
        print(f"note: {note}", file=out)
    for problem in report.problems:
        print(f"problem: {problem}", file=out)
    verdict = "OK" if not report.problems else f"{len(report.problems)} problem(s)"
    print(f"fsck: {len(report.states)} queue(s), {report.messages} message(s): {verdict}",
          file=out)
    return 0 if not report.problems else 1
