"""Cron schedules of a queue (SPEC S9), as pure functions: no IO, `now` is a parameter.

Owns the validation of an S9.1 schedule entry (`entry_problem`, used by
`rq.config`), the S9.2 tracking key of an entry, the slot arithmetic (the first slot
after a time, the latest slot before one) in the entry's `tz` or the server's
local time zone, the S9.3 firing decision (`plan`: entries, tracking state,
queue status and now → the actions to take and the new state) and the
`cron.state.json` codec.  The queue process does the IO (`rq/queue/cron.py`);
the web server uses `schedule_key` and `shown_next` for NAME.json (S9.4).

Cron expressions are matched by croniter (day of month and day of week are
OR-ed when both are restricted, S9.1); this module only maps croniter's
wall-clock times to instants.  Daylight-saving changes (SPEC is silent; the
rule of Vixie cron):
* an entry whose minute or hour field starts with `*` (`*/5 * * * *`,
  `0 * * * *`, `@hourly`) fires at every real minute whose wall-clock time
  matches: a repeated hour fires again, a skipped hour has no slots;
* any other entry (a fixed time of day: `30 2 * * *`, `@daily`) fires once
  per matching wall-clock time: in a repeated hour at its first occurrence,
  in a skipped hour shifted forward by the change (02:30 → 03:30).
No instant ever fires twice, and slots only move forward.
"""

from __future__ import annotations

import json
import re
import time
import zoneinfo
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from croniter import CroniterError, croniter

PARAMS = ("param1", "param2", "param3", "param4")
WINDOW = 60               # S9.3: a slot fires from 60 s before to 60 s after it
MAX_SHIFT = 3 * 3600      # more than any daylight-saving change (at most 2 h)
SEARCH_LIMIT = 5000       # croniter steps for one slot; an entry past it never fires
PASS_LIMIT = 16           # slots dealt with for one entry in one pass
KEYWORDS = {"@yearly": "0 0 1 1 *", "@annually": "0 0 1 1 *", "@monthly": "0 0 1 * *",
            "@weekly": "0 0 * * 0", "@daily": "0 0 * * *", "@midnight": "0 0 * * *",
            "@hourly": "0 * * * *"}

FIRE = "fire"            # a slot in the window: message due at the slot
CATCH_UP = "catch_up"    # missed slots of a catch_up entry: one message due now
SKIP = "skip"            # missed slots of another entry: no message


# ---------------------------------------------------------------- entries and keys (S9.2)

