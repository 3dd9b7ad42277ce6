"""The queue process's memory of its directory (STYLE habit 3: the directory is
the truth; this is rebuilt from it at start and kept in step with every move).

Owns: the `que` entries in scheduling order (due, id) (S5.1), the coalescing
links between a running parent and its waiting dups (S5.3), the set of `prep`
ids, and the counts of the finished states (S7.3 num_messages).  No IO.
"""

from __future__ import annotations

import itertools
import sys
from typing import Any, NamedTuple

from sortedcontainers import SortedList

from rq.queue.jobs import param_key

LAST_ID = "\U0010ffff"  # sorts after every msg id: (due, LAST_ID) ends the entries at `due`
NO_PARAMS = ("", "", "", "")


class QueItem(NamedTuple):
    """What scheduling needs of a queued message; the rest stays on disk.  A tuple that
    sorts by (due, msg_id) itself (ids are unique: the later fields are never compared),
    so the scheduling order holds the items, not a (due, id) pair beside each: a queue of
    a million messages in ~250 bytes each (issue 15, bench/restart.py)."""

    due: float
    msg_id: str
    dest: str
    params: tuple[str, str, str, str]
    tries: int  # the msg's `count` (a tuple's own count() keeps its name)
    seq: int  # commit order, for single_que (S5.6); 0 for those found at start

    def key(self, params: tuple[int, ...]) -> tuple[str, ...]:
        return tuple(self.params[i - 1] for i in params)


def que_item(msg_id: str, due: float, fields: dict[str, Any], seq: int = 0) -> QueItem:
    """The index entry of a que/ message from its msg fields (ValueError, TypeError or
    OverflowError for a due that is no number)."""
    get = fields.get
    params = (str(get("param1") or ""), str(get("param2") or ""), str(get("param3") or ""),
              str(get("param4") or ""))  # jobs.param_key(fields, (1, 2, 3, 4)), unrolled
    count = get("count", 0)
    return QueItem(float(due), msg_id, sys.intern(str(get("dest", ""))),
                   NO_PARAMS if params == NO_PARAMS else params,
                   count if isinstance(count, int) else 0, seq)


class Index:
    def __init__(self) -> None:
        self.order: SortedList = SortedList()    # QueItems, by (due, msg_id)
        self.que: dict[str, QueItem] = {}
        self.dups: dict[str, str] = {}           # waiting dup id -> its running parent (S5.3)
        self.prep: set[str] = set()
        self.counts = {"done": 0, "relayed": 0, "err": 0}
        self._seq = itertools.count(1)

    # ------------------------------------------------------------ que
    def load_que(self, items: list[QueItem]) -> None:
        """The que/ entries found at start (S2.7), sorted once rather than one by one; they
        count as committed before any later one, in msg id order among themselves."""
        self.que = {item.msg_id: item for item in items}
        self.order = SortedList(self.que.values())

    def add_que(self, msg_id: str, due: float, fields: dict[str, Any]) -> QueItem:
        self.remove_que(msg_id)
        item = que_item(msg_id, due, fields, next(self._seq))
        self.que[msg_id] = item
        self.order.add(item)
        return item

    def remove_que(self, msg_id: str) -> QueItem | None:
        item = self.que.pop(msg_id, None)
        if item is not None:
            self.order.discard(item)
            self.dups.pop(msg_id, None)
        return item

    def set_due(self, msg_id: str, due: float) -> None:
        item = self.que[msg_id]
        self.order.discard(item)
        item = self.que[msg_id] = item._replace(due=float(due))
        self.order.add(item)

    def dup_of(self, msg_id: str) -> str | None:
        """The running parent a que entry waits on (S5.3), or None."""
        return self.dups.get(msg_id)

    def earliest_due(self) -> float | None:
        return self.order[0].due if self.order else None

    def candidates(self) -> Any:
        """Que entries in scheduling order, skipping waiting dups."""
        # Lazy: callers stop early (a scheduler pass takes a few) and never
        # change the index while iterating, so a copy of 100,000 entries per
        # pass is not needed.
        dups = self.dups
        for item in self.order:
            if item.msg_id not in dups:
                yield item

    def next_wake(self, now: float) -> float | None:
        """The earliest future due among schedulable entries."""
        start = self.order.bisect_right((now, LAST_ID))  # entries already due: skipped
        for item in self.order.islice(start):
            if item.msg_id not in self.dups and item.due > now:
                return item.due
        return None

    def latest_committed(self) -> QueItem | None:
        """The most recently committed entry that is not a waiting dup (S5.6)."""
        best = None
        for item in self.que.values():
            if item.msg_id not in self.dups and (
                    best is None or (item.seq, item.msg_id) > (best.seq, best.msg_id)):
                best = item
        return best

    # ------------------------------------------------------------ coalescing (S5.3)
    def attach_dups(self, parent_id: str, parent_fields: dict[str, Any],
                    params: tuple[int, ...]) -> list[str]:
        if not params:
            return []
        key = param_key(parent_fields, params)
        dups = []
        for item in self.que.values():
            if item.msg_id != parent_id and item.msg_id not in self.dups \
                    and item.key(params) == key:
                self.dups[item.msg_id] = parent_id
                dups.append(item.msg_id)
        return sorted(dups)

    def release_dups(self, dups: list[str]) -> None:
        for msg_id in dups:
            self.dups.pop(msg_id, None)
