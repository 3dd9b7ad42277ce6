"""Timer files and their due times (SPEC S10.1, S10.2, S10.4, S10.5, S10.7), pure.

Owns: which `timers/` entry names are timers, the validation of a timer
file's content, the stat key that says a file changed, and the `Timetable`:
the due time of every valid timer, the staggering of new ones, the rule for
the next due time after a fire, the state kept across restarts and the
`timers` listing.  No IO here: the daemon (rq.timers.daemon) reads the
directory, hands over what it found with `now`, fires and persists.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

MIN_PERIOD = 60      # S10.2
STAGGER = 2.0        # S10.4: seconds between new timers found in one scan
PARAMS = ("param1", "param2", "param3", "param4")
SUFFIX = ".json"


class TimerError(ValueError):
    """A timer file that is not a timer (S10.2); the text says why."""


@dataclass(frozen=True)
class TimerSpec:
    """A valid timer file: `period` seconds and the message fields to send."""

    period: int
    msg: Mapping[str, Any]

    @property
    def dest(self) -> str:
        return str(self.msg["dest"])


@dataclass(frozen=True)
class Found:
    """One timer file as a scan saw it: its stat key and content or error."""

    name: str
    stat: str
    spec: TimerSpec | None = None
    error: str | None = None


@dataclass
class Timer:
    name: str
    spec: TimerSpec
    stat: str
    due: float
    last_fire: float | None = None


@dataclass
class ScanResult:
    added: list[str] = field(default_factory=list)
    restored: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    rejected: list[tuple[str, str]] = field(default_factory=list)  # (name, reason)


def timer_name(entry: str) -> str | None:
    """S10.1: `NAME.json`, NAME non-empty and without `.` or `/`; else None."""
    if not entry.endswith(SUFFIX):
        return None
    name = entry[: -len(SUFFIX)]
    if not name or "." in name or "/" in name:
        return None
    return name


def stat_key(st: os.stat_result) -> str:
    """S10.3: (device, inode, size, mtime) of the resolved file, as text."""
    return f"{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}"


def parse_timer(data: object) -> TimerSpec:
    """S10.2: `{"period": INT >= 60, "msg": {"dest": STRING, param1..4?, src?}}`.

    Only `dest`, the params and `src` are sent (S10.6); other keys of `msg`
    are ignored.  Params may be any JSON value (the queue stores non-strings
    as JSON text, S4.4)."""
    if not isinstance(data, dict):
        raise TimerError("timer file is not a JSON object")
    period = data.get("period")
    if isinstance(period, bool) or not isinstance(period, int):
        raise TimerError("timer has invalid period (not an integer)")
    if period < MIN_PERIOD:
        raise TimerError(f"timer has invalid period (less than {MIN_PERIOD})")
    msg = data.get("msg")
    if not isinstance(msg, dict):
        raise TimerError("timer is missing msg object")
    dest = msg.get("dest")
    if not isinstance(dest, str) or not dest.strip():
        raise TimerError("timer msg is missing dest")
    src = msg.get("src")
    if src is not None and (not isinstance(src, str) or not src):
        raise TimerError("timer msg has invalid src")
    fields = {k: msg[k] for k in ("dest", *PARAMS, "src") if msg.get(k) is not None}
    return TimerSpec(period, fields)


def message_for(spec: TimerSpec) -> dict[str, Any]:
    """S10.6: the create_message fields of a fire: dest, params, src (default `timer`)."""
    out = dict(spec.msg)
    out.setdefault("src", "timer")
    return out


def parse_state(data: object) -> dict[str, tuple[float, str]]:
    """S10.5 `config/timers.state.json` -> {NAME: (last_fire, stat)}; bad entries dropped."""
    out: dict[str, tuple[float, str]] = {}
    if not isinstance(data, dict):
        return out
    for name, entry in data.items():
        if not isinstance(entry, dict):
            continue
        last, stat = entry.get("last_fire"), entry.get("stat")
        if isinstance(last, (int, float)) and not isinstance(last, bool) \
                and isinstance(stat, str):
            out[str(name)] = (float(last), stat)
    return out


def epoch_out(t: float) -> int | float:
    """An epoch for JSON: milliseconds, integral values as integers (S0.3.5)."""
    r = round(t, 3)
    return int(r) if r == int(r) else r


class Timetable:
    """The valid timers and their due times (wall-clock epoch seconds)."""

    def __init__(self, saved: Mapping[str, tuple[float, str]] | None = None) -> None:
        self.timers: dict[str, Timer] = {}
        self.saved: dict[str, tuple[float, str]] = dict(saved or {})
        self.rejected: dict[str, str] = {}  # name -> stat of a file already reported

    def update(self, found: Iterable[Found], now: float) -> ScanResult:
        """Apply one scan (every timer file present now).  New and changed
        timers are due at once, staggered STAGGER s apart in name order; an
        unchanged file with a recorded fire is due at last_fire + period (at
        once if past, S10.5); removed files lose their state (S10.7)."""
        result = ScanResult()
        present = {f.name: f for f in found}
        for name in sorted((set(self.timers) | set(self.saved) | set(self.rejected))
                           - set(present)):
            if self.timers.pop(name, None) is not None:
                result.removed.append(name)
            self.saved.pop(name, None)
            self.rejected.pop(name, None)
        slot = 0
        for name in sorted(present):
            f = present[name]
            if f.spec is None:
                self._reject(f, result)
                continue
            self.rejected.pop(name, None)
            old = self.timers.get(name)
            if old is not None and old.stat == f.stat:
                continue
            kept = self.saved.get(name)
            if old is None and kept is not None and kept[1] == f.stat:
                due = max(now, kept[0] + f.spec.period)
                self.timers[name] = Timer(name, f.spec, f.stat, due, kept[0])
                result.restored.append(name)
                continue
            self.saved.pop(name, None)
            self.timers[name] = Timer(name, f.spec, f.stat, now + STAGGER * slot)
            slot += 1
            (result.changed if old is not None else result.added).append(name)
        return result

    def _reject(self, f: Found, result: ScanResult) -> None:
        """S10.2: reported once per version of the file; it is no timer meanwhile."""
        if self.timers.pop(f.name, None) is not None:
            result.removed.append(f.name)
        self.saved.pop(f.name, None)
        if self.rejected.get(f.name) != f.stat:
            self.rejected[f.name] = f.stat
            result.rejected.append((f.name, f.error or "invalid timer file"))

    def due(self, now: float) -> list[Timer]:
        """Timers due at `now`, earliest first."""
        return sorted((t for t in self.timers.values() if t.due <= now),
                      key=lambda t: (t.due, t.name))

    def fired(self, name: str, now: float) -> None:
        """S10.4: next due = previous due + period, or now + period if that is past.

        The recorded last fire is the slot that fired (next due - period: the
        due time, or `now` when late), so that last_fire + period after a
        restart (S10.5) is exactly the due time the timer had before it."""
        t = self.timers[name]
        t.due = t.due + t.spec.period
        if t.due <= now:
            t.due = now + t.spec.period
        t.last_fire = t.due - t.spec.period
        self.saved[name] = (t.last_fire, t.stat)

    def next_due(self) -> float | None:
        return min((t.due for t in self.timers.values()), default=None)

    def listing(self) -> list[list[Any]]:
        """S7.2 `timers`: [[name, due_epoch], ...] sorted by due."""
        ordered = sorted(self.timers.values(), key=lambda t: (t.due, t.name))
        return [[t.name, epoch_out(t.due)] for t in ordered]

    def state(self) -> dict[str, dict[str, Any]]:
        """S10.5 state file content: {NAME: {"last_fire": EPOCH, "stat": STRING}}."""
        return {name: {"last_fire": epoch_out(last), "stat": stat}
                for name, (last, stat) in sorted(self.saved.items())}