def schedule_key(entry: Mapping[str, Any]) -> str:
    """S9.2 tracking key: `id` when given, else the compact JSON, with sorted
    keys, of the entry's `cron`, `tz` and params (those present)."""
    if entry.get("id") is not None:
        return str(entry["id"])
    picked = {k: entry[k] for k in ("cron", "tz", *PARAMS) if entry.get(k) is not None}
    return json.dumps(picked, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


@dataclass(frozen=True)
class Entry:
    """One S9.1 schedule entry as the planner needs it."""

    key: str
    cron: str
    tz: str | None = None
    catch_up: bool = False
    params: Mapping[str, str] = field(default_factory=dict, hash=False)

    @classmethod
    def from_config(cls, entry: Mapping[str, Any]) -> Entry:
        """From a validated config entry (`entry_problem`)."""
        return cls(key=schedule_key(entry), cron=str(entry.get("cron", "")),
                   tz=entry.get("tz") or None, catch_up=entry.get("catch_up") is True,
                   params={k: str(entry[k]) for k in PARAMS if entry.get(k) is not None})

    def message(self, queue: str, due: float) -> dict[str, Any]:
        """The S9.3 message input for this entry."""
        return {"dest": queue, "src": "cron", **self.params, "due": due}


# ---------------------------------------------------------------- slots (S9.1)

class _Zone:
    """Wall-clock time ↔ instants in an IANA zone, or in local time for None."""

    def __init__(self, tz: str | None) -> None:
        self.zi = ZoneInfo(tz) if tz else None

    def wall(self, epoch: float) -> datetime:
        if self.zi is None:
            return datetime.fromtimestamp(epoch)
        return datetime.fromtimestamp(epoch, self.zi).replace(tzinfo=None)

    def offset(self, epoch: float) -> float:
        if self.zi is None:
            return float(time.localtime(epoch).tm_gmtoff)
        delta = datetime.fromtimestamp(epoch, self.zi).utcoffset()
        return delta.total_seconds() if delta is not None else 0.0

    def changes_near(self, epoch: float) -> bool:
        return self.offset(epoch - MAX_SHIFT) != self.offset(epoch + MAX_SHIFT)

    def instants(self, wall: datetime, fixed: bool) -> list[float]:
        """The instants at which wall-clock time `wall` is a slot (module docstring)."""
        first, second = (self._epoch(wall, fold) for fold in (0, 1))
        if first == second:
            return [first]
        if first < second:                 # repeated hour: first, then second occurrence
            return [first] if fixed else [first, second]
        return [first] if fixed else []    # skipped hour: fold 0 is shifted forward

    def _epoch(self, wall: datetime, fold: int) -> float:
        if self.zi is None:
            return wall.replace(fold=fold).timestamp()
        return wall.replace(tzinfo=self.zi, fold=fold).timestamp()


def expand(cron: str) -> str:
    """An @keyword as its five fields; other specs unchanged."""
    return KEYWORDS.get(cron.strip().lower(), cron) if cron.strip().startswith("@") else cron


def is_fixed_time(cron: str) -> bool:
    """True unless the minute or hour field starts with `*` (Vixie cron's rule)."""
    fields = expand(cron).split()
    return len(fields) >= 2 and not (fields[0].startswith("*") or fields[1].startswith("*"))


def next_slot(cron: str, tz: str | None, after: float) -> int | None:
    """The first slot strictly after epoch `after`, or None (no slot or a bad spec).

    Wall-clock times from croniter are mapped to instants; near a change of
    the zone's offset the search starts MAX_SHIFT earlier and keeps the
    smallest instant, because there wall-clock order and instant order differ.
    """
    try:
        zone = _Zone(tz)
        fixed = is_fixed_time(cron)
        margin = timedelta(seconds=MAX_SHIFT if zone.changes_near(after) else 0)
        it = croniter(expand(cron), zone.wall(after) - margin)
        best: float | None = None
        best_wall = datetime.min
        for _ in range(SEARCH_LIMIT):
            wall = it.get_next(datetime)
            if best is not None and wall > best_wall + margin:
                break
            for epoch in zone.instants(wall, fixed):
                if epoch > after and (best is None or epoch < best):
                    best, best_wall = epoch, wall
    except Exception:  # croniter raises many kinds (bad spec, no match for years): no slot
        return None
    return None if best is None else int(best)


def last_slot_before(cron: str, tz: str | None, before: float, after: float) -> int | None:
    """The latest slot s with `after` < s < `before`, or None when there is none."""
    slot = next_slot(cron, tz, after)
    if slot is None or slot >= before:
        return None
    lookback = float(WINDOW)
    while before - lookback > slot:   # jump close to `before`, then walk forward
        near = next_slot(cron, tz, before - lookback)
        if near is not None and near < before:
            slot = near
            break
        lookback *= 2
    while (following := next_slot(cron, tz, slot)) is not None and following < before:
        slot = following
    return slot


def shown_next(cron: str, tz: str | None, last_fire: float | None, now: float) -> int | None:
    """S9.4 `next`: the next slot the queue will fire (missed slots are not shown)."""
    base = now if last_fire is None else max(last_fire, now - WINDOW)
    return next_slot(cron, tz, base)


# ---------------------------------------------------------------- firing (S9.3)

@dataclass(frozen=True)
class Track:
    """One key of cron.state.json (S9.2)."""

    last_fire: float
    last_msg_id: str | None = None


@dataclass(frozen=True)
class Action:
    """One step the queue takes, in order: write `last_fire` to the state file,
    then, unless `kind` is SKIP, create `message` and record its id."""

    key: str
    kind: str
    last_fire: int
    message: dict[str, Any] | None


@dataclass(frozen=True)
class Plan:
    """`base`: the state before any action (removed keys dropped, new entries
    added with last_fire = now); `actions` in order; `wake_at`: when the next
    slot enters the window (None when nothing is scheduled or the queue is not UP)."""

    base: dict[str, Track]
    actions: tuple[Action, ...]
    wake_at: float | None


def plan(queue: str, entries: Iterable[Entry], state: Mapping[str, Track], active: bool,
         now: float) -> Plan:
    """The S9.3 decision for one scheduler pass.

    `active` is true when the queue's status is UP or SCRIPTERROR (S3.5); while
    it is not, nothing changes (state and slots wait until the first UP pass).
    Entries with the same key are one entry (the first is used).
    """
    if not active:
        return Plan(dict(state), (), None)
    unique: dict[str, Entry] = {}
    for entry in entries:
        unique.setdefault(entry.key, entry)
    base = {key: state.get(key) or Track(int(now)) for key in unique}
    actions: list[Action] = []
    wake_at: float | None = None
    for key, entry in unique.items():
        steps, upcoming = _entry_actions(queue, entry, base[key].last_fire, now)
        actions.extend(steps)
        if upcoming is not None:
            wake_at = upcoming - WINDOW if wake_at is None else min(wake_at, upcoming - WINDOW)
    return Plan(base, tuple(actions), wake_at)


def _entry_actions(queue: str, entry: Entry, last_fire: float,
                   now: float) -> tuple[list[Action], int | None]:
    """The actions for one entry and its next slot after them (None: never)."""
    actions: list[Action] = []
    for _ in range(PASS_LIMIT):
        slot = next_slot(entry.cron, entry.tz, last_fire)
        if slot is None or slot > now + WINDOW:
            return actions, slot
        if slot >= now - WINDOW:
            actions.append(Action(entry.key, FIRE, slot, entry.message(queue, slot)))
        else:  # missed: move to the latest slot more than WINDOW in the past
            latest = last_slot_before(entry.cron, entry.tz, now - WINDOW, last_fire) or slot
            due = round(now, 3)
            message = entry.message(queue, due) if entry.catch_up else None
            actions.append(Action(entry.key, CATCH_UP if entry.catch_up else SKIP, latest,
                                  message))
            slot = latest
        last_fire = slot
    return actions, next_slot(entry.cron, entry.tz, last_fire)


# ---------------------------------------------------------------- cron.state.json codec

def parse_state(data: object) -> dict[str, Track]:
    """The tracking state from parsed JSON; malformed keys are left out."""
    if not isinstance(data, dict):
        return {}
    out: dict[str, Track] = {}
    for key, value in data.items():
        if not isinstance(value, dict):
            continue
        last, msg_id = value.get("last_fire"), value.get("last_msg_id")
        if isinstance(last, (int, float)) and not isinstance(last, bool):
            out[str(key)] = Track(last, msg_id if isinstance(msg_id, str) else None)
    return out


def dump_state(state: Mapping[str, Track]) -> bytes:
    """cron.state.json content: {KEY: {"last_fire", "last_msg_id"}}, integers as integers."""
    doc = {key: {"last_fire": int(t.last_fire) if float(t.last_fire).is_integer()
                 else t.last_fire, "last_msg_id": t.last_msg_id}
           for key, t in sorted(state.items())}
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode()


# ---------------------------------------------------------------- S9.1 validation

_CRON_KEYWORDS = ("@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight",
                  "@hourly")
# One S9.1 cron field: comma-separated items, each `*` or a number/name or a
# range, optionally with a step.  croniter also knows `L`, `W`, `#`, `?` and
# seconds/years fields; S9.1 does not, so those are refused here first.
_CRON_VALUE = r"([0-9]+|[a-z]{3})"
_CRON_ITEM = rf"(\*|{_CRON_VALUE}(-{_CRON_VALUE})?)(/[0-9]+)?"
_CRON_FIELD_RE = re.compile(rf"^{_CRON_ITEM}(,{_CRON_ITEM})*$", re.IGNORECASE)


def entry_problem(entry: object) -> str | None:
    """Why one S9.1 schedule entry is invalid, or None when it is valid."""
    if not isinstance(entry, dict):
        return "not an object"
    if "cron" not in entry:
        return "missing cron"
    if not valid_cron(entry["cron"]):
        return f"invalid cron {json.dumps(entry['cron'])}"
    tz = entry.get("tz")
    if tz is not None and not valid_tz(tz):
        return f"invalid tz {json.dumps(tz)}"
    if not isinstance(entry.get("catch_up", False), (bool, type(None))):
        return "catch_up must be a boolean"
    if not isinstance(entry.get("id", ""), (str, type(None))):
        return "id must be a string"
    for i in range(1, 5):
        if not isinstance(entry.get(f"param{i}", ""), (str, type(None))):
            return f"param{i} must be a string"
    return None


def valid_cron(spec: object) -> bool:
    """S9.1: five fields or one of the @ keywords, that croniter can schedule."""
    if not isinstance(spec, str):
        return False
    if spec.startswith("@"):
        return spec.lower() in _CRON_KEYWORDS
    fields = spec.split()
    if len(fields) != 5 or not all(_CRON_FIELD_RE.match(f) for f in fields):
        return False
    try:
        # is_valid alone accepts specs that never match, such as `0 0 31 2 *`;
        # finding one slot (from a fixed start, for determinism) refuses them.
        croniter(spec, 0).get_next(float)
    except (CroniterError, ValueError, KeyError, TypeError, OverflowError):
        return False
    return True


def valid_tz(tz: object) -> bool:
    """An IANA zone name that zoneinfo can load."""
    if not isinstance(tz, str) or not tz:
        return False
    try:
        zoneinfo.ZoneInfo(tz)
    except (ValueError, KeyError, OSError):  # ZoneInfoNotFoundError is a KeyError
        return False
    return True
