"""`rq fsck`: check that a root's message store is consistent (issue 2, crash tests).

Owns the read-only consistency rules: every message id lives in exactly one
state of its queue, every committed message's `msg` parses as a JSON object
whose `msg_id` is its directory name and which has a `dest`, and done/relayed
messages sit in the hashdir bucket of their id (S3.2).  Event-log files with a
torn or corrupt tail, and the sidecars their bad bytes were moved to, are
reported as notes (S13.4, issue 18): nothing acknowledged is lost.  Uncommitted `prep`
messages without a readable `msg` (a crash during allocation) are reported as
notes, not problems: they were never acknowledged.  It never changes anything.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import IO

from rq import events, message, protocol
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
    for state in STATES:
        for msg_id, path in _entries(store, state, report):
            where = f"{store.name}/{state}/{msg_id}"
            if msg_id in seen:
                report.problems.append(
                    f"{store.name}/{msg_id}: present in both {seen[msg_id]} and {state}")
                continue
            seen[msg_id] = state
            _check_msg(where, msg_id, path, state, report)
    return seen


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


def _check_msg(where: str, msg_id: str, path: str, state: str, report: Report) -> None:
    try:
        with open(os.path.join(path, "msg"), "rb") as fh:
            data = json.loads(fh.read())
    except (OSError, ValueError) as exc:
        text = f"{where}: msg unreadable ({exc.__class__.__name__})"
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
