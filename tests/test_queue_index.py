"""The queue process's index of que/ (rq/queue/index.py): scheduling order (S5.1), waiting
dups (S5.3) and commit order (S5.6), for entries loaded at start (S2.7) and added later.
Pure: no daemon, no files (the daemons' tests cover the same through the socket)."""

from __future__ import annotations

import sys

from rq.queue.index import NO_PARAMS, Index, que_item


def loaded(*entries: tuple[str, float]) -> Index:
    index = Index()
    index.load_que([que_item(msg_id, due, {"dest": "q"}) for msg_id, due in sorted(entries)])
    return index


def test_loaded_and_added_entries_share_one_order_by_due_then_id() -> None:
    index = loaded(("b", 5), ("a", 5), ("c", 1))
    index.add_que("d", 3, {"dest": "q"})
    assert [i.msg_id for i in index.candidates()] == ["c", "d", "a", "b"]
    assert index.earliest_due() == 1.0
    index.set_due("c", 9)
    assert [i.msg_id for i in index.candidates()] == ["d", "a", "b", "c"]
    assert index.que["c"].due == 9.0 and len(index.order) == len(index.que) == 4
    assert index.next_wake(4) == 5.0 and index.next_wake(9) is None
    assert index.remove_que("a") is not None and index.remove_que("a") is None
    assert [i.msg_id for i in index.order] == ["d", "b", "c"]


def test_latest_committed_is_the_last_added_else_the_greatest_loaded_id() -> None:
    index = loaded(("20260101.0000.00.000.2", 1), ("20260101.0000.00.000.1", 9))
    assert index.latest_committed().msg_id == "20260101.0000.00.000.2"  # type: ignore[union-attr]
    index.add_que("20250101.0000.00.000.9", 0, {})  # an older id, committed later
    index.add_que("20250101.0000.00.000.8", 0, {})
    assert index.latest_committed().msg_id == "20250101.0000.00.000.8"  # type: ignore[union-attr]


def test_dups_wait_beside_their_entries_and_leave_with_them() -> None:
    index = Index()
    for msg_id, p1 in (("a", "x"), ("b", "x"), ("c", "y")):
        index.add_que(msg_id, 1, {"param1": p1})
    assert index.attach_dups("a", {"param1": "x"}, (1,)) == ["b"]
    assert index.dup_of("b") == "a" and index.dup_of("c") is None
    assert [i.msg_id for i in index.candidates()] == ["a", "c"]
    assert index.latest_committed().msg_id == "c"  # type: ignore[union-attr]
    index.remove_que("b")
    assert index.dups == {}
    index.add_que("b", 1, {"param1": "x"})
    index.attach_dups("a", {"param1": "x"}, (1,))
    index.release_dups(["b"])
    assert [i.msg_id for i in index.candidates()] == ["a", "b", "c"]


def test_entries_keep_what_scheduling_needs_in_little_memory() -> None:
    item = que_item("m", 7, {"dest": "q" + "ueue", "param2": 3, "count": 2})
    assert (item.due, item.dest, item.params, item.tries) == (7.0, "queue", ("", "3", "", ""), 2)
    assert item.dest is sys.intern("queue")
    assert que_item("n", 1, {"count": True}).params is NO_PARAMS
    assert que_item("n", 1, {"count": "2"}).tries == 0
