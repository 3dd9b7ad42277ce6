"""The queue process's memory of its directory (STYLE habit 3: the directory is
the truth; this is rebuilt from it at start and kept in step with every move).

Owns: the `que` entries in scheduling order (due, id) (S5.1), the coalescing
links between a running parent and its waiting dups (S5.3), the set of `prep`
ids, and the counts of the finished states (S7.3 num_messages).  No IO.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

from sortedcontainers import SortedList

from rq.queue.jobs import param_key

LAST_ID = "\U0010ffff"  # sorts after every msg id: (due, LAST_ID) ends the entries at `due`


@dataclass(slots=True)
class QueItem:
    """What scheduling needs of a queued message; the rest stays on disk (a
    queue of 100,000 messages must fit in little memory, issue 2 bench (d))."""

    msg_id: str
    due: float
    dest: str
    params: tuple[str, str, str, str]
    count: int
    seq: int                  # commit order, for single_que (S5.6)
    dup_of: str | None = None  # id of the running parent this waits on (S5.3)

    def key(self, params: tuple[int, ...]) -> tuple[str, ...]:
        return tuple(self.params[i - 1] for i in params)


class Index:
    def __init__(self) -> None:
        self.order: SortedList = SortedList()    # (due, msg_id)
        self.que: dict[str, QueItem] = {}
        self.prep: set[str] = set()
        self.counts = {"done": 0, "relayed": 0, "err": 0}
        self._seq = itertools.count(1)

    # ------------------------------------------------------------ que
    def add_que(self, msg_id: str, due: float, fields: dict[str, Any]) -> QueItem:
        params = param_key(fields, (1, 2, 3, 4))
        count = fields.get("count", 0)
        item = QueItem(msg_id, float(due), str(fields.get("dest", "")),
                       (params[0], params[1], params[2], params[3]),
                       count if isinstance(count, int) else 0, next(self._seq))
        self.que[msg_id] = item
        self.order.add((item.due, msg_id))
        return item

    def remove_que(self, msg_id: str) -> QueItem | None:
        item = self.que.pop(msg_id, None)
        if item is not None:
            self.order.discard((item.due, msg_id))
        return item

    def set_due(self, msg_id: str, due: float) -> None:
        item = self.que[msg_id]
        self.order.discard((item.due, msg_id))
        item.due = float(due)
        self.order.add((item.due, msg_id))

    def earliest_due(self) -> float | None:
        return self.order[0][0] if self.order else None

    def candidates(self) -> Any:
        """Que entries in scheduling order, skipping waiting dups."""
        # Lazy: callers stop early (a scheduler pass takes a few) and never
        # change the index while iterating, so a copy of 100,000 entries per
        # pass is not needed.
        for _, msg_id in self.order:
            item = self.que.get(msg_id)
            if item is not None and item.dup_of is None:
                yield item

    def next_wake(self, now: float) -> float | None:
        """The earliest future due among schedulable entries."""
        start = self.order.bisect_right((now, LAST_ID))  # entries already due: skipped
        for due, msg_id in self.order.islice(start):
            item = self.que.get(msg_id)
            if item is not None and item.dup_of is None and due > now:
                return due
        return None

    def latest_committed(self) -> QueItem | None:
        """The most recently committed entry that is not a waiting dup (S5.6)."""
        best = None
        for item in self.que.values():
            if item.dup_of is None and (best is None or item.seq > best.seq):
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
            if item.msg_id != parent_id and item.dup_of is None \
                    and item.key(params) == key:
                item.dup_of = parent_id
                dups.append(item.msg_id)
        return sorted(dups)

    def release_dups(self, dups: list[str]) -> None:
        for msg_id in dups:
            item = self.que.get(msg_id)
            if item is not None:
                item.dup_of = None
